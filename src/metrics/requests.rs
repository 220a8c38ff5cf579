//! The end of each measured request as one value, for whatever wants requests one by one
//! rather than summed into series: per-request spans, the live view.
//!
//! A consumer registers a [`RequestTap`] on [`Metrics`](super::Metrics); the recorder
//! builds a [`FinishedRequest`] only while at least one tap is registered, and hands it to
//! every tap on the thread that ended the request. A tap must therefore return at once
//! (copy what it needs, queue it, drop it when its queue is full): it runs in the request
//! path. Like the rest of `metrics`, it takes plain values and knows nothing of how they
//! were measured.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use super::exemplar::TraceContext;
use super::outcome::Verdict;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Outcome, StatusClass};
    use std::sync::Mutex;

    struct Collect(Mutex<Vec<String>>);

    impl RequestTap for Collect {
        fn finished(&self, request: &FinishedRequest) {
            self.0.lock().unwrap().push(request.model.to_string());
        }
    }

    fn request(model: &str) -> FinishedRequest {
        FinishedRequest {
            model: Arc::from(model),
            tenant: Arc::from("t"),
            dialect: "openai_chat",
            path: "/v1/chat/completions".into(),
            verdict: Verdict::new(Outcome::Completed, StatusClass::Success),
            http_status: Some(200),
            answered_by_tokentap: false,
            grpc_status: None,
            stream: Some(true),
            trace: None,
            started: SystemTime::UNIX_EPOCH,
            duration: Duration::from_millis(10),
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
        }
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
}
