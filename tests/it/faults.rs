//! Faults that the upstream, the client or the operator inflict on a live stream, and
//! what tokentap does about each: the client always sees what it would have seen without
//! tokentap, every request is counted exactly once with an honest outcome, and nothing
//! tokentap holds grows with what the client has not read yet.
//!
//! Already covered elsewhere (and listed in docs/RELIABILITY.md): connection refused
//! (502), reset mid-stream, stall past the idle timeout, 200 then an error event,
//! 429/503 with `Retry-After`, one client disconnecting (tests/it/proxy.rs), SIGHUP
//! reload and one stream drained on SIGTERM (tests/it/lifecycle.rs).
//!
//! The tests that start many connections size themselves to the open-file limit
//! (`ulimit -n`) and say so when they had to shrink.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use tokentap_sim::{ModelProfile, SimConfig, UsageMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The soft limit on open files of this process (inherited by the binary it starts).
fn open_file_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(1024)
}

/// `wanted` connections, or fewer if `fds_per_connection * n` would not fit the limit.
fn scaled(wanted: usize, fds_per_connection: usize) -> usize {
    let limit = open_file_limit();
    let fit = limit.saturating_sub(256) / fds_per_connection;
    if fit < wanted {
        eprintln!(
            "open-file limit {limit}: running {fit} connections instead of {wanted} \
             (raise `ulimit -n` to run the full case)"
        );
    }
    wanted.min(fit).max(1)
}

/// A raw HTTP/1.1 streaming chat request.
fn raw_chat(model: &str, tenant: &str, close: bool, extra_headers: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    format!(
        "POST {CHAT} HTTP/1.1\r\nHost: tokentap\r\nContent-Type: application/json\r\n\
         X-Tenant-ID: {tenant}\r\n{extra_headers}{}Content-Length: {}\r\n\r\n{body}",
        if close { "Connection: close\r\n" } else { "" },
        body.len()
    )
    .into_bytes()
}

/// Connect, send `request` and read until the first SSE `data:` line has arrived.
async fn open_stream(addr: SocketAddr, request: &[u8]) -> (TcpStream, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("send request");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while find(&seen, b"data: ").is_none() {
        let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf))
            .await
            .expect("first event within 20 s")
            .expect("read");
        assert!(n > 0, "closed before the first event: {seen:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    (stream, seen)
}

/// The tests that open hundreds of connections or run the binary under load take turns,
/// so that each has the machine (and its timing margins) to itself.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(ms(10)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Streams that end early.
// ---------------------------------------------------------------------------------------

fn short_sim() -> SimConfig {
    SimConfig {
        models: vec![ModelProfile::new("m", ms(5), ms(2), 20)],
        usage: UsageMode::Never,
        role_chunk: true,
        ..SimConfig::default()
    }
}

/// An HTTP-complete body that stops after 5 tokens, with no finish chunk, usage or
/// `[DONE]` (`x-sim-fault: end-after=5`) is `completed`: the message ended the way HTTP
/// says a message ends (chunked terminator), which is all a proxy can know. Several
/// dialects (Anthropic, Responses, TGI, Ollama) never send `[DONE]`, and a server that
/// stops early on purpose (a stop sequence with a buggy final chunk) looks the same. The
/// tokens are what the client received, and the client sees the same clean end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_end_without_done_is_completed_with_the_tokens_received() {
    let sim = SimHandle::start(short_sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let mut request = chat(&proxy.url(CHAT), "m", "t", true, false);
    request
        .headers_mut()
        .insert("x-sim-fault", "end-after=5".parse().unwrap());
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the client sees a clean end, as it would directly")
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(!text.contains("[DONE]"), "{text}");
    assert_eq!(text.matches("\"content\":\" ").count(), 5, "{text}");
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        1.0
    );
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 5.0);
    assert_eq!(m.sum("tokentap_decode_errors_total", &[]), 0.0);
}

