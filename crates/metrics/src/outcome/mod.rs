//! How a request ended, in one place: the `outcome` and `status` labels of
//! `tokentap_requests_total`, and every rule that decides them.
//!
//! `outcome` says what happened to the request; `status` says what the client was told
//! and who told it: the upstream's status class, or one of tokentap's own answers. Both
//! value sets are fixed, and only the pairs in [`Verdict::ALL`] exist, so the family's
//! cardinality per (model, tenant) is bounded whatever the traffic.
//!
//! The vocabulary lives in this crate because it is what the metrics are labelled with;
//! the rules that decide an outcome are beside it or in the proxy (docs/ARCHITECTURE.md,
//! "Add an outcome class"):
//!
//! - the types, [`Outcome`], [`StatusClass`] and [`Verdict`] (this file), shared by the
//!   per-pair storage (one counter per [`Verdict`]) and the encoders of this crate;
//! - [`verdict`]: the verdict on a finished request, from the transport's view of its end,
//!   the status, the stream's own error and a gRPC call's `grpc-status`;
//! - the proxy's `outcome::answer` (it names the exchange policy's fault types, which this
//!   crate cannot): what each failure before the response head answers and how it is
//!   counted, how a body's end is counted, and the `grpc-status` a gRPC call gets for
//!   tokentap's answer. The proxy re-exports this module as `tokentap::outcome`.
//!
//! The transports report what they saw (through the exchange policy) and the recorder
//! records; neither decides an outcome itself.

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

pub mod verdict;

use http::StatusCode;

/// How a request ended. Recorded exactly once per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The whole body reached the client, the status was a success (1xx-3xx), and the
    /// stream reported no error.
    Completed,
    /// The client went away before the end.
    Cancelled,
    /// The upstream failed: no connection or no readable head (tokentap's `502`), a 5xx
    /// status, a body that broke off, an error reported inside the stream, or a gRPC
    /// error status.
    UpstreamError,
    /// The upstream refused the request with a 4xx status (`429` included), or a gRPC
    /// status that says the caller is at fault (`RESOURCE_EXHAUSTED` as `429`).
    UpstreamRefused,
    /// The response head (tokentap's `504`) or a body frame took longer than its timeout,
    /// or a gRPC call ended `DEADLINE_EXCEEDED`.
    Timeout,
    /// The client's own request was at fault (a malformed head or body, a stalled body,
    /// a bad `Host`, an h2 protocol error): tokentap answered 4xx/501 itself (or reset
    /// the h2 stream) and the upstream is not to blame.
    ClientError,
    /// tokentap's own `limits.max_in_flight` was reached: it answered `503` without
    /// asking the upstream.
    Overloaded,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Completed,
        Outcome::Cancelled,
        Outcome::UpstreamError,
        Outcome::UpstreamRefused,
        Outcome::Timeout,
        Outcome::ClientError,
        Outcome::Overloaded,
    ];

    /// The `outcome` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamRefused => "upstream_refused",
            Outcome::Timeout => "timeout",
            Outcome::ClientError => "client_error",
            Outcome::Overloaded => "overloaded",
        }
    }
}

/// What the client was told: the `status` label. The upstream's statuses by class, with
/// `429` and `503` on their own (a rate limit and an overloaded engine are what an
/// operator acts on); tokentap's own answers by their exact status, prefixed `tokentap_`
/// so that a `502` tokentap sent is never mistaken for one the upstream sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatusClass {
    /// No response head reached the client.
    None,
    Informational,
    Success,
    Redirection,
    /// `429`, or a rate-limit error reported inside the stream.
    TooManyRequests,
    /// Any other 4xx.
    ClientError,
    /// `503` or `529` (Anthropic's "overloaded"), or an overloaded error reported inside
    /// the stream.
    Unavailable,
    /// Any other 5xx.
    ServerError,
    /// tokentap's own answers, each status it answers a counted request with: `400`
    /// (also an h2 stream or connection the h2 layer reset for the client's protocol
    /// error, which has no status), `408`, `414`, `431`, `501`, `502`, `503`, `504`. Its
    /// `405` goes only to `CONNECT`, which no route measures, so it is never counted.
    Tokentap400,
    Tokentap408,
    Tokentap414,
    Tokentap431,
    Tokentap501,
    Tokentap502,
    Tokentap503,
    Tokentap504,
}

