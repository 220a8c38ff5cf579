//! The metric contract (docs/ARCHITECTURE.md, "The metric contract"): families built once
//! from an explicit registry, and per-pair handles resolved once per request so the token
//! path only touches atomics.
//!
//! A crate of its own (issue 34), so that the compiler keeps it from the proxy: it
//! depends on the wire crate's types and on no async runtime, HTTP stack or module of the
//! proxy, which re-exports it as `tokentap::metrics`. The outcome vocabulary its request
//! counter is labelled with is here too ([`outcome`], re-exported as `tokentap::outcome`).
//!
//! Names, labels and base units (`families`, the contract as a table) are shared with the
//! dashboards, the alert rules and docs/METRICS.md; change them only together.
//!
//! The per-(model, tenant) families are kept in tokentap's own atomics (`series`), per
//! pair for the families that carry `tenant` and per model for the rest
//! (`labels.tenant.families`), and written straight to text (`exposition`): with thousands of label pairs the prometheus
//! crate's snapshot-then-encode made each scrape take most of a second. The text is the
//! same byte for byte (`equivalence` proves it against the crate). The few small families
//! (gauges, per-reason counters, build info, the process collector's `process_*`) stay on
//! a prometheus registry, whose text encoder writes them in their place in name order.
//!
//! Whatever reads the families as values rather than text (the demo's summary, tests, an
//! encoder of another format) takes a [`Snapshot`]: every family, the registry's
//! included, as plain typed data.
//!
//! This file holds the types ([`Metrics`], the figures a request is recorded with, a
//! scrape's [`Exposition`]) and how a `Metrics` is built. What it does is split by job
//! into child files, each an `impl Metrics` that this file does not name (no module
//! imports its importer: tests/it/layering.rs): which series a request's labels
//! lead to, `series_sets`; a finished request's figures recorded on them, `record`; the
//! small families of the registry, registered, counted and read back, `registry`; one
//! scrape, as text (whole or in chunks), snapshot or protobuf, `scrape`.

// Values from the network pass here: nothing may panic on them (clippy.toml); the
// recording path's files also deny indexing and unchecked arithmetic.
#![warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod buckets;
#[cfg(test)]
mod equivalence;
pub mod exemplar;
mod exposition;
mod families;
pub mod gen_ai;
pub mod in_flight;
pub mod labels;
pub mod native;
mod objective_totals;
pub mod outcome;
pub mod protobuf;
mod record;
mod registry;
mod scrape;
mod series;
mod series_sets;
mod settings;
pub mod snapshot;
mod text;

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use prometheus::proto;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use exemplar::TraceContext;
use exposition::{Cursor, Family, Pairs, SetLevel, Writer};
pub use families::{contract, gen_ai_contract, process_wide, tenant_by_default, tenant_capable};
use families::{
    RegistryFamily, RegistryKind, BUFFERED_RESPONSES, CLIENT_CONNECTIONS, CLIENT_CONNECTIONS_LIMIT,
    CLIENT_CONNECTION_LIMIT_REACHED, DECODE_ERRORS, GEN_AI_FAMILIES, LABEL_OVERFLOW,
    OBJECTIVE_OUTPUT_TOKENS, OBJECTIVE_REQUESTS, OBJECTIVE_TARGET, OTLP_EXPORTS,
    OTLP_EXPORTS_DROPPED, OVERLOAD_REJECTIONS, PAIR_FAMILIES, PASSTHROUGH, STREAMS_IN_FLIGHT,
    TASK_RESTARTS, UNOBSERVED, UPSTREAM_RATE_LIMIT_LIMIT, UPSTREAM_RATE_LIMIT_REMAINING,
    UPSTREAM_RETRY_AFTER, UPSTREAM_UP, USAGE_DETAIL_TOKENS,
};
pub use gen_ai::MetricNames;
use gen_ai::{GenAiBounds, GenAiKey};
use labels::{LabelSet, PairCap};
use native::NativeSettings;
pub use objective_totals::ObjectiveTotals;
use series::{Bounds, Slot, TenantSlots};
pub use series::{Counter, GenAiSeries, Histogram, SeriesSet, StreamSeries};
pub use settings::{
    Buckets, LabelPolicy, Labels, NativeHistograms, DEFAULT_MAX_PAIRS, DEFAULT_MAX_VALUE_LEN,
    DEFAULT_MODEL_MAX_VALUES, DEFAULT_TENANT_MAX_VALUES,
};
pub use snapshot::Snapshot;