/// A chunked body whose connection closes before the terminating zero-length chunk, and
/// a `Content-Length` body that closes short, are incomplete HTTP messages: the client
/// sees the stream break (tokentap does not invent a clean end) and the outcome is
/// `upstream_error`, with the tokens that did arrive measured. A close-delimited body (no
/// length, no chunking: HTTP/1.0 style) ends at EOF by definition: `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_closed_before_the_last_chunk_is_an_upstream_error() {
    let event = |word: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{word}\"}}}}]}}\n\n")
    };
    let chunk = |data: &str| format!("{:x}\r\n{data}\r\n", data.len()).into_bytes();
    let sse_head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n";

    // (1) chunked, cut before `0\r\n\r\n`.
    let chunked = ScriptedBackend::start(vec![
        Step::Write(format!("{sse_head}Transfer-Encoding: chunked\r\n\r\n").into_bytes()),
        Step::Write(chunk(&event("a"))),
        Step::Write(chunk(&event("b"))),
        Step::Sleep(ms(20)),
    ])
    .await;
    // (2) Content-Length promises more than is sent.
    let two = format!("{}{}", event("a"), event("b"));
    let short = ScriptedBackend::start(vec![Step::Write(
        format!(
            "{sse_head}Content-Length: {}\r\n\r\n{two}",
            two.len() + 1000
        )
        .into_bytes(),
    )])
    .await;
    // (3) close-delimited: the end of the connection is the end of the body.
    let delimited = ScriptedBackend::start(vec![Step::Write(
        format!("{sse_head}Connection: close\r\n\r\n{two}data: [DONE]\n\n").into_bytes(),
    )])
    .await;

    for (name, backend, want_outcome, want_break) in [
        ("chunked", &chunked, "upstream_error", true),
        ("content-length", &short, "upstream_error", true),
        ("close-delimited", &delimited, "completed", false),
    ] {
        let proxy = Proxy::start(&backend.url(), "").await;
        let response = client()
            .request(chat(&proxy.url(CHAT), "m", name, true, false))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{name}");
        let mut body = response.into_body();
        let mut received = Vec::new();
        let broke = loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        received.extend_from_slice(data);
                    }
                }
                Some(Err(_)) => break true,
                None => break false,
            }
        };
        assert_eq!(broke, want_break, "{name}: the client's view of the end");
        assert!(received.starts_with(two.as_bytes()), "{name}: {received:?}");
        let m = proxy
            .wait_metrics(name, |m| m.sum("tokentap_requests_total", &[]) >= 1.0)
            .await;
        assert_eq!(
            m.sum("tokentap_requests_total", &[("outcome", want_outcome)]),
            1.0,
            "{name}: {}",
            m.text
        );
        assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0, "{name}");
        assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 2.0, "{name}");
        assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 0.0, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Many clients going away at once.
// ---------------------------------------------------------------------------------------

