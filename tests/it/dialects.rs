//! Every dialect end to end: the simulator streams it with known timing, tokentap sits in
//! front, and the figures scraped from tokentap's `/metrics` must match the truth.
//!
//! Each test binds the simulator and tokentap on `127.0.0.1:0` in-process (addresses are
//! known before anything is sent, so nothing sleeps to wait for a server) and polls
//! `/metrics` with a deadline until the requests are recorded.
//!
//! Timing tolerance. The simulator sends token `i` at the absolute deadline
//! `t0 + TTFT + i * ITL`, and tokio timers never fire early, so every event arrives at
//! its deadline plus a lateness `l_i` in `[0, L]` (timer granularity, scheduling on a
//! 2-core machine with other tests running, the proxy hop). Hence the measured TTFT is in
//! `[TTFT, TTFT + L]`, and a request's mean ITL is `ITL + (l_E - l_1) / (N - 1)`, within
//! `L / (N - 1)` of the truth: the error shrinks with the stream's length. With `L` = 40 ms
//! (an order of magnitude above what is seen here) and N = 20 that is ±2.1 ms on 10 ms.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokentap::config::{Config, Overrides};
use tokentap::Server;
use tokentap_sim::{ModelProfile, Sim, SimConfig, UsageMode};
use tokio::sync::watch;

const TTFT: Duration = Duration::from_millis(50);
const ITL: Duration = Duration::from_millis(10);
const N: u64 = 20;
/// Bound on how late an event may arrive (see the module docs).
const LATENESS: Duration = Duration::from_millis(40);
const MODEL: &str = "sim-model";

/// One dialect's request: where to send it and what to send.
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    path: &'static str,
    body: &'static str,
    /// Whether the dialect reports input tokens.
    reports_input: bool,
    /// Whether the stream reports its output tokens (N) at the end.
    reports_output: bool,
    /// Whether per-event counts are exact (one token per event, or usage growth).
    exact: bool,
}

const STREAMED: &[Case] = &[
    Case {
        name: "openai_chat",
        path: "/v1/chat/completions",
        body: r#"{"model":"sim-model","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Why is the sky blue?"}]}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "openai_completions",
        path: "/v1/completions",
        body: r#"{"model":"sim-model","stream":true,"stream_options":{"include_usage":true},"prompt":"Why is the sky blue?"}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "openai_responses",
        path: "/v1/responses",
        body: r#"{"model":"sim-model","stream":true,"input":"Why is the sky blue?"}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "anthropic",
        path: "/v1/messages",
        body: r#"{"model":"sim-model","stream":true,"max_tokens":1024,"messages":[{"role":"user","content":"Why is the sky blue?"}]}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "gemini_sse",
        path: "/v1beta/models/sim-model:streamGenerateContent?alt=sse",
        body: r#"{"contents":[{"role":"user","parts":[{"text":"Why is the sky blue?"}]}]}"#,
        reports_input: true,
        reports_output: true,
        exact: true,
    },
    Case {
        name: "gemini_json_array",
        path: "/v1beta/models/sim-model:streamGenerateContent",
        body: r#"{"contents":[{"role":"user","parts":[{"text":"Why is the sky blue?"}]}]}"#,
        reports_input: true,
        reports_output: true,
        exact: true,
    },
    Case {
        name: "ollama_chat",
        path: "/api/chat",
        body: r#"{"model":"sim-model","messages":[{"role":"user","content":"Why is the sky blue?"}]}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "ollama_generate",
        path: "/api/generate",
        body: r#"{"model":"sim-model","prompt":"Why is the sky blue?"}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "tgi",
        path: "/generate_stream",
        body: r#"{"inputs":"Why is the sky blue?","parameters":{"max_new_tokens":100,"details":true}}"#,
        reports_input: true,
        reports_output: true,
        exact: true,
    },
    Case {
        name: "triton",
        path: "/v2/models/sim-model/generate_stream",
        body: r#"{"text_input":"Why is the sky blue?","max_tokens":100,"stream":true}"#,
        reports_input: false,
        reports_output: false,
        exact: false,
    },
];

