//! `tokentap demo` (README's first command) runs on its own and shows tokentap's
//! figures for every simulated model, and the p50/p99 its summary shows (read from the
//! native histograms) agree with what the streams really did.

use std::time::{Duration, Instant};

use tokentap::config::{Config, Overrides};
use tokentap::demo::{render_table, summarize};
use tokentap::Server;
use tokentap_sim::{ModelProfile, SimConfig, UsageMode};
use tokio::sync::watch;

use crate::common::{self, SimHandle};

#[test]
fn demo_runs_and_shows_per_model_figures() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args([
            "demo",
            "--duration",
            "4s",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--ui-listen",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("/metrics"), "{stdout}");
    // A clean exit logs no warning (the demo logs at `warn`, so any would show here).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("WARN"), "{stderr}");
    // The final summary has rows per model and tenant; each model has measured TTFTs
    // (a pair whose only stream was cut by the demo's end may show "-").
    let summary = stdout.rsplit("tokentap's own figures").next().unwrap();
    for model in ["llama-3.1-8b", "qwen2.5-32b", "mistral-7b"] {
        let ttfts: Vec<f64> = summary
            .lines()
            .filter(|l| l.starts_with(model))
            .filter_map(|row| row.split_whitespace().nth(5)?.parse().ok())
            .collect();
        assert!(!ttfts.is_empty(), "no TTFT for {model}:\n{summary}");
        assert!(
            ttfts.iter().all(|t| *t > 50.0 && *t < 1000.0),
            "{model}: {ttfts:?}"
        );
    }
    // Every request is counted by outcome and status under the table.
    assert!(summary.contains("\noutcomes: completed/2xx "), "{summary}");
    // And judged against the demo's objective.
    assert!(summary.contains("\nobjectives: interactive "), "{summary}");
}

const TENANT: &str = "demo-native-quantiles";

/// Stream one chat completion from a simulator started with `stamp`, and return the
/// gaps between the send times the simulator stamped on consecutive token-bearing
/// chunks, in seconds: the inter-token gaps tokentap measured, but for loopback delivery
/// (microseconds), and free of this client's own scheduling.
async fn sent_gaps(url: String) -> Vec<f64> {
    let client = common::client();
    let request = common::chat(&url, "known", TENANT, true, true);
    let response = client.request(request).await.expect("response");
    let body = common::body_bytes(response).await;
    let sent: Vec<u64> = String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|json| serde_json::from_str::<serde_json::Value>(json.trim()).ok())
        .filter(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .filter_map(|chunk| chunk["sim_sent_unix_ns"].as_u64())
        .collect();
    sent.windows(2)
        .map(|w| w[1].saturating_sub(w[0]) as f64 / 1e9)
        .collect()
}

/// The exact `q`-quantile (nearest rank) of the values.
fn exact_quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = (q * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// `streams` streams through `url`, 100 at a time (a burst of hundreds of connects would
/// overflow a listen backlog and put a SYN retransmit, 1 s, into some TTFTs): the gaps
/// between the simulator's sends, of every stream.
async fn streams_in_waves(url: &str, streams: usize) -> Vec<f64> {
    const WAVE: usize = 100;
    let mut gaps = Vec::new();
    for _ in 0..streams / WAVE {
        let wave: Vec<_> = (0..WAVE)
            .map(|_| tokio::spawn(sent_gaps(url.to_string())))
            .collect();
        for stream in wave {
            gaps.extend(stream.await.expect("stream task"));
        }
    }
    gaps
}

/// The smallest and the largest of `values`.
fn range(values: &[f64]) -> (f64, f64) {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(0.0, f64::max);
    (min, max)
}

/// The demo's summary reads the native histograms: with the simulator's uniform +-30%
/// jitter (as in the demo's profiles), its TTFT and ITL p50/p99 lie within 5% of the
/// exact quantiles of the values tokentap observed. Exact TTFTs are tokentap's own, from
/// its access log (one per request); the access log has only a mean ITL per request, so
/// the exact gaps are the simulator's send stamps (see [`sent_gaps`]). The timings are
/// hundreds of milliseconds so that timer granularity (1 ms) and the scheduling delays
/// of a loaded machine are small beside them, and the largest values sit near the top
/// of a schema-3 bucket (250-273 ms) rather than just past a bound, where bucket
/// interpolation is at its worst: TTFT 143-267 ms, ITL 146-270 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_quantiles_from_native_histograms_match_the_streams() {
    let ms = Duration::from_millis;
    let profile = ModelProfile {
        jitter: 0.3,
        ..ModelProfile::new("known", ms(205), ms(208), 6)
    };
    let sim = SimHandle::start(SimConfig {
        models: vec![profile],
        usage: UsageMode::Requested,
        stamp: true,
        ..SimConfig::default()
    })
    .await;
    common::access_log::install();
    let overrides = Overrides {
        upstream: Some(sim.url()),
        listen: Some("127.0.0.1:0".into()),
        admin: Some("127.0.0.1:0".into()),
        ui_listen: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    let config = Config::from_yaml("{}", "test", &overrides).expect("valid config");
    let server = Server::bind(config).await.expect("bind tokentap");
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr());
    let metrics = server.metrics();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(server.run(async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|stop| *stop).await;
    }));

    const STREAMS: usize = 200;
    let mut gaps = streams_in_waves(&url, STREAMS).await;
    assert_eq!(gaps.len(), STREAMS * 5);
    let lines = common::access_log::wait_for_lines("tenant", TENANT, STREAMS).await;
    let mut ttfts: Vec<f64> = lines
        .iter()
        .filter_map(|line| line.field("ttft_ms")?.parse::<f64>().ok())
        .map(|ms| ms / 1e3)
        .collect();
    assert_eq!(ttfts.len(), STREAMS);
    // The simulator drew what its profile says, give or take its timers' lateness (a
    // late send shortens the gap after it).
    let (min, max) = range(&ttfts);
    assert!(min >= 0.1435 && max < 1.0, "TTFTs from {min} s to {max} s");
    let (min, max) = range(&gaps);
    assert!(min > 0.1 && max < 0.4, "gaps from {min} s to {max} s");

    // Every stream has been recorded once its client saw the end of the body.
    let deadline = Instant::now() + Duration::from_secs(10);
    let rows = loop {
        let rows = summarize(&metrics.snapshot());
        if rows.iter().map(|r| r.requests).sum::<u64>() == STREAMS as u64
            || Instant::now() > deadline
        {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = stop.send(true);
    let _ = task.await;

    assert_eq!(rows.len(), 1, "one (model, tenant) pair");
    let row = &rows[0];
    assert_eq!(
        (&*row.model, &*row.tenant, row.requests),
        ("known", TENANT, STREAMS as u64)
    );
    let table = render_table(&rows);
    let checks = [
        ("TTFT p50", row.ttft_p50, exact_quantile(&mut ttfts, 0.5)),
        ("TTFT p99", row.ttft_p99, exact_quantile(&mut ttfts, 0.99)),
        ("ITL p50", row.itl_p50, exact_quantile(&mut gaps, 0.5)),
        ("ITL p99", row.itl_p99, exact_quantile(&mut gaps, 0.99)),
    ];
    for (what, shown, exact) in checks {
        let shown = shown.unwrap_or_else(|| panic!("no {what}:\n{table}"));
        let error = (shown - exact).abs() / exact;
        println!(
            "{what}: summary {:.1} ms, exact {:.1} ms ({:.1}%)",
            shown * 1e3,
            exact * 1e3,
            error * 100.0
        );
        assert!(
            error <= 0.05,
            "{what}: summary {:.1} ms vs exact {:.1} ms ({:.1}%)\n{table}",
            shown * 1e3,
            exact * 1e3,
            error * 100.0
        );
        // The table prints the figure it returned.
        assert!(table.contains(&format!("{:.1}", shown * 1e3)), "{table}");
    }
    assert!(row.classic_ttft_p99.is_some() && row.classic_itl_p99.is_some());
}
