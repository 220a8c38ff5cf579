#!/usr/bin/env python3
"""The checks of scripts/ops/e2e-otlp.sh (which starts the processes): tokentap's OTLP
exports, as scripts/ops/otlp_receiver.py received them, against tokentap's own /metrics
scraped at the same moment; the spans, against the `traceparent`s sent and the exemplars
on /metrics; then the receiver stopped mid-run.

    e2e_otlp.py HOST SIM_PORT RECEIVER_HTTP_PORT RECEIVER_PID PROTOCOL:PROXY:ADMIN... MODEL
"""
import concurrent.futures
import json
import math
import os
import re
import secrets
import signal
import sys
import time
import urllib.request

host, sim, receiver, receiver_pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
targets = [t.split(":") for t in sys.argv[5:-1]]
model = sys.argv[-1]
passed = failed = 0
sent_traces = set()
# Per tokentap proxy port: {trace id: the parent span id its traceparent named}.
sent_parents = {}


def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what, flush=True)


def get(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def chat(port, i):
    trace, parent = secrets.token_hex(16), secrets.token_hex(8)
    sent_traces.add(trace)
    sent_parents.setdefault(str(port), {})[trace] = parent
    body = json.dumps({"model": model, "stream": True, "seed": i,
                       "messages": [{"role": "user", "content": f"request {i}"}]}).encode()
    req = urllib.request.Request(f"http://{host}:{port}/v1/chat/completions", body,
                                 {"content-type": "application/json", "x-tenant-id": "e2e",
                                  "traceparent": f"00-{trace}-{parent}-01"})
    with urllib.request.urlopen(req, timeout=30) as response:
        return response.status, response.read()


def traffic(port, count, start=0):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda i: chat(port, i), range(start, start + count)))


def latest(protocol):
    return json.loads(get(f"http://{host}:{receiver}/latest?protocol={protocol}"))


def scrape(admin):
    """/metrics text as {(name, frozenset(labels)): value}."""
    out = {}
    for line in get(f"http://{host}:{admin}/metrics").decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$', line)
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def classic(text, name, attributes):
    """(count, sum, [(le, cumulative)]) of one classic histogram series in the text."""
    labels = frozenset(attributes.items())
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in text.items()
                     if k[0] == name + "_bucket" and k[1] - {("le", dict(k[1])["le"])} == labels)
    return text[(name + "_count", labels)], text[(name + "_sum", labels)], buckets


def classic_quantile(buckets, count, q):
    """Prometheus' histogram_quantile over classic buckets; and the bucket it fell in."""
    rank, lower, below = q * count, 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(le):
                return lower, (lower, lower)
            return lower + (le - lower) * (rank - below) / (cumulative - below), (lower, le)
        lower, below = le, cumulative
    return lower, (lower, lower)


def exponential_quantile(point, q):
    """The same estimate from OTLP's exponential buckets, index i = (base^i, base^(i+1)]."""
    base = 2 ** (2 ** -point["scale"])
    rank, below = q * point["count"], point["zero_count"]
    if rank <= below:
        return point["zero_threshold"] * rank / max(below, 1)
    for k, n in enumerate(point["bucket_counts"]):
        index = point["offset"] + k
        lo, hi = base ** index, base ** (index + 1)
        if n and below + n >= rank:
            return lo + (hi - lo) * (rank - below) / n
        below += n
    return None


def buckets_agree(point, buckets):
    """Whether the exponential buckets fit the classic ones: for each classic bound, the
    observations OTLP places wholly at or below it are at most the classic count there,
    and those it places in buckets starting below it at least that count. An index off by
    one moves every observation a bucket up or down and breaks it at some bound."""
    base = 2 ** (2 ** -point["scale"])
    for le, cumulative in buckets:
        if math.isinf(le):
            continue
        below = maybe = point["zero_count"]
        for k, n in enumerate(point["bucket_counts"]):
            index = point["offset"] + k
            if base ** (index + 1) <= le * (1 + 1e-12):
                below += n
            if base ** index < le * (1 - 1e-12):
                maybe += n
        if not below <= cumulative <= maybe:
            return False, le, below, cumulative, maybe
    return True, None, None, None, None


def wait_export(protocol, after):
    """Wait for an export numbered past `after`; return it."""
    deadline = time.time() + 15
    while time.time() < deadline:
        got = latest(protocol)
        if got["received"] > after:
            return got
        time.sleep(0.1)
    raise SystemExit(f"no {protocol} export within 15 s")


# 1. Traffic through both tokentaps, then a quiet moment to compare in.
for protocol, proxy, admin in targets:
    results = traffic(proxy, 40)
    check(all(status == 200 and b"[DONE]" in body for status, body in results),
          f"{protocol}: 40 streamed requests through tokentap")

