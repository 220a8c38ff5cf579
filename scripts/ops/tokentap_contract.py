"""The metric contract of tokentap, as agreed for dashboards, rules and tests.

One list, used by scripts/ops/check-grafana.py (static checks) and
scripts/ops/e2e-prometheus.sh (against the real /metrics exposition). The binary's
own table of families (crates/metrics/src/families.rs) is checked against this file by
`cargo test` (the_ops_contract_is_this_table), so the two cannot drift: a family
renamed or added there fails that test until it is changed here too, and then the
checks show every dashboard or rule to fix.

Write METRICS entries with literal strings, one per line, as below: the Rust test
reads them.
"""
import re

# name -> (type, labels), with the default `labels.tenant.families`: `tenant` is on the
# requests and token counters, TTFT and ITL; every other per-request family is per
# model (an operator may add `tenant` to any of them, so queries on those aggregate
# `by (model)` and never filter on tenant).
METRICS = {
    "tokentap_time_to_first_byte_seconds": ("histogram", ("model",)),
    "tokentap_time_to_first_token_seconds": ("histogram", ("model", "tenant")),
    "tokentap_time_to_first_content_token_seconds": ("histogram", ("model",)),
    "tokentap_inter_token_latency_seconds": ("histogram", ("model", "tenant")),
    "tokentap_inter_chunk_latency_seconds": ("histogram", ("model",)),
    "tokentap_time_per_output_token_seconds": ("histogram", ("model",)),
    "tokentap_output_tokens_per_second": ("histogram", ("model",)),
    "tokentap_output_tokens_per_event": ("histogram", ("model",)),
    "tokentap_request_duration_seconds": ("histogram", ("model",)),
    "tokentap_requests_total": ("counter", ("model", "tenant", "outcome", "status")),
    "tokentap_output_tokens_total": ("counter", ("model", "tenant")),
    "tokentap_input_tokens_total": ("counter", ("model", "tenant")),
    "tokentap_event_tokens_total": ("counter", ("model", "tenant", "accuracy")),
    "tokentap_stream_stalls_total": ("counter", ("model",)),
    "tokentap_engine_queue_seconds": ("histogram", ("model",)),
    "tokentap_engine_prefill_seconds": ("histogram", ("model",)),
    "tokentap_time_to_first_token_outside_engine_seconds": ("histogram", ("model",)),
    "tokentap_label_overflow_total": ("counter", ("label",)),
    "tokentap_unobserved_responses_total": ("counter", ("reason",)),
    "tokentap_decode_errors_total": ("counter", ("dialect",)),
    "tokentap_passthrough_requests_total": ("counter", ()),
    "tokentap_overload_rejections_total": ("counter", ()),
    "tokentap_client_connection_limit_reached_total": ("counter", ()),
    "tokentap_streams_in_flight": ("gauge", ()),
    "tokentap_client_connections": ("gauge", ()),
    "tokentap_client_connections_limit": ("gauge", ()),
    "tokentap_upstream_up": ("gauge", ()),
    "tokentap_upstream_rate_limit_limit": ("gauge", ("model", "resource")),
    "tokentap_upstream_rate_limit_remaining": ("gauge", ("model", "resource")),
    "tokentap_upstream_retry_after_seconds": ("gauge", ("model",)),
    "tokentap_build_info": ("gauge", ("version",)),
    "tokentap_otlp_exports_total": ("counter", ("result", "signal")),
    "tokentap_otlp_exports_dropped_total": ("counter", ("reason", "signal")),
    "tokentap_task_restarts_total": ("counter", ("task",)),
    "tokentap_objective_requests_total": ("counter", ("model", "objective", "result", "tenant")),
    "tokentap_objective_output_tokens_total": ("counter", ("model", "objective", "result", "tenant")),
    "tokentap_objective_target": ("gauge", ("objective",)),
    "tokentap_buffered_responses_total": ("counter", ("model",)),
    "tokentap_usage_detail_tokens_total": ("counter", ("kind", "model", "tenant")),
}

# Exported and checked like the rest, but no dashboard panel or rule reads them (yet):
# diagnostics for an operator who looks at /metrics directly.
NOT_CHARTED = {
    "tokentap_event_tokens_total",
    "tokentap_output_tokens_per_event",
    "tokentap_engine_queue_seconds",
    "tokentap_engine_prefill_seconds",
    "tokentap_time_to_first_token_outside_engine_seconds",
    "tokentap_passthrough_requests_total",
    "tokentap_overload_rejections_total",
    "tokentap_client_connection_limit_reached_total",
    "tokentap_otlp_exports_total",
    "tokentap_otlp_exports_dropped_total",
    "tokentap_task_restarts_total",
    "tokentap_usage_detail_tokens_total",
}

