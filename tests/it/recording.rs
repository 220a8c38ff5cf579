//! Every request that reaches tokentap's handler is recorded exactly once, with the
//! outcome that names the side at fault: a client that gives up at any stage is
//! `cancelled`, a response without a body is recorded by its status. Over HTTP/1.1 and
//! h2c, each case under its own model label so the deltas cannot mix.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{access_log, chat, Proxy, ScriptedBackend, Step};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const CHAT: &str = "/v1/chat/completions";

#[derive(Clone, Copy, Debug)]
enum Protocol {
    H1,
    H2,
}

fn client(protocol: Protocol) -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(matches!(protocol, Protocol::H2))
        .build_http()
}

/// Poll `condition` until it holds (panics after 10 s).
async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Wait until `model` has one recorded request, then check it is the only one, has
/// `outcome`, and left one access-log line saying so with `status` (`None`: no head).
async fn recorded_once(proxy: &Proxy, model: &str, outcome: &str, status: Option<u16>) {
    recorded_once_as(proxy, ("model", model), outcome, status).await;
}

/// [`recorded_once`] for the requests with one label pair.
async fn recorded_once_as(
    proxy: &Proxy,
    (label, value): (&str, &str),
    outcome: &str,
    status: Option<u16>,
) {
    let m = proxy
        .wait_metrics(&format!("{value} recorded"), |m| {
            m.sum("tokentap_requests_total", &[(label, value)]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[(label, value)]),
        1.0,
        "{value}: recorded more than once\n{}",
        m.text
    );
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[(label, value), ("outcome", outcome)]
        ),
        1.0,
        "{value}: not recorded as {outcome}\n{}",
        m.text
    );
    access_log::assert_one_request_line(label, value, outcome, status).await;
}

/// A head and one event, then an event every 20 ms for much longer than any test waits.
fn slow_stream() -> Vec<Step> {
    let event = |text: &str| {
        let data = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        );
        format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
    };
    let mut script = vec![Step::Write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
    )];
    script.push(Step::Write(event("first")));
    for _ in 0..1500 {
        script.push(Step::Sleep(Duration::from_millis(20)));
        script.push(Step::Write(event(" more")));
    }
    script
}

/// A whole short stream.
fn short_stream() -> Vec<Step> {
    let data =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
    vec![Step::Write(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{data}",
            data.len()
        )
        .into_bytes(),
    )]
}

