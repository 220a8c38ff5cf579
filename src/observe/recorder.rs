//! `Recorder`: one request's measurement state, from request head to outcome.
//!
//! It owns the `TokenClock`, resolves the request's metric handles once (lazily, so a
//! model named only by the response can still label it), observes per-event figures as
//! they happen, and records the per-request figures and the outcome exactly once, in
//! [`Recorder::record`], which consumes it. The observers in [`super`] guarantee `record`
//! is called on every exit, including a drop.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use prometheus::IntGauge;

use super::burst::{Burst, Gap};
use super::itl_sketch::ItlSketch;
use super::rate_limits::RateLimits;
use crate::clock::{ItlShare, Stamp, TokenClock};
use crate::metrics::in_flight::{LiveEntry, LiveStream};
use crate::metrics::{Metrics, StreamSeries};
use crate::outcome::{verdict, Outcome, StatusClass};
use crate::summary::objectives::Objectives;
use crate::summary::{RequestFacts, RequestSummary, Sinks};
use crate::wire::{gen_ai, Dialect, EngineTimings, ErrorClass, Signal};

/// The most distinct finish reasons kept for one request.
const MAX_FINISH_REASONS: usize = 8;

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
    sinks: Arc<Sinks>,
    /// What each token-bearing event reads and writes, kept apart from the rest.
    per_event: PerEvent,
    facts: Arc<RequestFacts>,
    response_model: Option<String>,
    /// The status the client was told, and whether tokentap (not the upstream) said it.
    status: Option<StatusCode>,
    answered_by_tokentap: bool,
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
    /// The finish reasons the stream named, each once.
    finish_reasons: Vec<String>,
    /// What the engine reported of its own time, recorded with the outcome.
    engine: EngineTimings,
    /// The objectives in force when the request began, judged at its end.
    objectives: Option<Objectives>,
    in_flight: InFlight,
}

/// The part of a [`Recorder`] that [`Recorder::apply`] reads and writes for each
/// token-bearing event, in one place: with a thousand streams a stream's state is out of
/// the caches when its next event comes, so an event's work waits on each cache line it
/// touches. Together they are a few contiguous lines, which the relay lists for the poll
/// that brings the next event ([`Recorder::hot_lines`]); the rest of the recorder is read
/// once per request.
struct PerEvent {
    clock: TokenClock,
    handles: Option<StreamSeries>,
    stall_threshold: Duration,
    /// The largest per-token value observed into ITL so far: the ITL exemplar's value.
    slowest_itl: Option<Duration>,
    /// Every per-token ITL value, sketched for the median: kept only for a request that
    /// gets a span.
    itl_sketch: Option<ItlSketch>,
    /// Whether the response arrives in one burst, and its first gaps while that is open.
    burst: Burst,
    /// The request's entry in the live view's list of requests in flight, from its head
    /// to its record, while the live view is on.
    live: Option<LiveEntry>,
}

impl Recorder {
    pub fn new(
        sinks: Arc<Sinks>,
        t_req: Instant,
        facts: Arc<RequestFacts>,
        stall_threshold: Duration,
        objectives: Option<Objectives>,
    ) -> Recorder {
        let metrics = sinks.metrics();
        let in_flight = InFlight::enter(&metrics.streams_in_flight);
        let itl_sketch = facts.span.map(|_| ItlSketch::default());
        let live = if sinks.in_flight.is_enabled() {
            let tenant = metrics.tenant_label(facts.tenant.as_deref());
            sinks.in_flight.register(None, tenant, t_req)
        } else {
            None
        };
        Recorder {
            sinks,
            per_event: PerEvent {
                clock: TokenClock::new(t_req),
                handles: None,
                stall_threshold,
                slowest_itl: None,
                itl_sketch,
                burst: Burst::default(),
                live,
            },
            facts,
            response_model: None,
            status: None,
            answered_by_tokentap: false,
            stream_error: None,
            end_marker: false,
            malformed: 0,
            grpc_status: None,
            whole_body: false,
            rate_limits: None,
            finish_reasons: Vec::new(),
            engine: EngineTimings::default(),
            objectives,
            in_flight,
        }
    }

