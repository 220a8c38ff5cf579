//! Listeners and lifecycle: the proxy port (HTTP/1.1 and h2c on one port, optional TLS
//! with ALPN), the admin port, the live view's listener, the upstream readiness probe,
//! and graceful drain.
//!
//! [`Server::bind`] binds every port first so callers (tests, the demo) learn the real
//! addresses before traffic flows; [`Server::run`] serves until the shutdown future
//! resolves, then stops accepting and lets in-flight streams finish up to the drain
//! deadline.
//!
//! The accept loop, the admin port and the probe run on the caller's runtime; each proxy
//! connection is handed to one of the workers (`workers.rs`). With `proxy.http1_fast_path` (the default), a plain
//! connection is served by the HTTP/1.1 [`relay`](crate::relay) until a request comes
//! that the relay leaves to hyper.
//!
//! On shutdown a connection that has not yet delivered one whole request (it sent
//! nothing, half a head, half an h2 preface) is closed at once: it has nothing to drain,
//! and hyper alone would keep it until `limits.header_read_timeout`.

mod connections;
mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::admin::{self, Readiness};
use crate::config::{Config, ConfigError, ListenerTls};
use crate::exchange::shutting_down;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::otlp::exporter::Exporter;
use crate::otlp::span_mapping::Server as SpanServer;
use crate::otlp::spans::SpanExporter;
use crate::otlp::transport::{Transport, TransportError};
use crate::proxy::upstream::{ClientError, UpstreamClient};
use crate::proxy::{Proxy, ProxyService};
use crate::reload::{load_tokenizer, Reloader};
use crate::relay::rewind::Rewind;
use crate::relay::{Relay, Relayed};
use crate::summary::Sinks;
use crate::supervise::Supervisor;
use connections::{ConnectionLimit, ConnectionSlot};
use workers::Workers;

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
        // The live view's ring fills from the start, so a viewer sees the last minutes.
        let sinks = proxy.gateway().sinks();
        let live = config.ui.then(|| Live::start(sinks.clone(), &supervisor));
        let live_at = ui_listener.as_ref().and_then(|l| l.local_addr().ok());
        let admin_task = tokio::spawn(admin::serve(
            admin_listener,
            metrics.clone(),
            readiness.clone(),
            live_at,
        ));
        let ui_task = ui_listener
            .zip(live.clone())
            .map(|(listener, live)| tokio::spawn(admin::serve_live(listener, live)));
        let (metrics_transport, traces_transport) = otlp_transports;
        let spans = config
            .otlp
            .as_ref()
            .and_then(|otlp| Some((otlp.traces.clone()?, otlp.resource.clone())))
            .zip(traces_transport)
            .map(|((traces, resource), transport)| {
                let upstream = &config.upstream;
                let server = SpanServer {
                    address: upstream.authority.host().to_string(),
                    port: upstream.authority.port_u16().unwrap_or(
                        if upstream.scheme == http::uri::Scheme::HTTPS {
                            443
                        } else {
                            80
                        },
                    ),
                };
                SpanExporter::spawn(
                    traces,
                    transport,
                    resource,
                    Some(server),
                    sinks.clone(),
                    &supervisor,
                )
            });
        let otlp = config
            .otlp
            .clone()
            .zip(metrics_transport)
            .map(|(settings, transport)| {
                Exporter::spawn(
                    settings,
                    transport,
                    metrics.clone(),
                    SystemTime::now(),
                    &supervisor,
                )
            });
        let probe_task = {
            let (proxy, readiness, metrics) = (proxy.clone(), readiness.clone(), metrics.clone());
            supervisor.spawn("upstream_probe", move || {
                probe_upstream(proxy.clone(), readiness.clone(), metrics.clone())
            })
        };
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
        // Spans first: their last batch goes out before the metrics push's last export.
        if let Some(exporter) = spans {
            exporter.finish().await;
        }
        if let Some(exporter) = otlp {
            exporter.finish().await;
        }
        probe_task.abort();
        admin_task.abort();
        if let Some(task) = ui_task {
            task.abort();
        }
        if let Some(live) = live {
            live.stop();
        }
        Ok(())
    }
}

