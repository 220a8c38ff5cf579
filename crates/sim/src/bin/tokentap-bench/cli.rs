//! The command line: one subcommand per job (`run`, `fidelity`, `scrape`) and their
//! flags, which `scripts/bench.sh` and `scripts/bench/` pass.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(about = "Load generator for tokentap's benchmark (see scripts/bench.sh)")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

// Parsed once at start-up: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Stream load against a target; prints a JSON summary line.
    Run(RunArgs),
    /// Compare a client request log with tokentap's JSON access log.
    Fidelity(FidelityArgs),
    /// Time full GETs of a URL (e.g. the admin /metrics).
    Scrape(ScrapeArgs),
}

#[derive(Args, Debug, Clone)]
pub(crate) struct RunArgs {
    /// Base URL of the target, e.g. http://127.0.0.1:8080 (loopback only).
    #[arg(long)]
    pub(crate) url: String,
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    pub(crate) path: String,
    /// Concurrent streams (one connection each over HTTP/1.1).
    #[arg(short, long, default_value_t = 100)]
    pub(crate) concurrency: usize,
    /// Measurement window (after the warm-up).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Warm-up before the window: connections and streams run, nothing is recorded.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) warmup: Duration,
    /// Spread the first request of each stream slot uniformly over this.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub(crate) ramp: Duration,
    /// Stop after this many requests in all (0: run for the duration). With a count,
    /// there is no warm-up and everything is recorded.
    #[arg(long, default_value_t = 0)]
    pub(crate) requests: u64,
    /// Models to ask for, comma-separated; request i asks for models[i % len].
    #[arg(long, value_delimiter = ',', default_value = "sim-model")]
    pub(crate) models: Vec<String>,
    /// Distinct tenants: request i sends `x-tenant-id: t<(i / models) % tenants>` (0: none).
    #[arg(long, default_value_t = 0)]
    pub(crate) tenants: u64,
    /// Send a unique `x-tenant-id` per request (pairs requests with tokentap's access log).
    #[arg(long)]
    pub(crate) unique_tenants: bool,
    /// `max_tokens` to send (0: none).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_tokens: u32,
    /// Do not ask for `stream_options.include_usage`.
    #[arg(long)]
    pub(crate) no_usage: bool,
    /// Speak h2c (prior knowledge), streams multiplexed over `--h2-connections`.
    #[arg(long)]
    pub(crate) http2: bool,
    /// h2c connections to spread the streams over.
    #[arg(long, default_value_t = 16)]
    pub(crate) h2_connections: usize,
    /// Hold mode: open `concurrency` streams once and keep them open for the whole
    /// warm-up + duration; a stream that ends or fails before that is an error.
    #[arg(long)]
    pub(crate) hold: bool,
    /// In hold mode, create this file once every stream is ready (see
    /// `--ready-after-events`).
    #[arg(long)]
    pub(crate) ready_file: Option<PathBuf>,
    /// In hold mode, a stream is ready once it has received this many token-bearing
    /// events (0: once it has received its first event of any kind). With a simulator
    /// that holds each stream open after its last token (`--hold-before-end`), the ready
    /// file then marks the moment every stream has all its tokens and none has ended.
    #[arg(long, default_value_t = 0)]
    pub(crate) ready_after_events: u64,
    /// Per-request timeout (streams longer than this count as errors).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// Write one JSON line per completed request (tenant, ttft_ms, mean_itl_ms, tokens).
    #[arg(long)]
    pub(crate) requests_log: Option<PathBuf>,
    /// Runtime worker threads (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// A label copied into the JSON summary.
    #[arg(long, default_value = "")]
    pub(crate) label: String,
}

#[derive(Args, Debug)]
pub(crate) struct FidelityArgs {
    /// The client's `--requests-log`.
    #[arg(long)]
    pub(crate) client: PathBuf,
    /// tokentap's stderr with `log.format: json`. Without it, only the simulator's TTFT
    /// is compared with the client's.
    #[arg(long)]
    pub(crate) access: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ScrapeArgs {
    /// Full URL, e.g. http://127.0.0.1:9464/metrics.
    #[arg(long)]
    pub(crate) url: String,
    /// Timed repeats (after one untimed warm-up GET).
    #[arg(long, default_value_t = 5)]
    pub(crate) repeat: usize,
    /// The `Accept` header to send, which picks the exposition format, e.g.
    /// `application/openmetrics-text` or the Prometheus protobuf format
    /// (`application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
    /// encoding=delimited`). None by default: the text format.
    #[arg(long)]
    pub(crate) accept: Option<String>,
}

/// A duration flag: `150ms`, `5s`, `2m`, `1h`, `1.5s` (a bare number is seconds), the
/// syntax of tokentap's own duration flags and keys (`tokentap::config::units`), which
/// this crate cannot import: the simulator and its load tool do not depend on the proxy.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (use e.g. 150ms, 5s, 2m)"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit `{other}` (use ms, s, m or h)"
            ))
        }
    };
    let seconds = value * scale;
    if seconds > 1e9 {
        return Err(format!("duration `{text}` is out of range"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("duration `{text}` is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_tokentap_reads_them() {
        assert_eq!(parse_duration("150ms"), Ok(Duration::from_millis(150)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("").is_err());
    }
}
