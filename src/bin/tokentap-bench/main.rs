//! `tokentap-bench`: the load generator behind `scripts/bench.sh`.
//!
//! It opens N concurrent streaming chat requests against a target (the simulator directly,
//! tokentap, nginx or Envoy in front of it), one HTTP/1.1 keep-alive connection per
//! concurrent stream (or N streams multiplexed over a few h2c connections), and measures
//! per *event*, not per request: the simulator started with `--stamp` embeds its wall-clock
//! send time (`"sim_sent_unix_ns"`) in every SSE chunk, and the bench subtracts it from the
//! wall-clock arrival of the frame that completed the event. The same figure measured
//! directly against the simulator is the baseline; a proxy's added latency is the
//! difference.
//!
//! Subcommands:
//! - `run`: stream load for a duration or a request count, or (`--hold`) open N streams
//!   and keep them open; prints one JSON summary line on stdout.
//! - `fidelity`: pair the per-request client log of a `run --requests-log` with tokentap's
//!   JSON access log (by the unique `x-tenant-id` each request carried) and report how far
//!   tokentap's TTFT / mean ITL are from what the client saw, and token-count mismatches.
//!   It also reports how far the simulator's own TTFT (its stamps: first token sent minus
//!   request received) is from the client's; from a run straight at the simulator (no
//!   `--access`), that is the floor any observer between them can reach on the machine.
//! - `scrape`: time full `GET`s of a URL (the admin `/metrics`), median of repeats.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use memchr::memmem;
use tokentap::config::units::parse_duration;
use tokentap::sim::unix_ns;
use tokentap::wire::sse::{SseDecoder, SseEvent};

#[derive(Parser, Debug)]
#[command(about = "Load generator for tokentap's benchmark (see scripts/bench.sh)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Stream load against a target; prints a JSON summary line.
    Run(RunArgs),
    /// Compare a client request log with tokentap's JSON access log.
    Fidelity(FidelityArgs),
    /// Time full GETs of a URL (e.g. the admin /metrics).
    Scrape(ScrapeArgs),
}

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// Base URL of the target, e.g. http://127.0.0.1:8080 (loopback only).
    #[arg(long)]
    url: String,
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Concurrent streams (one connection each over HTTP/1.1).
    #[arg(short, long, default_value_t = 100)]
    concurrency: usize,
    /// Measurement window (after the warm-up).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up before the window: connections and streams run, nothing is recorded.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Spread the first request of each stream slot uniformly over this.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    ramp: Duration,
    /// Stop after this many requests in all (0: run for the duration). With a count,
    /// there is no warm-up and everything is recorded.
    #[arg(long, default_value_t = 0)]
    requests: u64,
    /// Models to ask for, comma-separated; request i asks for models[i % len].
    #[arg(long, value_delimiter = ',', default_value = "sim-model")]
    models: Vec<String>,
    /// Distinct tenants: request i sends `x-tenant-id: t<(i / models) % tenants>` (0: none).
    #[arg(long, default_value_t = 0)]
    tenants: u64,
    /// Send a unique `x-tenant-id` per request (pairs requests with tokentap's access log).
    #[arg(long)]
    unique_tenants: bool,
    /// `max_tokens` to send (0: none).
    #[arg(long, default_value_t = 0)]
    max_tokens: u32,
    /// Do not ask for `stream_options.include_usage`.
    #[arg(long)]
    no_usage: bool,
    /// Speak h2c (prior knowledge), streams multiplexed over `--h2-connections`.
    #[arg(long)]
    http2: bool,
    /// h2c connections to spread the streams over.
    #[arg(long, default_value_t = 16)]
    h2_connections: usize,
    /// Hold mode: open `concurrency` streams once and keep them open for the whole
    /// warm-up + duration; a stream that ends or fails before that is an error.
    #[arg(long)]
    hold: bool,
    /// In hold mode, create this file once every stream has received its first event.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Per-request timeout (streams longer than this count as errors).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    timeout: Duration,
    /// Write one JSON line per completed request (tenant, ttft_ms, mean_itl_ms, tokens).
    #[arg(long)]
    requests_log: Option<PathBuf>,
    /// Runtime worker threads (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A label copied into the JSON summary.
    #[arg(long, default_value = "")]
    label: String,
}

