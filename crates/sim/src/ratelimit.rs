//! The simulator's rate limit ([`RateLimit`], off by default): hosted APIs refuse a
//! caller past its requests or tokens per minute with a 429, and say in every answer
//! how much of each budget is left, so tokentap and the alerts built on it can be run
//! against a provider that does this with a known limit.
//!
//! Each budget is a token bucket that holds a minute's worth and refills continuously;
//! both are shared by all the simulator's models, as one API key's limit would be. A
//! request costs one request and the output tokens its response will have; a request
//! either budget cannot cover is refused and costs nothing. Only the hosted APIs are
//! limited, each as it really does it:
//!
//! | paths | headers on every answer | 429 body |
//! |---|---|---|
//! | `/v1/chat/completions`, `/v1/completions`, `/v1/responses` | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the reset as a duration (`1s`, `6m0s`, `120ms`) | `{"error": {"type": "requests" or "tokens", "code": "rate_limit_exceeded", ...}}` |
//! | `/v1/messages` | `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`, the reset as an RFC 3339 time | `{"type": "error", "error": {"type": "rate_limit_error", ...}}` |
//! | Gemini | none (Gemini sends none) | `{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", ...}}` |
//!
//! "Remaining" counts what is left after this request, "reset" when the bucket is full
//! again. A 429 also carries `Retry-After`: whole seconds until the request would fit.
//! Ollama, TGI and Triton are self-hosted servers with no such limit and are never
//! limited. The limiter takes instants and renders text: the request handling brings
//! the clocks and the response.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::json;
use tokio::time::Instant;

use super::config::RateLimit;
use super::render::{rfc3339, Api};

/// Nanoseconds in a minute: a bucket's level is kept in units of 1/`MINUTE` of a request
/// (or token), so that refilling `capacity` per minute adds exactly `capacity` per
/// nanosecond, in whole numbers.
const MINUTE: u128 = 60_000_000_000;

/// A bucket of `capacity` that refills `capacity` per minute, continuously.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    capacity: u128,
    /// What it holds, in 1/`MINUTE` units.
    level: u128,
    at: Instant,
}

impl Bucket {
    fn full(capacity: u32, now: Instant) -> Bucket {
        let capacity = u128::from(capacity.max(1));
        Bucket {
            capacity,
            level: capacity * MINUTE,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        self.level = (self.level + elapsed * self.capacity).min(self.capacity * MINUTE);
        self.at = self.at.max(now);
    }

    /// How long until it holds `amount` (at most its capacity).
    fn wait_for(&self, amount: u128) -> Duration {
        let missing = (amount.min(self.capacity) * MINUTE).saturating_sub(self.level);
        let nanos = missing.div_ceil(self.capacity);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn take(&mut self, amount: u128) {
        self.level -= amount.min(self.capacity) * MINUTE;
    }

    fn quota(&self) -> Quota {
        let whole = |units: u128| u64::try_from(units).unwrap_or(u64::MAX);
        Quota {
            limit: whole(self.capacity),
            remaining: whole(self.level / MINUTE),
            reset: self.wait_for(self.capacity),
        }
    }
}

/// One budget as the headers state it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Quota {
    pub(super) limit: u64,
    /// Whole units left.
    pub(super) remaining: u64,
    /// Until the bucket is full again.
    pub(super) reset: Duration,
}

/// Both budgets, after a request was admitted or refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Budgets {
    pub(super) requests: Quota,
    pub(super) tokens: Quota,
}

/// Which budget a refused request could not get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Exhausted {
    Requests,
    Tokens,
}

/// A refused request: the budgets, which one was short, and how long until it fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) budgets: Budgets,
    pub(super) exhausted: Exhausted,
    /// Output tokens the request would have cost.
    pub(super) cost: u32,
    pub(super) retry_after: Duration,
}

/// The simulator's two buckets.
#[derive(Debug)]
pub(super) struct Limiter {
    requests: Bucket,
    tokens: Bucket,
}

