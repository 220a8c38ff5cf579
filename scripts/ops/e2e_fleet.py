"""The fleet claim, checked (docs/FLEET.md, "The claim, tested"): the shipped dashboard's
per-model p99 ITL and request rate, read by one Prometheus from two tokentap pods, equal
what one histogram holding both pods' traffic gives.

Run by scripts/ops/e2e-fleet.sh, which starts the simulators, the two tokentaps and
Prometheus. This script sends the traffic, scrapes both pods itself before and after it
(the merged histogram: the pods' classic buckets added bucket by bucket, per model, the
warm-up left out), then evaluates the dashboard's "Per model" queries in Prometheus over a
window that holds exactly that traffic, and compares.

Equal means: the p99 within 2% (Prometheus' rate() extrapolates each series by the time
between its samples and the window's edges, a factor that differs a little from pod to
pod, and so weights the pods a little differently), the request rate times the window
the merged count, or above it by no more than that extrapolation (two scrape intervals
over the window). Printed beside: the mean of
the two pods' own p99s, which a dashboard that averaged per-pod quantiles would show; the
pods run different ITLs so that it is far from the merged p99, and the check has teeth.

Prints PASS/FAIL lines; exit 1 on any failure.
"""
import argparse
import http.client
import json
import math
import re
import sys
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import dashboard_queries  # noqa: E402

ITL = "tokentap_inter_token_latency_seconds_bucket"
REQ = "tokentap_requests_total"
LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$')
LABEL = re.compile(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"')

failed = 0


def check(ok, what):
    global failed
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failed += 1


def scrape(admin):
    """{(name, model, le): value} of the ITL buckets and request counts of one pod."""
    text = urllib.request.urlopen(admin + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m or m.group(1) not in (ITL, REQ):
            continue
        labels = dict(LABEL.findall(m.group(2)))
        key = (m.group(1), labels.get("model"), labels.get("le"))
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def stream(proxy, model, tenant):
    u = urllib.parse.urlparse(proxy)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    body = json.dumps({"model": model, "stream": True, "max_tokens": 20,
                       "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", "x-tenant-id": tenant})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


TENANTS = 3


def traffic(proxies, models, per_model, concurrency):
    jobs = [(p, m, f"team-{i % TENANTS}") for p in proxies for m in models for i in range(per_model)]
    lock = threading.Lock()
    statuses = []

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                job = jobs.pop()
            status = stream(*job)
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def quantile(q, buckets):
    """Prometheus' histogram_quantile on [(le, cumulative count)] (classic buckets)."""
    buckets = sorted(buckets, key=lambda b: b[0])
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return buckets[-2][0]


def merged_buckets(before, after, model):
    """The merged histogram of one model: every pod's bucket increases, added by `le`."""
    sums = {}
    for b, a in zip(before, after):
        for (name, m, le), v in a.items():
            if name == ITL and m == model:
                sums[le] = sums.get(le, 0.0) + v - b.get((name, m, le), 0.0)
    return [(float(le), c) for le, c in sums.items()]


def count(before, after, model):
    return sum(v - b.get((n, m, le), 0.0)
               for b, a in zip(before, after) for (n, m, le), v in a.items()
               if n == REQ and m == model)


def prom_query(prom, expr, at):
    q = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    data = json.load(urllib.request.urlopen(f"{prom}/api/v1/query?{q}", timeout=10))
    if data.get("status") != "success":
        raise RuntimeError(f"{expr}: {data}")
    return {r["metric"].get("model"): float(r["value"][1]) for r in data["data"]["result"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prom", required=True)
    ap.add_argument("--proxies", required=True, help="comma-separated proxy URLs, one per pod")
    ap.add_argument("--admins", required=True, help="comma-separated admin URLs, same order")
    ap.add_argument("--models", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--per-model", type=int, default=30, help="streams per model per pod")
    ap.add_argument("--scrape-interval", type=float, default=1.0)
    args = ap.parse_args()
    proxies, admins = args.proxies.split(","), args.admins.split(",")
    models = args.models.split(",")

    # Warm-up: every series exists, and Prometheus has seen it flat, before the traffic.
    traffic(proxies, models, TENANTS, 4)
    time.sleep(4 * args.scrape_interval)
    before = [scrape(a) for a in admins]
    start = time.time()
    statuses = traffic(proxies, models, args.per_model, 12)
    check(all(s == 200 for s in statuses), f"{len(statuses)} streams through {len(proxies)} pods, all 200")
    time.sleep(2 * args.scrape_interval)
    after = [scrape(a) for a in admins]
    # Prometheus scrapes the final state (flat from here on), then the window is read: it
    # begins in the flat stretch before the traffic and lasts at least 30 s, so that
    # rate()'s extrapolation to its edges (at most a scrape interval each) stays small.
    time.sleep(3 * args.scrape_interval)
    while time.time() - start < 28:
        time.sleep(0.5)
    at = time.time()
    window = math.ceil(at - start + 2 * args.scrape_interval)

    dashboard = json.load(open(args.dashboard))
    panel = [q for q in dashboard_queries.panel_queries(dashboard, f"{window}s") if q[1] == "Per model"]
    p99_expr = next(q[4] for q in panel if "inter_token_latency" in q[4] and "0.99" in q[4])
    rate_expr = next(q[4] for q in panel if q[3].startswith("sum by (model) (rate(tokentap_requests_total"))
    print(f"window {window}s; dashboard queries:\n  {p99_expr}\n  {rate_expr}")
    p99 = prom_query(args.prom, p99_expr, at)
    rate = prom_query(args.prom, rate_expr, at)
    # rate() over a window whose edges are flat: (last - first) scaled by the window over the
    # span its samples cover, which falls short of the window by at most an interval at each
    # end. So the dashboard's count is the merged count, or at most that much more.
    rate_slack = 2 * args.scrape_interval / (window - 2 * args.scrape_interval)

    for model in models:
        merged = quantile(0.99, merged_buckets(before, after, model))
        pods = [quantile(0.99, merged_buckets([b], [a], model)) for b, a in zip(before, after)]
        got = p99.get(model, math.nan)
        check(abs(got - merged) <= 0.02 * merged,
              f"{model}: dashboard p99 ITL {got * 1000:.2f} ms = merged histogram's "
              f"{merged * 1000:.2f} ms (pods alone: {', '.join(f'{p * 1000:.2f}' for p in pods)} ms; "
              f"their mean {sum(pods) / len(pods) * 1000:.2f} ms)")
        check(abs(sum(pods) / len(pods) - merged) > 0.05 * merged,
              f"{model}: the mean of the pods' p99s is more than 5% from the merged p99 (the check can tell them apart)")
        want = count(before, after, model)
        seen = rate.get(model, math.nan) * window
        check(want > 0 and want - 0.01 <= seen <= want * (1 + rate_slack),
              f"{model}: dashboard request rate x {window}s = {seen:.1f} requests, merged count {want:.0f} "
              f"(at most {rate_slack:.1%} more: rate()'s extrapolation to the window's edges)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
