//! Issue 16: every response forwarded whole, every outcome blaming the right side.
//!
//! Byte-exact cases use raw TCP sockets on both sides (a scripted upstream, a raw client);
//! h2 cases use hyper's HTTP/2 client with prior knowledge. Each case checks what the
//! client got, what the upstream got, and the `tokentap_requests_total` delta.
//! docs/RELIABILITY.md lists these tests beside the guarantees they prove.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokentap_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";
const MODELS: &str = "/v1/models";

fn requests(metrics: &Metrics, outcome: &str) -> f64 {
    metrics.sum("tokentap_requests_total", &[("outcome", outcome)])
}

/// The one access-log line of the request sent as `tenant` has `outcome` and the status
/// the client got.
async fn logged_once(tenant: &str, outcome: &str, status: u16) {
    access_log::assert_one_request_line("tenant", tenant, outcome, Some(status)).await;
}

/// One request over h2c (prior knowledge) on a fresh connection; the response head and
/// the whole body, or the error that ended it.
async fn h2_exchange<B>(
    addr: SocketAddr,
    request: Request<B>,
) -> (http::response::Parts, Result<Bytes, hyper::Error>)
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .expect("h2 response head");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map(|collected| collected.to_bytes());
    (parts, body)
}

fn status_line(raw: &[u8]) -> String {
    let end = find(raw, b"\r\n").unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// An SSE body of a few events, and its chunked encoding in uneven chunks.
fn sse_body() -> (Vec<u8>, Vec<u8>) {
    let mut body = Vec::new();
    for word in ["Hello", " there", ", how", " are", " you"] {
        body.extend_from_slice(
            format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{word}\"}}}}]}}\n\n")
                .as_bytes(),
        );
    }
    body.extend_from_slice(b"data: [DONE]\n\n");
    let mut chunked = Vec::new();
    for piece in body.chunks(37) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    (body, chunked)
}

