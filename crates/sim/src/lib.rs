//! A simulated inference server with known timing, speaking every dialect tokentap reads.
//!
//! `tokentap sim`, the demo, the integration tests and the benchmarks all need a backend
//! whose TTFT, inter-token latency and output length are known in advance, so tokentap's
//! numbers can be checked against the truth. Streams are timer-driven bodies (no task per
//! stream) with absolute deadlines, so a stream's timing does not drift and ten thousand
//! open streams cost little.
//!
//! Every dialect is served at once, on its native path, with the same timing: token
//! events at the profile's deadlines, one token each or several
//! ([`ModelProfile::tokens_per_event`]: the usage still reports the true N, so tokentap's
//! apportioned ITL can be checked against it), an optional hold after the last token
//! ([`ModelProfile::hold_before_end`]), and each dialect's own framing, preamble, usage
//! and end (see `render.rs`):
//!
//! | path | dialect | streamed when |
//! |---|---|---|
//! | `POST /v1/chat/completions`, `/v1/completions` | OpenAI (`stream_options.include_usage` honoured) | `"stream": true` |
//! | `POST /v1/responses` | OpenAI Responses | `"stream": true` |
//! | `POST /v1/messages` | Anthropic Messages | `"stream": true` |
//! | `POST /v1beta/models/{m}:streamGenerateContent[?alt=sse]`, `:generateContent` | Gemini (SSE, or a streamed JSON array without `alt=sse`) | `:streamGenerateContent` |
//! | `POST /api/chat`, `/api/generate` | Ollama (NDJSON) | unless `"stream": false` |
//! | `POST /generate_stream`, `/generate` | TGI | `/generate_stream` |
//! | `POST /v2/models/{m}/generate_stream`, `/generate` | Triton | `generate_stream` |
//! | gRPC `/sglang.grpc.scheduler.SglangScheduler/Generate`, `/vllm.grpc.engine.VllmEngine/Generate`, `/trtllm.TrtllmService/Generate` (h2c) | SGLang, vLLM, TensorRT-LLM gRPC: a `chunk` of `tokens_per_event` token ids per step, then a `complete` with usage; `grpc-status` in the trailers | `stream` (TensorRT-LLM `streaming`) |
//! | gRPC `/inference.GRPCInferenceService/ModelStreamInfer` (h2c, bidirectional) | Triton: per request message, a response per step with INT32 `output_ids` and BYTES `text_output`, `triton_final_response` at the end | BOOL input `stream` (default true) |
//! | gRPC `…/GetModelInfo`, `…/HealthCheck` of the three SMG services | unary | – |
//!
//! Also `GET /v1/models` and `GET /health`. A gRPC call (`POST` of `application/grpc`) is
//! answered by `grpc.rs`, without tonic: its model (the SMG requests name none; Triton's
//! `model_name` wins), how the faults below become gRPC statuses (`status=429` is
//! `RESOURCE_EXHAUSTED`, `status=503` `UNAVAILABLE`, in a trailers-only answer) and when
//! its messages are gzip-compressed are in that module's docs.
//!
//! A request may change its own response with these headers, which is how the tests make
//! an upstream misbehave (a gRPC call sends them as metadata):
//!
//! | header | effect |
//! |---|---|
//! | `x-sim-fault: reset-after=N` | reset the connection after N tokens |
//! | `x-sim-fault: stall-after=N` | stop sending after N tokens, the connection left open |
//! | `x-sim-fault: error-after=N` | report an engine failure mid-stream after N tokens, in the dialect's own way, then end |
//! | `x-sim-fault: rate-limit-error-after=N` | the same, the error naming a rate limit (OpenAI `rate_limit_exceeded`, Anthropic `rate_limit_error`, Gemini 429 `RESOURCE_EXHAUSTED`; see [`StreamError`]) |
//! | `x-sim-fault: overloaded-error-after=N` | the same, the error naming an overload (OpenAI `server_is_overloaded`, Anthropic `overloaded_error`, Gemini 503 `UNAVAILABLE`, TGI `overloaded`) |
//! | `x-sim-fault: end-after=N` | end cleanly after N tokens, without finish, usage or end marker |
//! | `x-sim-fault: status=CODE` | answer `CODE` with an OpenAI-style error body (`Retry-After: 7` on a 429 or 503) |
//! | `x-sim-itl-ms: N` | N milliseconds between tokens in this response, in place of its model's (TTFT unchanged; 0 to 600000) |
//! | `x-sim-queue-ms: N` | the engine reports N milliseconds (at most the TTFT) of this response's TTFT as queued, the rest as prefill, where its dialect reports engine timings: Ollama's `load_duration` and `prompt_eval_duration`, TensorRT-LLM's `perf_metrics` (TTFT unchanged; default 0) |
//! | `x-sim-cached-tokens: N` | the usage reports N of the input tokens (at most all of them) as read from the prompt cache: OpenAI's `prompt_tokens_details.cached_tokens`, the Responses API's `input_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens` (its `input_tokens` the rest), Gemini's `cachedContentTokenCount` (input unchanged; 0 to 1000000) |
//! | `x-sim-reasoning-tokens: N` | the usage reports N of the output tokens (at most all of them) as reasoning: OpenAI's `completion_tokens_details.reasoning_tokens`, the Responses API's `output_tokens_details.reasoning_tokens` (output unchanged; 0 to 1000000) |
//!
//! A value any of these headers cannot read is answered `400` with a message saying why, so a
//! typo cannot pass for a healthy stream. With [`SimConfig::rate_limit`] the hosted APIs'
//! paths carry their rate-limit headers and are refused with a `429` past the limit (see
//! `ratelimit.rs`). A request that accepts `gzip` or `zstd` gets a compressed response
//! when [`SimConfig::compress`] is set (flushed after every event, as streaming servers
//! do).

