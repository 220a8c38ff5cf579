//! `upstream.http2` on an `https://` upstream: the TLS connection must carry h2.
//!
//! gRPC needs HTTP/2 (its status travels in trailers, which an HTTP/1.1 response drops
//! unless it declares them), so an operator who says `http2` means it. The TLS client then
//! offers only `h2` by ALPN; a server that speaks ALPN but not h2 fails the handshake, and
//! one that answers without ALPN (an HTTP/1.1-only server commonly does) would otherwise
//! be sent an HTTP/2 preface it cannot read and fail with an error that names neither
//! side. [`H2Only`] refuses that connection at once, saying why.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::TokioIo;

type Stream = MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The TLS server chose no protocol, or one other than h2.
#[derive(Debug, thiserror::Error)]
#[error("upstream.http2 is set but the upstream's TLS handshake did not negotiate h2 by ALPN (it chose {chosen})")]
pub struct NotH2 {
    chosen: String,
}

/// hyper-rustls's connector, refusing a TLS connection that did not negotiate h2 when
/// `require_h2` is set (plain `http://` connections pass: h2c has no ALPN).
#[derive(Clone)]
pub struct H2Only {
    inner: HttpsConnector<HttpConnector>,
    require_h2: bool,
}

impl H2Only {
    pub fn new(inner: HttpsConnector<HttpConnector>, require_h2: bool) -> H2Only {
        H2Only { inner, require_h2 }
    }
}

impl tower_service::Service<Uri> for H2Only {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let require_h2 = self.require_h2;
        Box::pin(async move {
            let stream = connecting.await?;
            if let MaybeHttpsStream::Https(tls) = &stream {
                if require_h2 && !stream.connected().is_negotiated_h2() {
                    let chosen = tls.inner().get_ref().1.alpn_protocol().map_or_else(
                        || "no protocol".to_string(),
                        |p| format!("`{}`", String::from_utf8_lossy(p)),
                    );
                    return Err(Box::new(NotH2 { chosen }) as BoxError);
                }
            }
            Ok(stream)
        })
    }
}
