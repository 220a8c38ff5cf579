//! The admin port: `/metrics` (Prometheus text format by default; the OpenMetrics text
//! with exemplars, or the protobuf format with native histograms and exemplars, for a
//! scraper that asks for it), `/healthz` (the process is alive),
//! `/readyz` (config loaded, listener bound, upstream reachable, not draining, no
//! background task down), and while
//! `ui.enabled` the live view (`live`): the page `/ui` and its files, the JSON snapshot
//! `/api/live/snapshot` and the server-sent events `/api/live/stream`.
//!
//! It is a separate listener so that scraping and probes never compete with, or show up
//! in, proxied traffic. It keeps its own bounded share of file descriptors: at most
//! [`MAX_CONNECTIONS`] at once (more wait in the listen backlog), and the proxy port's
//! `limits.max_connections` leaves them out of its budget, so a flood of clients on the
//! proxy port cannot starve a scrape or a probe.
//!
//! `/metrics` text (either kind) is a streamed body rendered a chunk at a time as hyper
//! writes it: with
//! thousands of label pairs the text is over 100 MB, and rendering it whole took that much
//! memory per scrape and held a tokio worker (and the proxied streams on it) for 50-130 ms.
//! The protobuf body is much smaller per series and is encoded whole, from a snapshot, on
//! tokio's blocking pool so that it holds no worker either.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::live::{page, Live};
use crate::metrics::{protobuf, Exposition, Metrics};

/// Prometheus text exposition format 0.0.4.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics text exposition format 1.0.0.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Admin connections served at once: scrapers and probes are few and short, so this
/// bounds what a misbehaving one can hold, and is the admin port's reserve of file
/// descriptors (`limits.max_connections` leaves it out of the proxy port's budget).
pub const MAX_CONNECTIONS: usize = 16;

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

/// Serve the admin endpoints until the task is aborted.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    live: Option<Arc<Live>>,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin listening (/metrics, /healthz, /readyz)");
    }
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // Wait for a slot before accepting: at the bound, new connections queue in the
        // listen backlog and are served as earlier ones finish.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        let live = live.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |request| {
                let metrics = metrics.clone();
                let readiness = readiness.clone();
                let live = live.clone();
                async move {
                    Ok::<_, Infallible>(
                        route(&request, &metrics, &readiness, live.as_deref()).await,
                    )
                }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn route(
    request: &Request<Incoming>,
    metrics: &Arc<Metrics>,
    readiness: &Readiness,
    live: Option<&Live>,
) -> Response<AdminBody> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    let path = request.uri().path();
    if path == "/ui" || path.starts_with("/ui/") || path.starts_with("/api/live/") {
        return match live {
            Some(live) => live_route(request, live),
            None => plain(
                StatusCode::NOT_FOUND,
                "not found: the live view is off (ui.enabled: false)\n",
            ),
        };
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
