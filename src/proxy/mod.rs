//! The proxy service: one client request in, one response out, unchanged.
//!
//! For an LLM route it starts a [`Recorder`] at the request head, scans the request body
//! on its way up, chooses a decoder from the response head and wraps the response body in
//! an [`ObservedBody`]. Every other route is forwarded without observation. Either way the
//! bytes, the status and the end-to-end headers are the upstream's own.

pub mod headers;
pub mod inspect;
pub mod request_body;
pub mod same_task;
pub mod tunnel;
pub mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::metrics::{Metrics, Unobserved};
use crate::observe::{
    BoxError, ObservedBody, Recorder, RequestFacts, RequestLabels, StreamObserver,
};
use crate::wire::{self, DecodeLimits, DecodeOptions, Unobservable};
use upstream::{error_response, UpstreamClient};

/// The body type of every response tokentap sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Shared state of the proxy service.
pub struct Proxy {
    /// The configuration in force; swapped whole on reload. A request takes its own
    /// reference at its head, so in-flight streams finish under the config they began with.
    current: RwLock<Arc<Generation>>,
    metrics: Arc<Metrics>,
    /// Bounds requests in flight; a permit lives as long as the response body.
    in_flight: Arc<Semaphore>,
}

/// One configuration and the upstream client built from it.
pub struct Generation {
    pub config: Arc<Config>,
    pub upstream: UpstreamClient,
}

/// Settings a reload cannot change in a running process (they shape listeners, the
/// in-flight semaphore or already registered metric families).
const RESTART_ONLY: &str =
    "listen, admin, tls, limits and metrics.buckets changes take effect after a restart";

impl Proxy {
    pub fn new(config: Arc<Config>, upstream: UpstreamClient, metrics: Arc<Metrics>) -> Arc<Proxy> {
        Arc::new(Proxy {
            in_flight: Arc::new(Semaphore::new(config.limits.max_in_flight)),
            current: RwLock::new(Arc::new(Generation { config, upstream })),
            metrics,
        })
    }

    /// The configuration in force.
    pub fn generation(&self) -> Arc<Generation> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Switch to a new, already validated configuration, atomically: a request sees
    /// either the old generation or the new one, never a mix. The upstream client (and
    /// its connection pool) is kept when the upstream settings did not change. Returns a
    /// warning when settings that need a restart differ.
    pub fn reload(&self, config: Config) -> Result<Option<&'static str>, upstream::ClientError> {
        let old = self.generation();
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
            || before.metrics.buckets != config.metrics.buckets;
        self.metrics.set_label_policies(&config.labels);
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(Generation {
            config: Arc::new(config),
            upstream,
        });
        Ok(restart_needed.then_some(RESTART_ONLY))
    }

    fn in_flight_limit(&self) -> usize {
        self.generation().config.limits.max_in_flight
    }

    /// A hyper service handle for one connection.
    pub fn service(self: &Arc<Self>) -> ProxyService {
        ProxyService(self.clone())
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let t_req = Instant::now();
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            self.metrics.overload_rejection();
            tracing::warn!(
                limit = self.in_flight_limit(),
                "rejecting request: too many in flight"
            );
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many requests in flight",
            );
        };
        let generation = self.generation();
        let config = &generation.config;
        let (parts, body) = request.into_parts();
        let info = inspect::inspect(&parts, &config.routes, &config.tenants);
        let Some(dialect) = info.dialect else {
            return self
                .passthrough(&generation, parts, body, t_req, permit)
                .await;
        };

        let facts = Arc::new(RequestFacts::default());
        let mut recorder = Recorder::new(
            self.metrics.clone(),
            t_req,
            RequestLabels {
                method: parts.method.clone(),
                path: parts.uri.path().to_string(),
                dialect,
                tenant: info.tenant,
            },
            facts.clone(),
            config.metrics.stall_threshold,
        );
        let body_timeout = config.limits.request_body_timeout;
        let sent = generation
            .upstream
            .send(parts, body, true, facts, body_timeout);
        let response = match sent.await {
            Ok(response) => response,
            Err(err) => {
                let outcome = err.outcome();
                tracing::warn!(error = %err, "upstream failed before its response head");
                recorder.finish(Instant::now(), outcome);
                return text(err.status(), &err.to_string());
            }
        };
        recorder.response_head(Instant::now(), response.status());

        let (mut parts, body) = response.into_parts();
        upstream::strip_response_hop_by_hop(&mut parts);
        let decoder = self.decoder_for(config, dialect, &parts);
        let observer = StreamObserver::new(recorder, decoder, self.metrics.clone());
        let body = ObservedBody::new(
            body,
            Some(observer),
            config.upstream.idle_timeout,
            self.metrics.clone(),
            Some(permit),
        );
        Response::from_parts(parts, body.boxed_unsync())
    }

    /// Choose the decoder for a response head, or `None` to forward it unobserved.
    fn decoder_for(
        &self,
        config: &Config,
        dialect: wire::Dialect,
        parts: &http::response::Parts,
    ) -> Option<Box<dyn wire::Decoder>> {
        if !parts.status.is_success() {
            // Error bodies carry no tokens; the status decides the outcome.
            return None;
        }
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // A compressed body is forwarded as it came; the decoder inflates its own copy.
        let content_encoding = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .map(|v| v.as_bytes());
        let limits = DecodeLimits {
            max_event_bytes: config.observe.max_event_bytes,
            max_body_bytes: config.observe.max_body_bytes,
        };
        let options = DecodeOptions {
            skip_special_tokens: config.observe.skip_special_tokens,
        };
        match wire::response_decoder_tokenized(
            dialect,
            content_type,
            content_encoding,
            limits,
            options,
            config.observe.tokenizer.as_ref(),
        ) {
            Ok(decoder) => Some(decoder),
            Err(Unobservable::ContentType) => {
                self.metrics.unobserved(Unobserved::ContentType);
                None
            }
            Err(Unobservable::ContentEncoding) => {
                self.metrics.unobserved(Unobserved::ContentEncoding);
                None
            }
        }
    }

    async fn passthrough(
        &self,
        generation: &Generation,
        parts: http::request::Parts,
        body: Incoming,
        t_req: Instant,
        permit: OwnedSemaphorePermit,
    ) -> Response<ProxyBody> {
        self.metrics.passthrough();
        let method = parts.method.clone();
        let path = parts.uri.path().to_string();
        let facts = Arc::new(RequestFacts::default());
        let body_timeout = generation.config.limits.request_body_timeout;
        let sent = generation
            .upstream
            .send(parts, body, false, facts, body_timeout);
        match sent.await {
            Ok(response) => {
                tracing::info!(
                    target: "tokentap::access",
                    method = %method,
                    path = %path,
                    status = response.status().as_u16(),
                    ttfb_ms = t_req.elapsed().as_secs_f64() * 1e3,
                    "passthrough"
                );
                let (mut parts, body) = response.into_parts();
                upstream::strip_response_hop_by_hop(&mut parts);
                let body = ObservedBody::new(
                    body,
                    None,
                    generation.config.upstream.idle_timeout,
                    self.metrics.clone(),
                    Some(permit),
                );
                Response::from_parts(parts, body.boxed_unsync())
            }
            Err(err) => {
                tracing::warn!(method = %method, path = %path, error = %err, "upstream failed");
                text(err.status(), &err.to_string())
            }
        }
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
