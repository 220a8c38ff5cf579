//! What a stream's own error report names as the cause ([`ErrorClass`]), by one rule for
//! every dialect ([`ErrorClass::of`]).
//!
//! An error reported inside a 200 response is an `upstream_error` whatever it says, but a
//! rate limit and an overload call for different answers (slow the callers down, or add
//! capacity), so the decoders say which one a report names, when it names one. Each
//! dialect module reads the fields its shape carries, and only once an event is known to
//! be an error, so the token path parses nothing more; this module alone says what those
//! fields mean.
//!
//! The rule, given a numeric code and the names a report carries (`type`, `code`,
//! `status`, `error_type` strings; the most specific first, as each dialect orders them):
//!
//! 1. The first name that is one of the names below decides (ASCII case ignored).
//! 2. Otherwise the numeric code: 429 is [`ErrorClass::RateLimited`], 503 and 529 are
//!    [`ErrorClass::Overloaded`]. A name made only of digits counts as a numeric code
//!    (Azure OpenAI writes `"code": "429"`).
//! 3. Otherwise [`ErrorClass::Other`].
//!
//! | name | class | sent by |
//! |---|---|---|
//! | `rate_limit_exceeded` | rate limited | OpenAI `error.code` (429), Responses `error` events and `response.failed` |
//! | `rate_limit_error` | rate limited | Anthropic `error.type` (429) |
//! | `resource_exhausted` | rate limited | Gemini / Vertex `error.status` (429); gRPC status 8 (`wire::grpc::status`) |
//! | `insufficient_quota` | rate limited | OpenAI `error.type` / `code` (429, quota or billing) |
//! | `too_many_requests` | rate limited | OpenAI-compatible gateways |
//! | `overloaded_error` | overloaded | Anthropic `error.type` (529) |
//! | `overloaded` | overloaded | TGI `error_type` ("Model is overloaded", sent with 429) |
//! | `unavailable` | overloaded | Gemini / Vertex `error.status` (503, "The model is overloaded"); gRPC status 14 |
//! | `server_is_overloaded` | overloaded | OpenAI `error.code` (503), Responses `response.failed` |
//! | `service_unavailable_error` | overloaded | OpenAI `error.type` (503) |
//! | `slow_down` | overloaded | OpenAI `error.code` (503: "a sudden increase in your request rate") |
//! | `engine_overloaded`, `server_overloaded` | overloaded | older OpenAI and OpenAI-compatible servers |
//!
//! A name decides before a number because a name is what the server means, while a number
//! mirrors an HTTP status that servers reuse: TGI sends its overload as a 429.
//!
//! `insufficient_quota` is a rate limit: it is the provider refusing the caller's usage,
//! sent as a 429, not the provider short of capacity; and Gemini reports an exhausted
//! per-minute limit and an exhausted daily or billing quota as the same
//! `RESOURCE_EXHAUSTED`, so a class that set quotas apart could not be told alike for
//! every dialect. (The class does not say whether retrying helps.)
//!
//! Free text is never read: an error that is only a message (Ollama's and Triton's plain
//! strings, an OpenAI `server_error`) is [`ErrorClass::Other`].

/// What a stream's own error report says went wrong, as far as it names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The provider refused the caller's rate or quota.
    RateLimited,
    /// The provider or engine was short of capacity.
    Overloaded,
    /// Anything else, or nothing named.
    Other,
}

const RATE_LIMITED: [&str; 5] = [
    "rate_limit_exceeded",
    "rate_limit_error",
    "resource_exhausted",
    "insufficient_quota",
    "too_many_requests",
];

const OVERLOADED: [&str; 8] = [
    "overloaded_error",
    "overloaded",
    "unavailable",
    "server_is_overloaded",
    "service_unavailable_error",
    "slow_down",
    "engine_overloaded",
    "server_overloaded",
];

impl ErrorClass {
    /// The class of an error report with numeric code `code` and these `names` (most
    /// specific first; an empty name is no name), by the rule in the module docs.
    pub fn of(code: Option<i64>, names: &[&str]) -> ErrorClass {
        let is = |list: &[&str], name: &str| list.iter().any(|n| n.eq_ignore_ascii_case(name));
        for name in names {
            if is(&RATE_LIMITED, name) {
                return ErrorClass::RateLimited;
            }
            if is(&OVERLOADED, name) {
                return ErrorClass::Overloaded;
            }
        }
        let digits = |name: &str| !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
        let code = code.or_else(|| names.iter().find(|n| digits(n))?.parse().ok());
        match code {
            Some(429) => ErrorClass::RateLimited,
            Some(503 | 529) => ErrorClass::Overloaded,
            _ => ErrorClass::Other,
        }
    }

