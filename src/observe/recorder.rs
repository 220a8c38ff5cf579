//! `Recorder`: one request's measurement state, from request head to outcome.
//!
//! It owns the `TokenClock`, resolves the request's metric handles once (lazily, so a
//! model named only by the response can still label it), observes per-event figures as
//! they happen, and records the per-request figures and the outcome exactly once, in
//! [`Recorder::record`], which consumes it. The observers in [`super`] guarantee `record`
//! is called on every exit, including a drop.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use prometheus::IntGauge;

use super::itl_sketch::ItlSketch;
use super::rate_limits::RateLimits;
use crate::clock::{Stamp, Timings, TokenClock};
use crate::metrics::exemplar::TraceContext;
use crate::metrics::live::{LiveEntry, LiveStream};
use crate::metrics::requests::FinishedRequest;
use crate::metrics::{EngineFigures, Metrics, RequestExemplar, RequestFigures, StreamSeries};
use crate::outcome::{verdict, Outcome, StatusClass};
use crate::wire::{gen_ai, Dialect, EngineTimings, ErrorClass, Signal};

/// The most distinct finish reasons kept for one request.
const MAX_FINISH_REASONS: usize = 8;

/// What is known about one measured request: who it is (from its head, at once) and what
/// its body said (published by the request scan as soon as it is read). Labels and the
/// access log come from here.
#[derive(Debug)]
pub struct RequestFacts {
    pub method: http::Method,
    /// The path without its query (a query can hold keys).
    pub path: String,
    pub dialect: Dialect,
    pub tenant: Option<String>,
    /// The request's valid W3C trace context, when exemplars or spans are on and it
    /// carried one.
    pub trace: Option<TraceContext>,
    /// tokentap's own span for the request, when spans are on and it was sampled: the
    /// parent's trace id (or a new one) and a new span id.
    pub span: Option<TraceContext>,
    /// The parent's valid W3C `tracestate`, for a request with a span and a parent: the
    /// span carries it.
    pub trace_state: Option<String>,
    /// What the request's exemplars name, when exemplars are on: its span, else the trace
    /// context it carried.
    pub exemplar: Option<TraceContext>,
    pub model: OnceLock<String>,
    /// Set when the body's `model` was too long for the request scanner to read.
    pub model_too_long: OnceLock<()>,
    pub stream: OnceLock<bool>,
    /// The model the upstream's engine said it serves (`GetModelInfo`), for a gRPC
    /// dialect whose requests name none: the label when neither request nor response
    /// names one.
    pub served_model: Option<String>,
}

impl RequestFacts {
    /// Facts from the head; the body's are filled in as the scan finds them.
    pub fn new(
        method: http::Method,
        path: String,
        dialect: Dialect,
        tenant: Option<String>,
    ) -> RequestFacts {
        RequestFacts {
            method,
            path,
            dialect,
            tenant,
            trace: None,
            span: None,
            trace_state: None,
            exemplar: None,
            model: OnceLock::new(),
            model_too_long: OnceLock::new(),
            stream: OnceLock::new(),
            served_model: None,
        }
    }
}

/// Keeps `tokentap_streams_in_flight` honest: incremented on creation, decremented on drop.
struct InFlight(IntGauge);

