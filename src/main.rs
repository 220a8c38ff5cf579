//! The `tokentap` command: run the proxy, check a config, run the simulator or the demo.
//! The only place that uses `anyhow` and decides exit codes: 0 success, 1 runtime
//! failure, 2 invalid configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokentap::config::{units::parse_duration, Config, LogFormat, Overrides};
use tokentap::reload::load_tokenizer;
use tokentap_sim::{ModelProfile, RateLimit, Sim, SimConfig, TokensPerEvent, UsageMode};

mod demo_cmd;
#[cfg(feature = "inject")]
mod inject_cmd;

/// tokentap: a transparent proxy that measures how fast LLMs stream (TTFT, inter-token
/// latency, tokens/s) and exports Prometheus metrics.
///
/// Without a subcommand it runs the proxy. Flags override the config file.
#[derive(Parser, Debug)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug, Default)]
struct RunArgs {
    /// Upstream inference server URL, e.g. http://127.0.0.1:8000 (config: upstream.url).
    #[arg(long, env = "TOKENTAP_UPSTREAM")]
    upstream: Option<String>,
    /// Proxy listen address (config: listen; default 0.0.0.0:8080).
    #[arg(long, env = "TOKENTAP_LISTEN")]
    listen: Option<String>,
    /// Admin address for /metrics, /healthz, /readyz (config: admin; default 0.0.0.0:9464).
    #[arg(long, env = "TOKENTAP_ADMIN")]
    admin: Option<String>,
    /// YAML config file (see config/ for commented examples).
    #[arg(long, env = "TOKENTAP_CONFIG")]
    config: Option<PathBuf>,
    /// Log format: text or json (config: log.format).
    #[arg(long, env = "TOKENTAP_LOG_FORMAT")]
    log_format: Option<String>,
    /// Log filter, e.g. info or tokentap=debug (config: log.level).
    #[arg(long, env = "TOKENTAP_LOG")]
    log_level: Option<String>,
    /// Serve the live view (/ui, /api/live/*) on its own listener: true or false
    /// (config: ui.enabled; default true).
    #[arg(long, env = "TOKENTAP_UI")]
    ui: Option<bool>,
    /// The live view's address (config: ui.listen; default 127.0.0.1:9465).
    #[arg(long, env = "TOKENTAP_UI_LISTEN")]
    ui_listen: Option<String>,
    /// How long in-flight streams get to finish after SIGTERM, e.g. 30s (config:
    /// shutdown.drain_timeout; default 30s). `tokentap inject` sets it to fit the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "TOKENTAP_DRAIN_TIMEOUT", value_parser = parse_duration)]
    drain_timeout: Option<Duration>,
    /// The request header that names the tenant, e.g. x-tenant-id (config:
    /// tenants.sources, which this replaces with this one header).
    #[arg(long, env = "TOKENTAP_TENANT_HEADER", value_parser = parse_header_name)]
    tenant_header: Option<http::HeaderName>,
}

/// The flags applied to a loaded config rather than through `Overrides`: set after every
/// load, the first and each SIGHUP reload.
#[derive(Clone, Debug, Default)]
struct AfterLoad {
    drain_timeout: Option<Duration>,
    tenant_header: Option<http::HeaderName>,
}

impl AfterLoad {
    fn apply(&self, config: &mut Config) {
        if let Some(drain) = self.drain_timeout {
            config.shutdown.drain_timeout = drain;
        }
        if let Some(header) = &self.tenant_header {
            config.tenants = vec![tokentap::config::TenantSource::Header(header.clone())];
        }
    }
}

