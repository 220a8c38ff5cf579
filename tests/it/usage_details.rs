//! Cached and reasoning tokens through the whole server, on every transport: each dialect's
//! usage fixture that states them gives `tokentap_usage_detail_tokens_total` the counts its
//! golden file states (the decoders' own test holds the golden to the payload), and input
//! and output tokens keep their meaning.

use crate::common;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use common::*;

/// (fixture under tests/fixtures, the path that routes to its dialect, model label)
const CASES: [(&str, &str); 5] = [
    (
        "openai/chat_openai_cached_reasoning.sse",
        "/v1/chat/completions",
    ),
    (
        "openai/chat_sglang_cache_report.sse",
        "/v1/chat/completions",
    ),
    ("responses/stream_cached_reasoning.sse", "/v1/responses"),
    ("anthropic/stream_prompt_cache.sse", "/v1/messages"),
    (
        "gemini/stream_cached_thinking.sse",
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
    ),
];

/// The last `details` and `usage` lines of a golden file: (read, write, reasoning, in, out).
fn stated(golden: &str) -> [Option<u64>; 5] {
    let value = |field: &str, line: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
            .and_then(|v| v.parse().ok())
    };
    let last = |prefix: &str| {
        golden
            .lines()
            .rfind(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line"))
            .to_string()
    };
    let (details, usage) = (last("details "), last("usage "));
    [
        value("read", &details),
        value("write", &details),
        value("reasoning", &details),
        value("in", &usage),
        value("out", &usage),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Relay,
    HyperH1,
    H2,
}

async fn counted_over(transport: Transport) {
    for (fixture, path) in CASES {
        let body = std::fs::read(format!("tests/fixtures/{fixture}")).expect("fixture");
        let golden = std::fs::read_to_string(format!(
            "tests/fixtures/{}",
            fixture.rsplit_once('.').unwrap().0.to_string() + ".golden"
        ))
        .expect("golden");
        let [read, write, reasoning, input, output] = stated(&golden);
        let mut head =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                .to_vec();
        head.extend_from_slice(&body);
        let backend = ScriptedBackend::start(vec![Step::Write(head)]).await;
        let fast_path = matches!(transport, Transport::Relay);
        let proxy = Proxy::start(
            &backend.url(),
            &format!("proxy:\n  http1_fast_path: {fast_path}\n"),
        )
        .await;
        let client: Client<_, Full<Bytes>> = match transport {
            Transport::H2 => Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
            _ => common::client(),
        };
        let request = http::Request::post(proxy.url(path))
            .header("content-type", "application/json")
            .header("x-tenant-id", "t")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"m","stream":true}"#,
            )))
            .unwrap();
        let response = client.request(request).await.expect("request");
        assert_eq!(response.status(), 200, "{fixture}");
        body_text(response).await;
        let m = proxy
            .wait_metrics(fixture, |m| m.sum("tokentap_requests_total", &[]) >= 1.0)
            .await;
        let at = format!("{transport:?} {fixture}\n{}", m.text);
        let kind = |kind: &str| {
            let labels = [("kind", kind), ("tenant", "t")];
            let present = m.text.contains(&format!(
                "tokentap_usage_detail_tokens_total{{kind=\"{kind}\""
            ));
            present.then(|| m.sum("tokentap_usage_detail_tokens_total", &labels) as u64)
        };
        assert_eq!(kind("cache_read_input"), read, "{at}");
        assert_eq!(kind("cache_write_input"), write, "{at}");
        assert_eq!(kind("reasoning_output"), reasoning, "{at}");
        if let Some(input) = input {
            assert_eq!(
                m.sum("tokentap_input_tokens_total", &[]) as u64,
                input,
                "{at}"
            );
        }
        if let Some(output) = output {
            assert_eq!(
                m.sum("tokentap_output_tokens_total", &[]) as u64,
                output,
                "{at}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_details_are_counted_through_the_relay() {
    counted_over(Transport::Relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_details_are_counted_through_hyper() {
    counted_over(Transport::HyperH1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_details_are_counted_over_h2() {
    counted_over(Transport::H2).await;
}