impl InFlight {
    fn enter(gauge: &IntGauge) -> InFlight {
        gauge.inc();
        InFlight(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Measurement state of one LLM request.
pub struct Recorder {
    metrics: Arc<Metrics>,
    clock: TokenClock,
    facts: Arc<RequestFacts>,
    response_model: Option<String>,
    handles: Option<StreamSeries>,
    /// The status the client was told, and whether tokentap (not the upstream) said it.
    status: Option<StatusCode>,
    answered_by_tokentap: bool,
    stall_threshold: Duration,
    /// The class of the first error the stream itself reported.
    stream_error: Option<ErrorClass>,
    /// The stream's own end marker (`[DONE]`, `message_stop`, ...) was seen.
    end_marker: bool,
    malformed: u64,
    /// The `grpc-status` code the response reported (in its trailers, or in the head of a
    /// trailers-only response), for a gRPC dialect.
    grpc_status: Option<u32>,
    /// The transport saw the body's own end (with its trailers, if any), not only the
    /// stream's end marker before the client left.
    whole_body: bool,
    /// The rate limits the response head reported, recorded with the outcome (when the
    /// model that labels them is known for sure).
    rate_limits: Option<Box<RateLimits>>,
    /// The largest per-token value observed into ITL so far: the ITL exemplar's value.
    slowest_itl: Option<Duration>,
    /// Every per-token ITL value, sketched for the median: kept only for a request that
    /// gets a span.
    itl_sketch: Option<ItlSketch>,
    /// The finish reasons the stream named, each once.
    finish_reasons: Vec<String>,
    /// What the engine reported of its own time, recorded with the outcome.
    engine: EngineTimings,
    in_flight: InFlight,
    /// The request's entry in the live view's list of requests in flight, from its head
    /// to its record, while the live view is on.
    live: Option<LiveEntry>,
}

impl Recorder {
    pub fn new(
        metrics: Arc<Metrics>,
        t_req: Instant,
        facts: Arc<RequestFacts>,
        stall_threshold: Duration,
    ) -> Recorder {
        let in_flight = InFlight::enter(&metrics.streams_in_flight);
        let itl_sketch = facts.span.map(|_| ItlSketch::default());
        let live = if metrics.live_streams.is_enabled() {
            let tenant = metrics.tenant_label(facts.tenant.as_deref());
            metrics.live_streams.register(None, tenant, t_req)
        } else {
            None
        };
        Recorder {
            metrics,
            clock: TokenClock::new(t_req),
            facts,
            response_model: None,
            handles: None,
            status: None,
            answered_by_tokentap: false,
            stall_threshold,
            stream_error: None,
            end_marker: false,
            malformed: 0,
            grpc_status: None,
            whole_body: false,
            rate_limits: None,
            slowest_itl: None,
            itl_sketch,
            finish_reasons: Vec::new(),
            engine: EngineTimings::default(),
            in_flight,
            live,
        }
    }

    /// The metrics this request is recorded in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The request's API dialect.
    pub fn dialect(&self) -> Dialect {
        self.facts.dialect
    }

    /// The upstream response head arrived at `at`.
    pub fn response_head(&mut self, at: Instant, status: StatusCode) {
        self.clock.response_head(at);
        self.status = Some(status);
        if let Some(entry) = &self.live {
            entry.stream().response_head(at);
        }
    }

    /// The request's entry in the live view's list, while the live view is on: the
    /// request scan names its model there as soon as the body says it.
    pub fn live_stream(&self) -> Option<&Arc<LiveStream>> {
        self.live.as_ref().map(LiveEntry::stream)
    }

    /// The rate limits the upstream reported in its response head.
    pub fn rate_limits(&mut self, limits: RateLimits) {
        self.rate_limits = Some(Box::new(limits));
    }

    /// The upstream reported `grpc-status: value` (in the trailers, or the head of a
    /// trailers-only response). The first report stands. A value that is no decimal code
    /// is read as `UNKNOWN` (2), as a gRPC client reads it.
    pub fn grpc_status(&mut self, value: &[u8]) {
        if self.grpc_status.is_none() {
            self.grpc_status = Some(verdict::read_grpc_status(value));
        }
    }

    /// The transport saw the body end, trailers and all: a gRPC call that reported no
    /// `grpc-status` by then never will ([`verdict::grpc_code`]).
    pub fn whole_body(&mut self) {
        self.whole_body = true;
    }

    /// No upstream head came and tokentap answered the client itself with `status`: the
    /// access log shows what the client got. No clock is stamped (there was no TTFB).
    pub fn answered_by_tokentap(&mut self, status: StatusCode) {
        self.status = Some(status);
        self.answered_by_tokentap = true;
    }

    /// Apply the signals decoded from one frame that arrived at `at`, in order.
    pub fn apply(&mut self, at: Instant, signals: &[Signal]) {
        for signal in signals {
            match signal {
                Signal::Output {
                    tokens,
                    exact,
                    kind,
                } => {
                    let content_pending = !self.clock.has_content();
                    let stamp = self.clock.output(at, *tokens, *exact, *kind);
                    let stall_threshold = self.stall_threshold;
                    if let Stamp::Next {
                        itl: Some(share), ..
                    } = stamp
                    {
                        if share.count > 0 {
                            self.slowest_itl = self.slowest_itl.max(Some(share.per_token));
                        }
                        if let Some(sketch) = &mut self.itl_sketch {
                            sketch.add(share.per_token, share.count);
                        }
                    }
                    let handles = self.handles();
                    if *exact {
                        // As the clock reads it: an exact 0 is one token.
                        handles
                            .tokens_per_event()
                            .observe(f64::from((*tokens).max(1)));
                    }
                    let gap = match stamp {
                        Stamp::First { .. } => None,
                        Stamp::Next { gap, .. } => Some(gap),
                    };
                    if let Some(entry) = &self.live {
                        entry.stream().event(at, u64::from((*tokens).max(1)), gap);
                    }
                    let handles = self.handles();
                    match stamp {
                        Stamp::First { ttft } => handles.first_token(ttft),
                        Stamp::Next { gap, itl } => {
                            if let Some(share) = itl {
                                handles.observe_itl(share.per_token, share.count);
                            }
                            handles.chunk_gap(gap);
                            if gap >= stall_threshold {
                                handles.stalls().inc();
                            }
                        }
                    }
                    if content_pending {
                        if let Some(ttft_content) = self.clock.ttft_content() {
                            self.handles()
                                .ttft_content()
                                .observe(ttft_content.as_secs_f64());
                        }
                    }
                }
                Signal::Usage {
                    input_tokens,
                    output_tokens,
                } => self.clock.usage(*input_tokens, *output_tokens),
                Signal::Model(model) => {
                    if self.response_model.is_none() {
                        self.response_model = Some(model.clone());
                    }
                }
                Signal::Error(class) => {
                    self.stream_error.get_or_insert(*class);
                }
                Signal::Malformed => self.malformed = self.malformed.saturating_add(1),
                Signal::Done => self.end_marker = true,
                Signal::TrailingTokens(tokens) => self.clock.trailing_tokens(*tokens),
                Signal::EngineTimings(timings) => self.engine.merge(*timings),
                Signal::TokenDetails(details) => self.clock.token_details(**details),
                Signal::FinishReason(reason) => {
                    // Each reason once; a stream of many choices names a few at most.
                    if self.finish_reasons.len() < MAX_FINISH_REASONS
                        && !self.finish_reasons.contains(reason)
                    {
                        self.finish_reasons.push(reason.clone());
                    }
                }
            }
        }
    }

    /// Add what [`apply`](Self::apply) writes per event outside the recorder itself.
    pub fn hot_lines(&self, lines: &mut crate::prefetch::Lines) {
        self.clock.hot_lines(lines);
    }

    /// The request's metric handles, resolved on first use.
    fn handles(&mut self) -> &StreamSeries {
        match self.handles {
            Some(ref handles) => handles,
            None => {
                let handles = self.resolve_handles();
                self.handles.insert(handles)
            }
        }
    }

    /// Resolve the request's metric handles (its labels, once).
    fn resolve_handles(&mut self) -> StreamSeries {
        // Each label is resolved once: the live entry's, where there is one, were
        // resolved at registration and (the model) by the request scan.
        let (model, tenant) = match &self.live {
            Some(entry) => (
                entry.stream().model_or_init(|| self.model_label()).clone(),
                entry.stream().tenant.clone(),
            ),
            None => (
                self.model_label(),
                self.metrics.tenant_label(self.facts.tenant.as_deref()),
            ),
        };
        let mut handles = self.metrics.stream_of(model, tenant);
        let dialect = self.facts.dialect;
        self.metrics.attach_gen_ai(
            &mut handles,
            gen_ai::operation_name(dialect, &self.facts.path),
            gen_ai::provider_name(dialect),
            self.facts.stream.get() != Some(&false),
        );
        if let Some(ttfb) = self.clock.ttfb() {
            handles.ttfb().observe(ttfb.as_secs_f64());
        }
        handles
    }

    /// The `model` label: the request's model, even one too long to read, wins over the
    /// response's, as a readable one does; then the model the engine said it serves.
    fn model_label(&self) -> Arc<str> {
        let request_model = self.facts.model.get().map(String::as_str);
        if request_model.is_none() && self.facts.model_too_long.get().is_some() {
            return self.metrics.model_label_too_long();
        }
        let model = request_model
            .or(self.response_model.as_deref())
            .or(self.facts.served_model.as_deref());
        self.metrics.model_label(model)
    }

    /// Whether the stream's own end marker arrived: a client that leaves after it has
    /// received the whole answer, even if the connection's final framing was not yet
    /// delivered.
    pub fn saw_end_marker(&self) -> bool {
        self.end_marker
    }

    /// Record the request's verdict and per-request figures, the transport having seen it
    /// end as `end`. Consumes the recorder: once only.
    pub fn record(mut self, at: Instant, end: Outcome) {
        let status = match self.status {
            None => StatusClass::None,
            Some(status) if self.answered_by_tokentap => StatusClass::tokentap(status),
            Some(status) => StatusClass::upstream(status),
        };
        let grpc_code = verdict::grpc_code(self.facts.dialect, self.whole_body, self.grpc_status);
        let verdict = verdict::verdict(end, status, self.stream_error, grpc_code);
        let timings = self.clock.timings(at);
        let handles = match self.handles.take() {
            Some(handles) => handles,
            None => self.resolve_handles(),
        };
        let handles = &handles;
        for share in &timings.deferred_itl {
            handles.observe_itl(share.per_token, share.count);
            if share.count > 0 {
                self.slowest_itl = self.slowest_itl.max(Some(share.per_token));
            }
            if let Some(sketch) = &mut self.itl_sketch {
                sketch.add(share.per_token, share.count);
            }
        }
        let mut figures = RequestFigures::from(&timings);
        figures.exemplar = self.facts.exemplar.map(|trace| RequestExemplar {
            trace,
            at: SystemTime::now(),
            ttft: timings.ttft,
            slowest_itl: self.slowest_itl,
        });
        // The stream leaves `tokentap_streams_in_flight` before it is counted, so a scrape
        // that sees the request counted never sees it in flight too.
        drop(self.in_flight);
        drop(self.live.take());
        self.metrics
            .record_gen_ai(handles, verdict, timings.ttft, &figures);
        self.metrics.record_request(handles, verdict, figures);
        if !self.engine.is_empty() {
            let figures = engine_figures(&self.engine, timings.ttft);
            self.metrics.record_engine_timings(handles, figures);
        }
        if let Some(limits) = self.rate_limits.take() {
            limits.record(&self.metrics, handles);
        }
        self.metrics
            .decode_errors(self.facts.dialect.as_str(), self.malformed);
        let tapped = self.metrics.request_taps.any();
        if tapped || self.facts.span.is_some() {
            let finished = FinishedRequest {
                model: handles.model().clone(),
                tenant: handles.tenant().clone(),
                dialect: self.facts.dialect.as_str(),
                path: self.facts.path.clone(),
                verdict,
                http_status: self.status.map(|s| s.as_u16()),
                answered_by_tokentap: self.answered_by_tokentap,
                grpc_status: self.grpc_status,
                stream: self.facts.stream.get().copied(),
                trace: self.facts.trace,
                started: SystemTime::now()
                    .checked_sub(timings.duration)
                    .unwrap_or(SystemTime::UNIX_EPOCH),
                duration: timings.duration,
                ttfb: timings.ttfb,
                ttft: timings.ttft,
                mean_itl: timings.mean_itl,
                slowest_itl: self.slowest_itl,
                slowest_gap: timings.slowest_gap,
                tpot: timings.decode.map(|d| d.tpot),
                events: timings.events,
                output_tokens: timings.output_tokens,
                input_tokens: timings.input_tokens,
                counting: timings.counting.as_str(),
                span: self.facts.span,
                trace_state: self.facts.trace_state.clone(),
                request_model: self.facts.model.get().cloned(),
                response_model: self.response_model.clone(),
                // A bucket's midpoint can lie past the largest value in it: never more
                // than the largest seen.
                itl_p50: self
                    .itl_sketch
                    .as_ref()
                    .and_then(|s| s.quantile(0.5))
                    .map(|p50| p50.min(self.slowest_itl.unwrap_or(p50))),
                gen_ai_operation: gen_ai::operation_name(self.facts.dialect, &self.facts.path),
                gen_ai_provider: gen_ai::provider_name(self.facts.dialect),
                finish_reasons: std::mem::take(&mut self.finish_reasons),
            };
            if tapped {
                self.metrics.request_taps.finished(&finished);
            }
            if self.facts.span.is_some() {
                self.metrics.spans.finished(&finished);
            }
        }

        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        tracing::info!(
            target: "tokentap::access",
            method = %self.facts.method,
            path = %self.facts.path,
            dialect = self.facts.dialect.as_str(),
            model = %handles.model(),
            tenant = %handles.tenant(),
            status = self.status.map(|s| s.as_u16()),
            grpc_status = self.grpc_status,
            status_class = verdict.status.as_str(),
            outcome = verdict.outcome.as_str(),
            stream = self.facts.stream.get().copied(),
            ttfb_ms = ms(timings.ttfb),
            ttft_ms = ms(timings.ttft),
            mean_itl_ms = ms(timings.mean_itl),
            duration_ms = timings.duration.as_secs_f64() * 1e3,
            output_tokens = timings.output_tokens,
            input_tokens = timings.input_tokens,
            events = timings.events,
            counting = timings.counting.as_str(),
            slowest_gap_ms = ms(timings.slowest_gap),
            engine_queue_ms = ms(self.engine.queue),
            engine_prefill_ms = ms(self.engine.prefill),
            engine_ttft_ms = ms(self.engine.time_to_first_token()),
            "request"
        );
    }
}

/// What [`Metrics::record_engine_timings`] records of the engine's report, with `ttft`
/// tokentap's own: the time outside the engine is `ttft` minus the engine's TTFT
/// ([`EngineTimings::time_to_first_token`]), 0 where the engine's is the longer (its
/// clock or its definition differs from tokentap's by more than the network took).
fn engine_figures(engine: &EngineTimings, ttft: Option<Duration>) -> EngineFigures {
    EngineFigures {
        queue: engine.queue,
        prefill: engine.prefill,
        ttft_outside_engine: ttft
            .zip(engine.time_to_first_token())
            .map(|(ttft, inside)| ttft.saturating_sub(inside)),
    }
}

/// What [`Metrics::record_request`] records of the clock's timings.
impl From<&Timings> for RequestFigures {
    fn from(timings: &Timings) -> RequestFigures {
        RequestFigures {
            duration: timings.duration,
            output_tokens: timings.output_tokens,
            input_tokens: timings.input_tokens,
            exact_event_tokens: timings.exact_event_tokens,
            apportioned_event_tokens: timings.apportioned_event_tokens,
            estimated_event_tokens: timings.estimated_event_tokens,
            tpot: timings.decode.map(|d| d.tpot),
            tokens_per_second: timings.decode.map(|d| d.tokens_per_second),
            exemplar: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::live::Phase;
    use crate::metrics::snapshot::{HistogramSnapshot, Values};
    use crate::wire::OutputKind;

    fn metrics() -> Arc<Metrics> {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        Metrics::new(&config.metrics.buckets, &config.labels)
    }

    fn recorder(metrics: &Arc<Metrics>, t_req: Instant) -> Recorder {
        let facts = RequestFacts::new(
            http::Method::POST,
            "/v1/chat/completions".into(),
            Dialect::OpenAiChat,
            Some("t".into()),
        );
        let _ = facts.model.set("m".into());
        let mut recorder = Recorder::new(
            metrics.clone(),
            t_req,
            Arc::new(facts),
            Duration::from_secs(5),
        );
        recorder.response_head(t_req, StatusCode::OK);
        recorder
    }

    fn output(tokens: u32, exact: bool) -> Signal {
        Signal::Output {
            tokens,
            exact,
            kind: OutputKind::Content,
        }
    }

    fn histogram(metrics: &Metrics, name: &str) -> HistogramSnapshot {
        let snapshot = metrics.snapshot();
        match &snapshot.family(name).expect("family shown").values {
            Values::Histogram(series) => series[0].value.clone(),
            _ => panic!("{name} is a histogram"),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_request_is_listed_from_its_head_only_while_the_live_view_is_on() {
        let metrics = metrics();
        let t0 = Instant::now();
        let off = recorder(&metrics, t0);
        assert!(off.live_stream().is_none());
        drop(off);
        metrics.live_streams.enable();
        let facts = RequestFacts::new(
            http::Method::POST,
            "/v1/chat/completions".into(),
            Dialect::OpenAiChat,
            Some("t".into()),
        );
        let mut on = Recorder::new(metrics.clone(), t0, Arc::new(facts), Duration::from_secs(5));
        let listed = |at| metrics.live_streams.views(at);
        let waiting = listed(t0);
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].phase, Phase::Head);
        assert_eq!(
            (waiting[0].model.as_deref(), &*waiting[0].tenant),
            (None, "t")
        );
        on.response_head(t0 + Duration::from_millis(5), StatusCode::OK);
        assert_eq!(listed(t0)[0].phase, Phase::FirstToken);
        // A request that named no model is labelled when its series are: the response's.
        on.apply(
            t0 + Duration::from_millis(9),
            &[Signal::Model("from-response".into()), output(2, true)],
        );
        let streaming = listed(t0 + Duration::from_millis(10));
        assert_eq!(streaming[0].phase, Phase::Streaming);
        assert_eq!(streaming[0].model.as_deref(), Some("from-response"));
        assert_eq!(streaming[0].tokens, 2);
        on.record(t0 + Duration::from_millis(20), Outcome::Completed);
        assert!(metrics.live_streams.is_empty());
    }

    #[test]
    fn every_gap_is_one_inter_chunk_observation_live_and_feeds_the_stall_counter() {
        let metrics = metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&metrics, t0);
        recorder.apply(t0 + ms(100), &[output(3, true)]);
        recorder.apply(t0 + ms(110), &[output(2, true), output(1, true)]);
        recorder.apply(t0 + ms(6110), &[output(4, true)]);
        // Live: the gaps are there before the request ends.
        let chunks = histogram(&metrics, "tokentap_inter_chunk_latency_seconds");
        assert_eq!(chunks.count, 3);
        assert!((chunks.sum - 6.01).abs() < 1e-9, "{}", chunks.sum);
        let pair = metrics.stream(Some("m"), Some("t"));
        assert_eq!(pair.stalls().get(), 1);
        recorder.record(t0 + ms(6120), Outcome::Completed);
        assert_eq!(
            histogram(&metrics, "tokentap_inter_chunk_latency_seconds").count,
            3
        );
    }

    #[test]
    fn exact_events_are_observed_as_tokens_per_event_and_estimates_are_not() {
        let metrics = metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&metrics, t0);
        recorder.apply(t0 + ms(100), &[output(3, true)]);
        recorder.apply(t0 + ms(110), &[output(5, false), output(0, true)]);
        recorder.apply(t0 + ms(130), &[output(1, true)]);
        // Live, one observation per exact event: 3, then 0 read as 1, then 1; the
        // estimated 5 is not the engine's shape and stays out.
        let per_event = histogram(&metrics, "tokentap_output_tokens_per_event");
        assert_eq!(per_event.count, 3);
        assert_eq!(per_event.sum, 5.0);
        let le = |bound: f64| {
            per_event
                .buckets()
                .find(|(b, _)| *b == bound)
                .map(|(_, n)| n)
        };
        assert_eq!(le(1.0), Some(2));
        assert_eq!(le(3.0), Some(3));
        recorder.record(t0 + ms(140), Outcome::Completed);
        let per_event = histogram(&metrics, "tokentap_output_tokens_per_event");
        assert_eq!(per_event.count, 3, "nothing more at the end");
    }

    #[test]
    fn estimated_gaps_are_recorded_once_at_the_end_as_n_minus_k1_tokens() {
        let metrics = metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&metrics, t0);
        recorder.apply(t0 + ms(100), &[output(1, false)]);
        recorder.apply(t0 + ms(130), &[output(1, false)]);
        recorder.apply(t0 + ms(190), &[output(1, false), output(1, false)]);
        assert_eq!(
            histogram(&metrics, "tokentap_inter_token_latency_seconds").count,
            0,
            "buffered until N is known"
        );
        recorder.apply(
            t0 + ms(195),
            &[Signal::Usage {
                input_tokens: None,
                output_tokens: Some(13),
            }],
        );
        recorder.record(t0 + ms(200), Outcome::Completed);
        let itl = histogram(&metrics, "tokentap_inter_token_latency_seconds");
        assert_eq!(itl.count, 12);
        assert!((itl.sum - 0.09).abs() < 1e-9, "{}", itl.sum);
        assert_eq!(
            histogram(&metrics, "tokentap_inter_chunk_latency_seconds").count,
            3
        );
        let text = String::from_utf8(metrics.render()).expect("UTF-8");
        assert!(text.contains(
            "tokentap_event_tokens_total{accuracy=\"apportioned\",model=\"m\",tenant=\"t\"} 13"
        ));
        assert!(!text.contains("accuracy=\"estimated\""));
    }

    /// A registered tap hears each request once, at its end, with the figures the
    /// access log has; with no tap, nothing is built.
    #[test]
    fn a_request_tap_hears_the_request_with_its_figures() {
        use crate::metrics::requests::{FinishedRequest, RequestTap};
        use std::sync::Mutex;

        #[derive(Default)]
        struct Keep(Mutex<Vec<FinishedRequest>>);
        impl RequestTap for Keep {
            fn finished(&self, request: &FinishedRequest) {
                self.0.lock().unwrap().push(request.clone());
            }
        }

        let metrics = metrics();
        let t0 = Instant::now();
        let unheard = recorder(&metrics, t0);
        unheard.record(t0 + ms(10), Outcome::Cancelled);
        let keep = Arc::new(Keep::default());
        let id = metrics.request_taps.add(keep.clone());
        let mut heard_one = recorder(&metrics, t0);
        heard_one.apply(t0 + ms(100), &[output(2, true)]);
        heard_one.apply(t0 + ms(130), &[output(3, true)]);
        heard_one.record(t0 + ms(140), Outcome::Completed);
        metrics.request_taps.remove(id);
        recorder(&metrics, t0).record(t0 + ms(5), Outcome::Completed);
        let heard = keep.0.lock().unwrap();
        assert_eq!(heard.len(), 1, "{heard:?}");
        let request = &heard[0];
        assert_eq!((&*request.model, &*request.tenant), ("m", "t"));
        assert_eq!(request.verdict.outcome, Outcome::Completed);
        assert_eq!(request.http_status, Some(200));
        assert_eq!(request.ttft, Some(ms(100)));
        assert_eq!(request.duration, ms(140));
        assert_eq!(request.output_tokens, 5);
        assert_eq!(request.events, 2);
        assert_eq!(request.slowest_itl, Some(ms(10)));
        assert_eq!(request.counting, "exact");
    }

    fn engine(queue: Option<u64>, prefill: Option<u64>, first: Option<u64>) -> Signal {
        Signal::EngineTimings(EngineTimings {
            queue: queue.map(ms),
            prefill: prefill.map(ms),
            first_token: first.map(ms),
        })
    }

    /// The engine's report is recorded once, at the end, beside tokentap's TTFT: later
    /// reports replace earlier ones part by part, and the time outside the engine is
    /// tokentap's TTFT minus the engine's.
    #[test]
    fn engine_timings_are_recorded_with_the_outcome() {
        let metrics = metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&metrics, t0);
        recorder.apply(t0 + ms(150), &[output(1, true)]);
        recorder.apply(t0 + ms(160), &[engine(Some(30), Some(90), None)]);
        recorder.apply(t0 + ms(170), &[engine(Some(40), None, None)]);
        let before = metrics.snapshot();
        let series = match before
            .family("tokentap_engine_queue_seconds")
            .map(|f| &f.values)
        {
            Some(Values::Histogram(series)) => series.len(),
            _ => 0,
        };
        assert_eq!(series, 0, "nothing before the end");
        recorder.record(t0 + ms(200), Outcome::Completed);
        let queue = histogram(&metrics, "tokentap_engine_queue_seconds");
        assert_eq!(queue.count, 1);
        assert!((queue.sum - 0.04).abs() < 1e-9, "{}", queue.sum);
        let prefill = histogram(&metrics, "tokentap_engine_prefill_seconds");
        assert!((prefill.sum - 0.09).abs() < 1e-9, "{}", prefill.sum);
        let outside = histogram(
            &metrics,
            "tokentap_time_to_first_token_outside_engine_seconds",
        );
        assert_eq!(outside.count, 1);
        assert!(
            (outside.sum - 0.02).abs() < 1e-9,
            "150 - (40 + 90) ms: {}",
            outside.sum
        );
    }

    #[test]
    fn the_time_outside_the_engine_follows_the_rule() {
        let t = |queue: Option<u64>, prefill: Option<u64>, first: Option<u64>| EngineTimings {
            queue: queue.map(ms),
            prefill: prefill.map(ms),
            first_token: first.map(ms),
        };
        let outside = |engine: EngineTimings, ttft: Option<u64>| {
            engine_figures(&engine, ttft.map(ms)).ttft_outside_engine
        };
        // The reported first token wins over queue + prefill.
        assert_eq!(
            outside(t(Some(10), Some(20), Some(100)), Some(130)),
            Some(ms(30))
        );
        assert_eq!(
            outside(t(Some(10), Some(20), None), Some(130)),
            Some(ms(100))
        );
        // A prefill alone is no engine TTFT; no TTFT (not streamed) gives nothing.
        assert_eq!(outside(t(None, Some(20), None), Some(130)), None);
        assert_eq!(outside(t(Some(10), Some(20), None), None), None);
        // The engine's longer than tokentap's: 0, not a negative figure.
        assert_eq!(
            outside(t(None, None, Some(200)), Some(130)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn an_unreadable_grpc_status_is_unknown_and_the_first_one_stands() {
        let metrics = metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&metrics, t0);
        recorder.grpc_status(b" x ");
        recorder.grpc_status(b"0");
        assert_eq!(recorder.grpc_status, Some(verdict::GRPC_UNKNOWN));
        let mut recorder = self::recorder(&metrics, t0);
        recorder.grpc_status(b" 14 ");
        assert_eq!(recorder.grpc_status, Some(14));
    }
}
