//! One exchange policy, every transport: the same bytes in give the same bytes out, the
//! same outcome and the same access line, whether the request comes over HTTP/1.1 through
//! the relay (`proxy.http1_fast_path: true`), over HTTP/1.1 through hyper (`false`), or as
//! an h2c stream. Each test runs its cases over every transport the case exists on (the
//! three, or the two HTTP/1.1 paths for what only HTTP/1.1 can say); the cases are those a
//! hostile probe tried, where one transport's answer could differ from another's.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{access_log, find, read_request, Proxy, ScriptedBackend, Step};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const CHAT: &str = "/v1/chat/completions";

/// How long a client's departure may take to reach the upstream in these tests: far above
/// what it takes (the next poll of the client's connection, well under a millisecond on
/// an idle machine), so that a loaded 2-core CI machine does not fail it.
const ABORT_BOUND: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// HTTP/1.1 through the relay.
    Relay,
    /// HTTP/1.1 through hyper's server and client.
    HyperH1,
    /// h2c through hyper.
    H2,
}

const TRANSPORTS: [Transport; 3] = [Transport::Relay, Transport::HyperH1, Transport::H2];

impl Transport {
    /// tokentap for this transport in front of `upstream`, with more YAML.
    async fn proxy(self, upstream: &str, yaml: &str) -> Proxy {
        let fast = self == Transport::Relay;
        let yaml = format!("proxy:\n  http1_fast_path: {fast}\n{yaml}");
        Proxy::start(upstream, &yaml).await
    }
}

/// A streamed chat request for `model`, as raw HTTP/1.1.
fn raw_chat(model: &str) -> Vec<u8> {
    raw_chat_with(model, "")
}

/// [`raw_chat`] with more header lines (each ending in CRLF).
fn raw_chat_with(model: &str, headers: &str) -> Vec<u8> {
    let body = format!(r#"{{"model":"{model}","stream":true}}"#);
    format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The same request for hyper's h2 client.
fn h2_chat(proxy: &Proxy, model: &str) -> http::Request<Full<Bytes>> {
    common::chat(&proxy.url(CHAT), model, "t", true, false)
}

fn h2_client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// Wait until `model` has one recorded request, and check it is the only one, has
/// `outcome`, and left one access line saying so with `status` (`None`: no head sent).
async fn recorded_once(proxy: &Proxy, model: &str, outcome: &str, status: Option<u16>) {
    let m = proxy
        .wait_metrics(&format!("{model} recorded"), |m| {
            m.sum("tokentap_requests_total", &[("model", model)]) >= 1.0
        })
        .await;
    let counted = |labels: &[(&str, &str)]| m.sum("tokentap_requests_total", labels);
    assert_eq!(counted(&[("model", model)]), 1.0, "{model}\n{}", m.text);
    assert_eq!(
        counted(&[("model", model), ("outcome", outcome)]),
        1.0,
        "{model}: not {outcome}\n{}",
        m.text
            .lines()
            .filter(|l| l.starts_with("tokentap_requests_total") && l.contains(model))
            .collect::<Vec<_>>()
            .join("\n")
    );
    access_log::assert_one_request_line("model", model, outcome, status).await;
}

/// An upstream that reads each request, sends `prefix` (nothing, or a head and an
/// event), then says nothing more and reports when tokentap closes the connection.
struct WatchingBackend {
    addr: std::net::SocketAddr,
    requests: Arc<AtomicUsize>,
    closed: mpsc::UnboundedReceiver<Instant>,
}

impl WatchingBackend {
    async fn start(prefix: Vec<u8>) -> WatchingBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(AtomicUsize::new(0));
        let (tx, closed) = mpsc::unbounded_channel();
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (seen, tx, prefix) = (seen.clone(), tx.clone(), prefix.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    if read_request(&mut stream, &mut buf).await.is_none() {
                        return;
                    }
                    seen.fetch_add(1, Ordering::SeqCst);
                    if stream.write_all(&prefix).await.is_err() {
                        let _ = tx.send(Instant::now());
                        return;
                    }
                    let mut byte = [0u8; 64];
                    loop {
                        match stream.read(&mut byte).await {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                    let _ = tx.send(Instant::now());
                });
            }
        });
        WatchingBackend {
            addr,
            requests,
            closed,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn wait_for_requests(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.requests.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "the upstream never got request {n}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// How long after `left` the upstream saw its connection closed.
    async fn closed_after(&mut self, left: Instant) -> Duration {
        let closed = tokio::time::timeout(Duration::from_secs(10), self.closed.recv())
            .await
            .expect("the upstream connection was never closed")
            .expect("backend running");
        closed.saturating_duration_since(left)
    }
}

/// A head and one event: the upstream then goes quiet (a long tool call, a stall).
fn head_and_one_event() -> Vec<u8> {
    let event = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
         transfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
        event.len()
    )
    .into_bytes()
}

#[derive(Clone, Copy, Debug)]
enum Leaves {
    /// The client closes its connection (FIN), or resets its h2 stream.
    Closes,
    /// The client's connection is reset (RST); on h2, the stream is reset.
    Resets,
}

/// Run one departure: the client sends a request, waits for `seen_first` (nothing, or the
/// first event), then leaves. Returns how long the upstream took to see it.
async fn leave(
    transport: Transport,
    proxy: &Proxy,
    backend: &mut WatchingBackend,
    n: usize,
    model: &str,
    mid_body: bool,
    how: Leaves,
) -> Duration {
    if transport == Transport::H2 {
        let request = h2_client().request(h2_chat(proxy, model));
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        let waiting = tokio::spawn(async move {
            let response = request.await.expect("response head");
            let mut body = response.into_body();
            let first = body.frame().await.expect("a first frame").expect("data");
            assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
            let _ = first_tx.send(());
            // Holding the body keeps the stream open until the task is aborted.
            std::future::pending::<()>().await;
            drop(body);
        });
        backend.wait_for_requests(n).await;
        if mid_body {
            tokio::time::timeout(Duration::from_secs(10), first_rx)
                .await
                .expect("the first event in time")
                .expect("the client task is running");
        }
        let left = Instant::now();
        waiting.abort();
        return backend.closed_after(left).await;
    }
    let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
    client.write_all(&raw_chat(model)).await.expect("send");
    backend.wait_for_requests(n).await;
    if mid_body {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while find(&got, b"data:").is_none() {
            let read = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf))
                .await
                .expect("the first event in time")
                .expect("read");
            assert!(read > 0, "closed before the first event");
            got.extend_from_slice(&buf[..read]);
        }
    }
    if let Leaves::Resets = how {
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
    }
    let left = Instant::now();
    drop(client);
    backend.closed_after(left).await
}

