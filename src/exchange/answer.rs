//! tokentap's own answers: the short text responses it sends when it cannot forward a
//! request (`503` at the in-flight limit, `502`/`504` for the upstream's failures, the
//! `4xx`/`501` of a client's bad request). Both transports send exactly these; the relay
//! serialises [`Answer::response`] itself, byte for byte as hyper's server writes it.
//!
//! A gRPC client reads how a call ended from `grpc-status`, and an HTTP error status with
//! a text body tells it only what gRPC's HTTP mapping can guess (a `504` is `UNAVAILABLE`,
//! with no message). So a gRPC call gets the same answer as a gRPC server would send it: a
//! trailers-only response, HTTP `200`, with the status the failure stands for and
//! tokentap's message in `grpc-message`.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::fault::ExchangeError;
use crate::outcome::answer::grpc_status;

/// The message of the `503` a request gets when too many are in flight.
pub const OVERLOADED: &str = "too many requests in flight";

/// Every method tokentap forwards: all but `CONNECT`.
const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// A status and its text, as tokentap answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status of the answer, and the one it is recorded with (`tokentap_NNN`),
    /// also when it goes to a gRPC call as a `grpc-status`.
    pub status: StatusCode,
    pub message: String,
    /// The request is a gRPC call: answered as one ([`Answer::to_grpc_call`]).
    pub grpc: bool,
}

impl Answer {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Answer {
        Answer {
            status,
            message: message.into(),
            grpc: false,
        }
    }

    /// This answer in the form the request's client reads: a gRPC call's (trailers-only,
    /// `grpc-status`) when its `content-type` is gRPC's, else the text one.
    #[must_use]
    pub fn to(self, request_headers: &HeaderMap) -> Answer {
        Answer {
            grpc: is_grpc_call(request_headers),
            ..self
        }
    }

    /// The answer at the in-flight limit.
    pub fn overloaded() -> Answer {
        Answer::new(StatusCode::SERVICE_UNAVAILABLE, OVERLOADED)
    }

    /// The answer to a failed exchange, `None` when the client is gone.
    pub fn of(err: &ExchangeError) -> Option<Answer> {
        Some(Answer::new(err.status()?, err.to_string()))
    }

    /// The response: a `text/plain` body `tokentap: {message}\n` (and, for a `405`, the
    /// `Allow` header RFC 9110 15.5.6 requires); to a gRPC call, [`Answer::to_grpc_call`].
    pub fn response<B: From<Bytes>>(&self) -> Response<B> {
        if self.grpc {
            return self.to_grpc_call();
        }
        let body = Bytes::from(format!("tokentap: {}\n", self.message));
        let mut response = Response::new(B::from(body));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if self.status == StatusCode::METHOD_NOT_ALLOWED {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
        }
        response
    }

    /// A trailers-only gRPC response: HTTP `200`, `content-type: application/grpc`,
    /// `grpc-status` ([`grpc_status`]) and `grpc-message: tokentap: {message}`
    /// (percent-encoded, as gRPC requires), and no body.
    pub fn to_grpc_call<B: From<Bytes>>(&self) -> Response<B> {
        let mut response = Response::new(B::from(Bytes::new()));
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from(grpc_status(self.status)));
        let message = percent_encoded(&format!("tokentap: {}", self.message));
        if let Ok(value) = HeaderValue::from_str(&message) {
            headers.insert("grpc-message", value);
        }
        response
    }
}

/// Whether the client of a request with these headers speaks gRPC: `content-type`
/// `application/grpc`, or `application/grpc+` a codec (any case, parameters allowed).
/// Wider than [`is_grpc`](crate::observe::inspect::is_grpc), which says whose messages
/// tokentap can decode: a `+json` client cannot be measured but reads `grpc-status` all
/// the same. gRPC-Web is a protocol of its own and keeps the text answer.
pub fn is_grpc_call(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some(codec) = essence
        .get(..16)
        .filter(|head| head.eq_ignore_ascii_case("application/grpc"))
        .map(|_| &essence[16..])
    else {
        return false;
    };
    codec.is_empty() || codec.starts_with('+')
}

/// gRPC's `grpc-message` encoding: every byte outside printable ASCII, and `%`, as `%XX`.
fn percent_encoded(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).unwrap(),
        );
        headers
    }

    #[test]
    fn grpc_clients_are_told_by_their_content_type() {
        for (content_type, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC+json; charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/grpc-web+proto", false),
            ("application/grpcx", false),
            ("application/json", false),
            ("application/grp", false),
        ] {
            assert_eq!(is_grpc_call(&headers(content_type)), grpc, "{content_type}");
        }
        assert!(!is_grpc_call(&HeaderMap::new()));
    }

    #[test]
    fn a_grpc_call_gets_a_trailers_only_status_with_the_message() {
        let answer = Answer::new(StatusCode::GATEWAY_TIMEOUT, "no head in 1s: 100% late é")
            .to(&headers("application/grpc"));
        let response = answer.response::<Bytes>();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.body().is_empty());
        let h = response.headers();
        assert_eq!(h[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(h["grpc-status"], "4");
        assert_eq!(
            h["grpc-message"],
            "tokentap: no head in 1s: 100%25 late %C3%A9"
        );
        // The answer keeps its HTTP status for the records.
        assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
        let text = Answer::overloaded()
            .to(&headers("application/json"))
            .response::<Bytes>();
        assert_eq!(text.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            text.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
    }
}