    /// Stable lower-case name, for logs, metric labels and test goldens.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Overloaded => "overloaded",
            ErrorClass::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorClass::{self, Other, Overloaded, RateLimited};
    use crate::{decoder, DecodeLimits, DecodeOptions, Dialect, Framing, Signal};

    #[test]
    fn names_then_numbers() {
        let cases: &[(Option<i64>, &[&str], ErrorClass)] = &[
            (None, &["rate_limit_exceeded", "requests"], RateLimited),
            (None, &["RESOURCE_EXHAUSTED"], RateLimited),
            (None, &["Rate_Limit_Error"], RateLimited),
            (None, &["insufficient_quota"], RateLimited),
            (None, &["", "too_many_requests"], RateLimited),
            (None, &["overloaded_error"], Overloaded),
            (None, &["UNAVAILABLE"], Overloaded),
            (
                None,
                &["server_is_overloaded", "service_unavailable_error"],
                Overloaded,
            ),
            (None, &["slow_down"], Overloaded),
            (None, &["engine_overloaded"], Overloaded),
            (None, &["server_overloaded"], Overloaded),
            (Some(429), &[], RateLimited),
            (Some(503), &[], Overloaded),
            (Some(529), &["api_error"], Overloaded),
            (Some(500), &["INTERNAL"], Other),
            (Some(400), &["BadRequestError"], Other),
            (None, &["429"], RateLimited),
            (None, &["503"], Overloaded),
            // A name decides before the number (TGI's overload comes as a 429).
            (Some(429), &["overloaded"], Overloaded),
            (Some(503), &["rate_limit_exceeded"], RateLimited),
            // The first known name wins.
            (None, &["server_overloaded", "rate_limit_error"], Overloaded),
            // Not names, and no guessing from near misses or free text.
            (
                None,
                &["server_error", "Overloaded!", "rate limit reached"],
                Other,
            ),
            (None, &["4 29", "-429", ""], Other),
            (None, &[], Other),
        ];
        for (code, names, want) in cases {
            assert_eq!(ErrorClass::of(*code, names), *want, "{code:?} {names:?}");
        }
    }

    /// The error classes of `body` decoded as `dialect` in `framing`.
    fn classes(dialect: Dialect, framing: Framing, body: &str) -> Vec<ErrorClass> {
        let mut decoder = decoder(dialect, framing, DecodeOptions::new(DecodeLimits::DEFAULT));
        let mut out = Vec::new();
        decoder.feed(body.as_bytes(), &mut out).unwrap();
        decoder.finish(&mut out).unwrap();
        out.iter()
            .filter_map(|signal| match signal {
                Signal::Error(class) => Some(*class),
                _ => None,
            })
            .collect()
    }

