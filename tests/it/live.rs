//! The live view's API against the in-process simulator: after traffic to two models, the
//! JSON snapshot's figures over its window are those of `/metrics` over the same time
//! (the window covers all of it: nothing happened before), its quantiles are the
//! windowed buckets' as `histogram_quantile` reads them, a long stream shows in flight
//! with its tokens so far, the SSE stream sends `tick` and `requests` events, nothing of
//! a request's text appears, the admin port does not serve it (a 404 that says where it
//! is), and with `ui.enabled: false` nothing listens for it. On both HTTP/1.1 paths
//! (relay and hyper), a request is listed in flight from its head, in the phase it waits
//! in, and leaves the list when it ends, its client gone before any answer included.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::{body_text, client, Proxy, SimHandle, Step};
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokentap::live::window::quantile;
use tokentap_sim::{ModelProfile, SimConfig};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn sim_config() -> SimConfig {
    SimConfig {
        models: vec![
            ModelProfile::new(
                "fast",
                Duration::from_millis(15),
                Duration::from_millis(3),
                8,
            ),
            ModelProfile::new(
                "slow",
                Duration::from_millis(60),
                Duration::from_millis(12),
                5,
            ),
        ],
        ..SimConfig::default()
    }
}

async fn get(admin: std::net::SocketAddr, path: &str) -> (u16, String) {
    let response = client()
        .request(
            Request::get(format!("http://{admin}{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("admin answers");
    let status = response.status().as_u16();
    (status, body_text(response).await)
}

async fn snapshot(admin: std::net::SocketAddr, window: u64) -> Value {
    let (status, body) = get(admin, &format!("/api/live/snapshot?window={window}")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("the snapshot is JSON")
}

async fn stream(proxy: &Proxy, model: &str, tenant: &str, extra: &[(&'static str, &str)]) {
    let mut request = common::chat(
        &proxy.url("/v1/chat/completions"),
        model,
        tenant,
        true,
        true,
    );
    for (name, value) in extra {
        request
            .headers_mut()
            .insert(*name, value.parse().expect("a header value"));
    }
    let response = client().request(request).await.expect("response");
    response.into_body().collect().await.expect("stream");
}

/// A model's histogram buckets in `/metrics`, summed over tenants, not cumulative.
fn buckets(metrics: &common::Metrics, name: &str, model: &str, bounds: &[f64]) -> Vec<u64> {
    let mut cumulative: BTreeMap<usize, f64> = BTreeMap::new();
    for (labels, value) in metrics.samples_of(name) {
        let label = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if label("model") != Some(model) {
            continue;
        }
        let le = label("le").expect("a bucket has le");
        let index = if le == "+Inf" {
            bounds.len()
        } else {
            let le: f64 = le.parse().expect("le is a number");
            bounds
                .iter()
                .position(|b| (b - le).abs() < 1e-9)
                .expect("le is one of the bounds")
        };
        *cumulative.entry(index).or_default() += value;
    }
    let mut below = 0.0;
    cumulative
        .values()
        .map(|&c| {
            let n = (c - below) as u64;
            below = c;
            n
        })
        .collect()
}

fn bounds(snapshot: &Value, which: &str) -> Vec<f64> {
    snapshot["bounds"][which]
        .as_array()
        .expect("bounds")
        .iter()
        .map(|b| b.as_f64().unwrap())
        .collect()
}

fn model<'a>(snapshot: &'a Value, name: &str) -> Option<&'a Value> {
    snapshot["models"]
        .as_array()?
        .iter()
        .find(|m| m["model"] == name)
}

/// Wait until `tenant`'s request to the model `name` is listed in flight with a token.
async fn wait_listed_in_flight(proxy: &Proxy, name: &str, tenant: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let snap = snapshot(proxy.live(), 60).await;
        let shown = snap["in_flight"]["streams"].as_array().unwrap().clone();
        if let Some(s) = shown.iter().find(|s| s["tenant"] == tenant) {
            if s["tokens"].as_u64().unwrap() >= 1 {
                assert_eq!(s["model"], name);
                assert!(s["elapsed_s"].as_f64().unwrap() > 0.0);
                assert_eq!(model(&snap, name).expect("listed")["in_flight"], 1);
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never in flight: {snap}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The snapshot over the last minute once its window counts `requests`.
async fn window_counting(proxy: &Proxy, requests: u64) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let snap = snapshot(proxy.live(), 60).await;
        let counted: u64 = snap["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["requests"].as_u64().unwrap())
            .sum();
        if counted == requests {
            return snap;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ring lags: {snap}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `name`'s figures in the snapshot are `/metrics`' over the same window: requests,
/// outcomes, tokens, the TTFT and ITL quantiles from the windowed buckets, the heatmap.
fn assert_model_is_metrics(snap: &Value, metrics: &common::Metrics, name: &str) {
    let ttft_bounds = bounds(snap, "ttft");
    let itl_bounds = bounds(snap, "itl");
    let m = model(snap, name).unwrap_or_else(|| panic!("{name} listed: {snap}"));
    let labels = [("model", name)];
    assert_eq!(
        m["requests"].as_f64().unwrap(),
        metrics.sum("tokentap_requests_total", &labels),
        "{name}"
    );
    assert_eq!(
        m["outcomes"]["completed"].as_f64().unwrap(),
        metrics.sum(
            "tokentap_requests_total",
            &[("model", name), ("outcome", "completed")]
        )
    );
    assert_eq!(
        m["output_tokens"].as_f64().unwrap(),
        metrics.sum("tokentap_output_tokens_total", &labels)
    );
    for (family, key, bounds) in [
        ("tokentap_time_to_first_token_seconds", "ttft", &ttft_bounds),
        ("tokentap_inter_token_latency_seconds", "itl", &itl_bounds),
    ] {
        let counts = buckets(metrics, &format!("{family}_bucket"), name, bounds);
        let figures = &m[key];
        assert_eq!(
            figures["count"].as_u64().unwrap(),
            counts.iter().sum::<u64>(),
            "{name} {key}"
        );
        for (q, field) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")] {
            let want = quantile(q, bounds, &counts).expect("observations");
            let got = figures[field].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-9,
                "{name} {key} {field}: {got} vs {want}"
            );
        }
        let mean = metrics.mean(family, &labels);
        assert!((figures["mean"].as_f64().unwrap() - mean).abs() < 1e-9);
    }
    let heat = &snap["heatmap"]["models"][name]["itl"];
    let columns = heat.as_array().expect("heatmap columns");
    assert_eq!(
        columns.len(),
        snap["heatmap"]["at_ms"].as_array().unwrap().len()
    );
    let heat_total: u64 = columns
        .iter()
        .flat_map(|c| c.as_array().unwrap())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        heat_total,
        m["itl"]["count"].as_u64().unwrap(),
        "{name} heatmap"
    );
}

#[tokio::test]
async fn the_snapshot_matches_metrics_over_the_same_window() {
    let sim = SimHandle::start(sim_config()).await;
    let proxy = Proxy::start(&sim.url(), "metrics:\n  exemplars:\n    enabled: true\n").await;

    // An SSE subscriber from the start.
    let sse = client()
        .request(
            Request::get(format!("http://{}/api/live/stream?window=10", proxy.live()))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("the stream opens");
    assert_eq!(sse.status(), 200);
    assert_eq!(sse.headers()["content-type"], "text/event-stream");
    let mut sse = sse.into_body();

    // A long stream, in flight while the others run.
    let long = {
        let proxy_url = proxy.url("/v1/chat/completions");
        tokio::spawn(async move {
            let mut request = common::chat(&proxy_url, "slow", "patient", true, true);
            request
                .headers_mut()
                .insert("x-sim-itl-ms", "400".parse().unwrap());
            let response = client().request(request).await.expect("response");
            response.into_body().collect().await.expect("stream");
        })
    };
    for i in 0..6 {
        stream(&proxy, "fast", &format!("t{}", i % 2), &[]).await;
    }
    let traceparent = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    stream(
        &proxy,
        "slow",
        "t0",
        &[("traceparent", &traceparent), ("x-sim-itl-ms", "150")],
    )
    .await;
    for _ in 0..3 {
        stream(&proxy, "slow", "t1", &[]).await;
    }

    // The long stream is listed in flight with its tokens so far.
    wait_listed_in_flight(&proxy, "slow", "patient").await;
    long.await.expect("the long stream ends");

    // Once the ring has ticked past the last request, the window holds all of it.
    let metrics = proxy
        .wait_metrics("11 requests", |m| {
            m.sum("tokentap_requests_total", &[]) == 11.0
        })
        .await;
    let snap = window_counting(&proxy, 11).await;
    for name in ["fast", "slow"] {
        assert_model_is_metrics(&snap, &metrics, name);
    }
    // The slow ITL of the traced request puts it among the slowest, with its trace id.
    let slowest = snap["slowest"].as_array().expect("slowest");
    assert_eq!(slowest[0]["model"], "slow");
    assert!(
        slowest.iter().any(|s| s["trace_id"] == TRACE_ID),
        "{slowest:?}"
    );
    assert_eq!(snap["in_flight"]["total"], 0);

    // The SSE stream sent ticks and the finished requests.
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(seen.contains("event: tick\ndata: ")
        && seen.contains("event: requests\ndata: ")
        && seen.contains("\"model\":\"fast\""))
    {
        let frame = tokio::time::timeout_at(deadline, sse.frame())
            .await
            .expect("SSE frames come")
            .expect("a frame")
            .expect("no error");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    for event in seen.split("\n\n").filter(|e| e.starts_with("event: ")) {
        let data = event.split_once("\ndata: ").expect("data").1;
        let _: Value = serde_json::from_str(data).expect("each event's data is JSON");
    }
    // No request text anywhere.
    let text = format!("{snap}{seen}");
    assert!(!text.contains("Say something"));
    assert!(!text.contains("traceparent"));
}

#[tokio::test]
async fn the_page_and_its_files_are_served() {
    let sim = SimHandle::start(sim_config()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let (status, page) = get(proxy.live(), "/ui").await;
    assert_eq!(status, 200);
    assert!(page.contains("uplot.min.js"), "{page}");
    for path in ["/ui/uplot.min.js", "/ui/uplot.min.css", "/ui/live.js"] {
        let (status, body) = get(proxy.live(), path).await;
        assert_eq!(status, 200, "{path}");
        assert!(!body.is_empty(), "{path}");
    }
    // No page refers to anything off the binary.
    assert!(!page.contains("http://") && !page.contains("https://"));
    assert_eq!(get(proxy.live(), "/ui/nothing").await.0, 404);
    // The listener's root is the page, for a port-forwarded browser.
    assert_eq!(get(proxy.live(), "/").await, (200, page));
}

/// The live view shows model and tenant names and trace ids: it is on its own listener,
/// not on the admin port, which answers its paths with a 404 saying where it is; the
/// live view's listener serves none of the admin port's paths.
#[tokio::test]
async fn the_live_view_is_not_on_the_admin_port() {
    let sim = SimHandle::start(sim_config()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let live = proxy.live();
    assert_ne!(live, proxy.admin);
    for path in [
        "/ui",
        "/ui/live.js",
        "/api/live/snapshot",
        "/api/live/stream",
    ] {
        let (status, body) = get(proxy.admin, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(
            body.contains("ui.listen") && body.contains(&live.to_string()),
            "{path}: {body}"
        );
    }
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(get(live, path).await.0, 404, "{path}");
        assert_eq!(get(proxy.admin, path).await.0, 200, "{path}");
    }
}

#[tokio::test]
async fn switched_off_the_live_view_is_not_there() {
    let sim = SimHandle::start(sim_config()).await;
    let proxy = Proxy::start(&sim.url(), "ui:\n  enabled: false\n").await;
    assert_eq!(proxy.ui, None, "nothing listens for it");
    for path in [
        "/ui",
        "/ui/uplot.min.js",
        "/api/live/snapshot",
        "/api/live/stream",
    ] {
        let (status, body) = get(proxy.admin, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("ui.enabled: false"), "{path}: {body}");
    }
    stream(&proxy, "fast", "t", &[]).await;
    assert_eq!(get(proxy.admin, "/metrics").await.0, 200);
}

#[tokio::test]
async fn the_stream_ends_when_the_server_stops() {
    let sim = SimHandle::start(sim_config()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let response = client()
        .request(
            Request::get(format!("http://{}/api/live/stream", proxy.live()))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("the stream opens");
    let mut body = response.into_body();
    proxy.shutdown();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
    assert!(ended.is_ok(), "the SSE stream outlived the server");
}

/// The two HTTP/1.1 paths: the relay (`proxy.http1_fast_path: true`) and hyper (`false`).
/// Both begin a request through the one exchange policy, where it is listed.
const PATHS: [bool; 2] = [true, false];

async fn proxy_on_path(upstream: &str, fast: bool) -> Proxy {
    Proxy::start(upstream, &format!("proxy:\n  http1_fast_path: {fast}\n")).await
}

/// The request of `tenant` in the snapshot's list of requests in flight, if listed.
async fn listed(admin: std::net::SocketAddr, tenant: &str) -> Option<Value> {
    let snap = snapshot(admin, 10).await;
    snap["in_flight"]["streams"]
        .as_array()?
        .iter()
        .find(|s| s["tenant"] == tenant)
        .cloned()
}

/// Wait until the request of `tenant` is listed in `phase`, with its model (named from
/// the moment the request body has been read: a reading between the head and the body
/// shows none); its entry.
async fn wait_listed(admin: std::net::SocketAddr, tenant: &str, phase: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let entry = listed(admin, tenant).await;
        let ready = |s: &&Value| s["phase"] == phase && !s["model"].is_null();
        if let Some(entry) = entry.as_ref().filter(ready) {
            return entry.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tenant} never listed {phase}: {entry:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until the request of `tenant` is no longer listed.
async fn wait_unlisted(admin: std::net::SocketAddr, tenant: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Some(entry) = listed(admin, tenant).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tenant} still listed: {entry}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sse_head() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        .to_vec()
}

fn chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

/// A request is listed from its head, on both HTTP/1.1 paths: while the upstream holds
/// its response head (`waiting_head`, elapsed growing), then the first token
/// (`waiting_first_token`), then streaming, with the model its body named; once it ends
/// it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_listed_from_its_head_through_each_phase() {
    let hold = Duration::from_millis(1500);
    let event = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    let backend = common::ScriptedBackend::start(vec![
        Step::Sleep(hold),
        Step::Write(sse_head()),
        Step::Sleep(hold),
        Step::Write(chunk(event)),
        Step::Sleep(hold),
        Step::Write(chunk("data: [DONE]\n\n")),
        Step::Write(b"0\r\n\r\n".to_vec()),
    ])
    .await;
    for fast in PATHS {
        let proxy = proxy_on_path(&backend.url(), fast).await;
        let tenant = format!("held-{fast}");
        let request = common::chat(
            &proxy.url("/v1/chat/completions"),
            "held",
            &tenant,
            true,
            false,
        );
        let client = tokio::spawn(async move {
            let response = client().request(request).await.expect("response");
            response.into_body().collect().await.expect("stream");
        });

        let first = wait_listed(proxy.live(), &tenant, "waiting_head").await;
        assert_eq!(first["model"], "held", "{first}");
        assert_eq!(first["tokens"], 0);
        for empty in ["tokens_per_s", "largest_gap_s", "since_last_event_s"] {
            assert_eq!(first[empty], Value::Null, "{empty}: {first}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let later = wait_listed(proxy.live(), &tenant, "waiting_head").await;
        assert!(
            later["elapsed_s"].as_f64().unwrap() > first["elapsed_s"].as_f64().unwrap(),
            "elapsed stands still: {first} then {later}"
        );

        let head = wait_listed(proxy.live(), &tenant, "waiting_first_token").await;
        assert_eq!(head["tokens"], 0, "{head}");
        assert_eq!(head["tokens_per_s"], Value::Null, "{head}");

        let streaming = wait_listed(proxy.live(), &tenant, "streaming").await;
        assert_eq!(streaming["tokens"], 1, "{streaming}");
        assert_eq!(streaming["model"], "held");

        client.await.expect("the stream ends");
        wait_unlisted(proxy.live(), &tenant).await;
    }
}

/// A request whose client leaves while the upstream has not answered leaves the list, on
/// both HTTP/1.1 paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_leaves_before_the_head_is_unlisted() {
    let backend = common::ScriptedBackend::start(vec![
        Step::Sleep(Duration::from_secs(60)),
        Step::Write(sse_head()),
    ])
    .await;
    for fast in PATHS {
        let proxy = proxy_on_path(&backend.url(), fast).await;
        let tenant = format!("gone-{fast}");
        let body = r#"{"model":"gone","stream":true}"#;
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             x-tenant-id: {tenant}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
        client.write_all(request.as_bytes()).await.expect("send");
        let waiting = wait_listed(proxy.live(), &tenant, "waiting_head").await;
        assert_eq!(waiting["model"], "gone", "{waiting}");
        drop(client);
        wait_unlisted(proxy.live(), &tenant).await;
        let m = proxy
            .wait_metrics("gone recorded", |m| {
                m.sum("tokentap_requests_total", &[("model", "gone")]) >= 1.0
            })
            .await;
        assert_eq!(
            m.sum(
                "tokentap_requests_total",
                &[("model", "gone"), ("outcome", "cancelled")]
            ),
            1.0
        );
    }
}
