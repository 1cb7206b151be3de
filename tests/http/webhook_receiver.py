#!/usr/bin/env python3
"""A webhook endpoint for the HTTP sink's tests (Python 3.11 standard library only).

    python3 webhook_receiver.py --port-file FILE [--port N] [--secret whsec_...]...
                                [--tolerance SECONDS] [--host 127.0.0.1]
                                [--dest NAME BEHAVIOUR]...
                                [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]

Listens on --host (a loopback address, 127.0.0.1 unless given), port N (or any free port),
writes the port to FILE (FILE.tmp, then renamed) once listening, and serves until SIGTERM or
SIGINT.

Webhooks: POST or PUT to /hooks/<dest> (<dest>: the rest of the path, percent-decoded; the query
is ignored; a request in the absolute form that an HTTP proxy gets, "POST http://h:p/hooks/x",
is served as if it were for this receiver: the receiver doubles as a proxy that the tests can
see). A destination not created by a control request is answered 404. With --secret, every
request must carry webhook-id, webhook-timestamp and webhook-signature, signed as Standard Webhooks
say by one of the secrets (checked here with Python's hmac), its timestamp within --tolerance of
this clock; else 401 with a short text saying why. Without --secret nothing is checked.
--dest NAME BEHAVIOUR (the JSON of a PUT /_control/dest/NAME below) creates a destination before
the receiver listens: a receiver started again on the same port answers its first request as the
one before it did, not 404.

TLS: with --tls-cert and --tls-key (PEM files: the certificate, its chain after it, and its key)
the receiver serves HTTPS only (Python's ssl module, TLS 1.2 or later, no ALPN: HTTP/1.1), and
with --tls-client-ca also requires a client certificate signed by a CA of that PEM file
(ssl.CERT_REQUIRED), on control requests too. The handshake runs in the connection's own thread
(at most 10 s); one that fails (no or an untrusted client certificate, a client that does not trust
this one, plain HTTP sent to this port) is answered by TLS alone (an alert, or the connection is
closed), never reaches a destination, and is recorded for GET /_control/tls_failures.

Control (the destination name percent-encoded as one path segment):
    PUT    /_control/dest/<dest>            JSON body (may be {}): creates or replaces its behaviour
           {"ratio_503": 0.0, "ratio_429": 0.0, "retry_after": "1" or null,
            "retry_after_503": as retry_after unless given (null: 503s carry none), "delay_ms": 0,
            "seed": 1, "plan": [{"status": 429, "retry_after": "2", "delay_ms": 0,
                                 "reset": false, "body": "...", "location": "...",
                                 "echo_headers": ["authorization"]}, ...]}
           {"refuse_status": 401, "refuse_seconds": 15.0}: every request that arrives within
           refuse_seconds of the destination's creation (or replacement) is answered
           refuse_status at once (an endpoint that refuses the relay's credentials for a while),
           before the plan and the ratios apply.
           Plan entries are used one per request, in order, before the random ratios apply. An
           entry's delay_ms (or else the destination's) is slept before answering; "reset": true
           closes the connection with a RST without answering, after reading the whole request;
           "echo_headers" appends the request's values of those headers (lower-case names) to
           the body, " <name>=<value>" each, as an endpoint that quotes what it got.
    DELETE /_control/dest/<dest>            removes it (its requests stay recorded)
    GET    /_control/dest/<dest>/requests   every request to <dest>, in the order answers were
                                            decided (see Record below), as a JSON array
    GET    /_control/healthz                200 "ok"
    GET    /_control/tls_failures           every failed TLS handshake so far, in order, as a
                                            JSON array of {"t": ..., "error": "..."} ([] without
                                            --tls-cert)

Times in a record (time.monotonic(), CLOCK_MONOTONIC: comparable across receivers on one host): t
when the request had been read, answered_t when its answer was decided, sent_t when the answer
had been written to the socket (null: none was).
"""

import argparse
import base64
import hashlib
import hmac
import http.server
import json
import os
import random
import signal
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse

_lock = threading.Lock()
_behaviours = {}  # dest -> Behaviour
_records = {}  # dest -> [record dict]
_seq = 0
_secrets = []  # decoded HMAC keys
_tolerance = 300.0
_tls_context = None  # ssl.SSLContext with --tls-cert
_tls_failures = []  # [{"t": monotonic, "error": str}] of failed handshakes


