//! One export's delivery, the same for every signal: sent over a [`Transport`], retried
//! while the failure is retryable (jittered exponential backoff from 1 s doubling to 30 s,
//! or the collector's `Retry-After`) until the export timeout has passed since the first
//! attempt, and counted once in `tokentap_otlp_exports_total{signal,result}`.

// Values from the network pass here: nothing may panic on them (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::transport::{SendError, Transport};
use crate::metrics::Metrics;

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Where one signal's exports go, and for how long each may be retried.
pub struct Delivery {
    transport: Transport,
    /// The `signal` label of the counters: `metrics`, `traces`.
    pub signal: &'static str,
    export_timeout: Duration,
}

impl Delivery {
    pub fn new(transport: Transport, signal: &'static str, export_timeout: Duration) -> Delivery {
        Delivery {
            transport,
            signal,
            export_timeout,
        }
    }

    /// Send `body`, retrying what is retryable until the export timeout has passed.
    pub async fn deliver(self: Arc<Self>, body: Vec<u8>) -> Result<(), SendError> {
        let first = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.transport.send(&body).await {
                Err(SendError::Retryable { reason, after }) => {
                    let wait = after.unwrap_or_else(|| jittered(backoff));
                    if !time_left(first.elapsed(), wait, self.export_timeout) {
                        return Err(SendError::Retryable {
                            reason: format!("{reason}; no time left to retry"),
                            after,
                        });
                    }
                    tracing::debug!(signal = self.signal, %reason, ?wait, "OTLP export will be retried");
                    tokio::time::sleep(wait).await;
                    backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
                }
                done => return done,
            }
        }
    }

    /// Send `body` once, within the transport's timeout (the last export at shutdown).
    pub async fn once(&self, body: &[u8]) -> Result<(), SendError> {
        self.transport.send(body).await
    }

    /// Count (and log) how an export ended.
    pub fn count(&self, metrics: &Metrics, result: Result<(), SendError>) {
        match result {
            Ok(()) => metrics.otlp_export(self.signal, "success"),
            Err(error) => {
                tracing::warn!(signal = self.signal, %error, "OTLP export failed");
                metrics.otlp_export(self.signal, "failed");
            }
        }
    }
}

/// Whether a retry after `wait` still starts within `export_timeout` of the first attempt,
/// `elapsed` ago. Both waits may come from a collector (`Retry-After`), so nothing is added
/// to an `Instant`: what is left is compared instead.
pub fn time_left(elapsed: Duration, wait: Duration, export_timeout: Duration) -> bool {
    wait < export_timeout.saturating_sub(elapsed)
}

/// `backoff` scaled by a random factor from 0.5 to 1.5, so that many sidecars that lost
/// the same collector do not all come back at once.
fn jittered(backoff: Duration) -> Duration {
    let permille = rand::thread_rng().gen_range(500u32..1500);
    backoff
        .saturating_mul(permille)
        .checked_div(1000)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_must_start_before_the_export_timeout_whatever_the_wait() {
        let timeout = Duration::from_secs(10);
        let s = Duration::from_secs;
        assert!(time_left(s(0), s(9), timeout));
        assert!(!time_left(s(0), s(10), timeout));
        assert!(!time_left(s(8), s(2), timeout));
        assert!(!time_left(s(11), s(0), timeout));
        // A collector's `Retry-After: 18446744073709551615` once overflowed `Instant + wait`.
        assert!(!time_left(s(0), Duration::MAX, timeout));
        assert!(!time_left(Duration::MAX, s(1), Duration::MAX));
    }

    #[test]
    fn jitter_stays_within_half_and_one_and_a_half_times() {
        for backoff in [FIRST_BACKOFF, MAX_BACKOFF, Duration::MAX] {
            for _ in 0..100 {
                let wait = jittered(backoff);
                assert!(wait >= backoff / 2 || backoff == Duration::MAX, "{wait:?}");
                assert!(wait <= backoff.saturating_mul(3) / 2, "{wait:?}");
            }
        }
    }
}