/// The figures of one finished request that [`Metrics::record_request`] records: plain values,
/// whatever measured them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestFigures {
    /// From request head received to the end of the response (or its failure).
    pub duration: Duration,
    /// Output tokens: the stream's reported usage when present, else counted per event.
    pub output_tokens: u64,
    /// Input tokens from reported usage.
    pub input_tokens: Option<u64>,
    /// Output tokens counted per event where the wire format gave the count.
    pub exact_event_tokens: u64,
    /// Output tokens whose per-event count was apportioned from the reported N.
    pub apportioned_event_tokens: u64,
    /// Output tokens counted per event as an estimate that no reported N corrected.
    pub estimated_event_tokens: u64,
    /// Time per output token after the first event, where defined.
    pub tpot: Option<Duration>,
    /// Decode tokens per second after the first event, where defined.
    pub tokens_per_second: Option<f64>,
    /// What the request's exemplars carry, when it came with a valid trace context.
    pub exemplar: Option<RequestExemplar>,
}

/// What the engine reported of one finished request's time, as
/// [`Metrics::record_engine_timings`] records it: plain values, each only where reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineFigures {
    /// The engine's queue time.
    pub queue: Option<Duration>,
    /// The engine's prefill time.
    pub prefill: Option<Duration>,
    /// tokentap's TTFT minus the engine's, 0 where the engine's is longer.
    pub ttft_outside_engine: Option<Duration>,
}

/// A traced request's exemplar figures: its trace context, when it was recorded, and the
/// values of its exemplars that [`RequestFigures`] does not hold already (TPOT and
/// duration are there).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestExemplar {
    pub trace: TraceContext,
    /// Wall-clock time of recording: every exemplar's timestamp.
    pub at: SystemTime,
    /// The request's TTFT, observed when its first token came.
    pub ttft: Option<Duration>,
    /// The largest per-token value the request put into the ITL histogram (its slowest
    /// gap's share per token).
    pub slowest_itl: Option<Duration>,
}

/// Every series set, in the order the exposition lists them.
#[derive(Default)]
struct Sets {
    /// model -> tenant -> the pair's set (the families that carry `tenant`).
    pairs: BTreeMap<Arc<str>, BTreeMap<Arc<str>, Arc<SeriesSet>>>,
    /// model -> the model's set (the families that are per model).
    models: BTreeMap<Arc<str>, Arc<SeriesSet>>,
    /// The GenAI attribute sets, when `metrics.names` exposes the GenAI families.
    gen_ai: BTreeMap<GenAiKey, Arc<SeriesSet>>,
}

/// Every metric family tokentap exports.
///
/// The per-(model, tenant) families live in [`SeriesSet`]s (one per pair for the families
/// that carry `tenant`, one per model for the rest, written straight to text by
/// `exposition`); the few small families stay on a prometheus registry.
pub struct Metrics {
    registry: Registry,
    /// The process collector's families (`process_*`), apart: they are read from `/proc`
    /// once per scrape, while `registry` may be gathered more than once (see `Render`).
    process: Registry,
    bounds: Bounds,
    /// `metrics.native_histograms.classic`: classic buckets in the protobuf exposition.
    protobuf_classic: bool,
    /// Every pair's and every model's series set.
    sets: RwLock<Sets>,
    /// Which families a pair's set keeps (`labels.tenant.families`); a model's set keeps
    /// the others.
    tenant_slots: TenantSlots,
    /// The per-pair families, sorted by name.
    families: Vec<Family>,
    /// Requests in flight on LLM routes.
    pub streams_in_flight: IntGauge,
    /// 1 while the readiness probe reaches the upstream.
    pub upstream_up: IntGauge,
    unobserved: IntCounterVec,
    decode_errors: IntCounterVec,
    passthrough: IntCounter,
    overload_rejections: IntCounter,
    /// What upstreams report of their rate limits, per model.
    rate_limit_limit: IntGaugeVec,
    rate_limit_remaining: IntGaugeVec,
    retry_after: GaugeVec,
    /// Client connections open on the proxy port.
    pub client_connections: IntGauge,
    /// The most client connections open at once (`limits.max_connections` in force).
    pub client_connections_limit: IntGauge,
    client_connection_limit_reached: IntCounter,
    otlp_exports: IntCounterVec,
    otlp_exports_dropped: IntCounterVec,
    task_restarts: IntCounterVec,
    /// Requests and their output tokens judged against each objective, and the targets.
    objective_requests: IntCounterVec,
    objective_output_tokens: IntCounterVec,
    objective_target: GaugeVec,
    buffered_responses: IntCounterVec,
    usage_detail_tokens: IntCounterVec,
    models: LabelSet,
    tenants: LabelSet,
    /// Bounds the (model, tenant) pairs, whatever the per-label caps allow.
    pair_cap: PairCap,
    last_render_bytes: AtomicUsize,
    /// `metrics.names`: which families are exposed, and whether GenAI sets are kept.
    names: MetricNames,
}

