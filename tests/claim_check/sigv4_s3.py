#!/usr/bin/env python3
"""A minimal S3 endpoint that checks AWS Signature Version 4 the way AWS does, for the claim-check
tests: s3rver (support/s3rver.h) does not verify signatures. Each request's Authorization header
is recomputed with botocore's own signer (python3-botocore, the AWS SDK for Python's core) over
the headers the request says it signed, and its x-amz-content-sha256 is checked against the body.
A wrong signature is 403 SignatureDoesNotMatch, a wrong payload hash 400
XAmzContentSHA256Mismatch, an unknown key id 403 InvalidAccessKeyId. PUT stores an object in
memory, GET returns it (404 NoSuchKey), DELETE removes it, GET /<bucket>?list-type=2 lists them
(ListObjectsV2, one page); path-style URLs only.

Usage: sigv4_s3.py PORT ACCESS_KEY_ID SECRET_ACCESS_KEY [SESSION_TOKEN]
Prints "sigv4_s3 listening on 127.0.0.1:PORT" once it accepts connections.
"""
import hashlib
import hmac
import sys
import time
from urllib.parse import parse_qs, urlsplit
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

PORT = int(sys.argv[1])
ACCESS_KEY, SECRET_KEY = sys.argv[2], sys.argv[3]
TOKEN = sys.argv[4] if len(sys.argv) > 4 else None
OBJECTS = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", code=None, headers=None):
        if code is not None:
            body = f"<Error><Code>{code}</Code></Error>".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def verify(self, body):
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return 403, "AccessDenied"
        fields = dict(part.strip().split("=", 1) for part in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        key_id, date, region, service, _ = fields["Credential"].split("/")
        if key_id != ACCESS_KEY:
            return 403, "InvalidAccessKeyId"
        signed = fields["SignedHeaders"].split(";")
        if "x-amz-content-sha256" not in signed or "x-amz-date" not in signed or "host" not in signed:
            return 403, "AccessDenied"
        if TOKEN is not None and ("x-amz-security-token" not in signed or
                                  self.headers.get("x-amz-security-token") != TOKEN):
            return 403, "InvalidToken"
        if self.headers.get("x-amz-content-sha256") != hashlib.sha256(body).hexdigest():
            return 400, "XAmzContentSHA256Mismatch"
        request = AWSRequest(method=self.command, url=f"http://{self.headers['Host']}{self.path}",
                             headers={name: self.headers[name] for name in signed}, data=body)
        request.context["timestamp"] = self.headers["x-amz-date"]
        signer = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY, TOKEN), service, region)
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        if not hmac.compare_digest(expected, fields["Signature"]):
            return 403, "SignatureDoesNotMatch"
        return None

    def handle_any(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length) if length else b""
        problem = self.verify(body)
        if problem is not None:
            return self.answer(problem[0], code=problem[1])
        url = urlsplit(self.path)
        if self.command == "GET" and url.query:
            query = parse_qs(url.query)
            if query.get("list-type") != ["2"] or url.path.count("/") != 1:
                return self.answer(400, code="InvalidRequest")
            prefix = url.path + "/" + query.get("prefix", [""])[0]
            contents = "".join(
                f"<Contents><Key>{path[len(url.path) + 1:]}</Key><LastModified>"
                f"{time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(modified))}</LastModified>"
                f"</Contents>" for path, (_, modified) in sorted(OBJECTS.items())
                if path.startswith(prefix))
            return self.answer(200, f"<ListBucketResult><IsTruncated>false</IsTruncated>"
                                    f"{contents}</ListBucketResult>".encode())
        if self.command == "PUT":
            OBJECTS[self.path] = (body, time.time())
            return self.answer(200, headers={"ETag": '"' + hashlib.md5(body).hexdigest() + '"'})
        if self.command == "GET":
            if self.path not in OBJECTS:
                return self.answer(404, code="NoSuchKey")
            return self.answer(200, OBJECTS[self.path][0])
        if self.command == "DELETE":
            OBJECTS.pop(self.path, None)
            return self.answer(204)
        return self.answer(405, code="MethodNotAllowed")

    do_PUT = do_GET = do_DELETE = handle_any


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print(f"sigv4_s3 listening on 127.0.0.1:{PORT}", flush=True)
server.serve_forever()
