//! Serving one accepted connection, on the worker it was handed to: plain TCP (HTTP/1.1
//! or h2c, by the HTTP/1.1 [`relay`](crate::relay) first while `proxy.http1_fast_path`
//! is on, then by hyper) or TLS (the protocol ALPN named, by hyper), with the HTTP/1.1 +
//! h2c settings of hyper-util's auto server ([`connection_builder`]).
//!
//! Apart from the accept loop (`accept.rs`) because what a connection needs while it is
//! served is its own: a deadline for a client that says nothing, the relay's hand-over to
//! hyper, and, on shutdown, closing at once a connection that has not yet delivered one
//! whole request (it sent nothing, half a head, half an h2 preface): it has nothing to
//! drain, and hyper alone would keep it until `limits.header_read_timeout`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::connections::ConnectionSlot;
use crate::config::Config;
use crate::exchange::shutting_down;
use crate::proxy::upstream::UpstreamClient;
use crate::proxy::ProxyService;
use crate::relay::rewind::Rewind;
use crate::relay::{Relay, Relayed};

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
pub(super) struct Connection {
    pub peer: SocketAddr,
    pub builder: auto::Builder<TokioExecutor>,
    pub watcher: Watcher,
    pub service: ProxyService,
    /// Turns `true` when the server starts to shut down.
    pub closing: watch::Receiver<bool>,
    /// The connection's place under `limits.max_connections`, given back when the
    /// connection (this value) is dropped.
    pub _slot: ConnectionSlot,
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
pub(super) async fn serve_plain(
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
pub(super) async fn serve_tls(
    stream: std::net::TcpStream,
    connection: Connection,
    acceptor: TlsAcceptor,
) {
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
