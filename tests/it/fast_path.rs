//! `proxy.http1_fast_path` on a running tokentap: a head that `httparse` refuses gets the
//! very bytes hyper answers with when the switch is off, and every connection handed to
//! hyper (ordinary requests, pipelined ones, chunked bodies, h2c) is served exactly as
//! with the switch off. The rest of the integration suite runs with the switch on too
//! (`TOKENTAP_IT_FAST_PATH=1`, see `scripts/test.sh`).

use std::net::SocketAddr;

use crate::common::{self, Step};

/// The two tokentaps, fast path off and on, in front of `upstream`.
async fn both(upstream: &str) -> (common::Proxy, common::Proxy) {
    let off = common::Proxy::start(upstream, "proxy:\n  http1_fast_path: false\n").await;
    let on = common::Proxy::start(upstream, "proxy:\n  http1_fast_path: true\n").await;
    (off, on)
}

async fn exchange(proxy: &common::Proxy, request: &[u8]) -> Vec<u8> {
    let addr: SocketAddr = proxy.addr;
    common::raw_exchange(addr, request).await
}

#[tokio::test]
async fn refused_heads_get_hyper_s_own_answer() {
    let backend = common::ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    )])
    .await;
    let (off, on) = both(&backend.url()).await;
    for request in [
        &b"GET / HTTP/1.1\r\nHost: a\r\nX-Fold: a\r\n b\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n",
        b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
    ] {
        let expected = exchange(&off, request).await;
        assert!(
            expected.starts_with(b"HTTP/1.1 400 Bad Request\r\n"),
            "{:?}",
            String::from_utf8_lossy(&expected)
        );
        assert_eq!(
            String::from_utf8_lossy(&exchange(&on, request).await),
            String::from_utf8_lossy(&expected),
            "{:?}",
            String::from_utf8_lossy(request)
        );
    }
    assert!(
        backend.requests.lock().expect("lock").is_empty(),
        "a refused head reached the upstream"
    );
}

#[tokio::test]
async fn handed_off_connections_are_served_as_before() {
    // Byte-exact upstream answers, so the two paths' client bytes can be compared whole.
    let backend = common::ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nX-Case: Kept\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
            .to_vec(),
    )])
    .await;
    let (off, on) = both(&backend.url()).await;
    for request in [
        &b"GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..],
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        // Handed to hyper for other reasons: HTTP/1.0, a duplicate Content-Length.
        b"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    ] {
        let expected = exchange(&off, request).await;
        assert!(
            expected.starts_with(b"HTTP/1."),
            "{:?}",
            String::from_utf8_lossy(&expected)
        );
        assert_eq!(
            String::from_utf8_lossy(&exchange(&on, request).await),
            String::from_utf8_lossy(&expected),
            "{:?}",
            String::from_utf8_lossy(request)
        );
    }
}

#[tokio::test]
async fn pipelined_requests_and_h2c_are_served_with_the_switch_on() {
    let sim = common::SimHandle::start(tokentap::sim::SimConfig::default()).await;
    let (_off, on) = both(&sim.url()).await;
    // Two requests in one write: hyper gets both from the bytes read already.
    let pipelined = b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let answer = exchange(&on, pipelined).await;
    let answers = String::from_utf8_lossy(&answer);
    assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");

    let h2c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let response = h2c
        .request(
            http::Request::get(on.url("/v1/models"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .expect("request"),
        )
        .await
        .expect("h2c through the fast path's hand-off");
    assert_eq!(response.status(), http::StatusCode::OK);
    assert_eq!(response.version(), http::Version::HTTP_2);
}
