//! What a simulated request asks for, read from its route, headers and JSON body: the
//! dialect and the model named in the path, whether it streams, its output-token cap, the
//! compression it accepts, and the fault and inter-token latency its `x-sim-*` headers
//! ask for.

use std::time::Duration;

use http::{header, HeaderMap, Method};

use super::compress::Coding;
use super::config::{Fault, SimConfig, UsageMode};
use super::render::Api;

/// The API, model named in the path, and whether the response streams, from the route
/// (the body may still decide streaming, see [`streams`]).
pub(super) fn route(
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Option<(Api, Option<String>)> {
    if method != Method::POST {
        return None;
    }
    let model_in = |rest: &str, suffix: &str| rest.strip_suffix(suffix).map(str::to_string);
    Some(match path {
        "/v1/chat/completions" => (Api::Chat, None),
        "/v1/completions" => (Api::Completions, None),
        "/v1/responses" => (Api::Responses, None),
        "/v1/messages" => (Api::Anthropic, None),
        "/api/chat" => (Api::Ollama { chat: true }, None),
        "/api/generate" => (Api::Ollama { chat: false }, None),
        "/generate_stream" | "/generate" => (Api::Tgi, None),
        _ => {
            if let Some(rest) = path
                .strip_prefix("/v1beta/models/")
                .or_else(|| path.strip_prefix("/v1/models/"))
            {
                let sse = query.is_some_and(|q| q.split('&').any(|p| p == "alt=sse"));
                let model = model_in(rest, ":streamGenerateContent")
                    .or_else(|| model_in(rest, ":generateContent"))?;
                (Api::Gemini { sse }, Some(model))
            } else if let Some(rest) = path.strip_prefix("/v2/models/") {
                let model =
                    model_in(rest, "/generate_stream").or_else(|| model_in(rest, "/generate"))?;
                // `/v2/models/{m}/versions/{v}/generate...`
                let model = model.split('/').next().unwrap_or_default().to_string();
                (Api::Triton, Some(model))
            } else {
                return None;
            }
        }
    })
}

/// Whether a request asks for a streamed response.
pub(super) fn streams(api: Api, path: &str, body: &serde_json::Value) -> bool {
    let flag = body.get("stream").and_then(|v| v.as_bool());
    match api {
        Api::Gemini { .. } => path.ends_with(":streamGenerateContent"),
        Api::Tgi | Api::Triton => path.ends_with("/generate_stream"),
        Api::Ollama { .. } => flag != Some(false),
        _ => flag == Some(true),
    }
}

/// The output-token cap a request sets, in its dialect's field.
pub(super) fn max_tokens(api: Api, body: &serde_json::Value) -> Option<u64> {
    let pointers: &[&str] = match api {
        Api::Chat | Api::Completions => &["/max_tokens", "/max_completion_tokens"],
        Api::Responses => &["/max_output_tokens"],
        Api::Anthropic | Api::Triton => &["/max_tokens"],
        Api::Gemini { .. } => &["/generationConfig/maxOutputTokens"],
        Api::Ollama { .. } => &["/options/num_predict"],
        Api::Tgi => &["/parameters/max_new_tokens"],
    };
    pointers
        .iter()
        .find_map(|p| body.pointer(p).and_then(|v| v.as_u64()))
}

/// The compression a request accepts, if the simulator is configured to compress.
pub(super) fn accepted_coding(config: &SimConfig, headers: &HeaderMap) -> Option<Coding> {
    if !config.compress {
        return None;
    }
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())?;
    accept
        .split(',')
        .find_map(|token| match token.split(';').next().unwrap_or("").trim() {
            "zstd" => Some(Coding::Zstd),
            "gzip" => Some(Coding::Gzip),
            _ => None,
        })
}

/// What a request asks of the simulator with its `x-sim-*` headers.
#[derive(Debug, Default)]
pub(super) struct Asked {
    pub(super) fault: Option<Fault>,
    /// In place of its model's.
    pub(super) itl: Option<Duration>,
    pub(super) queue: Duration,
    pub(super) cached_tokens: u64,
    pub(super) reasoning_tokens: u64,
}

impl Asked {
    /// Every `x-sim-*` header read, or the message of the 400 that answers the first bad one.
    pub(super) fn of(headers: &HeaderMap) -> Result<Asked, String> {
        let (cached_tokens, reasoning_tokens) = requested_usage_details(headers)?;
        Ok(Asked {
            fault: requested_fault(headers)?,
            itl: requested_itl(headers)?,
            queue: requested_queue(headers)?.unwrap_or_default(),
            cached_tokens,
            reasoning_tokens,
        })
    }
}

/// The fault a request asks for with `x-sim-fault`, or the message of the 400 that
/// answers a value that names none (a typo would otherwise pass for a healthy stream).
pub(super) fn requested_fault(headers: &HeaderMap) -> Result<Option<Fault>, String> {
    header_value(headers, "x-sim-fault", |value| {
        Fault::parse(value).ok_or_else(|| format!("is not one of {}", Fault::FORMS))
    })
}

/// The largest `x-sim-itl-ms` or `x-sim-queue-ms` (ten minutes): a larger one is surely a mistake, and keeps
/// a long stream's deadlines far from the clock's range.
const MAX_ITL_MS: u64 = 600_000;

/// The inter-token latency a request asks for with `x-sim-itl-ms` (whole milliseconds,
/// in place of its model's), or the message of the 400 that answers a bad value.
pub(super) fn requested_itl(headers: &HeaderMap) -> Result<Option<Duration>, String> {
    whole_millis(headers, "x-sim-itl-ms")
}

