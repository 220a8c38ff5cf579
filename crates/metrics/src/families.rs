//! The metric contract as data: one spec per family (name, help, labels, kind and where
//! its values come from), which [`Metrics::new`] iterates to build the families.
//!
//! Dashboards, alert rules, the e2e checks and docs/METRICS.md rely on these names, labels and
//! base units; `scripts/ops/tokentap_contract.py` states the same contract (with the
//! default `labels.tenant.families`) for the ops scripts, and a test here fails if the two
//! differ.
//!
//! Which of the per-pair families carry `tenant` is configuration (`labels.tenant.families`):
//! the table says which do by default, and every other one is then per model. The default
//! keeps what per-tenant SLOs and panels read (requests, tokens, TTFT, ITL) and leaves the
//! rest per model, so that 50 models x 200 tenants is 10,000 series of six families, not
//! of seventeen.
//!
//! [`Metrics::new`]: super::Metrics::new

use std::collections::BTreeSet;

use super::gen_ai;
use super::series::{Counter, Histogram, SeriesSet, Slot};
use super::settings::{Buckets, Labels};

/// A family with one series per (model, tenant) pair, or per model when it does not carry
/// `tenant` (and per sub-label), kept in [`SeriesSet`] atomics and written by tokentap's own
/// encoder.
pub(super) struct PairFamily {
    pub name: &'static str,
    pub help: &'static str,
    /// Label names, sorted (the order of a series' labels in the text and the snapshot),
    /// `tenant` included: a series of a family that is per model leaves it out.
    pub labels: &'static [&'static str],
    /// Whether the family carries `tenant` when `labels.tenant.families` is not written.
    pub tenant_by_default: bool,
    /// Which storage of a [`SeriesSet`] holds the family.
    pub slot: Slot,
    pub kind: PairKind,
}

/// What a per-pair family reads from each series set (`None` from a set of the other
/// level: a per-model family is not kept in a pair's set, nor the reverse).
pub(super) enum PairKind {
    /// A histogram with the bucket bounds `buckets` selects from the config; `always`:
    /// the series exists as soon as its set does (a request's handles are taken at
    /// `Metrics::stream`), else only once something was observed.
    Histogram {
        buckets: fn(&Buckets) -> &[f64],
        get: fn(&SeriesSet) -> Option<&Histogram>,
        always: bool,
    },
    /// A counter; `always` as for histograms.
    Counter {
        get: fn(&SeriesSet) -> Option<&Counter>,
        always: bool,
    },
    /// `tokentap_requests_total`: one series per outcome that happened.
    Requests,
    /// `tokentap_event_tokens_total`: one series per accuracy that was counted.
    EventTokens,
}

impl PairKind {
    /// The `# TYPE` of the family.
    pub const fn type_name(&self) -> &'static str {
        match self {
            PairKind::Histogram { .. } => "histogram",
            PairKind::Counter { .. } | PairKind::Requests | PairKind::EventTokens => "counter",
        }
    }
}

const PAIR: &[&str] = &["model", "tenant"];

/// `tokentap_inter_chunk_latency_seconds`' help (the equivalence test's reference reuses it).
pub(super) const INTER_CHUNK_HELP: &str = "Gap between consecutive token-bearing events, observed once per gap as the later event arrives (time per output chunk).";

