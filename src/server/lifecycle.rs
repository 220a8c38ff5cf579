//! The server's lifecycle: bind, start, drain, stop.
//!
//! [`Server::bind`] builds what the configuration names and binds every port first, so
//! callers (tests, the demo) learn the real addresses before traffic flows.
//! [`Server::run`] starts the workers and the background tasks (`background.rs`), runs
//! the accept loop (`accept.rs`) until the shutdown future resolves, then stops
//! accepting, fails `/readyz`, lets in-flight streams finish up to the drain deadline,
//! stops the workers (cutting and counting what is still open) and last the background
//! tasks. The order of these steps is written here, once.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::accept::Accepting;
use super::background::{Background, Start};
use super::connections::ConnectionLimit;
use super::serve::connection_builder;
use super::workers::Workers;
use crate::admin::Readiness;
use crate::config::{Config, ConfigError, ListenerTls};
use crate::metrics::Metrics;
use crate::otlp::transport::{Transport, TransportError};
use crate::proxy::upstream::{ClientError, UpstreamClient};
use crate::proxy::Proxy;
use crate::reload::{load_tokenizer, Reloader};
use crate::summary::Sinks;
use crate::supervise::Supervisor;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A setting that validated but could not be built (a tokenizer file that cannot be
    /// loaded); names its key and line like a validation error.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("listener TLS: {0}")]
    Tls(String),
    /// A TLS file of the OTLP export, named by its key or variable.
    #[error("OTLP: {0}")]
    Otlp(#[from] TransportError),
    #[error("cannot start the worker threads: {0}")]
    Workers(std::io::Error),
}

/// A bound, not yet serving, tokentap.
pub struct Server {
    /// The configuration the process starts with (what a reload compares with).
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    proxy_listener: TcpListener,
    admin_listener: TcpListener,
    /// The live view's (`ui.listen`), while `ui.enabled`.
    ui_listener: Option<TcpListener>,
    proxy: Arc<Proxy>,
    tls: Option<TlsAcceptor>,
    readiness: Arc<Readiness>,
    workers: usize,
    /// The OTLP push's and the span export's connections, when on.
    otlp_transports: (Option<Transport>, Option<Transport>),
    /// Restarts the background tasks that fail.
    supervisor: Supervisor,
}

impl Server {
    /// Load the tokenizer, build the upstream client and bind the proxy and admin ports.
    pub async fn bind(config: Config) -> Result<Server, ServeError> {
        let tokenizer = load_tokenizer(&config)?;
        let metrics = Metrics::with_names(
            &config.metrics.buckets,
            &config.metrics.native_histograms,
            &config.labels,
            config.metrics.names,
        );
        let upstream = UpstreamClient::new(&config.upstream)?;
        let tls = config.tls.as_ref().map(tls_acceptor).transpose()?;
        // Built now, so a TLS file of the OTLP export that cannot be used stops the start.
        let otlp_transports = match &config.otlp {
            Some(otlp) => (
                Some(Transport::new(&otlp.link, otlp.url.clone())?),
                otlp.traces
                    .as_ref()
                    .map(|traces| Transport::new(&traces.link, traces.url.clone()))
                    .transpose()?,
            ),
            None => (None, None),
        };
        let proxy_listener = bind_proxy(config.listen)?;
        let admin_listener = bind_admin("admin", config.admin).await?;
        let ui_listener = if config.ui {
            Some(bind_admin("live view", config.ui_listen).await?)
        } else {
            None
        };
        let readiness = Arc::new(Readiness::default());
        readiness.listening.store(true, Ordering::Relaxed);
        let config = Arc::new(config);
        metrics.set_objective_targets(crate::summary::objectives::targets(
            config.objectives.as_ref(),
        ));
        let sinks = Sinks::new(metrics.clone());
        let proxy = Proxy::new(config.clone(), upstream, tokenizer, sinks);
        let supervisor = Supervisor::new(metrics.clone(), readiness.clone());
        Ok(Server {
            config,
            metrics,
            proxy_listener,
            admin_listener,
            ui_listener,
            proxy,
            tls,
            readiness,
            workers: Workers::default_count(),
            otlp_transports,
            supervisor,
        })
    }

    /// Serve proxy connections on `count` worker threads instead of one per CPU.
    pub fn with_workers(mut self, count: usize) -> Server {
        self.workers = count.max(1);
        self
    }

    /// The bound proxy address (useful with port 0).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_listener
            .local_addr()
            .unwrap_or(self.config.listen)
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .unwrap_or(self.config.admin)
    }

    /// The bound address of the live view (`ui.listen`), while `ui.enabled`.
    pub fn ui_addr(&self) -> Option<SocketAddr> {
        let listener = self.ui_listener.as_ref()?;
        Some(listener.local_addr().unwrap_or(self.config.ui_listen))
    }

    /// A handle to reload the configuration while serving.
    pub fn reloader(&self) -> Reloader {
        Reloader::new(self.proxy.clone(), self.config.clone())
    }

    /// The metric families this server exports.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The supervisor of this server's background tasks, for one started beside it (the
    /// SIGHUP reload): its failures count and show in `/readyz` like the server's own.
    pub fn supervisor(&self) -> Supervisor {
        self.supervisor.clone()
    }

    /// Serve until `shutdown` resolves, then drain.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let Server {
            config,
            metrics,
            proxy_listener,
            admin_listener,
            ui_listener,
            proxy,
            tls,
            readiness,
            workers,
            otlp_transports,
            supervisor,
        } = self;
        let workers = Workers::start(workers).map_err(ServeError::Workers)?;
        // Before the admin port serves: no scrape sees the limit gauge unset.
        let limit = ConnectionLimit::at_start(
            config.limits.max_connections,
            workers.count(),
            metrics.clone(),
        );
        let background = Background::start(Start {
            config: &config,
            metrics: &metrics,
            readiness: &readiness,
            proxy: &proxy,
            supervisor: &supervisor,
            admin_listener,
            ui_listener,
            otlp_transports,
        });
        tracing::info!(
            listen = %proxy_listener.local_addr().unwrap_or(config.listen),
            upstream = %proxy.active().config.upstream.url(),
            tls = tls.is_some(),
            workers = workers.count(),
            max_connections = limit.limit(),
            "proxy listening"
        );
        let (closing, closing_rx) = watch::channel(false);
        let accepting = Accepting {
            listener: proxy_listener,
            limit,
            builder: connection_builder(&config),
            graceful: GracefulShutdown::new(),
            closing: closing_rx,
            header_read_timeout: config.limits.header_read_timeout,
            proxy: proxy.clone(),
            tls,
        };
        let graceful = accepting.run(&workers, shutdown).await;

        // No longer accepting: fail readiness, and let in-flight streams finish.
        readiness.draining.store(true, Ordering::Relaxed);
        let _ = closing.send(true);
        drain(graceful, &proxy, &metrics).await;
        // Streams still open are cut here; each is counted before `run` returns.
        workers.stop().await;
        // After the workers: the last exports carry the final counts.
        background.stop().await;
        Ok(())
    }
}

