//! Engine-reported timings through tokentap, against the simulator's known timing: a
//! TensorRT-LLM `Generate` call that asks for `perf_metrics` and an Ollama stream, each
//! with a TTFT of 150 ms of which the engine reports 40 ms as queued (`x-sim-queue-ms`).
//!
//! Tolerances. The simulator reports the instants of its own schedule, so the engine's
//! queue (40 ms) and prefill (110 ms) come back exactly, up to the float precision of
//! TensorRT-LLM's Unix-second instants (~0.24 µs at today's epoch; 0.1 ms allowed). The
//! time outside the engine is tokentap's TTFT minus the engine's 150 ms: tokentap reads
//! `t_req` before the simulator starts its clock and tokio timers never fire early, so it
//! is above 0, and below the lateness bound of the accuracy tests (`dialects.rs`: 40 ms
//! for timer granularity, scheduling on a shared 2-core machine and the proxy hop).
//!
//! A call that does not ask for `perf_metrics` gets none, and tokentap adds no engine
//! figure: tokentap never asks for them itself (the request passes unchanged). TGI's
//! `/generate` reports its queue in the response head (`x-queue-time`), read on TGI
//! responses only.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokentap::wire::grpc::framing::frame;
use tokentap::wire::grpc::proto::trtllm;
use tokentap_sim::{ModelProfile, SimConfig};

use crate::common::{Metrics, Proxy, ScriptedBackend, SimHandle, Step};

const TTFT: Duration = Duration::from_millis(150);
const QUEUE_MS: u64 = 40;
const ITL: Duration = Duration::from_millis(10);
const TOKENS: u32 = 8;
/// How late an event may arrive (`dialects.rs`).
const LATENESS: f64 = 0.040;
/// The float precision allowed on the engine's own figures.
const EXACT: f64 = 1e-4;

const QUEUE: &str = "tokentap_engine_queue_seconds";
const PREFILL: &str = "tokentap_engine_prefill_seconds";
const OUTSIDE: &str = "tokentap_time_to_first_token_outside_engine_seconds";

async fn sim() -> SimHandle {
    SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("sim-model", TTFT, ITL, TOKENS)],
        ..SimConfig::default()
    })
    .await
}

