//! Engine gRPC streams through tokentap: an h2c client, tokentap, and an h2c upstream
//! (`upstream.http2: true`) that is a scripted gRPC backend answering SGLang's
//! `Generate` with messages built from the engine's own types at known times, then its
//! trailers. gRPC is h2 only, so these cases have no HTTP/1.1 path.
//!
//! What passes must be what a direct connection gives (bytes, trailers, `grpc-timeout`,
//! a client's `RST_STREAM`), and what is counted must follow the token ids and the
//! `grpc-status` mapping (`outcome::verdict::grpc_status_verdict`).

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::Proxy;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use prost::Message;
use tokentap::wire::grpc::framing::frame;
use tokentap::wire::grpc::proto::sglang::grpc::scheduler as sglang;
use tokio::net::{TcpListener, TcpStream};

const GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
const HEALTH: &str = "/grpc.health.v1.Health/Check";
const MODEL_INFO: &str = "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo";

/// The model the backend's `GetModelInfo` names.
const SERVED_MODEL: &str = "llama-3.1-8b-instruct";

/// The gap between two messages of the backend's stream.
const GAP: Duration = Duration::from_millis(60);

/// The token ids of the backend's chunks: 3, then 2, then 5 (10 in all).
const CHUNKS: [&[u32]; 3] = [
    &[791, 4320, 315],
    &[5780, 374],
    &[264, 1296, 13, 578, 128009],
];

/// What the backend saw of one call.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HeaderMap,
    /// The call was reset by its client (tokentap, or the test) before it ended.
    reset: bool,
}

/// A scripted h2c gRPC backend. Each `Generate` call says what to do in its test-only
/// `x-script-status` header (forwarded as any other header): `0` the whole stream then
/// `grpc-status: 0`; `trailers-only:N` a trailers-only answer with `grpc-status: N`;
/// `hold` one chunk, then wait for the client's reset; any other `N` one chunk then
/// `grpc-status: N`. A health check gets one empty message and `grpc-status: 0`.
struct Backend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Backend {
    async fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        tokio::spawn(answer(request, respond, log.clone()));
                    }
                });
            }
        });
        Backend { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn message(response: sglang::generate_response::Response) -> Bytes {
    frame(
        &sglang::GenerateResponse {
            request_id: "r1".into(),
            response: Some(response),
        }
        .encode_to_vec(),
    )
    .into()
}

fn chunk(ids: &[u32], completion: u32) -> Bytes {
    message(sglang::generate_response::Response::Chunk(
        sglang::GenerateStreamChunk {
            token_ids: ids.to_vec(),
            prompt_tokens: 12,
            completion_tokens: completion,
            ..Default::default()
        },
    ))
}

fn complete() -> Bytes {
    message(sglang::generate_response::Response::Complete(
        sglang::GenerateComplete {
            output_ids: CHUNKS.concat(),
            finish_reason: "stop".into(),
            prompt_tokens: 12,
            completion_tokens: 10,
            ..Default::default()
        },
    ))
}

fn grpc_head(status: Option<&str>) -> Response<()> {
    let mut response = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/grpc");
    if let Some(status) = status {
        response = response.header("grpc-status", status);
    }
    response.body(()).unwrap()
}

fn trailers(status: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_str(status).unwrap());
    if status != "0" {
        trailers.insert(
            "grpc-message",
            HeaderValue::from_static("scripted%20failure"),
        );
    }
    trailers
}

async fn answer(
    request: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    log: Arc<Mutex<Vec<Seen>>>,
) {
    let (parts, mut body) = request.into_parts();
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
    }
    let script = parts
        .headers
        .get("x-script-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("0")
        .to_string();
    let index = {
        let mut log = log.lock().unwrap();
        log.push(Seen {
            path: parts.uri.path().to_string(),
            headers: parts.headers.clone(),
            reset: false,
        });
        log.len() - 1
    };
    let mark_reset = || log.lock().unwrap()[index].reset = true;
    if parts.uri.path() == MODEL_INFO {
        let Ok(mut send) = respond.send_response(grpc_head(None), false) else {
            return;
        };
        let info = sglang::GetModelInfoResponse {
            model_path: "/models/llama".into(),
            served_model_name: SERVED_MODEL.into(),
            ..Default::default()
        };
        let _ = send.send_data(frame(&info.encode_to_vec()).into(), false);
        let _ = send.send_trailers(trailers("0"));
        return;
    }
    if parts.uri.path() == HEALTH {
        let Ok(mut send) = respond.send_response(grpc_head(None), false) else {
            return;
        };
        let _ = send.send_data(frame(&[]).into(), false);
        let _ = send.send_trailers(trailers("0"));
        return;
    }
    if let Some(status) = script.strip_prefix("trailers-only:") {
        let _ = respond.send_response(grpc_head(Some(status)), true);
        return;
    }
    let Ok(mut send) = respond.send_response(grpc_head(None), false) else {
        return;
    };
    let mut sent = 0;
    for (i, ids) in CHUNKS.iter().enumerate() {
        tokio::time::sleep(GAP).await;
        sent += ids.len() as u32;
        if send.send_data(chunk(ids, sent), false).is_err() {
            mark_reset();
            return;
        }
        if i == 0 && script != "0" {
            break;
        }
    }
    match script.as_str() {
        "0" => {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let _ = send.send_data(complete(), false);
            let _ = send.send_trailers(trailers("0"));
        }
        "hold" => {
            let reset = tokio::time::timeout(
                Duration::from_secs(10),
                std::future::poll_fn(|cx| send.poll_reset(cx)),
            )
            .await;
            if matches!(reset, Ok(Ok(_))) {
                mark_reset();
            }
        }
        status => {
            tokio::time::sleep(GAP).await;
            let _ = send.send_trailers(trailers(status));
        }
    }
}

