//! The rate limits an upstream reports in its response headers: what a hosted API says is
//! left of a model's quota (OpenAI's `x-ratelimit-*`, Anthropic's `anthropic-ratelimit-*`)
//! and how long a refused client should wait (`retry-after`, `retry-after-ms`).
//!
//! Read once per response head, in one pass over its fields, into a fixed set of values:
//! a header's value never becomes a label, and a resource outside the known set is
//! ignored, so the gauges these feed stay bounded whatever an upstream sends.

use std::time::{Duration, SystemTime};

use http::{header, HeaderMap, StatusCode};

use crate::metrics::{Metrics, StreamSeries};

/// What a rate limit counts, as the `resource` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
}

impl Resource {
    pub const ALL: [Resource; 4] = [
        Resource::Requests,
        Resource::Tokens,
        Resource::InputTokens,
        Resource::OutputTokens,
    ];

    /// The `resource` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Resource::Requests => "requests",
            Resource::Tokens => "tokens",
            Resource::InputTokens => "input_tokens",
            Resource::OutputTokens => "output_tokens",
        }
    }

    /// The resource a header names (`requests`, `tokens`, `input-tokens`, ...).
    fn named(name: &str) -> Option<Resource> {
        Some(match name {
            "requests" => Resource::Requests,
            "tokens" => Resource::Tokens,
            "input-tokens" => Resource::InputTokens,
            "output-tokens" => Resource::OutputTokens,
            _ => return None,
        })
    }
}

/// One resource's quota as the upstream reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
}

/// The rate limits one response reported; indexed like [`Resource::ALL`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateLimits {
    pub quotas: [Quota; 4],
    /// How long the upstream asked a refused client to wait.
    pub retry_after: Option<Duration>,
}

impl RateLimits {
    /// The rate limits in a response head with `status`, `None` when it reports none
    /// (most responses of a self-hosted engine). `Retry-After` is read on a `429` or `503`
    /// only, where RFC 9110 10.2.3 gives it this meaning; an HTTP date in it is counted
    /// from `now()`, which is read only then (the clock is not read per response).
    pub fn read(
        status: StatusCode,
        headers: &HeaderMap,
        now: impl FnOnce() -> SystemTime,
    ) -> Option<RateLimits> {
        let mut limits = RateLimits::default();
        let mut found = false;
        for (name, value) in headers {
            let name = name.as_str();
            let (resource, field) = if let Some(rest) = name.strip_prefix("x-ratelimit-") {
                // OpenAI: x-ratelimit-{limit,remaining}-{requests,tokens}
                let Some((field, resource)) = rest.split_once('-') else {
                    continue;
                };
                (resource, field)
            } else if let Some(rest) = name.strip_prefix("anthropic-ratelimit-") {
                // Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,...}-{limit,remaining}
                let Some((resource, field)) = rest.rsplit_once('-') else {
                    continue;
                };
                (resource, field)
            } else {
                continue;
            };
            let Some(resource) = Resource::named(resource) else {
                continue;
            };
            let Some(n) = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
            else {
                continue;
            };
            let Some(quota) = limits.quotas.get_mut(resource as usize) else {
                continue;
            };
            match field {
                "limit" => quota.limit = Some(n),
                "remaining" => quota.remaining = Some(n),
                _ => continue,
            }
            found = true;
        }
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            limits.retry_after = retry_after(headers, now);
            found |= limits.retry_after.is_some();
        }
        found.then_some(limits)
    }

    /// Set the gauges of `stream`'s model to what these limits say (each value only where
    /// reported).
    pub fn record(&self, metrics: &Metrics, stream: &StreamSeries) {
        for (resource, quota) in Resource::ALL.iter().zip(self.quotas) {
            metrics.upstream_quota(stream, resource.as_str(), quota.limit, quota.remaining);
        }
        if let Some(wait) = self.retry_after {
            metrics.upstream_retry_after(stream, wait);
        }
    }
}