# Counters whose series only exist after the event they count happened (a labelled
# child is created on first increment unless the binary pre-creates it). The e2e
# test provokes what it can from the contract and reports the rest as skipped
# when they are absent from the exposition.
# tokentap_output_tokens_per_event is a histogram with the same rule: a model's series
# exists once one of its streams gave a per-event count exactly (token ids, logprobs,
# continuous usage, TGI).
# The objective families (tokentap_objective_*) exist only where `objectives` is
# configured; e2e-prometheus.sh configures two on its main tokentap and sends the traffic
# that judges them, so they are not listed here: absent, they fail.
EVENT_DRIVEN = {
    "tokentap_stream_stalls_total",
    "tokentap_output_tokens_per_event",
    "tokentap_engine_queue_seconds",
    "tokentap_engine_prefill_seconds",
    "tokentap_time_to_first_token_outside_engine_seconds",
    "tokentap_label_overflow_total",
    "tokentap_unobserved_responses_total",
    "tokentap_decode_errors_total",
    "tokentap_upstream_rate_limit_limit",
    "tokentap_upstream_rate_limit_remaining",
    "tokentap_upstream_retry_after_seconds",
    "tokentap_otlp_exports_total",
    "tokentap_otlp_exports_dropped_total",
    "tokentap_task_restarts_total",
    "tokentap_buffered_responses_total",
    "tokentap_usage_detail_tokens_total",
}

PROCESS_METRICS = {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"}

# `metrics.names: gen_ai` or `both`: the OpenTelemetry GenAI semantic conventions'
# families (crates/metrics/src/families.rs GEN_AI_FAMILIES), name -> (type, labels); a series
# has the labels of its attributes it carries (error_type only on failed requests'
# durations). GEN_AI_REPLACES: what `gen_ai` leaves out of the tokentap_ families.
GEN_AI_METRICS = {
    "gen_ai_client_operation_time_per_output_chunk_seconds": ("histogram", ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")),
    "gen_ai_client_operation_time_to_first_chunk_seconds": ("histogram", ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")),
    "gen_ai_client_token_usage": ("histogram", ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type")),
    "gen_ai_server_request_duration_seconds": ("histogram", ("error_type", "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")),
    "gen_ai_server_time_per_output_token_seconds": ("histogram", ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")),
    "gen_ai_server_time_to_first_token_seconds": ("histogram", ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")),
}
GEN_AI_REPLACES = (
    "tokentap_time_to_first_token_seconds",
    "tokentap_time_per_output_token_seconds",
    "tokentap_request_duration_seconds",
    "tokentap_inter_chunk_latency_seconds",
    "tokentap_output_tokens_total",
    "tokentap_input_tokens_total",
)

OUTCOMES = ("completed", "cancelled", "upstream_error", "upstream_refused", "timeout",
            "client_error", "overloaded")

# The `status` label of tokentap_requests_total: the upstream's status class, or
# tokentap's own answer.
STATUSES = ("none", "1xx", "2xx", "3xx", "429", "4xx", "503", "5xx", "tokentap_400",
            "tokentap_408", "tokentap_414", "tokentap_431", "tokentap_501", "tokentap_502",
            "tokentap_503", "tokentap_504")

ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
               0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5,
                7.5, 10, 15, 20, 30, 60)

_NAME = re.compile(r"\btokentap_[a-z0-9_]+\b")


def base_name(series_name):
    """tokentap_x_seconds_bucket -> tokentap_x_seconds for histograms; else unchanged."""
    for suffix in ("_bucket", "_sum", "_count"):
        if series_name.endswith(suffix):
            stem = series_name[: -len(suffix)]
            if METRICS.get(stem, ("",))[0] == "histogram":
                return stem
    return series_name


def referenced(text):
    """Contract-level metric names (histogram suffixes stripped) referenced in PromQL text.

    Names inside recording-rule names (`model:tokentap_requests:rate5m`) and the
    threshold series (`tokentap:threshold:...`) are not metric references."""
    names = set()
    for m in _NAME.finditer(text):
        start = m.start()
        if start > 0 and text[start - 1] == ":":
            continue  # part of a recording rule name, e.g. model:tokentap_requests:rate5m
        names.add(base_name(m.group(0)))
    return names
