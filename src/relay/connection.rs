//! The relay of one plain HTTP/1.1 client connection: the I/O loop.
//!
//! Each request head is read with [`request_head`]; one the relay fully understands (no
//! body, a `Content-Length` body or a chunked one, to a plain-HTTP/1.1 upstream) is sent
//! upstream by [`request_relay`](super::request_relay) on a connection of this worker's [`upstream_pool`], and
//! the response is relayed as it arrives by feeding each read to a [`ResponseRelay`] (the
//! sans-IO machine that decides what the client gets) and writing what it says. The
//! connection is then kept for the client's next request. Anything else (`Expect`,
//! upgrades, HTTP/1.0, an HTTPS or h2c upstream, ...) ends the relay at that request
//! boundary: the connection goes to hyper with the bytes read so far, which serves it
//! exactly as if it had read every byte itself.
//!
//! What a request's life means (admission, answers, outcomes, the idle timeout) is the
//! [exchange policy](crate::exchange)'s, as on the hyper path. This loop only reads, feeds,
//! writes and runs the timers; and it watches the client while the upstream works
//! ([`client_watch`], from the connect on), so a client that leaves (closes or resets its
//! connection) frees the upstream at once.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use http::Method;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::client_watch::{self, Activity};
use super::request_head::{self, Decision, ForwardHead, HeadReader, HeadRules, RequestFraming};
use super::request_relay::send_request;
use super::response::{ResponseHead, ResponseRules};
use super::response_relay::{ResponseRelay, Step, Upstream, Watcher};
use super::scratch::{self, read_more, READ_CHUNK};
use super::serialize;
use super::upstream_pool::{self, Origin};
use crate::config::{Config, HostHeader};
use crate::exchange::{
    boundary, idle, shutting_down, Active, Admitted, Answer, BodyEnd, ClientFault, Exchange,
    ExchangeError, Gateway, Streaming, UpstreamIdle,
};
use crate::observe::RequestHead;

