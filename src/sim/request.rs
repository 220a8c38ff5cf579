//! What a simulated request asks for, read from its route, headers and JSON body: the
//! dialect and the model named in the path, whether it streams, its output-token cap and
//! the compression it accepts.

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

/// The fault a request asks for with `x-sim-fault`, if it names one.
pub(super) fn requested_fault(headers: &HeaderMap) -> Option<Fault> {
    headers
        .get("x-sim-fault")
        .and_then(|v| v.to_str().ok())
        .and_then(Fault::parse)
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
