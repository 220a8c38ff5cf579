//! The vocabulary every wire module shares: what a decoder is ([`Decoder`]), what it
//! emits ([`Signal`], [`OutputKind`], [`EngineTimings`], [`TokenDetails`]), why it stops ([`DecodeError`]), its bounds
//! ([`DecodeLimits`]) and the names of what it reads ([`Dialect`], [`Framing`]).
//!
//! This module is a leaf but for [`ErrorClass`], itself a leaf: it imports nothing else
//! from `wire`, so every framer and dialect can use these names without depending on the
//! decoder factory, which depends on them all.

use std::fmt;
use std::time::Duration;

use super::error_class::ErrorClass;

/// The response format a decoder understands. Chosen from the request path, the
/// response content-type and (optionally) route configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI `/v1/chat/completions` (also vLLM, SGLang, llama.cpp, TGI's OpenAI API).
    OpenAiChat,
    /// OpenAI legacy `/v1/completions`.
    OpenAiCompletions,
    /// OpenAI Responses API, `/v1/responses`.
    OpenAiResponses,
    /// Anthropic Messages, `/v1/messages`.
    Anthropic,
    /// Google Gemini `generateContent` / `streamGenerateContent` (Gemini API, Vertex AI).
    Gemini,
    /// Ollama's native `/api/chat` and `/api/generate`.
    Ollama,
    /// Hugging Face TGI's native `/generate_stream` and `/generate`.
    Tgi,
    /// Triton's generate extension, `/v2/models/{m}/generate_stream` (TensorRT-LLM).
    Triton,
    /// SGLang's scheduler over gRPC: `sglang.grpc.scheduler.SglangScheduler/Generate`.
    SglangGrpc,
    /// vLLM's engine over gRPC: `vllm.grpc.engine.VllmEngine/Generate`.
    VllmGrpc,
    /// TensorRT-LLM's service over gRPC: `trtllm.TrtllmService/Generate`.
    TrtllmGrpc,
    /// Triton's streaming inference over gRPC:
    /// `inference.GRPCInferenceService/ModelStreamInfer` (TensorRT-LLM, vLLM, Python
    /// backends).
    TritonGrpc,
}

impl Dialect {
    /// Every dialect, in a stable order.
    pub const ALL: [Dialect; 12] = [
        Dialect::OpenAiChat,
        Dialect::OpenAiCompletions,
        Dialect::OpenAiResponses,
        Dialect::Anthropic,
        Dialect::Gemini,
        Dialect::Ollama,
        Dialect::Tgi,
        Dialect::Triton,
        Dialect::SglangGrpc,
        Dialect::VllmGrpc,
        Dialect::TrtllmGrpc,
        Dialect::TritonGrpc,
    ];

    /// Stable lower-case name, used in logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai_chat",
            Dialect::OpenAiCompletions => "openai_completions",
            Dialect::OpenAiResponses => "openai_responses",
            Dialect::Anthropic => "anthropic",
            Dialect::Gemini => "gemini",
            Dialect::Ollama => "ollama",
            Dialect::Tgi => "tgi",
            Dialect::Triton => "triton",
            Dialect::SglangGrpc => "sglang_grpc",
            Dialect::VllmGrpc => "vllm_grpc",
            Dialect::TrtllmGrpc => "trtllm_grpc",
            Dialect::TritonGrpc => "triton_grpc",
        }
    }

    /// Whether this dialect's responses are gRPC messages ([`Framing::Grpc`]) rather than
    /// an HTTP API's bodies.
    pub const fn is_grpc(self) -> bool {
        matches!(
            self,
            Dialect::SglangGrpc | Dialect::VllmGrpc | Dialect::TrtllmGrpc | Dialect::TritonGrpc
        )
    }

    /// The dialect named by [`Dialect::as_str`] (for configuration that forces one).
    pub fn from_name(name: &str) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.as_str() == name)
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
    /// `tokens` is `k_i`; `exact` says whether the wire format gave the count
    /// (logprobs entries, a usage delta, one-token-per-event formats) or it is the
    /// documented estimate: the event text's words and symbols, or what it settled in the
    /// configured tokenizer's incremental count (possibly 0).
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
    /// though the HTTP status may have been 200, and what the report names as its cause.
    Error(ErrorClass),
    /// An event (or line) that could not be understood was skipped; observation goes on.
    Malformed,
    /// At the clean end of the body: tokens of the configured tokenizer's text that only
    /// the end settled, which belong to the last token-bearing event (an estimate).
    TrailingTokens(u32),
    /// The stream's explicit end marker (`data: [DONE]` and the like).
    Done,
    /// The engine's own account of the request's time, as the response reported it. A
    /// later report replaces an earlier one part by part (`None` leaves a part as it was).
    EngineTimings(EngineTimings),
    /// Why the response says it, or one of its choices, ended (`stop`, `length`,
    /// `tool_calls`, `end_turn`, `MAX_TOKENS`, ...), as written: OpenAI's
    /// `finish_reason`, Anthropic's `stop_reason`, Gemini's `finishReason`, the Responses
    /// API's incomplete reason or status, the gRPC engines' `finish_reason`. Read from the
    /// value the event's or body's parse already holds (the table in [`crate`]).
    FinishReason(String),
    /// The cached and reasoning parts of the reported usage (the table in
    /// [`crate`]). Like `Usage` they are cumulative: a later report replaces an
    /// earlier one part by part (`None` leaves a part as it was), and a decoder reports
    /// them only when they say something its earlier reports did not (a stream that
    /// repeats its usage on every chunk reports them once per change). Boxed: usage comes
    /// once or a few times a stream, and inline the three counts would make every
    /// `Signal`, pushed for every event, a word larger.
    TokenDetails(Box<TokenDetails>),
}

