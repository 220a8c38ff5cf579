//! The live view's memory: per model, what changed in each tick (requests by outcome,
//! output tokens, the TTFT and ITL histograms' bucket counts), kept in a ring of
//! [`SLOTS`] ticks, and the windowed figures read from it (rates, quantiles from the
//! windowed buckets, outcome ratios, heatmap columns).
//!
//! Plain data, no clock and no I/O: the ticker in [`super`] reads the cumulative totals
//! from the metric families once per tick and pushes them here; [`Ring::push`] keeps the
//! difference from the previous tick. So the page shows what changed in the last minutes,
//! not the average since start.
//!
//! Per model it also keeps the requests judged against each objective, met and missed
//! (`tokentap_objective_requests_total`, read with [`Metrics::objective_totals`]).
//!
//! Bounded: at most [`MAX_MODELS`] models are kept (the rest are counted in
//! [`Ring::models_over_cap`]), besides the label policy's own two values, `other` (all
//! traffic folded past the label cap: never hidden, however many models came first) and
//! `unknown`; a slot holds an entry only for the models that changed in it, and
//! [`Ring::bytes`] is the memory the slots hold; its ceiling is
//! `SLOTS × (MAX_MODELS + 2) × ModelTick` (see [`Ring::max_bytes`]), a tick keeping at most
//! [`OBJECTIVES_PER_TICK`] objectives per model.
//!
//! [`Metrics::objective_totals`]: crate::metrics::Metrics::objective_totals

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::metrics::snapshot::{HistogramSnapshot, Snapshot, Values};
use crate::metrics::ObjectiveTotals;
use crate::outcome::Outcome;

/// Ticks kept: ten minutes of one-second ticks.
pub const SLOTS: usize = 600;
/// Models kept; a model first seen past it is left out of the view (and counted).
/// `other` and `unknown` are kept besides them.
pub const MAX_MODELS: usize = 32;

/// The values the label policy gives itself (`other`: folded past the cap; `unknown`: no
/// model named): always kept, so the view accounts for all traffic.
fn is_fold(model: &str) -> bool {
    model == crate::metrics::labels::OTHER || model == crate::metrics::labels::UNKNOWN
}
/// Objectives a model's tick keeps: as many as the config allows at once
/// ([`crate::config::MAX_OBJECTIVES`]); more are judged only in the second of a
/// reload that renamed them, and that second's extra ones are left out of the view.
pub const OBJECTIVES_PER_TICK: usize = crate::config::MAX_OBJECTIVES;
/// Objective names the ring indexes over its life (reloads may rename them); a name first
/// seen past it is left out of the view.
pub const OBJECTIVE_NAMES: usize = 64;
/// The outcomes, in [`Outcome::ALL`]'s order.
pub const OUTCOMES: usize = Outcome::ALL.len();

pub const TTFT: &str = "tokentap_time_to_first_token_seconds";
pub const ITL: &str = "tokentap_inter_token_latency_seconds";
pub const REQUESTS: &str = "tokentap_requests_total";
pub const OUTPUT_TOKENS: &str = "tokentap_output_tokens_total";
/// The families the ticker reads.
pub const FAMILIES: [&str; 4] = [ITL, OUTPUT_TOKENS, REQUESTS, TTFT];

