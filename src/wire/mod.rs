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
//!
//! # Dialects
//!
//! [`dialect_for`] picks the dialect from the request (method, path, query);
//! [`framing_for`] the framing from the response's content-type; [`response_decoder`]
//! adds the content-encoding. Each dialect has its own module with the exact rules; in
//! short (every route also matches under a base path, e.g. `/openai/v1/chat/completions`):
//!
//! | dialect | routes | framing | token-bearing events | tokens per event | usage (N, input) | error mid-stream |
//! |---|---|---|---|---|---|---|
//! | `openai_chat` | `POST …/chat/completions` | SSE + `[DONE]`; JSON | `delta.content`, `refusal`, `tool_calls`/`function_call`, `reasoning_content`/`reasoning` | `logprobs.content` entries, exact; else growth of a cumulative `usage.completion_tokens` (vLLM/SGLang continuous usage), exact; else 1, estimated | `usage` (final chunk or every chunk); llama.cpp `timings` | `error` object or event |
//! | `openai_completions` | `POST …/completions` | SSE + `[DONE]`; JSON | `choices[].text` | `logprobs.tokens` entries, exact; else usage growth, exact; else 1 | `usage` | `error` object or event |
//! | `openai_responses` | `POST …/responses`; `GET …/responses/{id}?stream=true` | typed SSE, no `[DONE]`; JSON | `response.output_text.delta`, `.refusal.delta`, `.function_call_arguments.delta` (and custom/MCP/code-interpreter input), `.reasoning_text.delta`, `.reasoning_summary_text.delta` | `logprobs` entries, exact; else 1, estimated | `usage` of `response.completed` / `.incomplete` / `.failed` | `error` event, `response.failed` |
//! | `anthropic` | `POST …/v1/messages`; Vertex `…/publishers/anthropic/models/{m}:streamRawPredict` | typed SSE; JSON | `content_block_delta`: `text_delta`, `thinking_delta`, `input_json_delta` | 1, estimated | `message_start` input (+ cache reads/writes); `message_delta` cumulative `output_tokens`, last wins | `error` event |
//! | `gemini` | `POST …/models/{m}:streamGenerateContent` (`?alt=sse`: SSE, else a streamed JSON array), `:generateContent` | SSE; JSON array; JSON | `parts[].text` (`thought: true` is reasoning), `functionCall`, `executableCode` | `logprobsResult.chosenCandidates` entries, exact; else growth of the cumulative `candidatesTokenCount + thoughtsTokenCount`, exact; else 1 | `usageMetadata` on every chunk | `error` object |
//! | `ollama` | `POST …/api/chat`, `…/api/generate` | NDJSON; JSON | `message.content` / `response`, `message.tool_calls`, `thinking` | `logprobs` entries, exact; else 1, estimated | final line (`done: true`): `prompt_eval_count`, `eval_count` | `error` field |
//! | `tgi` | `POST …/generate_stream`, `…/generate` | SSE; JSON | every `token` event (special tokens too, unless [`DecodeOptions::skip_special_tokens`]) | 1, exact | last event's `details`: `generated_tokens`, `input_length` | `error` field |
//! | `triton` | `POST …/v2/models/{m}[/versions/{v}]/generate_stream`, `…/generate` | SSE; JSON | non-empty `text_output` | 1, estimated | none: N is the event count | `error` field (after a 200) |
//!
//! Everywhere: one event is at most one [`Signal::Output`], of the most visible kind it
//! carries (content > refusal > tool call > reasoning); role-only, empty, keep-alive,
//! ping and usage-only events carry none. Reported usage is cumulative and replaces the
//! event count as N. A non-streaming (JSON) body yields the model, usage and errors only:
//! it arrives at once and has no inter-token timing. Responses compressed with `gzip`,
//! `deflate`, `br` or `zstd` are decoded on the observer's copy ([`compress`]).
//!
//! Where the table says "1, estimated", an optional [`Tokenizer`] (`observe.tokenizer`,
//! see [`tokenize`]) counts the event's output text instead; that count is still
//! estimated (`exact: false`). Without one (the default) the text is never looked at.