/// Bucket bounds as the config validated them: at least one, positive, finite and
/// strictly increasing (`+Inf` is implicit, never listed). A bad set is a programming
/// error.
fn bounds(buckets: &[f64]) -> Arc<[f64]> {
    assert!(
        buckets.iter().all(|b| b.is_finite()) && buckets.windows(2).all(|w| w[0] < w[1]),
        "histogram buckets must be finite and in increasing order"
    );
    Arc::from(buckets)
}

/// A registry family built from its static definition (`families.rs`), which the tests
/// of this module build and register, each of them.
#[allow(
    clippy::expect_used,
    reason = "static definitions: a failure is a bug the tests find, not a value from outside"
)]
fn defined<T>(built: prometheus::Result<T>) -> T {
    built.expect("static metric definitions are valid and their names unique")
}

fn opts(family: &RegistryFamily) -> Opts {
    Opts::new(family.name, family.help)
}

fn counter(family: &RegistryFamily) -> IntCounter {
    debug_assert!(family.kind == RegistryKind::Counter && family.labels.is_empty());
    defined(IntCounter::with_opts(opts(family)))
}

fn counter_vec(family: &RegistryFamily) -> IntCounterVec {
    debug_assert!(family.kind == RegistryKind::Counter);
    defined(IntCounterVec::new(opts(family), family.labels))
}

fn gauge(family: &RegistryFamily) -> IntGauge {
    debug_assert!(family.kind == RegistryKind::Gauge && family.labels.is_empty());
    defined(IntGauge::with_opts(opts(family)))
}

fn float_gauge_vec(family: &RegistryFamily) -> GaugeVec {
    debug_assert!(family.kind == RegistryKind::Gauge);
    defined(GaugeVec::new(opts(family), family.labels))
}

fn gauge_vec(family: &RegistryFamily) -> IntGaugeVec {
    debug_assert!(family.kind == RegistryKind::Gauge);
    defined(IntGaugeVec::new(opts(family), family.labels))
}

impl Metrics {
    /// Build and register every family, with the default `metrics.native_histograms`.
    /// Bucket bounds were validated with the config.
    pub fn new(buckets: &Buckets, labels: &Labels) -> Arc<Metrics> {
        Metrics::with_native(buckets, &NativeHistograms::default(), labels)
    }

    /// [`Metrics::new`] with the native histograms (validated) of `native`.
    pub fn with_native(
        buckets: &Buckets,
        native: &NativeHistograms,
        labels: &Labels,
    ) -> Arc<Metrics> {
        Metrics::with_names(buckets, native, labels, MetricNames::default())
    }

    /// [`Metrics::with_native`], exposing the families `names` says (`metrics.names`).
    pub fn with_names(
        buckets: &Buckets,
        native: &NativeHistograms,
        labels: &Labels,
        names: MetricNames,
    ) -> Arc<Metrics> {
        let label_overflow = counter_vec(&LABEL_OVERFLOW);
        let metrics = Metrics {
            registry: Registry::new(),
            process: Registry::new(),
            bounds: histogram_bounds(buckets, native),
            protobuf_classic: native.classic,
            sets: RwLock::new(Sets::default()),
            tenant_slots: tenant_slots(labels),
            families: pair_families(buckets, labels, names),
            streams_in_flight: gauge(&STREAMS_IN_FLIGHT),
            upstream_up: gauge(&UPSTREAM_UP),
            unobserved: counter_vec(&UNOBSERVED),
            decode_errors: counter_vec(&DECODE_ERRORS),
            passthrough: counter(&PASSTHROUGH),
            overload_rejections: counter(&OVERLOAD_REJECTIONS),
            rate_limit_limit: gauge_vec(&UPSTREAM_RATE_LIMIT_LIMIT),
            rate_limit_remaining: gauge_vec(&UPSTREAM_RATE_LIMIT_REMAINING),
            retry_after: float_gauge_vec(&UPSTREAM_RETRY_AFTER),
            client_connections: gauge(&CLIENT_CONNECTIONS),
            client_connections_limit: gauge(&CLIENT_CONNECTIONS_LIMIT),
            client_connection_limit_reached: counter(&CLIENT_CONNECTION_LIMIT_REACHED),
            otlp_exports: counter_vec(&OTLP_EXPORTS),
            otlp_exports_dropped: counter_vec(&OTLP_EXPORTS_DROPPED),
            task_restarts: counter_vec(&TASK_RESTARTS),
            objective_requests: counter_vec(&OBJECTIVE_REQUESTS),
            objective_output_tokens: counter_vec(&OBJECTIVE_OUTPUT_TOKENS),
            objective_target: float_gauge_vec(&OBJECTIVE_TARGET),
            buffered_responses: counter_vec(&BUFFERED_RESPONSES),
            usage_detail_tokens: counter_vec(&USAGE_DETAIL_TOKENS),
            models: LabelSet::new(
                labels.model.clone(),
                label_overflow.with_label_values(&["model"]),
            ),
            tenants: LabelSet::new(
                labels.tenant.clone(),
                label_overflow.with_label_values(&["tenant"]),
            ),
            pair_cap: PairCap::new(
                labels.max_pairs,
                label_overflow.with_label_values(&["pair"]),
            ),
            last_render_bytes: AtomicUsize::new(0),
            names,
        };
        metrics.register(label_overflow);
        Arc::new(metrics)
    }
}

