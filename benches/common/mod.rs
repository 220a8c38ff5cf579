//! What the benches share: simulated responses, the configuration, the exchange policy's
//! state as the server builds it, and a response begun through it, so that each bench
//! measures the request path the same way (`observe`: criterion's time; `budget`:
//! valgrind's instruction count).

// Each bench uses part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokentap::config::{Config, Overrides};
use tokentap::exchange::{Active, Gateway, Streaming, UpstreamIdle};
use tokentap::metrics::Metrics;
use tokentap::observe::{self, RequestHead, ResponseObserver};
use tokentap::proxy::body::StreamingBody;
use tokentap::relay::response::ResponseRules;
use tokentap::summary::Sinks;

pub const TOKENS: usize = 40;

/// One frame per event, as `tokentap sim` sends them: a role chunk, 40 token events, the
/// finish, the usage and `[DONE]`.
pub fn sim_frames() -> Vec<Bytes> {
    sim_frames_n(TOKENS)
}

/// The same with `tokens` token events.
pub fn sim_frames_n(tokens: usize) -> Vec<Bytes> {
    let words = [
        " the", " token", " streams", " fast", " and", " every", " gap", " is",
    ];
    let head = r#"{"id":"sim-1","object":"chat.completion.chunk","created":1764000000,"model":"sim-model","choices":"#;
    let mut out = vec![format!(
        "data: {head}[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    )];
    for i in 0..tokens {
        out.push(format!(
            "data: {head}[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
            words[i % words.len()]
        ));
    }
    out.push(format!(
        "data: {head}[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"length\"}}]}}\n\n"
    ));
    out.push(format!(
        "data: {head}[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\n",
        tokens + 12
    ));
    out.push("data: [DONE]\n\n".to_string());
    out.into_iter().map(Bytes::from).collect()
}

pub type InMemory = StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>,
>;

/// `frames` as a response body, then `trailers` if any.
pub fn in_memory_with(frames: &[Bytes], trailers: Option<&http::HeaderMap>) -> InMemory {
    let mut frames: Vec<_> = frames.iter().cloned().map(|b| Ok(Frame::data(b))).collect();
    if let Some(trailers) = trailers {
        frames.push(Ok(Frame::trailers(trailers.clone())));
    }
    StreamBody::new(futures_util::stream::iter(frames))
}

pub fn in_memory(frames: &[Bytes]) -> InMemory {
    in_memory_with(frames, None)
}

/// The configuration from `yaml` (`{}`: the defaults) with the benches' upstream.
pub fn config_from(yaml: &str) -> Arc<Config> {
    let mut config = Config::from_yaml(
        yaml,
        "<bench>",
        &Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Overrides::default()
        },
    )
    .expect("the bench's config is valid");
    // `iter_batched` opens a whole batch of streams before it drains any, and on a quiet
    // machine a batch holds more than the default limit's 20,000.
    config.limits.max_in_flight = 1 << 30;
    Arc::new(config)
}

pub fn config() -> Arc<Config> {
    config_from("{}")
}

/// The measured route the benches request.
pub const CHAT: &str = "/v1/chat/completions";

pub fn metrics(config: &Config) -> Arc<Metrics> {
    Metrics::new(&config.metrics.buckets, &config.labels)
}

/// The metric families as the server builds them from `config` (names, native buckets).
pub fn server_metrics(config: &Config) -> Arc<Metrics> {
    Metrics::with_names(
        &config.metrics.buckets,
        &config.metrics.native_histograms,
        &config.labels,
        config.metrics.names,
    )
}

/// The sinks requests are observed into, over `config`'s metric families.
pub fn sinks(config: &Config) -> Arc<Sinks> {
    Sinks::new(metrics(config))
}

/// The observer of one streamed chat request for `model` and `tenant`.
pub fn observer(
    config: &Arc<Config>,
    sinks: &Arc<Sinks>,
    model: &str,
    tenant: Option<String>,
) -> ResponseObserver {
    let (parts, ()) = http::Request::post("/v1/chat/completions")
        .body(())
        .expect("static request")
        .into_parts();
    let mut parts = parts;
    if let Some(tenant) = tenant {
        parts.headers.insert(
            "x-tenant-id",
            tenant.parse().expect("tenant is a header value"),
        );
    }
    let (mut scan, pending) = observe::start(
        RequestHead::of(&parts),
        Instant::now(),
        config,
        None,
        sinks,
        &Default::default(),
    );
    scan.feed(format!(r#"{{"model":"{model}","stream":true}}"#).as_bytes());
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    pending
        .response(Instant::now(), http::StatusCode::OK, &headers)
        .expect("a chat completion is measured")
}

/// The exchange policy's state, as the server builds it (no upstream client: nothing is sent).
pub fn gateway(config: &Arc<Config>, sinks: &Arc<Sinks>) -> Gateway<()> {
    let active = Active {
        config: config.clone(),
        tokenizer: None,
        upstream: (),
    };
    Gateway::new(active, sinks.clone())
}

/// A request as a client sends it: its path, tenant and body, and the content type of
/// the response to it.
pub struct Call<'a> {
    pub path: &'a str,
    pub tenant: Option<String>,
    pub body: &'a [u8],
    pub content_type: &'static str,
}

impl Call<'_> {
    /// A streamed request at `path` for `model`, with an SSE response.
    pub fn sse<'a>(path: &'a str, body: &'a [u8], tenant: Option<String>) -> Call<'a> {
        Call {
            path,
            tenant,
            body,
            content_type: "text/event-stream",
        }
    }
}

/// The request head of `call`: a gRPC call's when its response is gRPC, else a JSON
/// request's.
pub fn request_parts(call: &Call<'_>) -> http::request::Parts {
    let grpc = call.content_type == "application/grpc";
    let (mut parts, ()) = http::Request::post(call.path)
        .header(
            http::header::CONTENT_TYPE,
            if grpc {
                "application/grpc"
            } else {
                "application/json"
            },
        )
        .body(())
        .expect("static request")
        .into_parts();
    if grpc {
        parts
            .headers
            .insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    }
    if let Some(tenant) = &call.tenant {
        parts.headers.insert(
            "x-tenant-id",
            tenant.parse().expect("tenant is a header value"),
        );
    }
    parts
}

/// `call` begun through the exchange policy, its body scanned, and its response head in.
pub fn response_head(gateway: &Gateway<()>, call: &Call<'_>) -> Streaming {
    let parts = request_parts(call);
    let mut admitted = gateway
        .begin(RequestHead::of(&parts), Instant::now())
        .expect("under the in-flight limit");
    admitted.scan.feed(call.body);
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(call.content_type),
    );
    admitted
        .exchange
        .response_head(Instant::now(), http::StatusCode::OK, &headers)
}

