//! What a gRPC call's status says went wrong. A gRPC server reports a failure in the
//! trailers (`grpc-status`, a decimal code; or in the head of a response with no body), not
//! in the messages: SGLang and TensorRT-LLM abort a failed `Generate` this way, with the
//! HTTP status still 200. The class comes from the code's canonical name by the same rule
//! as a stream's own error report ([`ErrorClass::of`]): `RESOURCE_EXHAUSTED` (8) is a rate
//! limit (`google.rpc.Code` maps it to HTTP 429, and Gemini sends it as its 429 status),
//! and `UNAVAILABLE` (14) an overload (HTTP 503).

use super::super::error_class::ErrorClass;

/// The canonical names of gRPC's status codes, by code (`OK` is 0).
const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The error a `grpc-status` value reports, or `None` for `0` (OK). A value that is not a
/// decimal code is a status tokentap cannot read: [`ErrorClass::Other`].
pub fn status_error(value: &[u8]) -> Option<ErrorClass> {
    let code = std::str::from_utf8(value.trim_ascii())
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    match code {
        Some(0) => None,
        Some(code) => Some(
            NAMES
                .get(code)
                .map_or(ErrorClass::Other, |name| ErrorClass::of(None, &[name])),
        ),
        None => Some(ErrorClass::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        let cases: [(&[u8], Option<ErrorClass>); 9] = [
            (b"0", None),
            (b" 0 ", None),
            (b"8", Some(ErrorClass::RateLimited)),
            (b"14", Some(ErrorClass::Overloaded)),
            (b"13", Some(ErrorClass::Other)),
            (b"1", Some(ErrorClass::Other)),
            (b"99", Some(ErrorClass::Other)),
            (b"", Some(ErrorClass::Other)),
            (b"ok", Some(ErrorClass::Other)),
        ];
        for (value, want) in cases {
            assert_eq!(status_error(value), want, "{value:?}");
        }
    }
}