    /// The metrics this request is recorded in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.sinks.metrics()
    }

    /// The request's API dialect.
    pub fn dialect(&self) -> Dialect {
        self.facts.dialect
    }

    /// The upstream response head arrived at `at`.
    pub fn response_head(&mut self, at: Instant, status: StatusCode) {
        self.per_event.clock.response_head(at);
        self.status = Some(status);
        if let Some(entry) = &self.per_event.live {
            entry.stream().response_head(at);
        }
    }

    /// The request's entry in the live view's list, while the live view is on: the
    /// request scan names its model there as soon as the body says it.
    pub fn live_stream(&self) -> Option<&Arc<LiveStream>> {
        self.per_event.live.as_ref().map(LiveEntry::stream)
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
                    let content_pending = !self.per_event.clock.has_content();
                    let stamp = self.per_event.clock.output(at, *tokens, *exact, *kind);
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
                    if let Some(entry) = &self.per_event.live {
                        entry.stream().event(at, u64::from((*tokens).max(1)), gap);
                    }
                    match stamp {
                        Stamp::First { ttft } => self.handles().first_token(ttft),
                        Stamp::Next { gap, itl } => self.gap(Gap { gap, itl }),
                    }
                    if content_pending {
                        if let Some(ttft_content) = self.per_event.clock.ttft_content() {
                            self.handles()
                                .ttft_content()
                                .observe(ttft_content.as_secs_f64());
                        }
                    }
                }
                Signal::Usage {
                    input_tokens,
                    output_tokens,
                } => self.per_event.clock.usage(*input_tokens, *output_tokens),
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
                Signal::TrailingTokens(tokens) => self.per_event.clock.trailing_tokens(*tokens),
                Signal::EngineTimings(timings) => self.engine.merge(*timings),
                Signal::TokenDetails(details) => self.per_event.clock.token_details(**details),
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

    /// The gap before a token-bearing event, through the burst detector: observed now,
    /// held until the stream shows it streams, or (buffered) never.
    fn gap(&mut self, gap: Gap) {
        self.handles();
        let PerEvent {
            handles: Some(handles),
            slowest_itl,
            itl_sketch,
            stall_threshold,
            burst,
            ..
        } = &mut self.per_event
        else {
            return;
        };
        burst.see(gap, |gap| {
            observe_gap(handles, slowest_itl, itl_sketch, *stall_threshold, gap);
        });
    }

    /// Add the memory [`apply`](Self::apply) touches per token-bearing event: its
    /// [`PerEvent`] state, the live entry's counters (an allocation of their own) and the
    /// clock's next buffered slot.
    pub fn hot_lines(&self, lines: &mut crate::prefetch::Lines) {
        let per_event = &self.per_event;
        lines.value(per_event);
        if let Some(live) = &per_event.live {
            lines.value(&**live.stream());
        }
        per_event.clock.hot_lines(lines);
    }

    /// The request's metric handles, resolved on first use.
    fn handles(&mut self) -> &StreamSeries {
        match self.per_event.handles {
            Some(ref handles) => handles,
            None => {
                let handles = self.resolve_handles();
                self.per_event.handles.insert(handles)
            }
        }
    }

    /// Resolve the request's metric handles (its labels, once).
    fn resolve_handles(&mut self) -> StreamSeries {
        // Each label is resolved once: the live entry's, where there is one, were
        // resolved at registration and (the model) by the request scan.
        let (model, tenant) = match &self.per_event.live {
            Some(entry) => (
                entry.stream().model_or_init(|| self.model_label()).clone(),
                entry.stream().tenant.clone(),
            ),
            None => (
                self.model_label(),
                self.sinks
                    .metrics()
                    .tenant_label(self.facts.tenant.as_deref()),
            ),
        };
        let metrics = self.sinks.metrics();
        let mut handles = metrics.stream_of(model, tenant);
        let dialect = self.facts.dialect;
        metrics.attach_gen_ai(
            &mut handles,
            gen_ai::operation_name(dialect, &self.facts.path),
            gen_ai::provider_name(dialect),
            self.facts.stream.get() != Some(&false),
        );
        if let Some(ttfb) = self.per_event.clock.ttfb() {
            handles.ttfb().observe(ttfb.as_secs_f64());
        }
        handles
    }

    /// The `model` label: the request's model, even one too long to read, wins over the
    /// response's, as a readable one does; then the model the engine said it serves.
    fn model_label(&self) -> Arc<str> {
        let request_model = self.facts.model.get().map(String::as_str);
        if request_model.is_none() && self.facts.model_too_long.get().is_some() {
            return self.sinks.metrics().model_label_too_long();
        }
        let model = request_model
            .or(self.response_model.as_deref())
            .or(self.facts.served_model.as_deref());
        self.sinks.metrics().model_label(model)
    }

    /// Whether the stream's own end marker arrived: a client that leaves after it has
    /// received the whole answer, even if the connection's final framing was not yet
    /// delivered.
    pub fn saw_end_marker(&self) -> bool {
        self.end_marker
    }

    /// Record the request's verdict and per-request figures, the transport having seen it
    /// end as `end`: its summary goes to every sink. Consumes the recorder: once only.
    pub fn record(mut self, at: Instant, end: Outcome) {
        let status = match self.status {
            None => StatusClass::None,
            Some(status) if self.answered_by_tokentap => StatusClass::tokentap(status),
            Some(status) => StatusClass::upstream(status),
        };
        let grpc_code = verdict::grpc_code(self.facts.dialect, self.whole_body, self.grpc_status);
        let verdict = verdict::verdict(end, status, self.stream_error, grpc_code);
        let timings = self.per_event.clock.timings(at);
        let handles = match self.per_event.handles.take() {
            Some(handles) => handles,
            None => self.resolve_handles(),
        };
        let PerEvent {
            slowest_itl,
            itl_sketch,
            stall_threshold,
            burst,
            ..
        } = &mut self.per_event;
        let buffered = burst.end(|gap| {
            observe_gap(&handles, slowest_itl, itl_sketch, *stall_threshold, gap);
        });
        // A buffered response's gaps are the hop's, not the engine's: none is observed.
        let deferred = if buffered {
            &[][..]
        } else {
            &timings.deferred_itl[..]
        };
        for share in deferred {
            observe_itl(&handles, slowest_itl, itl_sketch, *share);
        }
        let decode = timings.decode.filter(|_| !buffered);
        // The stream leaves `tokentap_streams_in_flight` before it is counted, so a scrape
        // that sees the request counted never sees it in flight too.
        drop(self.in_flight);
        drop(self.per_event.live.take());
        let summary = RequestSummary {
            facts: self.facts,
            model: handles.model().clone(),
            tenant: handles.tenant().clone(),
            response_model: self.response_model,
            verdict,
            http_status: self.status.map(|s| s.as_u16()),
            answered_by_tokentap: self.answered_by_tokentap,
            grpc_status: self.grpc_status,
            started: SystemTime::now()
                .checked_sub(timings.duration)
                .unwrap_or(SystemTime::UNIX_EPOCH),
            duration: timings.duration,
            ttfb: timings.ttfb,
            ttft: timings.ttft,
            mean_itl: timings.mean_itl.filter(|_| !buffered),
            slowest_itl: self.per_event.slowest_itl,
            // A bucket's midpoint can lie past the largest value in it: never more than
            // the largest seen.
            itl_p50: self
                .per_event
                .itl_sketch
                .as_ref()
                .and_then(|s| s.quantile(0.5))
                .map(|p50| p50.min(self.per_event.slowest_itl.unwrap_or(p50))),
            slowest_gap: timings.slowest_gap.filter(|_| !buffered),
            tpot: decode.map(|d| d.tpot),
            tokens_per_second: decode.map(|d| d.tokens_per_second),
            buffered,
            events: timings.events,
            output_tokens: timings.output_tokens,
            input_tokens: timings.input_tokens,
            token_details: timings.details,
            counting: timings.counting.as_str(),
            exact_event_tokens: timings.exact_event_tokens,
            apportioned_event_tokens: timings.apportioned_event_tokens,
            estimated_event_tokens: timings.estimated_event_tokens,
            finish_reasons: self.finish_reasons,
            engine: self.engine,
            rate_limits: self.rate_limits,
            malformed: self.malformed,
            objectives: self.objectives,
        };
        self.sinks.finished(summary, &handles);
    }
}

