//! The one way into observation: the [exchange policy](crate::exchange), for either
//! transport, calls [`start`] at a request head and hands over bytes as they pass; this
//! module decides what is measured and records each measured request's outcome exactly
//! once.
//!
//! The flow, in http types and byte slices only (no body or I/O types):
//! - [`start`] inspects the head ([`inspect`]): an LLM route is measured, any other is
//!   counted as passthrough. It returns a [`RequestScan`] for the request body's bytes
//!   and a [`Pending`] for the response head.
//! - [`Pending::response`] takes the response head, picks the decoder and returns the
//!   [`ResponseObserver`] that is fed the response body's bytes; [`Pending::fail`]
//!   records a request that got no response head, and a `Pending` dropped before either
//!   (the client gave up while the upstream thought) records it as cancelled.
//! - [`ResponseObserver`] records the outcome once: at [`end`](ResponseObserver::end), at
//!   [`fail`](ResponseObserver::fail), or when dropped before either (the client went
//!   away).
//!
//! A panic inside an observer (reading the response head included) is caught: observation
//! of that stream stops, the stream itself goes on. A request dropped while a panic
//! unwinds the exchange is recorded as failed, not cancelled ([`crate::exchange::boundary`]).

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

mod burst;
#[cfg(test)]
pub(crate) mod inject;
pub mod inspect;
pub mod itl_sketch;
pub mod rate_limits;
mod recorder;

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use rate_limits::RateLimits;

use http::{header, HeaderMap, Method, StatusCode, Uri};

use crate::config::Config;
use crate::metrics::exemplar::TraceContext;
use crate::metrics::in_flight::LiveStream;
use crate::metrics::Metrics;
use crate::outcome::Outcome;
use crate::prefetch;
use crate::summary::{access_log, RequestFacts, RequestSummary, Sinks};
use crate::wire::grpc::request::GrpcRequestScanner;
use crate::wire::request::RequestScanner;
use crate::wire::{
    self, DecodeLimits, DecodeOptions, Decoder, Dialect, EngineTimings, Signal, Tokenizer,
    Unobservable,
};
#[cfg(test)]
pub(crate) use recorder::Recorder;
#[cfg(not(test))]
use recorder::Recorder;

/// Where a gRPC response reports how the call ended: in its trailers, or in the head of a
/// trailers-only response.
const GRPC_STATUS: &str = "grpc-status";

/// A request head as observation needs it: what any transport has parsed.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
}

