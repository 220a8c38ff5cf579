#!/usr/bin/env python3
"""A stand-in for the tokentap binary, ONLY to self-test scripts/ops/e2e-prometheus.sh.

It is not tokentap and measures nothing precisely: it speaks the agreed command
line and metric contract well enough that the e2e harness (process handling,
traffic, Prometheus, dashboard and rule queries, cleanup) can be exercised before
the real binary exists:

    fake_tokentap.py sim --listen ADDR [--models a,b] [--ttft 150ms] [--itl 20ms] [--tokens 40]
    fake_tokentap.py --upstream URL --listen ADDR --admin ADDR [--config FILE] [--log-format F]

Proxy: forwards requests line by line (SSE) or whole, records the contract's
histograms/counters/gauges per model and x-tenant-id, an inter-token gap above 5 s
as a stall, an upstream idle gap above upstream.idle_timeout as `timeout`, a
client that goes away as `cancelled`, an unreachable upstream as `upstream_error`.
Admin: /metrics, /healthz, /readyz (TCP connect to the upstream). SIGTERM: stop
accepting, wait for in-flight requests up to shutdown.drain_timeout, exit 0.
Loopback addresses only; stdlib + PyYAML.
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokentap_contract import ITL_BUCKETS, TTFT_BUCKETS  # noqa: E402

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
LLM_PATHS = {"/v1/chat/completions", "/v1/completions"}
STALL_S = 5.0
START = time.time()


def dur(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(text).strip())
    if not m:
        raise SystemExit(f"bad duration {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


def addr(text):
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"fake_tokentap only binds loopback, not {host}")
    return host, int(port)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def write_chunk(wfile, data):
    wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    wfile.flush()


# ---------------------------------------------------------------- simulator
def run_sim(a):
    models = a.models.split(",")
    ttft, itl, ntok = dur(a.ttft), dur(a.itl), a.tokens

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _json(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in models]})
            elif self.path == "/health":
                self._json(200, {"status": "ok"})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            n = int(self.headers.get("content-length") or 0)
            req = json.loads(self.rfile.read(n) or b"{}")
            chat = self.path == "/v1/chat/completions"
            if self.path not in LLM_PATHS:
                return self._json(404, {"error": "not found"})
            model = req.get("model", models[0])
            usage = {"prompt_tokens": 12, "completion_tokens": ntok, "total_tokens": 12 + ntok}
            if not req.get("stream"):
                time.sleep(ttft + itl * (ntok - 1))
                choice = {"index": 0, "message": {"role": "assistant", "content": "tok " * ntok}} if chat else {"index": 0, "text": "tok " * ntok}
                return self._json(200, {"id": "x", "model": model, "choices": [choice], "usage": usage})
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            obj = "chat.completion.chunk" if chat else "text_completion"
            def ev(payload):
                write_chunk(self.wfile, b"data: " + json.dumps(payload).encode() + b"\n\n")
            try:
                if chat:
                    ev({"id": "x", "object": obj, "model": model, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
                time.sleep(ttft)
                for i in range(ntok):
                    if i:
                        time.sleep(itl)
                    delta = {"index": 0, "delta": {"content": "tok "}} if chat else {"index": 0, "text": "tok "}
                    ev({"id": "x", "object": obj, "model": model, "choices": [delta]})
                ev({"id": "x", "object": obj, "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"} if chat else {"index": 0, "text": "", "finish_reason": "stop"}]})
                if (req.get("stream_options") or {}).get("include_usage"):
                    ev({"id": "x", "object": obj, "model": model, "choices": [], "usage": usage})
                write_chunk(self.wfile, b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass

    srv = Server(addr(a.listen), H)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    srv.serve_forever()
    return 0


# ---------------------------------------------------------------- metrics
class Metrics:
    HISTS = {
        "tokentap_time_to_first_byte_seconds": TTFT_BUCKETS,
        "tokentap_time_to_first_token_seconds": TTFT_BUCKETS,
        "tokentap_time_to_first_content_token_seconds": TTFT_BUCKETS,
        "tokentap_inter_token_latency_seconds": ITL_BUCKETS,
        "tokentap_time_per_output_token_seconds": ITL_BUCKETS,
        "tokentap_output_tokens_per_second": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
        "tokentap_request_duration_seconds": TTFT_BUCKETS,
    }

    def __init__(self):
        self.lock = threading.Lock()
        self.h = {n: {} for n in self.HISTS}
        self.c = {"tokentap_requests_total": {}, "tokentap_output_tokens_total": {}, "tokentap_input_tokens_total": {},
                  "tokentap_stream_stalls_total": {}, "tokentap_label_overflow_total": {},
                  "tokentap_unobserved_responses_total": {}, "tokentap_decode_errors_total": {}}
        self.in_flight = 0
        self.upstream_up = 0

    def observe(self, name, labels, v, n=1):
        with self.lock:
            st = self.h[name].setdefault(labels, [[0] * len(self.HISTS[name]), 0.0, 0])
            for i, b in enumerate(self.HISTS[name]):
                if v <= b:
                    st[0][i] += n
            st[1] += v * n
            st[2] += n

    def inc(self, name, labels, n=1):
        with self.lock:
            self.c[name][labels] = self.c[name].get(labels, 0) + n

    def render(self):
        def lab(pairs):
            return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}" if pairs else ""
        out = []
        with self.lock:
            for name, buckets in self.HISTS.items():
                if not self.h[name]:
                    continue
                out += [f"# HELP {name} fake", f"# TYPE {name} histogram"]
                for labels, (counts, s, n) in sorted(self.h[name].items()):
                    for b, cnt in zip(buckets, counts):
                        out.append(f"{name}_bucket{lab(labels + (('le', repr(float(b))),))} {cnt}")
                    out.append(f"{name}_bucket{lab(labels + (('le', '+Inf'),))} {n}")
                    out.append(f"{name}_sum{lab(labels)} {s}")
                    out.append(f"{name}_count{lab(labels)} {n}")
            for name, series in self.c.items():
                if not series:
                    continue
                out += [f"# HELP {name} fake", f"# TYPE {name} counter"]
                for labels, v in sorted(series.items()):
                    out.append(f"{name}{lab(labels)} {v}")
            out += ["# HELP tokentap_streams_in_flight fake", "# TYPE tokentap_streams_in_flight gauge",
                    f"tokentap_streams_in_flight {self.in_flight}",
                    "# HELP tokentap_upstream_up fake", "# TYPE tokentap_upstream_up gauge",
                    f"tokentap_upstream_up {self.upstream_up}",
                    "# HELP tokentap_build_info fake", "# TYPE tokentap_build_info gauge",
                    'tokentap_build_info{version="0.0.0-fake"} 1']
        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page
        t = os.times()
        out += ["# HELP process_resident_memory_bytes fake", "# TYPE process_resident_memory_bytes gauge",
                f"process_resident_memory_bytes {rss}",
                "# HELP process_cpu_seconds_total fake", "# TYPE process_cpu_seconds_total counter",
                f"process_cpu_seconds_total {t.user + t.system}",
                "# HELP process_open_fds fake", "# TYPE process_open_fds gauge",
                f"process_open_fds {len(os.listdir('/proc/self/fd'))}",
                "# HELP process_start_time_seconds fake", "# TYPE process_start_time_seconds gauge",
                f"process_start_time_seconds {START}"]
        # FAKE_TOKENTAP_OMIT=name,...: leave metric families out, to prove the e2e
        # checks fail when the binary misses a contract metric.
        omit = tuple(n for n in os.environ.get("FAKE_TOKENTAP_OMIT", "").split(",") if n)
        if omit:
            out = [l for l in out if not any(l.startswith(n) or l.startswith(f"# HELP {n}") or l.startswith(f"# TYPE {n}") for n in omit)]
        return ("\n".join(out) + "\n").encode()


# ---------------------------------------------------------------- proxy
def run_proxy(a):
    cfg = {}
    if a.config:
        import yaml
        with open(a.config) as f:
            cfg = yaml.safe_load(f) or {}
    up_cfg = cfg.get("upstream") or {}
    upstream = a.upstream or up_cfg.get("url") or os.environ.get("TOKENTAP_UPSTREAM")
    listen = a.listen or cfg.get("listen") or "127.0.0.1:8080"
    admin = a.admin or cfg.get("admin") or "127.0.0.1:9464"
    idle = dur(up_cfg.get("idle_timeout", "60s"))
    drain = dur((cfg.get("shutdown") or {}).get("drain_timeout", "30s"))
    if not upstream:
        raise SystemExit("--upstream or upstream.url is required")
    up = urlparse(upstream)
    m = Metrics()
    stopping = threading.Event()

    def up_ok():
        try:
            with socket.create_connection((up.hostname, up.port), timeout=0.5):
                return True
        except OSError:
            return False

    class Admin(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code, body, ctype="text/plain"):
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/metrics":
                m.upstream_up = 1 if up_ok() else 0
                self._send(200, m.render(), "text/plain; version=0.0.4")
            elif self.path == "/healthz":
                self._send(200, b"ok\n")
            elif self.path == "/readyz":
                ready = up_ok() and not stopping.is_set()
                m.upstream_up = 1 if ready else 0
                self._send(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
            else:
                self._send(404, b"not found\n")

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def handle_one(self, method):
            n = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(n) if n else None
            t_req = time.monotonic()
            llm = method == "POST" and self.path in LLM_PATHS
            model, tenant = "unknown", self.headers.get("x-tenant-id") or "unknown"
            if llm:
                try:
                    model = str(json.loads(body or b"{}").get("model") or "unknown")
                except ValueError:
                    pass
            labels = (("model", model), ("tenant", tenant))
            outcome = None
            with m.lock:
                m.in_flight += 1
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=idle)
            try:
                hdrs = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                try:
                    conn.request(method, self.path, body=body, headers=hdrs)
                    resp = conn.getresponse()
                except OSError:
                    outcome = "upstream_error"
                    msg = b'{"error":"upstream unreachable"}'
                    self.send_response(502)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                t_head = time.monotonic()
                if llm:
                    m.observe("tokentap_time_to_first_byte_seconds", labels, t_head - t_req)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                ctype = resp.getheader("content-type") or ""
                sse = "text/event-stream" in ctype
                if llm and resp.status < 300 and not sse and "json" not in ctype:
                    m.inc("tokentap_unobserved_responses_total", (("reason", "content_type"),))
                if not sse:
                    data = resp.read()
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    if llm:
                        outcome = "completed" if resp.status < 500 else "upstream_error"
                        try:
                            u = json.loads(data).get("usage") or {}
                        except ValueError:
                            u = {}
                        if u:
                            m.inc("tokentap_output_tokens_total", labels, u.get("completion_tokens", 0))
                            m.inc("tokentap_input_tokens_total", labels, u.get("prompt_tokens", 0))
                            m.observe("tokentap_time_to_first_token_seconds", labels, time.monotonic() - t_req)
                            m.observe("tokentap_time_to_first_content_token_seconds", labels, time.monotonic() - t_req)
                    return
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                stamps, usage = [], None
                try:
                    while True:
                        try:
                            line = resp.readline()
                        except (socket.timeout, TimeoutError):
                            outcome = "timeout"
                            break
                        if not line:
                            outcome = "completed"
                            break
                        try:
                            write_chunk(self.wfile, line)
                        except OSError:
                            outcome = "cancelled"
                            break
                        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                            try:
                                ev = json.loads(line[5:])
                            except ValueError:
                                m.inc("tokentap_decode_errors_total", (("dialect", "openai"),))
                                continue
                            usage = ev.get("usage") or usage
                            ch = (ev.get("choices") or [{}])[0] if ev.get("choices") else {}
                            text = (ch.get("delta") or {}).get("content") or ch.get("text")
                            if text:
                                now = time.monotonic()
                                if stamps and now - stamps[-1] > STALL_S:
                                    m.inc("tokentap_stream_stalls_total", labels)
                                stamps.append(now)
                    if outcome == "completed":
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                except OSError:
                    outcome = "cancelled"
                if stamps:
                    m.observe("tokentap_time_to_first_token_seconds", labels, stamps[0] - t_req)
                    m.observe("tokentap_time_to_first_content_token_seconds", labels, stamps[0] - t_req)
                    for prev, cur in zip(stamps, stamps[1:]):
                        m.observe("tokentap_inter_token_latency_seconds", labels, cur - prev)
                    ntok = (usage or {}).get("completion_tokens") or len(stamps)
                    m.inc("tokentap_output_tokens_total", labels, ntok)
                    if len(stamps) > 1:
                        span = stamps[-1] - stamps[0]
                        m.observe("tokentap_time_per_output_token_seconds", labels, span / (ntok - 1))
                        m.observe("tokentap_output_tokens_per_second", labels, (ntok - 1) / span if span > 0 else 0)
                if usage:
                    m.inc("tokentap_input_tokens_total", labels, usage.get("prompt_tokens", 0))
            finally:
                conn.close()
                with m.lock:
                    m.in_flight -= 1
                if llm and outcome:
                    m.inc("tokentap_requests_total", labels + (("outcome", outcome),))
                    m.observe("tokentap_request_duration_seconds", labels, time.monotonic() - t_req)
                self.close_connection = True

        def do_POST(self):
            self.handle_one("POST")

        def do_GET(self):
            self.handle_one("GET")

    proxy = Server(addr(listen), Proxy)
    adm = Server(addr(admin), Admin)
    threading.Thread(target=adm.serve_forever, daemon=True).start()

    def on_term(*_):
        def stop():
            stopping.set()
            proxy.shutdown()
            proxy.server_close()  # stop accepting
            deadline = time.monotonic() + drain
            while m.in_flight > 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            adm.shutdown()
            os._exit(0)
        threading.Thread(target=stop).start()

    signal.signal(signal.SIGTERM, on_term)
    print(json.dumps({"msg": "fake tokentap listening", "listen": listen, "admin": admin, "upstream": upstream}), flush=True)
    proxy.serve_forever()
    while True:  # serve_forever returned because of SIGTERM: the stop thread exits.
        time.sleep(1)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "sim":
        ap = argparse.ArgumentParser(prog="fake_tokentap.py sim")
        ap.add_argument("--listen", required=True)
        ap.add_argument("--models", default="sim-model")
        ap.add_argument("--ttft", default="150ms")
        ap.add_argument("--itl", default="20ms")
        ap.add_argument("--tokens", type=int, default=40)
        return run_sim(ap.parse_args(sys.argv[2:]))
    ap = argparse.ArgumentParser(prog="fake_tokentap.py")
    ap.add_argument("--upstream")
    ap.add_argument("--listen")
    ap.add_argument("--admin")
    ap.add_argument("--config")
    ap.add_argument("--log-format", default="text")
    return run_proxy(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
