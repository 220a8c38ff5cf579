#!/usr/bin/env python3
"""Checks of scripts/ops/e2e-prometheus.sh against a live Prometheus and tokentap.

    e2e_check.py --prom URL --instance NAME=ADMIN_URL... --roles main=NAME,dead=NAME,...
                 --traffic SUMMARY.json [--rate-interval 2m] [--expect-dropped ADDR...]

Sections (each line PASS / FAIL / SKIP):
  targets     Prometheus scrapes exactly the tokentap admin ports, through the
              relabel rules of deploy/prometheus/scrape-config.yaml; decoys dropped
  exposition  /metrics of every instance passes `promtool check metrics`; every
              contract metric exists with its labels and bucket layout; every
              tokentap_* name the dashboard or the rules use exists
  semantics   what the traffic did shows up: outcomes per instance, tenants incl.
              `unknown`, stalls, timeouts, upstream_up, plausible TTFT/ITL
  dashboard   every panel query and variable query (variables resolved) is valid
              PromQL and returns data
  rules       every recording rule expression returns data and its recorded series
              exists; every alert expression is valid
A query or metric that depends only on event-driven counters that this run did
not produce (tokentap_contract.EVENT_DRIVEN, absent from every exposition) is
SKIPPED, never passed. Last line: `E2E_COUNTS <passed> <failed> <skipped>`.
"""
import argparse
import json
import math
import pathlib
import re
import subprocess
import sys
import urllib.parse
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dashboard_queries as dq  # noqa: E402
import tokentap_contract as contract  # noqa: E402

import yaml  # noqa: E402

ROOT = HERE.parents[1]
COUNTS = {"PASS": 0, "FAIL": 0, "SKIP": 0}


def report(kind, what, detail=""):
    COUNTS[kind] += 1
    print(f"{kind} {what}{': ' + str(detail) if detail else ''}", flush=True)