pub mod anthropic;
pub mod compress;
mod count;
mod frame;
pub mod gemini;
mod json;
pub mod jsonarray;
pub mod ndjson;
pub mod ollama;
pub mod openai;
pub mod request;
pub mod responses;
pub mod sse;
pub mod tgi;
pub mod token_stream;
pub mod tokenize;
pub mod triton;

pub use tokenize::{TokenCounter, Tokenizer};

use std::fmt;

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
}

impl Dialect {
    /// Every dialect, in a stable order.
    pub const ALL: [Dialect; 8] = [
        Dialect::OpenAiChat,
        Dialect::OpenAiCompletions,
        Dialect::OpenAiResponses,
        Dialect::Anthropic,
        Dialect::Gemini,
        Dialect::Ollama,
        Dialect::Tgi,
        Dialect::Triton,
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
        }
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
    /// A compressed body could not be decompressed.
    #[error("corrupt compressed body")]
    Compression,
    /// A compressed body inflated past `ratio` times its compressed size.
    #[error("compressed body inflates more than {ratio} times")]
    InflateRatio { ratio: u64 },
}

impl DecodeError {
    /// Stable short name, used as a metric label value.
    pub const fn reason(&self) -> &'static str {
        match self {
            DecodeError::EventTooLarge { .. } => "event_too_large",
            DecodeError::BodyTooLarge { .. } => "body_too_large",
            DecodeError::Compression => "compression",
            DecodeError::InflateRatio { .. } => "inflate_ratio",
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
    /// Largest single SSE event, NDJSON line or JSON-array element the observer buffers.
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

/// Dialect-specific decoding choices (defaults suit every backend). The optional
/// [`Tokenizer`] is passed beside these ([`decoder_tokenized`]) so that the options stay
/// `Copy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// TGI: special tokens (`token.special`, e.g. the final EOS) are not token-bearing
    /// events. Off by default, so that per-event counts add up to `generated_tokens`.
    /// Set by `observe.skip_special_tokens`.
    pub skip_special_tokens: bool,
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
}

impl Framing {
    /// Every framing, in a stable order.
    pub const ALL: [Framing; 4] = [
        Framing::Sse,
        Framing::Json,
        Framing::Ndjson,
        Framing::JsonArray,
    ];
}

/// Build the decoder for a dialect and framing, with default options.
pub fn decoder(dialect: Dialect, framing: Framing, limits: DecodeLimits) -> Box<dyn Decoder> {
    decoder_with(dialect, framing, limits, DecodeOptions::default())
}

/// Build the decoder for a dialect and framing.
pub fn decoder_with(
    dialect: Dialect,
    framing: Framing,
    limits: DecodeLimits,
    options: DecodeOptions,
) -> Box<dyn Decoder> {
    decoder_tokenized(dialect, framing, limits, options, None)
}

/// Build the decoder for a dialect and framing that counts the text of events without an
/// exact count with `tokenizer` (see [`tokenize`]); `None` is [`decoder_with`].
pub fn decoder_tokenized(
    dialect: Dialect,
    framing: Framing,
    limits: DecodeLimits,
    options: DecodeOptions,
    tokenizer: Option<&Tokenizer>,
) -> Box<dyn Decoder> {
    let tokenizer = tokenizer.cloned();
    match dialect {
        Dialect::OpenAiChat | Dialect::OpenAiCompletions => match framing {
            Framing::Sse => Box::new(openai::StreamDecoder::with_tokenizer(
                dialect, limits, tokenizer,
            )),
            Framing::Json => Box::new(openai::JsonDecoder::new(dialect, limits)),
            other => framed(openai::OpenAi::new(dialect, tokenizer), other, limits),
        },
        Dialect::OpenAiResponses => framed(responses::Responses::new(tokenizer), framing, limits),
        Dialect::Anthropic => framed(anthropic::Anthropic::new(tokenizer), framing, limits),
        Dialect::Gemini => framed(gemini::Gemini::new(tokenizer), framing, limits),
        Dialect::Ollama => framed(ollama::Ollama::new(tokenizer), framing, limits),
        // One token per event, exact: nothing for a tokenizer to improve.
        Dialect::Tgi => framed(tgi::Tgi::new(options.skip_special_tokens), framing, limits),
        Dialect::Triton => framed(triton::Triton::new(tokenizer), framing, limits),
    }
}

fn framed<H: frame::Handler + 'static>(
    handler: H,
    framing: Framing,
    limits: DecodeLimits,
) -> Box<dyn Decoder> {
    match framing {
        Framing::Sse => Box::new(frame::SseStream::new(handler, limits)),
        Framing::Json => Box::new(frame::JsonBody::new(handler, limits)),
        Framing::Ndjson => Box::new(frame::NdjsonStream::new(handler, limits)),
        Framing::JsonArray => Box::new(frame::ArrayStream::new(handler, limits)),
    }
}

