//! The two small listeners beside the proxy port, and what keeps them answering.
//!
//! The admin port (`admin`, on the cluster network): `/metrics` (Prometheus text format by
//! default; the OpenMetrics text with exemplars, or the protobuf format with native
//! histograms and exemplars, for a scraper that asks for it), `/healthz` (the process is
//! alive), `/readyz` (config loaded, listener bound, upstream reachable, not draining, no
//! background task down).
//!
//! The live view's listener (`ui.listen`, loopback by default, while `ui.enabled`): the
//! page `/ui` and its files, the JSON snapshot `/api/live/snapshot` and the server-sent
//! events `/api/live/stream` ([`crate::live`]). It shows model and tenant names and trace
//! ids, so it is not on the admin port, which answers its paths with a 404 saying where
//! it went (docs/RELIABILITY.md, "Who sees what").
//!
//! Both are separate from the proxy port so that scraping, probes and viewers never
//! compete with, or show up in, proxied traffic. Each holds at most [`MAX_CONNECTIONS`]
//! descriptors (`limits.max_connections` leaves them out of the proxy port's budget), and
//! no client can keep a probe waiting by holding them:
//! - a connection idle (no request, or half a request head) for [`IDLE_TIMEOUT`] is
//!   closed;
//! - a write that makes no progress for [`WRITE_STALL_TIMEOUT`] fails its connection (a
//!   live-view viewer or a scraper that stopped reading);
//! - when every place is taken, a new client is accepted anyway and the connection idle
//!   the longest is closed to make room for it, so a probe is answered at once however
//!   many idle keep-alive clients there are.
//!
//! `/metrics` text (either kind) is a streamed body rendered a chunk at a time as hyper
//! writes it: with
//! thousands of label pairs the text is over 100 MB, and rendering it whole took that much
//! memory per scrape and held a tokio worker (and the proxied streams on it) for 50-130 ms.
//! The protobuf body is much smaller per series and is encoded whole, from a snapshot, on
//! tokio's blocking pool so that it holds no worker either.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::live::{page, Live};
use crate::metrics::{protobuf, Exposition, Metrics};

/// Prometheus text exposition format 0.0.4.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics text exposition format 1.0.0.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Descriptors each of the two listeners holds at most: `MAX_CONNECTIONS - 1`
/// connections served, and one accepted while the idlest is closed to make room for it.
/// Scrapers, probes and viewers are few; `limits.max_connections` leaves
/// [`RESERVED_DESCRIPTORS`] out of the proxy port's budget.
pub const MAX_CONNECTIONS: usize = 16;

/// What the admin port and the live view's listener hold together, at most.
pub const RESERVED_DESCRIPTORS: usize = 2 * MAX_CONNECTIONS;

/// A connection that has no request in progress for this long is closed: hyper's header
/// read timeout, which runs from the moment it waits for a request head (on a new
/// connection, or after the previous response) to the head's end. Probes and scrapes
/// send their head at once; a Prometheus that keeps its connection between scrapes opens
/// a new one.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// A write that makes no progress for this long fails its connection: the client stopped
/// reading. Prometheus' default scrape timeout, so a scrape cut by it had failed already;
/// a browser (a tab in the background too) and `tokentap top` read frames as they come.
/// The stall begins once the kernel's buffers are full: for a live-view stream that
/// takes seconds to minutes, by the frame rate and the client's receive buffer (docs/LIVE.md,
/// "How it works and what it costs", gives the measured figures).
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The send buffer of a live-view connection (the kernel doubles it): small, so that a
/// viewer that stops reading is noticed after a few frames, not megabytes of them.
/// Frames are a few KB a second; the page's largest file, the snapshot with its
/// heatmaps, passes in a few round trips.
const LIVE_SEND_BUFFER: usize = 16 << 10;

/// Chunks rendered in one poll of the connection task before it yields (about 200 KiB,
/// well under a millisecond): hyper keeps polling a body that is always ready until its
/// write buffer is full, sixteen times over, before it yields by itself.
const CHUNKS_PER_POLL: u32 = 4;

