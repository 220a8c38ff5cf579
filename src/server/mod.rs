//! The server: the proxy port (HTTP/1.1 and h2c on one port, optional TLS with ALPN), the
//! admin port, the live view's listener and the background tasks beside them, from bind to
//! the end of the drain. It splits by job:
//!
//! - `lifecycle.rs`: [`Server`]: bind every port, start, drain, stop, in one order;
//! - `background.rs`: the background tasks (the live view, the admin and live-view
//!   listeners, the OTLP push, the span export, the upstream probe), with one owner that
//!   starts and stops them;
//! - `accept.rs`: the proxy port's accept loop, under `limits.max_connections`
//!   (`connections.rs`);
//! - `workers.rs`: the threads that serve connections, one current-thread runtime each;
//! - `serve.rs`: one connection, on its worker: plain (the HTTP/1.1
//!   [`relay`](crate::relay), then hyper) or TLS (hyper).
//!
//! The accept loop, the admin port and the background tasks run on the caller's runtime;
//! each proxy connection is handed to one of the workers. A reload is not the server's:
//! [`reload`](crate::reload) decides it, and [`Server::reloader`] hands out its handle.

mod accept;
mod background;
mod connections;
mod lifecycle;
mod serve;
mod workers;

pub use lifecycle::{ServeError, Server};
/// For the relay's tests, which build a hyper server as tokentap builds its own.
#[cfg(test)]
pub(crate) use serve::connection_builder;