/// The non-streaming form of each dialect.
const WHOLE: &[Case] = &[
    Case {
        name: "openai_chat",
        path: "/v1/chat/completions",
        body: r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "openai_responses",
        path: "/v1/responses",
        body: r#"{"model":"sim-model","input":"hi"}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "anthropic",
        path: "/v1/messages",
        body: r#"{"model":"sim-model","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "gemini",
        path: "/v1beta/models/sim-model:generateContent",
        body: r#"{"contents":[{"parts":[{"text":"hi"}]}]}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "ollama",
        path: "/api/chat",
        body: r#"{"model":"sim-model","stream":false,"messages":[{"role":"user","content":"hi"}]}"#,
        reports_input: true,
        reports_output: true,
        exact: false,
    },
    Case {
        name: "tgi",
        path: "/generate",
        body: r#"{"inputs":"hi"}"#,
        reports_input: false,
        reports_output: true,
        exact: false,
    },
];

/// What the simulator reports as input tokens for a request body.
fn prompt_tokens(body: &str) -> u64 {
    (body.len() as u64 / 4).max(1)
}

// ---- harness: simulator + tokentap in-process, a client, a /metrics scraper ----

struct Stack {
    sim: SocketAddr,
    proxy: SocketAddr,
    admin: SocketAddr,
    _stop: watch::Sender<bool>,
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn stack() -> Stack {
    let config = SimConfig {
        models: vec![ModelProfile::new(MODEL, TTFT, ITL, N as u32)],
        usage: UsageMode::Requested,
        fixed_clock: Some(1_750_000_000),
        compress: true,
        ..SimConfig::default()
    };
    let sim = Sim::bind("127.0.0.1:0".parse().expect("addr"), config)
        .await
        .expect("bind sim");
    let sim_addr = sim.local_addr();
    let (stop, rx) = watch::channel(false);
    tokio::spawn(sim.run(stopped(rx.clone())));
    let overrides = Overrides {
        upstream: Some(format!("http://{sim_addr}")),
        listen: Some("127.0.0.1:0".into()),
        admin: Some("127.0.0.1:0".into()),
        ui_listen: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    let mut config = Config::from_overrides(&overrides).expect("config");
    crate::common::fast_path_from_env(&mut config, "");
    let server = Server::bind(config).await.expect("bind tokentap");
    let (proxy, admin) = (server.proxy_addr(), server.admin_addr());
    tokio::spawn(server.run(stopped(rx)));
    Stack {
        sim: sim_addr,
        proxy,
        admin,
        _stop: stop,
    }
}

/// Send a request and read the whole response: status, content-encoding, body bytes.
async fn send(
    to: SocketAddr,
    case: &Case,
    headers: &[(&str, &str)],
) -> (StatusCode, Option<String>, Bytes) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::post(format!("http://{to}{}", case.path))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from_static(case.body.as_bytes())))
        .expect("request");
    let response = client.request(request).await.expect("response");
    let status = response.status();
    let encoding = response
        .headers()
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = crate::common::body_bytes(response).await;
    (status, encoding, body)
}

/// One sample: metric name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parsed Prometheus text exposition.
struct Scrape {
    text: String,
    samples: Vec<Sample>,
}

impl Scrape {
    fn parse(text: String) -> Scrape {
        let mut samples = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let labels = rest
                        .trim_end_matches('}')
                        .split("\",")
                        .filter_map(|pair| pair.split_once("=\""))
                        .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
                        .collect();
                    (name, labels)
                }
                None => (series, Vec::new()),
            };
            samples.push((name.to_string(), labels, value));
        }
        Scrape { text, samples }
    }

    /// Sum of every series of `name` that has all of `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}

