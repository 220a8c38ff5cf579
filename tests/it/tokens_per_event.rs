//! `tokentap_output_tokens_per_event` through the proxy: one observation per token-bearing
//! event whose count the wire format gave exactly, with that count, and nothing for an
//! estimated one. The simulator's gRPC engine (token ids) and a recorded vLLM completions
//! stream with logprobs give the exact counts; the simulator's OpenAI chat stream without
//! logprobs or continuous usage gives estimates only.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokentap::wire::grpc::framing::frame;
use tokentap::wire::grpc::proto::sglang::grpc::scheduler as sglang;
use tokentap_sim::{ModelProfile, SimConfig, TokensPerEvent, UsageMode};

const FAMILY: &str = "tokentap_output_tokens_per_event";
const GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";

/// The observations of `FAMILY` in each of its buckets up to `le="64"`, not cumulative:
/// `(upper bound, count)`.
fn per_bucket(m: &Metrics) -> Vec<(String, f64)> {
    let bounds = ["1", "2", "3", "4", "5", "6", "8", "12", "16", "32", "64"];
    let mut below = 0.0;
    bounds
        .iter()
        .map(|le| {
            let cumulative = m.sum(&format!("{FAMILY}_bucket"), &[("le", le)]);
            let here = cumulative - below;
            below = cumulative;
            (le.to_string(), here)
        })
        .collect()
}

/// One SGLang `Generate` call to `url` over h2c; returns the `grpc-status` of its
/// trailers.
async fn generate(url: &str) -> Option<String> {
    let addr = url.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2c handshake");
    tokio::spawn(connection);
    let body = frame(
        &sglang::GenerateRequest {
            request_id: "tpe".into(),
            stream: true,
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let request = Request::post(format!("{url}{GENERATE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = send.send_request(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut status = None;
    while let Some(frame) = body.frame().await {
        if let Ok(trailers) = frame.expect("body intact").into_trailers() {
            status = trailers
                .get("grpc-status")
                .map(|v| v.to_str().expect("ASCII").to_string());
        }
    }
    status
}

/// A gRPC engine whose steps carry 1-3 token ids: every step is observed with its ids,
/// so the histogram has observations at 1, 2 and 3 and nowhere else, one per message,
/// adding up to the tokens generated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_token_ids_are_observed_per_message() {
    const TOKENS: u32 = 40;
    const CALLS: u32 = 3;
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile {
            tokens_per_event: TokensPerEvent::range(1, 3).expect("a range"),
            ..ModelProfile::new("spec", Duration::ZERO, Duration::from_millis(1), TOKENS)
        }],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "upstream:\n  http2: true\n").await;
    for _ in 0..CALLS {
        assert_eq!(generate(&proxy.url("")).await.as_deref(), Some("0"));
    }
    let m = proxy
        .wait_metrics("every call recorded", |m| {
            m.sum("tokentap_requests_total", &[("outcome", "completed")]) >= f64::from(CALLS)
        })
        .await;
    let tokens = f64::from(TOKENS * CALLS);
    assert_eq!(m.sum(&format!("{FAMILY}_sum"), &[]), tokens, "{}", m.text);
    let events = m.sum(&format!("{FAMILY}_count"), &[]);
    assert!(
        events >= tokens / 3.0 && events < tokens,
        "{events} messages of 1-3 ids"
    );
    let buckets = per_bucket(&m);
    let at = |le: &str| buckets.iter().find(|(b, _)| b == le).map_or(0.0, |b| b.1);
    assert!(
        at("1") > 0.0 && at("2") > 0.0 && at("3") > 0.0,
        "{buckets:?}"
    );
    assert_eq!(at("1") + at("2") + at("3"), events, "{buckets:?}");
    // docs/METRICS.md, "Cardinality": a model with exact counts costs 14 series more, 12 buckets
    // (`+Inf` included), `_sum` and `_count`, and no tenant label.
    let lines: Vec<&str> = m
        .text
        .lines()
        .filter(|l| l.starts_with(FAMILY) && !l.starts_with('#'))
        .collect();
    assert_eq!(lines.len(), 14, "{lines:#?}");
    assert!(lines.iter().all(|l| !l.contains("tenant=")), "{lines:#?}");
}

/// A completions stream with logprobs (`tests/fixtures/openai/completions_vllm_logprobs.sse`:
/// 1, 2, 1 and 1 tokens) is observed event by event; the simulator's chat stream, whose
/// counts are estimated from its text, adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_observed_and_estimates_are_not() {
    let fixture = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/openai/completions_vllm_logprobs.sse"),
    )
    .expect("fixture");
    let mut head =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n".to_vec();
    head.extend_from_slice(&fixture);
    let backend = ScriptedBackend::start(vec![Step::Write(head)]).await;
    let proxy = Proxy::start(&backend.url(), "").await;
    let request = Request::post(proxy.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"Qwen/Qwen2.5-7B","prompt":"hi","stream":true,"logprobs":1}"#,
        )))
        .expect("request");
    let response = client().request(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    body_bytes(response).await;
    let m = proxy
        .wait_metrics("the request recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    let model = [("model", "Qwen/Qwen2.5-7B")];
    assert_eq!(m.sum(&format!("{FAMILY}_count"), &model), 4.0, "{}", m.text);
    assert_eq!(m.sum(&format!("{FAMILY}_sum"), &model), 5.0);
    let buckets = per_bucket(&m);
    assert_eq!(buckets[0], ("1".to_string(), 3.0));
    assert_eq!(buckets[1], ("2".to_string(), 1.0));

    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile {
            tokens_per_event: TokensPerEvent::range(1, 3).expect("a range"),
            ..ModelProfile::new("m", Duration::ZERO, Duration::from_millis(1), 12)
        }],
        usage: UsageMode::Always,
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let response = client()
        .request(chat(
            &proxy.url("/v1/chat/completions"),
            "m",
            "t",
            true,
            true,
        ))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    body_bytes(response).await;
    let m = proxy
        .wait_metrics("the request recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_output_tokens_total", &[]),
        12.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(&format!("{FAMILY}_count"), &[]),
        0.0,
        "estimated counts are not the engine's shape\n{}",
        m.text
    );
}
