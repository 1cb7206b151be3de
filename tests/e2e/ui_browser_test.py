#!/usr/bin/env python3
"""outboxd's dashboard (/ui) in a real headless browser.

Debian's chromium and chromium-driver, driven by python3-selenium, against the real outboxd:
  --store postgres  PostgreSQL (OUTBOX_TEST_PG_URL, a schema of its own, dropped at the end) and
                    RabbitMQ (OUTBOX_TEST_AMQP_URL) as the sink, plus a second target whose broker
                    is down (its messages wait: something to abandon, a reason for "not ready");
  --store sqlite    the embedded store with a file sink; then again without a token (read-only);
  --store many      one outboxd relaying many databases ([[databases]]): two schemas of
                    OUTBOX_TEST_PG_URL and a third database that cannot be reached, a file sink.

It checks that the overview's counts equal the database's, that a filter finds a given message
and shows its headers, last error and payload, that replaying an abandoned message from the page
makes it published (a dry run first, which changes nothing), that abandoning with a reason works,
that a wrong token shows an error and changes nothing, and that a topic, header, error or payload
holding "<script>" is shown as text and never runs. With many databases: the selector lists them
(the unreachable one marked not relayed, with why), the choice is kept (hash, localStorage), the
lists show the chosen database's messages only, a replay acts on the chosen database only, and
every admin request the page sends names its database. Screenshots of every page go to --artifacts.

Every process it starts (outboxd, chromedriver and its chromium) is stopped in a finally block,
by its own process id or process group; the whole test is bounded by --deadline seconds.
"""

import argparse
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:
    sys.exit("ui_browser_test: python3-selenium is missing: run scripts/install-deps tools")

