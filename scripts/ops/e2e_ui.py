#!/usr/bin/env python3
"""The live view in a real browser, for scripts/ops/e2e-ui.sh (loopback only).

    e2e_ui.py --chromium PATH --proxy URL --admin URL --ui URL --models a,b,c --regress b
              --hostile constructor,__proto__ --out DIR [--screenshot FILE]

Drives headless Chromium over the DevTools protocol (websocket-client, from PyPI; no
browser is downloaded: Debian's `chromium`):
  0. the admin port does not serve the live view: ADMIN/ui is a 404 naming ui.listen;
  1. opens UI/ui (the live view's own listener) and waits for live data (the page's SSE
     ticks);
  2. sends streamed chat traffic to every model, stops, and waits for the ring to tick
     past it; then, over the 5-minute window chosen in the page's selector, each model's
     row shows the requests /metrics counts, and the page's TTFT/ITL p50/p90/p99 are those
     of /metrics' buckets (summed over tenants) as histogram_quantile reads them, and its
     objectives column shows the attainment /metrics' objective counts give;
  3. injects a regression into one model's ITL (x-sim-itl-ms on its requests) and checks
     that its ITL heatmap's hottest recent bucket moves above 250 ms within seconds while
     the other models' stay below 100 ms, and that its streams show in flight (its ITL
     shows when a stream ends, since its per-event counts are apportioned from the
     reported usage: streams of 8 tokens, so a couple of seconds), and that the slowest
     recent request is one of its, listed with the trace id its traceparent carried;
  4. writes a screenshot (OUT/ui.png, and --screenshot if given);
  5. streams to models named like the properties every plain object inherits
     (--hostile: constructor, __proto__, toString, hasOwnProperty): the page keeps
     ticking without a script error, and each has its row and its heatmaps.
Prints PASS/FAIL lines and `e2e-ui: N passed, M failed`; exit 1 on a failure.
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import websocket  # websocket-client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exposition import parse_exposition, total  # noqa: E402

passed = failed = 0


def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    return ok


def loopback(url):
    host = urllib.parse.urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"e2e-ui: {url} is not a loopback URL")
    return url


class Browser:
    """Headless Chromium and one page, over the DevTools protocol."""

    def __init__(self, chromium, tmp):
        self.profile = tempfile.mkdtemp(prefix="tokentap-chromium-")
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", "--window-size=1400,1900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "chromium.log"), "w"))
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        for _ in range(300):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.1)
        port = open(port_file).read().split()[0]
        for _ in range(100):
            targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=5))
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                break
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0
        self.exceptions = []
        self.call("Runtime.enable")
        self.call("Page.enable")

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.exceptions.append(details.get("exception", {}).get("description")
                                       or details.get("text"))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def eval(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.eval(expression):
                    return True
            except RuntimeError:
                pass
            time.sleep(0.25)
        return check(False, f"{what} (waited {timeout} s for `{expression}`)")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)


class Traffic:
    """Streamed chat requests, `per_model` at a time for each model, until stopped."""

    def __init__(self, proxy, models, per_model=2, headers=None):
        self.stop = threading.Event()
        self.sent = 0
        self.errors = 0
        self.threads = []
        for model in models:
            for i in range(per_model):
                extra = (headers or {}).get(model, {})
                t = threading.Thread(target=self.run, args=(proxy, model, f"tenant-{i}", extra),
                                     daemon=True)
                t.start()
                self.threads.append(t)

    def run(self, proxy, model, tenant, extra):
        body = json.dumps({"model": model, "stream": True, "max_tokens": 8,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": "a secret prompt"}]}).encode()
        while not self.stop.is_set():
            request = urllib.request.Request(
                f"{proxy}/v1/chat/completions", body,
                {"content-type": "application/json", "x-tenant-id": tenant, **extra})
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    response.read()
                self.sent += 1
            except Exception:
                self.errors += 1
                time.sleep(0.2)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(90)


def scrape(admin):
    """`/metrics` as [(name, {labels}, value)]."""
    text = urllib.request.urlopen(f"{admin}/metrics", timeout=10).read().decode()
    return parse_exposition(text)[0]


def buckets(samples, name, model, bounds):
    cumulative = [0.0] * (len(bounds) + 1)
    for n, l, v in samples:
        if n != name or l.get("model") != model:
            continue
        le = l["le"]
        i = len(bounds) if le == "+Inf" else min(range(len(bounds)),
                                                 key=lambda j: abs(bounds[j] - float(le)))
        cumulative[i] += v
    counts, below = [], 0.0
    for c in cumulative:
        counts.append(int(round(c - below)))
        below = c
    return counts


def quantile(q, bounds, counts):
    """Prometheus' histogram_quantile over classic buckets (tokentap's live::window)."""
    total_count = sum(counts)
    if total_count == 0:
        return None
    rank = q * total_count
    below = 0
    for i, count in enumerate(counts):
        if below + count >= rank and count > 0:
            if i >= len(bounds):
                return bounds[-1]
            lower = 0.0 if i == 0 else bounds[i - 1]
            return lower + (bounds[i] - lower) * (rank - below) / count
        below += count
    return bounds[-1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--admin", required=True)
    parser.add_argument("--ui", required=True)
    parser.add_argument("--hostile", required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--regress", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--screenshot")
    args = parser.parse_args()
    proxy, admin, ui = loopback(args.proxy), loopback(args.admin), loopback(args.ui)
    models = args.models.split(",")
    hostile = args.hostile.split(",")
    os.makedirs(args.out, exist_ok=True)

    browser = Browser(args.chromium, args.out)
    try:
        # 0. Not on the admin port.
        try:
            urllib.request.urlopen(f"{admin}/ui", timeout=10)
            check(False, "the admin port does not serve /ui")
        except urllib.error.HTTPError as e:
            body = e.read().decode()
            check(e.code == 404 and "ui.listen" in body,
                  f"the admin port answers /ui with a 404 naming ui.listen: {body.strip()!r}")

        # 1. The page, and live data in it.
        browser.call("Page.navigate", url=f"{ui}/ui")
        check(browser.wait("window.tokentapLive && tokentapLive.ticks >= 2", 20,
                           "the page receives live ticks"), "the page receives live ticks")

        # 2. Traffic to every model; then the page's figures against /metrics.
        traffic = Traffic(proxy, models, per_model=2)
        time.sleep(6)
        traffic.finish()
        check(traffic.sent > 0 and traffic.errors == 0,
              f"traffic: {traffic.sent} streams, {traffic.errors} errors")
        browser.eval("(() => { const s = document.querySelector('#window');"
                     " s.value = '300'; s.dispatchEvent(new Event('change')); return 1; })()")
        metrics = scrape(admin)
        want = {m: total(metrics, "tokentap_requests_total", model=m) for m in models}
        everything = sum(want.values())
        browser.wait(
            "tokentapLive.frame && tokentapLive.frame.window_s === 300 && "
            f"tokentapLive.frame.models.reduce((s, m) => s + m.requests, 0) === {int(everything)}",
            15, "the page's window catches up with /metrics")
        frame = browser.eval("tokentapLive.frame")
        rows = browser.eval(
            "Array.from(document.querySelectorAll('#models tbody tr')).map(tr => "
            "[tr.dataset.model, tr.querySelector('[data-field=requests]').textContent])")
        rows = dict(rows or [])
        attainment = dict(browser.eval(
            "Array.from(document.querySelectorAll('#models tbody tr')).map(tr => "
            "[tr.dataset.model, tr.querySelector('[data-field=objectives]').textContent])") or [])
        bounds = {"ttft": frame["bounds"]["ttft"], "itl": frame["bounds"]["itl"]}
        for m in models:
            check(m in rows, f"model {m} has a row in the page")
            check(rows.get(m) == str(int(want[m])),
                  f"{m}: the page shows {rows.get(m)} requests, /metrics counts {int(want[m])}")
            figures = next((x for x in frame["models"] if x["model"] == m), None)
            if not check(figures is not None, f"{m} in the page's frame"):
                continue
            check(figures["output_tokens"] == total(metrics, "tokentap_output_tokens_total", model=m),
                  f"{m}: output tokens {figures['output_tokens']} as /metrics")
            met = total(metrics, "tokentap_objective_requests_total", model=m, result="met")
            missed = total(metrics, "tokentap_objective_requests_total", model=m, result="missed")
            shown = f"interactive {100 * met / (met + missed):.1f}%" if met + missed else "–"
            check(met + missed == want[m] and attainment.get(m) == shown,
                  f"{m}: the objectives column shows {attainment.get(m)!r}, /metrics' "
                  f"{int(met)} met and {int(missed)} missed of {int(want[m])} give {shown!r}")
            for key, family in (("ttft", "tokentap_time_to_first_token_seconds"),
                                ("itl", "tokentap_inter_token_latency_seconds")):
                counts = buckets(metrics, family + "_bucket", m, bounds[key])
                ok = figures[key]["count"] == sum(counts)
                for q, field in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                    expected = quantile(q, bounds[key], counts)
                    got = figures[key][field]
                    ok = ok and expected is not None and got is not None and abs(got - expected) < 1e-9
                check(ok, f"{m}: {key} count and p50/p90/p99 as /metrics' buckets give "
                          f"({figures[key]['p50']:.4f}/{figures[key]['p90']:.4f}/{figures[key]['p99']:.4f} s)")
        page = browser.eval("document.body.innerText")
        check("a secret prompt" not in page, "no request text in the page")

        # 3. A regression in one model's ITL shows in its heatmap within seconds.
        browser.eval("(() => { const s = document.querySelector('#window');"
                     " s.value = '10'; s.dispatchEvent(new Event('change')); return 1; })()")
        itl_bounds = bounds["itl"]
        slow_bucket = next(i for i, b in enumerate(itl_bounds) if b >= 0.25)
        fast_bucket = next(i for i, b in enumerate(itl_bounds) if b >= 0.1)
        started = time.time()
        trace_id = "5ee1e2e0000000000000000000000027"
        traffic = Traffic(proxy, models, per_model=2,
                          headers={args.regress: {"x-sim-itl-ms": "300",
                                                  "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}})
        others = [m for m in models if m != args.regress]
        expression = (
            f"(() => {{ const hot = (m) => Number((document.getElementById('heat-' + m + '/itl')"
            f" || {{dataset: {{hot: -1}}}}).dataset.hot);"
            f" return hot({json.dumps(args.regress)}) >= {slow_bucket} && "
            + " && ".join(f"hot({json.dumps(o)}) >= 0 && hot({json.dumps(o)}) <= {fast_bucket}"
                          for o in others)
            + "; })()")
        shown = browser.wait(expression, 15, "the regression shows in the heatmap")
        took = time.time() - started
        check(shown and took < 10,
              f"{args.regress}'s ITL regression shows in its heatmap after {took:.1f} s, "
              f"the others' stay at or below {itl_bounds[fast_bucket]} s")
        check(browser.wait(
            "Array.from(document.querySelectorAll('#inflight tbody tr td:first-child'))"
            f".some(td => td.textContent === {json.dumps(args.regress)})", 10,
            "its streams in flight"), f"{args.regress}'s streams are listed in flight")
        check(browser.wait(
            "Array.from(document.querySelectorAll('#inflight tbody tr')).some(tr =>"
            f" tr.cells[0].textContent === {json.dumps(args.regress)} &&"
            " ['waiting_head', 'waiting_first_token', 'streaming']"
            ".includes(tr.cells[2].dataset.phase))", 10,
            "their phase"), f"{args.regress}'s requests in flight show their phase")
        check(browser.wait(
            "(() => { const first = document.querySelector('#slowest tbody tr');"
            f" return !!first && first.textContent.includes({json.dumps(args.regress)})"
            f" && first.textContent.includes('{trace_id}'); }})()", 10,
            "the slowest request, with its trace id"),
            f"the slowest recent request is {args.regress}'s, with its trace id")
        time.sleep(2)
        path = os.path.join(args.out, "ui.png")
        browser.screenshot(path)
        if args.screenshot:
            browser.screenshot(args.screenshot)
        check(os.path.getsize(path) > 10000, f"screenshot written: {path}")
        traffic.finish()
        snapshot = json.load(urllib.request.urlopen(f"{ui}/api/live/snapshot", timeout=10))
        print(f"ring: {snapshot['ring_bytes']} bytes after {len(snapshot['heatmap']['at_ms'])} "
              f"ticks of the last 300 with {len(snapshot['models'])} models", flush=True)

        # 5. Model names that are the names of Object.prototype's properties.
        check(not browser.exceptions, f"no script error so far: {browser.exceptions}")
        ticks = browser.eval("tokentapLive.ticks")
        traffic = Traffic(proxy, hostile, per_model=1)
        time.sleep(4)
        traffic.finish()
        check(traffic.sent > 0 and traffic.errors == 0,
              f"traffic to {hostile}: {traffic.sent} streams, {traffic.errors} errors")
        rows = ("Array.from(document.querySelectorAll('#models tbody tr'))"
                ".map(tr => tr.dataset.model)")
        shown = browser.wait(
            f"(() => {{ const rows = {rows};"
            f" return {json.dumps(hostile)}.every(m => rows.includes(m)"
            " && !!document.getElementById('heat-' + m + '/itl')"
            " && !!document.getElementById('heat-' + m + '/ttft')); })()",
            10, "every hostile model's row and heatmaps")
        check(shown, f"{', '.join(hostile)}: each has its row and its heatmaps")
        later = browser.eval("tokentapLive.ticks")
        check(browser.wait(f"tokentapLive.ticks >= {later + 2} && "
                           f"tokentapLive.frame.at_ms > Date.now() - 3000", 10,
                           "the page keeps ticking"),
              f"the page keeps ticking after them ({ticks} -> {later} ticks, and on)")
        check(not browser.exceptions,
              f"no script error with those names: {browser.exceptions[:3]}")
    finally:
        browser.close()
    print(f"e2e-ui: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