fn raw_post(path: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: tokentap\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const CHAT_BODY: &str = r#"{"model":"m","stream":true,"messages":[]}"#;

/// Item 6: `Content-Length` beside `Transfer-Encoding: chunked` from the upstream. The
/// chunking delimits the body, so the length is removed (RFC 9112 6.3) and h1 and h2
/// clients get every byte, on an LLM route and a passthrough route.
#[tokio::test]
async fn content_length_beside_chunked_is_removed_and_the_whole_body_arrives() {
    let (body, chunked) = sse_body();
    for declared in [10, 1000] {
        let mut script = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
             Content-Length: {declared}\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes();
        script.extend_from_slice(&chunked);
        let upstream = ScriptedBackend::start(vec![Step::Write(script)]).await;
        let proxy = Proxy::start(&upstream.url(), "").await;
        for path in [CHAT, MODELS] {
            let before = proxy.metrics().await;
            let tenant = format!("cl-beside-chunked-{declared}");
            let raw = raw_exchange(
                proxy.addr,
                &raw_post(path, &format!("X-Tenant-ID: {tenant}-h1\r\n"), CHAT_BODY),
            )
            .await;
            let (lines, got, _) = parse_raw_response(&raw);
            assert_eq!(lines[0], "HTTP/1.1 200 OK", "{declared} {path}");
            assert!(
                !lines
                    .iter()
                    .any(|l| l.to_ascii_lowercase().starts_with("content-length")),
                "{declared} {path}: {lines:?}"
            );
            assert_eq!(got, body, "{declared} {path}: h1 body");

            let request = Request::post(format!("http://{}{path}", proxy.addr))
                .header("content-type", "application/json")
                .header("x-tenant-id", format!("{tenant}-h2"))
                .body(Full::new(Bytes::from(CHAT_BODY)))
                .unwrap();
            let (parts, got) = h2_exchange(proxy.addr, request).await;
            assert_eq!(parts.status, StatusCode::OK);
            assert!(
                !parts.headers.contains_key("content-length"),
                "{declared} {path}: {:?}",
                parts.headers
            );
            assert_eq!(got.expect("h2 body"), body, "{declared} {path}: h2 body");
            if path == CHAT {
                proxy
                    .wait_metrics("both requests completed", |m| {
                        requests(m, "completed") == requests(&before, "completed") + 2.0
                    })
                    .await;
                logged_once(&format!("{tenant}-h1"), "completed", 200).await;
                logged_once(&format!("{tenant}-h2"), "completed", 200).await;
            }
        }
    }
}

/// Item 7: a transfer coding besides `chunked` (`gzip, chunked`) cannot be re-expressed
/// once hyper removed the chunking: the client gets tokentap's 502 (never gzip bytes
/// with nothing saying so), counted `upstream_error`.
#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_answered_502() {
    let (_, chunked) = sse_body();
    for (n, coding) in ["gzip, chunked", "x-custom, chunked"]
        .into_iter()
        .enumerate()
    {
        let tenant = format!("request-coding-{n}");
        let mut script = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
             Transfer-Encoding: {coding}\r\n\r\n"
        )
        .into_bytes();
        script.extend_from_slice(&chunked);
        let upstream = ScriptedBackend::start(vec![Step::Write(script)]).await;
        let proxy = Proxy::start(&upstream.url(), "").await;
        let before = proxy.metrics().await;
        let raw = raw_exchange(
            proxy.addr,
            &raw_post(CHAT, &format!("X-Tenant-ID: {tenant}-h1\r\n"), CHAT_BODY),
        )
        .await;
        assert_eq!(status_line(&raw), "HTTP/1.1 502 Bad Gateway", "{coding}");
        assert!(
            find(&raw, b"unsupported transfer coding").is_some(),
            "{coding}"
        );

        let request = Request::post(format!("http://{}{CHAT}", proxy.addr))
            .header("x-tenant-id", format!("{tenant}-h2"))
            .body(Full::new(Bytes::from(CHAT_BODY)))
            .unwrap();
        let (parts, _) = h2_exchange(proxy.addr, request).await;
        assert_eq!(parts.status, StatusCode::BAD_GATEWAY, "{coding}: h2");
        proxy
            .wait_metrics("both counted upstream_error", |m| {
                requests(m, "upstream_error") == requests(&before, "upstream_error") + 2.0
            })
            .await;
        logged_once(&format!("{tenant}-h1"), "upstream_error", 502).await;
        logged_once(&format!("{tenant}-h2"), "upstream_error", 502).await;
    }
}

/// The request side of the same rule: a request with a transfer coding tokentap cannot
/// forward gets 501 (RFC 9112 6.1) and never reaches the upstream.
#[tokio::test]
async fn a_request_transfer_coding_other_than_chunked_is_answered_501() {
    let upstream = ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
    )])
    .await;
    let proxy = Proxy::start(&upstream.url(), "").await;
    let raw = raw_exchange(
        proxy.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
          X-Tenant-ID: request-gzip-chunked\r\n\
          Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(status_line(&raw), "HTTP/1.1 501 Not Implemented");
    proxy
        .wait_metrics("counted client_error", |m| {
            requests(m, "client_error") == 1.0
        })
        .await;
    logged_once("request-gzip-chunked", "client_error", 501).await;
    assert!(upstream.requests.lock().unwrap().is_empty());
}