fn parse_header_name(text: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::try_from(text).map_err(|_| format!("`{text}` is not a valid header name"))
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate a config file; prints every error with its key path and line:column.
    CheckConfig {
        /// The YAML file to check.
        file: PathBuf,
    },
    /// Run a simulated streaming backend with known timing: every HTTP dialect, and the
    /// SGLang, vLLM, TensorRT-LLM and Triton gRPC services (h2c) on the same port.
    Sim(SimArgs),
    /// Run the simulator, tokentap and a traffic generator, and show live figures.
    Demo(DemoArgs),
    /// The live view's figures in the terminal, from a running tokentap's live view
    /// (ui.listen): a table per model over the window and the slowest streams in flight.
    /// q quits.
    Top(TopArgs),
    /// Add tokentap as a native sidecar to Kubernetes manifests (Deployment, StatefulSet,
    /// DaemonSet, ReplicaSet, Job, CronJob, Pod; multi-document YAML or JSON, Lists), and
    /// move the Services in the input to its port; or, with --serve, run the mutating
    /// admission webhook that does the same to pods labelled tokentap.dev/inject=enabled.
    /// Built with `--features inject`.
    Inject(InjectArgs),
}

/// `tokentap inject`'s flags. A pod-template annotation (tokentap.dev/<flag name>) wins
/// over the flag, which wins over the default.
#[derive(Args, Debug)]
struct InjectArgs {
    /// Manifests to read; - or nothing for standard input. The result goes to standard
    /// output, notes (Services outside the input, with the kubectl patch to run) to
    /// standard error.
    file: Option<PathBuf>,
    /// Remove what an earlier injection added (comments are not kept).
    #[arg(long, conflicts_with = "serve")]
    uninject: bool,
    /// The tokentap image.
    #[arg(long, default_value = concat!("tokentap:", env!("CARGO_PKG_VERSION")))]
    image: String,
    /// The engine's port (default: the engine container's single declared port).
    #[arg(long)]
    engine_port: Option<u16>,
    /// The engine container, when the pod has several.
    #[arg(long)]
    engine_container: Option<String>,
    /// An existing ConfigMap with a tokentap.yaml key, mounted and passed with --config
    /// (without it the sidecar is configured by its args alone).
    #[arg(long)]
    config_map: Option<String>,
    /// tokentap's proxy port in the pod (default 8080).
    #[arg(long)]
    http_port: Option<u16>,
    /// tokentap's admin port (/metrics, /healthz, /readyz; default 9464).
    #[arg(long)]
    metrics_port: Option<u16>,
    /// The live view's port on the pod's loopback (default 9465; not a container port).
    #[arg(long)]
    ui_port: Option<u16>,
    /// The request header that names the tenant (default: the config's, x-tenant-id).
    #[arg(long)]
    tenant_header: Option<String>,
    /// The sidecar's CPU request (default 100m).
    #[arg(long)]
    cpu_request: Option<String>,
    /// The sidecar's CPU limit (default 1).
    #[arg(long)]
    cpu_limit: Option<String>,
    /// The sidecar's memory request (default 64Mi).
    #[arg(long)]
    memory_request: Option<String>,
    /// The sidecar's memory limit (default 256Mi).
    #[arg(long)]
    memory_limit: Option<String>,
    /// Run the admission webhook (AdmissionReview v1 on POST /mutate, over TLS).
    #[arg(long)]
    serve: bool,
    /// The webhook's TLS listener.
    #[arg(long, default_value = "0.0.0.0:8443", requires = "serve")]
    listen: String,
    /// The webhook's plain-HTTP admin listener: /metrics, /healthz, /readyz.
    #[arg(long, default_value = "0.0.0.0:9464", requires = "serve")]
    admin: String,
    /// PEM certificate chain for the webhook (read again when the file changes).
    #[arg(long, requires = "serve")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for the webhook.
    #[arg(long, requires = "serve")]
    tls_key: Option<PathBuf>,
}

#[cfg(feature = "inject")]
impl InjectArgs {
    fn options(&self) -> tokentap_inject::Options {
        tokentap_inject::Options {
            image: self.image.clone(),
            engine_port: self.engine_port,
            engine_container: self.engine_container.clone(),
            config_map: self.config_map.clone(),
            http_port: self.http_port,
            metrics_port: self.metrics_port,
            ui_port: self.ui_port,
            tenant_header: self.tenant_header.clone(),
            cpu_request: self.cpu_request.clone(),
            cpu_limit: self.cpu_limit.clone(),
            memory_request: self.memory_request.clone(),
            memory_limit: self.memory_limit.clone(),
        }
    }
}