/// 1,000 streaming clients drop their connections in the same instant: each request is
/// counted once as `cancelled`, the in-flight gauge returns to 0, and every upstream
/// stream is closed (none left streaming into a pooled connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_disconnecting_at_once_are_all_cancelled() {
    let _heavy = HEAVY.lock().await;
    // Four descriptors per stream in this process: client, tokentap's two sides, the sim.
    let n = scaled(1000, 4);
    // Long streams, slow enough that 1,000 of them cost little in a debug build.
    let sim = SimHandle::start(long_streams_sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let started = Instant::now();
    let mut opening = Vec::with_capacity(n);
    for i in 0..n {
        let addr = proxy.addr;
        opening.push(tokio::spawn(async move {
            open_stream(addr, &raw_chat("m", &format!("c{}", i % 10), false, "")).await
        }));
    }
    let mut streams = Vec::with_capacity(n);
    for task in opening {
        streams.push(task.await.unwrap().0);
    }
    assert_eq!(sim.open_streams(), n as u64);
    let m = proxy.metrics().await;
    assert_eq!(m.sum("tokentap_streams_in_flight", &[]), n as f64);
    eprintln!("{n} streams open after {:?}", started.elapsed());

    let dropped = Instant::now();
    drop(streams);
    let m = proxy
        .wait_metrics("every request cancelled", |m| {
            m.sum("tokentap_requests_total", &[]) >= n as f64
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "cancelled")]),
        n as f64,
        "{}",
        m.text
    );
    assert_eq!(m.sum("tokentap_requests_total", &[]), n as f64);
    assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 0.0);
    wait_until(
        "every upstream stream closed",
        Duration::from_secs(10),
        || sim.open_streams() == 0,
    )
    .await;
    eprintln!(
        "{n} cancellations recorded and upstreams closed {:?} after the drop",
        dropped.elapsed()
    );
    // And tokentap still serves.
    let response = client()
        .request(chat(&proxy.url(CHAT), "quick", "after", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// Open `n` long streams and return them (each has received its first event).
async fn hold_streams(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        streams.push(
            open_stream(addr, &raw_chat("m", &format!("h{i}"), false, ""))
                .await
                .0,
        );
    }
    streams
}

fn long_streams_sim() -> SimConfig {
    SimConfig {
        models: vec![
            ModelProfile::new("m", ms(5), ms(1000), 10_000),
            ModelProfile::new("quick", ms(1), ms(1), 3),
        ],
        usage: UsageMode::Never,
        ..SimConfig::default()
    }
}

/// `limits.max_in_flight` sheds load: with the limit reached, a new request gets tokentap's
/// own 503 at once (the upstream never sees it), and as soon as a stream ends its slot is
/// free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_in_flight_limit_get_503_and_slots_come_back() {
    let sim = SimHandle::start(long_streams_sim()).await;
    let proxy = Proxy::start(&sim.url(), "limits:\n  max_in_flight: 3\n").await;
    let streams = hold_streams(proxy.addr, 3).await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "quick", "shed", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(body_text(response)
        .await
        .contains("too many requests in flight"));
    assert_eq!(
        sim.open_streams(),
        3,
        "the shed request never reached the upstream"
    );
    drop(streams);
    proxy
        .wait_metrics("the held streams cancelled", |m| {
            m.sum("tokentap_requests_total", &[("outcome", "cancelled")]) == 3.0
                && m.sum("tokentap_streams_in_flight", &[]) == 0.0
        })
        .await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "quick", "after", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await;
}

/// A request shed at the in-flight limit is an answer tokentap gave on the LLM route, so
/// it should be counted, not only logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_shed_at_the_in_flight_limit_are_counted() {
    let sim = SimHandle::start(long_streams_sim()).await;
    let proxy = Proxy::start(&sim.url(), "limits:\n  max_in_flight: 1\n").await;
    let _held = hold_streams(proxy.addr, 1).await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "quick", "shed", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let m = proxy.metrics().await;
    assert_eq!(
        m.sum("tokentap_overload_rejections_total", &[]),
        1.0,
        "{}",
        m.text
    );
}

// ---------------------------------------------------------------------------------------
// The real binary: backpressure with a slow client, SIGTERM during 500 streams.
// ---------------------------------------------------------------------------------------

/// A backend that answers one streaming chat request with an endless SSE body, written as
/// fast as its socket accepts, and counts the bytes the kernel took from it.
struct Firehose {
    addr: SocketAddr,
    /// Body bytes accepted by the socket so far.
    written: Arc<AtomicU64>,
    /// The connection to tokentap was closed (a write failed).
    closed: Arc<AtomicBool>,
}