impl Limiter {
    /// Full buckets at `now` (a limit of 0 is taken as 1).
    pub(super) fn new(limit: RateLimit, now: Instant) -> Limiter {
        Limiter {
            requests: Bucket::full(limit.requests_per_minute, now),
            tokens: Bucket::full(limit.tokens_per_minute, now),
        }
    }

    /// Admit a request at `now` whose response will have `tokens` output tokens, taking
    /// them from the budgets, or refuse it. A request larger than the whole token budget
    /// is admitted once the bucket is full, so that no request waits forever.
    pub(super) fn admit(&mut self, now: Instant, tokens: u32) -> Result<Budgets, Refusal> {
        self.requests.refill(now);
        self.tokens.refill(now);
        let wait_requests = self.requests.wait_for(1);
        let wait_tokens = self.tokens.wait_for(u128::from(tokens));
        if wait_requests.is_zero() && wait_tokens.is_zero() {
            self.requests.take(1);
            self.tokens.take(u128::from(tokens));
            return Ok(self.budgets());
        }
        Err(Refusal {
            budgets: self.budgets(),
            exhausted: if wait_requests >= wait_tokens {
                Exhausted::Requests
            } else {
                Exhausted::Tokens
            },
            cost: tokens,
            retry_after: wait_requests.max(wait_tokens),
        })
    }

    fn budgets(&self) -> Budgets {
        Budgets {
            requests: self.requests.quota(),
            tokens: self.tokens.quota(),
        }
    }
}

/// Whether requests of `api` are rate limited (the hosted APIs').
pub(super) const fn applies(api: Api) -> bool {
    matches!(
        api,
        Api::Chat | Api::Completions | Api::Responses | Api::Anthropic | Api::Gemini { .. }
    )
}

/// The rate-limit headers `api` answers with, given the budgets and the wall-clock time
/// `now` (Anthropic states resets as times).
pub(super) fn headers(api: Api, budgets: &Budgets, now: SystemTime) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let mut put = |name: String, value: String| {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            headers.insert(name, value);
        }
    };
    let budgets = [("requests", budgets.requests), ("tokens", budgets.tokens)];
    match api {
        Api::Chat | Api::Completions | Api::Responses => {
            for (what, quota) in budgets {
                put(format!("x-ratelimit-limit-{what}"), quota.limit.to_string());
                put(
                    format!("x-ratelimit-remaining-{what}"),
                    quota.remaining.to_string(),
                );
                put(
                    format!("x-ratelimit-reset-{what}"),
                    go_duration(quota.reset),
                );
            }
        }
        Api::Anthropic => {
            for (what, quota) in budgets {
                let prefix = format!("anthropic-ratelimit-{what}");
                put(format!("{prefix}-limit"), quota.limit.to_string());
                put(format!("{prefix}-remaining"), quota.remaining.to_string());
                put(format!("{prefix}-reset"), reset_time(now, quota.reset));
            }
        }
        _ => {}
    }
    headers
}

