//! The end of each measured request as one value, for whatever wants requests one by one
//! rather than summed into series: per-request spans, the live view.
//!
//! A consumer registers a [`RequestTap`] on [`Metrics`](super::Metrics); the recorder
//! builds a [`FinishedRequest`] only while at least one tap is registered, and hands it to
//! every tap on the thread that ended the request. A tap must therefore return at once
//! (copy what it needs, queue it, drop it when its queue is full): it runs in the request
//! path. Like the rest of `metrics`, it takes plain values and knows nothing of how they
//! were measured.

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(clippy::indexing_slicing)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rand::Rng;

use super::exemplar::TraceContext;
use crate::outcome::Verdict;

/// What one measured request came to, as the access log says it.
#[derive(Clone, Debug)]
pub struct FinishedRequest {
    /// The `model` and `tenant` label values the request was counted under.
    pub model: Arc<str>,
    pub tenant: Arc<str>,
    /// The dialect's name (`openai_chat`, `sglang_grpc`, ...).
    pub dialect: &'static str,
    /// The path without its query.
    pub path: String,
    pub verdict: Verdict,
    /// The HTTP status the client was told, and whether tokentap (not the upstream) said it.
    pub http_status: Option<u16>,
    pub answered_by_tokentap: bool,
    /// A gRPC response's `grpc-status`.
    pub grpc_status: Option<u32>,
    /// What the request body said of `stream`.
    pub stream: Option<bool>,
    /// The request's valid W3C trace context, when it carried one and it was read.
    pub trace: Option<TraceContext>,
    /// Wall-clock time the request head was received (`t_req`).
    pub started: SystemTime,
    /// From `t_req` to the end.
    pub duration: Duration,
    pub ttfb: Option<Duration>,
    pub ttft: Option<Duration>,
    /// Token-weighted mean ITL.
    pub mean_itl: Option<Duration>,
    /// The largest per-token ITL observed.
    pub slowest_itl: Option<Duration>,
    /// The longest gap between consecutive token-bearing events.
    pub slowest_gap: Option<Duration>,
    pub tpot: Option<Duration>,
    pub events: u64,
    pub output_tokens: u64,
    pub input_tokens: Option<u64>,
    /// How the per-event counts were known (`exact`, `apportioned`, ...).
    pub counting: &'static str,
    /// tokentap's own span for this request (its trace id, and the span id it exported
    /// the request under): set only when per-request spans are on and the request was
    /// sampled. Its parent is [`trace`](Self::trace) when the request carried one.
    pub span: Option<TraceContext>,
    /// The parent's W3C `tracestate`, which the span carries; only for a request with a
    /// [`span`](Self::span) and a parent.
    pub trace_state: Option<String>,
    /// The model the request body named, as written (not folded into a label value);
    /// `None` when it named none or one too long to read.
    pub request_model: Option<String>,
    /// The model the response named, when it named one.
    pub response_model: Option<String>,
    /// The median per-token ITL of this request (within the sketch's error bound, see
    /// `observe::itl_sketch`); kept only for a request with a [`span`](Self::span).
    pub itl_p50: Option<Duration>,
    /// `gen_ai.operation.name` and `gen_ai.provider.name` of the request's dialect
    /// (`wire::gen_ai`).
    pub gen_ai_operation: &'static str,
    pub gen_ai_provider: &'static str,
    /// The finish reasons the stream reported (`stop`, `length`, `end_turn`, ...), in
    /// the order first seen, each once.
    pub finish_reasons: Vec<String>,
}

