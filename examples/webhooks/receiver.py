#!/usr/bin/env python3
"""A webhook receiver for outbox's HTTP sink (Python's standard library only): prints each request
and whether its Standard Webhooks signature is valid, and answers 204.

    python3 receiver.py whsec_... [PORT]     # listens on 127.0.0.1:PORT (8099)
"""
import base64
import hashlib
import hmac
import http.server
import sys
import time


def verify(secret: str, headers: dict, body: bytes, tolerance: int = 300) -> bool:
    """True when one of the webhook-signature entries was made with `secret` (whsec_...)."""
    msg_id, ts = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(time.time() - int(ts)) > tolerance:
        return False  # too old or from the future: a replay
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(mac).decode()
    return any(hmac.compare_digest(expected, s) for s in headers["webhook-signature"].split())


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {name.lower(): value for name, value in self.headers.items()}
        print(self.command, self.path, flush=True)
        for name, value in self.headers.items():
            print(f"  {name}: {value}", flush=True)
        print("  body:", body.decode(errors="replace"), flush=True)
        print("  signature valid:", verify(SECRET, headers, body), flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    SECRET = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 8099
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
