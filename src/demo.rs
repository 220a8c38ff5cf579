//! `tokentap demo`: the whole product in one process, with nothing to install.
//!
//! Starts the simulator with three models of different speeds, tokentap in front of it,
//! and a small traffic generator that streams chat completions as three tenants, a few of
//! them refused with a `429` as a rate-limited upstream refuses them. Every few seconds it
//! prints tokentap's own view, read from a snapshot of its metric families: per model and
//! tenant, requests (and how many the upstream refused or failed), TTFT and ITL p50/p99
//! and decode tokens/s, read from the native histograms exactly as Prometheus'
//! `histogram_quantile` would (each p99 with the classic buckets' coarser estimate beside
//! it), and below it every request counted by outcome and status.

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
use crate::sim::{ModelProfile, RateLimit, Sim, SimConfig, TokensPerEvent, UsageMode};

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

    let config = Config::from_overrides(&Overrides {
        upstream: Some(format!("http://{sim_addr}")),
        listen: Some(options.listen.to_string()),
        admin: Some(options.admin.to_string()),
        ui_listen: Some(options.ui_listen.to_string()),
        ..Overrides::default()
    })?;
    let server = Server::bind(config).await?;
    let proxy_addr = server.proxy_addr();
    let admin_addr = server.admin_addr();
    let ui_addr = server.ui_addr();
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

/// The demo's figures for one (model, tenant) pair, from tokentap's own histograms.
///
/// Quantiles come from the native (sparse exponential) buckets, as `histogram_quantile`
/// reads a native histogram, so they are within a few percent of the exact quantile;
/// the `classic_*` figures are the same quantile interpolated from the classic buckets,
/// shown beside them for comparison (their error is up to a bucket's width). A figure
/// is `None` while the pair has no observation of it. In seconds, tokens/s for
/// `tokens_per_second_p50`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SummaryRow {
    pub model: String,
    pub tenant: String,
    pub requests: u64,
    /// Requests the upstream refused (`upstream_refused`).
    pub refused: u64,
    /// Requests that failed (`upstream_error`, `timeout`, `overloaded`).
    pub failed: u64,
    pub ttft_p50: Option<f64>,
    pub ttft_p99: Option<f64>,
    pub classic_ttft_p99: Option<f64>,
    pub itl_p50: Option<f64>,
    pub itl_p99: Option<f64>,
    pub classic_itl_p99: Option<f64>,
    pub tokens_per_second_p50: Option<f64>,
}

/// The `q`-quantile of a histogram the pair may not have (yet): from its native buckets
/// when it keeps them, else from the classic ones.
fn quantile(histogram: Option<&HistogramSnapshot>, q: f64) -> Option<f64> {
    let histogram = histogram?;
    match &histogram.native {
        Some(native) => native.quantile(q),
        None => histogram.quantile(q),
    }
}

fn classic_quantile(histogram: Option<&HistogramSnapshot>, q: f64) -> Option<f64> {
    histogram.and_then(|h| h.quantile(q))
}

fn key<T>(series: &Series<T>) -> (String, String) {
    let label = |name| series.label(name).unwrap_or_default().to_string();
    (label("model"), label("tenant"))
}

/// Per (model, tenant): requests, histogram snapshots.
#[derive(Default)]
struct Pair<'a> {
    requests: u64,
    refused: u64,
    failed: u64,
    ttft: Option<&'a HistogramSnapshot>,
    itl: Option<&'a HistogramSnapshot>,
    tokens_per_second: Option<&'a HistogramSnapshot>,
}