/// A client that leaves, while the upstream thinks (before the head) or pauses mid-body,
/// frees the upstream at once on every transport, and is counted `cancelled` once: with
/// no status before the head (nothing was answered), with the `200` it got mid-body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_frees_the_upstream_at_once() {
    let mut slowest = Duration::ZERO;
    for transport in TRANSPORTS {
        for mid_body in [false, true] {
            let prefix = if mid_body {
                head_and_one_event()
            } else {
                Vec::new()
            };
            let mut backend = WatchingBackend::start(prefix).await;
            let proxy = transport.proxy(&backend.url(), "").await;
            let ways: &[Leaves] = if transport == Transport::H2 {
                &[Leaves::Closes]
            } else {
                &[Leaves::Closes, Leaves::Resets]
            };
            for (n, how) in ways.iter().enumerate() {
                let model = format!("leaves-{transport:?}-{mid_body}-{how:?}");
                let took = leave(
                    transport,
                    &proxy,
                    &mut backend,
                    n + 1,
                    &model,
                    mid_body,
                    *how,
                )
                .await;
                assert!(
                    took < ABORT_BOUND,
                    "{model}: the upstream saw the client leave after {took:?}"
                );
                slowest = slowest.max(took);
                let status = mid_body.then_some(200);
                recorded_once(&proxy, &model, "cancelled", status).await;
            }
        }
    }
    println!("slowest client departure to upstream close: {slowest:?}");
}

/// The probe's case: the whole request, the client closes 200 ms later, and the upstream
/// would have sent its whole response a second after that, in one write. The client got
/// nothing, so the request is not `completed` on any transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_left_is_never_completed() {
    let script = vec![
        Step::Sleep(Duration::from_millis(1200)),
        Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 59\r\n\r\n\
              data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"
                .to_vec(),
        ),
    ];
    let backend = ScriptedBackend::start(script).await;
    for transport in TRANSPORTS {
        let proxy = transport.proxy(&backend.url(), "").await;
        let model = format!("left-early-{transport:?}");
        if transport == Transport::H2 {
            let request = h2_client().request(h2_chat(&proxy, &model));
            let waiting = tokio::spawn(request);
            tokio::time::sleep(Duration::from_millis(200)).await;
            waiting.abort();
        } else {
            let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
            client.write_all(&raw_chat(&model)).await.expect("send");
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(client);
        }
        recorded_once(&proxy, &model, "cancelled", None).await;
    }
}

/// The upstream keeps streaming (an event every 50 ms, under `upstream.idle_timeout:
/// 300ms`) while the client reads nothing for 1.5 s and the sockets between fill up: the
/// time tokentap spends waiting to write to the client is not upstream idleness, so the
/// whole body arrives and the request is `completed` on every transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reading_client_is_not_an_idle_upstream() {
    const EVENTS: usize = 40;
    // Large events, so that 40 of them (5 MiB) fill every buffer on the way.
    let text = "x".repeat(128 << 10);
    let event = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
    let mut script = vec![Step::Write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
    )];
    for _ in 0..EVENTS {
        script.push(Step::Write(
            format!("{:x}\r\n{event}\r\n", event.len()).into_bytes(),
        ));
        script.push(Step::Sleep(Duration::from_millis(50)));
    }
    script.push(Step::Write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n".to_vec()));
    let backend = ScriptedBackend::start(script).await;
    for transport in TRANSPORTS {
        let proxy = transport
            .proxy(&backend.url(), "upstream:\n  idle_timeout: 300ms\n")
            .await;
        let model = format!("slow-reader-{transport:?}");
        let body = if transport == Transport::H2 {
            let response = h2_client()
                .request(h2_chat(&proxy, &model))
                .await
                .expect("response head");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            response
                .into_body()
                .collect()
                .await
                .expect("whole body")
                .to_bytes()
        } else {
            let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
            client.write_all(&raw_chat(&model)).await.expect("send");
            let mut first = [0u8; 1];
            client.read_exact(&mut first).await.expect("a first byte");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let mut raw = first.to_vec();
            let mut buf = vec![0u8; 1 << 16];
            while find(&raw, b"data: [DONE]").is_none() {
                let read = tokio::time::timeout(Duration::from_secs(20), client.read(&mut buf))
                    .await
                    .expect("the body in time")
                    .expect("read");
                assert!(read > 0, "{model}: cut after {} bytes", raw.len());
                raw.extend_from_slice(&buf[..read]);
            }
            Bytes::from(raw)
        };
        let events = body
            .windows(b"\"content\":\"x".len())
            .filter(|w| w == b"\"content\":\"x")
            .count();
        assert_eq!(events, EVENTS, "{model}");
        recorded_once(&proxy, &model, "completed", Some(200)).await;
    }
}

/// What the client gets from each transport for one upstream response head.
async fn answer_to(transport: Transport, proxy: &Proxy, model: &str) -> (u16, Bytes) {
    answer_as(transport, proxy, model, None).await
}

