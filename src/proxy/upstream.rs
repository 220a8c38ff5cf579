//! The upstream side: a pooled HTTP client, the rewrite of a client request into an
//! upstream request (URI, version, hop-by-hop headers, `Host`), and the mapping of
//! failures to [`ExchangeError`]s: the upstream's faults, or the client's own (see
//! [`intermediary`] and [`request_body`](super::request_body)).
//!
//! A plain `http://` HTTP/1.1 upstream (the sidecar case) goes through
//! [`h1_upstream`](super::h1_upstream), whose connections are driven by the task that writes
//! to the client. HTTPS (ALPN) and h2c upstreams go through hyper-util's pooled client.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, StatusCode, Version};
use http_body::Body as _;
use hyper::upgrade::OnUpgrade;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::body::UpstreamBody;
use super::h1_upstream::{error_chain, H1Pool, ResponseBody};
use super::h2_only::H2Only;
use super::tunnel::{self, Tunnels};
use crate::config::{HostHeader, Upstream};
use crate::exchange::{ClientFault, ExchangeError, UpstreamFault};
use crate::idle_pool::Origin;
use crate::intermediary::{self, HostError};
use crate::trust::{self, TrustError};

/// Why the upstream client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("upstream.ca_file: {0}")]
    Trust(#[from] TrustError),
}

/// The pooled client for one upstream.
#[derive(Clone)]
pub struct UpstreamClient {
    transport: Transport,
    /// `Host` for requests that do not keep the client's: the upstream authority, with
    /// its port unless it is 80.
    host: HeaderValue,
    config: Arc<Upstream>,
}

#[derive(Clone)]
enum Transport {
    /// Plain HTTP/1.1: connections driven by the task that uses them.
    PlainH1(H1Pool),
    /// HTTPS or h2c: hyper-util's client, one task per connection.
    Pooled(Box<Client<H2Only, UpstreamBody>>),
}

impl UpstreamClient {
    pub fn new(config: &Upstream) -> Result<UpstreamClient, ClientError> {
        let transport = if config.is_plain_http1() {
            Transport::PlainH1(H1Pool::new(
                Origin::of(&config.authority),
                config.connect_timeout,
                config.pool_idle_timeout,
                config.pool_max_idle_per_host,
            ))
        } else {
            Transport::Pooled(Box::new(pooled_client(config)?))
        };
        Ok(UpstreamClient {
            transport,
            host: host_header_value(&config.authority),
            config: Arc::new(config.clone()),
        })
    }

    /// Send a client request upstream. `parts` come from the client request unchanged;
    /// this rewrites only what a proxy must. `body` is moved as it is.
    pub async fn send(
        &self,
        mut parts: http::request::Parts,
        body: UpstreamBody,
        tunnels: &Tunnels,
    ) -> Result<Response<ResponseBody>, ExchangeError> {
        if parts.method == http::Method::CONNECT {
            // A reverse proxy has no tunnel to offer (forwarded, it would be `CONNECT /`).
            return Err(ClientFault::ConnectMethod.into());
        }
        intermediary::check_transfer_coding(&mut parts.headers)
            .map_err(ClientFault::RequestCoding)?;
        // Upgrades are relayed to plain HTTP/1.1 upstreams; elsewhere they are stripped
        // like any hop-by-hop header.
        let upgrade = match (&self.transport, parts.extensions.remove::<OnUpgrade>()) {
            (Transport::PlainH1(_), Some(on_upgrade)) => {
                tunnel::requested_protocol(parts.version, &parts.headers)
                    .map(|protocol| (protocol, on_upgrade))
            }
            _ => None,
        };
        let upgrading = upgrade.is_some();
        let client_authority = parts.uri.authority().cloned();
        let path_and_query = self.upstream_path(&parts.uri);
        prepare_headers(
            parts.version,
            &mut parts.headers,
            self.config.host_header,
            client_authority.as_ref(),
        )
        .map_err(ClientFault::InvalidHost)?;
        // A body that is not known to be empty goes up however it came; hyper's client
        // would send a `GET` or `HEAD` of unknown length as bodiless.
        let unframed_body = !body.is_end_stream()
            && matches!(parts.method, http::Method::GET | http::Method::HEAD)
            && !parts.headers.contains_key(header::CONTENT_LENGTH);
        let exchange = async {
            match &self.transport {
                Transport::PlainH1(pool) => {
                    let upgrade = upgrade.map(|(protocol, client)| (protocol, client, tunnels));
                    self.send_plain_h1(pool, parts, body, path_and_query, unframed_body, upgrade)
                        .await
                }
                Transport::Pooled(client) => {
                    parts.uri = self.absolute_uri(path_and_query);
                    // The client picks HTTP/2 itself where ALPN negotiated it.
                    parts.version = if self.config.http2 {
                        Version::HTTP_2
                    } else {
                        Version::HTTP_11
                    };
                    match client.request(Request::from_parts(parts, body)).await {
                        Ok(response) => Ok(response.map(ResponseBody::detached)),
                        Err(err) if err.is_connect() => {
                            Err(UpstreamFault::Connect(error_chain(&err)).into())
                        }
                        Err(err) => Err(UpstreamFault::Request(error_chain(&err)).into()),
                    }
                }
            }
        };
        // The head deadline is the exchange policy's; the caller holds it.
        let mut response = exchange.await?;
        if response.status() == StatusCode::SWITCHING_PROTOCOLS && !upgrading {
            return Err(UpstreamFault::UnsolicitedSwitch.into());
        }
        intermediary::check_transfer_coding(response.headers_mut())
            .map_err(UpstreamFault::Framing)?;
        Ok(response)
    }

