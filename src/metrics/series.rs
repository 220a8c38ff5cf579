//! Storage for the per-(model, tenant) families: one [`PairSeries`] per label pair holds
//! every histogram and counter of that pair as plain atomics, and is the handle a request
//! observes through (resolved once per request by `Metrics::stream`).
//!
//! Why not the prometheus crate's vectors: its `gather()` copies every series into an owned
//! protobuf snapshot before encoding, which with 10,000 pairs made `/metrics` take most of
//! a second. A pair is created once (the first request that carries it) and shared by the
//! streams as an `Arc`, so the per-event path touches only atomics, and the text encoder
//! (`exposition`) reads them in place.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::exemplar::{Exemplar, ExemplarSlots};
use super::native::{NativeHistogram, NativeSettings};
use super::outcome::Outcome;
use super::snapshot::NativeHistogramSnapshot;
use super::text::escape_label_value;

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
        self.counts[self.slot(v)].fetch_add(1, Ordering::Relaxed);
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
        self.counts[self.slot(v)].fetch_add(n, Ordering::Relaxed);
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
    pub duration: Arc<[f64]>,
    /// Native buckets beside the classic ones, when enabled.
    pub native: Option<NativeSettings>,
}

/// `tokentap_event_tokens_total`'s `accuracy` values, in label-value order.
pub(super) const ACCURACY: [&str; 3] = ["apportioned", "estimated", "exact"];

/// Every series of one (model, tenant) pair.
pub struct PairSeries {
    pub model: Arc<str>,
    pub tenant: Arc<str>,
    /// `model="…",tenant="…"`, escaped for the exposition once.
    labels: Box<str>,
    /// Where `,tenant=` starts in `labels` (`outcome` sorts between the two).
    tenant_at: usize,
    pub ttfb: Histogram,
    pub ttft: Histogram,
    pub ttft_content: Histogram,
    pub itl: Histogram,
    /// Every gap between consecutive token-bearing events, once each, live.
    pub inter_chunk: Histogram,
    pub stalls: Counter,
    pub(super) tpot: Histogram,
    pub(super) tokens_per_second: Histogram,
    pub(super) duration: Histogram,
    /// Indexed by `Outcome as usize`.
    pub(super) requests: [Counter; Outcome::ALL.len()],
    pub(super) output_tokens: Counter,
    pub(super) input_tokens: Counter,
    /// Indexed like [`ACCURACY`].
    pub(super) event_tokens: [Counter; 3],
}

impl PairSeries {
    pub(super) fn new(model: Arc<str>, tenant: Arc<str>, bounds: &Bounds) -> PairSeries {
        let mut labels = String::with_capacity(model.len() + tenant.len() + 20);
        labels.push_str("model=\"");
        escape_label_value(&model, &mut labels);
        labels.push('"');
        let tenant_at = labels.len();
        labels.push_str(",tenant=\"");
        escape_label_value(&tenant, &mut labels);
        labels.push('"');
        let native = bounds.native.as_ref();
        PairSeries {
            model,
            tenant,
            labels: labels.into_boxed_str(),
            tenant_at,
            ttfb: Histogram::new(&bounds.ttfb, native),
            ttft: Histogram::new(&bounds.ttft, native),
            ttft_content: Histogram::new(&bounds.ttft, native),
            itl: Histogram::new(&bounds.itl, native),
            inter_chunk: Histogram::new(&bounds.inter_chunk, native),
            stalls: Counter::default(),
            tpot: Histogram::new(&bounds.tpot, native),
            tokens_per_second: Histogram::new(&bounds.tokens_per_second, native),
            duration: Histogram::new(&bounds.duration, native),
            requests: Default::default(),
            output_tokens: Counter::default(),
            input_tokens: Counter::default(),
            event_tokens: Default::default(),
        }
    }

    /// Observe `tokens` ITL samples of `per_token` each (one per token).
    pub fn observe_itl(&self, per_token: Duration, tokens: u64) {
        self.itl.observe_many(per_token.as_secs_f64(), tokens);
    }

    /// `model="…",tenant="…"`.
    pub(super) fn labels(&self) -> &str {
        &self.labels
    }

    /// `model="…"` and `,tenant="…"`.
    pub(super) fn split_labels(&self) -> (&str, &str) {
        self.labels.split_at(self.tenant_at)
    }

    pub(super) fn requests(&self, outcome: Outcome) -> &Counter {
        &self.requests[outcome as usize]
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
            let bounds: Arc<[f64]> = Arc::from(crate::metrics::buckets::LATENCY_BUCKETS);
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

    #[test]
    fn labels_are_escaped_once() {
        let bounds: Arc<[f64]> = Arc::from(vec![1.0]);
        let b = Bounds {
            ttfb: bounds.clone(),
            ttft: bounds.clone(),
            itl: bounds.clone(),
            inter_chunk: bounds.clone(),
            tpot: bounds.clone(),
            tokens_per_second: bounds.clone(),
            duration: bounds,
            native: None,
        };
        let pair = PairSeries::new(Arc::from("a\"b"), Arc::from("c\\d\ne"), &b);
        assert_eq!(pair.labels(), r#"model="a\"b",tenant="c\\d\ne""#);
        assert_eq!(
            pair.split_labels(),
            (r#"model="a\"b""#, r#",tenant="c\\d\ne""#)
        );
    }
}
