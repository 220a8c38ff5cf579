#!/usr/bin/env python3
"""Generate the SLO rule groups and the PrometheusRule object.

deploy/prometheus/rules.yaml is the single source of the rules (plain Prometheus
loads it directly, promtool tests it). Two parts of what ships are generated from
it and from deploy/prometheus/slo.yaml, so that they never drift:

  * the SLO groups at the end of rules.yaml, between the BEGIN/END GENERATED SLO
    GROUPS markers: for each objective in slo.yaml, burn-rate and error-budget
    recording rules and the multi-window, multi-burn-rate alerts of the Google SRE
    workbook ("Alerting on SLOs", table 5-8 and its final alerting configuration);
  * the PrometheusRule that wraps all groups of rules.yaml for the Prometheus Operator.

    scripts/ops/gen-prometheusrule.py            # rewrite both
    scripts/ops/gen-prometheusrule.py --check    # exit 1 if either is out of date
    scripts/ops/gen-prometheusrule.py --check --slo OTHER.yaml   # objectives from elsewhere

Each objective's threshold must be a bound of its histogram's classic bucket layout,
read from crates/metrics/src/buckets.rs: the classic arm of the rules counts the events
under the threshold with the `le` bucket at that bound, which is exact only there.

Needs PyYAML.
"""
import argparse
import decimal
import difflib
import pathlib
import re
import sys
import textwrap

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "deploy/prometheus/rules.yaml"
SLO = ROOT / "deploy/prometheus/slo.yaml"
BUCKETS = ROOT / "crates/metrics/src/buckets.rs"
DST = ROOT / "deploy/kubernetes/components/prometheus-rules/prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/rules.yaml by scripts/ops/gen-prometheusrule.py.
# Do not edit: change rules.yaml and re-run the script (ops-check fails on drift).
"""
BEGIN = "  # BEGIN GENERATED SLO GROUPS"
END = "  # END GENERATED SLO GROUPS"

# The histograms an objective may be set on: the classic bucket layout that holds its
# threshold (a constant of crates/metrics/src/buckets.rs), what one observation is, and what
# to look at when its objective burns.
HISTOGRAMS = {
    "tokentap_inter_token_latency_seconds": {
        "buckets": "ITL_BUCKETS",
        "events": "inter-token gaps",
        "title": "inter-token latency",
        "causes": (
            "The engine decodes slowly for this model: check its batch size and KV-cache "
            "usage (preemptions and swapping raise every stream's gaps), GPU utilisation and "
            "throttling, and whether one tenant's long contexts dominate (dashboard: per-tenant "
            "ITL). Scale out or lower the engine's max concurrent sequences; roll back a recent "
            "engine or model change."
        ),
    },
    "tokentap_time_to_first_token_seconds": {
        "buckets": "LATENCY_BUCKETS",
        "events": "first tokens",
        "title": "time to first token",
        "causes": (
            "Requests wait before their first token: check the engine's waiting queue and request "
            "rate (dashboard: requests/s by model), prompt sizes (tokentap_input_tokens_total) and "
            "prefix-cache hits; a high TTFB too means the engine answers late. Scale out, or cap "
            "prompt length or concurrency."
        ),
    },
}

# The workbook's window pairs, each with the share of the period's error budget it
# lets burn before it fires: the burn-rate factor is share * period / long window
# (30d: 0.02 * 720h / 1h = 14.4). Pages: 2% in 1h (checked over the last 5m too), 5% in
# 6h (30m); tickets: 10% in 1d (2h), 10% in 3d (6h).
PAGE = (("1h", "5m", "0.02"), ("6h", "30m", "0.05"))
TICKET = (("1d", "2h", "0.1"), ("3d", "6h", "0.1"))
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(duration):
    m = re.fullmatch(r"(\d+)([smhdw])", str(duration))
    if not m:
        sys.exit(f"{duration!r} is not a duration like 30d, 4w or 720h")
    return int(m.group(1)) * UNIT_SECONDS[m.group(2)]


def number(value):
    """A decimal's shortest text: 14.40 -> 14.4, 2.0 -> 2."""
    return format(value.normalize(), "f")