/// A streamed TensorRT-LLM `Generate` through tokentap at `url`; `perf_metrics` sets
/// `output_config.return_perf_metrics`.
async fn trtllm_call(url: &str, perf_metrics: bool) {
    let addr = url.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let message = trtllm::GenerateRequest {
        request_id: "t1".into(),
        tokenized: Some(trtllm::TokenizedInput {
            original_text: "hi".into(),
            input_token_ids: vec![1, 2, 3, 4],
            ..Default::default()
        }),
        streaming: true,
        output_config: Some(trtllm::OutputConfig {
            return_perf_metrics: perf_metrics,
            ..Default::default()
        }),
        ..Default::default()
    };
    let request = Request::post(format!("{url}/trtllm.TrtllmService/Generate"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-sim-queue-ms", QUEUE_MS.to_string())
        .body(Full::new(Bytes::from(frame(&message.encode_to_vec()))))
        .unwrap();
    let response = send.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let collected = response.into_body().collect().await.unwrap();
    let status = collected.trailers().and_then(|t| t.get("grpc-status"));
    assert_eq!(status.map(|v| v.as_bytes()), Some(&b"0"[..]));
}

/// `(count, mean)` of a histogram over every series.
fn observed(metrics: &Metrics, histogram: &str) -> (f64, f64) {
    let count = metrics.sum(&format!("{histogram}_count"), &[]);
    (count, metrics.sum(&format!("{histogram}_sum"), &[]) / count)
}

fn assert_joined(metrics: &Metrics, requests: f64, what: &str) {
    let (count, queue) = observed(metrics, QUEUE);
    assert_eq!(count, requests, "{what}: {QUEUE}");
    assert!((queue - 0.040).abs() < EXACT, "{what}: queue {queue}");
    let (count, prefill) = observed(metrics, PREFILL);
    assert_eq!(count, requests, "{what}: {PREFILL}");
    assert!((prefill - 0.110).abs() < EXACT, "{what}: prefill {prefill}");
    let (count, outside) = observed(metrics, OUTSIDE);
    assert_eq!(count, requests, "{what}: {OUTSIDE}");
    assert!(
        outside > 0.0 && outside < LATENESS,
        "{what}: outside the engine {outside}"
    );
    // The three parts add up to tokentap's TTFT.
    let ttft = metrics.mean("tokentap_time_to_first_token_seconds", &[]);
    eprintln!(
        "{what}: TTFT {ttft:.6} s = queue {queue:.6} + prefill {prefill:.6} + outside {outside:.6}"
    );
    assert!(
        (queue + prefill + outside - ttft).abs() < EXACT,
        "{what}: {queue} + {prefill} + {outside} != TTFT {ttft}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_perf_metrics_split_the_ttft_into_queue_prefill_and_outside() {
    let sim = sim().await;
    let proxy = Proxy::start(&sim.url(), "upstream:\n  http2: true\n").await;
    let url = proxy.url("");
    let url = url.trim_end_matches('/');

    // Not asked for: none sent, none recorded.
    trtllm_call(url, false).await;
    let metrics = proxy
        .wait_metrics("the first call recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    for family in [QUEUE, PREFILL, OUTSIDE] {
        assert_eq!(
            metrics.sum(&format!("{family}_count"), &[]),
            0.0,
            "{family}"
        );
    }

    for _ in 0..3 {
        trtllm_call(url, true).await;
    }
    let metrics = proxy
        .wait_metrics("the perf_metrics calls recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 4.0
        })
        .await;
    // The first call had no engine figures: TTFT is over all four.
    let ttft_count = metrics.sum("tokentap_time_to_first_token_seconds_count", &[]);
    assert_eq!(ttft_count, 4.0);
    let (count, queue) = observed(&metrics, QUEUE);
    assert_eq!(count, 3.0);
    assert!((queue - 0.040).abs() < EXACT, "queue {queue}");
    let (_, prefill) = observed(&metrics, PREFILL);
    assert!((prefill - 0.110).abs() < EXACT, "prefill {prefill}");
    let (count, outside) = observed(&metrics, OUTSIDE);
    assert_eq!(count, 3.0);
    assert!(outside > 0.0 && outside < LATENESS, "outside {outside}");
    eprintln!("trtllm: queue {queue:.6} s, prefill {prefill:.6} s, outside {outside:.6} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_durations_split_the_ttft_into_queue_prefill_and_outside() {
    let sim = sim().await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for _ in 0..3 {
        let body = serde_json::json!({
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
        });
        let request = Request::post(proxy.url("/api/chat"))
            .header("content-type", "application/json")
            .header("x-sim-queue-ms", QUEUE_MS.to_string())
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.into_body().collect().await.unwrap().to_bytes();
        let last = text.split(|b| *b == b'\n').rfind(|l| !l.is_empty());
        let last: serde_json::Value = serde_json::from_slice(last.unwrap()).unwrap();
        assert_eq!(last["load_duration"], 40_000_000);
        assert_eq!(last["prompt_eval_duration"], 110_000_000);
    }
    let metrics = proxy
        .wait_metrics("the Ollama calls recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 3.0
        })
        .await;
    assert_joined(&metrics, 3.0, "ollama");
}

/// TGI's `/generate` answer with its timing headers, as its router writes them.
fn tgi_answer() -> Vec<u8> {
    let body = r#"{"generated_text":" the sky","details":{"finish_reason":"length","generated_tokens":2}}"#;
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-compute-type: gpu+optimized\r\n\
         x-total-time: 291\r\nx-validation-time: 4\r\nx-queue-time: 37\r\n\
         x-inference-time: 250\r\nx-time-per-token: 125\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgi_reports_its_queue_in_the_response_head() {
    let backend = ScriptedBackend::start(vec![Step::Write(tgi_answer())]).await;
    let proxy = Proxy::start(&backend.url(), "").await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let sent = r#"{"inputs":"What colour is the sky?","parameters":{"max_new_tokens":2}}"#;
    for path in ["/generate", "/v1/chat/completions"] {
        let request = Request::post(proxy.url(path))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(sent)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap();
    }
    let metrics = proxy
        .wait_metrics("both answers recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 2.0
        })
        .await;
    // Only the TGI answer's head is read: one queue of 37 ms, and no prefill (its
    // x-inference-time is prefill and decoding) nor TTFT (not streamed).
    let (count, queue) = observed(&metrics, QUEUE);
    assert_eq!(count, 1.0);
    assert!((queue - 0.037).abs() < 1e-9, "queue {queue}");
    assert_eq!(metrics.sum(&format!("{PREFILL}_count"), &[]), 0.0);
    assert_eq!(metrics.sum(&format!("{OUTSIDE}_count"), &[]), 0.0);
    // The request went up as it was sent.
    for seen in backend.requests.lock().unwrap().iter() {
        assert!(
            seen.ends_with(sent.as_bytes()),
            "{}",
            String::from_utf8_lossy(seen)
        );
    }
}
