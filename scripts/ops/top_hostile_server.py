#!/usr/bin/env python3
"""A fake tokentap admin server for `scripts/ops/e2e-top-hostile.sh`: serves
`/api/live/stream` as server-sent events the way a hostile server could, to check that
`tokentap top` neither passes a server's escape sequences to the terminal nor lets a
frame cost it memory or CPU without bound.

    top_hostile_server.py MODE PORT_FILE

MODE:
  hostile  a `tick` frame every 0.5 s whose model, tenant and phase strings carry
           terminal escapes: OSC 0/2 title changes, an OSC 52 clipboard write, the
           alternate-screen switch, C1 controls, a clear screen, a bidi override
  huge     one `tick` frame of 70,000 models (tens of MB), then hostile frames
  endless  a `tick` frame that never ends: its data line grows as fast as the client
           reads, for 60 s
  silent   a stream that never completes an event: a comment line every 100 ms

Listens on a free loopback port and writes it to PORT_FILE. Serves until killed.
"""

import http.server
import json
import os
import sys
import time

ESC = "\x1b"
BEL = "\x07"
HOSTILE = [
    # OSC 0 (icon and title) ended by BEL, OSC 2 (title) ended by ST.
    f"{ESC}]0;pwned{BEL}title-bel",
    f"{ESC}]2;pwned{ESC}\\title-st",
    # OSC 52: write "pwned" to the clipboard.
    f"{ESC}]52;c;cHduZWQ={BEL}clipboard",
    # The alternate screen (DECSET 1049), then a clear screen and cursor home.
    f"{ESC}[?1049hscreen{ESC}[2J{ESC}[H",
    # C1 controls: OSC (U+009D) ... ST (U+009C), and CSI (U+009B).
    "\u009d0;pwned\u009cc1-osc",
    "\u009b?1049hc1-csi",
    # A newline, a carriage return and a bidi override.
    "line\nbreak\rreturn\u202eflipped",
]


def model(name, in_flight=0):
    quantiles = {"count": 3, "mean": 0.2, "p50": 0.1, "p90": 0.2, "p99": 0.3}
    return {
        "model": name,
        "covered_s": 60.0,
        "requests": 3,
        "requests_per_s": 0.05,
        "outcomes": {"completed": 3},
        "output_tokens": 30,
        "tokens_per_s": 0.5,
        "in_flight": in_flight,
        "ttft": quantiles,
        "itl": quantiles,
        "column": {"ttft": [0, 1, 2], "itl": [0, 1, 2]},
    }


def hostile_frame(n):
    return {
        "at_ms": int(time.time() * 1000),
        "window_s": 60,
        "bounds": {"ttft": [0.1, 0.5], "itl": [0.01, 0.05]},
        "models": [model(name, 1) for name in HOSTILE],
        "in_flight": {
            "total": len(HOSTILE),
            "streams": [
                {
                    "model": name,
                    "tenant": HOSTILE[(i + 1) % len(HOSTILE)],
                    "phase": HOSTILE[(i + 2) % len(HOSTILE)],
                    "elapsed_s": 1.5 + n,
                    "tokens": 10,
                    "tokens_per_s": 5.0,
                    "largest_gap_s": 0.2,
                    "since_last_event_s": 0.1,
                }
                for i, name in enumerate(HOSTILE)
            ],
        },
        "models_over_cap": 0,
        "slowest": [],
    }


def event(name, value):
    return f"event: {name}\ndata: {json.dumps(value)}\n\n".encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if not self.path.startswith("/api/live/stream"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")  # the body ends when the connection does
        self.end_headers()
        try:
            self.wfile.write(b"retry: 2000\n: tokentap live\n\n")
            self.wfile.flush()
            getattr(self, "serve_" + MODE)()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def hostile_forever(self):
        n = 0
        while True:
            self.wfile.write(event("tick", hostile_frame(n)))
            self.wfile.flush()
            n += 1
            time.sleep(0.5)

    def serve_hostile(self):
        self.hostile_forever()

    def serve_huge(self):
        frame = hostile_frame(0)
        frame["models"] = [model(f"model-{i:05}") for i in range(70_000)]
        self.wfile.write(event("tick", frame))
        self.wfile.flush()
        self.hostile_forever()

    def serve_endless(self):
        self.wfile.write(b'event: tick\ndata: {"models": [')
        piece = (json.dumps(model("endless")) + ", ").encode() * 64
        end = time.monotonic() + 60
        while time.monotonic() < end:
            self.wfile.write(piece)
        self.wfile.flush()

    def serve_silent(self):
        while True:
            self.wfile.write(b": still here, no event\n")
            self.wfile.flush()
            time.sleep(0.1)


if __name__ == "__main__":
    MODE, PORT_FILE = sys.argv[1], sys.argv[2]
    assert hasattr(Handler, "serve_" + MODE), f"unknown mode {MODE}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(PORT_FILE + ".tmp", PORT_FILE)
    server.serve_forever()