impl Firehose {
    /// `send_buffer`: SO_SNDBUF of the backend's sockets (inherited from the listener), so
    /// the backend's own kernel buffer is not where the bytes pile up.
    async fn start(send_buffer: u32) -> Firehose {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(send_buffer).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(16).unwrap();
        let addr = listener.local_addr().unwrap();
        let written = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let (count, done) = (written.clone(), closed.clone());
        tokio::spawn(async move {
            // The first connection that sends a whole request (readiness probes connect
            // and close without one).
            let mut stream = 'accept: loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                if read_request(&mut stream, &mut Vec::new()).await.is_some() {
                    break 'accept stream;
                }
            };
            let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
            if stream.write_all(head).await.is_err() {
                done.store(true, Ordering::SeqCst);
                return;
            }
            // 64 KiB chunks of token events.
            let event = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
            let mut data = Vec::new();
            while data.len() + event.len() <= 64 << 10 {
                data.extend_from_slice(event);
            }
            let mut frame = format!("{:x}\r\n", data.len()).into_bytes();
            frame.extend_from_slice(&data);
            frame.extend_from_slice(b"\r\n");
            loop {
                let mut rest = &frame[..];
                while !rest.is_empty() {
                    match stream.write(rest).await {
                        Ok(0) | Err(_) => {
                            done.store(true, Ordering::SeqCst);
                            return;
                        }
                        Ok(n) => {
                            count.fetch_add(n as u64, Ordering::SeqCst);
                            rest = &rest[n..];
                        }
                    }
                }
            }
        });
        Firehose {
            addr,
            written,
            closed,
        }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    /// Wait until the written count stops moving for `quiet`; returns it.
    async fn plateau(&self, quiet: Duration, timeout: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = self.written();
        let mut since = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(ms(50)).await;
            let now = self.written();
            if now != last {
                last = now;
                since = tokio::time::Instant::now();
            } else if since.elapsed() >= quiet {
                return now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the backend never stopped writing: {now} bytes accepted"
            );
        }
    }
}

const MIB: u64 = 1 << 20;

/// A client that stops reading: tokentap stops reading the upstream (the backend's
/// accepted bytes plateau at what the sockets' kernel buffers hold), its memory does not
/// grow with the unread stream, reading N more bytes lets about N more through, and when
/// the client finally goes away the upstream connection is closed and the request is
/// `cancelled`. Runs the real binary so its RSS can be read from /proc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_backpressure_bounds_upstream_reads_and_memory() {
    let _heavy = HEAVY.lock().await;
    let firehose = Firehose::start(64 << 10).await;
    let process = TokentapProcess::start_with_yaml(
        "backpressure",
        &format!(
            "upstream:\n  url: http://{}\n  idle_timeout: 60s\n",
            firehose.addr
        ),
    );
    let rss_before = process.rss_bytes();

    // The client's receive buffer is small and fixed (no autotuning), so the bytes that
    // are in flight sit in tokentap's sockets, or in tokentap.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(32 << 10).unwrap();
    let mut client = socket.connect(process.proxy).await.unwrap();
    client
        .write_all(&raw_chat("m", "slow", false, ""))
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let mut read = 0u64;
    while read < 256 << 10 {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0);
        read += n as u64;
    }

    // The client stops reading.
    let plateau = firehose.plateau(ms(1000), Duration::from_secs(30)).await;
    let rss_at_plateau = process.rss_bytes();
    let in_flight = plateau - read;
    // What can legitimately be in flight: the backend's send buffer (64 KiB, doubled by
    // the kernel), tokentap's upstream receive buffer and client send buffer (autotuned,
    // at most tcp_rmem[2] + tcp_wmem[2]), the client's 32 KiB receive buffer, and hyper's
    // read buffer (~400 KiB) plus a frame. Anything that grew with the stream would blow
    // through this.
    let sysctl_max = |name: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .ok()
            .and_then(|v| v.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
            .unwrap_or(8 * MIB)
    };
    let bound = sysctl_max("tcp_rmem") + sysctl_max("tcp_wmem") + 2 * MIB;
    eprintln!(
        "client read {read} B then stopped; backend plateaued at {plateau} B \
         ({in_flight} B in flight; bound {bound} B); tokentap RSS {} -> {} KiB",
        rss_before / 1024,
        rss_at_plateau / 1024
    );
    assert!(in_flight < bound, "{in_flight} B in flight");
    // tokentap's own memory did not take the unread stream in: RSS grew by far less than
    // what was in flight could make it, had it been buffered (kernel socket buffers are
    // not part of RSS).
    let grown = rss_at_plateau.saturating_sub(rss_before);
    assert!(grown < 16 * MIB, "tokentap RSS grew by {grown} B");

    // Reading 8 MiB more lets roughly 8 MiB more through, then it stops again.
    let more = 8 * MIB;
    let mut got = 0u64;
    while got < more {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got += n as u64;
    }
    let second = firehose.plateau(ms(1000), Duration::from_secs(30)).await;
    eprintln!(
        "after reading {got} B more the backend plateaued at {second} B (+{} B)",
        second - plateau
    );
    assert!(
        second >= plateau + more / 2,
        "upstream reads follow the client"
    );
    assert!(second - read - got < bound, "still bounded");
    assert!(process.rss_bytes().saturating_sub(rss_before) < 16 * MIB);

    // The client goes away: the upstream connection is closed, the request cancelled.
    drop(client);
    wait_until(
        "the upstream connection closed",
        Duration::from_secs(10),
        || firehose.closed.load(Ordering::SeqCst),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = process.metrics().await;
        if m.sum("tokentap_requests_total", &[]) >= 1.0 {
            assert_eq!(
                m.sum("tokentap_requests_total", &[("outcome", "cancelled")]),
                1.0
            );
            assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 0.0);
            // What reached the client was measured (tokens = events seen by tokentap,
            // which include the ones still in socket buffers when the client left).
            assert!(m.sum("tokentap_output_tokens_total", &[]) > 0.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no outcome recorded:\n{}",
            m.text
        );
        tokio::time::sleep(ms(20)).await;
    }
}