/// [`answer_to`] for a request of `tenant` (`None`: the h2 client's `t`, none on HTTP/1.1).
async fn answer_as(
    transport: Transport,
    proxy: &Proxy,
    model: &str,
    tenant: Option<&str>,
) -> (u16, Bytes) {
    if transport == Transport::H2 {
        let request = common::chat(&proxy.url(CHAT), model, tenant.unwrap_or("t"), true, false);
        let response = h2_client().request(request).await.expect("an answer");
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        return (status, body);
    }
    let tenant = tenant.map_or(String::new(), |t| format!("x-tenant-id: {t}\r\n"));
    let request = raw_chat_with(model, &format!("{tenant}connection: close\r\n"));
    let raw = common::raw_exchange(proxy.addr, &request).await;
    let (head, body, _) = common::parse_raw_response(&raw);
    let status = head
        .first()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("{model}: no status line in {head:?}"));
    (status, Bytes::from(body))
}

/// Upstream answers tokentap cannot forward faithfully get the same `502`, with the same
/// text, on every transport: a transfer coding other than `chunked` (named), and a `101`
/// to a request that asked for no upgrade (RFC 9110 15.2.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unforwardable_upstream_heads_get_one_502_text() {
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "gzip",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "tokentap: upstream response: unsupported transfer coding \"gzip\" \
             (only chunked can be forwarded)\n",
        ),
        (
            "x-custom",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: x-custom\r\n\r\n",
            "tokentap: upstream response: unsupported transfer coding \"x-custom\" \
             (only chunked can be forwarded)\n",
        ),
        (
            "switch",
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            "tokentap: upstream answered 101 Switching Protocols to a request that asked \
             for no upgrade\n",
        ),
    ];
    for (name, head, text) in cases {
        let backend = ScriptedBackend::start(vec![Step::Write(head.to_vec())]).await;
        for transport in TRANSPORTS {
            let proxy = transport.proxy(&backend.url(), "").await;
            let model = format!("unforwardable-{name}-{transport:?}");
            let (status, body) = answer_to(transport, &proxy, &model).await;
            assert_eq!(status, 502, "{model}: {body:?}");
            assert_eq!(body, text.as_bytes(), "{model}");
            recorded_once(&proxy, &model, "upstream_error", Some(502)).await;
        }
    }
}

/// The bytes a raw HTTP/1.1 `request` gets from tokentap on the relay and on hyper, in
/// front of an upstream that answers `response`.
async fn both_http1_answers(response: &[u8], request: &[u8]) -> (String, String) {
    let backend = ScriptedBackend::start(vec![Step::Write(response.to_vec())]).await;
    let mut answers = Vec::new();
    for transport in [Transport::Relay, Transport::HyperH1] {
        let proxy = transport.proxy(&backend.url(), "").await;
        let raw = common::raw_exchange(proxy.addr, request).await;
        answers.push(String::from_utf8_lossy(&raw).into_owned());
    }
    let hyper = answers.pop().unwrap_or_default();
    let relay = answers.pop().unwrap_or_default();
    (relay, hyper)
}

/// Upstream heads the two HTTP/1.1 paths once relayed differently reach the client the same
/// way on both: `Content-Length` on a `204` or `304`, and an HTTP/1.0 response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_and_http10_responses_are_relayed_alike() {
    let request = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let cases: [(&str, &[u8]); 5] = [
        (
            "204 with a length",
            b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nX-A: 1\r\n\r\n",
        ),
        (
            "304 with a length",
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 12\r\nX-A: 1\r\n\r\n",
        ),
        (
            "HTTP/1.0 with a length",
            b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\nhi",
        ),
        (
            "HTTP/1.0 until close",
            b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\nhello",
        ),
        (
            "HTTP/1.1 until close",
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nhello",
        ),
    ];
    let mut differ = Vec::new();
    for (name, response) in cases {
        let (relay, hyper) = both_http1_answers(response, request).await;
        if relay != hyper {
            differ.push(format!("{name}:\n  relay {relay:?}\n  hyper {hyper:?}"));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// An upstream that records each request whole (a chunked body up to its last chunk) and
/// answers `200 ok`.
async fn recording_backend() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let requests = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let whole = find(&buf, b"\r\n\r\n").is_some_and(|end| {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        !head.contains("transfer-encoding: chunked")
                            || find(&buf[end..], b"\r\n0\r\n\r\n").is_some()
                    });
                    if whole {
                        break;
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                requests
                    .lock()
                    .expect("lock")
                    .push(String::from_utf8_lossy(&buf).into_owned());
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    (url, seen)
}

/// Request heads the HTTP/1.1 paths once treated differently get one treatment: an
/// HTTP/1.1 request without a valid `Host` is a `400` (RFC 9112 3.2), a `GET` with a
/// chunked body goes up with its body, a target's `#fragment` does not go up, and an
/// `Upgrade: h2c` goes up as an ordinary request (never a tunnel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_get_one_treatment_on_both_http1_paths() {
    // (name, request, status, what the upstream's request contains, and what it lacks)
    type Case = (
        &'static str,
        &'static str,
        u16,
        &'static [&'static str],
        &'static [&'static str],
    );
    let cases: [Case; 5] = [
        (
            "no host",
            "GET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n",
            400,
            &[],
            &[],
        ),
        (
            "a host that is not one",
            "GET /v1/models HTTP/1.1\r\nhost: a, b\r\nconnection: close\r\n\r\n",
            400,
            &[],
            &[],
        ),
        (
            "a GET with a chunked body",
            "GET /v1/models HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\
             connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            200,
            &["GET /v1/models HTTP/1.1\r\n", "5\r\nhello\r\n0\r\n\r\n"],
            &[],
        ),
        (
            "a fragment",
            "GET /v1/models?a=1#frag HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            200,
            &["GET /v1/models?a=1 HTTP/1.1\r\n"],
            &["frag"],
        ),
        (
            "an h2c upgrade",
            "GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings, close\r\n\
             upgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
            200,
            &["GET /v1/models HTTP/1.1\r\n"],
            &["pgrade", "http2-settings", "HTTP2-Settings"],
        ),
    ];
    for (name, request, status, has, lacks) in cases {
        for transport in [Transport::Relay, Transport::HyperH1] {
            let (url, seen) = recording_backend().await;
            let proxy = transport.proxy(&url, "").await;
            let answer = common::raw_exchange(proxy.addr, request.as_bytes()).await;
            let answer = String::from_utf8_lossy(&answer).into_owned();
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status} ")),
                "{name} on {transport:?}: {answer:?}"
            );
            let upstream = seen.lock().expect("lock").join("");
            if status == 400 {
                assert!(
                    upstream.is_empty(),
                    "{name} on {transport:?} went up: {upstream:?}"
                );
            }
            for part in has {
                assert!(
                    upstream.contains(part),
                    "{name} on {transport:?}: {upstream:?}"
                );
            }
            for part in lacks {
                assert!(
                    !upstream.contains(part),
                    "{name} on {transport:?}: {upstream:?}"
                );
            }
        }
    }
}