def rust_buckets():
    """{CONST_NAME: [bounds]} of the `pub const X: &[f64] = &[...]` tables in buckets.rs."""
    text = BUCKETS.read_text()
    tables = {}
    for name, body in re.findall(r"pub const (\w+): &\[f64\] = &\[(.*?)\];", text, re.S):
        tables[name] = [decimal.Decimal(v.strip()) for v in body.split(",") if v.strip()]
    return tables


def le_matcher(bound):
    """The `le` matcher for a bucket bound. Prometheus keeps `le` as scraped: the text
    format writes 2 where OpenMetrics (what a Prometheus asks for first) writes 2.0."""
    text = number(bound)
    if "." in text:
        return f'le="{text}"'
    return f'le=~"{text}|{text}\\\\.0"'


def camel(name):
    return "".join(part.capitalize() for part in name.split("_"))


def load_slos(path):
    spec = yaml.safe_load(path.read_text())
    tables = rust_buckets()
    slos, names = [], set()
    for entry in spec.get("slos") or []:
        where = f"{path}: slo {entry.get('slo')!r}"
        name = str(entry.get("slo", ""))
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name in names:
            sys.exit(f"{where}: `slo` must be a unique lower_snake_case name")
        names.add(name)
        hist = HISTOGRAMS.get(entry.get("histogram"))
        if hist is None:
            sys.exit(f"{where}: histogram must be one of {sorted(HISTOGRAMS)}")
        threshold = decimal.Decimal(str(entry.get("threshold_seconds")))
        bounds = tables.get(hist["buckets"])
        if bounds is None:
            sys.exit(f"{where}: no table {hist['buckets']} in {BUCKETS.relative_to(ROOT)}")
        if threshold not in bounds:
            sys.exit(f"{where}: threshold {threshold} s is not a bound of {hist['buckets']} "
                     f"({BUCKETS.relative_to(ROOT)}: {', '.join(map(number, bounds))})")
        objective = decimal.Decimal(str(entry.get("objective")))
        if not 0 < objective < 1:
            sys.exit(f"{where}: objective must lie between 0 and 1")
        period = str(entry.get("period"))
        if seconds(period) < seconds(TICKET[-1][0]):
            sys.exit(f"{where}: period {period} is shorter than the longest alert window {TICKET[-1][0]}")
        slos.append(dict(slo=name, histogram=entry["histogram"], hist=hist, threshold=threshold,
                         objective=objective, budget=1 - objective, period=period))
    if not slos:
        sys.exit(f"{path}: no objectives under `slos`")
    return slos


def miss_ratio(s, window):
    """PromQL: the share of the window's events above the threshold, per model, from the
    native histogram where Prometheus stores one, else from the classic buckets."""
    h, t = s["histogram"], number(s["threshold"])
    return (
        f"1 - histogram_fraction(0, {t}, sum by (model) (rate({h}[{window}])))\n"
        f"or\n"
        f"1 - sum by (model) (rate({h}_bucket{{{le_matcher(s['threshold'])}}}[{window}]))\n"
        f"  / sum by (model) (rate({h}_count[{window}]))"
    )


def folded(text, spaces=12, width=92):
    """A folded block scalar's lines (Prometheus reads them back as one line of text),
    never broken inside a template action."""
    whole = re.sub(r"\{\{.*?\}\}", lambda m: m.group(0).replace(" ", "\0"), text)
    return textwrap.fill(whole, width=width, initial_indent=" " * spaces, subsequent_indent=" " * spaces,
                         break_long_words=False, break_on_hyphens=False).replace("\0", " ")


def comment(text, spaces=2, width=92):
    return textwrap.fill(text, width=width, initial_indent=" " * spaces + "# ",
                         subsequent_indent=" " * spaces + "# ", break_long_words=False, break_on_hyphens=False)


