//! The proxy service: one client request in, one response out, unchanged.
//!
//! It routes bytes and answers errors; what is measured is [`observe`](crate::observe)'s
//! decision. Every request goes through [`observe::start`]: the request body goes up
//! wrapped in its scan, the response body comes back wrapped in the proxy's limits and,
//! where observe returns an observer, in an [`ObservedBody`]. Either way the bytes, the
//! status and the end-to-end headers are the upstream's own.

pub mod h1_upstream;
pub mod headers;
pub mod limits;
pub mod request_body;
pub mod transport;
pub mod tunnel;
pub mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::observe::body::{BoxError, ObservedBody, ScannedBody};
use crate::observe::{self, Outcome, RequestHead};
use crate::wire::Tokenizer;
use limits::LimitedBody;
use request_body::ClientBody;
use upstream::{error_response, UpstreamClient, UpstreamError};

/// The body type of every response tokentap sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Shared state of the proxy service.
pub struct Proxy {
    /// The configuration in force; swapped whole on reload. A request takes its own
    /// reference at its head, so in-flight streams finish under the config they began with.
    current: RwLock<Arc<ActiveConfig>>,
    metrics: Arc<Metrics>,
    /// Bounds requests in flight; a permit lives as long as the response body.
    in_flight: Arc<Semaphore>,
}

/// The active configuration: one validated config and what is built from it, the
/// upstream client and the tokenizer.
pub struct ActiveConfig {
    pub config: Arc<Config>,
    pub upstream: UpstreamClient,
    /// `observe.tokenizer`, loaded.
    pub tokenizer: Option<Tokenizer>,
}

/// The message of the `503` a request gets when too many are in flight.
pub const OVERLOADED: &str = "too many requests in flight";

/// Settings a reload cannot change in a running process (they shape listeners, the
/// in-flight semaphore or already registered metric families).
const RESTART_ONLY: &str = "listen, admin, tls, limits, metrics.buckets, \
     metrics.native_histograms and labels.tenant.families changes take effect after a restart";

impl Proxy {
    pub fn new(
        config: Arc<Config>,
        upstream: UpstreamClient,
        tokenizer: Option<Tokenizer>,
        metrics: Arc<Metrics>,
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            in_flight: Arc::new(Semaphore::new(config.limits.max_in_flight)),
            current: RwLock::new(Arc::new(ActiveConfig {
                config,
                upstream,
                tokenizer,
            })),
            metrics,
        })
    }

    /// The configuration in force.
    pub fn active(&self) -> Arc<ActiveConfig> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Switch to a new, already validated configuration (with its tokenizer, loaded),
    /// atomically: a request sees either the old configuration or the new one, never a
    /// mix. The upstream client (and its connection pool) is kept when the upstream
    /// settings did not change. Returns a warning when settings that need a restart differ.
    pub fn reload(
        &self,
        config: Config,
        tokenizer: Option<Tokenizer>,
    ) -> Result<Option<&'static str>, upstream::ClientError> {
        let old = self.active();
        let upstream = if old.config.upstream == config.upstream {
            old.upstream.clone()
        } else {
            UpstreamClient::new(&config.upstream)?
        };
        let before = &old.config;
        let restart_needed = before.listen != config.listen
            || before.admin != config.admin
            || before.tls != config.tls
            || before.limits != config.limits
            || before.metrics.buckets != config.metrics.buckets
            || before.metrics.native_histograms != config.metrics.native_histograms
            || before.labels.tenant_families != config.labels.tenant_families;
        self.metrics.set_label_policies(&config.labels);
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(ActiveConfig {
            config: Arc::new(config),
            upstream,
            tokenizer,
        });
        Ok(restart_needed.then_some(RESTART_ONLY))
    }

    fn in_flight_limit(&self) -> usize {
        self.active().config.limits.max_in_flight
    }

    /// A hyper service handle for one connection.
    pub fn service(self: &Arc<Self>) -> ProxyService {
        ProxyService(self.clone())
    }

    /// The metric families requests are recorded in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Admit one request: its in-flight permit, held until its response ends, or `None`
    /// (counted and logged) when `limits.max_in_flight` are in flight already; it is then
    /// answered `503` with [`OVERLOADED`].
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let permit = self.in_flight.clone().try_acquire_owned().ok();
        if permit.is_none() {
            self.metrics.overload_rejection();
            tracing::warn!(
                limit = self.in_flight_limit(),
                "rejecting request: too many in flight"
            );
        }
        permit
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let t_req = Instant::now();
        let Some(permit) = self.admit() else {
            return text(StatusCode::SERVICE_UNAVAILABLE, OVERLOADED);
        };
        let active = self.active();
        let (parts, body) = request.into_parts();
        let (scan, pending) = observe::start(
            RequestHead::of(&parts),
            t_req,
            &active.config,
            active.tokenizer.as_ref(),
            &self.metrics,
        );
        let (method, uri) = (parts.method.clone(), parts.uri.clone());
        let (body, watch) = ClientBody::new(body, active.config.limits.request_body_timeout);
        let body = ScannedBody::new(body, scan)
            .map_err(BoxError::from)
            .boxed_unsync();
        let sent = active.upstream.send(parts, body).await;
        // An exchange that failed because the client's body did is the client's fault.
        let sent = sent.map_err(|err| watch.failure().map_or(err, UpstreamError::from));
        let response = match sent {
            Ok(response) => response,
            Err(err) => {
                let outcome = err.outcome();
                if outcome == Outcome::ClientError {
                    tracing::info!(
                        method = %method,
                        path = %uri.path(),
                        error = %err,
                        "client request refused before its response head"
                    );
                } else {
                    tracing::warn!(
                        method = %method,
                        path = %uri.path(),
                        error = %err,
                        "upstream failed before its response head"
                    );
                }
                pending.fail(Instant::now(), err.status(), outcome);
                return text(err.status(), &err.to_string());
            }
        };
        let at = Instant::now();
        let (mut parts, body) = response.into_parts();
        upstream::strip_response_hop_by_hop(&mut parts);
        let observer = pending.response(at, parts.status, &parts.headers);
        let body = LimitedBody::new(body, active.config.upstream.idle_timeout, Some(permit));
        let body = match observer {
            Some(observer) => ObservedBody::new(body, observer).boxed_unsync(),
            None => body.boxed_unsync(),
        };
        Response::from_parts(parts, body)
    }
}

fn text(status: StatusCode, message: &str) -> Response<ProxyBody> {
    error_response::<Full<Bytes>>(status, message)
        .map(|b| b.map_err(|never| match never {}).boxed_unsync())
}

/// The per-connection hyper service.
#[derive(Clone)]
pub struct ProxyService(Arc<Proxy>);

impl hyper::service::Service<Request<Incoming>> for ProxyService {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let proxy = self.0.clone();
        Box::pin(async move { Ok(proxy.handle(request).await) })
    }
}
