//! Trace exemplars: the W3C trace context of a request kept beside the histogram
//! observation it explains, so a slow bucket on a dashboard leads to the trace of a
//! request that put a value there.
//!
//! A histogram takes its storage on its first exemplar (most label pairs never see a
//! traced request, and a pair has eight histograms): until then it costs the 16 bytes of an
//! empty [`OnceLock`] of a pointer, after it one [`Exemplar`] slot (48 bytes) per classic
//! bucket, `+Inf` included, and [`NATIVE_EXEMPLARS`] for the native histogram, behind one
//! mutex. Exemplars are written once per request (`Metrics::record_request`), never on the
//! token path, so the lock is taken at most a few times per request.
//!
//! A leaf: it imports nothing from the rest of `metrics`.

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(clippy::indexing_slicing)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A request's trace context as the W3C `traceparent` header names it: the ids only (the
/// flags say nothing an exemplar needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, not all zero.
    pub span_id: [u8; 8],
}

impl TraceContext {
    /// `trace_id` as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// `span_id` as 16 lower-case hex digits.
    pub fn span_id_hex(&self) -> String {
        hex::encode(self.span_id)
    }
}

/// One exemplar: the trace that made an observation, its value, and when it was recorded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exemplar {
    pub trace: TraceContext,
    pub value: f64,
    /// Wall-clock time the request was recorded, since the Unix epoch.
    pub timestamp: Duration,
}

impl Exemplar {
    /// An exemplar of `value` for `trace`, recorded at wall-clock time `at` (a clock before
    /// the epoch reads as the epoch).
    pub fn new(trace: TraceContext, value: f64, at: SystemTime) -> Exemplar {
        Exemplar {
            trace,
            value,
            timestamp: at.duration_since(UNIX_EPOCH).unwrap_or_default(),
        }
    }
}

/// How many exemplars a native histogram keeps: the latest ones, as Prometheus'
/// client_golang keeps a small bounded list for its native histograms.
pub const NATIVE_EXEMPLARS: usize = 4;

/// A histogram's exemplars, allocated on the first one.
#[derive(Default)]
pub(super) struct ExemplarSlots {
    store: OnceLock<Box<Mutex<Store>>>,
}

struct Store {
    /// Per classic bucket (the last slot is `+Inf`): the latest exemplar whose value falls
    /// in the bucket.
    buckets: Box<[Option<Exemplar>]>,
    /// The latest [`NATIVE_EXEMPLARS`], oldest first once full (`next` is the oldest).
    recent: [Option<Exemplar>; NATIVE_EXEMPLARS],
    next: usize,
}

impl ExemplarSlots {
    /// Keep `exemplar` as classic bucket `slot`'s latest (of `slots` in all) and as the
    /// native histogram's newest.
    pub fn record(&self, slots: usize, slot: usize, exemplar: Exemplar) {
        let store = self.store.get_or_init(|| {
            Box::new(Mutex::new(Store {
                buckets: vec![None; slots].into_boxed_slice(),
                recent: [None; NATIVE_EXEMPLARS],
                next: 0,
            }))
        });
        let mut store = store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(bucket) = store.buckets.get_mut(slot) {
            *bucket = Some(exemplar);
        }
        let next = store.next;
        if let Some(recent) = store.recent.get_mut(next) {
            *recent = Some(exemplar);
        }
        store.next = next.saturating_add(1) % NATIVE_EXEMPLARS;
    }

    /// Each classic bucket's exemplar, one per slot, appended to `out`; nothing when none
    /// was ever recorded.
    pub fn read_buckets(&self, out: &mut Vec<Option<Exemplar>>) {
        if let Some(store) = self.store.get() {
            let store = store
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            out.extend_from_slice(&store.buckets);
        }
    }

    /// The native histogram's exemplars, oldest first.
    pub fn read_recent(&self) -> Vec<Exemplar> {
        let Some(store) = self.store.get() else {
            return Vec::new();
        };
        let store = store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (newer, older) = store.recent.split_at(store.next);
        older.iter().chain(newer).flatten().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exemplar(n: u8, value: f64) -> Exemplar {
        Exemplar {
            trace: TraceContext {
                trace_id: [n; 16],
                span_id: [n; 8],
            },
            value,
            timestamp: Duration::from_secs(u64::from(n)),
        }
    }

    #[test]
    fn storage_is_taken_on_the_first_exemplar_and_keeps_the_latest_per_bucket() {
        let slots = ExemplarSlots::default();
        let mut buckets = Vec::new();
        slots.read_buckets(&mut buckets);
        assert!(buckets.is_empty() && slots.read_recent().is_empty());

        slots.record(3, 1, exemplar(1, 0.5));
        slots.record(3, 1, exemplar(2, 0.6));
        slots.record(3, 2, exemplar(3, 9.0));
        slots.read_buckets(&mut buckets);
        assert_eq!(
            buckets,
            [None, Some(exemplar(2, 0.6)), Some(exemplar(3, 9.0))]
        );
        assert_eq!(
            slots.read_recent(),
            [exemplar(1, 0.5), exemplar(2, 0.6), exemplar(3, 9.0)]
        );
    }

    #[test]
    fn the_native_list_keeps_the_latest_few_oldest_first() {
        let slots = ExemplarSlots::default();
        for n in 0..7u8 {
            slots.record(1, 0, exemplar(n, f64::from(n)));
        }
        let kept: Vec<f64> = slots.read_recent().iter().map(|e| e.value).collect();
        assert_eq!(kept, [3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn a_slot_is_48_bytes() {
        assert_eq!(std::mem::size_of::<Option<Exemplar>>(), 48);
        assert_eq!(std::mem::size_of::<ExemplarSlots>(), 16);
    }
}