/// Read a raw HTTP/1.1 response to EOF; returns (bytes, clean end): the chunked body's
/// terminating chunk arrived.
async fn read_to_end(mut stream: TcpStream, mut seen: Vec<u8>) -> (Vec<u8>, bool) {
    let _ = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut seen)).await;
    let clean = seen.ends_with(b"\r\n0\r\n\r\n");
    (seen, clean)
}

/// SIGTERM while 500 streams are live, with a drain deadline longer than the streams:
/// every stream finishes in full, tokentap exits 0, and every request is counted exactly
/// once: the scraped `requests_total` equals the requests sent (checked while one longer
/// "guard" stream keeps the process up), and there is one access-log line per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_500_streams_drains_them_all_and_counts_each_once() {
    let _heavy = HEAVY.lock().await;
    // Descriptors: this process holds the client and the sim side, tokentap two.
    let n = scaled(500, 2);
    let sim = SimHandle::start(SimConfig {
        models: vec![
            // 4 s streams: still running when SIGTERM comes, however slow the opening.
            ModelProfile::new("m", ms(20), ms(100), 40),
            ModelProfile::new("guard", ms(20), ms(100), 120),
        ],
        usage: UsageMode::Always,
        ..SimConfig::default()
    })
    .await;
    let process = TokentapProcess::start_with_yaml(
        "sigterm",
        &format!(
            "upstream:\n  url: {}\nshutdown:\n  drain_timeout: 30s\nlabels:\n  tenant:\n    max_values: 2000\n  max_pairs: 2000\n",
            sim.url()
        ),
    );
    let (guard, guard_seen) =
        open_stream(process.proxy, &raw_chat("guard", "guard", true, "")).await;
    let mut opening = Vec::with_capacity(n);
    for i in 0..n {
        let addr = process.proxy;
        opening.push(tokio::spawn(async move {
            open_stream(addr, &raw_chat("m", &format!("c{i}"), true, "")).await
        }));
    }
    let mut streams = Vec::with_capacity(n);
    let started = Instant::now();
    for task in opening {
        streams.push(task.await.unwrap());
    }
    eprintln!("{n} streams open in {:?}", started.elapsed());
    assert_eq!(
        sim.open_streams(),
        n as u64 + 1,
        "all streams live at SIGTERM"
    );

    let term_at = Instant::now();
    process.signal("TERM");
    let reading: Vec<_> = streams
        .into_iter()
        .map(|(stream, seen)| tokio::spawn(read_to_end(stream, seen)))
        .collect();
    let guard_reading = tokio::spawn(read_to_end(guard, guard_seen));
    for task in reading {
        let (bytes, clean) = task.await.unwrap();
        assert!(
            clean && find(&bytes, b"data: [DONE]").is_some(),
            "a stream was cut: {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    let drained = term_at.elapsed();
    // New connections are refused while draining.
    assert!(TcpStream::connect(process.proxy).await.is_err());

    // The guard stream is still running: every one of the n requests is counted, once.
    let m = process.metrics().await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[]),
        n as f64,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        n as f64
    );
    assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 1.0);
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 40.0 * n as f64);

    let (guard_bytes, guard_clean) = guard_reading.await.unwrap();
    assert!(guard_clean, "{}", String::from_utf8_lossy(&guard_bytes));
    let ((status, access), exited) = process_exit(process, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "exit status");
    eprintln!(
        "{n} streams drained {drained:?} after SIGTERM; exit 0 {:?} after SIGTERM",
        exited - term_at
    );
    assert_eq!(access.len(), n + 1, "one access-log line per request");
    let mut tenants: Vec<&str> = access
        .iter()
        .map(|l| l["tenant"].as_str().unwrap())
        .collect();
    tenants.sort_unstable();
    tenants.dedup();
    assert_eq!(tenants.len(), n + 1, "no request logged twice");
    assert!(access.iter().all(|l| l["outcome"] == "completed"));
}