/// What a response's usage says of its tokens beyond the input and output counts. These
/// are parts of [`Signal::Usage`]'s counts, not additions to them: cache reads and writes
/// are part of the input tokens, reasoning tokens part of the output tokens, whatever
/// the provider's own usage adds up. Each part is present only where the response
/// reported it (a reported 0 is 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenDetails {
    /// Input tokens read from the prompt cache (a prefix-cache hit): OpenAI's
    /// `cached_tokens`, Anthropic's `cache_read_input_tokens`, Gemini's
    /// `cachedContentTokenCount`, the engines' `cached_tokens`.
    pub cache_read_input: Option<u64>,
    /// Input tokens written to the prompt cache: Anthropic's `cache_creation_input_tokens`.
    pub cache_write_input: Option<u64>,
    /// Output tokens the model spent reasoning: OpenAI's `reasoning_tokens`, Gemini's
    /// `thoughtsTokenCount`.
    pub reasoning_output: Option<u64>,
}

impl TokenDetails {
    /// Whether no part was reported.
    pub fn is_empty(&self) -> bool {
        *self == TokenDetails::default()
    }

    /// `later`'s parts over this one's, part by part.
    pub fn merge(&mut self, later: TokenDetails) {
        self.cache_read_input = later.cache_read_input.or(self.cache_read_input);
        self.cache_write_input = later.cache_write_input.or(self.cache_write_input);
        self.reasoning_output = later.reasoning_output.or(self.reasoning_output);
    }

    /// Push these details as a [`Signal::TokenDetails`] when they change what `sent` (this
    /// stream's reports so far, merged) says, and merge them into `sent`. Out of line: it
    /// runs where a stream reports usage, not on the per-event path it is called from.
    #[inline(never)]
    pub(crate) fn report(self, sent: &mut TokenDetails, out: &mut Vec<Signal>) {
        let mut merged = *sent;
        merged.merge(self);
        if merged != *sent {
            *sent = merged;
            out.push(Signal::TokenDetails(Box::new(self)));
        }
    }
}

/// Where the engine says a request's time to first token went, measured on the engine's
/// clock. Each part is present only where the response reported it; a decoder never
/// puts a negative, non-finite or implausibly large value here
/// (`wire::engine_timings` reads them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineTimings {
    /// Waiting before the engine started on the request: its queue (TensorRT-LLM, Groq,
    /// Cerebras), or until a loaded model could take it (Ollama's `load_duration`).
    pub queue: Option<Duration>,
    /// Processing the prompt (prefill).
    pub prefill: Option<Duration>,
    /// From the request's arrival at the engine to its first token, where the engine
    /// reports that instant itself.
    pub first_token: Option<Duration>,
}

impl EngineTimings {
    /// Whether any part was reported.
    pub fn is_empty(&self) -> bool {
        *self == EngineTimings::default()
    }

    /// `later`'s parts over this one's, part by part.
    pub fn merge(&mut self, later: EngineTimings) {
        self.queue = later.queue.or(self.queue);
        self.prefill = later.prefill.or(self.prefill);
        self.first_token = later.first_token.or(self.first_token);
    }

    /// The engine's time to first token: the first-token time it reported, else its
    /// queue and prefill added, when it reported both; `None` otherwise (a prefill alone
    /// leaves out the engine's wait, and is no TTFT).
    pub fn time_to_first_token(&self) -> Option<Duration> {
        self.first_token.or_else(|| {
            self.queue
                .zip(self.prefill)
                .map(|(queue, prefill)| queue.saturating_add(prefill))
        })
    }
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
    /// A compressed body could not be decompressed.
    #[error("corrupt compressed body")]
    Compression,
    /// A compressed body inflated past `ratio` times its compressed size.
    #[error("compressed body inflates more than {ratio} times")]
    InflateRatio { ratio: u64 },
    /// A gRPC message's compressed flag was neither 0 nor 1: the message framing is lost.
    #[error("malformed gRPC message framing")]
    MessageFraming,
    /// A gRPC message flagged compressed, under a `grpc-encoding` tokentap cannot decode,
    /// or none.
    #[error("gRPC message in an unsupported encoding")]
    MessageEncoding,
}

