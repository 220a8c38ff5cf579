//! The hyper transport: one client request in, one response out, unchanged.
//!
//! hyper's server (HTTP/1.1 and h2c) hands each request to [`ProxyService`]; it begins the
//! exchange ([`Gateway::begin`]), sends the request upstream with its body wrapped in the
//! request scan ([`ScannedBody`]) and the client-fault watch ([`ClientBody`]), and returns
//! the upstream's response with its body wrapped in a [`StreamingBody`]. What any of this
//! means (admission, answers, outcomes, the idle timeout) is the
//! [exchange policy](crate::exchange)'s; the bytes, the status and the end-to-end headers
//! are the upstream's own.

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

pub mod body;
pub mod h1_upstream;
pub mod h2_only;
pub mod request_body;
pub mod tunnel;
pub mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::config::Config;
use crate::exchange::{
    boundary, Active, Admitted, Answer, Exchange, ExchangeError, Gateway, UpstreamIdle,
};
use crate::metrics::Metrics;
use crate::observe::RequestHead;
use crate::summary::Sinks;
use crate::wire::Tokenizer;
pub use body::ProxyBody;
use body::{BoxError, ScannedBody, StreamingBody};
use request_body::{BodyWatch, ClientBody};
use tunnel::Tunnels;
use upstream::UpstreamClient;

/// The proxy: the exchange policy's shared state, with the hyper transport's upstream
/// client as part of the configuration in force.
pub struct Proxy {
    gateway: Arc<Gateway<UpstreamClient>>,
    /// Upgraded connections, which the drain waits for.
    tunnels: Tunnels,
}

impl Proxy {
    pub fn new(
        config: Arc<Config>,
        upstream: UpstreamClient,
        tokenizer: Option<Tokenizer>,
        sinks: Arc<Sinks>,
    ) -> Arc<Proxy> {
        let active = Active {
            config,
            tokenizer,
            upstream,
        };
        Arc::new(Proxy {
            gateway: Arc::new(Gateway::new(active, sinks)),
            tunnels: Tunnels::default(),
        })
    }

    /// The exchange policy's shared state, for the other transport (the relay).
    pub fn gateway(&self) -> &Arc<Gateway<UpstreamClient>> {
        &self.gateway
    }

    /// The upgraded connections (WebSocket tunnels) open now.
    pub fn tunnels(&self) -> &Tunnels {
        &self.tunnels
    }

    /// The configuration in force.
    pub fn active(&self) -> Arc<Active<UpstreamClient>> {
        self.gateway.active()
    }

    /// Put `active` (a configuration, its tokenizer, its upstream client) in force,
    /// atomically: a request sees either the old one or the new one, never a mix. What to
    /// put in force on a reload is [`reload`](crate::reload)'s to decide.
    pub fn swap(&self, active: Active<UpstreamClient>) {
        self.gateway.swap(active);
    }

    /// A hyper service handle for one connection.
    pub fn service(self: &Arc<Self>) -> ProxyService {
        ProxyService(self.clone())
    }

    /// The metric families requests are recorded in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.gateway.metrics()
    }

    /// Forward an admitted request and return its response (or tokentap's answer).
    async fn forward(
        parts: http::request::Parts,
        body: Incoming,
        admitted: Admitted<UpstreamClient>,
        tunnels: Tunnels,
    ) -> Response<ProxyBody> {
        let Admitted {
            active,
            scan,
            exchange,
        } = admitted;
        let full_duplex = parts.version == http::Version::HTTP_2;
        let timeout = active.config.limits.request_body_timeout;
        let (body, watch) = ClientBody::new(body, timeout, full_duplex);
        let (head_deadline, head_timed_out) = (exchange.head_deadline(), exchange.head_timed_out());
        // Declared before the upstream exchange, so dropped after it (and its body).
        let exchange = Unanswered(Some(exchange), watch.clone());
        let body = ScannedBody::new(body, scan)
            .map_err(BoxError::from)
            .boxed_unsync();
        let upstream = &active.upstream;
        // A panic up to the response head is answered `502` (exchange::boundary).
        let send = boundary::unwound(async {
            #[cfg(test)]
            crate::observe::inject::injected_panic(
                &parts.headers,
                crate::observe::inject::Stage::Send,
            );
            upstream.send(parts, body, &tunnels).await
        });
        let sent = tokio::time::timeout_at(head_deadline, send)
            .await
            .map_or_else(|_| Err(head_timed_out), |sent| sent.and_then(|r| r));
        // An exchange that failed because the client's body did is the client's fault.
        let sent = sent.map_err(|err| watch.failure().map_or(err, ExchangeError::from));
        let exchange = exchange.answered();
        let response = match sent {
            Ok(response) => {
                if full_duplex {
                    watch.answered();
                }
                response
            }
            Err(err) => {
                return match exchange.failed(&err) {
                    Some(answer) => text(&answer),
                    // Nobody is left to read an answer; hyper drops the connection.
                    None => text(&Answer::new(StatusCode::BAD_REQUEST, err.to_string())),
                };
            }
        };
        let at = Instant::now();
        let (mut parts, body) = response.into_parts();
        upstream::strip_response_hop_by_hop(&mut parts);
        // An intermediary sends its own HTTP version (RFC 9110 6.2), whatever the
        // upstream's: an HTTP/1.0 upstream's body is then chunked for an HTTP/1.1 client,
        // whose connection stays open, as the relay does.
        parts.version = http::Version::HTTP_11;
        let streaming = exchange.response_head(at, parts.status, &parts.headers);
        let idle = UpstreamIdle::new(active.config.upstream.idle_timeout);
        let body = StreamingBody::new(body, streaming, idle).boxed_unsync();
        Response::from_parts(parts, body)
    }
}

