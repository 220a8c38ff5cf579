//! The fast path's relay: a plain HTTP/1.1 client connection served by tokentap itself.
//!
//! Each request head is read with [`request_head`]; one the relay fully understands (no
//! body, a `Content-Length` body or a chunked one, to a plain-HTTP/1.1 upstream) is
//! forwarded (a chunked body re-chunked as hyper's client writes it) on a
//! connection of this worker's [`upstream_pool`], and the response is relayed as it
//! arrives while [`response`] tells the observer where its body data is: a
//! `Content-Length` body byte for byte, a chunked or close-delimited one in chunks of the
//! relay's own, one per piece of data, as hyper's server writes them (so that trailers
//! pass as hyper passes them, and the client connection outlives a close-delimited body).
//! The connection is then kept for the client's next request. Anything else (`Expect`,
//! upgrades, HTTP/1.0, an HTTPS or h2c upstream, ...) ends the
//! relay at that request boundary: the connection goes to hyper with the bytes read so
//! far, which serves it exactly as if it had read every byte itself.
//!
//! Per request it does what [`Proxy`]'s hyper service does, in the same order and with
//! the same answers: admission (the `503`), the configuration in force, observation
//! ([`observe::start`]: routes, tenant, the request body's scan, the access log and the
//! recorded outcome), `upstream.response_head_timeout` (`504`), a failed connect or
//! exchange (`502`), and `upstream.idle_timeout` between reads of the body. What hyper's
//! server adds, it adds too: `connection: close` to a closing client's answer (or at
//! shutdown), and the chunked coding of a body the upstream delimits by closing.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HeaderName;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::chunked::ChunkedReader;
use super::request_head::{self, Decision, ForwardHead, HeadReader, HeadRules, RequestFraming};
use super::response::ResponseRules;
use super::response::{BodyFraming, Piece, ResponseError, ResponseHead, ResponseReader};
use super::scratch;
use super::upstream_pool::{self, Origin};
use crate::config::{Config, HostHeader};
use crate::observe::{self, Outcome, Pending, RequestHead, ResponseObserver};
use crate::proxy::headers::UnsupportedTransferCoding;
use crate::proxy::upstream::{error_response, UpstreamError};
use crate::proxy::{ActiveConfig, Proxy, OVERLOADED};

/// How much is read from either side at a time.
const READ_CHUNK: usize = 8192;

/// The upstream response head limits of the hyper path's plain-HTTP/1.1 client: its read
/// buffer (16 KiB, `proxy::h1_upstream`) and hyper's default field count.
const RESPONSE_RULES: ResponseRules = ResponseRules {
    max_header_bytes: 16 << 10,
    max_headers: 100,
};

/// What hyper's client says when the upstream closes before a response head.
const CLOSED_BEFORE_HEAD: &str = "connection closed before message completed";

/// The request-head rules of one configuration, owned so that a connection can keep them
/// while the configuration stays in force.
#[derive(Debug, Clone)]
struct HeadConfig {
    max_header_bytes: usize,
    max_headers: usize,
    upstream_host: String,
    preserve_host: bool,
    base_path: String,
}

impl HeadConfig {
    fn new(config: &Config) -> HeadConfig {
        let authority = &config.upstream.authority;
        let upstream_host = match authority.port_u16() {
            Some(port) if port != 80 => format!("{}:{port}", authority.host()),
            _ => authority.host().to_string(),
        };
        HeadConfig {
            max_header_bytes: config.limits.max_header_bytes,
            max_headers: config.limits.max_headers,
            upstream_host,
            preserve_host: config.upstream.host_header == HostHeader::Preserve,
            base_path: config.upstream.base_path.clone(),
        }
    }

    fn rules(&self) -> HeadRules<'_> {
        HeadRules {
            max_header_bytes: self.max_header_bytes,
            max_headers: self.max_headers,
            upstream_host: self.upstream_host.as_bytes(),
            preserve_host: self.preserve_host,
            base_path: &self.base_path,
        }
    }
}

