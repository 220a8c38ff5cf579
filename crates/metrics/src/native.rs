//! Prometheus native histograms: sparse exponential buckets kept beside each classic
//! histogram, so a scraper that asks for the protobuf format gets quantiles with a known,
//! small relative error instead of an interpolation across a classic bucket's width.
//!
//! The bucket layout is Prometheus' own: at schema `s` the base is `2^(2^-s)` and bucket
//! `i` holds the values in `(base^(i-1), base^i]`; values `<=` the zero threshold go to
//! the zero bucket. Only positive buckets exist: every tokentap histogram observes a
//! duration or a rate, never a negative value.
//!
//! Observing stays lock-free and allocation-free: each histogram owns a fixed array of
//! atomic counters, allocated when its series is created, over a bounded index range
//! taken from the family's classic buckets (finding the bucket is a power of two, a table
//! lookup on the mantissa's top bits and one comparison: ~4-5 ns more per observation
//! than the classic buckets alone):
//!
//! - the zero threshold is the largest power of two at or below half the first classic
//!   bound (e.g. 2^-8 s = 3.9 ms for TTFT's 10 ms), so it is a bucket boundary at every
//!   schema >= 0 (and at the stored schema when it is negative): values at or below it are
//!   counted in the zero bucket, as Prometheus counts them;
//! - the top bucket's upper bound is a power of two at least twice the last classic bound
//!   (128 s for TTFT's 60 s); larger values, infinities and NaN fold into the top bucket,
//!   as the classic histogram counts them only in `+Inf`.
//!
//! That is 8 bytes per bucket: at the default schema 3 (8 buckets per doubling) the
//! default families span 13-18 doublings, 104-144 buckets, so about 1 KiB per histogram
//! and 7 KiB per (model, tenant) pair with its seven histograms (14 MB at the default
//! 2000 pairs); `metrics.native_histograms.enabled: false` allocates none of it.
//!
//! At exposition a histogram with more populated buckets than `max_buckets` is reduced
//! the way Prometheus reduces one: the schema drops by one, merging each pair of adjacent
//! buckets, until it fits (or the schema reaches -4).

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(clippy::indexing_slicing)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::snapshot::NativeHistogramSnapshot;

/// The coarsest schema Prometheus accepts (base 2^16).
pub const MIN_SCHEMA: i8 = -4;
/// The finest schema Prometheus accepts (base 2^(1/256)).
pub const MAX_SCHEMA: i8 = 8;
/// The default growth factor (`metrics.native_histograms.factor`): schema 3, at most
/// ~4.3% relative error on a quantile.
pub const DEFAULT_FACTOR: f64 = 1.1;
/// The default `metrics.native_histograms.max_buckets`: room for a default family's whole
/// native range at schema 3 (104-144 buckets).
pub const DEFAULT_MAX_BUCKETS: usize = 160;

/// What every native histogram shares (from `metrics.native_histograms`).
#[derive(Clone, Debug)]
pub struct NativeSettings {
    schema: i8,
    max_buckets: usize,
    /// `2^(j / 2^schema)` for `j` in `0..=2^schema` (schema > 0; empty otherwise): the
    /// bucket bounds within one power of two, computed once.
    boundaries: Arc<[f64]>,
    /// For schema > 0: the mantissa range [1, 2) cut into `2^(schema + 2)` equal cells,
    /// each cell's first boundary not below the cell's start. A bucket is wider than a
    /// cell (`2^(2^-s) - 1 >= 0.69 / 2^s > 1 / 2^(s+2)`), so a value's bucket is that
    /// boundary or the next: one comparison instead of a search ([`NativeSettings::index`]).
    cells: Arc<[u16]>,
}

