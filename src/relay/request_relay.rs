//! The request side of one relayed exchange: the head and body on their way upstream.
//!
//! The head goes on a kept connection of this worker's [`upstream_pool`] (once more on a
//! fresh one if the upstream had just closed it) or a new one; the body follows as it
//! arrives, `Content-Length` bytes as they came, a chunked body re-chunked as hyper's
//! client writes it. Every body byte is fed to the request's scan once it is on its way.

use std::io;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::chunked::ChunkedReader;
use super::client_watch::{self, Activity};
use super::request_head::{ForwardHead, RequestFraming};
use super::scratch::{read_more, READ_CHUNK};
use super::serialize::{chunk, declared, last_chunk};
use super::upstream_pool::{self, Origin};
use crate::config::Config;
use crate::exchange::{ClientFault, ExchangeError, UpstreamFault};
use crate::idle_pool::{self, Unsent};
use crate::observe::RequestScan;

/// Send the request whose head starts `input` upstream, its body as it arrives, feeding
/// the body to `scan`; leaves in `input` what the client sent after it. Returns the
/// upstream connection, which is to carry the response. `started` turns `true` once the
/// request has left `input` (before, a failure leaves `input` as it was).
#[allow(clippy::too_many_arguments)]
pub async fn send_request(
    client: &mut TcpStream,
    input: &mut Vec<u8>,
    head: &ForwardHead,
    body_len: u64,
    origin: &Origin,
    config: &Config,
    scan: &mut RequestScan,
    started: &mut bool,
) -> Result<TcpStream, ExchangeError> {
    let timeout = config.upstream.connect_timeout;
    let after_head = input.get(head.head_len..).unwrap_or_default();
    let initial =
        usize::try_from(body_len).map_or(after_head.len(), |len| len.min(after_head.len()));
    let body = after_head.get(..initial).unwrap_or_default();
    let mut first = Vec::with_capacity(head.upstream_head.len().saturating_add(body.len()));
    first.extend_from_slice(&head.upstream_head);
    first.extend_from_slice(body);
    // A kept connection the upstream closed just then has taken nothing of the request: it
    // goes once more on a fresh one.
    let (mut upstream, ()) = idle_pool::send_on_kept_or_new(
        upstream_pool::checkout(origin),
        first.as_slice(),
        || connect(client, origin, timeout),
        |mut upstream: TcpStream, first: &[u8]| async move {
            let sent = upstream.write_all(first).await.map_err(|err| Unsent {
                message: Some(first),
                error: request_failed(err),
            });
            (upstream, sent)
        },
    )
    .await?;
    // Scanned once it is on its way, as the hyper path scans what the upstream reads.
    let sent = head.head_len.saturating_add(initial).min(input.len());
    scan.feed(input.get(head.head_len..sent).unwrap_or_default());
    input.drain(..sent);
    *started = true;
    let body_timeout = config.limits.request_body_timeout;
    if head.framing == RequestFraming::Chunked {
        let max_trailer_bytes = config.limits.max_header_bytes;
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
    let mut remaining = body_len.saturating_sub(initial as u64);
    while remaining > 0 {
        if input.is_empty() {
            read_body(client, input, body_timeout).await?;
        }
        let take = usize::try_from(remaining).map_or(input.len(), |r| r.min(input.len()));
        let body = input.get(..take).unwrap_or_default();
        scan.feed(body);
        upstream.write_all(body).await.map_err(request_failed)?;
        input.drain(..take);
        remaining = remaining.saturating_sub(take as u64);
    }
    Ok(upstream)
}

/// Connect to `origin` while watching `client`: a client that leaves while the connect
/// hangs is gone (`cancelled`, as hyper's server drops its request), not the `502` of
/// the connect failing later. A client that sends more meanwhile (the rest of its body)
/// is there: the connect goes on unwatched, and the body's reads after it notice a
/// departure.
async fn connect(
    client: &TcpStream,
    origin: &Origin,
    timeout: Duration,
) -> Result<TcpStream, ExchangeError> {
    let connect = upstream_pool::connect(origin, timeout);
    tokio::pin!(connect);
    let activity = tokio::select! {
        biased;
        connected = &mut connect => return connected.map_err(connect_failed),
        activity = client_watch::activity(client) => activity,
    };
    if activity == Activity::Left {
        return Err(ClientFault::Gone.into());
    }
    connect.await.map_err(connect_failed)
}

fn connect_failed(err: String) -> ExchangeError {
    UpstreamFault::Connect(err).into()
}

/// Read more of a request body from the client within `body_timeout`.
async fn read_body(
    client: &mut TcpStream,
    input: &mut Vec<u8>,
    body_timeout: Duration,
) -> Result<(), ExchangeError> {
    match tokio::time::timeout(body_timeout, read_more(client, input)).await {
        Err(_) => Err(ClientFault::BodyTimeout(body_timeout).into()),
        Ok(Ok(0)) | Ok(Err(_)) => Err(ClientFault::Gone.into()),
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
    scan: &mut RequestScan,
) -> Result<(), ExchangeError> {
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
            .map_err(|err| ExchangeError::from(ClientFault::MalformedBody(err.to_string())))?;
        for range in &ranges {
            let data = input.get(range.clone()).unwrap_or_default();
            scan.feed(data);
            chunk(data, &mut out);
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

fn request_failed(err: io::Error) -> ExchangeError {
    UpstreamFault::Request(err.to_string()).into()
}