/// Item 10: two `Host` headers are a 400 (RFC 9112 3.2) and reach no upstream; with
/// `host_header: preserve` an absolute-form target's host wins over `Host`.
#[tokio::test]
async fn duplicate_host_is_400_and_an_absolute_target_wins() {
    let upstream = ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    )])
    .await;
    for mode in ["upstream", "preserve"] {
        let proxy = Proxy::start(
            &upstream.url(),
            &format!("upstream:\n  host_header: {mode}\n"),
        )
        .await;
        let before = proxy.metrics().await;
        let raw = raw_exchange(
            proxy.addr,
            b"GET /v1/models HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\
              Connection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status_line(&raw), "HTTP/1.1 400 Bad Request", "{mode}");
        let tenant = format!("duplicate-host-{mode}");
        let raw = raw_exchange(
            proxy.addr,
            &raw_post(
                CHAT,
                &format!("Host: second.example\r\nX-Tenant-ID: {tenant}\r\n"),
                CHAT_BODY,
            ),
        )
        .await;
        assert_eq!(status_line(&raw), "HTTP/1.1 400 Bad Request", "{mode}");
        proxy
            .wait_metrics("the LLM request counted client_error", |m| {
                requests(m, "client_error") == requests(&before, "client_error") + 1.0
            })
            .await;
        logged_once(&tenant, "client_error", 400).await;
    }
    assert!(upstream.requests.lock().unwrap().is_empty());

    let proxy = Proxy::start(&upstream.url(), "upstream:\n  host_header: preserve\n").await;
    let raw = raw_exchange(
        proxy.addr,
        b"GET http://target.example/v1/models HTTP/1.1\r\nHost: other.example\r\n\
          Connection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_line(&raw), "HTTP/1.1 200 OK");
    let seen = upstream.requests.lock().unwrap()[0].clone();
    let head = String::from_utf8_lossy(&seen).to_ascii_lowercase();
    assert!(head.starts_with("get /v1/models http/1.1\r\n"), "{head}");
    assert!(head.contains("\r\nhost: target.example\r\n"), "{head}");
    assert!(!head.contains("other.example"), "{head}");
}

/// Item 9 (part): `CONNECT` is answered 405 with `Allow`, over h1 and h2, and never
/// forwarded (it used to become `CONNECT /`).
#[tokio::test]
async fn connect_is_405_with_allow_and_never_forwarded() {
    let upstream = ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
    )])
    .await;
    let proxy = Proxy::start(&upstream.url(), "").await;
    let raw = raw_exchange(
        proxy.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    )
    .await;
    assert_eq!(status_line(&raw), "HTTP/1.1 405 Method Not Allowed");
    let (lines, _, _) = parse_raw_response(&raw);
    let allow = lines
        .iter()
        .find_map(|l| l.strip_prefix("allow: "))
        .expect("an Allow header");
    assert!(
        allow.contains("POST") && !allow.contains("CONNECT"),
        "{allow}"
    );

    let request = Request::connect("example.com:443")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, _) = h2_exchange(proxy.addr, request).await;
    assert_eq!(parts.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(parts.headers.contains_key("allow"));
    assert!(upstream.requests.lock().unwrap().is_empty());
}

/// Item 3: a malformed chunked request body is the client's fault: `400`, counted
/// `client_error`, never `502`/`upstream_error`.
#[tokio::test]
async fn a_malformed_request_body_is_a_400_counted_as_client_error() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let body = CHAT_BODY;
    let cases: [(&str, String); 5] = [
        (
            "space before the size",
            format!(" {:x}\r\n{body}\r\n0\r\n\r\n", body.len()),
        ),
        (
            "0x prefix",
            format!("0x{:x}\r\n{body}\r\n0\r\n\r\n", body.len()),
        ),
        (
            "size overflow",
            format!("FFFFFFFFFFFFFFFFFF\r\n{body}\r\n0\r\n\r\n"),
        ),
        (
            "bare LF chunk line",
            format!("{:x}\n{body}\r\n0\r\n\r\n", body.len()),
        ),
        (
            "no CRLF after the data",
            format!("{:x}\r\n{body}XX0\r\n\r\n", body.len()),
        ),
    ];
    for (n, (what, chunked)) in cases.into_iter().enumerate() {
        let before = proxy.metrics().await;
        let tenant = format!("malformed-body-{n}");
        let request = format!(
            "POST {CHAT} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
             X-Tenant-ID: {tenant}\r\n\
             Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"
        );
        let raw = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert_eq!(status_line(&raw), "HTTP/1.1 400 Bad Request", "{what}");
        let after = proxy
            .wait_metrics(what, |m| {
                requests(m, "client_error") == requests(&before, "client_error") + 1.0
            })
            .await;
        assert_eq!(
            requests(&after, "upstream_error"),
            requests(&before, "upstream_error"),
            "{what}"
        );
        logged_once(&tenant, "client_error", 400).await;
    }
}

