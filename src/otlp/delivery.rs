//! One export's delivery, the same for every signal: sent over a [`Transport`], retried
//! while the failure is retryable (jittered exponential backoff from 1 s doubling to 30 s,
//! or the collector's `Retry-After`) until the export timeout has passed since the first
//! attempt, and counted once in `tokentap_otlp_exports_total{signal,result}`.

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
        let deadline = Instant::now() + self.export_timeout;
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.transport.send(&body).await {
                Err(SendError::Retryable { reason, after }) => {
                    let wait = after.unwrap_or_else(|| jittered(backoff));
                    if Instant::now() + wait >= deadline {
                        return Err(SendError::Retryable {
                            reason: format!("{reason}; no time left to retry"),
                            after,
                        });
                    }
                    tracing::debug!(signal = self.signal, %reason, ?wait, "OTLP export will be retried");
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
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

/// `backoff` scaled by a random factor from 0.5 to 1.5, so that many sidecars that lost
/// the same collector do not all come back at once.
fn jittered(backoff: Duration) -> Duration {
    backoff.mul_f64(rand::thread_rng().gen_range(0.5..1.5))
}