/// The upstream response head limits, the hyper path's too.
const RESPONSE_RULES: ResponseRules = ResponseRules {
    max_header_bytes: crate::intermediary::MAX_UPSTREAM_HEAD_BYTES,
    max_headers: crate::intermediary::MAX_UPSTREAM_HEAD_FIELDS,
};

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
        HeadConfig {
            max_header_bytes: config.limits.max_header_bytes,
            max_headers: config.limits.max_headers,
            upstream_host: crate::intermediary::host_value(&config.upstream.authority),
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

/// What the relay of one connection needs. `U` is the hyper transport's part of the
/// configuration in force, which the relay carries without using.
pub struct Relay<U> {
    gateway: Arc<Gateway<U>>,
    /// The configuration the head rules were made from, and the rules.
    active: Arc<Active<U>>,
    rules: HeadConfig,
    header_read_timeout: Duration,
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Read the client's next request.
    KeepAlive,
    /// Close the client connection.
    Close,
}

impl<U> Relay<U> {
    pub fn new(gateway: Arc<Gateway<U>>, header_read_timeout: Duration) -> Relay<U> {
        let active = gateway.active();
        let rules = HeadConfig::new(&active.config);
        Relay {
            gateway,
            active,
            rules,
            header_read_timeout,
        }
    }

    /// The configuration in force, with the head rules made from it.
    fn refresh(&mut self) {
        let active = self.gateway.active();
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
                    self.gateway.unreadable_head(status);
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
                    deadline =
                        idle::deadline(tokio::time::Instant::now(), self.header_read_timeout);
                }
            }
        }
    }

    /// Whether the relay forwards this request itself: every head the reader forwards,
    /// when the upstream is plain HTTP/1.1.
    fn relays(&self) -> bool {
        self.active.config.upstream.is_plain_http1()
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
        let request = RequestHead {
            method: &head.method,
            uri: &head.uri,
            headers: &head.headers,
        };
        let Admitted {
            active,
            mut scan,
            exchange,
        } = match self.gateway.begin(request, t_req) {
            Ok(admitted) => admitted,
            Err(answer) => {
                client
                    .write_all(&serialize::answer(&answer, client_closing))
                    .await?;
                return Ok(skip_unread(input, &head, body_len, Next::KeepAlive));
            }
        };
        let upstream_config = &active.config.upstream;
        let head_deadline = exchange.head_deadline();
        let origin = Origin::of(&upstream_config.authority);
        let mut started = false;
        // A panic up to the response head is answered `502` (exchange::boundary).
        let send = boundary::unwound(async {
            #[cfg(test)]
            crate::observe::inject::injected_panic(
                &head.headers,
                crate::observe::inject::Stage::Send,
            );
            send_request(
                client,
                input,
                &head,
                body_len,
                &origin,
                &active.config,
                &mut scan,
                &mut started,
            )
            .await
        });
        let sent = match tokio::time::timeout_at(head_deadline, send).await {
            Ok(Ok(sent)) => sent,
            Ok(Err(panicked)) => {
                // Where the request stood is unknown: the connection closes after.
                fail_before_head(client, exchange, &panicked, true).await;
                return Ok(Next::Close);
            }
            Err(_) => Err(exchange.head_timed_out()),
        };
        let upstream = match sent {
            Ok(upstream) => upstream,
            Err(err) => {
                // After the client's own fault (its body stalled or it left) the client
                // connection cannot carry another request.
                let close = client_closing || matches!(err, ExchangeError::Client(_));
                let next = fail_before_head(client, exchange, &err, close).await;
                // Once the request started on its way, the rest of its body is unread.
                return Ok(if started {
                    Next::Close
                } else {
                    skip_unread(input, &head, body_len, next)
                });
            }
        };
        let response = ResponseLoop {
            client,
            upstream,
            relay: ResponseRelay::new(
                head.method == Method::HEAD,
                RESPONSE_RULES,
                !client_closing,
                serialize::te_trailers(&head.headers),
            ),
            observed: Observed::new(exchange),
            idle: UpstreamIdle::new(upstream_config.idle_timeout),
            head_deadline,
        };
        // A panic once the head is in: the response breaks off, both connections close,
        // and the exchange, dropped as it unwinds, records it (exchange::boundary).
        let ended = boundary::unwound(response.run(closing))
            .await
            .unwrap_or_else(|_| ResponseEnd::closed());
        // The response's memory is not wanted until the next response lists its own.
        crate::prefetch::forget();
        if let UpstreamAfter::Reuse(upstream) = ended.upstream {
            upstream_pool::checkin(
                &origin,
                upstream,
                upstream_config.pool_idle_timeout,
                upstream_config.pool_max_idle_per_host,
            );
        }
        Ok(ended.next)
    }
}

