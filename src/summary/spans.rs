//! Per-request spans: which requests get one (OpenTelemetry's samplers), and the sink a
//! sampled request's summary goes to when it ends (the span exporter, `otlp::spans`).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use rand::Rng;

use super::request::RequestSummary;
use super::taps::Sink;
use crate::metrics::exemplar::TraceContext;

/// Which requests get a span: OpenTelemetry's samplers (`always_on`, `always_off`,
/// `traceidratio`, and each of them `parentbased_`), as plain values.
///
/// `traceidratio` is the specification's TraceIdRatioBased: a request is sampled when the
/// low 63 bits of its trace id's last 8 bytes, read big-endian, are below `ratio * 2^63`,
/// so every service sampling at the same ratio keeps the same traces. Parent-based: a
/// request whose `traceparent` says sampled (flags bit 0) is sampled, one that says not
/// sampled is not, and one without a parent goes by the ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    pub parent_based: bool,
    /// 0 to 1: `always_on` is 1, `always_off` 0.
    pub ratio: f64,
}

impl Sampler {
    /// The ratio's bound on the trace id's low 63 bits.
    fn bound(self) -> u64 {
        if self.ratio >= 1.0 {
            u64::MAX
        } else {
            (self.ratio.max(0.0) * (1u64 << 63) as f64) as u64
        }
    }

    /// Whether a request of `trace_id`, whose parent said `parent_sampled` (none: no
    /// parent), is sampled.
    pub fn sampled(self, trace_id: &[u8; 16], parent_sampled: Option<bool>) -> bool {
        match parent_sampled {
            Some(sampled) if self.parent_based => sampled,
            _ => by_ratio(self.bound(), trace_id),
        }
    }
}

fn by_ratio(bound: u64, trace_id: &[u8; 16]) -> bool {
    let [_, _, _, _, _, _, _, _, low @ ..] = *trace_id;
    let low = u64::from_be_bytes(low) >> 1;
    low < bound
}

/// Per-request spans, while an exporter runs: its sampler (read lock-free by every
/// request, at its start) and its tap (called for sampled requests only, at their end).
/// Until [`start`](Spans::start), and after [`stop`](Spans::stop), no request gets a span
/// and the check is one atomic load.
#[derive(Default)]
pub struct Spans {
    /// 0: off; else 1 | 2 when parent-based.
    mode: AtomicU8,
    bound: AtomicU64,
    tap: RwLock<Option<Arc<dyn Sink>>>,
}

const SPANS_ON: u8 = 1;
const PARENT_BASED: u8 = 2;

impl Spans {
    /// Give sampled requests spans, each handed to `tap` when the request ends.
    pub fn start(&self, sampler: Sampler, tap: Arc<dyn Sink>) {
        *self.tap.write().unwrap_or_else(|e| e.into_inner()) = Some(tap);
        self.bound.store(sampler.bound(), Ordering::Relaxed);
        let parent = if sampler.parent_based {
            PARENT_BASED
        } else {
            0
        };
        self.mode.store(SPANS_ON | parent, Ordering::Release);
    }

    /// No more spans: requests that start from now get none.
    pub fn stop(&self) {
        self.mode.store(0, Ordering::Release);
    }

    /// Whether spans are on: the request's trace context is worth reading.
    pub fn on(&self) -> bool {
        self.mode.load(Ordering::Acquire) & SPANS_ON != 0
    }

    /// tokentap's span for a request that starts now, whose `traceparent` gave `parent`
    /// and its sampled flag: a new span id in the parent's trace, or in a new trace when
    /// there is no parent; `None` when spans are off or the request is not sampled.
    pub fn decide(&self, parent: Option<(TraceContext, bool)>) -> Option<TraceContext> {
        let mode = self.mode.load(Ordering::Acquire);
        if mode & SPANS_ON == 0 {
            return None;
        }
        let mut rng = rand::thread_rng();
        let trace_id = match parent {
            Some((_, sampled)) if mode & PARENT_BASED != 0 => {
                if !sampled {
                    return None;
                }
                parent.map(|(p, _)| p.trace_id)?
            }
            Some((parent, _)) => {
                if !by_ratio(self.bound.load(Ordering::Relaxed), &parent.trace_id) {
                    return None;
                }
                parent.trace_id
            }
            None => {
                let trace_id = nonzero(&mut rng);
                if !by_ratio(self.bound.load(Ordering::Relaxed), &trace_id) {
                    return None;
                }
                trace_id
            }
        };
        Some(TraceContext {
            trace_id,
            span_id: nonzero(&mut rng),
        })
    }

