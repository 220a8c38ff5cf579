//! The keep-alive pools of idle upstream connections, one per worker thread, for both
//! transports that speak plain HTTP/1.1 to the upstream: the relay's raw sockets
//! ([`relay::upstream_pool`](crate::relay::upstream_pool)) and hyper's client connections
//! ([`proxy::h1_upstream`](crate::proxy::h1_upstream)). What a connection is differs;
//! what is kept, how long, how many and which goes out first is decided here, once:
//!
//! - the most recently used connection is reused first (its socket is the warmest);
//! - one idle for `upstream.pool_idle_timeout` is closed, and so is one that can no
//!   longer carry a request ([`Reusable`]: the upstream closed it, or sent bytes that
//!   answer no request). An idle connection is not polled while it waits: it is checked
//!   at checkout, and by a sweep that runs while the thread keeps any (when one expires,
//!   and every second for closes nobody asked about);
//! - `upstream.pool_max_idle_per_host` bounds the idle connections to one upstream in the
//!   whole process, both transports together. Each server worker keeps its part of it
//!   ([`thread_cap`], by the [`worker_slot`](crate::worker_slot) it is), so checkin and
//!   checkout take no lock and touch no shared counter.
//!
//! Per thread because a server worker (`server::workers`) is one thread running a
//! current-thread runtime, and serves a client connection for its whole life: a pooled
//! connection is reused by the thread whose reactor its socket is registered with (so no
//! other thread is woken for an event), and that thread sweeps it. The pools are keyed by
//! origin and outlive a reload: a new upstream client reuses the connections of the one
//! it replaced, and connections to an upstream no longer in use close as they expire.
//!
//! [`IdleConnections`] and [`KeptCount`] are the policy with no I/O and no clock reads
//! (instants are passed in); [`checkout`] and [`checkin`] apply it to the calling
//! thread's [`ThreadPool`] and run its sweep. [`connect`] opens the connections both
//! transports pool, and [`send_on_kept_or_new`] is their one rule for a kept connection
//! the upstream closed just as a request went out on it.

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::runtime::{Handle, RuntimeFlavor};

use crate::worker_slot::{this_worker, WorkerSlot};

/// Where connections go: the upstream's host (as its URL writes it, IPv6 in brackets)
/// and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub host: String,
    pub port: u16,
}

impl Origin {
    /// A plain-HTTP upstream's origin: its host and port (80 when none is written).
    pub fn of(authority: &http::uri::Authority) -> Origin {
        Origin {
            host: authority.host().to_string(),
            port: authority.port_u16().unwrap_or(80),
        }
    }
}

/// A pooled connection type: it can tell, without waiting, whether it can carry another
/// request.
pub trait Reusable {
    /// `false` once the upstream has closed it, it failed, or something arrived on it
    /// that answers no request.
    fn reusable(&mut self) -> bool;
}

/// How often a sweep checks kept connections for a close by the upstream. (Expiry is
/// swept when it falls due.)
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// This thread's part of `max_idle` idle connections per upstream for the whole process:
/// `max_idle` split evenly over the server's workers, the first `max_idle % count` of
/// them keeping one more (so the parts add up to `max_idle`, and a worker keeps none
/// when `max_idle` is below the number of workers and its index is past it). A thread
/// that is no worker keeps all of it.
pub fn thread_cap(max_idle: usize, worker: Option<WorkerSlot>) -> usize {
    match worker {
        None => max_idle,
        Some(WorkerSlot { index, count }) => {
            max_idle / count + usize::from(index < max_idle % count)
        }
    }
}

/// Idle connections one thread keeps, per origin, of every connection type: what the
/// cap counts, so that both transports' pools on a thread share its part of the cap.
#[derive(Debug, Default)]
pub struct KeptCount {
    /// Origins with at least one idle connection.
    counts: Vec<(Origin, usize)>,
}

impl KeptCount {
    pub const fn new() -> KeptCount {
        KeptCount { counts: Vec::new() }
    }

    /// Idle connections kept to `origin`.
    pub fn of(&self, origin: &Origin) -> usize {
        self.counts
            .iter()
            .find(|(kept, _)| kept == origin)
            .map_or(0, |(_, count)| *count)
    }

