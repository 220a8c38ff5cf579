#!/usr/bin/env python3
"""Bounded OpenAI-style traffic for scripts/ops/e2e-prometheus.sh (loopback only).

    e2e_traffic.py --main URL --models m1,m2 [--refusals-model M] [--stall URL --stall-model M]
                   [--timeout URL --timeout-model M] [--dead URL] [--odd URL]
                   [--traceparent TP] [--quantiles URL --quantile-model M
                   --quantile-requests N --quantile-log FILE]
                   [--engines URL --engine-model M]
                   [--objectives --objective-prom PROM_URL...]
                   [--requests 48] [--concurrency 4] [--cancels 4] [--deadline 120]

Sends, through tokentap:
  main     streaming chat + completions requests over the models, tenants acme /
           globex / initech via x-tenant-id plus some without the header, a few
           non-streaming ones, and --cancels streams the client abandons after the
           first token (-> outcome cancelled); one GET /v1/models (passthrough);
  refusals with --refusals-model M (a model the main simulator serves, tenant acme):
           3 requests the simulator answers 429 with Retry-After (x-sim-fault:
           status=429 -> upstream_refused, status 429), 2 streams that end in a
           rate-limit error after 3 tokens (-> upstream_error, status 429), 2 in an
           overloaded error (-> upstream_error, status 503), and 1 request for a model
           the simulator does not serve (its 404 -> upstream_refused, status 4xx);
           counted apart from `main`;
  stall    2 streams to a slow backend whose token gap exceeds the stall threshold;
           with --traceparent, the first carries that W3C `traceparent` and tenant
           `traced` (so its access-log line can be found): a deliberately slow request
           whose exemplars the e2e looks for;
  timeout  2 streams to a slow backend behind a short upstream idle timeout;
  dead     3 requests to a tokentap whose upstream is not listening;
  odd      a text/plain answer and a stream with a malformed event (e2e_odd_backend.py);
  quantiles  --quantile-requests streams (8 at a time, tenant `quantiles`) to a simulator
           started with `--stamp`: for each, the gaps between the send times the
           simulator stamped on consecutive token-bearing chunks go to --quantile-log,
           one JSON line per request (`{"gaps": [seconds...]}`): the exact inter-token
           values tokentap measured on that stream, but for loopback delivery.
  engines  with --engines (a tokentap in front of a simulator serving --engine-model):
           ENGINE_STREAMS Ollama /api/chat streams whose engine reports 50 ms queued
           (x-sim-queue-ms) -> the engine-timing families, and ENGINE_STREAMS TGI
           /generate_stream streams (exact tokens per event) -> tokens per event;
  objectives  with --objectives (main's tokentap configured with OBJECTIVES below, see
           objectives_yaml()): streams to the first model for tenant `gold`, all at the
           simulator's own pace, and tenant `bronze`, a known share slowed down with
           x-sim-itl-ms (OBJECTIVE_CLASSES says which objective each class meets). A
           warm-up first (OBJECTIVE_WARMUP) creates every met and missed series; with
           --objective-prom the run waits until each Prometheus has scraped it, so
           rate() over the rules' windows counts every request sent afterwards
           (OBJECTIVE_TRAFFIC; a counter's increments before its first sample are not
           in any rate). Counted as main requests; the summary's `objectives` gives the
           expected met and missed counts.
Every socket has a timeout and the whole run a deadline. Only loopback URLs are
accepted. Prints a JSON summary on stdout (what the client observed).
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import socket
import sys
import threading
import time
import urllib.request
from urllib.parse import urlencode, urlparse

TENANTS = ["acme", "globex", "initech", None]
ENGINE_STREAMS = 3
ENGINE_QUEUE_MS = 50
# --refusals-model: how many of each refusal (e2e_check.py reads the same numbers).
REFUSED_429 = 3
RATE_LIMIT_STREAMED = 2
OVERLOADED_STREAMED = 2
NOT_FOUND = 1
NOT_SERVED_MODEL = "e2e-no-such-model"
# Cached and reasoning tokens: DETAIL_STREAMS streams per tenant of DETAIL_TENANTS to the
# first model, whose usage reports DETAIL_CACHED cached input tokens (of about 37: the
# body's length / 4) and DETAIL_REASONING reasoning output tokens (of 40).
DETAIL_TENANTS = ["acme", "globex"]
DETAIL_STREAMS = 3
DETAIL_CACHED = 12
DETAIL_REASONING = 7

# --objectives. The main simulator streams 40 tokens, first after 150 ms, then one every
# 20 ms (e2e-prometheus.sh): 0.93 s in all. Each class sets the gap with x-sim-itl-ms and
# says which objective it meets, with a wide margin either way (a late event only makes a
# duration longer, and TPOT is the mean gap after the first token):
#   fast    20 ms: TPOT 20 ms, 0.93 s       -> meets both
#   medium  80 ms: TPOT 80 ms, 3.27 s > 3 s -> meets interactive, misses complete
#   slow   200 ms: TPOT 200 ms, 7.95 s      -> misses both
OBJECTIVES = {
    "interactive": {"ttft": "2s", "tpot": "100ms"},
    "complete": {"duration": "3s", "target": 0.9},
}
DEFAULT_TARGET = 0.95
OBJECTIVE_CLASSES = {
    "fast": (20, {"interactive": True, "complete": True}),
    "medium": (80, {"interactive": True, "complete": False}),
    "slow": (200, {"interactive": False, "complete": False}),
}
OBJECTIVE_WARMUP = {"gold": {"fast": 1}, "bronze": {"fast": 1, "slow": 1}}
OBJECTIVE_TRAFFIC = {"gold": {"fast": 12}, "bronze": {"fast": 10, "medium": 5, "slow": 5}}


def objectives_yaml():
    """The `objectives:` section of main's tokentap config (e2e-prometheus.sh writes it)."""
    lines = ["objectives:"]
    for name, bounds in OBJECTIVES.items():
        lines.append(f"  {name}:")
        lines += [f"    {k}: {v}" for k, v in bounds.items()]
    return "\n".join(lines)


