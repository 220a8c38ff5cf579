//! Plain HTTP/1.1 upstream connections driven by the task that uses them.
//!
//! hyper-util's pooled client runs every upstream connection as a task of its own. A
//! streamed event is then read in that task, handed through hyper's body channel to the
//! client connection's task and written from there: two task polls and a cross-task (often
//! cross-thread) wake-up per event, which is most of what tokentap spent per event beyond
//! nginx. Here the upstream connection is polled from inside the response body, by the
//! task that writes to the client, so an event costs one wake-up of one task.
//!
//! Connections are kept alive in a LIFO pool. An idle connection is not polled while it
//! waits; a sweep every few seconds (and a check at checkout) closes the ones the upstream
//! has closed or that outlived `pool_idle_timeout`. A request that never left a reused
//! connection (the upstream closed it just then) is retried once on a fresh one.
//!
//! The pool is sharded by thread: a connection is reused by the thread that used it
//! last, whose reactor its socket is registered with, so that a server worker
//! (`server::workers`) never wakes another thread for an event. Any thread can still poll
//! any connection; the shards only keep that from happening.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::body::UpstreamBody;
use crate::exchange::{ExchangeError, UpstreamFault};
use crate::intermediary;

/// How often idle connections are checked for a close by the upstream or for age.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Idle shards per pool. Threads beyond this many share shards, which stays correct.
const SHARDS: usize = 8;

thread_local! {
    /// This thread's shard in every pool.
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

type Driver = http1::Connection<TokioIo<TcpStream>, UpstreamBody>;

/// One HTTP/1.1 connection: the request sender and the future that does its I/O.
struct Conn {
    sender: http1::SendRequest<UpstreamBody>,
    /// `None` once the connection has finished (closed by either side, or failed).
    driver: Option<Driver>,
}

impl Conn {
    /// Do whatever I/O the connection has pending; `false` once it has finished.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(driver) = self.driver.as_mut() {
            if let Poll::Ready(result) = Pin::new(driver).poll(cx) {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "upstream connection ended with an error");
                }
                self.driver = None;
            }
        }
        self.driver.is_some()
    }

    /// Poll once without a task to wake: for connections nobody is waiting on.
    fn drive_detached(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()))
    }

    /// Ready for another request: alive, and the previous exchange fully finished.
    fn reusable(&mut self) -> bool {
        self.drive_detached() && self.sender.is_ready()
    }
}

/// The pool of one upstream (plain `http://`, HTTP/1.1).
#[derive(Clone)]
pub struct H1Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    host: String,
    port: u16,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    builder: http1::Builder,
    shards: [Shard; SHARDS],
    /// Idle connections in all shards, held to `max_idle`.
    idle_count: AtomicUsize,
}

