//! Body wrappers that watch traffic without touching it.
//!
//! [`ObservedBody`] wraps an upstream response body: every frame is returned exactly as it
//! came, and the observer looks at a borrowed view of its bytes on the way through. It is
//! the one place that reads the clock (once per frame), it enforces the per-frame idle
//! timeout, and it records the request's outcome exactly once: at end of stream, on an
//! error frame, or when dropped before the end (the client went away).
//!
//! [`ScannedBody`] wraps a request body the same way, scanning for `model` and `stream`.
//!
//! A panic inside an observer is caught: observation of that stream stops, the stream
//! itself goes on.

pub mod recorder;

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use crate::metrics::{Metrics, Outcome, Unobserved};
use crate::wire::request::RequestScanner;
use crate::wire::{Decoder, Signal};
pub use recorder::{Recorder, RequestFacts, RequestLabels};

/// Error type of proxied bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream sent nothing for longer than `upstream.idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeout(pub Duration);

/// The decoder plus the recorder it feeds.
pub struct StreamObserver {
    recorder: Recorder,
    /// `None` once observation stopped (limit hit, panic, or a response not decoded).
    decoder: Option<Box<dyn Decoder>>,
    signals: Vec<Signal>,
    metrics: Arc<Metrics>,
}

impl StreamObserver {
    pub fn new(
        recorder: Recorder,
        decoder: Option<Box<dyn Decoder>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        StreamObserver {
            recorder,
            decoder,
            signals: Vec::new(),
            metrics,
        }
    }

    /// Look at one data frame that arrived at `at`.
    fn data(&mut self, at: Instant, bytes: &[u8]) {
        let Some(decoder) = self.decoder.as_mut() else {
            return;
        };
        self.signals.clear();
        match decoder.feed(bytes, &mut self.signals) {
            Ok(()) => self.recorder.apply(at, &self.signals),
            Err(err) => {
                // What was decoded before the bound was hit still counts.
                self.recorder.apply(at, &self.signals);
                tracing::debug!(error = %err, "stopped observing a stream");
                self.metrics.unobserved(Unobserved::for_decode_error(&err));
                self.decoder = None;
            }
        }
    }

    /// The body ended cleanly at `at`.
    fn end(mut self, at: Instant) {
        if let Some(mut decoder) = self.decoder.take() {
            self.signals.clear();
            match decoder.finish(&mut self.signals) {
                Ok(()) => {}
                Err(err) => self.metrics.unobserved(Unobserved::for_decode_error(&err)),
            }
            self.recorder.apply(at, &self.signals);
        }
        self.recorder.finish(at, Outcome::Completed);
    }

    fn fail(self, at: Instant, outcome: Outcome) {
        self.recorder.finish(at, outcome);
    }
}

pin_project! {
    /// A response body forwarded frame by frame, observed on the way.
    pub struct ObservedBody<B> {
        #[pin]
        inner: B,
        observer: Option<StreamObserver>,
        idle_timeout: Duration,
        idle: Option<Pin<Box<Sleep>>>,
        // When the upstream must have sent something by; armed while it has nothing.
        idle_deadline: Option<tokio::time::Instant>,
        // Whether the inner body said it had nothing more to send after the last frame.
        at_end: bool,
        metrics: Arc<Metrics>,
        // Held until the body is gone: the request counts against the in-flight limit.
        permit: Option<OwnedSemaphorePermit>,
    }

    impl<B> PinnedDrop for ObservedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(observer) = this.observer.take() {
                // Dropped before the end: the client went away (or the server is shutting
                // down past its drain deadline). hyper may also drop a body it has read to
                // its end without polling for `None`: that is a completion.
                // A client that leaves right after the stream's end marker got everything.
                let at = Instant::now();
                let outcome = if *this.at_end || observer.recorder.saw_end_marker() {
                    Outcome::Completed
                } else {
                    Outcome::Cancelled
                };
                guarded(this.metrics, || match outcome {
                    Outcome::Completed => observer.end(at),
                    other => observer.fail(at, other),
                });
            }
        }
    }
}

impl<B> ObservedBody<B> {
    /// Wrap `inner`; with `observer: None` the body is only guarded by the idle timeout.
    pub fn new(
        inner: B,
        observer: Option<StreamObserver>,
        idle_timeout: Duration,
        metrics: Arc<Metrics>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        ObservedBody {
            inner,
            observer,
            permit,
            idle_timeout,
            idle: None,
            idle_deadline: None,
            at_end: false,
            metrics,
        }
    }
}

