//! The real binary's lifecycle: SIGHUP reload (atomic, invalid files rejected, in-flight
//! streams unaffected), SIGTERM drain with exit 0, and that no secret a client sends ever
//! reaches the logs (at trace level) or `/metrics`.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokentap_sim::{ModelProfile, SimConfig};

fn write_config(path: &std::path::Path, upstream: &str, tenant_header: &str, fast: bool) {
    std::fs::write(
        path,
        format!(
            "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream:\n  url: {upstream}\n  probe_interval: 100ms\nshutdown:\n  drain_timeout: 10s\ntenants:\n  sources:\n    - header: {tenant_header}\nproxy:\n  http1_fast_path: {fast}\n"
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_atomically_and_sigterm_drains() {
    reload_and_drain(false).await;
}

/// The same on the HTTP/1.1 fast path's relay, which serves these plain HTTP/1.1 requests
/// itself: its in-flight stream finishes at SIGTERM and its idle connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_atomically_and_sigterm_drains_on_the_relay() {
    reload_and_drain(true).await;
}

async fn reload_and_drain(fast: bool) {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new(
            "m",
            Duration::from_millis(20),
            Duration::from_millis(20),
            60,
        )],
        ..SimConfig::default()
    })
    .await;
    let dir =
        std::env::temp_dir().join(format!("tokentap-lifecycle-{}-{fast}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokentap.yaml");
    write_config(&path, &sim.url(), "x-tenant-id", fast);
    let mut process = TokentapProcess::start(&path, "info");
    let proxy_url = format!("http://{}/v1/chat/completions", process.proxy);

    // A stream that is still running across both reloads.
    let long = client()
        .request(chat(&proxy_url, "m", "before", true, false))
        .await
        .unwrap();
    let mut long_body = long.into_body();
    long_body.frame().await.unwrap().unwrap();

    // An invalid file is rejected and the old configuration keeps serving.
    std::fs::write(&path, "upstream:\n  url: http://x:1\n  bogus_key: 1\n").unwrap();
    process.signal("HUP");
    let rejected = process.wait_log("config reload rejected");
    assert!(
        rejected["error"].as_str().unwrap().contains("bogus_key"),
        "{rejected}"
    );
    let response = client()
        .request(chat(&proxy_url, "m", "still-old", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await;

    // A valid file with a different tenant source takes effect for new requests.
    write_config(&path, &sim.url(), "x-team", fast);
    process.signal("HUP");
    process.wait_log("config reloaded");
    let mut request = chat(&proxy_url, "m", "ignored-now", true, false);
    request
        .headers_mut()
        .insert("x-team", "blue".parse().unwrap());
    body_text(client().request(request).await.unwrap()).await;

    // The stream begun before both reloads completes and keeps its original labels.
    let rest = long_body
        .collect()
        .await
        .expect("in-flight stream unaffected")
        .to_bytes();
    assert!(rest.ends_with(b"data: [DONE]\n\n"));
    let m = process
        .wait_metrics("three requests", |m| {
            m.sum("tokentap_requests_total", &[]) >= 3.0
        })
        .await;
    for tenant in ["before", "still-old", "blue"] {
        assert_eq!(
            m.sum(
                "tokentap_requests_total",
                &[("tenant", tenant), ("outcome", "completed")]
            ),
            1.0,
            "{tenant}: {}",
            m.text
        );
    }

    // SIGTERM during a live stream: it finishes, then the process exits 0.
    let live = client()
        .request(chat(&proxy_url, "m", "draining", true, false))
        .await
        .unwrap();
    let mut live_body = live.into_body();
    live_body.frame().await.unwrap().unwrap();
    process.signal("TERM");
    let rest = live_body
        .collect()
        .await
        .expect("drained stream completes")
        .to_bytes();
    assert!(rest.ends_with(b"data: [DONE]\n\n"));
    let status = tokio::task::spawn_blocking(move || process.child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_logs_or_metrics() {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new(
            "m",
            Duration::from_millis(1),
            Duration::from_millis(1),
            5,
        )],
        ..SimConfig::default()
    })
    .await;
    let dir = std::env::temp_dir().join(format!("tokentap-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokentap.yaml");
    write_config(&path, &sim.url(), "x-tenant-id", false);
    let process = TokentapProcess::start(&path, "trace");

    let secrets = [
        "sk-PLANTED-bearer-0001",
        "PLANTED-cookie-0002",
        "PLANTED-prompt-0003",
        "PLANTED-xapikey-0004",
        "PLANTED-query-0005",
    ];
    let body = serde_json::json!({
        "model": "m",
        "stream": true,
        "messages": [{"role": "user", "content": format!("my password is {}", secrets[2])}],
    });
    for path in ["/v1/chat/completions", "/v1/models", "/v1/nope"] {
        let request = Request::post(format!("http://{}{path}?key={}", process.proxy, secrets[4]))
            .header("authorization", format!("Bearer {}", secrets[0]))
            .header("cookie", format!("session={}", secrets[1]))
            .header("x-api-key", secrets[3])
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        body_text(client().request(request).await.unwrap()).await;
    }
    // A request to an unreachable upstream path, so error paths log too.
    let m = process
        .wait_metrics("the chat request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    process.wait_log("tokentap::access");
    let logs = process.all_logs();
    assert!(logs.len() > 1000, "trace logging produced output");
    for secret in secrets {
        assert!(!logs.contains(secret), "{secret} leaked into logs");
        assert!(!m.text.contains(secret), "{secret} leaked into /metrics");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
