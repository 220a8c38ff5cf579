#!/usr/bin/env python3
"""Structural checks of the Grafana dashboard and provisioning, plus metric names.

    check-grafana.py [--promql-rules OUT.yaml]

Checks grafana/dashboards/tokentap.json:
  * schemaVersion >= 39, a uid, no __inputs (portable: a `datasource` variable of
    type prometheus instead), variables datasource / job / model / tenant as agreed;
  * the rows in ROWS, unique panel ids, gridPos inside 24 columns with no overlaps;
  * every panel: a description, the `${datasource}` data source, a unit from the
    agreed set, queries with unique refIds; heatmaps read `_bucket` series by le
    and the native series, in heatmap format;
  * every selector of a metric that has model and tenant labels filters on
    $model and $tenant; of a per-model metric (no `tenant` with the default
    labels.tenant.families) on $model and never on $tenant (a tenant filter would
    empty it); instance-level metrics filter on $job;
  * both kinds of Prometheus: a query that reads a histogram's classic series
    (`_bucket`, `_sum`, `_count`) also reads its native series, so it returns data
    on a classic Prometheus and on one that stores native histograms only;
and grafana/provisioning (data source of type prometheus whose uid is the
dashboard's default; a file provider into folder "tokentap").

Across dashboard and deploy/prometheus/rules.yaml: every tokentap_* metric named is
in the contract (scripts/ops/tokentap_contract.py), every recording rule the
dashboard reads is defined in rules.yaml, and every rule reads both kinds of
histogram as above.

--promql-rules writes every dashboard query (variables resolved) as a recording
rule into a rules file, so `promtool check rules` can parse-check the PromQL.
"""
import argparse
import json
import pathlib
import re
import sys

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashboard_queries as dq  # noqa: E402
import tokentap_contract as contract  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASH = ROOT / "grafana/dashboards/tokentap.json"
DS_PROV = ROOT / "grafana/provisioning/datasources/prometheus.yaml"
DB_PROV = ROOT / "grafana/provisioning/dashboards/tokentap.yaml"
RULES = ROOT / "deploy/prometheus/rules.yaml"

UNITS = {"s", "reqps", "short", "percentunit", "bytes"}
ROWS = ["Overview", "Latency", "SLOs", "Objectives", "Per model and tenant", "Upstream rate limits", "tokentap health"]
DS_REF = {"type": "prometheus", "uid": "${datasource}"}

passes = failures = 0


def ok(cond, what, detail=""):
    global passes, failures
    if cond:
        passes += 1
        print(f"PASS {what}")
    else:
        failures += 1
        print(f"FAIL {what}{': ' + str(detail) if detail else ''}")
    return cond


def selectors(expr):
    """(metric, matcher-text) for every `name{...}` or bare `name` in PromQL."""
    out = []
    for m in re.finditer(r"(?<![:\w])([a-zA-Z_][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?", expr):
        name, body = m.group(1), m.group(2) or ""
        if name.startswith(("tokentap_", "process_")) or name == "up":
            out.append((name, body))
    return out


def classic_without_native(expr):
    """Histograms whose classic series `expr` reads without reading the native one."""
    names = {name for name, _ in selectors(expr)}
    classic = {contract.base_name(n) for n in names if contract.base_name(n) != n}
    return sorted(classic - names)


