//! The simulator's per-request controls, over HTTP: `x-sim-itl-ms` slows one response's
//! tokens, and a header value the simulator cannot read is a 400 (not a silently healthy
//! stream).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tokentap::sim::{ModelProfile, SimConfig};

use crate::common::{self, body_text, SimHandle};

fn post(url: String, body: serde_json::Value, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn chat_body(stream: bool) -> serde_json::Value {
    serde_json::json!({"model": "sim-model", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn an_itl_header_slows_that_responses_tokens() {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new(
            "sim-model",
            Duration::ZERO,
            Duration::from_millis(1),
            4,
        )],
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", sim.url());
    let started = Instant::now();
    let response = common::client()
        .request(post(url, chat_body(true), &[("x-sim-itl-ms", "60")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_text(response).await;
    // Deadlines are absolute: the last of 4 tokens is due 3 ITLs after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(180),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(body.matches("\"content\":\" ").count(), 4, "{body}");
}

#[tokio::test]
async fn a_sim_header_it_cannot_read_is_a_400() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let cases = [
        (
            "x-sim-fault",
            "eror-after=3",
            "x-sim-fault: `eror-after=3` is not one of reset-after=N,",
        ),
        (
            "x-sim-itl-ms",
            "20ms",
            "x-sim-itl-ms: `20ms` is not a whole number of milliseconds from 0 to 600000",
        ),
    ];
    for (name, value, message) in cases {
        let url = format!("{}/v1/chat/completions", sim.url());
        let response = common::client()
            .request(post(url, chat_body(true), &[(name, value)]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{name}");
        let body: serde_json::Value = serde_json::from_str(&body_text(response).await).unwrap();
        let text = body["error"]["message"].as_str().unwrap();
        assert!(text.starts_with(message), "{text}");
    }
}