impl NativeSettings {
    /// Settings of a validated config: `schema` within [`MIN_SCHEMA`]`..=`[`MAX_SCHEMA`],
    /// `max_buckets` at least 1. Anything else is a programming error.
    pub fn new(schema: i8, max_buckets: usize) -> NativeSettings {
        assert!(
            (MIN_SCHEMA..=MAX_SCHEMA).contains(&schema) && max_buckets >= 1,
            "native histogram schema {schema} or max_buckets {max_buckets} out of range"
        );
        let boundaries = if schema > 0 {
            let per_doubling = 1u32 << schema;
            (0..=per_doubling)
                .map(|j| (f64::from(j) / f64::from(per_doubling)).exp2())
                .collect()
        } else {
            Arc::from(Vec::new())
        };
        let cells = if schema > 0 {
            let count = 1u32 << schema.saturating_add(2);
            (0..count)
                .map(|k| {
                    let start = 1.0 + f64::from(k) / f64::from(count);
                    boundaries.partition_point(|b| *b < start) as u16
                })
                .collect()
        } else {
            Arc::from(Vec::new())
        };
        NativeSettings {
            schema,
            max_buckets,
            boundaries,
            cells,
        }
    }

    /// [`bucket_index`] of `v` (positive, normal, finite) at this schema, with the
    /// cell table in place of the binary search.
    fn index(&self, v: f64) -> i32 {
        if self.schema <= 0 {
            return bucket_index(v, self.schema, &self.boundaries);
        }
        let (fraction, exponent) = frexp(v);
        let mantissa = 2.0 * fraction;
        // Exact in wrapping arithmetic, which the checks would only slow down (this runs
        // on every observation): the schema is 1..=8 here, so the shift is 42..=49, and
        // an f64's exponent lies within +-1075, so the index within +-2^19. The tables are
        // made for this schema (`new`), so every lookup hits.
        let shift = 50u32.wrapping_sub(self.schema.unsigned_abs().into());
        let cell = (v.to_bits() & ((1 << 52) - 1)).wrapping_shr(shift);
        let candidate = self.cells.get(cell as usize).map_or(0, |&c| usize::from(c));
        let above = self
            .boundaries
            .get(candidate)
            .is_some_and(|&b| b < mantissa);
        let within = (candidate as i32).wrapping_add(i32::from(above));
        exponent
            .wrapping_sub(1)
            .wrapping_shl(self.schema.unsigned_abs().into())
            .wrapping_add(within)
    }

    pub fn schema(&self) -> i8 {
        self.schema
    }
}

/// The schema whose bucket factor `2^(2^-schema)` is the largest not above `factor`
/// (as Prometheus' Go client picks it), clamped to the valid schemas. `factor > 1`.
pub fn schema_for_factor(factor: f64) -> i8 {
    let schema = (-factor.log2().log2()).ceil();
    schema.clamp(f64::from(MIN_SCHEMA), f64::from(MAX_SCHEMA)) as i8
}

/// `v = fraction * 2^exponent` with `fraction` in `[0.5, 1)`, for a positive normal `v`.
fn frexp(v: f64) -> (f64, i32) {
    let bits = v.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52));
    // `biased` is 0..=2047: no overflow.
    (fraction, biased.wrapping_sub(1022))
}

/// The index of the bucket that holds `v` (positive, normal, finite) at `schema`:
/// the `i` with `base^(i-1) < v <= base^i`, computed as Prometheus does (a power of two
/// and its fraction, the fraction looked up in `boundaries`).
pub fn bucket_index(v: f64, schema: i8, boundaries: &[f64]) -> i32 {
    let (fraction, exponent) = frexp(v);
    if schema > 0 {
        // `2 * fraction` is in [1, 2): the first boundary not below it is the bucket.
        let mantissa = 2.0 * fraction;
        let within = boundaries.partition_point(|b| *b < mantissa) as i32;
        exponent
            .saturating_sub(1)
            .saturating_mul(1i32.checked_shl(schema.unsigned_abs().into()).unwrap_or(1))
            .saturating_add(within)
    } else {
        // An exact power of two is the upper bound of its bucket.
        let log2_ceil = if fraction == 0.5 {
            exponent.saturating_sub(1)
        } else {
            exponent
        };
        let shift = u32::from(schema.unsigned_abs());
        let width = 1i32.checked_shl(shift).unwrap_or(i32::MAX);
        log2_ceil
            .saturating_add(width)
            .saturating_sub(1)
            .checked_shr(shift)
            .unwrap_or(0)
    }
}

