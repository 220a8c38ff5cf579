//! Per-request spans against an in-process OTLP/HTTP collector: a traced request's span
//! is a child of the `traceparent` it sent, an untraced one a root; the GenAI attributes
//! carry what the simulator streamed; the sampler decides which requests get one; a
//! failed request's span says ERROR; exemplars name the exported span; and a collector
//! that never answers costs no request, its losses counted; a request refused at the
//! in-flight limit has a span too. (scripts/ops/e2e-otlp.sh
//! checks spans against the OpenTelemetry project's Python receiver, both protocols.)

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, Proxy, SimHandle};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{
    span::SpanKind, status::StatusCode as SpanStatus, Span,
};
use prost::Message;
use tokentap_sim::{ModelProfile, SimConfig};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0";

/// An OTLP/HTTP collector on a free port that keeps every span sent to `/v1/traces` and
/// answers metrics exports with 200.
async fn collector() -> (SocketAddr, Arc<Mutex<Vec<Span>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let spans = Arc::new(Mutex::new(Vec::new()));
    let shared = spans.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let spans = shared.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let spans = spans.clone();
                async move {
                    let path = request.uri().path().to_string();
                    let body = request.into_body().collect().await.unwrap().to_bytes();
                    if path == "/v1/traces" {
                        let export = ExportTraceServiceRequest::decode(body).expect("protobuf");
                        let resource = &export.resource_spans[0];
                        let scope = &resource.scope_spans[0];
                        assert_eq!(scope.scope.as_ref().unwrap().name, "tokentap");
                        spans.lock().unwrap().extend(scope.spans.iter().cloned());
                    } else {
                        assert_eq!(path, "/v1/metrics");
                    }
                    Response::builder()
                        .status(StatusCode::OK)
                        .body(Full::new(Bytes::new()))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, spans)
}

fn sim() -> SimConfig {
    SimConfig {
        models: ["m", "traced", "root"]
            .iter()
            .map(|name| {
                ModelProfile::new(name, Duration::from_millis(20), Duration::from_millis(4), 8)
            })
            // Three tokens a second apart: a stream that holds its slot.
            .chain([ModelProfile::new(
                "slow",
                Duration::from_millis(20),
                Duration::from_secs(1),
                3,
            )])
            .collect(),
        ..SimConfig::default()
    }
}

fn config(collector: SocketAddr, traces: &str) -> String {
    format!(
        "otlp:\n  endpoint: http://{collector}/v1/metrics\n  interval: 1h\n  traces:\n    enabled: true\n    schedule_delay: 50ms\n{traces}"
    )
}

/// One streamed chat request of `model`, with `headers`; its status.
async fn request(proxy: &Proxy, model: &str, headers: &[(&str, &str)]) -> u16 {
    let mut request = common::chat(&proxy.url("/v1/chat/completions"), model, "t", true, true);
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            value.parse().expect("a header value"),
        );
    }
    let response = client().request(request).await.expect("response");
    let status = response.status().as_u16();
    response.into_body().collect().await.expect("stream");
    status
}

fn traceparent(span: &str, flags: &str) -> String {
    format!("00-{TRACE}-{span}-{flags}")
}

async fn wait_for_spans(spans: &Mutex<Vec<Span>>, n: usize) -> Vec<Span> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = spans.lock().unwrap().clone();
        if seen.len() >= n {
            return seen;
        }
        assert!(Instant::now() < deadline, "{} spans of {n}", seen.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn attributes(span: &Span) -> BTreeMap<String, Value> {
    span.attributes
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap().value.unwrap()))
        .collect()
}

