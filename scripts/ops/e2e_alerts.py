#!/usr/bin/env python3
"""Traffic and checks of scripts/ops/e2e-alerts.sh: does the page arrive, and leave?

    e2e_alerts.py --proxy URL --prom URL --webhook-log FILE --rules deploy/prometheus/rules.yaml
                  --steady M --regress M --limited M [--itl-ms 150] [--baseline 15]
                  [--fire-within 45] [--resolve-within 75]

Streams to three models through tokentap (in front of `tokentap sim`), two clients
each, all the time, and in phases:
  baseline    everything healthy for --baseline seconds; no alert may be pending or
              firing in Prometheus at its end;
  regression  --regress streams with `x-sim-itl-ms: --itl-ms` (every gap above the
              100 ms threshold) and every other request to --limited is answered 429
              by the simulator (`x-sim-fault: status=429`). It lasts until the webhook
              has had these three, each within --fire-within seconds of its start:
                TokentapInterTokenLatencyHigh{model=<regress>}
                TokentapInterTokenLatencyBudgetBurnPage{model=<regress>}
                TokentapUpstreamRateLimited{model=<limited>}
  recovery    healthy again; each of the three must arrive resolved within
              --resolve-within seconds of the regression's end.
Then the checks: each of the three came with the labels and annotations its rule
promises (the runbook word for word as in the shipped rules.yaml); no other alert
reached the webhook, except TokentapInterTokenLatencyBudgetBurnTicket{model=<regress>}
(this short run is the whole history of the scaled 1d and 3d windows, so the burn
files a ticket as well; it is reported, not required); in particular nothing for
--steady, no TokentapErrorRatioHigh for the 429s (they are upstream_refused, not
failures). Prints PASS/FAIL lines, the measured delays, and last
`E2E_ALERTS <passed> <failed> <alerts fired and resolved> <seconds from the regression's
start to each of the three at the webhook, in the order above>`.
Loopback URLs only; every wait has a bound.
"""
import argparse
import json
import pathlib
import re
import sys
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import e2e_traffic  # noqa: E402

import yaml  # noqa: E402

COUNTS = {"PASS": 0, "FAIL": 0}


def ok(cond, what, detail=""):
    kind = "PASS" if cond else "FAIL"
    COUNTS[kind] += 1
    print(f"{kind} {what}{'' if cond else ': ' + str(detail)}", flush=True)
    return cond


class Load:
    """Two clients per model streaming until stopped; the phase flags pick the headers."""

    def __init__(self, proxy, models, regress, limited, itl_ms, clients=2):
        self.proxy, self.models, self.regress, self.limited, self.itl_ms = proxy, models, regress, limited, itl_ms
        self.regressing = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.statuses = {m: {} for m in models}
        self.threads = [threading.Thread(target=self.client, args=(m,), daemon=True)
                        for m in models for _ in range(clients)]

    def client(self, model):
        n = 0
        while not self.stop.is_set():
            headers = {}
            if self.regressing.is_set() and model == self.regress:
                headers["x-sim-itl-ms"] = str(self.itl_ms)
            if self.regressing.is_set() and model == self.limited and n % 2 == 0:
                headers["x-sim-fault"] = "status=429"
            n += 1
            r = e2e_traffic.request(self.proxy, model, "e2e", "chat", True, False, 30, headers)
            with self.lock:
                key = r["status"] or r["error"]
                self.statuses[model][key] = self.statuses[model].get(key, 0) + 1
            if r["error"]:
                time.sleep(0.1)

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=35)


def prom_alerts(prom):
    with urllib.request.urlopen(f"{prom}/api/v1/alerts", timeout=10) as r:
        return json.load(r)["data"]["alerts"]


def prom_value(prom, expr):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        result = json.load(r)["data"]["result"]
    return {tuple(sorted(x["metric"].items())): float(x["value"][1]) for x in result}