mod compress;
mod config;
mod grpc;
mod ratelimit;
mod render;
mod request;
mod state;
mod stream;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::net::TcpListener;
use tokio::time::Instant;

use compress::{Coding, Encoder};
pub use config::{
    unix_ns, Fault, ModelProfile, RateLimit, SimConfig, StreamError, TokensPerEvent, UsageMode,
};
use ratelimit::Limiter;
use render::{Api, Script};
use state::{SimBody, SimState};
use stream::{Schedule, SimStream};

/// A bound simulator.
pub struct Sim {
    listener: TcpListener,
    state: Arc<SimState>,
}

impl Sim {
    pub async fn bind(addr: SocketAddr, config: SimConfig) -> std::io::Result<Sim> {
        let limiter = config
            .rate_limit
            .map(|limit| Mutex::new(Limiter::new(limit, Instant::now())));
        Ok(Sim {
            listener: TcpListener::bind(addr).await?,
            state: Arc::new(SimState {
                config,
                requests: AtomicU64::new(0),
                open_streams: Arc::new(AtomicU64::new(0)),
                limiter,
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Streamed responses currently open (their body not yet dropped). Lets tests see that
    /// a proxy closed the upstream side of a stream its client abandoned.
    pub fn open_streams(&self) -> Arc<AtomicU64> {
        self.state.open_streams.clone()
    }

    /// LLM requests (of any dialect) received so far.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// Serve until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(u32::MAX);
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let state = self.state.clone();
            let builder = builder.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(handle(state, request).await) }
                });
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}

fn json(status: StatusCode, body: String) -> Response<SimBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn error_json(status: StatusCode, message: &str, kind: &str) -> Response<SimBody> {
    json(
        status,
        serde_json::json!({"error": {"message": message, "type": kind, "code": status.as_u16()}})
            .to_string(),
    )
}

/// FNV-1a, for ids that depend only on the request.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Answers one request: the fixed routes directly, an LLM request with the [`Script`]
/// its dialect, model and fault call for, streamed or whole.
async fn handle(state: Arc<SimState>, request: Request<Incoming>) -> Response<SimBody> {
    let start = Instant::now();
    // Read only when stamping: it is the request's arrival, so it is taken first.
    let received_unix_ns = state.config.stamp.then(unix_ns);
    if grpc::is_grpc(&request) {
        return grpc::handle(state, request).await;
    }
    let path = request.uri().path().to_string();
    let (api, path_model) = match (request.method(), path.as_str()) {
        (&Method::GET, "/health") => return json(StatusCode::OK, "{}".into()),
        (&Method::GET, "/v1/models") => return model_list(&state.config),
        (method, path) => match request::route(method, path, request.uri().query()) {
            Some(route) => route,
            None => return error_json(StatusCode::NOT_FOUND, "no such route", "not_found"),
        },
    };
    let asked = match request::Asked::of(request.headers()) {
        Ok(asked) => asked,
        Err(message) => {
            return error_json(StatusCode::BAD_REQUEST, &message, "invalid_request_error")
        }
    };
    let fault = asked.fault;
    let coding = request::accepted_coding(&state.config, request.headers());
    let (body, json) = match read_json(request.into_body()).await {
        Ok(read) => read,
        Err(refusal) => return refusal,
    };
    if let Some(Fault::Status(code)) = fault {
        return simulated_failure(code);
    }
    let llm = LlmRequest {
        api,
        path_model,
        fault,
        body,
        json,
    };
    let profile = match profile_for(&state.config, &llm) {
        Ok(profile) => profile,
        Err(message) => {
            return error_json(StatusCode::NOT_FOUND, &message, "invalid_request_error")
        }
    };
    let with_itl;
    let profile = match asked.itl {
        Some(itl) => {
            with_itl = ModelProfile {
                itl,
                ..profile.clone()
            };
            &with_itl
        }
        None => profile,
    };
    let tokens = output_tokens(&llm, profile);
    let limit_headers = match state.limiter.as_ref().filter(|_| ratelimit::applies(api)) {
        Some(limiter) => {
            let admitted = limiter
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .admit(start, tokens);
            let now = wall_clock(&state.config);
            match admitted {
                Ok(budgets) => Some(ratelimit::headers(api, &budgets, now)),
                Err(refusal) => return rate_limited(api, &profile.name, &refusal, now),
            }
        }
        None => None,
    };
    let n = state.requests.fetch_add(1, Ordering::Relaxed);
    let mut script = script(&state.config, &llm, profile, tokens, n, received_unix_ns);
    script.queue_ns = nanos(asked.queue.min(profile.ttft));
    script.cached_tokens = asked.cached_tokens.min(script.prompt_tokens);
    script.reasoning_tokens = asked.reasoning_tokens.min(u64::from(tokens));
    let rng = SmallRng::seed_from_u64(state.config.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // A TGI event is one token by its format (its `token` object).
    let per_event = if api == Api::Tgi {
        TokensPerEvent::ONE
    } else {
        profile.tokens_per_event
    };
    let cut = llm.fault.and_then(Fault::after_tokens);
    let schedule = Schedule::new(start, profile, per_event, script.tokens, cut, rng);
    let mut response = if request::streams(api, &path, &llm.json) {
        streamed_response(script, schedule, coding, state.open_streams.clone())
    } else {
        whole_response(&script, schedule, coding).await
    };
    if let Some(headers) = limit_headers {
        response.headers_mut().extend(headers);
    }
    response
}

/// The wall-clock time the simulator states (its fixed clock, if it has one).
fn wall_clock(config: &SimConfig) -> SystemTime {
    config.fixed_clock.map_or_else(SystemTime::now, |secs| {
        UNIX_EPOCH + Duration::from_secs(secs)
    })
}

/// The `429` that refuses a request past the rate limit, in its dialect's shape.
fn rate_limited(
    api: Api,
    model: &str,
    refusal: &ratelimit::Refusal,
    now: SystemTime,
) -> Response<SimBody> {
    let mut response = json(
        StatusCode::TOO_MANY_REQUESTS,
        ratelimit::refusal_body(api, model, refusal),
    );
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, ratelimit::retry_after(refusal));
    headers.extend(ratelimit::headers(api, &refusal.budgets, now));
    response
}

/// `GET /v1/models`: every configured model.
fn model_list(config: &SimConfig) -> Response<SimBody> {
    let data: Vec<_> = config
        .models
        .iter()
        .map(|m| serde_json::json!({"id": m.name, "object": "model", "owned_by": "tokentap-sim"}))
        .collect();
    json(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": data}).to_string(),
    )
}

/// The request body and its JSON, or the error the simulator answers a body with that is
/// too large or not JSON.
async fn read_json(body: Incoming) -> Result<(Bytes, serde_json::Value), Response<SimBody>> {
    let body = match Limited::new(body, 64 << 20).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Err(error_json(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
                "invalid_request_error",
            ))
        }
    };
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(json) => Ok((body, json)),
        Err(_) => Err(error_json(
            StatusCode::BAD_REQUEST,
            "request body is not JSON",
            "invalid_request_error",
        )),
    }
}