#[derive(Args, Debug)]
struct FidelityArgs {
    /// The client's `--requests-log`.
    #[arg(long)]
    client: PathBuf,
    /// tokentap's stderr with `log.format: json`. Without it, only the simulator's TTFT
    /// is compared with the client's.
    #[arg(long)]
    access: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ScrapeArgs {
    /// Full URL, e.g. http://127.0.0.1:9464/metrics.
    #[arg(long)]
    url: String,
    /// Timed repeats (after one untimed warm-up GET).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Fidelity(args) => fidelity(&args),
        Command::Scrape(args) => scrape(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tokentap-bench: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    rt.context("cannot start the async runtime")
}

/// Raise the soft open-files limit to the hard limit (10,000 streams need > 10,000 fds).
#[cfg(target_os = "linux")]
fn raise_nofile() -> Option<u64> {
    #[repr(C)]
    struct RLimit {
        cur: u64,
        max: u64,
    }
    extern "C" {
        fn getrlimit(resource: i32, rlim: *mut RLimit) -> i32;
        fn setrlimit(resource: i32, rlim: *const RLimit) -> i32;
    }
    const RLIMIT_NOFILE: i32 = 7;
    let mut lim = RLimit { cur: 0, max: 0 };
    // SAFETY: plain libc calls on a properly sized, initialised struct.
    unsafe {
        if getrlimit(RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.cur < lim.max {
            let want = RLimit {
                cur: lim.max,
                max: lim.max,
            };
            if setrlimit(RLIMIT_NOFILE, &want) == 0 {
                lim.cur = lim.max;
            }
        }
    }
    Some(lim.cur)
}

#[cfg(not(target_os = "linux"))]
fn raise_nofile() -> Option<u64> {
    None
}

// ---------------------------------------------------------------------------------------
// A lock-free log-linear histogram of nanoseconds (about 0.8 % relative precision).

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;

struct Hist {
    counts: Box<[AtomicU64]>,
    n: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Hist {
    fn new() -> Hist {
        let buckets = (64 - SUB_BITS as usize + 1) * SUB as usize;
        Hist {
            counts: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
            n: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros();
        let sub = (v >> (exp - SUB_BITS)) & (SUB - 1);
        ((exp - SUB_BITS + 1) as u64 * SUB + sub) as usize
    }

    /// Upper bound of a bucket (what a quantile reports: never flatters).
    fn upper(index: usize) -> u64 {
        let i = index as u64;
        if i < SUB {
            return i;
        }
        let exp = i / SUB + u64::from(SUB_BITS) - 1;
        let sub = i % SUB;
        let base = (SUB + sub) << (exp - u64::from(SUB_BITS));
        base + (1u64 << (exp - u64::from(SUB_BITS))) - 1
    }

    fn record(&self, v: u64) {
        self.counts[Self::index(v)].fetch_add(1, Ordering::Relaxed);
        self.n.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
        self.max.fetch_max(v, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }

    fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.load(Ordering::Relaxed);
            if seen >= rank {
                return Self::upper(i).min(self.max.load(Ordering::Relaxed));
            }
        }
        self.max.load(Ordering::Relaxed)
    }

    /// Summary in the given unit (`div` ns per unit).
    fn summary(&self, div: f64) -> serde_json::Value {
        let n = self.count();
        let f = |v: u64| (v as f64 / div * 1000.0).round() / 1000.0;
        serde_json::json!({
            "n": n,
            "p50": f(self.quantile(0.50)),
            "p90": f(self.quantile(0.90)),
            "p99": f(self.quantile(0.99)),
            "p999": f(self.quantile(0.999)),
            "max": f(self.max.load(Ordering::Relaxed)),
            "mean": self.sum.load(Ordering::Relaxed).checked_div(n).map_or(0.0, f),
        })
    }
}

// ---------------------------------------------------------------------------------------
// The run.

#[derive(Default)]
struct Errors {
    connect: AtomicU64,
    status: AtomicU64,
    body: AtomicU64,
    timeout: AtomicU64,
    /// Hold mode: a stream ended before the end of the run.
    early_end: AtomicU64,
    /// The stream reported an error event.
    stream_error: AtomicU64,
}

impl Errors {
    fn total(&self) -> u64 {
        [
            &self.connect,
            &self.status,
            &self.body,
            &self.timeout,
            &self.early_end,
            &self.stream_error,
        ]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum()
    }
}

struct Shared {
    args: RunArgs,
    uri: Uri,
    authority: String,
    run_id: u64,
    /// Recording window.
    window_start: Instant,
    window_end: Instant,
    /// Everything stops here.
    end: Instant,
    issued: AtomicU64,
    completed: AtomicU64,
    events: AtomicU64,
    /// Stamped events over the whole run, warm-up and tail included (for CPU per event).
    events_all: AtomicU64,
    token_events: AtomicU64,
    bytes: AtomicU64,
    latency: Hist,
    ttft: Hist,
    itl: Hist,
    errors: Errors,
    open: AtomicUsize,
    open_max: AtomicUsize,
    established: AtomicUsize,
    all_ready: AtomicBool,
    log: Mutex<Vec<String>>,
    stamp: memmem::Finder<'static>,
    received: memmem::Finder<'static>,
    content: memmem::Finder<'static>,
    completion: memmem::Finder<'static>,
}

impl Shared {
    fn recording(&self, at: Instant) -> bool {
        self.args.requests > 0 || (at >= self.window_start && at < self.window_end)
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let uri: Uri = args.url.parse().context("--url")?;
    let authority = uri
        .authority()
        .context("--url needs host:port")?
        .to_string();
    let host = uri.host().unwrap_or("");
    if !(host.starts_with("127.") || host == "localhost" || host == "[::1]" || host == "::1") {
        bail!("only loopback targets are allowed (got {host})");
    }
    let nofile = raise_nofile();
    let need = args.concurrency as u64 + 64;
    if let Some(limit) = nofile {
        if !args.http2 && limit < need {
            eprintln!(
                "tokentap-bench: warning: open-files limit {limit} < {need} needed for {} streams",
                args.concurrency
            );
        }
    }
    let rt = runtime(args.threads)?;
    rt.block_on(run_async(args, uri, authority))
}

async fn run_async(args: RunArgs, uri: Uri, authority: String) -> anyhow::Result<()> {
    let start = Instant::now();
    let (window_start, window_end, end) = if args.requests > 0 && !args.hold {
        // Count mode: everything recorded; `--duration` bounds the whole run.
        (start, start + args.duration, start + args.duration)
    } else {
        let ws = start + args.warmup;
        (ws, ws + args.duration, ws + args.duration)
    };
    let shared = Arc::new(Shared {
        run_id: unix_ns() % 1_000_000_007,
        uri,
        authority,
        window_start,
        window_end,
        end,
        issued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        events: AtomicU64::new(0),
        events_all: AtomicU64::new(0),
        token_events: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        latency: Hist::new(),
        ttft: Hist::new(),
        itl: Hist::new(),
        errors: Errors::default(),
        open: AtomicUsize::new(0),
        open_max: AtomicUsize::new(0),
        established: AtomicUsize::new(0),
        all_ready: AtomicBool::new(false),
        log: Mutex::new(Vec::new()),
        stamp: memmem::Finder::new(b"\"sim_sent_unix_ns\":"),
        received: memmem::Finder::new(b"\"sim_received_unix_ns\":"),
        content: memmem::Finder::new(b"\"content\":\""),
        completion: memmem::Finder::new(b"\"completion_tokens\":"),
        args,
    });

    let n = shared.args.concurrency;
    let mut h2_senders = Vec::new();
    if shared.args.http2 {
        let conns = shared.args.h2_connections.clamp(1, n);
        for _ in 0..conns {
            match connect_h2(&shared).await {
                Ok(Sender::H2(sender)) => h2_senders.push(sender),
                Ok(Sender::H1(_)) => unreachable!("connect_h2 returns h2 senders"),
                Err(err) => {
                    shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                    eprintln!("tokentap-bench: h2 connect failed: {err:#}");
                }
            }
        }
        if h2_senders.is_empty() {
            bail!("no h2c connection could be opened to {}", shared.args.url);
        }
    }

    let mut tasks = Vec::with_capacity(n);
    for slot in 0..n {
        let shared = shared.clone();
        let h2 = (!h2_senders.is_empty()).then(|| h2_senders[slot % h2_senders.len()].clone());
        let delay = shared.args.ramp.mul_f64(slot as f64 / n as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((start + delay).into()).await;
            if shared.args.hold {
                hold_slot(&shared, h2.map(Sender::H2)).await;
            } else {
                stream_slot(&shared, h2).await;
            }
        }));
    }
    if let Some(path) = shared.args.ready_file.clone() {
        let watcher = shared.clone();
        tokio::spawn(async move {
            loop {
                if watcher.established.load(Ordering::Relaxed) >= watcher.args.concurrency {
                    watcher.all_ready.store(true, Ordering::Relaxed);
                    let _ = std::fs::write(&path, b"ready\n");
                    eprintln!(
                        "tokentap-bench: all {} streams open",
                        watcher.args.concurrency
                    );
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    for task in tasks {
        let _ = task.await;
    }
    let finished = Instant::now();

    if let Some(path) = &shared.args.requests_log {
        let lines = shared.log.lock().map(|l| l.join("\n")).unwrap_or_default();
        std::fs::write(
            path,
            if lines.is_empty() {
                lines
            } else {
                lines + "\n"
            },
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
    }

    let window = if shared.args.requests > 0 && !shared.args.hold {
        finished.duration_since(start)
    } else {
        shared.args.duration
    }
    .as_secs_f64()
    .max(1e-9);
    let e = &shared.errors;
    let events = shared.events.load(Ordering::Relaxed);
    let completed = shared.completed.load(Ordering::Relaxed);
    let summary = serde_json::json!({
        "label": shared.args.label,
        "mode": if shared.args.hold { "hold" } else { "stream" },
        "url": shared.args.url,
        "http2": shared.args.http2,
        "concurrency": n,
        "window_s": (window * 1000.0).round() / 1000.0,
        "requests_completed": completed,
        "requests_per_s": (completed as f64 / window * 10.0).round() / 10.0,
        "events": events,
        "events_per_s": (events as f64 / window).round(),
        "events_all": shared.events_all.load(Ordering::Relaxed),
        "token_events": shared.token_events.load(Ordering::Relaxed),
        "bytes": shared.bytes.load(Ordering::Relaxed),
        "latency_us": shared.latency.summary(1e3),
        "ttft_ms": shared.ttft.summary(1e6),
        "mean_itl_ms": shared.itl.summary(1e6),
        "errors": e.total(),
        "error_kinds": {
            "connect": e.connect.load(Ordering::Relaxed),
            "status": e.status.load(Ordering::Relaxed),
            "body": e.body.load(Ordering::Relaxed),
            "timeout": e.timeout.load(Ordering::Relaxed),
            "early_end": e.early_end.load(Ordering::Relaxed),
            "stream_error": e.stream_error.load(Ordering::Relaxed),
        },
        "established": shared.established.load(Ordering::Relaxed),
        "open_max": shared.open_max.load(Ordering::Relaxed),
        "all_open": shared.all_ready.load(Ordering::Relaxed)
            || shared.established.load(Ordering::Relaxed) >= n,
    });
    println!("{summary}");
    Ok(())
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> hyper::Result<http::Response<Incoming>> {
        match self {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(request).await
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(request).await
            }
        }
    }
}

async fn connect_h1(shared: &Shared) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(&shared.authority).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Sender::H1(sender))
}

async fn connect_h2(shared: &Shared) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(&shared.authority).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(16 << 20)
        .max_concurrent_reset_streams(1 << 16)
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Sender::H2(sender))
}

fn build_request(shared: &Shared, i: u64, http2: bool) -> (Request<Full<Bytes>>, Option<String>) {
    let args = &shared.args;
    let models = args.models.len().max(1) as u64;
    let model = args
        .models
        .get((i % models) as usize)
        .map_or("sim-model", String::as_str);
    let mut body = format!(
        r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"Summarise today's news in one paragraph."}}]"#
    );
    if !args.no_usage {
        body.push_str(r#","stream_options":{"include_usage":true}"#);
    }
    if args.max_tokens > 0 {
        body.push_str(&format!(r#","max_tokens":{}"#, args.max_tokens));
    }
    body.push('}');
    let tenant = if args.unique_tenants {
        Some(format!("b{}-{i}", shared.run_id))
    } else if args.tenants > 0 {
        Some(format!("t{}", (i / models) % args.tenants))
    } else {
        None
    };
    let uri = if http2 {
        shared.uri.to_string().trim_end_matches('/').to_string() + &args.path
    } else {
        args.path.clone()
    };
    let mut builder = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "text/event-stream");
    if !http2 {
        builder = builder.header(header::HOST, &shared.authority);
    }
    if let Some(t) = &tenant {
        builder = builder.header("x-tenant-id", t);
    }
    let request = builder
        .body(Full::new(Bytes::from(body)))
        .expect("static request parts are valid");
    (request, tenant)
}

/// What one stream saw.
#[derive(Default)]
struct StreamStats {
    first_token: Option<Instant>,
    /// The simulator's TTFT by its own stamps (first token sent - request received).
    sim_ttft_ns: Option<u64>,
    last_token: Option<Instant>,
    tokens: u64,
    usage_tokens: Option<u64>,
    stream_error: bool,
    first_event: bool,
}

enum Failure {
    Status,
    Body,
    StreamError,
}

/// Send one request on `sender` and read its whole stream, recording every event.
async fn one_request(
    shared: &Shared,
    sender: &mut Sender,
    i: u64,
    on_first_event: &mut (dyn FnMut() + Send),
) -> Result<(), Failure> {
    let http2 = matches!(sender, Sender::H2(_));
    let (request, tenant) = build_request(shared, i, http2);
    let t_send = Instant::now();
    let response = sender.send(request).await.map_err(|_| Failure::Body)?;
    if response.status() != StatusCode::OK {
        // Drain so the connection can be reused.
        let _ = response.into_body().collect().await;
        return Err(Failure::Status);
    }
    let mut body = response.into_body();
    let mut sse = SseDecoder::new(1 << 20);
    let mut st = StreamStats::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Failure::Body)?;
        let arrived_wall = unix_ns();
        let arrived = Instant::now();
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let recording = shared.recording(arrived);
        if recording {
            shared.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        let mut fed = |ev: SseEvent<'_>| {
            let d = ev.data;
            if !st.first_event {
                st.first_event = true;
                on_first_event();
            }
            if d.starts_with(b"{\"error\"") || ev.event == "error" {
                st.stream_error = true;
                return;
            }
            let sent = shared
                .stamp
                .find(d)
                .map(|pos| parse_u64(&d[pos + shared.stamp.needle().len()..]));
            if let Some(sent) = sent {
                shared.events_all.fetch_add(1, Ordering::Relaxed);
                if recording {
                    shared.events.fetch_add(1, Ordering::Relaxed);
                    shared.latency.record(arrived_wall.saturating_sub(sent));
                }
            }
            if let Some(pos) = shared.content.find(d) {
                if d.get(pos + shared.content.needle().len()) != Some(&b'"') {
                    st.tokens += 1;
                    if st.first_token.is_none() {
                        st.first_token = Some(arrived);
                        let received = shared
                            .received
                            .find(d)
                            .map(|pos| parse_u64(&d[pos + shared.received.needle().len()..]));
                        if let (Some(sent), Some(received)) = (sent, received) {
                            st.sim_ttft_ns = Some(sent.saturating_sub(received));
                        }
                    }
                    st.last_token = Some(arrived);
                    if recording {
                        shared.token_events.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if let Some(pos) = shared.completion.find(d) {
                st.usage_tokens = Some(parse_u64(&d[pos + shared.completion.needle().len()..]));
            }
        };
        if sse.feed(&data, &mut fed).is_err() {
            return Err(Failure::Body);
        }
    }
    if st.stream_error {
        return Err(Failure::StreamError);
    }
    let done = Instant::now();
    // Per-request figures count only requests wholly inside the window: one sent while
    // the connections were still being opened measures the ramp, not the steady load.
    if !shared.recording(t_send) || !shared.recording(done) {
        return Ok(());
    }
    shared.completed.fetch_add(1, Ordering::Relaxed);
    let ttft = st.first_token.map(|t| t.duration_since(t_send));
    let mean_itl = match (st.first_token, st.last_token) {
        (Some(a), Some(b)) if st.tokens >= 2 => Some(b.duration_since(a) / (st.tokens - 1) as u32),
        _ => None,
    };
    if let Some(t) = ttft {
        shared.ttft.record(t.as_nanos() as u64);
    }
    if let Some(t) = mean_itl {
        shared.itl.record(t.as_nanos() as u64);
    }
    if shared.args.requests_log.is_some() {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        let line = serde_json::json!({
            "tenant": tenant,
            "ttft_ms": ms(ttft),
            "mean_itl_ms": ms(mean_itl),
            "sim_ttft_ms": st.sim_ttft_ns.map(|ns| ns as f64 / 1e6),
            "tokens": st.tokens,
            "usage_tokens": st.usage_tokens,
        })
        .to_string();
        if let Ok(mut log) = shared.log.lock() {
            log.push(line);
        }
    }
    Ok(())
}

fn parse_u64(bytes: &[u8]) -> u64 {
    let mut v: u64 = 0;
    for &b in bytes.iter().skip_while(|b| **b == b' ') {
        if !b.is_ascii_digit() {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
    }
    v
}

fn count_failure(shared: &Shared, failure: &Failure) {
    let e = &shared.errors;
    match failure {
        Failure::Status => e.status.fetch_add(1, Ordering::Relaxed),
        Failure::Body => e.body.fetch_add(1, Ordering::Relaxed),
        Failure::StreamError => e.stream_error.fetch_add(1, Ordering::Relaxed),
    };
}

/// One stream slot: request after request on its own connection until the end.
async fn stream_slot(
    shared: &Shared,
    h2: Option<hyper::client::conn::http2::SendRequest<Full<Bytes>>>,
) {
    let mut sender: Option<Sender> = h2.clone().map(Sender::H2);
    let mut backoff = Duration::from_millis(5);
    loop {
        let now = Instant::now();
        if now >= shared.end {
            return;
        }
        let i = shared.issued.fetch_add(1, Ordering::Relaxed);
        if shared.args.requests > 0 && i >= shared.args.requests {
            return;
        }
        let mut current = match sender.take() {
            Some(s) if !s.is_closed() => s,
            _ if h2.is_some() => {
                // A dead h2c connection is not replaced: its streams end here.
                shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ => match tokio::time::timeout_at(shared.end.into(), connect_h1(shared)).await {
                Err(_) => return,
                Ok(Ok(s)) => s,
                Ok(Err(_)) => {
                    if shared.recording(Instant::now()) {
                        shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(5);
        let deadline = (Instant::now() + shared.args.timeout).min(shared.end);
        let outcome = tokio::time::timeout_at(
            deadline.into(),
            one_request(shared, &mut current, i, &mut || {}),
        )
        .await;
        match outcome {
            Ok(Ok(())) => sender = Some(current),
            Ok(Err(failure)) => {
                if shared.recording(Instant::now()) {
                    count_failure(shared, &failure);
                }
                if h2.is_some() {
                    sender = Some(current);
                }
            }
            Err(_) => {
                if Instant::now() < shared.end {
                    shared.errors.timeout.fetch_add(1, Ordering::Relaxed);
                }
                // The connection is mid-body: drop it (h1) / the stream was reset (h2).
                if h2.is_some() {
                    sender = Some(current);
                }
            }
        }
    }
}

/// Hold mode: one stream, kept open until the end of the run.
async fn hold_slot(shared: &Shared, h2: Option<Sender>) {
    let mut sender = match h2 {
        Some(s) => s,
        None => match connect_h1(shared).await {
            Ok(s) => s,
            Err(_) => {
                shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                return;
            }
        },
    };
    let i = shared.issued.fetch_add(1, Ordering::Relaxed);
    let mut opened = false;
    let mut on_first = || {
        opened = true;
        shared.established.fetch_add(1, Ordering::Relaxed);
        let open = shared.open.fetch_add(1, Ordering::Relaxed) + 1;
        shared.open_max.fetch_max(open, Ordering::Relaxed);
    };
    let outcome = tokio::time::timeout_at(
        shared.end.into(),
        one_request(shared, &mut sender, i, &mut on_first),
    )
    .await;
    match outcome {
        Err(_) => {} // still open at the end: success
        Ok(Ok(())) => {
            shared.errors.early_end.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(failure)) => count_failure(shared, &failure),
    }
    if opened {
        shared.open.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------
// Fidelity: tokentap's access log versus the client's own view.

fn fidelity(args: &FidelityArgs) -> anyhow::Result<()> {
    struct Seen {
        ttft: Option<f64>,
        itl: Option<f64>,
        tokens: u64,
    }
    let mut client: HashMap<String, Seen> = HashMap::new();
    let mut sim_ttft_diff = Vec::new();
    let file = std::fs::File::open(&args.client)
        .with_context(|| format!("cannot open {}", args.client.display()))?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(tenant) = v["tenant"].as_str() else {
            continue;
        };
        if let (Some(seen), Some(sim)) = (v["ttft_ms"].as_f64(), v["sim_ttft_ms"].as_f64()) {
            sim_ttft_diff.push((seen - sim).abs());
        }
        client.insert(
            tenant.to_string(),
            Seen {
                ttft: v["ttft_ms"].as_f64(),
                itl: v["mean_itl_ms"].as_f64(),
                tokens: v["usage_tokens"]
                    .as_u64()
                    .unwrap_or(v["tokens"].as_u64().unwrap_or(0)),
            },
        );
    }
    let client_total = client.len();
    let q = |v: &mut Vec<f64>, q: f64| -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let idx = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        (v[idx] * 1e4).round() / 1e4
    };
    let sim_vs_client = serde_json::json!({
        "p50": q(&mut sim_ttft_diff, 0.5),
        "p99": q(&mut sim_ttft_diff, 0.99),
        "max": q(&mut sim_ttft_diff, 1.0),
    });
    let Some(access) = &args.access else {
        let out = serde_json::json!({
            "client_requests": client_total,
            "sim_ttft_abs_diff_ms": sim_vs_client,
        });
        println!("{out}");
        return Ok(());
    };
    let mut ttft_diff = Vec::new();
    let mut itl_diff = Vec::new();
    let mut ttft_signed = Vec::new();
    let mut mismatches = 0u64;
    let mut counted_mismatches = 0u64;
    let mut paired = 0u64;
    let file =
        std::fs::File::open(access).with_context(|| format!("cannot open {}", access.display()))?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if !line.contains("\"ttft_ms\"") && !line.contains("\"output_tokens\"") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(tenant) = v["tenant"].as_str() else {
            continue;
        };
        let Some(seen) = client.remove(tenant) else {
            continue;
        };
        paired += 1;
        let tokens = v["output_tokens"].as_u64().unwrap_or(0);
        if tokens != seen.tokens {
            mismatches += 1;
        }
        if let (Some(a), Some(b)) = (v["ttft_ms"].as_f64(), seen.ttft) {
            ttft_diff.push((a - b).abs());
            ttft_signed.push(a - b);
        }
        if let (Some(a), Some(b)) = (v["mean_itl_ms"].as_f64(), seen.itl) {
            itl_diff.push((a - b).abs());
        }
        if v["events"].as_u64().is_some_and(|e| e != seen.tokens) {
            counted_mismatches += 1;
        }
    }
    let out = serde_json::json!({
        "client_requests": client_total,
        "paired": paired,
        "unpaired": client_total as u64 - paired,
        "ttft_abs_diff_ms": {"p50": q(&mut ttft_diff, 0.5), "p99": q(&mut ttft_diff, 0.99), "max": q(&mut ttft_diff, 1.0)},
        "ttft_signed_diff_ms_p50": q(&mut ttft_signed, 0.5),
        "mean_itl_abs_diff_ms": {"p50": q(&mut itl_diff, 0.5), "p99": q(&mut itl_diff, 0.99), "max": q(&mut itl_diff, 1.0)},
        "token_mismatches": mismatches,
        "event_count_mismatches": counted_mismatches,
        "sim_ttft_abs_diff_ms": sim_vs_client,
    });
    println!("{out}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Scrape timing.

fn scrape(args: &ScrapeArgs) -> anyhow::Result<()> {
    let uri: Uri = args.url.parse().context("--url")?;
    let authority = uri
        .authority()
        .context("--url needs host:port")?
        .to_string();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let rt = runtime(1)?;
    rt.block_on(async move {
        let mut times = Vec::new();
        let mut bytes = 0usize;
        for round in 0..=args.repeat {
            let stream = tokio::net::TcpStream::connect(&authority).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                    .await?;
            tokio::spawn(conn);
            let request = Request::get(path.as_str())
                .header(header::HOST, authority.as_str())
                .body(Full::new(Bytes::new()))?;
            let t0 = Instant::now();
            let response = sender.send_request(request).await?;
            let status = response.status();
            // Count the body as it streams: holding 130 MB here would time this client's
            // page faults, not the scrape.
            let mut body = response.into_body();
            let mut received = 0usize;
            while let Some(frame) = body.frame().await {
                if let Some(data) = frame?.data_ref() {
                    received += data.len();
                }
            }
            let took = t0.elapsed();
            if status != StatusCode::OK {
                bail!("{} answered {status}", args.url);
            }
            bytes = received;
            if round > 0 {
                times.push(took.as_secs_f64() * 1e3);
            }
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        let out = serde_json::json!({
            "url": args.url,
            "bytes": bytes,
            "median_ms": (median * 100.0).round() / 100.0,
            "min_ms": (times.first().copied().unwrap_or(f64::NAN) * 100.0).round() / 100.0,
            "max_ms": (times.last().copied().unwrap_or(f64::NAN) * 100.0).round() / 100.0,
        });
        println!("{out}");
        let _ = std::io::stdout().flush();
        Ok(())
    })
}