/// The proxy port's accept loop and what it hands each connection.
struct Accepting {
    listener: TcpListener,
    limit: ConnectionLimit,
    builder: auto::Builder<TokioExecutor>,
    graceful: GracefulShutdown,
    /// Given to each connection: turns `true` when the server starts to shut down.
    closing: watch::Receiver<bool>,
    header_read_timeout: Duration,
    proxy: Arc<Proxy>,
    tls: Option<TlsAcceptor>,
}

impl Accepting {
    /// Accept connections and hand each to a worker until `shutdown` resolves; then close
    /// the listener and return what the drain waits on.
    async fn run(
        mut self,
        workers: &Workers,
        shutdown: impl Future<Output = ()>,
    ) -> GracefulShutdown {
        tokio::pin!(shutdown);
        loop {
            // A permit first: at `limits.max_connections` the loop waits here, and new
            // clients wait in the listen backlog, rather than being accepted and closed.
            let permit = tokio::select! {
                biased;
                () = &mut shutdown => break,
                permit = self.limit.acquire() => permit,
            };
            let (stream, peer) = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors (held elsewhere than by client
                        // connections), say: back off instead of spinning.
                        tracing::warn!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // Held by the connection's task until the connection ends.
            let slot = self.limit.open(permit);
            self.hand_over(workers, stream, peer, slot);
        }
        // Stop accepting.
        drop(self.listener);
        self.graceful
    }

    /// Send one accepted connection to a worker, to be served there.
    fn hand_over(
        &self,
        workers: &Workers,
        stream: TcpStream,
        peer: SocketAddr,
        slot: ConnectionSlot,
    ) {
        let _ = stream.set_nodelay(true);
        // The socket moves to the worker's reactor when the worker first polls it.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(err) => {
                tracing::debug!(%peer, error = %err, "cannot hand over a connection");
                return;
            }
        };
        let connection = Connection {
            peer,
            builder: self.builder.clone(),
            watcher: self.graceful.watcher(),
            service: self.proxy.service(),
            closing: self.closing.clone(),
            _slot: slot,
        };
        match &self.tls {
            None => {
                let header_read_timeout = self.header_read_timeout;
                // Per connection, so that a reload switches new connections over.
                let active = self.proxy.active();
                let relay = active
                    .config
                    .proxy
                    .http1_fast_path
                    .then(|| Relay::new(self.proxy.gateway().clone(), header_read_timeout));
                workers
                    .dispatch(move || serve_plain(stream, connection, header_read_timeout, relay))
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                workers.dispatch(move || serve_tls(stream, connection, acceptor))
            }
        }
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
/// [`admin::MAX_CONNECTIONS`], and the default backlog of 128 is plenty for scrapes,
/// probes and viewers.
async fn bind_admin(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { what, addr, source })
}