impl<'a> RequestHead<'a> {
    /// The head of a request parsed by the `http` crate (hyper's).
    pub fn of(parts: &'a http::request::Parts) -> RequestHead<'a> {
        RequestHead {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
        }
    }
}

/// Start observing a request whose head was fully received at `t_req`, under `config`
/// and its loaded `tokenizer` (what the request keeps to its end).
pub fn start(
    head: RequestHead<'_>,
    t_req: Instant,
    config: &Arc<Config>,
    tokenizer: Option<&Tokenizer>,
    sinks: &Arc<Sinks>,
    served: &Arc<ServedModels>,
) -> (RequestScan, Pending) {
    let metrics = sinks.metrics();
    let path = head.uri.path();
    let routed = inspect::routed_dialect(
        &config.routes,
        head.method,
        path,
        head.uri.query(),
        head.headers,
    );
    let Some(dialect) = routed else {
        metrics.passthrough();
        // An engine's `GetModelInfo` passes through, read on the way for the model its
        // generate calls (which name none) are labelled with.
        let model_info = inspect::is_grpc(head.headers)
            .then(|| wire::grpc::route::model_info_rpc(path))
            .flatten()
            .map(|dialect| ModelInfoReader {
                dialect,
                body: Vec::new(),
                served: served.clone(),
                upstream: ServedModels::key(config),
                metrics: metrics.clone(),
            });
        let pending = Pending(Some(Waiting::Passthrough {
            method: head.method.clone(),
            uri: head.uri.clone(),
            t_req,
            model_info,
        }));
        return (RequestScan::inactive(), pending);
    };
    let mut facts = RequestFacts::new(
        head.method.clone(),
        path.to_string(),
        dialect,
        inspect::tenant_for(head.headers, &config.tenants),
    );
    if dialect.is_grpc() {
        facts.served_model = served.get(config);
    }
    let tracing = Tracing::of(head.headers, config, sinks);
    facts.trace = tracing.trace;
    facts.span = tracing.span;
    facts.trace_state = tracing.trace_state;
    // A sampled request's exemplars name its span (which is exported) rather than the
    // client's.
    if config.metrics.exemplars.enabled {
        facts.exemplar = facts.span.or(facts.trace);
    }
    let facts = Arc::new(facts);
    // With the live view on, this lists the request in flight: here, at its head, once
    // for either transport.
    let recorder = Recorder::new(
        sinks.clone(),
        t_req,
        facts.clone(),
        config.metrics.stall_threshold,
        config.objectives.clone(),
    );
    let live = recorder
        .live_stream()
        .map(|stream| LiveModel(stream.clone(), metrics.clone()));
    let pending = Pending(Some(Waiting::Measured {
        recorder: Box::new(recorder),
        config: config.clone(),
        tokenizer: tokenizer.cloned(),
    }));
    (RequestScan::new(facts, live), pending)
}

/// A request's place in a trace: what its head says, read when exemplars or spans want
/// it, and its own span when spans are on and it is sampled.
struct Tracing {
    /// The valid W3C `traceparent` it carried.
    trace: Option<TraceContext>,
    /// tokentap's span for it: the parent's trace (or a new one) and a new span id.
    span: Option<TraceContext>,
    /// The parent's `tracestate`, for a span with a parent.
    trace_state: Option<String>,
}

impl Tracing {
    fn of(headers: &HeaderMap, config: &Config, sinks: &Sinks) -> Tracing {
        let exemplars = &config.metrics.exemplars;
        let spans_on = sinks.spans.on();
        let mut tracing = Tracing {
            trace: None,
            span: None,
            trace_state: None,
        };
        if exemplars.enabled || spans_on {
            let parent = inspect::trace_parent(headers, &exemplars.header);
            tracing.trace = parent.map(|(trace, _)| trace);
            if spans_on {
                tracing.span = sinks.spans.decide(parent);
                if tracing.span.is_some() && parent.is_some() {
                    tracing.trace_state = inspect::trace_state(headers);
                }
            }
        }
        tracing
    }
}

/// A request tokentap answered with `status` itself, without sending it upstream and
/// without reading its body: refused at admission (`head` given), or a head it could not
/// read at all (`None`). Counted once like every other request, with `outcome` and
/// tokentap's status: on a measured route (or an unreadable head, whose route nobody
/// knows) in `tokentap_requests_total` with model `unknown`, on any other route as
/// passthrough.
pub fn refused(
    head: Option<RequestHead<'_>>,
    config: &Config,
    sinks: &Sinks,
    status: StatusCode,
    outcome: Outcome,
) {
    let metrics = sinks.metrics();
    let dialect = match head {
        Some(head) => {
            let routed = inspect::routed_dialect(
                &config.routes,
                head.method,
                head.uri.path(),
                head.uri.query(),
                head.headers,
            );
            let Some(dialect) = routed else {
                metrics.passthrough();
                access_log::passthrough(head.method, head.uri.path(), status, None);
                return;
            };
            Some(dialect)
        }
        None => None,
    };
    let tenant = head.and_then(|head| inspect::tenant_for(head.headers, &config.tenants));
    let series = metrics.stream(None, tenant.as_deref());
    let verdict =
        crate::outcome::Verdict::new(outcome, crate::outcome::StatusClass::tokentap(status));
    sinks.refused(&series, verdict, config.objectives.as_ref());
    if let (Some(head), Some(dialect)) = (head, dialect) {
        refused_span(head, dialect, config, sinks, &series, verdict, status);
    }
    access_log::refused(
        head.map(|head| head.method.as_str()),
        head.map(|head| head.uri.path()),
        dialect,
        (series.model(), series.tenant()),
        status,
        verdict,
    );
}

/// The span of a request tokentap answered itself before any exchange, when spans are on
/// and it is sampled: it starts and ends at once, with the status and outcome tokentap
/// gave, so a caller's trace shows where its call stopped.
fn refused_span(
    head: RequestHead<'_>,
    dialect: Dialect,
    config: &Config,
    sinks: &Sinks,
    series: &crate::metrics::StreamSeries,
    verdict: crate::outcome::Verdict,
    status: StatusCode,
) {
    let tracing = Tracing::of(head.headers, config, sinks);
    if tracing.span.is_none() {
        return;
    }
    let mut facts = RequestFacts::new(
        head.method.clone(),
        head.uri.path().to_string(),
        dialect,
        None,
    );
    facts.trace = tracing.trace;
    facts.span = tracing.span;
    facts.trace_state = tracing.trace_state;
    let mut summary = RequestSummary::unmeasured(
        Arc::new(facts),
        series.model().clone(),
        series.tenant().clone(),
        verdict,
    );
    summary.http_status = Some(status.as_u16());
    summary.answered_by_tokentap = true;
    sinks.spans.finished(&summary);
}

/// The request body's scan for `model` and `stream`, fed bytes as they go upstream.
pub struct RequestScan {
    /// `None` once the scan is done (or never needed: passthrough, or a panic).
    scanner: Option<(Scanner, Arc<RequestFacts>)>,
    /// The request's entry in the live view's list, to label with the model once the
    /// body names it.
    live: Option<LiveModel>,
}

/// A live entry whose model label is not set yet, and the metrics whose label policy
/// resolves it.
struct LiveModel(Arc<LiveStream>, Arc<Metrics>);

impl LiveModel {
    /// Label the entry with the request's model, if the body has named it: the request's
    /// model is the label (`Recorder`'s rule), so it is final. Whether it is labelled.
    fn label(&self, facts: &RequestFacts) -> bool {
        let LiveModel(stream, metrics) = self;
        if let Some(model) = facts.model.get() {
            stream.model_or_init(|| metrics.model_label(Some(model)));
        } else if facts.model_too_long.get().is_some() {
            stream.model_or_init(|| metrics.model_label_too_long());
        } else {
            return stream.model().is_some();
        }
        true
    }
}

/// A JSON body's scanner, or a gRPC one's (the first request message); their interfaces
/// match.
enum Scanner {
    Json(RequestScanner),
    Grpc(GrpcRequestScanner),
}

macro_rules! each_scanner {
    ($scanner:expr, $s:ident => $body:expr) => {
        match $scanner {
            Scanner::Json($s) => $body,
            Scanner::Grpc($s) => $body,
        }
    };
}

impl RequestScan {
    fn new(facts: Arc<RequestFacts>, live: Option<LiveModel>) -> RequestScan {
        let scanner = if facts.dialect.is_grpc() {
            Scanner::Grpc(GrpcRequestScanner::new(facts.dialect))
        } else {
            Scanner::Json(RequestScanner::new())
        };
        RequestScan {
            scanner: Some((scanner, facts)),
            live,
        }
    }

