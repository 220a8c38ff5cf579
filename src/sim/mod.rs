//! A simulated inference server with known timing, speaking every dialect tokentap reads.
//!
//! `tokentap sim`, the demo, the integration tests and the benchmarks all need a backend
//! whose TTFT, inter-token latency and output length are known in advance, so tokentap's
//! numbers can be checked against the truth. Streams are timer-driven bodies (no task per
//! stream) with absolute deadlines, so a stream's timing does not drift and ten thousand
//! open streams cost little.
//!
//! Every dialect is served at once, on its native path, with the same timing: one event
//! per token at the profile's deadlines, and each dialect's own framing, preamble, usage
//! and end (see `sim/render.rs`):
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
//!
//! Also `GET /v1/models` and `GET /health`. A request may ask for a fault with the
//! `x-sim-fault` header (see [`Fault`]), which is how the tests make an upstream reset,
//! stall, report an error mid-stream (in the dialect's own way) or fail with a status. A
//! request that accepts `gzip` or `zstd` gets a compressed response when
//! [`SimConfig::compress`] is set (flushed after every event, as streaming servers do).

mod render;

use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};

use render::{Api, Script};

/// Timing and length of one simulated model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProfile {
    pub name: String,
    /// Time from request to the first token.
    pub ttft: Duration,
    /// Time between tokens.
    pub itl: Duration,
    /// Uniform jitter as a fraction of TTFT and of each gap (0 = exact timing).
    pub jitter: f64,
    /// Output tokens per response (a request's `max_tokens` caps it).
    pub tokens: u32,
}

impl ModelProfile {
    pub fn new(name: &str, ttft: Duration, itl: Duration, tokens: u32) -> ModelProfile {
        ModelProfile {
            name: name.to_string(),
            ttft,
            itl,
            jitter: 0.0,
            tokens,
        }
    }
}

/// When the simulator reports token usage in a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageMode {
    /// Only when the request sets `stream_options.include_usage` (OpenAI's behaviour).
    Requested,
    /// A final usage chunk on every stream.
    Always,
    /// Never.
    Never,
    /// Cumulative usage on every chunk (vLLM's `continuous_usage_stats`).
    Continuous,
}

impl std::str::FromStr for UsageMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "requested" => Ok(UsageMode::Requested),
            "always" => Ok(UsageMode::Always),
            "never" => Ok(UsageMode::Never),
            "continuous" => Ok(UsageMode::Continuous),
            other => Err(format!(
                "`{other}` is not one of requested, always, never, continuous"
            )),
        }
    }
}

/// The simulator's settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub models: Vec<ModelProfile>,
    pub usage: UsageMode,
    /// Send a role-only chunk right after the head, before the first token (as vLLM does).
    pub role_chunk: bool,
    /// Embed the wall-clock send time (`"sim_sent_unix_ns"`) and the request's arrival
    /// time (`"sim_received_unix_ns"`) in every chunk: the benchmark's per-event latency,
    /// and the backend's own TTFT for fidelity comparisons.
    pub stamp: bool,
    pub seed: u64,
    /// Report this Unix time (seconds) as every response's creation time, and derive
    /// response ids from the request body instead of a counter, so that two identical
    /// requests get byte-identical responses (tests compare proxied and direct bytes).
    pub fixed_clock: Option<u64>,
    /// Compress responses with `zstd` or `gzip` when the request's `Accept-Encoding`
    /// allows (the first of the two it lists), flushing after every event.
    pub compress: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            models: vec![ModelProfile::new(
                "sim-model",
                Duration::from_millis(150),
                Duration::from_millis(20),
                40,
            )],
            usage: UsageMode::Requested,
            role_chunk: true,
            stamp: false,
            seed: 1,
            fixed_clock: None,
            compress: false,
        }
    }
}

/// A fault a request asks for with `x-sim-fault: NAME[=N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Reset the connection after N tokens.
    ResetAfter(u32),
    /// Stop sending (but keep the connection open) after N tokens.
    StallAfter(u32),
    /// Report an error mid-stream after N tokens, as the dialect does (an OpenAI error
    /// object, Anthropic `error` event, Responses `response.failed`, ...), then end.
    ErrorAfter(u32),
    /// End the stream cleanly after N tokens, without finish chunk, usage or `[DONE]`.
    EndAfter(u32),
    /// Answer with this status and an OpenAI-style error body.
    Status(u16),
}

