//! `tokentap inject` (built with `--features inject`): the CLI's I/O around
//! `tokentap_inject::manifests`, and `--serve`, the mutating admission webhook over TLS
//! around `tokentap_inject::admission`. What injection means is decided in the
//! `tokentap-inject` crate only; this file reads, writes and serves.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokentap_inject::admission::{self, Stats};
use tokentap_inject::manifests::{self, Mode};

use crate::InjectArgs;

pub fn run(args: InjectArgs) -> ExitCode {
    let options = args.options();
    if args.serve {
        crate::init_logs(tokentap::config::LogFormat::Json, "info");
        return crate::report(crate::runtime().and_then(|rt| rt.block_on(serve(args, options))));
    }
    let text = match read_input(args.file.as_deref()) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("tokentap inject: {e:#}");
            return ExitCode::from(2);
        }
    };
    let mode = if args.uninject {
        Mode::Uninject
    } else {
        Mode::Inject
    };
    match manifests::run(&text, &options, mode) {
        Ok(report) => {
            print!("{}", report.output);
            for note in &report.notes {
                eprintln!("{note}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tokentap inject: {e}");
            ExitCode::from(2)
        }
    }
}

fn read_input(file: Option<&Path>) -> anyhow::Result<String> {
    let limit = u64::try_from(manifests::MAX_INPUT).unwrap_or(u64::MAX);
    let mut text = String::new();
    match file {
        None => {
            std::io::stdin()
                .take(limit.saturating_add(1))
                .read_to_string(&mut text)
                .context("reading standard input")?;
        }
        Some(p) if p == Path::new("-") => {
            std::io::stdin()
                .take(limit.saturating_add(1))
                .read_to_string(&mut text)
                .context("reading standard input")?;
        }
        Some(p) => {
            std::fs::File::open(p)
                .with_context(|| format!("cannot open {}", p.display()))?
                .take(limit.saturating_add(1))
                .read_to_string(&mut text)
                .with_context(|| format!("reading {}", p.display()))?;
        }
    }
    Ok(text)
}

/// A certificate and key read from files (cert-manager's Secret, mounted), read again
/// when the files change: a renewal needs no restart.
#[derive(Debug)]
struct Certs {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<CertState>,
}

#[derive(Debug)]
struct CertState {
    checked: Instant,
    modified: Option<SystemTime>,
    current: Arc<CertifiedKey>,
}

impl Certs {
    fn load(cert: &Path, key: &Path) -> anyhow::Result<Arc<CertifiedKey>> {
        let open = |p: &Path| {
            std::fs::File::open(p)
                .map(std::io::BufReader::new)
                .with_context(|| format!("cannot read {}", p.display()))
        };
        let chain = rustls_pemfile::certs(&mut open(cert)?)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| cert.display().to_string())?;
        anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
        let key_der = rustls_pemfile::private_key(&mut open(key)?)
            .with_context(|| key.display().to_string())?
            .with_context(|| format!("{} holds no private key", key.display()))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key_der)
            .map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
        Ok(Arc::new(CertifiedKey::new(chain, signing)))
    }

    fn modified(&self) -> Option<SystemTime> {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        m(&self.cert).max(m(&self.key))
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().ok()?;
        if state.checked.elapsed() >= Duration::from_secs(10) {
            state.checked = Instant::now();
            let modified = self.modified();
            if modified != state.modified {
                match Certs::load(&self.cert, &self.key) {
                    Ok(current) => {
                        tracing::info!("webhook certificate reloaded");
                        state.current = current;
                        state.modified = modified;
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "webhook certificate not reloaded; keeping the one in use")
                    }
                }
            }
        }
        Some(state.current.clone())
    }
}

async fn serve(args: InjectArgs, options: tokentap_inject::Options) -> anyhow::Result<()> {
    let (Some(cert), Some(key)) = (args.tls_cert.clone(), args.tls_key.clone()) else {
        anyhow::bail!(
            "--serve needs --tls-cert and --tls-key (the API server calls webhooks over TLS only)"
        );
    };
    let certs = Certs {
        state: Mutex::new(CertState {
            checked: Instant::now(),
            modified: None,
            current: Certs::load(&cert, &key)?,
        }),
        cert,
        key,
    };
    if let Ok(mut s) = certs.state.lock() {
        s.modified = certs.modified();
    }
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(certs));
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

    let listen: SocketAddr = args.listen.parse().context("--listen")?;
    let admin: SocketAddr = args.admin.parse().context("--admin")?;
    let webhook = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let admin_listener = tokio::net::TcpListener::bind(admin)
        .await
        .with_context(|| format!("binding {admin}"))?;
    tracing::info!(%listen, %admin, "tokentap inject webhook serving");
    let stats = Arc::new(Stats::default());
    let options = Arc::new(options);

    let admin_stats = stats.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = admin_listener.accept().await else {
                continue;
            };
            let stats = admin_stats.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let stats = stats.clone();
                        async move {
                            Ok::<_, std::convert::Infallible>(admin_response(
                                req.uri().path(),
                                &stats,
                            ))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let accept = async {
        loop {
            let (stream, peer) = match webhook.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let stats = stats.clone();
            let options = options.clone();
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await
                else {
                    tracing::debug!(%peer, "TLS handshake failed");
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let stats = stats.clone();
                    let options = options.clone();
                    async move { Ok::<_, std::convert::Infallible>(mutate(req, &stats, &options).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    };
    tokio::select! {
        _ = accept => Ok(()),
        _ = crate::shutdown_signal() => {
            tracing::info!("tokentap inject webhook stopping");
            Ok(())
        }
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn admin_response(path: &str, stats: &Stats) -> Response<Full<Bytes>> {
    match path {
        "/healthz" | "/readyz" => text(StatusCode::OK, "ok\n", "text/plain"),
        "/metrics" => text(
            StatusCode::OK,
            stats.render(),
            "text/plain; version=0.0.4; charset=utf-8",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n", "text/plain"),
    }
}

async fn mutate(
    req: Request<hyper::body::Incoming>,
    stats: &Stats,
    options: &tokentap_inject::Options,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&http::Method::POST, "/mutate") => {}
        (&http::Method::GET, "/healthz" | "/readyz") => {
            return text(StatusCode::OK, "ok\n", "text/plain")
        }
        _ => return text(StatusCode::NOT_FOUND, "not found\n", "text/plain"),
    }
    let body = match Limited::new(req.into_body(), admission::MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            stats.record_bad();
            return text(StatusCode::PAYLOAD_TOO_LARGE, "too large\n", "text/plain");
        }
    };
    match admission::review(&body, options) {
        Ok(reply) => {
            stats.record(reply.outcome);
            match &reply.message {
                Some(m) => {
                    tracing::warn!(result = reply.outcome.result(), message = %m, "admitted without tokentap")
                }
                None => tracing::info!(result = reply.outcome.result(), "review answered"),
            }
            text(StatusCode::OK, reply.body, "application/json")
        }
        Err(e) => {
            stats.record_bad();
            tracing::warn!(error = %e, "not an AdmissionReview");
            text(StatusCode::BAD_REQUEST, format!("{e}\n"), "text/plain")
        }
    }
}