    fn add(&mut self, origin: &Origin) {
        match self.counts.iter_mut().find(|(kept, _)| kept == origin) {
            Some((_, count)) => *count += 1,
            None => self.counts.push((origin.clone(), 1)),
        }
    }

    fn remove(&mut self, origin: &Origin, closed: usize) {
        if closed == 0 {
            return;
        }
        if let Some(at) = self.counts.iter().position(|(kept, _)| kept == origin) {
            let count = &mut self.counts[at].1;
            *count = count.saturating_sub(closed);
            if *count == 0 {
                self.counts.swap_remove(at);
            }
        }
    }
}

/// One thread's idle connections of one type, by origin, and the policy that keeps them:
/// order, expiry, the reusable check and the cap. No I/O of its own and no clock reads.
/// A connection it lets go is dropped, which closes it.
pub struct IdleConnections<C> {
    /// Origins with at least one idle connection (in practice one: the upstream).
    origins: Vec<OriginIdle<C>>,
}

struct OriginIdle<C> {
    origin: Origin,
    /// Oldest first.
    idle: Vec<Idle<C>>,
}

struct Idle<C> {
    conn: C,
    /// When it has been idle for the pool idle timeout; `None`: a timeout too long to
    /// fall due.
    expires: Option<Instant>,
}

impl<C> Idle<C> {
    fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|expires| now >= expires)
    }
}

impl<C: Reusable> IdleConnections<C> {
    pub const fn new() -> IdleConnections<C> {
        IdleConnections {
            origins: Vec::new(),
        }
    }

    /// The most recently kept connection to `origin` that has not expired at `now` and
    /// is reusable. Those found expired or not reusable on the way are closed.
    pub fn checkout(&mut self, kept: &mut KeptCount, origin: &Origin, now: Instant) -> Option<C> {
        let at = self
            .origins
            .iter()
            .position(|list| list.origin == *origin)?;
        let list = &mut self.origins[at];
        let before = list.idle.len();
        let mut found = None;
        while let Some(mut entry) = list.idle.pop() {
            if !entry.expired(now) && entry.conn.reusable() {
                found = Some(entry.conn);
                break;
            }
        }
        kept.remove(origin, before - list.idle.len());
        if list.idle.is_empty() {
            self.origins.swap_remove(at);
        }
        found
    }

    /// Keep `conn`, idle from `now`, for `idle_timeout` for the next request to `origin`,
    /// unless `cap` idle connections to it are kept on this thread already (as `kept`
    /// counts them, all types together) or `idle_timeout` is zero. Returns whether it
    /// was kept; one that was not is closed.
    pub fn checkin(
        &mut self,
        kept: &mut KeptCount,
        origin: &Origin,
        conn: C,
        now: Instant,
        idle_timeout: Duration,
        cap: usize,
    ) -> bool {
        if idle_timeout.is_zero() || kept.of(origin) >= cap {
            return false;
        }
        let entry = Idle {
            conn,
            expires: now.checked_add(idle_timeout),
        };
        match self.origins.iter_mut().find(|list| list.origin == *origin) {
            Some(list) => list.idle.push(entry),
            None => self.origins.push(OriginIdle {
                origin: origin.clone(),
                idle: vec![entry],
            }),
        }
        kept.add(origin);
        true
    }

    /// Close the connections that have expired at `now` or are no longer reusable.
    pub fn sweep(&mut self, kept: &mut KeptCount, now: Instant) {
        for list in &mut self.origins {
            let before = list.idle.len();
            list.idle
                .retain_mut(|entry| !entry.expired(now) && entry.conn.reusable());
            kept.remove(&list.origin, before - list.idle.len());
        }
        self.origins.retain(|list| !list.idle.is_empty());
    }

    /// When the next sweep is due, seen at `now`: when the first kept connection
    /// expires, or a second on if sooner (to look for closes); `None` when none is kept.
    pub fn next_sweep(&self, now: Instant) -> Option<Instant> {
        let regular = now + SWEEP_EVERY;
        self.origins
            .iter()
            .flat_map(|list| &list.idle)
            .map(|entry| {
                entry
                    .expires
                    .map_or(regular, |expires| expires.min(regular))
            })
            .min()
    }