def check_dashboard(d):
    ok(isinstance(d.get("schemaVersion"), int) and d["schemaVersion"] >= 39, "dashboard schemaVersion >= 39", d.get("schemaVersion"))
    ok(bool(d.get("uid")) and bool(d.get("title")), "dashboard has uid and title")
    ok("__inputs" not in d and "__requires" not in d, "no __inputs/__requires (portable via the datasource variable)")
    ok(d.get("id") is None, "no numeric dashboard id (provisioning assigns it)")

    tv = {v.get("name"): v for v in (d.get("templating") or {}).get("list", [])}
    ds = tv.get("datasource", {})
    ok(ds.get("type") == "datasource" and ds.get("query") == "prometheus", "variable `datasource` of type datasource/prometheus")
    for name, q in (("model", "label_values(tokentap_requests_total, model)"),
                    ("tenant", None), ("job", None)):
        v = tv.get(name)
        if not ok(v is not None, f"variable `{name}` exists"):
            continue
        query = v.get("query", {})
        query = query.get("query") if isinstance(query, dict) else query
        if q:
            ok(query == q, f"variable `{name}` query is {q}", query)
        ok(v.get("multi") is True and v.get("includeAll") is True and v.get("allValue") == ".*",
           f"variable `{name}` is multi-value with All = .*")
        ok(v.get("datasource") == DS_REF, f"variable `{name}` uses ${{datasource}}")
    tq = tv.get("tenant", {}).get("query", {})
    tq = tq.get("query") if isinstance(tq, dict) else tq
    ok(bool(re.fullmatch(r'label_values\(tokentap_requests_total\{model=~"\$model"\}, tenant\)', tq or "")),
       "variable `tenant` lists the tenants of the selected models", tq)

    panels = d.get("panels", [])
    rows = [p.get("title") for p in panels if p.get("type") == "row"]
    ok(rows == ROWS, "rows " + " / ".join(ROWS), rows)
    ids = [p.get("id") for p in panels]
    ok(len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids), "panel ids are unique integers")

    cells = {}
    overlap = []
    for p in panels:
        g = p.get("gridPos") or {}
        x, y, w, h = g.get("x", -1), g.get("y", -1), g.get("w", 0), g.get("h", 0)
        if not (0 <= x and w > 0 and x + w <= 24 and y >= 0 and h > 0):
            ok(False, f"panel {p.get('id')} gridPos inside 24 columns", g)
            continue
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                if (cx, cy) in cells:
                    overlap.append((p.get("id"), cells[(cx, cy)]))
                cells[(cx, cy)] = p.get("id")
    ok(not overlap, "no overlapping panels", sorted(set(overlap))[:5])

    for p in panels:
        if p.get("type") == "row":
            ok(p.get("collapsed") is False and p.get("panels") == [], f"row \"{p.get('title')}\" is expanded (its panels follow it)")
            continue
        what = f"panel {p.get('id')} \"{p.get('title')}\""
        problems = []
        if not (p.get("description") or "").strip():
            problems.append("no description")
        if p.get("datasource") != DS_REF:
            problems.append(f"datasource {p.get('datasource')}")
        unit = ((p.get("fieldConfig") or {}).get("defaults") or {}).get("unit")
        if unit not in UNITS:
            problems.append(f"unit {unit!r} not in {sorted(UNITS)}")
        targets = p.get("targets") or []
        if not targets:
            problems.append("no queries")
        refs = [t.get("refId") for t in targets]
        if len(refs) != len(set(refs)):
            problems.append(f"duplicate refIds {refs}")
        for t in targets:
            if t.get("datasource") != DS_REF:
                problems.append(f"query {t.get('refId')} datasource {t.get('datasource')}")
            expr = t.get("expr") or ""
            if not expr.strip():
                problems.append(f"query {t.get('refId')} has no expr")
            if p.get("type") == "heatmap" and t.get("format") != "heatmap":
                problems.append(f"heatmap query {t.get('refId')} must be in heatmap format")
            if p.get("type") != "heatmap" and classic_without_native(expr):
                problems.append(f"query {t.get('refId')} reads only the classic series of {classic_without_native(expr)}")
            for name, body in selectors(expr):
                base = contract.base_name(name)
                labels = contract.METRICS.get(base, ("", ()))[1]
                if "model" in labels and "tenant" in labels:
                    if 'model=~"$model"' not in body or 'tenant=~"$tenant"' not in body:
                        problems.append(f"{name} not filtered by $model and $tenant")
                elif "model" in labels:
                    if 'model=~"$model"' not in body or "tenant" in body:
                        problems.append(f"{name} (per model) must be filtered by $model and not by tenant")
                elif base in contract.METRICS or name in contract.PROCESS_METRICS or name == "up":
                    if 'job=~"$job"' not in body:
                        problems.append(f"{name} not filtered by $job")
        if p.get("type") == "heatmap":
            exprs = [t.get("expr") or "" for t in targets]
            classic = [e for e in exprs if "_bucket" in e and "by (le)" in e]
            native = [e for e in exprs if "_bucket" not in e and "le" not in re.findall(r"by \(([^)]*)\)", e)]
            if not classic or not native:
                problems.append("heatmap needs a `_bucket` query by le and a native-series query")
        ok(not problems, f"{what}: description, data source, unit, queries, filters, both histogram kinds", "; ".join(problems))


