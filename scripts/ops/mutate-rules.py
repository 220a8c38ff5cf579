#!/usr/bin/env python3
"""Prove the promtool unit tests can fail: break rules.yaml on purpose, expect red.

Each mutation is a plausible mistake (a wrong threshold, a dropped guard, a wrong
label filter, a shorter `for:`). It is applied to a temporary copy of
deploy/prometheus/rules.yaml next to a copy of the tests, and
`promtool test rules` must FAIL on it. A mutation whose text is not found is an
error too (the list must follow rules.yaml). The test files run one at a time and a
mutation stops at the first that fails, two mutations at once (a machine of two
cores): the whole list takes well under a minute.

    scripts/ops/mutate-rules.py        # prints PASS/FAIL per mutation, exit 1 on any FAIL
"""
import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy/prometheus"

# (what, old, new): `old` must occur exactly once in rules.yaml.
MUTATIONS = [
    ("ITL threshold 0.1 -> 0.2", "expr: vector(0.1)", "expr: vector(0.2)"),
    ("TTFT threshold 5 -> 10", "expr: vector(5)", "expr: vector(10)"),
    ("error threshold 0.05 -> 0.5", "tokentap:threshold:error_ratio\n        expr: vector(0.05)",
     "tokentap:threshold:error_ratio\n        expr: vector(0.5)"),
    ("cancel threshold 0.2 -> 0.5", "expr: vector(0.2)", "expr: vector(0.5)"),
    ("traffic guard 0.05 -> 0.01 req/s", "tokentap:threshold:min_request_rate\n        expr: vector(0.05)",
     "tokentap:threshold:min_request_rate\n        expr: vector(0.01)"),
    # The quantile rules' classic arms: promtool 2.42's test input cannot write native
    # histograms, so the native arms are checked against a real Prometheus instead
    # (scripts/ops/e2e-prometheus.sh, its native run).
    ("p99 ITL computed as p95",
     "histogram_quantile(0.99, sum by (le, model) (rate(tokentap_inter_token_latency_seconds_bucket[5m])))",
     "histogram_quantile(0.95, sum by (le, model) (rate(tokentap_inter_token_latency_seconds_bucket[5m])))"),
    ("ITL quantile aggregated without tenant split",
     "histogram_quantile(0.99, sum by (le, model, tenant) (rate(tokentap_inter_token_latency_seconds_bucket[5m])))",
     "histogram_quantile(0.99, sum by (le, model) (rate(tokentap_inter_token_latency_seconds_bucket[5m])))"),
    ("timeouts not counted as errors", 'outcome=~"upstream_error|timeout|overloaded"',
     'outcome=~"upstream_error|overloaded"'),
    ("overloads not counted as errors", 'outcome=~"upstream_error|timeout|overloaded"',
     'outcome=~"upstream_error|timeout"'),
    ("client errors counted as errors", 'outcome=~"upstream_error|timeout|overloaded"',
     'outcome=~"upstream_error|timeout|overloaded|client_error"'),
    ("the engine's 4xx counted as errors", 'outcome=~"upstream_error|timeout|overloaded"',
     'outcome=~"upstream_error|timeout|overloaded|upstream_refused"'),
    ("error ratio as everything but completed", 'outcome=~"upstream_error|timeout|overloaded"',
     'outcome!="completed"'),
    ("error ratio without the explicit-zero arm",
     'sum by (model) (rate(tokentap_requests_total{outcome=~"upstream_error|timeout|overloaded"}[5m]))\n            or\n            0 * sum by (model) (rate(tokentap_requests_total[5m]))',
     'sum by (model) (rate(tokentap_requests_total{outcome=~"upstream_error|timeout|overloaded"}[5m]))'),
    ("rate-limit threshold 0.05 -> 0.2", "tokentap:threshold:rate_limited_ratio\n        expr: vector(0.05)",
     "tokentap:threshold:rate_limited_ratio\n        expr: vector(0.2)"),
    ("rate-limit ratio counts only 429 heads, not 429s streamed in a 200",
     'rate(tokentap_requests_total{status="429"}[5m])',
     'rate(tokentap_requests_total{status="429", outcome="upstream_refused"}[5m])'),
    ("rate-limit ratio counts every 4xx", 'rate(tokentap_requests_total{status="429"}[5m])',
     'rate(tokentap_requests_total{status=~"429|4xx"}[5m])'),
    ("rate-limit ratio without the explicit-zero arm",
     'sum by (model) (rate(tokentap_requests_total{status="429"}[5m]))\n            or\n            0 * sum by (model) (rate(tokentap_requests_total[5m]))',
     'sum by (model) (rate(tokentap_requests_total{status="429"}[5m]))'),
    ("rate-limit alert without the traffic guard",
     "tokentap:threshold:rate_limited_ratio\n          and on (model)\n          model:tokentap_requests:rate5m\n            >= on () group_left () tokentap:threshold:min_request_rate\n",
     "tokentap:threshold:rate_limited_ratio\n"),
    ("rate-limit alert `for` 10m -> 5m", "a person must act.\n        for: 10m", "a person must act.\n        for: 5m"),
    ("cancel ratio counts completed", 'rate(tokentap_requests_total{outcome="cancelled"}[5m])',
     'rate(tokentap_requests_total{outcome="completed"}[5m])'),
    ("stall rule ignores timeouts",
     "increase(tokentap_stream_stalls_total[10m])\n            or\n            increase(tokentap_requests_total{outcome=\"timeout\"}[10m])",
     "increase(tokentap_stream_stalls_total[10m])"),
    ("ITL alert `for` 10m -> 5m",
     "tokentap:threshold:itl_p99_seconds\n          and on (model)\n          model:tokentap_requests:rate5m\n            >= on () group_left () tokentap:threshold:min_request_rate\n        for: 10m",
     "tokentap:threshold:itl_p99_seconds\n          and on (model)\n          model:tokentap_requests:rate5m\n            >= on () group_left () tokentap:threshold:min_request_rate\n        for: 5m"),
    ("TokentapDown on any job", 'expr: up{job="tokentap"} == 0', "expr: up == 0"),
    ("absent() on the wrong job", 'absent(up{job="tokentap"})', 'absent(up{job="tokentap-gateway"})'),
    ("upstream alert inverted", "expr: tokentap_upstream_up == 0", "expr: tokentap_upstream_up == 1"),
    ("label overflow alert on rate over 1m", "increase(tokentap_label_overflow_total[1h])",
     "increase(tokentap_label_overflow_total[1m])"),
    ("connections threshold 0.9 -> 0.99", "expr: vector(0.9)", "expr: vector(0.99)"),
    ("connections alert fires at exactly the threshold",
     "tokentap_client_connections / tokentap_client_connections_limit\n            > on ()",
     "tokentap_client_connections / tokentap_client_connections_limit\n            >= on ()"),
    ("connections alert `for` 5m -> 1m",
     "tokentap:threshold:client_connections_ratio\n        for: 5m",
     "tokentap:threshold:client_connections_ratio\n        for: 1m"),
    ("decode errors alert on the wrong label", "sum by (dialect) (rate(tokentap_decode_errors_total[10m]))",
     "sum by (reason) (rate(tokentap_decode_errors_total[10m]))"),
    # Objectives (tests/objectives_test.yaml).
    ("objective traffic guard 100 -> 150 judged requests an hour",
     "tokentap:threshold:min_objective_requests_1h\n        expr: vector(100)",
     "tokentap:threshold:min_objective_requests_1h\n        expr: vector(150)"),
    ("objective traffic guard 100 -> 50 judged requests an hour",
     "tokentap:threshold:min_objective_requests_1h\n        expr: vector(100)",
     "tokentap:threshold:min_objective_requests_1h\n        expr: vector(50)"),
    ("objective traffic guard over 5m instead of the attainment's hour",
     "sum by (objective, model, tenant) (increase(tokentap_objective_requests_total[1h]))",
     "sum by (objective, model, tenant) (increase(tokentap_objective_requests_total[5m]))"),
    ("objective alert without the traffic guard",
     "group_left () min by (objective) (tokentap_objective_target)\n          and on (objective, model, tenant)\n"
     "          objective_model_tenant:tokentap_objective_requests:increase1h\n"
     "            >= on () group_left () tokentap:threshold:min_objective_requests_1h\n",
     "group_left () min by (objective) (tokentap_objective_target)\n"),
    ("objective alert fires at exactly the target",
     "ratio_rate1h\n            < on (objective)", "ratio_rate1h\n            <= on (objective)"),
    ("objective alert against the highest target of the pods (a rollout pages on the old one)",
     "min by (objective) (tokentap_objective_target)", "max by (objective) (tokentap_objective_target)"),
    ("objective alert `for` 15m -> 5m",
     "tokentap:threshold:min_objective_requests_1h\n        for: 15m",
     "tokentap:threshold:min_objective_requests_1h\n        for: 5m"),
    ("attainment over 5m instead of 1h",
     'rate(tokentap_objective_requests_total{result="met"}[1h])',
     'rate(tokentap_objective_requests_total{result="met"}[5m])'),
    ("attainment counts every judged request as met",
     'rate(tokentap_objective_requests_total{result="met"}[1h])',
     'rate(tokentap_objective_requests_total[1h])'),
    ("attainment without the explicit-zero arm (a tenant whose every request missed)",
     'sum by (objective, model, tenant) (rate(tokentap_objective_requests_total{result="met"}[1h]))\n'
     '            or\n            0 * sum by (objective, model, tenant) (rate(tokentap_objective_requests_total[1h]))',
     'sum by (objective, model, tenant) (rate(tokentap_objective_requests_total{result="met"}[1h]))'),
    ("attainment summed over tenants",
     'sum by (objective, model, tenant) (rate(tokentap_objective_requests_total{result="met"}[1h]))',
     'sum by (objective, model) (rate(tokentap_objective_requests_total{result="met"}[1h]))'),
    ("request goodput of the missed requests",
     'rate(tokentap_objective_requests_total{result="met"}[5m])',
     'rate(tokentap_objective_requests_total{result="missed"}[5m])'),
    ("request goodput without the explicit-zero arm",
     'sum by (objective, model, tenant) (rate(tokentap_objective_requests_total{result="met"}[5m]))\n'
     '          or\n          0 * sum by (objective, model, tenant) (rate(tokentap_objective_requests_total[5m]))',
     'sum by (objective, model, tenant) (rate(tokentap_objective_requests_total{result="met"}[5m]))'),
    ("token goodput without the explicit-zero arm",
     'sum by (objective, model, tenant) (rate(tokentap_objective_output_tokens_total{result="met"}[5m]))\n'
     '          or\n          0 * sum by (objective, model, tenant) (rate(tokentap_objective_requests_total[5m]))',
     'sum by (objective, model, tenant) (rate(tokentap_objective_output_tokens_total{result="met"}[5m]))'),
    ("token goodput of every judged request's tokens",
     'rate(tokentap_objective_output_tokens_total{result="met"}[5m])',
     'rate(tokentap_objective_output_tokens_total[5m])'),
    # Buffered responses (tests/buffered_test.yaml).
    ("buffered threshold 0.5 -> 0.7", "tokentap:threshold:buffered_ratio\n        expr: vector(0.5)",
     "tokentap:threshold:buffered_ratio\n        expr: vector(0.7)"),
    ("buffered threshold 0.5 -> 0.3", "tokentap:threshold:buffered_ratio\n        expr: vector(0.5)",
     "tokentap:threshold:buffered_ratio\n        expr: vector(0.3)"),
    ("buffered ratio without the explicit-zero arm",
     "sum by (model) (rate(tokentap_buffered_responses_total[5m]))\n            or\n"
     "            0 * sum by (model) (rate(tokentap_requests_total[5m]))",
     "sum by (model) (rate(tokentap_buffered_responses_total[5m]))"),
    ("buffered ratio over the completed requests only",
     "0 * sum by (model) (rate(tokentap_requests_total[5m]))\n          )\n          /\n"
     "          sum by (model) (rate(tokentap_requests_total[5m]))\n"
     "      # Stalls",
     "0 * sum by (model) (rate(tokentap_requests_total[5m]))\n          )\n          /\n"
     "          sum by (model) (rate(tokentap_requests_total{outcome=\"completed\"}[5m]))\n"
     "      # Stalls"),
    ("buffered ratio summed over models", "sum by (model) (rate(tokentap_buffered_responses_total[5m]))",
     "sum (rate(tokentap_buffered_responses_total[5m]))"),
    ("buffered alert without the traffic guard",
     "tokentap:threshold:buffered_ratio\n          and on (model)\n          model:tokentap_requests:rate5m\n"
     "            >= on () group_left () tokentap:threshold:min_request_rate\n",
     "tokentap:threshold:buffered_ratio\n"),
    ("buffered alert fires at exactly the threshold",
     "ratio_rate5m\n            > on () group_left () tokentap:threshold:buffered_ratio",
     "ratio_rate5m\n            >= on () group_left () tokentap:threshold:buffered_ratio"),
    ("buffered alert `for` 15m -> 5m",
     "tokentap:threshold:min_request_rate\n        for: 15m\n        labels:\n          severity: warning\n"
     "        annotations:\n          summary: \"{{ $value | humanizePercentage }} of responses of",
     "tokentap:threshold:min_request_rate\n        for: 5m\n        labels:\n          severity: warning\n"
     "        annotations:\n          summary: \"{{ $value | humanizePercentage }} of responses of"),
    # The generated SLO groups (deploy/prometheus/slo.yaml via gen-prometheusrule.py).
    ("ITL page at 1.44x instead of 14.4x over 1h",
     'model:tokentap_slo_burn_rate:1h{slo="inter_token_latency"} > 14.4',
     'model:tokentap_slo_burn_rate:1h{slo="inter_token_latency"} > 1.44'),
    ("ITL page without the 5m window that resets it",
     'model:tokentap_slo_burn_rate:5m{slo="inter_token_latency"} > 14.4',
     'model:tokentap_slo_burn_rate:1h{slo="inter_token_latency"} > 14.4'),
    ("ITL page over 6h and 30m at 10x instead of 6x",
     'model:tokentap_slo_burn_rate:6h{slo="inter_token_latency"} > 6\n',
     'model:tokentap_slo_burn_rate:6h{slo="inter_token_latency"} > 10\n'),
    ("ITL ticket over 1d and 2h at 6x instead of 3x",
     'model:tokentap_slo_burn_rate:1d{slo="inter_token_latency"} > 3',
     'model:tokentap_slo_burn_rate:1d{slo="inter_token_latency"} > 6'),
    ("ITL ticket over 3d and 6h at 2.5x instead of 1x",
     'model:tokentap_slo_burn_rate:3d{slo="inter_token_latency"} > 1',
     'model:tokentap_slo_burn_rate:3d{slo="inter_token_latency"} > 2.5'),
    ("ITL page without the traffic guard",
     'model:tokentap_slo_burn_rate:30m{slo="inter_token_latency"} > 6\n            )\n          )\n'
     '          and on (model)\n          model:tokentap_requests:rate5m\n'
     '            >= on () group_left () tokentap:threshold:min_request_rate\n',
     'model:tokentap_slo_burn_rate:30m{slo="inter_token_latency"} > 6\n            )\n          )\n'),
    ("ITL objective read from the 0.15 s bucket",
     'rate(tokentap_inter_token_latency_seconds_bucket{le="0.1"}[1h])',
     'rate(tokentap_inter_token_latency_seconds_bucket{le="0.15"}[1h])'),
    ("ITL burn rate of the good gaps instead of the bad",
     '1 - sum by (model) (rate(tokentap_inter_token_latency_seconds_bucket{le="0.1"}[6h]))',
     'sum by (model) (rate(tokentap_inter_token_latency_seconds_bucket{le="0.1"}[6h]))'),
    ("TTFT objective misses the text format's spelling of the 2 s bucket",
     'tokentap_time_to_first_token_seconds_bucket{le=~"2|2\\\\.0"}[30d]',
     'tokentap_time_to_first_token_seconds_bucket{le="2.0"}[30d]'),
    ("ITL error budget over 1d instead of the 30d period",
     "rate(tokentap_inter_token_latency_seconds_count[30d])",
     "rate(tokentap_inter_token_latency_seconds_count[1d])"),
]