/// An upstream that reports when a request's bytes so far include `marker`, and when
/// tokentap closes the connection.
async fn marker_backend(
    marker: &'static [u8],
) -> (
    String,
    mpsc::UnboundedReceiver<()>,
    mpsc::UnboundedReceiver<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let (closed_tx, closed) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (seen_tx, closed_tx) = (seen_tx.clone(), closed_tx.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut told = false;
                loop {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if !told && find(&buf, marker).is_some() {
                        told = true;
                        let _ = seen_tx.send(());
                    }
                }
                let _ = closed_tx.send(());
            });
        }
    });
    (url, seen, closed)
}

/// An upload the client abandons mid-body (it declared 200 bytes, sent the first part,
/// then closed its connection or reset its h2 stream) is `cancelled` on every transport,
/// with no status logged (nobody received an answer), and its upstream connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_abandoned_mid_body_is_cancelled() {
    for transport in TRANSPORTS {
        let (url, mut seen, mut closed) = marker_backend(b"\"pad\"").await;
        let proxy = transport.proxy(&url, "").await;
        let model = format!("abandoned-{transport:?}");
        // The model is in the part that arrives.
        let part = format!(r#"{{"model":"{model}","stream":true,"pad":""#);
        let within = |what| async move {
            tokio::time::timeout(Duration::from_secs(10), what)
                .await
                .expect("in time")
        };
        // The h2 body's sender outlives the client: dropped before the abort lands, it
        // would end the stream short of its content-length (END_STREAM), which is a
        // malformed body (client_error), not a client that left.
        let mut body_open = None;
        if transport == Transport::H2 {
            let (tx, rx) = mpsc::channel::<Result<http_body::Frame<Bytes>, std::io::Error>>(1);
            let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            let body = http_body_util::StreamBody::new(Box::pin(frames));
            let request = http::Request::post(proxy.url(CHAT))
                .header("content-type", "application/json")
                .header("content-length", "200")
                .body(body)
                .expect("request");
            let client = Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http();
            let waiting = tokio::spawn(async move { client.request(request).await });
            tx.send(Ok(http_body::Frame::data(Bytes::from(part))))
                .await
                .expect("body channel");
            within(seen.recv())
                .await
                .expect("the upstream got the part");
            // Dropping the request resets the stream.
            waiting.abort();
            body_open = Some(tx);
        } else {
            let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
            let head =
                format!("POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-length: 200\r\n\r\n{part}");
            client.write_all(head.as_bytes()).await.expect("send");
            within(seen.recv())
                .await
                .expect("the upstream got the part");
            drop(client);
        }
        recorded_once(&proxy, &model, "cancelled", None).await;
        drop(body_open);
        within(closed.recv())
            .await
            .expect("the upstream connection closed");
    }
}

/// Wait until `model` has one recorded request, and check it is counted once with
/// `outcome` and `status` (the label) and logged once with the same, and with `code`.
async fn classified_once(proxy: &Proxy, model: &str, outcome: &str, status: &str, code: u16) {
    classified_once_as(proxy, ("model", model), outcome, status, code).await;
}

