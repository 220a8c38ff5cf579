//! A typed copy of every family at one instant: what [`Metrics::snapshot`] returns.
//!
//! `/metrics` text is written straight from the live atomics (`exposition`) because with
//! thousands of label pairs a copy would cost most of a scrape; everything else that reads
//! the families as values (the demo's summary, tests, an encoder of another exposition
//! format) reads this instead: plain owned data, families in name order, each series with
//! its labels in name order, histograms as their classic buckets, sum and count (and
//! native buckets and exemplars where kept). Nearly a leaf: it imports only the exemplar
//! data type (itself a leaf) from the rest of `metrics`, so an encoder built on it
//! depends on nothing else.
//!
//! [`Metrics::snapshot`]: super::Metrics::snapshot

use std::borrow::Cow;
use std::sync::Arc;

pub use super::exemplar::{Exemplar, TraceContext};

/// Every family with at least one series, sorted by name (the order of the text
/// exposition), the process collector's included.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub families: Vec<FamilySnapshot>,
}

impl Snapshot {
    /// The family called `name`, if it has any series.
    pub fn family(&self, name: &str) -> Option<&FamilySnapshot> {
        self.families.iter().find(|f| f.name == name)
    }
}

/// One metric family: its name, help text and series.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilySnapshot {
    pub name: Cow<'static, str>,
    pub help: Cow<'static, str>,
    pub values: Values,
}

/// A family's series, typed by the family's kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Monotonic counts. `f64` as the exposition formats carry them: a count above 2^53
    /// is the float it rounds to, as the text prints it.
    Counter(Vec<Series<f64>>),
    Gauge(Vec<Series<f64>>),
    Histogram(Vec<Series<HistogramSnapshot>>),
}

impl Values {
    /// Whether there is no series at all.
    pub fn is_empty(&self) -> bool {
        match self {
            Values::Counter(series) | Values::Gauge(series) => series.is_empty(),
            Values::Histogram(series) => series.is_empty(),
        }
    }
}

/// One labelled series of a family, in the order the text exposition lists them.
#[derive(Clone, Debug, PartialEq)]
pub struct Series<T> {
    /// Sorted by label name.
    pub labels: Vec<Label>,
    pub value: T,
}

impl<T> Series<T> {
    /// The value of the label called `name`, if the series has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|l| l.name == name)
            .map(|l| &*l.value)
    }
}

/// A label of a series. Values are shared with the live series (`model`, `tenant`), so a
/// snapshot of thousands of pairs copies no label text.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub name: Cow<'static, str>,
    pub value: Arc<str>,
}

/// A classic histogram as read at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// The finite upper bounds, increasing; `+Inf` is implicit (its cumulative count is
    /// [`HistogramSnapshot::count`]).
    pub bounds: Arc<[f64]>,
    /// Observations `<=` each bound, one per bound.
    pub cumulative_counts: Vec<u64>,
    /// Every observation, those above the last bound included.
    pub count: u64,
    pub sum: f64,
    /// The native (sparse exponential) buckets of the same observations, when
    /// `metrics.native_histograms.enabled`.
    pub native: Option<NativeHistogramSnapshot>,
    /// Each classic bucket's latest exemplar, one per bound and then one for `+Inf`;
    /// empty when the histogram never had one.
    pub exemplars: Vec<Option<Exemplar>>,
    /// The native histogram's latest exemplars, oldest first (none without native
    /// buckets).
    pub native_exemplars: Vec<Exemplar>,
}

/// A native histogram as read at one instant: Prometheus' sparse exponential buckets,
/// positive only (bucket `i` holds `(base^(i-1), base^i]`, `base = 2^(2^-schema)`).
#[derive(Clone, Debug, PartialEq)]
pub struct NativeHistogramSnapshot {
    pub schema: i32,
    /// Values at or below it are counted in `zero_count`.
    pub zero_threshold: f64,
    pub zero_count: u64,
    /// `(bucket index, count)` of every populated bucket, index increasing.
    pub buckets: Vec<(i32, u64)>,
}

