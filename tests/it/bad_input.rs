//! Hostile or broken input from either side: the stream is forwarded byte for byte,
//! observation gives up (and says so in a metric) rather than buffer without bound, and
//! connection-level abuse is cut off by configured limits without disturbing other
//! traffic.
//!
//! The two 100 MiB cases stream their data through generators and hashes: neither the
//! test nor (as the RSS check shows) tokentap ever holds the 100 MiB.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use sha2::{Digest, Sha256};
use tokentap_sim::{ModelProfile, SimConfig, UsageMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CHAT: &str = "/v1/chat/completions";
const MIB: usize = 1 << 20;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn rss() -> u64 {
    vm_rss_bytes("self").unwrap_or(0)
}

/// Samples this process's RSS every 10 ms until dropped; `peak()` is the highest seen.
struct RssWatch {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssWatch {
    fn start() -> RssWatch {
        let peak = Arc::new(AtomicU64::new(rss()));
        let seen = peak.clone();
        let task = tokio::spawn(async move {
            loop {
                seen.fetch_max(rss(), Ordering::Relaxed);
                tokio::time::sleep(ms(10)).await;
            }
        });
        RssWatch { peak, task }
    }

    fn peak(&self) -> u64 {
        self.peak.fetch_max(rss(), Ordering::Relaxed).max(rss())
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The SHA-256 and length of a body, published once it has all passed.
type Digest256 = Arc<Mutex<Option<(Vec<u8>, u64)>>>;

fn sse_event(content: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n")
}

// ---------------------------------------------------------------------------------------
// Broken response bodies.
// ---------------------------------------------------------------------------------------

/// A stream of malformed SSE (comments, fields without a colon, lone CR line endings,
/// control bytes, events that are not JSON) and invalid UTF-8 (inside a JSON string and
/// as a bare data line), cut into chunks at awkward places (inside a multi-byte sequence,
/// between CR and LF): the client gets exactly the upstream's bytes; the events that can
/// be read are measured; the others are counted in `tokentap_decode_errors_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_sse_and_invalid_utf8_are_forwarded_byte_identical() {
    let _memory = MEMORY.read().await;
    let mut body = Vec::new();
    body.extend_from_slice(b": a comment\n\n");
    body.extend_from_slice(sse_event("a").as_bytes()); // token 1
    body.extend_from_slice(b"data: {not json\n\n"); // malformed 1
    body.extend_from_slice(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xff\xfe\"}}]}\n\n",
    ); // malformed 2
    body.extend_from_slice(b"a field without a colon\n\n"); // no data: no event
    body.extend_from_slice(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\r\r",
    ); // token 2
    body.extend_from_slice(b"\x00\x01\x02\x7f binary\r\n\r\n"); // no data: no event
    body.extend_from_slice(b"data: \xc3\x28\xa0\xa1\n\n"); // malformed 3
    body.extend_from_slice(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xc3\xa9\xe2\x82\xac\"}}]}\r\n\r\n"); // token 3 (valid multi-byte)
    body.extend_from_slice(b"data: [DONE]\n\n");

    let mut script = vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec(),
    )];
    // 7-byte chunks cut multi-byte sequences and CR LF pairs.
    for piece in body.chunks(7) {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(piece);
        chunk.extend_from_slice(b"\r\n");
        script.push(Step::Write(chunk));
    }
    script.push(Step::Write(b"0\r\n\r\n".to_vec()));
    let backend = ScriptedBackend::start(script).await;
    let proxy = Proxy::start(&backend.url(), "").await;
    let request = {
        let body = br#"{"model":"m","stream":true,"messages":[]}"#;
        let mut r = format!(
            "POST {CHAT} HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    };
    let direct = raw_exchange(backend.addr, &request).await;
    let proxied = raw_exchange(proxy.addr, &request).await;
    let (_, direct_body, _) = parse_raw_response(&direct);
    let (_, proxied_body, _) = parse_raw_response(&proxied);
    assert_eq!(direct_body, body);
    assert_eq!(
        proxied_body, body,
        "the client must get the upstream's bytes"
    );

    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        1.0
    );
    // No usage: N is the events' estimates, a token per word or symbol: "a", "b", and
    // "é€" (a letter and a symbol, two).
    assert_eq!(
        m.sum("tokentap_output_tokens_total", &[]),
        4.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(
            "tokentap_decode_errors_total",
            &[("dialect", "openai_chat")]
        ),
        3.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum("tokentap_unobserved_responses_total", &[]),
        0.0,
        "skipping bad events is not giving up"
    );
}

/// A non-streaming JSON body that is cut short and holds invalid UTF-8 is forwarded as
/// is, counted as one decode error and the request as `completed` (the HTTP exchange
/// completed; the body is the upstream's business).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_json_body_is_forwarded_and_counted() {
    let _memory = MEMORY.read().await;
    let body: &[u8] = b"{\"id\":\"x\",\"choices\":[{\"message\":{\"content\":\"\xff\xfe";
    let mut head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    head.extend_from_slice(body);
    let backend = ScriptedBackend::start(vec![Step::Write(head)]).await;
    let proxy = Proxy::start(&backend.url(), "").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", false, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let got = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&got[..], body);
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum("tokentap_decode_errors_total", &[]),
        1.0,
        "{}",
        m.text
    );
}

