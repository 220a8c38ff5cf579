//! `proxy.http1_fast_path` on a running tokentap: a head that `httparse` refuses gets the
//! very bytes hyper answers with when the switch is off; requests the relay serves itself
//! (no body, a `Content-Length` or a chunked body, to a plain-HTTP/1.1 upstream) and
//! connections it hands to hyper (HTTP/1.0, h2c, ...) give the client the same responses
//! as with the switch off, and the upstream the same requests but for the field order
//! (see [`per_name_fields`]). The rest of the integration suite runs with the switch on
//! (its default), and again with it off when `TOKENTAP_IT_FAST_PATH=0` is set
//! (`scripts/test.sh` runs both); the tests here set it themselves either way.

use std::net::SocketAddr;
use std::time::Duration;

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

/// `request` sent once to each path: the hyper path's answer starts with `prefix`, and the
/// fast path's is the same bytes.
async fn same_answer(off: &common::Proxy, on: &common::Proxy, request: &[u8], prefix: &[u8]) {
    let expected = exchange(off, request).await;
    assert!(
        expected.starts_with(prefix),
        "{:?}",
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(
        String::from_utf8_lossy(&exchange(on, request).await),
        String::from_utf8_lossy(&expected),
        "{:?}",
        String::from_utf8_lossy(request)
    );
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
        same_answer(&off, &on, request, b"HTTP/1.1 400 Bad Request\r\n").await;
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
        same_answer(&off, &on, request, b"HTTP/1.").await;
    }
}

#[tokio::test]
async fn pipelined_requests_and_h2c_are_served_with_the_switch_on() {
    let sim = common::SimHandle::start(tokentap_sim::SimConfig::default()).await;
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

/// tokentap's own answers (`502` for an upstream that refuses connections, `504` for one
/// that does not answer in time) are the same bytes on the relay as on the hyper path,
/// with `connection: close` where the client closes, and a kept-alive connection carries
/// the next request after them.
#[tokio::test]
async fn tokentap_s_own_answers_are_the_same_bytes() {
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", listener.local_addr().expect("addr"))
    };
    let silent =
        common::ScriptedBackend::start(vec![Step::Sleep(std::time::Duration::from_secs(5))]).await;
    let two = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}\
        GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for (upstream, yaml) in [
        (dead, ""),
        (silent.url(), "upstream:\n  response_head_timeout: 200ms\n"),
    ] {
        let off = common::Proxy::start(
            &upstream,
            &format!("proxy:\n  http1_fast_path: false\n{yaml}"),
        )
        .await;
        let on = common::Proxy::start(
            &upstream,
            &format!("proxy:\n  http1_fast_path: true\n{yaml}"),
        )
        .await;
        let expected = exchange(&off, two).await;
        let answers = String::from_utf8_lossy(&expected).into_owned();
        assert_eq!(answers.matches("HTTP/1.1 50").count(), 2, "{answers}");
        assert!(answers.contains("connection: close"), "{answers}");
        assert_eq!(
            String::from_utf8_lossy(&exchange(&on, two).await),
            answers,
            "{upstream}"
        );
    }
}

// --- differential: generated exchanges through both paths ------------------------------

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use tokentap::relay::chunked::ChunkedReader;
use tokentap::relay::response::{Piece, ResponseReader, ResponseRules};

/// A request of a generated exchange.
#[derive(Clone, Debug)]
struct GenRequest {
    path: &'static str,
    body: Vec<u8>,
    chunked: bool,
    head: bool,
}

/// The upstream's answer to one request, and whether it closes the connection after it.
#[derive(Clone, Debug)]
struct GenResponse {
    wire: Vec<u8>,
    close: bool,
}

/// A message as a peer saw it: the raw head and the de-chunked body (how hyper chunks a
/// body it forwards depends on how its reads fell, so chunk boundaries are not compared).
type Message = (Vec<u8>, Vec<u8>);

