//! Storage for the per-(model, tenant) families: one [`SeriesSet`] per label pair holds
//! the histograms and counters of the families that carry `tenant`, one per model those
//! of the families that are per model (`labels.tenant.families`), all as plain atomics. A
//! request observes through a [`StreamSeries`], its pair's set and its model's, resolved
//! once per request by `Metrics::stream`.
//!
//! Why not the prometheus crate's vectors: its `gather()` copies every series into an owned
//! protobuf snapshot before encoding, which with 10,000 pairs made `/metrics` take most of
//! a second. Why two levels: a pair's set allocates nothing for a per-model family (a
//! native histogram is about 1 KiB), so 10,000 pairs cost only what the families that
//! carry `tenant` need.

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(clippy::indexing_slicing)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::exemplar::{Exemplar, ExemplarSlots};
use super::gen_ai::{GenAiBounds, GenAiKey};
use super::native::{NativeHistogram, NativeSettings};
use super::snapshot::NativeHistogramSnapshot;
use super::text::escape_label_value;
use crate::outcome::Verdict;

/// A classic histogram: a count per bucket (the last slot counts what is above every
/// bound, NaN included) and the sum of every observed value.
///
/// The total count is the sum of the slots, so `le="+Inf"` and `_count` always agree with
/// the finite buckets, whenever a scrape happens. With native histograms enabled it also
/// counts every value in its native buckets, and it keeps the exemplars requests leave.
pub struct Histogram {
    bounds: Arc<[f64]>,
    counts: Box<[AtomicU64]>,
    native: Option<NativeHistogram>,
    exemplars: ExemplarSlots,
    /// `f64` bits: updated with a CAS loop so the sum is exactly the float sum of the
    /// observed values, in the order they were observed.
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &Arc<[f64]>, native: Option<&NativeSettings>) -> Histogram {
        Histogram {
            bounds: bounds.clone(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            native: native.map(|settings| NativeHistogram::new(settings, bounds)),
            exemplars: ExemplarSlots::default(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Count `v` in the first bucket whose bound is `>= v`, as the prometheus crate does.
    pub fn observe(&self, v: f64) {
        // `slot` is at most `bounds.len()`, and there is a count more than bounds.
        if let Some(count) = self.counts.get(self.slot(v)) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(native) = &self.native {
            native.observe(v);
        }
        self.add_to_sum(v);
    }

    /// Count `v` `n` times: the same as `n` calls of [`Histogram::observe`], in one
    /// step (a request's apportioned share can be many tokens). The sum adds `v` one at a
    /// time, as `observe` would, for up to 64 observations (what the equivalence with the
    /// prometheus crate relies on) and `v * n` past that.
    pub fn observe_many(&self, v: f64, n: u64) {
        if n <= 64 {
            for _ in 0..n {
                self.observe(v);
            }
            return;
        }
        if let Some(count) = self.counts.get(self.slot(v)) {
            count.fetch_add(n, Ordering::Relaxed);
        }
        if let Some(native) = &self.native {
            native.observe_n(v, n);
        }
        self.add_to_sum(v * n as f64);
    }

    /// Keep `exemplar` for the observation of its value (made already, or made with it):
    /// as the latest of the classic bucket the value falls in, and among the native
    /// histogram's latest. Once per request, never per token: it takes a lock, and
    /// allocates this histogram's exemplar storage the first time.
    pub fn exemplar(&self, exemplar: Exemplar) {
        self.exemplars
            .record(self.counts.len(), self.slot(exemplar.value), exemplar);
    }

    /// The first bucket whose bound is `>= v`; the last slot for anything above every
    /// bound (NaN included).
    fn slot(&self, v: f64) -> usize {
        self.bounds
            .iter()
            .position(|bound| v <= *bound)
            .unwrap_or(self.bounds.len())
    }

    fn add_to_sum(&self, v: f64) {
        let mut current = self.sum.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(current) + v).to_bits();
            match self.sum.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
    }

    /// Per-slot counts appended to `out`; returns the total count and the sum.
    pub(super) fn read(&self, out: &mut Vec<u64>) -> (u64, f64) {
        let mut total = 0u64;
        for slot in self.counts.iter() {
            let n = slot.load(Ordering::Relaxed);
            total = total.wrapping_add(n);
            out.push(n);
        }
        (total, f64::from_bits(self.sum.load(Ordering::Relaxed)))
    }

    /// Each classic bucket's latest exemplar (one per slot, `+Inf` last) appended to
    /// `out`; nothing if this histogram never had one.
    pub(super) fn read_exemplars(&self, out: &mut Vec<Option<Exemplar>>) {
        self.exemplars.read_buckets(out);
    }

    /// The native histogram's latest exemplars, oldest first (none without native
    /// buckets).
    pub(super) fn read_native_exemplars(&self) -> Vec<Exemplar> {
        if self.native.is_none() {
            return Vec::new();
        }
        self.exemplars.read_recent()
    }

    /// The native buckets as they are now, if this histogram keeps them.
    pub(super) fn read_native(&self) -> Option<NativeHistogramSnapshot> {
        self.native.as_ref().map(NativeHistogram::read)
    }

    pub(super) fn bounds(&self) -> &Arc<[f64]> {
        &self.bounds
    }
}

/// A monotonic counter.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Bucket bounds of each histogram family (validated by the config).
pub(super) struct Bounds {
    pub ttfb: Arc<[f64]>,
    pub ttft: Arc<[f64]>,
    pub itl: Arc<[f64]>,
    pub inter_chunk: Arc<[f64]>,
    pub tpot: Arc<[f64]>,
    pub tokens_per_second: Arc<[f64]>,
    pub tokens_per_event: Arc<[f64]>,
    pub duration: Arc<[f64]>,
    /// The GenAI families' bounds: the convention's, whatever the config says.
    pub gen_ai: GenAiBounds,
    /// Native buckets beside the classic ones, when enabled.
    pub native: Option<NativeSettings>,
}

/// `tokentap_event_tokens_total`'s `accuracy` values, in label-value order.
pub(super) const ACCURACY: [&str; 3] = ["apportioned", "estimated", "exact"];

/// The storage of one per-pair family in a [`SeriesSet`]: every family has its own, and
/// a set allocates only those of the families kept at its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    Ttfb,
    Ttft,
    TtftContent,
    Itl,
    InterChunk,
    Tpot,
    TokensPerSecond,
    TokensPerEvent,
    Duration,
    Requests,
    OutputTokens,
    InputTokens,
    EventTokens,
    Stalls,
    EngineQueue,
    EnginePrefill,
    TtftOutsideEngine,
    /// The two storages only a GenAI set keeps (`gen_ai`), after the [`Slot::COUNT`] of
    /// the `tokentap_` families: a pair's or a model's set never has them.
    FirstChunk,
    TokenUsage,
}

impl Slot {
    /// The slots of the `tokentap_` families, which pairs' and models' sets divide.
    pub const COUNT: usize = 17;
}

/// Which slots a set of each level holds: `true` for the families that carry `tenant`
/// (kept in the (model, tenant) pair's set), `false` for those kept per model.
#[derive(Clone, Copy, Debug)]
pub(super) struct TenantSlots(pub [bool; Slot::COUNT]);

/// A family's storage, allocated only in the sets of its level (a pointer when absent).
type Kept<T> = Option<Box<T>>;

/// The series of one label set: a (model, tenant) pair, holding the families that carry
/// `tenant`, or a model, holding the families that are per model. Created once (by the
/// first request that carries it) and shared as an `Arc` by the streams, so the per-event
/// path touches only atomics, and the text encoder (`exposition`) reads them in place.
pub struct SeriesSet {
    pub(super) model: Arc<str>,
    /// `None` in a per-model set.
    pub(super) tenant: Option<Arc<str>>,
    /// `model="…",tenant="…"` (or `model="…"`), escaped for the exposition once.
    labels: Box<str>,
    /// Where `,tenant=` starts in `labels` (`outcome` sorts between the two); the end of
    /// `labels` in a per-model set.
    tenant_at: usize,
    pub(super) ttfb: Kept<Histogram>,
    pub(super) ttft: Kept<Histogram>,
    pub(super) ttft_content: Kept<Histogram>,
    pub(super) itl: Kept<Histogram>,
    /// Every gap between consecutive token-bearing events, once each, live.
    pub(super) inter_chunk: Kept<Histogram>,
    pub(super) stalls: Kept<Counter>,
    pub(super) tpot: Kept<Histogram>,
    pub(super) tokens_per_second: Kept<Histogram>,
    /// The exact token count of each token-bearing event whose count the wire format gave.
    pub(super) tokens_per_event: Kept<Histogram>,
    pub(super) duration: Kept<Histogram>,
    /// Indexed by [`Verdict::index`].
    pub(super) requests: Kept<[Counter; Verdict::COUNT]>,
    pub(super) output_tokens: Kept<Counter>,
    pub(super) input_tokens: Kept<Counter>,
    /// Indexed like [`ACCURACY`].
    pub(super) event_tokens: Kept<[Counter; 3]>,
    /// What the engine reported of its own time (with the TTFT buckets).
    pub(super) engine_queue: Kept<Histogram>,
    pub(super) engine_prefill: Kept<Histogram>,
    pub(super) ttft_outside_engine: Kept<Histogram>,
    /// A GenAI set's attributes (`None` in a pair's or a model's set).
    pub(super) gen_ai: Option<GenAiKey>,
    /// A GenAI set's time to the first chunk of a streamed response.
    pub(super) first_chunk: Kept<Histogram>,
    /// A GenAI set's tokens per request (of the set's `gen_ai.token.type`).
    pub(super) token_usage: Kept<Histogram>,
}

impl SeriesSet {
    /// The set of a (model, tenant) pair (`tenant` given) or of a model: with the
    /// storage of the slots `tenant_slots` puts at its level, and no other.
    pub(super) fn new(
        model: Arc<str>,
        tenant: Option<Arc<str>>,
        bounds: &Bounds,
        tenant_slots: TenantSlots,
    ) -> SeriesSet {
        let mut labels = String::with_capacity(model.len().saturating_add(20));
        labels.push_str("model=\"");
        escape_label_value(&model, &mut labels);
        labels.push('"');
        let tenant_at = labels.len();
        if let Some(tenant) = &tenant {
            labels.push_str(",tenant=\"");
            escape_label_value(tenant, &mut labels);
            labels.push('"');
        }
        let per_pair = tenant.is_some();
        let kept = |slot: Slot| tenant_slots.0.get(slot as usize) == Some(&per_pair);
        let native = bounds.native.as_ref();
        let histogram = |slot: Slot, bounds: &Arc<[f64]>| {
            kept(slot).then(|| Box::new(Histogram::new(bounds, native)))
        };
        let counter = |slot: Slot| kept(slot).then(Box::<Counter>::default);
        SeriesSet {
            ttfb: histogram(Slot::Ttfb, &bounds.ttfb),
            ttft: histogram(Slot::Ttft, &bounds.ttft),
            ttft_content: histogram(Slot::TtftContent, &bounds.ttft),
            itl: histogram(Slot::Itl, &bounds.itl),
            inter_chunk: histogram(Slot::InterChunk, &bounds.inter_chunk),
            stalls: counter(Slot::Stalls),
            tpot: histogram(Slot::Tpot, &bounds.tpot),
            tokens_per_second: histogram(Slot::TokensPerSecond, &bounds.tokens_per_second),
            tokens_per_event: histogram(Slot::TokensPerEvent, &bounds.tokens_per_event),
            duration: histogram(Slot::Duration, &bounds.duration),
            requests: kept(Slot::Requests)
                .then(|| Box::new(std::array::from_fn(|_| Counter::default()))),
            output_tokens: counter(Slot::OutputTokens),
            input_tokens: counter(Slot::InputTokens),
            event_tokens: kept(Slot::EventTokens).then(Box::default),
            engine_queue: histogram(Slot::EngineQueue, &bounds.ttft),
            engine_prefill: histogram(Slot::EnginePrefill, &bounds.ttft),
            ttft_outside_engine: histogram(Slot::TtftOutsideEngine, &bounds.ttft),
            gen_ai: None,
            first_chunk: None,
            token_usage: None,
            model,
            tenant,
            labels: labels.into_boxed_str(),
            tenant_at,
        }
    }

    /// The set of one GenAI attribute set (see `gen_ai`), with the storage of the slots
    /// in `slots` only, each with the convention's buckets.
    pub(super) fn gen_ai(key: GenAiKey, slots: &[Slot], bounds: &Bounds) -> SeriesSet {
        let labels = key.label_text();
        let native = bounds.native.as_ref();
        let histogram = |slot: Slot, bounds: &Arc<[f64]>| {
            slots
                .contains(&slot)
                .then(|| Box::new(Histogram::new(bounds, native)))
        };
        let conventions = &bounds.gen_ai;
        SeriesSet {
            ttfb: None,
            ttft: histogram(Slot::Ttft, &conventions.time_to_first_token),
            ttft_content: None,
            itl: None,
            inter_chunk: histogram(Slot::InterChunk, &conventions.duration),
            stalls: None,
            tpot: histogram(Slot::Tpot, &conventions.time_per_output_token),
            tokens_per_second: None,
            tokens_per_event: None,
            duration: histogram(Slot::Duration, &conventions.duration),
            requests: None,
            output_tokens: None,
            input_tokens: None,
            event_tokens: None,
            engine_queue: None,
            engine_prefill: None,
            ttft_outside_engine: None,
            first_chunk: histogram(Slot::FirstChunk, &conventions.duration),
            token_usage: histogram(Slot::TokenUsage, &conventions.token_usage),
            model: key.model.clone(),
            tenant: None,
            tenant_at: labels.len(),
            labels: labels.into_boxed_str(),
            gen_ai: Some(key),
        }
    }

    /// `model="…",tenant="…"` (a pair's) or `model="…"` (a model's).
    pub(super) fn labels(&self) -> &str {
        &self.labels
    }

    /// `model="…"` and `,tenant="…"` (empty in a model's set).
    pub(super) fn split_labels(&self) -> (&str, &str) {
        self.labels.split_at(self.tenant_at)
    }
}

/// What the sets of each role keep.
pub(super) const OK_SLOTS: &[Slot] = &[
    Slot::Ttft,
    Slot::Tpot,
    Slot::Duration,
    Slot::FirstChunk,
    Slot::InterChunk,
];
pub(super) const ERROR_SLOTS: &[Slot] = &[Slot::Duration];
pub(super) const TOKEN_SLOTS: &[Slot] = &[Slot::TokenUsage];

/// A request's GenAI sets, resolved with its other series: the set without `error.type`
/// (figures of every request, and those of successful ones), and one per token type.
/// The set of a failed request's `error.type` is looked up at its end.
#[derive(Clone)]
pub struct GenAiSeries {
    pub(super) ok: Arc<SeriesSet>,
    pub(super) input: Arc<SeriesSet>,
    pub(super) output: Arc<SeriesSet>,
    /// The request asked for a stream (or did not say): the client chunk metrics apply.
    pub(super) streaming: bool,
}

/// The series one request observes through, resolved once by `Metrics::stream`: its
/// (model, tenant) pair's set and its model's. Each accessor picks the set that keeps
/// the family, so the per-event path does no lookup.
#[derive(Clone)]
pub struct StreamSeries {
    pub(super) pair: Arc<SeriesSet>,
    pub(super) model: Arc<SeriesSet>,
    /// The request's GenAI sets, when `metrics.names` exposes the GenAI families
    /// (`Metrics::attach_gen_ai`).
    pub(super) gen_ai: Option<GenAiSeries>,
}

/// The one of `pair` and `model` that is kept: exactly one is, as `SeriesSet::new` gives
/// a pair's set and a model's set complementary slots from the same [`TenantSlots`].
#[allow(
    clippy::expect_used,
    reason = "a typed invariant of SeriesSet::new: the two sets' slots are complementary"
)]
fn kept<'s, T>(pair: &'s Kept<T>, model: &'s Kept<T>) -> &'s T {
    pair.as_deref()
        .or(model.as_deref())
        .expect("every family is kept in the pair's set or in the model's")
}