/// Item 4: a request body that stalls gets `408` after `limits.request_body_timeout`,
/// counted `client_error`, and frees its in-flight slot (here the only one), over h1
/// and h2.
#[tokio::test]
async fn a_stalled_request_body_is_a_408_and_frees_its_slot() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let proxy = Proxy::start(
        &sim.url(),
        "limits:\n  max_in_flight: 1\n  request_body_timeout: 300ms\n",
    )
    .await;

    let mut stalled = TcpStream::connect(proxy.addr).await.unwrap();
    stalled
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\
              X-Tenant-ID: stalled-body-h1\r\n\r\n{\"model\":\"m\",\"s",
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut raw))
        .await
        .expect("answered within 10 s")
        .unwrap();
    assert_eq!(status_line(&raw), "HTTP/1.1 408 Request Timeout");
    proxy
        .wait_metrics("the h1 stall counted client_error", |m| {
            requests(m, "client_error") == 1.0 && requests(m, "timeout") == 0.0
        })
        .await;
    logged_once("stalled-body-h1", "client_error", 408).await;

    // h2: 16 bytes of a 1000-byte body, then nothing (the sender is held open).
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    tx.send(Ok(Frame::data(Bytes::from_static(b"{\"model\":\"m\",\"s"))))
        .await
        .unwrap();
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let request = Request::post(format!("http://{}{CHAT}", proxy.addr))
        .header("content-length", "1000")
        .header("x-tenant-id", "stalled-body-h2")
        .body(StreamBody::new(Box::pin(frames)))
        .unwrap();
    let (parts, _) = h2_exchange(proxy.addr, request).await;
    assert_eq!(parts.status, StatusCode::REQUEST_TIMEOUT);
    drop(tx);
    proxy
        .wait_metrics("the h2 stall counted client_error", |m| {
            requests(m, "client_error") == 2.0
        })
        .await;
    logged_once("stalled-body-h2", "client_error", 408).await;

    // The only slot is free again: a whole request goes through.
    let response = client()
        .request(chat(&proxy.url(CHAT), "sim-model", "after", false, false))
        .await
        .expect("request after the stalls");
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await;
}

/// Item 3 on h2: a body that contradicts its `content-length` (more DATA than declared,
/// or END_STREAM short of it) is malformed (RFC 9113 8.1.1). The h2 crate resets the
/// stream with `PROTOCOL_ERROR` itself as the DATA arrives (h2 0.4 `recv_data`:
/// "content-length overflow" / "underflow"), before hyper hands tokentap the frame, so no
/// `400` can reach the client: it sees the reset. The request is recorded once, never
/// against the upstream: `client_error` when the upstream exchange hears of the broken
/// body first, `cancelled` when hyper first sees the stream reset while the handler
/// waits (`proto/h2/server.rs` checks `poll_reset` and drops the handler), which tokentap
/// cannot tell from a client's own reset.
#[tokio::test]
async fn an_h2_body_that_contradicts_its_content_length_is_reset_and_never_the_upstreams_fault() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    for (n, (what, declared)) in [("more than declared", "5"), ("short of it", "1000")]
        .into_iter()
        .enumerate()
    {
        let tenant = format!("h2-content-length-{n}");
        let request = Request::post(format!("http://{}{CHAT}", proxy.addr))
            .header("content-type", "application/json")
            .header("content-length", declared)
            .header("x-tenant-id", &tenant)
            .body(Full::new(Bytes::from(CHAT_BODY)))
            .unwrap();
        let stream = TcpStream::connect(proxy.addr).await.expect("connect");
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("h2 handshake");
        tokio::spawn(connection);
        let err = sender.send_request(request).await.expect_err(what);
        // hyper wraps the h2 error; its reason shows in the error's debug form.
        let shown = format!("{err:?}");
        assert!(shown.contains("PROTOCOL_ERROR"), "{what}: {shown}");

        let lines = access_log::wait_for_lines("tenant", &tenant, 1).await;
        assert_eq!(lines.len(), 1, "{what}: logged once: {lines:?}");
        let outcome = lines[0].field("outcome");
        assert!(
            matches!(outcome, Some("client_error" | "cancelled")),
            "{what}: {lines:?}"
        );
        let m = proxy
            .wait_metrics(what, |m| {
                m.sum("tokentap_requests_total", &[("tenant", &tenant)]) == 1.0
            })
            .await;
        assert_eq!(requests(&m, "upstream_error"), 0.0, "{what}");
    }
}