const RULES: ResponseRules = ResponseRules {
    max_header_bytes: 1 << 20,
    max_headers: 100,
};

fn request_wire(request: &GenRequest, last: bool) -> Vec<u8> {
    let method = if request.head {
        "HEAD"
    } else if request.body.is_empty() {
        "GET"
    } else {
        "POST"
    };
    let mut wire = format!(
        "{method} {} HTTP/1.1\r\nHost: client.example\r\nX-Case: Kept\r\n",
        request.path
    );
    if last {
        wire.push_str("Connection: close\r\n");
    }
    let mut wire = wire.into_bytes();
    if request.body.is_empty() {
        wire.extend_from_slice(b"\r\n");
    } else if request.chunked {
        wire.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        for piece in request.body.chunks(7) {
            wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            wire.extend_from_slice(piece);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
    } else {
        wire.extend_from_slice(
            format!("Content-Length: {}\r\n\r\n", request.body.len()).as_bytes(),
        );
        wire.extend_from_slice(&request.body);
    }
    wire
}

fn sse_body(events: usize) -> Vec<u8> {
    let mut body = String::new();
    for i in 0..events {
        body.push_str(&format!(
            "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
        ));
    }
    body.push_str("data: [DONE]\n\n");
    body.into_bytes()
}

fn response_wire(kind: u8, events: usize) -> GenResponse {
    let body = sse_body(events);
    let sse = "Content-Type: text/event-stream\r\nX-Up: Kept\r\n";
    match kind {
        0 => {
            let mut wire = format!(
                "HTTP/1.1 200 OK\r\n{sse}Content-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            wire.extend_from_slice(&body);
            GenResponse { wire, close: false }
        }
        1 => {
            let mut wire =
                format!("HTTP/1.1 200 OK\r\n{sse}Transfer-Encoding: chunked\r\n\r\n").into_bytes();
            for piece in body.chunks(40) {
                wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                wire.extend_from_slice(piece);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            GenResponse { wire, close: false }
        }
        2 => {
            let mut wire = format!("HTTP/1.1 200 OK\r\n{sse}\r\n").into_bytes();
            wire.extend_from_slice(&body);
            GenResponse { wire, close: true }
        }
        3 => GenResponse {
            wire: b"HTTP/1.1 204 No Content\r\nX-Up: Kept\r\n\r\n".to_vec(),
            close: false,
        },
        _ => GenResponse {
            wire: b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops".to_vec(),
            close: false,
        },
    }
}

/// A raw upstream that answers the n-th request it reads with `responses[n]`, and records
/// each request as it saw it.
struct GenBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Message>>>,
}

impl GenBackend {
    async fn start(responses: Vec<GenResponse>) -> GenBackend {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
        let next = Arc::new(AtomicUsize::new(0));
        let (recorded, responses) = (seen.clone(), Arc::new(responses));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (recorded, responses, next) =
                    (recorded.clone(), responses.clone(), next.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let Some(head_len) = read_head(&mut stream, &mut buf).await else {
                            return;
                        };
                        let head = buf[..head_len].to_vec();
                        buf.drain(..head_len);
                        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                        let mut body = Vec::new();
                        if text.contains("transfer-encoding: chunked") {
                            let mut reader = ChunkedReader::new(8192);
                            loop {
                                let mut ranges = Vec::new();
                                let Ok(used) = reader.feed(&buf, |range| ranges.push(range)) else {
                                    return;
                                };
                                for range in ranges {
                                    body.extend_from_slice(&buf[range]);
                                }
                                buf.drain(..used);
                                if reader.is_done() {
                                    break;
                                }
                                let mut chunk = [0u8; 4096];
                                match stream.read(&mut chunk).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                                }
                            }
                        } else if let Some(length) = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                        {
                            while buf.len() < length {
                                let mut chunk = [0u8; 4096];
                                match stream.read(&mut chunk).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                                }
                            }
                            body = buf.drain(..length).collect();
                        }
                        recorded
                            .lock()
                            .expect("lock")
                            .push((per_name_fields(&head), body));
                        let index = next.fetch_add(1, Ordering::SeqCst);
                        let Some(response) = responses.get(index) else {
                            return;
                        };
                        if stream.write_all(&response.wire).await.is_err() || response.close {
                            let _ = stream.shutdown().await;
                            return;
                        }
                    }
                });
            }
        });
        GenBackend { addr, seen }
    }
}