/// Observe one gap before a token-bearing event: its ITL share (and the request's slowest
/// and sketch), its inter-chunk gap, and a stall when it is one.
fn observe_gap(
    handles: &StreamSeries,
    slowest: &mut Option<Duration>,
    sketch: &mut Option<ItlSketch>,
    stall_threshold: Duration,
    gap: Gap,
) {
    if let Some(share) = gap.itl {
        observe_itl(handles, slowest, sketch, share);
    }
    handles.chunk_gap(gap.gap);
    if gap.gap >= stall_threshold {
        handles.stalls().inc();
    }
}

/// Observe an ITL share, and keep the request's slowest and its sketch.
fn observe_itl(
    handles: &StreamSeries,
    slowest: &mut Option<Duration>,
    sketch: &mut Option<ItlSketch>,
    share: ItlShare,
) {
    if share.count > 0 {
        *slowest = (*slowest).max(Some(share.per_token));
    }
    if let Some(sketch) = sketch {
        sketch.add(share.per_token, share.count);
    }
    handles.observe_itl(share.per_token, share.count);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::in_flight::Phase;
    use crate::metrics::snapshot::{HistogramSnapshot, Values};
    use crate::wire::OutputKind;

    fn sinks() -> Arc<Sinks> {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        Sinks::new(Metrics::new(&config.metrics.buckets, &config.labels))
    }

    fn recorder(sinks: &Arc<Sinks>, t_req: Instant) -> Recorder {
        let facts = RequestFacts::new(
            http::Method::POST,
            "/v1/chat/completions".into(),
            Dialect::OpenAiChat,
            Some("t".into()),
        );
        let _ = facts.model.set("m".into());
        let mut recorder = Recorder::new(
            sinks.clone(),
            t_req,
            Arc::new(facts),
            Duration::from_secs(5),
            None,
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
        let sinks = sinks();
        let t0 = Instant::now();
        let off = recorder(&sinks, t0);
        assert!(off.live_stream().is_none());
        drop(off);
        sinks.in_flight.enable();
        let facts = RequestFacts::new(
            http::Method::POST,
            "/v1/chat/completions".into(),
            Dialect::OpenAiChat,
            Some("t".into()),
        );
        let mut on = Recorder::new(
            sinks.clone(),
            t0,
            Arc::new(facts),
            Duration::from_secs(5),
            None,
        );
        let listed = |at| sinks.in_flight.views(at);
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
        assert!(sinks.in_flight.is_empty());
    }

    #[test]
    fn every_gap_is_one_inter_chunk_observation_live_and_feeds_the_stall_counter() {
        let sinks = sinks();
        let metrics = sinks.metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&sinks, t0);
        recorder.apply(t0 + ms(100), &[output(3, true)]);
        recorder.apply(t0 + ms(110), &[output(2, true), output(1, true)]);
        recorder.apply(t0 + ms(6110), &[output(4, true)]);
        // Live: the gaps are there before the request ends.
        let chunks = histogram(metrics, "tokentap_inter_chunk_latency_seconds");
        assert_eq!(chunks.count, 3);
        assert!((chunks.sum - 6.01).abs() < 1e-9, "{}", chunks.sum);
        let pair = metrics.stream(Some("m"), Some("t"));
        assert_eq!(pair.stalls().get(), 1);
        recorder.record(t0 + ms(6120), Outcome::Completed);
        assert_eq!(
            histogram(metrics, "tokentap_inter_chunk_latency_seconds").count,
            3
        );
    }

    #[test]
    fn exact_events_are_observed_as_tokens_per_event_and_estimates_are_not() {
        let sinks = sinks();
        let metrics = sinks.metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&sinks, t0);
        recorder.apply(t0 + ms(100), &[output(3, true)]);
        recorder.apply(t0 + ms(110), &[output(5, false), output(0, true)]);
        recorder.apply(t0 + ms(130), &[output(1, true)]);
        // Live, one observation per exact event: 3, then 0 read as 1, then 1; the
        // estimated 5 is not the engine's shape and stays out.
        let per_event = histogram(metrics, "tokentap_output_tokens_per_event");
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
        let per_event = histogram(metrics, "tokentap_output_tokens_per_event");
        assert_eq!(per_event.count, 3, "nothing more at the end");
    }

    #[test]
    fn estimated_gaps_are_recorded_once_at_the_end_as_n_minus_k1_tokens() {
        let sinks = sinks();
        let metrics = sinks.metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&sinks, t0);
        recorder.apply(t0 + ms(100), &[output(1, false)]);
        recorder.apply(t0 + ms(130), &[output(1, false)]);
        recorder.apply(t0 + ms(190), &[output(1, false), output(1, false)]);
        assert_eq!(
            histogram(metrics, "tokentap_inter_token_latency_seconds").count,
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
        let itl = histogram(metrics, "tokentap_inter_token_latency_seconds");
        assert_eq!(itl.count, 12);
        assert!((itl.sum - 0.09).abs() < 1e-9, "{}", itl.sum);
        assert_eq!(
            histogram(metrics, "tokentap_inter_chunk_latency_seconds").count,
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
        use crate::summary::Sink;
        use std::sync::Mutex;

        #[derive(Default)]
        struct Keep(Mutex<Vec<RequestSummary>>);
        impl Sink for Keep {
            fn finished(&self, request: &RequestSummary) {
                self.0.lock().unwrap().push(request.clone());
            }
        }

        let sinks = sinks();
        let t0 = Instant::now();
        let unheard = recorder(&sinks, t0);
        unheard.record(t0 + ms(10), Outcome::Cancelled);
        let keep = Arc::new(Keep::default());
        let id = sinks.taps().add(keep.clone());
        let mut heard_one = recorder(&sinks, t0);
        heard_one.apply(t0 + ms(100), &[output(2, true)]);
        heard_one.apply(t0 + ms(130), &[output(3, true)]);
        heard_one.record(t0 + ms(140), Outcome::Completed);
        sinks.taps().remove(id);
        recorder(&sinks, t0).record(t0 + ms(5), Outcome::Completed);
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
        let sinks = sinks();
        let metrics = sinks.metrics();
        let t0 = Instant::now();
        let mut recorder = recorder(&sinks, t0);
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
        let queue = histogram(metrics, "tokentap_engine_queue_seconds");
        assert_eq!(queue.count, 1);
        assert!((queue.sum - 0.04).abs() < 1e-9, "{}", queue.sum);
        let prefill = histogram(metrics, "tokentap_engine_prefill_seconds");
        assert!((prefill.sum - 0.09).abs() < 1e-9, "{}", prefill.sum);
        let outside = histogram(
            metrics,
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
    fn an_unreadable_grpc_status_is_unknown_and_the_first_one_stands() {
        let sinks = sinks();
        let t0 = Instant::now();
        let mut recorder = recorder(&sinks, t0);
        recorder.grpc_status(b" x ");
        recorder.grpc_status(b"0");
        assert_eq!(recorder.grpc_status, Some(verdict::GRPC_UNKNOWN));
        let mut recorder = self::recorder(&sinks, t0);
        recorder.grpc_status(b" 14 ");
        assert_eq!(recorder.grpc_status, Some(14));
    }
}
