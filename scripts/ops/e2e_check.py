#!/usr/bin/env python3
"""Checks of scripts/ops/e2e-prometheus.sh against a live Prometheus and tokentap.

    e2e_check.py --prom URL --kind classic|native --instance NAME=ADMIN_URL...
                 --roles main=NAME,dead=NAME,... --traffic SUMMARY.json
                 [--sections targets,exposition,...] [--rate-interval 2m]
                 [--expect-dropped ADDR...] [native section options, see --help]

--kind says which kind of Prometheus --prom is: `classic` (scrapes text, stores
_bucket/_sum/_count series) or `native` (--enable-feature=native-histograms,
exemplar-storage: scrapes protobuf and, in 2.42, stores only the native series of a
histogram that has native buckets). Every line is prefixed with the kind.

Sections (each line PASS / FAIL / SKIP):
  targets     Prometheus scrapes exactly the tokentap admin ports, through the
              relabel rules of deploy/prometheus/scrape-config.yaml; decoys dropped
  exposition  /metrics of every instance passes `promtool check metrics`; every
              contract metric exists with its labels and bucket layout; every
              tokentap_* name the dashboard or the rules use exists
  semantics   what the traffic did shows up: outcomes per instance, tenants incl.
              `unknown`, stalls, timeouts, upstream_up, plausible TTFT/ITL; with
              --refusals-model the refusals by outcome and status (429 heads, rate-limit
              and overloaded errors streamed inside a 200, the upstream's 404), the
              Retry-After gauge and, with --rate-limit-rpm, the rate-limit gauges;
              with the traffic's `objectives`, main's judgements: met and missed per
              objective and tenant exactly as the traffic's classes imply, their
              output tokens, the targets, and every refusal a miss; with the traffic's
              `usage_details`, the cached and reasoning tokens per tenant its usage
              reported
  dashboard   every panel query and variable query (variables resolved) is valid
              PromQL and returns data
  rules       every recording rule expression returns data and its recorded series
              exists; every alert expression is valid and every series it reads
              (recorded series, thresholds, raw metrics) returns data, so each alert
              can fire on this kind of Prometheus; the SLO burn rates of the
              --quantile-model traffic, whose gaps all lie above the ITL objective's
              100 ms and whose first tokens all lie under the TTFT objective's 2 s,
              are exactly 100 and 0 (the native arm's histogram_fraction and the
              classic arm's le bucket count the same); with the traffic's
              `objectives`, the recorded attainment of each objective and tenant
              against the share of the counted requests that met it (1 for the
              tenant whose every request met it) and 40 good tokens per good request
  native      (native kind) the native-histogram checks: TTFT and ITL are stored as
              native histograms; histogram_quantile(q) over them for q = 0.5, 0.9, 0.99
              lies within --tolerance of the exact quantile of the values tokentap
              observed, with the classic Prometheus' estimate from the classic buckets
              printed beside it; /api/v1/query_exemplars returns the trace id of the
              deliberately slow traced request with that request's own TTFT and
              slowest ITL gap (SKIP while tokentap serves no exemplars)
On the native kind, a query that returns nothing and reads classic-only series
(a histogram's _bucket/_sum/_count) FAILs with a note saying so: it must be written
to work on both kinds.
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
import time
import urllib.parse
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dashboard_queries as dq  # noqa: E402
import e2e_traffic  # noqa: E402
from exposition import parse_exposition, total  # noqa: E402
import tokentap_contract as contract  # noqa: E402

import yaml  # noqa: E402

ROOT = HERE.parents[1]
COUNTS = {"PASS": 0, "FAIL": 0, "SKIP": 0}


PROM_KIND = "classic"


def report(kind, what, detail=""):
    COUNTS[kind] += 1
    print(f"{kind} [{PROM_KIND}] {what}{': ' + str(detail) if detail else ''}", flush=True)


def ok(cond, what, detail=""):
    report("PASS" if cond else "FAIL", what, "" if cond else detail)
    return cond


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def prom_query(prom, expr, path="/api/v1/query", **params):
    url = f"{prom}{path}?" + urllib.parse.urlencode({"query": expr, **params})
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


def classic_only(expr):
    """The classic-only series (a histogram's _bucket/_sum/_count) an expression reads."""
    return sorted({m.group(0) for m in re.finditer(r"\btokentap_[a-z0-9_]+_(?:bucket|sum|count)\b", expr)
                   if contract.METRICS.get(contract.base_name(m.group(0)), ("",))[0] == "histogram"})


SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?(?![\w:(])")
PROMQL_WORDS = {"on", "by", "without", "and", "or", "unless", "group_left", "group_right", "ignoring", "bool",
                "offset", "inf", "nan"}


def series_read(expr):
    """The series selectors (name plus label matchers) a PromQL expression reads:
    recorded series, thresholds and raw metrics, in order, without duplicates."""
    out = []
    for m in SELECTOR.finditer(expr):
        name = m.group(1)
        if name.lower() in PROMQL_WORDS or not (":" in name or name.startswith("tokentap_") or name == "up"):
            continue
        sel = name + (m.group(2) or "")
        if sel not in out:
            out.append(sel)
    return out


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
    ap.add_argument("--refusals-model", help="semantics: the model of e2e_traffic.py --refusals-model")
    ap.add_argument("--rate-limit-rpm", type=int, help="semantics: the main simulator's --rate-limit-rpm")
    ap.add_argument("--kind", choices=("classic", "native"), default="classic")
    ap.add_argument("--sections", default="targets,exposition,semantics,dashboard,rules,native",
                    help="comma-separated sections to run (native runs only on the native kind)")
    ap.add_argument("--classic-prom", help="native section: the classic Prometheus, for the classic estimates")
    ap.add_argument("--quantile-model", default="e2e-quantiles")
    ap.add_argument("--quantile-access-log", help="native section: stderr of the tokentap of the quantile traffic")
    ap.add_argument("--quantile-gaps", help="native section: e2e_traffic.py --quantile-log")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--traceparent", help="native section: the traced slow request's traceparent")
    ap.add_argument("--traced-instance", help="native section: NAME of the instance the traced request went through")
    ap.add_argument("--traced-access-log", help="native section: that instance's stderr (JSON access log)")
    a = ap.parse_args()
    global PROM_KIND
    PROM_KIND = a.kind
    sections = set(a.sections.split(","))
    prom = a.prom.rstrip("/")
    inst = dict(i.split("=", 1) for i in a.instance)
    roles = dict(r.split("=", 1) for r in a.roles.split(","))
    traffic = json.loads(pathlib.Path(a.traffic).read_text())
    a.traffic_summary = traffic
    dashboard = json.loads(pathlib.Path(a.dashboard).read_text())
    rules = yaml.safe_load(pathlib.Path(a.rules).read_text())

    if "targets" in sections:
        check_targets(prom, inst, a.expect_dropped)
    expo, present = read_expositions(inst, check="exposition" in sections)
    if "exposition" in sections:
        check_exposition(expo, present, dashboard, rules)
    if "semantics" in sections:
        check_semantics(expo, roles, inst, traffic, a.cancels)
        check_refusals(expo, roles, traffic, a.refusals_model, a.rate_limit_rpm)
        check_objectives(expo, roles, traffic, a.refusals_model)
        check_usage_details(expo, roles, traffic)
    absent_events = {m for m in contract.EVENT_DRIVEN if m not in present}
    if "dashboard" in sections or "rules" in sections:
        check_queries(prom, a, dashboard, rules, sections, absent_events)
    if "native" in sections and a.kind == "native":
        check_native(prom, a, inst, traffic)

    print(f"E2E_COUNTS {COUNTS['PASS']} {COUNTS['FAIL']} {COUNTS['SKIP']}")
    return 1 if COUNTS["FAIL"] else 0


def check_targets(prom, inst, expect_dropped):
    print(f"== [{PROM_KIND}] targets")
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
    for d in expect_dropped:
        ok(d in dropped, f"decoy target {d} dropped by the relabel rules", f"dropped: {sorted(dropped)}")


def read_expositions(inst, check):
    """{instance: samples} of every instance's text /metrics and the contract-level names
    present in any; with `check`, each GET and `promtool check metrics` is a check."""
    if check:
        print(f"== [{PROM_KIND}] exposition")
    expo, present = {}, set()
    for name, url in inst.items():
        try:
            status, text = http_get(f"{url}/metrics")
        except OSError as e:
            ok(False, f"{name}: GET /metrics", e)
            continue
        if check:
            ok(status == 200, f"{name}: GET /metrics answers 200", status)
            lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
            ok(lint.returncode == 0, f"{name}: promtool check metrics is clean",
               (lint.stdout + lint.stderr).strip()[:800])
        expo[name] = parse_exposition(text)
    for samples, _ in expo.values():
        for n, _, _ in samples:
            present.add(contract.base_name(n))
    return expo, present


def check_exposition(expo, present, dashboard, rules):
    all_samples, all_types = [], {}
    for samples, types in expo.values():
        all_samples += samples
        all_types.update(types)
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


def check_semantics(expo, roles, inst, traffic, cancels):
    print(f"== [{PROM_KIND}] semantics")
    expo = {name: samples for name, (samples, _) in expo.items()}
    main_s = expo.get(roles.get("main"), [])
    if main_s:
        got = total(main_s, "tokentap_requests_total", outcome="completed")
        ok(got == traffic["main_completed"], "main: completed requests = streams the client saw finish",
           f"tokentap {got:g} vs client {traffic['main_completed']}")
        for model, n in traffic["main_completed_by_model"].items():
            got = total(main_s, "tokentap_requests_total", outcome="completed", model=model)
            ok(got == n, f"main: completed requests of model {model} = {n}", got)
        got = total(main_s, "tokentap_requests_total", outcome="cancelled")
        ok(got == cancels, f"main: cancelled = {cancels} streams the client abandoned", got)
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
    engines = traffic.get("engines") or []
    if engines and roles.get("engines") in expo:
        s = expo[roles["engines"]]
        model, n = traffic["engine_model"], len(engines) // 2
        ok(all(r["status"] == 200 and not r["error"] for r in engines),
           f"engines: {len(engines)} Ollama and TGI streams answered 200", engines[:2])
        queue_n = total(s, "tokentap_engine_queue_seconds_count", model=model)
        queue_sum = total(s, "tokentap_engine_queue_seconds_sum", model=model)
        want = n * traffic["engine_queue_ms"] / 1e3
        ok(queue_n == n and abs(queue_sum - want) < 1e-6,
           f"engines: the engine's queue time of {model}'s {n} Ollama streams ({traffic['engine_queue_ms']} ms each)",
           (queue_n, queue_sum))
        outside_n = total(s, "tokentap_time_to_first_token_outside_engine_seconds_count", model=model)
        ok(outside_n == n, f"engines: TTFT outside the engine observed for each of {model}'s streams", outside_n)
        per_event_n = total(s, "tokentap_output_tokens_per_event_count")
        per_event_sum = total(s, "tokentap_output_tokens_per_event_sum")
        ok(per_event_n >= 6 * n and per_event_sum == per_event_n,
           "engines: TGI's exact tokens are observed one per event", (per_event_n, per_event_sum))
    if "quantile_sent" in traffic:
        ok(traffic["quantile_completed"] == traffic["quantile_sent"] > 0,
           f"quantiles: all {traffic['quantile_sent']} streams completed", traffic["quantile_errors"])


def check_refusals(expo, roles, traffic, model, rpm):
    """Who refused a request, and what the upstream said about its limits, on main."""
    samples = expo.get(roles.get("main"), ([], {}))[0]
    if not samples:
        return
    completed = total(samples, "tokentap_requests_total", outcome="completed")
    ok(completed == total(samples, "tokentap_requests_total", outcome="completed", status="2xx"),
       "main: every completed request has status 2xx",
       {l.get("status") for n, l, _ in samples if n == "tokentap_requests_total" and l.get("outcome") == "completed"})
    if model:
        got = traffic["refusals"]
        for what, outcome, status, want, client in (
                ("429 heads", "upstream_refused", "429", e2e_traffic.REFUSED_429, got["status_429"]),
                ("rate-limit errors streamed in a 200", "upstream_error", "429", e2e_traffic.RATE_LIMIT_STREAMED,
                 got["rate_limit_streamed"]),
                ("overloaded errors streamed in a 200", "upstream_error", "503", e2e_traffic.OVERLOADED_STREAMED,
                 got["overloaded_streamed"])):
            n = total(samples, "tokentap_requests_total", model=model, outcome=outcome, status=status)
            ok(n == want, f"main: {want} {what} of {model} are outcome={outcome}, status={status} "
               f"(the client saw {client})", n)
        n = total(samples, "tokentap_requests_total", model=e2e_traffic.NOT_SERVED_MODEL, outcome="upstream_refused",
                  status="4xx")
        ok(n == e2e_traffic.NOT_FOUND, f"main: the upstream's 404 for {e2e_traffic.NOT_SERVED_MODEL} is "
           f"outcome=upstream_refused, status=4xx (the client saw {got['not_found']})", n)
        ok(total(samples, "tokentap_upstream_retry_after_seconds", model=model) == 7,
           f"main: tokentap_upstream_retry_after_seconds{{model={model}}} = the simulator's Retry-After: 7",
           total(samples, "tokentap_upstream_retry_after_seconds", model=model))
    if rpm:
        for m in traffic["models"]:
            limit = total(samples, "tokentap_upstream_rate_limit_limit", model=m, resource="requests")
            left = total(samples, "tokentap_upstream_rate_limit_remaining", model=m, resource="requests")
            ok(limit == rpm and 0 < left < rpm,
               f"main: rate-limit gauges of {m}: limit {rpm} requests (the simulator's --rate-limit-rpm), "
               f"0 < remaining < limit", (limit, left))
            ok(total(samples, "tokentap_upstream_rate_limit_limit", model=m, resource="tokens") > 0,
               f"main: the token limit of {m} is reported too")


def check_objectives(expo, roles, traffic, refusals_model):
    """Main's judgements on /metrics: exactly what the traffic's classes imply."""
    objectives = traffic.get("objectives")
    samples = expo.get(roles.get("main"), ([], {}))[0]
    if not objectives or not samples:
        return
    model, per = objectives["model"], objectives["tokens_per_request"]
    family, tokens = "tokentap_objective_requests_total", "tokentap_objective_output_tokens_total"
    for objective, tenants in objectives["total"].items():
        got = total(samples, "tokentap_objective_target", objective=objective)
        ok(got == objectives["targets"][objective],
           f"main: tokentap_objective_target{{objective={objective}}} = {objectives['targets'][objective]}", got)
        for tenant, want in tenants.items():
            got = {r: total(samples, family, model=model, objective=objective, tenant=tenant, result=r)
                   for r in ("met", "missed")}
            ok(got == want, f"main: {objective}, tenant {tenant}: met {want['met']}, missed {want['missed']} "
               f"(the traffic's classes)", got)
            got_tokens = {r: total(samples, tokens, model=model, objective=objective, tenant=tenant, result=r)
                          for r in ("met", "missed")}
            ok(got_tokens == {r: per * n for r, n in want.items()},
               f"main: {objective}, tenant {tenant}: {per} output tokens per judged request, by result",
               got_tokens)
    if refusals_model:
        # The service failed or refused them: a miss, whatever the bounds.
        for m, want in ((refusals_model, e2e_traffic.REFUSED_429 + e2e_traffic.RATE_LIMIT_STREAMED
                         + e2e_traffic.OVERLOADED_STREAMED),
                        (e2e_traffic.NOT_SERVED_MODEL, e2e_traffic.NOT_FOUND)):
            for objective in objectives["total"]:
                got = {r: total(samples, family, model=m, objective=objective, tenant="acme", result=r)
                       for r in ("met", "missed")}
                ok(got == {"met": 0, "missed": want},
                   f"main: {objective}: the {want} refused or failed requests to {m} are all missed", got)


def check_usage_details(expo, roles, traffic):
    """Main's cached and reasoning tokens: what the usage of the traffic's tagged streams
    reported, per tenant, and nothing for a tenant that sent none."""
    details = traffic.get("usage_details")
    samples = expo.get(roles.get("main"), ([], {}))[0]
    if not details or not samples:
        return
    family = "tokentap_usage_detail_tokens_total"
    for tenant in traffic["tenants"]:
        n = details["streams"].get(tenant, 0)
        want = {"cache_read_input": n * details["cached"], "reasoning_output": n * details["reasoning"],
                "cache_write_input": 0}
        got = {kind: total(samples, family, tenant=tenant, kind=kind) for kind in want}
        ok(got == want, f"main: tenant {tenant}: {n} streams reported {details['cached']} cached input and "
           f"{details['reasoning']} reasoning output tokens each", got)


def check_objective_rules(prom, traffic):
    """The recorded attainment and goodput of main's objectives against the traffic."""
    objectives = traffic.get("objectives")
    if not objectives:
        return
    model = objectives["model"]
    for objective, tenants in objectives["counted"].items():
        for tenant, want in tenants.items():
            labels = f'objective="{objective}", model="{model}", tenant="{tenant}"'
            implied = want["met"] / (want["met"] + want["missed"])
            got = scalar(prom, f"objective_model_tenant:tokentap_objective_attainment:ratio_rate1h{{{labels}}}")
            # rate() extrapolates each series by up to 1.5 scrape intervals over its own
            # sampled span (here tens of 1 s scrapes), and met and missed start at
            # different scrapes: their ratio moves by well under 0.02. A tenant with no
            # missed series has exactly 1.
            tolerance = 0.0 if want["missed"] == 0 else 0.02
            ok(got is not None and abs(got - implied) <= tolerance,
               f"attainment of {objective} for tenant {tenant}: observed "
               f"{'none' if got is None else format(got, '.4f')} vs implied {implied:.4f} "
               f"({want['met']} of {want['met'] + want['missed']} counted requests met it)", got)
            good = scalar(prom, f"objective_model_tenant:tokentap_objective_goodput:rate5m{{{labels}}}")
            good_tokens = scalar(prom, f"objective_model_tenant:tokentap_objective_token_goodput:rate5m{{{labels}}}")
            per = objectives["tokens_per_request"]
            ok(good is not None and good > 0 and good_tokens is not None
               and abs(good_tokens / good - per) <= 0.01 * per,
               f"goodput of {objective} for tenant {tenant}: {good_tokens} good tokens/s over {good} good "
               f"requests/s = {per} tokens per request", (good, good_tokens))


def check_queries(prom, a, dashboard, rules, sections, absent_events):
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
            note = ""
            if PROM_KIND == "native" and classic_only(refs_from or expr):
                note = (f" [classic-only: reads {', '.join(classic_only(refs_from or expr))}, which a native-histogram"
                        " Prometheus does not store; the query must be written for both kinds]")
            return ok(False, f"{what} returns data", f"empty{note} | {expr}")
        # A native histogram sample counts as data; float samples must not all be NaN.
        vals = [float(r["value"][1]) if "value" in r else 0.0 if "histogram" in r else float(r[1]) for r in result]
        if all(math.isnan(v) for v in vals):
            return ok(False, f"{what} returns data", f"only NaN | {expr}")
        report("PASS", f"{what} returns data ({len(result)} series)")

    if "dashboard" in sections:
        print(f"== [{PROM_KIND}] dashboard")
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

    if "rules" in sections:
        print(f"== [{PROM_KIND}] rules")
        recorded = {str(r["record"]): str(r["expr"]) for g in rules["groups"] for r in g["rules"] if "record" in r}
        for g in rules["groups"]:
            for r in g["rules"]:
                expr = str(r["expr"])
                if "record" in r:
                    run(f"recording rule {r['record']} expr", expr)
                    run(f"recorded series {r['record']}", r["record"], refs_from=expr)
                    continue
                run(f"alert {r['alert']} expr", expr, need_data=False)
                # The alert can fire on this kind only if every series it reads exists.
                for sel in series_read(expr):
                    run(f"alert {r['alert']} input {sel}", sel, refs_from=recorded.get(sel, sel))
        run("TokentapUpstreamDown expr sees the dead upstream", "tokentap_upstream_up == 0")
        # The quantile traffic (gaps 146-270 ms, first tokens 144-266 ms, see
        # e2e-prometheus.sh) lies wholly inside the 5m window: every gap misses the ITL
        # objective (burn rate = 1 / budget 0.01), no first token misses the TTFT one.
        for slo, want in (("inter_token_latency", 100.0), ("time_to_first_token", 0.0)):
            sel = f'model:tokentap_slo_burn_rate:5m{{slo="{slo}", model="{a.quantile_model}"}}'
            got = scalar(prom, sel)
            ok(got is not None and abs(got - want) < 1e-6,
               f"{sel} = {want:g} (every quantile-traffic event on one side of the objective)", got)
        check_objective_rules(prom, a.traffic_summary)


def exact_quantile(values, q):
    """Nearest rank: the smallest value with at least q of all values at or below it."""
    values = sorted(values)
    return values[max(0, math.ceil(q * len(values)) - 1)]


def scalar(prom, expr):
    data, err = prom_query(prom, expr)
    if err or not data["result"]:
        return None
    return float(data["result"][0]["value"][1])


def access_lines(path):
    """The tokentap::access lines (their fields) of a tokentap's JSON stderr."""
    out = []
    for line in pathlib.Path(path).read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("target") == "tokentap::access":
            out.append(event.get("fields", event))
    return out


def check_native(prom, a, inst, traffic):
    print(f"== [{PROM_KIND}] native histograms")
    model = a.quantile_model
    ttft = f'tokentap_time_to_first_token_seconds{{model="{model}"}}'
    itl = f'tokentap_inter_token_latency_seconds{{model="{model}"}}'
    for name, sel in (("TTFT", ttft), ("ITL", itl)):
        data, err = prom_query(prom, sel)
        got = [] if err else data["result"]
        ok(bool(got) and all("histogram" in r for r in got), f"{name} of {model} is stored as native histograms",
           err or got[:1])
        # 2.42 keeps only the native series of a histogram that has native buckets: the
        # dashboards and rules must not need the classic ones here.
        data, err = prom_query(prom, sel.replace("_seconds{", "_seconds_bucket{"))
        ok(not err and not data["result"], f"{name} of {model} has no classic _bucket series on this kind",
           err or f"{len(data['result'])} series")
    requests = traffic.get("quantile_completed", 0)
    # Prometheus has scraped the final state (e2e-prometheus.sh waited for it); allow a
    # few scrapes more in case the last stream was recorded just after.
    deadline = time.time() + 15
    while time.time() < deadline and scalar(prom, f"histogram_count(sum({ttft}))") != requests:
        time.sleep(0.5)
    ok(scalar(prom, f"histogram_count(sum({ttft}))") == requests,
       f"native TTFT histogram of {model} counts the {requests} streams", scalar(prom, f"histogram_count(sum({ttft}))"))

    # Exact TTFTs: tokentap's own, one per request in its access log. Exact ITLs: the
    # access log has only each request's mean, so the per-token values are the gaps
    # between the simulator's send stamps on consecutive token-bearing chunks
    # (e2e_traffic.py --quantile-log). tokentap observes each of those gaps as the
    # simulator sent it plus the difference of two loopback deliveries (microseconds
    # against gaps of 146-270 ms), once per token since the simulator sends one token
    # per event; the count and sum checks below confirm that per stream set.
    ttfts = [f["ttft_ms"] / 1e3 for f in access_lines(a.quantile_access_log)
             if f.get("model") == model and f.get("ttft_ms") is not None]
    gaps = [g for line in pathlib.Path(a.quantile_gaps).read_text().splitlines() for g in json.loads(line)["gaps"]]
    ok(len(ttfts) == requests, f"{len(ttfts)} TTFTs of {model} in the access log", requests)
    itl_count = scalar(prom, f"histogram_count(sum({itl}))")
    ok(itl_count == len(gaps), f"native ITL count = the {len(gaps)} stamped gaps", itl_count)
    itl_sum = scalar(prom, f"histogram_sum(sum({itl}))")
    ok(itl_sum is not None and gaps and abs(itl_sum - sum(gaps)) <= 0.01 * sum(gaps),
       "native ITL sum within 1% of the stamped gaps' sum", f"{itl_sum} vs {sum(gaps)}")
    classic_prom = (a.classic_prom or "").rstrip("/")
    for name, sel, exact_values in (("TTFT", ttft, ttfts), ("ITL", itl, gaps)):
        if not exact_values:
            ok(False, f"{name}: exact values", "none")
            continue
        bucket_sel = sel.replace("_seconds{", "_seconds_bucket{")
        for q in (0.5, 0.9, 0.99):
            exact = exact_quantile(exact_values, q)
            native = scalar(prom, f"histogram_quantile({q}, sum({sel}))")
            classic = scalar(classic_prom, f"histogram_quantile({q}, sum by (le) ({bucket_sel}))") if classic_prom else None
            err = abs(native - exact) / exact if native is not None else math.inf
            beside = (f"classic {classic * 1e3:.1f} ms ({abs(classic - exact) / exact:.1%})" if classic is not None
                      else "classic: no estimate")
            ok(err <= a.tolerance,
               f"{name} p{q * 100:g}: native {native * 1e3 if native is not None else math.nan:.1f} ms vs exact "
               f"{exact * 1e3:.1f} ms ({err:.1%}, within {a.tolerance:.0%}); {beside}",
               "outside the tolerance")

    # The alerts compare the recorded p99s with their thresholds, so on this kind they
    # page on what the recording rules compute from the native series: the recorded p99
    # of the quantile model must be as close to the exact one as the query above (the
    # quantile traffic all lies inside the rules' 5m window).
    for name, family, exact_values in (("TTFT", "tokentap_time_to_first_token_seconds", ttfts),
                                       ("ITL", "tokentap_inter_token_latency_seconds", gaps)):
        if not exact_values:
            continue
        exact = exact_quantile(exact_values, 0.99)
        rule = f'model:{family}:p99_5m{{model="{model}"}}'
        recorded = scalar(prom, rule)
        err = abs(recorded - exact) / exact if recorded is not None else math.inf
        ok(err <= a.tolerance,
           f"recorded {rule} (what the {name} p99 alert reads) "
           f"{recorded * 1e3 if recorded is not None else math.nan:.1f} ms vs exact {exact * 1e3:.1f} ms "
           f"({err:.1%}, within {a.tolerance:.0%})", "outside the tolerance")

    check_exemplars(prom, a, inst)


def check_exemplars(prom, a, inst):
    print(f"== [{PROM_KIND}] exemplars")
    if not (a.traceparent and a.traced_instance and a.traced_access_log):
        return report("SKIP", "exemplars: no traced request in this run")
    trace_id = a.traceparent.split("-")[1]
    admin = inst[a.traced_instance]
    req = urllib.request.Request(f"{admin}/metrics", headers={"Accept": "application/openmetrics-text"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            openmetrics = r.read().decode()
    except OSError as e:
        return ok(False, "exemplars: GET /metrics as OpenMetrics", e)
    if trace_id not in openmetrics:
        return report("SKIP", f"exemplars: tokentap serves none (the OpenMetrics text of {a.traced_instance} "
                              f"does not carry trace id {trace_id}): issue 14 item 2 not in this build")
    traced = [f for f in access_lines(a.traced_access_log) if f.get("tenant") == "traced"]
    if not ok(len(traced) == 1, "exemplars: the traced request has one access-log line", len(traced)):
        return
    line = traced[0]
    now = time.time()
    for family, field in (("tokentap_time_to_first_token_seconds", "ttft_ms"),
                          ("tokentap_inter_token_latency_seconds", "slowest_gap_ms")):
        want = line.get(field)
        query = f'{{__name__=~"{family}(_bucket)?", instance="{urllib.parse.urlparse(admin).netloc}"}}'
        # Prometheus has scraped the final state by now; a few seconds more in case the
        # exemplar came with a later scrape than the series it belongs to.
        deadline = time.time() + 10
        while True:
            data, err = prom_query(prom, query, path="/api/v1/query_exemplars", start=now - 3600, end=time.time() + 60)
            found = [] if err else [e for series in data for e in series.get("exemplars", [])
                                    if trace_id in (e.get("labels") or {}).values()]
            if found or err or time.time() > deadline:
                break
            time.sleep(0.5)
        if err:
            ok(False, f"exemplars of {family} can be queried", err)
            continue
        if not ok(bool(found), f"exemplars: {family} has one with the traced request's trace id {trace_id}",
                  f"{sum(len(x.get('exemplars', [])) for x in data)} exemplars, none with it"):
            continue
        value = float(found[-1]["value"])
        ok(want is not None and abs(value - want / 1e3) <= 1e-6 * max(1.0, value),
           f"exemplars: its value {value:.6f} s = the request's {field} from the access log", f"{want} ms")


if __name__ == "__main__":
    sys.exit(main())
