//! Trace exemplars end to end: streams with a valid, a malformed and no `traceparent` go
//! through tokentap to the simulator; a scrape with Prometheus' own `Accept` gets the
//! OpenMetrics text, where the valid request's trace and span ids sit on its TTFT, ITL,
//! TPOT and duration buckets with the values its access-log line reports, and nothing
//! of the others' appears. The protobuf scrape carries the same exemplars.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{access_log, client, Proxy, SimHandle};
use http_body_util::BodyExt;
use prost::Message;
use tokentap::metrics::protobuf::{self, MetricFamily};
use tokentap_sim::{ModelProfile, SimConfig};

/// What Prometheus 2.42 sends by default (no native histograms).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// The same with `--enable-feature=native-histograms`.
const NATIVE_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_ID: &str = "00f067aa0ba902b7";
/// Upper-case hex: not a valid `traceparent`.
const BAD_TRACE_ID: &str = "A3CE929D0E0E47364BF92F3577B34DA6";

const HISTOGRAMS: [&str; 4] = [
    "tokentap_time_to_first_token_seconds",
    "tokentap_inter_token_latency_seconds",
    "tokentap_time_per_output_token_seconds",
    "tokentap_request_duration_seconds",
];

/// One streamed chat request of `model` (its own tenant too), with `traceparent` if given;
/// returns the request's access-log line.
async fn stream(proxy: &Proxy, model: &str, traceparent: Option<&str>) -> access_log::LogLine {
    let mut request = common::chat(&proxy.url("/v1/chat/completions"), model, model, true, true);
    if let Some(value) = traceparent {
        request
            .headers_mut()
            .insert("traceparent", value.parse().expect("a header value"));
    }
    let response = client().request(request).await.expect("response");
    response.into_body().collect().await.expect("stream");
    access_log::assert_one_request_line("model", model, "completed", Some(200)).await
}

fn sim_config(models: &[&str]) -> SimConfig {
    SimConfig {
        models: models
            .iter()
            .map(|model| {
                ModelProfile::new(
                    model,
                    Duration::from_millis(15),
                    Duration::from_millis(3),
                    6,
                )
            })
            .collect(),
        ..SimConfig::default()
    }
}

/// An access-log field in milliseconds, as seconds.
fn seconds(line: &access_log::LogLine, field: &str) -> f64 {
    line.field(field)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{field} in {line:?}"))
        / 1e3
}

