//! gRPC's transport guarantees through tokentap, against the simulator's engine services:
//! an `https://` upstream negotiates h2 by ALPN and carries server-streaming and
//! bidirectional calls measured as over h2c, and with `upstream.http2` must choose h2; a
//! client's reset or departure frees the engine's stream at once and is counted once,
//! `cancelled`; tokentap's own timeouts leave a long call alone while it streams; and what
//! tokentap answers itself to a gRPC call is a gRPC status a gRPC client can read, not an
//! HTTP error page.
//!
//! The TLS upstream is a terminator in this file (rustls, the ALPN protocols it is given)
//! that pipes the decrypted bytes to the simulator: it notes which protocol each
//! connection negotiated, so a test sees h2 was chosen rather than inferring it.

use crate::common::{Proxy, SimHandle};
use crate::sim_grpc::{sglang_request, triton_request};
use crate::tls::TestCert;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokentap::wire::grpc::framing::{MessageEncoding, MessageReader};
use tokentap_sim::{ModelProfile, SimConfig, TokensPerEvent};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
const STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

const TTFT: Duration = Duration::from_millis(150);
const ITL: Duration = Duration::from_millis(20);
const TOKENS: u32 = 12;
const PER_EVENT: u32 = 3;

/// `grpc-model` streams 12 tokens, 3 a message, from 150 ms at 20 ms a token; `endless`
/// streams for minutes (the calls a client abandons); `long` one token per 100 ms for 1.5 s
/// (longer than every tokentap timeout the long-call test sets).
fn sim_config() -> SimConfig {
    let mut profile = ModelProfile::new("grpc-model", TTFT, ITL, TOKENS);
    profile.tokens_per_event = TokensPerEvent::range(PER_EVENT, PER_EVENT).unwrap();
    SimConfig {
        models: vec![
            profile,
            ModelProfile::new("endless", Duration::from_millis(20), ITL, 10_000),
            ModelProfile::new(
                "long",
                Duration::from_millis(50),
                Duration::from_millis(100),
                15,
            ),
        ],
        ..SimConfig::default()
    }
}

/// A TLS server offering `protocols` by ALPN, piping each connection's bytes to `backend`.
struct TlsFront {
    addr: SocketAddr,
    /// The protocol each accepted connection negotiated (`None`: no ALPN).
    negotiated: Arc<Mutex<Vec<Option<Vec<u8>>>>>,
}

impl TlsFront {
    async fn start(cert: &TestCert, protocols: &[&[u8]], backend: SocketAddr) -> TlsFront {
        let key =
            rustls::pki_types::PrivatePkcs8KeyDer::from(cert.certified.key_pair.serialize_der());
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.certified.cert.der().clone()], key.into())
        .unwrap();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let negotiated = Arc::new(Mutex::new(Vec::new()));
        let log = negotiated.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, log) = (acceptor.clone(), log.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                    log.lock().unwrap().push(alpn);
                    let Ok(mut plain) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront { addr, negotiated }
    }

    fn negotiated(&self) -> Vec<Option<Vec<u8>>> {
        self.negotiated.lock().unwrap().clone()
    }
}

type CallBody = UnsyncBoxBody<Bytes, Infallible>;

/// An h2c (prior knowledge) connection to `addr`.
async fn h2c(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<CallBody> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    send
}

fn grpc_request(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: CallBody,
) -> Request<CallBody> {
    let mut request = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body).unwrap()
}

/// A call whose request stream stays open until the test closes it: the first message
/// goes with the head, the rest through the returned sender.
async fn open_call(
    send: &mut hyper::client::conn::http2::SendRequest<CallBody>,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    first: Vec<u8>,
) -> (Response<Incoming>, mpsc::UnboundedSender<Bytes>) {
    let (requests, rx) = mpsc::unbounded_channel::<Bytes>();
    requests.send(Bytes::from(first)).unwrap();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(http_body::Frame::data(b)), rx))
    });
    let body = StreamBody::new(stream).boxed_unsync();
    let response = send
        .send_request(grpc_request(addr, path, headers, body))
        .await
        .unwrap();
    (response, requests)
}

