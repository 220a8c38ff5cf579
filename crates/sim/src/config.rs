//! What a simulator is configured with (its models, usage reporting, rate limit,
//! injected faults) and the wall clock its stamps carry: a leaf that the request
//! handling, the rendering and the stream schedule all build on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::SmallRng;
use rand::Rng;

/// Timing and length of one simulated model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProfile {
    pub name: String,
    /// Time from request to the first token.
    pub ttft: Duration,
    /// Time between tokens.
    pub itl: Duration,
    /// Uniform jitter as a fraction of TTFT and of each gap (0 = exact timing).
    pub jitter: f64,
    /// Output tokens per response (a request's `max_tokens` caps it).
    pub tokens: u32,
    /// Tokens each streamed event carries (the stream's usage still reports the true N).
    /// An event of `k` tokens comes `k` inter-token latencies after the previous one, so
    /// the per-token latency stays [`ModelProfile::itl`] and the gap between events grows.
    pub tokens_per_event: TokensPerEvent,
    /// How long a stream waits after its last token before its finish, usage and end
    /// (0: none). Keeps many finished-but-open streams around, their usage not yet sent.
    pub hold_before_end: Duration,
}

impl ModelProfile {
    pub fn new(name: &str, ttft: Duration, itl: Duration, tokens: u32) -> ModelProfile {
        ModelProfile {
            name: name.to_string(),
            ttft,
            itl,
            jitter: 0.0,
            tokens,
            tokens_per_event: TokensPerEvent::ONE,
            hold_before_end: Duration::ZERO,
        }
    }
}

/// How many tokens one streamed event carries: a fixed number, or drawn uniformly from
/// `min..=max` per event (the last event of a response carries what is left).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokensPerEvent {
    min: u32,
    max: u32,
}

impl TokensPerEvent {
    /// One token per event: every dialect's usual shape, and the default.
    pub const ONE: TokensPerEvent = TokensPerEvent { min: 1, max: 1 };

    /// `min..=max` tokens per event; `None` unless `1 <= min <= max`.
    pub const fn range(min: u32, max: u32) -> Option<TokensPerEvent> {
        if min >= 1 && min <= max {
            Some(TokensPerEvent { min, max })
        } else {
            None
        }
    }

    /// The size of the next event, at most `left` tokens (and at least 1).
    pub(super) fn draw(self, rng: &mut SmallRng, left: u32) -> u32 {
        let k = if self.min == self.max {
            self.min
        } else {
            rng.gen_range(self.min..=self.max)
        };
        k.min(left).max(1)
    }
}

