//! Framings: the five ways a response body is cut into units a dialect reads, each as a
//! [`Decoder`] around a dialect's [`Handler`].
//!
//! Most dialects differ only in what one event means, not in how events are cut: Anthropic
//! and the Responses API are typed SSE, TGI and Triton plain SSE, Ollama NDJSON, Gemini SSE
//! or a streamed JSON array, and every one of them answers non-streaming requests with one
//! JSON document; the gRPC dialects' messages are length-prefixed. So the cutting lives
//! here, once, and a dialect module only implements [`Handler`]: what to make of one
//! complete event (for gRPC, one message), and of one whole body. Split invariance then
//! only has to be proved for the framers ([`SseDecoder`], [`NdjsonDecoder`],
//! [`ArraySplitter`], [`BodyBuffer`], [`MessageReader`]), which are the only parts that
//! see frame edges.

use super::buffer::BodyBuffer;
use super::grpc::framing::{MessageEncoding, MessageReader};
use super::jsonarray::{ArraySplitter, Piece};
use super::ndjson::NdjsonDecoder;
use super::sse::{SseDecoder, SseEvent};
use super::types::{DecodeError, DecodeLimits, Decoder, Signal};

/// What a dialect makes of complete events and whole bodies.
pub(crate) trait Handler: Send {
    /// One complete streamed event: an SSE event (`name` is its `event:` type, empty when
    /// the stream named none), an NDJSON line, a JSON-array element or a gRPC message,
    /// inflated if it was compressed (`name` empty).
    /// Whitespace around `data` is the framer's; the data may still be anything.
    fn event(&mut self, name: &str, data: &[u8], out: &mut Vec<Signal>);
    /// A whole non-streaming body. Emits no [`Signal::Output`]: a body that arrives at
    /// once has no inter-token timing, only a model, usage, finish reasons and possibly
    /// an error.
    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>);
    /// The body ended cleanly, after its last event: what only the end settles (the
    /// tokens of a tokenizer's pending text). Nothing by default.
    fn finish(&mut self, _out: &mut Vec<Signal>) {}
}

/// `text/event-stream`: one [`Handler::event`] per SSE event.
pub(crate) struct SseStream<H> {
    sse: SseDecoder,
    handler: H,
}

impl<H: Handler> SseStream<H> {
    pub(crate) fn new(handler: H, limits: DecodeLimits) -> Self {
        SseStream {
            sse: SseDecoder::new(limits.max_event_bytes),
            handler,
        }
    }
}

impl<H: Handler> Decoder for SseStream<H> {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        let handler = &mut self.handler;
        self.sse.feed(bytes, &mut |event: SseEvent<'_>| {
            handler.event(event.event, event.data, out)
        })
    }

    /// A final event without its terminating blank line is discarded (SSE spec) and, if
    /// it carried data, reported as [`Signal::Malformed`].
    fn finish(&mut self, out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        if self.sse.finish() {
            out.push(Signal::Malformed);
        }
        self.handler.finish(out);
        Ok(())
    }
}

/// `application/x-ndjson`: one [`Handler::event`] per non-blank line.
pub(crate) struct NdjsonStream<H> {
    lines: NdjsonDecoder,
    handler: H,
}

impl<H: Handler> NdjsonStream<H> {
    pub(crate) fn new(handler: H, limits: DecodeLimits) -> Self {
        NdjsonStream {
            lines: NdjsonDecoder::new(limits.max_event_bytes),
            handler,
        }
    }
}

impl<H: Handler> Decoder for NdjsonStream<H> {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        let handler = &mut self.handler;
        self.lines
            .feed(bytes, &mut |line: &[u8]| handler.event("", line, out))
    }

    /// A last line without its `\n` is still a complete JSON value more often than not
    /// (servers that end the body right after the final object): it is decoded.
    fn finish(&mut self, out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        let handler = &mut self.handler;
        self.lines
            .finish(&mut |line: &[u8]| handler.event("", line, out));
        handler.finish(out);
        Ok(())
    }
}

/// A streamed JSON array (`[{...},{...}]`, Gemini without `alt=sse`): one
/// [`Handler::event`] per element. A body whose top level is an object instead is one
/// whole document for [`Handler::body`], so the same framing serves Gemini's streaming
/// and non-streaming JSON answers.
pub(crate) struct ArrayStream<H> {
    splitter: ArraySplitter,
    handler: H,
}

impl<H: Handler> ArrayStream<H> {
    pub(crate) fn new(handler: H, limits: DecodeLimits) -> Self {
        ArrayStream {
            splitter: ArraySplitter::new(limits.max_event_bytes, limits.max_body_bytes),
            handler,
        }
    }
}

impl<H: Handler> ArrayStream<H> {
    fn on_piece(handler: &mut H, piece: Piece<'_>, out: &mut Vec<Signal>) {
        match piece {
            Piece::Element(data) => handler.event("", data, out),
            Piece::Document(body) => handler.body(body, out),
            Piece::Malformed => out.push(Signal::Malformed),
        }
    }
}

impl<H: Handler> Decoder for ArrayStream<H> {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        let handler = &mut self.handler;
        self.splitter.feed(bytes, &mut |piece: Piece<'_>| {
            Self::on_piece(handler, piece, out)
        })
    }

    fn finish(&mut self, out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        let handler = &mut self.handler;
        self.splitter
            .finish(&mut |piece: Piece<'_>| Self::on_piece(handler, piece, out));
        handler.finish(out);
        Ok(())
    }
}

/// `application/json`: the body is buffered (bounded) and read once at the end.
pub(crate) struct JsonBody<H> {
    /// Visible to the dialects' tests, which check it stays within its bound.
    pub(super) body: BodyBuffer,
    handler: H,
}

impl<H: Handler> JsonBody<H> {
    pub(crate) fn new(handler: H, limits: DecodeLimits) -> Self {
        JsonBody {
            body: BodyBuffer::new(limits.max_body_bytes),
            handler,
        }
    }
}

impl<H: Handler> Decoder for JsonBody<H> {
    fn feed(&mut self, bytes: &[u8], _out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        self.body.extend(bytes)
    }

    fn finish(&mut self, out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        let body = self.body.take();
        self.handler.body(&body, out);
        self.handler.finish(out);
        Ok(())
    }
}

/// `application/grpc`: one [`Handler::event`] per length-prefixed message.
pub(crate) struct GrpcStream<H> {
    messages: MessageReader,
    handler: H,
}

impl<H: Handler> GrpcStream<H> {
    /// `encoding` is the response's `grpc-encoding`: how its compressed messages are.
    pub(crate) fn new(handler: H, limits: DecodeLimits, encoding: MessageEncoding) -> Self {
        GrpcStream {
            messages: MessageReader::new(limits.max_event_bytes, encoding),
            handler,
        }
    }
}

impl<H: Handler> Decoder for GrpcStream<H> {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        let handler = &mut self.handler;
        self.messages
            .feed(bytes, &mut |message: &[u8]| handler.event("", message, out))
    }

    /// A body that ends inside a message lost that message: [`Signal::Malformed`].
    fn finish(&mut self, out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        if self.messages.finish() {
            out.push(Signal::Malformed);
        }
        self.handler.finish(out);
        Ok(())
    }
}