impl StatusClass {
    pub const ALL: [StatusClass; 16] = [
        StatusClass::None,
        StatusClass::Informational,
        StatusClass::Success,
        StatusClass::Redirection,
        StatusClass::TooManyRequests,
        StatusClass::ClientError,
        StatusClass::Unavailable,
        StatusClass::ServerError,
        StatusClass::Tokentap400,
        StatusClass::Tokentap408,
        StatusClass::Tokentap414,
        StatusClass::Tokentap431,
        StatusClass::Tokentap501,
        StatusClass::Tokentap502,
        StatusClass::Tokentap503,
        StatusClass::Tokentap504,
    ];

    /// The class of a status the upstream sent.
    pub fn upstream(status: StatusCode) -> StatusClass {
        match status.as_u16() {
            429 => StatusClass::TooManyRequests,
            503 | 529 => StatusClass::Unavailable,
            100..=199 => StatusClass::Informational,
            200..=299 => StatusClass::Success,
            300..=399 => StatusClass::Redirection,
            400..=499 => StatusClass::ClientError,
            _ => StatusClass::ServerError,
        }
    }

    /// The class of an answer tokentap sent itself. tokentap counts no other status than
    /// these (`exchange::fault`, `Gateway::unreadable_head`, the in-flight limit; a test
    /// holds every answer to them); any other would be a bug, taken as the `400` or
    /// `502` of its side.
    pub fn tokentap(status: StatusCode) -> StatusClass {
        match status.as_u16() {
            400 => StatusClass::Tokentap400,
            408 => StatusClass::Tokentap408,
            414 => StatusClass::Tokentap414,
            431 => StatusClass::Tokentap431,
            501 => StatusClass::Tokentap501,
            502 => StatusClass::Tokentap502,
            503 => StatusClass::Tokentap503,
            504 => StatusClass::Tokentap504,
            code => {
                debug_assert!(false, "tokentap counts no answer {code}");
                if code < 500 {
                    StatusClass::Tokentap400
                } else {
                    StatusClass::Tokentap502
                }
            }
        }
    }

    /// Whether the upstream said this (a class of its status), not tokentap.
    pub const fn is_upstream(self) -> bool {
        matches!(
            self,
            StatusClass::Informational
                | StatusClass::Success
                | StatusClass::Redirection
                | StatusClass::TooManyRequests
                | StatusClass::ClientError
                | StatusClass::Unavailable
                | StatusClass::ServerError
        )
    }

    /// The `status` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            StatusClass::None => "none",
            StatusClass::Informational => "1xx",
            StatusClass::Success => "2xx",
            StatusClass::Redirection => "3xx",
            StatusClass::TooManyRequests => "429",
            StatusClass::ClientError => "4xx",
            StatusClass::Unavailable => "503",
            StatusClass::ServerError => "5xx",
            StatusClass::Tokentap400 => "tokentap_400",
            StatusClass::Tokentap408 => "tokentap_408",
            StatusClass::Tokentap414 => "tokentap_414",
            StatusClass::Tokentap431 => "tokentap_431",
            StatusClass::Tokentap501 => "tokentap_501",
            StatusClass::Tokentap502 => "tokentap_502",
            StatusClass::Tokentap503 => "tokentap_503",
            StatusClass::Tokentap504 => "tokentap_504",
        }
    }
}

/// One counted request: how it ended and what the client was told. Only the pairs in
/// [`Verdict::ALL`] exist; [`Verdict::new`] maps anything else onto them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Verdict {
    pub outcome: Outcome,
    pub status: StatusClass,
}

/// The statuses each outcome can carry. A request that failed after its head keeps the
/// upstream's status; one that failed before it carries tokentap's answer, or `none`.
const fn statuses(outcome: Outcome) -> &'static [StatusClass] {
    use StatusClass as S;
    match outcome {
        Outcome::Completed => &[S::Informational, S::Success, S::Redirection],
        Outcome::UpstreamRefused => &[S::TooManyRequests, S::ClientError],
        Outcome::Overloaded => &[S::Tokentap503],
        Outcome::ClientError => &[
            S::Tokentap400,
            S::Tokentap408,
            S::Tokentap414,
            S::Tokentap431,
            S::Tokentap501,
        ],
        Outcome::Cancelled => &[
            S::None,
            S::Informational,
            S::Success,
            S::Redirection,
            S::TooManyRequests,
            S::ClientError,
            S::Unavailable,
            S::ServerError,
        ],
        Outcome::UpstreamError => &[
            S::Informational,
            S::Success,
            S::Redirection,
            S::TooManyRequests,
            S::ClientError,
            S::Unavailable,
            S::ServerError,
            S::Tokentap502,
        ],
        Outcome::Timeout => &[
            S::Informational,
            S::Success,
            S::Redirection,
            S::TooManyRequests,
            S::ClientError,
            S::Unavailable,
            S::ServerError,
            S::Tokentap504,
        ],
    }
}

