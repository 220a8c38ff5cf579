//! A response that arrived in one burst is called one (`observe::burst`): behind a hop
//! that collects the whole body and sends it in one write, on every transport, it is
//! counted in `tokentap_buffered_responses_total`, marked in the access log, and none of
//! its gaps passes for decoding (no ITL, inter-chunk or TPOT observation); the
//! simulator's own streams are not flagged, at one token per event or 1-3, at 500 tokens
//! per second, nor is a `stream: false` answer.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::*;
use tokentap_sim::{ModelProfile, SimConfig, TokensPerEvent, UsageMode};

const CHAT: &str = "/v1/chat/completions";

/// A buffering hop: each request goes to `upstream` as it is; the response is read whole
/// (to the end of its chunked body) and written to the client in one write, as nginx
/// with `proxy_buffering on` does for a short answer.
async fn buffering_hop(upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut engine) = TcpStream::connect(upstream).await else {
                    return;
                };
                let mut request = Vec::new();
                while let Some(n) = read_request(&mut client, &mut request).await {
                    let rest = request.split_off(n);
                    if engine.write_all(&request).await.is_err() {
                        return;
                    }
                    request = rest;
                    let mut response = Vec::new();
                    let mut chunk = [0u8; 8192];
                    while find(&response, b"\r\n0\r\n\r\n").is_none() {
                        match engine.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => response.extend_from_slice(&chunk[..n]),
                        }
                    }
                    if client.write_all(&response).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Relay,
    HyperH1,
    H2,
}

fn client_for(
    transport: Transport,
) -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    match transport {
        Transport::H2 => Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http(),
        _ => common::client(),
    }
}

/// 40 tokens, one per event, 3 ms apart: a stream the hop turns into one burst.
fn sim() -> SimConfig {
    SimConfig {
        models: vec![ModelProfile::new(
            "m",
            Duration::from_millis(5),
            Duration::from_millis(3),
            40,
        )],
        usage: UsageMode::Always,
        ..SimConfig::default()
    }
}

async fn flagged_behind_the_hop(transport: Transport) {
    let sim = SimHandle::start(sim()).await;
    let hop = buffering_hop(sim.addr).await;
    let fast_path = matches!(transport, Transport::Relay);
    let proxy = Proxy::start(
        &format!("http://{hop}"),
        &format!("proxy:\n  http1_fast_path: {fast_path}\n"),
    )
    .await;
    let response = client_for(transport)
        .request(chat(&proxy.url(CHAT), "m", "t", true, true))
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let body = body_text(response).await;
    assert!(
        body.contains("[DONE]"),
        "the whole stream reaches the client: {body}"
    );
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    let at = format!("{transport:?}\n{}", m.text);
    assert_eq!(
        m.sum("tokentap_buffered_responses_total", &[("model", "m")]),
        1.0,
        "{at}"
    );
    assert_eq!(
        m.sum("tokentap_output_tokens_total", &[("model", "m")]),
        40.0,
        "{at}"
    );
    assert_eq!(
        m.sum(
            "tokentap_time_to_first_token_seconds_count",
            &[("model", "m")]
        ),
        1.0,
        "{at}"
    );
    for family in [
        "tokentap_inter_token_latency_seconds_count",
        "tokentap_inter_chunk_latency_seconds_count",
        "tokentap_time_per_output_token_seconds_count",
        "tokentap_output_tokens_per_second_count",
    ] {
        assert_eq!(m.sum(family, &[("model", "m")]), 0.0, "{family}: {at}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffering_hop_is_flagged_through_the_relay() {
    flagged_behind_the_hop(Transport::Relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffering_hop_is_flagged_through_hyper() {
    flagged_behind_the_hop(Transport::HyperH1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffering_hop_is_flagged_over_h2() {
    flagged_behind_the_hop(Transport::H2).await;
}

/// The simulator's own streams, on every transport: one token per event at 3 ms, 1-3
/// tokens per event at 2 ms a token (500 tokens/s), and a `stream: false` answer. None is
/// flagged, and the streams' gaps are observed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_stream_are_not_flagged() {
    let mut fast = ModelProfile::new(
        "fast",
        Duration::from_millis(5),
        Duration::from_millis(2),
        60,
    );
    fast.tokens_per_event = TokensPerEvent::range(1, 3).expect("1 to 3");
    let mut config = sim();
    config.models.push(fast);
    let sim = SimHandle::start(config).await;
    for transport in [Transport::Relay, Transport::HyperH1, Transport::H2] {
        let fast_path = matches!(transport, Transport::Relay);
        let proxy = Proxy::start(
            &sim.url(),
            &format!("proxy:\n  http1_fast_path: {fast_path}\n"),
        )
        .await;
        let client = client_for(transport);
        for (model, stream) in [("m", true), ("fast", true), ("m", false)] {
            let response = client
                .request(chat(&proxy.url(CHAT), model, "t", stream, stream))
                .await
                .expect("request");
            assert_eq!(response.status(), 200);
            body_text(response).await;
        }
        let m = proxy
            .wait_metrics("three requests", |m| {
                m.sum("tokentap_requests_total", &[]) >= 3.0
            })
            .await;
        let at = format!("{transport:?}\n{}", m.text);
        assert_eq!(m.sum("tokentap_buffered_responses_total", &[]), 0.0, "{at}");
        for model in ["m", "fast"] {
            assert!(
                m.sum(
                    "tokentap_inter_chunk_latency_seconds_count",
                    &[("model", model)]
                ) > 0.0,
                "{model}: {at}"
            );
        }
    }
}