/// A histogram's buckets, not cumulative: one count per finite bound and a last one for
/// `+Inf`, and the sum of the observations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets {
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Buckets {
    fn add_snapshot(&mut self, h: &HistogramSnapshot) {
        let n = h.cumulative_counts.len() + 1;
        if self.counts.len() < n {
            self.counts.resize(n, 0);
        }
        let mut below = 0;
        for (i, &c) in h.cumulative_counts.iter().enumerate() {
            self.counts[i] += c.saturating_sub(below);
            below = c;
        }
        self.counts[n - 1] += h.count.saturating_sub(below);
        self.sum += h.sum;
    }

    fn add(&mut self, other: &[u32], sum: f64) {
        if self.counts.len() < other.len() {
            self.counts.resize(other.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(other) {
            *a += u64::from(*b);
        }
        self.sum += sum;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// One model's cumulative totals at one tick, summed over tenants and statuses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Totals {
    pub requests: [u64; OUTCOMES],
    pub output_tokens: u64,
    pub ttft: Buckets,
    pub itl: Buckets,
    /// Requests judged against each objective: met, missed.
    pub objectives: BTreeMap<Arc<str>, [u64; 2]>,
}

/// Every model's totals in `snapshot` (of [`FAMILIES`]) and `objectives`, by model, in
/// name order.
pub fn totals(snapshot: &Snapshot, objectives: ObjectiveTotals) -> Vec<(Arc<str>, Totals)> {
    let mut by_model: std::collections::BTreeMap<Arc<str>, Totals> = Default::default();
    let model_of = |labels: &[crate::metrics::snapshot::Label]| {
        labels
            .iter()
            .find(|l| l.name == "model")
            .map(|l| l.value.clone())
    };
    for family in &snapshot.families {
        match (&*family.name, &family.values) {
            (REQUESTS, Values::Counter(series)) => {
                for s in series {
                    let (Some(model), Some(outcome)) = (model_of(&s.labels), s.label("outcome"))
                    else {
                        continue;
                    };
                    if let Some(i) = Outcome::ALL.iter().position(|o| o.as_str() == outcome) {
                        by_model.entry(model).or_default().requests[i] += s.value as u64;
                    }
                }
            }
            (OUTPUT_TOKENS, Values::Counter(series)) => {
                for s in series {
                    if let Some(model) = model_of(&s.labels) {
                        by_model.entry(model).or_default().output_tokens += s.value as u64;
                    }
                }
            }
            (name @ (TTFT | ITL), Values::Histogram(series)) => {
                for s in series {
                    if let Some(model) = model_of(&s.labels) {
                        let totals = by_model.entry(model).or_default();
                        let buckets = if name == TTFT {
                            &mut totals.ttft
                        } else {
                            &mut totals.itl
                        };
                        buckets.add_snapshot(&s.value);
                    }
                }
            }
            _ => {}
        }
    }
    for (model, judged) in objectives {
        by_model.entry(model).or_default().objectives = judged;
    }
    by_model.into_iter().collect()
}

/// What one model changed in one tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelTick {
    pub requests: [u32; OUTCOMES],
    pub output_tokens: u64,
    pub ttft: Box<[u32]>,
    pub ttft_sum: f64,
    pub itl: Box<[u32]>,
    pub itl_sum: f64,
    /// Requests judged in the tick, met and missed, by objective (its index in
    /// [`Ring::objectives`]); only the objectives that judged any, at most
    /// [`OBJECTIVES_PER_TICK`].
    pub objectives: Box<[(u8, [u32; 2])]>,
}

impl ModelTick {
    fn is_empty(&self) -> bool {
        self.requests.iter().all(|&n| n == 0)
            && self.output_tokens == 0
            && self.ttft.iter().all(|&n| n == 0)
            && self.itl.iter().all(|&n| n == 0)
            && self.objectives.is_empty()
    }

    /// Heap bytes beside the struct itself.
    fn heap_bytes(&self) -> usize {
        (self.ttft.len() + self.itl.len()) * size_of::<u32>()
            + self.objectives.len() * size_of::<(u8, [u32; 2])>()
    }
}

/// One tick: when it was taken (ms since the Unix epoch) and what changed in it, by model
/// index.
#[derive(Clone, Debug, Default)]
pub struct Slot {
    pub at_ms: u64,
    pub models: Vec<(u16, ModelTick)>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Ring {
    /// Model names by index, in order of first sight.
    models: Vec<Arc<str>>,
    /// Each model's totals at the latest tick.
    previous: Vec<Totals>,
    slots: VecDeque<Slot>,
    /// Models left out because [`MAX_MODELS`] were kept already.
    models_over_cap: usize,
    over_cap: Vec<Arc<str>>,
    /// Finite bucket counts of the TTFT and ITL histograms (+1 for `+Inf` in each column).
    ttft_buckets: usize,
    itl_buckets: usize,
    /// Objective names by index, in order of first sight, at most [`OBJECTIVE_NAMES`].
    objectives: Vec<Arc<str>>,
}

fn delta(now: &Buckets, before: &Buckets, width: usize) -> (Box<[u32]>, f64) {
    let mut out = vec![0u32; width];
    for (i, slot) in out.iter_mut().enumerate() {
        let a = now.counts.get(i).copied().unwrap_or(0);
        let b = before.counts.get(i).copied().unwrap_or(0);
        *slot = u32::try_from(a.saturating_sub(b)).unwrap_or(u32::MAX);
    }
    (out.into_boxed_slice(), (now.sum - before.sum).max(0.0))
}

/// What changed in each objective's counts since `before`, by objective index in
/// `names` (which gains the names first seen): only
/// the ones that changed, at most [`OBJECTIVES_PER_TICK`].
fn objective_deltas(
    names: &mut Vec<Arc<str>>,
    now: &BTreeMap<Arc<str>, [u64; 2]>,
    before: &BTreeMap<Arc<str>, [u64; 2]>,
) -> Box<[(u8, [u32; 2])]> {
    let mut out = Vec::new();
    for (name, counts) in now {
        let was = before.get(name).copied().unwrap_or_default();
        let changed = [
            count_delta(counts[0], was[0]),
            count_delta(counts[1], was[1]),
        ];
        if changed == [0, 0] || out.len() == OBJECTIVES_PER_TICK {
            continue;
        }
        let index = match names.iter().position(|o| o == name) {
            Some(i) => i,
            None if names.len() < OBJECTIVE_NAMES => {
                names.push(name.clone());
                names.len() - 1
            }
            None => continue,
        };
        // OBJECTIVE_NAMES fits in a u8.
        out.push((index as u8, changed));
    }
    out.into_boxed_slice()
}

fn count_delta(now: u64, before: u64) -> u32 {
    u32::try_from(now.saturating_sub(before)).unwrap_or(u32::MAX)
}

impl Ring {
    /// Take the totals of a tick at `at_ms`: the difference from the previous tick's is
    /// the new slot (a model seen for the first time counts from zero); the oldest slot
    /// goes once [`SLOTS`] are kept.
    pub fn push(&mut self, at_ms: u64, totals: Vec<(Arc<str>, Totals)>) {
        let mut slot = Slot {
            at_ms,
            models: Vec::new(),
        };
        for (model, now) in totals {
            self.ttft_buckets = self.ttft_buckets.max(now.ttft.counts.len());
            self.itl_buckets = self.itl_buckets.max(now.itl.counts.len());
            let index = match self.models.iter().position(|m| *m == model) {
                Some(i) => i,
                None if is_fold(&model) || self.named_models() < MAX_MODELS => {
                    self.models.push(model);
                    self.previous.push(Totals::default());
                    self.models.len() - 1
                }
                None => {
                    if !self.over_cap.contains(&model) {
                        self.over_cap.push(model);
                        self.models_over_cap += 1;
                    }
                    continue;
                }
            };
            let before = &self.previous[index];
            let mut tick = ModelTick::default();
            for (i, n) in tick.requests.iter_mut().enumerate() {
                *n = count_delta(now.requests[i], before.requests[i]);
            }
            tick.output_tokens = now.output_tokens.saturating_sub(before.output_tokens);
            (tick.ttft, tick.ttft_sum) = delta(&now.ttft, &before.ttft, self.ttft_buckets);
            (tick.itl, tick.itl_sum) = delta(&now.itl, &before.itl, self.itl_buckets);
            tick.objectives =
                objective_deltas(&mut self.objectives, &now.objectives, &before.objectives);
            self.previous[index] = now;
            if !tick.is_empty() {
                slot.models.push((index as u16, tick));
            }
        }
        slot.models.shrink_to_fit();
        if self.slots.capacity() < SLOTS {
            // All at once, and no more: the bound counts SLOTS slots.
            self.slots.reserve_exact(SLOTS - self.slots.len());
        }
        if self.slots.len() == SLOTS {
            self.slots.pop_front();
        }
        self.slots.push_back(slot);
    }

    pub fn models(&self) -> &[Arc<str>] {
        &self.models
    }

    /// Objective names by the index a [`ModelTick`] gives them.
    pub fn objectives(&self) -> &[Arc<str>] {
        &self.objectives
    }

    /// Models kept that are not `other` or `unknown`.
    fn named_models(&self) -> usize {
        self.models.iter().filter(|m| !is_fold(m)).count()
    }

    pub fn models_over_cap(&self) -> usize {
        self.models_over_cap
    }

    /// The slots, oldest first.
    pub fn slots(&self) -> &VecDeque<Slot> {
        &self.slots
    }

    /// The latest tick's time, if any.
    pub fn latest_ms(&self) -> Option<u64> {
        self.slots.back().map(|s| s.at_ms)
    }

    /// The figures of the last `ticks` slots, per model kept.
    pub fn window(&self, ticks: usize) -> Vec<Windowed> {
        let ticks = ticks.min(self.slots.len());
        let mut out: Vec<Windowed> = self
            .models
            .iter()
            .map(|m| Windowed {
                model: m.clone(),
                ticks,
                ..Windowed::default()
            })
            .collect();
        for slot in self.slots.iter().skip(self.slots.len() - ticks) {
            for (index, tick) in &slot.models {
                let w = &mut out[usize::from(*index)];
                for (a, b) in w.requests.iter_mut().zip(tick.requests) {
                    *a += u64::from(b);
                }
                w.output_tokens += tick.output_tokens;
                w.ttft.add(&tick.ttft, tick.ttft_sum);
                w.itl.add(&tick.itl, tick.itl_sum);
                for (objective, [met, missed]) in &tick.objectives {
                    let Some(name) = self.objectives.get(usize::from(*objective)) else {
                        continue;
                    };
                    let counts = w.objectives.entry(name.clone()).or_default();
                    counts[0] += u64::from(*met);
                    counts[1] += u64::from(*missed);
                }
            }
        }
        out
    }

    /// Memory the slots hold now, in bytes.
    pub fn bytes(&self) -> usize {
        let entry = size_of::<(u16, ModelTick)>();
        self.slots.capacity() * size_of::<Slot>()
            + self
                .slots
                .iter()
                .map(|s| {
                    s.models.capacity() * entry
                        + s.models.iter().map(|(_, t)| t.heap_bytes()).sum::<usize>()
                })
                .sum::<usize>()
    }

    /// The most the slots can hold, with `buckets` finite bounds in each histogram: every
    /// slot with every kept model, `other` and `unknown` included, each judged against
    /// [`OBJECTIVES_PER_TICK`] objectives.
    pub fn max_bytes(buckets: usize) -> usize {
        let entry = size_of::<(u16, ModelTick)>()
            + 2 * (buckets + 1) * size_of::<u32>()
            + OBJECTIVES_PER_TICK * size_of::<(u8, [u32; 2])>();
        SLOTS * (size_of::<Slot>() + (MAX_MODELS + 2) * entry)
    }
}

/// One model's figures over a window of ticks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Windowed {
    pub model: Arc<str>,
    /// Ticks the window covers (fewer than asked while the ring fills).
    pub ticks: usize,
    pub requests: [u64; OUTCOMES],
    pub output_tokens: u64,
    pub ttft: Buckets,
    pub itl: Buckets,
    /// Requests judged against each objective in the window: met, missed.
    pub objectives: BTreeMap<Arc<str>, [u64; 2]>,
}

impl Windowed {
    pub fn request_count(&self) -> u64 {
        self.requests.iter().sum()
    }
}

/// The `q` quantile (0..=1) of a histogram's non-cumulative `counts` (one per finite
/// bound in `bounds`, then `+Inf`), as Prometheus' `histogram_quantile` reads classic
/// buckets: linear within the bucket the rank falls in, from 0 below the first bound; in
/// the `+Inf` bucket, the last finite bound. `None` without observations.
pub fn quantile(q: f64, bounds: &[f64], counts: &[u64]) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 || bounds.is_empty() {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0u64;
    for (i, &count) in counts.iter().enumerate() {
        let cumulative = below + count;
        if cumulative as f64 >= rank && count > 0 {
            let Some(&upper) = bounds.get(i) else {
                return bounds.last().copied();
            };
            let lower = if i == 0 {
                0.0_f64.min(upper)
            } else {
                bounds[i - 1]
            };
            let within = (rank - below as f64) / count as f64;
            return Some(lower + (upper - lower) * within);
        }
        below = cumulative;
    }
    bounds.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::outcome::{StatusClass, Verdict};
    use std::time::Duration;

    const BOUNDS: [f64; 4] = [0.1, 0.2, 0.5, 1.0];

    fn counts_of(observations: &[f64]) -> Vec<u64> {
        let mut counts = vec![0; BOUNDS.len() + 1];
        for &v in observations {
            let i = BOUNDS.iter().position(|&b| v <= b).unwrap_or(BOUNDS.len());
            counts[i] += 1;
        }
        counts
    }

    #[test]
    fn quantiles_from_buckets_interpolate_as_prometheus_does() {
        // 10 observations: 4 in (0, 0.1], 4 in (0.1, 0.2], 2 in (0.5, 1].
        let obs = [0.05, 0.05, 0.05, 0.05, 0.15, 0.15, 0.15, 0.15, 0.7, 0.9];
        let counts = counts_of(&obs);
        assert_eq!(counts, [4, 4, 0, 2, 0]);
        // p50: rank 5, the first of the second bucket's 4: 0.1 + 0.1 * 1/4.
        assert!((quantile(0.5, &BOUNDS, &counts).unwrap() - 0.125).abs() < 1e-12);
        // p40: rank 4, the top of the first bucket.
        assert!((quantile(0.4, &BOUNDS, &counts).unwrap() - 0.1).abs() < 1e-12);
        // p90: rank 9, half way through (0.5, 1].
        assert!((quantile(0.9, &BOUNDS, &counts).unwrap() - 0.75).abs() < 1e-12);
        assert_eq!(quantile(0.5, &BOUNDS, &[0, 0, 0, 0, 0]), None);
        // In +Inf: the last finite bound.
        assert_eq!(quantile(0.99, &BOUNDS, &[1, 0, 0, 0, 9]), Some(1.0));
        // Each quantile of known observations lands in the bucket that holds the true one.
        let obs: Vec<f64> = (1..=100).map(|i| f64::from(i) / 100.0).collect();
        let counts = counts_of(&obs);
        for q in [0.5, 0.9, 0.99] {
            let got = quantile(q, &BOUNDS, &counts).unwrap();
            let truth = obs[(q * 100.0) as usize - 1];
            let bucket = |v: f64| BOUNDS.iter().position(|&b| v <= b);
            assert_eq!(bucket(got), bucket(truth), "q {q}: {got} vs {truth}");
        }
    }

    fn totals(requests: u64, tokens: u64, ttft: &[u64], itl: &[u64]) -> Totals {
        let mut t = Totals::default();
        t.requests[0] = requests;
        t.output_tokens = tokens;
        t.ttft.counts = ttft.to_vec();
        t.itl.counts = itl.to_vec();
        t
    }

    #[test]
    fn the_ring_keeps_deltas_and_windows_add_them_up() {
        let mut ring = Ring::default();
        let m: Arc<str> = Arc::from("m");
        // A model first seen with totals counts them all in its first tick.
        ring.push(
            1000,
            vec![(m.clone(), totals(2, 10, &[1, 1, 0], &[5, 0, 0]))],
        );
        ring.push(
            2000,
            vec![(m.clone(), totals(2, 10, &[1, 1, 0], &[5, 0, 0]))],
        );
        ring.push(
            3000,
            vec![(m.clone(), totals(5, 40, &[1, 3, 1], &[5, 20, 5]))],
        );
        assert_eq!(ring.slots().len(), 3);
        // The quiet tick keeps no entry.
        assert!(ring.slots()[1].models.is_empty());
        let last = &ring.slots()[2].models[0].1;
        assert_eq!(last.requests[0], 3);
        assert_eq!(last.output_tokens, 30);
        assert_eq!(&*last.ttft, &[0, 2, 1]);
        assert_eq!(&*last.itl, &[0, 20, 5]);
        let w = &ring.window(2)[0];
        assert_eq!((w.ticks, w.request_count(), w.output_tokens), (2, 3, 30));
        assert_eq!(w.itl.counts, [0, 20, 5]);
        let all = &ring.window(60)[0];
        assert_eq!(
            (all.ticks, all.request_count(), all.output_tokens),
            (3, 5, 40)
        );
        assert_eq!(all.ttft.counts, [1, 3, 1]);
    }

    #[test]
    fn the_ring_wraps_around_and_stays_bounded() {
        let mut ring = Ring::default();
        let buckets = 20;
        for tick in 0..(SLOTS as u64 * 2 + 7) {
            let cumulative = tick + 1;
            let models = (0..MAX_MODELS + 5)
                .map(|i| {
                    let counts = vec![cumulative; buckets + 1];
                    let mut totals = totals(cumulative, cumulative, &counts, &counts);
                    for o in 0..OBJECTIVES_PER_TICK {
                        let name = Arc::from(format!("objective-{o}"));
                        totals.objectives.insert(name, [cumulative, cumulative]);
                    }
                    (Arc::from(format!("model-{i:02}")), totals)
                })
                .collect();
            ring.push(tick * 1000, models);
        }
        assert_eq!(ring.slots().len(), SLOTS);
        assert_eq!(
            ring.slots().front().unwrap().at_ms,
            (SLOTS as u64 + 7) * 1000
        );
        assert_eq!(ring.models().len(), MAX_MODELS);
        assert_eq!(ring.models_over_cap(), 5);
        // Every slot holds every kept model's one-per-tick change.
        let w = ring.window(SLOTS);
        assert!(w.iter().all(|w| w.request_count() == SLOTS as u64));
        let bytes = ring.bytes();
        assert!(bytes <= Ring::max_bytes(buckets), "{bytes}");
        assert!(bytes * 10 >= Ring::max_bytes(buckets) * 9, "{bytes}");
        // The bound, stated in docs/PERFORMANCE.md: about 7.5 MiB with 20 buckets.
        assert!(
            Ring::max_bytes(buckets) < 8 << 20,
            "{}",
            Ring::max_bytes(buckets)
        );
    }

    /// Past the label cap the metrics fold models into `other`: the view keeps it (and
    /// `unknown`) however many models filled its places first.
    #[test]
    fn other_and_unknown_are_kept_past_the_model_cap() {
        let mut ring = Ring::default();
        let mut models: Vec<(Arc<str>, Totals)> = (0..MAX_MODELS + 3)
            .map(|i| (Arc::from(format!("model-{i:02}")), totals(1, 1, &[1], &[1])))
            .collect();
        ring.push(1000, models.clone());
        models.push((Arc::from("other"), totals(7, 70, &[7], &[7])));
        models.push((Arc::from("unknown"), totals(2, 20, &[2], &[2])));
        ring.push(2000, models);
        assert_eq!(ring.models().len(), MAX_MODELS + 2);
        assert_eq!(ring.models_over_cap(), 3);
        let window = ring.window(10);
        let other = window
            .iter()
            .find(|w| &*w.model == "other")
            .expect("other kept");
        assert_eq!((other.request_count(), other.output_tokens), (7, 70));
        let unknown = window
            .iter()
            .find(|w| &*w.model == "unknown")
            .expect("unknown kept");
        assert_eq!(unknown.request_count(), 2);
        // A model named like a fold value takes no second place.
        ring.push(3000, vec![(Arc::from("other"), totals(8, 80, &[8], &[8]))]);
        assert_eq!(ring.models().len(), MAX_MODELS + 2);
    }

    #[test]
    fn the_bound_with_the_default_buckets() {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        let b = &config.metrics.buckets;
        let widest = b
            .time_to_first_token_seconds
            .len()
            .max(b.inter_token_latency_seconds.len());
        let bound = Ring::max_bytes(widest);
        println!(
            "ring bound with the default buckets ({} TTFT, {} ITL): {bound} bytes; one model over ten minutes: {} bytes",
            b.time_to_first_token_seconds.len(),
            b.inter_token_latency_seconds.len(),
            bound / (MAX_MODELS + 2)
        );
        // docs/PERFORMANCE.md and docs/LIVE.md state "at most about 7.5 MiB".
        assert!(bound < 8 << 20, "{bound}");
    }

    #[test]
    fn totals_sum_tenants_and_statuses_per_model() {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        let metrics = Metrics::new(&config.metrics.buckets, &config.labels);
        let a = metrics.stream(Some("a"), Some("t1"));
        let a2 = metrics.stream(Some("a"), Some("t2"));
        let b = metrics.stream(Some("b"), None);
        let completed = Verdict::new(Outcome::Completed, StatusClass::Success);
        let cancelled = Verdict::new(Outcome::Cancelled, StatusClass::None);
        let figures = crate::metrics::RequestFigures {
            duration: Duration::from_millis(100),
            output_tokens: 7,
            ..Default::default()
        };
        metrics.record_request(&a, completed, figures);
        metrics.record_request(&a2, cancelled, figures);
        metrics.record_request(&b, completed, figures);
        a.ttft().observe(0.05);
        a2.ttft().observe(0.3);
        a.observe_itl(Duration::from_millis(20), 4);
        metrics.count_objective(&a, "chat", true, 7);
        metrics.count_objective(&a2, "chat", false, 7);
        metrics.count_objective(&a2, "chat", true, 7);
        metrics.count_objective(&a, "batch", false, 7);
        let snapshot = metrics.snapshot_of(&FAMILIES);
        let t = super::totals(&snapshot, metrics.objective_totals());
        assert_eq!(t.len(), 2);
        let (model, a) = &t[0];
        assert_eq!(&**model, "a");
        assert_eq!(a.requests[0], 1);
        assert_eq!(a.requests[1], 1);
        assert_eq!(a.output_tokens, 14);
        assert_eq!(a.ttft.count(), 2);
        assert_eq!(a.itl.count(), 4);
        assert_eq!(t[1].1.requests.iter().sum::<u64>(), 1);
        // Objectives are summed over tenants, met then missed.
        let judged: Vec<(&str, [u64; 2])> = a.objectives.iter().map(|(o, &n)| (&**o, n)).collect();
        assert_eq!(judged, [("batch", [0, 1]), ("chat", [2, 1])]);
        assert!(t[1].1.objectives.is_empty());
    }

    #[test]
    fn objectives_are_kept_per_tick_and_added_up_per_window() {
        let mut ring = Ring::default();
        let m: Arc<str> = Arc::from("m");
        let with = |met: u64, missed: u64, other: u64| {
            let mut t = totals(0, 0, &[0], &[0]);
            t.objectives.insert(Arc::from("chat"), [met, missed]);
            if other > 0 {
                t.objectives.insert(Arc::from("batch"), [other, 0]);
            }
            t
        };
        ring.push(1000, vec![(m.clone(), with(3, 1, 0))]);
        ring.push(2000, vec![(m.clone(), with(3, 1, 0))]);
        ring.push(3000, vec![(m.clone(), with(10, 2, 4))]);
        // A tick in which nothing was judged keeps no entry at all.
        assert!(ring.slots()[1].models.is_empty());
        let last = &ring.slots()[2].models[0].1;
        let names = ring.objectives();
        let last: Vec<(&str, [u32; 2])> = last
            .objectives
            .iter()
            .map(|(i, n)| (&*names[usize::from(*i)], *n))
            .collect();
        assert_eq!(last, [("batch", [4, 0]), ("chat", [7, 1])]);
        let w = &ring.window(2)[0];
        let judged: Vec<(&str, [u64; 2])> = w.objectives.iter().map(|(o, &n)| (&**o, n)).collect();
        assert_eq!(judged, [("batch", [4, 0]), ("chat", [7, 1])]);
        assert_eq!(
            ring.window(60)[0].objectives[&Arc::<str>::from("chat")],
            [10, 2]
        );
    }

    #[test]
    fn a_tick_keeps_at_most_its_share_of_objectives() {
        let mut ring = Ring::default();
        let mut t = totals(0, 0, &[0], &[0]);
        for i in 0..OBJECTIVES_PER_TICK + 3 {
            t.objectives.insert(Arc::from(format!("o{i:02}")), [1, 0]);
        }
        ring.push(1000, vec![(Arc::from("m"), t)]);
        assert_eq!(
            ring.slots()[0].models[0].1.objectives.len(),
            OBJECTIVES_PER_TICK
        );
        // Names are bounded over the ring's life too.
        for round in 0..(OBJECTIVE_NAMES / OBJECTIVES_PER_TICK + 2) as u64 {
            let mut t = totals(0, 0, &[0], &[0]);
            for i in 0..OBJECTIVES_PER_TICK {
                t.objectives
                    .insert(Arc::from(format!("r{round}-{i}")), [1, 0]);
            }
            ring.push(2000 + round, vec![(Arc::from("m"), t)]);
        }
        assert_eq!(ring.objectives().len(), OBJECTIVE_NAMES);
    }
}