/// The per-pair families `names` exposes (and the GenAI ones when it keeps their sets),
/// sorted by name; each is per pair or per model as `labels.tenant.families` says.
fn pair_families(buckets: &Buckets, labels: &Labels, names: MetricNames) -> Vec<Family> {
    let level = |name: &str| {
        if labels.tenant_families.contains(name) {
            SetLevel::Pair
        } else {
            SetLevel::Model
        }
    };
    let mut families: Vec<Family> = PAIR_FAMILIES
        .iter()
        .filter(|spec| names.exposes(spec.name))
        .map(|spec| Family::new(spec, buckets, level(spec.name)))
        .collect();
    if names.gen_ai() {
        families.extend(
            GEN_AI_FAMILIES
                .iter()
                .map(|spec| Family::new(spec, buckets, SetLevel::GenAi)),
        );
    }
    families.sort_by_key(|f| f.name);
    families
}

/// Which storages a pair's set keeps: those of the families that carry `tenant`
/// (`labels.tenant.families`); a model's set keeps the others.
fn tenant_slots(labels: &Labels) -> TenantSlots {
    let mut tenant_slots = [false; Slot::COUNT];
    for spec in &PAIR_FAMILIES {
        tenant_slots[spec.slot as usize] = labels.tenant_families.contains(spec.name);
    }
    TenantSlots(tenant_slots)
}

/// Every histogram's bucket bounds (`metrics.buckets`) and the native histograms'
/// settings (`metrics.native_histograms`), both validated with the config.
fn histogram_bounds(buckets: &Buckets, native: &NativeHistograms) -> Bounds {
    Bounds {
        ttfb: bounds(&buckets.time_to_first_byte_seconds),
        ttft: bounds(&buckets.time_to_first_token_seconds),
        itl: bounds(&buckets.inter_token_latency_seconds),
        inter_chunk: bounds(&buckets.inter_chunk_latency_seconds),
        tpot: bounds(&buckets.time_per_output_token_seconds),
        tokens_per_second: bounds(&buckets.output_tokens_per_second),
        tokens_per_event: bounds(&buckets.output_tokens_per_event),
        duration: bounds(&buckets.request_duration_seconds),
        gen_ai: GenAiBounds::default(),
        native: native
            .enabled
            .then(|| NativeSettings::new(native.schema, native.max_buckets)),
    }
}

/// The target size of an [`Exposition`] chunk. A chunk ends after the pair whose lines
/// reach it, so it may exceed it by one pair's lines (and a family header): a few KiB.
pub const CHUNK_BYTES: usize = 48 << 10;

/// What a chunk's buffer starts with: room for the overshoot, and under glibc's 128 KiB
/// `M_MMAP_THRESHOLD`, so chunks come from (and go back to) the heap instead of each
/// mapping fresh pages that the kernel must fault in and zero.
const CHUNK_CAPACITY: usize = 64 << 10;

/// The `/metrics` text rendered a chunk at a time, so that a scrape with thousands of label
/// pairs never holds the whole text (150 MB with 10,000 pairs) and the worker that renders
/// it can serve other tasks between chunks.
///
/// Concatenated, the chunks are exactly [`Metrics::render`]'s text (which is built from the
/// same parts), from a snapshot of the label pairs taken when the exposition was created.
pub struct Exposition {
    metrics: Arc<Metrics>,
    /// `None` once the text is complete.
    render: Option<Render>,
}

/// One scrape's progress through the families: the small registry families (gathered
/// whole) and the per-pair ones (written a part at a time), merged in name order.
///
/// Values are read in name order, so a scrape is as consistent as the order of the
/// writes it reads: the recorder leaves `tokentap_streams_in_flight` before it counts
/// `tokentap_requests_total`, and the counter is read first, so no scrape sees one
/// request both counted and in flight. For that the registry is gathered again before
/// each run of its families that follows a per-pair family.
struct Render {
    /// The registry families not yet written. Once a per-pair family has been written
    /// since they were gathered, their names still say where they go, but their values
    /// are gathered again before the next one is written.
    small: Peekable<std::vec::IntoIter<proto::MetricFamily>>,
    small_stale: bool,
    pairs: Pairs,
    /// The next per-pair family and where its text stopped.
    family: usize,
    cursor: Cursor,
    writer: Writer,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use bytes::Bytes;

    use crate::outcome::Verdict;
    use tokentap_wire::Unobservable;