    fn inactive() -> RequestScan {
        RequestScan {
            scanner: None,
            live: None,
        }
    }

    /// Look at the next bytes of the request body; what they say is published at once.
    pub fn feed(&mut self, bytes: &[u8]) {
        let Some((scanner, facts)) = self.scanner.as_mut() else {
            return;
        };
        let live = &mut self.live;
        let scanned = catch_unwind(AssertUnwindSafe(|| {
            each_scanner!(scanner, s => {
                s.feed(bytes);
                if let Some(model) = s.model() {
                    if facts.model.get().is_none() {
                        let _ = facts.model.set(model.to_string());
                    }
                }
                if s.model_too_long() {
                    let _ = facts.model_too_long.set(());
                }
                if let Some(stream) = s.stream() {
                    let _ = facts.stream.set(stream);
                }
                if live.as_ref().is_some_and(|live| live.label(facts)) {
                    *live = None;
                }
                s.is_done()
            })
        }));
        if scanned.unwrap_or(true) {
            self.scanner = None;
            self.live = None;
        }
    }
}

/// A request sent upstream, waiting for its response head. Dropped while waiting (the
/// client gave up, or shutdown went past its drain deadline), a measured request is
/// recorded as cancelled.
pub struct Pending(Option<Waiting>);

enum Waiting {
    Measured {
        /// Boxed: the clock's state makes it much larger than the other variant.
        recorder: Box<Recorder>,
        config: Arc<Config>,
        /// `observe.tokenizer`, loaded.
        tokenizer: Option<Tokenizer>,
    },
    /// Not an LLM route: only the access log hears of it (and, for an engine's
    /// `GetModelInfo`, the served models).
    Passthrough {
        method: Method,
        uri: Uri,
        t_req: Instant,
        model_info: Option<ModelInfoReader>,
    },
}

impl Pending {
    /// The response head arrived at `at`: the observer of its body, or `None` for a
    /// passthrough route (whose body needs no observer).
    pub fn response(
        mut self,
        at: Instant,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<ResponseObserver> {
        match self.0.take()? {
            Waiting::Measured {
                mut recorder,
                config,
                tokenizer,
            } => {
                recorder.response_head(at, status);
                let metrics = recorder.metrics().clone();
                // The head is the upstream's: a panic while reading it (a bug, a value no
                // conversion expected) stops observing this response, which still goes to
                // the client and is recorded once with its status.
                let mut decoder = None;
                guarded(&metrics, || {
                    #[cfg(test)]
                    inject::injected_panic(headers, inject::Stage::Head);
                    if recorder.dialect().is_grpc() {
                        // A trailers-only response (a call that failed at once) carries its
                        // status in the head.
                        if let Some(value) = headers.get(GRPC_STATUS) {
                            recorder.grpc_status(value.as_bytes());
                        }
                    }
                    if let Some(limits) = RateLimits::read(status, headers, SystemTime::now) {
                        recorder.rate_limits(limits);
                    }
                    if let Some(queue) = head_queue_time(recorder.dialect(), headers) {
                        let timings = EngineTimings {
                            queue: Some(queue),
                            ..EngineTimings::default()
                        };
                        recorder.apply(at, &[Signal::EngineTimings(timings)]);
                    }
                    decoder = decoder_for(
                        &config,
                        tokenizer.as_ref(),
                        &metrics,
                        recorder.dialect(),
                        status,
                        headers,
                    );
                });
                Some(ResponseObserver::new(*recorder, decoder, metrics))
            }
            Waiting::Passthrough {
                method,
                uri,
                t_req,
                model_info,
            } => {
                access_log::passthrough(
                    &method,
                    uri.path(),
                    status,
                    Some(at.saturating_duration_since(t_req)),
                );
                let model_info = model_info.filter(|_| status.is_success())?;
                Some(ResponseObserver {
                    observing: None,
                    metrics: model_info.metrics.clone(),
                    model_info: Some(model_info),
                })
            }
        }
    }

    /// No response head came (the upstream failed or timed out, or the client's request
    /// was refused) and tokentap answered `status` itself: record `outcome` at `at`.
    pub fn fail(mut self, at: Instant, status: StatusCode, outcome: Outcome) {
        if let Some(Waiting::Measured { mut recorder, .. }) = self.0.take() {
            recorder.answered_by_tokentap(status);
            recorder.record(at, outcome);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(Waiting::Measured { mut recorder, .. }) = self.0.take() {
            let metrics = recorder.metrics().clone();
            guarded(&metrics, || {
                if std::thread::panicking() {
                    // Unwinding from a panic in the exchange, before any head: its
                    // boundary answers `502` (exchange::boundary).
                    tracing::error!("request failed inside tokentap before its response head");
                    recorder.answered_by_tokentap(StatusCode::BAD_GATEWAY);
                    recorder.record(Instant::now(), Outcome::UpstreamError);
                } else {
                    recorder.record(Instant::now(), Outcome::Cancelled);
                }
            });
        }
    }
}

/// The engine's queue time a response head reports: TGI's `x-queue-time` (one lookup, on
/// TGI responses only; the other dialects report theirs in the body).
fn head_queue_time(dialect: Dialect, headers: &HeaderMap) -> Option<std::time::Duration> {
    if dialect != Dialect::Tgi {
        return None;
    }
    let value = headers.get(wire::tgi::QUEUE_TIME_HEADER)?;
    wire::tgi::queue_time(value.as_bytes())
}

/// Choose the decoder for a response head, or `None` to forward it unobserved (counted,
/// with its reason, where the status said there should have been tokens).
fn decoder_for(
    config: &Config,
    tokenizer: Option<&Tokenizer>,
    metrics: &Metrics,
    dialect: Dialect,
    status: StatusCode,
    headers: &HeaderMap,
) -> Option<Box<dyn Decoder>> {
    if !status.is_success() {
        // Error bodies carry no tokens; the status decides the outcome.
        return None;
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // A compressed body is forwarded as it came; the decoder inflates its own copy.
    let content_encoding = headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes());
    let options = DecodeOptions {
        limits: DecodeLimits {
            max_event_bytes: config.observe.max_event_bytes,
            max_body_bytes: config.observe.max_body_bytes,
        },
        skip_special_tokens: config.observe.skip_special_tokens,
        tokenizer,
        grpc_encoding: headers.get("grpc-encoding").map(|v| v.as_bytes()),
    };
    match wire::response_decoder(dialect, content_type, content_encoding, options) {
        Ok(decoder) => Some(decoder),
        Err(reason) => {
            metrics.unobserved(reason);
            None
        }
    }
}

/// Watches one response body and records its request's outcome exactly once.
pub struct ResponseObserver {
    /// `None` once the outcome is recorded (or for a passthrough `GetModelInfo`).
    observing: Option<Observing>,
    metrics: Arc<Metrics>,
    /// A passthrough `GetModelInfo` answer being read.
    model_info: Option<ModelInfoReader>,
}

/// The models the engines behind each upstream said they serve, in the last `GetModelInfo`
/// answer that passed through: the label of their generate calls, whose requests name no
/// model (SGLang, vLLM, TensorRT-LLM). Kept across reloads; one entry per upstream (a
/// reload that changes the upstream starts with none for it).
#[derive(Debug, Default)]
pub struct ServedModels {
    by_upstream: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// Upstreams remembered at most: more are only there after many reloads to new upstreams.
const SERVED_UPSTREAMS: usize = 16;

impl ServedModels {
    fn key(config: &Config) -> String {
        format!("{}{}", config.upstream.authority, config.upstream.base_path)
    }

    fn get(&self, config: &Config) -> Option<String> {
        let by_upstream = self
            .by_upstream
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        by_upstream.get(&Self::key(config)).cloned()
    }

    fn set(&self, upstream: String, model: String) {
        let mut by_upstream = self
            .by_upstream
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if by_upstream.len() >= SERVED_UPSTREAMS && !by_upstream.contains_key(&upstream) {
            by_upstream.clear();
        }
        by_upstream.insert(upstream, model);
    }
}

/// Largest `GetModelInfo` answer read (a few hundred bytes in practice); a longer one is
/// forwarded unread.
const MODEL_INFO_MAX_BYTES: usize = 64 * 1024;

/// Reads a passthrough `GetModelInfo` answer (one uncompressed message) for its model.
struct ModelInfoReader {
    dialect: Dialect,
    body: Vec<u8>,
    served: Arc<ServedModels>,
    upstream: String,
    metrics: Arc<Metrics>,
}

impl ModelInfoReader {
    fn data(&mut self, bytes: &[u8]) {
        if self.body.len().saturating_add(bytes.len()) <= MODEL_INFO_MAX_BYTES {
            self.body.extend_from_slice(bytes);
        } else {
            self.body = vec![0xff];
        }
    }

    fn end(self) {
        let message = match self.body.as_slice() {
            [0, a, b, c, d, message @ ..] => {
                let n = usize::try_from(u32::from_be_bytes([*a, *b, *c, *d])).unwrap_or(usize::MAX);
                message.get(..n)
            }
            _ => None,
        };
        let model = message.and_then(|m| wire::grpc::model_info::model_info_model(self.dialect, m));
        if let Some(model) = model {
            tracing::info!(
                upstream = %self.upstream,
                model = %model,
                "the engine named the model it serves"
            );
            self.served.set(self.upstream, model);
        }
    }
}

/// The decoder plus the recorder it feeds.
struct Observing {
    recorder: Recorder,
    /// `None` once observation stopped (limit hit, panic, or a response not decoded).
    decoder: Option<Box<dyn Decoder>>,
}

thread_local! {
    /// What one feed of a decoder found: the worker's, not each stream's, because it is
    /// empty between feeds, and a buffer per stream would be one more cold cache line
    /// touched per event when a worker carries many streams. Borrowed in place (taking
    /// the vector out and putting it back moved it twice per feed).
    static SIGNALS: RefCell<Vec<Signal>> = const { RefCell::new(Vec::new()) };
}

/// Run `work` on the worker's (empty) signal buffer.
fn with_signals<R>(work: impl FnOnce(&mut Vec<Signal>) -> R) -> R {
    SIGNALS.with(|signals| match signals.try_borrow_mut() {
        Ok(mut signals) => {
            // A feed that panicked left its signals behind.
            signals.clear();
            let result = work(&mut signals);
            signals.clear();
            result
        }
        // In use further up this thread's stack.
        Err(_) => work(&mut Vec::new()),
    })
}

impl ResponseObserver {
    pub(crate) fn new(
        recorder: Recorder,
        decoder: Option<Box<dyn Decoder>>,
        metrics: Arc<Metrics>,
    ) -> ResponseObserver {
        ResponseObserver {
            observing: Some(Observing { recorder, decoder }),
            metrics,
            model_info: None,
        }
    }

    /// Look at the bytes of one response body frame that arrived at `at`.
    pub fn data(&mut self, at: Instant, bytes: &[u8]) {
        if let Some(model_info) = self.model_info.as_mut() {
            model_info.data(bytes);
        }
        let Some(observing) = self.observing.as_mut() else {
            return;
        };
        if observing.decoder.is_none() {
            return;
        }
        if !guarded(&self.metrics, || observing.decode(at, bytes, &self.metrics)) {
            // The decoder's state is not trusted after a panic; the request is still
            // recorded when the stream ends.
            observing.decoder = None;
        }
    }

    /// The memory [`data`](Self::data) touches first: what a transport lists for the
    /// poll that brings the next data ([`prefetch::for_next_poll`]), so that the memory
    /// comes in as the poll starts.
    pub fn hot_lines(&self, lines: &mut prefetch::Lines) {
        if let Some(observing) = self.observing.as_ref() {
            lines.value(&observing.decoder);
            if let Some(decoder) = observing.decoder.as_deref() {
                lines.value(decoder);
            }
            observing.recorder.hot_lines(lines);
        }
    }

    /// The response's trailers passed (forwarded unchanged): a gRPC call's status is there.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        let Some(observing) = self.observing.as_mut() else {
            return;
        };
        if observing.recorder.dialect().is_grpc() {
            if let Some(value) = trailers.get(GRPC_STATUS) {
                observing.recorder.grpc_status(value.as_bytes());
            }
        }
    }

    /// The body ended cleanly at `at`.
    pub fn end(&mut self, at: Instant) {
        if let Some(model_info) = self.model_info.take() {
            guarded(&self.metrics, || model_info.end());
        }
        if let Some(mut observing) = self.observing.take() {
            observing.recorder.whole_body();
            guarded(&self.metrics, || observing.end(at, &self.metrics));
        }
    }

    /// The body failed at `at` with `outcome` (an upstream error, an idle timeout).
    pub fn fail(&mut self, at: Instant, outcome: Outcome) {
        if let Some(observing) = self.observing.take() {
            guarded(&self.metrics, || observing.recorder.record(at, outcome));
        }
    }
}

impl Drop for ResponseObserver {
    fn drop(&mut self) {
        if let Some(observing) = self.observing.take() {
            // Dropped before the end: the client went away (or the server is shutting
            // down past its drain deadline). A client that leaves right after the
            // stream's end marker got everything.
            let at = Instant::now();
            let metrics = &self.metrics;
            guarded(metrics, || {
                if std::thread::panicking() {
                    // Unwinding from a panic in the exchange: the response breaks off.
                    tracing::error!("response failed inside tokentap; breaking it off");
                    observing.recorder.record(at, Outcome::UpstreamError);
                } else if observing.recorder.saw_end_marker() {
                    observing.end(at, metrics);
                } else {
                    observing.recorder.record(at, Outcome::Cancelled);
                }
            });
        }
    }
}

impl Observing {
    fn decode(&mut self, at: Instant, bytes: &[u8], metrics: &Metrics) {
        let Some(decoder) = self.decoder.as_mut() else {
            return;
        };
        let recorder = &mut self.recorder;
        let fed = with_signals(|signals| {
            let fed = decoder.feed(bytes, signals);
            // What was decoded before a bound was hit still counts.
            recorder.apply(at, signals);
            fed
        });
        if let Err(err) = fed {
            tracing::debug!(error = %err, "stopped observing a stream");
            metrics.unobserved(Unobservable::for_decode_error(&err));
            self.decoder = None;
        }
    }

