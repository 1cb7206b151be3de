#!/usr/bin/python3
"""One outboxd, many tenant databases (issue #42): what each tenant costs an idle relay, how a
quiet tenant's latency holds while another tenant drains a backlog, and the drain rate with every
tenant busy against one database.

Tenants are PostgreSQL databases (`--layout databases`, the default: one migrated template
database, then `CREATE DATABASE <prefix>tNNN TEMPLATE <prefix>template`) or schemas of one
database (`--layout schemas`: `outboxctl migrate --schema tNNN`, one per tenant), created once for
the largest count and dropped at the end (the prefix is `mdb<pid>_`; `--drop-leftovers` drops what
an interrupted run left). outboxd gets one `[[databases]]` table per tenant (name "tNNN"),
`[relay] instance`, `[log] level = "warn"`, `[http] listen` on a free loopback port and
`[sinks.default]` RabbitMQ with `routing_key = "{topic}"`, plus any --relay-setting lines;
everything else at its defaults (each idle case prints lease, idle_lease, sweep_interval and
purge_interval as `outboxd --check-config` gives them: with [[databases]] 30 s, 2 min, 30 s and
10 min; an idle relay renews for idle_lease only after a whole lease without work, so the idle
cases want --settle-seconds of 50 or more). outboxd and
outboxctl are copied from --bin first, so a build in the tree meanwhile changes nothing. The
benchmark's own connections carry `application_name = mdb-bench`; everything else in the tenant
databases is outboxd's.

Cases (each prints its conditions, then its numbers):

  idle      N tenants, outboxd started and settled, no writes, over --idle-seconds (60): the
            statements outboxd sends, from the server's log (`log_statement = 'all'` set on the
            tenant databases only, by ALTER DATABASE, for the idle cases; the entries of
            outboxd's sessions between two clock_timestamp()s, see LogStatements), next to
            pg_stat_statements' `calls` in the tenant databases (their entries, and those of
            databases dropped since, reset just before the window; its max is shared with other
            tests' statements, and a deallocation during the window, which undercounts, is
            reported) and the tenants' transactions from pg_stat_database (autovacuum's
            included: an upper bound); in total, per second and per tenant, broken down by query
            text (calls per tenant per minute); outboxd's connections (pg_stat_activity, grouped
            by their last statement, with how long they have been idle: the wake-up connection,
            which LISTENs, idle since before the window sent nothing and was woken by no NOTIFY);
            outboxd's RSS, threads and open files; CPU seconds of outboxd, of its PostgreSQL
            backends and of all postgres processes over the window; the size of /metrics.
            Target: <= 0.05 statements/s per idle tenant (the slope of a least-squares fit over
            the tenant counts, and the marginal cost against 1 tenant).
  latency   N tenants; the quiet tenant (t002; t001 alone when N = 1) commits one 256 B message
            every 100 ms (autocommit `SELECT outbox.enqueue(...)`); COMMIT returned -> pika
            consumer received, p50/p90/p99/max, in three phases: (a) the other tenants idle
            (--quiet-seconds), (b) while --backlog messages (1,000,000) are written into t001 in
            one transaction (statements of 250,000 `SELECT outbox.enqueue(...) FROM
            generate_series`; the bulk writers' sessions plan each statement afresh,
            plan_cache_mode = force_custom_plan: see Tenants.connect), (c) from that COMMIT until
            t001's last message reached its consumer (another process, counting only). N = 1
            gives the single-tenant figure. t001 and t002 are made new (Tenants.refresh) before
            each case, and the backlog's transaction ends with ANALYZE of the outbox's tables
            (see analyze()): each case drains an unbloated table with its statistics.
            Target: (c)'s p99 <= 2 x the single-tenant p99.
  separate  the control for `latency` on this box: the same two databases, each served by an
            outboxd of its own (a plain `[database]` config), the same writer, backlog and
            phases; what CPU contention alone does to the quiet tenant's latency.
  drain     --drain-messages (100,000) messages of 256 B over 1,000 streams, written before
            outboxd starts: spread evenly over all N tenants, then all in t001 (outboxd still
            serving N tenants); messages/s from the first receipt to the last, and 10 % -> 90 %
            of them, at a pika consumer in another process (auto-ack, counting only; t001 and
            t002 made new first, each tenant's table analyzed after its write); the time
            from outboxd's start to READY=1 and to the last receipt; statements per message.
            Both include outboxd's start (with 500 tenants: 1,500 connections opened while the
            drain runs); a third run writes the messages into t001 in one transaction once
            outboxd serves the N tenants and is settled (the drain of one database beside N - 1
            idle ones, from the COMMIT), and a fourth, for N <= --max-open-writers (100), spreads
            them over the N tenants in transactions held open and committed together once
            outboxd is settled (every tenant busy, without the start). Each run also prints
            outboxd's own account from /metrics: claims (count, mean time, messages each) and
            batch publishes (mean time from the lane's queue to the last confirm).
  drain-separate  (not in the default set) the control for drain's fourth run: the same spread
            over N tenants (N <= --max-open-writers), each tenant served by an outboxd of its own
            with a [database] config: what N concurrent drains cost on this box without sharing
            a process, a dispatcher or a sink connection.

  bench/many_databases.py [--tenants 1,10,100,500] [--cases idle,latency,separate,drain]
                          [--layout databases|schemas] [--idle-seconds 60] [--backlog 1000000]
                          [--drain-messages 100000] [--relay-setting 'LINE' ...]
                          [--max-open-writers 100] [--bin DIR] [--quick] [--legacy-config]
                          [--drop-leftovers]

--quick: tenants 1,10, idle 10 s, backlog 50,000, drain 20,000, quiet phase 5 s (a smoke run of a
few minutes). --legacy-config writes `[database]` instead of `[[databases]]` (one tenant only:
for an outboxd without issue #42). Servers: $OUTBOX_TEST_PG_URL (a superuser; pg_stat_statements
loaded) and $OUTBOX_TEST_AMQP_URL, as `eval "$(scripts/services env)"` sets them. Binaries:
build/release/bin/outboxd and outboxctl (--bin). Debian's /usr/bin/python3 with psycopg 3 and
pika (python3-psycopg, python3-pika).
"""
import argparse
import atexit
import math
import multiprocessing
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import pika
import psycopg
from psycopg import sql

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
APP = "mdb-bench"
PREFIX = f"mdb{os.getpid()}_"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*args):
    print(*args, flush=True)


def now():
    return time.monotonic()  # CLOCK_MONOTONIC: comparable across this process's threads


# --- servers ----------------------------------------------------------------------------------


