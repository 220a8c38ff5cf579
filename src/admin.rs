//! The admin port: `/metrics` (Prometheus text format), `/healthz` (the process is alive)
//! and `/readyz` (config loaded, listener bound, upstream reachable, not draining).
//!
//! It is a separate listener so that scraping and probes never compete with, or show up
//! in, proxied traffic.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::server::Readiness;

/// Prometheus text exposition format 0.0.4.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
    metrics: &Metrics,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match request.uri().path() {
        "/metrics" => {
            let mut response = Response::new(Full::new(Bytes::from(metrics.render())));
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

fn plain(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