#[cfg(not(feature = "inject"))]
fn inject_missing(_: InjectArgs) -> ExitCode {
    eprintln!(
        "tokentap inject: this tokentap was built without it. Build it with\n  \
         cargo build --release --features inject\n\
         (or cargo install --path . --features inject); the image from deploy/Dockerfile has it."
    );
    ExitCode::from(2)
}

#[derive(Args, Debug)]
struct TopArgs {
    /// The live view's address (host:port, ui.listen) of the tokentap to watch.
    #[arg(long, default_value = "127.0.0.1:9465", env = "TOKENTAP_UI_LISTEN")]
    addr: String,
    /// The window in seconds: 10, 60 or 300.
    #[arg(long, default_value = "60", value_parser = parse_window)]
    window: u64,
}

#[derive(Args, Debug)]
struct SimArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:8000", env = "TOKENTAP_SIM_LISTEN")]
    listen: SocketAddr,
    /// Model names served (comma-separated); all share the timing below.
    #[arg(long, value_delimiter = ',', default_value = "sim-model")]
    models: Vec<String>,
    /// Time to first token, e.g. 150ms.
    #[arg(long, default_value = "150ms", value_parser = parse_duration)]
    ttft: Duration,
    /// Inter-token latency, e.g. 20ms.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    itl: Duration,
    /// Uniform jitter as a fraction of TTFT and of each gap (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Output tokens per response (a request's max_tokens caps it).
    #[arg(long, default_value_t = 40)]
    tokens: u32,
    /// Tokens per streamed event: N, or MIN-MAX drawn per event (e.g. 1-5). An event of k
    /// tokens comes k inter-token latencies after the previous one; usage reports the
    /// true total. TGI streams stay one token per event.
    #[arg(long, default_value = "1")]
    tokens_per_event: TokensPerEvent,
    /// Wait this long after a stream's last token before its finish, usage and end.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    hold_before_end: Duration,
    /// Usage reporting: requested (stream_options.include_usage), always, never, continuous.
    #[arg(long, default_value = "requested")]
    usage: UsageMode,
    /// Do not send a role-only chunk before the first token.
    #[arg(long)]
    no_role_chunk: bool,
    /// Embed the wall-clock send time and the request's arrival time in each chunk (for
    /// the benchmark).
    #[arg(long)]
    stamp: bool,
    /// Compress responses (zstd or gzip) for clients that accept it, flushed per event;
    /// gRPC messages gzip-compressed for clients whose grpc-accept-encoding names gzip.
    #[arg(long)]
    compress: bool,
    /// Rate-limit the hosted APIs' paths (OpenAI, Anthropic, Gemini) to this many requests
    /// per minute, shared by all models: every answer carries the API's rate-limit
    /// headers, and a request past the limit is a 429 with Retry-After.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    rate_limit_rpm: Option<u32>,
    /// With --rate-limit-rpm, also limit output tokens per minute (default: enough for
    /// that many full-length responses, so requests run out first).
    #[arg(long, requires = "rate_limit_rpm", value_parser = clap::value_parser!(u32).range(1..))]
    rate_limit_tpm: Option<u32>,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Proxy listen address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Admin (metrics) address.
    #[arg(long, default_value = "127.0.0.1:9464")]
    admin: SocketAddr,
    /// The live view's address (and `top`'s, with --top).
    #[arg(long, default_value = "127.0.0.1:9465")]
    ui_listen: SocketAddr,
    /// Stop after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Concurrent client streams.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Show `tokentap top` instead of the text table.
    #[arg(long)]
    top: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig { file }) => check_config(&file),
        Some(Command::Sim(args)) => {
            init_logs(LogFormat::Text, "info");
            report(runtime().and_then(|rt| rt.block_on(run_sim(args))))
        }
        Some(Command::Top(args)) => top(&args.addr, args.window),
        #[cfg(feature = "inject")]
        Some(Command::Inject(args)) => inject_cmd::run(args),
        #[cfg(not(feature = "inject"))]
        Some(Command::Inject(args)) => inject_missing(args),
        Some(Command::Demo(args)) if args.top => {
            init_logs(LogFormat::Text, "error");
            demo_with_top(args)
        }
        Some(Command::Demo(args)) => {
            init_logs(LogFormat::Text, "warn");
            let options = demo_cmd::DemoOptions {
                listen: args.listen,
                admin: args.admin,
                ui_listen: args.ui_listen,
                duration: args.duration,
                concurrency: args.concurrency.max(1),
                ..Default::default()
            };
            report(runtime().and_then(|rt| {
                rt.block_on(demo_cmd::run(options, shutdown_signal()))
                    .context("demo failed")
            }))
        }
        None => run_proxy(cli.run),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    start_runtime(tokio::runtime::Builder::new_multi_thread())
}

