//! tokentap's own work per streamed event and per request, counted in instructions (and
//! simulated cache misses) under valgrind's callgrind, for the budget that
//! `scripts/budget.sh` holds the build to (`benches/budget.toml`). A count does not depend
//! on what else the machine runs, so a change of a few instructions per event shows; a
//! time on a shared 2-core machine does not resolve 3%.
//!
//! Each case runs whole requests (admission, the request body's scan, the response head,
//! the events, the end: the record, the live list, the access log as configured by
//! default, a text line per request into a sink), once with 40 token events and once with
//! 240. `budget.sh` reads the count of each run and derives:
//! - per request (40 events): the run with 40 events;
//! - per event: (the run with 240 events - the run with 40) / 200, so the head and the
//!   end cancel and what is left is what one more token event costs, all of it.
//!
//! Each stream pauses once, for [`PACE`], before its second token-bearing event: the
//! burst detector (`observe/burst.rs`) then judges it a stream at its first gap, as it
//! judges a real engine's, and every later gap is observed live (ITL, inter-chunk gap).
//! Without the pause the events arrive microseconds apart, a buffered response to the
//! detector, unless the machine's load stretches a gap past its 1 ms: which path a
//! stream took, and with it the count, then moved with the load (seen: 200 instructions
//! per event between runs of the same code). The pause is a fixed cost per request (one
//! `nanosleep`), so it cancels out of the per-event figures.
//!
//! The transports' sans-IO parts are what runs here: the HTTP/1.1 relay's
//! `ResponseRelay` (one read per event, each event its own chunk, one clock read per
//! read, the idle clock), and the hyper path's `StreamingBody` (each event one frame,
//! polled on a current-thread runtime). Socket calls and hyper's own HTTP machinery are
//! not in these counts (`scripts/budget.sh --process` counts a whole process).
//!
//! Cases: `relay/{openai_chat,anthropic,responses}` and `hyper/{openai_chat,sglang_grpc}`
//! with the default configuration (the live view on, spans, OTLP and GenAI names off);
//! `relay/openai_chat+otlp` (the OTLP metrics push), `+spans` (every request sampled),
//! `+gen_ai` (`metrics.names: both`) and `+all` (all three); `+objectives` (two
//! objectives, judged at each request's end: a cost per request, none per event).
//!
//! Each measured run is one call of `budget_measure`, which callgrind is told to count
//! alone and to dump after; the binary prints one `measure` line per call, in order, so
//! the dumps can be named. Without valgrind it runs every case as well (`cargo test
//! --bench budget`): a check of the setup, which fails unless every request is measured.
//! Run: `bash scripts/budget.sh` (it builds, counts and compares).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    chunked, config_from, drain, gateway, request_parts, response_head, server_metrics, Call, RULES,
};
use criterion::black_box;
use prost::Message;
use tokentap::exchange::{BodyEnd, Exchange, Gateway, Streaming, UpstreamIdle};
use tokentap::metrics::Metrics;
use tokentap::observe::RequestHead;
use tokentap::proxy::body::StreamingBody;
use tokentap::relay::response::ResponseHead;
use tokentap::relay::response_relay::{ResponseRelay, Step, Upstream, Watcher};
use tokentap::summary::Sinks;
use tokentap::wire::grpc::framing::frame;
use tokentap::wire::grpc::proto::sglang::grpc::scheduler as sglang;

/// The token events of the shorter run.
const EVENTS: usize = 40;
/// The token events of the longer run: the more events the difference spans, the less a
/// per-event figure moves with what varies per request (a hash table's probes, the digits
/// of a time in the access log).
const LONG: usize = 240;
/// Requests per measured run (its count is divided by them): a run's count then varies
/// less with where a hash table's probes land.
const REQUESTS: usize = 32;
/// Requests run before a case's measured runs: label pairs admitted, buffers grown.
const WARM_UP: usize = 2;

const IDLE: Duration = Duration::from_secs(120);

/// The pause before each stream's second token-bearing event: longer than the burst
/// detector's `TOGETHER` (1 ms) whatever the machine does, so every stream is a stream.
const PACE: Duration = Duration::from_millis(2);

/// The only function callgrind counts (`--toggle-collect`), and after which it dumps.
#[no_mangle]
#[inline(never)]
fn budget_measure(run: &mut dyn FnMut()) {
    run();
}

/// What the relay's I/O loop does with one read, without the sockets: the clock read,
/// the idle clock, the state machine and the observer behind it.
struct Relayed {
    exchange: Option<Exchange>,
    streaming: Option<Streaming>,
    at: Instant,
    /// Pieces of body data the observer saw.
    observed: usize,
}

impl Watcher for Relayed {
    fn head(&mut self, head: &ResponseHead) {
        if let Some(exchange) = self.exchange.take() {
            self.streaming = Some(exchange.response_head(self.at, head.status, &head.headers));
        }
    }