def indent(text, spaces):
    return "\n".join((" " * spaces + line) if line else line for line in text.splitlines())


def factor(s, long, share):
    return decimal.Decimal(share) * seconds(s["period"]) / seconds(long)


def burn_condition(s, pairs):
    arms = []
    for long, short, share in pairs:
        f = number(factor(s, long, share))
        arms.append(
            f"(\n"
            f'  model:tokentap_slo_burn_rate:{long}{{slo="{s["slo"]}"}} > {f}\n'
            f"  and\n"
            f'  model:tokentap_slo_burn_rate:{short}{{slo="{s["slo"]}"}} > {f}\n'
            f")"
        )
    return "\nor\n".join(arms)


def render_slo(s):
    name, h = s["slo"], s["hist"]
    t, obj, budget, period = number(s["threshold"]), s["objective"], number(s["budget"]), s["period"]
    pct = number(obj * 100)
    goal = f"{pct}% of {h['events']} of each model under {t} s over {period}"
    remaining = (f'{{{{ with printf "model:tokentap_slo_error_budget_remaining:ratio{{slo=%q,model=%q}}" '
                 f'"{name}" $labels.model | query }}}}{{{{ . | first | value | humanizePercentage }}}} of the '
                 f'{period} error budget is left.{{{{ end }}}}')
    page = [(long, short, number(factor(s, long, share)), number(decimal.Decimal(share) * 100))
            for long, short, share in PAGE]
    ticket = [(long, short, number(factor(s, long, share)), number(decimal.Decimal(share) * 100))
              for long, short, share in TICKET]
    lines = [
        comment(f"{goal}: {t} s is a bound of {h['buckets']} (crates/metrics/src/buckets.rs), so the "
                f"classic `le` bucket counts exactly the {h['events']} under it."),
        f"  - name: tokentap.slo.{name}",
        "    rules:",
        comment(f"Burn rate over each window: the share of {h['events']} above {t} s divided by the "
                f"error budget {budget} (1 = spending exactly the budget in {period}).", 6),
    ]
    for w in WINDOWS:
        lines += [
            f"      - record: model:tokentap_slo_burn_rate:{w}",
            "        labels:",
            f"          slo: {name}",
            "        expr: |",
            indent(f"(\n{indent(miss_ratio(s, w), 2)}\n)\n/ {budget}", 10),
        ]
    lines += [
        comment(f"Share of the {period} error budget left: 1 = untouched, 0 = spent, < 0 = overspent.", 6),
        "      - record: model:tokentap_slo_error_budget_remaining:ratio",
        "        labels:",
        f"          slo: {name}",
        "        expr: |",
        indent(f"1 - (\n{indent(miss_ratio(s, period), 2)}\n)\n/ {budget}", 10),
    ]
    page_windows = " or ".join(f"{f}x over {lo} and {sh} ({p}% of the budget in {lo})" for lo, sh, f, p in page)
    ticket_windows = " or ".join(f"{f}x over {lo} and {sh} ({p}% of the budget in {lo})" for lo, sh, f, p in ticket)
    missed = (f"Objective: {goal}. Model {{{{ $labels.model }}}} missed it {{{{ $value | printf \"%.1f\" }}}} "
              f"times as often as the objective allows,")
    dashboard = ("The dashboard's SLO row shows the burn rate and the budget left per model. Objective: "
                 "deploy/prometheus/slo.yaml, rules regenerated by scripts/ops/gen-prometheusrule.py.")
    lines += [
        comment("Page: the budget burns fast enough to be gone in days. The long window makes the burn "
                "significant, the short one resets the alert soon after the burn stops; together they "
                "replace a `for:`. Only for models with the traffic the other alerts ask for (a few slow "
                "events of a quiet model are noise).", 6),
        f"      - alert: Tokentap{camel(name)}BudgetBurnPage",
        "        expr: |",
        indent(f"(\n{indent(burn_condition(s, PAGE), 2)}\n)\n"
               "and on (model)\n"
               "model:tokentap_requests:rate5m\n"
               "  >= on () group_left () tokentap:threshold:min_request_rate", 10),
        "        labels:",
        "          severity: critical",
        "        annotations:",
        f'          summary: "{{{{ $labels.model }}}} burns its {h["title"]} error budget {{{{ $value | printf \\"%.1f\\" }}}}x as fast as the objective allows"',
        "          description: >-",
        folded(f"{missed} paging at {page_windows}. {remaining}"),
        "          runbook: >-",
        folded(f"{h['causes']} {dashboard}"),
        comment("Ticket: a slower burn that would still spend the budget before the period ends. "
                "Without the traffic guard: the short windows of 2h and 6h already hold hundreds of "
                "requests at the minimum rate, and a ticket wakes nobody.", 6),
        f"      - alert: Tokentap{camel(name)}BudgetBurnTicket",
        "        expr: |",
        indent(burn_condition(s, TICKET), 10),
        "        labels:",
        "          severity: warning",
        "        annotations:",
        f'          summary: "{{{{ $labels.model }}}} spends its {h["title"]} error budget {{{{ $value | printf \\"%.1f\\" }}}}x as fast as the objective allows"',
        "          description: >-",
        folded(f"{missed} ticket at {ticket_windows}. {remaining}"),
        "          runbook: >-",
        folded(f"Not urgent, but the budget will not last the period at this pace. {h['causes']} {dashboard}"),
    ]
    return "\n".join(lines)