/// The summary table's rows, one per (model, tenant) pair in name order. A family
/// without `tenant` (see `labels.tenant.families`) gives its per-model figures to
/// every tenant row of that model.
pub fn summarize(snapshot: &Snapshot) -> Vec<SummaryRow> {
    let mut pairs: BTreeMap<(String, String), Pair<'_>> = BTreeMap::new();
    let mut per_model: BTreeMap<String, Pair<'_>> = BTreeMap::new();
    for family in &snapshot.families {
        match (&*family.name, &family.values) {
            ("tokentap_requests_total", Values::Counter(series)) => {
                for s in series {
                    let pair = pairs.entry(key(s)).or_default();
                    let n = s.value as u64;
                    pair.requests += n;
                    match s.label("outcome").unwrap_or_default() {
                        "upstream_refused" => pair.refused += n,
                        "upstream_error" | "timeout" | "overloaded" => pair.failed += n,
                        _ => {}
                    }
                }
            }
            (name, Values::Histogram(series)) => {
                let set: for<'h> fn(&mut Pair<'h>, &'h HistogramSnapshot) = match name {
                    "tokentap_time_to_first_token_seconds" => |pair, h| pair.ttft = Some(h),
                    "tokentap_inter_token_latency_seconds" => |pair, h| pair.itl = Some(h),
                    "tokentap_output_tokens_per_second" => {
                        |pair, h| pair.tokens_per_second = Some(h)
                    }
                    _ => continue,
                };
                for s in series {
                    let (model, tenant) = key(s);
                    if s.label("tenant").is_some() {
                        set(pairs.entry((model, tenant)).or_default(), &s.value);
                    } else {
                        set(per_model.entry(model).or_default(), &s.value);
                    }
                }
            }
            _ => {}
        }
    }
    pairs
        .into_iter()
        .map(|((model, tenant), pair)| {
            let model_wide = per_model.get(&model);
            let ttft = pair.ttft.or(model_wide.and_then(|m| m.ttft));
            let itl = pair.itl.or(model_wide.and_then(|m| m.itl));
            let tokens_per_second = pair
                .tokens_per_second
                .or(model_wide.and_then(|m| m.tokens_per_second));
            SummaryRow {
                requests: pair.requests,
                refused: pair.refused,
                failed: pair.failed,
                ttft_p50: quantile(ttft, 0.5),
                ttft_p99: quantile(ttft, 0.99),
                classic_ttft_p99: classic_quantile(ttft, 0.99),
                itl_p50: quantile(itl, 0.5),
                itl_p99: quantile(itl, 0.99),
                classic_itl_p99: classic_quantile(itl, 0.99),
                tokens_per_second_p50: quantile(tokens_per_second, 0.5),
                model,
                tenant,
            }
        })
        .collect()
}

fn print_summary(metrics: &Metrics, sent: u64) {
    let rows = summarize(&metrics.snapshot());
    let mut out = String::new();
    if std::io::stdout().is_terminal() {
        out.push_str("\x1b[2J\x1b[H");
    }
    out.push_str(&format!(
        "tokentap demo: {sent} streams completed by the client; tokentap's own figures:\n\n"
    ));
    out.push_str(&render_table(&rows));
    if rows.is_empty() {
        out.push_str("(waiting for the first streams to finish...)\n");
    } else {
        out.push_str(&render_verdicts(&metrics.snapshot()));
    }
    print!("{out}");
    let _ = std::io::stdout().flush();
}

