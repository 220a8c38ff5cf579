//! `tokentap demo`: the whole product in one process, with nothing to install.
//!
//! Starts the simulator with three models of different speeds, tokentap in front of it,
//! and a small traffic generator that streams chat completions as three tenants. Every
//! few seconds it prints tokentap's own view, read from a snapshot of its metric families:
//! per model and tenant, requests, TTFT and ITL p50/p99 and decode tokens/s, interpolated
//! from the histograms exactly as Prometheus' `histogram_quantile` would.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::{Config, ConfigError, Overrides};
use crate::metrics::snapshot::{HistogramSnapshot, Series, Values};
use crate::metrics::{Metrics, Snapshot};
use crate::server::{ServeError, Server};
use crate::sim::{ModelProfile, Sim, SimConfig, TokensPerEvent, UsageMode};

/// Demo settings (all have defaults that work on a fresh machine).
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// Stop after this long (`None`: until Ctrl-C).
    pub duration: Option<Duration>,
    /// Concurrent client streams.
    pub concurrency: usize,
    /// How often the summary is printed.
    pub refresh: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9464)),
            duration: None,
            concurrency: 8,
            refresh: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start the simulator: {0}")]
    Sim(std::io::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// The simulated models: a small fast one, a big slow one, and one in between. The two
/// fast ones batch tokens into events as real servers do, so their ITL is apportioned
/// from the reported usage; the slow one sends a token per event.
pub fn demo_models() -> Vec<ModelProfile> {
    let ms = Duration::from_millis;
    vec![
        ModelProfile {
            jitter: 0.3,
            tokens_per_event: TokensPerEvent::range(1, 3).unwrap_or(TokensPerEvent::ONE),
            ..ModelProfile::new("llama-3.1-8b", ms(120), ms(15), 60)
        },
        ModelProfile {
            jitter: 0.3,
            ..ModelProfile::new("qwen2.5-32b", ms(350), ms(40), 40)
        },
        ModelProfile {
            jitter: 0.3,
            tokens_per_event: TokensPerEvent::range(1, 4).unwrap_or(TokensPerEvent::ONE),
            ..ModelProfile::new("mistral-7b", ms(90), ms(12), 80)
        },
    ]
}

const TENANTS: [&str; 3] = ["team-search", "team-chat", "team-batch"];

/// Run the demo until `shutdown` resolves or the duration passes.
pub async fn run(
    options: DemoOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DemoError> {
    let sim = Sim::bind(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        SimConfig {
            models: demo_models(),
            usage: UsageMode::Requested,
            ..SimConfig::default()
        },
    )
    .await
    .map_err(DemoError::Sim)?;
    let sim_addr = sim.local_addr();
    // Stopped in order: the traffic, then tokentap, then the simulator, so that tokentap's
    // upstream probe never sees its upstream gone (and warns) during a clean exit.
    let (stop_traffic, traffic_stopped) = tokio::sync::watch::channel(false);
    let (stop_proxy, proxy_stopped) = tokio::sync::watch::channel(false);
    let (stop_sim, sim_stopped) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let sim_task = tokio::spawn(sim.run(stopped(sim_stopped)));

    let config = Config::from_overrides(&Overrides {
        upstream: Some(format!("http://{sim_addr}")),
        listen: Some(options.listen.to_string()),
        admin: Some(options.admin.to_string()),
        ..Overrides::default()
    })?;
    let server = Server::bind(config).await?;
    let proxy_addr = server.proxy_addr();
    let admin_addr = server.admin_addr();
    let metrics = server.metrics();
    let server_task = tokio::spawn(server.run(stopped(proxy_stopped)));

    println!("tokentap demo");
    println!(
        "  simulated backend  http://{sim_addr}  (models: llama-3.1-8b, qwen2.5-32b, mistral-7b)"
    );
    println!("  tokentap proxy     http://{proxy_addr}  ->  http://{sim_addr}");
    println!("  metrics            http://{admin_addr}/metrics");
    println!(
        "  try: curl -N http://{proxy_addr}/v1/chat/completions -H 'x-tenant-id: me' \\\n         -d '{{\"model\":\"llama-3.1-8b\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!("  Ctrl-C to stop.\n");

    let sent = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..options.concurrency {
        workers.push(tokio::spawn(traffic(
            proxy_addr,
            worker as u64,
            sent.clone(),
            traffic_stopped.clone(),
        )));
    }

    let deadline = options.duration.map(|d| tokio::time::Instant::now() + d);
    tokio::pin!(shutdown);
    let mut ticker = tokio::time::interval(options.refresh);
    ticker.tick().await;
    loop {
        let expired = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => break,
            () = expired => break,
            _ = ticker.tick() => print_summary(&metrics, sent.load(Ordering::Relaxed)),
        }
    }
    let _ = stop_traffic.send(true);
    for worker in workers {
        let _ = worker.await;
    }
    print_summary(&metrics, sent.load(Ordering::Relaxed));
    let _ = stop_proxy.send(true);
    let _ = server_task.await;
    let _ = stop_sim.send(true);
    let _ = sim_task.await;
    Ok(())
}

/// One client: stream requests back to back until told to stop.
async fn traffic(
    proxy: SocketAddr,
    worker: u64,
    sent: Arc<AtomicU64>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut rng = SmallRng::seed_from_u64(worker);
    let models = demo_models();
    while !*stop.borrow() {
        let model = &models[rng.gen_range(0..models.len())].name;
        let tenant = TENANTS[rng.gen_range(0..TENANTS.len())];
        let body = serde_json::json!({
            "model": model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Why does inter-token latency matter?"}],
        });
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{proxy}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-tenant-id", tenant)
            .body(Full::new(Bytes::from(body.to_string())));
        let Ok(request) = request else { return };
        match client.request(request).await {
            Ok(response) => {
                let _ = response.into_body().collect().await;
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Per (model, tenant): requests, histogram snapshots.
#[derive(Default)]
struct Row<'a> {
    requests: u64,
    ttft: Option<&'a HistogramSnapshot>,
    itl: Option<&'a HistogramSnapshot>,
    tokens_per_second: Option<&'a HistogramSnapshot>,
}

/// The `q`-quantile of a histogram the row may not have (yet).
fn quantile(histogram: Option<&HistogramSnapshot>, q: f64) -> Option<f64> {
    histogram.and_then(|h| h.quantile(q))
}

fn key<T>(series: &Series<T>) -> (String, String) {
    let label = |name| series.label(name).unwrap_or_default().to_string();
    (label("model"), label("tenant"))
}

fn summarize<'s>(snapshot: &'s Snapshot) -> BTreeMap<(String, String), Row<'s>> {
    let mut rows: BTreeMap<(String, String), Row<'s>> = BTreeMap::new();
    for family in &snapshot.families {
        match (&*family.name, &family.values) {
            ("tokentap_requests_total", Values::Counter(series)) => {
                for s in series {
                    rows.entry(key(s)).or_default().requests += s.value as u64;
                }
            }
            (name, Values::Histogram(series)) => {
                let set: fn(&mut Row<'s>, &'s HistogramSnapshot) = match name {
                    "tokentap_time_to_first_token_seconds" => |row, h| row.ttft = Some(h),
                    "tokentap_inter_token_latency_seconds" => |row, h| row.itl = Some(h),
                    "tokentap_output_tokens_per_second" => |row, h| row.tokens_per_second = Some(h),
                    _ => continue,
                };
                for s in series {
                    set(rows.entry(key(s)).or_default(), &s.value);
                }
            }
            _ => {}
        }
    }
    rows
}

fn print_summary(metrics: &Metrics, sent: u64) {
    let snapshot = metrics.snapshot();
    let rows = summarize(&snapshot);
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}", v * 1e3));
    let mut out = String::new();
    if std::io::stdout().is_terminal() {
        out.push_str("\x1b[2J\x1b[H");
    }
    out.push_str(&format!(
        "tokentap demo: {sent} streams completed by the client; tokentap's own figures:\n\n"
    ));
    out.push_str(&format!(
        "{:<14} {:<12} {:>8} {:>10} {:>10} {:>9} {:>9} {:>10}\n",
        "model", "tenant", "requests", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "tok/s p50"
    ));
    out.push_str(&format!(
        "{:<14} {:<12} {:>8} {:>10} {:>10} {:>9} {:>9} {:>10}\n",
        "", "", "", "ms", "ms", "ms", "ms", ""
    ));
    for ((model, tenant), row) in &rows {
        out.push_str(&format!(
            "{:<14} {:<12} {:>8} {:>10} {:>10} {:>9} {:>9} {:>10}\n",
            model,
            tenant,
            row.requests,
            ms(quantile(row.ttft, 0.5)),
            ms(quantile(row.ttft, 0.99)),
            ms(quantile(row.itl, 0.5)),
            ms(quantile(row.itl, 0.99)),
            quantile(row.tokens_per_second, 0.5).map_or("-".to_string(), |v| format!("{v:.0}")),
        ));
    }
    if rows.is_empty() {
        out.push_str("(waiting for the first streams to finish...)\n");
    }
    print!("{out}");
    let _ = std::io::stdout().flush();
}