    /// Hand a sampled request to the exporter.
    pub fn finished(&self, request: &RequestSummary) {
        if let Some(tap) = self.tap.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            tap.finished(request);
        }
    }
}

/// Random bytes, not all zero (an all-zero id is invalid).
fn nonzero<const N: usize>(rng: &mut impl Rng) -> [u8; N] {
    loop {
        let mut id = [0u8; N];
        rng.fill(&mut id[..]);
        if id != [0; N] {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::taps::tests::Models;

    fn request(model: &str) -> RequestSummary {
        super::super::request::example(model)
    }

    fn trace(low: u64) -> [u8; 16] {
        let mut id = [0xab; 16];
        id[8..].copy_from_slice(&low.to_be_bytes());
        id
    }

    /// TraceIdRatioBased as the specification says: the low 63 bits of the last 8 bytes
    /// against `ratio * 2^63`; parent-based follows the parent's flag.
    #[test]
    fn samplers_decide_as_the_specification_says() {
        let ratio = |r: f64| Sampler {
            parent_based: false,
            ratio: r,
        };
        let half = 1u64 << 62; // the bound of 0.5, in the low 63 bits
        assert!(ratio(0.5).sampled(&trace((half - 1) << 1), None));
        assert!(!ratio(0.5).sampled(&trace(half << 1), None));
        assert!(!ratio(0.0).sampled(&trace(0), None));
        assert!(ratio(1.0).sampled(&trace(u64::MAX), None));
        // Not parent-based: the parent's flag is not read.
        assert!(!ratio(0.0).sampled(&trace(0), Some(true)));
        let parent = Sampler {
            parent_based: true,
            ratio: 0.0,
        };
        assert!(parent.sampled(&trace(u64::MAX), Some(true)));
        assert!(!Sampler {
            ratio: 1.0,
            ..parent
        }
        .sampled(&trace(0), Some(false)));
        assert!(!parent.sampled(&trace(0), None), "a root goes by the ratio");
        // About the ratio of random trace ids.
        let mut rng = rand::thread_rng();
        let sampled = (0..20_000)
            .filter(|_| ratio(0.25).sampled(&rng.gen(), None))
            .count();
        assert!((4_500..5_500).contains(&sampled), "{sampled}");
    }

    #[test]
    fn spans_give_sampled_requests_a_new_span_in_the_parents_trace() {
        let spans = Spans::default();
        let parent = TraceContext {
            trace_id: trace(7),
            span_id: [1; 8],
        };
        assert!(!spans.on());
        assert_eq!(spans.decide(Some((parent, true))), None, "off");
        let tap = Arc::new(Models::default());
        let always = Sampler {
            parent_based: true,
            ratio: 1.0,
        };
        spans.start(always, tap.clone());
        let span = spans.decide(Some((parent, true))).expect("sampled");
        assert_eq!(span.trace_id, parent.trace_id);
        assert_ne!(span.span_id, parent.span_id);
        assert_eq!(spans.decide(Some((parent, false))), None, "parent said no");
        let root = spans.decide(None).expect("a root");
        assert_ne!(root.trace_id, [0; 16]);
        assert_ne!(root.trace_id, spans.decide(None).unwrap().trace_id);
        spans.finished(&request("a"));
        assert_eq!(*tap.0.lock().unwrap(), ["a"]);
        spans.stop();
        assert_eq!(spans.decide(None), None);
    }
}
