//! The engines' gRPC services, served over h2c with plain hyper and the generated prost
//! types (no tonic): the SMG engines' `Generate` (server streaming), `GetModelInfo` and
//! `HealthCheck` (unary), and Triton's bidirectional `ModelStreamInfer`, with the same
//! timing model as the HTTP dialects ([`Schedule`]: TTFT, then each message of `k` token ids
//! `k` jittered ITLs after the previous one, `tokens_per_event` ids per message).
//!
//! | path | messages sent |
//! |---|---|
//! | `/sglang.grpc.scheduler.SglangScheduler/Generate`, `/vllm.grpc.engine.VllmEngine/Generate`, `/trtllm.TrtllmService/Generate` | a `chunk` per step (its new `token_ids`, `prompt_tokens`, cumulative `completion_tokens`), then a `complete` (all `output_ids`, `finish_reason` `stop` or `length`, usage); with `stream: false` (TensorRT-LLM `streaming: false`) the `complete` alone, when the last token is due |
//! | `…/GetModelInfo` | the profile's name as `served_model_name` and `model_path` (TensorRT-LLM `model_id`) |
//! | `…/HealthCheck` | healthy (TensorRT-LLM `status: "OK"`) |
//! | `/inference.GRPCInferenceService/ModelStreamInfer` | for each request message as it arrives (several may overlap): a response per step with an INT32 `output_ids` tensor (the step's ids) and a BYTES `text_output`, in `raw_output_contents`, and `triton_final_response` (true on the last; with `triton_enable_empty_final_response`, as `tritonclient` sends it, an empty final response instead); with a BOOL input `stream` false, one response with every id |
//!
//! Every response is `application/grpc`, HTTP 200, with `grpc-status` (and `grpc-message`)
//! in the trailers, or in the head alone (trailers-only) for a call refused at once. The
//! SMG requests name no model: the model is the one `x-sim-model` names, else the first
//! profile; Triton's is the request's `model_name` (an unknown one is an `error_message`
//! in the stream, as Triton answers it), else the same. Output is capped by the request's
//! `max_new_tokens` (SGLang), `max_tokens` (vLLM, TensorRT-LLM) or INT32 input tensor
//! `max_tokens` (Triton). Faults (`x-sim-fault`), per call:
//!
//! | fault | gRPC |
//! |---|---|
//! | `status=CODE` | trailers-only, the code's gRPC status: 429 `RESOURCE_EXHAUSTED` (8), 502/503 `UNAVAILABLE` (14), 400 `INVALID_ARGUMENT` (3), 401 `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`, 404 `NOT_FOUND`, 408/504 `DEADLINE_EXCEEDED`, 501 `UNIMPLEMENTED`, other 5xx `INTERNAL` (13), 2xx `OK` |
//! | `error-after=N` | vLLM: a `complete` with `finish_reason: "error"`, status OK; SGLang, TensorRT-LLM: `INTERNAL` in the trailers; Triton: an `error_message` response for that request, status OK |
//! | `rate-limit-error-after=N`, `overloaded-error-after=N` | `RESOURCE_EXHAUSTED`, `UNAVAILABLE` in the trailers |
//! | `end-after=N` | the request ends without `complete` / final response (status OK once every request ended) |
//! | `reset-after=N`, `stall-after=N` | `RST_STREAM`; no more messages, the stream left open |
//!
//! `x-sim-itl-ms` sets the ITL as over HTTP. A TensorRT-LLM request that sets
//! `output_config.return_perf_metrics` gets `perf_metrics` in its `complete`, from the
//! same timing: `arrival_time` when the call came (Unix seconds, or the fixed clock),
//! `first_scheduled_time` `x-sim-queue-ms` later (at most the first token), and
//! `first_token_time` and `last_token_time` when those tokens were due. With `--compress` and `grpc-accept-encoding`
//! naming `gzip`, every message is sent gzip-compressed (`grpc-encoding: gzip`); otherwise
//! identity. Compressed request messages (`gzip`, `deflate`, `zstd`) are read. A method
//! the simulator does not serve is `UNIMPLEMENTED`; `grpc-timeout` is not enforced.
//!
//! This module serves the call, the same for every engine: its route, faults and statuses,
//! the framing, and each request's messages at its schedule's deadlines ([`Generation`]).
//! One module per engine says what its messages hold: `sglang`, `vllm`, `trtllm` (with
//! TensorRT-LLM's `perf_metrics`, and the health and model information Triton's service
//! answers with) and `triton`.

