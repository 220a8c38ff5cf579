//! Helpers for the dialect modules' unit tests: decode a body whole and byte by byte,
//! insist both give the same signals, and return them.

use super::frame::{ArrayStream, GrpcStream, Handler, JsonBody, NdjsonStream, SseStream};
use super::grpc::framing::MessageEncoding;
use super::types::{DecodeLimits, Decoder, Signal};

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
        || SseStream::new(handler.clone(), DecodeLimits::DEFAULT),
        body,
    )
}

pub(crate) fn ndjson<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
    run(
        || NdjsonStream::new(handler.clone(), DecodeLimits::DEFAULT),
        body,
    )
}

pub(crate) fn array<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
    run(
        || ArrayStream::new(handler.clone(), DecodeLimits::DEFAULT),
        body,
    )
}

pub(crate) fn body<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
    run(
        || JsonBody::new(handler.clone(), DecodeLimits::DEFAULT),
        body,
    )
}

pub(crate) fn grpc<H: Handler + Clone>(handler: H, body: &[u8]) -> Vec<Signal> {
    run(
        || {
            GrpcStream::new(
                handler.clone(),
                DecodeLimits::DEFAULT,
                MessageEncoding::Identity,
            )
        },
        body,
    )
}