class Env:
    def __init__(self, options):
        self.pg_url = os.environ.get("OUTBOX_TEST_PG_URL")
        self.amqp_url = os.environ.get("OUTBOX_TEST_AMQP_URL")
        if not self.pg_url or not self.amqp_url:
            sys.exit("OUTBOX_TEST_PG_URL / OUTBOX_TEST_AMQP_URL unset: "
                     'eval "$(scripts/services env)"')
        self.dir = tempfile.mkdtemp(prefix=PREFIX)
        self.relay_settings = options.relay_setting
        # Copies: a build in the shared tree meanwhile does not change what is measured.
        for program in ("outboxd", "outboxctl"):
            path = os.path.join(options.bin, program)
            if not os.access(path, os.X_OK):
                sys.exit(f"{path} missing: cmake --build build/release --target outboxd outboxctl")
            shutil.copy2(path, os.path.join(self.dir, program))
        self.outboxd = os.path.join(self.dir, "outboxd")
        self.outboxctl = os.path.join(self.dir, "outboxctl")
        self.built = time.strftime("%H:%M:%S", time.localtime(os.path.getmtime(self.outboxd)))
        self.commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip()
        self.monitor = self.connect(self.pg_url)
        self.max_connections = int(self.scalar("SHOW max_connections"))

    def url_for(self, database):
        """The test URL with another database name (and no query string)."""
        parts = urllib.parse.urlsplit(self.pg_url)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/" + database, "", ""))

    @staticmethod
    def connect(url):
        return psycopg.connect(url, autocommit=True, application_name=APP)

    def scalar(self, query, params=None):
        return self.monitor.execute(query, params).fetchone()[0]

    def rows(self, query, params=None):
        return self.monitor.execute(query, params).fetchall()


# --- tenants ----------------------------------------------------------------------------------


class Tenants:
    """`count` migrated tenants named t001.. (databases or schemas), dropped by drop()."""

    def __init__(self, env, count, layout):
        self.env, self.layout = env, layout
        self.names = [f"t{i:03d}" for i in range(1, count + 1)]
        self.created = []  # databases to drop
        started = now()
        if layout == "databases":
            template = PREFIX + "template"
            self._create_database(template)
            self._migrate(env.url_for(template), "outbox")
            for name in self.names:
                env.monitor.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(PREFIX + name), sql.Identifier(template)))
                self.created.append(PREFIX + name)
        else:
            self.shared = PREFIX + "tenants"
            self._create_database(self.shared)
            for name in self.names:
                self._migrate(env.url_for(self.shared), name)
        log(f"  created {count} tenant {layout} in {now() - started:.1f} s")

    def _create_database(self, database):
        self.env.monitor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        self.created.append(database)

    def _migrate(self, url, schema):
        subprocess.run([self.env.outboxctl, "--db", url, "--schema", schema, "migrate"],
                       check=True, stdout=subprocess.DEVNULL)

    def refresh(self, name):
        """Tenant `name` as new (no rows, dead or alive, no statistics) before a case writes into
        it: a copy of the template again, or its schema dropped and migrated again."""
        if self.layout == "databases":
            database = sql.Identifier(PREFIX + name)
            self.env.monitor.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(database))
            self.env.monitor.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                database, sql.Identifier(PREFIX + "template")))
        else:
            self.env.monitor.close()
            with self.env.connect(self.url(name)) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
            self.env.monitor = self.env.connect(self.env.pg_url)
            self._migrate(self.url(name), name)

    def database(self, name):
        return PREFIX + name if self.layout == "databases" else self.shared

    def schema(self, name):
        return "outbox" if self.layout == "databases" else name

    def url(self, name):
        return self.env.url_for(self.database(name))

    def databases(self, count):
        """The distinct database names of the first `count` tenants."""
        return sorted({self.database(name) for name in self.names[:count]})

    def connect(self, name, bulk=False):
        """`bulk`: a session writing thousands of messages in one transaction plans
        outbox.enqueue's statements afresh each call (plan_cache_mode = force_custom_plan): its
        generic plan, cached while stream_seqs was analyzed as (nearly) empty, scans stream_seqs
        sequentially, and that table grows by a row per message of the transaction: quadratic
        (20,000 messages: 29 s instead of 1.2 s; 1,000,000 did not finish in 12 minutes)."""
        if bulk:
            return psycopg.connect(self.url(name), autocommit=True, application_name=APP,
                                   options="-c plan_cache_mode=force_custom_plan")
        return self.env.connect(self.url(name))

    def messages(self, name):
        return sql.SQL("{}.messages").format(sql.Identifier(self.schema(name)))

    def count_left(self, count):
        """Messages still in the first `count` tenants' tables (published ones are deleted)."""
        left = 0
        for name in self.names[:count]:
            with self.connect(name) as conn:
                left += conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status <> 'published'")
                                     .format(self.messages(name))).fetchone()[0]
        return left

    def drop(self):
        if self.env.monitor.closed:  # the server was restarted meanwhile (a shared cluster)
            self.env.monitor = self.env.connect(self.env.pg_url)
        for database in reversed(self.created):
            try:
                self.env.monitor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                                         .format(sql.Identifier(database)))
            except psycopg.Error as error:
                log(f"  cannot drop {database}: {error}")
        self.created = []


def enqueue_sql(schema):
    """One autocommit statement: a message of `payload` bytes with seq %(i)s."""
    return sql.SQL(
        "SELECT {}.enqueue(topic => %(topic)s, payload => ('{{\"i\":\"' || lpad(%(i)s::text, 10, "
        "'0') || '\",\"pad\":\"' || %(pad)s || '\"}}')::json, stream_key => %(key)s)"
    ).format(sql.Identifier(schema))


def bulk_enqueue_sql(schema):
    """Messages %(lo)s..%(hi)s of `payload` bytes over 1,000 streams, in one statement."""
    return sql.SQL(
        "SELECT count({}.enqueue(topic => %(topic)s, payload => ('{{\"i\":\"' || lpad(g::text, 10, "
        "'0') || '\",\"pad\":\"' || %(pad)s || '\"}}')::json, stream_key => 's' || (g %% 1000)))"
        " FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g"
    ).format(sql.Identifier(schema))


def pad(payload):
    return "x" * max(0, payload - len('{"i":"0000000000","pad":""}'))


def seq_of(body):
    match = re.match(rb'\{"i":"(\d+)"', body)
    return int(match.group(1)) if match else None


# --- outboxd ----------------------------------------------------------------------------------


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Outboxd:
    """outboxd on `entries` [(name, url, schema)], started under a NOTIFY_SOCKET of ours."""

    def __init__(self, env, entries, label, legacy=False):
        self.env, self.label = env, label
        self.port = free_port()
        self.config = os.path.join(env.dir, f"{label}.toml")
        self.logfile = os.path.join(env.dir, f"{label}.log")
        relay = "".join(line + "\n" for line in env.relay_settings)
        lines = [f'[relay]\ninstance = "{label}"\n{relay}', '[log]\nlevel = "warn"\n',
                 f'[http]\nlisten = "127.0.0.1:{self.port}"\n',
                 f'[sinks.default]\ntype = "rabbitmq"\nurl = "{env.amqp_url}"\n'
                 'routing_key = "{topic}"\n']
        if legacy:
            assert len(entries) == 1, "a [database] config serves one tenant"
            _, url, schema = entries[0]
            lines.insert(0, f'[database]\nurl = "{url}"\nschema = "{schema}"\n')
        else:
            for name, url, schema in entries:
                lines.append(f'[[databases]]\nname = "{name}"\nurl = "{url}"\nschema = "{schema}"\n')
        with open(self.config, "w") as out:
            out.write("\n".join(lines))
        # What outboxd makes of it, defaults filled in.
        checked = subprocess.run([env.outboxd, "--config", self.config, "--check-config"],
                                 capture_output=True, text=True)
        if checked.returncode != 0:
            raise RuntimeError(f"outboxd --check-config: exit {checked.returncode}: "
                               f"{checked.stderr.strip()}")
        self.settings = dict(re.findall(r'^(\w+) = "?([^"\n]*)"?$', checked.stdout, re.M))
        notify_path = os.path.join(env.dir, f"{label}.notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(notify_path)
        environment = dict(os.environ, NOTIFY_SOCKET=notify_path)
        self.started = now()
        with open(self.logfile, "ab") as logfile:
            self.process = subprocess.Popen([env.outboxd, "--config", self.config],
                                            stdout=logfile, stderr=subprocess.STDOUT,
                                            env=environment)
        self.ready_seconds = None
        self.notify.settimeout(0.5)
        deadline = now() + 300
        while self.ready_seconds is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"outboxd exited with {self.process.returncode} at start: "
                                   f"{self.tail()}")
            if now() > deadline:
                raise RuntimeError(f"outboxd not ready in 300 s: {self.tail()}")
            try:
                if b"READY=1" in self.notify.recv(4096):
                    self.ready_seconds = now() - self.started
            except socket.timeout:
                pass
        running.add(self)

    @property
    def pid(self):
        return self.process.pid

    def tail(self, lines=12):
        try:
            with open(self.logfile, errors="replace") as logfile:
                return "".join(logfile.readlines()[-lines:])
        except OSError:
            return ""

    def metrics(self):
        started = now()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as reply:
            body = reply.read()
        return body, now() - started

    def stop(self):
        running.discard(self)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.notify.close()
        code = self.process.returncode
        if code != 0:
            log(f"  outboxd ({self.label}) exited with {code}; log {self.logfile}:\n{self.tail()}")
        errors = [line for line in self.tail(200).splitlines() if "error" in line.lower()]
        if errors:
            log(f"  outboxd ({self.label}) logged {len(errors)} error line(s), e.g.: {errors[-1]}")
        return code