/// The longest wait a `Retry-After` (or `retry-after-ms`) is read as. A longer one says
/// "not soon" as well as this does, and past it a hostile value (`1e308` ms, `u64::MAX`
/// seconds) would overflow what it is converted to: a `Duration`, an `Instant` after it,
/// the `tokentap_upstream_retry_after_seconds` gauge.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// `Retry-After` in its delay-seconds form, at most [`MAX_RETRY_AFTER`] (the OTLP
/// exporters read a collector's with this too).
pub fn delay_seconds(value: &str) -> Option<Duration> {
    let seconds = value.trim().parse::<u64>().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// `retry-after-ms` (OpenAI's, finer) or else `Retry-After`: delay-seconds or an HTTP date;
/// at most [`MAX_RETRY_AFTER`].
fn retry_after(headers: &HeaderMap, now: impl FnOnce() -> SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            // Only a wait past `Duration::MAX` fails to convert, and that is past the cap.
            let wait = Duration::try_from_secs_f64(ms / 1e3).unwrap_or(MAX_RETRY_AFTER);
            return Some(wait.min(MAX_RETRY_AFTER));
        }
    }
    let value = text(header::RETRY_AFTER.as_str())?;
    if let Some(wait) = delay_seconds(value) {
        return Some(wait);
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let wait = date.duration_since(now()).unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(lines: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn quota(limits: &RateLimits, resource: Resource) -> (Option<u64>, Option<u64>) {
        let q = limits.quotas[resource as usize];
        (q.limit, q.remaining)
    }

    #[test]
    fn openai_and_anthropic_headers_fill_their_resources() {
        let now = SystemTime::UNIX_EPOCH;
        let openai = headers(&[
            ("x-ratelimit-limit-requests", "10000"),
            ("x-ratelimit-remaining-requests", "9999"),
            ("x-ratelimit-reset-requests", "6ms"),
            ("x-ratelimit-limit-tokens", "2000000"),
            ("x-ratelimit-remaining-tokens", " 1999000 "),
        ]);
        let limits = RateLimits::read(StatusCode::OK, &openai, || now).expect("reported");
        assert_eq!(
            quota(&limits, Resource::Requests),
            (Some(10000), Some(9999))
        );
        assert_eq!(
            quota(&limits, Resource::Tokens),
            (Some(2000000), Some(1999000))
        );
        assert_eq!(limits.retry_after, None);

        let anthropic = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-12-03T12:00:00Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "12000"),
            ("anthropic-ratelimit-output-tokens-remaining", "800"),
            ("retry-after", "7"),
        ]);
        let limits =
            RateLimits::read(StatusCode::TOO_MANY_REQUESTS, &anthropic, || now).expect("reported");
        assert_eq!(quota(&limits, Resource::Requests), (Some(50), Some(0)));
        assert_eq!(
            quota(&limits, Resource::InputTokens),
            (Some(40000), Some(12000))
        );
        assert_eq!(quota(&limits, Resource::OutputTokens), (None, Some(800)));
        assert_eq!(quota(&limits, Resource::Tokens), (None, None));
        assert_eq!(limits.retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn retry_after_is_read_on_refusals_only_in_each_form() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        type Case<'a> = (StatusCode, Vec<(&'a str, &'a str)>, Option<Duration>);
        let cases: [Case<'_>; 6] = [
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "20")],
                Some(Duration::from_secs(20)),
            ),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                vec![("retry-after", &date)],
                Some(Duration::from_secs(30)),
            ),
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "20"), ("retry-after-ms", "1500")],
                Some(Duration::from_millis(1500)),
            ),
            (StatusCode::OK, vec![("retry-after", "20")], None),
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "soon")],
                None,
            ),
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "-3")],
                None,
            ),
        ];
        for (status, lines, expected) in cases {
            let got =
                RateLimits::read(status, &headers(&lines), || now).and_then(|l| l.retry_after);
            assert_eq!(got, expected, "{status} {lines:?}");
        }
    }

    /// A hostile wait (past what a `Duration` holds, or just absurd) is read as the cap,
    /// never a panic: `1e308` ms once panicked the connection task.
    #[test]
    fn hostile_waits_are_read_as_the_cap() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let far = httpdate::fmt_http_date(now + Duration::from_secs(400 * 24 * 3600));
        let cases: [(StatusCode, &str, &str); 7] = [
            (StatusCode::TOO_MANY_REQUESTS, "retry-after-ms", "1e308"),
            (StatusCode::SERVICE_UNAVAILABLE, "retry-after-ms", "1e308"),
            (
                StatusCode::TOO_MANY_REQUESTS,
                "retry-after-ms",
                "18446744073709551615000",
            ),
            (StatusCode::TOO_MANY_REQUESTS, "retry-after-ms", "86400001"),
            (
                StatusCode::TOO_MANY_REQUESTS,
                "retry-after",
                "18446744073709551615",
            ),
            (StatusCode::SERVICE_UNAVAILABLE, "retry-after", "86401"),
            (StatusCode::TOO_MANY_REQUESTS, "retry-after", &far),
        ];
        for (status, name, value) in cases {
            let got = RateLimits::read(status, &headers(&[(name, value)]), || now)
                .and_then(|l| l.retry_after);
            assert_eq!(got, Some(MAX_RETRY_AFTER), "{status} {name}: {value}");
        }
        for value in ["inf", "NaN", "-1", "-0.5"] {
            let lines = [("retry-after-ms", value), ("retry-after", "3")];
            let got = RateLimits::read(StatusCode::TOO_MANY_REQUESTS, &headers(&lines), || now)
                .and_then(|l| l.retry_after);
            assert_eq!(got, Some(Duration::from_secs(3)), "retry-after-ms: {value}");
        }
        assert_eq!(delay_seconds(" 86400 "), Some(MAX_RETRY_AFTER));
        assert_eq!(delay_seconds("12"), Some(Duration::from_secs(12)));
        assert_eq!(delay_seconds("1.5"), None);
    }

    #[test]
    fn what_is_not_a_known_quota_is_ignored() {
        let now = SystemTime::UNIX_EPOCH;
        let odd = headers(&[
            ("x-ratelimit-limit-images", "5"),
            ("x-ratelimit-remaining-requests", "many"),
            ("x-ratelimit-remaining-requests", "-1"),
            ("x-ratelimit-requests", "5"),
            ("anthropic-ratelimit-requests-reset", "2026-12-03T12:00:00Z"),
            ("anthropic-ratelimit-priority-input-tokens-limit", "9"),
            ("x-ratelimit-remaining-tokens", "18446744073709551616"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(RateLimits::read(StatusCode::OK, &odd, || now), None);
        assert_eq!(
            RateLimits::read(StatusCode::OK, &HeaderMap::new(), || now),
            None
        );
    }
}
