//! The bodies of the hyper transport: what tokentap sends upstream and to the client, and
//! the wrappers that put the [exchange policy](crate::exchange) on them.
//!
//! [`StreamingBody`] wraps an upstream response body on its way to the client: every frame
//! is returned exactly as it came, its [`Streaming`] observer looks at a borrowed view of
//! the bytes on the way through (one clock read per frame) and at the trailers (where a
//! gRPC call's status is), the upstream idle timeout
//! ([`UpstreamIdle`]) ends a stalled stream, and the body's end is told to the exchange as
//! a [`BodyEnd`]. [`ScannedBody`] feeds a request body to its [`RequestScan`] on the way up.
//! Neither changes a frame.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::exchange::{BodyEnd, IdleTimeout, Streaming, UpstreamIdle};
use crate::observe::RequestScan;

/// Error type of proxied bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response tokentap sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// What the upstream client sends as a request body: the client's, already wrapped by
/// whatever watches it on the way up.
pub type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

pin_project! {
    /// An upstream response body forwarded frame by frame under the exchange's rules.
    pub struct StreamingBody<B: Body> {
        #[pin]
        inner: B,
        streaming: Streaming,
        idle: UpstreamIdle,
        // Armed while the upstream has nothing for us.
        sleep: Option<Pin<Box<Sleep>>>,
    }

    impl<B: Body> PinnedDrop for StreamingBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // hyper drops a body that is already at its end without polling it (a
            // `Content-Length: 0` error, a 204, a 304): that is a whole response. Any other
            // drop before the end is a client that went away.
            let end = if this.inner.is_end_stream() {
                BodyEnd::Clean
            } else {
                BodyEnd::ClientGone
            };
            this.streaming.finish(Instant::now(), end);
        }
    }
}

impl<B: Body> StreamingBody<B> {
    pub fn new(inner: B, streaming: Streaming, idle: UpstreamIdle) -> Self {
        StreamingBody {
            inner,
            streaming,
            idle,
            sleep: None,
        }
    }
}

impl<B> Body for StreamingBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // A panic here, after the head went out, breaks the response off (an error frame:
        // hyper closes the connection or resets the stream) and records it once
        // (exchange::boundary).
        let polled = catch_unwind(AssertUnwindSafe(|| self.as_mut().forward(cx)));
        polled.unwrap_or_else(|panic| {
            let message = crate::supervise::panic_message(&*panic).to_string();
            tracing::error!(panic = %message, "response failed inside tokentap; breaking it off");
            self.project()
                .streaming
                .finish(Instant::now(), BodyEnd::UpstreamBroken);
            Poll::Ready(Some(Err(message.into())))
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> StreamingBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// [`Body::poll_frame`], inside the panic boundary.
    fn forward(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let Poll::Ready(polled) = this.inner.as_mut().poll_frame(cx) else {
            let deadline = match this.idle.deadline() {
                Some(deadline) => deadline,
                None => this.idle.waiting(tokio::time::Instant::now()),
            };
            let sleep = this
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let timeout = this.idle.timeout();
            this.streaming
                .finish(Instant::now(), BodyEnd::upstream_idle(timeout));
            return Poll::Ready(Some(Err(Box::new(IdleTimeout(timeout)))));
        };
        this.idle.data();
        match polled {
            Some(Ok(frame)) => {
                if this.streaming.observes() {
                    // The one clock read for this frame: every event it completes gets it.
                    let at = Instant::now();
                    let mut last = false;
                    if let Some(data) = frame.data_ref() {
                        this.streaming.data(at, data);
                    } else if let Some(trailers) = frame.trailers_ref() {
                        this.streaming.trailers(trailers);
                        // Trailers end a body: hyper's HTTP/1.1 server writes the body's
                        // end with them and polls no further.
                        last = true;
                    }
                    if last || this.inner.is_end_stream() {
                        this.streaming.finish(at, BodyEnd::Clean);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(err)) => {
                let err: BoxError = err.into();
                this.streaming
                    .finish(Instant::now(), BodyEnd::upstream_broken(&err));
                Poll::Ready(Some(Err(err)))
            }
            None => {
                this.streaming.finish(Instant::now(), BodyEnd::Clean);
                Poll::Ready(None)
            }
        }
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
    use crate::observe::{Recorder, ResponseObserver};
    use crate::summary::RequestFacts;
    use crate::wire::{DecodeError, Decoder, Dialect, OutputKind, Signal};
    use http_body_util::{BodyExt, StreamBody};
    use std::sync::Arc;
    use std::time::Duration;

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
            output_tokens_per_event: vec![1.0],
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
        let mut recorder = Recorder::new(
            crate::summary::Sinks::new(metrics.clone()),
            Instant::now(),
            Arc::new(RequestFacts::new(
                http::Method::POST,
                "/v1/chat/completions".into(),
                Dialect::OpenAiChat,
                Some("t".into()),
            )),
            Duration::from_secs(5),
            None,
        );
        recorder.response_head(Instant::now(), http::StatusCode::OK);
        let observer = ResponseObserver::new(
            recorder,
            Some(Box::new(Panicking { frames: 0 })),
            metrics.clone(),
        );
        let body = StreamingBody::new(
            inner,
            Streaming::observing(observer),
            UpstreamIdle::new(Duration::from_secs(60)),
        );
        let forwarded = body.collect().await.expect("stream intact").to_bytes();

        // Every byte went through, the request was still recorded once, and the panic
        // is visible as an unobserved response.
        assert_eq!(&forwarded[..], b"onetwothree");
        let exposition = text(&metrics);
        assert!(exposition.contains(
            "tokentap_requests_total{model=\"unknown\",outcome=\"completed\",status=\"2xx\",tenant=\"t\"} 1"
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
