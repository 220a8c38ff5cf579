//! `run`: stream load against a target. Sets the run up (loopback check, open-files
//! limit, the recording window), starts one slot per concurrent stream, and prints the
//! JSON summary line that `scripts/bench.sh` parses.

mod conn;
mod stream;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use http::Uri;
use memchr::memmem;
use tokentap_sim::unix_ns;

use crate::cli::RunArgs;
use crate::hist::Hist;
use crate::runtime;
use conn::{connect_h2, H2Sender, Sender};
use stream::{hold_slot, stream_slot};

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
    /// Hold mode: streams that have received `--ready-after-events` token events.
    ready: AtomicUsize,
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

pub(crate) fn run(args: RunArgs) -> anyhow::Result<()> {
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
    let shared = Arc::new(Shared::new(args, uri, authority, start));

    let n = shared.args.concurrency;
    let h2_senders = if shared.args.http2 {
        open_h2(&shared).await?
    } else {
        Vec::new()
    };

    let mut tasks = Vec::with_capacity(n);
    for slot in 0..n {
        let shared = shared.clone();
        let h2 = (!h2_senders.is_empty()).then(|| h2_senders[slot % h2_senders.len()].clone());
        let ramp = shared.args.ramp.as_secs_f64();
        let delay = Duration::try_from_secs_f64(ramp * slot as f64 / n as f64).unwrap_or_default();
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
        tokio::spawn(announce_ready(shared.clone(), path));
    }
    for task in tasks {
        let _ = task.await;
    }
    let finished = Instant::now();

    if let Some(path) = &shared.args.requests_log {
        write_requests_log(&shared, path)?;
    }
    let summary = summary(&shared, finished.duration_since(start));
    println!("{summary}");
    Ok(())
}

impl Shared {
    /// A run of `args` that starts at `start`: its recording window and its end, and
    /// every count at zero.
    fn new(args: RunArgs, uri: Uri, authority: String, start: Instant) -> Shared {
        let (window_start, window_end, end) = if args.requests > 0 && !args.hold {
            // Count mode: everything recorded; `--duration` bounds the whole run.
            (start, start + args.duration, start + args.duration)
        } else {
            let ws = start + args.warmup;
            (ws, ws + args.duration, ws + args.duration)
        };
        Shared {
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
            ready: AtomicUsize::new(0),
            all_ready: AtomicBool::new(false),
            log: Mutex::new(Vec::new()),
            stamp: memmem::Finder::new(b"\"sim_sent_unix_ns\":"),
            received: memmem::Finder::new(b"\"sim_received_unix_ns\":"),
            content: memmem::Finder::new(b"\"content\":\""),
            completion: memmem::Finder::new(b"\"completion_tokens\":"),
            args,
        }
    }
}

/// `--http2`: the h2c connections the streams share (`--h2-connections`, at most one per
/// stream); an error when none could be opened.
async fn open_h2(shared: &Shared) -> anyhow::Result<Vec<H2Sender>> {
    let n = shared.args.concurrency;
    let mut h2_senders = Vec::new();
    let conns = shared.args.h2_connections.clamp(1, n);
    for _ in 0..conns {
        match connect_h2(shared).await {
            Ok(sender) => h2_senders.push(sender),
            Err(err) => {
                shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                eprintln!("tokentap-bench: h2 connect failed: {err:#}");
            }
        }
    }
    if h2_senders.is_empty() {
        bail!("no h2c connection could be opened to {}", shared.args.url);
    }
    Ok(h2_senders)
}

/// `--ready-file`: written (and said on stderr) once every stream is open (and has its
/// `--ready-after-events`).
async fn announce_ready(watcher: Arc<Shared>, path: std::path::PathBuf) {
    loop {
        if watcher.ready.load(Ordering::Relaxed) >= watcher.args.concurrency {
            watcher.all_ready.store(true, Ordering::Relaxed);
            let _ = std::fs::write(&path, b"ready\n");
            eprintln!(
                "tokentap-bench: all {} streams open{}",
                watcher.args.concurrency,
                match watcher.args.ready_after_events {
                    0 => String::new(),
                    n => format!(", {n} token events each"),
                }
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `--requests-log`: one line per request recorded.
fn write_requests_log(shared: &Shared, path: &std::path::Path) -> anyhow::Result<()> {
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
    Ok(())
}

/// The JSON summary line `scripts/bench.sh` parses; `elapsed`: the run's whole length.
fn summary(shared: &Shared, elapsed: Duration) -> serde_json::Value {
    let n = shared.args.concurrency;
    let window = if shared.args.requests > 0 && !shared.args.hold {
        elapsed
    } else {
        shared.args.duration
    }
    .as_secs_f64()
    .max(1e-9);
    let e = &shared.errors;
    let events = shared.events.load(Ordering::Relaxed);
    let completed = shared.completed.load(Ordering::Relaxed);
    serde_json::json!({
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
        "ready": shared.ready.load(Ordering::Relaxed),
        "open_max": shared.open_max.load(Ordering::Relaxed),
        "all_open": shared.all_ready.load(Ordering::Relaxed)
            || shared.established.load(Ordering::Relaxed) >= n,
    })
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