running = set()


def settle(env, databases, relay, expected=None, quiet_for=3.0, limit=300):
    """Waits until outboxd's connection count to `databases` is unchanged for `quiet_for` s (and
    at least `expected`); returns (count, seconds since outboxd's start)."""
    last, since = -1, now()
    deadline = now() + limit
    while now() < deadline:
        count = len(relay_backends(env, databases))
        if count != last:
            last, since = count, now()
        elif now() - since >= quiet_for and (expected is None or count >= expected):
            return count, since - relay.started
        if relay.process.poll() is not None:
            raise RuntimeError(f"outboxd exited with {relay.process.returncode}: {relay.tail()}")
        time.sleep(0.25)
    return last, now() - relay.started


def relay_backends(env, databases):
    """(pid, datname, state, last query, seconds idle) of outboxd's sessions in `databases`."""
    return env.rows(
        "SELECT pid, datname, state, regexp_replace(left(query, 100), '\\s+', ' ', 'g'),"
        " extract(epoch FROM now() - state_change)::float8 FROM pg_stat_activity"
        " WHERE datname = ANY(%s) AND application_name <> %s AND backend_type = 'client backend'",
        (databases, APP))


# --- /proc ------------------------------------------------------------------------------------


def proc_cpu(pid):
    """utime + stime of a process in seconds; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError):
        return None


def proc_status(pid):
    values = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                values[key] = value.strip()
        values["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return values


def postgres_cpu():
    """{pid: cpu seconds} of every process named postgres (the shared cluster's, not only ours)."""
    cpu = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as comm:
                if comm.read().strip() != "postgres":
                    continue
        except OSError:
            continue
        seconds = proc_cpu(entry)
        if seconds is not None:
            cpu[int(entry)] = seconds
    return cpu


def machine_busy():
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


class CpuWindow:
    """CPU seconds over a window: outboxd, its backends (pids given), all postgres processes alive
    at the end (those started in the window with all their CPU time), and the machine's busy
    share."""

    def __init__(self, relay_pid, backend_pids):
        self.relay_pid, self.backends = relay_pid, list(backend_pids)
        self.relay = proc_cpu(relay_pid)
        self.postgres = postgres_cpu()
        self.busy = machine_busy()
        self.started = now()

    def finish(self):
        relay = proc_cpu(self.relay_pid)
        postgres = postgres_cpu()
        busy, total = machine_busy()
        backends = [pid for pid in self.backends if pid in postgres and pid in self.postgres]
        cores = os.cpu_count() or 1
        return {
            "seconds": now() - self.started,
            "outboxd": relay - self.relay,
            "backends": sum(postgres[pid] - self.postgres[pid] for pid in backends),
            "backends_alive": len(backends),
            "postgres": sum(postgres[pid] - self.postgres.get(pid, 0.0) for pid in postgres),
            "machine_busy": 100.0 * cores * (busy - self.busy[0]) / max(1, total - self.busy[1]),
        }


def describe_cpu(cpu):
    backends = (f"its {cpu['backends_alive']} PostgreSQL backends {cpu['backends']:.2f} s, "
                if cpu["backends_alive"] else "")
    return (f"CPU over {cpu['seconds']:.0f} s: outboxd {cpu['outboxd']:.2f} s, {backends}all postgres "
            f"processes {cpu['postgres']:.2f} s (the shared cluster's; processes that exited in "
            f"the window, such as autovacuum workers, not included); machine busy {cpu['machine_busy']:.0f} % of "
            f"{100 * (os.cpu_count() or 1)} %")


# --- statements -------------------------------------------------------------------------------


class Statements:
    """pg_stat_statements' calls in `databases` over a window: the entries of those databases are
    reset at the start (the others' are left alone), read at the end."""

    def __init__(self, env, databases):
        self.env, self.databases = env, databases
        self.available = bool(env.scalar(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"))
        if not self.available:
            try:
                env.monitor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                self.available = True
            except psycopg.Error:
                return
        self.dbids = [row[0] for row in env.rows(
            "SELECT oid FROM pg_database WHERE datname = ANY(%s)", (databases,))]

    def start(self):
        if not self.available:
            return
        # The entries of databases dropped since (other tests') and of ours: room in
        # pg_stat_statements.max, so that no entry of the window is deallocated.
        self.env.monitor.execute(
            "SELECT pg_stat_statements_reset(0, d, 0) FROM (SELECT DISTINCT dbid AS d FROM"
            " pg_stat_statements WHERE dbid NOT IN (SELECT oid FROM pg_database)) gone")
        self.env.monitor.execute(
            "SELECT pg_stat_statements_reset(0, d, 0) FROM unnest(%s::oid[]) d", (self.dbids,))
        self.entries = self.env.scalar("SELECT count(*) FROM pg_stat_statements")
        self.info = self.env.rows("SELECT dealloc, stats_reset FROM pg_stat_statements_info")[0]
        self.xacts = self._xacts()

    def _xacts(self):
        return self.env.scalar(
            "SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database"
            " WHERE datname = ANY(%s)", (self.databases,))

    def finish(self, exclude_writers=False):
        """{normalized query: (calls, tenants issuing it)}, dealloc delta, reset seen, xacts."""
        if not self.available:
            return None
        filter_ = (" AND query NOT LIKE '%%enqueue%%' AND query NOT IN ('BEGIN', 'COMMIT')"
                   if exclude_writers else "")
        rows = self.env.rows(
            "SELECT regexp_replace(query, '\\s+', ' ', 'g'), sum(calls)::float8,"
            " count(DISTINCT dbid) FROM pg_stat_statements WHERE dbid = ANY(%s::oid[])" + filter_ +
            " GROUP BY 1 ORDER BY 2 DESC", (self.dbids,))
        info = self.env.rows("SELECT dealloc, stats_reset FROM pg_stat_statements_info")[0]
        entries = self.env.scalar("SELECT count(*) FROM pg_stat_statements")
        return {"queries": [(query, calls, dbs) for query, calls, dbs in rows],
                "total": sum(calls for _, calls, _ in rows),
                "dealloc": info[0] - self.info[0], "reset": info[1] != self.info[1],
                "entries": entries, "xacts": self._xacts() - self.xacts}


class LogStatements:
    """The statements the tenant databases' sessions ran over a window, from the server's log:
    `ALTER DATABASE ... SET log_statement = 'all'` on the tenant databases only (before outboxd
    connects; reset afterwards), then the log's `statement:` / `execute <name>:` entries
    (multi-line texts joined) between two clock_timestamp()s, by backend pid. Exact where
    pg_stat_statements may deallocate entries (its max is shared with other tests)."""

    ENTRY = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \S+ \[(\d+)\] "
                       r"(\w+):  (.*)$")
    STATEMENT = re.compile(r"^(?:statement|execute [^:]*): ?(.*)$")

    def __init__(self, env, databases):
        self.env, self.databases = env, databases
        self.path = None
        data = env.scalar("SHOW data_directory")
        for candidate in (os.path.join(os.path.dirname(data), "postgres.log"),
                          os.path.join(data, "postgres.log")):
            if os.access(candidate, os.R_OK):
                self.path = candidate
                break
        if self.path is None or env.scalar("SHOW log_statement") != "none":
            self.path = None  # unreadable, or every database logs: no attribution
            return
        for database in databases:
            env.monitor.execute(sql.SQL("ALTER DATABASE {} SET log_statement = 'all'")
                                .format(sql.Identifier(database)))

    @property
    def available(self):
        return self.path is not None

    def reset(self):
        try:
            for database in self.databases:
                self.env.monitor.execute(sql.SQL("ALTER DATABASE {} RESET log_statement")
                                         .format(sql.Identifier(database)))
        except psycopg.Error as error:  # dropped at the end anyway
            log(f"  cannot reset log_statement: {error}")

    def _clock(self):
        return self.env.scalar(
            "SELECT to_char(clock_timestamp() AT TIME ZONE current_setting('log_timezone'),"
            " 'YYYY-MM-DD HH24:MI:SS.MS')")

    def start(self):
        if self.available:
            self.offset = os.path.getsize(self.path)
            self.since = self._clock()

    def finish(self, pids):
        """{"queries": [(text, calls, sessions)], "total", "unattributed"}: the entries of `pids`
        (outboxd's sessions); "unattributed" counts those of other pids."""
        if not self.available:
            return None
        until = self._clock()
        time.sleep(0.5)  # the logger's last lines
        queries, sessions, unattributed = {}, {}, 0
        current = None

        def close(entry):
            nonlocal unattributed
            if entry is None:
                return
            at, pid, text = entry
            if not (self.since <= at <= until):
                return
            if pid not in pids:
                unattributed += 1
                return
            text = re.sub(r'"t\d{3}"', '"<tenant>"', re.sub(r"\s+", " ", text).strip())
            queries[text] = queries.get(text, 0) + 1
            sessions.setdefault(text, set()).add(pid)

        with open(self.path, errors="replace") as logfile:
            logfile.seek(self.offset)
            for line in logfile:
                line = line.rstrip("\n")
                if line.startswith("\t") and current is not None:
                    current[2] += " " + line[1:]
                    continue
                close(current)
                current = None
                match = self.ENTRY.match(line)
                if match and match.group(3) == "LOG":
                    statement = self.STATEMENT.match(match.group(4))
                    if statement:
                        current = [match.group(1), int(match.group(2)), statement.group(1)]
            close(current)
        rows = sorted(((text, calls, len(sessions[text])) for text, calls in queries.items()),
                      key=lambda row: -row[1])
        return {"queries": rows, "total": sum(queries.values()), "unattributed": unattributed}


# --- RabbitMQ ---------------------------------------------------------------------------------


def declare_queues(env, names):
    connection = pika.BlockingConnection(pika.URLParameters(env.amqp_url))
    channel = connection.channel()
    for name in names:
        channel.queue_delete(name)
        channel.queue_declare(name, durable=True)
    connection.close()


def delete_queues(env, names):
    try:
        connection = pika.BlockingConnection(pika.URLParameters(env.amqp_url))
        channel = connection.channel()
        for name in names:
            channel.queue_delete(name)
        connection.close()
    except (pika.exceptions.AMQPError, OSError) as error:
        log(f"  cannot delete queues {names}: {error}")


class QuietConsumer(threading.Thread):
    """Receive time of each message of `queue` by its seq (the payload's "i")."""

    def __init__(self, amqp_url, queue):
        super().__init__(daemon=True)
        self.amqp_url, self.queue = amqp_url, queue
        self.received = {}
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.duplicates = 0

    def run(self):
        connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        self.ready.set()
        for method, _properties, body in channel.consume(self.queue, auto_ack=True,
                                                         inactivity_timeout=0.1):
            if method is not None:
                at = now()
                seq = seq_of(body)
                if seq in self.received:
                    self.duplicates += 1
                else:
                    self.received[seq] = at
            if self.stopping.is_set():
                break
        connection.close()


def count_consumer(amqp_url, queue, expected, results, started):
    """In a process of its own: counts `expected` deliveries of `queue` (auto-ack), puts the
    CLOCK_MONOTONIC times of the first, the 10 %, 90 % and last ones and the distinct count."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=2000)
    started.set()
    seen, count = set(), 0
    marks = {}
    tenth, ninetieth = max(1, expected // 10), max(1, expected * 9 // 10)
    last_at = None
    for method, properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=1):
        if method is None:
            if results.get("stop", False):
                break
            continue
        at = time.monotonic()
        key = (properties.headers or {}).get("outbox-database"), seq_of(body)
        if key in seen:
            continue
        seen.add(key)
        count += 1
        last_at = at
        if count == 1:
            marks["first"] = at
        if count == tenth:
            marks["tenth"] = at
        if count == ninetieth:
            marks["ninetieth"] = at
        if count >= expected:
            break
    marks["last"] = last_at
    marks["count"] = count
    results.update(marks)
    connection.close()


class Counter:
    """count_consumer in another process (so that its parsing does not hold this one's GIL)."""

    def __init__(self, env, queue, expected):
        context = multiprocessing.get_context("spawn")
        self.manager = context.Manager()
        self.results = self.manager.dict()
        started = self.manager.Event()
        self.process = context.Process(target=count_consumer,
                                       args=(env.amqp_url, queue, expected, self.results, started))
        self.process.start()
        started.wait(30)
        self.expected = expected

    def wait(self, timeout):
        self.process.join(timeout)
        if self.process.is_alive():
            self.results["stop"] = True
            self.process.join(10)
            if self.process.is_alive():
                self.process.terminate()
        result = dict(self.results)
        self.manager.shutdown()
        return result


# --- statistics -------------------------------------------------------------------------------


def percentile(values, share):
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))
    return ordered[index]


def describe_latency(values):
    if not values:
        return "no samples"
    return (f"n {len(values)}: p50 {percentile(values, 0.5):.1f} ms, p90 "
            f"{percentile(values, 0.9):.1f} ms, p99 {percentile(values, 0.99):.1f} ms, max "
            f"{max(values):.1f} ms")


def fit(points):
    """Least squares y = a + b x over [(x, y)]: (a, b)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return mean_y, math.nan
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return mean_y - b * mean_x, b


def verdict(ok):
    return "met" if ok else "NOT MET"


def metric_sum(body, name):
    """The sum of every series of `name` (all labels, the databases' included) in /metrics."""
    total = 0.0
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def describe_rounds(relay):
    """outboxd's own account of a drain, from /metrics: claims (count, mean time, mean batch,
    over every database) and the dispatcher's batch publishes."""
    return describe_rounds_of([relay])


def describe_rounds_of(relays):
    """describe_rounds over one or several outboxd, added up."""
    bodies = []
    for relay in relays:
        try:
            bodies.append(relay.metrics()[0])
        except OSError as error:
            if len(relays) == 1:
                return f"/metrics not read ({error})"
    body = b"\n".join(bodies)
    claims = metric_sum(body, "outbox_relay_claim_seconds_count")
    claim_time = metric_sum(body, "outbox_relay_claim_seconds_sum")
    claimed = metric_sum(body, "outbox_relay_claim_batch_size_sum")
    publishes = metric_sum(body, "outbox_relay_publish_seconds_count")
    publish_time = metric_sum(body, "outbox_relay_publish_seconds_sum")
    who = "outboxd's" if len(relays) == 1 else f"the {len(relays)} outboxd's"
    return (f"{who} claims {claims:,.0f} (all databases), mean "
            f"{1000 * claim_time / max(1, claims):.1f} ms, {claimed / max(1, claims):.0f} messages "
            f"each, {claim_time:.1f} s in all; batch publishes {publishes:,.0f}, mean "
            f"{1000 * publish_time / max(1, publishes):.1f} ms, {publish_time:.1f} s in all")


# --- case: idle -------------------------------------------------------------------------------


def idle_case(env, tenants, count, options):
    databases = tenants.databases(count)
    log(f"\n== idle: {count} tenant {tenants.layout} ({len(databases)} database(s)), no writes, "
        f"{options.idle_seconds:.0f} s window")
    entries = [(name, tenants.url(name), tenants.schema(name)) for name in tenants.names[:count]]
    logged = LogStatements(env, databases)
    relay = None
    try:
        relay = Outboxd(env, entries, f"idle{count}", legacy=options.legacy_config)
        log("  outboxd: " + ", ".join(f"{key} {relay.settings.get(key, '?')}" for key in (
            "lease", "idle_lease", "sweep_interval", "purge_interval", "stats_interval"))
            + " (--check-config)"
            + "".join(f"; [relay] {line}" for line in env.relay_settings))
        connections, settled = settle(env, databases, relay)
        log(f"  outboxd READY=1 after {relay.ready_seconds:.2f} s; {connections} connections to the "
            f"tenant databases, stable from {settled:.1f} s")
        time.sleep(options.settle_seconds)  # the first sweep and stats rounds are done
        statements = Statements(env, databases)
        backends = relay_backends(env, databases)
        statements.start()
        logged.start()
        cpu = CpuWindow(relay.pid, [row[0] for row in backends])
        window_start = now()
        time.sleep(options.idle_seconds)
        seconds = now() - window_start
        counted = statements.finish()
        used = cpu.finish()
        backends_after = relay_backends(env, databases)
        from_log = logged.finish({row[0] for row in backends} | {row[0] for row in backends_after})
        status = proc_status(relay.pid)
        body, fetch = relay.metrics()
        newline = b"\n"
    finally:
        if relay is not None:
            relay.stop()
        logged.reset()

    result = {"tenants": count, "seconds": seconds, "connections": len(backends_after)}
    if counted is not None:
        complete = counted["dealloc"] == 0 and not counted["reset"]
        log(f"  pg_stat_statements: {counted['total']:.0f} calls in the tenant databases in "
            f"{seconds:.1f} s = {counted['total'] / seconds:.3f}/s"
            + ("" if complete else f" (UNDERCOUNTED: {counted['dealloc']} deallocation(s)"
               f"{' and a reset' if counted['reset'] else ''} during the window)")
            + f"; entries {statements.entries} -> {counted['entries']} of "
            f"{env.scalar('SHOW pg_stat_statements.max')} (shared with other tests); "
            f"transactions in the tenant databases (pg_stat_database, autovacuum's included): "
            f"{counted['xacts']}")
    else:
        log("  pg_stat_statements: not loaded")
    if from_log is not None:
        source, total, queries = "server log", from_log["total"], from_log["queries"]
        log(f"  server log (log_statement = all on the tenant databases): {total} statements of "
            f"outboxd's sessions in the window"
            + (f", {from_log['unattributed']} of other sessions" if from_log["unattributed"]
               else ""))
    elif counted is not None:
        source, total, queries = "pg_stat_statements", counted["total"], counted["queries"]
    else:
        source, total, queries = None, math.nan, []
    per_second = total / seconds
    result["per_second"] = per_second
    result["queries"] = queries
    if source:
        log(f"  statements ({source}): {total:.0f} in {seconds:.1f} s = {per_second:.3f}/s in "
            f"total, {per_second / count:.4f}/s per tenant; by query (calls in the window, per "
            f"tenant per minute, {'sessions' if source == 'server log' else 'databases'} "
            f"issuing it):")
        for query, calls, issuers in queries[:25]:
            log(f"    {calls:7.0f}  {60 * calls / seconds / count:7.3f}/tenant/min  {issuers:5d}  "
                f"{query[:160]}")
    per_tenant = {}
    for _, datname, _, _, _ in backends_after:
        per_tenant[datname] = per_tenant.get(datname, 0) + 1
    log(f"  connections held: {len(backends_after)} to {len(per_tenant)} database(s) "
        f"(per database min {min(per_tenant.values(), default=0)}, max "
        f"{max(per_tenant.values(), default=0)}), by last statement (sessions, state, idle "
        f"for at least):")
    groups = {}
    for _, _, state, query, idle in backends_after:
        key = (re.sub(r"\$\d+|'[^']*'|\b\d+\b", "?", query)[:90], state)
        count_idle = groups.setdefault(key, [0, math.inf])
        count_idle[0] += 1
        count_idle[1] = min(count_idle[1], idle or 0)
    for (query, state), (sessions, idle) in sorted(groups.items(), key=lambda item: -item[1][0]):
        log(f"    {sessions:5d}  {state:<6}  {idle:7.1f} s  {query}")
    # The wake-up connection LISTENs; its last statement is LISTEN or relay_idle() (the mark
    # that the relay sleeps, sent after the LISTEN).
    listen = [row for row in backends_after
              if row[3].upper().startswith("LISTEN") or "relay_idle()" in row[3]]
    if listen:
        quiet = sum(1 for row in listen if (row[4] or 0) >= seconds)
        log(f"  wake-up (LISTEN) sessions: {len(listen)}, of which {quiet} idle since before the "
            "window (no statement sent in it, no NOTIFY woke them)")
    log(f"  outboxd: RSS {status.get('VmRSS', '?')}, peak {status.get('VmHWM', '?')}, threads "
        f"{status.get('Threads', '?')}, open files {status.get('fds', '?')}; /metrics "
        f"{len(body):,} bytes, {body.count(newline):,} lines, read in {1000 * fetch:.0f} ms")
    log(f"  {describe_cpu(used)}")
    result.update(rss=status.get("VmRSS"), threads=status.get("Threads"), fds=status.get("fds"),
                  cpu=used)
    return result


# --- case: latency ----------------------------------------------------------------------------


class QuietWriter(threading.Thread):
    """Commits one message every `interval` s into the quiet tenant; records COMMIT-returned."""

    def __init__(self, connection, schema, topic, payload, interval=0.1):
        super().__init__(daemon=True)
        self.connection, self.topic, self.interval = connection, topic, interval
        self.statement = enqueue_sql(schema)
        self.pad = pad(payload)
        self.committed = {}
        self.stopping = threading.Event()

    def run(self):
        seq, next_at = 0, now()
        while not self.stopping.is_set():
            seq += 1
            self.connection.execute(self.statement, {"topic": self.topic, "i": seq, "pad": self.pad,
                                                     "key": f"q{seq % 10}"})
            self.committed[seq] = now()
            next_at += self.interval
            delay = next_at - now()
            if delay > 0:
                self.stopping.wait(delay)
            else:
                next_at = now()


def insert_backlog(connection, schema, topic, count, payload, chunk=250000, commit=True):
    """`count` messages in one transaction (statements of `chunk`); returns the COMMIT time."""
    statement = bulk_enqueue_sql(schema)
    with connection.transaction():
        for lo in range(1, count + 1, chunk):
            connection.execute(statement, {"topic": topic, "pad": pad(payload), "lo": lo,
                                           "hi": min(count, lo + chunk - 1)})
        analyze(connection, schema)
    return now()


def analyze(connection, schema):
    """ANALYZE of the outbox's tables, in the writing transaction (its own rows count as live):
    the relay's first claims are planned on the backlog's statistics, not an empty table's. Without
    it, a backlog committed into a table last analyzed while empty was claimed with a plan that
    ran past the 15 s statement_deadline five times in a row (77 s without a message published)
    until autovacuum analyzed the table."""
    for table in ("messages", "stream_seqs"):
        connection.execute(sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema),
                                                          sql.Identifier(table)))