    /// Many label pairs over every kind of family (and one family with no series at all),
    /// with the process collector's lines left out: they change from one read to the next.
    fn populated() -> Arc<Metrics> {
        let metrics = Metrics::new(&Buckets::default(), &Labels::default());
        for m in 0..7u32 {
            for t in 0..9u32 {
                let (model, tenant) = (format!("model-{m}"), format!("tenant \"{t}\""));
                let stream = metrics.stream(Some(&model), Some(&tenant));
                stream.ttfb().observe(0.001 * f64::from(m * t));
                stream.ttft().observe(0.3);
                stream.observe_itl(Duration::from_millis(u64::from(t)), 3);
                stream.tokens_per_event().observe(f64::from(1 + t % 4));
                if (m + t) % 4 == 0 {
                    continue;
                }
                let decode = t % 2 == 0;
                let figures = RequestFigures {
                    duration: Duration::from_millis(u64::from(100 * m + t)),
                    output_tokens: 4,
                    input_tokens: None,
                    exact_event_tokens: u64::from(m % 2),
                    apportioned_event_tokens: u64::from(t % 3),
                    estimated_event_tokens: 4,
                    tpot: decode.then_some(Duration::from_millis(20)),
                    tokens_per_second: decode.then_some(50.0),
                    exemplar: None,
                };
                let verdict = Verdict::ALL[(m + t) as usize % Verdict::COUNT];
                metrics.record_request(&stream, verdict, figures);
                if m % 3 == 0 {
                    let ms = |n: u32| Duration::from_millis(u64::from(n));
                    let engine = EngineFigures {
                        queue: Some(ms(10 * t)),
                        prefill: (t % 2 == 1).then_some(ms(100 + m)),
                        ttft_outside_engine: Some(ms(t)),
                    };
                    metrics.record_engine_timings(&stream, engine);
                }
            }
        }
        metrics
    }