for protocol, proxy, admin in targets:
    # An export read after the traffic ended, then the scrape, then one more export: equal
    # to the scrape when nothing moved in between.
    first = wait_export(protocol, latest(protocol)["received"])
    text = scrape(admin)
    export = wait_export(protocol, first["received"])
    metrics = export["metrics"]
    resource = export.get("resource", {})
    check(resource.get("service.name") == "tokentap" and resource.get("service.version")
          and resource.get("k8s.pod.name") == "tokentap-e2e-0"
          and resource.get("deployment.environment.name") == "e2e",
          f"{protocol}: resource {resource}")
    check(export.get("scope") == "tokentap", f"{protocol}: instrumentation scope tokentap")
    histograms = [n for n, m in metrics.items() if m["kind"] == "exponential_histogram"]
    check(len(histograms) >= 6, f"{protocol}: exponential histograms {sorted(histograms)}")
    check(all(m["temporality"] == 2 for m in metrics.values() if m["kind"] != "gauge"),
          f"{protocol}: cumulative temporality everywhere")
    compared = 0
    for name in histograms:
        for point in metrics[name]["points"]:
            count, total, buckets = classic(text, name, point["attributes"])
            if count == 0:
                continue
            compared += 1
            where = f"{protocol}: {name}{point['attributes']}"
            check(point["count"] == count, f"{where} count {point['count']} = /metrics {count}")
            check(math.isclose(point["sum"], total, rel_tol=1e-9, abs_tol=1e-12),
                  f"{where} sum {point['sum']} = /metrics {total}")
            ok, le, below, cumulative, maybe = buckets_agree(point, buckets)
            check(ok, f"{where} exponential buckets fit the classic ones"
                      + ("" if ok else f": at le={le} {below} <= {cumulative} <= {maybe} fails"))
            for q in (0.5, 0.9, 0.99):
                mine = exponential_quantile(point, q)
                theirs, (lo, hi) = classic_quantile(buckets, count, q)
                # Both estimate the same rank; each is exact to its bucket, so they agree
                # within the classic bucket the value falls in (the coarser of the two).
                ok = mine is not None and lo - 1e-9 <= mine <= max(hi, lo) * (1 + 2 ** -3) + 1e-9
                check(ok, f"{where} p{int(q * 100)} otlp {mine:.6g} within /metrics bucket "
                          f"({lo:g}, {hi:g}] (estimate {theirs:.6g})")
    check(compared >= 6, f"{protocol}: {compared} histogram series compared")
    counters = [(n, p) for n, m in metrics.items() if m["kind"] == "sum"
                for p in m["points"] if n.startswith("tokentap_") and "otlp" not in n]
    same = [(n, p["value"], text.get((n, frozenset(p["attributes"].items()))))
            for n, p in counters]
    check(counters and all(mine == theirs for _, mine, theirs in same),
          f"{protocol}: {len(counters)} counters equal /metrics "
          f"({[s for s in same if s[1] != s[2]][:3]})")
    requests = sum(p["value"] for p in metrics["tokentap_requests_total"]["points"])
    check(requests == 40, f"{protocol}: tokentap_requests_total {requests} = 40 sent")
    # The objectives of e2e-otlp.sh's config: `interactive` met by all 40, `strict` (a
    # 1 ms first token) missed by all; the counters equal /metrics above.
    judged = {(p["attributes"].get("objective"), p["attributes"].get("result")): p["value"]
              for p in metrics.get("tokentap_objective_requests_total", {}).get("points", [])}
    check(judged == {("interactive", "met"): 40, ("strict", "missed"): 40},
          f"{protocol}: tokentap_objective_requests_total over OTLP {judged} = 40 met interactive, 40 missed strict")
    check(any(n == "tokentap_objective_output_tokens_total" for n, _ in counters),
          f"{protocol}: tokentap_objective_output_tokens_total among the counters compared")
    goals = {p["attributes"].get("objective"): p["value"]
             for p in metrics.get("tokentap_objective_target", {}).get("points", [])}
    scraped = {o: text.get(("tokentap_objective_target", frozenset({("objective", o)}))) for o in goals}
    check(goals == {"interactive": 0.95, "strict": 0.5} == scraped,
          f"{protocol}: tokentap_objective_target over OTLP {goals} = /metrics {scraped}")
    exemplars = {t for n in histograms for p in metrics[n]["points"] for t in p["exemplars"]}
    check(exemplars and exemplars <= sent_traces,
          f"{protocol}: {len(exemplars)} exemplar trace ids, all among those sent")

# 2. The spans: one per request, in the trace each request sent, child of the span its
# traceparent named, with the GenAI attributes; the exemplars on /metrics name them.
def spans(protocol):
    return json.loads(get(f"http://{host}:{receiver}/spans?protocol={protocol}"))["spans"]


def openmetrics_exemplars(admin):
    """(trace id, span id) of every exemplar on the OpenMetrics exposition."""
    req = urllib.request.Request(f"http://{host}:{admin}/metrics",
                                 headers={"accept": "application/openmetrics-text;version=1.0.0"})
    with urllib.request.urlopen(req, timeout=10) as response:
        text = response.read().decode()
    return re.findall(r'# \{trace_id="([0-9a-f]{32})",span_id="([0-9a-f]{16})"\}', text)


