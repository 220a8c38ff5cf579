"""Extract the PromQL of a Grafana dashboard with its template variables resolved.

Used by check-grafana.py (syntax via promtool) and e2e-prometheus.sh (run against a
real Prometheus). Variables resolve to their default: a multi-value variable whose
default is "All" becomes its allValue (".*"), otherwise the selected value(s)
joined as a regex alternation. Grafana's built-ins get fixed values:
$__rate_interval (argument), $__interval 15s, $__range 1h.

    python3 dashboard_queries.py DASHBOARD.json [--rate-interval 1m] [--json]
"""
import argparse
import json
import re
import sys


def variable_values(dashboard):
    values = {}
    for v in (dashboard.get("templating") or {}).get("list", []):
        name = v.get("name")
        if v.get("type") == "datasource":
            continue
        cur = (v.get("current") or {}).get("value")
        if cur is None:
            cur = []
        if isinstance(cur, str):
            cur = [cur]
        if not cur or "$__all" in cur:
            values[name] = v.get("allValue") or ".*"
        elif len(cur) == 1:
            values[name] = re.escape(cur[0]) if v.get("multi") or v.get("includeAll") else cur[0]
        else:
            values[name] = "(" + "|".join(re.escape(c) for c in cur) + ")"
    return values


def substitute(expr, values, rate_interval="1m"):
    builtins = {"__rate_interval": rate_interval, "__interval": "15s", "__range": "1h"}
    def rep(m):
        name = m.group(1) or m.group(2)
        if name in builtins:
            return builtins[name]
        if name in values:
            return values[name]
        raise KeyError(f"unknown dashboard variable ${name} in: {expr}")
    return re.sub(r"\$\{([A-Za-z0-9_]+)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)", rep, expr)


def panel_queries(dashboard, rate_interval="1m"):
    """[(panel_id, panel_title, refId, raw_expr, resolved_expr)] for every panel target."""
    values = variable_values(dashboard)
    out = []
    def walk(panels):
        for p in panels or []:
            if p.get("type") == "row":
                walk(p.get("panels"))
                continue
            for t in p.get("targets", []):
                if t.get("hide"):
                    continue
                out.append((p.get("id"), p.get("title"), t.get("refId"), t["expr"],
                            substitute(t["expr"], values, rate_interval)))
    walk(dashboard.get("panels"))
    return out


def variable_queries(dashboard, rate_interval="1m"):
    """[(name, raw_query, series_selector_resolved)] for label_values() variables."""
    values = variable_values(dashboard)
    out = []
    for v in (dashboard.get("templating") or {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q or "")
        if not m:
            raise ValueError(f"variable {v.get('name')}: unsupported query {q!r}")
        out.append((v["name"], q, substitute(m.group(1), values, rate_interval), m.group(2)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dashboard")
    ap.add_argument("--rate-interval", default="1m")
    ap.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    a = ap.parse_args()
    with open(a.dashboard) as f:
        d = json.load(f)
    qs = panel_queries(d, a.rate_interval)
    if a.json:
        json.dump([{"panel": i, "title": t, "refId": r, "expr": e} for i, t, r, _, e in qs], sys.stdout, indent=1)
    else:
        for i, t, r, _, e in qs:
            print(f"{i}\t{t}\t{r}\t{e}")


if __name__ == "__main__":
    main()