impl std::str::FromStr for TokensPerEvent {
    type Err = String;
    /// `N` or `MIN-MAX`, e.g. `3` or `1-5`.
    fn from_str(s: &str) -> Result<Self, String> {
        let number = |v: &str| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{s}` is not N or MIN-MAX (e.g. 3 or 1-5)"))
        };
        let (min, max) = match s.split_once('-') {
            Some((min, max)) => (number(min)?, number(max)?),
            None => {
                let n = number(s)?;
                (n, n)
            }
        };
        TokensPerEvent::range(min, max)
            .ok_or_else(|| format!("`{s}`: tokens per event need 1 <= MIN <= MAX"))
    }
}

impl std::fmt::Display for TokensPerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// When the simulator reports token usage in a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageMode {
    /// Only when the request sets `stream_options.include_usage` (OpenAI's behaviour).
    Requested,
    /// A final usage chunk on every stream.
    Always,
    /// Never.
    Never,
    /// Cumulative usage on every chunk (vLLM's `continuous_usage_stats`).
    Continuous,
}

impl std::str::FromStr for UsageMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "requested" => Ok(UsageMode::Requested),
            "always" => Ok(UsageMode::Always),
            "never" => Ok(UsageMode::Never),
            "continuous" => Ok(UsageMode::Continuous),
            other => Err(format!(
                "`{other}` is not one of requested, always, never, continuous"
            )),
        }
    }
}

/// The simulator's settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub models: Vec<ModelProfile>,
    pub usage: UsageMode,
    /// Send a role-only chunk right after the head, before the first token (as vLLM does).
    pub role_chunk: bool,
    /// Embed the wall-clock send time (`"sim_sent_unix_ns"`) and the request's arrival
    /// time (`"sim_received_unix_ns"`) in every chunk: the benchmark's per-event latency,
    /// and the backend's own TTFT for fidelity comparisons.
    pub stamp: bool,
    pub seed: u64,
    /// Report this Unix time (seconds) as every response's creation time, and derive
    /// response ids from the request body instead of a counter, so that two identical
    /// requests get byte-identical responses (tests compare proxied and direct bytes).
    pub fixed_clock: Option<u64>,
    /// Compress responses with `zstd` or `gzip` when the request's `Accept-Encoding`
    /// allows (the first of the two it lists), flushing after every event.
    pub compress: bool,
    /// Limit requests and output tokens per minute, as hosted APIs do (`None`: no limit,
    /// and no rate-limit headers).
    pub rate_limit: Option<RateLimit>,
}

/// A hosted API's rate limit: one budget of requests and one of output tokens per
/// minute, shared by all the simulator's models (as one API key's limit would be), each
/// a token bucket that holds a minute's worth and refills continuously.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub requests_per_minute: u32,
    /// Output tokens per minute: a request costs the output tokens its response will
    /// have (the profile's, capped by the request's own limit).
    pub tokens_per_minute: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            models: vec![ModelProfile::new(
                "sim-model",
                Duration::from_millis(150),
                Duration::from_millis(20),
                40,
            )],
            usage: UsageMode::Requested,
            role_chunk: true,
            stamp: false,
            seed: 1,
            fixed_clock: None,
            compress: false,
            rate_limit: None,
        }
    }
}

/// A fault a request asks for with `x-sim-fault: NAME[=N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Reset the connection after N tokens.
    ResetAfter(u32),
    /// Stop sending (but keep the connection open) after N tokens.
    StallAfter(u32),
    /// Report an error mid-stream after N tokens, as the dialect does (an OpenAI error
    /// object, Anthropic `error` event, Responses `response.failed`, ...), naming what
    /// the [`StreamError`] says, then end.
    ErrorAfter(u32, StreamError),
    /// End the stream cleanly after N tokens, without finish chunk, usage or `[DONE]`.
    EndAfter(u32),
    /// Answer with this status and an OpenAI-style error body.
    Status(u16),
}

impl Fault {
    /// The token count the fault strikes at (no event of the stream straddles it).
    pub(super) const fn after_tokens(self) -> Option<u32> {
        match self {
            Fault::ResetAfter(n)
            | Fault::StallAfter(n)
            | Fault::ErrorAfter(n, _)
            | Fault::EndAfter(n) => Some(n),
            Fault::Status(_) => None,
        }
    }

    /// The names [`Fault::parse`] reads, as `x-sim-fault` values.
    pub(super) const FORMS: &'static str = "reset-after=N, stall-after=N, error-after=N, \
        rate-limit-error-after=N, overloaded-error-after=N, end-after=N or status=CODE";

    pub(super) fn parse(value: &str) -> Option<Fault> {
        let (name, n) = value.split_once('=')?;
        let n: u32 = n.trim().parse().ok()?;
        match name.trim() {
            "reset-after" => Some(Fault::ResetAfter(n)),
            "stall-after" => Some(Fault::StallAfter(n)),
            "error-after" => Some(Fault::ErrorAfter(n, StreamError::Failure)),
            "rate-limit-error-after" => Some(Fault::ErrorAfter(n, StreamError::RateLimit)),
            "overloaded-error-after" => Some(Fault::ErrorAfter(n, StreamError::Overload)),
            "end-after" => Some(Fault::EndAfter(n)),
            "status" => u16::try_from(n).ok().map(Fault::Status),
            _ => None,
        }
    }
}

/// What a mid-stream error report ([`Fault::ErrorAfter`]) names as its cause, each in
/// the dialect's own shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// An engine failure (`x-sim-fault: error-after=N`): a server error naming no cause.
    Failure,
    /// A rate limit (`rate-limit-error-after=N`).
    RateLimit,
    /// An overload (`overloaded-error-after=N`).
    Overload,
}

/// Wall-clock nanoseconds since the Unix epoch, as the stamps carry them (the benchmark
/// reads its arrival times with the same clock).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
