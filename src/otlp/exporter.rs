//! The export loop: its own task, its own timer, at most one export in flight and one
//! waiting, so that a collector that is down or slow costs the proxy nothing.
//!
//! Every interval the loop reads [`Metrics::snapshot`], maps it (`mapping`) and encodes it,
//! on the blocking pool (a large snapshot takes as long as a scrape).
//! A snapshot is cumulative, so the newest one carries everything an older unsent one
//! did: while an export is in flight (or retrying) the next one waits, and a newer one
//! replaces it (counted in `tokentap_otlp_exports_dropped_total{reason="replaced"}`).
//! An export that fails in a retryable way is sent again after an exponential backoff
//! (1s doubling to 30s, jittered, or what the collector asked for with `Retry-After`)
//! until it goes through or `export_timeout` has passed since its first attempt; each
//! attempt has the transport's `timeout`. Every export ends in
//! `tokentap_otlp_exports_total{result="success"|"failed"}`. The retries and the count
//! are `delivery`'s, which the span exporter shares.
//!
//! At shutdown whatever waits or is in flight is given up (`reason="shutdown"`), and one
//! last snapshot, taken after the drain so every request is in it, is sent once within
//! `timeout`.
//!
//! The loop runs [supervised](crate::supervise) as `otlp_metrics`: if it fails, it starts
//! again with the next interval (the export it held is lost; the next carries its counts).

use std::sync::Arc;
use std::time::SystemTime;

use prost::Message;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::delivery::Delivery;
use super::mapping::{export_request, Origin};
use super::transport::Transport;
use crate::config::Otlp;
use crate::metrics::Metrics;
use crate::supervise::Supervisor;

/// The `signal` label of this exporter's counters.
pub const SIGNAL: &str = "metrics";

/// The running exporter; [`Exporter::finish`] makes the last export and stops it.
pub struct Exporter {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Exporter {
    /// Start exporting `metrics` as `settings` say through `transport` (built from them
    /// with [`Transport::new`] at start), counting from `start` (the start time of every
    /// cumulative point), under `supervisor`.
    pub fn spawn(
        settings: Otlp,
        transport: Transport,
        metrics: Arc<Metrics>,
        start: SystemTime,
        supervisor: &Supervisor,
    ) -> Exporter {
        let (stop, stopped) = watch::channel(false);
        tracing::info!(
            url = %settings.url,
            protocol = ?settings.link.protocol,
            interval = ?settings.interval,
            "OTLP metrics push on"
        );
        let delivery = Arc::new(Delivery::new(transport, SIGNAL, settings.export_timeout));
        let task = supervisor.spawn("otlp_metrics", move || {
            run(
                settings.clone(),
                delivery.clone(),
                metrics.clone(),
                start,
                stopped.clone(),
            )
        });
        Exporter { stop, task }
    }

    /// Give up what is pending, send one last snapshot (within the export timeout) and
    /// stop.
    pub async fn finish(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// One encoded export request.
struct Export {
    body: Vec<u8>,
}

async fn run(
    settings: Otlp,
    delivery: Arc<Delivery>,
    metrics: Arc<Metrics>,
    start: SystemTime,
    mut stopped: watch::Receiver<bool>,
) {
    let origin = Arc::new(Origin {
        resource: settings.resource.clone(),
        start,
    });
    // Off the async threads: with thousands of label pairs a snapshot takes as long as a
    // scrape, and the accept loop shares the control runtime.
    let encode = || {
        let (metrics, origin) = (metrics.clone(), origin.clone());
        async move {
            let encoded = tokio::task::spawn_blocking(move || {
                export_request(&metrics.snapshot(), &origin, SystemTime::now()).encode_to_vec()
            })
            .await;
            encoded.ok().map(|body| Export { body })
        }
    };
    let mut ticker =
        tokio::time::interval_at(Instant::now() + settings.interval, settings.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut waiting: Option<Export> = None;
    let mut in_flight = None;
    loop {
        if in_flight.is_none() {
            if let Some(export) = waiting.take() {
                in_flight = Some(Box::pin(delivery.clone().deliver(export.body)));
            }
        }
        tokio::select! {
            biased;
            // Told to stop, or the exporter is gone.
            _ = async { drop(stopped.wait_for(|stop| *stop).await) } => break,
            delivered = async { in_flight.as_mut().expect("polled only when some").await },
                if in_flight.is_some() =>
            {
                in_flight = None;
                delivery.count(&metrics, delivered);
            }
            _ = ticker.tick() => {
                let Some(export) = encode().await else { continue };
                if waiting.replace(export).is_some() {
                    metrics.otlp_export_dropped(SIGNAL, "replaced");
                }
            }
        }
    }
    if in_flight.is_some() {
        metrics.otlp_export_dropped(SIGNAL, "shutdown");
    }
    if waiting.is_some() {
        metrics.otlp_export_dropped(SIGNAL, "shutdown");
    }
    if let Some(last) = encode().await {
        delivery.count(&metrics, delivery.once(&last.body).await);
    }
}