/// [`classified_once`] for the requests with one label pair.
async fn classified_once_as(
    proxy: &Proxy,
    (label, value): (&str, &str),
    outcome: &str,
    status: &str,
    code: u16,
) {
    let m = proxy
        .wait_metrics(&format!("{value} recorded"), |m| {
            m.sum("tokentap_requests_total", &[(label, value)]) >= 1.0
        })
        .await;
    let labels = [(label, value), ("outcome", outcome), ("status", status)];
    assert_eq!(
        (
            m.sum("tokentap_requests_total", &[(label, value)]),
            m.sum("tokentap_requests_total", &labels)
        ),
        (1.0, 1.0),
        "{value}: not {outcome}/{status}\n{}",
        m.text
            .lines()
            .filter(|l| l.starts_with("tokentap_requests_total") && l.contains(value))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let line = access_log::assert_one_request_line(label, value, outcome, Some(code)).await;
    assert_eq!(
        line.field("status_class"),
        Some(status),
        "{value}: {line:?}"
    );
}

/// A response with `content-length`, status line `status`, and `headers` (CRLF-ended).
fn response(status: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An OpenAI chat stream of one token, then `last` (an event, or `[DONE]`).
fn sse(last: &str) -> Vec<u8> {
    let body = format!(
        "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}}}}]}}\n\n\
         data: {last}\n\n"
    );
    response("200 OK", "content-type: text/event-stream\r\n", &body)
}

/// Every answer an upstream can give is counted with the same outcome and status label,
/// and logged with the same fields, on every transport: a success, the refusals (429 on
/// its own, any other 4xx), the failures (503 and 529 as "overloaded", any other 5xx),
/// and an error reported inside a 200 stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_classifies_the_upstreams_answers_alike() {
    let json = "content-type: application/json\r\n";
    let cases: Vec<(&str, Vec<u8>, u16, &str, &str)> = vec![
        ("ok", sse("[DONE]"), 200, "completed", "2xx"),
        (
            "rate-limited",
            response(
                "429 Too Many Requests",
                "content-type: application/json\r\nretry-after: 7\r\n",
                r#"{"error":{"type":"requests","code":"rate_limit_exceeded"}}"#,
            ),
            429,
            "upstream_refused",
            "429",
        ),
        (
            "unknown-model",
            response(
                "404 Not Found",
                json,
                r#"{"error":{"code":"model_not_found"}}"#,
            ),
            404,
            "upstream_refused",
            "4xx",
        ),
        (
            "bad-key",
            response(
                "401 Unauthorized",
                json,
                r#"{"error":{"code":"invalid_api_key"}}"#,
            ),
            401,
            "upstream_refused",
            "4xx",
        ),
        (
            "server-error",
            response("500 Internal Server Error", json, "{}"),
            500,
            "upstream_error",
            "5xx",
        ),
        (
            "unavailable",
            response("503 Service Unavailable", "retry-after: 1\r\n", ""),
            503,
            "upstream_error",
            "503",
        ),
        (
            "overloaded-529",
            response(
                "529 Site Overloaded",
                json,
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
            ),
            529,
            "upstream_error",
            "503",
        ),
        (
            "stream-error",
            sse(r#"{"error":{"message":"boom","type":"server_error"}}"#),
            200,
            "upstream_error",
            "2xx",
        ),
        (
            "stream-rate-limited",
            sse(
                r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
            ),
            200,
            "upstream_error",
            "429",
        ),
        (
            "stream-overloaded",
            sse(
                r#"{"error":{"message":"busy","type":"server_error","code":"server_is_overloaded"}}"#,
            ),
            200,
            "upstream_error",
            "503",
        ),
    ];
    for (name, answer, code, outcome, status) in cases {
        let backend = ScriptedBackend::start(vec![Step::Write(answer)]).await;
        for transport in TRANSPORTS {
            let proxy = transport.proxy(&backend.url(), "").await;
            let model = format!("classified-{name}-{transport:?}");
            let (got, _) = answer_to(transport, &proxy, &model).await;
            assert_eq!(got, code, "{model}");
            classified_once(&proxy, &model, outcome, status, code).await;
        }
    }
}

/// tokentap's own answers are told apart from the upstream's by their status label
/// (`tokentap_502` is never an upstream's 502), on every transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokentaps_own_answers_are_labelled_as_its_own() {
    // Nothing listens on a port bound and dropped: a connect failure.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let slow = ScriptedBackend::start(vec![Step::Sleep(Duration::from_secs(5))]).await;
    // By tenant: a request that fails before its body went upstream may not have had its
    // model read.
    for transport in TRANSPORTS {
        let proxy = transport.proxy(&nowhere, "").await;
        let tenant = format!("unreachable-{transport:?}");
        let (code, _) = answer_as(transport, &proxy, "m", Some(&tenant)).await;
        assert_eq!(code, 502, "{tenant}");
        let tenant = ("tenant", tenant.as_str());
        classified_once_as(&proxy, tenant, "upstream_error", "tokentap_502", 502).await;

        let yaml = "upstream:\n  response_head_timeout: 200ms\n";
        let proxy = transport.proxy(&slow.url(), yaml).await;
        let tenant = format!("head-timeout-{transport:?}");
        let (code, _) = answer_as(transport, &proxy, "m", Some(&tenant)).await;
        assert_eq!(code, 504, "{tenant}");
        let tenant = ("tenant", tenant.as_str());
        classified_once_as(&proxy, tenant, "timeout", "tokentap_504", 504).await;
    }
}

/// A request refused at `limits.max_in_flight` is a request: counted once in
/// `tokentap_requests_total` (model `unknown`: its body was never read) as `overloaded`
/// with tokentap's 503, on every transport, and still in the older counter of refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_at_the_in_flight_limit_is_counted_once() {
    let slow = ScriptedBackend::start(vec![
        Step::Sleep(Duration::from_millis(1500)),
        Step::Write(sse("[DONE]")),
    ])
    .await;
    for transport in TRANSPORTS {
        let proxy = transport
            .proxy(&slow.url(), "limits:\n  max_in_flight: 1\n")
            .await;
        let holder = {
            let (addr, request) = (proxy.addr, raw_chat(&format!("holder-{transport:?}")));
            tokio::spawn(async move { common::raw_exchange(addr, &request).await })
        };
        proxy
            .wait_metrics("the holder in flight", |m| {
                m.sum("tokentap_streams_in_flight", &[]) >= 1.0
            })
            .await;
        let tenant = format!("refused-{transport:?}");
        let (status, _) = answer_as(transport, &proxy, "m", Some(&tenant)).await;
        assert_eq!(status, 503, "{tenant}");
        let m = proxy.metrics().await;
        let labels = [
            ("model", "unknown"),
            ("tenant", tenant.as_str()),
            ("outcome", "overloaded"),
            ("status", "tokentap_503"),
        ];
        assert_eq!(m.sum("tokentap_requests_total", &labels), 1.0, "{}", m.text);
        assert_eq!(m.sum("tokentap_overload_rejections_total", &[]), 1.0);
        let line =
            access_log::assert_one_request_line("tenant", &tenant, "overloaded", Some(503)).await;
        assert_eq!(line.field("status_class"), Some("tokentap_503"));
        holder.await.unwrap();
    }
}