/// What a client got of one call.
#[derive(Debug, PartialEq)]
struct Got {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    /// `grpc-status` of a trailers-only answer.
    head_grpc_status: Option<HeaderValue>,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
}

/// An h2c (prior knowledge) connection to `addr`.
async fn connect(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    client
}

fn generate_request(addr: SocketAddr, path: &str, script: &str) -> (Request<()>, Bytes) {
    let request = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "5S")
        .header("x-script-status", script)
        .body(())
        .unwrap();
    let body = sglang::GenerateRequest {
        request_id: "r1".into(),
        stream: true,
        ..Default::default()
    }
    .encode_to_vec();
    (request, frame(&body).into())
}

/// One whole call of `path` to `addr`.
async fn call(addr: SocketAddr, path: &str, script: &str) -> Got {
    let client = connect(addr).await;
    let mut client = client.ready().await.unwrap();
    let (request, body) = generate_request(addr, path, script);
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(body, true).unwrap();
    let response = response.await.expect("response head");
    let (parts, mut body) = response.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body intact");
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.expect("trailers intact");
    Got {
        status: parts.status,
        content_type: parts.headers.get("content-type").cloned(),
        head_grpc_status: parts.headers.get("grpc-status").cloned(),
        data,
        trailers,
    }
}

async fn proxy_for(backend: &Backend) -> Proxy {
    Proxy::start(&backend.url(), "upstream:\n  http2: true\n").await
}

/// Bytes and trailers through tokentap are those of a direct call; `grpc-timeout` reaches
/// the engine; and the stream is measured from its token ids: 10 tokens, TTFT one gap,
/// ITL `GAP / 2` for the 2 tokens of the second chunk and `GAP / 5` for the 5 of the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generate_stream_passes_unchanged_and_is_measured_from_its_token_ids() {
    let backend = Backend::start().await;
    let proxy = proxy_for(&backend).await;
    let direct = call(backend.addr, GENERATE, "0").await;
    let proxied = call(proxy.addr, GENERATE, "0").await;
    assert_eq!(direct.status, StatusCode::OK);
    assert!(direct.trailers.is_some(), "{direct:?}");
    assert_eq!(
        direct.data,
        [
            chunk(CHUNKS[0], 3),
            chunk(CHUNKS[1], 5),
            chunk(CHUNKS[2], 10),
            complete()
        ]
        .concat()
    );
    assert_eq!(proxied, direct, "byte-identical to a direct call");
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    for call in &seen {
        assert_eq!(call.path, GENERATE);
        assert_eq!(call.headers.get("grpc-timeout").unwrap(), "5S");
        assert_eq!(call.headers.get("te").unwrap(), "trailers");
    }

    let m = proxy
        .wait_metrics("the call", |m| m.sum("tokentap_requests_total", &[]) >= 1.0)
        .await;
    let counted = [
        ("outcome", "completed"),
        ("status", "2xx"),
        ("model", "unknown"),
    ];
    assert_eq!(
        m.sum("tokentap_requests_total", &counted),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 10.0);
    assert_eq!(
        m.sum("tokentap_event_tokens_total", &[("accuracy", "exact")]),
        10.0
    );
    let gap = GAP.as_secs_f64();
    // Measured against the engine's known times: the first chunk one gap after the
    // request, each next one a gap after the previous; a loaded machine only adds.
    let ttft = m.sum("tokentap_time_to_first_token_seconds_sum", &[]);
    assert_eq!(
        m.sum("tokentap_time_to_first_token_seconds_count", &[]),
        1.0
    );
    assert!(ttft >= gap && ttft < gap + 0.25, "ttft {ttft}");
    assert_eq!(
        m.sum("tokentap_inter_token_latency_seconds_count", &[]),
        7.0,
        "one per token after the first chunk's"
    );
    let itl = m.sum("tokentap_inter_token_latency_seconds_sum", &[]);
    eprintln!("gap {gap:.3}s: ttft {ttft:.4}s, itl sum {itl:.4}s over 7 tokens");
    // 2 x GAP/2 + 5 x GAP/5 = 2 gaps, give or take the machine's scheduling.
    assert!(itl > 1.5 * gap && itl < 2.0 * gap + 0.25, "itl sum {itl}");
}

