#!/usr/bin/env python3
"""A deliberately odd OpenAI-style backend for scripts/ops/e2e-prometheus.sh.

tokentap must forward what it cannot measure and count it instead. This backend
(loopback only) answers POST /v1/chat/completions by model:
  odd-plain      200 text/plain body          -> tokentap_unobserved_responses_total
  odd-malformed  200 SSE with one event that is not JSON among valid ones
                                               -> tokentap_decode_errors_total
and GET /health. Which reason/dialect label values tokentap uses is its own
business; the e2e run only needs the series to exist so the dashboard panels
for them have data.

    e2e_odd_backend.py --listen 127.0.0.1:PORT
"""
import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, code, ctype, body):
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, "application/json", b'{"status":"ok"}')
        else:
            self._send(404, "application/json", b'{"error":"not found"}')

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        req = json.loads(self.rfile.read(n) or b"{}")
        model = req.get("model")
        if model == "odd-plain":
            return self._send(200, "text/plain; charset=utf-8", b"just some text, no tokens to see here\n")
        if model == "odd-malformed":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            events = [
                {"id": "x", "object": "chat.completion.chunk", "model": model,
                 "choices": [{"index": 0, "delta": {"content": "one "}}]},
                "{this is not json",
                {"id": "x", "object": "chat.completion.chunk", "model": model,
                 "choices": [{"index": 0, "delta": {"content": "two"}}]},
                {"id": "x", "object": "chat.completion.chunk", "model": model,
                 "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
            for ev in events:
                data = ev if isinstance(ev, str) else json.dumps(ev)
                chunk = f"data: {data}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(0.02)
            done = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            self.wfile.flush()
            return
        self._send(404, "application/json", b'{"error":"unknown model"}')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True)
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("loopback only")
    srv = ThreadingHTTPServer((host, int(port)), H)
    srv.daemon_threads = True
    srv.serve_forever()


if __name__ == "__main__":
    main()
