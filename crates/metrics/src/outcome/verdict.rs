//! The verdict on a finished request: the transport's view of its end (an [`Outcome`],
//! from `ExchangeError::outcome` or `BodyEnd::outcome`), the class of what the client was
//! told, the error the stream reported of its own and a gRPC call's `grpc-status` give one
//! listed (outcome, status) pair. The recorder calls [`verdict`] once per request.

use super::{Outcome, StatusClass, Verdict};
use tokentap_wire::{Dialect, ErrorClass};

/// The verdict on a request the transport saw end as `end`, with `status` the class of
/// what the client was told, `stream_error` the class of the first error the stream
/// reported of its own, and `grpc_status` the code of a gRPC response's `grpc-status`. A
/// body that ended cleanly still failed when the stream said so or the status was a 5xx,
/// and was refused when the status was a 4xx; every other end stands. A stream error that
/// names a rate limit or an overload gives the status the same refusal would have had
/// before the head (`429`, `503`). A gRPC status other than `OK` and `CANCELLED` on an
/// upstream 2xx decides both labels by [`grpc_status_verdict`] (a clean end takes its
/// outcome; any other end stands, with the gRPC status class).
pub fn verdict(
    end: Outcome,
    status: StatusClass,
    stream_error: Option<ErrorClass>,
    grpc_status: Option<u32>,
) -> Verdict {
    let grpc = grpc_status
        .filter(|_| status == StatusClass::Success)
        .and_then(grpc_status_verdict);
    if let Some((outcome, class)) = grpc {
        let outcome = if end == Outcome::Completed {
            outcome
        } else {
            end
        };
        return Verdict::new(outcome, class);
    }
    let status = match (stream_error, status) {
        (Some(ErrorClass::RateLimited), s) if s.is_upstream() => StatusClass::TooManyRequests,
        (Some(ErrorClass::Overloaded), s) if s.is_upstream() => StatusClass::Unavailable,
        _ => status,
    };
    let outcome = match end {
        Outcome::Completed if stream_error.is_some() => Outcome::UpstreamError,
        Outcome::Completed => match status {
            StatusClass::Unavailable | StatusClass::ServerError => Outcome::UpstreamError,
            StatusClass::TooManyRequests | StatusClass::ClientError => Outcome::UpstreamRefused,
            _ => Outcome::Completed,
        },
        other => other,
    };
    Verdict::new(outcome, status)
}

/// gRPC's `UNKNOWN`: what an unreadable `grpc-status` is taken for, and a missing one.
pub const GRPC_UNKNOWN: u32 = 2;

/// The gRPC status a call is judged by: the one it reported; for a call of a gRPC
/// `dialect` whose whole body passed (`whole_body`) without one (no trailers, or
/// trailers without `grpc-status`), `UNKNOWN`. A gRPC client fails such a call (grpc-go
/// reports `INTERNAL`, which the table judges alike), so it is a failed call, not a
/// completed one. A call the client left before its end has no status to miss.
pub fn grpc_code(dialect: Dialect, whole_body: bool, reported: Option<u32>) -> Option<u32> {
    match reported {
        None if whole_body && dialect.is_grpc() => Some(GRPC_UNKNOWN),
        reported => reported,
    }
}