def render_slo_groups(slos):
    blocks = [
        f"{BEGIN}: written by scripts/ops/gen-prometheusrule.py from",
        "  # deploy/prometheus/slo.yaml. Edit that file and re-run the script; ops-check fails",
        "  # on drift.",
    ]
    blocks += [render_slo(s) for s in slos]
    blocks.append(END)
    return "\n".join(blocks) + "\n"


def splice(rules_text, generated):
    start = rules_text.find(BEGIN)
    end = rules_text.find(END)
    if start < 0 or end < start:
        sys.exit(f"{SRC}: no `{BEGIN.strip()}` ... `{END.strip()}` block to write the SLO groups into")
    end = rules_text.index("\n", end) + 1
    return rules_text[:start] + generated + rules_text[end:]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    # Multi-line expressions stay readable as literal blocks.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_prometheusrule(rules_text) -> str:
    rules = yaml.safe_load(rules_text)
    if not isinstance(rules, dict) or not isinstance(rules.get("groups"), list):
        sys.exit(f"{SRC}: expected a mapping with a `groups` list")
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "tokentap",
            "labels": {"app.kubernetes.io/name": "tokentap"},
        },
        "spec": {"groups": rules["groups"]},
    }
    body = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return HEADER + body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ap.add_argument("--slo", type=pathlib.Path, default=SLO, help="the objectives (default: %(default)s)")
    args = ap.parse_args()
    have_rules = SRC.read_text()
    want_rules = splice(have_rules, render_slo_groups(load_slos(args.slo)))
    want_prom = render_prometheusrule(want_rules)
    outputs = ((SRC, have_rules, want_rules, f"its SLO groups do not match {args.slo}"),
               (DST, DST.read_text() if DST.exists() else "", want_prom,
                f"it does not match {SRC.relative_to(ROOT)}"))
    if args.check:
        stale = 0
        for path, have, want, why in outputs:
            if have != want:
                sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                           str(path), "generated"))
                print(f"{path.relative_to(ROOT)} is out of date ({why}): run scripts/ops/gen-prometheusrule.py")
                stale += 1
            else:
                print(f"{path.relative_to(ROOT)} is up to date")
        return 1 if stale else 0
    for path, have, want, _ in outputs:
        if have != want:
            path.write_text(want)
            print(f"wrote {path.relative_to(ROOT)}")
        else:
            print(f"{path.relative_to(ROOT)} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