    /// Send to a plain HTTP/1.1 upstream what hyper-util's client would send for it:
    /// origin-form, a `Host` from the upstream URI unless one is kept, and an upgrade on a
    /// connection of its own.
    async fn send_plain_h1(
        &self,
        pool: &H1Pool,
        mut parts: http::request::Parts,
        body: UpstreamBody,
        path_and_query: String,
        unframed_body: bool,
        upgrade: Option<(HeaderValue, OnUpgrade, &Tunnels)>,
    ) -> Result<Response<ResponseBody>, ExchangeError> {
        parts.uri = Uri::try_from(path_and_query).unwrap_or_else(|_| Uri::from_static("/"));
        parts.version = Version::HTTP_11;
        if unframed_body {
            parts.headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        if !parts.headers.contains_key(header::HOST) {
            parts.headers.insert(header::HOST, self.host.clone());
        }
        let Some((protocol, client, tunnels)) = upgrade else {
            return pool.send(Request::from_parts(parts, body)).await;
        };
        tunnel::keep_upgrade(&mut parts.headers, protocol);
        let host = self.config.authority.host().trim_matches(['[', ']']);
        let port = self.config.authority.port_u16().unwrap_or(80);
        let request = Request::from_parts(parts, body);
        let timeout = self.config.connect_timeout;
        tunnel::send(host, port, timeout, request, client, tunnels)
            .await
            .map(|response| response.map(ResponseBody::detached))
    }

    /// The upstream's path and query for a client URI: `base_path` + the client's.
    fn upstream_path(&self, client_uri: &Uri) -> String {
        let path_and_query = client_uri
            .path_and_query()
            .map_or("/", PathAndQuery::as_str);
        if self.config.base_path.is_empty() {
            path_and_query.to_string()
        } else {
            format!("{}{}", self.config.base_path, path_and_query)
        }
    }

    fn absolute_uri(&self, path_and_query: String) -> Uri {
        Uri::builder()
            .scheme(self.config.scheme.clone())
            .authority(self.config.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .unwrap_or_else(|_| {
                // Only reachable with a path hyper accepted but http rejects; keep the path.
                Uri::from_static("/")
            })
    }

    /// Open (and drop) one TCP connection to the upstream: the readiness probe.
    pub async fn probe(&self) -> bool {
        let host = self
            .config
            .authority
            .host()
            .trim_matches(['[', ']'])
            .to_string();
        let port = self.config.authority.port_u16().unwrap_or(
            if self.config.scheme == http::uri::Scheme::HTTPS {
                443
            } else {
                80
            },
        );
        matches!(
            tokio::time::timeout(
                self.config.connect_timeout,
                tokio::net::TcpStream::connect((host.as_str(), port))
            )
            .await,
            Ok(Ok(_))
        )
    }
}

/// hyper-util's client, for HTTPS (HTTP/1.1 or h2 by ALPN; h2 only with `http2`) and h2c
/// upstreams.
fn pooled_client(config: &Upstream) -> Result<Client<H2Only, UpstreamBody>, ClientError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(config.connect_timeout));
    let tls = trust::client_config(trust::root_store(config.ca_file.as_deref())?);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let connector: HttpsConnector<HttpConnector> = if config.http2 {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.enable_all_versions().wrap_connector(http)
    };
    let connector = H2Only::new(connector, config.http2);
    let client = Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(config.pool_idle_timeout)
        .pool_max_idle_per_host(config.pool_max_idle_per_host)
        .http1_preserve_header_case(true)
        .http1_max_buf_size(intermediary::MAX_UPSTREAM_HEAD_BYTES)
        .http1_max_headers(intermediary::MAX_UPSTREAM_HEAD_FIELDS)
        .http2_max_header_list_size(
            u32::try_from(intermediary::MAX_UPSTREAM_HEAD_BYTES).unwrap_or(u32::MAX),
        )
        .http2_only(config.http2)
        // A request whose body has started streaming cannot be replayed.
        .retry_canceled_requests(false)
        .set_host(true)
        .build(connector);
    Ok(client)
}

fn host_header_value(authority: &http::uri::Authority) -> HeaderValue {
    HeaderValue::from_str(&intermediary::host_value(authority))
        .unwrap_or_else(|_| HeaderValue::from_static("localhost"))
}

/// Remove hop-by-hop headers from a response head, except that a `101` keeps the
/// `Upgrade` it answers with and says `Connection: upgrade`, as the switch needs.
pub fn strip_response_hop_by_hop(parts: &mut http::response::Parts) {
    let switching = (parts.status == StatusCode::SWITCHING_PROTOCOLS)
        .then(|| parts.headers.get(header::UPGRADE).cloned())
        .flatten();
    intermediary::strip_hop_by_hop(&mut parts.headers);
    if let Some(protocol) = switching {
        tunnel::keep_upgrade(&mut parts.headers, protocol);
    }
}

fn prepare_headers(
    version: Version,
    headers: &mut HeaderMap,
    host: HostHeader,
    client_authority: Option<&http::uri::Authority>,
) -> Result<(), HostError> {
    intermediary::strip_hop_by_hop(headers);
    // Checked whichever `Host` goes upstream: two make the request invalid (RFC 9112 3.2).
    let preserved = intermediary::preserved_host(version, headers, client_authority)?;
    headers.remove(header::HOST);
    match (host, preserved) {
        // The client sets `Host` from the upstream URI.
        (HostHeader::Upstream, _) | (HostHeader::Preserve, None) => {}
        (HostHeader::Preserve, Some(value)) => {
            headers.insert(header::HOST, value);
        }
    }
    Ok(())
}