/// The request got no response head: the exchange logs and records it; the client gets
/// its answer unless it is gone (or `close` after it).
async fn fail_before_head(
    client: &mut TcpStream,
    exchange: Exchange,
    err: &ExchangeError,
    close: bool,
) -> Next {
    let Some(answer) = exchange.failed(err) else {
        return Next::Close;
    };
    if client
        .write_all(&serialize::answer(&answer, close))
        .await
        .is_err()
        || close
    {
        return Next::Close;
    }
    Next::KeepAlive
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

/// The exchange's side of a relayed response: the exchange until the head, then the
/// streaming observer; told by the [`ResponseRelay`] what passes.
struct Observed {
    exchange: Option<Exchange>,
    streaming: Option<Streaming>,
    /// When the read being fed arrived (the head's instant).
    at: Instant,
}

impl Watcher for Observed {
    fn head(&mut self, head: &ResponseHead) {
        if let Some(exchange) = self.exchange.take() {
            self.streaming = Some(exchange.response_head(self.at, head.status, &head.headers));
        }
    }

    fn data(&mut self, bytes: &[u8]) {
        if let Some(streaming) = self.streaming.as_mut().filter(|s| s.observes()) {
            // One clock read per piece of data (a chunk, or what a read brought of a
            // length-delimited body), as the hyper path reads it once per body frame.
            streaming.data(Instant::now(), bytes);
        }
    }

    fn trailers(&mut self, section: &[u8]) {
        if let Some(streaming) = self.streaming.as_mut().filter(|s| s.observes()) {
            let trailers: http::HeaderMap = serialize::trailer_fields(section).collect();
            streaming.trailers(&trailers);
        }
    }
}

impl Observed {
    fn new(exchange: Exchange) -> Observed {
        Observed {
            exchange: Some(exchange),
            streaming: None,
            at: Instant::now(),
        }
    }

    /// The body, after its head, ended as `end` says.
    fn ended(&mut self, end: BodyEnd) {
        if let Some(streaming) = self.streaming.as_mut() {
            streaming.finish(Instant::now(), end);
        }
    }

    /// No head came: the exchange fails with the fault `fault` names, and says what to
    /// answer.
    fn failed(&mut self, fault: impl FnOnce(&Exchange) -> ExchangeError) -> Option<Answer> {
        let exchange = self.exchange.take()?;
        let fault = fault(&exchange);
        exchange.failed(&fault)
    }

    /// The client left, before the head or after it.
    fn client_left(&mut self) {
        if self.streaming.is_some() {
            self.ended(BodyEnd::ClientGone);
        } else {
            self.failed(|_| ClientFault::Gone.into());
        }
    }
}

/// What the upstream connection is good for after a response.
enum UpstreamAfter {
    /// Kept for the next request.
    Reuse(TcpStream),
    /// Closed (dropped), or never to carry another request.
    Closed,
}

/// How a relayed response ended.
struct ResponseEnd {
    next: Next,
    upstream: UpstreamAfter,
}

impl ResponseEnd {
    /// Both connections close: the exchange broke off.
    fn closed() -> ResponseEnd {
        ResponseEnd {
            next: Next::Close,
            upstream: UpstreamAfter::Closed,
        }
    }
}

/// What woke the response loop.
enum Wake {
    /// The upstream sent something, closed, or failed.
    Read(io::Result<usize>, scratch::Buffers),
    /// The client's connection ended (closed or reset) while its response was on the way.
    ClientLeft,
    /// The client sent more (a pipelined request): it is still there.
    ClientSent,
    /// The head deadline, or the idle deadline, or a timer armed for it earlier.
    Timer,
}

/// The lines the response loop lists of its own state for the next event, before the
/// reader's and the observer's.
pub(crate) const LOOP_LINES: usize = 6;

/// Reads after which the response loop looks at the client's watch even though nothing
/// woke it (a backstop: the armed watch wakes the loop by itself).
const CLIENT_LOOK_EVERY: u32 = 64;

/// What comes after one read is relayed.
enum After {
    /// Wait for the upstream again; it is idle from this deadline on.
    Wait(tokio::time::Instant),
    /// The response ended cleanly.
    Ended { reuse_upstream: bool },
    /// The exchange is over (broken off, or the client gone).
    Done(ResponseEnd),
}

/// The I/O of one response: read the upstream, feed the [`ResponseRelay`], write what it
/// says to the client, run the head and idle timers, and watch the client.
struct ResponseLoop<'a> {
    client: &'a mut TcpStream,
    upstream: TcpStream,
    relay: ResponseRelay,
    observed: Observed,
    idle: UpstreamIdle,
    head_deadline: tokio::time::Instant,
}