impl StreamSeries {
    /// The `model` label of the request's pair (`other` if the pair cap folded it).
    pub fn model(&self) -> &Arc<str> {
        &self.pair.model
    }

    /// The `tenant` label of the request's pair.
    #[allow(
        clippy::expect_used,
        reason = "a typed invariant: SeriesSet::new gives a pair's set its tenant"
    )]
    pub fn tenant(&self) -> &Arc<str> {
        self.pair
            .tenant
            .as_ref()
            .expect("a pair's set has a tenant")
    }

    pub fn ttfb(&self) -> &Histogram {
        kept(&self.pair.ttfb, &self.model.ttfb)
    }

    pub fn ttft(&self) -> &Histogram {
        kept(&self.pair.ttft, &self.model.ttft)
    }

    pub fn ttft_content(&self) -> &Histogram {
        kept(&self.pair.ttft_content, &self.model.ttft_content)
    }

    /// Every gap between consecutive token-bearing events, once each, live.
    pub fn inter_chunk(&self) -> &Histogram {
        kept(&self.pair.inter_chunk, &self.model.inter_chunk)
    }

    /// The first token-bearing event arrived `ttft` after the request head: TTFT, and
    /// the GenAI time to first chunk of a streamed request.
    pub fn first_token(&self, ttft: Duration) {
        let seconds = ttft.as_secs_f64();
        self.ttft().observe(seconds);
        if let Some(gen_ai) = self.gen_ai.as_ref().filter(|g| g.streaming) {
            if let Some(first_chunk) = &gen_ai.ok.first_chunk {
                first_chunk.observe(seconds);
            }
        }
    }

    /// A token-bearing event arrived `gap` after the one before: the inter-chunk latency,
    /// and the GenAI time per output chunk of a streamed request.
    #[inline]
    pub fn chunk_gap(&self, gap: Duration) {
        let seconds = gap.as_secs_f64();
        self.inter_chunk().observe(seconds);
        if let Some(gen_ai) = self.gen_ai.as_ref().filter(|g| g.streaming) {
            if let Some(chunk) = &gen_ai.ok.inter_chunk {
                chunk.observe(seconds);
            }
        }
    }

    pub fn stalls(&self) -> &Counter {
        kept(&self.pair.stalls, &self.model.stalls)
    }

    /// Observe `tokens` ITL samples of `per_token` each (one per token).
    pub fn observe_itl(&self, per_token: Duration, tokens: u64) {
        self.itl().observe_many(per_token.as_secs_f64(), tokens);
    }

    pub(super) fn itl(&self) -> &Histogram {
        kept(&self.pair.itl, &self.model.itl)
    }

    pub(super) fn tpot(&self) -> &Histogram {
        kept(&self.pair.tpot, &self.model.tpot)
    }

    pub(super) fn tokens_per_second(&self) -> &Histogram {
        kept(&self.pair.tokens_per_second, &self.model.tokens_per_second)
    }

    /// The exact token counts of token-bearing events, one observation per event.
    pub fn tokens_per_event(&self) -> &Histogram {
        kept(&self.pair.tokens_per_event, &self.model.tokens_per_event)
    }

    pub(super) fn duration(&self) -> &Histogram {
        kept(&self.pair.duration, &self.model.duration)
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "a typed invariant: Verdict::index() < Verdict::COUNT, the array's length"
    )]
    pub(super) fn requests(&self, verdict: Verdict) -> &Counter {
        &kept(&self.pair.requests, &self.model.requests)[verdict.index()]
    }

    pub(super) fn output_tokens(&self) -> &Counter {
        kept(&self.pair.output_tokens, &self.model.output_tokens)
    }

    pub(super) fn input_tokens(&self) -> &Counter {
        kept(&self.pair.input_tokens, &self.model.input_tokens)
    }

    /// Indexed like [`ACCURACY`].
    pub(super) fn event_tokens(&self) -> &[Counter; 3] {
        kept(&self.pair.event_tokens, &self.model.event_tokens)
    }

    pub(super) fn engine_queue(&self) -> &Histogram {
        kept(&self.pair.engine_queue, &self.model.engine_queue)
    }

    pub(super) fn engine_prefill(&self) -> &Histogram {
        kept(&self.pair.engine_prefill, &self.model.engine_prefill)
    }

    pub(super) fn ttft_outside_engine(&self) -> &Histogram {
        kept(
            &self.pair.ttft_outside_engine,
            &self.model.ttft_outside_engine,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_upper_inclusive_and_nan_counts_only_in_inf() {
        let bounds: Arc<[f64]> = Arc::from(vec![0.5, 1.0]);
        let h = Histogram::new(&bounds, None);
        for v in [0.0, 0.5, 0.75, 1.0, 2.0, f64::NAN] {
            h.observe(v);
        }
        let mut counts = Vec::new();
        let (total, sum) = h.read(&mut counts);
        assert_eq!(counts, [2, 2, 2]);
        assert_eq!(total, 6);
        assert!(sum.is_nan());
    }

    proptest::proptest! {
        /// The native buckets count exactly the observations the classic ones do.
        #[test]
        fn native_and_classic_count_the_same_observations(
            values in proptest::collection::vec(
                proptest::prop_oneof![0.0..0.02f64, 0.0..100.0f64, 1e-12..1e9f64],
                0..200,
            ),
            schema in super::super::native::MIN_SCHEMA..=super::super::native::MAX_SCHEMA,
        ) {
            let bounds: Arc<[f64]> = Arc::from(crate::buckets::LATENCY_BUCKETS);
            let h = Histogram::new(&bounds, Some(&NativeSettings::new(schema, 160)));
            for v in &values {
                h.observe(*v);
            }
            let (total, sum) = h.read(&mut Vec::new());
            let native = h.read_native().expect("native buckets enabled");
            proptest::prop_assert_eq!(native.count(), total);
            proptest::prop_assert_eq!(total, values.len() as u64);
            proptest::prop_assert_eq!(sum, values.iter().sum::<f64>());
            proptest::prop_assert!(native.buckets.len() <= 160);
        }
    }

    #[test]
    fn an_exemplar_lands_in_the_bucket_of_its_value() {
        use super::super::exemplar::TraceContext;
        let bounds: Arc<[f64]> = Arc::from(vec![0.5, 1.0]);
        let h = Histogram::new(&bounds, None);
        let mut out = Vec::new();
        h.read_exemplars(&mut out);
        assert!(out.is_empty(), "no storage before the first exemplar");
        let trace = TraceContext {
            trace_id: [1; 16],
            span_id: [2; 8],
        };
        let at = std::time::UNIX_EPOCH + Duration::from_millis(1_733_100_000_123);
        for v in [0.75, 2.0, 1.0] {
            h.observe(v);
            h.exemplar(Exemplar::new(trace, v, at));
        }
        h.read_exemplars(&mut out);
        let values: Vec<Option<f64>> = out.iter().map(|e| e.map(|e| e.value)).collect();
        assert_eq!(values, [None, Some(1.0), Some(2.0)]);
        assert!(h.read_native_exemplars().is_empty(), "no native buckets");
        let native = Histogram::new(&bounds, Some(&NativeSettings::new(3, 160)));
        native.exemplar(Exemplar::new(trace, 0.1, at));
        assert_eq!(native.read_native_exemplars().len(), 1);
    }

    /// Every family with the single classic bound 1.0, no native buckets.
    fn one_bound_everywhere() -> Bounds {
        let bounds: Arc<[f64]> = Arc::from(vec![1.0]);
        Bounds {
            ttfb: bounds.clone(),
            ttft: bounds.clone(),
            itl: bounds.clone(),
            inter_chunk: bounds.clone(),
            tpot: bounds.clone(),
            tokens_per_second: bounds.clone(),
            tokens_per_event: bounds.clone(),
            duration: bounds,
            gen_ai: GenAiBounds::default(),
            native: None,
        }
    }

    #[test]
    fn labels_are_escaped_once() {
        let b = one_bound_everywhere();
        let pair = SeriesSet::new(
            Arc::from("a\"b"),
            Some(Arc::from("c\\d\ne")),
            &b,
            TenantSlots([true; Slot::COUNT]),
        );
        assert_eq!(pair.labels(), r#"model="a\"b",tenant="c\\d\ne""#);
        assert_eq!(
            pair.split_labels(),
            (r#"model="a\"b""#, r#",tenant="c\\d\ne""#)
        );
        let model = SeriesSet::new(
            Arc::from("a\"b"),
            None,
            &b,
            TenantSlots([true; Slot::COUNT]),
        );
        assert_eq!(model.labels(), r#"model="a\"b""#);
        assert_eq!(model.split_labels(), (r#"model="a\"b""#, ""));
    }

    /// A pair's set and a model's set hold complementary families: a family is kept at
    /// one level only, and nothing of the other level's is allocated.
    #[test]
    fn a_pair_and_its_model_keep_complementary_families() {
        let b = one_bound_everywhere();
        let mut slots = [false; Slot::COUNT];
        slots[Slot::Ttft as usize] = true;
        slots[Slot::Requests as usize] = true;
        let slots = TenantSlots(slots);
        let stream = StreamSeries {
            pair: Arc::new(SeriesSet::new(
                Arc::from("m"),
                Some(Arc::from("t")),
                &b,
                slots,
            )),
            model: Arc::new(SeriesSet::new(Arc::from("m"), None, &b, slots)),
            gen_ai: None,
        };
        assert!(stream.pair.ttft.is_some() && stream.model.ttft.is_none());
        assert!(stream.pair.requests.is_some() && stream.model.requests.is_none());
        assert!(stream.pair.ttfb.is_none() && stream.model.ttfb.is_some());
        assert!(stream.pair.stalls.is_none() && stream.model.stalls.is_some());
        stream.ttft().observe(0.5);
        stream.ttfb().observe(0.5);
        stream.requests(Verdict::ALL[0]).inc();
        assert_eq!(
            stream
                .pair
                .ttft
                .as_deref()
                .map(|h| h.read(&mut Vec::new()).0),
            Some(1)
        );
        assert_eq!(
            stream
                .model
                .ttfb
                .as_deref()
                .map(|h| h.read(&mut Vec::new()).0),
            Some(1)
        );
        assert_eq!(&**stream.tenant(), "t");
    }
}