/// `Retry-After` for a refusal: whole seconds, rounded up, at least 1.
pub(super) fn retry_after(refusal: &Refusal) -> HeaderValue {
    let secs = refusal.retry_after.as_secs() + u64::from(refusal.retry_after.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

/// The body of the 429 that refuses a request for `model`, in `api`'s own shape.
pub(super) fn refusal_body(api: Api, model: &str, refusal: &Refusal) -> String {
    let (what, unit, quota, requested) = match refusal.exhausted {
        Exhausted::Requests => ("requests", "RPM", refusal.budgets.requests, 1),
        Exhausted::Tokens => ("tokens", "TPM", refusal.budgets.tokens, refusal.cost),
    };
    let used = quota.limit - quota.remaining;
    match api {
        Api::Anthropic => {
            let per_minute = if what == "requests" {
                "requests"
            } else {
                "output tokens"
            };
            json!({"type": "error", "error": {
                "type": "rate_limit_error",
                "message": format!("This request would exceed the rate limit for your organization of {} {per_minute} per minute. Please try again later.", quota.limit),
            }})
        }
        Api::Gemini { .. } => json!({"error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }}),
        _ => json!({"error": {
            "message": format!(
                "Rate limit reached for {model} in organization org-sim on {what} per min ({unit}): Limit {}, Used {used}, Requested {requested}. Please try again in {}.",
                quota.limit,
                go_duration(refusal.retry_after),
            ),
            "type": what,
            "param": null,
            "code": "rate_limit_exceeded",
        }}),
    }
    .to_string()
}

/// A duration as OpenAI's reset headers write it (Go's format, to the millisecond,
/// rounded up): `120ms`, `1s`, `8.64s`, `6m0s`, `1h0m0s`.
fn go_duration(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m) = (ms / 3_600_000, ms / 60_000 % 60);
    let (s, frac) = (ms / 1000 % 60, ms % 1000);
    let seconds = if frac == 0 {
        format!("{s}s")
    } else {
        let frac = format!("{frac:03}");
        format!("{s}.{}s", frac.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

/// The RFC 3339 time `reset` after `now`, to the second, rounded up.
fn reset_time(now: SystemTime, reset: Duration) -> String {
    let at = now.duration_since(UNIX_EPOCH).unwrap_or_default() + reset;
    rfc3339(at.as_secs() + u64::from(at.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn remaining(budgets: Budgets) -> (u64, u64) {
        (budgets.requests.remaining, budgets.tokens.remaining)
    }

    #[test]
    fn requests_run_out_and_refill_continuously() {
        let t0 = Instant::now();
        let limit = RateLimit {
            requests_per_minute: 3,
            tokens_per_minute: 1000,
        };
        let mut limiter = Limiter::new(limit, t0);
        assert_eq!(remaining(limiter.admit(t0, 10).unwrap()), (2, 990));
        assert_eq!(remaining(limiter.admit(t0, 10).unwrap()), (1, 980));
        let last = limiter.admit(t0, 10).unwrap();
        assert_eq!(remaining(last), (0, 970));
        assert_eq!(
            last.requests.reset,
            s(60),
            "three requests refill in a minute"
        );
        assert_eq!(last.tokens.reset, Duration::from_millis(1800));

        let refused = limiter.admit(t0 + s(5), 10).unwrap_err();
        assert_eq!(refused.exhausted, Exhausted::Requests);
        assert_eq!(refused.retry_after, s(15), "one request refills every 20 s");
        assert_eq!(
            remaining(refused.budgets),
            (0, 1000),
            "a refusal costs nothing"
        );
        assert_eq!(retry_after(&refused), "15");

        let again = limiter.admit(t0 + s(20), 10).unwrap();
        assert_eq!(remaining(again), (0, 990));
        assert_eq!(again.requests.reset, s(60));
        // Refilled, never past the capacity.
        assert_eq!(remaining(limiter.admit(t0 + s(600), 10).unwrap()), (2, 990));
    }

    #[test]
    fn tokens_run_out_too() {
        let t0 = Instant::now();
        let limit = RateLimit {
            requests_per_minute: 100,
            tokens_per_minute: 60,
        };
        let mut limiter = Limiter::new(limit, t0);
        assert_eq!(remaining(limiter.admit(t0, 40).unwrap()), (99, 20));
        let refused = limiter.admit(t0, 40).unwrap_err();
        assert_eq!(refused.exhausted, Exhausted::Tokens);
        assert_eq!(refused.retry_after, s(20), "one token per second");
        let body = refusal_body(Api::Chat, "m", &refused);
        assert!(body.contains(r#""type":"tokens""#), "{body}");
        assert!(body.contains("on tokens per min (TPM): Limit 60, Used 40, Requested 40. Please try again in 20s."), "{body}");
        // A request larger than the whole budget waits for a full bucket, not forever.
        let mut limiter = Limiter::new(limit, t0);
        assert_eq!(remaining(limiter.admit(t0, 500).unwrap()), (99, 0));
        assert_eq!(limiter.admit(t0, 500).unwrap_err().retry_after, s(60));
        assert!(limiter.admit(t0 + s(60), 500).is_ok());
        // A sub-second wait still says to retry in a second.
        let mut limiter = Limiter::new(limit, t0);
        limiter.admit(t0, 60).unwrap();
        let refused = limiter
            .admit(t0 + Duration::from_millis(500), 1)
            .unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_millis(500));
        assert_eq!(retry_after(&refused), "1");
    }

    #[test]
    fn each_hosted_api_states_its_budgets_its_own_way() {
        let budgets = Budgets {
            requests: Quota {
                limit: 3,
                remaining: 2,
                reset: s(20),
            },
            tokens: Quota {
                limit: 1000,
                remaining: 960,
                reset: Duration::from_millis(2400),
            },
        };
        let now = UNIX_EPOCH + Duration::from_secs(1_704_067_200); // 2024-01-01T00:00:00Z
        let openai = headers(Api::Responses, &budgets, now);
        let want = [
            ("x-ratelimit-limit-requests", "3"),
            ("x-ratelimit-remaining-requests", "2"),
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-remaining-tokens", "960"),
            ("x-ratelimit-reset-tokens", "2.4s"),
        ];
        for (name, value) in want {
            assert_eq!(openai[name], value, "{name}");
        }
        assert_eq!(openai.len(), want.len());
        let anthropic = headers(Api::Anthropic, &budgets, now);
        let want = [
            ("anthropic-ratelimit-requests-limit", "3"),
            ("anthropic-ratelimit-requests-remaining", "2"),
            ("anthropic-ratelimit-requests-reset", "2024-01-01T00:00:20Z"),
            ("anthropic-ratelimit-tokens-limit", "1000"),
            ("anthropic-ratelimit-tokens-remaining", "960"),
            ("anthropic-ratelimit-tokens-reset", "2024-01-01T00:00:03Z"),
        ];
        for (name, value) in want {
            assert_eq!(anthropic[name], value, "{name}");
        }
        assert_eq!(anthropic.len(), want.len());
        assert!(headers(Api::Gemini { sse: true }, &budgets, now).is_empty());
        assert!(
            !applies(Api::Tgi) && !applies(Api::Ollama { chat: true }) && !applies(Api::Triton)
        );
    }

    #[test]
    fn refusals_take_each_dialects_shape() {
        let t0 = Instant::now();
        let limit = RateLimit {
            requests_per_minute: 1,
            tokens_per_minute: 100,
        };
        let mut limiter = Limiter::new(limit, t0);
        limiter.admit(t0, 1).unwrap();
        let refused = limiter.admit(t0, 1).unwrap_err();
        let body = |api| {
            serde_json::from_str::<serde_json::Value>(&refusal_body(api, "m", &refused)).unwrap()
        };
        let openai = body(Api::Chat);
        assert_eq!(openai["error"]["type"], "requests");
        assert_eq!(openai["error"]["code"], "rate_limit_exceeded");
        assert_eq!(
            openai["error"]["message"],
            "Rate limit reached for m in organization org-sim on requests per min (RPM): Limit 1, Used 1, Requested 1. Please try again in 1m0s."
        );
        let anthropic = body(Api::Anthropic);
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "rate_limit_error");
        let gemini = body(Api::Gemini { sse: false });
        assert_eq!(gemini["error"]["code"], 429);
        assert_eq!(gemini["error"]["status"], "RESOURCE_EXHAUSTED");
    }

    #[test]
    fn durations_in_openais_format() {
        let ms = Duration::from_millis;
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ms"),
            (ms(120), "120ms"),
            (ms(1000), "1s"),
            (ms(8640), "8.64s"),
            (ms(60_500), "1m0.5s"),
            (s(360), "6m0s"),
            (s(3600), "1h0m0s"),
            (s(3725), "1h2m5s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }
}
