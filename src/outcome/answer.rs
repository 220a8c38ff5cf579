//! tokentap's answers and the outcomes of a transport's ends: what each failure before the
//! response head answers (its status) and how it is counted, how a body's end is counted,
//! and the `grpc-status` a gRPC call is told for each of tokentap's answers.
//!
//! The failures and ends are the exchange policy's types (`exchange::fault`); their
//! tables are here, beside the outcome they decide.

use http::StatusCode;

use super::Outcome;
use crate::exchange::fault::{BodyEnd, ClientFault, ExchangeError, UpstreamFault};

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

/// The `grpc-status` of tokentap's answer with HTTP status `status`: what gRPC's own
/// mapping of HTTP statuses (`doc/http-grpc-status-mapping.md` in grpc/grpc) gives, which
/// is what a client would read from the HTTP status anyway, except that tokentap's `504`
/// (no response head in time) is `DEADLINE_EXCEEDED`, the status an engine's own timeout
/// has and the one the gRPC status table counts as `timeout`, like this `504`.
pub fn grpc_status(status: StatusCode) -> u16 {
    match status.as_u16() {
        400 => 13,             // INTERNAL
        401 => 16,             // UNAUTHENTICATED
        403 => 7,              // PERMISSION_DENIED
        404 => 12,             // UNIMPLEMENTED
        429 | 502 | 503 => 14, // UNAVAILABLE
        504 => 4,              // DEADLINE_EXCEEDED
        _ => 2,                // UNKNOWN
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::intermediary::{HostError, UnsupportedTransferCoding};

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

    #[test]
    fn each_answer_status_has_its_grpc_status() {
        for (status, code) in [
            (400, 13),
            (405, 2),
            (408, 2),
            (501, 2),
            (502, 14),
            (503, 14),
            (504, 4),
        ] {
            assert_eq!(
                grpc_status(StatusCode::from_u16(status).unwrap()),
                code,
                "{status}"
            );
        }
    }
}
