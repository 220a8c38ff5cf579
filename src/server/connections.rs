//! `limits.max_connections`: the bound on open client connections of the proxy port.
//!
//! Every connection holds a file descriptor, and so may its upstream connection. Without a
//! bound, a flood of idle clients takes every descriptor the process may open: `accept`
//! then fails with `EMFILE` over and over, and the admin port can no longer accept a
//! scrape or a probe either. So the accept loop takes a permit before it accepts, and the
//! connection's task holds it until the connection ends. At the limit the loop waits for
//! a permit: new clients queue in the kernel's listen backlog (and are served as earlier
//! ones close) instead of being accepted and closed.
//!
//! The default follows the descriptor limit the process runs with (the soft
//! `RLIMIT_NOFILE`), leaving out a reserve for the process's own files, the worker
//! threads' runtimes and the connections of the admin port and the live view.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admin;
use crate::metrics::Metrics;

/// Descriptors for the process's own files: stdio, the two listeners, the main runtime,
/// the readiness probe, DNS lookups, a tokenizer file being read.
const RESERVED_FOR_THE_PROCESS: u64 = 48;
/// Descriptors each worker thread's runtime holds (measured: 3-4, an epoll instance and
/// its wake-up event among them).
const RESERVED_PER_WORKER: u64 = 4;
/// The most client connections the default allows, whatever the descriptor limit (a
/// container's is often 1048576): far more than one sidecar or gateway serves, and a
/// bound on the memory idle connections can take.
const DEFAULT_CEILING: usize = 65_536;
/// How often, at most, reaching the limit is logged (it is counted every time).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The effective `limits.max_connections`, and whether the configured value was lowered.
#[derive(Debug, PartialEq, Eq)]
struct Effective {
    pub limit: usize,
    /// `(configured, allowed)` when the configured value was more than the descriptor
    /// limit allows.
    pub lowered: Option<(usize, usize)>,
}

/// The client connections `nofile` descriptors allow with `workers` worker threads:
/// half of what the reserve leaves (a client connection may hold an upstream connection
/// too), at least 1. `None`: no limit (`RLIM_INFINITY`).
fn allowed_by(nofile: Option<u64>, workers: usize) -> Option<usize> {
    let nofile = nofile?;
    let workers = u64::try_from(workers).unwrap_or(u64::MAX);
    let reserve = RESERVED_FOR_THE_PROCESS
        .saturating_add(RESERVED_PER_WORKER.saturating_mul(workers))
        .saturating_add(admin::RESERVED_DESCRIPTORS as u64);
    let allowed = nofile.saturating_sub(reserve) / 2;
    Some(usize::try_from(allowed).unwrap_or(usize::MAX).max(1))
}

/// `limits.max_connections` as it applies: the configured value, lowered to what the
/// descriptor limit allows; or, when not configured, that allowance up to
/// [`DEFAULT_CEILING`].
fn effective(configured: Option<usize>, nofile: Option<u64>, workers: usize) -> Effective {
    let allowed = allowed_by(nofile, workers);
    let (limit, lowered) = match (configured, allowed) {
        (Some(configured), Some(allowed)) if configured > allowed => {
            (allowed, Some((configured, allowed)))
        }
        (Some(configured), _) => (configured, None),
        (None, Some(allowed)) => (allowed.min(DEFAULT_CEILING), None),
        (None, None) => (DEFAULT_CEILING, None),
    };
    Effective {
        // A semaphore holds at most this many permits (some 2^61 on 64-bit targets).
        limit: limit.clamp(1, Semaphore::MAX_PERMITS),
        lowered,
    }
}

/// The soft `RLIMIT_NOFILE` of this process; `None` when it is unlimited, or cannot be
/// read (then no descriptor bound is known, and the limit is the configured value or the
/// default ceiling).
fn nofile_soft_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through a valid pointer to one.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if read != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "cannot read the file descriptor limit (RLIMIT_NOFILE)"
        );
        return None;
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    #[allow(clippy::useless_conversion)] // `rlim_t` is `u64` on Linux, not on every target.
    u64::try_from(limit.rlim_cur).ok()
}

/// The permits of the proxy port's accept loop.
pub(super) struct ConnectionLimit {
    permits: Arc<Semaphore>,
    limit: usize,
    metrics: Arc<Metrics>,
    /// When reaching the limit was last logged.
    warned: Option<Instant>,
}

impl ConnectionLimit {
    /// The limit in force from `limits.max_connections` (`configured`) and the descriptor
    /// limit the process runs with; warns when the configured value had to be lowered.
    pub fn at_start(
        configured: Option<usize>,
        workers: usize,
        metrics: Arc<Metrics>,
    ) -> ConnectionLimit {
        let nofile = nofile_soft_limit();
        let effective = effective(configured, nofile, workers);
        if let (Some((configured, allowed)), Some(nofile)) = (effective.lowered, nofile) {
            tracing::warn!(
                configured,
                allowed,
                nofile,
                "limits.max_connections is {configured}, more than the file descriptor limit \
                 (ulimit -n {nofile}) allows: using {allowed}"
            );
        }
        ConnectionLimit::new(effective.limit, metrics)
    }

