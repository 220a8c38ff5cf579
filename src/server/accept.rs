//! The proxy port's accept loop: it takes a place under `limits.max_connections`
//! (`connections.rs`) before it accepts, so at the limit new clients wait in the listen
//! backlog, and hands each accepted connection to the worker serving the fewest
//! (`workers.rs`), where `serve.rs` serves it. It runs on the caller's runtime until the
//! shutdown future resolves, then closes the listener and returns what the drain waits on.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::connections::{ConnectionLimit, ConnectionSlot};
use super::serve::{serve_plain, serve_tls, Connection};
use super::workers::Workers;
use crate::proxy::Proxy;
use crate::relay::Relay;

/// The proxy port's accept loop and what it hands each connection.
pub(super) struct Accepting {
    pub listener: TcpListener,
    pub limit: ConnectionLimit,
    pub builder: auto::Builder<TokioExecutor>,
    pub graceful: GracefulShutdown,
    /// Given to each connection: turns `true` when the server starts to shut down.
    pub closing: watch::Receiver<bool>,
    pub header_read_timeout: Duration,
    pub proxy: Arc<Proxy>,
    pub tls: Option<TlsAcceptor>,
}

impl Accepting {
    /// Accept connections and hand each to a worker until `shutdown` resolves; then close
    /// the listener and return what the drain waits on.
    pub async fn run(
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
