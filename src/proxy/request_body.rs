//! The client's request body on its way upstream, watched for the client's own faults.
//!
//! When a request body fails, the upstream client only reports that the exchange failed,
//! which looks like an upstream fault (502, `upstream_error`). [`ClientBody`] notes why
//! the body failed before passing the error on, so [`UpstreamClient::send`]'s caller can answer
//! for the right side: a malformed body (a bad chunk size, a bare-LF chunk line) is the
//! client's `400`, a body that stops arriving for `limits.request_body_timeout` is the
//! client's `408`, and a client that went away mid-body is a cancellation.
//!
//! On h2, hyper drops a request's future as soon as its stream is reset, by the client
//! (it left) or by the h2 library (the client broke the body's framing: more data than
//! its `content-length`), often before the body was read. The watch then holds the
//! unanswered exchange until the body is gone ([`BodyWatch::abandoned`]); the body reads
//! its stream's fate as it is dropped, and the exchange is recorded as that fate says:
//! the client's error, or the client gone.
//!
//! On h2 the stall timeout ends when the response head arrives ([`BodyWatch::answered`]):
//! a stream is full-duplex there, and a client of a bidirectional call (gRPC's
//! `ModelStreamInfer`) says nothing while the engine answers its last request, for as long
//! as the answer takes. Cutting its request stream would end the call. On HTTP/1.1 the
//! timeout stays, since a body that never ends holds its connection.
//!
//! [`UpstreamClient::send`]: super::upstream::UpstreamClient::send

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::body::BoxError;
use super::h1_upstream::error_chain;
use crate::exchange::{ClientFault, Exchange};

/// Where a [`ClientBody`] leaves the reason it failed, for the side that sent it, and
/// learns that the response head arrived.
#[derive(Clone, Default)]
pub struct BodyWatch(Arc<Watched>);

#[derive(Default)]
struct Watched {
    failure: OnceLock<ClientFault>,
    answered: AtomicBool,
    orphan: Mutex<Orphan>,
}

/// An exchange whose request's future was dropped unanswered while its body lived on
/// (in the upstream connection's task), waiting for the body's end to be recorded.
#[derive(Default)]
struct Orphan {
    body_dropped: bool,
    exchange: Option<Exchange>,
}

impl BodyWatch {
    /// Why the body failed, if it did: the client's fault its exchange is failed with.
    pub fn failure(&self) -> Option<ClientFault> {
        self.0.failure.get().cloned()
    }

    /// The request's future was dropped with `exchange` unanswered: it is recorded now if
    /// the body is gone, else when the body is dropped, by what the body learnt of its
    /// end (`BodyWatch::settle`).
    pub fn abandoned(&self, exchange: Exchange) {
        let mut orphan = self.0.orphan.lock().unwrap_or_else(PoisonError::into_inner);
        if orphan.body_dropped {
            drop(orphan);
            self.settle(exchange);
        } else {
            orphan.exchange = Some(exchange);
        }
    }

    /// The body is gone: an exchange left with it is recorded now.
    fn body_dropped(&self) {
        let exchange = {
            let mut orphan = self.0.orphan.lock().unwrap_or_else(PoisonError::into_inner);
            orphan.body_dropped = true;
            orphan.exchange.take()
        };
        if let Some(exchange) = exchange {
            self.settle(exchange);
        }
    }

    /// Record an abandoned exchange: the client's fault its body showed, or the client
    /// gone (dropping the exchange records `cancelled`).
    fn settle(&self, exchange: Exchange) {
        match self.failure() {
            Some(fault) if fault != ClientFault::Gone => {
                exchange.failed(&fault.into());
            }
            _ => drop(exchange),
        }
    }

    /// The response head of an h2 request arrived: from now on the body's silence is
    /// the client's to keep, with no stall timeout.
    pub fn answered(&self) {
        self.0.answered.store(true, Ordering::Relaxed);
    }
}

pin_project! {
    /// A request body forwarded as it comes, with an idle timeout between its frames.
    pub struct ClientBody<B>
    where
        B: Body<Data = Bytes>,
        B::Error: std::error::Error,
        B::Error: Send,
        B::Error: Sync,
        B::Error: 'static,
    {
        #[pin]
        inner: B,
        timeout: Duration,
        // Armed while the client has nothing for us; dropped when a frame arrives.
        idle: Option<Pin<Box<Sleep>>>,
        watch: BodyWatch,
        // An h2 stream's body, whose fate is read as it is dropped.
        h2: bool,
    }

    impl<B> PinnedDrop for ClientBody<B>
    where
        B: Body<Data = Bytes>,
        B::Error: std::error::Error,
        B::Error: Send,
        B::Error: Sync,
        B::Error: 'static,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.h2 && this.watch.0.failure.get().is_none() {
                // Frames already buffered come first (a flow-control window's worth at
                // most), then the stream's end or its error, or nothing yet.
                let mut cx = Context::from_waker(Waker::noop());
                let mut inner = this.inner;
                for _ in 0..MAX_PROBED_FRAMES {
                    match inner.as_mut().poll_frame(&mut cx) {
                        Poll::Ready(Some(Ok(_))) => {}
                        Poll::Ready(Some(Err(err))) => {
                            if h2_library_reset(&err) {
                                let failure = ClientFault::MalformedBody(error_chain(&err));
                                let _ = this.watch.0.failure.set(failure);
                            }
                            break;
                        }
                        Poll::Ready(None) | Poll::Pending => break,
                    }
                }
            }
            this.watch.body_dropped();
        }
    }
}

