//! End-to-end tests of the proxy: tokentap in-process on 127.0.0.1:0 in front of a
//! backend with known timing (the simulator) or a byte-exact script, checked through the
//! client's view and the scraped `/metrics` text.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokentap_sim::{ModelProfile, SimConfig, UsageMode};

const CHAT: &str = "/v1/chat/completions";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The scripted backend of the issue: TTFT 150 ms, ITL 20 ms, 40 tokens, a role-only
/// first chunk and (when asked) a usage chunk.
fn scripted_sim() -> SimConfig {
    SimConfig {
        models: vec![ModelProfile::new("llama-3-8b", ms(150), ms(20), 40)],
        usage: UsageMode::Requested,
        role_chunk: true,
        ..SimConfig::default()
    }
}

/// Usage the stream itself reported, read from the client's copy.
fn reported_usage(body: &[u8]) -> (f64, f64) {
    let text = String::from_utf8_lossy(body);
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|v| v.get("usage").cloned())
        .expect("a usage chunk");
    (
        usage["prompt_tokens"].as_f64().unwrap(),
        usage["completion_tokens"].as_f64().unwrap(),
    )
}

/// Timing tolerances, from how the simulator and tokentap keep time:
/// - the simulator schedules token i at an absolute deadline `t_sim + 150 ms + 20 ms * i`
///   and tokio timers never fire early, so every token leaves at or after its deadline
///   (late by timer granularity, 1 ms, plus scheduling on a busy 2-core machine);
/// - tokentap's `t_req` precedes the simulator's `t_sim`, so TTFT >= 150 ms exactly, and
///   above it by loopback + scheduling: 40 ms is generous for a loaded CI box;
/// - mean ITL = (t_40 - t_1) / 39 = 20 ms + (late_40 - late_1) / 39: a lateness spread of
///   even 40 ms moves it by ~1 ms, so +-1.5 ms holds unless the machine stalls for 60 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_and_token_counts_match_the_scripted_backend() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "llama-3-8b", "team-a", true, true))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_bytes(response).await;
    let (prompt_tokens, completion_tokens) = reported_usage(&body);
    assert_eq!(completion_tokens, 40.0);

    let labels = [("model", "llama-3-8b"), ("tenant", "team-a")];
    // The families that are per model by default (`labels.tenant.families`).
    let model = &labels[..1];
    let m = proxy
        .wait_metrics("the request to be recorded", |m| {
            m.sum("tokentap_requests_total", &labels) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        1.0
    );
    assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0);
    assert_eq!(m.sum("tokentap_output_tokens_total", &labels), 40.0);
    assert_eq!(m.sum("tokentap_input_tokens_total", &labels), prompt_tokens);
    // One TTFT per request; ITL observed once per token after the first event.
    assert_eq!(
        m.sum("tokentap_time_to_first_token_seconds_count", &labels),
        1.0
    );
    assert_eq!(
        m.sum("tokentap_inter_token_latency_seconds_count", &labels),
        39.0
    );
    let ttft = m.mean("tokentap_time_to_first_token_seconds", &labels);
    assert!((0.150..0.190).contains(&ttft), "TTFT {ttft}");
    let ttft_content = m.mean("tokentap_time_to_first_content_token_seconds", model);
    assert_eq!(ttft_content, ttft, "the first token is visible content");
    let itl = m.mean("tokentap_inter_token_latency_seconds", &labels);
    assert!((itl - 0.020).abs() < 0.0015, "mean ITL {itl}");
    let tpot = m.mean("tokentap_time_per_output_token_seconds", model);
    assert!((tpot - 0.020).abs() < 0.0015, "TPOT {tpot}");
    let rate = m.mean("tokentap_output_tokens_per_second", model);
    assert!((rate - 50.0).abs() < 4.0, "tokens/s {rate}");
    let ttfb = m.mean("tokentap_time_to_first_byte_seconds", model);
    assert!(ttfb < ttft, "TTFB {ttfb} comes before TTFT {ttft}");
    let duration = m.mean("tokentap_request_duration_seconds", model);
    assert!(duration >= 0.150 + 0.020 * 39.0, "duration {duration}");
    assert_eq!(
        m.sum(
            "tokentap_event_tokens_total",
            &[("accuracy", "apportioned")]
        ),
        40.0
    );
    assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_keep_models_and_tenants_apart() {
    let sim = SimHandle::start(SimConfig {
        models: vec![
            ModelProfile::new("fast", ms(20), ms(2), 10),
            ModelProfile::new("slow", ms(40), ms(4), 20),
        ],
        usage: UsageMode::Never,
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let mut tasks = Vec::new();
    for i in 0..12 {
        let request = chat(
            &proxy.url(CHAT),
            if i % 2 == 0 { "fast" } else { "slow" },
            &format!("t{}", i % 3),
            true,
            false,
        );
        tasks.push(tokio::spawn(async move {
            body_bytes(client().request(request).await.unwrap()).await
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let m = proxy
        .wait_metrics("12 requests", |m| {
            m.sum("tokentap_requests_total", &[]) >= 12.0
        })
        .await;
    for (model, tokens) in [("fast", 10.0), ("slow", 20.0)] {
        for tenant in ["t0", "t1", "t2"] {
            let labels = [("model", model), ("tenant", tenant)];
            assert_eq!(
                m.sum("tokentap_requests_total", &labels),
                2.0,
                "{model}/{tenant}"
            );
            // No usage reported: one token per event, counted exactly as streamed.
            assert_eq!(m.sum("tokentap_output_tokens_total", &labels), 2.0 * tokens);
        }
    }
}

/// A byte-exact recorded stream, with mixed-case headers, no `Date` and trailers.
fn recorded_response() -> (Vec<Step>, Vec<u8>) {
    let body = std::fs::read("tests/fixtures/openai/chat_openai_include_usage.sse").unwrap();
    let mut script = vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Request-ID: abc-123\r\nOpenAI-Processing-Ms: 42\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
            .to_vec(),
    )];
    // Chunks that cut events at awkward places, including mid-"data:".
    for piece in body.chunks(37) {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(piece);
        chunk.extend_from_slice(b"\r\n");
        script.push(Step::Write(chunk));
        script.push(Step::Sleep(ms(1)));
    }
    script.push(Step::Write(b"0\r\nX-Checksum: 1234\r\n\r\n".to_vec()));
    (script, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_headers_and_trailers_pass_unchanged() {
    let (script, fixture) = recorded_response();
    let backend = ScriptedBackend::start(script).await;
    let proxy = Proxy::start(&backend.url(), "").await;
    let request_body =
        br#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = |host: &str| {
        let mut r = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nX-Tenant-ID: acme\r\nTE: trailers\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            request_body.len()
        )
        .into_bytes();
        r.extend_from_slice(request_body);
        r
    };
    let direct = raw_exchange(backend.addr, &request("backend")).await;
    let proxied = raw_exchange(proxy.addr, &request("proxy")).await;
    let (direct_head, direct_body, direct_trailers) = parse_raw_response(&direct);
    let (proxied_head, proxied_body, proxied_trailers) = parse_raw_response(&proxied);
    assert_eq!(direct_body, fixture);
    assert_eq!(proxied_body, direct_body, "body bytes differ");
    // Trailers arrive intact; hyper writes trailer names in lower case (names are
    // case-insensitive in HTTP, and unlike headers hyper keeps no case map for them).
    let lower = |t: &[String]| t.iter().map(|l| l.to_ascii_lowercase()).collect::<Vec<_>>();
    assert_eq!(lower(&proxied_trailers), lower(&direct_trailers));
    assert_eq!(lower(&proxied_trailers), ["x-checksum: 1234"]);
    // Same header lines, case preserved; only hop-by-hop framing is the proxy's own.
    let end_to_end = |head: &[String]| -> Vec<String> {
        head.iter()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                !l.starts_with("transfer-encoding:") && !l.starts_with("connection:")
            })
            .cloned()
            .collect()
    };
    assert_eq!(end_to_end(&proxied_head), end_to_end(&direct_head));
    assert!(
        !proxied_head
            .iter()
            .any(|l| l.to_ascii_lowercase().starts_with("date:")),
        "tokentap must not add Date: {proxied_head:?}"
    );

    // The request reached the upstream unchanged apart from hop-by-hop headers and Host.
    let seen = backend.requests.lock().unwrap().clone();
    let upstream_request = String::from_utf8_lossy(&seen[1]).into_owned();
    assert!(upstream_request.ends_with(std::str::from_utf8(request_body).unwrap()));
    assert!(
        upstream_request.contains("X-Tenant-ID: acme"),
        "{upstream_request}"
    );
    assert!(!upstream_request.contains("stream_options"));
    assert!(!upstream_request
        .to_ascii_lowercase()
        .contains("connection: close"));

    let m = proxy
        .wait_metrics("the stream", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    let labels = [("model", "gpt-4o-mini"), ("tenant", "acme")];
    assert_eq!(m.sum("tokentap_requests_total", &labels), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_client_reaches_an_http1_upstream() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let h2: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let response = h2
        .request(chat(&proxy.url(CHAT), "llama-3-8b", "h2", true, true))
        .await
        .expect("h2c request");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), http::Version::HTTP_2);
    let body = body_bytes(response).await;
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let m = proxy
        .wait_metrics("the h2 stream", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_output_tokens_total", &[("tenant", "h2")]),
        40.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_is_cancelled_and_closes_the_upstream_stream() {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(10), ms(20), 10_000)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", true, false))
        .await
        .unwrap();
    let mut body = response.into_body();
    for _ in 0..3 {
        body.frame().await.expect("a frame").expect("ok frame");
    }
    assert_eq!(sim.open_streams(), 1);
    drop(body);
    let m = proxy
        .wait_metrics("the cancellation", |m| {
            m.sum("tokentap_requests_total", &[("outcome", "cancelled")]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0);
    assert_eq!(m.sum("tokentap_streams_in_flight", &[]), 0.0);
    // The upstream side is closed too, not left streaming into a pooled connection.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while sim.open_streams() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "upstream stream left open"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_mid_stream_is_an_upstream_error() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let mut request = chat(&proxy.url(CHAT), "llama-3-8b", "t", true, false);
    request
        .headers_mut()
        .insert("x-sim-fault", "reset-after=5".parse().unwrap());
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Count the tokens the client received before the break.
    let mut body = response.into_body();
    let mut received = String::new();
    let broke = loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    received.push_str(&String::from_utf8_lossy(data));
                }
            }
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert!(
        broke,
        "the client must see the stream break, as it would directly"
    );
    let client_tokens = received.matches("\"content\":\" ").count() as f64;
    assert!(client_tokens >= 1.0, "{received}");
    let m = proxy
        .wait_metrics("the upstream error", |m| {
            m.sum("tokentap_requests_total", &[("outcome", "upstream_error")]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0);
    // Exactly the tokens that reached the client were measured.
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), client_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_event_after_200_is_an_upstream_error() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let mut request = chat(&proxy.url(CHAT), "llama-3-8b", "t", true, false);
    request
        .headers_mut()
        .insert("x-sim-fault", "error-after=3".parse().unwrap());
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_bytes(response).await;
    assert!(String::from_utf8_lossy(&body).contains("simulated engine failure"));
    proxy
        .wait_metrics("the error outcome", |m| {
            m.sum("tokentap_requests_total", &[("outcome", "upstream_error")]) == 1.0
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_stream_times_out() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "upstream:\n  idle_timeout: 300ms\n").await;
    let mut request = chat(&proxy.url(CHAT), "llama-3-8b", "t", true, false);
    request
        .headers_mut()
        .insert("x-sim-fault", "stall-after=3".parse().unwrap());
    let response = client().request(request).await.unwrap();
    assert!(response.into_body().collect().await.is_err());
    let m = proxy
        .wait_metrics("the timeout", |m| {
            m.sum("tokentap_requests_total", &[("outcome", "timeout")]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_gives_502_and_is_counted() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let proxy = Proxy::start(&format!("http://127.0.0.1:{port}"), "").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let text = body_text(response).await;
    assert!(
        text.starts_with("tokentap: cannot connect to upstream"),
        "{text}"
    );
    let models = proxy.get("/v1/models").await;
    assert_eq!(models.status(), StatusCode::BAD_GATEWAY);
    // The upstream never read the body, so the model could not be learnt from it.
    let m = proxy.metrics().await;
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[
                ("outcome", "upstream_error"),
                ("model", "unknown"),
                ("tenant", "t")
            ]
        ),
        1.0
    );
    // Readiness reports the upstream as unreachable.
    let ready = client()
        .request(
            Request::get(format!("http://{}/readyz", proxy.admin))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_response_head_gives_504() {
    let backend = ScriptedBackend::start(vec![Step::Sleep(Duration::from_secs(5))]).await;
    let proxy = Proxy::start(
        &backend.url(),
        "upstream:\n  response_head_timeout: 200ms\n",
    )
    .await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", true, false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    let m = proxy.metrics().await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "timeout")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_llm_routes_and_error_statuses_pass_through() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "").await;

    let direct = body_bytes(
        client()
            .request(
                Request::get(format!("{}/v1/models", sim.url()))
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap(),
    )
    .await;
    let models = proxy.get("/v1/models").await;
    assert_eq!(models.status(), StatusCode::OK);
    assert_eq!(body_bytes(models).await, direct);
    assert_eq!(proxy.get("/health").await.status(), StatusCode::OK);
    assert_eq!(
        proxy.get("/no/such/path").await.status(),
        StatusCode::NOT_FOUND
    );

    for (status, outcome) in [(429u16, "upstream_refused"), (503, "upstream_error")] {
        let mut request = chat(
            &proxy.url(CHAT),
            "llama-3-8b",
            &format!("s{status}"),
            true,
            false,
        );
        request
            .headers_mut()
            .insert("x-sim-fault", format!("status={status}").parse().unwrap());
        let response = client().request(request).await.unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(response.headers()["retry-after"], "7");
        let body = body_text(response).await;
        assert!(body.contains("simulated failure"));
        let tenant = format!("s{status}");
        proxy
            .wait_metrics("the error status", |m| {
                m.sum(
                    "tokentap_requests_total",
                    &[("tenant", tenant.as_str()), ("outcome", outcome)],
                ) == 1.0
            })
            .await;
    }
    let m = proxy.metrics().await;
    assert_eq!(m.sum("tokentap_passthrough_requests_total", &[]), 3.0);
    assert_eq!(m.sum("tokentap_requests_total", &[]), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_response_records_usage_and_duration() {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(30), ms(1), 25)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", false, false))
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    let labels = [("model", "m"), ("tenant", "t")];
    // The families that are per model by default (`labels.tenant.families`).
    let model = &labels[..1];
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_output_tokens_total", &labels), 25.0);
    assert_eq!(
        m.sum("tokentap_input_tokens_total", &labels),
        body["usage"]["prompt_tokens"].as_f64().unwrap()
    );
    assert_eq!(m.sum("tokentap_request_duration_seconds_count", model), 1.0);
    assert_eq!(
        m.sum("tokentap_time_to_first_byte_seconds_count", model),
        1.0
    );
    // No token events in a non-streamed body: no TTFT is invented.
    assert_eq!(
        m.sum("tokentap_time_to_first_token_seconds_count", &labels),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_falls_back_to_the_response_and_tenant_to_an_api_key_hash() {
    let sim = SimHandle::start(scripted_sim()).await;
    // Config holds only the key's SHA-256, never the key.
    let real_hash = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"sk-test-key"))
    };
    let yaml = format!("tenants:\n  sources:\n    - header: x-tenant-id\n    - api_keys:\n        {real_hash}: keyed-team\n");
    let proxy = Proxy::start(&sim.url(), &yaml).await;
    // No `model` in the request: the simulator answers with its default model.
    let request = Request::post(proxy.url(CHAT))
        .header("authorization", "Bearer sk-test-key")
        .body(Full::new(Bytes::from_static(
            br#"{"stream":true,"messages":[]}"#,
        )))
        .unwrap();
    body_bytes(client().request(request).await.unwrap()).await;
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum(
            "tokentap_requests_total",
            &[("model", "llama-3-8b"), ("tenant", "keyed-team")]
        ),
        1.0,
        "{}",
        m.text
    );
    assert!(!m.text.contains("sk-test-key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_values_are_capped() {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(1), ms(1), 2)],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "labels:\n  tenant:\n    max_values: 2\n").await;
    for tenant in ["a", "b", "c", "d", "a"] {
        body_bytes(
            client()
                .request(chat(&proxy.url(CHAT), "m", tenant, true, false))
                .await
                .unwrap(),
        )
        .await;
    }
    let m = proxy
        .wait_metrics("5 requests", |m| {
            m.sum("tokentap_requests_total", &[]) >= 5.0
        })
        .await;
    assert_eq!(m.sum("tokentap_requests_total", &[("tenant", "a")]), 2.0);
    assert_eq!(m.sum("tokentap_requests_total", &[("tenant", "b")]), 1.0);
    assert_eq!(
        m.sum("tokentap_requests_total", &[("tenant", "other")]),
        2.0
    );
    assert_eq!(
        m.sum("tokentap_label_overflow_total", &[("label", "tenant")]),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_in_flight_streams_finish() {
    let sim = SimHandle::start(scripted_sim()).await;
    let mut proxy = Proxy::start(&sim.url(), "shutdown:\n  drain_timeout: 10s\n").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "llama-3-8b", "t", true, true))
        .await
        .unwrap();
    let mut body = response.into_body();
    body.frame().await.expect("first frame").expect("ok");
    proxy.shutdown();
    // The stream still completes in full after the shutdown request.
    let rest = body
        .collect()
        .await
        .expect("the stream completes")
        .to_bytes();
    assert!(rest.ends_with(b"data: [DONE]\n\n"));
    let result = tokio::time::timeout(Duration::from_secs(10), proxy.task.take().unwrap())
        .await
        .expect("server exits after draining")
        .expect("server task");
    assert!(result.is_ok());
    // The listener is closed.
    assert!(tokio::net::TcpStream::connect(proxy.addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "upstream:\n  probe_interval: 50ms\n").await;
    let get = |path: &str| {
        client().request(
            Request::get(format!("http://{}{path}", proxy.admin))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
    };
    assert_eq!(get("/healthz").await.unwrap().status(), StatusCode::OK);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while get("/readyz").await.unwrap().status() != StatusCode::OK {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(ms(20)).await;
    }
    let metrics = get("/metrics").await.unwrap();
    assert!(metrics.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let m = Metrics::parse(&body_text(metrics).await);
    assert_eq!(m.sum("tokentap_upstream_up", &[]), 1.0);
    assert_eq!(m.sum("tokentap_build_info", &[]), 1.0);
    assert_eq!(get("/nope").await.unwrap().status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_usage_gives_exact_per_event_counts() {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new("m", ms(5), ms(2), 12)],
        usage: UsageMode::Continuous,
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), "").await;
    body_bytes(
        client()
            .request(chat(&proxy.url(CHAT), "m", "t", true, false))
            .await
            .unwrap(),
    )
    .await;
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 12.0);
    assert_eq!(
        m.sum("tokentap_event_tokens_total", &[("accuracy", "exact")]),
        12.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_upstream_by_option() {
    let sim = SimHandle::start(scripted_sim()).await;
    let proxy = Proxy::start(&sim.url(), "upstream:\n  http2: true\n").await;
    // An HTTP/1.1 client in, HTTP/2 prior knowledge out.
    let response = client()
        .request(chat(&proxy.url(CHAT), "llama-3-8b", "t", true, true))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), http::Version::HTTP_11);
    let body = body_bytes(response).await;
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let m = proxy
        .wait_metrics("the request", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 40.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_right_after_done_is_completed() {
    let event = |data: &str| {
        let payload = format!("data: {data}\n\n");
        format!("{:x}\r\n{payload}\r\n", payload.len()).into_bytes()
    };
    let backend = ScriptedBackend::start(vec![
        Step::Write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec(),
        ),
        Step::Write(event(r#"{"model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}"#)),
        Step::Write(event("[DONE]")),
        // The final zero-length chunk comes late: the client leaves before it.
        Step::Sleep(Duration::from_secs(3)),
        Step::Write(b"0\r\n\r\n".to_vec()),
    ])
    .await;
    let proxy = Proxy::start(&backend.url(), "").await;
    let response = client()
        .request(chat(&proxy.url(CHAT), "m", "t", true, false))
        .await
        .unwrap();
    let mut body = response.into_body();
    let mut seen = String::new();
    while !seen.contains("[DONE]") {
        let frame = body.frame().await.expect("frame").expect("ok");
        seen.push_str(&String::from_utf8_lossy(frame.data_ref().unwrap()));
    }
    drop(body);
    let m = proxy
        .wait_metrics("the outcome", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        1.0,
        "{}",
        m.text
    );
}

/// A keep-alive HTTP/1.1 backend that counts the connections that carried a request (the
/// readiness probe's bare connects are not counted). It answers a
/// POST with a chunked SSE stream and anything else with a `Content-Length` body, and
/// closes a connection that has been idle for `idle_close`.
struct KeepAliveBackend {
    url: String,
    /// Connections that carried at least one request.
    used: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Connections that tokentap closed.
    closed_by_peer: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

async fn keep_alive_backend(idle_close: Duration) -> KeepAliveBackend {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let used = std::sync::Arc::new(AtomicUsize::new(0));
    let closed_by_peer = std::sync::Arc::new(AtomicUsize::new(0));
    let (counter, closed) = (used.clone(), closed_by_peer.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (counter, closed) = (counter.clone(), closed.clone());
            tokio::spawn(async move {
                let mut first = true;
                let mut buf = Vec::new();
                loop {
                    let length =
                        match tokio::time::timeout(idle_close, read_request(&mut stream, &mut buf))
                            .await
                        {
                            Ok(Some(length)) => length,
                            Ok(None) => {
                                // Closed by tokentap between requests (not before the first).
                                if !first && buf.is_empty() {
                                    closed.fetch_add(1, Ordering::SeqCst);
                                }
                                return;
                            }
                            Err(_) => return, // idle for too long: close
                        };
                    if std::mem::take(&mut first) {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    let is_post = buf.starts_with(b"POST");
                    buf.drain(..length);
                    let response: &[u8] = if is_post {
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                          transfer-encoding: chunked\r\n\r\n\
                          67\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"model\":\"m\",\"object\":\"chat.completion.chunk\"}\n\n\r\n\
                          e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                          content-length: 11\r\n\r\n{\"data\":[]}"
                    };
                    if stream.write_all(response).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    KeepAliveBackend {
        url: format!("http://{addr}"),
        used,
        closed_by_peer,
    }
}

/// Upstream connections are kept alive and reused, streamed (chunked) responses and
/// `Content-Length` ones alike; concurrent requests each get their own. Each of the
/// proxy's two workers keeps its own idle connections, so up to two serve sequential
/// requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused() {
    use std::sync::atomic::Ordering;
    let backend = keep_alive_backend(Duration::from_secs(30)).await;
    let accepted = backend.used.clone();
    let proxy = Proxy::start(&backend.url, "").await;
    for i in 0..6 {
        let response = if i % 2 == 0 {
            proxy.get("/v1/models").await
        } else {
            client()
                .request(chat(&proxy.url(CHAT), "m", "t", true, false))
                .await
                .unwrap()
        };
        assert_eq!(response.status(), StatusCode::OK);
        let body = body_bytes(response).await;
        assert!(!body.is_empty());
    }
    let opened = accepted.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&opened),
        "6 sequential requests opened {opened} connections, not one per worker"
    );

    for _round in 0..3 {
        let requests =
            (0..8).map(|_| client().request(chat(&proxy.url(CHAT), "m", "t", true, false)));
        for response in futures_util::future::join_all(requests).await {
            let response = response.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            assert!(find(&body_bytes(response).await, b"[DONE]").is_some());
        }
    }
    let opened = accepted.load(Ordering::SeqCst);
    // Without reuse it would be 24 more; a worker never needs more than 8 plus the one
    // it kept from the sequential requests.
    assert!(
        (2..=18).contains(&opened),
        "3 rounds of 8 concurrent requests opened {opened} connections"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        27.0
    );
}

/// A pooled connection the upstream closed while it sat idle is not used for the next
/// request: that request goes out on a fresh connection and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_closed_by_the_upstream_is_replaced() {
    use std::sync::atomic::Ordering;
    let backend = keep_alive_backend(ms(100)).await;
    let accepted = backend.used.clone();
    let proxy = Proxy::start(&backend.url, "").await;
    for round in 1..=3 {
        let response = client()
            .request(chat(&proxy.url(CHAT), "m", "t", true, false))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "round {round}");
        assert!(find(&body_bytes(response).await, b"[DONE]").is_some());
        assert_eq!(accepted.load(Ordering::SeqCst), round);
        // Longer than the upstream keeps an idle connection.
        tokio::time::sleep(ms(300)).await;
    }
    let m = proxy.metrics().await;
    assert_eq!(m.sum("tokentap_requests_total", &[]), 3.0);
    assert_eq!(
        m.sum("tokentap_requests_total", &[("outcome", "completed")]),
        3.0
    );
}

/// A keep-alive HTTP/1.1 backend that answers requests in rounds: it holds each request
/// until `round` of them have arrived, so that a round of concurrent requests needs that
/// many upstream connections, and counts the connections that carried a request and
/// those of them still open.
struct RoundsBackend {
    url: String,
    /// Connections that carried at least one request.
    opened: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Of those, the ones tokentap has not closed.
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

async fn rounds_backend(round: usize) -> RoundsBackend {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opened = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let (arrived, _) = tokio::sync::watch::channel(0usize);
    let arrived = Arc::new(arrived);
    let (opened_count, open_count) = (opened.clone(), open.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (opened, open, arrived) =
                (opened_count.clone(), open_count.clone(), arrived.clone());
            tokio::spawn(async move {
                let mut first = true;
                let mut buf = Vec::new();
                while let Some(length) = read_request(&mut stream, &mut buf).await {
                    buf.drain(..length);
                    if std::mem::take(&mut first) {
                        opened.fetch_add(1, Ordering::SeqCst);
                        open.fetch_add(1, Ordering::SeqCst);
                    }
                    let mut this_one = 0;
                    arrived.send_modify(|count| {
                        *count += 1;
                        this_one = *count;
                    });
                    let round_end = this_one.div_ceil(round) * round;
                    let mut all_here = arrived.subscribe();
                    let _ = all_here.wait_for(|count| *count >= round_end).await;
                    let response = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                     content-length: 11\r\n\r\n{\"data\":[]}";
                    if stream.write_all(response).await.is_err() {
                        break;
                    }
                }
                if !first {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
    });
    RoundsBackend {
        url: format!("http://{addr}"),
        opened,
        open,
    }
}

/// `upstream.pool_max_idle_per_host` means the same on both paths: the idle connections
/// to the upstream in the whole process. With a cap of 2 and two workers, a round of 6
/// concurrent requests opens 6 upstream connections; once it ends, tokentap keeps 2 of
/// them open (one per worker), and the next round reuses both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_paths_keep_pool_max_idle_per_host_idle_connections_in_all() {
    use std::sync::atomic::Ordering;
    for fast_path in [true, false] {
        let backend = rounds_backend(6).await;
        let yaml = format!(
            "upstream:\n  pool_max_idle_per_host: 2\nproxy:\n  http1_fast_path: {fast_path}\n"
        );
        let proxy = Proxy::start(&backend.url, &yaml).await;
        for round in 1..=2 {
            // A client of its own per round: 6 new client connections, 3 per worker.
            let client = client();
            let requests = (0..6).map(|_| client.get(proxy.url("/v1/models").parse().unwrap()));
            for response in futures_util::future::join_all(requests).await {
                let response = response.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                assert_eq!(&body_bytes(response).await[..], b"{\"data\":[]}");
            }
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while backend.open.load(Ordering::SeqCst) != 2 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "fast path {fast_path}, round {round}: {} upstream connections left open \
                     with pool_max_idle_per_host: 2",
                    backend.open.load(Ordering::SeqCst)
                );
                tokio::time::sleep(ms(10)).await;
            }
        }
        assert_eq!(
            backend.opened.load(Ordering::SeqCst),
            6 + 4,
            "fast path {fast_path}: the second round did not reuse the 2 kept connections"
        );
    }
}

/// An idle pooled connection is closed once it is older than `pool_idle_timeout`, even
/// when no request comes to notice it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pooled_connections_are_closed_after_the_pool_idle_timeout() {
    use std::sync::atomic::Ordering;
    let backend = keep_alive_backend(Duration::from_secs(30)).await;
    let proxy = Proxy::start(&backend.url, "upstream: {pool_idle_timeout: 200ms}").await;
    let response = proxy.get("/v1/models").await;
    assert_eq!(response.status(), StatusCode::OK);
    body_bytes(response).await;
    assert_eq!(backend.closed_by_peer.load(Ordering::SeqCst), 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while backend.closed_by_peer.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle connection is still open 5 s after a 200 ms pool_idle_timeout"
        );
        tokio::time::sleep(ms(20)).await;
    }
}