/// What a gRPC status code says of a call that ended cleanly over an HTTP 200: its
/// outcome and its status class, or `None` where the HTTP view stands (`OK` (0): as the
/// HTTP status and the stream say; `CANCELLED` (1): as the transport saw the end).
///
/// The status class is the class of the HTTP status gRPC's own mapping gives the code
/// (`google.rpc.Code`, as grpc-gateway and Google's HTTP APIs answer it), so a gRPC `429`
/// and an HTTP `429` are one series: `RESOURCE_EXHAUSTED` 429, `UNAVAILABLE` 503,
/// `INVALID_ARGUMENT`/`FAILED_PRECONDITION`/`OUT_OF_RANGE` 400, `UNAUTHENTICATED` 401,
/// `PERMISSION_DENIED` 403, `NOT_FOUND` 404, `ALREADY_EXISTS` 409, `DEADLINE_EXCEEDED`
/// 504, `UNKNOWN`/`INTERNAL`/`DATA_LOSS` 500. Two codes are classed by whose fault they
/// are rather than by that table: `UNIMPLEMENTED` (501 there) is the client calling a
/// method the engine does not have, a refusal (`4xx`); `ABORTED` (409 there) is the
/// engine aborting the request (SGLang and TensorRT-LLM abort a failed `Generate` so), an
/// error (`5xx`). A code gRPC does not define is an error (`5xx`), as `UNKNOWN`.
pub fn grpc_status_verdict(code: u32) -> Option<(Outcome, StatusClass)> {
    use StatusClass as S;
    match code {
        // OK, CANCELLED
        0 | 1 => None,
        // RESOURCE_EXHAUSTED
        8 => Some((Outcome::UpstreamRefused, S::TooManyRequests)),
        // UNAVAILABLE
        14 => Some((Outcome::UpstreamError, S::Unavailable)),
        // INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
        // FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED, UNAUTHENTICATED
        3 | 5 | 6 | 7 | 9 | 11 | 12 | 16 => Some((Outcome::UpstreamRefused, S::ClientError)),
        // DEADLINE_EXCEEDED: the engine's deadline (the client's `grpc-timeout`) ran out.
        4 => Some((Outcome::Timeout, S::ServerError)),
        // UNKNOWN, ABORTED, INTERNAL, DATA_LOSS, and any code gRPC does not define.
        _ => Some((Outcome::UpstreamError, S::ServerError)),
    }
}