/// The response to one request begun at `path` (with `tenant`), its body `frames`.
pub fn streamed(
    gateway: &Gateway<()>,
    path: &str,
    model: &str,
    tenant: Option<String>,
    frames: &[Bytes],
    idle: Duration,
) -> StreamingBody<InMemory> {
    let body = format!(r#"{{"model":"{model}","stream":true}}"#);
    let streaming = response_head(gateway, &Call::sse(path, body.as_bytes(), tenant));
    StreamingBody::new(in_memory(frames), streaming, UpstreamIdle::new(idle))
}

pub fn drain<B>(rt: &tokio::runtime::Runtime, body: B) -> usize
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    rt.block_on(async move {
        let mut body = body;
        let mut n = 0;
        while let Some(frame) = body.frame().await {
            n += frame
                .expect("in-memory frames do not fail")
                .into_data()
                .map_or(0, |d| d.len());
        }
        n
    })
}

/// The bytes of one event as a chunked upstream sends it: its own chunk.
pub fn chunked(frame: &[u8]) -> Vec<u8> {
    let mut out = format!("{:X}\r\n", frame.len()).into_bytes();
    out.extend_from_slice(frame);
    out.extend_from_slice(b"\r\n");
    out
}

pub const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

pub const RULES: ResponseRules = ResponseRules {
    max_header_bytes: 16 << 10,
    max_headers: 100,
};
