//! What a simulator is configured with (its models, usage reporting, injected faults)
//! and the wall clock its stamps carry: a leaf that the request handling, the rendering
//! and the stream schedule all build on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
}

impl ModelProfile {
    pub fn new(name: &str, ttft: Duration, itl: Duration, tokens: u32) -> ModelProfile {
        ModelProfile {
            name: name.to_string(),
            ttft,
            itl,
            jitter: 0.0,
            tokens,
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
    /// object, Anthropic `error` event, Responses `response.failed`, ...), then end.
    ErrorAfter(u32),
    /// End the stream cleanly after N tokens, without finish chunk, usage or `[DONE]`.
    EndAfter(u32),
    /// Answer with this status and an OpenAI-style error body.
    Status(u16),
}

impl Fault {
    pub(super) fn parse(value: &str) -> Option<Fault> {
        let (name, n) = value.split_once('=')?;
        let n: u32 = n.trim().parse().ok()?;
        match name.trim() {
            "reset-after" => Some(Fault::ResetAfter(n)),
            "stall-after" => Some(Fault::StallAfter(n)),
            "error-after" => Some(Fault::ErrorAfter(n)),
            "end-after" => Some(Fault::EndAfter(n)),
            "status" => u16::try_from(n).ok().map(Fault::Status),
            _ => None,
        }
    }
}

/// Wall-clock nanoseconds since the Unix epoch, as the stamps carry them (the benchmark
/// reads its arrival times with the same clock).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
