//! `metrics.names`: the GenAI semantic conventions' families on `/metrics`, from streams
//! of known shape through tokentap (the simulator: TTFT 150 ms, ITL 10 ms, 8 tokens, no
//! jitter). Each family holds what its definition takes, compared with tokentap's own
//! families in the same scrape: the server's TTFT and TPOT only successful requests, the
//! client's chunk figures only streamed ones, the duration of a failed request under its
//! `error_type`, and operation and provider from the dialect. The timing tolerance is
//! `dialects.rs`' lateness bound (40 ms: timers, scheduling on a shared 2-core machine and
//! the proxy hop); counts are exact.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use prost::Message;
use tokentap::metrics::protobuf::{MetricFamily, MetricType};
use tokentap_sim::{ModelProfile, SimConfig};

use crate::common::{chat, client, Metrics, Proxy, SimHandle};

const TTFT: f64 = 0.150;
const LATENESS: f64 = 0.040;
const MODEL: &str = "sim-model";

const CHAT: [(&str, &str); 3] = [
    ("gen_ai_operation_name", "chat"),
    ("gen_ai_provider_name", "openai"),
    ("gen_ai_request_model", MODEL),
];
const OLLAMA: [(&str, &str); 3] = [
    ("gen_ai_operation_name", "text_completion"),
    ("gen_ai_provider_name", "ollama"),
    ("gen_ai_request_model", MODEL),
];

async fn sim() -> SimHandle {
    SimHandle::start(SimConfig {
        models: vec![ModelProfile::new(
            MODEL,
            Duration::from_millis(150),
            Duration::from_millis(10),
            8,
        )],
        ..SimConfig::default()
    })
    .await
}