/// The part of the TTFT a request asks the engine to report as queued with
/// `x-sim-queue-ms` (whole milliseconds; the TTFT itself is unchanged), or the message of
/// the 400 that answers a bad value.
pub(super) fn requested_queue(headers: &HeaderMap) -> Result<Option<Duration>, String> {
    whole_millis(headers, "x-sim-queue-ms")
}

/// The largest `x-sim-cached-tokens` or `x-sim-reasoning-tokens`.
const MAX_DETAIL_TOKENS: u64 = 1_000_000;

/// The cached input and reasoning output tokens a request asks the usage to report with
/// `x-sim-cached-tokens` and `x-sim-reasoning-tokens` (0 without them), or the message of
/// the 400 that answers a bad value.
pub(super) fn requested_usage_details(headers: &HeaderMap) -> Result<(u64, u64), String> {
    let count = |name| {
        header_value(headers, name, |value| {
            value
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= MAX_DETAIL_TOKENS)
                .ok_or_else(|| format!("is not a whole number from 0 to {MAX_DETAIL_TOKENS}"))
        })
    };
    Ok((
        count("x-sim-cached-tokens")?.unwrap_or(0),
        count("x-sim-reasoning-tokens")?.unwrap_or(0),
    ))
}

/// The header `name` as whole milliseconds from 0 to [`MAX_ITL_MS`].
fn whole_millis(headers: &HeaderMap, name: &str) -> Result<Option<Duration>, String> {
    header_value(headers, name, |value| {
        value
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms <= MAX_ITL_MS)
            .map(Duration::from_millis)
            .ok_or_else(|| format!("is not a whole number of milliseconds from 0 to {MAX_ITL_MS}"))
    })
}

/// `parse` applied to the header `name`, if present; a value `parse` refuses is an error
/// naming the header and the value.
fn header_value<T>(
    headers: &HeaderMap,
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    parse(&text)
        .map(Some)
        .map_err(|why| format!("{name}: `{}` {why}", text.escape_debug()))
}

/// Whether a stream reports usage, given the simulator's mode and the request.
pub(super) fn includes_usage(mode: UsageMode, body: &serde_json::Value) -> bool {
    match mode {
        UsageMode::Always | UsageMode::Continuous => true,
        UsageMode::Never => false,
        UsageMode::Requested => {
            body.pointer("/stream_options/include_usage")
                .and_then(|v| v.as_bool())
                == Some(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamError;

    fn headers(name: &'static str, value: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, http::HeaderValue::from_bytes(value).unwrap());
        headers
    }

    #[test]
    fn faults_are_named_or_refused() {
        let fault = |v: &str| requested_fault(&headers("x-sim-fault", v.as_bytes()));
        assert_eq!(requested_fault(&HeaderMap::new()), Ok(None));
        assert_eq!(
            fault("error-after=3"),
            Ok(Some(Fault::ErrorAfter(3, StreamError::Failure)))
        );
        assert_eq!(
            fault("rate-limit-error-after=0"),
            Ok(Some(Fault::ErrorAfter(0, StreamError::RateLimit)))
        );
        assert_eq!(
            fault(" overloaded-error-after = 5"),
            Ok(Some(Fault::ErrorAfter(5, StreamError::Overload)))
        );
        assert_eq!(fault("status=429"), Ok(Some(Fault::Status(429))));
        for bad in [
            "error-after",
            "eror-after=3",
            "error-after=-1",
            "status=70000",
            "",
        ] {
            let message = fault(bad).unwrap_err();
            assert!(
                message.starts_with(&format!("x-sim-fault: `{bad}` is not one of reset-after=N")),
                "{message}"
            );
        }
        let binary = requested_fault(&headers("x-sim-fault", b"error-after=\xff"));
        assert!(binary
            .unwrap_err()
            .starts_with("x-sim-fault: `error-after=\u{fffd}` is not"));
    }

    #[test]
    fn an_itl_is_whole_milliseconds_up_to_ten_minutes() {
        let itl = |v: &str| requested_itl(&headers("x-sim-itl-ms", v.as_bytes()));
        assert_eq!(requested_itl(&HeaderMap::new()), Ok(None));
        assert_eq!(itl("250"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(itl("0"), Ok(Some(Duration::ZERO)));
        assert_eq!(itl("600000"), Ok(Some(Duration::from_secs(600))));
        for bad in ["600001", "-1", "2.5", "20ms", ""] {
            assert_eq!(
                itl(bad),
                Err(format!(
                    "x-sim-itl-ms: `{bad}` is not a whole number of milliseconds from 0 to 600000"
                ))
            );
        }
        let details = |name, v: &str| requested_usage_details(&headers(name, v.as_bytes()));
        assert_eq!(requested_usage_details(&HeaderMap::new()), Ok((0, 0)));
        assert_eq!(details("x-sim-cached-tokens", " 12 "), Ok((12, 0)));
        assert_eq!(
            details("x-sim-reasoning-tokens", "1000000"),
            Ok((0, 1_000_000))
        );
        for bad in ["-1", "1000001", "1.5", "x", ""] {
            assert_eq!(
                details("x-sim-cached-tokens", bad),
                Err(format!(
                    "x-sim-cached-tokens: `{bad}` is not a whole number from 0 to 1000000"
                ))
            );
        }
        let queue = |v: &str| requested_queue(&headers("x-sim-queue-ms", v.as_bytes()));
        assert_eq!(queue("40"), Ok(Some(Duration::from_millis(40))));
        assert_eq!(
            queue("x"),
            Err(
                "x-sim-queue-ms: `x` is not a whole number of milliseconds from 0 to 600000".into()
            )
        );
    }
}
