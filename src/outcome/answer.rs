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
    use crate::outcome::verdict::verdict;
    use crate::outcome::{StatusClass, Verdict};
    use crate::wire::ErrorClass;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

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

    /// Every end a transport reports, with every status it can come with, has a listed
    /// verdict (`Verdict::new` asserts so in tests, the verdict rules' `debug_assert`).
    /// Here, not beside the rules in the metrics crate, because the ends are the
    /// exchange policy's fault types: the failures before a head with
    /// tokentap's answer (or none), the body ends with any upstream status.
    #[test]
    fn every_end_with_every_status_it_can_have_gets_a_listed_verdict() {
        let faults: Vec<ExchangeError> = vec![
            UpstreamFault::Connect("refused".into()).into(),
            UpstreamFault::HeadTimeout(ms(1)).into(),
            UpstreamFault::Request("reset".into()).into(),
            UpstreamFault::UnsolicitedSwitch.into(),
            ClientFault::MalformedBody("x".into()).into(),
            ClientFault::BodyTimeout(ms(1)).into(),
            ClientFault::InvalidHost(HostError::Missing).into(),
            ClientFault::RequestCoding(UnsupportedTransferCoding("gzip".into())).into(),
            // `ClientFault::ConnectMethod` is answered (`405`) but never counted: no route
            // measures a `CONNECT` (`inspect::routed_dialect`).
        ];
        let mut sent = Vec::new();
        for fault in &faults {
            let status = StatusClass::tokentap(fault.status().expect("answered"));
            assert!(!status.is_upstream());
            let v = verdict(fault.outcome(), status, None, None);
            assert_eq!(v.outcome, fault.outcome(), "{fault}");
            assert_eq!(v.status, status, "{fault}");
            sent.push(v);
        }
        // The refusals before any exchange: at the in-flight limit, and the request heads
        // a transport cannot read (`Gateway::unreadable_head`).
        sent.push(verdict(
            Outcome::Overloaded,
            StatusClass::tokentap(StatusCode::SERVICE_UNAVAILABLE),
            None,
            None,
        ));
        for code in [400, 414, 431] {
            let status = StatusClass::tokentap(StatusCode::from_u16(code).unwrap());
            sent.push(verdict(Outcome::ClientError, status, None, None));
        }
        // Each of tokentap's own statuses is one it sends: the set lists no other.
        for class in StatusClass::ALL {
            if class != StatusClass::None && !class.is_upstream() {
                assert!(
                    sent.iter().any(|v| v.status == class),
                    "{class:?} never sent"
                );
            }
        }
        assert_eq!(
            verdict(Outcome::Cancelled, StatusClass::None, None, None),
            Verdict::new(Outcome::Cancelled, StatusClass::None)
        );
        for code in 100..=599 {
            let status = StatusClass::upstream(StatusCode::from_u16(code).unwrap());
            for end in [
                BodyEnd::Clean,
                BodyEnd::UpstreamIdle,
                BodyEnd::UpstreamBroken,
                BodyEnd::ClientGone,
            ] {
                for stream_error in [None, Some(ErrorClass::Other)] {
                    let v = verdict(end.outcome(), status, stream_error, None);
                    assert_eq!(v.status, status, "{code} {end:?}");
                }
                for class in [ErrorClass::RateLimited, ErrorClass::Overloaded] {
                    verdict(end.outcome(), status, Some(class), None);
                }
                // Any gRPC status with any end and any status: a listed verdict.
                for grpc in 0..=17 {
                    for stream_error in [None, Some(ErrorClass::RateLimited)] {
                        verdict(end.outcome(), status, stream_error, Some(grpc));
                    }
                }
            }
        }
    }
}