/// How a streamed response around one giant event is written: content type, what comes
/// before the giant event's text, the giant event's opening and closing, and the end.
struct Shape {
    content_type: &'static str,
    opening: String,
    big_open: &'static [u8],
    closing: String,
}

fn sse_shape() -> Shape {
    Shape {
        content_type: "text/event-stream",
        opening: format!("{}{}", sse_event("a"), sse_event("b")),
        big_open: b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"",
        closing: format!("\"}}}}]}}\n\n{}data: [DONE]\n\n", sse_event("c")),
    }
}

fn ndjson_shape() -> Shape {
    let line = |content: &str| {
        format!("{{\"model\":\"m\",\"message\":{{\"role\":\"assistant\",\"content\":\"{content}\"}},\"done\":false}}\n")
    };
    Shape {
        content_type: "application/x-ndjson",
        opening: format!("{}{}", line("a"), line("b")),
        big_open: b"{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"",
        closing: format!(
            "\"}},\"done\":false}}\n{}{{\"model\":\"m\",\"message\":{{\"role\":\"assistant\",\"content\":\"\"}},\"done\":true,\"eval_count\":3}}\n",
            line("c")
        ),
    }
}

/// A backend whose streamed response has one giant event (of `event_bytes` of text)
/// between ordinary ones, generated on the fly; it publishes the SHA-256 and length of the
/// body it sent.
struct BigEventBackend {
    addr: SocketAddr,
    sent: Digest256,
}

impl BigEventBackend {
    async fn start(shape: Shape, event_bytes: usize) -> BigEventBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(Mutex::new(None));
        let publish = sent.clone();
        tokio::spawn(async move {
            // The first connection that sends a request (readiness probes connect and
            // close without one).
            let mut stream = loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                if read_request(&mut stream, &mut Vec::new()).await.is_some() {
                    break stream;
                }
            };
            let mut hash = Sha256::new();
            let mut total = 0u64;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
                shape.content_type
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut chunk = |data: &[u8]| {
                hash.update(data);
                total += data.len() as u64;
                let mut out = format!("{:x}\r\n", data.len()).into_bytes();
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
                out
            };
            for frame in [chunk(shape.opening.as_bytes()), chunk(shape.big_open)] {
                stream.write_all(&frame).await.unwrap();
            }
            // The giant event's text, in 64 KiB chunks.
            let filler: Vec<u8> = (0..64 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
            let mut left = event_bytes;
            while left > 0 {
                let n = left.min(filler.len());
                let frame = chunk(&filler[..n]);
                if stream.write_all(&frame).await.is_err() {
                    return;
                }
                left -= n;
            }
            let frame = chunk(shape.closing.as_bytes());
            stream.write_all(&frame).await.unwrap();
            stream.write_all(b"0\r\n\r\n").await.unwrap();
            *publish.lock().unwrap() = Some((hash.finalize().to_vec(), total));
            let _ = stream.shutdown().await;
        });
        BigEventBackend { addr, sent }
    }
}

