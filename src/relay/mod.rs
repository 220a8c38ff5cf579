//! The HTTP/1.1 fast path: tokentap reads HTTP/1.1 heads itself and relays body bytes as
//! they come, instead of going through hyper's general HTTP/1.1 machinery on both sides
//! (which costs ~4.5 us per streamed event; see docs/PERFORMANCE.md, "What limits
//! tokentap").
//!
//! It takes only what it fully understands and hands everything else to hyper, with the
//! bytes read so far, so that anything unusual is answered exactly as before. The pieces
//! here are sans-IO (bytes in, decisions out; no sockets, no clock):
//! - [`request_head`]: parse a client request head and decide: forward it (with its
//!   hop-by-hop edits and its body framing), reject it as hyper would, or hand it off.
//! - [`chunked`]: the chunked transfer coding, read strictly, telling where the data is.
//! - [`response`]: an upstream response's heads and framing, telling the observer where
//!   the body data is while every byte is relayed as it came.
//! - [`response_relay`]: the response side of one exchange as a state machine: each read
//!   in; the client's bytes, the observer's calls and the next step out.
//! - [`serialize`]: what the relay writes itself, as hyper writes the same thing.
//!
//! On a connection (with `proxy.http1_fast_path`, on by default), the [`connection`] loop
//! reads each request head, sends what it fully understands upstream ([`request_relay`])
//! on its own keep-alive [`upstream_pool`], and relays the response, watching the client
//! from the connect on ([`client_watch`]), reading and writing
//! through the worker's [`scratch`] buffers; the first request it does not take hands the
//! connection to hyper through a [`rewind`] wrapper that replays what was read. What each
//! request's life means is the [exchange policy](crate::exchange)'s, as on the hyper path.

// Values from the network pass here: nothing may panic on them (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

pub mod chunked;
pub mod client_watch;
pub mod connection;
pub mod request_head;
pub mod request_relay;
pub mod response;
pub mod response_relay;
pub mod rewind;
pub mod scratch;
pub mod serialize;
pub mod upstream_pool;

#[cfg(test)]
mod hyper_agrees;

pub use connection::{Relay, Relayed};

/// The elements of a comma-separated field value (`Connection`, `TE`, `Content-Length`),
/// each trimmed of the whitespace around it; empty elements included.
fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii)
}

/// Whether a comma-separated field value lists `token` (ASCII case-insensitive).
fn lists(value: &[u8], token: &[u8]) -> bool {
    list_elements(value).any(|element| element.eq_ignore_ascii_case(token))
}

/// One `name: value` field line of an HTTP/1.1 head, as the relay writes every one.
fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}
