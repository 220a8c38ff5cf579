//! A lock-free log-linear histogram of nanoseconds (about 0.8 % relative precision): every
//! stream slot records into the same one, and the summary reports upper bucket bounds,
//! which never flatter.

use std::sync::atomic::{AtomicU64, Ordering};

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;

pub(crate) struct Hist {
    counts: Box<[AtomicU64]>,
    n: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Hist {
    pub(crate) fn new() -> Hist {
        let buckets = (64 - SUB_BITS as usize + 1) * SUB as usize;
        Hist {
            counts: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
            n: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros();
        let sub = (v >> (exp - SUB_BITS)) & (SUB - 1);
        ((exp - SUB_BITS + 1) as u64 * SUB + sub) as usize
    }

    /// Upper bound of a bucket (what a quantile reports: never flatters).
    fn upper(index: usize) -> u64 {
        let i = index as u64;
        if i < SUB {
            return i;
        }
        let exp = i / SUB + u64::from(SUB_BITS) - 1;
        let sub = i % SUB;
        let base = (SUB + sub) << (exp - u64::from(SUB_BITS));
        base + (1u64 << (exp - u64::from(SUB_BITS))) - 1
    }

    pub(crate) fn record(&self, v: u64) {
        self.counts[Self::index(v)].fetch_add(1, Ordering::Relaxed);
        self.n.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
        self.max.fetch_max(v, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }

    fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.load(Ordering::Relaxed);
            if seen >= rank {
                return Self::upper(i).min(self.max.load(Ordering::Relaxed));
            }
        }
        self.max.load(Ordering::Relaxed)
    }

    /// Summary in the given unit (`div` ns per unit).
    pub(crate) fn summary(&self, div: f64) -> serde_json::Value {
        let n = self.count();
        let f = |v: u64| (v as f64 / div * 1000.0).round() / 1000.0;
        serde_json::json!({
            "n": n,
            "p50": f(self.quantile(0.50)),
            "p90": f(self.quantile(0.90)),
            "p99": f(self.quantile(0.99)),
            "p999": f(self.quantile(0.999)),
            "max": f(self.max.load(Ordering::Relaxed)),
            "mean": self.sum.load(Ordering::Relaxed).checked_div(n).map_or(0.0, f),
        })
    }
}
