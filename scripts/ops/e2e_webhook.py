#!/usr/bin/env python3
"""The webhook receiver of scripts/ops/e2e-alerts.sh: what Alertmanager delivers, logged.

    e2e_webhook.py --listen 127.0.0.1:PORT --log FILE

Every POST body (Alertmanager's webhook payload, JSON) is appended to FILE as one line
{"received": <unix time, s>, "payload": {...}} the moment it arrives, so the test can
measure when a notification reached the receiver. GET /health answers 200. Loopback only.
"""
import argparse
import http.server
import json
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    host, port = a.listen.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"refusing to listen on non-loopback {host}")
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received = time.time()
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                payload = json.loads(body)
            except ValueError:
                self.send_error(400, "not JSON")
                return
            with lock, open(a.log, "a") as log:
                log.write(json.dumps({"received": received, "payload": payload}) + "\n")
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