impl DecodeError {
    /// Stable short name, used as a metric label value.
    pub const fn reason(&self) -> &'static str {
        match self {
            DecodeError::EventTooLarge { .. } => "event_too_large",
            DecodeError::BodyTooLarge { .. } => "body_too_large",
            DecodeError::Compression => "compression",
            DecodeError::InflateRatio { .. } => "inflate_ratio",
            DecodeError::MessageFraming => "message_framing",
            DecodeError::MessageEncoding => "message_encoding",
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
    /// Largest single SSE event, NDJSON line, JSON-array element or gRPC message (as sent,
    /// and once inflated) the observer buffers.
    pub max_event_bytes: usize,
    /// Largest non-streaming JSON body the observer buffers to read usage from.
    pub max_body_bytes: usize,
}

impl DecodeLimits {
    /// The bounds `observe.max_event_bytes` and `observe.max_body_bytes` default to (the
    /// configuration reads its defaults from here): 1 MiB events, 8 MiB bodies.
    pub const DEFAULT: DecodeLimits = DecodeLimits {
        max_event_bytes: 1 << 20,
        max_body_bytes: 8 << 20,
    };
}

/// How the response body is cut into events, from its content-type (and the dialect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`
    Sse,
    /// `application/json` (a non-streaming response)
    Json,
    /// `application/x-ndjson`: one JSON value per line (Ollama).
    Ndjson,
    /// `application/json` holding a streamed array of chunks (Gemini without `alt=sse`);
    /// a top-level object is read as one whole body.
    JsonArray,
    /// `application/grpc`: length-prefixed messages (the gRPC dialects).
    Grpc,
}

impl Framing {
    /// Every framing, in a stable order.
    pub const ALL: [Framing; 5] = [
        Framing::Sse,
        Framing::Json,
        Framing::Ndjson,
        Framing::JsonArray,
        Framing::Grpc,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_ttft_is_the_reported_first_token_else_queue_and_prefill() {
        let ms = Duration::from_millis;
        let both = EngineTimings {
            queue: Some(ms(20)),
            prefill: Some(ms(100)),
            first_token: None,
        };
        assert_eq!(both.time_to_first_token(), Some(ms(120)));
        let reported = EngineTimings {
            first_token: Some(ms(130)),
            ..both
        };
        assert_eq!(reported.time_to_first_token(), Some(ms(130)));
        let prefill_only = EngineTimings {
            prefill: Some(ms(100)),
            ..EngineTimings::default()
        };
        assert_eq!(prefill_only.time_to_first_token(), None);
        assert!(EngineTimings::default().is_empty() && !prefill_only.is_empty());

        let mut merged = both;
        merged.merge(EngineTimings {
            queue: Some(ms(5)),
            ..EngineTimings::default()
        });
        assert_eq!((merged.queue, merged.prefill), (Some(ms(5)), Some(ms(100))));
    }

    #[test]
    fn token_details_merge_part_by_part_and_report_only_changes() {
        let read = |n| TokenDetails {
            cache_read_input: Some(n),
            ..TokenDetails::default()
        };
        let mut merged = read(5);
        merged.merge(TokenDetails {
            reasoning_output: Some(7),
            ..TokenDetails::default()
        });
        assert_eq!(
            merged,
            TokenDetails {
                cache_read_input: Some(5),
                cache_write_input: None,
                reasoning_output: Some(7),
            },
            "None erases nothing"
        );
        merged.merge(read(0));
        assert_eq!(merged.cache_read_input, Some(0), "a later 0 wins");
        assert!(TokenDetails::default().is_empty() && !merged.is_empty());

        let mut sent = TokenDetails::default();
        let mut out = Vec::new();
        TokenDetails::default().report(&mut sent, &mut out);
        read(5).report(&mut sent, &mut out);
        read(5).report(&mut sent, &mut out);
        TokenDetails::default().report(&mut sent, &mut out);
        read(6).report(&mut sent, &mut out);
        assert_eq!(
            out,
            [
                Signal::TokenDetails(Box::new(read(5))),
                Signal::TokenDetails(Box::new(read(6)))
            ]
        );
        assert_eq!(sent, read(6));
    }

    #[test]
    fn a_signal_stays_six_words() {
        // Signals are pushed for every event: what a variant carries beyond this is boxed.
        assert_eq!(std::mem::size_of::<Signal>(), 48);
    }

    #[test]
    fn names_round_trip() {
        for dialect in Dialect::ALL {
            assert_eq!(Dialect::from_name(dialect.as_str()), Some(dialect));
        }
        assert_eq!(Dialect::from_name("nope"), None);
    }
}