    fn data(&mut self, bytes: &[u8]) {
        if let Some(streaming) = self.streaming.as_mut().filter(|s| s.observes()) {
            streaming.data(Instant::now(), bytes);
            self.observed += 1;
        }
    }
}

/// One request relayed over the HTTP/1.1 fast path: `reads` are what the upstream reads
/// bring (the head, then one event each).
/// `pause_before`: the read before which the upstream pauses for [`PACE`].
fn relay_request(
    gateway: &Gateway<()>,
    call: &Call<'_>,
    reads: &[Vec<u8>],
    pause_before: usize,
) -> usize {
    let parts = request_parts(call);
    let admitted = gateway
        .begin(RequestHead::of(&parts), Instant::now())
        .expect("under the in-flight limit");
    let mut scan = admitted.scan;
    scan.feed(call.body);
    drop(scan);
    let mut relayed = Relayed {
        exchange: Some(admitted.exchange),
        streaming: None,
        at: Instant::now(),
        observed: 0,
    };
    let mut relay = ResponseRelay::new(false, RULES, true, false);
    let mut idle = UpstreamIdle::new(IDLE);
    let mut pieces = Vec::new();
    let mut out = Vec::with_capacity(4096);
    let mut sent = 0;
    for (index, read) in reads.iter().enumerate() {
        if index == pause_before {
            std::thread::sleep(PACE);
        }
        let at = Instant::now();
        relayed.at = at;
        idle.data();
        out.clear();
        let step = relay.feed(
            Upstream::Sent,
            read,
            false,
            &mut pieces,
            &mut out,
            &mut relayed,
        );
        sent += black_box(&out).len();
        match step {
            Step::More { used } => {
                assert_eq!(used, read.len(), "each read is whole");
                idle.waiting(tokio::time::Instant::from_std(at));
            }
            Step::Ended { .. } => {
                if let Some(streaming) = relayed.streaming.as_mut() {
                    streaming.finish(Instant::now(), BodyEnd::Clean);
                }
            }
            other => panic!("the bench's response is whole: {other:?}"),
        }
    }
    assert!(relayed.observed > 0, "the bench's request is measured");
    sent
}

/// `frames` as a response body (then `trailers` if any) that pauses for [`PACE`] before
/// the frame at `pause_before`.
fn paced(
    frames: &[Bytes],
    trailers: Option<&http::HeaderMap>,
    pause_before: usize,
) -> impl http_body::Body<Data = Bytes, Error = std::convert::Infallible> + Unpin {
    let mut frames: Vec<_> = frames
        .iter()
        .cloned()
        .map(|b| Ok(http_body::Frame::data(b)))
        .collect();
    if let Some(trailers) = trailers {
        frames.push(Ok(http_body::Frame::trailers(trailers.clone())));
    }
    let frames = frames.into_iter().enumerate().map(move |(index, frame)| {
        if index == pause_before {
            std::thread::sleep(PACE);
        }
        frame
    });
    http_body_util::StreamBody::new(futures_util::stream::iter(frames))
}

/// A streamed response as an HTTP/1.1 upstream sends it, one read per event.
fn chunked_reads(content_type: &str, events: &[Bytes]) -> Vec<Vec<u8>> {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let mut reads = vec![head.into_bytes()];
    reads.extend(events.iter().map(|event| chunked(event)));
    if let Some(last) = reads.last_mut() {
        last.extend_from_slice(b"0\r\n\r\n");
    }
    reads
}

/// An Anthropic Messages stream with `tokens` text deltas.
fn anthropic_events(tokens: usize) -> Vec<Bytes> {
    let mut out = vec![
        r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":21,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}

"#
        .to_string(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".to_string(),
    ];
    for i in 0..tokens {
        out.push(format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n",
            word(i)
        ));
    }
    out.push(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
            .to_string(),
    );
    out.push(format!(
        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{tokens}}}}}\n\n"
    ));
    out.push("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_string());
    out.into_iter().map(Bytes::from).collect()
}

