//! The relay's keep-alive upstream connections: raw sockets in this worker thread's
//! [`idle_pool`], which decides what is kept, how long and how many
//! (`upstream.pool_max_idle_per_host` counts them together with hyper's connections).
//!
//! The server runs one current-thread runtime per CPU (`server::workers`) and a client
//! connection stays on its worker, so a pool per thread needs no lock, and a connection
//! is only ever used by the thread whose reactor its socket is registered with. What a
//! raw socket adds is how it tells that it is still open ([`Reusable`]).

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::idle_pool::{self, Reusable, ThreadPool};
pub use crate::idle_pool::{connect, Origin};

thread_local! {
    /// This thread's idle relay connections.
    static IDLE: ThreadPool<TcpStream> = const { ThreadPool::new() };
}

/// The most recently used live connection to `origin` kept on this thread, if any.
pub fn checkout(origin: &Origin) -> Option<TcpStream> {
    idle_pool::checkout(&IDLE, origin)
}

/// Keep `stream`, whose last response ended cleanly, for `idle_timeout` for the next
/// request to `origin`, unless this thread keeps its part of `max_idle` (the whole
/// process's `upstream.pool_max_idle_per_host`, see [`idle_pool::thread_cap`]) already.
/// Call it on the runtime the connection's socket is registered with (a worker's, one
/// thread).
pub fn checkin(origin: &Origin, stream: TcpStream, idle_timeout: Duration, max_idle: usize) {
    idle_pool::checkin(&IDLE, origin, stream, idle_timeout, max_idle);
}

/// An idle socket can carry a request while nothing has arrived on it (neither the
/// upstream's close nor bytes that answer no request). Its end of stream is already known
/// to the reactor, so the check costs no system call while the connection is alive.
impl Reusable for TcpStream {
    fn reusable(&mut self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.try_read(&mut probe), Err(err) if err.kind() == io::ErrorKind::WouldBlock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn listener() -> (TcpListener, Origin) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let origin = Origin {
            host: "127.0.0.1".to_string(),
            port,
        };
        (listener, origin)
    }

    #[tokio::test]
    async fn a_live_connection_is_reused_and_a_closed_one_is_not() {
        let (listener, origin) = listener().await;
        let stream = connect(&origin, Duration::from_secs(5))
            .await
            .expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        checkin(&origin, stream, Duration::from_secs(60), 4);
        let reused = checkout(&origin).expect("kept");
        checkin(&origin, reused, Duration::from_secs(60), 4);
        drop(accepted);
        // The reactor learns of the close from the next readiness event.
        let mut closed = false;
        for _ in 0..100 {
            tokio::task::yield_now().await;
            match checkout(&origin) {
                None => {
                    closed = true;
                    break;
                }
                Some(stream) => {
                    stream.readable().await.expect("readable");
                    checkin(&origin, stream, Duration::from_secs(60), 4);
                }
            }
        }
        assert!(closed, "a connection the upstream closed was handed out");
    }

    #[tokio::test]
    async fn idle_connections_expire_and_are_bounded() {
        let (listener, origin) = listener().await;
        let mut accepted = Vec::new();
        for _ in 0..3 {
            let stream = connect(&origin, Duration::from_secs(5))
                .await
                .expect("connect");
            accepted.push(listener.accept().await.expect("accept"));
            checkin(&origin, stream, Duration::from_secs(60), 2);
        }
        assert!(checkout(&origin).is_some());
        assert!(checkout(&origin).is_some());
        assert!(checkout(&origin).is_none(), "max_idle");
        let stream = connect(&origin, Duration::from_secs(5))
            .await
            .expect("connect");
        checkin(&origin, stream, Duration::ZERO, 2);
        assert!(checkout(&origin).is_none(), "idle timeout");
    }

    #[tokio::test]
    async fn the_sweep_closes_an_expired_connection_nobody_asks_for() {
        let (listener, origin) = listener().await;
        let stream = connect(&origin, Duration::from_secs(5))
            .await
            .expect("connect");
        let (mut accepted, _) = listener.accept().await.expect("accept");
        checkin(&origin, stream, Duration::from_millis(200), 2);
        // The upstream sees the close without any checkout.
        let mut buf = [0u8; 1];
        let read = tokio::io::AsyncReadExt::read(&mut accepted, &mut buf);
        let read = tokio::time::timeout(Duration::from_secs(5), read).await;
        assert_eq!(
            read.expect("closed by the sweep").expect("closed cleanly"),
            0
        );
    }
}