/// A request head as the differential test compares it upstream: the request line, then
/// each field name's lines in the order they came, names in sorted order. The relay keeps
/// the client's field order, where hyper's edits move `Host` (and what follows removed
/// fields) around; the order among one name's fields, their case and values, and every
/// other byte must still be the same.
fn per_name_fields(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut fields: Vec<(String, &str)> = lines
        .filter(|line| !line.is_empty())
        .map(|line| {
            let name = line.split(':').next().unwrap_or_default();
            (name.to_ascii_lowercase(), line)
        })
        .collect();
    // Stable: one name's fields keep their order.
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let mut normal = format!("{request_line}\r\n");
    for (_, line) in fields {
        normal.push_str(line);
        normal.push_str("\r\n");
    }
    normal.push_str("\r\n");
    normal.into_bytes()
}

async fn read_head(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(at) = common::find(buf, b"\r\n\r\n") {
            return Some(at + 4);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The client's view of one connection: each response's raw head and body data.
async fn client_side(addr: SocketAddr, requests: &[GenRequest], pipelined: bool) -> Vec<Message> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let wires: Vec<Vec<u8>> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| request_wire(r, i + 1 == requests.len()))
        .collect();
    if pipelined {
        stream.write_all(&wires.concat()).await.expect("write");
    }
    let mut messages = Vec::new();
    let mut buf = Vec::new();
    for (request, wire) in requests.iter().zip(&wires) {
        if !pipelined {
            stream.write_all(wire).await.expect("write");
        }
        let mut reader = ResponseReader::new(request.head, RULES);
        let mut message: Message = (Vec::new(), Vec::new());
        loop {
            let mut pieces = Vec::new();
            let used = reader.feed(&buf, &mut pieces).expect("a readable response");
            for piece in &pieces {
                match piece {
                    Piece::Head(head) => message.0 = buf[head.range.clone()].to_vec(),
                    Piece::Data(range) => message.1.extend_from_slice(&buf[range.clone()]),
                    Piece::Interim(_) | Piece::End => {}
                }
            }
            buf.drain(..used);
            if reader.is_done() {
                break;
            }
            let mut chunk = [0u8; 8192];
            let n =
                tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut chunk))
                    .await
                    .expect("the response arrives")
                    .expect("read");
            if n == 0 {
                let mut pieces = Vec::new();
                reader
                    .closed(&mut pieces)
                    .expect("the response ended at the close");
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        messages.push(message);
    }
    messages
}

/// The counters and histogram counts of a scrape (timings differ between runs; how many
/// of everything there were must not).
fn counts(metrics: &common::Metrics) -> Vec<String> {
    let mut lines: Vec<String> = metrics
        .text
        .lines()
        .filter(|l| l.starts_with("tokentap_"))
        .filter(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or("");
            (name.ends_with("_total") || name.ends_with("_count")) && !name.contains("scrape")
        })
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