/// The answer to `x-sim-fault: status=N`; 429 and 503 say when to retry, as servers do.
fn simulated_failure(code: u16) -> Response<SimBody> {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = error_json(status, "simulated failure", "server_error");
    if code == 429 || code == 503 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("7"));
    }
    response
}

/// An LLM request as read: what its model profile and [`Script`] are chosen from.
struct LlmRequest {
    api: Api,
    /// The model the path names (Gemini, Triton), which wins over the body's `model`.
    path_model: Option<String>,
    fault: Option<Fault>,
    body: Bytes,
    json: serde_json::Value,
}

/// The profile of the model a request names, the first one for a request that names none
/// (TGI serves one model and names none), or for a model not configured the message of
/// the 404 that answers it.
fn profile_for<'a>(config: &'a SimConfig, llm: &LlmRequest) -> Result<&'a ModelProfile, String> {
    let requested = llm
        .path_model
        .as_deref()
        .or_else(|| llm.json.get("model").and_then(|m| m.as_str()))
        .unwrap_or("");
    let requested = if llm.api == Api::Tgi { "" } else { requested };
    config
        .models
        .iter()
        .find(|m| m.name == requested)
        .or_else(|| requested.is_empty().then(|| &config.models[0]))
        .ok_or_else(|| format!("The model `{requested}` does not exist."))
}