/// An exchange until its request's future answers it. hyper drops the future of an h2
/// request whose stream was reset, before the answer: the exchange then goes to the
/// request body's watch, which records it by what the body learns of the reset (the
/// client's error when the h2 library reset the stream for the client's framing, else
/// the client gone).
struct Unanswered(Option<Exchange>, BodyWatch);

impl Unanswered {
    /// The exchange, now that the request's future answers it. Taken by value, so once:
    /// `Unanswered` is built holding it and only this or `Drop` takes it.
    #[allow(
        clippy::expect_used,
        reason = "built with Some, and this by-value call is the only take before Drop"
    )]
    fn answered(mut self) -> Exchange {
        self.0.take().expect("answered once")
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(exchange) = self.0.take() {
            self.1.abandoned(exchange);
        }
    }
}

fn text(answer: &Answer) -> Response<ProxyBody> {
    answer
        .response::<Full<Bytes>>()
        .map(|b| b.map_err(|never| match never {}).boxed_unsync())
}

/// The per-connection hyper service.
#[derive(Clone)]
pub struct ProxyService(Arc<Proxy>);

impl ProxyService {
    /// A connection hyper served ended with `err`: if it ended on a request head that
    /// could not be read (hyper's automatic `400`, `414` or `431` on HTTP/1, or an h2
    /// connection error for the client's protocol violation), count that request.
    pub fn connection_failed(&self, err: &(dyn std::error::Error + 'static)) {
        if let Some(status) = refused_head(err) {
            self.0.gateway.unreadable_head(status);
        }
    }
}

/// The status of the request head a connection ended on, refused before any service saw
/// it: `None` for every other end.
///
/// On HTTP/1, hyper answers a head it cannot parse itself, as its `on_error` decides:
/// [`answered_parse_error`]. On h2, the h2 library closes the connection with a GOAWAY
/// when a frame breaks the protocol (`PROTOCOL_ERROR`: an undecodable header block, a
/// stream id out of order, a frame where none may be; `COMPRESSION_ERROR`;
/// `FRAME_SIZE_ERROR`). hyper returns that error here, and nothing else sees it: it is
/// counted as the HTTP/1.1 unreadable head is, with the `400` HTTP/1.1 answers (a GOAWAY
/// has no status). `ENHANCE_YOUR_CALM` is left out: h2 sends it for floods (of resets,
/// of CONTINUATION frames) as much as for an oversized head, and does not say which.
///
/// A request the h2 library refuses on its own stream (a malformed or missing
/// pseudo-header, a connection-specific field, a head over `max_header_list_size`, which
/// it answers `431` itself) resets only that stream, and h2 tells no one: `h2`'s
/// `Recv::recv_headers` and `server::Peer::convert_poll_message` return a stream error
/// that `Streams::recv_headers` turns into a RST_STREAM (or the `431`) without queueing
/// the stream for `accept`, so hyper never calls the service and the connection goes on
/// without an error. Those are not counted (docs/ARCHITECTURE.md says so).
fn refused_head(err: &(dyn std::error::Error + 'static)) -> Option<StatusCode> {
    let mut source = Some(err);
    while let Some(err) = source {
        if let Some(hyper_err) = err.downcast_ref::<hyper::Error>() {
            if hyper_err.is_parse() {
                return answered_parse_error(hyper_err);
            }
        }
        if let Some(h2_err) = err.downcast_ref::<h2::Error>() {
            return h2_protocol_error(h2_err).then_some(StatusCode::BAD_REQUEST);
        }
        source = err.source();
    }
    None
}

/// Whether h2 closed the connection for the client's breach of the protocol.
fn h2_protocol_error(err: &h2::Error) -> bool {
    err.is_go_away()
        && err.is_library()
        && err.reason().is_some_and(|reason| {
            [
                h2::Reason::PROTOCOL_ERROR,
                h2::Reason::COMPRESSION_ERROR,
                h2::Reason::FRAME_SIZE_ERROR,
            ]
            .contains(&reason)
        })
}

/// The status hyper's HTTP/1 server answered a request head it could not parse with, as
/// its `on_error` decides (hyper answers these itself, before any service sees them):
/// `None` for the parse errors hyper closes on without an answer (an h2 preface on
/// HTTP/1, a response's status, an internal error).
fn answered_parse_error(hyper_err: &hyper::Error) -> Option<StatusCode> {
    if hyper_err.is_parse_version_h2() || hyper_err.is_parse_status() {
        return None;
    }
    // hyper tells `URI too long` from a head too large only in its message.
    let message = hyper_err.to_string();
    if hyper_err.is_parse_too_large() {
        return Some(if message.starts_with("URI too long") {
            StatusCode::URI_TOO_LONG
        } else {
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        });
    }
    (!message.starts_with("internal error")).then_some(StatusCode::BAD_REQUEST)
}

impl hyper::service::Service<Request<Incoming>> for ProxyService {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    /// The exchange begins here, when hyper has the whole head, not when the returned
    /// future is first polled: a client that leaves in between is still recorded (as
    /// cancelled, when hyper drops the future).
    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let t_req = Instant::now();
        let (parts, body) = request.into_parts();
        match self.0.gateway.begin(RequestHead::of(&parts), t_req) {
            Ok(admitted) => {
                let tunnels = self.0.tunnels.clone();
                Box::pin(async move { Ok(Proxy::forward(parts, body, admitted, tunnels).await) })
            }
            Err(answer) => Box::pin(std::future::ready(Ok(text(&answer)))),
        }
    }
}
