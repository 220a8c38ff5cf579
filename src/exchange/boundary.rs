//! The exchange's panic boundary: a panic that escapes the code of one request (a bug, or
//! a value from the network that a conversion did not expect) ends that exchange the way
//! a broken upstream would, never as a silently dropped connection.
//!
//! Where it is caught, on both transports:
//! - reading the upstream's response head (`observe`): observation stops, and the
//!   upstream's answer goes to the client as sent, recorded once with its status;
//! - sending the request, until the response head ([`unwound`] around each transport's
//!   send): tokentap answers `502` and the exchange records it once
//!   ([`UpstreamFault::Internal`]), as any failure before the head;
//! - after the head was sent on (hyper's `StreamingBody`, the relay's response loop): the
//!   response breaks off (HTTP/1.1: the connection closes; h2: the stream is reset) and
//!   the request is recorded once as `upstream_error`.
//!
//! Each is logged with the request's method and path (and its access line). Tests reach
//! every stage with `observe::inject`, which exists only in test builds.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use super::fault::{ExchangeError, UpstreamFault};
use crate::supervise::panic_message;

/// Run `work` (a transport's send, up to the response head); a panic in it is the
/// exchange's [`UpstreamFault::Internal`].
///
/// Not an `async fn`: its future would hold `work` twice (as the argument and as the
/// local it is moved into when first polled), which doubled the size of every
/// connection's future and copied the whole exchange's state once more per request.
pub fn unwound<F: Future>(work: F) -> impl Future<Output = Result<F::Output, ExchangeError>> {
    AssertUnwindSafe(work).catch_unwind().map(|caught| {
        caught.map_err(|panic| UpstreamFault::Internal(panic_message(&*panic).to_string()).into())
    })
}

#[cfg(test)]
mod tests;