mod sglang;
mod triton;
mod trtllm;
mod vllm;

use std::collections::VecDeque;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokentap_wire::grpc::framing::{frame, frame_with, MessageEncoding, MessageReader};
use tokio::time::{Instant, Sleep};

use super::config::{unix_ns, Fault, ModelProfile, SimConfig, StreamError};
use super::request;
use super::state::{SimBody, SimState};
use super::stream::Schedule;

/// gRPC status codes the simulator sends.
pub(super) mod code {
    pub const OK: u32 = 0;
    pub const CANCELLED: u32 = 1;
    pub const UNKNOWN: u32 = 2;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const NOT_FOUND: u32 = 5;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
    pub const UNAUTHENTICATED: u32 = 16;
}

/// The largest request message read.
const MAX_REQUEST_MESSAGE: usize = 64 << 20;

/// The engine whose service a call is to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Sglang,
    Vllm,
    Trtllm,
    Triton,
}

/// The RPCs served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rpc {
    Generate(Engine),
    ModelInfo(Engine),
    Health(Engine),
    StreamInfer,
}

fn rpc(path: &str) -> Option<Rpc> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    let engine = match service {
        "sglang.grpc.scheduler.SglangScheduler" => Engine::Sglang,
        "vllm.grpc.engine.VllmEngine" => Engine::Vllm,
        "trtllm.TrtllmService" => Engine::Trtllm,
        "inference.GRPCInferenceService" => {
            return (method == "ModelStreamInfer").then_some(Rpc::StreamInfer)
        }
        _ => return None,
    };
    match method {
        "Generate" => Some(Rpc::Generate(engine)),
        "GetModelInfo" => Some(Rpc::ModelInfo(engine)),
        "HealthCheck" => Some(Rpc::Health(engine)),
        _ => None,
    }
}

/// Whether a request is a gRPC call (a `POST` of `application/grpc[+proto]`).
pub(super) fn is_grpc<B>(request: &Request<B>) -> bool {
    request.method() == Method::POST
        && request
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC status an `x-sim-fault: status=CODE` HTTP code stands for.
pub(super) fn status_for_http(code: u16) -> u32 {
    match code {
        200..=299 => code::OK,
        400 => code::INVALID_ARGUMENT,
        401 => code::UNAUTHENTICATED,
        403 => code::PERMISSION_DENIED,
        404 => code::NOT_FOUND,
        408 | 504 => code::DEADLINE_EXCEEDED,
        429 => code::RESOURCE_EXHAUSTED,
        499 => code::CANCELLED,
        501 => code::UNIMPLEMENTED,
        502 | 503 => code::UNAVAILABLE,
        500..=599 => code::INTERNAL,
        _ => code::UNKNOWN,
    }
}

/// `grpc-message` is percent-encoded: every byte outside printable ASCII, and `%`.
fn percent_encoded(message: &str) -> HeaderValue {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&out).unwrap_or(HeaderValue::from_static(""))
}

/// The `grpc-status` (and `grpc-message`) headers of a call's end.
fn status_headers(status: u32, message: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("grpc-status", HeaderValue::from(status));
    if !message.is_empty() {
        headers.insert("grpc-message", percent_encoded(message));
    }
    headers
}

fn grpc_head(response: &mut Response<SimBody>) {
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
}

/// A call refused at once: the status in the head, no body (gRPC's "trailers-only").
fn trailers_only(status: u32, message: &str) -> Response<SimBody> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    grpc_head(&mut response);
    response
        .headers_mut()
        .extend(status_headers(status, message));
    response
}