    fn without_process(text: &[u8]) -> String {
        String::from_utf8(text.to_vec())
            .expect("the exposition is UTF-8")
            .lines()
            .filter(|l| !l.starts_with("process_") && !l.contains(" process_"))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// The most a chunk may run past [`CHUNK_BYTES`]: the longest run of lines written
    /// after the last check of the size, i.e. a family header with the lines of one pair
    /// (per sub-label), or a whole small family.
    fn longest_step(metrics: &Metrics, text: &str) -> usize {
        let mut longest = 0;
        let (mut family, mut step, mut key) = ("", 0, String::new());
        for line in text.lines() {
            if let Some(name) = line
                .strip_prefix("# HELP ")
                .and_then(|l| l.split(' ').next())
            {
                (family, step, key) = (name, 0, String::new());
            } else if !line.starts_with('#') {
                let per_pair = metrics.families.iter().any(|f| f.name == family);
                // A pair's histogram lines differ only in the metric suffix and `le`.
                let labels = line
                    .split_once('{')
                    .and_then(|(_, rest)| rest.rsplit_once('}'))
                    .map_or("", |(labels, _)| labels);
                let this = if per_pair {
                    labels.split(",le=").next().unwrap_or_default().to_string()
                } else {
                    String::new()
                };
                if this != key && !key.is_empty() {
                    step = 0;
                }
                key = this;
            }
            step += line.len() + 1;
            longest = longest.max(step);
        }
        longest
    }

    #[test]
    fn chunks_concatenate_to_the_rendered_text_and_stay_near_their_size() {
        let metrics = populated();
        let whole = metrics.render();
        let chunks: Vec<Bytes> = metrics.exposition().collect();
        assert!(chunks.len() >= 5, "{} chunks", chunks.len());

        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let text = without_process(&whole);
        assert_eq!(without_process(&joined), text);
        assert!(
            !text.contains("tokentap_input_tokens_total"),
            "empty family"
        );
        for family in ["tokentap_requests_total", "tokentap_event_tokens_total"] {
            assert_eq!(text.matches(&format!("# TYPE {family} ")).count(), 1);
        }

        let step = longest_step(&metrics, &String::from_utf8_lossy(&whole));
        assert!(step < 8 << 10, "one pair's lines: {step} bytes");
        let (last, full) = chunks.split_last().expect("chunks");
        assert!(!last.is_empty() && last.len() < CHUNK_BYTES + step);
        for chunk in full {
            assert!(
                (CHUNK_BYTES..CHUNK_BYTES + step).contains(&chunk.len()),
                "{} bytes",
                chunk.len()
            );
        }
    }

    /// A request that ends while a scrape is under way (it leaves the in-flight gauge,
    /// then is counted) is never both counted and in flight in that scrape: the gauge is
    /// read after the counter was written, not when the scrape began.
    #[test]
    fn a_scrape_reads_the_in_flight_gauge_after_the_request_counter() {
        let mut labels = Labels::default();
        labels.model.max_values = Some(4000);
        labels.max_pairs = 4000;
        let metrics = Metrics::new(&Buckets::default(), &labels);
        // Enough models that the per-model families between the two span whole chunks.
        for m in 0..500 {
            let stream = metrics.stream(Some(&format!("model-{m}")), None);
            metrics.record_request(&stream, Verdict::ALL[0], RequestFigures::default());
        }
        metrics.streams_in_flight.set(1);
        let mut exposition = metrics.exposition();
        let mut text = String::new();
        let mut ended = false;
        for chunk in exposition.by_ref() {
            text.push_str(&String::from_utf8_lossy(&chunk));
            let counted = text.contains("# TYPE tokentap_requests_total ");
            if counted && !ended && !text.contains("# TYPE tokentap_streams_in_flight ") {
                // The request ends between two chunks: after the counter was written.
                metrics.streams_in_flight.dec();
                ended = true;
            }
        }
        assert!(ended, "no chunk ends between the counter and the gauge");
        assert!(
            text.contains("\ntokentap_streams_in_flight 0\n"),
            "the gauge as the scrape began: {}",
            text.lines()
                .find(|l| l.starts_with("tokentap_streams_in_flight"))
                .unwrap_or("none")
        );
    }

    /// Past `labels.max_pairs` a new pair's families that carry `tenant` go to (`other`,
    /// `other`), while its per-model families keep the model (bounded by the model cap);
    /// a request with no labels is `unknown` in both.
    #[test]
    fn the_pair_cap_folds_the_tenant_families_and_the_model_families_keep_the_model() {
        let labels = Labels {
            max_pairs: 2,
            ..Labels::default()
        };
        let metrics = Metrics::new(&Buckets::default(), &labels);
        for (model, tenant) in [(Some("a"), Some("x")), (None, None), (Some("b"), Some("y"))] {
            let stream = metrics.stream(model, tenant);
            metrics.record_request(&stream, Verdict::COMPLETED, RequestFigures::default());
        }
        let text = without_process(&metrics.render());
        for line in [
            r#"tokentap_requests_total{model="a",outcome="completed",status="2xx",tenant="x"} 1"#,
            r#"tokentap_requests_total{model="unknown",outcome="completed",status="2xx",tenant="unknown"} 1"#,
            r#"tokentap_requests_total{model="other",outcome="completed",status="2xx",tenant="other"} 1"#,
            r#"tokentap_time_to_first_token_seconds_count{model="other",tenant="other"} 0"#,
            r#"tokentap_request_duration_seconds_count{model="a"} 1"#,
            r#"tokentap_request_duration_seconds_count{model="b"} 1"#,
            r#"tokentap_request_duration_seconds_count{model="unknown"} 1"#,
            r#"tokentap_time_to_first_byte_seconds_count{model="b"} 0"#,
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line}\n{text}");
        }
        assert!(!text.contains(r#"tokentap_request_duration_seconds_count{model="other""#));
        assert!(!text.contains(r#"tokentap_time_to_first_byte_seconds_count{model="a",tenant"#));
        assert!(text.contains("tokentap_label_overflow_total{label=\"pair\"} 1\n"));
    }

    /// The family table is what a scrape shows: every family tokentap defines, with the
    /// table's type and label names, and nothing else (the process collector aside).
    #[test]
    fn the_family_table_is_what_the_exposition_shows() {
        let metrics = populated();
        let pair = metrics.stream(Some("m"), Some("t"));
        metrics.record_request(
            &pair,
            Verdict::COMPLETED,
            RequestFigures {
                input_tokens: Some(3),
                ..RequestFigures::default()
            },
        );
        metrics.unobserved(Unobservable::ContentType);
        metrics.decode_errors("openai_chat", 1);
        metrics.upstream_quota(&pair, "requests", Some(10), Some(9));
        metrics.upstream_retry_after(&pair, Duration::from_millis(1500));
        metrics.otlp_export("metrics", "success");
        metrics.otlp_export_dropped("metrics", "replaced");
        metrics.task_restart("otlp_metrics");
        metrics.count_objective(&pair, "chat", true, 3);
        metrics.set_objective_targets([("chat", 0.95)]);
        metrics.count_buffered(&pair);
        metrics.count_usage_detail(&pair, "cache_read_input", 2);
        let text = without_process(&metrics.render());

        let mut shown: BTreeMap<String, (String, BTreeSet<Vec<String>>)> = BTreeMap::new();
        let mut family = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                family = name.to_string();
                shown.insert(family.clone(), (kind.to_string(), BTreeSet::new()));
            } else if !line.starts_with('#') {
                let labels = line
                    .split_once('{')
                    .and_then(|(_, rest)| rest.rsplit_once('}'))
                    .map_or("", |(labels, _)| labels);
                let names = labels
                    .split(',')
                    .filter_map(|l| l.split_once('=').map(|(name, _)| name.to_string()))
                    .filter(|name| name != "le")
                    .collect();
                let (_, label_sets) = shown.get_mut(&family).expect("after its # TYPE");
                label_sets.insert(names);
            }
        }
        let table: BTreeMap<String, (String, BTreeSet<Vec<String>>)> = families::contract()
            .map(|(name, kind, labels)| {
                let labels = labels.iter().map(|l| l.to_string()).collect();
                (
                    name.to_string(),
                    (kind.to_string(), BTreeSet::from([labels])),
                )
            })
            .collect();
        assert_eq!(shown, table);
    }

    const TRACE: TraceContext = TraceContext {
        trace_id: [0xab; 16],
        span_id: [0x01; 8],
    };

    /// A traced request's figures on pair (`m`, `t`) recorded at a known wall-clock time.
    fn traced(metrics: &Metrics, ttft: f64, itl: Duration) -> SystemTime {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_733_100_000_123);
        let pair = metrics.stream(Some("m"), Some("t"));
        pair.ttft().observe(ttft);
        pair.observe_itl(itl, 2);
        metrics.record_request(
            &pair,
            Verdict::COMPLETED,
            RequestFigures {
                duration: Duration::from_millis(700),
                output_tokens: 3,
                tpot: Some(itl),
                tokens_per_second: Some(40.0),
                exemplar: Some(RequestExemplar {
                    trace: TRACE,
                    at,
                    ttft: Duration::try_from_secs_f64(ttft).ok(),
                    slowest_itl: Some(itl),
                }),
                ..RequestFigures::default()
            },
        );
        at
    }

    /// The OpenMetrics text is the Prometheus text with OpenMetrics' headers and `le`
    /// spellings, the bucket exemplars, and `# EOF`; streamed, its chunks add up to it.
    #[test]
    fn openmetrics_is_the_text_with_its_headers_exemplars_and_eof() {
        let metrics = populated();
        metrics.decode_errors("openai_chat", 1);
        metrics.unobserved(Unobservable::ContentType);
        traced(&metrics, 0.093, Duration::from_millis(21));
        let openmetrics = without_process(&metrics.render_openmetrics());
        let text = without_process(&metrics.render());
        assert!(openmetrics.ends_with("\n# EOF\n"));
        assert_eq!(openmetrics.matches("# EOF").count(), 1);

        let chunks: Vec<u8> = metrics
            .openmetrics_exposition()
            .flat_map(|chunk| chunk.to_vec())
            .collect();
        assert_eq!(without_process(&chunks), openmetrics);

        let expected: String = text
            .lines()
            .map(|line| {
                let mut line = line.to_string();
                if let Some(rest) = line.strip_prefix("# TYPE ") {
                    if let Some(name) = rest.strip_suffix("_total counter") {
                        line = format!("# TYPE {name} counter");
                    }
                } else if let Some(rest) = line.strip_prefix("# HELP ") {
                    let (name, help) = rest.split_once(' ').expect("# HELP name text");
                    let name = name.strip_suffix("_total").unwrap_or(name);
                    line = format!("# HELP {name} {}", help.replace('"', "\\\""));
                } else if let Some((head, rest)) = line.split_once(",le=\"") {
                    let (le, tail) = rest.split_once('"').expect("le closes");
                    let canonical = match le {
                        "+Inf" => le.to_string(),
                        le => text::openmetrics_le(le.parse().expect("a bound")),
                    };
                    line = format!("{head},le=\"{canonical}\"{tail}");
                }
                line + "\n"
            })
            .collect::<String>()
            + "# EOF\n";
        let without_exemplars: String = openmetrics
            .lines()
            .map(|line| line.split(" # {").next().unwrap_or(line).to_string() + "\n")
            .collect();
        assert_eq!(without_exemplars, expected);
        assert!(openmetrics.contains("# TYPE tokentap_requests counter\n"));
        assert!(openmetrics.contains("le=\"1.0\"} "));
        assert!(
            text.contains("le=\"1\"} "),
            "the Prometheus text is unchanged"
        );

        let trace = format!(
            "trace_id=\"{}\",span_id=\"{}\"",
            "ab".repeat(16),
            "01".repeat(8)
        );
        let exemplar_lines: Vec<&str> =
            openmetrics.lines().filter(|l| l.contains(" # {")).collect();
        assert!(
            !text.contains(" # {"),
            "no exemplars in the Prometheus text"
        );
        for (family, le, value) in [
            ("tokentap_time_to_first_token_seconds", "0.1", "0.093"),
            ("tokentap_inter_token_latency_seconds", "0.025", "0.021"),
            ("tokentap_time_per_output_token_seconds", "0.025", "0.021"),
            ("tokentap_request_duration_seconds", "1.0", "0.7"),
        ] {
            // TPOT and duration are per model by default (`labels.tenant.families`).
            let tenant = if tenant_by_default().any(|f| f == family) {
                ",tenant=\"t\""
            } else {
                ""
            };
            let line = format!("{family}_bucket{{model=\"m\"{tenant},le=\"{le}\"}}");
            let found: Vec<&&str> = exemplar_lines
                .iter()
                .filter(|l| l.starts_with(&line))
                .collect();
            assert_eq!(found.len(), 1, "{family}: {exemplar_lines:#?}");
            assert!(
                found[0].ends_with(&format!(" # {{{trace}}} {value} 1733100000.123")),
                "{}",
                found[0]
            );
        }
        assert_eq!(exemplar_lines.len(), 4, "one per traced histogram");
    }

    /// The protobuf body carries the same exemplars: classic buckets' and the native list.
    #[test]
    fn protobuf_carries_the_exemplars() {
        use prost::Message;
        let metrics = populated();
        let at = traced(&metrics, 0.093, Duration::from_millis(21));
        let mut body = &metrics.protobuf()[..];
        let mut found = 0;
        while !body.is_empty() {
            let family =
                protobuf::MetricFamily::decode_length_delimited(&mut body).expect("a family");
            for metric in &family.metric {
                let Some(h) = &metric.histogram else { continue };
                let labels: Vec<(&str, &str)> =
                    metric.label.iter().map(|l| (l.name(), l.value())).collect();
                // The traced request's series: its pair's, or its model's for a family
                // that is per model by default (TPOT, duration).
                let traced_pair = if tenant_by_default().any(|f| f == family.name()) {
                    labels == [("model", "m"), ("tenant", "t")]
                } else {
                    labels == [("model", "m")]
                };
                let bucket_exemplars: Vec<&protobuf::Exemplar> = h
                    .bucket
                    .iter()
                    .filter_map(|b| b.exemplar.as_ref())
                    .collect();
                if !traced_pair {
                    assert!(bucket_exemplars.is_empty() && h.exemplars.is_empty());
                    continue;
                }
                let expected = match family.name() {
                    "tokentap_time_to_first_token_seconds" => 0.093,
                    "tokentap_inter_token_latency_seconds" => 0.021,
                    "tokentap_time_per_output_token_seconds" => 0.021,
                    "tokentap_request_duration_seconds" => 0.7,
                    _ => {
                        assert!(bucket_exemplars.is_empty() && h.exemplars.is_empty());
                        continue;
                    }
                };
                found += 1;
                assert_eq!(bucket_exemplars.len(), 1, "{}", family.name());
                assert_eq!(h.exemplars.len(), 1, "{}", family.name());
                for exemplar in [bucket_exemplars[0], &h.exemplars[0]] {
                    assert_eq!(exemplar.value, Some(expected));
                    let labels: Vec<(&str, &str)> = exemplar
                        .label
                        .iter()
                        .map(|l| (l.name(), l.value()))
                        .collect();
                    let (trace, span) = (TRACE.trace_id_hex(), TRACE.span_id_hex());
                    assert_eq!(labels, [("trace_id", &*trace), ("span_id", &*span)]);
                    let since = at.duration_since(SystemTime::UNIX_EPOCH).expect("after");
                    let ts = exemplar.timestamp.as_ref().expect("timestamp");
                    assert_eq!(
                        (ts.seconds as u64, ts.nanos as u32),
                        (since.as_secs(), since.subsec_nanos())
                    );
                }
                let bucket = h.bucket.iter().find(|b| b.exemplar.is_some()).expect("one");
                let upper = bucket.upper_bound();
                let lower = h
                    .bucket
                    .iter()
                    .map(|b| b.upper_bound())
                    .filter(|b| *b < upper)
                    .fold(0.0, f64::max);
                assert!(
                    lower < expected && expected <= upper,
                    "{lower} < {expected} <= {upper}"
                );
            }
        }
        assert_eq!(found, 4);
    }

    /// A request without a trace context leaves no exemplar; a later traced one replaces
    /// the bucket's earlier exemplar.
    #[test]
    fn untraced_requests_leave_none_and_the_latest_exemplar_wins() {
        let metrics = populated();
        assert!(!String::from_utf8_lossy(&metrics.render_openmetrics()).contains(" # {"));
        traced(&metrics, 0.093, Duration::from_millis(21));
        traced(&metrics, 0.094, Duration::from_millis(22));
        let text = String::from_utf8(metrics.render_openmetrics()).expect("UTF-8");
        let ttft: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("tokentap_time_to_first_token_seconds_bucket") && l.contains(" # {")
            })
            .collect();
        assert_eq!(ttft.len(), 1, "{ttft:?}");
        assert!(ttft[0].contains("} 0.094 "), "{}", ttft[0]);
    }
}