def latency_run(env, tenants, count, options, separate=False):
    """One latency case; with `separate`, each of the two tenants has an outboxd of its own."""
    quiet_name = tenants.names[1] if count >= 2 else tenants.names[0]
    backlog_name = tenants.names[0] if count >= 2 else None
    quiet_queue, backlog_queue = PREFIX + "quiet", PREFIX + "backlog"
    declare_queues(env, [quiet_queue, backlog_queue])
    for name in tenants.names[:2]:
        tenants.refresh(name)
    databases = tenants.databases(count)
    what = ("two outboxd, one per database ([database] configs)" if separate
            else f"one outboxd serving {count} tenant {tenants.layout}")
    log(f"\n== latency{' (control)' if separate else ''}: {what}; the quiet tenant "
        f"{quiet_name} commits one {options.payload} B message every 100 ms"
        + (f"; {backlog_name} drains {options.backlog:,} messages of {options.payload} B over "
           "1,000 streams, written in one transaction after the quiet phase"
           if backlog_name else " (the single-tenant figure: nothing else)"))
    relays = []
    writer = consumer = counter = None
    phases = {}
    try:
        if separate:
            for name, label in ((quiet_name, "quiet"), (backlog_name, "backlog")):
                relays.append(Outboxd(env, [(name, tenants.url(name), tenants.schema(name))],
                                      f"separate-{label}", legacy=True))
        else:
            entries = [(name, tenants.url(name), tenants.schema(name))
                       for name in tenants.names[:count]]
            relays.append(Outboxd(env, entries, f"latency{count}", legacy=options.legacy_config))
        for relay in relays:
            settle(env, databases, relay)
        time.sleep(options.settle_seconds)
        consumer = QuietConsumer(env.amqp_url, quiet_queue)
        consumer.start()
        consumer.ready.wait(30)
        writer_conn = tenants.connect(quiet_name)
        writer = QuietWriter(writer_conn, tenants.schema(quiet_name), quiet_queue, options.payload)
        writer.start()
        phase_start = now()
        quiet_seconds = options.quiet_seconds if backlog_name else options.single_seconds
        time.sleep(quiet_seconds)
        phases["a"] = (phase_start, now())
        if backlog_name:
            counter = Counter(env, backlog_queue, options.backlog)
            cpu = CpuWindow(relays[-1].pid, [])
            with tenants.connect(backlog_name, bulk=True) as backlog_conn:
                write_start = now()
                committed = insert_backlog(backlog_conn, tenants.schema(backlog_name),
                                           backlog_queue, options.backlog, options.payload)
            phases["b"] = (write_start, committed)
            drained = counter.wait(timeout=3600)
            counter = None
            used = cpu.finish()
            end = drained.get("last") or now()
            phases["c"] = (committed, end)
            log(f"  backlog: written in {committed - write_start:.1f} s; {drained.get('count', 0):,}"
                f" received; drain {drained.get('count', 0) / max(1e-9, end - committed):,.0f} "
                f"msgs/s from COMMIT to the last receipt ({end - committed:.1f} s)")
            log(f"  {describe_cpu(used)} (outboxd: the draining tenant's)")
        writer.stopping.set()
        writer.join()
        writer_conn.close()
        deadline = now() + 30
        while len(consumer.received) < len(writer.committed) and now() < deadline:
            time.sleep(0.1)
    finally:
        if writer is not None:
            writer.stopping.set()
        if consumer is not None:
            consumer.stopping.set()
        if counter is not None:
            counter.wait(timeout=1)
        for relay in relays:
            relay.stop()
        delete_queues(env, [quiet_queue, backlog_queue])

    missing = [seq for seq in writer.committed if seq not in consumer.received]
    log(f"  quiet tenant: {len(writer.committed)} committed, {len(consumer.received)} received, "
        f"{len(missing)} missing, {consumer.duplicates} duplicates")
    results = {}
    names = {"a": "quiet phase, other tenants idle", "b": "while the backlog is written",
             "c": "while the other tenant drains"}
    for phase, (start, end) in phases.items():
        values = [1000 * (consumer.received[seq] - at) for seq, at in writer.committed.items()
                  if start <= at < end and seq in consumer.received]
        results[phase] = values
        log(f"  commit -> consumer, {names[phase]} ({end - start:.0f} s): "
            f"{describe_latency(values)}")
    return results