/// The HTTP/1.1 + h2c server settings: nothing added to responses, case preserved,
/// a client that leaves noticed at once, bounded request heads.
pub(crate) fn connection_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .auto_date_header(false)
        .preserve_header_case(true)
        // A client whose connection reaches its end while its request is in flight has
        // left (a close and a shut write side look the same): hyper then drops the
        // exchange at once, which frees the upstream, as the relay does and as nginx and
        // Envoy do.
        .half_close(false)
        .header_read_timeout(config.limits.header_read_timeout)
        .max_headers(config.limits.max_headers)
        .max_buf_size(config.limits.max_header_bytes)
        .http2()
        .timer(TokioTimer::new())
        .auto_date_header(false)
        .max_header_list_size(u32::try_from(config.limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(1024);
    builder
}

/// The HTTP/2 connection preface, which tells h2c prior knowledge from HTTP/1.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Wait (without consuming anything) until the first bytes say which protocol the client
/// speaks: a byte that is not the h2 preface's, the whole preface, or the end of input.
async fn protocol_known(stream: &TcpStream) {
    let mut buf = [0u8; 24];
    loop {
        match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) if n >= H2_PREFACE.len() || buf[..n] != H2_PREFACE[..n] => return,
            // A partial preface: peek would return at once again, so wait for more.
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// What serving one accepted connection needs besides its socket.
struct Connection {
    peer: SocketAddr,
    builder: auto::Builder<TokioExecutor>,
    watcher: Watcher,
    service: ProxyService,
    /// Turns `true` when the server starts to shut down.
    closing: watch::Receiver<bool>,
    /// The connection's place under `limits.max_connections`, given back when the
    /// connection (this value) is dropped.
    _slot: ConnectionSlot,
}

impl Connection {
    /// Register the socket with the reactor of the worker this runs on.
    fn register(&self, stream: std::net::TcpStream) -> Option<TcpStream> {
        TcpStream::from_std(stream)
            .inspect_err(|err| {
                tracing::debug!(peer = %self.peer, error = %err, "cannot register a connection");
            })
            .ok()
    }
}

// Connections are the largest tasks, so their futures are kept small: plain and TLS
// connections are separate futures (a TLS session takes no room in a plain one), and hyper's
// connection borrows the builder where `into_owned` would copy it.

/// Serve one plain-TCP connection (HTTP/1.1 or h2c) on a worker; with `relay`
/// (`proxy.http1_fast_path`), by the [`Relay`] until it hands the connection to hyper.
/// The relay holds the connection's graceful-shutdown watcher while it serves, so the
/// drain waits for its in-flight response too.
async fn serve_plain(
    stream: std::net::TcpStream,
    connection: Connection,
    header_read_timeout: Duration,
    relay: Option<Relay<UpstreamClient>>,
) {
    let Some(mut stream) = connection.register(stream) else {
        return;
    };
    // hyper's header_read_timeout starts only once the protocol is known, and hyper-util
    // waits for that without a deadline: bound it here, so a client that connects and
    // says nothing cannot hold a descriptor forever.
    let deadline = tokio::time::Instant::now() + header_read_timeout;
    let mut closing = connection.closing.clone();
    tokio::select! {
        known = tokio::time::timeout_at(deadline, protocol_known(&stream)) => {
            if known.is_err() {
                tracing::debug!(peer = %connection.peer, "closing a connection that sent no request");
                return;
            }
        }
        _ = shutting_down(&mut closing) => return,
    }
    let read_already = match relay {
        None => Vec::new(),
        Some(relay) => match relay.serve(&mut stream, deadline, &mut closing).await {
            Ok(Relayed::HandOff(read_already)) => read_already,
            Ok(Relayed::Closed) => return,
            Err(err) => {
                tracing::debug!(peer = %connection.peer, error = %err, "relayed connection failed");
                return;
            }
        },
    };
    let counter = connection.service.clone();
    let (service, first_request) = FirstRequest::wrap(connection.service, true);
    // With upgrades: a `101` from the upstream hands the connection to `proxy::tunnel`.
    let http = connection
        .builder
        .serve_connection_with_upgrades(TokioIo::new(Rewind::new(read_already, stream)), service);
    let served = connection.watcher.watch(http);
    if let Some(result) = unless_closed_before_a_request(served, &first_request, closing).await {
        connection_ended(connection.peer, result, &counter);
    }
}

/// Run `served` to its end, unless the server starts to shut down before the connection
/// delivered its first whole request head (`None`: then it is dropped, and closed).
/// hyper's graceful shutdown closes an idle keep-alive connection at once, but one that
/// has not finished its first head counts as busy until `header_read_timeout`.
async fn unless_closed_before_a_request<R>(
    served: impl Future<Output = R>,
    first_request: &AtomicBool,
    mut closing: watch::Receiver<bool>,
) -> Option<R> {
    tokio::pin!(served);
    let shutdown = shutting_down(&mut closing);
    tokio::pin!(shutdown);
    // Once a request head has arrived, hyper's graceful watcher owns the drain: the
    // shutdown signal is no longer polled, so it costs nothing per event on a busy
    // connection (a `select!` would poll it at every wake-up).
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = served.as_mut().poll(cx) {
            return Poll::Ready(Some(result));
        }
        if first_request.load(Ordering::Acquire) || shutdown.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        tracing::debug!("closing a connection with no whole request at shutdown");
        Poll::Ready(None)
    })
    .await
}

