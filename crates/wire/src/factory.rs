//! Decoder construction: which [`Decoder`] reads a response, from its dialect, its
//! content-type and its content-encoding (and, for gRPC, its `grpc-encoding`).
//!
//! This is the one module that knows every dialect and every framing; nothing in `wire`
//! imports it, so a dialect never depends on the others through it. A response the
//! factory cannot read is [`Unobservable`] (and forwarded all the same).

use super::compress;
use super::frame::{ArrayStream, GrpcStream, Handler, JsonBody, NdjsonStream, SseStream};
use super::grpc::engines::{Engine, Generate};
use super::grpc::framing::MessageEncoding;
use super::grpc::triton::StreamInfer;
use super::tokenize::Tokenizer;
use super::types::{DecodeError, DecodeLimits, Decoder, Dialect, Framing};
use super::{anthropic, gemini, ollama, openai, responses, tgi, triton};

/// Everything a decoder is built with besides its dialect and framing.
#[derive(Clone, Copy, Debug)]
pub struct DecodeOptions<'a> {
    /// Bounds on what the decoder buffers.
    pub limits: DecodeLimits,
    /// TGI: special tokens (`token.special`, e.g. the final EOS) are not token-bearing
    /// events. Off by default, so that per-event counts add up to `generated_tokens`.
    /// Set by `observe.skip_special_tokens`.
    pub skip_special_tokens: bool,
    /// Counts the text of events without an exact count (`observe.tokenizer`, see
    /// [`super::tokenize`]); `None` (the default) never looks at the text.
    pub tokenizer: Option<&'a Tokenizer>,
    /// The response's `grpc-encoding` header, if any: how the gRPC messages flagged
    /// compressed are compressed ([`MessageEncoding::parse`]). Read by [`Framing::Grpc`]
    /// only; `None` (the default) lets no message be compressed.
    pub grpc_encoding: Option<&'a [u8]>,
}

impl DecodeOptions<'_> {
    /// `limits`, with every other choice at its default (suits every backend).
    pub const fn new(limits: DecodeLimits) -> Self {
        DecodeOptions {
            limits,
            skip_special_tokens: false,
            tokenizer: None,
            grpc_encoding: None,
        }
    }
}

/// Build the decoder for a dialect and framing.
pub fn decoder(dialect: Dialect, framing: Framing, options: DecodeOptions<'_>) -> Box<dyn Decoder> {
    let tokenizer = options.tokenizer.cloned();
    let o = &options;
    match dialect {
        Dialect::OpenAiChat | Dialect::OpenAiCompletions => {
            framed(openai::OpenAi::new(dialect, tokenizer), framing, o)
        }
        Dialect::OpenAiResponses => framed(responses::Responses::new(tokenizer), framing, o),
        Dialect::Anthropic => framed(anthropic::Anthropic::new(tokenizer), framing, o),
        Dialect::Gemini => framed(gemini::Gemini::new(tokenizer), framing, o),
        Dialect::Ollama => framed(ollama::Ollama::new(tokenizer), framing, o),
        // One token per event, exact: nothing for a tokenizer to improve.
        Dialect::Tgi => framed(tgi::Tgi::new(options.skip_special_tokens), framing, o),
        Dialect::Triton => framed(triton::Triton::new(tokenizer), framing, o),
        // Token ids, exact: no tokenizer either.
        Dialect::SglangGrpc => framed(Generate::new(Engine::Sglang), framing, o),
        Dialect::VllmGrpc => framed(Generate::new(Engine::Vllm), framing, o),
        Dialect::TrtllmGrpc => framed(Generate::new(Engine::Trtllm), framing, o),
        Dialect::TritonGrpc => framed(StreamInfer::new(tokenizer), framing, o),
    }
}

fn framed<H: Handler + 'static>(
    handler: H,
    framing: Framing,
    options: &DecodeOptions<'_>,
) -> Box<dyn Decoder> {
    let limits = options.limits;
    match framing {
        Framing::Sse => Box::new(SseStream::new(handler, limits)),
        Framing::Json => Box::new(JsonBody::new(handler, limits)),
        Framing::Ndjson => Box::new(NdjsonStream::new(handler, limits)),
        Framing::JsonArray => Box::new(ArrayStream::new(handler, limits)),
        Framing::Grpc => Box::new(GrpcStream::new(
            handler,
            limits,
            MessageEncoding::parse(options.grpc_encoding),
        )),
    }
}