async fn scrape(admin: SocketAddr) -> Scrape {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::get(format!("http://{admin}/metrics"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = client.request(request).await.expect("scrape");
    let body = crate::common::body_bytes(response).await;
    Scrape::parse(String::from_utf8_lossy(&body).into_owned())
}

/// Poll `/metrics` until `done` holds; panics after 10 s with the last scrape.
async fn wait_for(admin: SocketAddr, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = scrape(admin).await;
        if done(&scrape) {
            return scrape;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; last scrape:\n{}",
            scrape.text
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn requests(scrape: &Scrape, outcome: &str) -> f64 {
    scrape.sum("tokentap_requests_total", &[("outcome", outcome)])
}

fn mean(scrape: &Scrape, histogram: &str) -> Duration {
    let sum = scrape.sum(&format!("{histogram}_sum"), &[]);
    let count = scrape.sum(&format!("{histogram}_count"), &[]);
    assert!(count > 0.0, "{histogram}: no observations\n{}", scrape.text);
    Duration::try_from_secs_f64(sum / count).expect("a mean of durations")
}

/// Drive `REQUESTS` streamed requests of one dialect through tokentap and check every
/// figure against the simulator's truth.
async fn streamed(case: &Case, accept_encoding: Option<&str>) {
    const REQUESTS: u64 = 2;
    let stack = stack().await;
    let headers: Vec<(&str, &str)> = accept_encoding
        .map(|e| vec![("accept-encoding", e)])
        .unwrap_or_default();
    for _ in 0..REQUESTS {
        let (status, encoding, body) = send(stack.proxy, case, &headers).await;
        assert_eq!(status, StatusCode::OK, "{}", case.name);
        assert_eq!(encoding.as_deref(), accept_encoding, "{}", case.name);
        assert!(!body.is_empty());
    }
    let m = wait_for(stack.admin, "requests recorded", |m| {
        requests(m, "completed") >= REQUESTS as f64
    })
    .await;
    let name = case.name;
    assert_eq!(requests(&m, "completed"), REQUESTS as f64, "{name}");
    assert_eq!(
        m.sum("tokentap_output_tokens_total", &[]),
        (REQUESTS * N) as f64,
        "{name}: output tokens"
    );
    let accuracy = match (case.exact, case.reports_output) {
        (true, _) => "exact",
        (false, true) => "apportioned",
        (false, false) => "estimated",
    };
    assert_eq!(
        m.sum("tokentap_event_tokens_total", &[("accuracy", accuracy)]),
        (REQUESTS * N) as f64,
        "{name}: per-event counts are all {accuracy}"
    );
    let input = if case.reports_input {
        REQUESTS * prompt_tokens(case.body)
    } else {
        0
    };
    assert_eq!(
        m.sum("tokentap_input_tokens_total", &[]),
        input as f64,
        "{name}: input tokens"
    );
    assert_eq!(
        m.sum("tokentap_unobserved_responses_total", &[]),
        0.0,
        "{name}: every response observed"
    );

    let ttft = mean(&m, "tokentap_time_to_first_token_seconds");
    assert!(
        ttft >= TTFT && ttft <= TTFT + LATENESS,
        "{name}: mean TTFT {ttft:?} not in [{TTFT:?}, {:?}]",
        TTFT + LATENESS
    );
    assert_eq!(
        m.sum("tokentap_time_to_first_content_token_seconds_count", &[]),
        REQUESTS as f64,
        "{name}: every stream had visible content"
    );
    // Every event carries one token: N - 1 gaps per request.
    assert_eq!(
        m.sum("tokentap_inter_token_latency_seconds_count", &[]),
        (REQUESTS * (N - 1)) as f64,
        "{name}: ITL observations"
    );
    let itl = mean(&m, "tokentap_inter_token_latency_seconds");
    let tolerance = LATENESS / (N as u32 - 1);
    assert!(
        itl.max(ITL) - itl.min(ITL) <= tolerance,
        "{name}: mean ITL {itl:?} not within {tolerance:?} of {ITL:?}"
    );
}

macro_rules! streamed_tests {
    ($($test:ident => $index:expr, $encoding:expr;)*) => {$(
        #[tokio::test]
        async fn $test() {
            streamed(&STREAMED[$index], $encoding).await;
        }
    )*};
}

streamed_tests! {
    openai_chat_streamed => 0, None;
    openai_completions_streamed => 1, None;
    openai_responses_streamed => 2, None;
    anthropic_streamed => 3, None;
    gemini_sse_streamed => 4, None;
    gemini_json_array_streamed => 5, None;
    ollama_chat_streamed => 6, None;
    ollama_generate_streamed => 7, None;
    tgi_streamed => 8, None;
    triton_streamed => 9, None;
    anthropic_streamed_gzip => 3, Some("gzip");
    ollama_chat_streamed_zstd => 6, Some("zstd");
    gemini_json_array_streamed_gzip => 5, Some("gzip");
}

#[test]
fn every_dialect_has_a_streamed_test() {
    for name in [
        "openai_chat",
        "openai_completions",
        "openai_responses",
        "anthropic",
        "gemini_sse",
        "gemini_json_array",
        "ollama_chat",
        "ollama_generate",
        "tgi",
        "triton",
    ] {
        assert!(STREAMED.iter().any(|c| c.name == name), "{name}");
    }
}

/// The proxied bytes are exactly what the simulator sends to a direct client, for every
/// dialect, compressed or not.
#[tokio::test]
async fn responses_pass_through_byte_for_byte() {
    let stack = stack().await;
    let checks = STREAMED.iter().chain(WHOLE).flat_map(|case| {
        [None, Some("gzip"), Some("zstd")].map(|encoding| async move {
            let headers: Vec<(&str, &str)> = encoding
                .map(|e| vec![("accept-encoding", e)])
                .unwrap_or_default();
            let (direct, proxied) = tokio::join!(
                send(stack.sim, case, &headers),
                send(stack.proxy, case, &headers)
            );
            assert_eq!(direct.0, proxied.0, "{} {encoding:?}: status", case.name);
            assert_eq!(direct.1, proxied.1, "{} {encoding:?}: encoding", case.name);
            assert_eq!(direct.2, proxied.2, "{} {encoding:?}: body", case.name);
        })
    });
    futures_util::future::join_all(checks).await;
}

/// Non-streaming answers: completed, N and input tokens from the body's usage.
#[tokio::test]
async fn whole_responses_report_usage() {
    let stack = stack().await;
    for case in WHOLE {
        let (status, _, _) = send(stack.proxy, case, &[]).await;
        assert_eq!(status, StatusCode::OK, "{}", case.name);
    }
    let total = WHOLE.len() as f64;
    let m = wait_for(stack.admin, "requests recorded", |m| {
        requests(m, "completed") >= total
    })
    .await;
    assert_eq!(requests(&m, "completed"), total);
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), total * N as f64);
    let input: u64 = WHOLE
        .iter()
        .filter(|c| c.reports_input)
        .map(|c| prompt_tokens(c.body))
        .sum();
    assert_eq!(m.sum("tokentap_input_tokens_total", &[]), input as f64);
    assert_eq!(m.sum("tokentap_unobserved_responses_total", &[]), 0.0);
}

/// An error reported inside a 200 stream is an upstream error, in every dialect.
#[tokio::test]
async fn errors_mid_stream_are_upstream_errors() {
    let stack = stack().await;
    for case in STREAMED {
        let (status, _, body) = send(stack.proxy, case, &[("x-sim-fault", "error-after=5")]).await;
        assert_eq!(status, StatusCode::OK, "{}", case.name);
        assert!(!body.is_empty(), "{}", case.name);
    }
    let total = STREAMED.len() as f64;
    let m = wait_for(stack.admin, "errors recorded", |m| {
        requests(m, "upstream_error") + requests(m, "completed") >= total
    })
    .await;
    assert_eq!(requests(&m, "upstream_error"), total, "{}", m.text);
    assert_eq!(requests(&m, "completed"), 0.0);
    // The five tokens before the error were seen as events in every dialect.
    assert_eq!(
        m.sum("tokentap_time_to_first_token_seconds_count", &[]),
        total
    );
}