/// A Responses API stream with `tokens` text deltas.
fn responses_events(tokens: usize) -> Vec<Bytes> {
    let response = |status: &str, usage: &str| {
        format!(
            r#"{{"id":"resp_01","object":"response","created_at":1741476542,"status":"{status}","error":null,"incomplete_details":null,"model":"gpt-4.1-2025-04-14","output":[],"usage":{usage}}}"#
        )
    };
    let mut out = vec![format!(
        "event: response.created\ndata: {{\"type\":\"response.created\",\"sequence_number\":0,\"response\":{}}}\n\n",
        response("in_progress", "null")
    )];
    out.push("event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"msg_01\",\"type\":\"message\",\"status\":\"in_progress\",\"content\":[],\"role\":\"assistant\"}}\n\n".to_string());
    for i in 0..tokens {
        out.push(format!(
            "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"sequence_number\":{},\"item_id\":\"msg_01\",\"output_index\":0,\"content_index\":0,\"delta\":\"{}\",\"logprobs\":[]}}\n\n",
            i + 2,
            word(i)
        ));
    }
    let usage = format!(
        r#"{{"input_tokens":12,"input_tokens_details":{{"cached_tokens":0}},"output_tokens":{tokens},"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":{}}}"#,
        tokens + 12
    );
    out.push(format!(
        "event: response.completed\ndata: {{\"type\":\"response.completed\",\"sequence_number\":{},\"response\":{}}}\n\n",
        tokens + 2,
        response("completed", &usage)
    ));
    out.into_iter().map(Bytes::from).collect()
}

/// An SGLang `Generate` stream: one chunk per token, then the completion.
fn sglang_messages(tokens: usize) -> Vec<Bytes> {
    use sglang::generate_response::Response;
    let message = |response| {
        Bytes::from(frame(
            &sglang::GenerateResponse {
                request_id: "r1".into(),
                response: Some(response),
            }
            .encode_to_vec(),
        ))
    };
    let ids = |n: usize| (0..n).map(|i| 1000 + i as u32).collect::<Vec<_>>();
    let mut out: Vec<Bytes> = (0..tokens)
        .map(|i| {
            message(Response::Chunk(sglang::GenerateStreamChunk {
                token_ids: vec![1000 + i as u32],
                prompt_tokens: 12,
                completion_tokens: i as u32 + 1,
                ..Default::default()
            }))
        })
        .collect();
    out.push(message(Response::Complete(sglang::GenerateComplete {
        output_ids: ids(tokens),
        prompt_tokens: 12,
        completion_tokens: tokens as u32,
        finish_reason: "length".into(),
        ..Default::default()
    })));
    out
}

fn word(i: usize) -> &'static str {
    const WORDS: [&str; 8] = [
        " the", " token", " streams", " fast", " and", " every", " gap", " is",
    ];
    WORDS[i % WORDS.len()]
}

/// The request path a case runs.
enum Path {
    Relay,
    Hyper,
}

/// A dialect's request and response.
struct Dialect {
    path: &'static str,
    body: Vec<u8>,
    content_type: &'static str,
    events: fn(usize) -> Vec<Bytes>,
    /// The response's trailers (gRPC's status).
    trailers: Option<http::HeaderMap>,
    /// The index among `events` of the second token-bearing event (the stream pauses
    /// before it).
    second_token: usize,
}

fn openai_chat() -> Dialect {
    Dialect {
        path: "/v1/chat/completions",
        body: br#"{"model":"sim-model","stream":true}"#.to_vec(),
        content_type: "text/event-stream",
        events: common::sim_frames_n,
        trailers: None,
        second_token: 2,
    }
}

fn anthropic() -> Dialect {
    Dialect {
        path: "/v1/messages",
        body: br#"{"model":"claude-sonnet-4-20250514","max_tokens":200,"stream":true}"#.to_vec(),
        content_type: "text/event-stream",
        events: anthropic_events,
        trailers: None,
        second_token: 3,
    }
}

fn responses() -> Dialect {
    Dialect {
        path: "/v1/responses",
        body: br#"{"model":"gpt-4.1-2025-04-14","stream":true}"#.to_vec(),
        content_type: "text/event-stream",
        events: responses_events,
        trailers: None,
        second_token: 3,
    }
}

fn sglang_grpc() -> Dialect {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let request = sglang::GenerateRequest {
        request_id: "r1".into(),
        stream: true,
        ..Default::default()
    };
    Dialect {
        path: "/sglang.grpc.scheduler.SglangScheduler/Generate",
        body: frame(&request.encode_to_vec()),
        content_type: "application/grpc",
        events: sglang_messages,
        trailers: Some(trailers),
        second_token: 1,
    }
}

/// One case: a dialect over a path, under a configuration.
struct Case {
    name: &'static str,
    path: Path,
    dialect: Dialect,
    /// The configuration file's text.
    config: &'static str,
}

/// The OTLP metrics push configured (to a collector that is not there: nothing is sent
/// while a count runs).
const OTLP: &str = "otlp:\n  endpoint: http://127.0.0.1:9/v1/metrics\n";
/// Per-request spans, every request sampled (spans turn the OTLP push on with them).
const SPANS: &str = "otlp:\n  endpoint: http://127.0.0.1:9/v1/metrics\n  traces:\n    enabled: true\n    sampler: always_on\n";
/// The GenAI semantic conventions' names beside tokentap's.
const GEN_AI: &str = "metrics:\n  names: both\n";
/// Two per-request objectives, one with a tenant's override: judged at each request's end.
const OBJECTIVES: &str = "objectives:\n  interactive:\n    ttft: 500ms\n    tpot: 50ms\n    overrides:\n      - tenant: tenant-a\n        ttft: 300ms\n  whole:\n    duration: 60s\n";
/// All of them.
const ALL: &str = "metrics:\n  names: both\notlp:\n  endpoint: http://127.0.0.1:9/v1/metrics\n  traces:\n    enabled: true\n    sampler: always_on\n";