/// Wait for the process to exit; returns its status, its access-log lines (one per
/// finished LLM request) and when it was seen to exit.
async fn process_exit(
    process: TokentapProcess,
    within: Duration,
) -> ((std::process::ExitStatus, Vec<serde_json::Value>), Instant) {
    let logs = process.logs.clone();
    let (status, exited) = process.wait_exit(within).await;
    let access = logs
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "tokentap::access" && v["message"] == "request")
        .collect();
    ((status, access), exited)
}

/// SIGTERM while 500 streams are live that would outlast the drain deadline: tokentap
/// exits 0 soon after the deadline, the streams are cut (the client sees no clean end),
/// and each request is still counted exactly once, as `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_drain_deadline_cuts_and_counts_every_stream() {
    let _heavy = HEAVY.lock().await;
    let n = scaled(500, 2);
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(20), ms(200), 1000)],
        usage: UsageMode::Never,
        ..SimConfig::default()
    })
    .await;
    let process = TokentapProcess::start_with_yaml(
        "deadline",
        &format!(
            "upstream:\n  url: {}\nshutdown:\n  drain_timeout: 1s\nlabels:\n  tenant:\n    max_values: 2000\n  max_pairs: 2000\n",
            sim.url()
        ),
    );
    let mut opening = Vec::with_capacity(n);
    for i in 0..n {
        let addr = process.proxy;
        opening.push(tokio::spawn(async move {
            open_stream(addr, &raw_chat("m", &format!("c{i}"), true, "")).await
        }));
    }
    let mut streams = Vec::with_capacity(n);
    for task in opening {
        streams.push(task.await.unwrap());
    }
    let term_at = Instant::now();
    process.signal("TERM");
    let reading: Vec<_> = streams
        .into_iter()
        .map(|(stream, seen)| tokio::spawn(read_to_end(stream, seen)))
        .collect();
    let ((status, access), exited) = process_exit(process, Duration::from_secs(20)).await;
    let took = exited - term_at;
    assert_eq!(status.code(), Some(0));
    eprintln!("exit 0 {took:?} after SIGTERM with a 1 s drain deadline");
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
    for task in reading {
        let (bytes, clean) = task.await.unwrap();
        assert!(!clean, "a cut stream must not look complete");
        assert!(find(&bytes, b"data: [DONE]").is_none());
    }
    assert_eq!(access.len(), n, "one access-log line per request");
    let mut tenants: Vec<&str> = access
        .iter()
        .map(|l| l["tenant"].as_str().unwrap())
        .collect();
    tenants.sort_unstable();
    tenants.dedup();
    assert_eq!(tenants.len(), n, "no request logged twice");
    assert!(
        access.iter().all(|l| l["outcome"] == "cancelled"),
        "{:?}",
        access.iter().find(|l| l["outcome"] != "cancelled")
    );
    // The upstream side of every stream was closed too.
    wait_until("upstream streams closed", Duration::from_secs(10), || {
        sim.open_streams() == 0
    })
    .await;
}