/// Whether responses to this call are gzip-compressed.
fn sends_gzip(config: &SimConfig, headers: &HeaderMap) -> bool {
    config.compress
        && headers
            .get("grpc-accept-encoding")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|c| c.trim().eq_ignore_ascii_case("gzip")))
}

/// One message, framed; gzip-compressed (and flagged so) when `gzip`.
fn framed(message: &[u8], gzip: bool) -> Bytes {
    if gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        if encoder.write_all(message).is_ok() {
            if let Ok(compressed) = encoder.finish() {
                return Bytes::from(frame_with(true, &compressed));
            }
        }
    }
    Bytes::from(frame(message))
}

fn response_head(response: &mut Response<SimBody>, gzip: bool) {
    grpc_head(response);
    let headers = response.headers_mut();
    headers.insert(
        "grpc-accept-encoding",
        HeaderValue::from_static("identity,gzip,deflate,zstd"),
    );
    if gzip {
        headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
    }
}

/// The model profile a call is for: `x-sim-model`'s, else the first.
fn header_profile<'a>(
    config: &'a SimConfig,
    headers: &HeaderMap,
) -> Result<&'a ModelProfile, String> {
    match headers.get("x-sim-model").and_then(|v| v.to_str().ok()) {
        Some(name) => config
            .models
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| format!("The model `{name}` does not exist.")),
        None => Ok(&config.models[0]),
    }
}

/// Answers one gRPC call.
pub(super) async fn handle(state: Arc<SimState>, request: Request<Incoming>) -> Response<SimBody> {
    let start = Instant::now();
    let Some(rpc) = rpc(request.uri().path()) else {
        return trailers_only(
            code::UNIMPLEMENTED,
            "the simulator does not serve this method",
        );
    };
    let headers = request.headers();
    let fault = match request::requested_fault(headers) {
        Ok(fault) => fault,
        Err(message) => return trailers_only(code::INVALID_ARGUMENT, &message),
    };
    let itl = match request::requested_itl(headers) {
        Ok(itl) => itl,
        Err(message) => return trailers_only(code::INVALID_ARGUMENT, &message),
    };
    let queue = match request::requested_queue(headers) {
        Ok(queue) => queue.unwrap_or_default(),
        Err(message) => return trailers_only(code::INVALID_ARGUMENT, &message),
    };
    if let Some(Fault::Status(status)) = fault {
        return trailers_only(status_for_http(status), "simulated failure");
    }
    let profile = match header_profile(&state.config, headers) {
        Ok(profile) => profile.clone(),
        Err(message) => return trailers_only(code::NOT_FOUND, &message),
    };
    let gzip = sends_gzip(&state.config, headers);
    let encoding = MessageEncoding::parse(headers.get("grpc-encoding").map(HeaderValue::as_bytes));
    let arrival = state.config.fixed_clock.map_or_else(
        || Duration::from_nanos(unix_ns()).as_secs_f64(),
        |secs| secs as f64,
    );
    let calls = Calls {
        fault,
        itl,
        queue,
        arrival,
        profile,
    };
    match rpc {
        Rpc::Health(engine) => unary(health(engine), gzip),
        Rpc::ModelInfo(engine) => unary(model_info(engine, &calls.profile.name), gzip),
        Rpc::Generate(engine) => {
            let message = match read_unary(request.into_body(), encoding).await {
                Ok(message) => message,
                Err(message) => return trailers_only(code::INVALID_ARGUMENT, &message),
            };
            let Some(ask) = Ask::smg(engine, &message) else {
                return trailers_only(code::INVALID_ARGUMENT, "not a GenerateRequest");
            };
            let generation = calls.generation(&state, engine, ask, &calls.profile, start);
            streamed(state, calls, None, vec![generation], gzip, encoding)
        }
        Rpc::StreamInfer => {
            let body = request.into_body();
            streamed(state, calls, Some(body), Vec::new(), gzip, encoding)
        }
    }
}