#[derive(Default)]
struct Shard {
    /// Oldest first; checkout takes the most recently used (its socket is warmest).
    idle: Mutex<Vec<Idle>>,
    sweeper_started: AtomicBool,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

impl H1Pool {
    pub fn new(
        host: &str,
        port: u16,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> H1Pool {
        let mut builder = http1::Builder::new();
        builder.preserve_header_case(true);
        // hyper grows a connection's read buffer while reads fill it (up to ~400 KiB) and
        // never shrinks it: one burst from the upstream (a backlog, a large JSON body)
        // would make every kept connection hold that much. 16 KiB reads still carry ~80
        // events each; a response head is bounded by it too (nginx's default: 4-8 KiB).
        builder.max_buf_size(intermediary::MAX_UPSTREAM_HEAD_BYTES);
        builder.max_headers(intermediary::MAX_UPSTREAM_HEAD_FIELDS);
        H1Pool {
            inner: Arc::new(PoolInner {
                host: host.trim_matches(['[', ']']).to_string(),
                port,
                connect_timeout,
                idle_timeout,
                max_idle,
                builder,
                shards: Default::default(),
                idle_count: AtomicUsize::new(0),
            }),
        }
    }

    /// Send `request` (origin-form URI, `Host` set) and wait for the response head while
    /// driving the connection. The returned body keeps driving it.
    pub async fn send(
        &self,
        request: Request<UpstreamBody>,
    ) -> Result<Response<ResponseBody>, ExchangeError> {
        let (mut conn, reused) = match self.inner.checkout(Instant::now()) {
            Some(conn) => (conn, true),
            None => (self.inner.connect().await?, false),
        };
        let response = match exchange(&mut conn, request).await {
            Ok(response) => response,
            Err(mut err) => match err.take_message() {
                // The request never left a reused connection: the upstream had closed it.
                Some(request) if reused => {
                    tracing::debug!(error = %err.error(), "pooled connection was closed; retrying");
                    conn = self.inner.connect().await?;
                    exchange(&mut conn, request)
                        .await
                        .map_err(|err| UpstreamFault::Request(error_chain(&err.into_error())))?
                }
                _ => return Err(UpstreamFault::Request(error_chain(&err.into_error())).into()),
            },
        };
        Ok(response.map(|body| ResponseBody {
            body,
            lease: Some(Lease {
                conn,
                pool: self.inner.clone(),
            }),
            failure: None,
            frame_in_flight: false,
        }))
    }
}

/// An error and its causes on one line (hyper's top-level messages are terse).
pub(super) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

type TrySendError = hyper::client::conn::TrySendError<Request<UpstreamBody>>;

/// Send on `conn` and drive it until the response head (or a failure) arrives.
async fn exchange(
    conn: &mut Conn,
    request: Request<UpstreamBody>,
) -> Result<Response<Incoming>, TrySendError> {
    let mut response = std::pin::pin!(conn.sender.try_send_request(request));
    poll_fn(|cx| {
        // When the connection finishes first, the response future reports why.
        conn.drive(cx);
        response.as_mut().poll(cx)
    })
    .await
}

impl PoolInner {
    async fn connect(&self) -> Result<Conn, UpstreamFault> {
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => return Err(UpstreamFault::Connect(err.to_string())),
            Err(_) => {
                return Err(UpstreamFault::Connect(format!(
                    "timed out after {:?}",
                    self.connect_timeout
                )))
            }
        };
        // Events are small writes that must leave at once.
        let _ = stream.set_nodelay(true);
        let (sender, driver) = self
            .builder
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|err| UpstreamFault::Connect(error_chain(&err)))?;
        Ok(Conn {
            sender,
            driver: Some(driver),
        })
    }

    fn checkout(&self, now: Instant) -> Option<Conn> {
        let mut idle = self.shard().lock();
        while let Some(mut entry) = idle.pop() {
            self.idle_count.fetch_sub(1, Ordering::Relaxed);
            if now.duration_since(entry.since) < self.idle_timeout && entry.conn.reusable() {
                return Some(entry.conn);
            }
        }
        None
    }

    fn checkin(self: &Arc<Self>, mut conn: Conn) {
        if !conn.reusable() {
            return;
        }
        if self.idle_count.fetch_add(1, Ordering::Relaxed) >= self.max_idle {
            self.idle_count.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let shard = SHARD.with(|shard| *shard);
        self.shards[shard].lock().push(Idle {
            conn,
            since: Instant::now(),
        });
        self.start_sweeper(shard);
    }

    /// The shard of the calling thread.
    fn shard(&self) -> &Shard {
        &self.shards[SHARD.with(|shard| *shard)]
    }

    /// Close the shard's idle connections that the upstream closed or that are too old.
    /// Runs while the pool exists; started on the shard's first checkin, on the runtime
    /// of the thread that checked in (whose reactor the connections are registered with).
    fn start_sweeper(self: &Arc<Self>, shard: usize) {
        let started = &self.shards[shard].sweeper_started;
        // Every checkin comes here: once the sweeper runs, that is all it costs.
        if started.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // A body dropped while the runtime shuts down: nothing left to sweep for.
            return;
        };
        if started.swap(true, Ordering::Relaxed) {
            return;
        }
        let pool: Weak<PoolInner> = Arc::downgrade(self);
        let every = SWEEP_EVERY.min(self.idle_timeout);
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(pool) = pool.upgrade() else { return };
                pool.sweep(shard, Instant::now());
            }
        });
    }

    fn sweep(&self, shard: usize, now: Instant) {
        let shard = &self.shards[shard];
        // Checking a connection reads its socket: do it outside the lock, so requests
        // are not held up behind a sweep of a large pool.
        let mut kept = std::mem::take(&mut *shard.lock());
        let before = kept.len();
        kept.retain_mut(|entry| {
            now.duration_since(entry.since) < self.idle_timeout && entry.conn.reusable()
        });
        self.idle_count
            .fetch_sub(before - kept.len(), Ordering::Relaxed);
        let mut idle = shard.lock();
        // Connections checked in meanwhile are newer: they go after the survivors.
        let newer = std::mem::replace(&mut *idle, kept);
        idle.extend(newer);
    }
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A response in use of a pooled connection.
struct Lease {
    conn: Conn,
    pool: Arc<PoolInner>,
}