/// How a relayed connection ended.
#[derive(Debug)]
pub enum Relayed {
    /// hyper serves the rest of the connection; these bytes were read from it already.
    HandOff(Vec<u8>),
    /// The connection is done (closed by either side, answered and closed, timed out,
    /// or the server is shutting down).
    Closed,
}

/// What the relay of one connection needs.
pub struct Relay {
    proxy: Arc<Proxy>,
    /// The configuration the head rules were made from, and the rules.
    active: Arc<ActiveConfig>,
    rules: HeadConfig,
    header_read_timeout: Duration,
}

/// What became of one request.
enum Next {
    /// Read the client's next request.
    KeepAlive,
    /// Close the client connection.
    Close,
}

impl Relay {
    pub fn new(proxy: Arc<Proxy>, header_read_timeout: Duration) -> Relay {
        let active = proxy.active();
        let rules = HeadConfig::new(&active.config);
        Relay {
            proxy,
            active,
            rules,
            header_read_timeout,
        }
    }

    /// The configuration in force, with the head rules made from it.
    fn refresh(&mut self) {
        let active = self.proxy.active();
        if !Arc::ptr_eq(&active, &self.active) {
            self.rules = HeadConfig::new(&active.config);
            self.active = active;
        }
    }

    /// Serve `client` until it closes, is handed to hyper, or the server shuts down. The
    /// first head must be complete by `first_deadline`, each later one within
    /// `limits.header_read_timeout` of the previous response's end (as hyper's server
    /// bounds a kept-alive connection's wait). A connection waiting for a head is closed
    /// at once when `closing` turns `true`; one with a request in flight finishes it.
    pub async fn serve(
        mut self,
        client: &mut TcpStream,
        first_deadline: tokio::time::Instant,
        closing: &mut watch::Receiver<bool>,
    ) -> io::Result<Relayed> {
        let mut input = Vec::with_capacity(READ_CHUNK);
        let mut reader = HeadReader::new();
        let mut deadline = first_deadline;
        loop {
            if *closing.borrow() {
                return Ok(Relayed::Closed);
            }
            self.refresh();
            let decision = if input.is_empty() {
                Decision::NeedMore
            } else {
                reader.decide(&input, &self.rules.rules())
            };
            match decision {
                Decision::NeedMore => {
                    let read = tokio::select! {
                        read = tokio::time::timeout_at(deadline, read_more(client, &mut input)) => read,
                        _ = shutting_down(closing) => return Ok(Relayed::Closed),
                    };
                    match read {
                        Ok(Ok(0)) | Err(_) => return Ok(Relayed::Closed),
                        Ok(Ok(_)) => {}
                        Ok(Err(err)) => return Err(err),
                    }
                }
                Decision::Reject(status) => {
                    client.write_all(&request_head::rejection(status)).await?;
                    client.flush().await?;
                    return Ok(Relayed::Closed);
                }
                Decision::HandOff(_) => return Ok(Relayed::HandOff(input)),
                Decision::Forward(head) => {
                    if !self.relays() {
                        return Ok(Relayed::HandOff(input));
                    }
                    match self.exchange(client, &mut input, head, closing).await? {
                        Next::KeepAlive => {}
                        Next::Close => {
                            let _ = client.shutdown().await;
                            return Ok(Relayed::Closed);
                        }
                    }
                    reader = HeadReader::next_on_connection();
                    deadline = tokio::time::Instant::now() + self.header_read_timeout;
                }
            }
        }
    }

    /// Whether the relay forwards this request itself: every head the reader forwards,
    /// when the upstream is plain HTTP/1.1.
    fn relays(&self) -> bool {
        let upstream = &self.active.config.upstream;
        upstream.scheme == http::uri::Scheme::HTTP && !upstream.http2
    }