/// Run observer code; a panic stops observation but never reaches the stream.
fn guarded(metrics: &Metrics, work: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(()) => true,
        Err(_) => {
            tracing::error!("observer panicked; the stream continues unobserved");
            metrics.unobserved(Unobserved::ObserverPanic);
            false
        }
    }
}

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let Poll::Ready(polled) = this.inner.as_mut().poll_frame(cx) else {
            // The idle clock runs from the first time the upstream has nothing for us, not
            // from the last frame: a slow client that delays our next poll is not an idle
            // upstream.
            let idle_timeout = *this.idle_timeout;
            let deadline = *this
                .idle_deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + idle_timeout);
            let sleep = this
                .idle
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if let Some(observer) = this.observer.take() {
                let at = Instant::now();
                guarded(this.metrics, || observer.fail(at, Outcome::Timeout));
            }
            tracing::warn!(timeout = ?idle_timeout, "upstream stream idle; aborting it");
            return Poll::Ready(Some(Err(Box::new(IdleTimeout(idle_timeout)))));
        };
        // The one clock read for this frame: every event completed by it gets this instant.
        let at = Instant::now();
        *this.idle_deadline = None;
        match polled {
            Some(Ok(frame)) => {
                if let (Some(observer), Some(data)) = (this.observer.as_mut(), frame.data_ref()) {
                    if !guarded(this.metrics, || observer.data(at, data)) {
                        // The decoder's state is not trusted after a panic; the request is
                        // still recorded when the stream ends.
                        observer.decoder = None;
                    }
                }
                *this.at_end = this.inner.is_end_stream();
                if *this.at_end {
                    if let Some(observer) = this.observer.take() {
                        guarded(this.metrics, || observer.end(at));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(err)) => {
                if let Some(observer) = this.observer.take() {
                    guarded(this.metrics, || observer.fail(at, Outcome::UpstreamError));
                }
                let err: BoxError = err.into();
                tracing::warn!(error = %err, "upstream stream failed mid-body");
                Poll::Ready(Some(Err(err)))
            }
            None => {
                if let Some(observer) = this.observer.take() {
                    guarded(this.metrics, || observer.end(at));
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// A request body forwarded frame by frame while `model` and `stream` are read from it.
    pub struct ScannedBody<B> {
        #[pin]
        inner: B,
        scanner: Option<RequestScanner>,
        facts: Arc<RequestFacts>,
    }
}

impl<B> ScannedBody<B> {
    /// `scan: false` forwards without looking (non-LLM routes).
    pub fn new(inner: B, scan: bool, facts: Arc<RequestFacts>) -> Self {
        ScannedBody {
            inner,
            scanner: scan.then(RequestScanner::new),
            facts,
        }
    }
}

impl<B> Body for ScannedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let (Some(scanner), Some(data)) = (this.scanner.as_mut(), frame.data_ref()) {
                let scanned = catch_unwind(AssertUnwindSafe(|| {
                    scanner.feed(data);
                    if let Some(model) = scanner.model() {
                        if this.facts.model.get().is_none() {
                            let _ = this.facts.model.set(model.to_string());
                        }
                    }
                    if let Some(stream) = scanner.stream() {
                        let _ = this.facts.stream.set(stream);
                    }
                    scanner.is_done()
                }));
                if scanned.unwrap_or(true) {
                    *this.scanner = None;
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Buckets, LabelPolicy, Labels};
    use crate::wire::{DecodeError, Dialect, OutputKind};
    use http_body_util::{BodyExt, StreamBody};

    /// A decoder that sees one token, then panics on its second frame.
    struct Panicking {
        frames: u32,
    }

    impl Decoder for Panicking {
        fn feed(&mut self, _: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError> {
            self.frames += 1;
            if self.frames == 2 {
                panic!("decoder bug");
            }
            out.push(Signal::Output {
                tokens: 1,
                exact: false,
                kind: OutputKind::Content,
            });
            Ok(())
        }
        fn finish(&mut self, _: &mut Vec<Signal>) -> Result<(), DecodeError> {
            Ok(())
        }
    }

    fn metrics() -> Arc<Metrics> {
        let policy = LabelPolicy {
            max_values: Some(10),
            allow: None,
            aliases: Default::default(),
            max_value_len: 64,
        };
        let buckets = Buckets {
            time_to_first_byte_seconds: vec![1.0],
            time_to_first_token_seconds: vec![1.0],
            inter_token_latency_seconds: vec![1.0],
            time_per_output_token_seconds: vec![1.0],
            output_tokens_per_second: vec![1.0],
            request_duration_seconds: vec![1.0],
        };
        Metrics::new(
            &buckets,
            &Labels {
                model: policy.clone(),
                tenant: policy,
                max_pairs: 100,
            },
        )
    }

    fn text(metrics: &Metrics) -> String {
        String::from_utf8(metrics.render()).unwrap()
    }

    #[tokio::test]
    async fn a_panicking_decoder_never_breaks_the_stream() {
        // The test prints the decoder's panic message: that panic is the point.
        let metrics = metrics();
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = ["one", "two", "three"]
            .into_iter()
            .map(|s| Ok(Frame::data(Bytes::from(s))))
            .collect();
        let inner = StreamBody::new(futures_util::stream::iter(frames));
        let recorder = Recorder::new(
            metrics.clone(),
            Instant::now(),
            RequestLabels {
                method: http::Method::POST,
                path: "/v1/chat/completions".into(),
                dialect: Dialect::OpenAiChat,
                tenant: Some("t".into()),
            },
            Arc::new(RequestFacts::default()),
            Duration::from_secs(5),
        );
        let observer = StreamObserver::new(
            recorder,
            Some(Box::new(Panicking { frames: 0 })),
            metrics.clone(),
        );
        let body = ObservedBody::new(
            inner,
            Some(observer),
            Duration::from_secs(5),
            metrics.clone(),
            None,
        );
        let forwarded = body.collect().await.expect("stream intact").to_bytes();

        // Every byte went through, the request was still recorded once, and the panic
        // is visible as an unobserved response.
        assert_eq!(&forwarded[..], b"onetwothree");
        let exposition = text(&metrics);
        assert!(exposition.contains(
            "tokentap_requests_total{model=\"unknown\",outcome=\"completed\",tenant=\"t\"} 1"
        ));
        assert!(
            exposition.contains("tokentap_output_tokens_total{model=\"unknown\",tenant=\"t\"} 1")
        );
        assert!(
            exposition.contains("tokentap_unobserved_responses_total{reason=\"observer_panic\"} 1")
        );
        assert!(exposition.contains("tokentap_streams_in_flight 0"));
    }
}