def caught(rules_text, tests, workdir):
    """True when some test file fails on `rules_text` (written next to a copy of the tests)."""
    (workdir / "rules.yaml").write_text(rules_text)
    for t in tests:
        r = subprocess.run(["promtool", "test", "rules", str(workdir / "tests" / t.name)], capture_output=True)
        if r.returncode != 0:
            return True
    return False


def main():
    rules = (PROM / "rules.yaml").read_text()
    tests = sorted((PROM / "tests").glob("*.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        # Baseline: the unmodified rules pass, or the mutations prove nothing.
        base_dir = pathlib.Path(tmp) / "base"
        shutil.copytree(PROM / "tests", base_dir / "tests")
        (base_dir / "rules.yaml").write_text(rules)
        base = subprocess.run(["promtool", "test", "rules", *(str(base_dir / "tests" / t.name) for t in tests)],
                              capture_output=True, text=True)
        if base.returncode != 0:
            print("FAIL baseline: promtool test rules fails on the unmodified rules")
            print(base.stdout[-2000:], base.stderr[-2000:])
            return 1

        def run(index):
            what, old, new = MUTATIONS[index]
            n = rules.count(old)
            if n != 1:
                return f"FAIL mutation \"{what}\": its text occurs {n} times in rules.yaml (expected 1)"
            workdir = pathlib.Path(tmp) / f"mutation-{index}"
            shutil.copytree(PROM / "tests", workdir / "tests")
            if caught(rules.replace(old, new), tests, workdir):
                return f"PASS mutation \"{what}\" is caught by the tests"
            return f"FAIL mutation \"{what}\" is NOT caught: promtool test rules still passes"

        with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
            lines = list(pool.map(run, range(len(MUTATIONS))))
    for line in lines:
        print(line)
    failed = sum(1 for line in lines if line.startswith("FAIL"))
    print(f"rule mutations: {len(MUTATIONS) - failed} caught, {failed} not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
