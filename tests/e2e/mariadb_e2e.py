#!/usr/bin/env python3
"""outboxd on MariaDB, end to end, checked by clients that are not ours.

Writers: PyMySQL (Debian's python3-pymysql), 8 threads, each transaction inserting an order into
the application's own database and calling the outbox's stored procedure in the same transaction;
a fifth of them roll back. Consumer: pika (python3-pika) on the RabbitMQ queue the relay publishes
to. Meanwhile the relay is killed with SIGKILL and started again, and the broker is stopped and
started. At the end every committed message must have been delivered (0 lost), nothing rolled
back may appear (0 phantom), and within each stream the first deliveries come in stream_seq order,
gap-free from 1.

  mariadb_e2e.py --outboxd PATH --outboxctl PATH --services PATH [--messages N]

Reads OUTBOX_TEST_MARIADB_URL and OUTBOX_TEST_AMQP_URL (scripts/services env). Exits non-zero
with the reason on any failure.
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import pika
import pymysql

WRITERS = 8
STREAMS = 200


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def mariadb_params(url):
    parts = urllib.parse.urlsplit(url)
    return dict(host=parts.hostname or "127.0.0.1", port=parts.port or 3306,
                user=urllib.parse.unquote(parts.username or ""),
                password=urllib.parse.unquote(parts.password or ""), autocommit=True)


class Consumer(threading.Thread):
    """Records every delivery of `queue`: (message id, stream key, stream seq), in arrival order.
    Reconnects while the broker is down."""

    def __init__(self, amqp_url, queue):
        super().__init__(daemon=True)
        self.amqp_url, self.queue = amqp_url, queue
        self.lock = threading.Lock()
        self.deliveries = []
        self.stopping = threading.Event()
        self.reconnects = 0

    def run(self):
        while not self.stopping.is_set():
            try:
                connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
                channel = connection.channel()
                channel.queue_declare(self.queue, durable=True)
                channel.basic_qos(prefetch_count=500)
                for method, properties, _body in channel.consume(self.queue, inactivity_timeout=0.2):
                    if self.stopping.is_set():
                        break
                    if method is None:
                        continue
                    headers = properties.headers or {}
                    key = headers.get("outbox-stream-key")
                    seq = headers.get("outbox-stream-seq")
                    with self.lock:
                        self.deliveries.append((properties.message_id,
                                                key.decode() if isinstance(key, bytes) else key,
                                                int(seq) if seq is not None else None))
                    channel.basic_ack(method.delivery_tag)
                connection.close()
            except (pika.exceptions.AMQPError, OSError):
                self.reconnects += 1
                time.sleep(0.3)

    def snapshot(self):
        with self.lock:
            return list(self.deliveries)


class Relay:
    def __init__(self, outboxd, config, log_path):
        self.outboxd, self.config, self.log_path = outboxd, config, log_path
        self.process = None

    def start(self):
        self.process = subprocess.Popen([self.outboxd, "--config", self.config],
                                        stdout=open(self.log_path, "ab"),
                                        stderr=subprocess.STDOUT)

    def check_alive(self):
        if self.process.poll() is not None:
            with open(self.log_path, errors="replace") as relay_log:
                sys.stderr.write(relay_log.read()[-4000:])
            sys.exit("FAIL: outboxd exited with %d" % self.process.returncode)

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--outboxd", required=True)
    parser.add_argument("--outboxctl", required=True)
    parser.add_argument("--services", required=True)
    parser.add_argument("--messages", type=int, default=20000)
    args = parser.parse_args()

    mariadb_url = os.environ.get("OUTBOX_TEST_MARIADB_URL",
                                 "mariadb://outbox:outbox@127.0.0.1:13306/outbox_test")
    amqp_url = os.environ.get("OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    suffix = "%d_%d" % (os.getpid(), random.randrange(1_000_000))
    schema, app_db, queue = "e2e_outbox_" + suffix, "e2e_app_" + suffix, "mariadb_e2e_" + suffix
    params = mariadb_params(mariadb_url)
    work = tempfile.mkdtemp(prefix="outbox-mariadb-e2e-")
    config = os.path.join(work, "outboxd.toml")
    with open(config, "w") as out:
        out.write(f"""[database]