    fn end(mut self, at: Instant, metrics: &Metrics) {
        if let Some(mut decoder) = self.decoder.take() {
            let recorder = &mut self.recorder;
            with_signals(|signals| {
                if let Err(err) = decoder.finish(signals) {
                    metrics.unobserved(Unobservable::for_decode_error(&err));
                }
                recorder.apply(at, signals);
            });
        }
        self.recorder.record(at, Outcome::Completed);
    }
}

/// Run observer code; a panic stops observation but never reaches the stream.
fn guarded(metrics: &Metrics, work: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(()) => true,
        Err(_) => {
            tracing::error!("observer panicked; the stream continues unobserved");
            metrics.unobserved(Unobservable::ObserverPanic);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::in_flight::Phase;

    /// A flag-only config, and its sinks with the live list on.
    fn live_sinks() -> (Arc<Config>, Arc<Sinks>, Arc<ServedModels>) {
        let config = Arc::new(
            Config::from_overrides(&crate::config::Overrides {
                upstream: Some("http://127.0.0.1:9".to_string()),
                ..Default::default()
            })
            .expect("flag-only config is valid"),
        );
        let sinks = Sinks::new(Metrics::new(&config.metrics.buckets, &config.labels));
        sinks.in_flight.enable();
        (config, sinks, Arc::new(ServedModels::default()))
    }

    #[test]
    fn an_events_prefetch_list_holds_its_state_and_leaves_room_for_the_relay() {
        let (config, sinks, served) = live_sinks();
        let (method, uri) = (Method::POST, Uri::from_static("/v1/chat/completions"));
        let headers = HeaderMap::new();
        let head = RequestHead {
            method: &method,
            uri: &uri,
            headers: &headers,
        };
        let (_, pending) = start(head, Instant::now(), &config, None, &sinks, &served);
        let mut response = HeaderMap::new();
        response.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        let mut observer = pending
            .response(Instant::now(), StatusCode::OK, &response)
            .expect("a measured route is observed");
        let event = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        observer.data(Instant::now(), event);
        let mut lines = prefetch::Lines::default();
        observer.hot_lines(&mut lines);
        let observing = observer.observing.as_ref().unwrap();
        let decoder = observing.decoder.as_deref().unwrap();
        assert!(
            lines.holds(std::ptr::from_ref(decoder)),
            "the decoder's state"
        );
        let live = observing.recorder.live_stream().unwrap();
        assert!(lines.holds(Arc::as_ptr(live)), "the live entry's counters");
        // The relay lists its loop's own lines and its response reader too: N bytes lie
        // in at most N / LINE lines, rounded up, plus one where they start inside a line.
        let reader = std::mem::size_of::<crate::relay::response::ResponseReader>();
        let reader = reader.div_ceil(prefetch::LINE) + 1;
        let relay = crate::relay::connection::LOOP_LINES + reader;
        assert!(
            lines.len() + relay <= prefetch::CAPACITY,
            "{} lines listed, {relay} more for the relay, {} fit",
            lines.len(),
            prefetch::CAPACITY
        );
    }

    #[test]
    fn a_request_is_listed_from_its_head_until_it_ends_however_it_ends() {
        let (config, sinks, served) = live_sinks();
        let (method, uri) = (Method::POST, Uri::from_static("/v1/chat/completions"));
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant-id", "t".parse().unwrap());
        let head = RequestHead {
            method: &method,
            uri: &uri,
            headers: &headers,
        };
        let t0 = Instant::now();
        let (mut scan, pending) = start(head, t0, &config, None, &sinks, &served);
        let views = sinks.in_flight.views(t0);
        assert_eq!(views.len(), 1);
        assert_eq!((views[0].model.as_deref(), &*views[0].tenant), (None, "t"));
        scan.feed(br#"{"model":"#);
        assert_eq!(sinks.in_flight.views(t0)[0].model, None);
        scan.feed(br#""m","stream":true}"#);
        assert_eq!(sinks.in_flight.views(t0)[0].model.as_deref(), Some("m"));
        // The client gave up before the head: recorded as cancelled, and unlisted.
        drop(pending);
        assert!(sinks.in_flight.is_empty());
        // No head came and tokentap answered: unlisted too.
        let (_, pending) = start(head, t0, &config, None, &sinks, &served);
        assert_eq!(sinks.in_flight.len(), 1);
        pending.fail(
            Instant::now(),
            StatusCode::BAD_GATEWAY,
            Outcome::UpstreamError,
        );
        assert!(sinks.in_flight.is_empty());
        // A head, then the body's end.
        let (_, pending) = start(head, t0, &config, None, &sinks, &served);
        let mut observer = pending
            .response(Instant::now(), StatusCode::OK, &HeaderMap::new())
            .expect("a measured route is observed");
        assert_eq!(sinks.in_flight.views(t0)[0].phase, Phase::FirstToken);
        observer.end(Instant::now());
        assert!(sinks.in_flight.is_empty());
    }
}