# --- case: drain ------------------------------------------------------------------------------


def drain_run(env, tenants, count, options, spread):
    """--drain-messages over the first `count` tenants (`spread`) or all in t001."""
    queue = PREFIX + "drain"
    declare_queues(env, [queue])
    for name in tenants.names[:2]:
        tenants.refresh(name)
    targets = tenants.names[:count] if spread else tenants.names[:1]
    total = options.drain_messages
    share, extra = divmod(total, len(targets))
    started = now()
    lo = 1
    for index, name in enumerate(targets):
        n = share + (1 if index < extra else 0)
        if n == 0:
            continue
        with tenants.connect(name, bulk=True) as conn:
            conn.execute(bulk_enqueue_sql(tenants.schema(name)),
                         {"topic": queue, "pad": pad(options.payload), "lo": lo, "hi": lo + n - 1})
            analyze(conn, tenants.schema(name))
        lo += n
    load = now() - started
    where = (f"spread over all {count} tenants ({share:,}-{share + (1 if extra else 0):,} each)"
             if spread else f"all in {targets[0]} (outboxd serving {count} tenant(s))")
    log(f"  {total:,} messages of {options.payload} B {where}, written in {load:.1f} s before "
        "outboxd starts")
    databases = tenants.databases(count)
    statements = Statements(env, databases)
    statements.start()
    counter = Counter(env, queue, total)
    entries = [(name, tenants.url(name), tenants.schema(name)) for name in tenants.names[:count]]
    relay = None
    try:
        relay = Outboxd(env, entries, f"drain{count}{'s' if spread else '1'}",
                        legacy=options.legacy_config)
        cpu = CpuWindow(relay.pid, [])
        result = counter.wait(timeout=1800)
        used = cpu.finish()
        counted = statements.finish()
        rounds = describe_rounds(relay)
    finally:
        if relay is not None:
            relay.stop()
        delete_queues(env, [queue])
    received = result.get("count", 0)
    if received < total:
        log(f"  only {received:,} of {total:,} received")
    first, last = result.get("first"), result.get("last")
    rate = (received - 1) / (last - first) if first and last and last > first else math.nan
    middle = (0.8 * total / (result["ninetieth"] - result["tenth"])
              if result.get("ninetieth") and result.get("tenth") else math.nan)
    wall = last - relay.started if last else math.nan
    per_message = counted["total"] / received if counted and received else math.nan
    log(f"  {rate:,.0f} msgs/s first -> last receipt, {middle:,.0f} msgs/s from 10 % to 90 %; "
        f"outboxd READY=1 after {relay.ready_seconds:.2f} s, last receipt {wall:.1f} s after its "
        f"start ({received / wall if wall else math.nan:,.0f} msgs/s over that); "
        f"{per_message:.4f} statements/message (outboxd's start included)")
    log(f"  {describe_cpu(used)}")
    log(f"  {rounds}")
    left = tenants.count_left(count)
    if left:
        log(f"  {left} messages left unpublished in the tenants' tables")
    return rate