/// The upper bound `base^index` of a bucket at `schema`: a power of two times the same
/// `2^(j / 2^schema)` the bucket lookup compares with, so the two agree to the bit.
pub fn upper_bound(index: i32, schema: i8) -> f64 {
    if schema > 0 {
        let per_doubling = 1i32 << schema;
        let within = f64::from(index.rem_euclid(per_doubling)) / f64::from(per_doubling);
        within.exp2() * f64::from(index.div_euclid(per_doubling)).exp2()
    } else {
        let shift = u32::from(schema.unsigned_abs());
        f64::from(index.checked_shl(shift).unwrap_or(i32::MAX)).exp2()
    }
}

/// One histogram's native buckets.
pub struct NativeHistogram {
    settings: NativeSettings,
    zero_threshold: f64,
    /// The index of `counts[0]`.
    min_index: i32,
    zero: AtomicU64,
    counts: Box<[AtomicU64]>,
}

impl NativeHistogram {
    /// The buckets of a histogram whose classic bounds are `bounds` (positive, finite,
    /// increasing; at least one): the range described in the module docs.
    pub fn new(settings: &NativeSettings, bounds: &[f64]) -> NativeHistogram {
        let (first, last) = match (bounds.first(), bounds.last()) {
            (Some(first), Some(last)) => (*first, *last),
            _ => (1.0, 1.0),
        };
        // Powers of two around the classic range, aligned to whole buckets of a negative
        // schema so that both ends are bucket boundaries at the stored schema.
        let shift = u32::from(settings.schema.min(0).unsigned_abs());
        let width = 1i32.checked_shl(shift).unwrap_or(1);
        let low = frexp(first)
            .1
            .saturating_sub(2)
            .max(-1000)
            .div_euclid(width)
            .saturating_mul(width);
        let high = {
            let top = frexp(last).1.saturating_add(1);
            top.saturating_add(width)
                .saturating_sub(1)
                .div_euclid(width)
                .saturating_mul(width)
        };
        let zero_threshold = f64::from(low).exp2();
        let min_index =
            bucket_index(zero_threshold, settings.schema, &settings.boundaries).saturating_add(1);
        let max_index = bucket_index(
            f64::from(high).exp2(),
            settings.schema,
            &settings.boundaries,
        );
        NativeHistogram {
            settings: settings.clone(),
            zero_threshold,
            min_index,
            zero: AtomicU64::new(0),
            counts: (min_index..=max_index).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Count `v` in its bucket (see the module docs for values outside the range).
    pub fn observe(&self, v: f64) {
        self.observe_n(v, 1);
    }

    /// Count `v` `n` times, in one step.
    pub fn observe_n(&self, v: f64, n: u64) {
        if v <= self.zero_threshold {
            self.zero.fetch_add(n, Ordering::Relaxed);
            return;
        }
        // `new` makes at least one bucket.
        let top = self.counts.len().saturating_sub(1);
        let slot = if v.is_finite() {
            let index = self.settings.index(v);
            // Both indexes lie within +-2^19 (`index`): the difference is exact.
            usize::try_from(index.wrapping_sub(self.min_index)).map_or(0, |slot| slot.min(top))
        } else {
            top
        };
        if let Some(count) = self.counts.get(slot) {
            count.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The populated buckets as they are now, reduced to `max_buckets`.
    pub fn read(&self) -> NativeHistogramSnapshot {
        let mut buckets = Vec::new();
        for (index, count) in (self.min_index..).zip(self.counts.iter()) {
            let n = count.load(Ordering::Relaxed);
            if n > 0 {
                buckets.push((index, n));
            }
        }
        let mut schema = self.settings.schema;
        while buckets.len() > self.settings.max_buckets && schema > MIN_SCHEMA {
            reduce(&mut buckets);
            schema = schema.saturating_sub(1);
        }
        NativeHistogramSnapshot {
            schema: i32::from(schema),
            zero_threshold: self.zero_threshold,
            zero_count: self.zero.load(Ordering::Relaxed),
            buckets,
        }
    }
}

/// Halve the resolution of `(index, count)` buckets (increasing index): schema `s` to
/// `s - 1`, where bucket `i` becomes `ceil(i / 2)`, so buckets `2k - 1` and `2k` merge.
pub fn reduce(buckets: &mut Vec<(i32, u64)>) {
    let mut merged: Vec<(i32, u64)> = Vec::with_capacity((buckets.len() / 2).saturating_add(1));
    for &(index, count) in buckets.iter() {
        let coarser = index.saturating_add(1) >> 1;
        match merged.last_mut() {
            Some((last, n)) if *last == coarser => *n = n.saturating_add(count),
            _ => merged.push((coarser, count)),
        }
    }
    *buckets = merged;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Prometheus' definition, in exact arithmetic where it can be: the smallest `i`
    /// with `v <= base^i`, searched around `log2(v) * 2^schema`.
    fn reference_index(v: f64, schema: i8) -> i32 {
        let guess = (v.log2() * f64::from(schema).exp2()).ceil() as i32;
        (guess - 2..=guess + 2)
            .find(|i| v <= upper_bound(*i, schema))
            .expect("within two of the estimate")
    }

    #[test]
    fn factor_picks_the_schema_prometheus_picks() {
        assert_eq!(schema_for_factor(1.1), 3);
        assert_eq!(schema_for_factor(2.0), 0);
        assert_eq!(schema_for_factor(1.5), 1);
        assert_eq!(schema_for_factor(1.0001), MAX_SCHEMA);
        assert_eq!(schema_for_factor(1e9), MIN_SCHEMA);
        // Schema 3's factor 2^(1/8) ~ 1.0905: its worst relative quantile error is
        // (factor - 1) / (factor + 1) ~ 4.3%, inside the 5% the issue asks for.
        let factor = upper_bound(1, 3);
        assert!(((factor - 1.0) / (factor + 1.0)) < 0.05);
    }

    #[test]
    fn values_on_bounds_belong_to_the_bucket_they_close() {
        for schema in MIN_SCHEMA..=MAX_SCHEMA {
            let settings = NativeSettings::new(schema, 160);
            for index in -40..40 {
                let bound = upper_bound(index, schema);
                if !bound.is_normal() || !bound.is_finite() {
                    continue;
                }
                assert_eq!(
                    bucket_index(bound, schema, &settings.boundaries),
                    index,
                    "schema {schema} bound {bound}"
                );
                let above = f64::from_bits(bound.to_bits() + 1);
                assert_eq!(
                    bucket_index(above, schema, &settings.boundaries),
                    index + 1,
                    "schema {schema} just above {bound}"
                );
                let below = f64::from_bits(bound.to_bits() - 1);
                for (v, expected) in [(below, index), (bound, index), (above, index + 1)] {
                    assert_eq!(settings.index(v), expected, "schema {schema} value {v}");
                }
            }
        }
        // Powers of two are exact at every schema: 1 closes bucket 0, 2 closes 2^schema.
        let s3 = NativeSettings::new(3, 160);
        assert_eq!(bucket_index(1.0, 3, &s3.boundaries), 0);
        assert_eq!(bucket_index(2.0, 3, &s3.boundaries), 8);
        assert_eq!(bucket_index(1.5, 3, &s3.boundaries), 5); // 2^(4/8)=1.41 < 1.5 <= 2^(5/8)
        assert_eq!(bucket_index(0.75, -1, &[]), 0); // (1/4, 1]
        assert_eq!(bucket_index(3.0, -1, &[]), 1); // (1, 4]
        assert_eq!(bucket_index(5.0, -1, &[]), 2); // (4, 16]
    }

    proptest! {
        #[test]
        fn indexing_matches_the_formula(v in 1e-6f64..1e6, schema in MIN_SCHEMA..=MAX_SCHEMA) {
            let settings = NativeSettings::new(schema, 160);
            prop_assert_eq!(bucket_index(v, schema, &settings.boundaries), reference_index(v, schema));
            prop_assert_eq!(settings.index(v), reference_index(v, schema));
        }
    }

    #[test]
    fn the_range_spans_the_classic_buckets_with_the_zero_bucket_below() {
        let settings = NativeSettings::new(3, 1000);
        let h = NativeHistogram::new(&settings, &[0.01, 60.0]);
        assert_eq!(h.zero_threshold, 2f64.powi(-8));
        assert_eq!(h.counts.len(), 15 * 8, "2^-8 .. 2^7 at 8 per doubling");
        for v in [0.0, 1e-9, 2f64.powi(-8), -1.0] {
            h.observe(v);
        }
        let above_zero = f64::from_bits(2f64.powi(-8).to_bits() + 1);
        h.observe(above_zero);
        h.observe(0.1);
        for v in [128.0, 1e6, f64::INFINITY, f64::NAN] {
            h.observe(v);
        }
        let read = h.read();
        assert_eq!(read.zero_count, 4);
        assert_eq!(read.schema, 3);
        let index_01 = reference_index(0.1, 3);
        assert_eq!(read.buckets, [(-63, 1), (index_01, 1), (56, 4)]);
        assert_eq!(read.count(), 10);
    }

    #[test]
    fn a_negative_schema_keeps_both_ends_on_bucket_boundaries() {
        let settings = NativeSettings::new(-2, 160);
        let h = NativeHistogram::new(&settings, &[0.01, 60.0]);
        // Aligned down to a multiple of 4 doublings: 2^-8 is a boundary at schema -2.
        assert_eq!(h.zero_threshold, 2f64.powi(-8));
        assert_eq!(h.min_index, -1);
        assert_eq!(h.counts.len(), 4, "2^-8 .. 2^8 in buckets of 2^4");
    }

    #[test]
    fn too_many_buckets_halve_the_resolution_until_they_fit() {
        let settings = NativeSettings::new(3, 4);
        let h = NativeHistogram::new(&settings, &[0.001, 1000.0]);
        let values: Vec<f64> = (0..10).map(|i| 0.01 * 1.3f64.powi(i)).collect();
        for v in &values {
            h.observe(*v);
        }
        let read = h.read();
        assert!(read.buckets.len() <= 4, "{:?}", read.buckets);
        assert!(read.schema < 3);
        assert_eq!(read.count(), 10);
        // Each value is still in the bucket the formula puts it in at the reduced schema.
        let reduced = NativeSettings::new(i8::try_from(read.schema).expect("schema"), 4);
        let mut expected: Vec<(i32, u64)> = Vec::new();
        for v in &values {
            let index = bucket_index(*v, reduced.schema, &reduced.boundaries);
            match expected.last_mut() {
                Some((last, n)) if *last == index => *n += 1,
                _ => expected.push((index, 1)),
            }
        }
        assert_eq!(read.buckets, expected);
    }

    #[test]
    fn reduction_merges_pairs_ending_on_even_indices() {
        let mut buckets = vec![(-3, 1), (-2, 2), (-1, 3), (0, 4), (1, 5), (2, 6), (7, 7)];
        reduce(&mut buckets);
        // ceil(i / 2): -3 and -2 -> -1, -1 and 0 -> 0, 1 and 2 -> 1, 7 -> 4.
        assert_eq!(buckets, [(-1, 3), (0, 7), (1, 11), (4, 7)]);
    }
}