type = "mariadb"
url = "{mariadb_url}"
schema = "{schema}"
[relay]
instance = "mariadb-e2e"
batch_size = 500
lease = "10s"
publish_timeout = "4s"
max_backoff = "500ms"
shutdown_timeout = "5s"
[retry]
initial_delay = "100ms"
max_delay = "200ms"
max_attempts = 1000
[sinks.default]
type = "rabbitmq"
url = "{amqp_url}"
routing_key = "{{topic}}"
[http]
listen = ""
""")
    subprocess.run([args.outboxctl, "--config", config, "migrate"], check=True)
    admin = pymysql.connect(**params)
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {app_db}")
        cursor.execute(f"CREATE TABLE {app_db}.orders (id BIGINT PRIMARY KEY, stream VARCHAR(32))")

    consumer = Consumer(amqp_url, queue)
    consumer.start()
    relay = Relay(args.outboxd, config, os.path.join(work, "outboxd.log"))
    relay.start()
    time.sleep(0.5)
    relay.check_alive()

    committed, rolled_back, stream_of = set(), set(), {}
    lock = threading.Lock()
    next_index = [0]
    errors = []

    def writer(number):
        rng = random.Random(number)
        conn = pymysql.connect(**dict(params, autocommit=False, database=app_db))
        try:
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= args.messages:
                    return
                stream = "s%d" % rng.randrange(STREAMS)
                for attempt in range(20):
                    try:
                        with conn.cursor() as cursor:
                            cursor.execute("INSERT INTO orders VALUES (%s, %s)", (i, stream))
                            cursor.execute(
                                f"CALL {schema}.enqueue(%s, %s, %s, NULL, NULL, NULL, NULL, "
                                "NULL, NULL)",
                                (queue, '{"n": %d}' % i, stream))
                            event_id = cursor.fetchone()[0]
                            while cursor.nextset():
                                pass
                        commit = rng.randrange(5) != 0
                        if commit:
                            conn.commit()
                        else:
                            conn.rollback()
                        break
                    except pymysql.err.OperationalError as error:  # deadlock: run it again
                        conn.rollback()
                        if error.args[0] != 1213 or attempt == 19:
                            raise
                with lock:
                    (committed if commit else rolled_back).add(event_id)
                    stream_of[event_id] = stream
        except Exception as error:  # noqa: BLE001: reported below
            errors.append("writer %d: %r" % (number, error))
        finally:
            conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()

    def progress():
        with lock:
            return next_index[0]

    # Faults while the writers write: SIGKILL the relay at a third, the broker down at two thirds.
    while progress() < args.messages // 3 and not errors:
        time.sleep(0.05)
    log("SIGKILL the relay after", progress(), "transactions,",
        len(consumer.snapshot()), "delivered")
    relay.kill()
    time.sleep(0.5)
    relay.start()
    while progress() < 2 * args.messages // 3 and not errors:
        time.sleep(0.05)
    log("broker stopped after", progress(), "transactions")
    subprocess.run([args.services, "rabbitmqctl", "stop_app"], check=True,
                   stdout=subprocess.DEVNULL)
    time.sleep(2)
    subprocess.run([args.services, "rabbitmqctl", "start_app"], check=True,
                   stdout=subprocess.DEVNULL)
    log("broker started")
    for thread in threads:
        thread.join()
    wrote = time.monotonic() - started
    log("written: %d committed, %d rolled back in %.1f s" % (len(committed), len(rolled_back),
                                                             wrote))
    if errors:
        sys.exit("FAIL: " + "; ".join(errors[:5]))

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        relay.check_alive()
        seen = {d[0] for d in consumer.snapshot()}
        if committed <= seen:
            break
        time.sleep(0.2)
    time.sleep(1)  # anything late (a phantom, a duplicate) shows up too
    relay.stop()
    consumer.stopping.set()
    consumer.join(timeout=5)
    deliveries = consumer.snapshot()
    seen = {d[0] for d in deliveries}
    lost = committed - seen
    phantom = seen - committed
    duplicates = len(deliveries) - len(seen)

    # Per stream: first deliveries in stream_seq order, 1, 2, 3, ... with no gap.
    first_seqs = {}
    firsts = set()
    bad_order = 0
    for message_id, key, seq in deliveries:
        if message_id in firsts:
            continue
        firsts.add(message_id)
        if key != stream_of.get(message_id):
            bad_order += 1
            continue
        expected = first_seqs.get(key, 0) + 1
        if seq != expected:
            bad_order += 1
        first_seqs[key] = seq if seq is not None else expected
    log("delivered %d (%d distinct, %d duplicates); lost %d, phantom %d, out of order %d; "
        "consumer reconnects %d; drained %.1f s after the writers" %
        (len(deliveries), len(seen), duplicates, len(lost), len(phantom), bad_order,
         consumer.reconnects, time.monotonic() - started - wrote))

    with admin.cursor() as cursor:
        cursor.execute(f"SELECT status, COUNT(*) FROM {schema}.messages GROUP BY status")
        statuses = dict(cursor.fetchall())
        cursor.execute(f"DROP DATABASE {app_db}")
        cursor.execute(f"DROP DATABASE {schema}")
    # The test's queue, gone with the test.
    try:
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        connection.channel().queue_delete(queue)
        connection.close()
    except pika.exceptions.AMQPError:
        pass
    failures = []
    if lost:
        failures.append("%d lost, e.g. %s" % (len(lost), sorted(lost)[:3]))
    if phantom:
        failures.append("%d phantom (rolled back or never written), e.g. %s" %
                        (len(phantom), sorted(phantom)[:3]))
    if bad_order:
        failures.append("%d first deliveries out of stream order" % bad_order)
    if statuses.get("abandoned"):
        failures.append("%d abandoned" % statuses["abandoned"])
    if failures:
        with open(os.path.join(work, "outboxd.log"), errors="replace") as relay_log:
            sys.stderr.write(relay_log.read()[-4000:])
        sys.exit("FAIL: " + "; ".join(failures))
    log("OK")


if __name__ == "__main__":
    main()