fn text(attributes: &BTreeMap<String, Value>, key: &str) -> String {
    match attributes.get(key) {
        Some(Value::StringValue(v)) => v.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

fn int(attributes: &BTreeMap<String, Value>, key: &str) -> i64 {
    match attributes.get(key) {
        Some(Value::IntValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

fn double(attributes: &BTreeMap<String, Value>, key: &str) -> f64 {
    match attributes.get(key) {
        Some(Value::DoubleValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

/// `gen_ai.response.finish_reasons`, which must be an array of strings.
fn finish_reasons(attributes: &BTreeMap<String, Value>) -> Vec<String> {
    match attributes.get("gen_ai.response.finish_reasons") {
        Some(Value::ArrayValue(array)) => array
            .values
            .iter()
            .map(|v| match &v.value {
                Some(Value::StringValue(reason)) => reason.clone(),
                other => panic!("a finish reason that is not a string: {other:?}"),
            })
            .collect(),
        other => panic!("finish reasons: {other:?}"),
    }
}

fn model_of(span: &Span) -> String {
    text(&attributes(span), "gen_ai.request.model")
}

/// A completed chat span of the simulator's: its name, kind and status, and the GenAI,
/// server and tokentap attributes of what it streamed; never a header, prompt or content.
fn assert_completed_chat_span(span: &Span, upstream_port: u16) {
    assert_eq!(span.name, "chat traced");
    assert_eq!(span.kind, SpanKind::Client as i32);
    assert!(span.status.is_none(), "completed: status unset");
    let duration = (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e9;
    let a = attributes(span);
    assert_eq!(text(&a, "gen_ai.operation.name"), "chat");
    assert_eq!(text(&a, "gen_ai.provider.name"), "openai");
    assert_eq!(text(&a, "gen_ai.response.model"), "traced");
    assert_eq!(
        int(&a, "gen_ai.usage.output_tokens"),
        8,
        "the simulator's 8 tokens"
    );
    assert!(int(&a, "gen_ai.usage.input_tokens") > 0);
    let ttft = double(&a, "gen_ai.response.time_to_first_chunk");
    assert!(
        (0.015..duration).contains(&ttft),
        "ttft {ttft} of {duration}"
    );
    let p50 = double(&a, "tokentap.itl.p50");
    let max = double(&a, "tokentap.itl.max");
    assert!(
        (0.0..0.5).contains(&p50) && p50 > 0.0 && p50 <= max,
        "itl p50 {p50} max {max}"
    );
    assert!(double(&a, "tokentap.ttfb") <= ttft);
    assert_eq!(
        finish_reasons(&a),
        ["length"],
        "the simulator ends at its token count"
    );
    assert_eq!(text(&a, "tokentap.outcome"), "completed");
    assert_eq!(text(&a, "tokentap.status_class"), "2xx");
    assert_eq!(text(&a, "tokentap.tenant"), "t");
    assert_eq!(text(&a, "tokentap.output_tokens.counting"), "apportioned");
    assert_eq!(text(&a, "server.address"), "127.0.0.1");
    assert_eq!(int(&a, "server.port"), i64::from(upstream_port));
    assert_eq!(int(&a, "http.response.status_code"), 200);
    for key in a.keys() {
        assert!(
            !key.contains("header") && !key.contains("prompt") && !key.contains("content"),
            "{key}"
        );
    }
}

/// A traced request's span is its `traceparent`'s child, an untraced one's a new root;
/// the attributes say what the simulator streamed; the exemplars name the span.
#[tokio::test]
async fn spans_are_children_of_the_sent_traceparent_with_the_genai_attributes() {
    let (collector, spans) = collector().await;
    let sim = SimHandle::start(sim()).await;
    let proxy = Proxy::start(&sim.url(), &config(collector, "")).await;
    let parents = ["00f067aa0ba902b7", "1111111111111111"];
    // A valid `tracestate` goes on the span, joined; an invalid one (upper case) does not.
    let states = ["rojo=00f067aa0ba902b7 , congo=t61rcWkgMzE", "Bad=1"];
    for (parent, state) in parents.into_iter().zip(states) {
        let status = request(
            &proxy,
            "traced",
            &[
                ("traceparent", &traceparent(parent, "01")),
                ("tracestate", state),
            ],
        )
        .await;
        assert_eq!(status, 200);
    }
    // Without a parent there is no state to carry.
    assert_eq!(
        request(&proxy, "root", &[("tracestate", "rojo=1")]).await,
        200
    );
    let seen = wait_for_spans(&spans, 3).await;
    assert_eq!(seen.len(), 3, "one span per request");

    let traced: Vec<&Span> = seen.iter().filter(|s| model_of(s) == "traced").collect();
    assert_eq!(traced.len(), 2);
    for (span, parent) in traced.iter().zip(parents) {
        assert_eq!(hex::encode(&span.trace_id), TRACE, "the sent trace");
        assert_eq!(
            hex::encode(&span.parent_span_id),
            parent,
            "the sent span is the parent"
        );
        assert_ne!(hex::encode(&span.span_id), parent, "a span of its own");
        assert_eq!(span.flags, 0x301, "sampled, with a remote parent");
    }
    assert_eq!(
        traced[0].trace_state,
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    );
    assert_eq!(
        traced[1].trace_state, "",
        "an invalid tracestate is dropped"
    );
    let root = seen.iter().find(|s| model_of(s) == "root").unwrap();
    assert!(root.parent_span_id.is_empty(), "no traceparent: a root");
    assert_eq!(root.trace_state, "");
    assert_ne!(hex::encode(&root.trace_id), TRACE);
    assert_eq!(root.trace_id.len(), 16);
    assert_eq!(root.span_id.len(), 8);

    assert_completed_chat_span(traced[0], sim.addr.port());

    // The exemplars of the traced requests name their exported spans, not the client's.
    let (_, body) = proxy.scrape_as(Some(OPENMETRICS)).await;
    let text = String::from_utf8(body.to_vec()).unwrap();
    let exemplars: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("tokentap_time_to_first_token_seconds_bucket{model=\"traced\"")
                && l.contains(" # {")
        })
        .collect();
    assert!(!exemplars.is_empty(), "{text}");
    let exported: Vec<String> = traced.iter().map(|s| hex::encode(&s.span_id)).collect();
    for line in exemplars {
        let (_, exemplar) = line.split_once(" # ").unwrap();
        assert!(
            exemplar.contains(&format!("trace_id=\"{TRACE}\"")),
            "{exemplar}"
        );
        assert!(
            exported
                .iter()
                .any(|id| exemplar.contains(&format!("span_id=\"{id}\""))),
            "{exemplar} names none of {exported:?}"
        );
    }
    let root_exemplar = text
        .lines()
        .find(|l| {
            l.starts_with("tokentap_time_to_first_token_seconds_bucket{model=\"root\"")
                && l.contains(" # {")
        })
        .expect("a sampled root request's exemplar names its own trace");
    assert!(root_exemplar.contains(&hex::encode(&root.span_id)));
}

/// The sampler: ratio 0 sends none, ratio 1 all; parent-based follows the sampled flag.
#[tokio::test]
async fn the_sampler_decides_which_requests_get_a_span() {
    let sampled = traceparent("00f067aa0ba902b7", "01");
    let unsampled = traceparent("00f067aa0ba902b7", "00");
    // (sampler keys, requests' traceparents, spans expected)
    let cases: [(&str, [Option<&str>; 4], usize); 4] = [
        (
            "    sampler: traceidratio\n    sampler_ratio: 0\n",
            [None, None, Some(&sampled), Some(&unsampled)],
            0,
        ),
        (
            "    sampler: traceidratio\n    sampler_ratio: 1\n",
            [None, None, Some(&sampled), Some(&unsampled)],
            4,
        ),
        (
            "    sampler: parentbased_always_off\n",
            [None, None, Some(&sampled), Some(&unsampled)],
            1,
        ),
        (
            "    sampler: parentbased_traceidratio\n    sampler_ratio: 0\n",
            [None, Some(&unsampled), Some(&sampled), Some(&sampled)],
            2,
        ),
    ];
    for (keys, traceparents, expected) in cases {
        let (collector, spans) = collector().await;
        let sim = SimHandle::start(sim()).await;
        let mut proxy = Proxy::start(&sim.url(), &config(collector, keys)).await;
        for traceparent in traceparents {
            let headers: Vec<(&str, &str)> = traceparent
                .map(|t| ("traceparent", t))
                .into_iter()
                .collect();
            assert_eq!(request(&proxy, "m", &headers).await, 200);
        }
        // Shutdown sends what is queued.
        proxy.shutdown();
        proxy.task.take().unwrap().await.unwrap().unwrap();
        let seen = spans.lock().unwrap().len();
        assert_eq!(seen, expected, "{keys}");
    }
}

/// A non-streamed answer's finish reason, read from its whole JSON body, reaches the
/// span as a stream's does.
#[tokio::test]
async fn a_non_streamed_body_gives_its_finish_reasons_to_the_span() {
    let (collector, spans) = collector().await;
    let sim = SimHandle::start(sim()).await;
    let proxy = Proxy::start(&sim.url(), &config(collector, "")).await;
    let request = common::chat(&proxy.url("/v1/chat/completions"), "m", "t", false, false);
    let response = client().request(request).await.expect("response");
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.expect("body");
    let seen = wait_for_spans(&spans, 1).await;
    let a = attributes(&seen[0]);
    assert_eq!(
        finish_reasons(&a),
        ["length"],
        "the simulator's body ends at its token count"
    );
}

/// A request that fails mid-stream, or is refused, gets a span with status ERROR and
/// `error.type` its outcome.
#[tokio::test]
async fn a_failed_request_has_an_error_span() {
    let (collector, spans) = collector().await;
    let sim = SimHandle::start(sim()).await;
    let proxy = Proxy::start(&sim.url(), &config(collector, "")).await;
    request(&proxy, "m", &[("x-sim-fault", "error-after=3")]).await;
    assert_eq!(
        request(&proxy, "m", &[("x-sim-fault", "status=503")]).await,
        503
    );
    let seen = wait_for_spans(&spans, 2).await;
    for span in &seen {
        let status = span.status.as_ref().expect("a status");
        assert_eq!(status.code, SpanStatus::Error as i32);
        let a = attributes(span);
        assert_eq!(text(&a, "error.type"), "upstream_error");
        assert_eq!(text(&a, "tokentap.outcome"), "upstream_error");
    }
    let codes: Vec<i64> = seen
        .iter()
        .map(|s| int(&attributes(s), "http.response.status_code"))
        .collect();
    assert!(codes.contains(&503), "{codes:?}");
}

/// A request tokentap refuses at `limits.max_in_flight` (its own 503, the upstream never
/// asked) still gets a span, a child of its `traceparent`, so the caller's trace shows
/// where the call stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_at_the_in_flight_limit_has_a_span() {
    let (collector, spans) = collector().await;
    let sim = SimHandle::start(sim()).await;
    let file = format!("{}limits:\n  max_in_flight: 1\n", config(collector, ""));
    let proxy = Arc::new(Proxy::start(&sim.url(), &file).await);
    // The one slot, held by a slow stream.
    let holder = {
        let proxy = proxy.clone();
        tokio::spawn(async move { request(&proxy, "slow", &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let parent = "00f067aa0ba902b7";
    let status = request(
        &proxy,
        "traced",
        &[("traceparent", &traceparent(parent, "01"))],
    )
    .await;
    assert_eq!(status, 503);
    let seen = wait_for_spans(&spans, 1).await;
    let span = seen
        .iter()
        .find(|s| hex::encode(&s.parent_span_id) == parent)
        .expect("the refused request's span");
    assert_eq!(hex::encode(&span.trace_id), TRACE);
    assert_eq!(
        span.status.as_ref().map(|s| s.code),
        Some(SpanStatus::Error as i32)
    );
    let a = attributes(span);
    assert_eq!(text(&a, "error.type"), "overloaded");
    assert_eq!(int(&a, "http.response.status_code"), 503);
    assert_eq!(text(&a, "gen_ai.operation.name"), "chat");
    assert_eq!(span.end_time_unix_nano, span.start_time_unix_nano);
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(
        wait_for_spans(&spans, 2).await.len(),
        2,
        "the held request's own"
    );
}

/// A collector that never answers holds no request up; the spans the queue cannot hold
/// are dropped and counted.
#[tokio::test]
async fn a_collector_that_never_answers_costs_no_request_and_full_queue_drops_are_counted() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = silent.local_addr().unwrap();
    let sim = SimHandle::start(sim()).await;
    let keys = "    max_queue_size: 2\n    max_export_batch_size: 1\n    schedule_delay: 10ms\n";
    let yaml = format!(
        "otlp:\n  endpoint: http://{gone}/v1/metrics\n  interval: 1h\n  timeout: 30s\n  traces:\n    enabled: true\n{keys}"
    );
    let proxy = Proxy::start(&sim.url(), &yaml).await;
    for _ in 0..10 {
        let started = Instant::now();
        assert_eq!(request(&proxy, "m", &[]).await, 200);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    let metrics = common::wait_for_metrics(proxy.admin, "span drops", |m| {
        m.sum(
            "tokentap_otlp_exports_dropped_total",
            &[("signal", "traces"), ("reason", "queue_full")],
        ) >= 1.0
    })
    .await;
    // One span in the export that never ends, one in the batch, two queued: the rest
    // dropped (a request may end while the task is between receiving and sending).
    let dropped = metrics.sum(
        "tokentap_otlp_exports_dropped_total",
        &[("signal", "traces"), ("reason", "queue_full")],
    );
    assert!((5.0..=7.0).contains(&dropped), "{dropped}");
    assert_eq!(
        metrics.sum("tokentap_requests_total", &[("outcome", "completed")]),
        10.0
    );
    drop(silent);
}