impl FinishedRequest {
    /// A request that ended before anything of it was measured (tokentap answered it
    /// at once, now): who it was and its verdict, every figure empty. The caller sets
    /// what else it knows.
    pub fn unmeasured(
        model: Arc<str>,
        tenant: Arc<str>,
        dialect: &'static str,
        path: String,
        verdict: Verdict,
        (gen_ai_operation, gen_ai_provider): (&'static str, &'static str),
    ) -> FinishedRequest {
        FinishedRequest {
            model,
            tenant,
            dialect,
            path,
            verdict,
            http_status: None,
            answered_by_tokentap: false,
            grpc_status: None,
            stream: None,
            trace: None,
            started: SystemTime::now(),
            duration: Duration::ZERO,
            ttfb: None,
            ttft: None,
            mean_itl: None,
            slowest_itl: None,
            slowest_gap: None,
            tpot: None,
            events: 0,
            output_tokens: 0,
            input_tokens: None,
            counting: "none",
            span: None,
            trace_state: None,
            request_model: None,
            response_model: None,
            itl_p50: None,
            gen_ai_operation,
            gen_ai_provider,
            finish_reasons: Vec::new(),
        }
    }
}

/// A consumer of [`FinishedRequest`]s. `finished` runs in the request path: it must not
/// block, and a panic in it is caught as an observer panic.
pub trait RequestTap: Send + Sync {
    fn finished(&self, request: &FinishedRequest);
}

/// Identifies a registered tap, to remove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapId(u64);

/// The registered taps. Reading them costs one atomic load while there are none, so a
/// request pays for the per-request value only when someone listens.
#[derive(Default)]
pub struct RequestTaps {
    count: AtomicUsize,
    next_id: AtomicU64,
    taps: RwLock<Vec<(TapId, Arc<dyn RequestTap>)>>,
}

impl RequestTaps {
    pub fn add(&self, tap: Arc<dyn RequestTap>) -> TapId {
        let id = TapId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut taps = self.taps.write().unwrap_or_else(|e| e.into_inner());
        taps.push((id, tap));
        self.count.store(taps.len(), Ordering::Release);
        id
    }

    pub fn remove(&self, id: TapId) {
        let mut taps = self.taps.write().unwrap_or_else(|e| e.into_inner());
        taps.retain(|(tap_id, _)| *tap_id != id);
        self.count.store(taps.len(), Ordering::Release);
    }

    /// Whether any tap listens: the recorder builds a [`FinishedRequest`] only then.
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// Hand `request` to every tap.
    pub fn finished(&self, request: &FinishedRequest) {
        let taps = self.taps.read().unwrap_or_else(|e| e.into_inner());
        for (_, tap) in taps.iter() {
            tap.finished(request);
        }
    }
}

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
    tap: RwLock<Option<Arc<dyn RequestTap>>>,
}

const SPANS_ON: u8 = 1;
const PARENT_BASED: u8 = 2;

impl Spans {
    /// Give sampled requests spans, each handed to `tap` when the request ends.
    pub fn start(&self, sampler: Sampler, tap: Arc<dyn RequestTap>) {
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
    pub fn finished(&self, request: &FinishedRequest) {
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
    use crate::outcome::{Outcome, StatusClass};
    use std::sync::Mutex;

    struct Collect(Mutex<Vec<String>>);

    impl RequestTap for Collect {
        fn finished(&self, request: &FinishedRequest) {
            self.0.lock().unwrap().push(request.model.to_string());
        }
    }

    fn request(model: &str) -> FinishedRequest {
        let mut request = FinishedRequest::unmeasured(
            Arc::from(model),
            Arc::from("t"),
            "openai_chat",
            "/v1/chat/completions".into(),
            Verdict::new(Outcome::Completed, StatusClass::Success),
            ("chat", "openai"),
        );
        request.http_status = Some(200);
        request.stream = Some(true);
        request.started = SystemTime::UNIX_EPOCH;
        request.duration = Duration::from_millis(10);
        request
    }

    #[test]
    fn taps_hear_each_request_until_removed() {
        let taps = RequestTaps::default();
        assert!(!taps.any());
        let first = Arc::new(Collect(Mutex::default()));
        let second = Arc::new(Collect(Mutex::default()));
        let first_id = taps.add(first.clone());
        taps.add(second.clone());
        assert!(taps.any());
        taps.finished(&request("a"));
        taps.remove(first_id);
        taps.finished(&request("b"));
        assert_eq!(*first.0.lock().unwrap(), ["a"]);
        assert_eq!(*second.0.lock().unwrap(), ["a", "b"]);
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
        let tap = Arc::new(Collect(Mutex::default()));
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