/// One event of 100 MiB, as an SSE event (OpenAI chat) and as an NDJSON line (Ollama):
/// the observer stops at `observe.max_event_bytes` (1 MiB by default) and says so
/// (`tokentap_unobserved_responses_total{reason="decode_limit"}`), the client still
/// receives every byte (same SHA-256 and length), the tokens before the giant event are
/// measured, the request is `completed`, and memory stays bounded: this process (which
/// runs tokentap, the backend and the client) grows by far less than the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_event_is_forwarded_intact_and_observation_gives_up() {
    let _memory = MEMORY.write().await;
    for (name, shape, path, dialect) in [
        ("sse", sse_shape(), CHAT, "openai_chat"),
        ("ndjson", ndjson_shape(), "/api/chat", "ollama"),
    ] {
        big_event(name, shape, path, dialect).await;
    }
}

async fn big_event(name: &str, shape: Shape, path: &str, dialect: &str) {
    let backend = BigEventBackend::start(shape, 100 * MIB).await;
    let proxy = Proxy::start(&format!("http://{}", backend.addr), "").await;
    let baseline = rss();
    let watch = RssWatch::start();
    let started = Instant::now();
    let response = client()
        .request(chat(&proxy.url(path), "m", "t", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut hash = Sha256::new();
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the stream is not broken");
        if let Some(data) = frame.data_ref() {
            hash.update(data);
            total += data.len() as u64;
        }
    }
    let elapsed = started.elapsed();
    let peak = watch.peak();
    let (sent_hash, sent_total) = backend.sent.lock().unwrap().clone().expect("sent");
    assert_eq!(total, sent_total, "{name}");
    assert_eq!(
        hash.finalize().to_vec(),
        sent_hash,
        "{name}: body bytes differ"
    );
    assert!(total > 100 * MIB as u64);

    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum(
            "tokentap_unobserved_responses_total",
            &[("reason", "decode_limit")]
        ),
        1.0,
        "{name}: {}",
        m.text
    );
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        1.0,
        "{name}"
    );
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 2.0, "{name}");
    assert_eq!(
        m.sum("tokentap_decode_errors_total", &[("dialect", dialect)]),
        0.0
    );
    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "{name}: 100 MiB event forwarded in {elapsed:?}; RSS {} MiB -> peak {} MiB",
        baseline >> 20,
        peak >> 20
    );
    assert!(
        grown < 40 * MIB as u64,
        "{name}: RSS grew by {} MiB",
        grown >> 20
    );
}

/// A backend that reads one request body of any size without keeping it, hashing it, and
/// answers with a two-token stream.
struct SinkBackend {
    addr: SocketAddr,
    received: Digest256,
}

impl SinkBackend {
    async fn start() -> SinkBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(None));
        let publish = received.clone();
        tokio::spawn(async move {
            let mut chunk = vec![0u8; 64 << 10];
            // The first connection that sends a request head (readiness probes connect
            // and close without one).
            let (mut stream, buf, head_end) = 'accept: loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = Vec::new();
                loop {
                    if let Some(i) = find(&buf, b"\r\n\r\n") {
                        break 'accept (stream, buf, i + 4);
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => continue 'accept,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let length: u64 = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("tokentap forwards the Content-Length");
            let mut hash = Sha256::new();
            hash.update(&buf[head_end..]);
            let mut total = (buf.len() - head_end) as u64;
            drop(buf);
            while total < length {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        hash.update(&chunk[..n]);
                        total += n as u64;
                    }
                }
            }
            *publish.lock().unwrap() = Some((hash.finalize().to_vec(), total));
            let body = format!("{}{}data: [DONE]\n\n", sse_event("a"), sse_event("b"));
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
        SinkBackend { addr, received }
    }
}