/// A scripted upstream that answers every request with one short SSE stream.
async fn sse_upstream() -> ScriptedBackend {
    let body = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";
    ScriptedBackend::start(vec![Step::Write(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )])
    .await
}

async fn chat_as(proxy: &Proxy, model: &str, tenant: &str) {
    let body = serde_json::json!({"model": model, "stream": true, "messages": []}).to_string();
    let raw = raw_exchange(
        proxy.addr,
        &raw_post(CHAT, &format!("X-Tenant-ID: {tenant}\r\n"), &body),
    )
    .await;
    assert_eq!(status_line(&raw), "HTTP/1.1 200 OK", "{model} {tenant}");
}

/// Smaller items: bidi controls and zero-width characters in a label value are
/// replaced (U+FFFD), and `labels.max_pairs` bounds (model, tenant) pairs: a new pair
/// past it is counted as (`other`, `other`) and in `label_overflow_total{label="pair"}`.
#[tokio::test]
async fn label_values_are_made_visible_and_pairs_are_capped() {
    let upstream = sse_upstream().await;
    let proxy = Proxy::start(&upstream.url(), "labels:\n  max_pairs: 3\n").await;
    chat_as(&proxy, "gpt\u{202E}4o\u{200B}", "t1").await;
    let m = proxy
        .wait_metrics("the bidi request", |m| requests(m, "completed") == 1.0)
        .await;
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[("model", "gpt\u{FFFD}4o\u{FFFD}"), ("tenant", "t1")]
        ),
        1.0,
        "{}",
        m.text
    );
    assert!(!m.text.contains('\u{202E}') && !m.text.contains('\u{200B}'));

    for (model, tenant) in [
        ("a", "t1"),
        ("a", "t2"),
        ("b", "t1"),
        ("b", "t2"),
        ("a", "t1"),
    ] {
        chat_as(&proxy, model, tenant).await;
    }
    let m = proxy
        .wait_metrics("six requests", |m| requests(m, "completed") == 6.0)
        .await;
    // Admitted: (gpt…, t1), (a, t1), (a, t2); (b, t1) and (b, t2) overflow.
    let pair = |model: &str, tenant: &str| {
        m.sum(
            "tokentap_requests_total",
            &[("model", model), ("tenant", tenant)],
        )
    };
    assert_eq!(pair("a", "t1"), 2.0);
    assert_eq!(pair("a", "t2"), 1.0);
    assert_eq!(pair("b", "t1") + pair("b", "t2"), 0.0);
    assert_eq!(pair("other", "other"), 2.0);
    assert_eq!(
        m.sum("tokentap_label_overflow_total", &[("label", "pair")]),
        2.0
    );
}