impl NativeHistogramSnapshot {
    /// Every observation the native buckets hold (the zero bucket's included). Read at
    /// its own instant, it may differ from the classic [`HistogramSnapshot::count`] by
    /// observations made while the scrape read the two.
    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .fold(self.zero_count, |total, (_, n)| total.wrapping_add(*n))
    }

    /// The estimated `q`-quantile, the way Prometheus 2.x's `histogram_quantile` reads a
    /// native histogram: the bucket holding rank `q * count`, interpolated linearly
    /// within it (the zero bucket spans `[0, zero_threshold]`). Its error is at most the
    /// bucket's width, `base - 1` of the value (~9% at schema 3, far less where a
    /// bucket's observations spread evenly). `None` with no observations or `q` outside
    /// `0..=1`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let count = self.count();
        if count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let base = 2f64.powf(2f64.powi(-self.schema));
        let rank = q * count as f64;
        let zero = (0.0, self.zero_threshold, self.zero_count);
        let buckets = self
            .buckets
            .iter()
            .map(|&(index, n)| (base.powi(index - 1), base.powi(index), n));
        let mut below = 0u64;
        for (lower, upper, n) in std::iter::once(zero).chain(buckets) {
            let cumulative = below.wrapping_add(n);
            if n > 0 && cumulative as f64 >= rank {
                return Some(lower + (upper - lower) * (rank - below as f64) / n as f64);
            }
            below = cumulative;
        }
        None
    }
}

impl HistogramSnapshot {
    /// `(upper bound, cumulative count)` of each finite bucket, increasing.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds
            .iter()
            .copied()
            .zip(self.cumulative_counts.iter().copied())
    }

    /// The estimated `q`-quantile, interpolated linearly within its bucket the way
    /// Prometheus' `histogram_quantile` does (so it carries an error of up to the
    /// bucket's width). `None` with no observations or `q` outside `0..=1`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = q * self.count as f64;
        let mut lower_bound = 0.0;
        let mut lower_count = 0u64;
        for (upper, cumulative) in self.buckets() {
            if cumulative as f64 >= rank && cumulative > lower_count {
                let in_bucket = (cumulative - lower_count) as f64;
                return Some(
                    lower_bound + (upper - lower_bound) * (rank - lower_count as f64) / in_bucket,
                );
            }
            lower_bound = upper;
            lower_count = cumulative;
        }
        // The rank falls in the +Inf bucket: Prometheus answers the highest finite bound.
        self.bounds.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A histogram with the given `(upper bound, cumulative count)` buckets and total.
    fn histogram(buckets: &[(f64, u64)], count: u64) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: buckets.iter().map(|(bound, _)| *bound).collect(),
            cumulative_counts: buckets.iter().map(|(_, n)| *n).collect(),
            count,
            sum: 0.0,
            native: None,
            exemplars: Vec::new(),
            native_exemplars: Vec::new(),
        }
    }

    #[test]
    fn native_quantile_interpolates_within_the_bucket_like_prometheus() {
        // Schema 0 (base 2): bucket 1 is (1, 2], bucket 2 is (2, 4].
        let native = NativeHistogramSnapshot {
            schema: 0,
            zero_threshold: 0.5,
            zero_count: 2,
            buckets: vec![(1, 4), (2, 4)],
        };
        // Rank 1 of 10 is half-way through the zero bucket [0, 0.5].
        assert_eq!(native.quantile(0.1), Some(0.25));
        // Rank 4: two of bucket 1's four observations in, half-way from 1 to 2.
        assert_eq!(native.quantile(0.4), Some(1.5));
        // Rank 8: two of bucket 2's four observations in, half-way from 2 to 4.
        assert_eq!(native.quantile(0.8), Some(3.0));
        assert_eq!(native.quantile(1.0), Some(4.0));
        assert_eq!(native.quantile(1.5), None);
        let empty = NativeHistogramSnapshot {
            zero_count: 0,
            buckets: Vec::new(),
            ..native
        };
        assert_eq!(empty.quantile(0.5), None);
    }

    #[test]
    fn quantile_interpolates_like_prometheus() {
        // 10 observations in (0, 0.1], 10 in (0.1, 0.2]: p50 = 0.1, p75 = 0.15.
        let buckets = [(0.1, 10), (0.2, 20), (0.4, 20)];
        assert_eq!(histogram(&buckets, 20).quantile(0.5), Some(0.1));
        assert!((histogram(&buckets, 20).quantile(0.75).unwrap() - 0.15).abs() < 1e-12);
        assert_eq!(histogram(&buckets, 0).quantile(0.5), None);
        // Everything beyond the last bound: the last bound.
        assert_eq!(histogram(&[(0.1, 0)], 5).quantile(0.99), Some(0.1));
    }
}
