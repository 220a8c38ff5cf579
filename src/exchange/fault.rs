//! Why an exchange ended before the client got a response head, and whose fault it was.
//!
//! Both transports report their failures as an [`ExchangeError`]; what a failure answers
//! (its status and text) and how it is counted (its outcome) is decided here, once.

use std::time::Duration;

use http::StatusCode;

use crate::intermediary::{HostError, UnsupportedTransferCoding};
use crate::observe::Outcome;

/// A failed exchange, before any response head reached the client.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error(transparent)]
    Upstream(#[from] UpstreamFault),
    #[error(transparent)]
    Client(#[from] ClientFault),
}

/// The upstream (or the way to it) failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamFault {
    #[error("cannot connect to upstream: {0}")]
    Connect(String),
    #[error("upstream response head not received within {0:?}")]
    HeadTimeout(Duration),
    #[error("upstream request failed: {0}")]
    Request(String),
    #[error("upstream response: {0}")]
    Framing(UnsupportedTransferCoding),
    /// RFC 9110 15.2.2: a server must not switch to a protocol the client did not ask for.
    #[error("upstream answered 101 Switching Protocols to a request that asked for no upgrade")]
    UnsolicitedSwitch,
    /// tokentap itself failed (panicked) while forwarding, before the response head
    /// ([`boundary`](super::boundary)). The panic's message is logged, never answered: it
    /// may hold values of the request.
    #[error("internal error while forwarding")]
    Internal(String),
}

/// The client's request cannot be forwarded, or the client left.
#[derive(Debug, thiserror::Error)]
pub enum ClientFault {
    #[error("malformed request body: {0}")]
    MalformedBody(String),
    #[error("request body stalled: nothing arrived for {0:?}")]
    BodyTimeout(Duration),
    #[error("client went away before its response head")]
    Gone,
    #[error("invalid request: {0}")]
    InvalidHost(HostError),
    #[error("request: {0}")]
    RequestCoding(UnsupportedTransferCoding),
    #[error("CONNECT is not supported by this reverse proxy")]
    ConnectMethod,
}

impl ExchangeError {
    /// The status tokentap answers with, or `None` when the client is gone (nobody would
    /// receive an answer, so none is sent or logged).
    pub fn status(&self) -> Option<StatusCode> {
        Some(match self {
            ExchangeError::Upstream(UpstreamFault::HeadTimeout(_)) => StatusCode::GATEWAY_TIMEOUT,
            ExchangeError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ExchangeError::Client(fault) => match fault {
                ClientFault::Gone => return None,
                ClientFault::MalformedBody(_) | ClientFault::InvalidHost(_) => {
                    StatusCode::BAD_REQUEST
                }
                ClientFault::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
                // RFC 9112 6.1: a transfer coding the server does not understand.
                ClientFault::RequestCoding(_) => StatusCode::NOT_IMPLEMENTED,
                ClientFault::ConnectMethod => StatusCode::METHOD_NOT_ALLOWED,
            },
        })
    }

    /// How the request is counted: the upstream's faults as `upstream_error` or
    /// `timeout`, the client's as `client_error`, or `cancelled` when it left.
    pub fn outcome(&self) -> Outcome {
        match self {
            ExchangeError::Upstream(UpstreamFault::HeadTimeout(_)) => Outcome::Timeout,
            ExchangeError::Upstream(_) => Outcome::UpstreamError,
            ExchangeError::Client(ClientFault::Gone) => Outcome::Cancelled,
            ExchangeError::Client(_) => Outcome::ClientError,
        }
    }
}

/// How a response body that had begun reaching the client ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// The whole body was handed to the client.
    Clean,
    /// The upstream sent nothing for `upstream.idle_timeout` while tokentap waited.
    UpstreamIdle,
    /// The upstream connection broke, or its framing did, before the end.
    UpstreamBroken,
    /// The client went away before the end.
    ClientGone,
}

impl BodyEnd {
    /// The outcome a body that ended so is recorded with (a clean end of a response whose
    /// status or stream says it failed is reclassified where it is recorded).
    pub fn outcome(self) -> Outcome {
        match self {
            BodyEnd::Clean => Outcome::Completed,
            BodyEnd::UpstreamIdle => Outcome::Timeout,
            BodyEnd::UpstreamBroken => Outcome::UpstreamError,
            BodyEnd::ClientGone => Outcome::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fault_has_one_answer_and_one_outcome() {
        let coding = || UnsupportedTransferCoding("gzip".to_string());
        let cases: Vec<(ExchangeError, Option<u16>, Outcome)> = vec![
            (
                UpstreamFault::Connect("refused".into()).into(),
                Some(502),
                Outcome::UpstreamError,
            ),
            (
                UpstreamFault::HeadTimeout(Duration::from_secs(1)).into(),
                Some(504),
                Outcome::Timeout,
            ),
            (
                UpstreamFault::Request("reset".into()).into(),
                Some(502),
                Outcome::UpstreamError,
            ),
            (
                UpstreamFault::Framing(coding()).into(),
                Some(502),
                Outcome::UpstreamError,
            ),
            (
                ClientFault::MalformedBody("bad chunk".into()).into(),
                Some(400),
                Outcome::ClientError,
            ),
            (
                ClientFault::BodyTimeout(Duration::from_secs(1)).into(),
                Some(408),
                Outcome::ClientError,
            ),
            (ClientFault::Gone.into(), None, Outcome::Cancelled),
            (
                ClientFault::InvalidHost(HostError::Duplicate).into(),
                Some(400),
                Outcome::ClientError,
            ),
            (
                ClientFault::RequestCoding(coding()).into(),
                Some(501),
                Outcome::ClientError,
            ),
            (
                ClientFault::ConnectMethod.into(),
                Some(405),
                Outcome::ClientError,
            ),
        ];
        for (err, status, outcome) in cases {
            assert_eq!(err.status().map(|s| s.as_u16()), status, "{err}");
            assert_eq!(err.outcome(), outcome, "{err}");
        }
    }

    #[test]
    fn a_body_end_maps_to_one_outcome() {
        assert_eq!(BodyEnd::Clean.outcome(), Outcome::Completed);
        assert_eq!(BodyEnd::UpstreamIdle.outcome(), Outcome::Timeout);
        assert_eq!(BodyEnd::UpstreamBroken.outcome(), Outcome::UpstreamError);
        assert_eq!(BodyEnd::ClientGone.outcome(), Outcome::Cancelled);
    }
}