/// A 100 MiB request body, with the top-level `model` at its very end (after decoys inside
/// the prompt): forwarded intact (same SHA-256 and length at the backend), labelled with
/// the right model (the request scanner streams, it does not buffer), and memory bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_request_body_is_forwarded_intact_and_labelled() {
    let _memory = MEMORY.write().await;
    let backend = SinkBackend::start().await;
    let proxy = Proxy::start(&format!("http://{}", backend.addr), "").await;
    let prefix = br#"{"stream":true,"messages":[{"role":"user","content":""#;
    let suffix = br#""}],"model":"late-model"}"#;
    // 64 KiB filler blocks: mostly letters, with a decoy `"model":"decoy"` (escaped, so
    // inside the string) at the start of each block.
    let mut block = br#"\"model\":\"decoy\", {\"model\":[\"x\"]} "#.to_vec();
    while block.len() < 64 << 10 {
        block.push(b'a' + (block.len() % 26) as u8);
    }
    let blocks = 100 * MIB / block.len();
    let length = prefix.len() + blocks * block.len() + suffix.len();

    let baseline = rss();
    let watch = RssWatch::start();
    let started = Instant::now();
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tenant-ID: big\r\nConnection: close\r\nContent-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut hash = Sha256::new();
    hash.update(prefix);
    stream.write_all(prefix).await.unwrap();
    for _ in 0..blocks {
        hash.update(&block);
        stream.write_all(&block).await.unwrap();
    }
    hash.update(suffix);
    stream.write_all(suffix).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut response))
        .await
        .expect("response within 60 s")
        .unwrap();
    let elapsed = started.elapsed();
    let peak = watch.peak();
    assert!(response.starts_with(b"HTTP/1.1 200 OK"), "{response:?}");
    let (got_hash, got_length) = backend.received.lock().unwrap().clone().expect("received");
    assert_eq!(got_length, length as u64);
    assert_eq!(
        got_hash,
        hash.finalize().to_vec(),
        "request body bytes differ"
    );

    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[
                ("model", "late-model"),
                ("tenant", "big"),
                ("outcome", "completed")
            ]
        ),
        1.0,
        "{}",
        m.text
    );
    assert!(!m.text.contains("decoy"));
    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "100 MiB request body forwarded in {elapsed:?}; RSS {} MiB -> peak {} MiB",
        baseline >> 20,
        peak >> 20
    );
    assert!(grown < 40 * MIB as u64, "RSS grew by {} MiB", grown >> 20);
}

/// `model` after 1.5 MiB of prompt, with decoys both inside strings and as keys of nested
/// objects, through the proxy to the simulator: the request is labelled with the
/// top-level model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_after_a_mebibyte_of_prompt_is_labelled() {
    let _memory = MEMORY.read().await;
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("the-real-model", ms(1), ms(1), 3)],
        usage: UsageMode::Never,
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let prompt = "say \"model\": \"decoy-in-string\" ".repeat(3 * MIB / 64);
    let body = serde_json::json!({
        "messages": [
            {"role": "user", "content": prompt, "model": "decoy-nested"},
            {"role": "user", "content": "again", "metadata": {"model": "decoy-deeper"}},
        ],
        "stream": true,
        "model": "the-real-model",
    })
    .to_string();
    let at = body.find("\"model\":\"the-real-model\"").unwrap();
    assert!(at > MIB, "the model comes after {at} bytes");
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .header("x-tenant-id", "t")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await;
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("model", "the-real-model")]),
        1.0,
        "{}",
        m.text
    );
    assert!(!m.text.contains("decoy"));
}

