#!/usr/bin/env python3
"""Receives outbox webhooks and applies each to a table exactly once, in Python.

    webhook_inbox_consumer.py --listen 127.0.0.1:8099 --secret whsec_...
        --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
        [--table applied]

An HTTP endpoint for outbox's http sink (standard library's http.server). Each POST must carry a
valid Standard Webhooks signature made with --secret (else 401); it then goes through the SQL
inbox (outbox_inbox.py): the row in the table and the inbox mark are one transaction, and the
answer (204) comes only after the commit, so a crash in between makes the relay send it again and
the inbox says duplicate. A gap or a database failure answers 503 with Retry-After (the relay
sends it again); a request that is invalid or not from an outbox answers 422 (the relay abandons
it, and an operator can see it). Runs until SIGTERM/SIGINT, then prints what it did. Needs
Debian's python3-psycopg.
"""

import argparse
import base64
import hashlib
import hmac
import http.server
import sys
import threading
import time

import psycopg

from outbox_inbox import (WEBHOOK_ID_HEADER, AppliedTable, Inbox, NotFromAnOutbox, Stopping,
                          delivery_from_headers)


def signature_valid(secret, headers, body, tolerance=300):
    """True when one of the webhook-signature entries was made with `secret` (whsec_...)."""
    try:
        msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
        if abs(time.time() - int(timestamp)) > tolerance:
            return False  # too old or from the future: a replay
        key = base64.b64decode(secret.removeprefix("whsec_"))
    except (KeyError, ValueError):
        return False
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(mac).decode()
    return any(hmac.compare_digest(expected, entry)
               for entry in headers.get("webhook-signature", "").split())


def main():
    stopping = Stopping()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8099")
    parser.add_argument("--secret", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--schema", default="outbox")
    parser.add_argument("--consumer", default="example-consumer")
    parser.add_argument("--table", default="applied")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")

    local = threading.local()  # a connection per request thread

    def inbox():
        if not hasattr(local, "inbox"):
            local.inbox = Inbox(args.db, args.consumer, args.schema)
        return local.inbox

    table = AppliedTable(inbox(), args.table)
    counts = {"processed": 0, "duplicates": 0, "retried": 0, "refused": 0}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the relay reuses its connections

        def answer(self, status, counter, retry_after=None):
            with lock:
                counts[counter] += 1
            self.send_response(status)
            if retry_after is not None:
                self.send_header("Retry-After", str(retry_after))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            if not signature_valid(args.secret, headers, body):
                return self.answer(401, "refused")
            try:
                delivery = delivery_from_headers(headers.get, WEBHOOK_ID_HEADER)
                decision = inbox().handle(
                    delivery, table.effect(delivery, body.decode("utf-8", "replace")))
            except (NotFromAnOutbox, ValueError) as problem:
                print(f"refusing {headers.get('webhook-id')}: {problem}", file=sys.stderr,
                      flush=True)
                return self.answer(422, "refused")
            except psycopg.Error as problem:
                print(f"asking again after: {problem}", file=sys.stderr, flush=True)
                return self.answer(503, "retried", retry_after=1)
            if decision == "invalid":
                return self.answer(422, "refused")
            if decision == "gap":  # its predecessor first
                return self.answer(503, "retried", retry_after=1)
            self.answer(204, "processed" if decision == "process" else "duplicates")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(f"webhook_inbox_consumer: listening on {args.listen}, applying into {args.table} as "
          f"'{args.consumer}' (Python, SQL inbox)", file=sys.stderr, flush=True)
    while not stopping:
        time.sleep(0.1)
    server.shutdown()
    print(f"webhook_inbox_consumer: processed {counts['processed']}, duplicates "
          f"{counts['duplicates']}, retried {counts['retried']}, refused {counts['refused']}",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