/// What every request of one call shares.
struct Calls {
    fault: Option<Fault>,
    itl: Option<Duration>,
    /// The part of each TTFT reported as queued (`x-sim-queue-ms`).
    queue: Duration,
    /// When the call came, in Unix seconds: the `arrival_time` of `perf_metrics`.
    arrival: f64,
    /// The model named by `x-sim-model`, else the first.
    profile: ModelProfile,
}

impl Calls {
    fn generation(
        &self,
        state: &SimState,
        engine: Engine,
        ask: Ask,
        profile: &ModelProfile,
        start: Instant,
    ) -> Generation {
        let profile = match self.itl {
            Some(itl) => ModelProfile {
                itl,
                ..profile.clone()
            },
            None => profile.clone(),
        };
        let tokens = profile
            .tokens
            .min(ask.max_tokens.unwrap_or(u32::MAX))
            .max(1);
        let n = state.requests.fetch_add(1, Ordering::Relaxed);
        let rng =
            SmallRng::seed_from_u64(state.config.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let cut = self.fault.and_then(Fault::after_tokens);
        let schedule = Schedule::new(start, &profile, profile.tokens_per_event, tokens, cut, rng);
        let first_token = schedule.deadline();
        Generation {
            engine,
            finish_reason: if tokens < profile.tokens {
                "length"
            } else {
                "stop"
            },
            model: profile.name,
            ask,
            schedule,
            fault: self.fault,
            total: tokens,
            start,
            arrival: self.arrival,
            scheduled: start + self.queue.min(first_token - start),
            first_token,
            phase: Phase::Tokens,
        }
    }
}

/// The one message of a unary request body.
async fn read_unary(body: Incoming, encoding: MessageEncoding) -> Result<Vec<u8>, String> {
    let bytes = Limited::new(body, MAX_REQUEST_MESSAGE + 5)
        .collect()
        .await
        .map_err(|e| format!("the request body cannot be read: {e}"))?
        .to_bytes();
    let mut reader = MessageReader::new(MAX_REQUEST_MESSAGE, encoding);
    let mut first = None;
    reader
        .feed(&bytes, &mut |m| {
            first.get_or_insert_with(|| m.to_vec());
        })
        .map_err(|e| format!("the request message cannot be read: {e}"))?;
    first.ok_or_else(|| "no request message".to_string())
}

/// A unary response: one message, then `grpc-status: 0`.
fn unary(message: Vec<u8>, gzip: bool) -> Response<SimBody> {
    let body = Unary {
        data: Some(framed(&message, gzip)),
        trailers: Some(status_headers(code::OK, "")),
    };
    let mut response = Response::new(body.boxed_unsync());
    response_head(&mut response, gzip);
    response
}

struct Unary {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for Unary {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// The `HealthCheck` answer (Triton's service has none of its own: TensorRT-LLM's).
fn health(engine: Engine) -> Vec<u8> {
    match engine {
        Engine::Sglang => sglang::health(),
        Engine::Vllm => vllm::health(),
        Engine::Trtllm | Engine::Triton => trtllm::health(),
    }
}

/// The `GetModelInfo` answer for `model`.
fn model_info(engine: Engine, model: &str) -> Vec<u8> {
    match engine {
        Engine::Sglang => sglang::model_info(model),
        Engine::Vllm => vllm::model_info(model),
        Engine::Trtllm | Engine::Triton => trtllm::model_info(model),
    }
}

/// What one generate request asks.
struct Ask {
    request_id: String,
    prompt_tokens: u32,
    max_tokens: Option<u32>,
    stream: bool,
    /// Triton: the model named, if any.
    model: Option<String>,
    /// Triton: `triton_enable_empty_final_response`.
    empty_final: bool,
    /// TensorRT-LLM: `output_config.return_perf_metrics`.
    perf_metrics: bool,
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Ask {
    /// An SMG engine's request (no model, no Triton parameters).
    fn new(request_id: String, prompt_tokens: u32, max_tokens: Option<u32>, stream: bool) -> Ask {
        Ask {
            request_id,
            prompt_tokens,
            max_tokens,
            stream,
            model: None,
            empty_final: false,
            perf_metrics: false,
        }
    }

    /// A `GenerateRequest` of one of the SMG engines.
    fn smg(engine: Engine, message: &[u8]) -> Option<Ask> {
        match engine {
            Engine::Sglang => sglang::ask(message),
            Engine::Vllm => vllm::ask(message),
            Engine::Trtllm => trtllm::ask(message),
            Engine::Triton => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Tokens,
    Hold,
    Finish,
    /// Triton: the empty final response is still to send.
    Final,
    Done,
}

/// What a [`Generation`] does next.
enum Action {
    /// Send this message (encoded, not framed).
    Send(Vec<u8>),
    /// Nothing to send; ask again.
    Nothing,
    /// This request is over.
    Finished,
    /// The call ends with this status.
    End(u32, String),
    /// The stream is reset.
    Reset,
}

/// One request's responses, at its schedule's deadlines.
struct Generation {
    engine: Engine,
    model: String,
    ask: Ask,
    schedule: Schedule,
    fault: Option<Fault>,
    total: u32,
    finish_reason: &'static str,
    start: Instant,
    /// [`Calls::arrival`]: `start` on the wall clock.
    arrival: f64,
    /// When the request was scheduled (`x-sim-queue-ms` after `start`, at most its first
    /// token), and when its first token was due.
    scheduled: Instant,
    first_token: Instant,
    phase: Phase,
}

/// The id of the `i`-th generated token.
fn token_id(i: u32) -> u32 {
    100 + i % 31_900
}

impl Generation {
    /// When the next action is due; `None` for a stalled request.
    fn due(&self) -> Option<Instant> {
        match self.phase {
            Phase::Tokens => {
                let sent = self.schedule.sent();
                match self.fault {
                    Some(Fault::StallAfter(n)) if n == sent => return None,
                    Some(fault) if fault.after_tokens() == Some(sent) => return Some(self.start),
                    _ => {}
                }
                Some(
                    self.schedule
                        .next()
                        .map_or_else(|| self.schedule.end_deadline(), |(_, at)| at),
                )
            }
            Phase::Hold => Some(self.schedule.end_deadline()),
            Phase::Finish | Phase::Final | Phase::Done => Some(self.start),
        }
    }

    fn step(&mut self) -> Action {
        match self.phase {
            Phase::Tokens => {
                let sent = self.schedule.sent();
                match self.fault {
                    Some(Fault::ResetAfter(n)) if n == sent => return Action::Reset,
                    Some(Fault::ErrorAfter(n, kind)) if n == sent => return self.error(kind, sent),
                    Some(Fault::EndAfter(n)) if n == sent => {
                        self.phase = Phase::Done;
                        return Action::Finished;
                    }
                    _ => {}
                }
                let Some((event, _)) = self.schedule.next() else {
                    self.phase = Phase::Hold;
                    return Action::Nothing;
                };
                self.schedule.advance();
                if !self.ask.stream {
                    return Action::Nothing;
                }
                let ids: Vec<u32> = (event.first..event.first + event.tokens)
                    .map(token_id)
                    .collect();
                let done = event.first + event.tokens;
                let last = done >= self.total;
                Action::Send(match self.engine {
                    Engine::Triton => triton::response(self, &ids, last && !self.ask.empty_final),
                    _ => self.chunk(ids, done),
                })
            }
            Phase::Hold => {
                self.phase = Phase::Finish;
                Action::Nothing
            }
            Phase::Finish => {
                if self.engine == Engine::Triton {
                    if self.ask.stream {
                        self.phase = Phase::Done;
                        return if self.ask.empty_final {
                            Action::Send(triton::response(self, &[], true))
                        } else {
                            Action::Finished
                        };
                    }
                    let ids: Vec<u32> = (0..self.total).map(token_id).collect();
                    self.phase = if self.ask.empty_final {
                        Phase::Final
                    } else {
                        Phase::Done
                    };
                    return Action::Send(triton::response(self, &ids, !self.ask.empty_final));
                }
                self.phase = Phase::Done;
                Action::Send(self.complete(self.total, self.finish_reason))
            }
            Phase::Final => {
                self.phase = Phase::Done;
                Action::Send(triton::response(self, &[], true))
            }
            Phase::Done => Action::Finished,
        }
    }

    /// The engine's failure after `sent` tokens.
    fn error(&mut self, kind: StreamError, sent: u32) -> Action {
        self.phase = Phase::Done;
        match kind {
            StreamError::RateLimit => {
                Action::End(code::RESOURCE_EXHAUSTED, "simulated rate limit".into())
            }
            StreamError::Overload => Action::End(code::UNAVAILABLE, "simulated overload".into()),
            StreamError::Failure => match self.engine {
                Engine::Vllm => Action::Send(self.complete(sent, "error")),
                Engine::Triton => Action::Send(triton::error("simulated engine failure".into())),
                Engine::Sglang | Engine::Trtllm => {
                    Action::End(code::INTERNAL, "simulated engine failure".into())
                }
            },
        }
    }

    /// A `chunk` of `ids`, `done` tokens generated so far.
    fn chunk(&self, ids: Vec<u32>, done: u32) -> Vec<u8> {
        match self.engine {
            Engine::Sglang => sglang::chunk(&self.ask, ids, done),
            Engine::Vllm => vllm::chunk(&self.ask, ids, done),
            Engine::Trtllm | Engine::Triton => trtllm::chunk(&self.ask, ids, done),
        }
    }

    /// The `complete` after `tokens` tokens.
    fn complete(&self, tokens: u32, finish_reason: &str) -> Vec<u8> {
        let ids: Vec<u32> = (0..tokens).map(token_id).collect();
        match self.engine {
            Engine::Sglang => sglang::complete(&self.ask, ids, tokens, finish_reason),
            Engine::Vllm => vllm::complete(&self.ask, ids, tokens, finish_reason),
            Engine::Trtllm | Engine::Triton => trtllm::complete(self, ids, tokens, finish_reason),
        }
    }
}

/// A streamed call's response.
fn streamed(
    state: Arc<SimState>,
    calls: Calls,
    incoming: Option<Incoming>,
    generations: Vec<Generation>,
    gzip: bool,
    encoding: MessageEncoding,
) -> Response<SimBody> {
    let open = state.open_streams.clone();
    open.fetch_add(1, Ordering::Relaxed);
    let body = GrpcStream {
        state,
        calls,
        incoming,
        reader: MessageReader::new(MAX_REQUEST_MESSAGE, encoding),
        generations,
        errors: VecDeque::new(),
        sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
        gzip,
        end: None,
        finished: false,
        open,
    };
    let mut response = Response::new(body.boxed_unsync());
    response_head(&mut response, gzip);
    response
}

/// The body of a streamed call: the requests still arriving (Triton) and the responses of
/// each request so far, each sent at its deadline (timer-driven, no task), then the
/// status in the trailers.
struct GrpcStream {
    state: Arc<SimState>,
    calls: Calls,
    incoming: Option<Incoming>,
    reader: MessageReader,
    generations: Vec<Generation>,
    /// Responses due now (an unknown model's `error_message`).
    errors: VecDeque<Vec<u8>>,
    sleep: Pin<Box<Sleep>>,
    gzip: bool,
    end: Option<(u32, String)>,
    finished: bool,
    open: Arc<AtomicU64>,
}

impl Drop for GrpcStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl GrpcStream {
    /// A Triton request message arrived.
    fn request(&mut self, message: &[u8]) {
        let start = Instant::now();
        let Some(ask) = triton::ask(message) else {
            self.end = Some((code::INVALID_ARGUMENT, "not a ModelInferRequest".into()));
            return;
        };
        let profile = match &ask.model {
            None => Some(self.calls.profile.clone()),
            Some(name) => self
                .state
                .config
                .models
                .iter()
                .find(|m| &m.name == name)
                .cloned(),
        };
        let Some(profile) = profile else {
            let name = ask.model.unwrap_or_default();
            self.errors.push_back(triton::error(format!(
                "Request for unknown model: '{name}' is not found"
            )));
            return;
        };
        let generation = self
            .calls
            .generation(&self.state, Engine::Triton, ask, &profile, start);
        self.generations.push(generation);
    }
}

impl Body for GrpcStream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        loop {
            if this.finished {
                return Poll::Ready(None);
            }
            if let Some((status, message)) = this.end.take() {
                this.finished = true;
                return Poll::Ready(Some(Ok(Frame::trailers(status_headers(status, &message)))));
            }
            if let Some(message) = this.errors.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(framed(&message, this.gzip)))));
            }
            if let Some(incoming) = this.incoming.as_mut() {
                match Pin::new(incoming).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            let mut messages = Vec::new();
                            let fed = this.reader.feed(&data, &mut |m| messages.push(m.to_vec()));
                            if fed.is_err() {
                                this.incoming = None;
                                this.generations.clear();
                                this.end = Some((
                                    code::INVALID_ARGUMENT,
                                    "a request message cannot be read".into(),
                                ));
                            }
                            for message in messages {
                                this.request(&message);
                            }
                        }
                        continue;
                    }
                    Poll::Ready(Some(Err(_))) => {
                        // The client went away: nothing more will be read.
                        this.incoming = None;
                        this.generations.clear();
                        this.end = Some((code::CANCELLED, "the request stream failed".into()));
                        continue;
                    }
                    Poll::Ready(None) => {
                        this.incoming = None;
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            let next = this
                .generations
                .iter()
                .enumerate()
                .filter_map(|(i, g)| g.due().map(|at| (i, at)))
                .min_by_key(|(_, at)| *at);
            match next {
                Some((i, at)) if at <= Instant::now() => match this.generations[i].step() {
                    Action::Send(message) => {
                        return Poll::Ready(Some(Ok(Frame::data(framed(&message, this.gzip)))))
                    }
                    Action::Nothing => {}
                    Action::Finished => {
                        this.generations.remove(i);
                    }
                    Action::End(status, message) => {
                        this.generations.clear();
                        this.incoming = None;
                        this.end = Some((status, message));
                    }
                    Action::Reset => {
                        this.finished = true;
                        return Poll::Ready(Some(Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionReset,
                            "simulated reset",
                        ))));
                    }
                },
                Some((_, at)) => {
                    if this.sleep.deadline() != at {
                        this.sleep.as_mut().reset(at);
                    }
                    if this.sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                None => {
                    if this.generations.is_empty() && this.incoming.is_none() {
                        this.end = Some((code::OK, String::new()));
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_rpcs_served() {
        assert_eq!(
            rpc("/sglang.grpc.scheduler.SglangScheduler/Generate"),
            Some(Rpc::Generate(Engine::Sglang))
        );
        assert_eq!(
            rpc("/vllm.grpc.engine.VllmEngine/GetModelInfo"),
            Some(Rpc::ModelInfo(Engine::Vllm))
        );
        assert_eq!(
            rpc("/trtllm.TrtllmService/HealthCheck"),
            Some(Rpc::Health(Engine::Trtllm))
        );
        assert_eq!(
            rpc("/inference.GRPCInferenceService/ModelStreamInfer"),
            Some(Rpc::StreamInfer)
        );
        assert_eq!(rpc("/inference.GRPCInferenceService/ModelInfer"), None);
        assert_eq!(rpc("/trtllm.TrtllmService/Embed"), None);
    }

    #[test]
    fn http_codes_map_to_grpc_statuses() {
        assert_eq!(status_for_http(429), code::RESOURCE_EXHAUSTED);
        assert_eq!(status_for_http(503), code::UNAVAILABLE);
        assert_eq!(status_for_http(500), code::INTERNAL);
        assert_eq!(status_for_http(200), code::OK);
        assert_eq!(
            percent_encoded("a 100% é").to_str().unwrap(),
            "a 100%25 %C3%A9"
        );
    }
}
