//! Plain HTTP/1.1 upstream connections driven by the task that uses them.
//!
//! hyper-util's pooled client runs every upstream connection as a task of its own. A
//! streamed event is then read in that task, handed through hyper's body channel to the
//! client connection's task and written from there: two task polls and a cross-task (often
//! cross-thread) wake-up per event, which is most of what tokentap spent per event beyond
//! nginx. Here the upstream connection is polled from inside the response body, by the
//! task that writes to the client, so an event costs one wake-up of one task.
//!
//! Connections are kept alive in the calling worker thread's
//! [`idle_pool`], which decides what is kept, how long and how many
//! (`upstream.pool_max_idle_per_host` counts them together with the relay's), so that a
//! connection is reused by the thread that used it last, whose reactor its socket is
//! registered with, and a server worker (`server::workers`) never wakes another thread
//! for an event. A request that never left a reused connection (the upstream closed it
//! just then) is retried once on a fresh one.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::body::UpstreamBody;
use crate::exchange::{ExchangeError, UpstreamFault};
use crate::idle_pool::{self, Origin, Reusable, ThreadPool, Unsent};
use crate::intermediary;

thread_local! {
    /// This thread's idle connections, of every `H1Pool` (by origin).
    static IDLE: ThreadPool<Conn> = const { ThreadPool::new() };
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
}

impl Reusable for Conn {
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
    origin: Origin,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// `upstream.pool_max_idle_per_host`, for the whole process.
    max_idle: usize,
    builder: http1::Builder,
}

impl H1Pool {
    /// The pool of the upstream at `origin` (as the relay's pool names it: the two share
    /// their idle connections' cap).
    pub fn new(
        origin: Origin,
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
                origin,
                connect_timeout,
                idle_timeout,
                max_idle,
                builder,
            }),
        }
    }

    /// Send `request` (origin-form URI, `Host` set) and wait for the response head while
    /// driving the connection. The returned body keeps driving it.
    pub async fn send(
        &self,
        request: Request<UpstreamBody>,
    ) -> Result<Response<ResponseBody>, ExchangeError> {
        let inner = &self.inner;
        // A request that never left a kept connection (the upstream had closed it) goes
        // once more on a fresh one.
        let (conn, response) = idle_pool::send_on_kept_or_new(
            inner.checkout(),
            request,
            || async { inner.connect().await.map_err(ExchangeError::from) },
            |mut conn: Conn, request| async move {
                let sent = exchange(&mut conn, request)
                    .await
                    .map_err(|mut err| Unsent {
                        message: err.take_message(),
                        error: UpstreamFault::Request(error_chain(&err.into_error())).into(),
                    });
                (conn, sent)
            },
        )
        .await?;
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
        let stream = idle_pool::connect(&self.origin, self.connect_timeout)
            .await
            .map_err(UpstreamFault::Connect)?;
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

    fn checkout(&self) -> Option<Conn> {
        idle_pool::checkout(&IDLE, &self.origin)
    }

    fn checkin(&self, mut conn: Conn) {
        if conn.reusable() {
            idle_pool::checkin(&IDLE, &self.origin, conn, self.idle_timeout, self.max_idle);
        }
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
    use crate::relay::upstream_pool;
    use std::sync::mpsc;

    /// The origin of a listener on this machine.
    fn local(port: u16) -> Origin {
        Origin {
            host: "127.0.0.1".to_string(),
            port,
        }
    }

    /// An upstream that accepts connections and keeps them open.
    fn holding_listener() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                held.push(stream);
            }
        });
        port
    }

    fn current_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A connection one thread checked in is not handed to another thread, whose task
    /// would then be woken from the first thread's reactor; the first thread reuses it.
    #[test]
    fn idle_connections_stay_with_the_thread_that_used_them() {
        let port = holding_listener();
        let timeout = Duration::from_secs(60);
        let pool = H1Pool::new(local(port), timeout, timeout, 4).inner;
        let (checked_in_tx, checked_in) = mpsc::channel();
        let (go_tx, go) = mpsc::channel::<()>();
        let owner = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                current_thread_runtime().block_on(async {
                    let conn = pool.connect().await.unwrap();
                    pool.checkin(conn);
                    checked_in_tx.send(()).unwrap();
                    go.recv().unwrap();
                    (pool.checkout().is_some(), pool.checkout().is_some())
                })
            })
        };
        checked_in.recv().unwrap();
        assert!(
            pool.checkout().is_none(),
            "another thread's idle connection was handed out"
        );
        go_tx.send(()).unwrap();
        let (first, second) = owner.join().unwrap();
        assert!(
            first,
            "the thread that checked the connection in did not get it back"
        );
        assert!(!second, "one connection was handed out twice");
    }

    /// The relay's idle sockets and hyper's idle connections to one upstream count
    /// against one `pool_max_idle_per_host`: with a cap of one, whichever transport
    /// keeps a connection first keeps the only one.
    #[test]
    fn the_relay_and_hyper_share_one_cap() {
        let port = holding_listener();
        let timeout = Duration::from_secs(60);
        let pool = H1Pool::new(local(port), timeout, timeout, 1).inner;
        let origin = pool.origin.clone();
        current_thread_runtime().block_on(async {
            let raw = upstream_pool::connect(&origin, timeout).await.unwrap();
            upstream_pool::checkin(&origin, raw, timeout, 1);
            pool.checkin(pool.connect().await.unwrap());
            assert!(
                pool.checkout().is_none(),
                "hyper kept a connection past the cap the relay had used up"
            );
            let raw = upstream_pool::checkout(&origin).expect("the relay's connection");
            pool.checkin(pool.connect().await.unwrap());
            upstream_pool::checkin(&origin, raw, timeout, 1);
            assert!(
                upstream_pool::checkout(&origin).is_none(),
                "the relay kept a connection past the cap hyper had used up"
            );
            assert!(pool.checkout().is_some(), "hyper's connection");
        });
    }
}