TOKEN = "ui-test-" + secrets.token_hex(8)
XSS_TOPIC = "<script>document.title='pwned';window.__pwned=1</script>"
XSS_PAYLOAD = '<img src=x onerror="window.__pwned=2"><script>window.__pwned=3</script>'
XSS_HEADER = "<b onmouseover=alert(1)>bold</b><script>window.__pwned=4</script>"
XSS_REASON = "<script>window.__pwned=5</script> rejected"
PAYMENT_REASON = "payment gateway rejected the message: 422 unknown currency 'XBT'"
WAIT = 20  # seconds, every wait for the page


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def log(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, predicate, timeout=WAIT, interval=0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as error:  # pylint: disable=broad-except
            last = error
        time.sleep(interval)
    raise Failure(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


# ---- the stores, read directly ----


class Postgres:
    def __init__(self, url, schema):
        self.url, self.schema = url, schema

    def sql(self, statement):
        result = subprocess.run(
            ["psql", self.url, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", statement],
            capture_output=True, text=True, timeout=30, check=False)
        if result.returncode != 0:
            raise Failure(f"psql failed: {result.stderr.strip()}")
        return [line.split("|") for line in result.stdout.splitlines() if line]

    def counts(self):
        rows = self.sql(f"SELECT status, count(*) FROM {self.schema}.messages GROUP BY status")
        return {status: int(count) for status, count in rows}

    def message(self, message_id):
        rows = self.sql(f"SELECT status, coalesce(last_error, '') FROM {self.schema}.messages "
                        f"WHERE id = '{message_id}'")
        return tuple(rows[0]) if rows else None

    def drop(self):
        self.sql(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


class Sqlite:
    def __init__(self, path):
        self.path = path

    def query(self, statement, args=()):
        with sqlite3.connect(self.path, timeout=10) as db:
            return db.execute(statement, args).fetchall()

    def counts(self):
        return dict(self.query("SELECT status, count(*) FROM outbox_messages GROUP BY status"))

    def message(self, message_id):
        rows = self.query("SELECT status, coalesce(last_error, '') FROM outbox_messages "
                          "WHERE id = ?", (message_id,))
        return tuple(rows[0]) if rows else None


# ---- processes ----


class Outboxd:
    def __init__(self, binary, config_text, workdir, name):
        self.config = os.path.join(workdir, f"{name}.toml")
        self.log_path = os.path.join(workdir, f"{name}.log")
        with open(self.config, "w", encoding="utf-8") as out:
            out.write(config_text)
        self.log_file = open(self.log_path, "wb")  # pylint: disable=consider-using-with
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            [binary, "--config", self.config], stdout=self.log_file, stderr=subprocess.STDOUT,
            start_new_session=True)

    def log_text(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as log_in:
            return log_in.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.log_file.close()
        return self.process.returncode


def http_get(port, path, token=TOKEN):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def start_browser(workdir):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--hide-scrollbars",
                f"--user-data-dir={os.path.join(workdir, 'chromium-profile')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path="/usr/bin/chromedriver",
                      log_path=os.path.join(workdir, "chromedriver.log"),
                      popen_kw={"start_new_session": True})
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(WAIT)
    driver.set_script_timeout(WAIT)
    return driver, service


def stop_browser(driver, service):
    try:
        if driver is not None:
            driver.quit()
    except Exception as error:  # pylint: disable=broad-except
        log(f"driver.quit failed: {error}")
    process = getattr(service, "process", None) if service is not None else None
    if process is not None and process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # chromedriver's own group: it and its chromium
        except ProcessLookupError:
            pass
        process.wait(timeout=10)


# ---- the page ----


class Page:
    def __init__(self, driver, port, artifacts, prefix):
        self.driver, self.port, self.artifacts, self.prefix = driver, port, artifacts, prefix

    def url(self, fragment=""):
        return f"http://127.0.0.1:{self.port}/ui" + (f"#{fragment}" if fragment else "")

    def find(self, element_id):
        return self.driver.find_element(By.ID, element_id)

    def text(self, element_id):
        return self.find(element_id).text

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def go(self, page):
        self.js("location.hash = arguments[0]", "#" + page)
        wait_for(f"page {page} rendered",
                 lambda: self.js("return document.body.getAttribute('data-rendered')") == page)

    def fill(self, element_id, value):
        field = self.find(element_id)
        field.clear()
        if value:
            field.send_keys(value)

    def banner(self):
        node = self.find("banner")
        return node.text if node.is_displayed() else ""

    def rows(self, table_id):
        return self.driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr[data-id]")

    def screenshot(self, name):
        os.makedirs(self.artifacts, exist_ok=True)
        path = os.path.join(self.artifacts, f"{self.prefix}-{name}.png")
        self.driver.save_screenshot(path)
        log(f"screenshot {path}")
        return path

    def assert_not_pwned(self):
        title, pwned = self.js("return [document.title, window.__pwned === undefined ? null : window.__pwned]")
        check(title == "outbox", f"document.title changed to {title!r}: a script ran")
        check(pwned is None, f"window.__pwned = {pwned!r}: a script from the data ran")

    def counts(self):
        return {status: self.text(f"count-{status}") for status in
                ("pending", "processing", "failed", "abandoned", "published")}

    def login(self, token):
        self.fill("token-input", token)
        self.find("token-submit").click()


def expected_counts(counts):
    return {status: f"{counts.get(status, 0):,}" for status in
            ("pending", "processing", "failed", "abandoned", "published")}


def rows_when(page, table_id, expect, what):
    def ready():
        rows = page.rows(table_id)
        return rows if rows and (expect is None or len(rows) == expect) else None
    return wait_for(what, ready)


def search_messages(page, expect, **filters):
    page.go("messages")
    Select(page.find("f-status")).select_by_value(filters.get("status", ""))
    for key, field in (("topic", "f-topic"), ("stream", "f-stream"), ("target", "f-target"),
                       ("older_than", "f-older"), ("event", "f-event")):
        page.fill(field, filters.get(key, ""))
    # The table is rebuilt from the answer: empty it first so that only the answer fills it.
    page.js("document.querySelector('#messages-table tbody').replaceChildren()")
    page.find("f-search").click()
    return rows_when(page, "messages-table", expect, f"{expect} messages matching {filters}")


def open_detail(page, message_id):
    page.driver.find_element(By.CSS_SELECTOR, f"#messages-table tr[data-id='{message_id}']").click()
    wait_for("the message detail", lambda: page.find("message-detail").is_displayed() and
             message_id in page.text("detail-fields"))


def abandoned_list(page, status="abandoned", topic="", target="", expect=None):
    page.go("abandoned")
    Select(page.find("ab-status")).select_by_value(status)
    page.fill("ab-topic", topic)
    page.fill("ab-target", target)
    page.js("document.querySelector('#ab-table tbody').replaceChildren()")
    page.find("ab-search").click()
    return rows_when(page, "ab-table", expect, f"{expect} {status} messages")


def select_ids(page, ids):
    page.find("ab-scope-selected").click()
    for box in page.driver.find_elements(By.CSS_SELECTOR, ".ab-select"):
        if box.get_attribute("data-id") in ids and not box.is_selected():
            box.click()


# ---- the scenario ----


def seed(seed_binary, args, messages):
    lines = "".join(json.dumps(m) + "\n" for m in messages)
    result = subprocess.run([seed_binary] + args, input=lines, capture_output=True, text=True,
                            timeout=60, check=False)
    if result.returncode != 0:
        raise Failure(f"seeding failed: {result.stderr.strip()}")
    return result.stdout.split()


def scenario_messages(partner):
    messages = []
    for i in range(12):
        messages.append({"topic": "orders", "stream": f"order-{i}", "type": "OrderPlaced",
                         "payload": json.dumps({"order": i, "total": 10 + i, "currency": "EUR"}),
                         "headers": {"correlation_id": f"req-{1000 + i}"}})
    for i in range(3):
        messages.append({"topic": "payments", "stream": f"payment-{i}", "type": "PaymentCaptured",
                         "payload": json.dumps({"payment": i, "amount": 5 * (i + 1), "currency": "XBT"}),
                         "headers": {"correlation_id": f"pay-{i}"}, "abandon": PAYMENT_REASON})
    messages.append({"topic": XSS_TOPIC, "stream": "xss", "payload": XSS_PAYLOAD,
                     "headers": {"x-note": XSS_HEADER}, "abandon": XSS_REASON})
    if partner:
        for i in range(4):
            messages.append({"topic": "invoices", "stream": f"invoice-{i}", "target": "partner",
                             "type": "InvoiceIssued",
                             "payload": json.dumps({"invoice": i, "due": "2026-12-31"})})
    return messages


def check_headers(port):
    status, headers, body = http_get(port, "/ui", token="")
    check(status == 200, f"/ui without a token: {status}")
    csp = headers.get("Content-Security-Policy", "")
    check("default-src 'self'" in csp and "unsafe-inline" not in csp, f"CSP: {csp!r}")
    check(headers.get("X-Content-Type-Options") == "nosniff", f"nosniff: {headers}")
    check(headers.get("Content-Type", "").startswith("text/html"), f"type: {headers}")
    check(b"<script src=\"/ui/app.js\"" in body, "index.html is served")
    etag = headers.get("ETag", "")
    check(etag.startswith('"') and len(etag) == 66, f"strong ETag: {etag!r}")
    request = urllib.request.Request(f"http://127.0.0.1:{port}/ui/", headers={"If-None-Match": etag})
    try:
        urllib.request.urlopen(request, timeout=5)  # pylint: disable=consider-using-with
        check(False, "If-None-Match with the ETag must give 304")
    except urllib.error.HTTPError as error:
        check(error.code == 304, f"If-None-Match: {error.code}")
    for path, kind in (("/ui/app.js", "text/javascript"), ("/ui/style.css", "text/css")):
        status, headers, _ = http_get(port, path, token="")
        check(status == 200 and headers.get("Content-Type", "").startswith(kind), f"{path}: {status} {headers}")
    check(http_get(port, "/ui/nope.js", token="")[0] == 404, "/ui/nope.js is 404")
    check(http_get(port, "/api/outbox/rates", token="")[0] == 401, "the rates need the token")
    status, _, body = http_get(port, "/api/outbox/rates")
    check(status == 200 and "published" in json.loads(body), f"/api/outbox/rates: {status} {body[:200]!r}")


def run_common(page, store, ids, partner):
    """The checks both stores share. ids: the seeded ids in scenario order."""
    orders, payments, xss = ids[0:12], ids[12:15], ids[15]

    # The token is asked for; a wrong one is refused and not kept.
    page.driver.get(page.url())
    wait_for("the token form", lambda: page.find("token-form").is_displayed())
    check("token" in page.banner(), f"banner asks for the token: {page.banner()!r}")
    page.login("wrong-" + TOKEN)
    wait_for("the refusal", lambda: "refused" in page.banner())
    check(page.js("return sessionStorage.getItem('outbox.token')") is None, "a wrong token is not kept")
    page.login(TOKEN)
    wait_for("the overview", lambda: page.js("return document.body.getAttribute('data-rendered')") == "overview")
    check(page.js("return sessionStorage.getItem('outbox.token')") == TOKEN, "the token is kept for the tab")

    # Overview: the counts equal the database's (the page refreshes every 2 s).
    wait_for("the overview's counts to equal the database's",
             lambda: page.counts() == expected_counts(store.counts()), timeout=30)
    log(f"overview counts {page.counts()} == database {store.counts()}")
    wait_for("the rates chart", lambda: page.driver.find_elements(By.CSS_SELECTOR, "#rates-chart svg path.published"))
    wait_for("readiness reasons", lambda: page.driver.find_elements(By.CSS_SELECTOR, "#ready-reasons li"))
    check("database: ok" in page.text("ready-reasons"), f"reasons: {page.text('ready-reasons')!r}")
    wait_for("latency percentiles", lambda: "p50" in page.text("latency") and "–" not in page.text("latency").split("\n")[0])
    if partner:
        check(page.text("ready-state") == "Not ready", f"ready state: {page.text('ready-state')!r}")
        check("partner" in page.text("ready-reasons"), f"why not ready: {page.text('ready-reasons')!r}")
    page.assert_not_pwned()
    page.screenshot("overview")

    # Topics: the backlog by topic, the <script> topic as text.
    page.go("topics")
    wait_for("the script topic as text", lambda: XSS_TOPIC in page.text("topics-table"))
    page.assert_not_pwned()
    page.screenshot("topics")

    # Messages: a filter finds a given message; its headers, payload.
    rows = search_messages(page, 1, topic="orders", stream="order-7")
    check(rows[0].get_attribute("data-id") == orders[7], "order-7 found by its stream")
    open_detail(page, orders[7])
    check("req-1007" in page.text("detail-headers"), f"headers: {page.text('detail-headers')!r}")
    check('"order": 7' in page.text("detail-payload"), f"payload: {page.text('detail-payload')!r}")
    search_messages(page, 3, status="abandoned", topic="payments")
    open_detail(page, payments[0])
    check(PAYMENT_REASON in page.text("detail-error"), f"last error: {page.text('detail-error')!r}")
    search_messages(page, 1, event=xss)
    open_detail(page, xss)
    check(page.text("detail-payload") == XSS_PAYLOAD, f"payload as text: {page.text('detail-payload')!r}")
    check(XSS_HEADER in page.text("detail-headers"), "header as text")
    check(XSS_TOPIC in page.text("detail-fields"), "topic as text")
    check(XSS_REASON in page.text("detail-error"), "reason as text")
    check(not page.driver.find_elements(By.CSS_SELECTOR, "#message-detail img, #message-detail script, #message-detail b"),
          "no element was made from the data")
    page.assert_not_pwned()
    page.screenshot("messages")

    # Abandoned: a dry run (changes nothing), then the replay; the relay publishes it.
    abandoned_list(page, expect=4)
    select_ids(page, {payments[0]})
    page.find("ab-replay").click()
    wait_for("the dry run", lambda: page.find("ab-confirm").is_displayed())
    check("would replay 1 message" in page.text("ab-confirm-text"), page.text("ab-confirm-text"))
    check(store.message(payments[0])[0] == "abandoned", "a dry run changes nothing")
    page.screenshot("abandoned")
    page.find("ab-confirm-go").click()
    wait_for("the replay's result", lambda: "Replayed 1 message" in page.text("ab-result"))
    wait_for("the replayed message to be published",
             lambda: store.message(payments[0])[0] == "published", timeout=30)
    log(f"replayed {payments[0]}: {store.message(payments[0])}")
    wait_for("the list without it", lambda: len(page.rows("ab-table")) == 3)

    # A wrong token (say, rotated on the server): an error, and nothing changes.
    before = store.counts()
    page.js("sessionStorage.setItem('outbox.token', arguments[0])", "rotated-" + TOKEN)
    select_ids(page, {payments[1]})
    page.find("ab-replay").click()
    wait_for("the 401 error", lambda: "refused (401)" in page.banner())
    check(store.message(payments[1])[0] == "abandoned", "a refused replay changes nothing")
    check(store.counts() == before, f"counts unchanged: {before} -> {store.counts()}")
    page.screenshot("wrong-token")
    page.js("sessionStorage.removeItem('outbox.token')")
    page.driver.refresh()
    wait_for("the token form again", lambda: page.find("token-form").is_displayed())
    page.login(TOKEN)
    wait_for("logged in again", lambda: page.js("return sessionStorage.getItem('outbox.token')") == TOKEN)
    page.assert_not_pwned()
    return orders, payments, xss


def skip_a_held_stream(page, store, message_id):
    """on_abandon = "hold" (docs/dead-letters.md): the held message is listed under its own
    status choice and skipped after a dry run; it stays abandoned, no longer holding."""
    store.sql(f"UPDATE {store.schema}.messages SET holds_stream = true WHERE id = '{message_id}'")
    abandoned_list(page, status="held", expect=1)
    check("holds its stream" in page.text("ab-table"), page.text("ab-table"))
    select_ids(page, {message_id})
    page.find("ab-skip").click()
    wait_for("the dry run", lambda: page.find("ab-confirm").is_displayed())
    check("would skip 1 message" in page.text("ab-confirm-text"), page.text("ab-confirm-text"))
    check(store.sql(f"SELECT holds_stream FROM {store.schema}.messages WHERE id = '{message_id}'") == [["t"]],
          "a dry run changes nothing")
    page.find("ab-confirm-go").click()
    wait_for("the skip's result", lambda: "Skipped 1 message" in page.text("ab-result"))
    check(store.sql(f"SELECT status, holds_stream FROM {store.schema}.messages WHERE id = '{message_id}'")
          == [["abandoned", "f"]], "skipped: abandoned, no longer holding")


def abandon_with_reason(page, store, partner_ids, reason):
    abandoned_list(page, status="pending", target="partner", expect=len(partner_ids))
    page.find("ab-scope-all").click()
    page.fill("ab-reason", reason)
    page.find("ab-abandon").click()
    wait_for("the dry run", lambda: page.find("ab-confirm").is_displayed())
    check(f"would abandon {len(partner_ids)} messages" in page.text("ab-confirm-text"), page.text("ab-confirm-text"))
    check(all(store.message(i)[0] == "pending" for i in partner_ids), "the dry run changes nothing")
    page.find("ab-confirm-go").click()
    wait_for("the abandon's result", lambda: f"Abandoned {len(partner_ids)} messages" in page.text("ab-result"))
    for message_id in partner_ids:
        status, error = store.message(message_id)
        check(status == "abandoned" and error == "abandoned by operator: " + reason, f"{message_id}: {status} {error}")


def load(store, seconds):
    """Traffic for the chart (--load-seconds, for the README's screenshots): a writer whose rate
    swells and ebbs, all of it published; ends with nothing pending but the test's own."""
    import math  # pylint: disable=import-outside-toplevel
    log(f"writing for {seconds}s")
    started = time.monotonic()
    published = store.counts().get("published", 0)
    while time.monotonic() - started < seconds:
        t = time.monotonic() - started
        batch = int(60 + 50 * math.sin(t / 9) + 25 * math.sin(t / 2.3))
        store.sql(f"SELECT {store.schema}.enqueue(topic => (ARRAY['orders','shipments','invoices.sent'])[1 + g % 3], "
                  f"payload => json_build_object('n', g)::text, stream_key => 'cart-' || (g % 50)) "
                  f"FROM generate_series(1, {batch}) AS g")
        published += batch
        time.sleep(0.5)
    wait_for("the load published", lambda: store.counts().get("published", 0) >= published, timeout=60)


class Processes:
    """outboxd and the browser of one run: on the way out, outboxd's log when the run failed, then
    both stopped, whatever happened."""

    def __init__(self):
        self.outboxd = self.driver = self.service = None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if kind is not None and self.outboxd is not None:
            log("outboxd log:\n" + self.outboxd.log_text()[-4000:])
        stop_browser(self.driver, self.service)
        if self.outboxd is not None:
            log(f"outboxd exited with {self.outboxd.stop()}")
        return False


def run_postgres(args, workdir):
    url = os.environ.get("OUTBOX_TEST_PG_URL", "postgresql://outbox:outbox@127.0.0.1:15432/outbox_test")
    amqp = os.environ.get("OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    schema = "ui_" + secrets.token_hex(4)
    store = Postgres(url, schema)
    port, dead_port = free_port(), free_port()
    try:
        with Processes() as run:
            ids = seed(args.seed, ["--postgres", url, "--schema", schema], scenario_messages(partner=True))
            config = f"""[database]
url = "{url}"
schema = "{schema}"
[relay]
instance = "relay-eu-1"
sweep_interval = "200ms"
min_backoff = "60s"
max_backoff = "60s"
[retry]
max_attempts = 3
[retention]
published = "1h"
[http]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"
stats_interval = "300ms"
ready_max_age = "3s"
[sinks.default]
type = "rabbitmq"
url = "{amqp}"
mandatory = false
[sinks.partner]
type = "rabbitmq"
url = "amqp://guest:guest@127.0.0.1:{dead_port}/"
"""
            run.outboxd = Outboxd(args.outboxd, config, workdir, "outboxd-postgres")
            wait_for("outboxd's listener", lambda: http_get(port, "/healthz")[0] == 200)
            wait_for("the orders published", lambda: store.counts().get("published", 0) == 12)
            if args.load_seconds:
                load(store, args.load_seconds)
            check_headers(port)
            run.driver, run.service = start_browser(workdir)
            page = Page(run.driver, port, args.artifacts, "postgres")
            _, payments, _ = run_common(page, store, ids, partner=True)
            abandon_with_reason(page, store, ids[16:20], "partner API retired; invoices are re-sent by hand")
            skip_a_held_stream(page, store, payments[1])
            page.go("relays")
            wait_for("this relay", lambda: "relay-eu-1" in page.text("relay-self"))
            check("live relays" in page.text("relay-shared"), page.text("relay-shared"))
            # The per-relay list equals the leases table: this relay, and the partitions it holds.
            held = store.sql(f"SELECT owner, count(*), min(partition), max(partition) "
                             f"FROM {store.schema}.partition_leases WHERE lease_until > now() "
                             f"GROUP BY owner")
            check(len(held) == 1 and held[0][0].startswith("relay-eu-1/"), f"leases: {held}")
            owner, count, low, high = held[0]
            rows = wait_for("the relay list", lambda: page.js(
                "return [...document.querySelectorAll('#relay-list tbody tr')]"
                ".map(r => [...r.cells].map(c => c.textContent))"))
            check(len(rows) == 1 and rows[0][0] == owner and rows[0][4] == count
                  and rows[0][5] == f"{low}–{high}", f"relay list {rows} vs leases {held}")
            check(f"{count} partitions, 0 held by nobody" in page.text("relay-list-note"),
                  page.text("relay-list-note"))
            page.screenshot("relays")
            abandoned_list(page, expect=7)
            page.screenshot("abandoned-after")
            page.assert_not_pwned()
            severe = [e for e in run.driver.get_log("browser") if e.get("level") == "SEVERE"
                      and "Content Security Policy" in e.get("message", "")]
            check(not severe, f"CSP violations: {severe}")
    finally:
        try:
            store.drop()
        except Failure as error:
            log(f"dropping {schema}: {error}")


def run_sqlite(args, workdir):
    db = os.path.join(workdir, "app.db")
    events = os.path.join(workdir, "events.jsonl")
    store = Sqlite(db)
    port = free_port()

    def config(token):
        return f"""[database]
type = "sqlite"
path = "{db}"
[relay]
instance = "relay-sqlite"
sweep_interval = "100ms"
[retention]
published = "1h"
[http]
listen = "127.0.0.1:{port}"
token = "{token}"
stats_interval = "300ms"
[sinks.default]
type = "file"
path = "{events}"
"""

    with Processes() as run:
        ids = seed(args.seed, ["--sqlite", db], scenario_messages(partner=False))
        run.outboxd = Outboxd(args.outboxd, config(TOKEN), workdir, "outboxd-sqlite")
        wait_for("outboxd's listener", lambda: http_get(port, "/healthz")[0] == 200)
        wait_for("the orders published", lambda: store.counts().get("published", 0) == 12)
        check_headers(port)
        run.driver, run.service = start_browser(workdir)
        page = Page(run.driver, port, args.artifacts, "sqlite")
        _, payments, _ = run_common(page, store, ids, partner=False)
        page.go("relays")
        wait_for("the relays note", lambda: "no partition leases" in page.text("relay-list-note"))
        check(not page.js("return document.querySelectorAll('#relay-list tbody tr').length"),
              "SQLite lists no relays with partitions")
        with open(events, encoding="utf-8") as published:
            check(payments[0] in published.read(), "the replayed message reached the file sink")
        check(run.outboxd.stop() == 0, "outboxd stops cleanly")
        run.outboxd = None

        # Without a token the page is read-only and says why.
        run.outboxd = Outboxd(args.outboxd, config(""), workdir, "outboxd-sqlite-readonly")
        wait_for("outboxd's listener", lambda: http_get(port, "/healthz")[0] == 200)
        page.js("sessionStorage.clear()")
        run.driver.get("about:blank")
        run.driver.get(page.url("overview"))
        wait_for("the read-only notice", lambda: "Read-only" in page.banner())
        check(not page.find("token-form").is_displayed(), "no token form without a token")
        wait_for("the overview's counts", lambda: page.counts() == expected_counts(store.counts()), timeout=30)
        page.go("messages")
        check("admin API" in page.text("messages-table"), page.text("messages-table"))
        page.go("abandoned")
        check(not page.find("ab-replay").is_enabled(), "no replay without the admin API")
        page.screenshot("readonly")
        page.assert_not_pwned()


def run_many(args, workdir):
    """One outboxd, three [[databases]]: two schemas of the test database and one that cannot be
    reached (its password must never reach the page)."""
    url = os.environ.get("OUTBOX_TEST_PG_URL", "postgresql://outbox:outbox@127.0.0.1:15432/outbox_test")
    tag = secrets.token_hex(4)
    alpha, beta = Postgres(url, f"uim_{tag}_a"), Postgres(url, f"uim_{tag}_b")
    # Names with a dot and a dash: the page sends them URL-encoded.
    alpha_name, beta_name, down_name = "alpha", "beta.eu-1", "gamma-down"
    secret = "pw-" + secrets.token_hex(6)
    port, dead_port = free_port(), free_port()
    events = os.path.join(workdir, "events.jsonl")

    def messages(prefix, orders, payments):
        return ([{"topic": "orders", "stream": f"{prefix}-order-{i}", "type": "OrderPlaced",
                  "payload": json.dumps({"tenant": prefix, "order": i})} for i in range(orders)] +
                [{"topic": "payments", "stream": f"{prefix}-payment-{i}",
                  "payload": json.dumps({"tenant": prefix, "payment": i}),
                  "abandon": f"card declined ({prefix})"} for i in range(payments)])

    try:
        with Processes() as run:
            a_ids = seed(args.seed, ["--postgres", url, "--schema", alpha.schema], messages("a", 4, 2))
            b_ids = seed(args.seed, ["--postgres", url, "--schema", beta.schema], messages("b", 3, 1))
            a_pay, b_pay = a_ids[4:], b_ids[3:]
            config = f"""[[databases]]
name = "{alpha_name}"
url = "{url}"
schema = "{alpha.schema}"
[[databases]]
name = "{beta_name}"
url = "{url}"
schema = "{beta.schema}"
[[databases]]
name = "{down_name}"
url = "postgresql://outbox:{secret}@127.0.0.1:{dead_port}/nowhere"
[relay]
instance = "relay-many"
sweep_interval = "200ms"
[retention]
published = "1h"
[http]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"
stats_interval = "300ms"
[sinks.default]
type = "file"
path = "{events}"
"""
            run.outboxd = Outboxd(args.outboxd, config, workdir, "outboxd-many")
            wait_for("outboxd's listener", lambda: http_get(port, "/healthz")[0] == 200)
            wait_for("both databases' orders published",
                     lambda: alpha.counts().get("published", 0) == 4 and beta.counts().get("published", 0) == 3)
            run.driver, run.service = start_browser(workdir)
            page = Page(run.driver, port, args.artifacts, "many")
            page.driver.get(page.url())
            wait_for("the token form", lambda: page.find("token-form").is_displayed())
            page.login(TOKEN)
            wait_for("the overview", lambda: page.js("return document.body.getAttribute('data-rendered')") == "overview")

            # The overview: the databases, relayed or not and why; no tiles of zeros.
            def database_rows():
                rows = page.js("return [...document.querySelectorAll('#databases-table tbody tr')]"
                               ".map(r => [...r.cells].map(c => c.textContent))")
                return {row[0]: row for row in rows}
            rows = wait_for("the databases table", lambda: (lambda r: r if len(r) == 3
                            and r[alpha_name][1] == "relayed" and r[beta_name][1] == "relayed" else None)(database_rows()))
            check(rows[down_name][1].startswith("not relayed: cannot connect"), f"{down_name}: {rows[down_name]}")
            check(int(rows[alpha_name][2]) >= 4 and int(rows[beta_name][2]) >= 3, f"published: {rows}")
            check(not page.find("count-cards").is_displayed(), "no count tiles with many databases")
            check("not read when outboxd relays many databases" in page.text("counts-note"), page.text("counts-note"))
            check("2 of 3 relayed" in page.text("databases-note"), page.text("databases-note"))
            check(page.find("database-picker").is_displayed(), "the database selector is shown")
            options = page.js("return [...document.querySelectorAll('#database-select option')]"
                              ".map(o => [o.value, o.textContent, o.title])")
            check(sorted(o[0] for o in options) == sorted([alpha_name, beta_name, down_name]), f"options: {options}")
            down = next(o for o in options if o[0] == down_name)
            check("not relayed" in down[1] and "cannot connect" in down[2], f"the unreachable one: {down}")
            check(all("not relayed" not in o[1] for o in options if o[0] != down_name), f"options: {options}")
            page.screenshot("overview")

            # Choosing a database: kept in the hash and in localStorage; the list shows its messages only.
            Select(page.find("database-select")).select_by_value(beta_name)
            wait_for("the choice kept in localStorage and the hash", lambda: page.js(
                "return [localStorage.getItem('outbox.database'), location.hash]")
                == [beta_name, "#overview?database=" + beta_name])
            rows = search_messages(page, len(b_ids))
            check({r.get_attribute("data-id") for r in rows} == set(b_ids), "the beta list holds beta's messages")
            check(f"from database {beta_name}" in page.text("messages-count"), page.text("messages-count"))
            open_detail(page, b_pay[0])
            check("card declined (b)" in page.text("detail-error"), page.text("detail-error"))
            page.screenshot("messages-beta")
            Select(page.find("database-select")).select_by_value(alpha_name)
            rows = search_messages(page, len(a_ids))
            check({r.get_attribute("data-id") for r in rows} == set(a_ids), "the alpha list holds alpha's messages")
            check(not page.find("message-detail").is_displayed(), "the other database's message is not shown")

            # A replay from the page acts on the chosen database, and on it only.
            abandoned_list(page, expect=2)
            select_ids(page, {a_pay[0]})
            page.find("ab-replay").click()
            wait_for("the dry run", lambda: page.find("ab-confirm").is_displayed())
            check(f"would replay 1 message in database {alpha_name}" in page.text("ab-confirm-text"),
                  page.text("ab-confirm-text"))
            page.screenshot("abandoned-alpha")
            page.find("ab-confirm-go").click()
            wait_for("the replay's result", lambda: "Replayed 1 message in database alpha" in page.text("ab-result"))
            wait_for("alpha's replayed message published", lambda: alpha.message(a_pay[0])[0] == "published")
            check(alpha.message(a_pay[1])[0] == "abandoned" and beta.message(b_pay[0])[0] == "abandoned",
                  "the other abandoned messages are untouched")
            # A link naming the other database chooses it; "every message matching" stays in it.
            page.js("location.hash = arguments[0]", "#abandoned?database=" + beta_name)
            wait_for("beta chosen by the hash", lambda: page.find("database-select").get_attribute("value") == beta_name)
            wait_for("beta's own abandoned message, only", lambda: [r.get_attribute("data-id")
                     for r in page.rows("ab-table")] == b_pay)
            page.find("ab-scope-all").click()
            page.find("ab-replay").click()
            wait_for("the dry run", lambda: page.find("ab-confirm").is_displayed())
            check(f"would replay 1 message in database {beta_name}" in page.text("ab-confirm-text"),
                  page.text("ab-confirm-text"))
            page.find("ab-confirm-go").click()
            wait_for("the replay's result", lambda: "Replayed 1 message" in page.text("ab-result"))
            wait_for("beta's replayed message published", lambda: beta.message(b_pay[0])[0] == "published")
            check(alpha.message(a_pay[1])[0] == "abandoned", "alpha's other abandoned message is untouched")
            with open(events, encoding="utf-8") as published:
                lines = [json.loads(line) for line in published if line.strip()]
            by_id = {line["id"]: line.get("database") for line in lines}
            check(by_id.get(a_pay[0]) == alpha_name and by_id.get(b_pay[0]) == beta_name,
                  f"the replayed messages reached the sink from their databases: {by_id}")

            # Every admin request the page sent named its database (a visit's requests: this one's).
            def check_admin_requests():
                sent = page.js("return performance.getEntriesByType('resource').map(e => e.name)")
                admin = [u for u in sent if "/api/messages" in u or "/api/outbox/relays" in u]
                check(admin and all("database=" in u for u in admin),
                      f"admin requests without ?database=: {[u for u in admin if 'database=' not in u]}")
                return len(admin)
            log(f"{check_admin_requests()} admin requests, each naming its database")

            # A new visit without the hash: the choice kept in this browser.
            run.driver.get("about:blank")
            run.driver.get(page.url("messages"))
            wait_for("the page", lambda: page.js("return document.body.getAttribute('data-rendered')") == "messages")
            check(page.find("database-select").get_attribute("value") == beta_name, "the choice is remembered")
            rows = rows_when(page, "messages-table", len(b_ids), "beta's messages again")
            check({r.get_attribute("data-id") for r in rows} == set(b_ids), "beta's messages again")

            # Its relays: the chosen database's partition leases.
            page.go("relays")
            title = page.js("return document.getElementById('relay-shared-title').textContent")
            check(title == f"Relays on database {beta_name}", title)
            held = beta.sql(f"SELECT owner, count(*) FROM {beta.schema}.partition_leases "
                            f"WHERE lease_until > now() GROUP BY owner")
            check(len(held) == 1 and held[0][0].startswith("relay-many/"), f"leases: {held}")
            relays = page.js("return [...document.querySelectorAll('#relay-list tbody tr')]"
                             ".map(r => [...r.cells].map(c => c.textContent))")
            check(len(relays) == 1 and relays[0][0] == held[0][0] and relays[0][4] == held[0][1],
                  f"relay list {relays} vs leases {held}")
            check("2 of 3 relayed" in page.text("relay-self"), page.text("relay-self"))
            page.screenshot("relays")
            page.go("topics")
            check("Not counted when outboxd relays many databases" in page.text("topics-table"), page.text("topics-table"))

            # The unreachable database: marked, with why, and its admin requests fail with that.
            Select(page.find("database-select")).select_by_value(down_name)
            wait_for("the not-relayed note", lambda: page.find("database-note").is_displayed())
            check(f"Database {down_name} is not relayed: cannot connect" in page.text("database-note"),
                  page.text("database-note"))
            page.js("location.hash = arguments[0]", "#messages")
            wait_for("the connection error in the list", lambda: f"Could not read database {down_name}: cannot connect"
                     in page.text("messages-table"))
            check(not page.rows("messages-table"), "no message from another database is shown")
            check(not page.banner(), f"no second banner: {page.banner()!r}")
            page.screenshot("not-relayed")
            check(secret not in page.js("return document.documentElement.outerHTML"), "the password is not shown")

            check_admin_requests()
            page.assert_not_pwned()
            severe = [e for e in run.driver.get_log("browser") if e.get("level") == "SEVERE"
                      and "Content Security Policy" in e.get("message", "")]
            check(not severe, f"CSP violations: {severe}")
    finally:
        for store in (alpha, beta):
            try:
                store.drop()
            except Failure as error:
                log(f"dropping {store.schema}: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=("postgres", "sqlite", "many"), required=True)
    parser.add_argument("--outboxd", required=True)
    parser.add_argument("--seed", required=True)
    parser.add_argument("--artifacts", required=True)
    parser.add_argument("--deadline", type=int, default=150)
    parser.add_argument("--load-seconds", type=int, default=0,
                        help="postgres: write traffic for this long first (for screenshots)")
    args = parser.parse_args()
    for tool in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        if not os.access(tool, os.X_OK):
            sys.exit(f"ui_browser_test: {tool} is missing: run scripts/install-deps tools")

    def out_of_time(signum, frame):
        raise Failure(f"the test ran past its deadline of {args.deadline}s")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(args.deadline + args.load_seconds)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"outbox-ui-{args.store}-") as workdir:
        try:
            {"postgres": run_postgres, "sqlite": run_sqlite, "many": run_many}[args.store](args, workdir)
        except Failure as failure:
            log(f"FAILED: {failure}")
            return 1
        finally:
            signal.alarm(0)
    log(f"passed in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
