//! HTTP/1.1 protocol upgrades (WebSocket, and any other `Upgrade` protocol) as an opaque
//! byte relay.
//!
//! `Upgrade` and `Connection` are hop-by-hop, so a proxy that strips them (as tokentap
//! does for every other request) makes the upstream answer an ordinary response, and a
//! `101` without `Upgrade` is useless to the client. An upgrade request instead goes out
//! on a connection of its own with the two headers kept; when the upstream switches
//! protocols, both connections are handed over by hyper and bytes are copied both ways
//! until either side closes. Nothing in the tunnel is observed: it is a passthrough.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::body::UpstreamBody;
use super::h1_upstream::error_chain;
use crate::exchange::{ExchangeError, UpstreamFault};

/// The protocol an HTTP/1.1 request asks to switch to: `Connection: upgrade` plus an
/// `Upgrade` header. h2 has no `Upgrade` (it uses extended CONNECT, answered 405).
///
/// An upgrade to `h2c` is never relayed: the request goes up as an ordinary one, its
/// `Upgrade` stripped (as Envoy does). A tunnelled h2c connection would carry requests
/// tokentap never sees (unmeasured, outside `limits.max_in_flight`, the "h2c smuggling"
/// that slips past a proxy's rules), and RFC 9113 3.1 retires the upgrade anyway.
pub fn requested_protocol(version: Version, headers: &HeaderMap) -> Option<HeaderValue> {
    if version != Version::HTTP_11 {
        return None;
    }
    let h2c = headers.get_all(header::UPGRADE).iter().any(|value| {
        value
            .to_str()
            .is_ok_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("h2c")))
    });
    if h2c {
        return None;
    }
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// The tunnels open now. hyper lets go of a connection once it is upgraded, so the
/// server's drain waits for these as well ([`Tunnels::all_closed`]): a tunnel open at
/// shutdown lives on until it closes or the drain deadline passes, like any stream.
#[derive(Clone, Default)]
pub struct Tunnels(Arc<OpenTunnels>);

#[derive(Default)]
struct OpenTunnels {
    count: AtomicUsize,
    closed: Notify,
}

/// One open tunnel, counted until dropped.
struct Held(Tunnels);

impl Drop for Held {
    fn drop(&mut self) {
        if self.0 .0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0 .0.closed.notify_waiters();
        }
    }
}

impl Tunnels {
    fn hold(&self) -> Held {
        self.0.count.fetch_add(1, Ordering::AcqRel);
        Held(self.clone())
    }

    /// How many are open.
    pub fn open(&self) -> usize {
        self.0.count.load(Ordering::Acquire)
    }

    /// Resolves once no tunnel is open.
    pub async fn all_closed(&self) {
        loop {
            let closed = self.0.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            closed.await;
        }
    }
}

/// Put back the two headers an upgrade needs after the hop-by-hop strip.
pub fn keep_upgrade(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(header::UPGRADE, protocol);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
}

/// Send an upgrade request to `host:port` on a new connection; if the upstream answers
/// `101`, relay bytes between it and the client (`client`, the client connection's
/// pending upgrade) in a task of their own, counted in `tunnels` while it runs.
pub async fn send(
    host: &str,
    port: u16,
    connect_timeout: Duration,
    request: Request<UpstreamBody>,
    client: OnUpgrade,
    tunnels: &Tunnels,
) -> Result<Response<Incoming>, ExchangeError> {
    let connect = TcpStream::connect((host, port));
    let stream = match tokio::time::timeout(connect_timeout, connect).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => return Err(UpstreamFault::Connect(err.to_string()).into()),
        Err(_) => {
            return Err(
                UpstreamFault::Connect(format!("timed out after {connect_timeout:?}")).into(),
            )
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .preserve_header_case(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|err| UpstreamFault::Connect(error_chain(&err)))?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(error = %err, "upgrade connection to the upstream ended with an error");
        }
    });
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|err| UpstreamFault::Request(error_chain(&err)))?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let upstream = hyper::upgrade::on(&mut response);
        let held = tunnels.hold();
        tokio::spawn(async move {
            relay(client, upstream).await;
            drop(held);
        });
    }
    Ok(response)
}

/// Copy bytes both ways between the two upgraded connections until either ends.
async fn relay(client: OnUpgrade, upstream: OnUpgrade) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(err) => {
            tracing::debug!(error = %err, "protocol upgrade did not complete");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
        Err(err) => tracing::debug!(error = %err, "upgraded connection failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrade_needs_both_headers_on_http1() {
        let mut headers = HeaderMap::new();
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(requested_protocol(Version::HTTP_11, &headers), None);
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert_eq!(
            requested_protocol(Version::HTTP_11, &headers),
            Some(HeaderValue::from_static("websocket"))
        );
        assert_eq!(requested_protocol(Version::HTTP_2, &headers), None);
        headers.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        assert_eq!(requested_protocol(Version::HTTP_11, &headers), None, "h2c");
        headers.remove(header::UPGRADE);
        assert_eq!(requested_protocol(Version::HTTP_11, &headers), None);
    }
}
