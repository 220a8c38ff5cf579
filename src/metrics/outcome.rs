//! How a request ended: the `outcome` label of `tokentap_requests_total`. A leaf, shared
//! by the per-pair storage (one counter per outcome) and the encoders.

/// How a request ended. Recorded exactly once per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The response body reached its end (whatever the HTTP status below 500).
    Completed,
    /// The client went away before the end.
    Cancelled,
    /// Connect failure, reset, 5xx status, or an error reported inside the stream.
    UpstreamError,
    /// The response head or a body frame took longer than its timeout.
    Timeout,
    /// The client's own request was at fault (a malformed or stalled body, duplicate
    /// `Host`): tokentap answered 4xx itself and the upstream is not to blame.
    ClientError,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Completed,
        Outcome::Cancelled,
        Outcome::UpstreamError,
        Outcome::Timeout,
        Outcome::ClientError,
    ];

    /// The `outcome` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Timeout => "timeout",
            Outcome::ClientError => "client_error",
        }
    }
}