/// What a client read of one call.
#[derive(Debug)]
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    messages: Vec<Vec<u8>>,
    trailers: Option<HeaderMap>,
}

impl Got {
    fn grpc_status(&self) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .map(|v| v.to_str().unwrap())
    }
}

/// Read a call to its end; `on_message` sees each message as it comes (with the count
/// read so far) and may close the request stream by taking `requests`.
async fn read_call(
    response: Response<Incoming>,
    mut requests: Option<mpsc::UnboundedSender<Bytes>>,
    mut on_message: impl FnMut(usize, &[u8], &mut Option<mpsc::UnboundedSender<Bytes>>),
) -> Got {
    let (head, mut body) = response.into_parts();
    let mut reader = MessageReader::new(1 << 20, MessageEncoding::Identity);
    let mut messages = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the call's body arrives intact");
        match frame.into_data() {
            Ok(data) => {
                let mut got = Vec::new();
                reader.feed(&data, &mut |m| got.push(m.to_vec())).unwrap();
                for message in got {
                    messages.push(message);
                    on_message(messages.len(), messages.last().unwrap(), &mut requests);
                }
            }
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    Got {
        status: head.status,
        headers: head.headers,
        messages,
        trailers,
    }
}

/// A unary-request call (SGLang's server-streaming `Generate`), read whole.
async fn server_streaming(addr: SocketAddr, path: &str, body: Vec<u8>) -> Got {
    let mut send = h2c(addr).await;
    let body = Full::new(Bytes::from(body)).boxed_unsync();
    let response = send
        .send_request(grpc_request(addr, path, &[("grpc-timeout", "10S")], body))
        .await
        .unwrap();
    read_call(response, None, |_, _, _| {}).await
}

/// A `ModelStreamInfer` call that keeps its request stream open until the final (empty)
/// response of its one request, `1 + tokens / per message` messages in, then closes it.
async fn bidirectional(addr: SocketAddr, model: &str, responses: usize) -> Got {
    let mut send = h2c(addr).await;
    let (response, requests) = open_call(
        &mut send,
        addr,
        STREAM_INFER,
        &[("grpc-timeout", "10S")],
        triton_request("a", model),
    )
    .await;
    read_call(response, Some(requests), |n, _, requests| {
        if n == responses {
            requests.take();
        }
    })
    .await
}

async fn wait_until(what: &str, within: Duration, condition: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < within, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    started.elapsed()
}

/// An `https://` upstream negotiates h2 by ALPN (offered h2 and HTTP/1.1, the server
/// picks h2) and carries a server-streaming and a bidirectional call: the messages and
/// `grpc-status` are a direct call's, and the calls are measured from their token ids with
/// the simulator's timing, as over h2c.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_an_https_upstream_negotiates_h2_and_is_measured() {
    let cert = TestCert::new("grpc-tls");
    let sim = SimHandle::start(sim_config()).await;
    let front = TlsFront::start(&cert, &[b"h2", b"http/1.1"], sim.addr).await;
    let proxy = Proxy::start(
        &format!("https://localhost:{}", front.addr.port()),
        &format!("upstream:\n  ca_file: {}\n", cert.cert_file.display()),
    )
    .await;

    let direct = server_streaming(sim.addr, GENERATE, sglang_request()).await;
    let proxied = server_streaming(proxy.addr, GENERATE, sglang_request()).await;
    assert_eq!(direct.grpc_status(), Some("0"), "{direct:?}");
    assert_eq!(proxied.status, StatusCode::OK);
    assert_eq!(proxied.grpc_status(), Some("0"), "{proxied:?}");
    assert_eq!(proxied.messages, direct.messages);
    assert!(proxied.messages.len() as u32 > TOKENS / PER_EVENT);

    let responses = (TOKENS / PER_EVENT) as usize + 1;
    let direct = bidirectional(sim.addr, "grpc-model", responses).await;
    let proxied = bidirectional(proxy.addr, "grpc-model", responses).await;
    assert_eq!(direct.grpc_status(), Some("0"), "{direct:?}");
    assert_eq!(proxied.grpc_status(), Some("0"), "{proxied:?}");
    assert_eq!(proxied.messages, direct.messages);
    assert_eq!(proxied.messages.len(), responses);

    let negotiated = front.negotiated();
    assert!(!negotiated.is_empty());
    assert!(
        negotiated
            .iter()
            .all(|p| p.as_deref() == Some(b"h2".as_slice())),
        "every upstream connection negotiated h2: {negotiated:?}"
    );

    let m = proxy
        .wait_metrics("both calls", |m| {
            m.sum("tokentap_requests_total", &[]) >= 2.0
        })
        .await;
    let completed = [("outcome", "completed"), ("status", "2xx")];
    assert_eq!(
        m.sum("tokentap_requests_total", &completed),
        2.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum("tokentap_output_tokens_total", &[("model", "grpc-model")]),
        f64::from(TOKENS),
        "Triton's call names its model"
    );
    assert_eq!(
        m.sum("tokentap_output_tokens_total", &[]),
        f64::from(2 * TOKENS)
    );
    assert_eq!(
        m.sum("tokentap_event_tokens_total", &[("accuracy", "exact")]),
        f64::from(2 * TOKENS)
    );
    // Each call: the first message at TTFT, then 3 more, 3 ITLs apart, whose 9 tokens each
    // take a third of their gap.
    assert_eq!(
        m.sum("tokentap_time_to_first_token_seconds_count", &[]),
        2.0
    );
    let ttft = m.sum("tokentap_time_to_first_token_seconds_sum", &[]) / 2.0;
    assert!(
        ttft >= TTFT.as_secs_f64() && ttft < TTFT.as_secs_f64() + 0.2,
        "mean ttft {ttft}"
    );
    let after_first = 2 * (TOKENS - PER_EVENT);
    assert_eq!(
        m.sum("tokentap_inter_token_latency_seconds_count", &[]),
        f64::from(after_first)
    );
    let itl = m.sum("tokentap_inter_token_latency_seconds_sum", &[]);
    let expected = 2.0 * (ITL * (TOKENS - PER_EVENT)).as_secs_f64();
    eprintln!("over TLS h2: mean ttft {ttft:.4}s, itl sum {itl:.4}s (due {expected:.3}s)");
    assert!(
        itl > expected - 0.02 && itl < expected + 0.2,
        "itl sum {itl}, due {expected}"
    );
}

