//! [`RequestSummary`]: what one measured request came to, as its sinks read it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::facts::RequestFacts;
use super::objectives::{Measures, Objectives};
use crate::metrics::exemplar::TraceContext;
use crate::observe::rate_limits::RateLimits;
use crate::outcome::Verdict;
use crate::wire::{gen_ai, Dialect, EngineTimings, TokenDetails};

/// What one measured request came to: who it was, its verdict, its timings and token
/// counts, and what the upstream reported of itself.
#[derive(Clone, Debug)]
pub struct RequestSummary {
    /// Who the request was: its head, and what its body said.
    pub facts: Arc<RequestFacts>,
    /// The `model` and `tenant` label values the request was counted under.
    pub model: Arc<str>,
    pub tenant: Arc<str>,
    /// The model the response named, when it named one.
    pub response_model: Option<String>,
    pub verdict: Verdict,
    /// The HTTP status the client was told, and whether tokentap (not the upstream) said it.
    pub http_status: Option<u16>,
    pub answered_by_tokentap: bool,
    /// A gRPC response's `grpc-status`.
    pub grpc_status: Option<u32>,
    /// Wall-clock time the request head was received (`t_req`).
    pub started: SystemTime,
    /// From `t_req` to the end.
    pub duration: Duration,
    pub ttfb: Option<Duration>,
    pub ttft: Option<Duration>,
    /// Token-weighted mean ITL.
    pub mean_itl: Option<Duration>,
    /// The largest per-token ITL observed.
    pub slowest_itl: Option<Duration>,
    /// The median per-token ITL of this request (within the sketch's error bound, see
    /// `observe::itl_sketch`); kept only for a request with a span.
    pub itl_p50: Option<Duration>,
    /// The longest gap between consecutive token-bearing events.
    pub slowest_gap: Option<Duration>,
    /// Time per output token after the first, and output tokens per second over the same
    /// span, for a request with at least two tokens over a measurable time.
    pub tpot: Option<Duration>,
    pub tokens_per_second: Option<f64>,
    /// Its token-bearing events reached tokentap in one burst (`observe::burst`): a
    /// buffering hop between tokentap and the engine. Its gaps, ITL, TPOT and tokens per
    /// second were not observed (here `None`: the mean ITL, the slowest gap, TPOT and
    /// tokens per second); its TTFT is the client's wait for the whole answer.
    pub buffered: bool,
    /// Token-bearing events.
    pub events: u64,
    pub output_tokens: u64,
    pub input_tokens: Option<u64>,
    /// The parts of the reported usage that are cached input and reasoning output (each a
    /// part of `input_tokens` or `output_tokens`, never added to them), as reported.
    pub token_details: TokenDetails,
    /// How the per-event counts were known (`exact`, `apportioned`, ...), and how many
    /// tokens each way.
    pub counting: &'static str,
    pub exact_event_tokens: u64,
    pub apportioned_event_tokens: u64,
    pub estimated_event_tokens: u64,
    /// The finish reasons the stream reported (`stop`, `length`, `end_turn`, ...), in
    /// the order first seen, each once.
    pub finish_reasons: Vec<String>,
    /// What the engine reported of its own time.
    pub engine: EngineTimings,
    /// The rate limits the response head reported.
    pub rate_limits: Option<Box<RateLimits>>,
    /// Events of the response the dialect's decoder could not read.
    pub malformed: u64,
    /// The objectives in force when the request began (`objectives`), which it is judged
    /// against; `None` when none is configured.
    pub objectives: Option<Objectives>,
}

impl RequestSummary {
    /// A request that ended before anything of it was measured (tokentap answered it
    /// at once, now): who it was and its verdict, every figure empty. The caller sets
    /// what else it knows.
    pub fn unmeasured(
        facts: Arc<RequestFacts>,
        model: Arc<str>,
        tenant: Arc<str>,
        verdict: Verdict,
    ) -> RequestSummary {
        RequestSummary {
            facts,
            model,
            tenant,
            response_model: None,
            verdict,
            http_status: None,
            answered_by_tokentap: false,
            grpc_status: None,
            started: SystemTime::now(),
            duration: Duration::ZERO,
            ttfb: None,
            ttft: None,
            mean_itl: None,
            slowest_itl: None,
            itl_p50: None,
            slowest_gap: None,
            tpot: None,
            tokens_per_second: None,
            buffered: false,
            events: 0,
            output_tokens: 0,
            input_tokens: None,
            token_details: TokenDetails::default(),
            counting: "none",
            exact_event_tokens: 0,
            apportioned_event_tokens: 0,
            estimated_event_tokens: 0,
            finish_reasons: Vec::new(),
            engine: EngineTimings::default(),
            rate_limits: None,
            malformed: 0,
            objectives: None,
        }
    }

    /// What an objective judges of it.
    pub fn measures(&self) -> Measures {
        Measures {
            duration: self.duration,
            ttft: self.ttft,
            tpot: self.tpot,
            slowest_gap: self.slowest_gap,
        }
    }

    /// Each objective in force that judges this request, by name: met or missed.
    pub fn judged(&self) -> impl Iterator<Item = (&str, bool)> + '_ {
        let measures = self.measures();
        self.objectives
            .iter()
            .flat_map(|o| o.iter())
            .filter_map(move |o| {
                o.judge(&self.model, &self.tenant, self.verdict.outcome, &measures)
                    .map(|met| (o.name.as_str(), met))
            })
    }

    pub fn dialect(&self) -> Dialect {
        self.facts.dialect
    }

    /// The model the request body named, as written (not folded into a label value);
    /// `None` when it named none or one too long to read.
    pub fn request_model(&self) -> Option<&str> {
        self.facts.model.get().map(String::as_str)
    }

    /// What the request body said of `stream`.
    pub fn stream(&self) -> Option<bool> {
        self.facts.stream.get().copied()
    }

    /// `gen_ai.operation.name` of the request's dialect and path (`wire::gen_ai`).
    pub fn gen_ai_operation(&self) -> &'static str {
        gen_ai::operation_name(self.facts.dialect, &self.facts.path)
    }

    /// `gen_ai.provider.name` of the request's dialect.
    pub fn gen_ai_provider(&self) -> &'static str {
        gen_ai::provider_name(self.facts.dialect)
    }

    /// The request's valid W3C trace context, when it carried one and it was read.
    pub fn trace(&self) -> Option<TraceContext> {
        self.facts.trace
    }

    /// tokentap's own span for this request: set only when per-request spans are on and
    /// the request was sampled. Its parent is [`trace`](Self::trace) when it had one.
    pub fn span(&self) -> Option<TraceContext> {
        self.facts.span
    }
}

/// A completed streamed chat request to model `model` for tenant `t`, for the sinks'
/// tests.
#[cfg(test)]
pub(crate) fn example(model: &str) -> RequestSummary {
    use crate::outcome::{Outcome, StatusClass};
    let facts = RequestFacts::new(
        http::Method::POST,
        "/v1/chat/completions".into(),
        Dialect::OpenAiChat,
        Some("t".into()),
    );
    let _ = facts.stream.set(true);
    let mut request = RequestSummary::unmeasured(
        Arc::new(facts),
        Arc::from(model),
        Arc::from("t"),
        Verdict::new(Outcome::Completed, StatusClass::Success),
    );
    request.http_status = Some(200);
    request.started = SystemTime::UNIX_EPOCH;
    request.duration = Duration::from_millis(10);
    request
}
