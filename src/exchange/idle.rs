//! The upstream idle timeout (`upstream.idle_timeout`), one rule for every transport.
//!
//! The upstream is idle when it has had nothing for tokentap for the whole timeout while
//! tokentap was waiting for it. The clock starts when the transport starts waiting (it
//! found nothing to read), not at the last data: time spent writing to a slow client is
//! the client's, and a client that reads slowly is not an idle upstream. It stops when
//! data arrives. A transport arms whatever timer it likes at [`UpstreamIdle::deadline`],
//! and when the timer fires asks [`UpstreamIdle::expired`] (a timer armed earlier may fire
//! before the upstream has really been idle that long).

use std::time::Duration;

use tokio::time::Instant;

/// The upstream sent nothing for `upstream.idle_timeout`: the error a transport ends a
/// response body with.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeout(pub Duration);

/// One response's idle clock.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamIdle {
    timeout: Duration,
    /// When tokentap started waiting for the upstream; `None` while it is not waiting.
    waiting_since: Option<Instant>,
}

impl UpstreamIdle {
    pub fn new(timeout: Duration) -> UpstreamIdle {
        UpstreamIdle {
            timeout,
            waiting_since: None,
        }
    }

    /// The configured timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The transport waits for the upstream from `now` on (a later call while it still
    /// waits keeps the first instant). Returns the deadline.
    pub fn waiting(&mut self, now: Instant) -> Instant {
        deadline(*self.waiting_since.get_or_insert(now), self.timeout)
    }

    /// The upstream sent something: it is not idle, and the wait is over.
    pub fn data(&mut self) {
        self.waiting_since = None;
    }

    /// When the current wait times out, if tokentap is waiting.
    pub fn deadline(&self) -> Option<Instant> {
        self.waiting_since
            .map(|since| deadline(since, self.timeout))
    }

    /// Whether the current wait has lasted the whole timeout at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|deadline| deadline <= now)
    }
}

/// Far enough ahead to mean "never" (tokio's own "far future" is 30 years too).
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `after` past `at`, or (when that is past what an `Instant` can hold) as late as can be
/// said: a timeout never makes a deadline panic, however long it was configured.
pub fn deadline(at: Instant, after: Duration) -> Instant {
    at.checked_add(after)
        .or_else(|| at.checked_add(FAR_FUTURE))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_past_what_an_instant_holds_is_far_ahead_not_a_panic() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        assert_eq!(deadline(now, Duration::MAX), now + FAR_FUTURE);
        let mut idle = UpstreamIdle::new(Duration::MAX);
        assert_eq!(idle.waiting(now), now + FAR_FUTURE);
    }

    #[test]
    fn the_clock_runs_only_while_waiting_for_the_upstream() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut idle = UpstreamIdle::new(Duration::from_millis(100));
        assert_eq!(idle.deadline(), None, "not waiting yet");
        assert!(!idle.expired(at(1_000)));
        // Waiting from 10 ms; asking again later keeps the first instant.
        assert_eq!(idle.waiting(at(10)), at(110));
        assert_eq!(idle.waiting(at(50)), at(110));
        assert!(!idle.expired(at(109)));
        assert!(idle.expired(at(110)));
        // Data at 105 ms, then 400 ms writing to a slow client: not idle time.
        idle.data();
        assert!(!idle.expired(at(505)));
        assert_eq!(idle.waiting(at(505)), at(605));
        assert!(!idle.expired(at(604)));
        assert!(idle.expired(at(605)));
    }
}