/// The `(value, timestamp)` of the exemplar on `family`'s buckets for `model`, checking
/// there is exactly one and that it names the valid trace.
fn exemplar(text: &str, family: &str, model: &str) -> (f64, f64) {
    let prefix = format!("{family}_bucket{{model=\"{model}\"");
    let found: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(" # {"))
        .collect();
    assert_eq!(found.len(), 1, "{family}: {found:#?}");
    let (_, exemplar) = found[0].split_once(" # ").expect("an exemplar");
    let labels = format!("{{trace_id=\"{TRACE_ID}\",span_id=\"{SPAN_ID}\"}} ");
    let rest = exemplar
        .strip_prefix(&labels)
        .unwrap_or_else(|| panic!("{family}: {exemplar}"));
    let (value, timestamp) = rest.split_once(' ').expect("value and timestamp");
    (
        value.parse().expect("a value"),
        timestamp.parse().expect("a timestamp"),
    )
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_traceparent_leaves_its_trace_on_four_histograms_and_nothing_else_does() {
    let (valid, malformed, absent) = ("ex-traced", "ex-malformed", "ex-untraced");
    let sim = SimHandle::start(sim_config(&[valid, malformed, absent])).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let started = now();
    let traced = stream(&proxy, valid, Some(&format!("00-{TRACE_ID}-{SPAN_ID}-01"))).await;
    stream(
        &proxy,
        malformed,
        Some(&format!("00-{BAD_TRACE_ID}-{SPAN_ID}-01")),
    )
    .await;
    stream(&proxy, absent, None).await;
    let finished = now();

    let (content_type, body) = proxy.scrape_as(Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = String::from_utf8(body.to_vec()).expect("UTF-8");
    assert!(text.ends_with("# EOF\n"), "{text}");

    // Each figure as the access log reports it (milliseconds) and as the exemplar holds it:
    // the same value, but for ITL, whose gaps waiting for the stream's final count are
    // kept in whole microseconds (`clock`) while the log's slowest gap is exact.
    for (family, field, tolerance) in [
        (HISTOGRAMS[0], "ttft_ms", 1e-9),
        (HISTOGRAMS[1], "slowest_gap_ms", 1e-6),
        (HISTOGRAMS[2], "mean_itl_ms", 1e-9),
        (HISTOGRAMS[3], "duration_ms", 1e-9),
    ] {
        let (value, timestamp) = exemplar(&text, family, valid);
        let logged = seconds(&traced, field);
        assert!(
            (value - logged).abs() < tolerance,
            "{family}: exemplar {value}, access log {logged}"
        );
        assert!(
            started - 0.001 <= timestamp && timestamp <= finished + 0.001,
            "{family}: {timestamp} not in [{started}, {finished}]"
        );
    }
    // One stream per model: one exemplar line per traced histogram, none elsewhere.
    let exemplar_lines: Vec<&str> = text.lines().filter(|l| l.contains(" # {")).collect();
    assert_eq!(
        exemplar_lines.len(),
        HISTOGRAMS.len(),
        "{exemplar_lines:#?}"
    );
    assert!(!text.to_lowercase().contains(&BAD_TRACE_ID.to_lowercase()));
    for model in [malformed, absent] {
        assert!(!exemplar_lines.iter().any(|l| l.contains(model)), "{model}");
    }

    // The Prometheus text has none; the protobuf scrape has the same ones.
    let (_, plain) = proxy.scrape_as(Some("text/plain;version=0.0.4")).await;
    assert!(!String::from_utf8_lossy(&plain).contains(TRACE_ID));
    let (content_type, body) = proxy.scrape_as(Some(NATIVE_ACCEPT)).await;
    assert_eq!(content_type, protobuf::CONTENT_TYPE);
    let mut body = &body[..];
    let mut traced_histograms = Vec::new();
    while !body.is_empty() {
        let family = MetricFamily::decode_length_delimited(&mut body).expect("a family");
        for metric in &family.metric {
            let Some(h) = &metric.histogram else {
                continue;
            };
            let in_buckets = h.bucket.iter().filter_map(|b| b.exemplar.as_ref());
            for exemplar in in_buckets.chain(&h.exemplars) {
                let ids: Vec<&str> = exemplar.label.iter().map(|l| l.value()).collect();
                assert_eq!(ids, [TRACE_ID, SPAN_ID], "{}", family.name());
                assert!(metric.label.iter().any(|l| l.value() == valid));
                traced_histograms.push(family.name().to_string());
            }
        }
    }
    let traced_histograms: BTreeSet<String> = traced_histograms.into_iter().collect();
    assert_eq!(traced_histograms, HISTOGRAMS.map(String::from).into());
}

/// `metrics.exemplars.enabled: false` reads no trace context at all; a configured header
/// replaces `traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exemplars_follow_the_config() {
    let (off, custom) = ("ex-off", "ex-custom-header");
    let sim = SimHandle::start(sim_config(&[off, custom])).await;
    let traceparent = format!("00-{TRACE_ID}-{SPAN_ID}-01");

    let proxy = Proxy::start(&sim.url(), "metrics:\n  exemplars:\n    enabled: false\n").await;
    stream(&proxy, off, Some(&traceparent)).await;
    let (_, body) = proxy.scrape_as(Some(PROMETHEUS_ACCEPT)).await;
    assert!(!String::from_utf8_lossy(&body).contains(" # {"));

    let proxy = Proxy::start(&sim.url(), "metrics:\n  exemplars:\n    header: x-trace\n").await;
    stream(&proxy, custom, Some(&traceparent)).await;
    let (_, body) = proxy.scrape_as(Some(PROMETHEUS_ACCEPT)).await;
    assert!(
        !String::from_utf8_lossy(&body).contains(" # {"),
        "`traceparent` is not read when another header is configured"
    );
    let mut request = common::chat(
        &proxy.url("/v1/chat/completions"),
        custom,
        "again",
        true,
        true,
    );
    request
        .headers_mut()
        .insert("x-trace", traceparent.parse().expect("a header value"));
    let response = client().request(request).await.expect("response");
    response.into_body().collect().await.expect("stream");
    access_log::assert_one_request_line("tenant", "again", "completed", Some(200)).await;
    let (_, body) = proxy.scrape_as(Some(PROMETHEUS_ACCEPT)).await;
    let text = String::from_utf8(body.to_vec()).expect("UTF-8");
    for family in HISTOGRAMS {
        exemplar(&text, family, custom);
    }
}
