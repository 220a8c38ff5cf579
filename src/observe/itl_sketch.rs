//! The median per-token ITL of one request, in bounded memory, for its span.
//!
//! A request's per-token ITL values arrive one share at a time (a gap split over the
//! tokens of its event: `count` tokens at `per_token` each). Keeping them all would grow
//! with the answer; the sketch keeps a count per log-linear bucket instead (HDR
//! histogram's layout): each power of two of nanoseconds is cut into 16 equal
//! sub-buckets, and values under 16 ns have a bucket each. A quantile is read as the
//! midpoint of the bucket that holds its rank, so it is within **1/32 (3.1 %)** of the
//! true value of that rank: a bucket `[16·2^k·(1 + j/16), +2^k)` is at most 1/16 of its
//! lower bound wide, and the midpoint is half of that from either end.
//!
//! Memory: one `u32` per bucket between the smallest and largest value seen (a request
//! whose gaps span 1 ms to 1 s holds 10 octaves, 160 buckets, 640 bytes), never more
//! than the 976 buckets of the whole `u64` range. Only a request that gets a span keeps
//! one; adding a value is a leading-zero count, two shifts and an increment.

use std::time::Duration;

const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;

/// Counts per log-linear bucket of nanoseconds, between the smallest and largest seen.
#[derive(Debug, Default, Clone)]
pub struct ItlSketch {
    /// The bucket index of `counts[0]`.
    first: usize,
    counts: Vec<u32>,
    total: u64,
}

fn index(nanos: u64) -> usize {
    if nanos < SUB {
        return nanos as usize;
    }
    let octave = 63u32.saturating_sub(nanos.leading_zeros()); // >= SUB_BITS
    let above = octave.saturating_sub(SUB_BITS);
    let sub = (nanos >> above) & (SUB - 1);
    (above.saturating_add(1) as usize)
        .saturating_mul(SUB as usize)
        .saturating_add(sub as usize)
}

/// The midpoint of bucket `i`, in nanoseconds.
fn midpoint(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let shift = u32::try_from((i / SUB).saturating_sub(1)).unwrap_or(u32::MAX);
    let lower = SUB
        .saturating_add(i % SUB)
        .checked_shl(shift)
        .unwrap_or(u64::MAX);
    lower.saturating_add(1u64.checked_shl(shift).unwrap_or(0) >> 1)
}

impl ItlSketch {
    /// `count` tokens at `per_token` each.
    pub fn add(&mut self, per_token: Duration, count: u64) {
        if count == 0 {
            return;
        }
        let nanos = crate::clock::saturating_nanos(per_token);
        let i = index(nanos);
        if self.counts.is_empty() {
            self.first = i;
        } else if i < self.first {
            let grow = self.first.saturating_sub(i);
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.first = i;
        }
        let at = i.saturating_sub(self.first);
        if at >= self.counts.len() {
            self.counts.resize(at.saturating_add(1), 0);
        }
        let n = u32::try_from(count).unwrap_or(u32::MAX);
        if let Some(counted) = self.counts.get_mut(at) {
            *counted = counted.saturating_add(n);
        }
        self.total = self.total.saturating_add(u64::from(n));
    }

    /// The `q` quantile (0 to 1) of the values added, by the lower rank rule (the
    /// median of 1, 2, 3, 4 is 2); `None` before any.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (at, &n) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(u64::from(n));
            if seen >= rank {
                return Some(Duration::from_nanos(midpoint(
                    self.first.saturating_add(at),
                )));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_a_bucket_whose_midpoint_is_within_a_32nd() {
        let mut n = 1u64;
        while n < u64::MAX / 3 {
            for v in [n, n + 1, n * 3 / 2, n * 2 - 1] {
                let mid = midpoint(index(v)) as f64;
                let error = (mid - v as f64).abs() / v as f64;
                assert!(error <= 1.0 / 32.0, "{v}: midpoint {mid}, error {error}");
            }
            n *= 2;
        }
        assert_eq!(index(u64::MAX), 975);
        for v in 0..16 {
            assert_eq!(midpoint(index(v)), v, "exact below 16 ns");
        }
    }

    #[test]
    fn the_median_is_within_the_bound_of_the_exact_one() {
        let ms = |v: f64| Duration::try_from_secs_f64(v / 1e3).unwrap();
        let mut sketch = ItlSketch::default();
        assert_eq!(sketch.quantile(0.5), None);
        let mut exact = Vec::new();
        // A decode at ~20 ms per token with a few stalls and a speculative burst.
        for i in 0..1000u64 {
            let v = 18.0 + (i % 7) as f64 * 0.7 + if i % 97 == 0 { 900.0 } else { 0.0 };
            let count = if i % 10 == 0 { 4 } else { 1 };
            sketch.add(ms(v), count);
            exact.extend(std::iter::repeat_n(v, count as usize));
        }
        sketch.add(ms(0.001), 0);
        exact.sort_by(f64::total_cmp);
        for q in [0.5, 0.9, 0.99, 1.0] {
            let rank = ((q * exact.len() as f64).ceil() as usize).max(1);
            let want = exact[rank - 1];
            let got = sketch.quantile(q).unwrap().as_secs_f64() * 1e3;
            assert!(
                (got - want).abs() / want <= 1.0 / 32.0,
                "q{q}: {got} vs exact {want}"
            );
        }
        // Values below the first bucket seen move it down.
        sketch.add(ms(0.01), 1);
        assert!(sketch.quantile(0.0).unwrap() < ms(0.011));
    }
}