/// The proxy service of one connection, noting when its first request head arrived.
#[derive(Clone)]
struct FirstRequest {
    service: ProxyService,
    seen: Arc<AtomicBool>,
    /// Whether the connection can hand itself over after a `101`. Where it cannot, a
    /// request's upgrade is not offered upstream (its `Upgrade` is stripped like any
    /// hop-by-hop header), so the client gets the upstream's ordinary answer rather than a
    /// `101` followed by a closed connection.
    upgrades: bool,
}

impl FirstRequest {
    fn wrap(service: ProxyService, upgrades: bool) -> (FirstRequest, Arc<AtomicBool>) {
        let seen = Arc::new(AtomicBool::new(false));
        let wrapped = FirstRequest {
            service,
            seen: seen.clone(),
            upgrades,
        };
        (wrapped, seen)
    }
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for FirstRequest {
    type Response =
        <ProxyService as hyper::service::Service<http::Request<hyper::body::Incoming>>>::Response;
    type Error =
        <ProxyService as hyper::service::Service<http::Request<hyper::body::Incoming>>>::Error;
    type Future =
        <ProxyService as hyper::service::Service<http::Request<hyper::body::Incoming>>>::Future;

    fn call(&self, mut request: http::Request<hyper::body::Incoming>) -> Self::Future {
        self.seen.store(true, Ordering::Release);
        if !self.upgrades {
            request
                .extensions_mut()
                .remove::<hyper::upgrade::OnUpgrade>();
        }
        self.service.call(request)
    }
}

/// Serve one TLS connection on a worker.
async fn serve_tls(stream: std::net::TcpStream, connection: Connection, acceptor: TlsAcceptor) {
    let Some(stream) = connection.register(stream) else {
        return;
    };
    let peer = connection.peer;
    let mut closing = connection.closing.clone();
    let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
    let handshake = tokio::select! {
        handshake = handshake => handshake,
        _ = shutting_down(&mut closing) => return,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::debug!(%peer, error = %err, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    // ALPN already named the protocol, so nothing is sniffed and hyper's
    // header_read_timeout bounds an HTTP/1 client from its first byte.
    let builder = if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        connection.builder.http2_only()
    } else {
        connection.builder.http1_only()
    };
    let counter = connection.service.clone();
    let (service, first_request) = FirstRequest::wrap(connection.service, false);
    // Without upgrades: hyper-util's upgradeable connection always sniffs the protocol
    // (ignoring `http1_only`) with no deadline, which would hold a silent TLS client.
    let http = builder.serve_connection(TokioIo::new(stream), service);
    let served = connection.watcher.watch(http);
    if let Some(result) = unless_closed_before_a_request(served, &first_request, closing).await {
        connection_ended(peer, result, &counter);
    }
}

/// A connection hyper served ended: a request head hyper refused is counted.
fn connection_ended(
    peer: SocketAddr,
    result: Result<(), Box<dyn std::error::Error + Send + Sync>>,
    service: &ProxyService,
) {
    if let Err(err) = result {
        tracing::debug!(%peer, error = %err, "connection ended with an error");
        service.connection_failed(&*err);
    }
}

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

/// Keep `upstream_reachable` and `tokentap_upstream_up` current.
async fn probe_upstream(proxy: Arc<Proxy>, readiness: Arc<Readiness>, metrics: Arc<Metrics>) {
    let mut was = None;
    loop {
        // The upstream may change on reload: probe the one in force.
        let active = proxy.active();
        let interval = active.config.upstream.probe_interval;
        let reachable = active.upstream.probe().await;
        readiness
            .upstream_reachable
            .store(reachable, Ordering::Relaxed);
        metrics.upstream_up.set(i64::from(reachable));
        if was != Some(reachable) {
            if reachable {
                tracing::info!("upstream reachable");
            } else {
                tracing::warn!("upstream not reachable");
            }
            was = Some(reachable);
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
