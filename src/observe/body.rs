//! The observers on `http_body::Body`s, for transports built on hyper.
//!
//! [`ObservedBody`] wraps a response body: every frame is returned exactly as it came,
//! and the [`ResponseObserver`] looks at a borrowed view of its bytes on the way through.
//! It is the one place that reads the clock (once per frame). [`ScannedBody`] does the
//! same for a request body and its [`RequestScan`]. Neither changes a frame, and neither
//! does anything but observe: limits (idle timeout, in-flight permit) belong to the
//! transport's own wrappers.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::{Outcome, RequestScan, ResponseObserver};

/// Error type of proxied bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream sent nothing for longer than `upstream.idle_timeout`: the error a
/// transport ends a response body with, recorded as [`Outcome::Timeout`].
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeout(pub Duration);

pin_project! {
    /// A response body forwarded frame by frame, observed on the way.
    pub struct ObservedBody<B: Body> {
        #[pin]
        inner: B,
        observer: ResponseObserver,
    }

    impl<B: Body> PinnedDrop for ObservedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // hyper drops a body that is already at its end without polling it (a
            // `Content-Length: 0` error, a 204, a 304): that is a whole response, recorded
            // by its status. Any other drop is left to the observer (cancelled).
            if this.inner.is_end_stream() {
                this.observer.end(Instant::now());
            }
        }
    }
}

impl<B: Body> ObservedBody<B> {
    pub fn new(inner: B, observer: ResponseObserver) -> Self {
        ObservedBody { inner, observer }
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
            return Poll::Pending;
        };
        // The one clock read for this frame: every event completed by it gets this instant.
        let at = Instant::now();
        match polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.observer.data(at, data);
                }
                if this.inner.is_end_stream() {
                    this.observer.end(at);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(err)) => {
                let err: BoxError = err.into();
                let outcome = if err.is::<IdleTimeout>() {
                    Outcome::Timeout
                } else {
                    Outcome::UpstreamError
                };
                this.observer.fail(at, outcome);
                Poll::Ready(Some(Err(err)))
            }
            None => {
                this.observer.end(at);
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
    /// A request body forwarded frame by frame while its [`RequestScan`] reads it.
    pub struct ScannedBody<B> {
        #[pin]
        inner: B,
        scan: RequestScan,
    }
}

impl<B> ScannedBody<B> {
    pub fn new(inner: B, scan: RequestScan) -> Self {
        ScannedBody { inner, scan }
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
            if let Some(data) = frame.data_ref() {
                this.scan.feed(data);
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
    use crate::metrics::Metrics;
    use crate::observe::{Recorder, RequestFacts};
    use crate::wire::{DecodeError, Decoder, Dialect, OutputKind, Signal};
    use http_body_util::{BodyExt, StreamBody};
    use std::sync::Arc;

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
            inter_chunk_latency_seconds: vec![1.0],
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
                tenant_families: Labels::default_tenant_families(),
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
            Arc::new(RequestFacts::new(
                http::Method::POST,
                "/v1/chat/completions".into(),
                Dialect::OpenAiChat,
                Some("t".into()),
            )),
            Duration::from_secs(5),
        );
        let observer = ResponseObserver::new(
            recorder,
            Some(Box::new(Panicking { frames: 0 })),
            metrics.clone(),
        );
        let body = ObservedBody::new(inner, observer);
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