#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "evaluated at compile time (Verdict::COUNT): a bad index is a build error"
)]
const fn count_all() -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < Outcome::ALL.len() {
        n += statuses(Outcome::ALL[i]).len();
        i += 1;
    }
    n
}

impl Verdict {
    /// How many verdicts there are: the request counters a label pair holds.
    pub const COUNT: usize = count_all();

    /// A request that completed with a 2xx status: the common case.
    pub const COMPLETED: Verdict = Verdict {
        outcome: Outcome::Completed,
        status: StatusClass::Success,
    };

    /// Every verdict, each outcome's in the order `statuses()` lists them.
    #[allow(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        reason = "evaluated at compile time: a bad index is a build error"
    )]
    pub const ALL: [Verdict; Verdict::COUNT] = {
        let mut all = [Verdict {
            outcome: Outcome::Completed,
            status: StatusClass::None,
        }; Verdict::COUNT];
        let (mut i, mut n) = (0, 0);
        while i < Outcome::ALL.len() {
            let outcome = Outcome::ALL[i];
            let statuses = statuses(outcome);
            let mut j = 0;
            while j < statuses.len() {
                all[n] = Verdict {
                    outcome,
                    status: statuses[j],
                };
                n += 1;
                j += 1;
            }
            i += 1;
        }
        all
    };

    /// The verdict of `outcome` with `status`. A status the outcome cannot carry (none
    /// does, by the classification in [`verdict`]; a test holds it to that) is replaced by
    /// the outcome's nearest: tokentap's answer by the outcome's first of tokentap's, an
    /// upstream class by `none` or the outcome's first.
    pub fn new(outcome: Outcome, status: StatusClass) -> Verdict {
        let allowed = statuses(outcome);
        let status = if allowed.contains(&status) {
            status
        } else {
            debug_assert!(false, "{outcome:?} never carries {status:?}");
            *allowed
                .iter()
                .find(|s| s.is_upstream() == status.is_upstream())
                .or(allowed.first())
                .unwrap_or(&status)
        };
        Verdict { outcome, status }
    }

    /// This verdict's counter among a pair's [`Verdict::COUNT`].
    #[allow(
        clippy::expect_used,
        reason = "a typed invariant: Verdict::new makes only verdicts of Verdict::ALL"
    )]
    pub fn index(self) -> usize {
        Verdict::ALL
            .iter()
            .position(|v| *v == self)
            .expect("Verdict::new only makes listed verdicts")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_is_listed_once_with_distinct_labels() {
        let mut labels: Vec<(&str, &str)> = Verdict::ALL
            .iter()
            .map(|v| (v.outcome.as_str(), v.status.as_str()))
            .collect();
        let n = labels.len();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), n);
        for (i, verdict) in Verdict::ALL.iter().enumerate() {
            assert_eq!(verdict.index(), i);
        }
        // docs/METRICS.md states this number and lists the pairs (its test, the proxy's
        // `metrics_contract::docs_metrics_lists_every_pair`, holds the list to `statuses()`).
        assert_eq!(Verdict::COUNT, 35);
    }

    #[test]
    fn upstream_statuses_fall_in_their_class() {
        let cases = [
            (100, "1xx"),
            (101, "1xx"),
            (200, "2xx"),
            (204, "2xx"),
            (304, "3xx"),
            (400, "4xx"),
            (404, "4xx"),
            (429, "429"),
            (499, "4xx"),
            (500, "5xx"),
            (502, "5xx"),
            (503, "503"),
            (529, "503"),
            (599, "5xx"),
        ];
        for (code, label) in cases {
            let class = StatusClass::upstream(StatusCode::from_u16(code).unwrap());
            assert_eq!(class.as_str(), label, "{code}");
            assert!(class.is_upstream());
        }
    }

    #[test]
    fn tokentap_answers_keep_their_exact_status() {
        for code in [400, 408, 414, 431, 501, 502, 503, 504] {
            let class = StatusClass::tokentap(StatusCode::from_u16(code).unwrap());
            assert_eq!(class.as_str(), format!("tokentap_{code}"));
            assert!(!class.is_upstream());
        }
    }

    #[test]
    fn label_values_are_plain() {
        for verdict in Verdict::ALL {
            for value in [verdict.outcome.as_str(), verdict.status.as_str()] {
                assert!(value
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            }
        }
    }
}