fn exchange_case() -> impl Strategy<Value = (Vec<(GenRequest, u8, usize)>, bool)> {
    let request = (
        prop_oneof![Just("/v1/chat/completions"), Just("/v1/models")],
        proptest::collection::vec(any::<u8>(), 0..30),
        any::<bool>(),
        prop_oneof![5 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(path, body, chunked, head)| GenRequest {
            path,
            body: if head { Vec::new() } else { body },
            chunked,
            head,
        });
    (
        proptest::collection::vec((request, 0u8..5, 0usize..4), 1..4),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("TOKENTAP_IT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Generated exchanges (pipelined or one after another on a keep-alive connection)
    /// through both paths: the client sees the same responses, the upstream the same
    /// requests, and the counts in the scrape are the same.
    #[test]
    fn both_paths_give_the_same_exchange((exchanges, pipelined) in exchange_case()) {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let requests: Vec<GenRequest> = exchanges.iter().map(|(r, _, _)| r.clone()).collect();
            let responses: Vec<GenResponse> = exchanges
                .iter()
                // A body after a HEAD request's response would be read as the next one.
                .map(|(request, kind, events)| response_wire(if request.head { 3 } else { *kind }, *events))
                .collect();
            let mut seen = Vec::new();
            for switch in [false, true] {
                let backend = GenBackend::start(responses.clone()).await;
                // The client's `Host` goes up, so both upstreams see the same heads.
                let yaml = format!(
                    "proxy:\n  http1_fast_path: {switch}\nupstream:\n  host_header: preserve\n"
                );
                let proxy = common::Proxy::start(&format!("http://{}", backend.addr), &yaml).await;
                let client = client_side(proxy.addr, &requests, pipelined).await;
                // Measured requests are recorded at their end, passthrough ones at their head.
                let total = requests.len() as f64;
                let metrics = proxy
                    .wait_metrics("every request recorded", |m| {
                        m.sum("tokentap_requests_total", &[])
                            + m.sum("tokentap_passthrough_requests_total", &[])
                            >= total
                    })
                    .await;
                let upstream = backend.seen.lock().expect("lock").clone();
                seen.push((client, upstream, counts(&metrics)));
            }
            prop_assert_eq!(seen[0].0.len(), requests.len(), "a response per request");
            prop_assert_eq!(seen[0].1.len(), requests.len(), "every request reached the upstream");
            prop_assert!(!seen[0].2.is_empty(), "nothing counted");
            prop_assert_eq!(&seen[0].0, &seen[1].0, "client-visible responses");
            prop_assert_eq!(&seen[0].1, &seen[1].1, "upstream-visible requests");
            prop_assert_eq!(&seen[0].2, &seen[1].2, "counts in the scrape");
            Ok(())
        })?;
    }
}

// --- what the hyper path does, pinned for the fast path's relay to match ---------------

/// hyper's client skips informational heads: a `103` from the upstream never reaches the
/// client; hyper's server answers a client's `Connection: close` with its own
/// `connection: close` after the upstream's fields; and the request head reaches the
/// upstream, on the hyper path, with `Host` moved to the end (the hop-by-hop edits remove
/// and insert it again) and the other fields in the client's case; the relay keeps the
/// client's order and case (the lead's decision), with `Host` where the client put it.
#[tokio::test]
async fn interim_heads_are_dropped_and_host_goes_last() {
    let backend = common::ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            .to_vec(),
    )])
    .await;
    let yaml = |switch: bool| {
        format!("proxy:\n  http1_fast_path: {switch}\nupstream:\n  host_header: preserve\n")
    };
    for switch in [false, true] {
        let proxy = common::Proxy::start(&backend.url(), &yaml(switch)).await;
        let answer = exchange(
            &proxy,
            b"GET /v1/models HTTP/1.1\r\nHost: client.example\r\nX-First: 1\r\nX-Second: 2\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(
            String::from_utf8_lossy(&answer),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok",
            "switch {switch}"
        );
    }
    let requests = backend.requests.lock().expect("lock").clone();
    assert_eq!(requests.len(), 2);
    let hyper_order =
        "GET /v1/models HTTP/1.1\r\nX-Second: 2\r\nX-First: 1\r\nHost: client.example\r\n\r\n";
    let client_order =
        "GET /v1/models HTTP/1.1\r\nHost: client.example\r\nX-First: 1\r\nX-Second: 2\r\n\r\n";
    assert_eq!(
        String::from_utf8_lossy(&requests[0]),
        hyper_order,
        "switch false"
    );
    assert_eq!(String::from_utf8_lossy(&requests[1]), client_order, "relay");
}

