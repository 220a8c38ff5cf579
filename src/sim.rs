//! A simulated OpenAI-compatible inference server with known timing.
//!
//! `tokentap sim`, the demo, the integration tests and the benchmarks all need a backend
//! whose TTFT, inter-token latency and output length are known in advance, so tokentap's
//! numbers can be checked against the truth. Streams are timer-driven bodies (no task per
//! stream) with absolute deadlines, so a stream's timing does not drift and ten thousand
//! open streams cost little.
//!
//! Serves `POST /v1/chat/completions` and `POST /v1/completions` (streamed or not, with
//! `stream_options.include_usage`), `GET /v1/models` and `GET /health`. A request may ask
//! for a fault with the `x-sim-fault` header (see [`Fault`]), which is how the tests make
//! an upstream reset, stall, report an error mid-stream or fail with a status.

use std::convert::Infallible;
use std::future::Future;
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
    /// Embed the wall-clock send time (`"sim_sent_unix_ns"`) in every chunk, for the
    /// benchmark's per-event latency.
    pub stamp: bool,
    pub seed: u64,
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
    /// Send an OpenAI-style error object after N tokens, then end the stream.
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

    /// Chat and completion requests received so far.
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

async fn handle(state: Arc<SimState>, request: Request<Incoming>) -> Response<SimBody> {
    let start = Instant::now();
    let api = match (request.method(), request.uri().path()) {
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
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, "/v1/completions") => Api::Completions,
        _ => return error_json(StatusCode::NOT_FOUND, "no such route", "not_found"),
    };
    let fault = request
        .headers()
        .get("x-sim-fault")
        .and_then(|v| v.to_str().ok())
        .and_then(Fault::parse);
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
    let requested = parsed.get("model").and_then(|m| m.as_str()).unwrap_or("");
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
    let max_tokens = parsed
        .get("max_tokens")
        .or_else(|| parsed.get("max_completion_tokens"))
        .and_then(|v| v.as_u64())
        .map_or(u32::MAX, |v| u32::try_from(v).unwrap_or(u32::MAX));
    let tokens = profile.tokens.min(max_tokens).max(1);
    let stream = parsed.get("stream").and_then(|v| v.as_bool()) == Some(true);
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
    let script = Script {
        api,
        model: profile.name.clone(),
        id: format!("sim-{n}"),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        tokens,
        prompt_tokens,
        include_usage,
        continuous: state.config.usage == UsageMode::Continuous,
        role_chunk: state.config.role_chunk && api == Api::Chat,
        stamp: state.config.stamp,
        fault,
        schedule: Schedule::new(start, profile, tokens, &mut rng),
    };
    if stream {
        let stream = SimStream::new(script, state.open_streams.clone());
        let mut response = Response::new(stream.boxed_unsync());
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        tokio::time::sleep_until(script.schedule.at(tokens - 1)).await;
        json(StatusCode::OK, script.whole_response())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Completions,
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

/// Everything needed to produce one response.
struct Script {
    api: Api,
    model: String,
    id: String,
    created: u64,
    tokens: u32,
    prompt_tokens: u64,
    include_usage: bool,
    continuous: bool,
    role_chunk: bool,
    stamp: bool,
    fault: Option<Fault>,
    schedule: Schedule,
}

const WORDS: [&str; 16] = [
    " the",
    " token",
    " streams",
    " fast",
    " and",
    " every",
    " gap",
    " is",
    " measured",
    " by",
    " tokentap",
    " at",
    " the",
    " pod",
    " boundary",
    ".",
];

impl Script {
    fn word(i: u32) -> &'static str {
        WORDS[i as usize % WORDS.len()]
    }

    fn usage(&self, completion: u64) -> serde_json::Value {
        serde_json::json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        })
    }

    /// One `data:` event. `choice` is the choice object, `None` for a usage-only chunk.
    fn chunk(&self, choice: Option<serde_json::Value>, usage: Option<serde_json::Value>) -> Bytes {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completions => "text_completion",
        };
        let mut chunk = serde_json::json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choice.map_or_else(Vec::new, |c| vec![c]),
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        if self.stamp {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            chunk["sim_sent_unix_ns"] = now.into();
        }
        Bytes::from(format!("data: {chunk}\n\n"))
    }

    fn token_choice(&self, i: u32) -> serde_json::Value {
        match self.api {
            Api::Chat => serde_json::json!({
                "index": 0, "delta": {"content": Self::word(i)}, "logprobs": null, "finish_reason": null
            }),
            Api::Completions => serde_json::json!({
                "index": 0, "text": Self::word(i), "logprobs": null, "finish_reason": null
            }),
        }
    }

    fn finish_choice(&self) -> serde_json::Value {
        match self.api {
            Api::Chat => serde_json::json!({
                "index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"
            }),
            Api::Completions => serde_json::json!({
                "index": 0, "text": "", "logprobs": null, "finish_reason": "length"
            }),
        }
    }

    fn continuous_usage(&self, completion: u64) -> Option<serde_json::Value> {
        self.continuous.then(|| self.usage(completion))
    }

    fn whole_response(&self) -> String {
        let text: String = (0..self.tokens).map(Self::word).collect();
        let (object, choice) = match self.api {
            Api::Chat => (
                "chat.completion",
                serde_json::json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "length"}),
            ),
            Api::Completions => (
                "text_completion",
                serde_json::json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}),
            ),
        };
        serde_json::json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice], "usage": self.usage(u64::from(self.tokens)),
        })
        .to_string()
    }
}