/// Wait for in-flight connections to finish, up to `shutdown.drain_timeout`.
async fn drain(graceful: GracefulShutdown, proxy: &Proxy, metrics: &Metrics) {
    let in_flight = graceful.count();
    let drain = proxy.active().config.shutdown.drain_timeout;
    let tunnels = proxy.tunnels().open();
    tracing::info!(connections = in_flight, tunnels, deadline = ?drain, "draining");
    // hyper lets go of an upgraded connection: its tunnel is waited for on its own.
    let connections_and_tunnels = async {
        graceful.shutdown().await;
        proxy.tunnels().all_closed().await;
    };
    match tokio::time::timeout(drain, connections_and_tunnels).await {
        Ok(()) => tracing::info!("drained; exiting"),
        Err(_) => tracing::warn!(
            streams = metrics.streams_in_flight.get(),
            "drain deadline passed; remaining streams are cut and counted as cancelled"
        ),
    }
}

/// The proxy port's listen backlog: how many clients, their handshake done, the kernel
/// holds until the accept loop takes them. Past it the kernel drops a new client's SYN and
/// the client tries again only 1 s, 3 s, 7 s... later. At `limits.max_connections` the
/// loop stops accepting by design, so waiting clients queue here, not just a burst: more
/// than the 128 of std's and tokio's `TcpListener::bind`, and than nginx's 511 (sized for
/// a burst, and to fill a power-of-two SYN table on old kernels). Each waiting client
/// costs kernel memory, no descriptor. The kernel lowers it
/// to `net.core.somaxconn` (4096 since Linux 5.4, 128 before).
const PROXY_BACKLOG: u32 = 1024;