/// Two streamed chats with usage, one chat not streamed, one streamed chat the engine
/// fails after 3 tokens, and one streamed Ollama `/api/generate`.
async fn traffic(proxy: &Proxy) -> Metrics {
    let client = client();
    let url = proxy.url("/v1/chat/completions");
    for stream in [true, true, false] {
        let response = client
            .request(chat(&url, MODEL, "team-a", stream, true))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap();
    }
    let mut failing = chat(&url, MODEL, "team-a", true, true);
    failing
        .headers_mut()
        .insert("x-sim-fault", "error-after=3".parse().unwrap());
    let response = client.request(failing).await.unwrap();
    response.into_body().collect().await.ok();
    let body = serde_json::json!({"model": MODEL, "prompt": "hi"});
    let generate = Request::post(proxy.url("/api/generate"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(generate).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    proxy
        .wait_metrics("five requests recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 5.0
        })
        .await
}

fn count(metrics: &Metrics, family: &str, labels: &[(&str, &str)]) -> f64 {
    metrics.sum(&format!("{family}_count"), labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gen_ai_family_holds_what_its_definition_takes() {
    let sim = sim().await;
    let proxy = Proxy::start(&sim.url(), "metrics:\n  names: both\n").await;
    let m = traffic(&proxy).await;
    let completed = m.sum(
        "tokentap_requests_total",
        &[("model", MODEL), ("outcome", "completed")],
    );
    assert_eq!(completed, 4.0, "{}", m.text);
    let failed = m.sum(
        "tokentap_requests_total",
        &[("model", MODEL), ("outcome", "upstream_error")],
    );
    assert_eq!(failed, 1.0);

    // Server TTFT and TPOT: the two successful streamed chats, not the failed one;
    // tokentap's TTFT has the three streamed chats and the Ollama stream. (A response
    // that is not streamed has no first token before its whole body: no TTFT at all.)
    let ttft = "gen_ai_server_time_to_first_token_seconds";
    assert_eq!(count(&m, ttft, &CHAT), 2.0);
    assert_eq!(
        count(
            &m,
            "tokentap_time_to_first_token_seconds",
            &[("model", MODEL)]
        ),
        4.0
    );
    let mean = m.mean(ttft, &CHAT);
    assert!(
        (TTFT..TTFT + LATENESS).contains(&mean),
        "server TTFT mean {mean}"
    );
    assert_eq!(
        count(&m, "gen_ai_server_time_per_output_token_seconds", &CHAT),
        2.0
    );
    assert_eq!(
        count(
            &m,
            "tokentap_time_per_output_token_seconds",
            &[("model", MODEL)]
        ),
        4.0,
        "tokentap's TPOT has the failed stream too"
    );
    // Client chunk figures: the three streamed chats (the failed one too), not the one
    // that was not streamed; every gap of tokentap's inter-chunk histogram is there.
    let first_chunk = "gen_ai_client_operation_time_to_first_chunk_seconds";
    assert_eq!(count(&m, first_chunk, &CHAT), 3.0);
    let chunks = "gen_ai_client_operation_time_per_output_chunk_seconds";
    let inter_chunk = count(
        &m,
        "tokentap_inter_chunk_latency_seconds",
        &[("model", MODEL)],
    );
    assert_eq!(
        count(&m, chunks, &CHAT) + count(&m, chunks, &OLLAMA),
        inter_chunk,
        "a non-streamed response has one event, so no gap"
    );
    // Duration: the successful ones without error_type, the failure under its outcome.
    let duration = "gen_ai_server_request_duration_seconds";
    assert_eq!(count(&m, duration, &CHAT), 4.0, "every chat, either series");
    let error = [CHAT.as_slice(), &[("error_type", "upstream_error")]].concat();
    assert_eq!(count(&m, duration, &error), 1.0);
    assert_eq!(
        count(&m, "tokentap_request_duration_seconds", &[("model", MODEL)]),
        5.0
    );
    assert!(!m.text.contains("error_type=\"completed\""));
    // Token usage: per request and type; the outputs add up to tokentap's counter.
    let usage = "gen_ai_client_token_usage";
    let output = |labels: &[(&str, &str)]| {
        let labels = [labels, &[("gen_ai_token_type", "output")]].concat();
        m.sum(&format!("{usage}_sum"), &labels)
    };
    assert_eq!(
        output(&CHAT) + output(&OLLAMA),
        m.sum("tokentap_output_tokens_total", &[("model", MODEL)])
    );
    let input = [CHAT.as_slice(), &[("gen_ai_token_type", "input")]].concat();
    assert!(count(&m, usage, &input) >= 3.0, "{}", m.text);
    // Ollama's generate is a text completion by the ollama provider.
    assert_eq!(count(&m, ttft, &OLLAMA), 1.0);
    // No series carries tenant.
    assert!(m
        .text
        .lines()
        .filter(|l| l.starts_with("gen_ai_"))
        .all(|l| !l.contains("tenant=")));
}

/// `gen_ai`: the replaced `tokentap_` families are gone and the rest stay; the protobuf
/// scrape carries the GenAI histograms with their native buckets, the OpenMetrics one
/// their exemplars.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_ai_names_replace_their_tokentap_families_in_every_format() {
    let sim = sim().await;
    let yaml = "metrics:\n  names: gen_ai\n  exemplars:\n    enabled: true\n";
    let proxy = Proxy::start(&sim.url(), yaml).await;
    let client = client();
    let mut request = chat(
        &proxy.url("/v1/chat/completions"),
        MODEL,
        "team-a",
        true,
        true,
    );
    request.headers_mut().insert(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            .parse()
            .unwrap(),
    );
    let response = client.request(request).await.unwrap();
    response.into_body().collect().await.unwrap();
    let m = proxy
        .wait_metrics("the request recorded", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    for gone in [
        "tokentap_time_to_first_token_seconds",
        "tokentap_time_per_output_token_seconds",
        "tokentap_request_duration_seconds",
        "tokentap_inter_chunk_latency_seconds",
        "tokentap_output_tokens_total",
        "tokentap_input_tokens_total",
    ] {
        assert!(!m.text.contains(&format!("# TYPE {gone} ")), "{gone}");
    }
    for kept in [
        "tokentap_inter_token_latency_seconds",
        "tokentap_time_to_first_byte_seconds",
        "tokentap_requests_total",
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_client_token_usage",
    ] {
        assert!(m.text.contains(&format!("# TYPE {kept} ")), "{kept}");
    }

    let (content_type, body) = proxy
        .scrape_as(Some(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
        ))
        .await;
    assert!(content_type.contains("protobuf"), "{content_type}");
    let mut body = &body[..];
    let mut families = Vec::new();
    while !body.is_empty() {
        families.push(MetricFamily::decode_length_delimited(&mut body).expect("a family"));
    }
    let ttft = families
        .iter()
        .find(|f| f.name() == "gen_ai_server_time_to_first_token_seconds")
        .expect("the GenAI TTFT in the protobuf scrape");
    assert_eq!(ttft.r#type(), MetricType::Histogram);
    let histogram = ttft.metric[0].histogram.as_ref().expect("a histogram");
    assert_eq!(histogram.sample_count(), 1);
    assert!(!histogram.positive_span.is_empty(), "native buckets");
    assert_eq!(histogram.bucket.len(), 16, "the convention's 16 boundaries");

    let (_, openmetrics) = proxy
        .scrape_as(Some("application/openmetrics-text; version=1.0.0"))
        .await;
    let openmetrics = String::from_utf8(openmetrics.to_vec()).unwrap();
    assert!(
        openmetrics.lines().any(|l| l
            .starts_with("gen_ai_server_time_to_first_token_seconds_bucket")
            && l.contains("trace_id=\"0af7651916cd43dd8448eb211c80319c\"")),
        "an exemplar on the GenAI TTFT"
    );
}
