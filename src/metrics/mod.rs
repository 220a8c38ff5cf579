//! The metric contract (docs/ARCHITECTURE.md, "The metric contract"): families built once
//! from an explicit registry, and per-pair handles resolved once per request so the token
//! path only touches atomics.
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
pub mod protobuf;
mod series;
mod settings;
pub mod snapshot;
mod text;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::iter::Peekable;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use prometheus::core::Collector;
use prometheus::proto;
use prometheus::{
    Encoder, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::outcome::{Outcome, Verdict};
use crate::wire::Unobservable;
use exemplar::{Exemplar, TraceContext};
use exposition::{
    registry_family_openmetrics, Cursor, Family, Level, Pairs, SetLevel, TextFormat, Writer,
};
pub use families::{process_wide, tenant_by_default, tenant_capable};
use families::{
    RegistryFamily, RegistryKind, BUFFERED_RESPONSES, BUILD_INFO, CLIENT_CONNECTIONS,
    CLIENT_CONNECTIONS_LIMIT, CLIENT_CONNECTION_LIMIT_REACHED, DECODE_ERRORS, GEN_AI_FAMILIES,
    LABEL_OVERFLOW, OBJECTIVE_OUTPUT_TOKENS, OBJECTIVE_REQUESTS, OBJECTIVE_TARGET, OTLP_EXPORTS,
    OTLP_EXPORTS_DROPPED, OVERLOAD_REJECTIONS, PAIR_FAMILIES, PASSTHROUGH, STREAMS_IN_FLIGHT,
    TASK_RESTARTS, UNOBSERVED, UPSTREAM_RATE_LIMIT_LIMIT, UPSTREAM_RATE_LIMIT_REMAINING,
    UPSTREAM_RETRY_AFTER, UPSTREAM_UP, USAGE_DETAIL_TOKENS,
};
pub use gen_ai::MetricNames;
use gen_ai::{GenAiBounds, GenAiKey};
use labels::{LabelSet, PairCap};
use native::NativeSettings;
use series::{Bounds, Slot, TenantSlots};
pub use series::{Counter, GenAiSeries, Histogram, SeriesSet, StreamSeries};
pub use settings::{Buckets, LabelPolicy, Labels, NativeHistograms};
pub use snapshot::Snapshot;
use snapshot::{FamilySnapshot, Label, Series, Values};

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

/// A family gathered from the prometheus registry, as snapshot values.
fn registry_snapshot(family: &proto::MetricFamily) -> Option<FamilySnapshot> {
    let series = |value: fn(&proto::Metric) -> f64| -> Vec<Series<f64>> {
        family
            .get_metric()
            .iter()
            .map(|metric| Series {
                labels: metric
                    .get_label()
                    .iter()
                    .map(|label| Label {
                        name: Cow::Owned(label.name().to_string()),
                        value: Arc::from(label.value()),
                    })
                    .collect(),
                value: value(metric),
            })
            .collect()
    };
    let values = match family.get_field_type() {
        proto::MetricType::COUNTER => Values::Counter(series(|m| m.get_counter().get_value())),
        proto::MetricType::GAUGE => Values::Gauge(series(|m| m.get_gauge().get_value())),
        // Counters and gauges are all the registry holds (tokentap's small families and
        // the process collector's); the snapshot test compares every family with the
        // text, so one of another type would show there.
        _ => return None,
    };
    Some(FamilySnapshot {
        name: Cow::Owned(family.name().to_string()),
        help: Cow::Owned(family.help().to_string()),
        values,
    })
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
        let per_pair = |name: &str| labels.tenant_families.contains(name);
        let level = |name: &str| {
            if per_pair(name) {
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
        let mut tenant_slots = [false; Slot::COUNT];
        for spec in &PAIR_FAMILIES {
            tenant_slots[spec.slot as usize] = per_pair(spec.name);
        }
        let bounds = Bounds {
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
        };

        let label_overflow = counter_vec(&LABEL_OVERFLOW);
        let build_info = gauge_vec(&BUILD_INFO);
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let metrics = Metrics {
            registry: Registry::new(),
            process: Registry::new(),
            bounds,
            protobuf_classic: native.classic,
            sets: RwLock::new(Sets::default()),
            tenant_slots: TenantSlots(tenant_slots),
            families,
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

        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(metrics.streams_in_flight.clone()),
            Box::new(metrics.upstream_up.clone()),
            Box::new(metrics.unobserved.clone()),
            Box::new(metrics.decode_errors.clone()),
            Box::new(metrics.passthrough.clone()),
            Box::new(metrics.overload_rejections.clone()),
            Box::new(metrics.client_connections.clone()),
            Box::new(metrics.client_connections_limit.clone()),
            Box::new(metrics.client_connection_limit_reached.clone()),
            Box::new(metrics.otlp_exports.clone()),
            Box::new(metrics.otlp_exports_dropped.clone()),
            Box::new(metrics.task_restarts.clone()),
            Box::new(metrics.objective_requests.clone()),
            Box::new(metrics.objective_output_tokens.clone()),
            Box::new(metrics.objective_target.clone()),
            Box::new(metrics.buffered_responses.clone()),
            Box::new(metrics.usage_detail_tokens.clone()),
            Box::new(label_overflow),
            Box::new(metrics.rate_limit_limit.clone()),
            Box::new(metrics.rate_limit_remaining.clone()),
            Box::new(metrics.retry_after.clone()),
            Box::new(build_info),
        ];
        for collector in collectors {
            defined(metrics.registry.register(collector));
        }
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            // Best effort: a sandbox without /proc still serves tokentap's own metrics.
            let _ = metrics.process.register(Box::new(process));
        }
        Arc::new(metrics)
    }

    /// The series of one request, resolved through the label policies: the handles its
    /// per-event path observes through, its (model, tenant) pair's set and its model's.
    /// Both exist from here on (TTFB, TTFT, ITL, inter-chunk and stalls series even if
    /// never observed).
    pub fn stream(&self, model: Option<&str>, tenant: Option<&str>) -> StreamSeries {
        let model = self.models.resolve(model);
        let tenant = self.tenants.resolve(tenant);
        self.pair(model, tenant)
    }

    /// The `model` label of a request's model, through the label policy, as
    /// [`Metrics::stream`] resolves it: for a caller that needs the label before the
    /// series (the live view's list of requests in flight). Resolving counts an overflow,
    /// so a label resolved here goes to [`Metrics::stream_of`], not through `stream` again.
    pub fn model_label(&self, model: Option<&str>) -> Arc<str> {
        self.models.resolve(model)
    }

    /// [`Metrics::model_label`] of a `model` too long to be read: `other`, counted in
    /// `tokentap_label_overflow_total{label="model"}`.
    pub fn model_label_too_long(&self) -> Arc<str> {
        self.models.resolve_too_long()
    }

    /// The `tenant` label of a request's tenant, as [`Metrics::model_label`] for models.
    pub fn tenant_label(&self, tenant: Option<&str>) -> Arc<str> {
        self.tenants.resolve(tenant)
    }

    /// [`Metrics::stream`] of labels already resolved ([`Metrics::model_label`],
    /// [`Metrics::tenant_label`]).
    pub fn stream_of(&self, model: Arc<str>, tenant: Arc<str>) -> StreamSeries {
        self.pair(model, tenant)
    }

    /// The sets of a pair of (already resolved) label values, created on first use. The
    /// pair cap bounds the pairs only: a pair past it is (`other`, `other`), while the
    /// per-model families keep the request's model (the model cap bounds those).
    fn pair(&self, model: Arc<str>, tenant: Arc<str>) -> StreamSeries {
        {
            let sets = self.read_sets();
            let pair = sets.pairs.get(&*model).and_then(|t| t.get(&*tenant));
            if let (Some(pair), Some(of_model)) = (pair, sets.models.get(&*model)) {
                return StreamSeries {
                    pair: pair.clone(),
                    model: of_model.clone(),
                    gen_ai: None,
                };
            }
        }
        let mut sets = self
            .sets
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Sets { pairs, models, .. } = &mut *sets;
        let of_model = models
            .entry(model.clone())
            .or_insert_with(|| {
                Arc::new(SeriesSet::new(
                    model.clone(),
                    None,
                    &self.bounds,
                    self.tenant_slots,
                ))
            })
            .clone();
        if let Some(pair) = pairs.get(&*model).and_then(|t| t.get(&*tenant)) {
            return StreamSeries {
                pair: pair.clone(),
                model: of_model,
                gen_ai: None,
            };
        }
        let (model, tenant) = if self.pair_cap.admit() {
            (model, tenant)
        } else {
            (Arc::from(labels::OTHER), Arc::from(labels::OTHER))
        };
        let pair = pairs
            .entry(model.clone())
            .or_default()
            .entry(tenant.clone())
            .or_insert_with(|| {
                Arc::new(SeriesSet::new(
                    model,
                    Some(tenant),
                    &self.bounds,
                    self.tenant_slots,
                ))
            })
            .clone();
        StreamSeries {
            pair,
            model: of_model,
            gen_ai: None,
        }
    }

    /// Give `stream` its GenAI sets for requests of `operation` to `provider` (names
    /// from `wire::gen_ai`), when `metrics.names` exposes the GenAI families; `streaming`:
    /// the request asked for a stream (or did not say). The model is the request's
    /// per-model label (the pair cap does not fold it).
    pub fn attach_gen_ai(
        &self,
        stream: &mut StreamSeries,
        operation: &'static str,
        provider: &'static str,
        streaming: bool,
    ) {
        if !self.names.gen_ai() {
            return;
        }
        let key = |token_type| GenAiKey {
            error_type: None,
            operation,
            provider,
            model: stream.model.model.clone(),
            token_type,
        };
        stream.gen_ai = Some(GenAiSeries {
            ok: self.gen_ai_set(key(None), series::OK_SLOTS),
            input: self.gen_ai_set(key(Some("input")), series::TOKEN_SLOTS),
            output: self.gen_ai_set(key(Some("output")), series::TOKEN_SLOTS),
            streaming,
        });
    }

    /// The GenAI set of `key`, created (with the storage of `slots`) on first use.
    fn gen_ai_set(&self, key: GenAiKey, slots: &[Slot]) -> Arc<SeriesSet> {
        if let Some(set) = self.read_sets().gen_ai.get(&key) {
            return set.clone();
        }
        let mut sets = self
            .sets
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        sets.gen_ai
            .entry(key.clone())
            .or_insert_with(|| Arc::new(SeriesSet::gen_ai(key, slots, &self.bounds)))
            .clone()
    }

    /// Record a finished request's GenAI figures, once, with [`Metrics::record_request`]
    /// (nothing unless [`Metrics::attach_gen_ai`] gave `stream` its sets): TTFT and TPOT
    /// of a successful request, the duration under the request's `error.type` (none when
    /// it completed), and the tokens counted.
    pub fn record_gen_ai(
        &self,
        stream: &StreamSeries,
        verdict: Verdict,
        ttft: Option<Duration>,
        figures: &RequestFigures,
    ) {
        let Some(gen_ai) = &stream.gen_ai else {
            return;
        };
        let exemplar = |value: Duration| {
            figures
                .exemplar
                .map(|e| Exemplar::new(e.trace, value.as_secs_f64(), e.at))
        };
        let observe = |histogram: Option<&Histogram>, value: Duration| {
            if let Some(histogram) = histogram {
                histogram.observe(value.as_secs_f64());
                if let Some(exemplar) = exemplar(value) {
                    histogram.exemplar(exemplar);
                }
            }
        };
        let completed = verdict.outcome == Outcome::Completed;
        if completed {
            if let Some(ttft) = ttft {
                observe(gen_ai.ok.ttft.as_deref(), ttft);
            }
            if let Some(tpot) = figures.tpot {
                observe(gen_ai.ok.tpot.as_deref(), tpot);
            }
            observe(gen_ai.ok.duration.as_deref(), figures.duration);
        } else if let Some(ok) = gen_ai.ok.gen_ai.clone() {
            // (A GenAI set always has its key.)
            let key = GenAiKey {
                error_type: Some(verdict.outcome.as_str()),
                ..ok
            };
            let failed = self.gen_ai_set(key, series::ERROR_SLOTS);
            observe(failed.duration.as_deref(), figures.duration);
        }
        if let (Some(input), Some(usage)) = (figures.input_tokens, &gen_ai.input.token_usage) {
            usage.observe(input as f64);
        }
        if figures.output_tokens > 0 {
            if let Some(usage) = &gen_ai.output.token_usage {
                usage.observe(figures.output_tokens as f64);
            }
        }
    }

    fn read_sets(&self) -> RwLockReadGuard<'_, Sets> {
        self.sets
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every set, in label order, taken under the lock once per scrape; the encoding
    /// then runs without it.
    fn pairs(&self) -> Pairs {
        let sets = self.read_sets();
        let mut series = Vec::with_capacity(sets.pairs.values().map(BTreeMap::len).sum());
        let mut models = Vec::with_capacity(sets.pairs.len());
        for tenants in sets.pairs.values() {
            let start = series.len();
            series.extend(tenants.values().cloned());
            models.push(start..series.len());
        }
        let pairs = Level { series, models };
        let one_each = |series: Vec<Arc<SeriesSet>>| {
            let models = (0..series.len()).map(|i| i..i + 1).collect();
            Level { series, models }
        };
        Pairs {
            pairs,
            models: one_each(sets.models.values().cloned().collect()),
            gen_ai: one_each(sets.gen_ai.values().cloned().collect()),
        }
    }

    /// Apply new label policies (config reload). Which families carry `tenant` is fixed
    /// when the families are built: `labels.tenant.families` takes effect at a restart.
    pub fn set_label_policies(&self, labels: &Labels) {
        self.models.set_policy(labels.model.clone());
        self.tenants.set_policy(labels.tenant.clone());
        self.pair_cap.set_max(labels.max_pairs);
    }

    /// Count a response that is forwarded but not measured.
    pub fn unobserved(&self, reason: Unobservable) {
        self.unobserved.with_label_values(&[reason.as_str()]).inc();
    }

    /// Count skipped (undecodable) events of a dialect.
    pub fn decode_errors(&self, dialect: &str, count: u64) {
        if count > 0 {
            self.decode_errors
                .with_label_values(&[dialect])
                .inc_by(count);
        }
    }

    /// Count a request refused by the in-flight limit.
    pub fn overload_rejection(&self) {
        self.overload_rejections.inc();
    }

    /// Count a time the proxy port stopped accepting at `limits.max_connections`.
    pub fn client_connection_limit_reached(&self) {
        self.client_connection_limit_reached.inc();
    }

    /// Count a finished OTLP export of `signal` (`metrics`, ...): `success` or `failed`.
    pub fn otlp_export(&self, signal: &str, result: &str) {
        self.otlp_exports.with_label_values(&[result, signal]).inc();
    }

    /// Count an OTLP export of `signal` never sent, and why (`replaced`, `shutdown`).
    pub fn otlp_export_dropped(&self, signal: &str, reason: &str) {
        self.otlp_exports_dropped
            .with_label_values(&[reason, signal])
            .inc();
    }

    /// The counter of OTLP exports of `signal` never sent for `reason`, to count without
    /// a label lookup (the span queue's drops, in the request path).
    pub fn otlp_export_dropped_counter(&self, signal: &str, reason: &str) -> IntCounter {
        self.otlp_exports_dropped
            .with_label_values(&[reason, signal])
    }

    /// Count a background task (`supervise`'s name for it) that failed and is restarted.
    pub fn task_restart(&self, task: &str) {
        self.task_restarts.with_label_values(&[task]).inc();
    }

    /// Count a request of `stream` judged against `objective`: met or missed, with its
    /// output tokens.
    pub fn count_objective(
        &self,
        stream: &StreamSeries,
        objective: &str,
        met: bool,
        output_tokens: u64,
    ) {
        let result = if met { "met" } else { "missed" };
        // In the family's label order (the registry writes label names sorted).
        let labels = [&**stream.model(), objective, result, &**stream.tenant()];
        self.objective_requests.with_label_values(&labels).inc();
        if output_tokens > 0 {
            self.objective_output_tokens
                .with_label_values(&labels)
                .inc_by(output_tokens);
        }
    }

    /// Each objective's target, replacing those set before (at start and on reload: an
    /// objective no longer configured leaves `tokentap_objective_target`).
    pub fn set_objective_targets<'a>(&self, targets: impl IntoIterator<Item = (&'a str, f64)>) {
        self.objective_target.reset();
        for (objective, target) in targets {
            self.objective_target
                .with_label_values(&[objective])
                .set(target);
        }
    }

    /// Count a response of `stream`'s model that arrived in one burst.
    pub fn count_buffered(&self, stream: &StreamSeries) {
        self.buffered_responses
            .with_label_values(&[&**stream.model()])
            .inc();
    }

    /// Count `tokens` of a usage part (`kind`: `cache_read_input`, `cache_write_input`,
    /// `reasoning_output`) of a request of `stream`.
    pub fn count_usage_detail(&self, stream: &StreamSeries, kind: &str, tokens: u64) {
        self.usage_detail_tokens
            .with_label_values(&[kind, &**stream.model(), &**stream.tenant()])
            .inc_by(tokens);
    }

    /// Count a request on a non-LLM route.
    pub fn passthrough(&self) {
        self.passthrough.inc();
    }

    /// The latest quota an upstream reported for `stream`'s model: `resource`'s `limit`
    /// and what `remaining` of it (each only where reported). A value past `i64::MAX`
    /// shows as `i64::MAX`.
    pub fn upstream_quota(
        &self,
        stream: &StreamSeries,
        resource: &str,
        limit: Option<u64>,
        remaining: Option<u64>,
    ) {
        let labels = [&**stream.model(), resource];
        let set = |gauges: &IntGaugeVec, n: u64| {
            gauges
                .with_label_values(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        if let Some(n) = limit {
            set(&self.rate_limit_limit, n);
        }
        if let Some(n) = remaining {
            set(&self.rate_limit_remaining, n);
        }
    }

    /// The latest wait an upstream asked a refused client of `stream`'s model for.
    pub fn upstream_retry_after(&self, stream: &StreamSeries, wait: Duration) {
        self.retry_after
            .with_label_values(&[&**stream.model()])
            .set(wait.as_secs_f64());
    }

    /// Count a request tokentap answered itself before it was measured (refused at
    /// admission, or a head it could not read): the counter only, no figures.
    pub fn count_request(&self, stream: &StreamSeries, verdict: Verdict) {
        stream.requests(verdict).inc();
    }

    /// Record the per-request figures of a finished request on its series (exactly once
    /// per request).
    pub fn record_request(&self, stream: &StreamSeries, verdict: Verdict, figures: RequestFigures) {
        stream.requests(verdict).inc();
        stream.duration().observe(figures.duration.as_secs_f64());
        if figures.output_tokens > 0 {
            stream.output_tokens().inc_by(figures.output_tokens);
        }
        if let Some(input) = figures.input_tokens.filter(|n| *n > 0) {
            stream.input_tokens().inc_by(input);
        }
        // Indexed like `series::ACCURACY`.
        for (counter, count) in stream.event_tokens().iter().zip([
            figures.apportioned_event_tokens,
            figures.estimated_event_tokens,
            figures.exact_event_tokens,
        ]) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        if let Some(tpot) = figures.tpot {
            stream.tpot().observe(tpot.as_secs_f64());
        }
        if let Some(tokens_per_second) = figures.tokens_per_second {
            stream.tokens_per_second().observe(tokens_per_second);
        }
        if let Some(exemplar) = figures.exemplar {
            let of =
                |value: Duration| Exemplar::new(exemplar.trace, value.as_secs_f64(), exemplar.at);
            stream.duration().exemplar(of(figures.duration));
            if let Some(ttft) = exemplar.ttft {
                stream.ttft().exemplar(of(ttft));
            }
            if let Some(itl) = exemplar.slowest_itl {
                stream.itl().exemplar(of(itl));
            }
            if let Some(tpot) = figures.tpot {
                stream.tpot().exemplar(of(tpot));
            }
        }
    }

    /// Record what the engine reported of a finished request's time, each figure only
    /// where it was reported (once per request, with [`Metrics::record_request`]).
    pub fn record_engine_timings(&self, stream: &StreamSeries, figures: EngineFigures) {
        if let Some(queue) = figures.queue {
            stream.engine_queue().observe(queue.as_secs_f64());
        }
        if let Some(prefill) = figures.prefill {
            stream.engine_prefill().observe(prefill.as_secs_f64());
        }
        if let Some(outside) = figures.ttft_outside_engine {
            stream.ttft_outside_engine().observe(outside.as_secs_f64());
        }
    }

    /// The Prometheus text exposition of every family, sorted by family name, in one
    /// buffer (tests, the demo's summary, benches). `/metrics` streams the same text as
    /// [`Metrics::exposition`] chunks instead.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.render_into(&mut out);
        out
    }

    /// [`Metrics::render`], appended to `out`.
    pub fn render_into(&self, out: &mut Vec<u8>) {
        self.render_format_into(out, TextFormat::Prometheus);
    }

    /// The OpenMetrics text exposition (1.0.0) of every family, in one buffer: the
    /// families of [`Metrics::render`] with OpenMetrics' headers, the histograms' bucket
    /// exemplars, and `# EOF`. `/metrics` streams it as
    /// [`Metrics::openmetrics_exposition`] chunks instead.
    pub fn render_openmetrics(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.render_format_into(&mut out, TextFormat::OpenMetrics);
        out
    }

    fn render_format_into(&self, out: &mut Vec<u8>, format: TextFormat) {
        let mut render = Render::new(self, format);
        // One allocation: with many label pairs the text is megabytes, and growing a
        // buffer would copy it over and over.
        let level = |sets: &[Arc<SeriesSet>]| {
            let label_bytes: usize = sets.iter().map(|p| p.labels().len()).sum();
            (sets.len(), label_bytes)
        };
        let estimate: usize = self
            .families
            .iter()
            .map(|f| {
                let (sets, label_bytes) = level(&render.pairs.level(f.level).series);
                f.estimate(sets, label_bytes)
            })
            .sum();
        let previous = self.last_render_bytes.load(Ordering::Relaxed);
        out.reserve(estimate.max(previous + (previous >> 4)) + (64 << 10));
        let start = out.len();
        render.fill(self, out, usize::MAX);
        self.last_render_bytes
            .store(out.len() - start, Ordering::Relaxed);
    }

    /// The text of [`Metrics::render`] as `Bytes` chunks of about [`CHUNK_BYTES`], each
    /// rendered only when it is asked for (what `/metrics` serves). The pairs are listed
    /// once, here; their values are read as each chunk is rendered.
    pub fn exposition(self: &Arc<Self>) -> Exposition {
        Exposition {
            render: Some(Render::new(self, TextFormat::Prometheus)),
            metrics: self.clone(),
        }
    }

    /// The text of [`Metrics::render_openmetrics`] as chunks, like [`Metrics::exposition`].
    pub fn openmetrics_exposition(self: &Arc<Self>) -> Exposition {
        Exposition {
            render: Some(Render::new(self, TextFormat::OpenMetrics)),
            metrics: self.clone(),
        }
    }

    /// Every family's series as they are now, typed: the same families, series and
    /// order as [`Metrics::render`]'s text.
    pub fn snapshot(&self) -> Snapshot {
        let pairs = self.pairs();
        // The per-pair counters are read before the registry's gauges, for the reason
        // `Render` gives: no request is both counted and in flight.
        let mut families: Vec<FamilySnapshot> = self
            .families
            .iter()
            .filter_map(|f| f.snapshot(&pairs))
            .collect();
        let small = self
            .process
            .gather()
            .into_iter()
            .chain(self.registry.gather());
        families.extend(small.filter_map(|mf| registry_snapshot(&mf)));
        families.sort_by(|a, b| a.name.cmp(&b.name));
        Snapshot { families }
    }

    /// The per-pair and per-model families called `names` (those with series), as
    /// [`Metrics::snapshot`] reads them, and nothing else: what the live view's ticker
    /// reads each second, without the registry's families or the process collector.
    pub fn snapshot_of(&self, names: &[&str]) -> Snapshot {
        let pairs = self.pairs();
        let mut families: Vec<FamilySnapshot> = self
            .families
            .iter()
            .filter(|f| names.contains(&f.name))
            .filter_map(|f| f.snapshot(&pairs))
            .collect();
        families.sort_by(|a, b| a.name.cmp(&b.name));
        Snapshot { families }
    }

    /// The Prometheus protobuf exposition of [`Metrics::snapshot`] (see [`protobuf`]):
    /// histograms with their native buckets, and their classic ones unless
    /// `metrics.native_histograms.classic` is false. Built whole: per series it is a
    /// fraction of the text's size.
    pub fn protobuf(&self) -> Vec<u8> {
        protobuf::encode(&self.snapshot(), self.protobuf_classic)
    }

    /// The small families of both registries, sorted by name.
    fn small_families(&self) -> Vec<proto::MetricFamily> {
        let mut families = self.process.gather();
        families.extend(self.registry.gather());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        families
    }

    /// Distinct `model` and `tenant` values admitted so far.
    pub fn admitted_labels(&self) -> (usize, usize) {
        (self.models.admitted(), self.tenants.admitted())
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

impl Exposition {
    /// The next chunk, or `None` at the end of the text (never an empty chunk).
    pub fn next_chunk(&mut self) -> Option<Bytes> {
        let render = self.render.as_mut()?;
        let mut out = Vec::with_capacity(CHUNK_CAPACITY);
        if render.fill(&self.metrics, &mut out, CHUNK_BYTES) {
            self.render = None;
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// Whether every chunk has been returned.
    pub fn is_complete(&self) -> bool {
        self.render.is_none()
    }
}

impl Iterator for Exposition {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        self.next_chunk()
    }
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

impl Render {
    fn new(metrics: &Metrics, format: TextFormat) -> Render {
        Render {
            small: metrics.small_families().into_iter().peekable(),
            small_stale: false,
            pairs: metrics.pairs(),
            family: 0,
            cursor: Cursor::default(),
            writer: Writer::new(format),
        }
    }

    /// Append text to `out` until it holds `limit` bytes or more (see
    /// [`Family::render_part`]) or the exposition is complete; true if it is (the
    /// OpenMetrics text then ends with its `# EOF`).
    fn fill(&mut self, metrics: &Metrics, out: &mut Vec<u8>, limit: usize) -> bool {
        let complete = self.fill_families(metrics, out, limit);
        if complete && self.writer.format == TextFormat::OpenMetrics {
            out.extend_from_slice(b"# EOF\n");
        }
        complete
    }

    fn fill_families(&mut self, metrics: &Metrics, out: &mut Vec<u8>, limit: usize) -> bool {
        let encoder = TextEncoder::new();
        while out.len() < limit {
            let family = metrics.families.get(self.family);
            let small_next =
                (self.small.peek()).is_some_and(|mf| family.is_none_or(|f| mf.name() < f.name));
            if small_next && self.small_stale {
                self.regather(metrics);
            }
            let next = self
                .small
                .next_if(|mf| family.is_none_or(|f| mf.name() < f.name));
            if let Some(mf) = next {
                match self.writer.format {
                    // Encoding into a Vec cannot fail for a gathered (non-empty) family.
                    TextFormat::Prometheus => {
                        let _ = encoder.encode(std::slice::from_ref(&mf), out);
                    }
                    TextFormat::OpenMetrics => registry_family_openmetrics(&mf, out),
                }
                continue;
            }
            let Some(family) = family else {
                return true;
            };
            let writer = &mut self.writer;
            if family.render_part(&self.pairs, &mut self.cursor, out, limit, writer) {
                self.family += 1;
                self.cursor = Cursor::default();
                self.small_stale = true;
            }
        }
        self.small.peek().is_none() && self.family == metrics.families.len()
    }

    /// Gather the registry again, keeping the families after the per-pair ones already
    /// written: those whose names sort after the last per-pair family written. Called
    /// only when a registry family is to be written next, so a scrape gathers once per
    /// run of registry families between per-pair ones.
    fn regather(&mut self, metrics: &Metrics) {
        let written = self
            .family
            .checked_sub(1)
            .and_then(|i| metrics.families.get(i))
            .map(|f| f.name);
        let families: Vec<proto::MetricFamily> = metrics
            .registry
            .gather()
            .into_iter()
            .filter(|mf| written.is_none_or(|name| mf.name() > name))
            .collect();
        self.small = families.into_iter().peekable();
        self.small_stale = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Many label pairs over every kind of family (and one family with no series at all),
    /// with the process collector's lines left out: they change from one read to the next.
    fn populated() -> Arc<Metrics> {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        let metrics = Metrics::new(&config.metrics.buckets, &config.labels);
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
        let mut config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        config.labels.model.max_values = Some(4000);
        config.labels.max_pairs = 4000;
        let metrics = Metrics::new(&config.metrics.buckets, &config.labels);
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
        let mut config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        config.labels.max_pairs = 2;
        let metrics = Metrics::new(&config.metrics.buckets, &config.labels);
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