/// The SSE body of `/api/live/stream`: a subscriber's frames as they come.
type SseBody = http_body_util::StreamBody<
    futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>,
>;

type AdminBody = Either<Full<Bytes>, Either<MetricsBody, SseBody>>;

/// What `/readyz` reports. The server sets it (bound, probe result, draining), and the
/// [supervisor](crate::supervise) marks a background task that failed and waits to be
/// restarted; it lives here, beside the endpoint that reads it.
#[derive(Debug, Default)]
pub struct Readiness {
    pub listening: AtomicBool,
    pub upstream_reachable: AtomicBool,
    pub draining: AtomicBool,
    /// Background tasks down now, by name: one entry per failure not yet restarted.
    down: Mutex<Vec<&'static str>>,
}

impl Readiness {
    /// `Ok` when ready, else the reason.
    pub fn check(&self) -> Result<(), String> {
        if self.draining.load(Ordering::Relaxed) {
            Err("draining".to_string())
        } else if !self.listening.load(Ordering::Relaxed) {
            Err("listener not bound".to_string())
        } else if !self.upstream_reachable.load(Ordering::Relaxed) {
            Err("upstream not reachable".to_string())
        } else if let Some(task) = self.lock_down().first() {
            Err(format!("background task {task} failed and is restarting"))
        } else {
            Ok(())
        }
    }

    /// `task` failed: not ready until [`task_up`](Self::task_up).
    pub fn task_down(&self, task: &'static str) {
        self.lock_down().push(task);
    }

    /// `task` runs again.
    pub fn task_up(&self, task: &'static str) {
        let mut down = self.lock_down();
        if let Some(at) = down.iter().position(|t| *t == task) {
            down.swap_remove(at);
        }
    }

    fn lock_down(&self) -> std::sync::MutexGuard<'_, Vec<&'static str>> {
        // The list stays consistent whatever a holder did: a poisoned lock is still usable.
        self.down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a listener answers.
enum Routes {
    Admin {
        metrics: Arc<Metrics>,
        readiness: Arc<Readiness>,
        /// Where the live view listens, if it is on.
        live_at: Option<SocketAddr>,
    },
    Live(Arc<Live>),
}

impl Routes {
    async fn respond(&self, request: &Request<Incoming>) -> Response<AdminBody> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        }
        match self {
            Routes::Admin {
                metrics,
                readiness,
                live_at,
            } => route(request, metrics, readiness, *live_at).await,
            Routes::Live(live) => live_route(request, live),
        }
    }
}

/// Serve the admin endpoints until the task is aborted; `live_at` is where the live view
/// listens, if it is on (the admin port's 404 for its paths says so).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    live_at: Option<SocketAddr>,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin listening (/metrics, /healthz, /readyz)");
    }
    let routes = Routes::Admin {
        metrics,
        readiness,
        live_at,
    };
    serve_bounded(listener, Arc::new(routes)).await;
}

/// Serve the live view until the task is aborted.
pub async fn serve_live(listener: TcpListener, live: Arc<Live>) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "live view listening (/ui, /api/live/snapshot, /api/live/stream)");
    }
    serve_bounded(listener, Arc::new(Routes::Live(live))).await;
}

async fn serve_bounded(listener: TcpListener, routes: Arc<Routes>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS - 1));
    let open = Arc::new(Open::default());
    loop {
        // With a place free, take it before accepting. At the bound, accept anyway (the
        // last descriptor), then make room: new clients are never left in the backlog
        // behind idle ones.
        let place = match slots.clone().try_acquire_owned() {
            Ok(place) => Some(place),
            Err(TryAcquireError::NoPermits) => None,
            Err(TryAcquireError::Closed) => return,
        };
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let place = match place {
            Some(place) => place,
            None => open.make_room(&slots).await,
        };
        if matches!(&*routes, Routes::Live(_)) {
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(LIVE_SEND_BUFFER);
        }
        let connection = open.add();
        tokio::spawn(serve_connection(stream, place, connection, routes.clone()));
    }
}