// ---------------------------------------------------------------------------------------
// Connection-level abuse.
// ---------------------------------------------------------------------------------------

/// Whether a raw exchange was refused: a 431 (or 400) answer, or the connection closed
/// without any answer.
fn refused(raw: &[u8]) -> bool {
    raw.is_empty() || raw.starts_with(b"HTTP/1.1 431") || raw.starts_with(b"HTTP/1.1 400")
}

/// Too many headers, one oversized header, and a head over `limits.max_header_bytes` made
/// of many small headers: each is refused (431 or closed) before anything reaches the
/// upstream, and requests within the limits keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_floods_are_refused_by_the_configured_limits() {
    let _memory = MEMORY.read().await;
    let backend = ScriptedBackend::start(vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".to_vec(),
    )])
    .await;
    let proxy = Proxy::start(
        &backend.url(),
        "limits:\n  max_headers: 20\n  max_header_bytes: 8KiB\n",
    )
    .await;
    let request = |headers: &str| {
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n")
            .into_bytes()
    };
    let many = |count: usize, value_len: usize| -> String {
        (0..count)
            .map(|i| format!("X-Flood-{i}: {}\r\n", "v".repeat(value_len)))
            .collect()
    };

    let fine = raw_exchange(proxy.addr, &request(&many(15, 10))).await;
    assert!(fine.starts_with(b"HTTP/1.1 200"), "{fine:?}");
    assert_eq!(backend.requests.lock().unwrap().len(), 1);

    for (name, headers) in [
        ("too many headers", many(40, 10)),
        ("one 16 KiB header", many(1, 16 << 10)),
        ("a 64 KiB head of small headers", many(2000, 24)),
        ("a 1 MiB head", many(1, MIB)),
    ] {
        let raw = raw_exchange(proxy.addr, &request(&headers)).await;
        assert!(
            refused(&raw),
            "{name}: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(200)])
        );
    }
    assert_eq!(
        backend.requests.lock().unwrap().len(),
        1,
        "nothing refused reached the upstream"
    );
    let after = raw_exchange(proxy.addr, &request(&many(3, 10))).await;
    assert!(after.starts_with(b"HTTP/1.1 200"), "{after:?}");
}

/// Read from `stream` until it is closed (EOF or error) or `within` passes; returns what
/// was read and whether it closed.
/// Whether an h2 server's bytes include a GOAWAY for the client's protocol error
/// (`PROTOCOL_ERROR`, `FRAME_SIZE_ERROR`, `COMPRESSION_ERROR`).
fn closed_for_a_protocol_error(mut answer: &[u8]) -> bool {
    while answer.len() >= 9 {
        let len =
            usize::from(answer[0]) << 16 | usize::from(answer[1]) << 8 | usize::from(answer[2]);
        let Some(payload) = answer.get(9..9 + len) else {
            return false;
        };
        if answer[3] == 0x7 && payload.len() >= 8 {
            let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
            return [0x1, 0x6, 0x9].contains(&code);
        }
        answer = &answer[9 + len..];
    }
    false
}