    /// Forward one request (its head at the start of `input`) and relay its response.
    async fn exchange(
        &self,
        client: &mut TcpStream,
        input: &mut Vec<u8>,
        head: Box<ForwardHead>,
        closing: &watch::Receiver<bool>,
    ) -> io::Result<Next> {
        let t_req = Instant::now();
        let client_closing = !head.keep_alive;
        let body_len = match head.framing {
            RequestFraming::ContentLength(n) => n,
            _ => 0,
        };
        let Some(permit) = self.proxy.admit() else {
            let answer = answer(StatusCode::SERVICE_UNAVAILABLE, OVERLOADED, client_closing);
            return self
                .answer_unread(client, input, &head, body_len, answer)
                .await;
        };
        let active = self.active.clone();
        let (mut scan, pending) = observe::start(
            RequestHead {
                method: &head.method,
                uri: &head.uri,
                headers: &head.headers,
            },
            t_req,
            &active.config,
            active.tokenizer.as_ref(),
            self.proxy.metrics(),
        );
        let upstream_config = &active.config.upstream;
        let head_timeout = upstream_config.response_head_timeout;
        let head_deadline = tokio::time::Instant::now() + head_timeout;
        let origin = Origin {
            host: upstream_config.authority.host().to_string(),
            port: upstream_config.authority.port_u16().unwrap_or(80),
        };

        // The request, up to the end of its body.
        let mut started = false;
        let sent = tokio::time::timeout_at(
            head_deadline,
            send_request(
                client,
                input,
                &head,
                body_len,
                &origin,
                &active,
                &mut scan,
                &mut started,
            ),
        )
        .await
        .unwrap_or(Err(Failure::Upstream(UpstreamError::Timeout(head_timeout))));
        let mut upstream = match sent {
            Ok(upstream) => upstream,
            Err(failure) => {
                let (err, close) = match failure {
                    Failure::Upstream(err) => (err, client_closing),
                    Failure::Client(err) => (err, true),
                };
                let next = self
                    .fail_before_head(client, &head, err, pending, close)
                    .await?;
                // Once the request started on its way, the rest of its body is unread.
                return Ok(if started {
                    Next::Close
                } else {
                    skip_unread(input, &head, body_len, next)
                });
            }
        };

        // The response.
        let mut reader = ResponseReader::new(head.method == Method::HEAD, RESPONSE_RULES);
        let mut pending = Some(pending);
        let mut observer: Option<ResponseObserver> = None;
        let mut framing = None;
        let mut reusable = false;
        let mut keep_client = !client_closing;
        // Bytes read but not yet consumed (the start of a head), and what the client did
        // not take at once: the stream's own, usually empty. Reads and writes otherwise go
        // through the worker's buffers (`scratch`).
        let mut carry: Vec<u8> = Vec::new();
        let mut unsent: Vec<u8> = Vec::new();
        let idle_timeout = upstream_config.idle_timeout;
        // hyper's server sends trailers only to a client that asked for them with
        // `TE: trailers`, and only those the response declares in `Trailer`.
        let client_takes_trailers = te_trailers(&head.headers);
        let mut declared_trailers = Vec::new();
        // One timer for the whole response: the head deadline until the head is in, then
        // `idle_timeout` after the last read that brought data. It is re-armed only when
        // it fires early (the stream was not idle that long), not on every read: arming a
        // timer per read costs more than the rest of a read's bookkeeping.
        let timer = tokio::time::sleep_until(head_deadline);
        tokio::pin!(timer);
        let mut last_data = tokio::time::Instant::now();
        loop {
            let read = tokio::select! {
                biased;
                read = read_upstream(&mut upstream, &carry, hot_lines(&reader, &observer)) => Some(read),
                () = &mut timer => {
                    let idle_until = last_data + idle_timeout;
                    if framing.is_some() && idle_until > tokio::time::Instant::now() {
                        timer.as_mut().reset(idle_until);
                        continue;
                    }
                    None
                }
            };
            let Some((read, mut buffers)) = read else {
                let at = Instant::now();
                if let Some(pending) = pending.take() {
                    let err = UpstreamError::Timeout(head_timeout);
                    return self
                        .fail_before_head(client, &head, err, pending, client_closing)
                        .await;
                }
                tracing::warn!(timeout = ?idle_timeout, "upstream stream idle; aborting it");
                if let Some(observer) = observer.as_mut() {
                    observer.fail(at, Outcome::Timeout);
                }
                return Ok(Next::Close);
            };
            carry.clear();
            let received = &buffers.received;
            let at = Instant::now();
            last_data = tokio::time::Instant::from_std(at);
            let fed = match read {
                Err(err) => Err(Broken::Io(err)),
                Ok(0) => reader
                    .closed(&mut buffers.pieces)
                    .map(|()| received.len())
                    .map_err(Broken::Response),
                Ok(_) => reader
                    .feed(received, &mut buffers.pieces)
                    .map_err(Broken::Response),
            };
            // A break mid-body ends the response once what came before it is relayed:
            // hyper's client yields that data (and a head that came with it) before the
            // error, and hyper's server then cuts the client's response.
            let (used, broken) = match fed {
                Ok(used) => (used, None),
                Err(broken) => {
                    let has_head = buffers
                        .pieces
                        .iter()
                        .any(|piece| matches!(piece, Piece::Head(_)));
                    if !has_head {
                        if let Some(pending) = pending.take() {
                            scratch::give_back(buffers);
                            let err = broken.before_head();
                            return self
                                .fail_before_head(client, &head, err, pending, client_closing)
                                .await;
                        }
                    }
                    (received.len(), Some(broken))
                }
            };

            let out = &mut buffers.out;
            let mut relay_from = 0;
            let mut ended = false;
            for piece in buffers.pieces.drain(..) {
                match piece {
                    Piece::Interim(range) => relay_from = range.end,
                    Piece::Head(response_head) => {
                        let shutting_down = *closing.borrow();
                        keep_client &= !shutting_down;
                        let add_chunked = response_head.framing == BodyFraming::UntilClose;
                        client_head(&response_head, !keep_client, add_chunked, out);
                        if response_head.framing == BodyFraming::Chunked && client_takes_trailers {
                            declared_trailers = declared(&response_head.headers);
                        }
                        observer = pending.take().and_then(|pending| {
                            pending.response(at, response_head.status, &response_head.headers)
                        });
                        relay_from = response_head.range.end;
                        reusable = response_head.reusable;
                        framing = Some(response_head.framing);
                        timer.as_mut().reset(last_data + idle_timeout);
                    }
                    Piece::Data(range) => {
                        if let Some(observer) = observer.as_mut() {
                            // One clock read per piece of data (a chunk, or what a read
                            // brought of a length-delimited body), as the hyper path reads
                            // it once per body frame and after the head.
                            observer.data(Instant::now(), &received[range.clone()]);
                        }
                        if rechunked(framing) {
                            chunk(&received[range], out);
                        }
                    }
                    Piece::End => ended = true,
                }
            }
            match framing {
                None => {}
                Some(_) if rechunked(framing) && ended => {
                    last_chunk(reader.trailer_section(), &declared_trailers, out);
                }
                Some(_) if rechunked(framing) || broken.is_some() => {}
                Some(_) => out.extend_from_slice(&received[relay_from..used]),
            }
            if ended {
                if let Some(observer) = observer.as_mut() {
                    // Its own clock read, as the hyper path sees the end after the last
                    // frame (what a decoder finishes at the end is timed there).
                    observer.end(Instant::now());
                }
            }
            let leftover = received.len() > used;
            // Most writes go whole at once; the rest waits in the stream's own buffer.
            let mut client_gone = false;
            if !out.is_empty() {
                let written = match send_now(client, out) {
                    Ok(written) => written,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(_) => {
                        client_gone = true;
                        0
                    }
                };
                if !client_gone {
                    unsent.extend_from_slice(&out[written..]);
                }
            }
            if !ended {
                carry.extend_from_slice(&received[used..]);
            }
            scratch::give_back(buffers);
            if client_gone || (!unsent.is_empty() && client.write_all(&unsent).await.is_err()) {
                // The client went away: an unended observer records it as cancelled.
                return Ok(Next::Close);
            }
            unsent.clear();
            if let Some(broken) = broken {
                tracing::warn!(error = %broken, "upstream stream failed mid-body");
                if let Some(observer) = observer.as_mut() {
                    observer.fail(at, Outcome::UpstreamError);
                }
                return Ok(Next::Close);
            }
            if ended {
                drop(permit);
                if reusable && !leftover && framing != Some(BodyFraming::UntilClose) {
                    upstream_pool::checkin(
                        &origin,
                        upstream,
                        upstream_config.pool_idle_timeout,
                        upstream_config.pool_max_idle_per_host,
                    );
                }
                return Ok(if keep_client {
                    Next::KeepAlive
                } else {
                    Next::Close
                });
            }
        }
    }