def check_provisioning(d):
    ds = yaml.safe_load(DS_PROV.read_text())
    sources = ds.get("datasources") or []
    ok(ds.get("apiVersion") == 1 and len(sources) == 1 and sources[0].get("type") == "prometheus"
       and sources[0].get("url") and sources[0].get("access") == "proxy", "datasource provisioning: one prometheus source with url, access proxy")
    default = next((v for v in d["templating"]["list"] if v.get("name") == "datasource"), {}).get("current", {}).get("value")
    ok(sources and sources[0].get("uid") == default, "provisioned data source uid = dashboard's default data source", f"{sources and sources[0].get('uid')} vs {default}")
    db = yaml.safe_load(DB_PROV.read_text())
    prov = db.get("providers") or []
    ok(db.get("apiVersion") == 1 and len(prov) == 1 and prov[0].get("type") == "file"
       and prov[0].get("folder") == "tokentap" and (prov[0].get("options") or {}).get("path"),
       "dashboard provisioning: one file provider into folder \"tokentap\" with a path")


def check_names(d):
    rules = yaml.safe_load(RULES.read_text())
    recorded = set()
    rule_text = []
    for g in rules["groups"]:
        for r in g["rules"]:
            if "record" in r:
                recorded.add(r["record"])
            rule_text.append(str(r["expr"]))
    dash_exprs = [e for _, _, _, e, _ in dq.panel_queries(d)]
    dash_exprs += [q for _, q, _, _ in dq.variable_queries(d)]
    for where, texts in (("dashboard", dash_exprs), ("rules.yaml", rule_text)):
        names = set().union(*(contract.referenced(t) for t in texts))
        unknown = sorted(names - set(contract.METRICS))
        ok(not unknown, f"{where}: every tokentap_* metric is in the contract ({len(names)} referenced)", unknown)
    classic_only = [(r.get("record") or r.get("alert"), classic_without_native(str(r["expr"])))
                    for g in rules["groups"] for r in g["rules"] if classic_without_native(str(r["expr"]))]
    ok(not classic_only, "rules.yaml: every rule that reads classic histogram series reads the native ones too", classic_only)
    per_model = [(r.get("record") or r.get("alert"), name)
                 for g in rules["groups"] for r in g["rules"]
                 for name in contract.referenced(str(r["expr"]))
                 if "tenant" in str(r["expr"]) and "tenant" not in contract.METRICS.get(name, ("", ("tenant",)))[1]
                 and "model" in contract.METRICS.get(name, ("", ()))[1]]
    ok(not per_model, "rules.yaml: no rule groups a per-model family by tenant", per_model)
    used_rules = set()
    for e in dash_exprs:
        used_rules |= set(re.findall(r"\b[a-z_]+:[a-z0-9_:]+\b", e))
    missing = sorted(used_rules - recorded)
    ok(not missing, f"dashboard: recording rules it reads are defined in rules.yaml ({sorted(used_rules)})", missing)
    # Every contract metric is shown somewhere (dashboard or rules).
    shown = set().union(*(contract.referenced(t) for t in dash_exprs + rule_text))
    unused = sorted(set(contract.METRICS) - contract.NOT_CHARTED - shown)
    ok(not unused, "every contract metric is used by the dashboard or the rules", unused)
    proc = set(re.findall(r"\bprocess_[a-z_]+\b", " ".join(dash_exprs)))
    ok(proc == contract.PROCESS_METRICS, "dashboard shows process RSS, CPU and open fds", sorted(proc))


def write_promql_rules(d, out):
    rules = []
    for pid, _title, ref, _raw, expr in dq.panel_queries(d):
        rules.append({"record": f"dashboard:panel_{pid}_{ref}", "expr": expr})
    for name, _q, sel, _label in dq.variable_queries(d):
        rules.append({"record": f"dashboard:variable_{name}", "expr": sel})
    pathlib.Path(out).write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, sort_keys=False))
    print(f"wrote {len(rules)} dashboard queries to {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--promql-rules", help="write the resolved dashboard queries as a rules file")
    ap.add_argument("--dashboard", default=str(DASH))
    a = ap.parse_args()
    try:
        d = json.loads(pathlib.Path(a.dashboard).read_text())
    except (OSError, json.JSONDecodeError) as e:
        ok(False, f"{a.dashboard} is valid JSON", e)
        return 1
    check_dashboard(d)
    check_provisioning(d)
    check_names(d)
    if a.promql_rules:
        write_promql_rules(d, a.promql_rules)
    print(f"grafana: {passes} checks passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
