//! The exchange policy: what one request's life means, whatever transport carries its
//! bytes (hyper's HTTP/1.1 and h2 server in [`proxy`](crate::proxy), or the HTTP/1.1
//! [`relay`](crate::relay)).
//!
//! A transport parses a request head and calls [`Gateway::begin`]; from there on this
//! module decides, once for every transport:
//! - admission: the in-flight permit or the `503` ([`Answer::overloaded`]);
//! - the configuration in force for the whole request ([`Active`]);
//! - observation: [`observe::start`] and the request body's [`RequestScan`];
//! - a failure before the response head: what is logged, answered and recorded
//!   ([`Exchange::failed`], with [`ExchangeError`] saying whose fault it was);
//! - a response: its observer and permit, held until the body ends ([`Streaming`]), and
//!   how the body's end maps to an outcome ([`BodyEnd`]);
//! - the upstream idle timeout ([`idle`]);
//! - a panic in one exchange ends that exchange only ([`boundary`]).
//!
//! The transports move bytes and read sockets; they decide none of these themselves.

// Values from the network pass here: nothing may panic on them (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

pub mod answer;
pub mod boundary;
pub mod fault;
pub mod idle;

use std::sync::{Arc, RwLock};
use std::time::Instant;

use http::{HeaderMap, Method, StatusCode, Uri};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::observe::{self, Pending, RequestHead, RequestScan, ResponseObserver};
use crate::outcome::Outcome;
use crate::prefetch;
use crate::summary::Sinks;
use crate::wire::Tokenizer;
pub use answer::Answer;
pub use fault::{BodyEnd, ClientFault, ExchangeError, UpstreamFault};
pub use idle::{IdleTimeout, UpstreamIdle};

/// Resolves once the server starts to shut down (`closing` turns `true`): a transport then
/// closes connections that wait for a request, and lets a request in flight finish with
/// `connection: close`.
pub async fn shutting_down(closing: &mut tokio::sync::watch::Receiver<bool>) {
    if closing.wait_for(|closing| *closing).await.is_err() {
        // The server is gone without saying so: nothing to wait for any more.
        std::future::pending::<()>().await;
    }
}

/// The configuration in force and what was built from it: the tokenizer, and `U`, the
/// hyper transport's upstream client (the relay builds what it needs per connection).
pub struct Active<U> {
    pub config: Arc<Config>,
    /// `observe.tokenizer`, loaded.
    pub tokenizer: Option<Tokenizer>,
    pub upstream: U,
}

/// What every exchange shares: the configuration in force, the in-flight bound and the
/// sinks its requests are observed into.
pub struct Gateway<U> {
    /// Swapped whole on reload. A request takes its own reference at its head, so
    /// in-flight streams finish under the configuration they began with.
    current: RwLock<Arc<Active<U>>>,
    sinks: Arc<Sinks>,
    /// Bounds requests in flight; a permit lives as long as the response body.
    in_flight: Arc<Semaphore>,
    /// The models the engines said they serve, kept across reloads.
    served: Arc<observe::ServedModels>,
}

/// An admitted request: the configuration it runs under, the scan its body goes through
/// on the way up, and the exchange that answers and records it.
pub struct Admitted<U> {
    pub active: Arc<Active<U>>,
    pub scan: RequestScan,
    pub exchange: Exchange,
}

impl<U> Gateway<U> {
    pub fn new(active: Active<U>, sinks: Arc<Sinks>) -> Gateway<U> {
        Gateway {
            in_flight: Arc::new(Semaphore::new(active.config.limits.max_in_flight)),
            current: RwLock::new(Arc::new(active)),
            sinks,
            served: Arc::default(),
        }
    }

    /// The configuration in force.
    pub fn active(&self) -> Arc<Active<U>> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Put `active` in force, atomically: a request sees the old one or the new one.
    pub fn swap(&self, active: Active<U>) {
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(active);
    }

    /// A request head the transport could not read, which it answered with `status`
    /// (`400`, `414`, `431`): counted and logged as the client's error. Its route, model
    /// and tenant are unknown.
    pub fn unreadable_head(&self, status: StatusCode) {
        tracing::debug!(
            status = status.as_u16(),
            "refused a request head that cannot be read"
        );
        observe::refused(
            None,
            &self.active().config,
            &self.sinks,
            status,
            Outcome::ClientError,
        );
    }

    /// The metric families requests are recorded in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.sinks.metrics()
    }

    /// Where requests are observed into: the metric families and the other sinks.
    pub fn sinks(&self) -> &Arc<Sinks> {
        &self.sinks
    }

    /// Begin the exchange of a request whose head was fully received at `t_req`: admit
    /// it and start observing it, or refuse it with the `503` to answer (counted and
    /// logged) when `limits.max_in_flight` are in flight already.
    pub fn begin(&self, head: RequestHead<'_>, t_req: Instant) -> Result<Admitted<U>, Answer> {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            self.sinks.metrics().overload_rejection();
            let active = self.active();
            tracing::warn!(
                limit = active.config.limits.max_in_flight,
                "rejecting request: too many in flight"
            );
            let answer = Answer::overloaded().to(head.headers);
            observe::refused(
                Some(head),
                &active.config,
                &self.sinks,
                answer.status,
                Outcome::Overloaded,
            );
            return Err(answer);
        };
        let active = self.active();
        let (scan, pending) = observe::start(
            head,
            t_req,
            &active.config,
            active.tokenizer.as_ref(),
            &self.sinks,
            &self.served,
        );
        let head_timeout = active.config.upstream.response_head_timeout;
        let exchange = Exchange {
            pending,
            permit,
            method: head.method.clone(),
            uri: head.uri.clone(),
            grpc: answer::is_grpc_call(head.headers),
            head_timeout,
            head_deadline: idle::deadline(tokio::time::Instant::from_std(t_req), head_timeout),
        };
        Ok(Admitted {
            active,
            scan,
            exchange,
        })
    }
}