    /// Answer a request whose body was not read (it was refused before it went upstream):
    /// the connection carries on only if the whole body had arrived already, as hyper's
    /// server drains what it can without waiting.
    async fn answer_unread(
        &self,
        client: &mut TcpStream,
        input: &mut Vec<u8>,
        head: &ForwardHead,
        body_len: u64,
        answer: Vec<u8>,
    ) -> io::Result<Next> {
        client.write_all(&answer).await?;
        Ok(skip_unread(input, head, body_len, Next::KeepAlive))
    }

    /// The request got no response head: log it as the hyper path does, record it, and
    /// answer with tokentap's own status.
    async fn fail_before_head(
        &self,
        client: &mut TcpStream,
        head: &ForwardHead,
        err: UpstreamError,
        pending: Pending,
        close: bool,
    ) -> io::Result<Next> {
        let outcome = err.outcome();
        if outcome == Outcome::ClientError {
            tracing::info!(
                method = %head.method,
                path = %head.uri.path(),
                error = %err,
                "client request refused before its response head"
            );
        } else {
            tracing::warn!(
                method = %head.method,
                path = %head.uri.path(),
                error = %err,
                "upstream failed before its response head"
            );
        }
        pending.fail(Instant::now(), err.status(), outcome);
        let closing = close || !head.keep_alive;
        if client
            .write_all(&answer(err.status(), &err.to_string(), closing))
            .await
            .is_err()
        {
            return Ok(Next::Close);
        }
        Ok(if closing {
            Next::Close
        } else {
            Next::KeepAlive
        })
    }
}