/// Smaller items: a 1 MiB `model` (too long for the request scanner to read) is labelled
/// `other` and counted in `label_overflow_total{label="model"}`, not `unknown`, over h1
/// and h2; the request is forwarded whole.
#[tokio::test]
async fn a_model_too_long_to_read_is_other_and_counted_as_overflow() {
    let upstream = sse_upstream().await;
    let proxy = Proxy::start(&upstream.url(), "").await;
    let model = "m".repeat(1 << 20);
    let body = serde_json::json!({"model": model, "stream": true, "messages": []}).to_string();

    let raw = raw_exchange(
        proxy.addr,
        &raw_post(CHAT, "X-Tenant-ID: long-h1\r\n", &body),
    )
    .await;
    assert_eq!(status_line(&raw), "HTTP/1.1 200 OK");

    let request = Request::post(format!("http://{}{CHAT}", proxy.addr))
        .header("content-type", "application/json")
        .header("x-tenant-id", "long-h2")
        .header("content-length", body.len())
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let (parts, response) = h2_exchange(proxy.addr, request).await;
    assert_eq!(parts.status, StatusCode::OK);
    response.expect("the h2 body");

    let m = proxy
        .wait_metrics("both requests", |m| requests(m, "completed") == 2.0)
        .await;
    for tenant in ["long-h1", "long-h2"] {
        assert_eq!(
            m.sum(
                "tokentap_requests_total",
                &[("model", "other"), ("tenant", tenant)]
            ),
            1.0,
            "{tenant}"
        );
        let line =
            access_log::assert_one_request_line("tenant", tenant, "completed", Some(200)).await;
        assert_eq!(line.field("model"), Some("other"));
    }
    assert_eq!(
        m.sum("tokentap_requests_total", &[("model", "unknown")]),
        0.0
    );
    assert_eq!(
        m.sum("tokentap_label_overflow_total", &[("label", "model")]),
        2.0
    );
    let seen = upstream.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|request| request.ends_with(body.as_bytes())),
        "the upstream got both bodies whole"
    );
}

/// Smaller items: a corrupt gzip response is forwarded as it came and counted under a
/// reason of its own, `corrupt_encoding` (not `decode_limit`).
#[tokio::test]
async fn a_corrupt_gzip_response_has_its_own_unobserved_reason() {
    // A gzip header, then a deflate block of the reserved type 11: not decompressible.
    let body: &[u8] = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff";
    let mut script = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    script.extend_from_slice(body);
    let upstream = ScriptedBackend::start(vec![Step::Write(script)]).await;
    let proxy = Proxy::start(&upstream.url(), "").await;
    let raw = raw_exchange(proxy.addr, &raw_post(CHAT, "", CHAT_BODY)).await;
    let (_, got, _) = parse_raw_response(&raw);
    assert_eq!(got, body, "forwarded as it came");
    let m = proxy
        .wait_metrics("the request", |m| requests(m, "completed") == 1.0)
        .await;
    assert_eq!(
        m.sum(
            "tokentap_unobserved_responses_total",
            &[("reason", "corrupt_encoding")]
        ),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(
            "tokentap_unobserved_responses_total",
            &[("reason", "decode_limit")]
        ),
        0.0
    );
}

/// A raw upstream that reads one chunked request to its last chunk and trailers, keeps
/// it, and answers `200` with an empty body.
async fn chunked_request_upstream() -> (SocketAddr, tokio::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // The last chunk, then the trailer section up to its empty line.
                let complete = |seen: &[u8]| {
                    find(seen, b"\r\n0\r\n")
                        .is_some_and(|i| find(&seen[i + 3..], b"\r\n\r\n").is_some())
                };
                while !complete(&seen) {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
                let _ = tx.send(seen).await;
            });
        }
    });
    (addr, rx)
}

