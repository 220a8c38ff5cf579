//! `labels.tenant.families` through the whole server: which families a scrape shows with
//! `tenant` (the default set, a widened one, none), and what a reload that changes the set
//! does (warns, keeps the running set: the families are built once).

use crate::common;

use std::time::Duration;

use common::*;
use tokentap::server::Server;
use tokentap_sim::{ModelProfile, SimConfig, TokensPerEvent, UsageMode};

const CHAT: &str = "/v1/chat/completions";

/// Label names of the first sample of `series` (a full series name, e.g. `x_count`).
fn label_names(m: &Metrics, series: &str) -> Vec<String> {
    let line = m
        .text
        .lines()
        .find(|l| l.starts_with(&format!("{series}{{")))
        .unwrap_or_else(|| panic!("no {series} in:\n{}", m.text));
    let labels = &line[series.len() + 1..line.rfind('}').expect("closing brace")];
    labels
        .split("\",")
        .filter_map(|pair| pair.split_once('=').map(|(name, _)| name.to_string()))
        .collect()
}

async fn scrape_after_two_requests(yaml: &str) -> Metrics {
    let profile = ModelProfile::new("m", Duration::from_millis(5), Duration::from_millis(1), 5);
    scrape_after_two_streams(yaml, profile, UsageMode::Always).await
}

/// One request of tenant `a` and one of `b` to a sim serving `profile` with `usage`.
async fn scrape_after_two_streams(yaml: &str, profile: ModelProfile, usage: UsageMode) -> Metrics {
    let sim = SimHandle::start(SimConfig {
        models: vec![profile],
        usage,
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), yaml).await;
    for tenant in ["a", "b"] {
        let response = client()
            .request(chat(&proxy.url(CHAT), "m", tenant, true, false))
            .await
            .expect("request");
        assert_eq!(response.status(), 200);
        body_text(response).await;
    }
    proxy
        .wait_metrics("both requests", |m| {
            m.sum("tokentap_requests_total", &[]) >= 2.0
        })
        .await
}

/// Default: `tenant` on requests, tokens, TTFT and ITL; TTFB, duration, TPOT, tokens/s,
/// inter-chunk and stalls per model, one series for both tenants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_only_the_slo_families_carry_tenant() {
    let m = scrape_after_two_requests("").await;
    for series in [
        "tokentap_requests_total",
        "tokentap_output_tokens_total",
        "tokentap_input_tokens_total",
        "tokentap_time_to_first_token_seconds_count",
        "tokentap_inter_token_latency_seconds_count",
    ] {
        assert!(
            label_names(&m, series).contains(&"tenant".to_string()),
            "{series}"
        );
    }
    for series in [
        "tokentap_time_to_first_byte_seconds_count",
        "tokentap_time_to_first_content_token_seconds_count",
        "tokentap_inter_chunk_latency_seconds_count",
        "tokentap_time_per_output_token_seconds_count",
        "tokentap_output_tokens_per_second_count",
        "tokentap_request_duration_seconds_count",
        "tokentap_stream_stalls_total",
    ] {
        assert_eq!(label_names(&m, series), ["model"], "{series}");
    }
    assert_eq!(
        m.sum("tokentap_request_duration_seconds_count", &[("model", "m")]),
        2.0
    );
    assert_eq!(
        m.sum(
            "tokentap_time_to_first_token_seconds_count",
            &[("model", "m"), ("tenant", "b")]
        ),
        1.0
    );
}

/// Widened and emptied: the families listed carry `tenant`, the others do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_families_carry_tenant_and_no_others() {
    let m = scrape_after_two_requests(
        "labels:\n  tenant:\n    families: [tokentap_request_duration_seconds]\n",
    )
    .await;
    assert_eq!(
        label_names(&m, "tokentap_request_duration_seconds_count"),
        ["model", "tenant"]
    );
    assert_eq!(
        m.sum(
            "tokentap_request_duration_seconds_count",
            &[("model", "m"), ("tenant", "a")]
        ),
        1.0
    );
    assert_eq!(
        label_names(&m, "tokentap_requests_total"),
        ["model", "outcome", "status"]
    );
    assert_eq!(
        label_names(&m, "tokentap_time_to_first_token_seconds_count"),
        ["model"]
    );

    let m = scrape_after_two_requests("labels:\n  tenant:\n    families: []\n").await;
    assert!(!m.text.contains("tenant="), "{}", m.text);
    assert_eq!(m.sum("tokentap_requests_total", &[("model", "m")]), 2.0);
}

/// A reload cannot rebuild the families: changing `labels.tenant.families` is accepted
/// with the restart warning (naming the key), the running set stays; an unchanged set
/// reloads without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_set_warns_and_keeps_the_running_one() {
    let config = config_without_traffic;
    let server = Server::bind(config("{}")).await.expect("bind");
    let reloader = server.reloader();

    let unchanged = reloader
        .reload(config("labels:\n  tenant:\n    max_values: 5\n"))
        .expect("reload");
    assert_eq!(unchanged, None);

    let changed = reloader
        .reload(config(
            "labels:\n  tenant:\n    families: [tokentap_request_duration_seconds]\n",
        ))
        .expect("reload");
    let warning = changed.expect("a restart warning");
    assert!(warning.contains("labels.tenant.families"), "{warning}");

    let metrics = server.metrics();
    let stream = metrics.stream(Some("m"), Some("t"));
    metrics.record_request(
        &stream,
        tokentap::outcome::Verdict::COMPLETED,
        tokentap::metrics::RequestFigures::default(),
    );
    let text = String::from_utf8(metrics.render()).expect("UTF-8");
    assert!(
        text.contains("tokentap_request_duration_seconds_count{model=\"m\"} 1\n"),
        "{text}"
    );
}

/// `tokentap_output_tokens_per_event` is per model by default and may be listed like any
/// other: with continuous usage every event's count is exact (here 3 tokens an event, 6
/// per stream), so each request observes its two events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_event_is_per_model_unless_listed() {
    let profile = || ModelProfile {
        tokens_per_event: TokensPerEvent::range(3, 3).expect("a range"),
        ..ModelProfile::new("m", Duration::from_millis(5), Duration::from_millis(1), 6)
    };
    let m = scrape_after_two_streams("", profile(), UsageMode::Continuous).await;
    let series = "tokentap_output_tokens_per_event_count";
    assert_eq!(label_names(&m, series), ["model"]);
    assert_eq!(m.sum(series, &[("model", "m")]), 4.0, "{}", m.text);
    assert_eq!(m.sum("tokentap_output_tokens_per_event_sum", &[]), 12.0);
    let bucket = |le: &str| m.sum("tokentap_output_tokens_per_event_bucket", &[("le", le)]);
    assert_eq!((bucket("2"), bucket("3")), (0.0, 4.0), "every event held 3");

    let m = scrape_after_two_streams(
        "labels:\n  tenant:\n    families: [tokentap_output_tokens_per_event]\n",
        profile(),
        UsageMode::Continuous,
    )
    .await;
    assert_eq!(label_names(&m, series), ["model", "tenant"]);
    assert_eq!(m.sum(series, &[("model", "m"), ("tenant", "a")]), 2.0);
}