/// After an answer to a request that did not go upstream: drop the request (its head
/// and body at the start of `input`) and go on as `next` says if all of it has arrived,
/// as hyper's server drains what it can without waiting; else close.
fn skip_unread(input: &mut Vec<u8>, head: &ForwardHead, body_len: u64, next: Next) -> Next {
    if head.framing == RequestFraming::Chunked {
        // Where its body ends is not known without reading it.
        return Next::Close;
    }
    let end = u64::try_from(head.head_len)
        .ok()
        .and_then(|len| len.checked_add(body_len))
        .and_then(|end| usize::try_from(end).ok());
    match (end, next) {
        (Some(end), Next::KeepAlive) if end <= input.len() && head.keep_alive => {
            input.drain(..end);
            Next::KeepAlive
        }
        _ => Next::Close,
    }
}

/// Why no response head came: the upstream's fault, or the client's (its body stalled
/// or it left), after which the client connection cannot carry another request.
enum Failure {
    Upstream(UpstreamError),
    Client(UpstreamError),
}

/// Send the request whose head starts `input` upstream, its body as it arrives, feeding
/// the body to `scan`; leaves in `input` what the client sent after it. Returns the
/// upstream connection, which is to carry the response. `started` turns `true` once the
/// request has left `input` (before, a failure leaves `input` as it was).
#[allow(clippy::too_many_arguments)]
async fn send_request(
    client: &mut TcpStream,
    input: &mut Vec<u8>,
    head: &ForwardHead,
    body_len: u64,
    origin: &Origin,
    active: &ActiveConfig,
    scan: &mut observe::RequestScan,
    started: &mut bool,
) -> Result<TcpStream, Failure> {
    let upstream_config = &active.config.upstream;
    let connect = |origin: &Origin| {
        let origin = origin.clone();
        let timeout = upstream_config.connect_timeout;
        async move {
            upstream_pool::connect(&origin, timeout)
                .await
                .map_err(|err| Failure::Upstream(UpstreamError::Connect(err)))
        }
    };
    let available = input.len() - head.head_len;
    let initial = usize::try_from(body_len).map_or(available, |len| len.min(available));
    let body = &input[head.head_len..head.head_len + initial];
    let mut first = Vec::with_capacity(head.upstream_head.len() + body.len());
    first.extend_from_slice(&head.upstream_head);
    first.extend_from_slice(body);
    let mut upstream = match upstream_pool::checkout(origin) {
        Some(mut reused) => {
            if reused.write_all(&first).await.is_ok() {
                reused
            } else {
                // The upstream closed the kept connection just then: nothing of the request
                // reached it, so it goes once more on a fresh connection.
                let mut fresh = connect(origin).await?;
                fresh.write_all(&first).await.map_err(request_failed)?;
                fresh
            }
        }
        None => {
            let mut fresh = connect(origin).await?;
            fresh.write_all(&first).await.map_err(request_failed)?;
            fresh
        }
    };
    // Scanned once it is on its way, as the hyper path scans what the upstream reads.
    scan.feed(&input[head.head_len..head.head_len + initial]);
    input.drain(..head.head_len + initial);
    *started = true;
    let body_timeout = active.config.limits.request_body_timeout;
    if head.framing == RequestFraming::Chunked {
        let max_trailer_bytes = active.config.limits.max_header_bytes;
        send_chunked(
            client,
            &mut upstream,
            input,
            head,
            body_timeout,
            max_trailer_bytes,
            scan,
        )
        .await?;
        return Ok(upstream);
    }
    let mut remaining = body_len - initial as u64;
    while remaining > 0 {
        if input.is_empty() {
            read_body(client, input, body_timeout).await?;
        }
        let take = usize::try_from(remaining).map_or(input.len(), |r| r.min(input.len()));
        scan.feed(&input[..take]);
        upstream
            .write_all(&input[..take])
            .await
            .map_err(request_failed)?;
        input.drain(..take);
        remaining -= take as u64;
    }
    Ok(upstream)
}