/// `tokentap_requests_total{outcome,status}` of calls that end with each `grpc-status`,
/// in the trailers or (for 3) in a trailers-only head: what reaches the client is
/// unchanged either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_statuses_are_counted_by_the_mapping() {
    let backend = Backend::start().await;
    let proxy = proxy_for(&backend).await;
    let cases = [
        ("0", "completed", "2xx"),
        ("8", "upstream_refused", "429"),
        ("14", "upstream_error", "503"),
        ("trailers-only:3", "upstream_refused", "4xx"),
        ("13", "upstream_error", "5xx"),
        ("4", "timeout", "5xx"),
    ];
    for (n, (script, outcome, status)) in cases.iter().enumerate() {
        let direct = call(backend.addr, GENERATE, script).await;
        let proxied = call(proxy.addr, GENERATE, script).await;
        assert_eq!(proxied, direct, "{script}");
        if let Some(code) = script.strip_prefix("trailers-only:") {
            assert_eq!(proxied.head_grpc_status.as_ref().unwrap(), code);
            assert!(proxied.data.is_empty() && proxied.trailers.is_none());
        } else {
            let trailers = proxied.trailers.as_ref().expect("trailers");
            assert_eq!(trailers.get("grpc-status").unwrap(), *script);
        }
        let m = proxy
            .wait_metrics(script, |m| {
                m.sum("tokentap_requests_total", &[]) >= (n + 1) as f64
            })
            .await;
        let labels = [("outcome", *outcome), ("status", *status)];
        assert_eq!(
            m.sum("tokentap_requests_total", &labels),
            1.0,
            "grpc-status {script}: {}",
            m.text
        );
    }
    let m = proxy.metrics().await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), cases.len() as f64);
}

/// A client's `RST_STREAM` mid-stream reaches the engine as a reset of its stream, and the
/// call is counted `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_reaches_the_engine_and_is_cancelled() {
    let backend = Backend::start().await;
    let proxy = proxy_for(&backend).await;
    let client = connect(proxy.addr).await;
    let mut client = client.ready().await.unwrap();
    let (request, body) = generate_request(proxy.addr, GENERATE, "hold");
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(body, true).unwrap();
    let response = response.await.expect("response head");
    let mut body = response.into_body();
    let first = body.data().await.expect("a chunk").expect("intact");
    assert_eq!(first, chunk(CHUNKS[0], 3));
    send.send_reset(h2::Reason::CANCEL);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !backend.seen().first().is_some_and(|call| call.reset) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the engine never saw its stream reset"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let m = proxy
        .wait_metrics("the cancelled call", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    let cancelled = [("outcome", "cancelled"), ("status", "2xx")];
    assert_eq!(
        m.sum("tokentap_requests_total", &cancelled),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 3.0);
}

/// Any other gRPC method passes through unmeasured: a health check is passthrough, with
/// its bytes and trailers unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_is_passthrough() {
    let backend = Backend::start().await;
    let proxy = proxy_for(&backend).await;
    let direct = call(backend.addr, HEALTH, "0").await;
    let proxied = call(proxy.addr, HEALTH, "0").await;
    assert_eq!(proxied, direct);
    assert_eq!(proxied.data, frame(&[]));
    let m = proxy
        .wait_metrics("the passthrough", |m| {
            m.sum("tokentap_passthrough_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_passthrough_requests_total", &[]), 1.0);
    assert_eq!(m.sum("tokentap_requests_total", &[]), 0.0);
}

/// SGLang's requests name no model: until the engine's `GetModelInfo` has passed through
/// (as passthrough, unchanged), its calls are `unknown`; after, they carry the model it
/// named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_an_engine_names_in_get_model_info_labels_its_calls() {
    let backend = Backend::start().await;
    let proxy = proxy_for(&backend).await;
    call(proxy.addr, GENERATE, "0").await;
    let direct = call(backend.addr, MODEL_INFO, "0").await;
    let proxied = call(proxy.addr, MODEL_INFO, "0").await;
    assert_eq!(proxied, direct);
    call(proxy.addr, GENERATE, "0").await;
    let m = proxy
        .wait_metrics("both calls", |m| {
            m.sum("tokentap_requests_total", &[]) >= 2.0
        })
        .await;
    assert_eq!(m.sum("tokentap_passthrough_requests_total", &[]), 1.0);
    for model in ["unknown", SERVED_MODEL] {
        assert_eq!(
            m.sum("tokentap_requests_total", &[("model", model)]),
            1.0,
            "{model}: {}",
            m.text
        );
        assert_eq!(
            m.sum("tokentap_output_tokens_total", &[("model", model)]),
            10.0
        );
    }
}
