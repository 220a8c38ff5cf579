//! Wire formats: turn the observer's copy of a response body into [`Signal`]s.
//!
//! Everything here is sans-IO and clock-free: a [`Decoder`] takes bytes exactly as they
//! came off the upstream connection (in whatever frames they came) and appends what it
//! learnt, in stream order, to a caller-owned `Vec<Signal>`. The body wrapper stamps the
//! instant once per frame and hands the signals to the `TokenClock`; nothing in this
//! module knows about time, sockets or metrics.
//!
//! A decoder never sees the forwarded bytes' fate: the stream is already on its way to
//! the client before a decoder looks at it, so a decoder error only ends observation.

pub mod openai;
pub mod request;
pub mod sse;

use std::fmt;

/// The response format a decoder understands. Chosen from the request path, the
/// response content-type and (optionally) route configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI `/v1/chat/completions` (also vLLM, SGLang, llama.cpp, TGI's OpenAI API).
    OpenAiChat,
    /// OpenAI legacy `/v1/completions`.
    OpenAiCompletions,
}

impl Dialect {
    /// Stable lower-case name, used in logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai_chat",
            Dialect::OpenAiCompletions => "openai_completions",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of output a token-bearing event carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputKind {
    /// Visible text (`delta.content`, completions `text`).
    Content,
    /// Reasoning text (`reasoning_content`, `reasoning`, thinking deltas).
    Reasoning,
    /// Tool-call / function-call arguments (or a tool call's name).
    ToolCall,
    /// Refusal text.
    Refusal,
}

impl OutputKind {
    /// Whether the user sees this output as the answer (everything except reasoning).
    pub const fn is_visible(self) -> bool {
        !matches!(self, OutputKind::Reasoning)
    }
}

/// One thing a decoder learnt from the response body, in stream order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// A token-bearing event is complete (its last byte was in the frame just fed).
    /// `tokens` is `k_i >= 1`; `exact` says whether the wire format gave the count
    /// (logprobs entries, a usage delta, one-token-per-event formats) or it is the
    /// documented estimate of one token per event.
    Output {
        tokens: u32,
        exact: bool,
        kind: OutputKind,
    },
    /// Token usage reported by the stream. Values are cumulative: a later `Usage`
    /// replaces an earlier one field by field (`None` leaves the field as it was).
    Usage {
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
    },
    /// The model the response names. Emitted at most once per stream.
    Model(String),
    /// The stream itself reported an error (an error event or error object), even
    /// though the HTTP status may have been 200.
    Error,
    /// An event (or line) that could not be understood was skipped; observation goes on.
    Malformed,
    /// The stream's explicit end marker (`data: [DONE]` and the like).
    Done,
}

/// Why a decoder stopped observing. The stream itself is unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// One event grew past the configured bound without being terminated.
    #[error("event larger than {limit} bytes")]
    EventTooLarge { limit: usize },
    /// A non-streaming body grew past the configured bound.
    #[error("body larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
}

impl DecodeError {
    /// Stable short name, used as a metric label value.
    pub const fn reason(&self) -> &'static str {
        match self {
            DecodeError::EventTooLarge { .. } => "event_too_large",
            DecodeError::BodyTooLarge { .. } => "body_too_large",
        }
    }
}

/// An incremental, sans-IO decoder for one response body.
///
/// `feed` may be called with any split of the body (a frame can hold many events, an
/// event can span many frames); the signals produced for a given body must not depend
/// on how it was split. After an `Err` the decoder is not fed again.
pub trait Decoder: Send {
    /// Consume the next bytes of the body.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError>;
    /// The body ended cleanly: flush whatever a complete body implies (a buffered JSON
    /// document; for SSE, a final event left unterminated is discarded as the HTML spec
    /// says, and reported as `Malformed`).
    fn finish(&mut self, out: &mut Vec<Signal>) -> Result<(), DecodeError>;
}

/// Bounds shared by all decoders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest single SSE event / NDJSON line the observer buffers.
    pub max_event_bytes: usize,
    /// Largest non-streaming JSON body the observer buffers to read usage from.
    pub max_body_bytes: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_event_bytes: 1 << 20,
            max_body_bytes: 8 << 20,
        }
    }
}

/// Whether the response is a stream or one JSON document, from its content-type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`
    Sse,
    /// `application/json` (a non-streaming response)
    Json,
}

/// Build the decoder for a dialect and framing.
pub fn decoder(dialect: Dialect, framing: Framing, limits: DecodeLimits) -> Box<dyn Decoder> {
    match framing {
        Framing::Sse => Box::new(openai::StreamDecoder::new(dialect, limits)),
        Framing::Json => Box::new(openai::JsonDecoder::new(dialect, limits)),
    }
}