/// Read more of a request body from the client within `body_timeout`.
async fn read_body(
    client: &mut TcpStream,
    input: &mut Vec<u8>,
    body_timeout: Duration,
) -> Result<(), Failure> {
    match tokio::time::timeout(body_timeout, read_more(client, input)).await {
        Err(_) => Err(Failure::Client(UpstreamError::BodyTimeout(body_timeout))),
        Ok(Ok(0)) | Ok(Err(_)) => Err(Failure::Client(UpstreamError::ClientGone)),
        Ok(Ok(_)) => Ok(()),
    }
}

/// Send a chunked request body (at the start of `input`) upstream as it arrives, in
/// chunks of the relay's own as hyper's client writes them: one per piece of data, and
/// the trailers the request declares in `Trailer` (hyper's client sends no others).
async fn send_chunked(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    input: &mut Vec<u8>,
    head: &ForwardHead,
    body_timeout: Duration,
    max_trailer_bytes: usize,
    scan: &mut observe::RequestScan,
) -> Result<(), Failure> {
    let mut reader = ChunkedReader::new(max_trailer_bytes);
    let mut ranges = Vec::new();
    let mut out = Vec::with_capacity(READ_CHUNK);
    loop {
        if input.is_empty() {
            read_body(client, input, body_timeout).await?;
        }
        ranges.clear();
        out.clear();
        let used = reader
            .feed(input, |range| ranges.push(range))
            .map_err(|err| Failure::Client(UpstreamError::MalformedBody(err.to_string())))?;
        for range in &ranges {
            scan.feed(&input[range.clone()]);
            chunk(&input[range.clone()], &mut out);
        }
        let done = reader.is_done();
        if done {
            last_chunk(
                &reader.take_trailer_section(),
                &declared(&head.headers),
                &mut out,
            );
        }
        input.drain(..used);
        if !out.is_empty() {
            upstream.write_all(&out).await.map_err(request_failed)?;
        }
        if done {
            return Ok(());
        }
    }
}

