//! What both upstream transports share ([`upstream`](super::upstream)'s pooled client and
//! [`h1_upstream`](super::h1_upstream)'s connections): the request body they send and the
//! failure they report. A leaf, so that neither transport module imports the other's
//! importer.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::combinators::UnsyncBoxBody;

use super::headers::{HostError, UnsupportedTransferCoding};
use crate::observe::body::BoxError;
use crate::observe::Outcome;

/// What the upstream client sends as a request body: the client's, already wrapped by
/// whatever watches it on the way up.
pub type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// A failed exchange, before any response head reached the client: the upstream's fault
/// or, for the variants below `Framing`, the client's.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to upstream: {0}")]
    Connect(String),
    #[error("upstream response head not received within {0:?}")]
    Timeout(Duration),
    #[error("upstream request failed: {0}")]
    Request(String),
    #[error("upstream response: {0}")]
    Framing(UnsupportedTransferCoding),
    #[error("malformed request body: {0}")]
    MalformedBody(String),
    #[error("request body stalled: nothing arrived for {0:?}")]
    BodyTimeout(Duration),
    #[error("client went away before its request body ended")]
    ClientGone,
    #[error("invalid request: {0}")]
    InvalidHost(HostError),
    #[error("request: {0}")]
    RequestCoding(UnsupportedTransferCoding),
    #[error("CONNECT is not supported by this reverse proxy")]
    ConnectMethod,
}

impl UpstreamError {
    /// The status tokentap answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            UpstreamError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            UpstreamError::Connect(_) | UpstreamError::Request(_) | UpstreamError::Framing(_) => {
                StatusCode::BAD_GATEWAY
            }
            UpstreamError::MalformedBody(_)
            | UpstreamError::ClientGone
            | UpstreamError::InvalidHost(_) => StatusCode::BAD_REQUEST,
            UpstreamError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            // RFC 9112 6.1: a transfer coding the server does not understand.
            UpstreamError::RequestCoding(_) => StatusCode::NOT_IMPLEMENTED,
            UpstreamError::ConnectMethod => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// How the request is counted: the upstream's faults as `upstream_error` or
    /// `timeout`, the client's as `client_error` (or `cancelled` when it left).
    pub fn outcome(&self) -> Outcome {
        match self {
            UpstreamError::Timeout(_) => Outcome::Timeout,
            UpstreamError::Connect(_) | UpstreamError::Request(_) | UpstreamError::Framing(_) => {
                Outcome::UpstreamError
            }
            UpstreamError::ClientGone => Outcome::Cancelled,
            UpstreamError::MalformedBody(_)
            | UpstreamError::BodyTimeout(_)
            | UpstreamError::InvalidHost(_)
            | UpstreamError::RequestCoding(_)
            | UpstreamError::ConnectMethod => Outcome::ClientError,
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