/// Bind the proxy port with [`PROXY_BACKLOG`], otherwise as `TcpListener::bind` does:
/// `SO_REUSEADDR` on Unix (a restart can rebind while old connections are in
/// `TIME_WAIT`), an IPv6 address as the system's default (dual-stack on Linux).
fn bind_proxy(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let bind = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // Not on Windows, where it would let another socket take the port (as tokio).
        #[cfg(not(windows))]
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(PROXY_BACKLOG)
    };
    bind().map_err(|source| ServeError::Bind {
        what: "proxy",
        addr,
        source,
    })
}

/// Bind the admin port or the live view's (`what`): each holds at most
/// [`admin::MAX_CONNECTIONS`](crate::admin::MAX_CONNECTIONS), and the default backlog of 128 is plenty for scrapes,
/// probes and viewers.
async fn bind_admin(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { what, addr, source })
}

/// The proxy port's TLS (`tls.cert_file`, `tls.key_file`), offering h2 and HTTP/1.1 by
/// ALPN.
fn tls_acceptor(tls: &ListenerTls) -> Result<TlsAcceptor, ServeError> {
    use std::fs::File;
    use std::io::BufReader;
    let open = |path: &std::path::Path| {
        File::open(path)
            .map(BufReader::new)
            .map_err(|e| ServeError::Tls(format!("cannot read {}: {e}", path.display())))
    };
    let certs = rustls_pemfile::certs(&mut open(&tls.cert_file)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ServeError::Tls(format!("{}: {e}", tls.cert_file.display())))?;
    if certs.is_empty() {
        return Err(ServeError::Tls(format!(
            "{} holds no certificate",
            tls.cert_file.display()
        )));
    }
    let key = rustls_pemfile::private_key(&mut open(&tls.key_file)?)
        .map_err(|e| ServeError::Tls(format!("{}: {e}", tls.key_file.display())))?
        .ok_or_else(|| {
            ServeError::Tls(format!("{} holds no private key", tls.key_file.display()))
        })?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ServeError::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| ServeError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    #[tokio::test]
    async fn the_proxy_port_binds_like_tokio_on_ipv4_and_ipv6() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let addr: SocketAddr = addr.parse().expect("an address");
            let listener = match bind_proxy(addr) {
                Ok(listener) => listener,
                // A host without IPv6 (some containers): nothing to check there.
                Err(ServeError::Bind { source, .. })
                    if addr.is_ipv6() && source.kind() == std::io::ErrorKind::AddrNotAvailable =>
                {
                    continue
                }
                Err(err) => panic!("{addr}: {err}"),
            };
            let bound = listener.local_addr().expect("bound");
            assert_eq!(bound.ip(), addr.ip());
            assert!(socket2::SockRef::from(&listener)
                .reuse_address()
                .expect("readable"));
            let client = TcpStream::connect(bound).await.expect("connects");
            let (_, peer) = listener.accept().await.expect("accepts");
            assert_eq!(Some(peer), client.local_addr().ok());
        }
    }

    #[tokio::test]
    async fn a_port_in_use_is_a_bind_error_naming_the_proxy() {
        let taken = bind_proxy("127.0.0.1:0".parse().expect("an address")).expect("binds");
        let addr = taken.local_addr().expect("bound");
        match bind_proxy(addr) {
            Err(err @ ServeError::Bind { what: "proxy", .. }) => {
                assert!(err.to_string().contains(&addr.to_string()), "{err}");
            }
            Err(err) => panic!("{err}"),
            Ok(_) => panic!("{addr} bound twice"),
        }
    }
}