for protocol, proxy, admin in targets:
    parents = sent_parents[proxy]
    deadline = time.time() + 15
    got = spans(protocol)
    while len(got) < len(parents) and time.time() < deadline:
        time.sleep(0.1)
        got = spans(protocol)
    time.sleep(0.5)  # and nothing more comes
    got = spans(protocol)
    check(len(got) == len(parents) == 40,
          f"{protocol}: {len(got)} spans for {len(parents)} requests")
    check(len({s["span_id"] for s in got}) == len(got), f"{protocol}: every span id unique")
    check({s["trace_id"] for s in got} == set(parents),
          f"{protocol}: the spans' trace ids are exactly those sent")
    check(all(parents.get(s["trace_id"]) == s["parent_span_id"] for s in got),
          f"{protocol}: each span's parent is the span id its traceparent named")
    check(all(s["span_id"] != s["parent_span_id"] for s in got),
          f"{protocol}: each span has an id of its own")
    check(all(s["kind"] == 3 and s["name"] == f"chat {model}" and s["status"] == 0
              and s["scope"] == "tokentap" and s["service"] == "tokentap" for s in got),
          f"{protocol}: CLIENT spans named `chat {model}`, status unset, scope and service tokentap")
    a = [s["attributes"] for s in got]
    genai = all(x.get("gen_ai.operation.name") == "chat"
                and x.get("gen_ai.provider.name") == "openai"
                and x.get("gen_ai.request.model") == model
                and x.get("gen_ai.response.model") == model
                and x.get("gen_ai.usage.output_tokens") == 20
                and x.get("gen_ai.response.finish_reasons") == ["length"]
                and 0 < x.get("gen_ai.response.time_to_first_chunk", 0) < 5
                for x in a)
    # The requests ask for no usage (no stream_options), so no input tokens are known.
    genai = genai and all("gen_ai.usage.input_tokens" not in x for x in a)
    check(genai, f"{protocol}: GenAI attributes on every span (e.g. "
                 f"{ {k: v for k, v in a[0].items() if k.startswith('gen_ai')} })")
    own = all(x.get("tokentap.outcome") == "completed" and x.get("tokentap.tenant") == "e2e"
              and 0 < x.get("tokentap.itl.p50", 0) <= x.get("tokentap.itl.max", 0)
              and x.get("server.address") == host and x.get("server.port") == int(sim)
              and x.get("http.response.status_code") == 200
              for x in a)
    check(own, f"{protocol}: tokentap's attributes on every span (e.g. "
               f"{ {k: v for k, v in a[0].items() if not k.startswith('gen_ai')} })")
    ids = {(s["trace_id"], s["span_id"]) for s in got}
    exemplars = set(openmetrics_exemplars(admin))
    check(exemplars and exemplars <= ids,
          f"{protocol}: {len(exemplars)} exemplars on /metrics, each naming a received span")

# 3. The receiver goes away mid-run: the proxy does not notice.
protocol, proxy, admin = targets[0]
expected = {}
for i in range(1000, 1010):
    expected[i] = chat(sim, i)[1]
with concurrent.futures.ThreadPoolExecutor(1) as pool:
    running = pool.submit(lambda: [(i, chat(proxy, i)) for i in range(1000, 1060)])
    time.sleep(0.3)
    os.kill(receiver_pid, signal.SIGTERM)
    results = running.result()
    time.sleep(3)  # long enough for an export and its retries to give up (1 s export timeout)
check(all(status == 200 and b"[DONE]" in body for _, (status, body) in results),
      f"{protocol}: 60 requests complete while the collector is gone")
same = [i for i, (_, body) in results if i in expected
        and re.sub(rb'"created":\d+|"id":"[^"]*"', b"", body)
        == re.sub(rb'"created":\d+|"id":"[^"]*"', b"", expected[i])]
check(len(same) == 10, f"{protocol}: {len(same)}/10 responses byte for byte as the simulator sends them directly (apart from its per-response id and created)")
text = scrape(admin)
completed = sum(v for (n, labels), v in text.items()
                if n == "tokentap_requests_total" and ("outcome", "completed") in labels)
check(completed == 100, f"{protocol}: tokentap counts {completed} of 100 requests completed")
failed_exports = sum(v for (n, labels), v in text.items()
                     if n == "tokentap_otlp_exports_total" and ("result", "failed") in labels)
dropped = sum(v for (n, _), v in text.items() if n == "tokentap_otlp_exports_dropped_total")
successes = sum(v for (n, labels), v in text.items()
                if n == "tokentap_otlp_exports_total" and ("result", "success") in labels)
check(failed_exports >= 1, f"{protocol}: exports failed {failed_exports:g}, dropped {dropped:g} "
                           f"after {successes:g} successes")

print(f"e2e-otlp: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