/// One admitted request, waiting for its response head. Dropped (the client left, or the
/// server stopped past its drain deadline), a measured request is recorded as cancelled.
pub struct Exchange {
    pending: Pending,
    permit: OwnedSemaphorePermit,
    /// For the log line of a failure.
    method: Method,
    uri: Uri,
    /// The request is a gRPC call, answered as one.
    grpc: bool,
    /// `upstream.response_head_timeout`, and when it runs out.
    head_timeout: std::time::Duration,
    head_deadline: tokio::time::Instant,
}

impl Exchange {
    /// When the response head must have arrived: `upstream.response_head_timeout` after the
    /// request's head was received (`t_req`), connecting and sending the request (and its body) included. A
    /// transport that misses it fails the exchange with [`Exchange::head_timed_out`].
    pub fn head_deadline(&self) -> tokio::time::Instant {
        self.head_deadline
    }

    /// The fault of a response head that missed [`Exchange::head_deadline`] (a `504`).
    pub fn head_timed_out(&self) -> ExchangeError {
        UpstreamFault::HeadTimeout(self.head_timeout).into()
    }

    /// The request got no response head: log and record it, and return what to answer
    /// (`None` when the client is gone: nobody would read an answer).
    pub fn failed(self, err: &ExchangeError) -> Option<Answer> {
        let (method, path) = (&self.method, self.uri.path());
        match err {
            ExchangeError::Client(ClientFault::Gone) => {
                tracing::debug!(%method, path, "client went away before its response head");
                // Dropping the pending request records it as cancelled, with no status.
                drop(self.pending);
                return None;
            }
            ExchangeError::Client(_) => tracing::info!(
                %method, path, error = %err,
                "client request refused before its response head"
            ),
            ExchangeError::Upstream(UpstreamFault::Internal(panic)) => tracing::error!(
                %method, path, panic,
                "tokentap panicked while forwarding, before the response head"
            ),
            ExchangeError::Upstream(_) => tracing::warn!(
                %method, path, error = %err,
                "upstream failed before its response head"
            ),
        }
        let answer = Answer {
            grpc: self.grpc,
            ..Answer::of(err)?
        };
        self.pending
            .fail(Instant::now(), answer.status, err.outcome());
        Some(answer)
    }

    /// The response head arrived at `at`: the body's observer (with the permit) from here.
    pub fn response_head(self, at: Instant, status: StatusCode, headers: &HeaderMap) -> Streaming {
        Streaming {
            observer: self.pending.response(at, status, headers),
            permit: Some(self.permit),
            #[cfg(test)]
            panic_in_body: crate::observe::inject::asks(
                headers,
                crate::observe::inject::Stage::Body,
            ),
        }
    }
}

/// A response body on its way to the client: observed (on a measured route) and holding
/// its request's in-flight permit until it ends. Dropped before [`finish`](Self::finish),
/// the client went away: the request is recorded as cancelled (unless the stream's end
/// marker had already passed).
pub struct Streaming {
    observer: Option<ResponseObserver>,
    permit: Option<OwnedSemaphorePermit>,
    /// The response asked a test build to panic at its first data.
    #[cfg(test)]
    panic_in_body: bool,
}

impl Streaming {
    /// A response observed by `observer`, with no permit: for tests of a transport's body.
    #[cfg(test)]
    pub(crate) fn observing(observer: ResponseObserver) -> Streaming {
        Streaming {
            observer: Some(observer),
            permit: None,
            panic_in_body: false,
        }
    }

    /// Whether there is anything to observe (a measured route whose body is decoded).
    pub fn observes(&self) -> bool {
        self.observer.is_some()
    }

    /// Look at the bytes of one piece of the body that arrived at `at`.
    pub fn data(&mut self, at: Instant, bytes: &[u8]) {
        #[cfg(test)]
        if self.panic_in_body {
            panic!(
                "injected panic at {:?}",
                crate::observe::inject::Stage::Body
            );
        }
        if let Some(observer) = self.observer.as_mut() {
            observer.data(at, bytes);
        }
    }

    /// Look at the trailers that end the body (forwarded unchanged): a gRPC call's
    /// `grpc-status` is there.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        if let Some(observer) = self.observer.as_mut() {
            observer.trailers(trailers);
        }
    }

    /// The memory [`data`](Self::data) touches first (see [`ResponseObserver::hot_lines`]).
    pub fn hot_lines(&self, lines: &mut prefetch::Lines) {
        if let Some(observer) = self.observer.as_ref() {
            observer.hot_lines(lines);
        }
    }

    /// The body ended at `at` as `end` says: record it and give the permit back. Later
    /// calls do nothing.
    pub fn finish(&mut self, at: Instant, end: BodyEnd) {
        if let Some(mut observer) = self.observer.take() {
            match end {
                BodyEnd::Clean => observer.end(at),
                // The observer's own drop decides (the end marker may have passed).
                BodyEnd::ClientGone => drop(observer),
                failed => observer.fail(at, failed.outcome()),
            }
        }
        self.permit = None;
    }
}