async fn until_closed(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// A slowloris client trickles its request head one byte every 50 ms: the connection is
/// closed once `limits.header_read_timeout` (here 500 ms) has passed, not held for as long
/// as the client keeps trickling. Other clients are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_cut_off_by_the_header_read_timeout() {
    let _memory = MEMORY.read().await;
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(1), ms(1), 3)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "limits:\n  header_read_timeout: 500ms\n").await;

    let mut slow = TcpStream::connect(proxy.addr).await.unwrap();
    let started = Instant::now();
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n".to_vec();
    let trickle = tokio::spawn(async move {
        slow.write_all(&head).await.unwrap();
        // An endless header, one byte at a time.
        for byte in b"X-Slow: ".iter().chain(b"a".repeat(10_000).iter()) {
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(ms(50)).await;
            // Stop writing once closed; the read side tells.
            let mut probe = [0u8; 256];
            match tokio::time::timeout(ms(1), slow.read(&mut probe)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return (started.elapsed(), true),
                Ok(Ok(_)) => return (started.elapsed(), true), // a 408 answer, then close
                Err(_) => {}
            }
            if started.elapsed() > Duration::from_secs(10) {
                return (started.elapsed(), false);
            }
        }
        (started.elapsed(), true)
    });
    // Meanwhile an ordinary client is served.
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await;
    let (took, closed) = trickle.await.unwrap();
    assert!(
        closed,
        "the slowloris connection was still open after {took:?}"
    );
    eprintln!("slowloris connection closed after {took:?}");
    assert!(
        took >= ms(450) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
}

/// A client that connects and never sends a byte, or sends the first bytes of the h2c
/// preface and stops, is closed once `limits.header_read_timeout` has passed, so silent
/// connections cannot pin descriptors (and in-flight slots of the accept loop) forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_by_the_header_read_timeout() {
    let _memory = MEMORY.read().await;
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(1), ms(1), 3)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "limits:\n  header_read_timeout: 500ms\n").await;
    for (name, sent) in [
        ("nothing", &b""[..]),
        ("part of the h2 preface", &b"PRI * HTTP/2.0\r\n"[..]),
    ] {
        let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
        silent.write_all(sent).await.unwrap();
        let started = Instant::now();
        let (_, closed) = until_closed(&mut silent, Duration::from_secs(5)).await;
        let took = started.elapsed();
        eprintln!("a client that sent {name}: closed {closed} after {took:?}");
        assert!(closed, "a client that sent {name} was kept {took:?}");
        assert!(
            took < Duration::from_secs(3),
            "{name}: closed after {took:?}"
        );
    }
}

/// A keep-alive connection that goes silent after a request is closed once
/// `limits.header_read_timeout` passes without the next request head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed_by_the_header_read_timeout() {
    let _memory = MEMORY.read().await;
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(1), ms(1), 3)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "limits:\n  header_read_timeout: 500ms\n").await;
    let mut idle = TcpStream::connect(proxy.addr).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let started = Instant::now();
    let (_, closed) = until_closed(&mut idle, Duration::from_secs(5)).await;
    let took = started.elapsed();
    eprintln!("idle keep-alive connection closed: {closed} after {took:?}");
    assert!(closed, "an idle keep-alive connection was kept {took:?}");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
}