/// A request head tokentap cannot read is answered (400, 414, 431) and counted once as
/// the client's error, on both HTTP/1.1 paths; on h2, a header block h2 cannot decode
/// closes the connection with a GOAWAY, counted as the same `400`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_request_head_is_counted_as_the_clients_error() {
    let backend = ScriptedBackend::start(vec![Step::Write(sse("[DONE]"))]).await;
    let huge = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(128 * 1024)
    );
    // Longer than hyper's longest target, in a head `limits.max_header_bytes` allows.
    let long_target = format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000));
    let roomy = "limits:\n  max_header_bytes: 128KiB\n";
    let cases: [(&str, Vec<u8>, &str, &str); 3] = [
        (
            "garbage",
            b"\x01\x02 not http\r\n\r\n".to_vec(),
            "",
            "tokentap_400",
        ),
        ("too large", huge.into_bytes(), "", "tokentap_431"),
        (
            "target too long",
            long_target.into_bytes(),
            roomy,
            "tokentap_414",
        ),
    ];
    for transport in [Transport::Relay, Transport::HyperH1] {
        for (name, request, yaml, status) in &cases {
            let proxy = transport.proxy(&backend.url(), yaml).await;
            let raw = common::raw_exchange(proxy.addr, request).await;
            let code = &status["tokentap_".len()..];
            assert!(
                raw.starts_with(format!("HTTP/1.1 {code}").as_bytes()),
                "{name} {transport:?}: {:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(80)])
            );
            unreadable_head_counted(&proxy, name, status).await;
        }
    }
    // h2c: the preface, SETTINGS, and a HEADERS frame whose block is HPACK index 0,
    // which no table has.
    let proxy = Transport::H2.proxy(&backend.url(), "").await;
    let mut frames = H2_PREFACE.to_vec();
    frames.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&[0, 0, 1, 0x1, 0x5, 0, 0, 0, 1, 0x80]);
    let raw = common::raw_exchange(proxy.addr, &frames).await;
    let go_away = h2_frames(&raw)
        .into_iter()
        .find(|(kind, _, _)| *kind == 0x7)
        .unwrap_or_else(|| panic!("no GOAWAY in {raw:?}"));
    let code = u32::from_be_bytes(go_away.2[4..8].try_into().expect("a GOAWAY's code"));
    assert_eq!(code, 0x1, "PROTOCOL_ERROR");
    unreadable_head_counted(&proxy, "an undecodable h2 header block", "tokentap_400").await;
}

/// The h2 connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The frames of a raw h2 byte stream: (type, stream id, payload).
fn h2_frames(mut raw: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while raw.len() >= 9 {
        let len = usize::from(raw[0]) << 16 | usize::from(raw[1]) << 8 | usize::from(raw[2]);
        let id = u32::from_be_bytes([raw[5], raw[6], raw[7], raw[8]]) & 0x7fff_ffff;
        let Some(payload) = raw.get(9..9 + len) else {
            break;
        };
        frames.push((raw[3], id, payload.to_vec()));
        raw = &raw[9 + len..];
    }
    frames
}

/// The one request `proxy` counted is the client's error with `status`, with model and
/// tenant unknown (nothing of the request was read).
async fn unreadable_head_counted(proxy: &Proxy, name: &str, status: &str) {
    let m = proxy
        .wait_metrics(&format!("{name} counted"), |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    let labels = [
        ("model", "unknown"),
        ("tenant", "unknown"),
        ("outcome", "client_error"),
        ("status", status),
    ];
    assert_eq!(
        m.sum("tokentap_requests_total", &[]),
        1.0,
        "{name}\n{}",
        m.text
    );
    assert_eq!(
        m.sum("tokentap_requests_total", &labels),
        1.0,
        "{name}\n{}",
        m.text
    );
}

/// An h2 request body that breaks its `content-length` (more data, or less before the
/// stream's end) is reset by the h2 library: the client's error, counted as the `400`
/// HTTP/1.1 answers a malformed body with (the reset has no status), never `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_body_that_breaks_its_content_length_is_the_clients_error() {
    let backend = ScriptedBackend::start(vec![Step::Write(sse("[DONE]"))]).await;
    let proxy = Transport::H2.proxy(&backend.url(), "").await;
    for (name, declared, sent) in [("longer", 10, 20), ("shorter", 30, 20)] {
        let tenant = format!("h2-body-{name}");
        let tcp = TcpStream::connect(proxy.addr).await.expect("connect");
        let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
        tokio::spawn(connection);
        let mut client = client.ready().await.expect("ready");
        let request = http::Request::post(proxy.url(CHAT))
            .header("content-type", "application/json")
            .header("x-tenant-id", &tenant)
            .header("content-length", declared)
            .body(())
            .expect("request");
        let (response, mut body) = client.send_request(request, false).expect("sent");
        body.send_data(Bytes::from(vec![b' '; sent]), true)
            .expect("body sent");
        let reset = response.await.expect_err("the stream is reset");
        assert_eq!(reset.reason(), Some(h2::Reason::PROTOCOL_ERROR), "{name}");
        let tenant = ("tenant", tenant.as_str());
        classified_once_as(&proxy, tenant, "client_error", "tokentap_400", 400).await;
    }
}

/// An upstream whose connects hang: a listener that never accepts, with its accept queue
/// full, so that the kernel drops further SYNs. It holds the queued connections.
struct HangingUpstream {
    _listener: socket2::Socket,
    _queued: Vec<TcpStream>,
    url: String,
}

async fn hanging_upstream() -> HangingUpstream {
    use socket2::{Domain, Socket, Type};
    let listener = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("address");
    listener.bind(&any.into()).expect("bind");
    listener.listen(0).expect("listen");
    let addr = listener
        .local_addr()
        .expect("address")
        .as_socket()
        .expect("an IP address");
    let mut queued = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(connected) => queued.push(connected.expect("connect")),
            // This one hangs: the queue is full.
            Err(_) => {
                return HangingUpstream {
                    _listener: listener,
                    _queued: queued,
                    url: format!("http://{addr}"),
                }
            }
        }
    }
    panic!("the accept queue never filled");
}

/// A client that leaves while tokentap's connect to the upstream hangs is `cancelled`,
/// with no status, on every transport, as soon as it leaves: not the `502` of a connect
/// that fails later, which would blame the upstream for the client's departure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_the_upstream_connect_hangs_is_cancelled() {
    let upstream = hanging_upstream().await;
    let yaml = "upstream:\n  connect_timeout: 3s\n";
    for transport in TRANSPORTS {
        let proxy = transport.proxy(&upstream.url, yaml).await;
        // By tenant: the body (and its model) is read only once the upstream takes it.
        let tenant = format!("connect-hangs-{transport:?}");
        if transport == Transport::H2 {
            let request = common::chat(&proxy.url(CHAT), "m", &tenant, true, false);
            let waiting = tokio::spawn(h2_client().request(request));
            tokio::time::sleep(Duration::from_millis(300)).await;
            waiting.abort();
        } else {
            let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
            let request = raw_chat_with("m", &format!("x-tenant-id: {tenant}\r\n"));
            client.write_all(&request).await.expect("send");
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(client);
        }
        let left = Instant::now();
        let m = proxy
            .wait_metrics(&format!("{tenant} recorded"), |m| {
                m.sum("tokentap_requests_total", &[("tenant", &tenant)]) >= 1.0
            })
            .await;
        let counted = |labels: &[(&str, &str)]| m.sum("tokentap_requests_total", labels);
        let cancelled = [("tenant", tenant.as_str()), ("outcome", "cancelled")];
        assert_eq!(
            (counted(&[("tenant", &tenant)]), counted(&cancelled)),
            (1.0, 1.0),
            "{tenant}: not cancelled\n{}",
            m.text
        );
        assert!(
            left.elapsed() < Duration::from_secs(2),
            "{tenant}: counted {:?} after the client left",
            left.elapsed()
        );
        access_log::assert_one_request_line("tenant", &tenant, "cancelled", None).await;
    }
}

