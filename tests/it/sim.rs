//! The simulator's per-request controls and its rate limit, over HTTP: `x-sim-itl-ms`
//! slows one response's tokens, a header value the simulator cannot read is a 400 (not
//! a silently healthy stream), and `tokentap sim --rate-limit-rpm` counts its budgets
//! down in each API's headers and refuses past them with a 429 and `Retry-After`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tokentap_sim::{ModelProfile, SimConfig};

use crate::common::{self, body_text, SimHandle};

fn post(url: String, body: serde_json::Value, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn chat_body(stream: bool) -> serde_json::Value {
    serde_json::json!({"model": "sim-model", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn an_itl_header_slows_that_responses_tokens() {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new(
            "sim-model",
            Duration::ZERO,
            Duration::from_millis(1),
            4,
        )],
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", sim.url());
    let started = Instant::now();
    let response = common::client()
        .request(post(url, chat_body(true), &[("x-sim-itl-ms", "60")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_text(response).await;
    // Deadlines are absolute: the last of 4 tokens is due 3 ITLs after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(180),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(body.matches("\"content\":\" ").count(), 4, "{body}");
}

#[tokio::test]
async fn a_sim_header_it_cannot_read_is_a_400() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let cases = [
        (
            "x-sim-fault",
            "eror-after=3",
            "x-sim-fault: `eror-after=3` is not one of reset-after=N,",
        ),
        (
            "x-sim-itl-ms",
            "20ms",
            "x-sim-itl-ms: `20ms` is not a whole number of milliseconds from 0 to 600000",
        ),
    ];
    for (name, value, message) in cases {
        let url = format!("{}/v1/chat/completions", sim.url());
        let response = common::client()
            .request(post(url, chat_body(true), &[(name, value)]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{name}");
        let body: serde_json::Value = serde_json::from_str(&body_text(response).await).unwrap();
        let text = body["error"]["message"].as_str().unwrap();
        assert!(text.starts_with(message), "{text}");
    }
}

/// `tokentap sim`, killed when dropped.
struct SimProcess {
    child: Child,
    addr: SocketAddr,
}

impl SimProcess {
    fn start(args: &[&str]) -> SimProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tokentap"))
            .args(["sim", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tokentap sim");
        let stderr = child.stderr.take().unwrap();
        let (lines, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut process = SimProcess {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
        };
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the simulator's listening line");
            if let Some(at) = line.find("simulator listening") {
                let rest = &line[at..];
                let from = rest.find("127.0.0.1:").expect("an address");
                let addr: String = rest[from..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect();
                process.addr = addr.parse().expect("a socket address");
                return process;
            }
        }
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn tokentap_sim_rate_limits_hosted_apis() {
    let sim = SimProcess::start(&[
        "--ttft",
        "0ms",
        "--itl",
        "0ms",
        "--tokens",
        "3",
        "--rate-limit-rpm",
        "2",
    ]);
    let base = format!("http://{}", sim.addr);
    let client = common::client();
    let chat = || post(format!("{base}/v1/chat/completions"), chat_body(false), &[]);
    let messages = || {
        let body = serde_json::json!({"model": "sim-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        post(format!("{base}/v1/messages"), body, &[])
    };

    let first = client.request(chat()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let headers = first.headers();
    assert_eq!(headers["x-ratelimit-limit-requests"], "2");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "1");
    // Tokens default to two full-length (3-token) responses a minute.
    assert_eq!(headers["x-ratelimit-limit-tokens"], "6");
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "3");
    let reset = headers["x-ratelimit-reset-requests"].to_str().unwrap();
    assert!(reset.ends_with('s') && reset.len() > 1, "{reset}");

    let second = client.request(messages()).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    let headers = second.headers();
    assert_eq!(headers["anthropic-ratelimit-requests-limit"], "2");
    assert_eq!(headers["anthropic-ratelimit-requests-remaining"], "0");
    assert_eq!(headers["anthropic-ratelimit-tokens-remaining"], "0");
    let reset = headers["anthropic-ratelimit-requests-reset"]
        .to_str()
        .unwrap();
    assert!(reset.len() == 20 && reset.ends_with('Z'), "{reset}");

    // One token: short of requests, not of tokens (which a 3-token request would be
    // short of for as long, leaving the body's `type` to rounding).
    let mut one_token = chat_body(false);
    one_token["max_tokens"] = 1.into();
    let refused = client
        .request(post(format!("{base}/v1/chat/completions"), one_token, &[]))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    assert_eq!(refused.headers()["x-ratelimit-remaining-requests"], "0");
    let body: serde_json::Value = serde_json::from_str(&body_text(refused).await).unwrap();
    assert_eq!(body["error"]["type"], "requests");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");

    let refused = client.request(messages()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value = serde_json::from_str(&body_text(refused).await).unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");

    // Self-hosted servers' APIs have no such limit.
    let ollama = serde_json::json!({"model": "sim-model", "stream": false, "messages": []});
    let response = client
        .request(post(format!("{base}/api/chat"), ollama, &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!response
        .headers()
        .contains_key("x-ratelimit-limit-requests"));
}