def objective_target(name):
    return OBJECTIVES[name].get("target", DEFAULT_TARGET)


def judged(plan):
    """{objective: {tenant: {"met": n, "missed": n}}} of a plan {tenant: {class: n}}."""
    out = {o: {} for o in OBJECTIVES}
    for tenant, classes in plan.items():
        for o in OBJECTIVES:
            counts = out[o].setdefault(tenant, {"met": 0, "missed": 0})
            for cls, n in classes.items():
                counts["met" if OBJECTIVE_CLASSES[cls][1][o] else "missed"] += n
    return out


def objective_jobs(plan, model):
    return [dict(model=model, tenant=tenant, kind="chat", stream=True,
                 extra_headers={"x-sim-itl-ms": str(OBJECTIVE_CLASSES[cls][0])}, objective_class=cls)
            for tenant, classes in plan.items() for cls, n in classes.items() for _ in range(n)]


def wait_scraped(proms, tenants, want, deadline):
    """Wait until every Prometheus in `proms` holds `want` judged requests of `tenants`."""
    query = f'sum(tokentap_objective_requests_total{{tenant=~"{"|".join(tenants)}"}})'
    for prom in proms:
        while True:
            url = f"{prom.rstrip('/')}/api/v1/query?" + urlencode({"query": query})
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    result = json.load(r)["data"]["result"]
                if result and float(result[0]["value"][1]) == want:
                    break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                sys.exit(f"{prom} did not scrape the objectives' warm-up ({query} != {want})")
            time.sleep(0.2)


def loopback(url):
    h = urlparse(url).hostname
    if h not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"refusing non-loopback URL {url}")
    return url


