//! Configured observation end to end: `routes` that force a dialect (or mark a path as not
//! an LLM call), and `observe.skip_special_tokens` for TGI. A byte-exact scripted backend
//! answers every path with one recorded stream; tokentap sits in front with the config
//! under test, and the figures are read from its scraped `/metrics`.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::{body_text, client, Proxy, ScriptedBackend, Step};
use http::{Request, StatusCode};
use http_body_util::Full;

/// A scripted backend that streams `fixture` (under `tests/fixtures/`) as chunked
/// `text/event-stream`, in small pieces.
async fn streaming(fixture: &str) -> (ScriptedBackend, Vec<u8>) {
    let body = std::fs::read(format!("tests/fixtures/{fixture}")).expect("fixture");
    let mut script = vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec(),
    )];
    for piece in body.chunks(64) {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(piece);
        chunk.extend_from_slice(b"\r\n");
        script.push(Step::Write(chunk));
        script.push(Step::Sleep(Duration::from_millis(1)));
    }
    script.push(Step::Write(b"0\r\n\r\n".to_vec()));
    (ScriptedBackend::start(script).await, body)
}

async fn post(proxy: &Proxy, path: &str) -> (StatusCode, String) {
    let request = Request::post(proxy.url(path))
        .header("content-type", "application/json")
        .header("x-tenant-id", "routes")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"my-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .expect("request");
    let response = client().request(request).await.expect("response");
    (response.status(), body_text(response).await)
}

/// The model the requests name (the label prefers it to the response's).
const MODEL: &str = "my-model";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_forces_its_dialect_and_none_passes_through() {
    let (backend, body) = streaming("anthropic/stream_text.sse").await;
    let proxy = Proxy::start(
        &backend.url(),
        "\
routes:
  - path_prefix: /my/llm
    dialect: anthropic
  - path_prefix: /private
    dialect: none
",
    )
    .await;

    // A path nothing would detect is measured as the route's dialect.
    let (status, text) = post(&proxy, "/my/llm/invoke").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text.as_bytes(), body, "bytes pass unchanged");
    let m = proxy
        .wait_metrics("the routed stream", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    let labels = [("model", MODEL), ("tenant", "routes")];
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[("model", MODEL), ("outcome", "completed")]
        ),
        1.0,
        "{}",
        m.text
    );
    // Four text deltas, one estimated token each, apportioned from N in the final
    // message_delta.
    assert_eq!(
        m.sum(
            "tokentap_event_tokens_total",
            &[("accuracy", "apportioned")]
        ),
        16.0
    );
    assert_eq!(m.sum("tokentap_output_tokens_total", &labels), 16.0);
    assert_eq!(m.sum("tokentap_input_tokens_total", &labels), 21.0);

    // `none` wins over path detection: an LLM-shaped path under it is not measured.
    let passthrough_before = m.sum("tokentap_passthrough_requests_total", &[]);
    let (status, text) = post(&proxy, "/private/v1/messages").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text.as_bytes(), body);
    let m = proxy
        .wait_metrics("the passthrough", |m| {
            m.sum("tokentap_passthrough_requests_total", &[]) > passthrough_before
        })
        .await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0, "{}", m.text);

    // Without a route, detection still works (the same stream on its native path).
    let (status, _) = post(&proxy, "/v1/messages").await;
    assert_eq!(status, StatusCode::OK);
    proxy
        .wait_metrics("the detected stream", |m| {
            m.sum("tokentap_requests_total", &[("model", MODEL)]) >= 2.0
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_special_tokens_leaves_tgi_eos_out_of_the_event_counts() {
    let (backend, _) = streaming("tgi/generate_stream.sse").await;
    for (yaml, expected_events) in [
        // Seven token events, the last one the special `</s>`.
        ("", 7.0),
        ("observe:\n  skip_special_tokens: true\n", 6.0),
    ] {
        let proxy = Proxy::start(&backend.url(), yaml).await;
        let (status, _) = post(&proxy, "/generate_stream").await;
        assert_eq!(status, StatusCode::OK);
        let m = proxy
            .wait_metrics("the TGI stream", |m| {
                m.sum("tokentap_requests_total", &[]) >= 1.0
            })
            .await;
        assert_eq!(
            m.sum("tokentap_event_tokens_total", &[("accuracy", "exact")]),
            expected_events,
            "{yaml:?}\n{}",
            m.text
        );
        // N is TGI's own `generated_tokens` either way.
        assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 7.0);
    }
}