async fn serve_connection(
    stream: TcpStream,
    place: OwnedSemaphorePermit,
    connection: Registered,
    routes: Arc<Routes>,
) {
    let _place = place;
    let state = connection.state.clone();
    let service = service_fn(move |request| {
        let routes = routes.clone();
        let state = state.clone();
        state.responding.store(true, Ordering::Relaxed);
        async move {
            let response = routes.respond(&request).await;
            Ok::<_, Infallible>(response.map(|body| Responding { body, state }))
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(IDLE_TIMEOUT)
        .serve_connection(
            TokioIo::new(WriteStall::new(stream, WRITE_STALL_TIMEOUT)),
            service,
        );
    tokio::pin!(served);
    let state = &connection.state;
    loop {
        tokio::select! {
            _ = &mut served => return,
            () = state.close.notified() => {
                // A request may have come since it was chosen: then it stays, and the next
                // idlest is chosen instead.
                if !state.responding.load(Ordering::Relaxed) {
                    return;
                }
                state.closing.store(false, Ordering::Relaxed);
            }
        }
    }
}

/// The connections a listener serves, so that the idlest can be closed for a newcomer.
struct Open {
    connections: Mutex<Vec<Arc<ConnectionState>>>,
    /// What [`ConnectionState::idle_since_ms`] counts from.
    epoch: Instant,
}

impl Default for Open {
    fn default() -> Self {
        Open {
            connections: Mutex::default(),
            epoch: Instant::now(),
        }
    }
}

/// One connection, as [`Open`] sees it.
struct ConnectionState {
    /// A response is being written (from its request to its body's end).
    responding: AtomicBool,
    /// When it last finished a response or opened, ms since [`Open::epoch`].
    idle_since_ms: AtomicU64,
    closing: AtomicBool,
    close: Notify,
    epoch: Instant,
}

impl ConnectionState {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A connection's place in [`Open`], given back when its task ends.
struct Registered {
    open: Arc<Open>,
    state: Arc<ConnectionState>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open
            .lock()
            .retain(|state| !Arc::ptr_eq(state, &self.state));
    }
}

impl Open {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<ConnectionState>>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(self: &Arc<Self>) -> Registered {
        let state = Arc::new(ConnectionState {
            responding: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            close: Notify::new(),
            epoch: self.epoch,
        });
        state.idle_since_ms.store(state.now_ms(), Ordering::Relaxed);
        self.lock().push(state.clone());
        Registered {
            open: self.clone(),
            state,
        }
    }

    /// Close the connection idle the longest (no response in progress), if any; whether
    /// one was asked to close.
    fn close_idlest(&self) -> bool {
        let connections = self.lock();
        let idlest = connections
            .iter()
            .filter(|c| !c.responding.load(Ordering::Relaxed) && !c.closing.load(Ordering::Relaxed))
            .min_by_key(|c| c.idle_since_ms.load(Ordering::Relaxed));
        match idlest {
            Some(connection) => {
                connection.closing.store(true, Ordering::Relaxed);
                // Stored if the task is not waiting yet: it closes at its next poll.
                connection.close.notify_one();
                true
            }
            None => false,
        }
    }

    /// A place for a connection accepted at the bound: close the idlest one, or wait for
    /// a response to end (every place is writing one; each write is bounded by
    /// [`WRITE_STALL_TIMEOUT`]).
    async fn make_room(&self, slots: &Arc<Semaphore>) -> OwnedSemaphorePermit {
        loop {
            if let Ok(place) = slots.clone().try_acquire_owned() {
                return place;
            }
            let closing = self
                .lock()
                .iter()
                .any(|c| c.closing.load(Ordering::Relaxed));
            if !closing {
                self.close_idlest();
            }
            // A closed connection gives its place back within a poll; a busy one becomes
            // idle when its response ends. Check again shortly either way.
            if let Ok(Ok(place)) =
                tokio::time::timeout(Duration::from_millis(20), slots.clone().acquire_owned()).await
            {
                return place;
            }
        }
    }
}

/// A response body that marks its connection idle again when it is done (dropped: hyper
/// drops it at its end, or unpolled for a `HEAD`).
struct Responding {
    body: AdminBody,
    state: Arc<ConnectionState>,
}

impl Drop for Responding {
    fn drop(&mut self) {
        self.state
            .idle_since_ms
            .store(self.state.now_ms(), Ordering::Relaxed);
        self.state.responding.store(false, Ordering::Relaxed);
    }
}

impl Body for Responding {
    type Data = Bytes;
    type Error = <AdminBody as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's I/O whose writes fail once one has made no progress for `limit`: the
/// timer is polled beside the pending write, so the task wakes when it runs out even if
/// the socket never becomes writable again.
struct WriteStall<T> {
    io: T,
    limit: Duration,
    /// Running while a write is pending.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteStall<T> {
    fn new(io: T, limit: Duration) -> WriteStall<T> {
        WriteStall {
            io,
            limit,
            stalled: None,
        }
    }

    /// `poll` as it came, unless it is pending and the write has been stalled for `limit`.
    fn bounded<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        match poll {
            Poll::Pending => {
                let limit = self.limit;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if stalled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client took no bytes for the write stall timeout",
                    )));
                }
                Poll::Pending
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteStall<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteStall<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.bounded(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.bounded(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.bounded(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.bounded(cx, poll)
    }
}

/// The live view's paths, which the admin port no longer serves.
fn is_live_path(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/") || path.starts_with("/api/live/")
}

async fn route(
    request: &Request<Incoming>,
    metrics: &Arc<Metrics>,
    readiness: &Readiness,
    live_at: Option<SocketAddr>,
) -> Response<AdminBody> {
    let path = request.uri().path();
    if is_live_path(path) {
        let text = match live_at {
            Some(addr) => format!(
                "not found: the live view is on its own listener, ui.listen ({addr}), not on \
                 the admin port; from outside the pod: kubectl port-forward pod/<pod> {port} \
                 and open http://127.0.0.1:{port}/ui\n",
                port = addr.port()
            ),
            None => "not found: the live view is off (ui.enabled: false)\n".to_string(),
        };
        return plain(StatusCode::NOT_FOUND, &text);
    }
    match path {
        "/metrics" => match negotiate(request.headers().get_all(header::ACCEPT)) {
            Format::Protobuf => protobuf_metrics(metrics).await,
            Format::OpenMetrics => {
                text_metrics(metrics.openmetrics_exposition(), OPENMETRICS_CONTENT_TYPE)
            }
            Format::Text => text_metrics(metrics.exposition(), METRICS_CONTENT_TYPE),
        },
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/readyz" => match readiness.check() {
            Ok(()) => plain(StatusCode::OK, "ready\n"),
            Err(reason) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("not ready: {reason}\n"),
            ),
        },
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz\n",
        ),
    }
}

/// The exposition formats `/metrics` serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Text,
    OpenMetrics,
    Protobuf,
}