impl<'a> ResponseLoop<'a> {
    /// Not an `async fn`: that would keep `self` twice in the future (the argument, and
    /// the local it is moved into when first polled), about 1.4 KiB more per connection
    /// and a copy of it per response; the block keeps it once.
    #[allow(clippy::manual_async_fn)]
    fn run<'c>(
        mut self,
        closing: &'c watch::Receiver<bool>,
    ) -> impl Future<Output = ResponseEnd> + use<'a, 'c> {
        async move {
            // Bytes read but not yet consumed (the start of a head), and what the client did
            // not take at once: the stream's own, usually empty. Reads and writes otherwise go
            // through the worker's buffers (`scratch`).
            let mut carry: Vec<u8> = Vec::new();
            let mut unsent: Vec<u8> = Vec::new();
            let mut watch_client = true;
            // One timer for the whole response: the head deadline until the head is in, then
            // the idle deadline. It is re-armed only when it fires early (the upstream was not
            // idle that long), not on every read: arming a timer per read costs more than the
            // rest of a read's bookkeeping.
            let timer = tokio::time::sleep_until(self.head_deadline);
            tokio::pin!(timer);
            // The client's watch waits in its socket's reader slot ([`client_watch`]): once
            // armed it stays armed, and the socket's news wakes this task. Looking at it again
            // on every event would touch the client socket's state, a cold cache line with
            // many streams, for nothing. So it is looked at when it is not armed yet, when
            // the task woke and the upstream had nothing (the client, or the timer, woke it),
            // and every `CLIENT_LOOK_EVERY` reads besides, should a wake ever go astray.
            let mut client_armed = false;
            let mut reads_since_look = 0u32;
            // What the polls that bring the next events touch (`prefetch`): listed anew
            // when the observation starts and now and then, as the rest stays where it is.
            let mut refresh = crate::prefetch::Refresh::default();
            loop {
                let wake = {
                    if refresh.due(self.observed.streaming.is_some()) {
                        // The loop's own state on the way to the read, then what reads
                        // and observes the event.
                        crate::prefetch::for_next_poll(|lines| {
                            let own: [*const u8; LOOP_LINES] = [
                                std::ptr::from_ref(&reads_since_look).cast(),
                                std::ptr::from_ref(&carry).cast(),
                                std::ptr::from_ref(&*timer).cast(),
                                std::ptr::from_ref(&self.upstream).cast(),
                                std::ptr::from_ref(&*self.client).cast(),
                                std::ptr::from_ref(closing).cast(),
                            ];
                            for address in own {
                                lines.address(address);
                            }
                            hot_lines(&self.relay, &self.observed, lines);
                        });
                    }
                    let mut read = std::pin::pin!(read_upstream(&mut self.upstream, &carry));
                    let client = &*self.client;
                    let mut woken = false;
                    let look_anyway = reads_since_look >= CLIENT_LOOK_EVERY;
                    std::future::poll_fn(|cx| {
                        if let Poll::Ready((read, buffers)) = read.as_mut().poll(cx) {
                            return Poll::Ready(Wake::Read(read, buffers));
                        }
                        if watch_client && (!client_armed || woken || look_anyway) {
                            reads_since_look = 0;
                            match client_watch::poll_activity(client, cx) {
                                Poll::Ready(Activity::Left) => {
                                    return Poll::Ready(Wake::ClientLeft)
                                }
                                Poll::Ready(Activity::Sent) => {
                                    return Poll::Ready(Wake::ClientSent)
                                }
                                Poll::Pending => client_armed = true,
                            }
                        }
                        woken = true;
                        if timer.as_mut().poll(cx).is_ready() {
                            return Poll::Ready(Wake::Timer);
                        }
                        Poll::Pending
                    })
                    .await
                };
                reads_since_look = reads_since_look.saturating_add(1);
                match wake {
                    Wake::Read(read, buffers) => {
                        let had_head = self.relay.has_head();
                        let fed = self.relay_read(read, buffers, closing, &mut carry, &mut unsent);
                        match fed.await {
                            After::Wait(deadline) if !had_head && self.relay.has_head() => {
                                timer.as_mut().reset(deadline);
                            }
                            After::Wait(_) => {}
                            After::Ended { reuse_upstream } => return self.ended(reuse_upstream),
                            After::Done(end) => return end,
                        }
                    }
                    Wake::ClientSent => watch_client = false,
                    Wake::ClientLeft => {
                        self.observed.client_left();
                        return ResponseEnd::closed();
                    }
                    Wake::Timer => match self.timer_fired() {
                        Ok(deadline) => timer.as_mut().reset(deadline),
                        Err(answer) => return self.answer(answer).await,
                    },
                }
            }
        }
    }

    /// Feed what one read brought to the machine and write to the client what it says;
    /// keeps in `carry` what the machine left for the next read.
    async fn relay_read(
        &mut self,
        read: io::Result<usize>,
        mut buffers: scratch::Buffers,
        closing: &watch::Receiver<bool>,
        carry: &mut Vec<u8>,
        unsent: &mut Vec<u8>,
    ) -> After {
        carry.clear();
        let at = Instant::now();
        self.observed.at = at;
        self.idle.data();
        let read = match read {
            Ok(0) => Upstream::Closed,
            Ok(_) => Upstream::Sent,
            Err(err) => Upstream::Failed(err),
        };
        let shutting_down = !self.relay.has_head() && *closing.borrow();
        let scratch::Buffers {
            received,
            pieces,
            out,
        } = &mut buffers;
        let step = self.relay.feed(
            read,
            received,
            shutting_down,
            pieces,
            out,
            &mut self.observed,
        );
        if let Step::NoHead(fault) = step {
            scratch::give_back(buffers);
            let answer = self.observed.failed(|_| fault.into());
            return After::Done(self.answer(answer).await);
        }
        if let Step::Ended { .. } = step {
            // Recorded as the end is handed to the client's connection, as the hyper path
            // records it when it hands hyper the last frame: a scrape that follows the
            // client's read of the end sees the request.
            self.observed.ended(BodyEnd::Clean);
        }
        let sent_at_once = send_now_or_keep(self.client, out, unsent);
        if let Step::More { used } = step {
            carry.extend_from_slice(received.get(used..).unwrap_or_default());
        }
        scratch::give_back(buffers);
        let client_took_it = match sent_at_once {
            Err(()) => false,
            Ok(()) if unsent.is_empty() => true,
            Ok(()) => self.client.write_all(unsent).await.is_ok(),
        };
        if !client_took_it {
            self.observed.client_left();
            return After::Done(ResponseEnd::closed());
        }
        // The idle clock starts now that the loop waits for the upstream again: the read's
        // instant, unless writing to the client took a while.
        let waiting_from = if unsent.is_empty() {
            at
        } else {
            Instant::now()
        };
        unsent.clear();
        match step {
            Step::More { .. } | Step::NoHead(_) => After::Wait(
                self.idle
                    .waiting(tokio::time::Instant::from_std(waiting_from)),
            ),
            Step::Broken(why) => {
                self.observed.ended(BodyEnd::upstream_broken(&why));
                After::Done(ResponseEnd::closed())
            }
            Step::Ended { reuse_upstream } => After::Ended { reuse_upstream },
        }
    }

    /// The timer fired: the deadline to wait for next, or, when the upstream missed its
    /// deadline, what the exchange answers (the response has ended).
    fn timer_fired(&mut self) -> Result<tokio::time::Instant, Option<Answer>> {
        if !self.relay.has_head() {
            return Err(self.observed.failed(Exchange::head_timed_out));
        }
        let now = tokio::time::Instant::now();
        if !self.idle.expired(now) {
            return Ok(self.idle.waiting(now));
        }
        let timeout = self.idle.timeout();
        self.observed.ended(BodyEnd::upstream_idle(timeout));
        Err(None)
    }

    /// The response ended cleanly.
    fn ended(self, reuse_upstream: bool) -> ResponseEnd {
        ResponseEnd {
            next: if self.relay.keeps_client() {
                Next::KeepAlive
            } else {
                Next::Close
            },
            upstream: if reuse_upstream {
                UpstreamAfter::Reuse(self.upstream)
            } else {
                UpstreamAfter::Closed
            },
        }
    }

    /// No response head came: send tokentap's answer, if there is one (the upstream
    /// connection is closed either way).
    async fn answer(&mut self, answer: Option<Answer>) -> ResponseEnd {
        let Some(answer) = answer else {
            return ResponseEnd::closed();
        };
        let keep = self.relay.keeps_client();
        let written = self
            .client
            .write_all(&serialize::answer(&answer, !keep))
            .await
            .is_ok();
        ResponseEnd {
            next: if written && keep {
                Next::KeepAlive
            } else {
                Next::Close
            },
            upstream: UpstreamAfter::Closed,
        }
    }
}

/// Send what the client socket takes of `out` now, keeping the rest in `unsent` to be
/// written when the socket takes it: most writes go whole at once. `Err` when the client
/// is gone.
fn send_now_or_keep(client: &TcpStream, out: &[u8], unsent: &mut Vec<u8>) -> Result<(), ()> {
    if out.is_empty() {
        return Ok(());
    }
    let written = match send_now(client, out) {
        Ok(written) => written,
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => 0,
        Err(_) => return Err(()),
    };
    unsent.extend_from_slice(out.get(written..).unwrap_or_default());
    Ok(())
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
) -> impl Future<Output = (io::Result<usize>, scratch::Buffers)> + 'a {
    std::future::poll_fn(move |cx| {
        if let Err(err) = std::task::ready!(upstream.poll_read_ready(cx)) {
            return Poll::Ready((Err(err), scratch::take()));
        }
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

/// The memory a read's bytes meet: the response reader's state first, then the
/// observer's.
fn hot_lines(relay: &ResponseRelay, observed: &Observed, lines: &mut crate::prefetch::Lines) {
    lines.value(relay.reader());
    if let Some(streaming) = observed.streaming.as_ref() {
        streaming.hot_lines(lines);
    }
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
