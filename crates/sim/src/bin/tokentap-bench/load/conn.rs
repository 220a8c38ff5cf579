//! The client side of one connection: HTTP/1.1 (one stream at a time) or h2c (prior
//! knowledge, streams multiplexed), behind one `Sender`.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::Shared;

pub(super) type H2Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

pub(super) enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(H2Sender),
}

impl Sender {
    pub(super) fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    pub(super) async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> hyper::Result<http::Response<Incoming>> {
        match self {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(request).await
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(request).await
            }
        }
    }
}

pub(super) async fn connect_h1(shared: &Shared) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(&shared.authority).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Sender::H1(sender))
}

/// An h2c connection, which every stream slot sharing it clones.
pub(super) async fn connect_h2(shared: &Shared) -> anyhow::Result<H2Sender> {
    let stream = tokio::net::TcpStream::connect(&shared.authority).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(16 << 20)
        .max_concurrent_reset_streams(1 << 16)
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}
