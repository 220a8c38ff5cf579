//! The simulator's gRPC services, over h2c with hyper's HTTP/2 client, read back with
//! tokentap's own decoders: each SMG engine's `Generate` and Triton's `ModelStreamInfer`
//! stream exactly the profile's tokens, `tokens_per_event` ids per message, at its TTFT
//! and ITL, end with `grpc-status: 0` in the trailers, and fail the way the faults say.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokentap::wire::grpc::framing::{frame, MessageEncoding, MessageReader};
use tokentap::wire::grpc::proto::inference::infer_parameter::ParameterChoice;
use tokentap::wire::grpc::proto::inference::model_infer_request::InferInputTensor;
use tokentap::wire::grpc::proto::inference::{InferParameter, ModelInferRequest};
use tokentap::wire::grpc::proto::sglang::grpc::scheduler as sglang;
use tokentap::wire::grpc::proto::trtllm;
use tokentap::wire::grpc::proto::vllm::grpc::engine as vllm;
use tokentap::wire::grpc::status::status_error;
use tokentap::wire::{response_decoder, DecodeLimits, DecodeOptions, Dialect, ErrorClass, Signal};
use tokentap_sim::{ModelProfile, SimConfig, TokensPerEvent};

use crate::common::SimHandle;

const TTFT: Duration = Duration::from_millis(150);
const ITL: Duration = Duration::from_millis(20);
const TOKENS: u32 = 12;
const PER_EVENT: u32 = 3;

fn config() -> SimConfig {
    let mut profile = ModelProfile::new("grpc-model", TTFT, ITL, TOKENS);
    profile.tokens_per_event = TokensPerEvent::range(PER_EVENT, PER_EVENT).unwrap();
    let other = ModelProfile::new("other-model", Duration::ZERO, Duration::from_millis(1), 5);
    SimConfig {
        models: vec![profile, other],
        ..SimConfig::default()
    }
}

/// What one call returned: its head, each DATA frame with when it came, its trailers.
struct Call {
    status: StatusCode,
    headers: HeaderMap,
    frames: Vec<(Duration, Bytes)>,
    trailers: Option<HeaderMap>,
}

impl Call {
    /// The call's `grpc-status`: from the trailers, or the head of a trailers-only answer.
    fn grpc_status(&self) -> Option<String> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .map(|v| v.to_str().unwrap().to_string())
    }

    fn messages(&self) -> Vec<Vec<u8>> {
        let mut reader = MessageReader::new(1 << 20, MessageEncoding::Identity);
        let mut out = Vec::new();
        for (_, bytes) in &self.frames {
            reader.feed(bytes, &mut |m| out.push(m.to_vec())).unwrap();
        }
        out
    }

    /// The decoder's signals, each with when its frame came.
    fn signals(&self, dialect: Dialect) -> Vec<(Duration, Signal)> {
        let mut decoder = response_decoder(
            dialect,
            "application/grpc",
            None,
            DecodeOptions::new(DecodeLimits::DEFAULT),
        )
        .unwrap();
        let mut out = Vec::new();
        for (at, bytes) in &self.frames {
            let mut signals = Vec::new();
            decoder.feed(bytes, &mut signals).unwrap();
            out.extend(signals.into_iter().map(|s| (*at, s)));
        }
        let mut signals = Vec::new();
        decoder.finish(&mut signals).unwrap();
        out.extend(signals.into_iter().map(|s| (Duration::MAX, s)));
        out
    }
}

async fn grpc_call(sim: &SimHandle, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Call {
    let addr = sim.url().trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut request = Request::post(format!("{}{path}", sim.url()))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::from(body))).unwrap();
    let started = Instant::now();
    let response = send.send_request(request).await.unwrap();
    let (head, mut body) = response.into_parts();
    let mut frames = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        match frame.into_data() {
            Ok(data) => frames.push((started.elapsed(), data)),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    Call {
        status: head.status,
        headers: head.headers,
        frames,
        trailers,
    }
}

