//! A panic at each stage of an exchange, on each transport (the relay, hyper's HTTP/1.1,
//! h2c), through a whole tokentap: the client gets an answer or a broken-off response,
//! never a silently dropped connection, and the request is counted once.

use crate::observe::inject::INJECT;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::config::{Config, Overrides};
use crate::metrics::Metrics;
use crate::server::Server;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Relay,
    HyperH1,
    H2,
}

const TRANSPORTS: [Transport; 3] = [Transport::Relay, Transport::HyperH1, Transport::H2];

const SSE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n\
                   data: [DONE]\n\n";

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Whether `got` holds a whole request (a `Content-Length` or chunked body).
fn whole_request(got: &[u8]) -> bool {
    let Some(end) = find(got, b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let length = head.lines().find_map(|line| {
        line.strip_prefix("content-length:")
            .and_then(|n| n.trim().parse::<usize>().ok())
    });
    match length {
        Some(n) => got.len() >= end + 4 + n,
        None if head.contains("transfer-encoding: chunked") => got.ends_with(b"0\r\n\r\n"),
        None => true,
    }
}

/// An HTTP/1.1 upstream that answers each request with a one-token stream, with `extra`
/// header lines (each ending in CRLF), then closes.
async fn upstream(extra: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !whole_request(&got) {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{extra}\
                     content-length: {}\r\nconnection: close\r\n\r\n{SSE}",
                    SSE.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// A tokentap on `transport` in front of `upstream`: its proxy address and metrics.
async fn tokentap(upstream: &str, transport: Transport) -> (SocketAddr, Arc<Metrics>) {
    let overrides = Overrides {
        upstream: Some(upstream.to_string()),
        listen: Some("127.0.0.1:0".into()),
        admin: Some("127.0.0.1:0".into()),
        ui_listen: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    let yaml = format!(
        "proxy:\n  http1_fast_path: {}\n",
        transport == Transport::Relay
    );
    let config = Config::from_yaml(&yaml, "test", &overrides).expect("valid");
    let server = Server::bind(config).await.expect("binds").with_workers(1);
    let (addr, metrics) = (server.proxy_addr(), server.metrics());
    tokio::spawn(server.run(std::future::pending()));
    (addr, metrics)
}

/// What the client got: the status (`None`: no head) and the body as far as it came,
/// and whether it came whole.
struct Got {
    status: Option<u16>,
    body: Vec<u8>,
    whole: bool,
}

/// A streamed chat request for `model`, with `extra` header lines, over `transport`.
async fn ask(addr: SocketAddr, transport: Transport, model: &str, extra: &str) -> Got {
    let body = format!(r#"{{"model":"{model}","stream":true}}"#);
    if transport == Transport::H2 {
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http::<Full<Bytes>>();
        let mut request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json");
        if let Some((name, value)) = extra.trim_end().split_once(": ") {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(Bytes::from(body))).expect("request");
        // A stream reset before the head reached the client is a broken-off response too.
        let Ok(response) = client.request(request).await else {
            return Got {
                status: None,
                body: Vec::new(),
                whole: false,
            };
        };
        let status = Some(response.status().as_u16());
        let (body, whole) = match response.into_body().collect().await {
            Ok(collected) => (collected.to_bytes().to_vec(), true),
            Err(_) => (Vec::new(), false),
        };
        return Got {
            status,
            body,
            whole,
        };
    }
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         connection: close\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw)).await;
    let Some(end) = find(&raw, b"\r\n\r\n") else {
        return Got {
            status: None,
            body: Vec::new(),
            whole: false,
        };
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
    let body = raw[end + 4..].to_vec();
    let length = head.lines().find_map(|line| {
        line.strip_prefix("content-length:")
            .and_then(|n| n.trim().parse::<usize>().ok())
    });
    let whole = length == Some(body.len());
    Got {
        status,
        body,
        whole,
    }
}

/// The `tokentap_requests_total` series of `model` once one is recorded: (labels, value).
async fn recorded(metrics: &Metrics, model: &str) -> Vec<(String, f64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8(metrics.render()).expect("text");
        let series: Vec<(String, f64)> = text
            .lines()
            .filter(|l| l.starts_with("tokentap_requests_total{"))
            .filter(|l| l.contains(&format!("model=\"{model}\"")))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once(' ')?;
                Some((labels.to_string(), value.parse().ok()?))
            })
            .filter(|(_, value)| *value > 0.0)
            .collect();
        if !series.is_empty() {
            // Anything recorded twice would show by now.
            tokio::time::sleep(Duration::from_millis(50)).await;
            return series;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{model} never recorded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Check `model` was counted once, with `outcome` and `status`.
async fn counted_once(metrics: &Metrics, model: &str, outcome: &str, status: &str) {
    let series = recorded(metrics, model).await;
    assert_eq!(series.len(), 1, "{model}: {series:?}");
    let (labels, value) = &series[0];
    assert_eq!(*value, 1.0, "{model}: {labels}");
    assert!(
        labels.contains(&format!("outcome=\"{outcome}\""))
            && labels.contains(&format!("status=\"{status}\"")),
        "{model}: {labels}, not {outcome}/{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_sending_is_answered_502_and_counted_once() {
    let upstream = upstream("").await;
    for transport in TRANSPORTS {
        let (addr, metrics) = tokentap(&upstream, transport).await;
        let model = format!("send-{transport:?}");
        let got = ask(addr, transport, &model, &format!("{INJECT}: send\r\n")).await;
        assert_eq!(got.status, Some(502), "{model}");
        assert_eq!(
            String::from_utf8_lossy(&got.body),
            "tokentap: internal error while forwarding\n",
            "{model}"
        );
        // The panic came before the request body, where the model is read, was scanned.
        counted_once(&metrics, "unknown", "upstream_error", "tokentap_502").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_reading_the_head_forwards_the_upstreams_answer() {
    let upstream = upstream("x-tokentap-test-panic: head\r\n").await;
    for transport in TRANSPORTS {
        let (addr, metrics) = tokentap(&upstream, transport).await;
        let model = format!("head-{transport:?}");
        let got = ask(addr, transport, &model, "").await;
        assert_eq!(got.status, Some(200), "{model}");
        assert_eq!(String::from_utf8_lossy(&got.body), SSE, "{model}");
        assert!(got.whole, "{model}");
        counted_once(&metrics, &model, "completed", "2xx").await;
        let text = String::from_utf8(metrics.render()).expect("text");
        assert!(
            text.contains("tokentap_unobserved_responses_total{reason=\"observer_panic\"} 1\n"),
            "{model}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_body_breaks_the_response_off_and_counts_it_once() {
    let upstream = upstream("x-tokentap-test-panic: body\r\n").await;
    for transport in TRANSPORTS {
        let (addr, metrics) = tokentap(&upstream, transport).await;
        let model = format!("body-{transport:?}");
        let got = ask(addr, transport, &model, "").await;
        assert!(!got.whole, "{model}: a broken-off response came whole");
        counted_once(&metrics, &model, "upstream_error", "2xx").await;
    }
}