/// A gRPC call is counted by the `grpc-status` in its trailers on every transport, and
/// one whose whole body passed without a `grpc-status` (no trailers, or trailers without
/// it) is a failed call, as gRPC's `UNKNOWN`: `upstream_error` with `5xx`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_is_judged_by_its_grpc_status_on_every_transport() {
    const GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
    let cases = [
        ("ok", "grpc-status: 0\r\n", "completed", "2xx"),
        (
            "exhausted",
            "grpc-status: 8\r\ngrpc-message: busy\r\n",
            "upstream_refused",
            "429",
        ),
        ("no-trailers", "", "upstream_error", "5xx"),
        ("no-status", "x-other: 1\r\n", "upstream_error", "5xx"),
    ];
    for (name, trailers, outcome, status) in cases {
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n\
             trailer: grpc-status, grpc-message\r\ntransfer-encoding: chunked\r\n\r\n\
             0\r\n{trailers}\r\n"
        );
        let backend = ScriptedBackend::start(vec![Step::Write(response.into_bytes())]).await;
        for transport in TRANSPORTS {
            let proxy = transport.proxy(&backend.url(), "").await;
            let tenant = format!("grpc-{name}-{transport:?}");
            if transport == Transport::H2 {
                let request = http::Request::post(proxy.url(GENERATE))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .header("x-tenant-id", &tenant)
                    .body(Full::new(Bytes::from_static(&[0; 5])))
                    .expect("request");
                let response = h2_client().request(request).await.expect("an answer");
                assert_eq!(response.status(), 200, "{tenant}");
                response.into_body().collect().await.expect("body");
            } else {
                let call = format!(
                    "POST {GENERATE} HTTP/1.1\r\nhost: x\r\ncontent-type: application/grpc\r\n\
                     te: trailers\r\nx-tenant-id: {tenant}\r\nconnection: close\r\n\
                     content-length: 5\r\n\r\n\0\0\0\0\0"
                );
                let raw = common::raw_exchange(proxy.addr, call.as_bytes()).await;
                assert!(raw.starts_with(b"HTTP/1.1 200 OK"), "{tenant}: {raw:?}");
            }
            let tenant = ("tenant", tenant.as_str());
            classified_once_as(&proxy, tenant, outcome, status, 200).await;
        }
    }
}

/// The rate limits an upstream reports become per-model gauges of the latest values, on
/// every transport: OpenAI's headers on a success, Anthropic's and `Retry-After` on a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_rate_limits_become_per_model_gauges() {
    let openai = ScriptedBackend::start(vec![Step::Write(response(
        "200 OK",
        "content-type: text/event-stream\r\nx-ratelimit-limit-requests: 500\r\n\
         x-ratelimit-remaining-requests: 499\r\nx-ratelimit-remaining-tokens: 149000\r\n",
        "data: [DONE]\n\n",
    ))])
    .await;
    let anthropic = ScriptedBackend::start(vec![Step::Write(response(
        "429 Too Many Requests",
        "content-type: application/json\r\nretry-after: 7\r\n\
         anthropic-ratelimit-input-tokens-limit: 40000\r\n\
         anthropic-ratelimit-input-tokens-remaining: 0\r\n",
        r#"{"type":"error","error":{"type":"rate_limit_error"}}"#,
    ))])
    .await;
    for transport in TRANSPORTS {
        let proxy = transport.proxy(&openai.url(), "").await;
        let model = format!("quota-{transport:?}");
        answer_to(transport, &proxy, &model).await;
        classified_once(&proxy, &model, "completed", "2xx", 200).await;
        let m = proxy.metrics().await;
        let gauge = |name: &str, resource: &str| {
            m.sum(name, &[("model", model.as_str()), ("resource", resource)])
        };
        assert_eq!(
            gauge("tokentap_upstream_rate_limit_limit", "requests"),
            500.0
        );
        assert_eq!(
            gauge("tokentap_upstream_rate_limit_remaining", "requests"),
            499.0
        );
        assert_eq!(
            gauge("tokentap_upstream_rate_limit_remaining", "tokens"),
            149000.0
        );
        assert!(!m.text.contains("tokentap_upstream_retry_after_seconds{"));

        let proxy = transport.proxy(&anthropic.url(), "").await;
        let model = format!("refused-quota-{transport:?}");
        answer_to(transport, &proxy, &model).await;
        classified_once(&proxy, &model, "upstream_refused", "429", 429).await;
        let m = proxy.metrics().await;
        let labels = |resource| [("model", model.as_str()), ("resource", resource)];
        let input = labels("input_tokens");
        assert_eq!(m.sum("tokentap_upstream_rate_limit_limit", &input), 40000.0);
        let exhausted = format!(
            "tokentap_upstream_rate_limit_remaining{{model=\"{model}\",resource=\"input_tokens\"}} 0\n"
        );
        assert!(m.text.contains(&exhausted), "{}", m.text);
        assert_eq!(
            m.sum(
                "tokentap_upstream_retry_after_seconds",
                &[("model", &model)]
            ),
            7.0
        );
    }
}