/// The connection preface of an HTTP/2 client.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame: its 9-byte header, then `payload`.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// 4 KiB of bytes that mean nothing, the same each run.
fn h2_noise() -> Vec<u8> {
    (0u32..4096)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// What an HTTP/2 client sends that no server can read, by name.
fn h2_garbage(noise: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let settings = h2_frame(4, 0, 0, &[]);
    vec![
        ("preface then noise", [H2_PREFACE, noise].concat()),
        (
            "garbage HPACK",
            [
                H2_PREFACE,
                &settings,
                &h2_frame(1, 0x4 | 0x1, 1, &[0xff, 0xff, 0xff, 0xff, 0x7f, 0x00, 0x13]),
            ]
            .concat(),
        ),
        (
            "DATA on an idle stream",
            [H2_PREFACE, &settings, &h2_frame(0, 0x1, 7, b"hello")].concat(),
        ),
        (
            "a 16 MiB frame",
            [
                H2_PREFACE,
                &settings,
                &[0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1],
                &noise[..64],
            ]
            .concat(),
        ),
        ("HTTP/1 noise", noise.to_vec()),
        (
            "half a preface",
            [&H2_PREFACE[..10], &noise[..100]].concat(),
        ),
    ]
}

/// HTTP/2 clients sending garbage: after the preface, random bytes; a SETTINGS frame
/// followed by a HEADERS frame whose HPACK block is garbage; DATA on a stream that was
/// never opened; a frame header announcing 16 MiB; and a plain HTTP/1 connection that
/// sends binary noise. Each connection is closed (a GOAWAY or 400 first is fine), and the
/// proxy serves normally afterwards. What tokentap could not read is counted once per
/// connection as the client's error (`tokentap_400`): the HTTP/1 heads it answered `400`,
/// and the h2 connections it closed with a GOAWAY for a protocol error
/// (`PROTOCOL_ERROR`, `COMPRESSION_ERROR`, `FRAME_SIZE_ERROR`); nothing else is a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_garbage_closes_the_connection_and_nothing_else() {
    let _memory = MEMORY.read().await;
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(1), ms(1), 3)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let noise = h2_noise();
    let mut refused = 0;
    for (name, bytes) in h2_garbage(&noise) {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        // The server may close before all of it is written.
        let _ = stream.write_all(&bytes).await;
        let (answer, closed) = until_closed(&mut stream, Duration::from_secs(5)).await;
        assert!(closed, "{name}: the connection stayed open");
        assert!(
            !answer.starts_with(b"HTTP/1.1 2"),
            "{name}: {:?}",
            String::from_utf8_lossy(&answer)
        );
        if bytes.starts_with(H2_PREFACE) && closed_for_a_protocol_error(&answer) {
            refused += 1;
        }
    }
    // The HPACK block no table can decode is the case of an unreadable head.
    assert!(
        refused >= 1,
        "no h2 connection was closed for a protocol error"
    );
    // Many at once, interleaved with real traffic.
    let mut attackers = Vec::new();
    for i in 0..50usize {
        let addr = proxy.addr;
        let bytes = [H2_PREFACE, &noise[i..i + 512]].concat();
        attackers.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let _ = stream.write_all(&bytes).await;
            let (answer, closed) = until_closed(&mut stream, Duration::from_secs(5)).await;
            (closed, closed_for_a_protocol_error(&answer))
        }));
    }
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(body_text(response).await.ends_with("data: [DONE]\n\n"));
    for attacker in attackers {
        let (closed, protocol_error) = attacker.await.unwrap();
        assert!(closed, "an attacker's connection stayed open");
        refused += usize::from(protocol_error);
    }
    let refused = refused as f64;
    // The real request, the two HTTP/1 heads tokentap could not read (answered 400), and
    // the h2 connections closed for a protocol error, each counted as the client's error.
    let m = proxy
        .wait_metrics("the refusals counted", |m| {
            m.sum("tokentap_requests_total", &[]) >= 3.0 + refused
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[]),
        3.0 + refused,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[("model", "m"), ("outcome", "completed")]
        ),
        1.0
    );
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[("outcome", "client_error"), ("status", "tokentap_400")]
        ),
        2.0 + refused,
        "{}",
        m.text
    );
    assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 0.0);
}

/// An h2c request whose header list is over `limits.max_header_bytes` is refused (431 or
/// a reset stream) without reaching the upstream; the connection and proxy stay usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_oversized_header_list_is_refused() {
    let _memory = MEMORY.read().await;
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(1), ms(1), 3)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "limits:\n  max_header_bytes: 16KiB\n").await;
    let h2: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let mut request = chat(&proxy.url(CHAT), "m", "t", true, false);
    request
        .headers_mut()
        .insert("x-big", "b".repeat(64 << 10).parse().unwrap());
    match h2.request(request).await {
        Ok(response) => assert_eq!(
            response.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        ),
        Err(err) => eprintln!("oversized h2 header list refused: {err}"),
    }
    assert_eq!(sim.open_streams(), 0);
    let response = h2
        .request(chat(&proxy.url(CHAT), "m", "t", true, false))
        .await
        .expect("a normal h2 request afterwards");
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await;
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0);
}