/// The code of a `grpc-status` value: a value that is no decimal code is read as
/// `UNKNOWN` (2), as a gRPC client reads it.
pub fn read_grpc_status(value: &[u8]) -> u32 {
    std::str::from_utf8(value.trim_ascii())
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(GRPC_UNKNOWN)
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    #[test]
    fn a_clean_body_is_judged_by_its_status_and_its_stream() {
        let (other, rate, overload) = (
            Some(ErrorClass::Other),
            Some(ErrorClass::RateLimited),
            Some(ErrorClass::Overloaded),
        );
        let cases = [
            (200, None, "completed", "2xx"),
            (204, None, "completed", "2xx"),
            (304, None, "completed", "3xx"),
            (200, other, "upstream_error", "2xx"),
            (200, rate, "upstream_error", "429"),
            (200, overload, "upstream_error", "503"),
            (500, rate, "upstream_error", "429"),
            (400, None, "upstream_refused", "4xx"),
            (401, None, "upstream_refused", "4xx"),
            (404, None, "upstream_refused", "4xx"),
            (429, None, "upstream_refused", "429"),
            (500, None, "upstream_error", "5xx"),
            (503, None, "upstream_error", "503"),
            (529, None, "upstream_error", "503"),
        ];
        for (code, stream_error, outcome, status) in cases {
            let class = StatusClass::upstream(StatusCode::from_u16(code).unwrap());
            let v = verdict(Outcome::Completed, class, stream_error, None);
            assert_eq!(
                (v.outcome.as_str(), v.status.as_str()),
                (outcome, status),
                "{code} stream_error={stream_error:?}"
            );
        }
        // Ends other than a clean one stand whatever the status says.
        let refused = StatusClass::upstream(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            verdict(Outcome::Cancelled, refused, None, None).outcome,
            Outcome::Cancelled
        );
        assert_eq!(
            verdict(Outcome::Timeout, refused, None, None).outcome,
            Outcome::Timeout
        );
    }

    /// The gRPC status mapping, code by code: what a call that ended cleanly over HTTP
    /// 200 is counted as.
    #[test]
    fn grpc_statuses_map_to_outcome_and_status() {
        let ok = StatusClass::Success;
        let cases: [(u32, &str, &str); 18] = [
            (0, "completed", "2xx"),         // OK
            (1, "completed", "2xx"),         // CANCELLED: as the transport saw it
            (2, "upstream_error", "5xx"),    // UNKNOWN
            (3, "upstream_refused", "4xx"),  // INVALID_ARGUMENT
            (4, "timeout", "5xx"),           // DEADLINE_EXCEEDED
            (5, "upstream_refused", "4xx"),  // NOT_FOUND
            (6, "upstream_refused", "4xx"),  // ALREADY_EXISTS
            (7, "upstream_refused", "4xx"),  // PERMISSION_DENIED
            (8, "upstream_refused", "429"),  // RESOURCE_EXHAUSTED
            (9, "upstream_refused", "4xx"),  // FAILED_PRECONDITION
            (10, "upstream_error", "5xx"),   // ABORTED
            (11, "upstream_refused", "4xx"), // OUT_OF_RANGE
            (12, "upstream_refused", "4xx"), // UNIMPLEMENTED
            (13, "upstream_error", "5xx"),   // INTERNAL
            (14, "upstream_error", "503"),   // UNAVAILABLE
            (15, "upstream_error", "5xx"),   // DATA_LOSS
            (16, "upstream_refused", "4xx"), // UNAUTHENTICATED
            (99, "upstream_error", "5xx"),   // not a gRPC code
        ];
        for (code, outcome, status) in cases {
            let v = verdict(Outcome::Completed, ok, None, Some(code));
            assert_eq!(
                (v.outcome.as_str(), v.status.as_str()),
                (outcome, status),
                "grpc-status {code}"
            );
        }
        // OK defers to the stream: an error it reported still fails the call.
        let v = verdict(Outcome::Completed, ok, Some(ErrorClass::Other), Some(0));
        assert_eq!(v.outcome, Outcome::UpstreamError);
        // A gRPC status outranks the stream's own report.
        let v = verdict(Outcome::Completed, ok, Some(ErrorClass::Other), Some(8));
        assert_eq!(
            (v.outcome.as_str(), v.status.as_str()),
            ("upstream_refused", "429")
        );
        // Any other end stands, with the gRPC status class.
        let v = verdict(Outcome::Cancelled, ok, None, Some(14));
        assert_eq!(
            (v.outcome.as_str(), v.status.as_str()),
            ("cancelled", "503")
        );
        let v = verdict(Outcome::Cancelled, ok, None, Some(1));
        assert_eq!(
            (v.outcome.as_str(), v.status.as_str()),
            ("cancelled", "2xx")
        );
        // Not over a 2xx (a proxy's 503 in front of the engine): the HTTP status decides.
        let unavailable = StatusClass::upstream(StatusCode::SERVICE_UNAVAILABLE);
        let v = verdict(Outcome::Completed, unavailable, None, Some(8));
        assert_eq!(
            (v.outcome.as_str(), v.status.as_str()),
            ("upstream_error", "503")
        );
    }

    /// A gRPC call whose whole body passed without a `grpc-status` failed, as `UNKNOWN`
    /// does; one the client left before its end, or an HTTP call, has no status to miss.
    #[test]
    fn a_grpc_call_that_ends_without_a_status_failed() {
        let ok = StatusClass::Success;
        let judged = |dialect, whole_body, reported| {
            let v = verdict(
                Outcome::Completed,
                ok,
                None,
                grpc_code(dialect, whole_body, reported),
            );
            (v.outcome.as_str(), v.status.as_str())
        };
        let grpc = Dialect::SglangGrpc;
        assert_eq!(judged(grpc, true, None), ("upstream_error", "5xx"));
        assert_eq!(judged(grpc, true, Some(0)), ("completed", "2xx"));
        assert_eq!(judged(grpc, true, Some(8)), ("upstream_refused", "429"));
        // Left after the stream's end marker, before the trailers: as the end stands.
        assert_eq!(judged(grpc, false, None), ("completed", "2xx"));
        assert_eq!(
            judged(Dialect::OpenAiChat, true, None),
            ("completed", "2xx")
        );
    }
}