/// A client that resets its stream (`RST_STREAM CANCEL`, what dropping a call does) or
/// closes its connection mid-stream frees the engine's stream at once (within 500 ms, as
/// `exchange_policy::a_client_that_leaves_frees_the_upstream_at_once` allows), over h2c
/// and over TLS h2 alike, and the call is counted once, `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_frees_the_engine_stream_and_is_counted_once() {
    let cert = TestCert::new("grpc-cancel");
    let sim = SimHandle::start(sim_config()).await;
    let front = TlsFront::start(&cert, &[b"h2"], sim.addr).await;
    let h2c_proxy = Proxy::start(&sim.url(), "upstream:\n  http2: true\n").await;
    let tls_proxy = Proxy::start(
        &format!("https://localhost:{}", front.addr.port()),
        &format!("upstream:\n  ca_file: {}\n", cert.cert_file.display()),
    )
    .await;
    for (upstream, proxy) in [("h2c", &h2c_proxy), ("TLS h2", &tls_proxy)] {
        for (n, how) in ["reset", "connection closed"].into_iter().enumerate() {
            let mut send = h2c(proxy.addr).await;
            let (response, requests) = open_call(
                &mut send,
                proxy.addr,
                STREAM_INFER,
                &[("grpc-timeout", "60S")],
                triton_request("c", "endless"),
            )
            .await;
            let mut body = response.into_body();
            let first = body.frame().await.unwrap().unwrap();
            assert!(first.is_data());
            assert_eq!(
                sim.open_streams(),
                1,
                "{upstream}, {how}: the engine streams"
            );
            match how {
                // hyper's client resets a stream whose body is dropped unfinished.
                "reset" => drop((body, requests)),
                _ => drop((body, requests, send)),
            }
            let freed = wait_until(
                "the engine's stream closed",
                Duration::from_millis(500),
                || sim.open_streams() == 0,
            )
            .await;
            eprintln!(
                "{upstream}, {how}: the engine's stream closed {freed:?} after the client left"
            );
            let m = proxy
                .wait_metrics("the cancelled call", |m| {
                    m.sum("tokentap_requests_total", &[]) >= (n + 1) as f64
                })
                .await;
            let cancelled = [("outcome", "cancelled"), ("model", "endless")];
            assert_eq!(
                m.sum("tokentap_requests_total", &cancelled),
                (n + 1) as f64,
                "{upstream}, {how}: {}",
                m.text
            );
            assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 0.0);
        }
    }
    // Nothing more is recorded later for the same calls.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for proxy in [&h2c_proxy, &tls_proxy] {
        let m = proxy.metrics().await;
        assert_eq!(m.sum("tokentap_requests_total", &[]), 2.0, "{}", m.text);
    }
}

