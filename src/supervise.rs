//! Background tasks that outlive their own failures: the OTLP exporters (metrics and the
//! span queue's), the live view's ticker, the upstream probe and the SIGHUP reload each
//! run under a [`Supervisor`], which restarts one that panics instead of losing it until the
//! process restarts.
//!
//! A failure is logged, counted in `tokentap_task_restarts_total{task}`, and makes
//! `/readyz` answer `503` (naming the task) until the task runs again, after a backoff of
//! 100 ms doubling to 30 s (back to 100 ms once a run lasted a minute), so that a task that
//! fails at once every time costs little. A task that returns ends for good: returning is
//! how a task stops (at shutdown, or when what it serves is gone).
//!
//! Each run is a new future from the task's factory: what a task keeps across runs (a
//! queue, a stop signal, a transport) lives outside the future, shared with the factory.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::task::JoinHandle;

use crate::admin::Readiness;
use crate::metrics::Metrics;

/// The wait before the first restart, doubled after each failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A run that lasted this long resets the backoff.
const STEADY: Duration = Duration::from_secs(60);

/// Starts supervised tasks; cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

impl Supervisor {
    /// A supervisor that counts failures in `metrics` and reports them in `readiness`.
    pub fn new(metrics: Arc<Metrics>, readiness: Arc<Readiness>) -> Supervisor {
        Supervisor { metrics, readiness }
    }

    /// Run `task()` on its own tokio task until a run returns, starting it again whenever
    /// a run panics. `name` is the `task` label. Aborting the handle stops it.
    pub fn spawn<F, Fut>(&self, name: &'static str, mut task: F) -> JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Supervisor { metrics, readiness } = self.clone();
        tokio::spawn(async move {
            let mut backoff = FIRST_BACKOFF;
            loop {
                let started = Instant::now();
                let Err(panic) = AssertUnwindSafe(task()).catch_unwind().await else {
                    return;
                };
                tracing::error!(
                    task = name,
                    panic = panic_message(&*panic),
                    restart_in = ?backoff,
                    "background task failed; restarting it"
                );
                metrics.task_restart(name);
                if started.elapsed() >= STEADY {
                    backoff = FIRST_BACKOFF;
                }
                let down = Down::mark(&readiness, name);
                tokio::time::sleep(backoff).await;
                drop(down);
                backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
            }
        })
    }
}

/// A task marked down in `/readyz` while this lives (also if the supervisor is aborted
/// while it waits).
struct Down<'a> {
    readiness: &'a Readiness,
    task: &'static str,
}

impl Down<'_> {
    fn mark<'a>(readiness: &'a Readiness, task: &'static str) -> Down<'a> {
        readiness.task_down(task);
        Down { readiness, task }
    }
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        self.readiness.task_up(self.task);
    }
}

/// What a panic said, when it said it with a string (as `panic!` and `expect` do).
pub fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn metrics() -> Arc<Metrics> {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        Metrics::new(&config.metrics.buckets, &config.labels)
    }

    #[tokio::test]
    async fn a_task_that_panics_is_counted_reported_and_restarted() {
        let metrics = metrics();
        let readiness = Arc::new(Readiness::default());
        readiness.listening.store(true, Ordering::Relaxed);
        readiness.upstream_reachable.store(true, Ordering::Relaxed);
        let supervisor = Supervisor::new(metrics.clone(), readiness.clone());
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let counted = runs.clone();
        let task = supervisor.spawn("upstream_probe", move || {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            let mut released = released.clone();
            async move {
                if run == 0 {
                    panic!("the first run fails");
                }
                let _ = released.wait_for(|r| *r).await;
            }
        });
        // Down between the failure and the restart, named in `/readyz`.
        let deadline = Instant::now() + Duration::from_secs(5);
        while runs.load(Ordering::SeqCst) == 0 || readiness.check().is_ok() {
            assert!(Instant::now() < deadline, "no failure seen");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            readiness.check(),
            Err("background task upstream_probe failed and is restarting".to_string())
        );
        while runs.load(Ordering::SeqCst) < 2 {
            assert!(Instant::now() < deadline, "not restarted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(readiness.check(), Ok(()));
        let text = String::from_utf8(metrics.render()).expect("text");
        assert!(
            text.contains("tokentap_task_restarts_total{task=\"upstream_probe\"} 1\n"),
            "{text}"
        );
        // A run that returns ends the task: no restart.
        let _ = release.send(true);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends")
            .expect("without a panic");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_aborted_supervisor_leaves_no_task_down() {
        let readiness = Arc::new(Readiness::default());
        readiness.listening.store(true, Ordering::Relaxed);
        readiness.upstream_reachable.store(true, Ordering::Relaxed);
        let supervisor = Supervisor::new(metrics(), readiness.clone());
        let task = supervisor.spawn("live_ticker", || async { panic!("always") });
        let deadline = Instant::now() + Duration::from_secs(5);
        while readiness.check().is_ok() {
            assert!(Instant::now() < deadline, "no failure seen");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        task.abort();
        let _ = task.await;
        assert_eq!(readiness.check(), Ok(()));
    }
}