impl Fault {
    fn parse(value: &str) -> Option<Fault> {
        let (name, n) = value.split_once('=')?;
        let n: u32 = n.trim().parse().ok()?;
        match name.trim() {
            "reset-after" => Some(Fault::ResetAfter(n)),
            "stall-after" => Some(Fault::StallAfter(n)),
            "error-after" => Some(Fault::ErrorAfter(n)),
            "end-after" => Some(Fault::EndAfter(n)),
            "status" => u16::try_from(n).ok().map(Fault::Status),
            _ => None,
        }
    }
}

/// A bound simulator.
pub struct Sim {
    listener: TcpListener,
    state: Arc<SimState>,
}

struct SimState {
    config: SimConfig,
    requests: AtomicU64,
    open_streams: Arc<AtomicU64>,
}

impl Sim {
    pub async fn bind(addr: SocketAddr, config: SimConfig) -> std::io::Result<Sim> {
        Ok(Sim {
            listener: TcpListener::bind(addr).await?,
            state: Arc::new(SimState {
                config,
                requests: AtomicU64::new(0),
                open_streams: Arc::new(AtomicU64::new(0)),
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

type SimBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

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

/// The API, model named in the path, and whether the response streams, from the route
/// (the body may still decide streaming, see [`streams`]).
fn route(method: &Method, path: &str, query: Option<&str>) -> Option<(Api, Option<String>)> {
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
fn streams(api: Api, path: &str, body: &serde_json::Value) -> bool {
    let flag = body.get("stream").and_then(|v| v.as_bool());
    match api {
        Api::Gemini { .. } => path.ends_with(":streamGenerateContent"),
        Api::Tgi | Api::Triton => path.ends_with("/generate_stream"),
        Api::Ollama { .. } => flag != Some(false),
        _ => flag == Some(true),
    }
}

/// The output-token cap a request sets, in its dialect's field.
fn max_tokens(api: Api, body: &serde_json::Value) -> Option<u64> {
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
fn accepted_coding(config: &SimConfig, headers: &http::HeaderMap) -> Option<Coding> {
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

/// Wall-clock nanoseconds since the Unix epoch, as the stamps carry them (the benchmark
/// reads its arrival times with the same clock).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// FNV-1a, for ids that depend only on the request.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn handle(state: Arc<SimState>, request: Request<Incoming>) -> Response<SimBody> {
    let start = Instant::now();
    // Read only when stamping: it is the request's arrival, so it is taken first.
    let received_unix_ns = state.config.stamp.then(unix_ns);
    let path = request.uri().path().to_string();
    let (api, path_model) = match (request.method(), path.as_str()) {
        (&Method::GET, "/health") => return json(StatusCode::OK, "{}".into()),
        (&Method::GET, "/v1/models") => {
            let data: Vec<_> = state
                .config
                .models
                .iter()
                .map(|m| serde_json::json!({"id": m.name, "object": "model", "owned_by": "tokentap-sim"}))
                .collect();
            return json(
                StatusCode::OK,
                serde_json::json!({"object": "list", "data": data}).to_string(),
            );
        }
        (method, path) => match route(method, path, request.uri().query()) {
            Some(route) => route,
            None => return error_json(StatusCode::NOT_FOUND, "no such route", "not_found"),
        },
    };
    let fault = request
        .headers()
        .get("x-sim-fault")
        .and_then(|v| v.to_str().ok())
        .and_then(Fault::parse);
    let coding = accepted_coding(&state.config, request.headers());
    let body = match Limited::new(request.into_body(), 64 << 20).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return error_json(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
                "invalid_request_error",
            )
        }
    };
    let Ok(parsed) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error_json(
            StatusCode::BAD_REQUEST,
            "request body is not JSON",
            "invalid_request_error",
        );
    };
    if let Some(Fault::Status(code)) = fault {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = error_json(status, "simulated failure", "server_error");
        if code == 429 || code == 503 {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("7"));
        }
        return response;
    }
    let requested = path_model
        .as_deref()
        .or_else(|| parsed.get("model").and_then(|m| m.as_str()))
        .unwrap_or("");
    // TGI serves one model and names none.
    let requested = if api == Api::Tgi { "" } else { requested };
    let Some(profile) = state
        .config
        .models
        .iter()
        .find(|m| m.name == requested)
        .or_else(|| requested.is_empty().then(|| &state.config.models[0]))
    else {
        return error_json(
            StatusCode::NOT_FOUND,
            &format!("The model `{requested}` does not exist."),
            "invalid_request_error",
        );
    };
    let max_tokens =
        max_tokens(api, &parsed).map_or(u32::MAX, |v| u32::try_from(v).unwrap_or(u32::MAX));
    let tokens = profile.tokens.min(max_tokens).max(1);
    let stream = streams(api, &path, &parsed);
    let include_usage = match state.config.usage {
        UsageMode::Always | UsageMode::Continuous => true,
        UsageMode::Never => false,
        UsageMode::Requested => {
            parsed
                .pointer("/stream_options/include_usage")
                .and_then(|v| v.as_bool())
                == Some(true)
        }
    };
    let n = state.requests.fetch_add(1, Ordering::Relaxed);
    let mut rng =
        SmallRng::seed_from_u64(state.config.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let prompt_tokens = (body.len() as u64 / 4).max(1);
    let (id, created) = match state.config.fixed_clock {
        Some(at) => (format!("sim-{:016x}", fnv1a(&body)), at),
        None => (
            format!("sim-{n}"),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        ),
    };
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let script = Script {
        api,
        model: profile.name.clone(),
        id,
        created,
        tokens,
        prompt_tokens,
        include_usage,
        continuous: state.config.usage == UsageMode::Continuous,
        role_chunk: state.config.role_chunk && api == Api::Chat,
        stamp: received_unix_ns,
        fault,
        ttft_ns: nanos(profile.ttft),
        itl_ns: nanos(profile.itl),
    };
    let schedule = Schedule::new(start, profile, tokens, &mut rng);
    if stream {
        let content_type = script.stream_content_type();
        let stream = SimStream::new(script, schedule, coding, state.open_streams.clone());
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
    } else {
        tokio::time::sleep_until(schedule.at(tokens - 1)).await;
        let body = script.whole_response();
        match coding {
            None => json(StatusCode::OK, body),
            Some(coding) => {
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
        }
    }
}

/// Absolute send deadlines of every token of one response.
struct Schedule {
    deadlines: Vec<Instant>,
}

impl Schedule {
    fn new(start: Instant, profile: &ModelProfile, tokens: u32, rng: &mut SmallRng) -> Schedule {
        let mut jittered = |d: Duration| {
            if profile.jitter > 0.0 {
                d.mul_f64((1.0 + rng.gen_range(-profile.jitter..=profile.jitter)).max(0.0))
            } else {
                d
            }
        };
        let mut at = start + jittered(profile.ttft);
        let mut deadlines = Vec::with_capacity(tokens as usize);
        for i in 0..tokens {
            if i > 0 {
                at += jittered(profile.itl);
            }
            deadlines.push(at);
        }
        Schedule { deadlines }
    }

    fn at(&self, i: u32) -> Instant {
        self.deadlines[i as usize]
    }
}

/// A content coding the simulator can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coding {
    Gzip,
    Zstd,
}

impl Coding {
    fn header(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Coding::Gzip => "gzip",
            Coding::Zstd => "zstd",
        })
    }
}

/// A streaming compressor: each frame is flushed, so it can be decoded on arrival.
enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    fn new(coding: Coding) -> Encoder {
        match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::fast(),
            )),
            Coding::Zstd => match zstd::stream::write::Encoder::new(Vec::new(), 1) {
                Ok(encoder) => Encoder::Zstd(encoder),
                // Cannot happen short of allocation failure; gzip needs no context.
                Err(_) => Encoder::new(Coding::Gzip),
            },
        }
    }

    /// Compress and flush one frame. Writing into a `Vec` cannot fail.
    fn frame(&mut self, bytes: &[u8]) -> Bytes {
        let out = match self {
            Encoder::Gzip(e) => {
                let _ = e.write_all(bytes).and_then(|()| e.flush());
                std::mem::take(e.get_mut())
            }
            Encoder::Zstd(e) => {
                let _ = e.write_all(bytes).and_then(|()| e.flush());
                std::mem::take(e.get_mut())
            }
        };
        Bytes::from(out)
    }

    /// The end of the compressed stream.
    fn finish(&mut self) -> Bytes {
        let out = match self {
            Encoder::Gzip(e) => {
                let _ = e.try_finish();
                std::mem::take(e.get_mut())
            }
            Encoder::Zstd(e) => {
                let _ = e.do_finish();
                std::mem::take(e.get_mut())
            }
        };
        Bytes::from(out)
    }
}