    /// Permits for `limit` connections; `tokentap_client_connections_limit` says `limit`.
    pub fn new(limit: usize, metrics: Arc<Metrics>) -> ConnectionLimit {
        metrics
            .client_connections_limit
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        ConnectionLimit {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            metrics,
            warned: None,
        }
    }

    /// The most client connections open at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A permit for the next connection to accept, waiting (and counting the wait in
    /// `tokentap_client_connection_limit_reached_total`) while `limit` are open.
    pub async fn acquire(&mut self) -> OwnedSemaphorePermit {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return permit;
        }
        self.metrics.client_connection_limit_reached();
        if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            self.warned = Some(Instant::now());
            tracing::warn!(
                limit = self.limit,
                "limits.max_connections client connections are open: new clients wait in \
                 the listen backlog until one closes"
            );
        }
        match self.permits.clone().acquire_owned().await {
            Ok(permit) => permit,
            // The semaphore is never closed; should it be, nothing is bounded any more
            // and nothing is accepted either.
            Err(_) => std::future::pending().await,
        }
    }

    /// An accepted connection's hold on its permit, counted in
    /// `tokentap_client_connections` until the connection ends.
    pub fn open(&self, permit: OwnedSemaphorePermit) -> ConnectionSlot {
        self.metrics.client_connections.inc();
        ConnectionSlot {
            _permit: permit,
            open: self.metrics.client_connections.clone(),
        }
    }
}

/// One open client connection's place under `limits.max_connections`: its task holds it,
/// and dropping it (the connection ended) lets the accept loop take the next client.
pub(super) struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
    open: IntGauge,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_follows_the_descriptor_limit() {
        // 48 + 4 x 2 workers + 2 x 16 admin and live view = 88 reserved; half the rest.
        assert_eq!(allowed_by(Some(1024), 2), Some(468));
        assert_eq!(allowed_by(Some(256), 2), Some(84));
        assert_eq!(allowed_by(Some(256), 8), Some(72));
        // Nothing left after the reserve: still one connection, never none.
        assert_eq!(allowed_by(Some(50), 2), Some(1));
        assert_eq!(allowed_by(None, 2), None);
        assert_eq!(
            effective(None, Some(1024), 2),
            Effective {
                limit: 468,
                lowered: None
            }
        );
        // A container's limit: the ceiling applies.
        assert_eq!(effective(None, Some(1 << 20), 2).limit, DEFAULT_CEILING);
        assert_eq!(effective(None, None, 2).limit, DEFAULT_CEILING);
    }

    #[test]
    fn a_configured_limit_is_lowered_to_what_the_descriptors_allow() {
        assert_eq!(
            effective(Some(4), Some(1024), 2),
            Effective {
                limit: 4,
                lowered: None
            }
        );
        assert_eq!(
            effective(Some(1000), Some(1024), 2),
            Effective {
                limit: 468,
                lowered: Some((1000, 468))
            }
        );
        // Above the default ceiling is fine when the descriptors allow it.
        assert_eq!(effective(Some(100_000), Some(1 << 20), 2).limit, 100_000);
        assert_eq!(
            effective(Some(usize::MAX), None, 2).limit,
            Semaphore::MAX_PERMITS
        );
    }

    #[tokio::test]
    async fn a_slot_holds_its_permit_and_counts_until_dropped() {
        let metrics = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .map(|config| Metrics::new(&config.metrics.buckets, &config.labels))
        .expect("flag-only config is valid");
        let mut limit = ConnectionLimit::new(1, metrics.clone());
        assert_eq!(metrics.client_connections_limit.get(), 1);
        let permit = limit.acquire().await;
        let first = limit.open(permit);
        assert_eq!(metrics.client_connections.get(), 1);
        // At the limit, acquiring waits (and counts that it had to) until the slot goes.
        let mut waiting = Box::pin(limit.acquire());
        assert!(poll_once(&mut waiting).await.is_none());
        let text = String::from_utf8_lossy(&metrics.render()).into_owned();
        assert!(
            text.contains("\ntokentap_client_connection_limit_reached_total 1\n"),
            "{text}"
        );
        drop(first);
        assert_eq!(metrics.client_connections.get(), 0);
        // The permit the dropped slot gave back is the waiting acquire's.
        let permit = waiting.await;
        let second = limit.open(permit);
        assert_eq!(metrics.client_connections.get(), 1);
        drop(second);
        assert_eq!(metrics.client_connections.get(), 0);
    }

    /// Poll `future` once: its output if it is ready at once.
    async fn poll_once<F: std::future::Future + Unpin>(future: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut *future).poll(cx) {
                std::task::Poll::Ready(output) => Some(output),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