pub(crate) fn sglang_request() -> Vec<u8> {
    frame(
        &sglang::GenerateRequest {
            request_id: "s1".into(),
            tokenized: Some(sglang::TokenizedInput {
                original_text: "hi".into(),
                input_ids: vec![1, 2, 3, 4, 5, 6, 7],
            }),
            stream: true,
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

fn vllm_request() -> Vec<u8> {
    frame(
        &vllm::GenerateRequest {
            request_id: "v1".into(),
            input: Some(vllm::generate_request::Input::Tokenized(
                vllm::TokenizedInput {
                    original_text: "hi".into(),
                    input_ids: vec![1, 2, 3, 4, 5, 6, 7],
                },
            )),
            stream: true,
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

fn trtllm_request() -> Vec<u8> {
    frame(
        &trtllm::GenerateRequest {
            request_id: "t1".into(),
            tokenized: Some(trtllm::TokenizedInput {
                original_text: "hi".into(),
                input_token_ids: vec![1, 2, 3, 4, 5, 6, 7],
                ..Default::default()
            }),
            streaming: true,
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

pub(crate) fn triton_request(id: &str, model: &str) -> Vec<u8> {
    let mut parameters = HashMap::new();
    parameters.insert(
        "triton_enable_empty_final_response".to_string(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(true)),
        },
    );
    let text = b"hi";
    let mut text_raw = (text.len() as u32).to_le_bytes().to_vec();
    text_raw.extend_from_slice(text);
    frame(
        &ModelInferRequest {
            model_name: model.into(),
            id: id.into(),
            parameters,
            inputs: vec![
                InferInputTensor {
                    name: "text_input".into(),
                    datatype: "BYTES".into(),
                    shape: vec![1, 1],
                    ..Default::default()
                },
                InferInputTensor {
                    name: "max_tokens".into(),
                    datatype: "INT32".into(),
                    shape: vec![1, 1],
                    ..Default::default()
                },
                InferInputTensor {
                    name: "stream".into(),
                    datatype: "BOOL".into(),
                    shape: vec![1, 1],
                    ..Default::default()
                },
            ],
            raw_input_contents: vec![text_raw, 100i32.to_le_bytes().to_vec(), vec![1]],
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

/// The token-bearing events: when each came and its token count, all exact.
fn outputs(signals: &[(Duration, Signal)]) -> Vec<(Duration, u32)> {
    signals
        .iter()
        .filter_map(|(at, s)| match s {
            Signal::Output { tokens, exact, .. } => {
                assert!(exact, "gRPC token ids are exact");
                Some((*at, *tokens))
            }
            _ => None,
        })
        .collect()
}

/// The first event at TTFT and each next `PER_EVENT` ITLs later: the simulator's
/// deadlines are absolute, so each event is checked against its own (never early; late
/// by a scheduling hiccup at most, on a shared machine). The hiccup is noise, not what is
/// checked: the integration suite runs its tests side by side on two cores, and a message
/// once came 62.6 ms late there. The late bound says only that the schedule was kept (a
/// message two and a half events late is not); "never early" is the exact side.
fn assert_timing(events: &[(Duration, u32)], what: &str) {
    let slack = Duration::from_millis(150);
    for (i, (at, _)) in events.iter().enumerate() {
        let due = TTFT + ITL * PER_EVENT * i as u32;
        assert!(
            *at + Duration::from_millis(2) >= due && *at <= due + slack,
            "{what}: message {i} at {at:?}, due at {due:?}"
        );
    }
}

#[tokio::test]
async fn sim_grpc_generate_streams_the_profiles_tokens_for_each_engine() {
    let sim = SimHandle::start(config()).await;
    let cases = [
        (
            "/sglang.grpc.scheduler.SglangScheduler/Generate",
            sglang_request(),
            Dialect::SglangGrpc,
        ),
        (
            "/vllm.grpc.engine.VllmEngine/Generate",
            vllm_request(),
            Dialect::VllmGrpc,
        ),
        (
            "/trtllm.TrtllmService/Generate",
            trtllm_request(),
            Dialect::TrtllmGrpc,
        ),
    ];
    for (path, request, dialect) in cases {
        let call = grpc_call(&sim, path, request, &[]).await;
        assert_eq!(call.status, StatusCode::OK, "{path}");
        assert_eq!(call.headers["content-type"], "application/grpc");
        assert_eq!(call.grpc_status().as_deref(), Some("0"), "{path}");
        // A chunk per step of PER_EVENT ids, then the complete.
        assert_eq!(
            call.messages().len() as u32,
            TOKENS / PER_EVENT + 1,
            "{path}"
        );
        let signals = call.signals(dialect);
        let events = outputs(&signals);
        assert_eq!(events.len() as u32, TOKENS / PER_EVENT, "{path}");
        assert!(
            events.iter().all(|(_, k)| *k == PER_EVENT),
            "{path}: {events:?}"
        );
        assert_eq!(events.iter().map(|(_, k)| k).sum::<u32>(), TOKENS, "{path}");
        assert_timing(&events, path);
        let last_usage = signals.iter().rev().find_map(|(_, s)| match s {
            Signal::Usage {
                output_tokens: Some(n),
                input_tokens,
            } => Some((*input_tokens, *n)),
            _ => None,
        });
        assert_eq!(last_usage, Some((Some(7), u64::from(TOKENS))), "{path}");
        assert!(signals.iter().any(|(_, s)| *s == Signal::Done), "{path}");
        assert!(
            !signals
                .iter()
                .any(|(_, s)| matches!(s, Signal::Error(_) | Signal::Malformed)),
            "{path}: {signals:?}"
        );
        println!(
            "{path}: {} messages, {} tokens, first at {:?}, grpc-status 0",
            call.messages().len(),
            TOKENS,
            events[0].0
        );
    }
}

#[tokio::test]
async fn sim_grpc_model_info_and_health_answer_unary() {
    let sim = SimHandle::start(config()).await;
    let empty = frame(&[]);
    let info = grpc_call(
        &sim,
        "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo",
        empty.clone(),
        &[],
    )
    .await;
    assert_eq!(info.grpc_status().as_deref(), Some("0"));
    let messages = info.messages();
    assert_eq!(messages.len(), 1);
    let answer = sglang::GetModelInfoResponse::decode(messages[0].as_slice()).unwrap();
    assert_eq!(answer.served_model_name, "grpc-model");
    let info = grpc_call(
        &sim,
        "/trtllm.TrtllmService/GetModelInfo",
        empty.clone(),
        &[("x-sim-model", "other-model")],
    )
    .await;
    let answer = trtllm::GetModelInfoResponse::decode(info.messages()[0].as_slice()).unwrap();
    assert_eq!(answer.model_id, "other-model");
    let health = grpc_call(
        &sim,
        "/vllm.grpc.engine.VllmEngine/HealthCheck",
        empty.clone(),
        &[],
    )
    .await;
    assert_eq!(health.grpc_status().as_deref(), Some("0"));
    assert!(
        vllm::HealthCheckResponse::decode(health.messages()[0].as_slice())
            .unwrap()
            .healthy
    );
    let unknown = grpc_call(&sim, "/vllm.grpc.engine.VllmEngine/Embed", empty, &[]).await;
    assert_eq!(unknown.grpc_status().as_deref(), Some("12"));
}

#[tokio::test]
async fn sim_grpc_triton_stream_infer_answers_each_request() {
    let sim = SimHandle::start(config()).await;
    // Two requests on one stream, the second for the other model: each gets its responses.
    let body = [
        triton_request("a", "grpc-model"),
        triton_request("b", "other-model"),
    ]
    .concat();
    let call = grpc_call(
        &sim,
        "/inference.GRPCInferenceService/ModelStreamInfer",
        body,
        &[],
    )
    .await;
    assert_eq!(call.status, StatusCode::OK);
    assert_eq!(call.grpc_status().as_deref(), Some("0"));
    // grpc-model: 4 responses of 3 ids, other-model: 5 of 1, and an empty final each.
    assert_eq!(call.messages().len(), 4 + 5 + 2);
    let signals = call.signals(Dialect::TritonGrpc);
    let events = outputs(&signals);
    assert_eq!(events.iter().map(|(_, k)| k).sum::<u32>(), TOKENS + 5);
    let grpc_model: Vec<_> = events
        .iter()
        .copied()
        .filter(|(_, k)| *k == PER_EVENT)
        .collect();
    assert_eq!(grpc_model.len() as u32, TOKENS / PER_EVENT);
    assert_timing(&grpc_model, "ModelStreamInfer");
    assert_eq!(
        signals.iter().filter(|(_, s)| *s == Signal::Done).count(),
        2
    );
    assert_eq!(
        signals.iter().find_map(|(_, s)| match s {
            Signal::Model(m) => Some(m.clone()),
            _ => None,
        }),
        Some("other-model".to_string()),
        "the first response is the fast model's"
    );
    println!(
        "ModelStreamInfer: {} messages, {} tokens, grpc-status 0",
        call.messages().len(),
        TOKENS + 5
    );
}

#[tokio::test]
async fn sim_grpc_faults_are_grpc_statuses() {
    let sim = SimHandle::start(config()).await;
    let path = "/sglang.grpc.scheduler.SglangScheduler/Generate";
    for (fault, status) in [("status=429", "8"), ("status=503", "14")] {
        let call = grpc_call(&sim, path, sglang_request(), &[("x-sim-fault", fault)]).await;
        assert_eq!(call.status, StatusCode::OK);
        assert!(
            call.frames.is_empty() && call.trailers.is_none(),
            "{fault}: trailers-only"
        );
        assert_eq!(call.headers["grpc-status"], status, "{fault}");
    }
    // Mid-stream: the chunks before it, then the status naming the class.
    for (fault, status, class) in [
        ("rate-limit-error-after=3", "8", ErrorClass::RateLimited),
        ("overloaded-error-after=6", "14", ErrorClass::Overloaded),
        ("error-after=3", "13", ErrorClass::Other),
    ] {
        let call = grpc_call(&sim, path, sglang_request(), &[("x-sim-fault", fault)]).await;
        assert_eq!(call.grpc_status().as_deref(), Some(status), "{fault}");
        let n: u32 = fault.rsplit('=').next().unwrap().parse().unwrap();
        let events = outputs(&call.signals(Dialect::SglangGrpc));
        assert_eq!(events.iter().map(|(_, k)| k).sum::<u32>(), n, "{fault}");
        assert_eq!(status_error(status.as_bytes()), Some(class), "{fault}");
    }
    // vLLM reports a failure in its complete message, status OK.
    let call = grpc_call(
        &sim,
        "/vllm.grpc.engine.VllmEngine/Generate",
        vllm_request(),
        &[("x-sim-fault", "error-after=3")],
    )
    .await;
    assert_eq!(call.grpc_status().as_deref(), Some("0"));
    let signals = call.signals(Dialect::VllmGrpc);
    assert!(signals
        .iter()
        .any(|(_, s)| *s == Signal::Error(ErrorClass::Other)));
    // Triton: an error_message in the stream.
    let call = grpc_call(
        &sim,
        "/inference.GRPCInferenceService/ModelStreamInfer",
        triton_request("a", "grpc-model"),
        &[("x-sim-fault", "error-after=6")],
    )
    .await;
    assert_eq!(call.grpc_status().as_deref(), Some("0"));
    let signals = call.signals(Dialect::TritonGrpc);
    assert_eq!(outputs(&signals).iter().map(|(_, k)| k).sum::<u32>(), 6);
    assert!(signals
        .iter()
        .any(|(_, s)| *s == Signal::Error(ErrorClass::Other)));
    // A header the simulator cannot read is INVALID_ARGUMENT, at once.
    let call = grpc_call(&sim, path, sglang_request(), &[("x-sim-fault", "nonsense")]).await;
    assert_eq!(call.headers["grpc-status"], "3");
}

/// Real third-party clients: `scripts/ops/grpc_client.py` drives `tokentap sim` with
/// `grpcio` (stubs generated from `crates/wire/proto/` at run time) and `tritonclient[grpc]`, directly
/// and through tokentap, where it also checks what tokentap measured. `scripts/test.sh`
/// installs the Python packages; without them (outside CI) it says it skipped.
#[test]
fn sim_grpc_python_clients_through_tokentap_and_direct() {
    let present = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools, tritonclient.grpc"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        // `scripts/test.sh` installs them, so CI never skips this.
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with grpcio, grpcio-tools and tritonclient[grpc] is missing"
        );
        eprintln!(
            "skip: python3 with grpcio, grpcio-tools and tritonclient[grpc] is not installed"
        );
        return;
    }
    // Straight to the simulator, then through tokentap (which then checks what tokentap
    // measured of the same calls).
    for mode in [None, Some("--through-tokentap")] {
        let output = std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/ops/grpc_client.py"
            ))
            .args(["--tokentap", env!("CARGO_BIN_EXE_tokentap")])
            .args(mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        println!("{stdout}");
        assert!(
            output.status.success(),
            "{mode:?}\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("passed: 0 failed"), "{stdout}");
    }
}

#[tokio::test]
async fn sim_grpc_gzip_messages_for_a_client_that_accepts_them() {
    let sim = SimHandle::start(SimConfig {
        compress: true,
        ..config()
    })
    .await;
    let call = grpc_call(
        &sim,
        "/vllm.grpc.engine.VllmEngine/Generate",
        vllm_request(),
        &[("grpc-accept-encoding", "identity,gzip")],
    )
    .await;
    assert_eq!(call.headers["grpc-encoding"], "gzip");
    assert!(
        call.frames.iter().all(|(_, f)| f[0] == 1),
        "each message flagged compressed"
    );
    let mut decoder = response_decoder(
        Dialect::VllmGrpc,
        "application/grpc",
        None,
        DecodeOptions {
            grpc_encoding: Some(b"gzip"),
            ..DecodeOptions::new(DecodeLimits::DEFAULT)
        },
    )
    .unwrap();
    let mut signals = Vec::new();
    for (_, bytes) in &call.frames {
        decoder.feed(bytes, &mut signals).unwrap();
    }
    let tokens: u32 = signals
        .iter()
        .filter_map(|s| match s {
            Signal::Output { tokens, .. } => Some(*tokens),
            _ => None,
        })
        .sum();
    assert_eq!(tokens, TOKENS);
    assert_eq!(call.grpc_status().as_deref(), Some("0"));
}

/// `ModelStreamInfer` reads request messages as they come: the second request, sent only
/// once the first one's first response arrived, is answered on the same stream.
#[tokio::test]
async fn sim_grpc_triton_reads_requests_as_they_come() {
    use futures_util::StreamExt;
    let sim = SimHandle::start(config()).await;
    let addr = sim.url().trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let (requests, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| {
            (
                Ok::<_, std::convert::Infallible>(http_body::Frame::data(b)),
                rx,
            )
        })
    });
    let body = http_body_util::StreamBody::new(stream.boxed());
    let request = Request::post(format!(
        "{}/inference.GRPCInferenceService/ModelStreamInfer",
        sim.url()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(body)
    .unwrap();
    requests
        .send(Bytes::from(triton_request("first", "grpc-model")))
        .unwrap();
    let started = Instant::now();
    let response = send.send_request(request).await.unwrap();
    let mut body = response.into_body();
    let mut reader = MessageReader::new(1 << 20, MessageEncoding::Identity);
    let mut ids = Vec::new();
    let mut requests = Some(requests);
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                trailers = frame.into_trailers().ok();
                continue;
            }
        };
        let mut messages = Vec::new();
        reader
            .feed(&data, &mut |m| messages.push(m.to_vec()))
            .unwrap();
        for m in messages {
            let response =
                tokentap::wire::grpc::proto::inference::ModelStreamInferResponse::decode(
                    m.as_slice(),
                )
                .unwrap();
            let id = response.infer_response.unwrap().id;
            if id == "first" {
                if let Some(requests) = requests.take() {
                    // The first response came at TTFT: now send the second, then close.
                    assert!(started.elapsed() >= TTFT);
                    requests
                        .send(Bytes::from(triton_request("second", "other-model")))
                        .unwrap();
                }
            }
            ids.push(id);
        }
    }
    assert_eq!(trailers.unwrap()["grpc-status"], "0");
    // other-model answers at once (TTFT 0, 1 ms ITL): its 5 responses and final come
    // between the first request's responses.
    assert_eq!(ids.iter().filter(|i| *i == "first").count(), 5);
    assert_eq!(ids.iter().filter(|i| *i == "second").count(), 6);
    assert_eq!(ids[0], "first");
    assert_eq!(ids[1], "second");
}