/// The framing of a response body from its `Content-Type`, or `None` for a type no
/// dialect streams (the response is then forwarded unobserved). JSON is a streamed array
/// for Gemini (whose array framing also reads a plain object), one document otherwise.
/// The gRPC dialects are read from `application/grpc` (or `application/grpc+proto`) and
/// nothing else, and no other dialect from it.
pub fn framing_for(dialect: Dialect, content_type: &str) -> Option<Framing> {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    let is = |name: &str| mime.eq_ignore_ascii_case(name);
    let grpc = is("application/grpc") || is("application/grpc+proto");
    if dialect.is_grpc() || grpc {
        return (dialect.is_grpc() && grpc).then_some(Framing::Grpc);
    }
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
    text.len()
        .checked_sub(suffix.len())
        .and_then(|start| text.as_bytes().get(start..))
        .is_some_and(|end| end.eq_ignore_ascii_case(suffix.as_bytes()))
}

/// Why a response cannot be observed (it is forwarded all the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unobservable {
    /// The content-type is none of the framings ([`framing_for`]).
    #[error("unsupported content-type")]
    ContentType,
    /// The content-encoding is not one [`compress`] decodes (or a gRPC message's
    /// `grpc-encoding` is not one [`MessageEncoding`] names).
    #[error("unsupported content-encoding")]
    ContentEncoding,
    /// The decoder gave up (event or body over its bound, or inflating past its ratio).
    #[error("decode limit reached")]
    DecodeLimit,
    /// Its compressed body could not be decompressed (a corrupt gzip, say), or its gRPC
    /// message framing is broken.
    #[error("corrupt content-encoding")]
    CorruptEncoding,
    /// The decoder failed unexpectedly; the stream went on unobserved.
    #[error("observer panicked")]
    ObserverPanic,
}

impl Unobservable {
    /// Why a decoder that failed with `err` stopped observing.
    pub const fn for_decode_error(err: &DecodeError) -> Unobservable {
        match err {
            DecodeError::Compression | DecodeError::MessageFraming => Unobservable::CorruptEncoding,
            DecodeError::MessageEncoding => Unobservable::ContentEncoding,
            DecodeError::EventTooLarge { .. }
            | DecodeError::BodyTooLarge { .. }
            | DecodeError::InflateRatio { .. } => Unobservable::DecodeLimit,
        }
    }

    /// The `reason` label of `tokentap_unobserved_responses_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unobservable::ContentType => "content_type",
            Unobservable::ContentEncoding => "content_encoding",
            Unobservable::DecodeLimit => "decode_limit",
            Unobservable::CorruptEncoding => "corrupt_encoding",
            Unobservable::ObserverPanic => "observer_panic",
        }
    }
}

/// The decoder for a response: framing from `content_type`, decompression from
/// `content_encoding` (the header's value, if any).
pub fn response_decoder(
    dialect: Dialect,
    content_type: &str,
    content_encoding: Option<&[u8]>,
    options: DecodeOptions<'_>,
) -> Result<Box<dyn Decoder>, Unobservable> {
    let framing = framing_for(dialect, content_type).ok_or(Unobservable::ContentType)?;
    let coding = match content_encoding {
        None => None,
        Some(value) => compress::Coding::parse(value).map_err(|_| Unobservable::ContentEncoding)?,
    };
    let inner = decoder(dialect, framing, options);
    match coding {
        None => Ok(inner),
        Some(coding) => compress::Decompressing::new(coding, inner)
            .map(|d| Box::new(d) as Box<dyn Decoder>)
            .map_err(|_| Unobservable::ContentEncoding),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            (Dialect::SglangGrpc, "application/grpc", Some(Grpc)),
            (Dialect::TritonGrpc, "application/grpc+proto", Some(Grpc)),
            (Dialect::VllmGrpc, "application/grpc-web", None),
            (Dialect::TrtllmGrpc, "text/event-stream", None),
            (Dialect::OpenAiChat, "application/grpc", None),
        ];
        for (dialect, content_type, want) in cases {
            assert_eq!(framing_for(*dialect, content_type), *want, "{content_type}");
        }
    }

    #[test]
    fn response_decoders() {
        let options = DecodeOptions::new(DecodeLimits::DEFAULT);
        let ok = |ct: &str, ce: Option<&[u8]>| {
            response_decoder(Dialect::OpenAiChat, ct, ce, options).map(|_| ())
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
}
