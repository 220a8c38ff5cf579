//! The relay's keep-alive upstream connections, one pool per worker thread.
//!
//! The server runs one current-thread runtime per CPU (`server::workers`) and a client
//! connection stays on its worker, so a pool per thread needs no lock, and a connection
//! is only ever used by the thread whose reactor its socket is registered with. An idle
//! connection is not polled while it waits: at checkout, and in a sweep every second
//! while the thread keeps any, one that outlived `upstream.pool_idle_timeout` is closed,
//! and so is one the upstream has closed (its end of stream is already known to the
//! reactor, so the check costs no system call while the connection is alive).

use std::cell::{Cell, RefCell};
use std::io;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// Where connections go: the upstream's host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub host: String,
    pub port: u16,
}

/// How often a thread's idle connections are checked while it keeps any.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Idle {
    origin: Origin,
    stream: TcpStream,
    /// When it has been idle for `upstream.pool_idle_timeout`.
    expires: Instant,
}

thread_local! {
    /// This thread's idle connections, oldest first.
    static IDLE: RefCell<Vec<Idle>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread's sweep is running.
    static SWEEPING: Cell<bool> = const { Cell::new(false) };
}

/// The most recently used live connection to `origin` kept on this thread, if any.
pub fn checkout(origin: &Origin) -> Option<TcpStream> {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        while let Some(at) = idle.iter().rposition(|entry| entry.origin == *origin) {
            let entry = idle.remove(at);
            if Instant::now() < entry.expires && still_open(&entry.stream) {
                return Some(entry.stream);
            }
        }
        None
    })
}

/// Keep `stream`, whose last response ended cleanly, for `idle_timeout` for the next
/// request to `origin`, unless `max_idle` connections to it are kept already. Call it on
/// the runtime the connection's socket is registered with (a worker's, one thread).
pub fn checkin(origin: &Origin, stream: TcpStream, idle_timeout: Duration, max_idle: usize) {
    let kept = IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        if idle.iter().filter(|entry| entry.origin == *origin).count() >= max_idle {
            return false;
        }
        idle.push(Idle {
            origin: origin.clone(),
            stream,
            expires: Instant::now() + idle_timeout,
        });
        true
    });
    if kept && !SWEEPING.with(|sweeping| sweeping.replace(true)) {
        // On a current-thread runtime the sweep runs on this thread, with this pool.
        tokio::spawn(sweep());
    }
}

/// Close this thread's idle connections as they expire or the upstream closes them; ends
/// when none is left (the next checkin starts it again).
async fn sweep() {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let now = Instant::now();
        let empty = IDLE.with(|idle| {
            let mut idle = idle.borrow_mut();
            idle.retain(|entry| now < entry.expires && still_open(&entry.stream));
            idle.is_empty()
        });
        if empty {
            SWEEPING.with(|sweeping| sweeping.set(false));
            return;
        }
    }
}

/// Whether an idle connection can carry a request: nothing has arrived on it (neither the
/// upstream's close nor bytes that answer no request).
fn still_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(err) if err.kind() == io::ErrorKind::WouldBlock)
}

/// Open a connection to `origin` within `timeout`. The error says why, as the hyper
/// path's upstream client words it.
pub async fn connect(origin: &Origin, timeout: Duration) -> Result<TcpStream, String> {
    let host = origin.host.trim_matches(['[', ']']);
    match tokio::time::timeout(timeout, TcpStream::connect((host, origin.port))).await {
        Ok(Ok(stream)) => {
            // Events are small writes that must leave at once.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("timed out after {timeout:?}")),
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