/// tokentap does not enforce `grpc-timeout` (the client and the engine do), and its own
/// timeouts leave a call alone while it streams: a bidirectional call whose client says
/// nothing more after its request for longer than `limits.request_body_timeout`, which
/// lasts longer than `upstream.response_head_timeout` and `upstream.idle_timeout`, with
/// tokens coming more often than the idle timeout, ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokentap_timeouts_leave_a_streaming_call_alone() {
    let sim = SimHandle::start(sim_config()).await;
    let proxy = Proxy::start(
        &sim.url(),
        "upstream:\n  http2: true\n  response_head_timeout: 300ms\n  idle_timeout: 400ms\n\
         limits:\n  request_body_timeout: 200ms\n",
    )
    .await;
    let started = Instant::now();
    let got = bidirectional(proxy.addr, "long", 16).await;
    let took = started.elapsed();
    assert_eq!(got.grpc_status(), Some("0"), "{got:?}");
    assert_eq!(got.messages.len(), 16, "15 tokens and the final response");
    assert!(took > Duration::from_millis(1400), "{took:?}");
    let m = proxy
        .wait_metrics("the call", |m| m.sum("tokentap_requests_total", &[]) >= 1.0)
        .await;
    let completed = [("outcome", "completed"), ("model", "long")];
    assert_eq!(
        m.sum("tokentap_requests_total", &completed),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 15.0);
}

/// An h2c backend that takes calls and never answers them.
async fn silent_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                let mut held = Vec::new();
                while let Some(Ok(call)) = conn.accept().await {
                    held.push(call);
                }
            });
        }
    });
    addr
}

