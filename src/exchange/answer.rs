//! tokentap's own answers: the short text responses it sends when it cannot forward a
//! request (`503` at the in-flight limit, `502`/`504` for the upstream's failures, the
//! `4xx`/`501` of a client's bad request). Both transports send exactly these; the relay
//! serialises [`Answer::response`] itself, byte for byte as hyper's server writes it.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use super::fault::ExchangeError;

/// The message of the `503` a request gets when too many are in flight.
pub const OVERLOADED: &str = "too many requests in flight";

/// Every method tokentap forwards: all but `CONNECT`.
const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// A status and its text, as tokentap answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub message: String,
}

impl Answer {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Answer {
        Answer {
            status,
            message: message.into(),
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
    /// `Allow` header RFC 9110 15.5.6 requires).
    pub fn response<B: From<Bytes>>(&self) -> Response<B> {
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
}
