//! What both upstream transports share ([`upstream`](super::upstream)'s pooled client and
//! [`same_task`](super::same_task)'s connections): the request body they send and the
//! failure they report. A leaf, so that neither transport module imports the other's
//! importer.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::combinators::UnsyncBoxBody;

use crate::observe::BoxError;

/// What the upstream client sends as a request body: the client's, already wrapped by
/// whatever watches it on the way up.
pub type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// A failed upstream exchange, before any response head.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to upstream: {0}")]
    Connect(String),
    #[error("upstream response head not received within {0:?}")]
    Timeout(Duration),
    #[error("upstream request failed: {0}")]
    Request(String),
}

impl UpstreamError {
    /// The status tokentap answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            UpstreamError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        }
    }
}

/// An error and its causes on one line (hyper's top-level messages are terse).
pub(super) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}