def request(base, model, tenant, kind="chat", stream=True, cancel_after_first=False, timeout=30,
            extra_headers=None, sent_stamps=None, objective_class=None, tag=None):
    """One request; returns what the client saw. With `sent_stamps` (a list), the
    simulator's `sim_sent_unix_ns` of every token-bearing chunk is appended to it."""
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body = {"model": model, "max_tokens": 64, "stream": stream}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "Say something about latency."}]
    else:
        body["prompt"] = "Say something about latency."
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"content-type": "application/json"}
    if tenant:
        headers["x-tenant-id"] = tenant
    headers.update(extra_headers or {})
    out = {"model": model, "tenant": tenant, "kind": kind, "stream": stream, "cancel": cancel_after_first,
           "status": None, "done": False, "events": 0, "error": None, "objective_class": objective_class,
           "tag": tag}
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        out["status"] = resp.status
        if not stream:
            data = resp.read()
            out["done"] = resp.status == 200 and b"choices" in data
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    out["done"] = True
                    # Read the response to its end (the chunked terminator) like a
                    # well-behaved HTTP client: whether a client that hangs up right
                    # after [DONE] counts as completed is not what this run measures.
                    resp.read()
                    break
                out["events"] += 1
                if sent_stamps is not None:
                    chunk = json.loads(payload)
                    choice = (chunk.get("choices") or [{}])[0]
                    text = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if text and "sim_sent_unix_ns" in chunk:
                        sent_stamps.append(chunk["sim_sent_unix_ns"])
                if cancel_after_first and (b'"content"' in payload or b'"text"' in payload):
                    # Abandon the stream mid-way: shut the socket down under the response.
                    if conn.sock is not None:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    resp.close()
                    return out
    except (OSError, http.client.HTTPException) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