/// Every per-pair family.
pub(super) static PAIR_FAMILIES: [PairFamily; 17] = [
    PairFamily {
        name: "tokentap_time_to_first_byte_seconds",
        help: "From request head received to upstream response head received.",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::Ttfb,
        kind: PairKind::Histogram {
            buckets: |b| &b.time_to_first_byte_seconds,
            get: |s| s.ttfb.as_deref(),
            always: true,
        },
    },
    PairFamily {
        name: "tokentap_time_to_first_token_seconds",
        help: "From request head received to the first token-bearing event (any output, reasoning included).",
        labels: PAIR,
        tenant_by_default: true,
        slot: Slot::Ttft,
        kind: PairKind::Histogram {
            buckets: |b| &b.time_to_first_token_seconds,
            get: |s| s.ttft.as_deref(),
            always: true,
        },
    },
    PairFamily {
        name: "tokentap_time_to_first_content_token_seconds",
        help: "From request head received to the first event with visible (non-reasoning) output.",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::TtftContent,
        kind: PairKind::Histogram {
            buckets: |b| &b.time_to_first_token_seconds,
            get: |s| s.ttft_content.as_deref(),
            always: true,
        },
    },
    PairFamily {
        name: "tokentap_inter_token_latency_seconds",
        help: "Gap between token-bearing events divided by the event's tokens, observed once per token after the first event.",
        labels: PAIR,
        tenant_by_default: true,
        slot: Slot::Itl,
        kind: PairKind::Histogram {
            buckets: |b| &b.inter_token_latency_seconds,
            get: |s| s.itl.as_deref(),
            always: true,
        },
    },
    PairFamily {
        name: "tokentap_inter_chunk_latency_seconds",
        help: INTER_CHUNK_HELP,
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::InterChunk,
        kind: PairKind::Histogram {
            buckets: |b| &b.inter_chunk_latency_seconds,
            get: |s| s.inter_chunk.as_deref(),
            always: true,
        },
    },
    PairFamily {
        name: "tokentap_time_per_output_token_seconds",
        help: "Per request: (last event - first event) / (output tokens - first event's tokens).",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::Tpot,
        kind: PairKind::Histogram {
            buckets: |b| &b.time_per_output_token_seconds,
            get: |s| s.tpot.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_output_tokens_per_second",
        help: "Per request decode rate: (output tokens - first event's tokens) / (last event - first event).",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::TokensPerSecond,
        kind: PairKind::Histogram {
            buckets: |b| &b.output_tokens_per_second,
            get: |s| s.tokens_per_second.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_output_tokens_per_event",
        help: "Tokens each token-bearing event carried, observed once per event whose count the wire format gave exactly (token ids, logprobs, cumulative usage, TGI): speculative-decoding acceptance and batching.",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::TokensPerEvent,
        kind: PairKind::Histogram {
            buckets: |b| &b.output_tokens_per_event,
            get: |s| s.tokens_per_event.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_request_duration_seconds",
        help: "From request head received to the end of the response (or its failure).",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::Duration,
        kind: PairKind::Histogram {
            buckets: |b| &b.request_duration_seconds,
            get: |s| s.duration.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_requests_total",
        help: "Requests on LLM routes by how they ended (outcome) and what the client was told (status).",
        labels: &["model", "outcome", "status", "tenant"],
        tenant_by_default: true,
        slot: Slot::Requests,
        kind: PairKind::Requests,
    },
    PairFamily {
        name: "tokentap_output_tokens_total",
        help: "Output tokens: the stream's reported usage when present, else counted per event.",
        labels: PAIR,
        tenant_by_default: true,
        slot: Slot::OutputTokens,
        kind: PairKind::Counter {
            get: |s| s.output_tokens.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_input_tokens_total",
        help: "Input (prompt) tokens from reported usage.",
        labels: PAIR,
        tenant_by_default: true,
        slot: Slot::InputTokens,
        kind: PairKind::Counter {
            get: |s| s.input_tokens.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_event_tokens_total",
        help: "Output tokens by how their per-event count was known: given by the wire format (exact), an estimate (words and symbols of the event's text, or the configured tokenizer's count of the event's text) apportioned from the N the stream reported (apportioned), or an estimate nothing corrected (estimated).",
        labels: &["accuracy", "model", "tenant"],
        tenant_by_default: true,
        slot: Slot::EventTokens,
        kind: PairKind::EventTokens,
    },
    PairFamily {
        name: "tokentap_stream_stalls_total",
        help: "Gaps between token-bearing events at least as long as the configured stall threshold.",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::Stalls,
        kind: PairKind::Counter {
            get: |s| s.stalls.as_deref(),
            always: true,
        },
    },
    PairFamily {
        name: "tokentap_engine_queue_seconds",
        help: "Time the engine says the request waited before it started on it (TensorRT-LLM and hosted APIs' queue time, Ollama's load_duration); per request, where the response reported it.",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::EngineQueue,
        kind: PairKind::Histogram {
            buckets: |b| &b.time_to_first_token_seconds,
            get: |s| s.engine_queue.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_engine_prefill_seconds",
        help: "Time the engine says it spent processing the prompt (prefill); per request, where the response reported it.",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::EnginePrefill,
        kind: PairKind::Histogram {
            buckets: |b| &b.time_to_first_token_seconds,
            get: |s| s.engine_prefill.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "tokentap_time_to_first_token_outside_engine_seconds",
        help: "TTFT minus the engine's own TTFT (its reported first-token time, else its queue plus prefill): time spent outside the engine (network, proxies, the server's request handling); 0 where the engine's is longer. Per streamed request whose response reported it.",
        labels: PAIR,
        tenant_by_default: false,
        slot: Slot::TtftOutsideEngine,
        kind: PairKind::Histogram {
            buckets: |b| &b.time_to_first_token_seconds,
            get: |s| s.ttft_outside_engine.as_deref(),
            always: false,
        },
    },
];

/// The `gen_ai_` families (`gen_ai`: `metrics.names`), defined as the `tokentap_` ones are;
/// each reads the storage of a GenAI set, with the convention's buckets.
pub(super) static GEN_AI_FAMILIES: [PairFamily; 6] = [
    PairFamily {
        name: "gen_ai_client_operation_time_per_output_chunk_seconds",
        help: "GenAI client time per output chunk: each gap between consecutive token-bearing events of a streamed response, observed as the later event arrives (tokentap_inter_chunk_latency_seconds).",
        labels: &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
        ],
        tenant_by_default: false,
        slot: Slot::InterChunk,
        kind: PairKind::Histogram {
            buckets: |_| gen_ai::buckets::DURATION,
            get: |s| s.inter_chunk.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "gen_ai_client_operation_time_to_first_chunk_seconds",
        help: "GenAI client time to first chunk: from request head received to the first token-bearing event of a streamed response, whatever its outcome (tokentap_time_to_first_token_seconds).",
        labels: &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
        ],
        tenant_by_default: false,
        slot: Slot::FirstChunk,
        kind: PairKind::Histogram {
            buckets: |_| gen_ai::buckets::DURATION,
            get: |s| s.first_chunk.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "gen_ai_client_token_usage",
        help: "GenAI client token usage: input and output tokens per request, where counted (reported usage, else output tokens counted per event).",
        labels: &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "gen_ai_token_type",
        ],
        tenant_by_default: false,
        slot: Slot::TokenUsage,
        kind: PairKind::Histogram {
            buckets: |_| gen_ai::buckets::TOKEN_USAGE,
            get: |s| s.token_usage.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "gen_ai_server_request_duration_seconds",
        help: "GenAI server request duration: from request head received to the end of the response (or its failure); error_type is the outcome of a request that did not complete (tokentap_request_duration_seconds).",
        labels: &[
            "error_type",
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
        ],
        tenant_by_default: false,
        slot: Slot::Duration,
        kind: PairKind::Histogram {
            buckets: |_| gen_ai::buckets::DURATION,
            get: |s| s.duration.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "gen_ai_server_time_per_output_token_seconds",
        help: "GenAI server time per output token after the first, of successful requests: (last event - first event) / (output tokens - first event's tokens) (tokentap_time_per_output_token_seconds).",
        labels: &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
        ],
        tenant_by_default: false,
        slot: Slot::Tpot,
        kind: PairKind::Histogram {
            buckets: |_| gen_ai::buckets::TIME_PER_OUTPUT_TOKEN,
            get: |s| s.tpot.as_deref(),
            always: false,
        },
    },
    PairFamily {
        name: "gen_ai_server_time_to_first_token_seconds",
        help: "GenAI server time to first token of successful requests: from request head received to the first token-bearing event (tokentap_time_to_first_token_seconds).",
        labels: &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
        ],
        tenant_by_default: false,
        slot: Slot::Ttft,
        kind: PairKind::Histogram {
            buckets: |_| gen_ai::buckets::TIME_TO_FIRST_TOKEN,
            get: |s| s.ttft.as_deref(),
            always: false,
        },
    },
];

/// The GenAI family names, in name order.
#[cfg(test)]
pub(super) fn family_names() -> impl Iterator<Item = &'static str> {
    GEN_AI_FAMILIES.iter().map(|f| f.name)
}

/// A small family kept on the prometheus registry (a handful of series at most).
pub(super) struct RegistryFamily {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: &'static [&'static str],
    pub kind: RegistryKind,
}

/// Which handle a registry family is built into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RegistryKind {
    Counter,
    Gauge,
}

impl RegistryKind {
    /// The `# TYPE` of the family.
    pub const fn type_name(self) -> &'static str {
        match self {
            RegistryKind::Counter => "counter",
            RegistryKind::Gauge => "gauge",
        }
    }
}

pub(super) static STREAMS_IN_FLIGHT: RegistryFamily = RegistryFamily {
    name: "tokentap_streams_in_flight",
    help: "Requests on LLM routes currently in flight.",
    labels: &[],
    kind: RegistryKind::Gauge,
};

pub(super) static UPSTREAM_UP: RegistryFamily = RegistryFamily {
    name: "tokentap_upstream_up",
    help: "1 if the last readiness probe connected to the upstream, else 0.",
    labels: &[],
    kind: RegistryKind::Gauge,
};

pub(super) static UNOBSERVED: RegistryFamily = RegistryFamily {
    name: "tokentap_unobserved_responses_total",
    help: "LLM-route responses forwarded without measurement, by reason.",
    labels: &["reason"],
    kind: RegistryKind::Counter,
};

pub(super) static DECODE_ERRORS: RegistryFamily = RegistryFamily {
    name: "tokentap_decode_errors_total",
    help: "Events that could not be decoded and were skipped, by dialect.",
    labels: &["dialect"],
    kind: RegistryKind::Counter,
};

pub(super) static PASSTHROUGH: RegistryFamily = RegistryFamily {
    name: "tokentap_passthrough_requests_total",
    help: "Requests on non-LLM routes, forwarded without measurement.",
    labels: &[],
    kind: RegistryKind::Counter,
};

pub(super) static OVERLOAD_REJECTIONS: RegistryFamily = RegistryFamily {
    name: "tokentap_overload_rejections_total",
    help: "Requests answered 503 because limits.max_in_flight requests were in flight.",
    labels: &[],
    kind: RegistryKind::Counter,
};

pub(super) static CLIENT_CONNECTIONS: RegistryFamily = RegistryFamily {
    name: "tokentap_client_connections",
    help: "Client connections open on the proxy port (idle keep-alive ones included).",
    labels: &[],
    kind: RegistryKind::Gauge,
};

pub(super) static CLIENT_CONNECTIONS_LIMIT: RegistryFamily = RegistryFamily {
    name: "tokentap_client_connections_limit",
    help: "Client connections the proxy port keeps open at most: limits.max_connections as in force (lowered to what ulimit -n allows), set at start.",
    labels: &[],
    kind: RegistryKind::Gauge,
};

pub(super) static CLIENT_CONNECTION_LIMIT_REACHED: RegistryFamily = RegistryFamily {
    name: "tokentap_client_connection_limit_reached_total",
    help: "Times the proxy port stopped accepting because limits.max_connections client connections were open; new clients then wait in the listen backlog until one closes.",
    labels: &[],
    kind: RegistryKind::Counter,
};

pub(super) static LABEL_OVERFLOW: RegistryFamily = RegistryFamily {
    name: "tokentap_label_overflow_total",
    help: "Label values folded into `other` by the label policy (cap, allowlist, length); label=\"pair\": new (model, tenant) pairs folded into (other, other) by labels.max_pairs.",
    labels: &["label"],
    kind: RegistryKind::Counter,
};

pub(super) static UPSTREAM_RATE_LIMIT_LIMIT: RegistryFamily = RegistryFamily {
    name: "tokentap_upstream_rate_limit_limit",
    help: "The quota the upstream last reported for a model (x-ratelimit-limit-*, anthropic-ratelimit-*-limit), by resource.",
    labels: &["model", "resource"],
    kind: RegistryKind::Gauge,
};

pub(super) static UPSTREAM_RATE_LIMIT_REMAINING: RegistryFamily = RegistryFamily {
    name: "tokentap_upstream_rate_limit_remaining",
    help: "What the upstream last reported left of a model's quota (x-ratelimit-remaining-*, anthropic-ratelimit-*-remaining), by resource.",
    labels: &["model", "resource"],
    kind: RegistryKind::Gauge,
};

pub(super) static UPSTREAM_RETRY_AFTER: RegistryFamily = RegistryFamily {
    name: "tokentap_upstream_retry_after_seconds",
    help: "The wait the upstream last asked for in a 429 or 503 for a model (retry-after-ms or Retry-After), at most a day (86400).",
    labels: &["model"],
    kind: RegistryKind::Gauge,
};

pub(super) static BUILD_INFO: RegistryFamily = RegistryFamily {
    name: "tokentap_build_info",
    help: "Always 1; the version label says which tokentap is running.",
    labels: &["version"],
    kind: RegistryKind::Gauge,
};

pub(super) static OTLP_EXPORTS: RegistryFamily = RegistryFamily {
    name: "tokentap_otlp_exports_total",
    help: "OTLP exports finished, by signal (metrics, traces) and result (success, or failed: refused by the collector or out of time and retries).",
    labels: &["result", "signal"],
    kind: RegistryKind::Counter,
};

pub(super) static OTLP_EXPORTS_DROPPED: RegistryFamily = RegistryFamily {
    name: "tokentap_otlp_exports_dropped_total",
    help: "OTLP exports never sent, by signal and reason (replaced: a newer metrics snapshot came while the collector was busy or down; queue_full: a span dropped because the span queue was full; shutdown: unsent at exit). For signal traces each count is one span.",
    labels: &["reason", "signal"],
    kind: RegistryKind::Counter,
};

pub(super) static TASK_RESTARTS: RegistryFamily = RegistryFamily {
    name: "tokentap_task_restarts_total",
    help: "Background tasks (otlp_metrics, otlp_spans, live_ticker, reload, upstream_probe) that failed (panicked) and were restarted, by task.",
    labels: &["task"],
    kind: RegistryKind::Counter,
};

pub(super) static OBJECTIVE_REQUESTS: RegistryFamily = RegistryFamily {
    name: "tokentap_objective_requests_total",
    help: "Finished requests judged against each configured objective (`objectives`), by whether they met it (result: met, missed). Requests that are not judged (the client's own error, a cancel before any bound was broken) are not counted.",
    labels: &["model", "objective", "result", "tenant"],
    kind: RegistryKind::Counter,
};

pub(super) static OBJECTIVE_OUTPUT_TOKENS: RegistryFamily = RegistryFamily {
    name: "tokentap_objective_output_tokens_total",
    help: "Output tokens of the requests counted in tokentap_objective_requests_total, by the same labels: token goodput is the met ones' rate.",
    labels: &["model", "objective", "result", "tenant"],
    kind: RegistryKind::Counter,
};

pub(super) static OBJECTIVE_TARGET: RegistryFamily = RegistryFamily {
    name: "tokentap_objective_target",
    help: "The share of judged requests each objective is meant to meet (`objectives.<name>.target`): what the attainment alert compares against.",
    labels: &["objective"],
    kind: RegistryKind::Gauge,
};

pub(super) static BUFFERED_RESPONSES: RegistryFamily = RegistryFamily {
    name: "tokentap_buffered_responses_total",
    help: "Responses whose token-bearing events reached tokentap in one burst (a buffering hop between tokentap and the engine): their gaps, ITL, TPOT and tokens per second are not observed.",
    labels: &["model"],
    kind: RegistryKind::Counter,
};

pub(super) static USAGE_DETAIL_TOKENS: RegistryFamily = RegistryFamily {
    name: "tokentap_usage_detail_tokens_total",
    help: "The parts of the reported usage that providers break out, by kind: cache_read_input and cache_write_input (parts of tokentap_input_tokens_total), reasoning_output (part of tokentap_output_tokens_total). Only requests whose usage reported the part count.",
    labels: &["kind", "model", "tenant"],
    kind: RegistryKind::Counter,
};

/// Every registry family (`Metrics::new` builds each into its own typed handle).
static REGISTRY_FAMILIES: [&RegistryFamily; 22] = [
    &STREAMS_IN_FLIGHT,
    &UPSTREAM_UP,
    &UNOBSERVED,
    &DECODE_ERRORS,
    &PASSTHROUGH,
    &OVERLOAD_REJECTIONS,
    &CLIENT_CONNECTIONS,
    &CLIENT_CONNECTIONS_LIMIT,
    &CLIENT_CONNECTION_LIMIT_REACHED,
    &LABEL_OVERFLOW,
    &UPSTREAM_RATE_LIMIT_LIMIT,
    &UPSTREAM_RATE_LIMIT_REMAINING,
    &UPSTREAM_RETRY_AFTER,
    &BUILD_INFO,
    &OTLP_EXPORTS,
    &OTLP_EXPORTS_DROPPED,
    &TASK_RESTARTS,
    &OBJECTIVE_REQUESTS,
    &OBJECTIVE_OUTPUT_TOKENS,
    &OBJECTIVE_TARGET,
    &BUFFERED_RESPONSES,
    &USAGE_DETAIL_TOKENS,
];

/// Every family that can carry `tenant` (the per-pair ones), in table order: what
/// `labels.tenant.families` may list.
pub fn tenant_capable() -> impl Iterator<Item = &'static str> {
    PAIR_FAMILIES.iter().map(|f| f.name)
}

/// The families that carry `tenant` when `labels.tenant.families` is not written.
pub fn tenant_by_default() -> impl Iterator<Item = &'static str> {
    PAIR_FAMILIES
        .iter()
        .filter(|f| f.tenant_by_default)
        .map(|f| f.name)
}

impl Labels {
    /// What an unwritten `labels.tenant.families` means: the table's default.
    pub fn default_tenant_families() -> BTreeSet<&'static str> {
        tenant_by_default().collect()
    }
}