fn cases() -> Vec<Case> {
    let case = |name, path, dialect, config| Case {
        name,
        path,
        dialect,
        config,
    };
    vec![
        case("relay/openai_chat", Path::Relay, openai_chat(), "{}"),
        case("relay/anthropic", Path::Relay, anthropic(), "{}"),
        case("relay/responses", Path::Relay, responses(), "{}"),
        case("hyper/openai_chat", Path::Hyper, openai_chat(), "{}"),
        case("hyper/sglang_grpc", Path::Hyper, sglang_grpc(), "{}"),
        case("relay/openai_chat+otlp", Path::Relay, openai_chat(), OTLP),
        case("relay/openai_chat+spans", Path::Relay, openai_chat(), SPANS),
        case(
            "relay/openai_chat+gen_ai",
            Path::Relay,
            openai_chat(),
            GEN_AI,
        ),
        case("relay/openai_chat+all", Path::Relay, openai_chat(), ALL),
        case(
            "relay/openai_chat+objectives",
            Path::Relay,
            openai_chat(),
            OBJECTIVES,
        ),
    ]
}

/// What a case's requests run against: the server's state as `serve` builds it from the
/// case's configuration. Its background tasks (the live view's ring, the span export)
/// are spawned on a runtime that is never driven, so no other work lands in a count.
struct Server {
    gateway: Gateway<()>,
    _live: Option<Arc<tokentap::live::Live>>,
    _spans: Option<tokentap::otlp::spans::SpanExporter>,
}

fn server(config_text: &str, background: &tokio::runtime::Runtime) -> Server {
    let config = config_from(config_text);
    let metrics: Arc<Metrics> = server_metrics(&config);
    let sinks = Sinks::new(metrics.clone());
    let _runtime = background.enter();
    let supervisor = tokentap::supervise::Supervisor::new(
        metrics.clone(),
        Arc::new(tokentap::admin::Readiness::default()),
    );
    let live = config
        .ui
        .then(|| tokentap::live::Live::start(sinks.clone(), &supervisor));
    let spans = config
        .otlp
        .as_ref()
        .and_then(|otlp| Some((otlp.traces.clone()?, otlp.resource.clone())))
        .map(|(traces, resource)| {
            let transport =
                tokentap::otlp::transport::Transport::new(&traces.link, traces.url.clone())
                    .expect("a plain-HTTP transport");
            tokentap::otlp::spans::SpanExporter::spawn(
                traces,
                transport,
                resource,
                None,
                sinks.clone(),
                &supervisor,
            )
        });
    Server {
        gateway: gateway(&config, &sinks),
        _live: live,
        _spans: spans,
    }
}

fn main() {
    // The access log as `tokentap` logs by default (text, `info`) to a log that is not a
    // terminal (a container's, a file), so without colours, into a sink.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .with_ansi(false)
        .fmt_fields(tokentap::log_fields::PlainFields)
        .init();
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let background = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let driver = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut index = 0;
    for case in cases() {
        if !only.is_empty() && !only.iter().any(|o| case.name.contains(o.as_str())) {
            continue;
        }
        let server = server(case.config, &background);
        let dialect = &case.dialect;
        let call = Call {
            path: dialect.path,
            tenant: Some("tenant-a".to_string()),
            body: &dialect.body,
            content_type: dialect.content_type,
        };
        for events in [EVENTS, LONG] {
            let frames = (dialect.events)(events);
            let reads = chunked_reads(dialect.content_type, &frames);
            let one = || -> usize {
                match case.path {
                    // The reads are the head, then one per event.
                    Path::Relay => {
                        relay_request(&server.gateway, &call, &reads, dialect.second_token + 1)
                    }
                    Path::Hyper => {
                        let streaming = response_head(&server.gateway, &call);
                        assert!(streaming.observes(), "the bench's request is measured");
                        let body = paced(&frames, dialect.trailers.as_ref(), dialect.second_token);
                        drain(
                            &driver,
                            StreamingBody::new(body, streaming, UpstreamIdle::new(IDLE)),
                        )
                    }
                }
            };
            for _ in 0..WARM_UP {
                black_box(one());
            }
            budget_measure(&mut || {
                for _ in 0..REQUESTS {
                    black_box(one());
                }
            });
            index += 1;
            println!(
                "measure {index} {} events={events} requests={REQUESTS}",
                case.name
            );
        }
    }
}