def engine_stream(base, path, body, headers, timeout=30):
    """One streamed request in another dialect, read to its end: its status, or the error."""
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json", **headers})
        resp = conn.getresponse()
        data = resp.read()
        return {"path": path, "status": resp.status, "bytes": len(data), "error": None}
    except (OSError, http.client.HTTPException) as e:
        return {"path": path, "status": None, "bytes": 0, "error": f"{type(e).__name__}: {e}"}
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--main", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--refusals-model")
    ap.add_argument("--stall")
    ap.add_argument("--stall-model", default="slow-model")
    ap.add_argument("--timeout")
    ap.add_argument("--timeout-model", default="slow-model")
    ap.add_argument("--dead")
    ap.add_argument("--odd", help="tokentap in front of e2e_odd_backend.py")
    ap.add_argument("--traceparent", help="W3C traceparent for the first stall stream")
    ap.add_argument("--quantiles", help="tokentap in front of a `tokentap sim --stamp`")
    ap.add_argument("--quantile-model", default="e2e-quantiles")
    ap.add_argument("--quantile-requests", type=int, default=200)
    ap.add_argument("--quantile-log")
    ap.add_argument("--engines", help="tokentap in front of a simulator serving --engine-model")
    ap.add_argument("--engine-model", default="e2e-engines")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--cancels", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=120)
    ap.add_argument("--objectives", action="store_true", help="main's tokentap has OBJECTIVES: send their traffic")
    ap.add_argument("--objective-prom", action="append", default=[],
                    help="a Prometheus that scrapes main: wait for it to hold the objectives' warm-up")
    a = ap.parse_args()
    for u in (a.main, a.stall, a.timeout, a.dead, a.odd, a.quantiles, a.engines, *a.objective_prom):
        if u:
            loopback(u)
    models = a.models.split(",")
    started = time.monotonic()
    results = {"main": [], "stall": [], "timeout": [], "dead": [], "odd": [], "refusals": {}, "models_status": None,
               "engines": []}

    # Slow streams first, in the background: they take ~10 s each.
    slow = []
    bg = cf.ThreadPoolExecutor(max_workers=4)
    if a.stall:
        traced = ("traced", {"traceparent": a.traceparent}) if a.traceparent else ("acme", {})
        for tenant, headers in (traced, ("acme", {})):
            slow.append(("stall", bg.submit(request, a.stall, a.stall_model, tenant, "chat", True, False, 40, headers)))
    if a.timeout:
        slow += [("timeout", bg.submit(request, a.timeout, a.timeout_model, "acme", "chat", True, False, 40)) for _ in range(2)]

    if a.engines:
        ollama = {"model": a.engine_model, "messages": [{"role": "user", "content": "hi"}]}
        tgi = {"inputs": "hi", "parameters": {"max_new_tokens": 6}}
        for _ in range(ENGINE_STREAMS):
            slow.append(("engines", bg.submit(engine_stream, a.engines, "/api/chat", ollama,
                                              {"x-sim-queue-ms": str(ENGINE_QUEUE_MS)})))
            slow.append(("engines", bg.submit(engine_stream, a.engines, "/generate_stream", tgi, {})))

    # Passthrough path (not an LLM call).
    u = urlparse(a.main)
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request("GET", "/v1/models")
        r = c.getresponse()
        r.read()
        results["models_status"] = r.status
        c.close()
    except (OSError, http.client.HTTPException) as e:
        results["models_status"] = f"{type(e).__name__}: {e}"

    # Objectives: the warm-up, scraped, then the counted traffic in the background.
    objective_streams = []
    opool = cf.ThreadPoolExecutor(max_workers=12)
    if a.objectives:
        warmup = [opool.submit(request, a.main, **j) for j in objective_jobs(OBJECTIVE_WARMUP, models[0])]
        for f in warmup:
            results["main"].append(dict(f.result(timeout=max(a.deadline - (time.monotonic() - started), 1)),
                                        objective_phase="warmup"))
        want = sum(sum(c.values()) for c in OBJECTIVE_WARMUP.values()) * len(OBJECTIVES)
        wait_scraped(a.objective_prom, OBJECTIVE_WARMUP, want, started + a.deadline)
        objective_streams = [opool.submit(request, a.main, **j) for j in objective_jobs(OBJECTIVE_TRAFFIC, models[0])]

    quantile_streams = []
    qpool = cf.ThreadPoolExecutor(max_workers=8)
    if a.quantiles:
        for _ in range(a.quantile_requests):
            stamps = []
            quantile_streams.append((stamps, qpool.submit(request, a.quantiles, a.quantile_model, "quantiles", "chat",
                                                          True, False, 30, None, stamps)))

    jobs = []
    for i in range(a.requests):
        jobs.append(dict(model=models[i % len(models)], tenant=TENANTS[i % len(TENANTS)],
                         kind="chat" if i % 3 else "completions", stream=(i % 8 != 7)))
    for i in range(a.cancels):
        jobs.append(dict(model=models[i % len(models)], tenant="acme", kind="chat", stream=True, cancel_after_first=True))
    details = {"x-sim-cached-tokens": str(DETAIL_CACHED), "x-sim-reasoning-tokens": str(DETAIL_REASONING)}
    for tenant in DETAIL_TENANTS:
        jobs += [dict(model=models[0], tenant=tenant, kind="chat", stream=True, extra_headers=details,
                      tag="usage_details") for _ in range(DETAIL_STREAMS)]
    with cf.ThreadPoolExecutor(max_workers=a.concurrency) as ex:
        futs = [ex.submit(request, a.main, **j) for j in jobs]
        for f in futs:
            left = a.deadline - (time.monotonic() - started)
            results["main"].append(f.result(timeout=max(left, 1)))
    if a.refusals_model:
        for what, model, fault, n in (("status_429", a.refusals_model, "status=429", REFUSED_429),
                                      ("rate_limit_streamed", a.refusals_model, "rate-limit-error-after=3",
                                       RATE_LIMIT_STREAMED),
                                      ("overloaded_streamed", a.refusals_model, "overloaded-error-after=3",
                                       OVERLOADED_STREAMED),
                                      ("not_found", NOT_SERVED_MODEL, None, NOT_FOUND)):
            headers = {"x-sim-fault": fault} if fault else {}
            results["refusals"][what] = [request(a.main, model, "acme", "chat", True, False, 10, headers)["status"]
                                         for _ in range(n)]
    if a.dead:
        for m in models[:1] * 3:
            results["dead"].append(request(a.dead, m, "acme", "chat", True, False, 10))
    if a.odd:
        for m in ("odd-plain", "odd-malformed"):
            results["odd"].append(request(a.odd, m, "acme", "chat", True, False, 10))
    for f in objective_streams:
        results["main"].append(dict(f.result(timeout=max(a.deadline - (time.monotonic() - started), 1)),
                                    objective_phase="counted"))
    opool.shutdown(wait=True)
    quantiles = []
    for stamps, f in quantile_streams:
        left = a.deadline - (time.monotonic() - started)
        quantiles.append((f.result(timeout=max(left, 1)), stamps))
    qpool.shutdown(wait=True)
    if a.quantile_log:
        with open(a.quantile_log, "w") as log:
            for _, stamps in quantiles:
                log.write(json.dumps({"gaps": [(b - a_) / 1e9 for a_, b in zip(stamps, stamps[1:])]}) + "\n")
    for kind, f in slow:
        left = a.deadline - (time.monotonic() - started)
        results[kind].append(f.result(timeout=max(left, 1)))
    bg.shutdown(wait=True)

    main = results["main"]
    summary = {
        "elapsed_s": round(time.monotonic() - started, 2),
        "main_sent": len(main),
        "main_completed": sum(1 for r in main if r["done"] and not r["cancel"]),
        "main_completed_by_model": {m: sum(1 for r in main if r["done"] and not r["cancel"] and r["model"] == m) for m in models},
        "main_cancelled_by_client": sum(1 for r in main if r["cancel"]),
        "main_errors": [r for r in main if r["error"] or (r["status"] != 200)],
        "stall_done": sum(1 for r in results["stall"] if r["done"]),
        "timeout_incomplete": sum(1 for r in results["timeout"] if not r["done"]),
        "dead_statuses": [r["status"] or r["error"] for r in results["dead"]],
        "odd": [{"model": r["model"], "status": r["status"], "done": r["done"], "error": r["error"]} for r in results["odd"]],
        "models_status": results["models_status"],
        "refusals": results["refusals"],
        "quantile_sent": len(quantiles),
        "quantile_completed": sum(1 for r, _ in quantiles if r["done"]),
        "quantile_errors": [r for r, _ in quantiles if r["error"] or r["status"] != 200][:3],
        "engines": results["engines"],
        "engine_model": a.engine_model if a.engines else None,
        "engine_queue_ms": ENGINE_QUEUE_MS,
        "models": models,
        "tenants": sorted({r["tenant"] or "unknown" for r in main}),
        # Per tenant, the streams whose usage reported cached and reasoning tokens.
        "usage_details": {
            "model": models[0], "cached": DETAIL_CACHED, "reasoning": DETAIL_REASONING,
            "streams": {t: sum(1 for r in main if r["tag"] == "usage_details" and r["tenant"] == t and r["done"])
                        for t in DETAIL_TENANTS},
        },
    }
    if a.objectives:
        # What tokentap must have judged: every request (warm-up included) on /metrics,
        # the counted ones in rate() over the rules' windows. Only streams the client saw
        # finish count; a failed one shows in main_errors.
        def seen(*phases):
            plan = {}
            for r in main:
                if r.get("objective_phase") in phases and r["done"]:
                    classes = plan.setdefault(r["tenant"], {})
                    classes[r["objective_class"]] = classes.get(r["objective_class"], 0) + 1
            return plan
        summary["objectives"] = {
            "model": models[0],
            "targets": {o: objective_target(o) for o in OBJECTIVES},
            "total": judged(seen("warmup", "counted")),
            "counted": judged(seen("counted")),
            "sent": sum(1 for r in main if r.get("objective_phase")),
            "tokens_per_request": 40,
        }
    json.dump(summary, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