/// The families of the whole process (no `model`, no `tenant`): they can never carry
/// `tenant`.
pub fn process_wide() -> impl Iterator<Item = &'static str> {
    REGISTRY_FAMILIES.iter().map(|f| f.name)
}

/// `(name, type, labels)` of every family tokentap defines (the process collector's
/// `process_*` families and the GenAI ones, [`gen_ai_contract`], aside), with the labels
/// of the default `labels.tenant.families`: what docs/METRICS.md and the ops scripts list.
pub fn contract() -> impl Iterator<Item = (&'static str, &'static str, Vec<&'static str>)> {
    PAIR_FAMILIES
        .iter()
        .map(|f| {
            let labels = f
                .labels
                .iter()
                .copied()
                .filter(|l| f.tenant_by_default || *l != "tenant")
                .collect();
            (f.name, f.kind.type_name(), labels)
        })
        .chain(
            REGISTRY_FAMILIES
                .iter()
                .map(|f| (f.name, f.kind.type_name(), f.labels.to_vec())),
        )
}

/// `(name, type, labels)` of the GenAI families (`metrics.names`: `gen_ai` or `both`).
pub fn gen_ai_contract() -> impl Iterator<Item = (&'static str, &'static str, Vec<&'static str>)> {
    GEN_AI_FAMILIES
        .iter()
        .map(|f| (f.name, f.kind.type_name(), f.labels.to_vec()))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::outcome::{Outcome, StatusClass, Verdict};

    /// The ops scripts' statement of the contract.
    const OPS_CONTRACT: &str = include_str!("../../../scripts/ops/tokentap_contract.py");

    /// The text between `NAME = <open>` and the matching `close`, in the Python source.
    fn python_value(name: &str, open: char, close: char) -> &'static str {
        let start = format!("\n{name} = {open}");
        let at = OPS_CONTRACT
            .find(&start)
            .unwrap_or_else(|| panic!("tokentap_contract.py defines `{name} = {open}...`"))
            + start.len();
        let end = OPS_CONTRACT[at..]
            .find(close)
            .unwrap_or_else(|| panic!("`{name}` ends with `{close}`"));
        &OPS_CONTRACT[at..at + end]
    }

    /// The double-quoted strings of `text`, and whether anything but strings and
    /// punctuation is left (a name that would have to be looked up).
    fn strings(text: &str) -> (Vec<String>, bool) {
        let mut parts = text.split('"');
        let mut outside = parts.next().unwrap_or_default().to_string();
        let mut found = Vec::new();
        while let Some(inside) = parts.next() {
            found.push(inside.to_string());
            outside.push_str(parts.next().unwrap_or_default());
        }
        let plain = outside
            .chars()
            .all(|c| c.is_whitespace() || ":,()".contains(c));
        (found, plain)
    }

    fn python_strings(name: &str, open: char, close: char) -> Vec<String> {
        let (found, plain) = strings(python_value(name, open, close));
        assert!(plain, "write `{name}` with literal strings only");
        found
    }

    fn python_floats(name: &str) -> Vec<f64> {
        python_value(name, '(', ')')
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: {v:?}")))
            .collect()
    }

    /// What an unwritten `metrics.buckets` means (the config takes these: its test
    /// `flag_only_settings_are_the_metric_crates_defaults`).
    fn defaults() -> Buckets {
        Buckets::default()
    }

    /// `scripts/ops/tokentap_contract.py` lists exactly the families of this table, each
    /// with its type and labels, so the dashboards' and e2e checks' idea of the metrics
    /// cannot drift from the binary's.
    #[test]
    fn the_ops_contract_is_this_table() {
        let mut ops = BTreeMap::new();
        for line in python_value("METRICS", '{', '}').lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (found, plain) = strings(line);
            assert!(
                plain && found.len() >= 2,
                "METRICS entries are `\"name\": (\"type\", (\"label\", ...)),`: {line}"
            );
            let labels: BTreeSet<String> = found[2..].iter().cloned().collect();
            ops.insert(found[0].clone(), (found[1].clone(), labels));
        }
        let table: BTreeMap<String, (String, BTreeSet<String>)> = contract()
            .map(|(name, kind, labels)| {
                let labels = labels.iter().map(|l| l.to_string()).collect();
                (name.to_string(), (kind.to_string(), labels))
            })
            .collect();
        assert_eq!(ops, table);

        let event_driven = python_strings("EVENT_DRIVEN", '{', '}');
        for name in &event_driven {
            assert!(table.contains_key(name), "EVENT_DRIVEN: {name}");
        }
        let not_charted = python_strings("NOT_CHARTED", '{', '}');
        for name in &not_charted {
            assert!(table.contains_key(name), "NOT_CHARTED: {name}");
        }
        let outcomes: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(python_strings("OUTCOMES", '(', ')'), outcomes);
        let mut statuses: Vec<&str> = Verdict::ALL.iter().map(|v| v.status.as_str()).collect();
        statuses.sort_by_key(|s| StatusClass::ALL.iter().position(|c| c.as_str() == *s));
        statuses.dedup();
        assert_eq!(python_strings("STATUSES", '(', ')'), statuses);
    }

    /// The GenAI families and what `gen_ai` replaces are the ops contract's too.
    #[test]
    fn the_ops_contract_has_the_gen_ai_families() {
        let mut ops = BTreeMap::new();
        for line in python_value("GEN_AI_METRICS", '{', '}').lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let (found, plain) = strings(line);
            assert!(plain && found.len() >= 2, "GEN_AI_METRICS entry: {line}");
            ops.insert(found[0].clone(), (found[1].clone(), found[2..].to_vec()));
        }
        let table: BTreeMap<String, (String, Vec<String>)> = GEN_AI_FAMILIES
            .iter()
            .map(|f| {
                let labels = f.labels.iter().map(|l| l.to_string()).collect();
                (f.name.to_string(), (f.kind.type_name().to_string(), labels))
            })
            .collect();
        assert_eq!(ops, table);
        let mut replaced: Vec<&str> = gen_ai::REPLACED.iter().map(|(_, t)| *t).collect();
        replaced.sort();
        replaced.dedup();
        let mut ops_replaced = python_strings("GEN_AI_REPLACES", '(', ')');
        ops_replaced.sort();
        assert_eq!(ops_replaced, replaced);
    }

    /// Each family's `slot` is the storage its getter reads: a set that keeps that slot
    /// alone has this family and no other, so `labels.tenant.families` moves exactly the
    /// families it names.
    #[test]
    fn each_family_reads_its_own_slot() {
        use crate::series::{Bounds, TenantSlots};
        use std::sync::Arc;
        let one: Arc<[f64]> = Arc::from(vec![1.0]);
        let bounds = Bounds {
            ttfb: one.clone(),
            ttft: one.clone(),
            itl: one.clone(),
            inter_chunk: one.clone(),
            tpot: one.clone(),
            tokens_per_second: one.clone(),
            tokens_per_event: one.clone(),
            duration: one,
            gen_ai: crate::gen_ai::GenAiBounds::default(),
            native: None,
        };
        let kept = |family: &PairFamily, set: &SeriesSet| match family.kind {
            PairKind::Histogram { get, .. } => get(set).is_some(),
            PairKind::Counter { get, .. } => get(set).is_some(),
            PairKind::Requests => set.requests.is_some(),
            PairKind::EventTokens => set.event_tokens.is_some(),
        };
        for family in &PAIR_FAMILIES {
            let mut slots = [false; Slot::COUNT];
            slots[family.slot as usize] = true;
            let pair = SeriesSet::new(
                Arc::from("m"),
                Some(Arc::from("t")),
                &bounds,
                TenantSlots(slots),
            );
            for other in &PAIR_FAMILIES {
                assert_eq!(
                    kept(other, &pair),
                    other.name == family.name,
                    "{} in a set keeping {}'s slot",
                    other.name,
                    family.name
                );
            }
            assert!(family.labels.contains(&"model") && family.labels.contains(&"tenant"));
        }
        assert_eq!(PAIR_FAMILIES.len(), Slot::COUNT);
    }

    /// The bucket bounds the e2e check expects are the configuration's defaults.
    #[test]
    fn the_ops_contract_buckets_are_the_defaults() {
        let defaults = defaults();
        assert_eq!(
            python_floats("ITL_BUCKETS"),
            defaults.inter_token_latency_seconds
        );
        assert_eq!(
            python_floats("TTFT_BUCKETS"),
            defaults.time_to_first_token_seconds
        );
        assert_eq!(
            python_floats("TTFT_BUCKETS"),
            defaults.time_to_first_byte_seconds,
            "the e2e check reads TTFB with the TTFT buckets"
        );
    }
}