fn request_failed(err: io::Error) -> Failure {
    Failure::Upstream(UpstreamError::Request(err.to_string()))
}

/// Why an upstream response broke off.
#[derive(Debug, thiserror::Error)]
enum Broken {
    #[error(transparent)]
    Io(io::Error),
    #[error(transparent)]
    Response(ResponseError),
}

impl Broken {
    /// The hyper path's error for a response that broke before its head.
    fn before_head(self) -> UpstreamError {
        match self {
            Broken::Response(ResponseError::ClosedBeforeHead) => {
                UpstreamError::Request(CLOSED_BEFORE_HEAD.to_string())
            }
            Broken::Response(ResponseError::TransferCoding) => UpstreamError::Framing(
                UnsupportedTransferCoding("a coding other than chunked".to_string()),
            ),
            Broken::Response(err) => UpstreamError::Request(err.to_string()),
            Broken::Io(err) => UpstreamError::Request(err.to_string()),
        }
    }
}

/// Read what `stream` has into `input`: the count, `0` at its end.
async fn read_more(stream: &mut TcpStream, input: &mut Vec<u8>) -> io::Result<usize> {
    if input.capacity() - input.len() < READ_CHUNK / 2 {
        input.reserve(READ_CHUNK);
    }
    stream.read_buf(input).await
}

/// Read what the upstream sent into the worker's buffers, after the bytes `carry`ied
/// from the last read: the count (`0` at its end) and the buffers, `received` holding
/// `carry` and then what was read.
///
/// The buffers are taken only for the moment of a poll, so a stream that waits holds
/// none. The read goes through `poll_read`, which takes a short read as the sign that
/// the socket is drained (epoll is edge-triggered); `readable()` then `try_read` would
/// spend a failing `recv` per event to learn the same.
fn read_upstream<'a>(
    upstream: &'a mut TcpStream,
    carry: &'a [u8],
    hot_lines: crate::prefetch::Lines,
) -> impl Future<Output = (io::Result<usize>, scratch::Buffers)> + 'a {
    std::future::poll_fn(move |cx| {
        if let Err(err) = std::task::ready!(upstream.poll_read_ready(cx)) {
            return Poll::Ready((Err(err), scratch::take()));
        }
        // Data is there: the state that reads and observes it can be on its way while the
        // read runs.
        hot_lines.fetch();
        let mut buffers = scratch::take();
        buffers.received.extend_from_slice(carry);
        let polled = {
            let read = read_more(upstream, &mut buffers.received);
            std::pin::pin!(read).poll(cx)
        };
        match polled {
            Poll::Ready(read) => Poll::Ready((read, buffers)),
            Poll::Pending => {
                scratch::give_back(buffers);
                Poll::Pending
            }
        }
    })
}

/// The memory a read's bytes meet first: the response reader's state and the observer's.
fn hot_lines(
    reader: &ResponseReader,
    observer: &Option<ResponseObserver>,
) -> crate::prefetch::Lines {
    let mut lines = observer
        .as_ref()
        .map(ResponseObserver::hot_lines)
        .unwrap_or_default();
    lines.value(reader);
    lines
}