/// The format a scraper's `Accept` prefers, by the highest `q` each format is given: the
/// protobuf one for the delimited `io.prometheus.client.MetricFamily` media type,
/// OpenMetrics for `application/openmetrics-text` (any version: 1.0.0 is served), and the
/// Prometheus text for `text/plain`, `text/*` and `*/*`. A format must have a `q` above 0;
/// a tie goes to the richer format (protobuf, then OpenMetrics). Anything else, no
/// `Accept` included, gets the Prometheus text.
///
/// Prometheus sends `application/openmetrics-text;version=1.0.0,…;q=0.75,text/plain;
/// version=0.0.4;q=0.5,*/*;q=0.1` by default, so its scrapes get OpenMetrics, and with
/// native histograms enabled it puts protobuf first.
fn negotiate(accept: header::GetAll<'_, HeaderValue>) -> Format {
    let mut protobuf_q: f32 = 0.0;
    let mut openmetrics_q: f32 = 0.0;
    let mut text_q: f32 = 0.0;
    for range in accept
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
    {
        let mut parts = range.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or_default().to_ascii_lowercase();
        let (mut q, mut proto, mut encoding) = (1.0f32, None, None);
        for parameter in parts {
            let Some((name, value)) = parameter.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match name.trim().to_ascii_lowercase().as_str() {
                "q" => q = value.parse().unwrap_or(0.0),
                "proto" => proto = Some(value.to_string()),
                "encoding" => encoding = Some(value.to_string()),
                _ => {}
            }
        }
        match media_type.as_str() {
            "application/vnd.google.protobuf"
                if proto.as_deref() == Some("io.prometheus.client.MetricFamily")
                    && encoding.as_deref() == Some("delimited") =>
            {
                protobuf_q = protobuf_q.max(q);
            }
            "application/openmetrics-text" => openmetrics_q = openmetrics_q.max(q),
            "text/plain" | "text/*" | "*/*" => text_q = text_q.max(q),
            _ => {}
        }
    }
    if protobuf_q > 0.0 && protobuf_q >= openmetrics_q && protobuf_q >= text_q {
        Format::Protobuf
    } else if openmetrics_q > 0.0 && openmetrics_q >= text_q {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// `/metrics` as streamed text. No content-length (the size is known only at the end):
/// chunked over HTTP/1.1. hyper never polls the body of a HEAD response, so HEAD renders
/// nothing.
fn text_metrics(exposition: Exposition, content_type: &'static str) -> Response<AdminBody> {
    let body = MetricsBody {
        exposition,
        chunks: 0,
    };
    let mut response = Response::new(Either::Right(Either::Left(body)));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The `window` query parameter (seconds), if given and a number.
fn window_param(request: &Request<Incoming>) -> Option<u64> {
    request
        .uri()
        .query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("window="))
        .and_then(|value| value.parse().ok())
}

/// The live view's page, files, snapshot and stream.
fn live_route(request: &Request<Incoming>, live: &Live) -> Response<AdminBody> {
    let path = request.uri().path();
    if let Some((content_type, body)) = page::file(path) {
        return with_type(Full::new(Bytes::from_static(body)), content_type);
    }
    match path {
        "/api/live/snapshot" => with_type(
            Full::new(live.snapshot(window_param(request))),
            "application/json",
        ),
        "/api/live/stream" => match live.subscribe(window_param(request)) {
            Some(subscription) => sse(subscription),
            None => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many live subscribers; try again later\n",
            ),
        },
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: try /ui, /api/live/snapshot, /api/live/stream\n",
        ),
    }
}