/// A chunked body that turns malformed after a good chunk, both in one write: each path
/// passes the good chunk on (hyper's client yields it before the error) and then cuts
/// the response without its last chunk.
#[tokio::test]
async fn data_before_a_malformed_chunk_is_passed_on() {
    let backend = common::ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
          12\r\ndata: {\"a\":true}\n\n\r\nzz\r\nmore\r\n"
            .to_vec(),
    )])
    .await;
    let (off, on) = both(&backend.url()).await;
    let request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let expected = exchange(&off, request).await;
    assert!(
        expected.ends_with(b"12\r\ndata: {\"a\":true}\n\n\r\n"),
        "{:?}",
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(
        String::from_utf8_lossy(&exchange(&on, request).await),
        String::from_utf8_lossy(&expected)
    );
}

/// `upstream.idle_timeout` counts from the last data, on both paths: a stream whose
/// chunks come 100 ms apart outlives a 300 ms idle timeout many times over (the relay
/// re-arms its one timer lazily, so this is the case that would catch a deadline that is
/// not moved on), and the same stream cut by a 2 s stall times out.
#[tokio::test]
async fn the_idle_timeout_ends_a_stall_not_a_steady_stream() {
    let chunk = b"a\r\ndata: {}\n\n\r\n".to_vec();
    let head =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut steady = vec![Step::Write(head.to_vec())];
    for _ in 0..12 {
        steady.push(Step::Sleep(Duration::from_millis(100)));
        steady.push(Step::Write(chunk.clone()));
    }
    let mut stalled = steady.clone();
    steady.push(Step::Write(b"0\r\n\r\n".to_vec()));
    stalled.push(Step::Sleep(Duration::from_secs(2)));
    stalled.push(Step::Write(b"0\r\n\r\n".to_vec()));
    let request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for switch in [false, true] {
        let yaml =
            format!("proxy:\n  http1_fast_path: {switch}\nupstream:\n  idle_timeout: 300ms\n");
        let backend = common::ScriptedBackend::start(steady.clone()).await;
        let proxy = common::Proxy::start(&backend.url(), &yaml).await;
        let answer = exchange(&proxy, request).await;
        assert!(
            answer.ends_with(b"0\r\n\r\n"),
            "switch {switch}: {:?}",
            String::from_utf8_lossy(&answer)
        );

        let backend = common::ScriptedBackend::start(stalled.clone()).await;
        let proxy = common::Proxy::start(&backend.url(), &yaml).await;
        let started = std::time::Instant::now();
        let answer = exchange(&proxy, request).await;
        let took = started.elapsed();
        assert!(
            !answer.ends_with(b"0\r\n\r\n"),
            "switch {switch}: the stall is cut"
        );
        // 1.2 s of chunks, then 300 ms of silence: cut at ~1.5 s, well before the stall
        // ends at 3.2 s.
        assert!(
            took < Duration::from_millis(2500),
            "switch {switch}: cut after {took:?}"
        );
    }
}

/// A response head that reaches tokentap in three reads (the relay carries the start of
/// it from read to read): the same answer on both paths.
#[tokio::test]
async fn a_head_split_across_upstream_reads_is_read_whole() {
    let pause = || Step::Sleep(Duration::from_millis(50));
    let backend = common::ScriptedBackend::start(vec![
        Step::Write(b"HTTP/1.1 200 OK\r\nContent-Le".to_vec()),
        pause(),
        Step::Write(b"ngth: 2\r\nX-Up: Ke".to_vec()),
        pause(),
        Step::Write(b"pt\r\n\r\nok".to_vec()),
    ])
    .await;
    let (off, on) = both(&backend.url()).await;
    let request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    same_answer(&off, &on, request, b"HTTP/1.1 200 OK\r\n").await;
    assert!(exchange(&on, request)
        .await
        .ends_with(b"X-Up: Kept\r\nconnection: close\r\n\r\nok"));
}