/// Resolves once the server starts to shut down.
async fn shutting_down(closing: &mut watch::Receiver<bool>) {
    if closing.wait_for(|closing| *closing).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The head the client gets, as hyper's server writes it: `connection: close` after the
/// end-to-end fields for a closing client, and `transfer-encoding: chunked` last where the
/// relay chunks a body the upstream delimits by closing (`add_chunked`).
fn client_head(head: &ResponseHead, close: bool, add_chunked: bool, out: &mut Vec<u8>) {
    let fields = &head.client_head[..head.client_head.len() - 2];
    out.extend_from_slice(&fields[..head.close_at]);
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(&fields[head.close_at..]);
    if add_chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Send what the socket takes of `data` now, without waiting: tokio's `try_write` with
/// the same syscall, minus its look at the socket's readiness first. That look reads
/// the client socket's readiness state, which nothing else touches between two events,
/// so it costs a cache miss per event. Sending on a socket tokio believes writable is
/// what `try_write` does anyway, and a `WouldBlock` here leaves tokio's readiness as it
/// was: the `write_all` that follows finds out and waits for the socket as usual.
fn send_now(client: &TcpStream, data: &[u8]) -> io::Result<usize> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const FLAGS: libc::c_int = 0;
    socket2::SockRef::from(client).send_with_flags(data, FLAGS)
}

/// Whether the body goes to the client in a chunked coding of the relay's own, as hyper's
/// server writes it: one chunk per piece of data and trailers as it passes them. A
/// chunked upstream body is re-chunked so that its trailers can be passed as hyper
/// passes them, and a body the upstream delimits by closing is chunked so that the client
/// connection stays open.
fn rechunked(framing: Option<BodyFraming>) -> bool {
    matches!(
        framing,
        Some(BodyFraming::Chunked | BodyFraming::UntilClose)
    )
}

/// Whether a request's `TE` asks for trailers.
fn te_trailers(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::TE)
        .iter()
        .any(|value| super::lists(value.as_bytes(), b"trailers"))
}

/// The trailer names a response head declares in `Trailer`, as hyper's server reads them.
fn declared(headers: &http::HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(http::header::TRAILER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// The end of a re-chunked body: the last chunk, with the trailers of `section` (a
/// trailer section as the upstream sent it) that hyper's server passes: those in
/// `declared` that may be trailers at all, each name's lines together, names in lower case.
fn last_chunk(section: &[u8], declared: &[HeaderName], out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n");
    if !declared.is_empty() {
        let mut trailers = http::HeaderMap::new();
        for line in section.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&line[..colon]),
                http::HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
            ) else {
                continue;
            };
            if declared.contains(&name) && may_be_a_trailer(&name) {
                trailers.append(name, value);
            }
        }
        for (name, value) in &trailers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// The fields hyper's server never sends as trailers (RFC 9110 6.5.1).
fn may_be_a_trailer(name: &HeaderName) -> bool {
    use http::header::*;
    ![
        AUTHORIZATION,
        CACHE_CONTROL,
        CONTENT_ENCODING,
        CONTENT_LENGTH,
        CONTENT_RANGE,
        CONTENT_TYPE,
        HOST,
        MAX_FORWARDS,
        SET_COOKIE,
        TRAILER,
        TRANSFER_ENCODING,
        TE,
    ]
    .contains(name)
}

/// `data` as one chunk of the chunked coding, its size in upper-case hex as hyper writes it.
fn chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    // Upper-case hex digits, most significant first, without the formatting machinery
    // (this runs once per relayed chunk).
    let len = data.len();
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4);
    for at in (0..digits).rev() {
        out.push(b"0123456789ABCDEF"[(len >> (at * 4)) & 0xf]);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// tokentap's own answer (`502`, `503`, `504`, a client's `4xx`), byte for byte what
/// hyper's server writes for [`error_response`]: its fields, `connection: close` for a
/// closing client, then the length hyper adds.
fn answer(status: StatusCode, message: &str, close: bool) -> Vec<u8> {
    let response = error_response::<Bytes>(status, message);
    let body = response.body();
    let mut out = Vec::with_capacity(128 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or_default().as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in response.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_s_size_is_upper_case_hex_as_hyper_writes_it() {
        for len in [
            1usize,
            9,
            10,
            15,
            16,
            255,
            256,
            4095,
            4096,
            8192,
            65_535,
            1 << 20,
            (1 << 20) + 0xABC,
        ] {
            let data = vec![b'x'; len];
            let mut out = Vec::new();
            chunk(&data, &mut out);
            let mut expected = format!("{len:X}\r\n").into_bytes();
            expected.extend_from_slice(&data);
            expected.extend_from_slice(b"\r\n");
            assert_eq!(out, expected, "{len}");
        }
        let mut out = Vec::new();
        chunk(b"", &mut out);
        assert!(
            out.is_empty(),
            "an empty piece is no chunk (it would end the body)"
        );
    }
}
