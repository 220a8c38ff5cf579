//! The proxy's limits on a response body, apart from observing it: the per-frame idle
//! timeout (`tower`'s timeout covers only the head) and the in-flight permit, which must
//! live as long as the body, not just the handler.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use crate::observe::body::{BoxError, IdleTimeout};

pin_project! {
    /// A response body ended with [`IdleTimeout`] when the upstream goes quiet for too
    /// long, holding its request's in-flight permit until dropped.
    pub struct LimitedBody<B> {
        #[pin]
        inner: B,
        idle_timeout: Duration,
        idle: Option<Pin<Box<Sleep>>>,
        // When the upstream must have sent something by; armed while it has nothing.
        idle_deadline: Option<tokio::time::Instant>,
        // Held until the body is gone: the request counts against the in-flight limit.
        permit: Option<OwnedSemaphorePermit>,
    }
}

impl<B> LimitedBody<B> {
    pub fn new(inner: B, idle_timeout: Duration, permit: Option<OwnedSemaphorePermit>) -> Self {
        LimitedBody {
            inner,
            idle_timeout,
            idle: None,
            idle_deadline: None,
            permit,
        }
    }
}

impl<B> Body for LimitedBody<B>
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
            tracing::warn!(timeout = ?idle_timeout, "upstream stream idle; aborting it");
            return Poll::Ready(Some(Err(Box::new(IdleTimeout(idle_timeout)))));
        };
        *this.idle_deadline = None;
        Poll::Ready(polled.map(|frame| {
            frame.map_err(|err| {
                let err: BoxError = err.into();
                tracing::warn!(error = %err, "upstream stream failed mid-body");
                err
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