/// Give a leased connection back to its pool (which keeps it only if it can be reused).
fn give_back(lease: &mut Option<Lease>) {
    if let Some(lease) = lease.take() {
        lease.pool.checkin(lease.conn);
    }
}

pin_project_lite::pin_project! {
    /// An upstream response body. Where it came over a same-task connection, polling it
    /// drives that connection; at its end the connection goes back to the pool, and
    /// dropped before its end it is closed (the rest of a response cannot be skipped on
    /// HTTP/1.1).
    pub struct ResponseBody {
        #[pin]
        body: Incoming,
        lease: Option<Lease>,
        // An upstream failure held back for one poll (see `poll_frame`).
        failure: Option<hyper::Error>,
        // A frame was just handed out and hyper has probably not written it yet.
        frame_in_flight: bool,
    }

    impl PinnedDrop for ResponseBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.body.is_end_stream() {
                give_back(this.lease);
            }
        }
    }
}

impl ResponseBody {
    /// A body whose connection something else drives (hyper-util's pooled client).
    pub fn detached(body: Incoming) -> ResponseBody {
        ResponseBody {
            body,
            lease: None,
            failure: None,
            frame_in_flight: false,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut this = self.project();
        if let Some(err) = this.failure.take() {
            return Poll::Ready(Some(Err(err)));
        }
        let polled = if std::mem::take(this.frame_in_flight) {
            // hyper asks for the next frame before it writes the last one, which still
            // shares the connection's read buffer: a read now would make hyper allocate
            // a new buffer for every event. Frames already read are handed out; for new
            // ones, yield once so the last frame is written (and its buffer free) first.
            let polled = this.body.as_mut().poll_frame(cx);
            if polled.is_pending() {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            polled
        } else {
            if let Some(lease) = this.lease.as_mut() {
                lease.conn.drive(cx);
            }
            this.body.as_mut().poll_frame(cx)
        };
        match polled {
            Poll::Ready(Some(Err(err))) => {
                // A truncated response often arrives whole in one read: its last bytes and
                // the failure together. hyper's server drops what it has not written yet
                // when a body fails, so the failure waits one poll, for the bytes before
                // it to be flushed to the client first.
                *this.lease = None;
                *this.failure = Some(err);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(None) => {
                give_back(this.lease);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                *this.frame_in_flight = true;
                if this.body.is_end_stream() {
                    give_back(this.lease);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A connection one thread checked in is not handed to another thread, whose task
    /// would then be woken from the first thread's reactor; the first thread reuses it.
    #[test]
    fn idle_connections_stay_with_the_thread_that_used_them() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                held.push(stream);
            }
        });
        let timeout = Duration::from_secs(60);
        let pool = H1Pool::new("127.0.0.1", port, timeout, timeout, 4).inner;
        // This thread takes its shard first, so the owner's is the next one.
        SHARD.with(|_| ());
        let (checked_in_tx, checked_in) = mpsc::channel();
        let (go_tx, go) = mpsc::channel::<()>();
        let owner = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let conn = pool.connect().await.unwrap();
                    pool.checkin(conn);
                    checked_in_tx.send(()).unwrap();
                    go.recv().unwrap();
                    pool.checkout(Instant::now()).is_some()
                })
            })
        };
        checked_in.recv().unwrap();
        assert_eq!(pool.idle_count.load(Ordering::Relaxed), 1);
        assert!(
            pool.checkout(Instant::now()).is_none(),
            "another thread's idle connection was handed out"
        );
        go_tx.send(()).unwrap();
        assert!(
            owner.join().unwrap(),
            "the thread that checked the connection in did not get it back"
        );
        assert_eq!(pool.idle_count.load(Ordering::Relaxed), 0);
    }
}