    /// Error reports as servers send them, streamed and as whole bodies, each through its
    /// dialect's decoder.
    #[test]
    fn real_payloads() {
        use Dialect::{Anthropic, Gemini, Ollama, OpenAiChat, OpenAiResponses, Tgi, Triton};
        use Framing::{Json, JsonArray, Ndjson, Sse};
        let cases: &[(Dialect, Framing, &str, ErrorClass)] = &[
            // OpenAI: 429s name the limit in `code`, the quota in `type` and `code`.
            (OpenAiChat, Sse, r#"data: {"error":{"message":"Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 3, Used 3, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#, RateLimited),
            (OpenAiChat, Json, r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#, RateLimited),
            (OpenAiChat, Json, r#"{"error":{"message":"The server is overloaded or not ready yet.","type":"service_unavailable_error","param":null,"code":"server_is_overloaded"}}"#, Overloaded),
            (OpenAiChat, Sse, r#"data: {"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#, Other),
            // Azure OpenAI: the status as a string code.
            (OpenAiChat, Json, r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier."}}"#, RateLimited),
            // vLLM / SGLang: `code` is the HTTP status, `type` an exception name.
            (OpenAiChat, Sse, r#"data: {"error":{"object":"error","message":"EngineCore encountered an issue.","type":"InternalServerError","param":null,"code":500}}"#, Other),
            (OpenAiChat, Json, r#"{"error":{"message":"Service is not ready to receive requests.","type":"ServiceUnavailableError","param":null,"code":503}}"#, Overloaded),
            // Older vLLM: the error object is the body itself.
            (OpenAiChat, Json, r#"{"object":"error","message":"Service is not ready to receive requests.","type":"ServiceUnavailableError","param":null,"code":503}"#, Overloaded),
            (OpenAiChat, Sse, r#"data: {"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}"#, Other),
            // OpenRouter: the status as `code`, mid-stream.
            (OpenAiChat, Sse, r#"data: {"id":"gen-1","object":"chat.completion.chunk","error":{"code":429,"message":"Rate limit exceeded"}}"#, RateLimited),
            // TGI's OpenAI API streams its own error objects.
            (OpenAiChat, Sse, r#"data: {"error":"Model is overloaded","error_type":"overloaded"}"#, Overloaded),
            (OpenAiChat, Sse, "event: error\ndata: not json", Other),
            // Anthropic: `event: error` mid-stream, the same object as a whole body.
            (Anthropic, Sse, "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}", Overloaded),
            (Anthropic, Sse, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"Number of request tokens has exceeded your per-minute rate limit\"},\"request_id\":\"req_1\"}", RateLimited),
            (Anthropic, Sse, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}", Other),
            (Anthropic, Json, r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 50 requests per minute."},"request_id":"req_1"}"#, RateLimited),
            (Anthropic, Json, r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#, Overloaded),
            // Gemini: the status and its name, as SSE, array element and whole body.
            (Gemini, Sse, r#"data: {"error": {"code": 429, "message": "You exceeded your current quota, please check your plan and billing details.", "status": "RESOURCE_EXHAUSTED"}}"#, RateLimited),
            (Gemini, JsonArray, r#"[{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}]"#, Overloaded),
            (Gemini, Json, r#"{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}"#, RateLimited),
            (Gemini, Sse, r#"data: {"error": {"code": 500, "message": "An internal error has occurred.", "status": "INTERNAL"}}"#, Other),
            // Responses API: the `error` event's `code`, `response.failed`'s `error.code`.
            (OpenAiResponses, Sse, "event: error\ndata: {\"type\":\"error\",\"sequence_number\":1,\"code\":\"rate_limit_exceeded\",\"message\":\"Rate limit reached for gpt-4.1 on tokens per min (TPM).\",\"param\":null}", RateLimited),
            (OpenAiResponses, Sse, "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_is_overloaded\",\"message\":\"Selected model is at capacity. Please try a different model.\"}}}", Overloaded),
            (OpenAiResponses, Sse, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"x\"}}}", Other),
            (OpenAiResponses, Json, r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#, RateLimited),
            (OpenAiResponses, Json, r#"{"id":"resp_1","object":"response","status":"failed","error":{"code":"rate_limit_exceeded","message":"x"}}"#, RateLimited),
            // TGI: `error_type`, streamed and as the `/generate` body.
            (Tgi, Sse, r#"data:{"error":"Model is overloaded","error_type":"overloaded"}"#, Overloaded),
            (Tgi, Json, r#"{"error":"Model is overloaded","error_type":"overloaded"}"#, Overloaded),
            (Tgi, Sse, r#"data:{"error":"Request failed during generation: Server error: CUDA out of memory","error_type":"generation"}"#, Other),
            // Ollama and Triton name nothing; their messages are not read.
            (Ollama, Ndjson, r#"{"error":"server busy, please try again.  maximum pending requests exceeded"}"#, Other),
            (Ollama, Json, r#"{"error":"model is overloaded"}"#, Other),
            (Triton, Sse, r#"data: {"error":"Rate limit exceeded"}"#, Other),
        ];
        for (dialect, framing, body, want) in cases {
            let body = match framing {
                Sse => format!("{body}\n\n"),
                Ndjson => format!("{body}\n"),
                _ => body.to_string(),
            };
            assert_eq!(
                classes(*dialect, *framing, &body),
                vec![*want],
                "{dialect} {framing:?}: {body}"
            );
        }
    }
}