/// The most buffered frames a dropped h2 body reads past to find how its stream ended.
const MAX_PROBED_FRAMES: usize = 64;

impl<B> ClientBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    /// Wrap `inner` (an h2 stream's body when `h2`); the returned watch learns why it
    /// failed.
    pub fn new(inner: B, timeout: Duration, h2: bool) -> (ClientBody<B>, BodyWatch) {
        let watch = BodyWatch::default();
        let body = ClientBody {
            inner,
            timeout,
            idle: None,
            watch: watch.clone(),
            h2,
        };
        (body, watch)
    }
}

/// Whether an error is an h2 stream the h2 library reset itself: the client broke the
/// stream's framing (more or less data than its `content-length`, trailers that do not
/// end it).
fn h2_library_reset(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            return h2.is_reset() && h2.is_library();
        }
        source = cause.source();
    }
    false
}

/// Whether a body error means the client left rather than broke the framing: hyper
/// reports an HTTP/1.1 body cut short as an `UnexpectedEof` (or reset) I/O error somewhere
/// in its chain, and an h2 stream the client reset (or a connection it closed) as an
/// `h2::Error`. A stream the h2 library reset itself ([`h2_library_reset`]) is malformed,
/// as the same body is on HTTP/1.1. A connection h2 closed for a breach is counted as the
/// connection's ([`super::ProxyService::connection_failed`]); the requests in flight on
/// it lost their client.
fn ended_early(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            if h2.is_reset() && h2.is_library() {
                return false;
            }
            return h2.is_reset() || h2.is_go_away() || h2.is_io();
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
            );
        }
        source = cause.source();
    }
    false
}

impl<B> Body for ClientBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.idle = None;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                let failure = if ended_early(&err) {
                    ClientFault::Gone
                } else {
                    ClientFault::MalformedBody(error_chain(&err))
                };
                let _ = this.watch.0.failure.set(failure);
                Poll::Ready(Some(Err(Box::new(err))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending if this.watch.0.answered.load(Ordering::Relaxed) => {
                *this.idle = None;
                Poll::Pending
            }
            Poll::Pending => {
                let timeout = *this.timeout;
                let idle = this
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if idle.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let fault = ClientFault::BodyTimeout(timeout);
                let _ = this.watch.0.failure.set(fault.clone());
                Poll::Ready(Some(Err(Box::new(fault))))
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    #[tokio::test]
    async fn a_stalled_body_fails_after_the_timeout_and_says_why() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let timeout = Duration::from_millis(50);
        let (body, watch) = ClientBody::new(StreamBody::new(stream), timeout, false);
        let mut body = Box::pin(body);
        tx.send(Ok(Frame::data(Bytes::from_static(b"first"))))
            .await
            .unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "first");
        // The clock starts when the client has nothing more for us.
        let started = tokio::time::Instant::now();
        let failed = body.frame().await.unwrap();
        assert!(failed.is_err());
        assert!(started.elapsed() >= timeout);
        assert_eq!(watch.failure(), Some(ClientFault::BodyTimeout(timeout)));
        drop(tx);
    }

    #[tokio::test]
    async fn an_answered_body_may_stay_silent() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let timeout = Duration::from_millis(20);
        let (body, watch) = ClientBody::new(StreamBody::new(stream), timeout, false);
        let mut body = Box::pin(body);
        // Armed before the head arrives, the timer no longer counts after it.
        assert!(tokio::time::timeout(timeout / 2, body.frame())
            .await
            .is_err());
        watch.answered();
        assert!(tokio::time::timeout(timeout * 5, body.frame())
            .await
            .is_err());
        assert_eq!(watch.failure(), None);
        tx.send(Ok(Frame::data(Bytes::from_static(b"next"))))
            .await
            .unwrap();
        let next = body.frame().await.unwrap().unwrap();
        assert_eq!(next.into_data().unwrap(), "next");
    }

    #[tokio::test]
    async fn framing_errors_and_early_ends_are_told_apart() {
        let cases = [
            (std::io::ErrorKind::InvalidInput, false),
            (std::io::ErrorKind::UnexpectedEof, true),
        ];
        for (kind, gone) in cases {
            let frames: Vec<Result<Frame<Bytes>, std::io::Error>> =
                vec![Err(std::io::Error::new(kind, "bad"))];
            let (mut body, watch) = ClientBody::new(
                StreamBody::new(futures_util::stream::iter(frames)),
                Duration::from_secs(30),
                false,
            );
            assert!(body.frame().await.unwrap().is_err());
            let expected = if gone {
                ClientFault::Gone
            } else {
                ClientFault::MalformedBody("bad".into())
            };
            assert_eq!(watch.failure(), Some(expected), "{kind:?}");
        }
    }
}