/// A TLS upstream that accepts TCP connections and never answers the handshake: a
/// request to it is stuck before the upstream connection exists. Counts the handshakes
/// begun (the readiness probe's bare connections send nothing and are not counted).
async fn never_connecting_upstream() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let hellos = Arc::new(AtomicUsize::new(0));
    let count = hellos.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut hello = [0u8; 1];
                if matches!(stream.read(&mut hello).await, Ok(1)) {
                    count.fetch_add(1, Ordering::SeqCst);
                    // Held open, unanswered, until the test ends.
                    std::future::pending::<()>().await;
                }
            });
        }
    });
    (url, hellos)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_before_the_head_is_cancelled() {
    // The upstream would answer a little later, with a stream; the client leaves first.
    let mut script = vec![Step::Sleep(Duration::from_millis(300))];
    script.extend(slow_stream());
    let backend = ScriptedBackend::start(script).await;
    let proxy = Proxy::start(&backend.url(), "").await;
    for (n, protocol) in [Protocol::H1, Protocol::H2].into_iter().enumerate() {
        let model = format!("before-head-{protocol:?}");
        let request = client(protocol).request(chat(&proxy.url(CHAT), &model, "t", true, false));
        let waiting = tokio::spawn(request);
        wait_until("the upstream to get the request", || {
            backend.requests.lock().unwrap().len() == n + 1
        })
        .await;
        // Dropping the request closes the h1 connection, or resets the h2 stream: either
        // is seen at once, before any head, so no status is logged.
        waiting.abort();
        recorded_once(&proxy, &model, "cancelled", None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_before_the_upstream_connects_is_recorded_once() {
    let (upstream, hellos) = never_connecting_upstream().await;
    let proxy = Proxy::start(&upstream, "upstream:\n  response_head_timeout: 500ms\n").await;
    // An h2 stream reset and an HTTP/1.1 close are both seen at once: cancelled, with no
    // status, as nothing was answered.
    for (n, protocol, outcome, status) in [
        (0, Protocol::H2, "cancelled", None),
        (1, Protocol::H1, "cancelled", None),
    ] {
        // A measured request (a stored response replayed as a stream), told by tenant.
        let tenant = format!("before-connect-{protocol:?}");
        let request = http::Request::get(proxy.url("/v1/responses/resp_1?stream=true"))
            .header("x-tenant-id", &tenant)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let waiting = tokio::spawn(client(protocol).request(request));
        wait_until("tokentap to connect upstream", || {
            hellos.load(Ordering::SeqCst) == n + 1
        })
        .await;
        waiting.abort();
        recorded_once_as(&proxy, ("tenant", &tenant), outcome, status).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_body_is_cancelled_and_after_the_end_completed() {
    let slow = ScriptedBackend::start(slow_stream()).await;
    let short = ScriptedBackend::start(short_stream()).await;
    let slow_proxy = Proxy::start(&slow.url(), "").await;
    let short_proxy = Proxy::start(&short.url(), "").await;
    for protocol in [Protocol::H1, Protocol::H2] {
        let model = format!("mid-body-{protocol:?}");
        let response = client(protocol)
            .request(chat(&slow_proxy.url(CHAT), &model, "t", true, false))
            .await
            .expect("response head");
        let mut body = response.into_body();
        let first = body.frame().await.expect("a first frame").expect("data");
        assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
        drop(body);
        recorded_once(&slow_proxy, &model, "cancelled", Some(200)).await;

        let model = format!("after-end-{protocol:?}");
        let response = client(protocol)
            .request(chat(&short_proxy.url(CHAT), &model, "t", true, false))
            .await
            .expect("response head");
        let body = response.into_body().collect().await.expect("whole body");
        assert!(body.to_bytes().ends_with(b"data: [DONE]\n\n"));
        recorded_once(&short_proxy, &model, "completed", Some(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_without_a_body_are_recorded_by_their_status() {
    let cases = [
        (
            "503 Service Unavailable",
            "retry-after: 1\r\ncontent-length: 0\r\n",
            "upstream_error",
        ),
        (
            "429 Too Many Requests",
            "content-length: 0\r\n",
            "upstream_refused",
        ),
        (
            "401 Unauthorized",
            "content-length: 0\r\n",
            "upstream_refused",
        ),
        (
            "200 OK",
            "content-type: application/json\r\ncontent-length: 0\r\n",
            "completed",
        ),
        ("204 No Content", "", "completed"),
        ("304 Not Modified", "", "completed"),
    ];
    for (status, headers, outcome) in cases {
        let head = format!("HTTP/1.1 {status}\r\n{headers}\r\n").into_bytes();
        let backend = ScriptedBackend::start(vec![Step::Write(head)]).await;
        let proxy = Proxy::start(&backend.url(), "").await;
        let code = &status[..3];
        for protocol in [Protocol::H1, Protocol::H2] {
            let model = format!("bodyless-{code}-{protocol:?}");
            let response = client(protocol)
                .request(chat(&proxy.url(CHAT), &model, "t", false, false))
                .await
                .expect("response head");
            assert_eq!(response.status().as_str(), code);
            let body = response.into_body().collect().await.expect("empty body");
            assert!(body.to_bytes().is_empty());
            let status = code.parse().expect("a numeric status");
            recorded_once(&proxy, &model, outcome, Some(status)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_shuts_its_write_side_has_left() {
    // A shut write side cannot be told from a close until tokentap writes to the client,
    // which may be long after (a queued request, a long prefill): both are taken as the
    // client leaving, so the upstream is freed at once, as nginx and Envoy do.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut script = vec![Step::Sleep(Duration::from_millis(300))];
    script.extend(short_stream());
    let backend = ScriptedBackend::start(script).await;
    let proxy = Proxy::start(&backend.url(), "").await;
    let body = r#"{"model":"half-closed","stream":true}"#;
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-tenant-id: half-closed\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.expect("shut the write side");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .expect("read the answer");
    assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
    // By tenant: the hyper path may drop the request before its body is scanned.
    recorded_once_as(&proxy, ("tenant", "half-closed"), "cancelled", None).await;
}

/// Shutdown past the drain deadline while requests wait for their head: 20 requests (10
/// over HTTP/1.1, 10 h2 streams) whose upstream answers long after `drain_timeout: 1s`.
/// Each is cut and logged exactly once as `cancelled` (the access line is written as the
/// request is counted, and `/metrics` is gone once the server has stopped), so the log's
/// "counted as cancelled" at the deadline is true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_past_the_drain_deadline_while_waiting_for_a_head_cancels_each_once() {
    // Reads each request, then says nothing for far longer than the test runs.
    let backend = ScriptedBackend::start(vec![Step::Sleep(Duration::from_secs(60))]).await;
    let mut proxy = Proxy::start(&backend.url(), "shutdown:\n  drain_timeout: 1s\n").await;
    let mut waiting = Vec::new();
    for n in 0..20 {
        let protocol = if n % 2 == 0 {
            Protocol::H1
        } else {
            Protocol::H2
        };
        let tenant = format!("drain-waiting-{n}");
        let request = client(protocol).request(chat(&proxy.url(CHAT), "m", &tenant, true, false));
        waiting.push((tenant, tokio::spawn(request)));
    }
    wait_until("the upstream to get all 20 requests", || {
        backend.requests.lock().unwrap().len() == 20
    })
    .await;
    let m = proxy.metrics().await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), 0.0, "none ended yet");

    let asked = tokio::time::Instant::now();
    proxy.shutdown();
    let task = proxy.task.take().expect("the server task");
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("shutdown ends soon after the drain deadline")
        .expect("the server task")
        .expect("a clean exit");
    let took = asked.elapsed();
    assert!(took >= Duration::from_secs(1), "the drain waited {took:?}");

    for (tenant, request) in waiting {
        let answer = request.await.expect("the client task");
        assert!(
            answer.is_err(),
            "{tenant}: no answer was invented: {answer:?}"
        );
        access_log::assert_one_request_line("tenant", &tenant, "cancelled", None).await;
    }
    let warned = access_log::server_warnings("drain deadline passed");
    assert!(
        warned
            .iter()
            .any(|line| line.field("streams") == Some("20")),
        "the deadline warning named the 20 streams: {warned:?}"
    );
}
