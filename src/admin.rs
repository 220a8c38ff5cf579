//! The admin port: `/metrics` (Prometheus text format), `/healthz` (the process is alive)
//! and `/readyz` (config loaded, listener bound, upstream reachable, not draining).
//!
//! It is a separate listener so that scraping and probes never compete with, or show up
//! in, proxied traffic.
//!
//! `/metrics` is a streamed body rendered a chunk at a time as hyper writes it: with
//! thousands of label pairs the text is over 100 MB, and rendering it whole took that much
//! memory per scrape and held a tokio worker (and the proxied streams on it) for 50-130 ms.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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

use crate::metrics::{Exposition, Metrics};

/// Prometheus text exposition format 0.0.4.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Chunks rendered in one poll of the connection task before it yields (about 200 KiB,
/// well under a millisecond): hyper keeps polling a body that is always ready until its
/// write buffer is full, sixteen times over, before it yields by itself.
const CHUNKS_PER_POLL: u32 = 4;

type AdminBody = Either<Full<Bytes>, MetricsBody>;

/// What `/readyz` reports. The server sets it (bound, probe result, draining); it lives
/// here, beside the endpoint that reads it.
#[derive(Debug, Default)]
pub struct Readiness {
    pub listening: AtomicBool,
    pub upstream_reachable: AtomicBool,
    pub draining: AtomicBool,
}

impl Readiness {
    /// `Ok` when ready, else the reason.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.draining.load(Ordering::Relaxed) {
            Err("draining")
        } else if !self.listening.load(Ordering::Relaxed) {
            Err("listener not bound")
        } else if !self.upstream_reachable.load(Ordering::Relaxed) {
            Err("upstream not reachable")
        } else {
            Ok(())
        }
    }
}

/// Serve the admin endpoints until the task is aborted.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, readiness: Arc<Readiness>) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin listening (/metrics, /healthz, /readyz)");
    }
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = route(&request, &metrics, &readiness);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn route(
    request: &Request<Incoming>,
    metrics: &Arc<Metrics>,
    readiness: &Readiness,
) -> Response<AdminBody> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match request.uri().path() {
        "/metrics" => {
            // No content-length (the size is known only at the end): chunked over
            // HTTP/1.1. hyper never polls the body of a HEAD response, so HEAD renders nothing.
            let body = MetricsBody {
                exposition: metrics.exposition(),
                chunks: 0,
            };
            let mut response = Response::new(Either::Right(body));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            response
        }
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