    /// Idle connections kept to `origin`.
    pub fn len(&self, origin: &Origin) -> usize {
        self.origins
            .iter()
            .find(|list| list.origin == *origin)
            .map_or(0, |list| list.idle.len())
    }

    /// Whether no connection is kept.
    pub fn is_empty(&self) -> bool {
        self.origins.is_empty()
    }
}

impl<C: Reusable> Default for IdleConnections<C> {
    fn default() -> Self {
        IdleConnections::new()
    }
}

/// One thread's pool of one connection type: a transport declares it in a
/// `thread_local!` and hands that to [`checkout`] and [`checkin`].
pub struct ThreadPool<C> {
    idle: RefCell<IdleConnections<C>>,
    /// Whether the sweep of this pool is running on this thread.
    sweeping: Cell<bool>,
}

impl<C: Reusable> ThreadPool<C> {
    pub const fn new() -> ThreadPool<C> {
        ThreadPool {
            idle: RefCell::new(IdleConnections::new()),
            sweeping: Cell::new(false),
        }
    }
}

impl<C: Reusable> Default for ThreadPool<C> {
    fn default() -> Self {
        ThreadPool::new()
    }
}

thread_local! {
    /// This thread's idle connections per origin, of every type.
    static KEPT: RefCell<KeptCount> = const { RefCell::new(KeptCount::new()) };
}

/// The most recently used live connection to `origin` in this thread's `pool`, if any.
pub fn checkout<C: Reusable>(pool: &'static LocalKey<ThreadPool<C>>, origin: &Origin) -> Option<C> {
    let now = Instant::now();
    pool.with(|pool| {
        KEPT.with(|kept| {
            pool.idle
                .borrow_mut()
                .checkout(&mut kept.borrow_mut(), origin, now)
        })
    })
}

/// Keep `conn`, whose last exchange ended cleanly, in this thread's `pool` for
/// `idle_timeout`, for the next request to `origin`, unless the thread already keeps its
/// part ([`thread_cap`]) of `max_idle` (`upstream.pool_max_idle_per_host`, for the whole
/// process). Call it on the runtime the connection's socket is registered with: kept
/// only on a current-thread runtime (a server worker's), where the sweep runs on this
/// thread; elsewhere the connection is closed.
pub fn checkin<C: Reusable + 'static>(
    pool: &'static LocalKey<ThreadPool<C>>,
    origin: &Origin,
    conn: C,
    idle_timeout: Duration,
    max_idle: usize,
) {
    let Ok(runtime) = Handle::try_current() else {
        return;
    };
    if runtime.runtime_flavor() != RuntimeFlavor::CurrentThread {
        return;
    }
    let cap = thread_cap(max_idle, this_worker());
    let now = Instant::now();
    let start_sweep = pool.with(|pool| {
        let kept = KEPT.with(|kept| {
            pool.idle.borrow_mut().checkin(
                &mut kept.borrow_mut(),
                origin,
                conn,
                now,
                idle_timeout,
                cap,
            )
        });
        kept && !pool.sweeping.replace(true)
    });
    if start_sweep {
        runtime.spawn(sweep(pool));
    }
}

/// Close this thread's idle connections in `pool` as they expire or stop being
/// reusable; ends when none is left (the next checkin starts it again).
async fn sweep<C: Reusable + 'static>(pool: &'static LocalKey<ThreadPool<C>>) {
    loop {
        let due = pool.with(|pool| pool.idle.borrow().next_sweep(Instant::now()));
        let Some(due) = due else {
            pool.with(|pool| pool.sweeping.set(false));
            return;
        };
        tokio::time::sleep_until(due.into()).await;
        let now = Instant::now();
        pool.with(|pool| {
            KEPT.with(|kept| pool.idle.borrow_mut().sweep(&mut kept.borrow_mut(), now));
        });
    }
}