/// Where a stream is in its script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Role,
    Token(u32),
    Finish,
    Usage,
    Done,
    End,
}

/// A timer-driven SSE body following a [`Script`].
struct SimStream {
    script: Script,
    step: Step,
    sleep: Pin<Box<Sleep>>,
    open: Arc<AtomicU64>,
}

impl Drop for SimStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SimStream {
    fn new(script: Script, open: Arc<AtomicU64>) -> SimStream {
        open.fetch_add(1, Ordering::Relaxed);
        let first = script.schedule.at(0);
        SimStream {
            open,
            step: if script.role_chunk {
                Step::Role
            } else {
                Step::Token(0)
            },
            sleep: Box::pin(tokio::time::sleep_until(first)),
            script,
        }
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
                Step::Role => {
                    this.step = Step::Token(0);
                    let choice = serde_json::json!({
                        "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null
                    });
                    let usage = this.script.continuous_usage(0);
                    return Poll::Ready(Some(Ok(Frame::data(
                        this.script.chunk(Some(choice), usage),
                    ))));
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
                            this.step = Step::End;
                            let error = serde_json::json!({"error": {"message": "simulated engine failure", "type": "server_error", "code": 500}});
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
                                "data: {error}\n\n"
                            ))))));
                        }
                        Some(Fault::EndAfter(n)) if i == n => {
                            this.step = Step::End;
                            continue;
                        }
                        _ => {}
                    }
                    if i >= this.script.tokens {
                        this.step = Step::Finish;
                        continue;
                    }
                    let deadline = this.script.schedule.at(i);
                    if this.sleep.deadline() != deadline {
                        this.sleep.as_mut().reset(deadline);
                    }
                    if this.sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.step = Step::Token(i + 1);
                    let usage = this.script.continuous_usage(u64::from(i) + 1);
                    let chunk = this.script.chunk(Some(this.script.token_choice(i)), usage);
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Step::Finish => {
                    this.step = Step::Usage;
                    let usage = this.script.continuous_usage(u64::from(this.script.tokens));
                    let chunk = this.script.chunk(Some(this.script.finish_choice()), usage);
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Step::Usage => {
                    this.step = Step::Done;
                    if this.script.include_usage {
                        let usage = this.script.usage(u64::from(this.script.tokens));
                        return Poll::Ready(Some(Ok(Frame::data(
                            this.script.chunk(None, Some(usage)),
                        ))));
                    }
                }
                Step::Done => {
                    this.step = Step::End;
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                        b"data: [DONE]\n\n",
                    )))));
                }
                Step::End => return Poll::Ready(None),
            }
        }
    }
}