def drain_settled(env, tenants, count, options):
    """--drain-messages into t001 in one transaction while outboxd, started and settled, serves
    the first `count` tenants: the drain of one database beside N - 1 idle ones, without outboxd's
    start in it."""
    queue = PREFIX + "drain"
    declare_queues(env, [queue])
    for name in tenants.names[:2]:
        tenants.refresh(name)
    databases = tenants.databases(count)
    entries = [(name, tenants.url(name), tenants.schema(name)) for name in tenants.names[:count]]
    relay = counter = None
    try:
        relay = Outboxd(env, entries, f"settled{count}", legacy=options.legacy_config)
        settle(env, databases, relay)
        time.sleep(options.settle_seconds)
        counter = Counter(env, queue, options.drain_messages)
        with tenants.connect(tenants.names[0], bulk=True) as conn:
            write_start = now()
            committed = insert_backlog(conn, tenants.schema(tenants.names[0]), queue,
                                       options.drain_messages, options.payload)
        cpu = CpuWindow(relay.pid, [row[0] for row in relay_backends(env, databases)])
        result = counter.wait(timeout=1800)
        counter = None
        used = cpu.finish()
        rounds = describe_rounds(relay)
    finally:
        if counter is not None:
            counter.wait(timeout=1)
        if relay is not None:
            relay.stop()
        delete_queues(env, [queue])
    received, first, last = result.get("count", 0), result.get("first"), result.get("last")
    rate = (received - 1) / (last - first) if first and last and last > first else math.nan
    log(f"  {options.drain_messages:,} messages of {options.payload} B written into t001 in one "
        f"transaction ({committed - write_start:.1f} s) while outboxd, settled, serves {count} "
        f"tenant(s): {rate:,.0f} msgs/s first -> last receipt, "
        f"{received / (last - committed) if last else math.nan:,.0f} msgs/s COMMIT -> last")
    log(f"  {describe_cpu(used)}")
    log(f"  {rounds}")
    return rate