fn with_type(body: Full<Bytes>, content_type: &'static str) -> Response<AdminBody> {
    let mut response = Response::new(Either::Left(body));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `/api/live/stream`: a comment at once (so the client sees the stream open), then each
/// frame the subscription receives; the body ends when the subscriber falls behind.
fn sse(subscription: crate::live::Subscription) -> Response<AdminBody> {
    use futures_util::StreamExt;
    let opening = futures_util::stream::once(async {
        Ok(Frame::data(Bytes::from_static(
            b"retry: 2000\n: tokentap live\n\n",
        )))
    });
    let frames = futures_util::stream::unfold(subscription, |mut subscription| async move {
        let frame = subscription.next().await?;
        Some((Ok(Frame::data(frame)), subscription))
    });
    let body = http_body_util::StreamBody::new(opening.chain(frames).boxed());
    let mut response = Response::new(Either::Right(Either::Right(body)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `/metrics` in the protobuf format (see [`Metrics::protobuf`]).
async fn protobuf_metrics(metrics: &Arc<Metrics>) -> Response<AdminBody> {
    let metrics = metrics.clone();
    // With thousands of label pairs the snapshot and its encoding take milliseconds.
    let Ok(body) = tokio::task::spawn_blocking(move || metrics.protobuf()).await else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the protobuf exposition failed\n",
        );
    };
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(body))));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(protobuf::CONTENT_TYPE),
    );
    response
}