/// The proxy's own runtime: one thread for accepting, the admin port, the upstream probe
/// and signals. Proxy connections are served on the server's worker threads.
fn control_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    start_runtime(tokio::runtime::Builder::new_current_thread())
}

fn start_runtime(mut builder: tokio::runtime::Builder) -> anyhow::Result<tokio::runtime::Runtime> {
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// A live view window: 10, 60 or 300 seconds.
fn parse_window(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(window @ (10 | 60 | 300)) => Ok(window),
        _ => Err(format!("`{value}` is not one of 10, 60, 300")),
    }
}

/// `tokentap top` on the live view at `addr`: 0 when the user quits, 1 (with a message)
/// when the server goes away or cannot be reached.
fn top(addr: &str, window: u64) -> ExitCode {
    let options = tokentap::top::TopOptions {
        addr: addr.to_string(),
        window,
    };
    match tokentap::top::run(&options) {
        Ok(tokentap::top::TopEnd::Quit) => ExitCode::SUCCESS,
        Ok(tokentap::top::TopEnd::ServerGone(why)) => {
            eprintln!("tokentap top: the server at {addr} went away ({why})");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("tokentap top: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `tokentap demo --top`: the demo without its table, and `top` on its live view until
/// the user quits.
fn demo_with_top(args: DemoArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(err) => return report(Err(err)),
    };
    let options = demo_cmd::DemoOptions {
        listen: args.listen,
        admin: args.admin,
        ui_listen: args.ui_listen,
        duration: args.duration,
        concurrency: args.concurrency.max(1),
        table: false,
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let demo = runtime.spawn(demo_cmd::run_reporting(
        options,
        async {
            let _ = stopped.await;
        },
        move |ui| {
            let _ = bound_tx.send(ui);
        },
    ));
    // The live view's bound address (the port, when --ui-listen asked for port 0), once
    // the demo's tokentap is bound; if the demo failed first, top says it cannot connect.
    let ui = bound_rx
        .recv_timeout(Duration::from_secs(30))
        .ok()
        .flatten()
        .unwrap_or(args.ui_listen);
    let code = top(&ui.to_string(), 60);
    let _ = stop.send(());
    match runtime.block_on(demo) {
        Ok(Ok(())) => code,
        Ok(Err(err)) => report(Err(anyhow::Error::new(err).context("demo failed"))),
        Err(err) => report(Err(anyhow::Error::new(err).context("demo failed"))),
    }
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tokentap: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    // The file must stand on its own: no flags or environment are applied.
    let checked = Config::from_file(file, &Overrides::default())
        .and_then(|config| load_tokenizer(&config).map(|_| config));
    match checked {
        Ok(config) => {
            let ui = if config.ui {
                config.ui_listen.to_string()
            } else {
                "off".to_string()
            };
            println!(
                "{}: ok (listen {}, admin {}, live view {ui}, upstream {})",
                file.display(),
                config.listen,
                config.admin,
                config.upstream.url()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::from(2)
        }
    }
}

fn run_proxy(args: RunArgs) -> ExitCode {
    let overrides = Overrides {
        upstream: args.upstream,
        listen: args.listen,
        admin: args.admin,
        log_format: args.log_format,
        log_level: args.log_level,
        ui: args.ui,
        ui_listen: args.ui_listen,
        environment: otel_environment(),
    };
    let loaded = match &args.config {
        Some(path) => Config::from_file(path, &overrides),
        None => Config::from_overrides(&overrides),
    };
    let mut config = match loaded {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(2);
        }
    };
    let after_load = AfterLoad {
        drain_timeout: args.drain_timeout,
        tenant_header: args.tenant_header.clone(),
    };
    after_load.apply(&mut config);
    init_logs(config.log.format, &config.log.level);
    let runtime = match control_runtime() {
        Ok(runtime) => runtime,
        Err(err) => return report(Err(err)),
    };
    runtime.block_on(async move {
        let server = match tokentap::Server::bind(config).await {
            Ok(server) => server,
            // A tokenizer that validated but cannot be loaded: an invalid configuration.
            Err(tokentap::ServeError::Config(err)) => {
                eprintln!("{err}");
                return ExitCode::from(2);
            }
            Err(err) => return report(Err(anyhow::Error::new(err).context("proxy failed"))),
        };
        if let Some(path) = args.config {
            let reloader = server.reloader();
            server.supervisor().spawn("reload", move || {
                reload_on_sighup(
                    reloader.clone(),
                    path.clone(),
                    overrides.clone(),
                    after_load.clone(),
                )
            });
        }
        report(server.run(shutdown_signal()).await.context("proxy failed"))
    })
}

/// The variables the `otlp` settings read: the OpenTelemetry SDK's and the pod's identity.
fn otel_environment() -> std::collections::BTreeMap<String, String> {
    std::env::vars()
        .filter(|(name, _)| name.starts_with("OTEL_") || name.starts_with("K8S_"))
        .collect()
}

/// On SIGHUP, re-read and validate the config file and swap it in atomically. An invalid
/// file is rejected with a logged error and the running configuration keeps serving.
async fn reload_on_sighup(
    reloader: tokentap::reload::Reloader,
    path: PathBuf,
    overrides: Overrides,
    after_load: AfterLoad,
) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; config reload disabled");
            return;
        };
        while hangups.recv().await.is_some() {
            let loaded = Config::from_file(&path, &overrides).map(|mut config| {
                after_load.apply(&mut config);
                config
            });
            match loaded {
                Err(err) => tracing::error!(
                    error = %err,
                    "config reload rejected; the running configuration keeps serving"
                ),
                Ok(config) => match reloader.reload(config) {
                    Ok(None) => tracing::info!(file = %path.display(), "config reloaded"),
                    Ok(Some(warning)) => {
                        tracing::warn!(file = %path.display(), "config reloaded; {warning}")
                    }
                    Err(err) => tracing::error!(
                        error = %err,
                        "config reload rejected; the running configuration keeps serving"
                    ),
                },
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (reloader, path, overrides, after_load);
}

async fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    let models = args
        .models
        .iter()
        .map(|name| ModelProfile {
            jitter: args.jitter.clamp(0.0, 1.0),
            tokens_per_event: args.tokens_per_event,
            hold_before_end: args.hold_before_end,
            ..ModelProfile::new(name, args.ttft, args.itl, args.tokens)
        })
        .collect();
    let rate_limit = args.rate_limit_rpm.map(|requests_per_minute| RateLimit {
        requests_per_minute,
        tokens_per_minute: args
            .rate_limit_tpm
            .unwrap_or_else(|| requests_per_minute.saturating_mul(args.tokens.max(1))),
    });
    let config = SimConfig {
        models,
        usage: args.usage,
        role_chunk: !args.no_role_chunk,
        stamp: args.stamp,
        compress: args.compress,
        rate_limit,
        ..SimConfig::default()
    };
    let sim = Sim::bind(args.listen, config)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(addr = %sim.local_addr(), "simulator listening");
    sim.run(shutdown_signal()).await;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

fn init_logs(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Colours (ANSI escapes) only for a terminal: a container's log, a file or a pipe
    // would keep the escapes as text, and writing them is most of the work of an access
    // line (about 24,000 of 39,000 instructions per request, docs/PERFORMANCE.md). On a
    // terminal tracing-subscriber decides as before (NO_COLOR turns them off).
    let builder = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        builder
    } else {
        builder.with_ansi(false)
    };
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        // tracing-subscriber's text fields, written for less (src/log_fields.rs).
        LogFormat::Text => builder.fmt_fields(tokentap::log_fields::PlainFields).init(),
    }
}