/// The framing of a response body from its `Content-Type`, or `None` for a type no
/// dialect streams (the response is then forwarded unobserved). JSON is a streamed array
/// for Gemini (whose array framing also reads a plain object), one document otherwise.
pub fn framing_for(dialect: Dialect, content_type: &str) -> Option<Framing> {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    let is = |name: &str| mime.eq_ignore_ascii_case(name);
    if is("text/event-stream") {
        Some(Framing::Sse)
    } else if is("application/x-ndjson")
        || is("application/ndjson")
        || is("application/jsonl")
        || is("application/x-jsonlines")
    {
        Some(Framing::Ndjson)
    } else if is("application/json") || is("text/json") || ends_with_ignore_case(mime, "+json") {
        Some(match dialect {
            Dialect::Gemini => Framing::JsonArray,
            _ => Framing::Json,
        })
    } else {
        None
    }
}

fn ends_with_ignore_case(text: &str, suffix: &str) -> bool {
    text.len() >= suffix.len()
        && text.as_bytes()[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// Why a response cannot be observed (it is forwarded all the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unobservable {
    /// The content-type is none of the framings ([`framing_for`]).
    #[error("unsupported content-type")]
    ContentType,
    /// The content-encoding is not one [`compress`] decodes.
    #[error("unsupported content-encoding")]
    ContentEncoding,
}

/// The decoder for a response: framing from `content_type`, decompression from
/// `content_encoding` (the header's value, if any).
pub fn response_decoder(
    dialect: Dialect,
    content_type: &str,
    content_encoding: Option<&[u8]>,
    limits: DecodeLimits,
    options: DecodeOptions,
) -> Result<Box<dyn Decoder>, Unobservable> {
    response_decoder_tokenized(
        dialect,
        content_type,
        content_encoding,
        limits,
        options,
        None,
    )
}

/// [`response_decoder`] with an optional [`Tokenizer`] ([`decoder_tokenized`]).
pub fn response_decoder_tokenized(
    dialect: Dialect,
    content_type: &str,
    content_encoding: Option<&[u8]>,
    limits: DecodeLimits,
    options: DecodeOptions,
    tokenizer: Option<&Tokenizer>,
) -> Result<Box<dyn Decoder>, Unobservable> {
    let framing = framing_for(dialect, content_type).ok_or(Unobservable::ContentType)?;
    let coding = match content_encoding {
        None => None,
        Some(value) => compress::Coding::parse(value).map_err(|_| Unobservable::ContentEncoding)?,
    };
    let inner = decoder_tokenized(dialect, framing, limits, options, tokenizer);
    match coding {
        None => Ok(inner),
        Some(coding) => compress::Decompressing::new(coding, inner)
            .map(|d| Box::new(d) as Box<dyn Decoder>)
            .map_err(|_| Unobservable::ContentEncoding),
    }
}

/// The dialect of an LLM route, or `None` for a route tokentap does not measure.
///
/// Matched on the path's end so that base paths work (`/openai/v1/chat/completions`,
/// Azure's `/openai/deployments/x/chat/completions`, a gateway's `/ollama/api/chat`).
/// Only `POST` requests are LLM calls, except the Responses API's
/// `GET …/responses/{id}?stream=true`, which replays a stored response as a stream.
pub fn dialect_for(method: &http::Method, path: &str, query: Option<&str>) -> Option<Dialect> {
    let path = path.trim_end_matches('/');
    if method == http::Method::GET {
        let streamed = query.is_some_and(|q| {
            q.split('&')
                .any(|pair| pair.eq_ignore_ascii_case("stream=true"))
        });
        let is_response = path
            .rsplit_once('/')
            .is_some_and(|(parent, id)| parent.ends_with("/responses") && !id.is_empty());
        return (streamed && is_response).then_some(Dialect::OpenAiResponses);
    }
    if method != http::Method::POST {
        return None;
    }
    let dialect = if path.ends_with("/chat/completions") {
        Dialect::OpenAiChat
    } else if path.ends_with("/completions") {
        Dialect::OpenAiCompletions
    } else if path.ends_with("/responses") {
        Dialect::OpenAiResponses
    } else if path.ends_with("/v1/messages")
        || (path.contains("/publishers/anthropic/models/")
            && (path.ends_with(":streamRawPredict") || path.ends_with(":rawPredict")))
    {
        Dialect::Anthropic
    } else if path.ends_with(":streamGenerateContent") || path.ends_with(":generateContent") {
        Dialect::Gemini
    } else if path.ends_with("/api/chat") || path.ends_with("/api/generate") {
        Dialect::Ollama
    } else if path.ends_with("/generate_stream") || path.ends_with("/generate") {
        if path.contains("/v2/models/") {
            Dialect::Triton
        } else {
            Dialect::Tgi
        }
    } else {
        return None;
    };
    Some(dialect)
}

/// Helpers for the dialect modules' unit tests: decode a body whole and byte by byte,
/// insist both give the same signals, and return them.
#[cfg(test)]
pub(crate) mod testing {
    use super::frame::{ArrayStream, Handler, JsonBody, NdjsonStream, SseStream};
    use super::{DecodeLimits, Decoder, Signal};

    fn run<D: Decoder>(mut make: impl FnMut() -> D, body: &[u8]) -> Vec<Signal> {
        let decode = |dec: &mut D, frames: &mut dyn Iterator<Item = &[u8]>| {
            let mut out = Vec::new();
            for frame in frames {
                dec.feed(frame, &mut out).expect("within limits");
            }
            dec.finish(&mut out).expect("finish");
            out
        };
        let whole = decode(&mut make(), &mut std::iter::once(body));
        let bytes = decode(&mut make(), &mut body.chunks(1));
        assert_eq!(whole, bytes, "byte-by-byte decoding differs");
        whole
    }

    pub(crate) fn sse<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
        run(
            || SseStream::new(handler.clone(), DecodeLimits::default()),
            body,
        )
    }

    pub(crate) fn ndjson<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
        run(
            || NdjsonStream::new(handler.clone(), DecodeLimits::default()),
            body,
        )
    }

    pub(crate) fn array<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
        run(
            || ArrayStream::new(handler.clone(), DecodeLimits::default()),
            body,
        )
    }

    pub(crate) fn body<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
        run(
            || JsonBody::new(handler.clone(), DecodeLimits::default()),
            body,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn routes() {
        let post = Method::POST;
        let cases: &[(&str, Option<Dialect>)] = &[
            ("/v1/chat/completions", Some(Dialect::OpenAiChat)),
            ("/openai/deployments/gpt/chat/completions/", Some(Dialect::OpenAiChat)),
            ("/v1/completions", Some(Dialect::OpenAiCompletions)),
            ("/v1/responses", Some(Dialect::OpenAiResponses)),
            ("/v1/messages", Some(Dialect::Anthropic)),
            ("/anthropic/v1/messages", Some(Dialect::Anthropic)),
            (
                "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4:streamRawPredict",
                Some(Dialect::Anthropic),
            ),
            ("/v1/threads/t_1/messages", None),
            ("/v1/messages/count_tokens", None),
            ("/v1beta/models/gemini-2.0-flash:streamGenerateContent", Some(Dialect::Gemini)),
            ("/v1beta/models/gemini-2.0-flash:generateContent", Some(Dialect::Gemini)),
            (
                "/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-pro:streamGenerateContent",
                Some(Dialect::Gemini),
            ),
            ("/v1beta/models/gemini-2.0-flash:countTokens", None),
            ("/api/chat", Some(Dialect::Ollama)),
            ("/ollama/api/generate", Some(Dialect::Ollama)),
            ("/api/tags", None),
            ("/generate_stream", Some(Dialect::Tgi)),
            ("/generate", Some(Dialect::Tgi)),
            ("/v2/models/ensemble/generate_stream", Some(Dialect::Triton)),
            ("/v2/models/llama/versions/1/generate", Some(Dialect::Triton)),
            ("/v2/models/llama/infer", None),
            ("/v1/models", None),
            ("/v1/embeddings", None),
        ];
        for (path, want) in cases {
            assert_eq!(dialect_for(&post, path, None), *want, "{path}");
        }
        assert_eq!(
            dialect_for(&Method::GET, "/v1/chat/completions", None),
            None
        );
        assert_eq!(
            dialect_for(
                &Method::GET,
                "/v1/responses/resp_1",
                Some("stream=true&starting_after=4")
            ),
            Some(Dialect::OpenAiResponses)
        );
        assert_eq!(
            dialect_for(&Method::GET, "/v1/responses/resp_1", None),
            None
        );
        assert_eq!(
            dialect_for(&Method::DELETE, "/v1/responses/resp_1", None),
            None
        );
    }

    #[test]
    fn framings() {
        use Framing::*;
        let cases: &[(Dialect, &str, Option<Framing>)] = &[
            (
                Dialect::OpenAiChat,
                "text/event-stream; charset=utf-8",
                Some(Sse),
            ),
            (Dialect::OpenAiChat, "application/json", Some(Json)),
            (Dialect::Ollama, "application/x-ndjson", Some(Ndjson)),
            (
                Dialect::Ollama,
                "application/json; charset=utf-8",
                Some(Json),
            ),
            (
                Dialect::Gemini,
                "application/json; charset=UTF-8",
                Some(JsonArray),
            ),
            (Dialect::Gemini, "text/event-stream", Some(Sse)),
            (Dialect::Anthropic, "application/problem+json", Some(Json)),
            (Dialect::Tgi, "text/plain", None),
            (Dialect::Tgi, "", None),
        ];
        for (dialect, content_type, want) in cases {
            assert_eq!(framing_for(*dialect, content_type), *want, "{content_type}");
        }
    }

    #[test]
    fn response_decoders() {
        let limits = DecodeLimits::default();
        let options = DecodeOptions::default();
        let ok = |ct: &str, ce: Option<&[u8]>| {
            response_decoder(Dialect::OpenAiChat, ct, ce, limits, options).map(|_| ())
        };
        assert_eq!(ok("text/event-stream", None), Ok(()));
        assert_eq!(ok("text/event-stream", Some(b"gzip")), Ok(()));
        assert_eq!(ok("text/event-stream", Some(b"identity")), Ok(()));
        assert_eq!(ok("text/html", None), Err(Unobservable::ContentType));
        assert_eq!(
            ok("text/event-stream", Some(b"compress")),
            Err(Unobservable::ContentEncoding)
        );
    }

    #[test]
    fn names_round_trip() {
        for dialect in Dialect::ALL {
            assert_eq!(Dialect::from_name(dialect.as_str()), Some(dialect));
        }
        assert_eq!(Dialect::from_name("nope"), None);
    }
}