fn plain(status: StatusCode, body: &str) -> Response<AdminBody> {
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(body.to_string()))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The `/metrics` body: each poll renders the next chunk of the exposition.
struct MetricsBody {
    exposition: Exposition,
    /// Chunks rendered since the task last yielded.
    chunks: u32,
}

impl Body for MetricsBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.chunks == CHUNKS_PER_POLL {
            self.chunks = 0;
            // Let the worker run other tasks; this one is scheduled again right away.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.chunks += 1;
        Poll::Ready(
            self.exposition
                .next_chunk()
                .map(|chunk| Ok(Frame::data(chunk))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.exposition.is_complete()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_that_makes_no_progress_fails_after_the_limit_counted_from_its_stall() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limit = Duration::from_millis(300);
        let (near, mut far) = tokio::io::duplex(64);
        let mut io = WriteStall::new(near, limit);
        io.write_all(&[1; 64]).await.expect("the buffer takes it");
        // The reader takes it all after 200 ms: the stalled write then goes on.
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut taken = [0u8; 64];
            far.read_exact(&mut taken).await.expect("read");
            far
        });
        let started = Instant::now();
        io.write_all(&[2; 64])
            .await
            .expect("progress within the limit");
        assert!(started.elapsed() >= Duration::from_millis(150));
        let _far = reader.await.expect("reader");
        // Nobody reads any more: the next write fails once it has been stalled for the
        // whole limit (not counted from the earlier stall).
        let started = Instant::now();
        let err = io.write_all(&[3; 1]).await.expect_err("stalled");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(took >= limit && took < limit * 4, "{took:?}");
    }

    fn negotiated(accept: &[&str]) -> Format {
        let mut headers = http::HeaderMap::new();
        for value in accept {
            headers.append(header::ACCEPT, HeaderValue::from_str(value).expect("valid"));
        }
        negotiate(headers.get_all(header::ACCEPT))
    }

    fn negotiates_protobuf(accept: &[&str]) -> bool {
        negotiated(accept) == Format::Protobuf
    }

    #[test]
    fn openmetrics_when_the_scraper_prefers_it() {
        // What Prometheus 2.42 sends by default, and with native histograms enabled.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiated(&[prometheus]), Format::OpenMetrics);
        let native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiated(&[native]), Format::Protobuf);
        assert_eq!(
            negotiated(&["Application/OpenMetrics-Text; version=0.0.1"]),
            Format::OpenMetrics
        );
        for (accept, format) in [
            (&[][..], Format::Text),
            (&["application/openmetrics-text;q=0"], Format::Text),
            (
                &["application/openmetrics-text;q=0.4,text/plain;q=0.5"],
                Format::Text,
            ),
            (
                &["application/openmetrics-text;q=0.5,*/*;q=0.5"],
                Format::OpenMetrics,
            ),
            (&["application/openmetrics-text;q=0.5", "*/*"], Format::Text),
            (&["application/json"], Format::Text),
        ] {
            assert_eq!(negotiated(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn protobuf_only_when_the_scraper_prefers_it() {
        // What Prometheus sends with native histograms enabled.
        assert!(negotiates_protobuf(&[
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
        ]));
        assert!(negotiates_protobuf(&[protobuf::CONTENT_TYPE]));
        assert!(negotiates_protobuf(&[
            "text/plain;q=0.5",
            "Application/Vnd.Google.Protobuf; proto=\"io.prometheus.client.MetricFamily\"; encoding=delimited",
        ]));

        for accept in [
            &[][..],
            &["text/plain;version=0.0.4"],
            &["*/*"],
            // Not the delimited MetricFamily encoding.
            &["application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"],
            &["application/vnd.google.protobuf"],
            // Text preferred, or protobuf refused.
            &["application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.2,text/plain;q=0.9"],
            &["application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0"],
            &["application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,*/*"],
        ] {
            assert!(!negotiates_protobuf(accept), "{accept:?}");
        }
    }
}