/// Item 8: which trailers pass, exactly. hyper (1.12) writes HTTP/1.1 trailers only when
/// they are declared in the message's `Trailer` header, and a server only to a client
/// that sent `TE: trailers`; it reads every trailer it receives, and h2 sends them all.
/// So: upstream trailers reach an h2 client whole, an h1 client with `TE: trailers`
/// only as declared, an h1 client without it not at all; client trailers reach an h1
/// upstream as declared in the request's `Trailer` header.
#[tokio::test]
async fn trailers_pass_as_far_as_http1_lets_them() {
    let script = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTrailer: x-declared\r\n\
        Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-declared: 1\r\nx-undeclared: 2\r\n\r\n"
        .to_vec();
    let upstream = ScriptedBackend::start(vec![Step::Write(script)]).await;
    let proxy = Proxy::start(&upstream.url(), "").await;
    let cases: [(&str, &[&str]); 2] = [("TE: trailers\r\n", &["x-declared: 1"]), ("", &[])];
    for (te, expected) in cases {
        let raw = raw_exchange(
            proxy.addr,
            format!("GET /download HTTP/1.1\r\nHost: t\r\n{te}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        let (_, body, trailers) = parse_raw_response(&raw);
        assert_eq!(body, b"hello", "{te:?}");
        assert_eq!(trailers, expected, "h1 client {te:?}");
    }
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let response = sender
        .send_request(
            Request::get(format!("http://{}/download", proxy.addr))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("h2 trailers");
    assert_eq!(trailers["x-declared"], "1");
    assert_eq!(trailers["x-undeclared"], "2");

    // Client trailers to an h1 upstream: declared ones only.
    let (addr, mut seen) = chunked_request_upstream().await;
    let proxy = Proxy::start(&format!("http://{addr}"), "").await;
    let raw = raw_exchange(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTrailer: x-declared\r\n\
          Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-declared: 1\r\n\
          x-undeclared: 2\r\n\r\n",
    )
    .await;
    assert_eq!(status_line(&raw), "HTTP/1.1 200 OK");
    let request = String::from_utf8(seen.recv().await.expect("the upstream's request")).unwrap();
    let tail = &request[request.find("\r\n0\r\n").unwrap()..];
    assert_eq!(tail, "\r\n0\r\nx-declared: 1\r\n\r\n", "{request}");
}

/// Shutdown: connections that have not delivered one whole request (nothing sent, half a
/// head, half an h2 preface, an h2 preface and no stream) are closed at once instead of
/// holding the drain for `shutdown.drain_timeout` (here 20 s).
#[tokio::test]
async fn shutdown_closes_connections_without_a_request_at_once() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let mut proxy = Proxy::start(&sim.url(), "shutdown:\n  drain_timeout: 20s\n").await;
    let openings: [&[u8]; 4] = [
        b"",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Ty",
        b"PRI * HTTP/2.0\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    ];
    let mut idle = Vec::new();
    for opening in openings {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        stream.write_all(opening).await.unwrap();
        idle.push(stream);
    }
    // Accepted in order: once a later connection is served, the idle ones were accepted.
    let response = proxy.get(MODELS).await;
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await;

    let started = tokio::time::Instant::now();
    proxy.shutdown();
    let task = proxy.task.take().expect("server task");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("shutdown within 5 s, not the 20 s drain deadline")
        .unwrap()
        .unwrap();
    eprintln!("shut down in {:?}", started.elapsed());
    for (i, mut stream) in idle.into_iter().enumerate() {
        let mut rest = Vec::new();
        // h2 connections may get a GOAWAY first; then the connection ends. A connection
        // whose bytes tokentap had not read yet when it closed it ends with a reset (the
        // kernel's answer to closing with unread data): closed at once all the same.
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
            .await
            .expect("closed");
        let reset = matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
        assert!(
            read.is_ok() || reset || i >= 2,
            "connection {i}: {read:?} {rest:?}"
        );
    }
}

/// An upstream that answers each upgrade request `101` and then echoes bytes.
async fn echoing_upgrade_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                if read_request(&mut stream, &mut buf).await.is_none() {
                    return;
                }
                let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                    Connection: Upgrade\r\n\r\n";
                if stream.write_all(switch).await.is_err() {
                    return;
                }
                let mut chunk = [0u8; 1024];
                while let Ok(n @ 1..) = stream.read(&mut chunk).await {
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// What `client` reads up to the end of the `101`'s head (within 10 s).
async fn switched(client: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    while find(&seen, b"\r\n\r\n").is_none() {
        let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk))
            .await
            .expect("101 within 10 s")
            .unwrap();
        assert!(n > 0, "closed before the 101: {seen:?}");
        seen.extend_from_slice(&chunk[..n]);
    }
    seen
}

/// Whether `client`'s tunnel echoes `message` within a second.
async fn echoes(client: &mut TcpStream, message: &[u8]) -> bool {
    if client.write_all(message).await.is_err() {
        return false;
    }
    let mut echoed = vec![0u8; message.len()];
    let read = tokio::time::timeout(Duration::from_secs(1), client.read_exact(&mut echoed));
    matches!(read.await, Ok(Ok(_))) && echoed == message
}

/// A WebSocket tunnel open at shutdown is drained like any stream: it carries bytes
/// until the drain deadline (2 s here), not just until the accept loop stops, and is cut
/// after it.
#[tokio::test]
async fn a_tunnel_open_at_shutdown_lives_until_the_drain_deadline() {
    let upstream = echoing_upgrade_upstream().await;
    let proxy = Proxy::start(
        &format!("http://{upstream}"),
        "shutdown:\n  drain_timeout: 2s\n",
    )
    .await;
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    client
        .write_all(
            b"GET /v1/realtime HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n\
              Connection: Upgrade\r\n\r\n",
        )
        .await
        .unwrap();
    switched(&mut client).await;
    assert!(echoes(&mut client, b"before").await);
    let stopped = std::time::Instant::now();
    proxy.shutdown();
    // Past the second a drain with nothing to wait for would have taken.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        echoes(&mut client, b"while draining").await,
        "the tunnel was cut {:?} into a 2 s drain",
        stopped.elapsed()
    );
    // After the deadline the server has stopped, and the tunnel with it.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the tunnel outlived the drain deadline");
    assert!(
        stopped.elapsed() >= Duration::from_secs(2),
        "cut before the deadline"
    );
}

/// Item 9: an HTTP/1.1 `Upgrade` (WebSocket) reaches the upstream with `Upgrade` and
/// `Connection: upgrade`, the client gets the `101` with `Upgrade`, and then bytes flow
/// both ways untouched (the raw upstream echoes them); counted as a passthrough.
#[tokio::test]
async fn websocket_upgrades_are_tunnelled_as_a_byte_relay() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (head_tx, mut head_rx) = tokio::sync::mpsc::channel(1);
    // Every connection is served: the readiness probe opens (and drops) some too.
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(echo_after_101(stream, head_tx.clone()));
        }
    });
    async fn echo_after_101(mut stream: TcpStream, head_tx: tokio::sync::mpsc::Sender<Vec<u8>>) {
        let mut buf = Vec::new();
        let Some(length) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let _ = head_tx.send(buf[..length].to_vec()).await;
        stream
            .write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                  Connection: Upgrade\r\nSec-WebSocket-Accept: abc=\r\n\r\n",
            )
            .await
            .unwrap();
        let mut chunk = [0u8; 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    let proxy = Proxy::start(&format!("http://{upstream}"), "").await;
    let before = proxy.metrics().await;
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    client
        .write_all(
            b"GET /v1/realtime HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n\
              Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              Sec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
    let seen = switched(&mut client).await;
    let head = String::from_utf8_lossy(&seen).to_ascii_lowercase();
    assert!(
        head.starts_with("http/1.1 101 switching protocols\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(head.contains("\r\nconnection: upgrade\r\n"), "{head}");
    assert!(
        head.contains("\r\nsec-websocket-accept: abc=\r\n"),
        "{head}"
    );

    let upstream_head = String::from_utf8(head_rx.recv().await.unwrap())
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        upstream_head.contains("\r\nupgrade: websocket\r\n"),
        "{upstream_head}"
    );
    assert!(
        upstream_head.contains("\r\nconnection: upgrade\r\n"),
        "{upstream_head}"
    );

    for message in [&b"\x81\x05hello"[..], &[0u8, 1, 2, 255, 13, 10][..]] {
        client.write_all(message).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut echoed))
            .await
            .expect("echo within 10 s")
            .unwrap();
        assert_eq!(echoed, message);
    }
    let m = proxy.metrics().await;
    assert_eq!(
        m.sum("tokentap_passthrough_requests_total", &[])
            - before.sum("tokentap_passthrough_requests_total", &[]),
        1.0
    );
    assert_eq!(m.sum("tokentap_requests_total", &[]), 0.0);
}