/// The output tokens of the response to `llm`: the profile's, capped by the request.
fn output_tokens(llm: &LlmRequest, profile: &ModelProfile) -> u32 {
    let max_tokens = request::max_tokens(llm.api, &llm.json)
        .map_or(u32::MAX, |v| u32::try_from(v).unwrap_or(u32::MAX));
    profile.tokens.min(max_tokens).max(1)
}

/// What the response to request number `n` says, event by event: its length (`tokens`),
/// usage, id and creation time.
fn script(
    config: &SimConfig,
    llm: &LlmRequest,
    profile: &ModelProfile,
    tokens: u32,
    n: u64,
    received_unix_ns: Option<u64>,
) -> Script {
    let (id, created) = match config.fixed_clock {
        Some(at) => (format!("sim-{:016x}", fnv1a(&llm.body)), at),
        None => (
            format!("sim-{n}"),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        ),
    };
    Script {
        api: llm.api,
        model: profile.name.clone(),
        id,
        created,
        tokens,
        prompt_tokens: (llm.body.len() as u64 / 4).max(1),
        include_usage: request::includes_usage(config.usage, &llm.json),
        continuous: config.usage == UsageMode::Continuous,
        role_chunk: config.role_chunk && llm.api == Api::Chat,
        stamp: received_unix_ns,
        fault: llm.fault,
        ttft_ns: nanos(profile.ttft),
        queue_ns: 0,
        itl_ns: nanos(profile.itl),
        cached_tokens: 0,
        reasoning_tokens: 0,
    }
}

/// `d` in whole nanoseconds, as Ollama reports durations.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A streamed response: the head now, each event at its deadline.
fn streamed_response(
    script: Script,
    schedule: Schedule,
    coding: Option<Coding>,
    open_streams: Arc<AtomicU64>,
) -> Response<SimBody> {
    let content_type = script.stream_content_type();
    let stream = SimStream::new(script, schedule, coding, open_streams);
    let mut response = Response::new(stream.boxed_unsync());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(coding) = coding {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, coding.header());
    }
    response
}

/// A whole response, sent when its last token is due.
async fn whole_response(
    script: &Script,
    schedule: Schedule,
    coding: Option<Coding>,
) -> Response<SimBody> {
    tokio::time::sleep_until(schedule.last_deadline()).await;
    let body = script.whole_response();
    let Some(coding) = coding else {
        return json(StatusCode::OK, body);
    };
    let mut encoder = Encoder::new(coding);
    let mut bytes = encoder.frame(body.as_bytes()).to_vec();
    bytes.extend_from_slice(&encoder.finish());
    let mut response = json(StatusCode::OK, String::new());
    *response.body_mut() = Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed_unsync();
    response
        .headers_mut()
        .insert(header::CONTENT_ENCODING, coding.header());
    response
}