/// Open a connection to `origin` within `timeout`. The error says why, in the words of
/// both transports' `502` answers.
pub async fn connect(origin: &Origin, timeout: Duration) -> Result<TcpStream, String> {
    let host = origin.host.trim_matches(['[', ']']);
    match tokio::time::timeout(timeout, TcpStream::connect((host, origin.port))).await {
        Ok(Ok(stream)) => {
            // Events are small writes that must leave at once.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("timed out after {timeout:?}")),
    }
}

/// A send that failed: why, and the message when none of it left (so it can go once more,
/// on another connection).
pub struct Unsent<M, E> {
    pub message: Option<M>,
    pub error: E,
}

/// Send `message` on `kept` (a connection from the pool) or, with none, on a new one from
/// `connect`. When a kept connection fails the send before any of the message left it, the
/// upstream closed that connection just then, so the message goes once more, on a new
/// connection; any other failure is the send's. Both transports' rule (the relay's raw
/// sockets, hyper's client connections). `send` takes the connection and gives it back
/// (no borrow lives across its future, which keeps the callers' futures `Send`). Returns
/// the connection that carried the message and what the send gave.
pub async fn send_on_kept_or_new<C, M, T, E, Connect, Connecting, Deliver, Delivering>(
    kept: Option<C>,
    message: M,
    mut connect: Connect,
    mut send: Deliver,
) -> Result<(C, T), E>
where
    E: std::fmt::Display,
    Connect: FnMut() -> Connecting,
    Connecting: std::future::Future<Output = Result<C, E>>,
    Deliver: FnMut(C, M) -> Delivering,
    Delivering: std::future::Future<Output = (C, Result<T, Unsent<M, E>>)>,
{
    let (conn, reused) = match kept {
        Some(conn) => (conn, true),
        None => (connect().await?, false),
    };
    match send(conn, message).await {
        (conn, Ok(sent)) => Ok((conn, sent)),
        (
            _closed,
            Err(Unsent {
                message: Some(message),
                error,
            }),
        ) if reused => {
            tracing::debug!(%error, "pooled connection was closed; retrying");
            let fresh = connect().await?;
            match send(fresh, message).await {
                (fresh, Ok(sent)) => Ok((fresh, sent)),
                (_, Err(unsent)) => Err(unsent.error),
            }
        }
        (_, Err(unsent)) => Err(unsent.error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection with a name, that stops being reusable when told to.
    #[derive(Debug, PartialEq)]
    struct Fake {
        name: &'static str,
        reusable: bool,
    }

    impl Reusable for Fake {
        fn reusable(&mut self) -> bool {
            self.reusable
        }
    }

    fn fake(name: &'static str) -> Fake {
        Fake {
            name,
            reusable: true,
        }
    }

    /// Another connection type, to show that both types count against one cap.
    struct Other;

    impl Reusable for Other {
        fn reusable(&mut self) -> bool {
            true
        }
    }

    fn origin(port: u16) -> Origin {
        Origin {
            host: "127.0.0.1".to_string(),
            port,
        }
    }

    const MINUTE: Duration = Duration::from_secs(60);

    fn names(
        pool: &mut IdleConnections<Fake>,
        kept: &mut KeptCount,
        origin: &Origin,
        now: Instant,
    ) -> Vec<&'static str> {
        std::iter::from_fn(|| pool.checkout(kept, origin, now).map(|conn| conn.name)).collect()
    }

    #[test]
    fn the_most_recently_kept_connection_goes_out_first() {
        let (mut pool, mut kept, a) = (IdleConnections::new(), KeptCount::new(), origin(1));
        let t0 = Instant::now();
        for (i, name) in ["first", "second", "third"].into_iter().enumerate() {
            let at = t0 + Duration::from_secs(i as u64);
            assert!(pool.checkin(&mut kept, &a, fake(name), at, MINUTE, 10));
        }
        let now = t0 + Duration::from_secs(5);
        assert_eq!(
            names(&mut pool, &mut kept, &a, now),
            ["third", "second", "first"]
        );
        assert_eq!(kept.of(&a), 0);
    }

    #[test]
    fn connections_are_kept_per_origin() {
        let (mut pool, mut kept) = (IdleConnections::new(), KeptCount::new());
        let (a, b) = (origin(1), origin(2));
        let now = Instant::now();
        assert!(pool.checkin(&mut kept, &a, fake("to a"), now, MINUTE, 1));
        assert!(pool.checkin(&mut kept, &b, fake("to b"), now, MINUTE, 1));
        assert_eq!(names(&mut pool, &mut kept, &b, now), ["to b"]);
        assert_eq!(names(&mut pool, &mut kept, &a, now), ["to a"]);
    }

    #[test]
    fn a_connection_expires_after_the_idle_timeout() {
        let (mut pool, mut kept, a) = (IdleConnections::new(), KeptCount::new(), origin(1));
        let t0 = Instant::now();
        let timeout = Duration::from_secs(90);
        assert!(pool.checkin(&mut kept, &a, fake("c"), t0, timeout, 10));
        let just_before = t0 + timeout - Duration::from_millis(1);
        assert_eq!(names(&mut pool, &mut kept, &a, just_before), ["c"]);

        assert!(pool.checkin(&mut kept, &a, fake("old"), t0, timeout, 10));
        assert!(pool.checkin(&mut kept, &a, fake("new"), t0 + timeout / 2, timeout, 10));
        // "old" expires at t0 + 90 s and is closed when reached; "new" lives to t0 + 135 s.
        assert_eq!(names(&mut pool, &mut kept, &a, t0 + timeout), ["new"]);
        assert_eq!(kept.of(&a), 0);
        assert_eq!(pool.len(&a), 0);
    }

    #[test]
    fn a_zero_idle_timeout_keeps_nothing() {
        let (mut pool, mut kept, a) = (IdleConnections::new(), KeptCount::new(), origin(1));
        assert!(!pool.checkin(&mut kept, &a, fake("c"), Instant::now(), Duration::ZERO, 10));
        assert!(pool.is_empty());
        assert_eq!(kept.of(&a), 0);
    }

    #[test]
    fn a_timeout_too_long_for_the_clock_never_expires() {
        let (mut pool, mut kept, a) = (IdleConnections::new(), KeptCount::new(), origin(1));
        let now = Instant::now();
        assert!(pool.checkin(&mut kept, &a, fake("c"), now, Duration::MAX, 10));
        assert_eq!(pool.next_sweep(now), Some(now + SWEEP_EVERY));
        assert_eq!(names(&mut pool, &mut kept, &a, now + MINUTE), ["c"]);
    }

    #[test]
    fn a_connection_that_is_not_reusable_is_skipped_and_closed() {
        let (mut pool, mut kept, a) = (IdleConnections::new(), KeptCount::new(), origin(1));
        let now = Instant::now();
        assert!(pool.checkin(&mut kept, &a, fake("live"), now, MINUTE, 10));
        let closed = Fake {
            name: "closed",
            reusable: false,
        };
        assert!(pool.checkin(&mut kept, &a, closed, now, MINUTE, 10));
        assert_eq!(names(&mut pool, &mut kept, &a, now), ["live"]);
        assert_eq!(kept.of(&a), 0);
    }

    #[test]
    fn the_cap_bounds_what_is_kept_and_frees_up_as_connections_leave() {
        let (mut pool, mut kept, a) = (IdleConnections::new(), KeptCount::new(), origin(1));
        let now = Instant::now();
        assert!(pool.checkin(&mut kept, &a, fake("1"), now, MINUTE, 2));
        assert!(pool.checkin(&mut kept, &a, fake("2"), now, MINUTE, 2));
        assert!(!pool.checkin(&mut kept, &a, fake("3"), now, MINUTE, 2));
        assert_eq!(pool.len(&a), 2);
        // Another origin has its own count.
        assert!(pool.checkin(&mut kept, &origin(2), fake("b"), now, MINUTE, 2));
        assert!(pool.checkout(&mut kept, &a, now).is_some());
        assert!(pool.checkin(&mut kept, &a, fake("4"), now, MINUTE, 2));
        assert_eq!(names(&mut pool, &mut kept, &a, now), ["4", "1"]);
    }

    #[test]
    fn both_connection_types_count_against_one_cap() {
        let mut kept = KeptCount::new();
        let (mut fakes, mut others) = (IdleConnections::new(), IdleConnections::new());
        let (a, now) = (origin(1), Instant::now());
        assert!(fakes.checkin(&mut kept, &a, fake("1"), now, MINUTE, 2));
        assert!(others.checkin(&mut kept, &a, Other, now, MINUTE, 2));
        assert!(!fakes.checkin(&mut kept, &a, fake("2"), now, MINUTE, 2));
        assert!(!others.checkin(&mut kept, &a, Other, now, MINUTE, 2));
        assert!(others.checkout(&mut kept, &a, now).is_some());
        assert!(fakes.checkin(&mut kept, &a, fake("2"), now, MINUTE, 2));
        assert_eq!(kept.of(&a), 2);
    }

    #[test]
    fn the_sweep_closes_expired_and_unusable_connections_and_says_when_to_come_back() {
        let (mut pool, mut kept, a) = (IdleConnections::new(), KeptCount::new(), origin(1));
        let t0 = Instant::now();
        assert_eq!(pool.next_sweep(t0), None);
        let short = Duration::from_millis(300);
        assert!(pool.checkin(&mut kept, &a, fake("short"), t0, short, 10));
        assert!(pool.checkin(&mut kept, &a, fake("long"), t0, MINUTE, 10));
        let closed = Fake {
            name: "closed",
            reusable: false,
        };
        assert!(pool.checkin(&mut kept, &a, closed, t0, MINUTE, 10));
        // Due when the short one expires, before the regular check.
        assert_eq!(pool.next_sweep(t0), Some(t0 + short));
        pool.sweep(&mut kept, t0 + short);
        assert_eq!(pool.len(&a), 1);
        assert_eq!(kept.of(&a), 1);
        let later = t0 + short;
        assert_eq!(pool.next_sweep(later), Some(later + SWEEP_EVERY));
        pool.sweep(&mut kept, t0 + MINUTE);
        assert!(pool.is_empty());
        assert_eq!(kept.of(&a), 0);
        assert_eq!(pool.next_sweep(t0 + MINUTE), None);
    }

    #[test]
    fn the_cap_is_split_over_the_workers_and_adds_up() {
        assert_eq!(thread_cap(1024, None), 1024);
        for (max, count) in [(2, 2), (3, 2), (1024, 3), (1, 4), (0, 2), (7, 7)] {
            let parts: Vec<usize> = (0..count)
                .map(|index| thread_cap(max, Some(WorkerSlot { index, count })))
                .collect();
            assert_eq!(parts.iter().sum::<usize>(), max, "{max} over {count}");
            let (least, most) = (parts.iter().min(), parts.iter().max());
            assert!(
                most.unwrap() - least.unwrap() <= 1,
                "{max} over {count}: {parts:?}"
            );
        }
    }

    /// The retry rule both transports send by: once more on a new connection only when a
    /// kept one took none of the message; every other failure stands.
    #[tokio::test]
    async fn a_kept_connection_closed_just_then_is_retried_once_on_a_new_one() {
        // A connection is its name; a send on "closed" fails with the message unsent, on
        // "partial" fails after part of it left, on any other succeeds.
        async fn run(
            kept: Option<&'static str>,
            new: &'static str,
        ) -> (Result<String, String>, usize) {
            let mut connects = 0;
            let result = send_on_kept_or_new(
                kept,
                "request",
                || {
                    connects += 1;
                    async move { Ok::<_, String>(new) }
                },
                |conn: &'static str, message: &'static str| async move {
                    let sent = match conn {
                        "closed" => Err(Unsent {
                            message: Some(message),
                            error: format!("{conn} refused {message}"),
                        }),
                        "partial" => Err(Unsent {
                            message: None,
                            error: format!("{conn} broke {message}"),
                        }),
                        _ => Ok(format!("{message} on {conn}")),
                    };
                    (conn, sent)
                },
            )
            .await
            .map(|(conn, sent)| format!("{sent} ({conn})"));
            (result, connects)
        }
        assert_eq!(
            run(Some("kept"), "new").await,
            (Ok("request on kept (kept)".into()), 0)
        );
        assert_eq!(
            run(None, "new").await,
            (Ok("request on new (new)".into()), 1)
        );
        assert_eq!(
            run(Some("closed"), "new").await,
            (Ok("request on new (new)".into()), 1)
        );
        // Once only: the new connection's failure stands.
        assert_eq!(
            run(Some("closed"), "closed").await,
            (Err("closed refused request".into()), 1)
        );
        // Part of it left: not sent again.
        assert_eq!(
            run(Some("partial"), "new").await,
            (Err("partial broke request".into()), 0)
        );
        // A new connection is never retried.
        assert_eq!(
            run(None, "closed").await,
            (Err("closed refused request".into()), 1)
        );
    }
}