/// Where a stream is in its script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Preamble,
    Token(u32),
    Finish,
    Usage,
    Done,
    /// The compressed stream's trailer, if compressing.
    Trailer,
    End,
}

/// A timer-driven streamed body following a [`Script`].
struct SimStream {
    script: Script,
    schedule: Schedule,
    step: Step,
    /// Events sent so far (the first Gemini array element opens the array).
    sent: u32,
    sleep: Pin<Box<Sleep>>,
    encoder: Option<Encoder>,
    open: Arc<AtomicU64>,
}

impl Drop for SimStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SimStream {
    fn new(
        script: Script,
        schedule: Schedule,
        coding: Option<Coding>,
        open: Arc<AtomicU64>,
    ) -> SimStream {
        open.fetch_add(1, Ordering::Relaxed);
        let first = schedule.at(0);
        SimStream {
            open,
            script,
            schedule,
            step: Step::Preamble,
            sent: 0,
            sleep: Box::pin(tokio::time::sleep_until(first)),
            encoder: coding.map(Encoder::new),
        }
    }

    /// A data frame, compressed if the stream is.
    fn emit(&mut self, bytes: Bytes) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.sent += 1;
        let bytes = match self.encoder.as_mut() {
            Some(encoder) => encoder.frame(&bytes),
            None => bytes,
        };
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

impl Body for SimStream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        loop {
            match this.step {
                Step::Preamble => {
                    this.step = Step::Token(0);
                    if let Some(bytes) = this.script.preamble() {
                        return this.emit(bytes);
                    }
                }
                Step::Token(i) => {
                    match this.script.fault {
                        Some(Fault::ResetAfter(n)) if i == n => {
                            this.step = Step::End;
                            return Poll::Ready(Some(Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionReset,
                                "simulated reset",
                            ))));
                        }
                        Some(Fault::StallAfter(n)) if i == n => return Poll::Pending,
                        Some(Fault::ErrorAfter(n)) if i == n => {
                            this.step = Step::Trailer;
                            let error = this.script.error(this.sent == 0);
                            return this.emit(error);
                        }
                        Some(Fault::EndAfter(n)) if i == n => {
                            this.step = Step::Trailer;
                            continue;
                        }
                        _ => {}
                    }
                    if i >= this.script.tokens {
                        this.step = Step::Finish;
                        continue;
                    }
                    let deadline = this.schedule.at(i);
                    if this.sleep.deadline() != deadline {
                        this.sleep.as_mut().reset(deadline);
                    }
                    if this.sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.step = Step::Token(i + 1);
                    let bytes = this.script.token(i, this.sent == 0);
                    return this.emit(bytes);
                }
                Step::Finish => {
                    this.step = Step::Usage;
                    if let Some(bytes) = this.script.finish(this.sent == 0) {
                        return this.emit(bytes);
                    }
                }
                Step::Usage => {
                    this.step = Step::Done;
                    if let Some(bytes) = this.script.usage() {
                        return this.emit(bytes);
                    }
                }
                Step::Done => {
                    this.step = Step::Trailer;
                    if let Some(bytes) = this.script.done() {
                        return this.emit(bytes);
                    }
                }
                Step::Trailer => {
                    this.step = Step::End;
                    if let Some(encoder) = this.encoder.as_mut() {
                        let tail = encoder.finish();
                        if !tail.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(tail))));
                        }
                    }
                }
                Step::End => return Poll::Ready(None),
            }
        }
    }
}
