//! `objectives` through the whole server, on every transport: a mix of fast and slow
//! first tokens for two tenants gives the exact met and missed counts per objective and
//! tenant (a tenant's override included), the token goodput, and the targets.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use common::*;
use tokentap_sim::{ModelProfile, SimConfig, UsageMode};

const CHAT: &str = "/v1/chat/completions";

/// `interactive`: a first token within 300 ms, 1 s for tenant `b`. `whole`: the whole
/// answer within 20 s, which every request here meets.
const OBJECTIVES: &str = "objectives:
  interactive:
    ttft: 300ms
    target: 0.9
    overrides:
      - tenant: b
        ttft: 1s
  whole:
    duration: 20s
";

#[derive(Clone, Copy, Debug)]
enum Transport {
    Relay,
    HyperH1,
    H2,
}

/// The simulator's first tokens: 5 ms and 600 ms, far from the bounds on either side (a
/// loaded 2-core machine adds tens of milliseconds, not hundreds), 4 tokens each.
fn sim() -> SimConfig {
    let model = |name: &str, ttft: u64| {
        ModelProfile::new(
            name,
            Duration::from_millis(ttft),
            Duration::from_millis(1),
            4,
        )
    };
    SimConfig {
        models: vec![model("fast", 5), model("slow", 600)],
        usage: UsageMode::Always,
        ..SimConfig::default()
    }
}

async fn judged_over(transport: Transport) {
    let sim = SimHandle::start(sim()).await;
    let fast_path = matches!(transport, Transport::Relay);
    let yaml = format!("proxy:\n  http1_fast_path: {fast_path}\n{OBJECTIVES}");
    let proxy = Proxy::start(&sim.url(), &yaml).await;
    let client: Client<_, Full<Bytes>> = match transport {
        Transport::H2 => Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http(),
        _ => common::client(),
    };
    // Tenant a: two fast, one slow. Tenant b: one fast, two slow (within its 1 s).
    let plan = [
        ("a", "fast"),
        ("a", "fast"),
        ("a", "slow"),
        ("b", "fast"),
        ("b", "slow"),
        ("b", "slow"),
    ];
    let requests = plan.map(|(tenant, model)| {
        let request = chat(&proxy.url(CHAT), model, tenant, true, true);
        let client = client.clone();
        async move {
            let response = client.request(request).await.expect("request");
            assert_eq!(response.status(), 200);
            body_text(response).await
        }
    });
    futures_util::future::join_all(requests).await;
    let m = proxy
        .wait_metrics("six requests judged twice", |m| {
            m.sum("tokentap_objective_requests_total", &[]) >= 12.0
        })
        .await;
    let counted = |objective: &str, tenant: &str, result: &str| {
        m.sum(
            "tokentap_objective_requests_total",
            &[
                ("objective", objective),
                ("tenant", tenant),
                ("result", result),
            ],
        )
    };
    let at = format!("{transport:?}\n{}", m.text);
    assert_eq!(counted("interactive", "a", "met"), 2.0, "{at}");
    assert_eq!(counted("interactive", "a", "missed"), 1.0, "{at}");
    assert_eq!(counted("interactive", "b", "met"), 3.0, "{at}");
    assert_eq!(counted("interactive", "b", "missed"), 0.0, "{at}");
    assert_eq!(counted("whole", "a", "met"), 3.0, "{at}");
    assert_eq!(counted("whole", "b", "met"), 3.0, "{at}");
    assert_eq!(
        m.sum("tokentap_objective_requests_total", &[]),
        12.0,
        "{at}"
    );
    // Token goodput: 4 tokens per request, by the same labels.
    let tokens = |tenant: &str, result: &str| {
        m.sum(
            "tokentap_objective_output_tokens_total",
            &[
                ("objective", "interactive"),
                ("tenant", tenant),
                ("result", result),
            ],
        )
    };
    assert_eq!(tokens("a", "met"), 8.0, "{at}");
    assert_eq!(tokens("a", "missed"), 4.0, "{at}");
    assert_eq!(tokens("b", "met"), 12.0, "{at}");
    assert_eq!(
        m.sum("tokentap_objective_target", &[("objective", "interactive")]),
        0.9
    );
    assert_eq!(
        m.sum("tokentap_objective_target", &[("objective", "whole")]),
        0.95
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn met_and_missed_per_objective_and_tenant_through_the_relay() {
    judged_over(Transport::Relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn met_and_missed_per_objective_and_tenant_through_hyper() {
    judged_over(Transport::HyperH1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn met_and_missed_per_objective_and_tenant_over_h2() {
    judged_over(Transport::H2).await;
}

/// Without objectives, none of the families has a series: nothing is judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_objectives_nothing_is_judged() {
    let sim = SimHandle::start(sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "fast", "a", true, true))
        .await
        .expect("request");
    body_text(response).await;
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert!(
        !m.text.contains("tokentap_objective_requests_total{"),
        "{}",
        m.text
    );
    assert!(!m.text.contains("tokentap_objective_target{"), "{}", m.text);
}