def drain_spread_settled(env, tenants, count, options, separate=False):
    """--drain-messages spread over the first `count` tenants while outboxd, started and settled,
    serves them: each tenant's share written in a transaction of its own, all held open, then
    committed one after the other (milliseconds apart). Needs `count` more connections, so it is
    skipped beyond --max-open-writers. `separate`: an outboxd per tenant ([database] configs)
    instead of one for all, the control."""
    if count > options.max_open_writers:
        log(f"  spread over {count} tenants with outboxd settled: not run (it holds {count} "
            f"writing transactions open, {count} connections beside outboxd's "
            f"{3 * count}; --max-open-writers {options.max_open_writers})")
        return math.nan
    queue = PREFIX + "drain"
    declare_queues(env, [queue])
    for name in tenants.names[:2]:
        tenants.refresh(name)
    databases = tenants.databases(count)
    entries = [(name, tenants.url(name), tenants.schema(name)) for name in tenants.names[:count]]
    total = options.drain_messages
    share, extra = divmod(total, count)
    relay = counter = None
    relays, writers = [], []
    try:
        if separate:
            for entry in entries:
                relays.append(Outboxd(env, [entry], f"separate{count}-{entry[0]}", legacy=True))
        else:
            relays.append(Outboxd(env, entries, f"spread{count}", legacy=options.legacy_config))
        relay = relays[0]
        settle(env, databases, relays[-1])  # all of them: their connections counted together
        time.sleep(options.settle_seconds)
        counter = Counter(env, queue, total)
        write_start = now()
        lo = 1
        for index, name in enumerate(tenants.names[:count]):
            n = share + (1 if index < extra else 0)
            conn = tenants.connect(name, bulk=True)
            writers.append(conn)
            conn.execute("BEGIN")
            conn.execute(bulk_enqueue_sql(tenants.schema(name)),
                         {"topic": queue, "pad": pad(options.payload), "lo": lo, "hi": lo + n - 1})
            analyze(conn, tenants.schema(name))
            lo += n
        backends = [row[0] for row in relay_backends(env, databases)]
        first_commit = now()
        for conn in writers:
            conn.execute("COMMIT")
        last_commit = now()
        cpu = CpuWindow(relay.pid, backends)
        relays_cpu = [proc_cpu(one.pid) for one in relays]
        result = counter.wait(timeout=1800)
        counter = None
        used = cpu.finish()
        used["outboxd"] = sum(proc_cpu(one.pid) - before
                              for one, before in zip(relays, relays_cpu))
        rounds = "; ".join(describe_rounds(one) for one in relays) if not separate else \
            describe_rounds_of(relays)
    finally:
        for conn in writers:
            conn.close()
        if counter is not None:
            counter.wait(timeout=1)
        for one in relays:
            one.stop()
        delete_queues(env, [queue])
    received, first, last = result.get("count", 0), result.get("first"), result.get("last")
    rate = (received - 1) / (last - first) if first and last and last > first else math.nan
    who = (f"{count} outboxd, one per tenant ([database] configs; CPU: all of them)" if separate
           else "outboxd")
    log(f"  {total:,} messages of {options.payload} B spread over all {count} tenants in open "
        f"transactions ({first_commit - write_start:.1f} s), committed within "
        f"{1000 * (last_commit - first_commit):.0f} ms while {who}, settled, serves them: "
        f"{rate:,.0f} msgs/s first -> last receipt, "
        f"{received / (last - first_commit) if last else math.nan:,.0f} msgs/s first COMMIT -> "
        "last")
    log(f"  {describe_cpu(used)}")
    log(f"  {rounds}")
    return rate