def notifications(path):
    """[(received, status, labels, annotations)] of every alert the webhook got, in order."""
    out = []
    p = pathlib.Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        entry = json.loads(line)
        for alert in entry["payload"].get("alerts", []):
            out.append((entry["received"], alert["status"], alert["labels"], alert.get("annotations", {})))
    return out


def first(path, alertname, model, status, after=0.0):
    for received, st, labels, annotations in notifications(path):
        if (received >= after and st == status and labels.get("alertname") == alertname
                and labels.get("model") == model):
            return received, labels, annotations
    return None


def wait_for(path, wanted, status, since, bound):
    """{(alertname, model): (delay, labels, annotations)} of the wanted notifications that
    arrived within `bound` seconds of `since`; waits until all did or the bound passed."""
    got = {}
    while time.time() < since + bound and len(got) < len(wanted):
        for alertname, model in wanted:
            if (alertname, model) not in got:
                hit = first(path, alertname, model, status, since)
                if hit:
                    got[(alertname, model)] = (hit[0] - since, hit[1], hit[2])
        time.sleep(0.2)
    return got


def rule(rules, alertname):
    return next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alertname)


def check_promises(rules, alertname, model, labels, annotations, summary, description):
    """The labels the rule sets and the series carry, the summary and description as
    its templates render them, and the runbook exactly as shipped."""
    r = rule(rules, alertname)
    want = {"alertname": alertname, "model": model, **r.get("labels", {})}
    if "BudgetBurn" in alertname:
        want["slo"] = "inter_token_latency"
    ok(labels == want, f"{alertname}: labels are {want}", labels)
    ok(re.fullmatch(summary, annotations.get("summary", "")) is not None,
       f"{alertname}: summary reads like /{summary}/", annotations.get("summary"))
    ok(re.search(description, annotations.get("description", "")) is not None,
       f"{alertname}: description says /{description}/", annotations.get("description"))
    ok(annotations.get("runbook") == r["annotations"]["runbook"], f"{alertname}: runbook as in rules.yaml",
       annotations.get("runbook"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--prom", required=True)
    ap.add_argument("--webhook-log", required=True)
    ap.add_argument("--rules", required=True, help="the shipped rules.yaml (the annotations it promises)")
    ap.add_argument("--steady", required=True)
    ap.add_argument("--regress", required=True)
    ap.add_argument("--limited", required=True)
    ap.add_argument("--itl-ms", type=int, default=150)
    ap.add_argument("--baseline", type=float, default=15)
    ap.add_argument("--fire-within", type=float, default=45)
    ap.add_argument("--resolve-within", type=float, default=75)
    a = ap.parse_args()
    e2e_traffic.loopback(a.proxy)
    e2e_traffic.loopback(a.prom)
    rules = yaml.safe_load(pathlib.Path(a.rules).read_text())
    expected = [("TokentapInterTokenLatencyHigh", a.regress),
                ("TokentapInterTokenLatencyBudgetBurnPage", a.regress),
                ("TokentapUpstreamRateLimited", a.limited)]
    allowed = set(expected) | {("TokentapInterTokenLatencyBudgetBurnTicket", a.regress)}

    load = Load(a.proxy, [a.steady, a.regress, a.limited], a.regress, a.limited, a.itl_ms)
    load.start()
    try:
        print(f"== baseline: {a.baseline:g} s of healthy streams to {a.steady}, {a.regress}, {a.limited}", flush=True)
        time.sleep(a.baseline)
        rates = prom_value(a.prom, "model:tokentap_requests:rate5m")
        models = {dict(k).get("model") for k in rates}
        ok({a.steady, a.regress, a.limited} <= models, "Prometheus records the request rate of the three models",
           sorted(models))
        active = [(x["labels"].get("alertname"), x["labels"].get("model"), x["state"]) for x in prom_alerts(a.prom)]
        ok(not active, "no alert pending or firing after the healthy baseline", active)

        print(f"== regression: {a.regress} at x-sim-itl-ms {a.itl_ms}, every other {a.limited} request a 429", flush=True)
        t_regress = time.time()
        load.regressing.set()
        fired = wait_for(a.webhook_log, expected, "firing", t_regress, a.fire_within)
        load.regressing.clear()
        t_recover = time.time()
        for alertname, model in expected:
            hit = fired.get((alertname, model))
            ok(hit is not None, f"{alertname}{{model={model}}} reached the webhook {hit[0]:.1f} s after the regression "
               f"began (bound {a.fire_within:g} s)" if hit else
               f"{alertname}{{model={model}}} reached the webhook within {a.fire_within:g} s", "it did not")

        print(f"== recovery: healthy streams again ({t_recover - t_regress:.1f} s of regression)", flush=True)
        resolved = wait_for(a.webhook_log, expected, "resolved", t_recover, a.resolve_within)
        for alertname, model in expected:
            hit = resolved.get((alertname, model))
            ok(hit is not None, f"{alertname}{{model={model}}} resolved at the webhook {hit[0]:.1f} s after the "
               f"regression ended (bound {a.resolve_within:g} s)" if hit else
               f"{alertname}{{model={model}}} resolved at the webhook within {a.resolve_within:g} s", "it did not")
    finally:
        load.finish()
    print(f"client statuses per model: {json.dumps(load.statuses, sort_keys=True)}", flush=True)
    ok(set(load.statuses[a.limited]) == {200, 429} and set(load.statuses[a.steady]) == {200}
       and set(load.statuses[a.regress]) == {200},
       "clients saw 200s, and 429s only from the rate-limited model", load.statuses)

    print("== what the receiver got", flush=True)
    seen = {}
    for received, status, labels, _ in notifications(a.webhook_log):
        key = (labels.get("alertname"), labels.get("model"))
        seen.setdefault(key, []).append(status)
    for (alertname, model), statuses in sorted(seen.items(), key=str):
        print(f"  {alertname}{{model={model}}}: {' -> '.join(statuses)}")
    ok(set(seen) <= allowed, "no other alert reached the webhook (nothing for the steady model, no error-ratio "
       "alert for the 429s)", sorted(set(seen) - allowed, key=str))

    if ("TokentapInterTokenLatencyHigh", a.regress) in fired:
        _, labels, ann = fired[("TokentapInterTokenLatencyHigh", a.regress)]
        check_promises(rules, "TokentapInterTokenLatencyHigh", a.regress, labels, ann,
                       rf"p99 inter-token latency of {a.regress} is \d+(\.\d+)?ms",
                       r"above the threshold of 100ms\. Users see the stream stutter\.")
    if ("TokentapUpstreamRateLimited", a.limited) in fired:
        _, labels, ann = fired[("TokentapUpstreamRateLimited", a.limited)]
        check_promises(rules, "TokentapUpstreamRateLimited", a.limited, labels, ann,
                       rf"\d+(\.\d+)?% of requests to {a.limited} are rate limited upstream",
                       r"above the threshold of 5%\. Clients wait and retry, or fail\.")
    if ("TokentapInterTokenLatencyBudgetBurnPage", a.regress) in fired:
        _, labels, ann = fired[("TokentapInterTokenLatencyBudgetBurnPage", a.regress)]
        check_promises(rules, "TokentapInterTokenLatencyBudgetBurnPage", a.regress, labels, ann,
                       rf"{a.regress} burns its inter-token latency error budget \d+\.\dx as fast as the objective allows",
                       r"Objective: 99% of inter-token gaps of each model under 0\.1 s over 30d\.")

    both = [k for k in expected if k in fired and k in resolved]
    delays = " ".join(f"{fired[k][0]:.1f}" if k in fired else "-" for k in expected)
    print(f"E2E_ALERTS {COUNTS['PASS']} {COUNTS['FAIL']} {len(both)} {delays}")
    return 1 if COUNTS["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