def ok(cond, what, detail=""):
    report("PASS" if cond else "FAIL", what, "" if cond else detail)
    return cond


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def prom_query(prom, expr):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        try:
            body = json.load(e)
        except ValueError:
            return None, f"HTTP {e.code}"
    except OSError as e:
        return None, str(e)
    if body.get("status") != "success":
        return None, f"{body.get('errorType')}: {body.get('error')}"
    return body["data"], None


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """[(name, {labels}, value)] and {family: type}."""
    samples, types = [], {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ.strip()
            continue
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if m:
            labels = dict(LABEL.findall(m.group(3) or ""))
            try:
                samples.append((m.group(1), labels, float(m.group(4))))
            except ValueError:
                pass
    return samples, types


def total(samples, name, **match):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == val for k, val in match.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prom", required=True)
    ap.add_argument("--instance", action="append", required=True, help="NAME=http://127.0.0.1:PORT (admin)")
    ap.add_argument("--roles", required=True, help="main=NAME,stall=NAME,timeout=NAME,dead=NAME")
    ap.add_argument("--traffic", required=True)
    ap.add_argument("--expect-dropped", action="append", default=[], help="host:port of a decoy target")
    ap.add_argument("--rate-interval", default="2m")
    ap.add_argument("--dashboard", default=str(ROOT / "grafana/dashboards/tokentap.json"))
    ap.add_argument("--rules", default=str(ROOT / "deploy/prometheus/rules.yaml"))
    ap.add_argument("--cancels", type=int, default=0)
    a = ap.parse_args()
    prom = a.prom.rstrip("/")
    inst = dict(i.split("=", 1) for i in a.instance)
    roles = dict(r.split("=", 1) for r in a.roles.split(","))
    traffic = json.loads(pathlib.Path(a.traffic).read_text())
    dashboard = json.loads(pathlib.Path(a.dashboard).read_text())
    rules = yaml.safe_load(pathlib.Path(a.rules).read_text())

    # ------------------------------------------------------------- targets
    print("== targets")
    data, err = prom_query(prom, 'up{job="tokentap"}')
    with urllib.request.urlopen(f"{prom}/api/v1/targets?state=any", timeout=10) as r:
        targets = json.load(r)["data"]
    active = {t["labels"].get("instance"): t for t in targets["activeTargets"]}
    want = {urllib.parse.urlparse(u).netloc for u in inst.values()}
    ok(set(active) == want, "active targets are exactly the tokentap admin ports", f"active {sorted(active)} want {sorted(want)}")
    ok(all(t["labels"].get("job") == "tokentap" for t in active.values()), 'targets carry job="tokentap"')
    ok(all(t["health"] == "up" for t in active.values()), "every tokentap target is up",
       {k: (t["health"], t.get("lastError")) for k, t in active.items() if t["health"] != "up"})
    ok(all({"namespace", "pod", "container"} <= set(t["labels"]) for t in active.values()),
       "relabeling added namespace/pod/container labels")
    dropped = {t["discoveredLabels"].get("__address__") for t in targets["droppedTargets"]}
    for d in a.expect_dropped:
        ok(d in dropped, f"decoy target {d} dropped by the relabel rules", f"dropped: {sorted(dropped)}")

    # ------------------------------------------------------------- exposition
    print("== exposition")
    expo, present = {}, set()
    all_samples, all_types = [], {}
    for name, url in inst.items():
        try:
            status, text = http_get(f"{url}/metrics")
        except OSError as e:
            ok(False, f"{name}: GET /metrics", e)
            continue
        ok(status == 200, f"{name}: GET /metrics answers 200", status)
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        ok(lint.returncode == 0, f"{name}: promtool check metrics is clean", (lint.stdout + lint.stderr).strip()[:800])
        samples, types = parse_exposition(text)
        expo[name] = samples
        all_samples += samples
        all_types.update(types)
    for n, _, _ in all_samples:
        present.add(contract.base_name(n))
    for metric, (typ, labels) in contract.METRICS.items():
        if metric not in present:
            if metric in contract.EVENT_DRIVEN:
                report("SKIP", f"{metric} not in any exposition (event-driven: no such event in this run)")
            else:
                ok(False, f"{metric} exists", "absent from every /metrics")
            continue
        ok(all_types.get(metric) == typ, f"{metric} is a {typ}", all_types.get(metric))
        names = {metric + s for s in ("_bucket", "_sum", "_count")} if typ == "histogram" else {metric}
        seen = {tuple(sorted(set(l) - {"le"})) for n, l, _ in all_samples if n in names}
        ok(seen == {tuple(sorted(labels))}, f"{metric} has labels {list(labels)}", seen)
    for p in sorted(contract.PROCESS_METRICS):
        ok(p in present, f"{p} exists")
    for metric, buckets in (("tokentap_inter_token_latency_seconds", contract.ITL_BUCKETS),
                            ("tokentap_time_to_first_token_seconds", contract.TTFT_BUCKETS),
                            ("tokentap_time_to_first_byte_seconds", contract.TTFT_BUCKETS)):
        les = {float(l["le"]) for n, l, _ in all_samples if n == metric + "_bucket"}
        if les:
            ok(les == set(map(float, buckets)) | {math.inf}, f"{metric} buckets are the documented defaults",
               sorted(les ^ (set(map(float, buckets)) | {math.inf})))
    dash_exprs = [raw for _, _, _, raw, _ in dq.panel_queries(dashboard)] + [q for _, q, _, _ in dq.variable_queries(dashboard)]
    rule_exprs = [str(r["expr"]) for g in rules["groups"] for r in g["rules"]]
    used = set().union(*(contract.referenced(e) for e in dash_exprs + rule_exprs))
    for metric in sorted(used):
        if metric in present:
            report("PASS", f"{metric} (used by dashboard/rules) is exposed")
        elif metric in contract.EVENT_DRIVEN:
            report("SKIP", f"{metric} (used by dashboard/rules) not exposed: no such event in this run")
        else:
            ok(False, f"{metric} (used by dashboard/rules) is exposed", "absent from every /metrics")

    # ------------------------------------------------------------- semantics
    print("== semantics")
    main_s = expo.get(roles.get("main"), [])
    if main_s:
        got = total(main_s, "tokentap_requests_total", outcome="completed")
        ok(got == traffic["main_completed"], "main: completed requests = streams the client saw finish",
           f"tokentap {got:g} vs client {traffic['main_completed']}")
        for model, n in traffic["main_completed_by_model"].items():
            got = total(main_s, "tokentap_requests_total", outcome="completed", model=model)
            ok(got == n, f"main: completed requests of model {model} = {n}", got)
        got = total(main_s, "tokentap_requests_total", outcome="cancelled")
        ok(got == a.cancels, f"main: cancelled = {a.cancels} streams the client abandoned", got)
        tenants = {l.get("tenant") for n, l, _ in main_s if n == "tokentap_requests_total"}
        ok(tenants == set(traffic["tenants"]), "main: tenant labels = x-tenant-id values, `unknown` without the header",
           f"{sorted(tenants)} vs {traffic['tenants']}")
        ok(total(main_s, "tokentap_upstream_up") == 1, "main: tokentap_upstream_up = 1")
        ok(total(main_s, "tokentap_streams_in_flight") == 0, "main: no streams in flight after the traffic")
        c = total(main_s, "tokentap_time_to_first_token_seconds_count")
        ttft = total(main_s, "tokentap_time_to_first_token_seconds_sum") / c if c else float("nan")
        ok(0.14 <= ttft <= 1.5, "main: mean TTFT within [0.14 s, 1.5 s] (sim --ttft 150ms)", ttft)
        c = total(main_s, "tokentap_time_to_first_byte_seconds_count")
        ttfb = total(main_s, "tokentap_time_to_first_byte_seconds_sum") / c if c else float("nan")
        ok(ttfb <= ttft, "main: mean TTFB <= mean TTFT", f"{ttfb} > {ttft}")
        c = total(main_s, "tokentap_inter_token_latency_seconds_count")
        itl = total(main_s, "tokentap_inter_token_latency_seconds_sum") / c if c else float("nan")
        ok(0.015 <= itl <= 0.06, "main: token-weighted mean ITL within [15 ms, 60 ms] (sim --itl 20ms)", itl)
        out_tok = total(main_s, "tokentap_output_tokens_total")
        ok(out_tok >= 40 * traffic["main_completed"], "main: output tokens >= 40 per completed stream", out_tok)
        ok(total(main_s, "tokentap_input_tokens_total") > 0, "main: input tokens counted (usage reported)")
    if roles.get("dead") in expo:
        s = expo[roles["dead"]]
        ok(total(s, "tokentap_upstream_up") == 0, "dead upstream: tokentap_upstream_up = 0")
        got = total(s, "tokentap_requests_total", outcome="upstream_error")
        ok(got == len(traffic["dead_statuses"]), "dead upstream: every request is outcome=upstream_error", got)
        ok(all(isinstance(x, int) and x >= 500 for x in traffic["dead_statuses"]), "dead upstream: clients got a 5xx",
           traffic["dead_statuses"])
        try:
            st, _ = http_get(f"{inst[roles['dead']]}/readyz")
        except urllib.error.HTTPError as e:
            st = e.code
        except OSError as e:
            st = str(e)
        ok(st != 200, "dead upstream: /readyz is not ready", st)
    if roles.get("stall") in expo:
        s = expo[roles["stall"]]
        ok(total(s, "tokentap_stream_stalls_total") >= 2, "stall: stalls counted (token gap 5.5 s > 5 s threshold)",
           total(s, "tokentap_stream_stalls_total"))
        ok(total(s, "tokentap_requests_total", outcome="completed") == traffic["stall_done"] == 2,
           "stall: both slow streams completed (idle timeout 30 s)", (total(s, "tokentap_requests_total", outcome="completed"), traffic["stall_done"]))
    if roles.get("timeout") in expo:
        s = expo[roles["timeout"]]
        ok(total(s, "tokentap_requests_total", outcome="timeout") == 2 and traffic["timeout_incomplete"] == 2,
           "timeout: both streams end as outcome=timeout (idle timeout 2 s < 5.5 s gap)",
           (total(s, "tokentap_requests_total", outcome="timeout"), traffic["timeout_incomplete"]))
    if traffic.get("odd"):
        odd = {r["model"]: r for r in traffic["odd"]}
        plain, bad = odd.get("odd-plain", {}), odd.get("odd-malformed", {})
        ok(plain.get("status") == 200 and not plain.get("error"), "odd: a text/plain answer is forwarded (200)", plain)
        ok(bad.get("status") == 200 and bad.get("done"), "odd: a stream with a malformed event is forwarded to its end", bad)
    ok(traffic["models_status"] == 200, "GET /v1/models passes through", traffic["models_status"])
    ok(not traffic["main_errors"], "main: no client-side errors", traffic["main_errors"][:3])

    # ------------------------------------------------------------- queries
    absent_events = {m for m in contract.EVENT_DRIVEN if m not in present}

    def run(what, expr, need_data=True, refs_from=None):
        data, err = prom_query(prom, expr)
        if err:
            return ok(False, f"{what} is valid", f"{err} | {expr}")
        result = data["result"]
        if data["resultType"] == "scalar":
            result = [result]
        if not need_data:
            return report("PASS", f"{what} is valid ({len(result)} series)")
        refs = contract.referenced(refs_from or expr)
        if not result:
            if refs & absent_events:
                return report("SKIP", f"{what}: no data, reads {sorted(refs & absent_events)} (no such event in this run)")
            return ok(False, f"{what} returns data", f"empty | {expr}")
        vals = [float(r["value"][1]) if "value" in r else float(r[1]) for r in result]
        if all(math.isnan(v) for v in vals):
            return ok(False, f"{what} returns data", f"only NaN | {expr}")
        report("PASS", f"{what} returns data ({len(result)} series)")

    print("== dashboard")
    heatmaps = {p.get("id") for p in dashboard.get("panels", []) if p.get("type") == "heatmap"}
    heatmap_queries = {}
    for pid, title, ref, _raw, expr in dq.panel_queries(dashboard, a.rate_interval):
        if pid in heatmaps:
            # A heatmap has one query per kind of histogram (classic `_bucket` by le,
            # native): each must be valid, the one of this Prometheus' kind has data.
            run(f"panel {pid} \"{title}\" {ref}", expr, need_data=False)
            heatmap_queries.setdefault((pid, title), []).append(expr)
            continue
        run(f"panel {pid} \"{title}\" {ref}", expr)
    for (pid, title), exprs in heatmap_queries.items():
        with_data = [e for e in exprs if ((prom_query(prom, e)[0] or {}).get("result"))]
        ok(len(with_data) == 1, f"heatmap {pid} \"{title}\": the query of this Prometheus' kind returns data",
           f"{len(with_data)} of {len(exprs)} have data")
    for name, _q, sel, label in dq.variable_queries(dashboard, a.rate_interval):
        run(f"variable {name} (label_values on {label})", f"count by ({label}) ({sel})")

    print("== rules")
    for g in rules["groups"]:
        for r in g["rules"]:
            expr = str(r["expr"])
            if "record" in r:
                run(f"recording rule {r['record']} expr", expr)
                run(f"recorded series {r['record']}", r["record"], refs_from=expr)
            else:
                run(f"alert {r['alert']} expr", expr, need_data=False)
    run("TokentapUpstreamDown expr sees the dead upstream", "tokentap_upstream_up == 0")

    print(f"E2E_COUNTS {COUNTS['PASS']} {COUNTS['FAIL']} {COUNTS['SKIP']}")
    return 1 if COUNTS["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
