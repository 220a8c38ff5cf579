//! `tokentap demo`: the whole product in one process, with nothing to install.
//!
//! Starts the simulator with three models of different speeds, tokentap in front of it,
//! and a small traffic generator that streams chat completions as three tenants, a few of
//! them refused with a `429` as a rate-limited upstream refuses them. Every few seconds it
//! prints tokentap's own view (`tokentap::demo`, the summary read from its metrics).
//!
//! A module of the binary, not the library: the simulator (crates/sim) is a dependency of
//! the `tokentap` command only, never of the proxy's library.

use std::future::Future;
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
use tokentap::config::{Config, ConfigError, Overrides};
use tokentap::demo::print_summary;
use tokentap::server::{ServeError, Server};
use tokentap::summary::objectives::{Bounds, Objective, Objectives};
use tokentap_sim::{ModelProfile, RateLimit, Sim, SimConfig, TokensPerEvent, UsageMode};

/// Demo settings (all have defaults that work on a fresh machine).
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// The live view's listener (`ui.listen`).
    pub ui_listen: SocketAddr,
    /// Stop after this long (`None`: until Ctrl-C).
    pub duration: Option<Duration>,
    /// Concurrent client streams.
    pub concurrency: usize,
    /// How often the summary is printed.
    pub refresh: Duration,
    /// Print the text table (off while `tokentap top` shows the figures instead).
    pub table: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9464)),
            ui_listen: SocketAddr::from(([127, 0, 0, 1], 9465)),
            duration: None,
            concurrency: 8,
            refresh: Duration::from_secs(2),
            table: true,
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

/// One objective, so that the demo's live view and `top` show attainment and its families
/// goodput: a chat contract, first token within 500 ms and 50 ms per token after it.
fn demo_objectives() -> Objectives {
    let ms = |n| Some(Duration::from_millis(n));
    let bounds = Bounds {
        ttft: ms(500),
        tpot: ms(50),
        ..Bounds::default()
    };
    Arc::from([Objective::new(
        "interactive".into(),
        bounds,
        Vec::new(),
        0.95,
    )])
}

const TENANTS: [&str; 3] = ["team-search", "team-chat", "team-batch"];

/// Run the demo until `shutdown` resolves or the duration passes.
pub async fn run(
    options: DemoOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DemoError> {
    run_reporting(options, shutdown, |_| {}).await
}

/// [`run`], telling `bound` the live view's address once tokentap is bound (`None` with
/// the live view off), so a caller given port 0 learns the port.
pub async fn run_reporting(
    options: DemoOptions,
    shutdown: impl Future<Output = ()>,
    bound: impl FnOnce(Option<SocketAddr>),
) -> Result<(), DemoError> {
    let sim = Sim::bind(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        SimConfig {
            models: demo_models(),
            usage: UsageMode::Requested,
            // A hosted API's quota, far above the demo's traffic: every response reports
            // what is left of it, as `tokentap_upstream_rate_limit_*` shows.
            rate_limit: Some(RateLimit {
                requests_per_minute: 100_000,
                tokens_per_minute: 10_000_000,
            }),
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

    let mut config = Config::from_overrides(&Overrides {
        upstream: Some(format!("http://{sim_addr}")),
        listen: Some(options.listen.to_string()),
        admin: Some(options.admin.to_string()),
        ui_listen: Some(options.ui_listen.to_string()),
        ..Overrides::default()
    })?;
    config.objectives = Some(demo_objectives());
    let server = Server::bind(config).await?;
    let proxy_addr = server.proxy_addr();
    let admin_addr = server.admin_addr();
    let ui_addr = server.ui_addr();
    bound(ui_addr);
    let metrics = server.metrics();
    let server_task = tokio::spawn(server.run(stopped(proxy_stopped)));

    println!("tokentap demo");
    println!(
        "  simulated backend  http://{sim_addr}  (models: llama-3.1-8b, qwen2.5-32b, mistral-7b)"
    );
    println!("  tokentap proxy     http://{proxy_addr}  ->  http://{sim_addr}");
    println!("  metrics            http://{admin_addr}/metrics");
    if let Some(ui_addr) = ui_addr {
        println!("  live view          http://{ui_addr}/ui   (or: tokentap top --addr {ui_addr})");
    }
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
            _ = ticker.tick() => {
                if options.table {
                    print_summary(&metrics, sent.load(Ordering::Relaxed));
                }
            }
        }
    }
    let _ = stop_traffic.send(true);
    for worker in workers {
        let _ = worker.await;
    }
    if options.table {
        print_summary(&metrics, sent.load(Ordering::Relaxed));
    }
    let _ = stop_proxy.send(true);
    let _ = server_task.await;
    let _ = stop_sim.send(true);
    let _ = sim_task.await;
    Ok(())
}

/// The share of the demo's requests the simulator refuses with a `429`.
const REFUSED_SHARE: f64 = 0.03;

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
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{proxy}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-tenant-id", tenant);
        // A few requests meet a rate limit, as real traffic to a busy engine or a hosted
        // API does: the simulator answers them 429 without streaming.
        if rng.gen_bool(REFUSED_SHARE) {
            request = request.header("x-sim-fault", "status=429");
        }
        let request = request.body(Full::new(Bytes::from(body.to_string())));
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