/// gRPC's percent-decoding of `grpc-message`.
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&value[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// What tokentap answers itself to a gRPC call (no upstream, no response head in time,
/// too many in flight) is a trailers-only gRPC response: HTTP 200, `application/grpc`, the
/// `grpc-status` the failure stands for and tokentap's message in `grpc-message`, which a
/// gRPC client reads as that status rather than as an HTTP error it can only guess at.
/// The call is counted as tokentap's own answer, as over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokentaps_own_answers_to_a_grpc_call_are_grpc_statuses() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let silent = silent_backend().await;
    let unreachable = Proxy::start(&format!("http://{closed}"), "upstream:\n  http2: true\n").await;
    let slow = Proxy::start(
        &format!("http://{silent}"),
        "upstream:\n  http2: true\n  response_head_timeout: 1s\nlimits:\n  max_in_flight: 1\n",
    )
    .await;

    let mut held = h2c(slow.addr).await;
    let held_call = tokio::spawn({
        let addr = slow.addr;
        async move {
            let body = Full::new(Bytes::from(sglang_request())).boxed_unsync();
            held.send_request(grpc_request(addr, GENERATE, &[], body))
                .await
        }
    });
    // The held call is in flight when the in-flight gauge says so.
    slow.wait_metrics("the held call in flight", |m| {
        m.sum("tokentap_streams_in_flight", &[]) >= 1.0
    })
    .await;
    let overloaded = server_streaming(slow.addr, GENERATE, sglang_request()).await;
    let timed_out = held_call.await.unwrap().unwrap();
    let timed_out = read_call(timed_out, None, |_, _, _| {}).await;
    let refused = server_streaming(unreachable.addr, GENERATE, sglang_request()).await;

    for (got, code, says) in [
        (&overloaded, "14", "tokentap: too many requests in flight"),
        (&timed_out, "4", "tokentap: "),
        (&refused, "14", "tokentap: "),
    ] {
        assert_eq!(got.status, StatusCode::OK, "{got:?}");
        assert_eq!(got.headers["content-type"], "application/grpc", "{got:?}");
        assert_eq!(got.headers["grpc-status"], code, "{got:?}");
        let message = percent_decoded(got.headers["grpc-message"].to_str().unwrap());
        assert!(message.starts_with(says), "{message}");
        assert!(
            got.messages.is_empty() && got.trailers.is_none(),
            "trailers-only: {got:?}"
        );
    }
    let m = slow
        .wait_metrics("both calls", |m| {
            m.sum("tokentap_requests_total", &[]) >= 2.0
        })
        .await;
    for (outcome, status) in [("timeout", "tokentap_504"), ("overloaded", "tokentap_503")] {
        let labels = [("outcome", outcome), ("status", status)];
        assert_eq!(m.sum("tokentap_requests_total", &labels), 1.0, "{}", m.text);
    }
    let m = unreachable
        .wait_metrics("the call", |m| m.sum("tokentap_requests_total", &[]) >= 1.0)
        .await;
    let labels = [("outcome", "upstream_error"), ("status", "tokentap_502")];
    assert_eq!(m.sum("tokentap_requests_total", &labels), 1.0, "{}", m.text);
}

/// `upstream.http2: true` on an `https://` upstream offers only h2 by ALPN and refuses a
/// server that does not choose it: one that offers HTTP/1.1 alone fails the handshake, one
/// that negotiates nothing is refused by tokentap, and each call gets tokentap's own
/// `UNAVAILABLE` naming why, never a gRPC call sent over HTTP/1.1 (whose `grpc-status`, in
/// trailers an HTTP/1.1 response does not carry, would be lost). A server that chooses
/// h2 serves the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_with_http2_must_choose_h2() {
    let cert = TestCert::new("grpc-h2-only");
    let sim = SimHandle::start(sim_config()).await;
    let yaml = format!(
        "upstream:\n  http2: true\n  ca_file: {}\n",
        cert.cert_file.display()
    );
    let cases: [(&[&[u8]], Option<&str>); 3] = [
        (&[b"http/1.1"], Some("NoApplicationProtocol")),
        (
            &[],
            Some("did not negotiate h2 by ALPN (it chose no protocol)"),
        ),
        (&[b"http/1.1", b"h2"], None),
    ];
    for (protocols, refused) in cases {
        let front = TlsFront::start(&cert, protocols, sim.addr).await;
        let proxy = Proxy::start(&format!("https://localhost:{}", front.addr.port()), &yaml).await;
        let got = server_streaming(proxy.addr, GENERATE, sglang_request()).await;
        let negotiated = front.negotiated();
        match refused {
            Some(why) => {
                assert_eq!(got.headers["grpc-status"], "14", "{protocols:?}: {got:?}");
                let message = percent_decoded(got.headers["grpc-message"].to_str().unwrap());
                assert!(message.contains(why), "{protocols:?}: {message}");
                let m = proxy
                    .wait_metrics("the call", |m| m.sum("tokentap_requests_total", &[]) >= 1.0)
                    .await;
                let labels = [("outcome", "upstream_error"), ("status", "tokentap_502")];
                assert_eq!(m.sum("tokentap_requests_total", &labels), 1.0, "{}", m.text);
            }
            None => {
                assert_eq!(got.grpc_status(), Some("0"), "{got:?}");
                assert_eq!(negotiated, vec![Some(b"h2".to_vec())]);
            }
        }
    }
}