# --- main -------------------------------------------------------------------------------------


def drop_leftovers(env):
    rows = env.rows("SELECT datname FROM pg_database WHERE datname ~ '^mdb[0-9]+_'")
    for (datname,) in rows:
        pid = int(re.match(r"mdb(\d+)_", datname).group(1))
        if pid != os.getpid() and os.path.exists(f"/proc/{pid}"):
            continue  # a run still going
        env.monitor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                            .format(sql.Identifier(datname)))
        log(f"dropped {datname}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", default="1,10,100,500")
    parser.add_argument("--cases", default="idle,latency,separate,drain")
    parser.add_argument("--layout", choices=["databases", "schemas"], default="databases")
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--settle-seconds", type=float, default=12,
                        help="after the connections are stable, before a window (the first "
                             "sweep at 10 s included)")
    parser.add_argument("--quiet-seconds", type=float, default=20,
                        help="latency: the quiet phase before the backlog")
    parser.add_argument("--single-seconds", type=float, default=60,
                        help="latency with 1 tenant: how long the single-tenant figure is taken")
    parser.add_argument("--backlog", type=int, default=1000000)
    parser.add_argument("--drain-messages", type=int, default=100000)
    parser.add_argument("--payload", type=int, default=256)
    parser.add_argument("--relay-setting", action="append", default=[], metavar="LINE",
                        help="a line added to outboxd's [relay], e.g. 'lease = \"180s\"' "
                             "(repeatable)")
    parser.add_argument("--max-open-writers", type=int, default=100,
                        help="drain: the most tenants written in transactions held open at once")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--legacy-config", action="store_true",
                        help="[database] instead of [[databases]] (one tenant only)")
    parser.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    parser.add_argument("--drop-leftovers", action="store_true",
                        help="drop the databases of earlier runs (mdb<pid>_*) whose pid is gone")
    options = parser.parse_args()
    if options.quick:
        options.tenants = "1,10" if options.tenants == parser.get_default("tenants") else \
            options.tenants
        options.idle_seconds, options.backlog, options.drain_messages = 10, 50000, 20000
        options.quiet_seconds, options.single_seconds, options.settle_seconds = 5, 15, 5
    counts = sorted({int(n) for n in options.tenants.split(",")})
    cases = options.cases.split(",")
    if options.legacy_config and counts != [1]:
        sys.exit("--legacy-config serves one tenant: --tenants 1")

    env = Env(options)
    if options.drop_leftovers:
        drop_leftovers(env)
    others = env.scalar("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                        "'client backend'")
    load = os.getloadavg()
    log(f"bench/many_databases.py {shlex.join(sys.argv[1:])}")
    log(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {os.cpu_count()} cores, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{env.scalar('SHOW server_version')}, max_connections {env.max_connections} "
        f"({others} client sessions open before the run), pg_stat_statements.max "
        f"{env.scalar('SHOW pg_stat_statements.max')}; RLIMIT_NOFILE "
        f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}; outboxd of {options.bin} built {env.built}, "
        f"tree at {env.commit}")
    log(f"tenants: {counts} {options.layout}; payload {options.payload} B; cases {cases}")

    largest = max(counts + ([2] if "latency" in cases or "separate" in cases else []))
    tenants = Tenants(env, largest, options.layout)

    def cleanup():
        for relay in list(running):
            relay.stop()
        tenants.drop()
        log(f"outboxd's configurations and logs: {env.dir}")
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    summary = []
    if "idle" in cases:
        idle = [idle_case(env, tenants, count, options) for count in counts]
        points = [(r["tenants"], r["per_second"]) for r in idle if not math.isnan(r["per_second"])]
        log("\n== idle summary: tenants, statements/s in total, per tenant, connections, RSS, "
            "threads, outboxd CPU s/min")
        for r in idle:
            log(f"  {r['tenants']:5d}  {r['per_second']:8.3f}  {r['per_second'] / r['tenants']:8.4f}"
                f"  {r['connections']:5d}  {r['rss']}  {r['threads']}  "
                f"{60 * r['cpu']['outboxd'] / r['cpu']['seconds']:.2f}")
        if len(points) >= 2:
            a, b = fit(points)
            low, high = points[0], points[-1]
            marginal = (high[1] - low[1]) / (high[0] - low[0])
            summary.append(f"target: idle statements/s per idle tenant (least squares over "
                           f"{[p[0] for p in points]}: {a:.3f} + {b:.4f} x tenants; marginal "
                           f"{low[0]} -> {high[0]}: {marginal:.4f}) <= 0.05: "
                           f"{verdict(max(b, marginal) <= 0.05)}")
    single = None
    if "latency" in cases:
        by_count = {count: latency_run(env, tenants, count, options) for count in counts}
        single_values = by_count.get(1, {}).get("a")
        single = percentile(single_values, 0.99) if single_values else None
        for count, phases in by_count.items():
            if count >= 2 and single:
                p99 = percentile(phases.get("c", []), 0.99)
                summary.append(f"target: quiet tenant p99 while another drains, {count} tenants: "
                               f"{p99:.1f} ms <= 2 x single-tenant {single:.1f} ms = "
                               f"{2 * single:.1f} ms: {verdict(p99 <= 2 * single)}")
    if "separate" in cases:
        phases = latency_run(env, tenants, 2, options, separate=True)
        p99 = percentile(phases.get("c", []), 0.99)
        summary.append(f"bound: quiet tenant p99 while another drains, two separate outboxd "
                       f"(CPU contention alone): {p99:.1f} ms"
                       + (f" = {p99 / single:.1f} x single-tenant" if single else ""))
    if "drain" in cases:
        log(f"\n== drain: {options.drain_messages:,} messages, every tenant busy vs one database")
        for count in counts:
            busy = drain_run(env, tenants, count, options, spread=True) if count > 1 else None
            one = drain_run(env, tenants, count, options, spread=False)
            settled = drain_settled(env, tenants, count, options)
            if busy is not None:
                busy_settled = drain_spread_settled(env, tenants, count, options)
                summary.append(f"drain, {count} tenants, outboxd's start included: all busy "
                               f"{busy:,.0f} msgs/s, one database {one:,.0f} msgs/s "
                               f"({busy / one:.2f} x); outboxd settled first: all busy "
                               f"{busy_settled:,.0f} msgs/s, one database {settled:,.0f} msgs/s "
                               f"({busy_settled / settled:.2f} x)")
            else:
                summary.append(f"drain, 1 tenant: {one:,.0f} msgs/s, outboxd settled first "
                               f"{settled:,.0f} msgs/s")
    if "drain-separate" in cases:
        log(f"\n== drain, the control: {options.drain_messages:,} messages spread over N tenants, "
            "each served by an outboxd of its own")
        for count in counts:
            if count > 1:
                rate = drain_spread_settled(env, tenants, count, options, separate=True)
                summary.append(f"drain, {count} tenants all busy, an outboxd per tenant, settled "
                               f"first: {rate:,.0f} msgs/s")
    log("\n== summary")
    for line in summary:
        log("  " + line)


if __name__ == "__main__":
    main()