/// Every request counted so far by outcome and status, most frequent first, in one line
/// under the table: `outcomes: completed/2xx 1520, upstream_refused/429 47`.
pub fn render_verdicts(snapshot: &Snapshot) -> String {
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for family in &snapshot.families {
        if let ("tokentap_requests_total", Values::Counter(series)) =
            (&*family.name, &family.values)
        {
            for s in series {
                let label = |name| s.label(name).unwrap_or_default().to_string();
                *counts
                    .entry((label("outcome"), label("status")))
                    .or_default() += s.value as u64;
            }
        }
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let parts: Vec<String> = counts
        .iter()
        .map(|((outcome, status), n)| format!("{outcome}/{status} {n}"))
        .collect();
    format!("\noutcomes: {}\n", parts.join(", "))
}

/// The summary as a text table: quantiles from the native histograms, each p99 with the
/// classic buckets' estimate beside it in the `classic` column.
pub fn render_table(rows: &[SummaryRow]) -> String {
    fn line(cells: [&str; 12]) -> String {
        let [model, tenant, requests, refused, failed, ttft_p50, ttft_p99, ttft_classic, itl_p50, itl_p99, itl_classic, tokens] =
            cells;
        format!(
            "{model:<14} {tenant:<12} {requests:>8} {refused:>7} {failed:>6} {ttft_p50:>9} \
             {ttft_p99:>9} {ttft_classic:>8} {itl_p50:>8} {itl_p99:>8} {itl_classic:>8} {tokens:>10}\n"
        )
    }
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}", v * 1e3));
    let mut out = line([
        "model",
        "tenant",
        "requests",
        "refused",
        "failed",
        "TTFT p50",
        "TTFT p99",
        "classic",
        "ITL p50",
        "ITL p99",
        "classic",
        "tok/s p50",
    ]);
    out.push_str(&line([
        "", "", "", "", "", "ms", "ms", "p99 ms", "ms", "ms", "p99 ms", "",
    ]));
    for row in rows {
        let tokens_per_second = row
            .tokens_per_second_p50
            .map_or("-".to_string(), |v| format!("{v:.0}"));
        out.push_str(&line([
            &row.model,
            &row.tenant,
            &row.requests.to_string(),
            &row.refused.to_string(),
            &row.failed.to_string(),
            &ms(row.ttft_p50),
            &ms(row.ttft_p99),
            &ms(row.classic_ttft_p99),
            &ms(row.itl_p50),
            &ms(row.itl_p99),
            &ms(row.classic_itl_p99),
            &tokens_per_second,
        ]));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;

    use super::*;
    use crate::metrics::snapshot::{FamilySnapshot, Label, NativeHistogramSnapshot};

    fn labels(pairs: &[(&'static str, &str)]) -> Vec<Label> {
        pairs
            .iter()
            .map(|(name, value)| Label {
                name: Cow::Borrowed(*name),
                value: Arc::from(*value),
            })
            .collect()
    }

    /// Ten observations in the classic bucket (0.1, 0.2] and in the schema-0 native
    /// bucket (0.125, 0.25] (index -2): the two estimates differ, so a row shows which
    /// one it read.
    fn histogram(with_native: bool) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: Arc::from([0.1, 0.2]),
            cumulative_counts: vec![0, 10],
            count: 10,
            sum: 1.5,
            native: with_native.then(|| NativeHistogramSnapshot {
                schema: 0,
                zero_threshold: 0.001,
                zero_count: 0,
                buckets: vec![(-2, 10)],
            }),
            exemplars: Vec::new(),
            native_exemplars: Vec::new(),
        }
    }

    fn family(name: &'static str, values: Values) -> FamilySnapshot {
        FamilySnapshot {
            name: Cow::Borrowed(name),
            help: Cow::Borrowed(""),
            values,
        }
    }

    #[test]
    fn rows_read_native_buckets_and_share_a_per_model_family_with_every_tenant() {
        let requests = |tenant| Series {
            labels: labels(&[
                ("model", "m"),
                ("outcome", "completed"),
                ("status", "2xx"),
                ("tenant", tenant),
            ]),
            value: 3.0,
        };
        let refused = Series {
            labels: labels(&[
                ("model", "m"),
                ("outcome", "upstream_refused"),
                ("status", "429"),
                ("tenant", "a"),
            ]),
            value: 2.0,
        };
        let snapshot = Snapshot {
            families: vec![
                family(
                    "tokentap_output_tokens_per_second",
                    // Per model (no `tenant`), and classic only.
                    Values::Histogram(vec![Series {
                        labels: labels(&[("model", "m")]),
                        value: histogram(false),
                    }]),
                ),
                family(
                    "tokentap_requests_total",
                    Values::Counter(vec![requests("a"), refused, requests("b")]),
                ),
                family(
                    "tokentap_time_to_first_token_seconds",
                    Values::Histogram(vec![Series {
                        labels: labels(&[("model", "m"), ("tenant", "a")]),
                        value: histogram(true),
                    }]),
                ),
            ],
        };
        let rows = summarize(&snapshot);
        assert_eq!(rows.len(), 2);
        let (a, b) = (&rows[0], &rows[1]);
        assert_eq!(
            (&*a.tenant, a.requests, a.refused, &*b.tenant, b.requests, b.refused),
            ("a", 5, 2, "b", 3, 0)
        );
        assert_eq!(
            render_verdicts(&snapshot),
            "\noutcomes: completed/2xx 6, upstream_refused/429 2\n"
        );
        // p50 of ten in (0.125, 0.25]: half-way, from the native bucket; the classic
        // estimate is half-way through (0.1, 0.2].
        assert_eq!(a.ttft_p50, Some(0.1875));
        let classic = a.classic_ttft_p99.expect("classic p99");
        assert!((classic - 0.199).abs() < 1e-12, "{classic}");
        // Tenant b has no TTFT of its own.
        assert_eq!((b.ttft_p50, b.classic_ttft_p99), (None, None));
        // The per-model tokens/s (classic only) is every tenant's.
        for row in [a, b] {
            let p50 = row.tokens_per_second_p50.expect("tokens/s p50");
            assert!((p50 - 0.15).abs() < 1e-12, "{p50}");
        }
        let table = render_table(&rows);
        assert!(
            table.contains("187.5") && table.contains("199.0"),
            "{table}"
        );
    }
}