/// A hostile wait in a refusal (`retry-after-ms: 1e308` on a `429`, `Retry-After:
/// 18446744073709551615` on a `503`) once panicked the connection task while it read the
/// head: the client got a dropped connection (or an h2 reset) and the request was neither
/// counted nor logged. Now, on every transport, the client gets the refusal as sent, it
/// is counted and logged once, and the gauge reads the one-day cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_retry_after_is_forwarded_counted_and_capped() {
    let cases = [
        (
            "429 Too Many Requests",
            "retry-after-ms",
            "1e308",
            "429",
            429,
        ),
        (
            "503 Service Unavailable",
            "retry-after",
            "18446744073709551615",
            "503",
            503,
        ),
    ];
    let body = r#"{"error":{"message":"slow down","code":"rate_limit_exceeded"}}"#;
    for (status_line, name, value, class, code) in cases {
        let backend = ScriptedBackend::start(vec![Step::Write(response(
            status_line,
            &format!("content-type: application/json\r\n{name}: {value}\r\n"),
            body,
        ))])
        .await;
        for transport in TRANSPORTS {
            let proxy = transport.proxy(&backend.url(), "").await;
            let model = format!("hostile-wait-{code}-{transport:?}");
            let (head, got) = if transport == Transport::H2 {
                let response = h2_client()
                    .request(h2_chat(&proxy, &model))
                    .await
                    .expect("an answer, not a reset");
                let header = response.headers().get(name).cloned();
                let status = response.status().as_u16();
                let got = response.into_body().collect().await.expect("body");
                (
                    (
                        status,
                        header.and_then(|h| h.to_str().ok().map(str::to_string)),
                    ),
                    got.to_bytes(),
                )
            } else {
                let request = raw_chat_with(&model, "connection: close\r\n");
                let raw = common::raw_exchange(proxy.addr, &request).await;
                assert!(!raw.is_empty(), "{model}: the connection was dropped");
                let (head, got, _) = common::parse_raw_response(&raw);
                let status = head[0].split(' ').nth(1).and_then(|c| c.parse().ok());
                let header = head.iter().find_map(|line| {
                    let (n, v) = line.split_once(':')?;
                    n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                });
                ((status.unwrap_or(0), header), Bytes::from(got))
            };
            assert_eq!(head, (code, Some(value.to_string())), "{model}");
            assert_eq!(got, body.as_bytes(), "{model}");
            let outcome = if code == 429 {
                "upstream_refused"
            } else {
                "upstream_error"
            };
            classified_once(&proxy, &model, outcome, class, code).await;
            let m = proxy.metrics().await;
            assert_eq!(
                m.sum(
                    "tokentap_upstream_retry_after_seconds",
                    &[("model", &model)]
                ),
                86400.0,
                "{model}"
            );
        }
    }
}

/// A gRPC call (`content-type: application/grpc`) that reaches tokentap over HTTP/1.1 and
/// fails before a response head gets the same trailers-only gRPC answer on the relay as
/// on hyper (and as over h2, `grpc_net.rs`): `200`, `application/grpc`, `grpc-status` 14
/// (`UNAVAILABLE`) for the unreachable upstream and 4 (`DEADLINE_EXCEEDED`) for the head
/// timeout, tokentap's message in `grpc-message`, no body; counted as tokentap's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_over_http1_gets_the_grpc_form_of_tokentaps_answer_on_both_paths() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let slow = ScriptedBackend::start(vec![Step::Sleep(Duration::from_secs(5))]).await;
    let call = |tenant: &str| {
        format!(
            "POST /sglang.grpc.scheduler.SglangScheduler/Generate HTTP/1.1\r\nhost: x\r\n\
             content-type: application/grpc\r\nte: trailers\r\nx-tenant-id: {tenant}\r\n\
             connection: close\r\ncontent-length: 5\r\n\r\n\0\0\0\0\0"
        )
        .into_bytes()
    };
    let mut heads = Vec::new();
    for transport in [Transport::Relay, Transport::HyperH1] {
        for (upstream, yaml, code, outcome, status) in [
            (&nowhere, "", "14", "upstream_error", "tokentap_502"),
            (
                &slow.url(),
                "upstream:\n  response_head_timeout: 200ms\n",
                "4",
                "timeout",
                "tokentap_504",
            ),
        ] {
            let proxy = transport.proxy(upstream, yaml).await;
            let tenant = format!("grpc-{outcome}-{transport:?}");
            let raw = common::raw_exchange(proxy.addr, &call(&tenant)).await;
            let (head, body, _) = common::parse_raw_response(&raw);
            let field = |name: &str| {
                head.iter()
                    .find_map(|l| {
                        let (n, v) = l.split_once(": ")?;
                        n.eq_ignore_ascii_case(name).then(|| v.to_string())
                    })
                    .unwrap_or_else(|| panic!("{tenant}: no {name} in {head:?}"))
            };
            assert_eq!(head[0], "HTTP/1.1 200 OK", "{tenant}: {head:?}");
            assert_eq!(field("content-type"), "application/grpc", "{tenant}");
            assert_eq!(field("grpc-status"), code, "{tenant}");
            assert!(field("grpc-message").starts_with("tokentap"), "{tenant}");
            assert!(
                body.is_empty(),
                "{tenant}: trailers-only, no body: {body:?}"
            );
            let tenant = ("tenant", tenant.as_str());
            let m = proxy
                .wait_metrics("the call counted", |m| {
                    m.sum("tokentap_requests_total", &[tenant]) >= 1.0
                })
                .await;
            let labels = [tenant, ("outcome", outcome), ("status", status)];
            assert_eq!(m.sum("tokentap_requests_total", &labels), 1.0, "{}", m.text);
            // Without the fields a transport writes of its own accord.
            let mut fields: Vec<String> = head[1..]
                .iter()
                .map(|l| l.to_ascii_lowercase())
                .filter(|l| !l.starts_with("date:") && !l.starts_with("connection:"))
                .collect();
            fields.sort();
            heads.push((code, fields));
        }
    }
    let (relay, hyper) = heads.split_at(2);
    assert_eq!(relay, hyper, "the relay and hyper answer alike");
}