class Behaviour:
    def __init__(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("the behaviour must be a JSON object")
        self.ratio_503 = float(spec.get("ratio_503", 0.0) or 0.0)
        self.ratio_429 = float(spec.get("ratio_429", 0.0) or 0.0)
        retry_after = spec.get("retry_after", "1")
        self.retry_after = None if retry_after is None else str(retry_after)
        retry_after_503 = spec.get("retry_after_503", retry_after)
        self.retry_after_503 = None if retry_after_503 is None else str(retry_after_503)
        self.delay_ms = float(spec.get("delay_ms", 0) or 0)
        self.random = random.Random(spec.get("seed", 1))
        plan = spec.get("plan", []) or []
        if not isinstance(plan, list) or not all(isinstance(p, dict) for p in plan):
            raise ValueError("plan must be an array of objects")
        self.plan = list(plan)
        self.refuse_status = int(spec.get("refuse_status", 401) or 401)
        self.refuse_until = time.monotonic() + float(spec.get("refuse_seconds", 0) or 0)

    def next_answer(self):
        """What to answer the next request with (called under _lock)."""
        if time.monotonic() < self.refuse_until:
            return {"status": self.refuse_status, "retry_after": None, "delay_ms": 0,
                    "reset": False, "body": "credentials refused (for now)", "location": None,
                    "echo_headers": []}
        if self.plan:
            entry = self.plan.pop(0)
            retry_after = entry.get("retry_after")
            return {
                "status": int(entry.get("status", 200)),
                "retry_after": None if retry_after is None else str(retry_after),
                "delay_ms": float(entry.get("delay_ms", self.delay_ms) or 0),
                "reset": bool(entry.get("reset", False)),
                "body": str(entry.get("body", "")),
                "location": entry.get("location"),
                "echo_headers": [str(name) for name in entry.get("echo_headers", []) or []],
            }
        answer = {"status": 200, "retry_after": None, "delay_ms": self.delay_ms, "reset": False,
                  "body": "", "location": None, "echo_headers": []}
        draw = self.random.random()
        if draw < self.ratio_503:
            answer["status"] = 503
            answer["retry_after"] = self.retry_after_503
        elif draw < self.ratio_503 + self.ratio_429:
            answer["status"] = 429
            answer["retry_after"] = self.retry_after
        return answer


def _check_signature(headers, body):
    """(True, "") when a secret signed this request, else (False, why)."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signature = headers.get("webhook-signature")
    if msg_id is None or timestamp is None or signature is None:
        return False, "missing webhook-id, webhook-timestamp or webhook-signature"
    try:
        ts = int(timestamp)
    except ValueError:
        return False, "webhook-timestamp is not an integer"
    if abs(time.time() - ts) > _tolerance:
        return False, "webhook-timestamp too far from now"
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = [base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
                for key in _secrets]
    for entry in signature.split(" "):
        version, _, value = entry.partition(",")
        if version != "v1" or not value:
            continue
        for candidate in expected:
            if hmac.compare_digest(value.encode(), candidate.encode()):
                return True, ""
    return False, "no signature matches"


def _int_or_none(text):
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "webhook_receiver"
    sys_version = ""

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _answer(self, status, body=b"", headers=None, content_type="text/plain"):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        if body:
            self.send_header("Content-Type", content_type)
        for name, value in (headers or []):
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _read_body(self):
        """The body, or None when it cannot be read by Content-Length (answered already)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            self._answer(411, "chunked bodies are not supported", [("Connection", "close")])
            return None
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            size = int(length)
        except ValueError:
            self.close_connection = True
            self._answer(400, "bad Content-Length", [("Connection", "close")])
            return None
        data = bytearray()
        while len(data) < size:
            chunk = self.rfile.read(size - len(data))
            if not chunk:
                self.close_connection = True
                return None
            data += chunk
        return bytes(data)

    def _reset(self):
        """Closes the connection with a RST, answering nothing."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.connection.close()
        except OSError:
            pass

    # Webhooks ----------------------------------------------------------------------------------

    def _hook(self, raw_path):
        arrival = time.monotonic()
        body = self._read_body()
        if body is None:
            return
        dest = urllib.parse.unquote(raw_path[len("/hooks/"):])
        headers = {}
        for name, value in self.headers.items():
            name = name.lower()
            headers[name] = headers[name] + ", " + value if name in headers else value
        signature_ok = None
        why = ""
        if _secrets:
            signature_ok, why = _check_signature(headers, body)
        record = {
            "seq": 0,
            "t": arrival,
            "answered_t": None,
            "sent_t": None,
            "method": self.command,
            "path": self.path,
            "id": headers.get("webhook-id"),
            "timestamp": headers.get("webhook-timestamp"),
            "signature_ok": signature_ok,
            "status": None,
            "retry_after": None,
            "headers": headers,
            "content_type": headers.get("content-type"),
            "stream_key": headers.get("outbox-stream-key"),
            "stream_seq": _int_or_none(headers.get("outbox-stream-seq")),
            "payload_b64": base64.b64encode(body).decode(),
        }
        with _lock:
            behaviour = _behaviours.get(dest)
            answer = None
            if behaviour is not None and signature_ok is not False:
                answer = behaviour.next_answer()
            if answer is None:
                self._decide(record, dest, 404 if behaviour is None else 401, None)
        if answer is None:
            if behaviour is None:
                self._answer(404, "no destination " + dest)
            else:
                self._answer(401, "signature refused: " + why)
            return
        if answer["delay_ms"] > 0:
            time.sleep(answer["delay_ms"] / 1000.0)
        with _lock:
            self._decide(record, dest, None if answer["reset"] else answer["status"],
                         answer["retry_after"])
        if answer["reset"]:
            self._reset()
            return
        extra = []
        if answer["retry_after"] is not None:
            extra.append(("Retry-After", answer["retry_after"]))
        if answer["location"] is not None:
            extra.append(("Location", str(answer["location"])))
        body = answer["body"]
        for name in answer["echo_headers"]:
            body += f" {name}={headers.get(name, '')}"
        self._answer(answer["status"], body, extra)
        with _lock:
            record["sent_t"] = time.monotonic()  # the answer is in the kernel's hands

    @staticmethod
    def _decide(record, dest, status, retry_after):
        """Records the answer (called under _lock)."""
        global _seq
        _seq += 1
        record["seq"] = _seq
        record["answered_t"] = time.monotonic()
        record["status"] = status
        record["retry_after"] = retry_after
        _records.setdefault(dest, []).append(record)

    # Control -----------------------------------------------------------------------------------

    def _control(self, raw_path):
        body = self._read_body()
        if body is None:
            return
        parts = raw_path.split("/")  # "", "_control", ...
        if raw_path == "/_control/healthz" and self.command == "GET":
            self._answer(200, "ok")
            return
        if raw_path == "/_control/tls_failures" and self.command == "GET":
            with _lock:
                failures = list(_tls_failures)
            self._answer(200, json.dumps(failures), content_type="application/json")
            return
        if len(parts) >= 4 and parts[2] == "dest" and parts[3]:
            dest = urllib.parse.unquote(parts[3])
            if len(parts) == 4 and self.command == "PUT":
                try:
                    spec = json.loads(body.decode() or "{}")
                    behaviour = Behaviour(spec)
                except (ValueError, TypeError) as error:
                    self._answer(400, "bad behaviour: " + str(error))
                    return
                with _lock:
                    _behaviours[dest] = behaviour
                self._answer(200, "ok")
                return
            if len(parts) == 4 and self.command == "DELETE":
                with _lock:
                    _behaviours.pop(dest, None)
                self._answer(200, "ok")
                return
            if len(parts) == 5 and parts[4] == "requests" and self.command == "GET":
                with _lock:
                    records = list(_records.get(dest, []))
                self._answer(200, json.dumps(records), content_type="application/json")
                return
        self._answer(404, "no such control request")

    # Dispatch ----------------------------------------------------------------------------------

    def _dispatch(self):
        raw_path = self.path.split("?", 1)[0]
        if raw_path.startswith(("http://", "https://")):
            # The absolute form a client sends through an HTTP proxy (this receiver as the proxy):
            # served as if it were for this receiver; "path" records it as it came.
            scheme_end = raw_path.index("//") + 2
            slash = raw_path.find("/", scheme_end)
            raw_path = raw_path[slash:] if slash >= 0 else "/"
        if raw_path.startswith("/_control/"):
            self._control(raw_path)
        elif raw_path.startswith("/hooks/") and self.command in ("POST", "PUT"):
            self._hook(raw_path)
        else:
            if self._read_body() is not None:
                self._answer(404, "not a webhook path")

    do_GET = _dispatch
    do_POST = _dispatch
    do_PUT = _dispatch
    do_DELETE = _dispatch


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def finish_request(self, request, client_address):
        """Serves one connection (in its own thread); with TLS, the handshake first."""
        if _tls_context is None:
            super().finish_request(request, client_address)
            return
        try:
            request.settimeout(10.0)
            tls = _tls_context.wrap_socket(request, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError) as error:
            with _lock:
                _tls_failures.append({"t": time.monotonic(), "error": str(error)})
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request, client_address):
        # A client that went away (a request timed out, a connection cut by the tests) is normal.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, ssl.SSLError)):
            return
        super().handle_error(request, client_address)


def _decode_secret(secret):
    if not secret.startswith("whsec_"):
        sys.exit("a secret must start with whsec_")
    return base64.b64decode(secret[len("whsec_"):], validate=True)


def main():
    global _tolerance, _tls_context
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--secret", action="append", default=[])
    parser.add_argument("--tolerance", type=float, default=300.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--dest", nargs=2, action="append", default=[],
                        metavar=("NAME", "BEHAVIOUR"))
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--tls-client-ca")
    args = parser.parse_args()
    if (args.tls_cert is None) != (args.tls_key is None):
        sys.exit("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        sys.exit("--tls-client-ca needs --tls-cert and --tls-key")
    if args.tls_cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(args.tls_cert, args.tls_key)
        if args.tls_client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=args.tls_client_ca)
        _tls_context = context
    _secrets.extend(_decode_secret(s) for s in args.secret)
    for name, spec in args.dest:
        try:
            _behaviours[name] = Behaviour(json.loads(spec or "{}"))
        except (ValueError, TypeError) as error:
            sys.exit(f"--dest {name}: bad behaviour: {error}")
    _tolerance = args.tolerance

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = Server((args.host, args.port), Handler)
    port = server.server_address[1]
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as out:
        out.write(f"{port}\n")
    os.rename(tmp, args.port_file)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
