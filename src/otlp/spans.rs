//! Per-request spans: a batch span processor on its own task.
//!
//! A sampled request is handed to `SpanTap` on the thread that ended it
//! ([`Metrics::spans`](crate::metrics::Metrics)); the tap copies it into a bounded queue
//! (`max_queue_size`) with `try_send` and returns: when the queue is full the span is
//! dropped and counted in `tokentap_otlp_exports_dropped_total{signal="traces",
//! reason="queue_full"}`, so a collector that is down or slow never holds up a request.
//! The task takes spans off the queue into a batch and sends it when it holds
//! `max_export_batch_size` spans or its first span has waited `schedule_delay`, one
//! export at a time: while one is in flight (or retrying, with the metrics push's rules,
//! `delivery`) spans wait in the queue. Spans are built and encoded on this task, not in
//! the request path.
//!
//! At shutdown (after the drain, so every request has ended) what is queued is sent in
//! batches within the export timeout of one request (`timeout`); what cannot be is
//! counted as `reason="shutdown"`.
//!
//! The task runs [supervised](crate::supervise) as `otlp_spans`: the queue outlives a
//! failure, so a restarted task goes on with the spans queued meanwhile (the batch it
//! held is lost).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use prometheus::IntCounter;
use prost::Message;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::delivery::Delivery;
use super::span_mapping::{export_request, span, Server};
use super::transport::{SendError, Transport};
use crate::config::OtlpTraces;
use crate::metrics::Metrics;
use crate::summary::{RequestSummary, Sink, Sinks};
use crate::supervise::Supervisor;

/// The `signal` label of the span export's counters.
pub const SIGNAL: &str = "traces";

/// Puts a sampled request's figures on the queue, or counts it dropped.
struct SpanTap {
    queue: mpsc::Sender<Box<RequestSummary>>,
    queue_full: IntCounter,
    closed: IntCounter,
}

impl Sink for SpanTap {
    fn finished(&self, request: &RequestSummary) {
        match self.queue.try_send(Box::new(request.clone())) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.queue_full.inc(),
            Err(mpsc::error::TrySendError::Closed(_)) => self.closed.inc(),
        }
    }
}

/// The running span export; [`SpanExporter::finish`] flushes it and stops it.
pub struct SpanExporter {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    sinks: Arc<Sinks>,
}

impl SpanExporter {
    /// Start giving sampled requests spans and exporting them as `settings` say through
    /// `transport` (built from them with [`Transport::new`] at start), from
    /// `resource`, naming `server` (the upstream) in each, under `supervisor`.
    pub fn spawn(
        settings: OtlpTraces,
        transport: Transport,
        resource: Vec<(String, String)>,
        server: Option<Server>,
        sinks: Arc<Sinks>,
        supervisor: &Supervisor,
    ) -> SpanExporter {
        let metrics = sinks.metrics();
        let (queue, spans) = mpsc::channel(settings.max_queue_size);
        let tap = Arc::new(SpanTap {
            queue,
            queue_full: metrics.otlp_export_dropped_counter(SIGNAL, "queue_full"),
            closed: metrics.otlp_export_dropped_counter(SIGNAL, "shutdown"),
        });
        tracing::info!(
            url = %settings.url,
            protocol = ?settings.link.protocol,
            sampler = ?settings.sampler,
            "OTLP spans on"
        );
        sinks.spans.start(settings.sampler, tap);
        let (stop, stopped) = watch::channel(false);
        let delivery = Arc::new(Delivery::new(transport, SIGNAL, settings.export_timeout));
        let spans = Arc::new(Mutex::new(spans));
        let batcher = Batcher {
            resource,
            server,
            batch: Vec::with_capacity(settings.max_export_batch_size),
        };
        let running = metrics.clone();
        let task = supervisor.spawn("otlp_spans", move || {
            run(
                settings.clone(),
                delivery.clone(),
                batcher.emptied(),
                running.clone(),
                spans.clone(),
                stopped.clone(),
            )
        });
        SpanExporter { stop, task, sinks }
    }

    /// Stop giving requests spans, send what is queued (within the export timeout of one
    /// request) and stop.
    pub async fn finish(self) {
        self.sinks.spans.stop();
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

type InFlight = Pin<Box<dyn Future<Output = Result<(), SendError>> + Send>>;

struct Batcher {
    resource: Vec<(String, String)>,
    server: Option<Server>,
    batch: Vec<RequestSummary>,
}

impl Batcher {
    /// A batcher for the same resource and server with an empty batch.
    fn emptied(&self) -> Batcher {
        Batcher {
            resource: self.resource.clone(),
            server: self.server.clone(),
            batch: Vec::with_capacity(self.batch.capacity()),
        }
    }

    /// The batch as one encoded export request, emptying it.
    fn encode(&mut self) -> Vec<u8> {
        let spans = self
            .batch
            .drain(..)
            .filter_map(|request| span(&request, self.server.as_ref()))
            .collect();
        export_request(spans, &self.resource).encode_to_vec()
    }
}

async fn run(
    settings: OtlpTraces,
    delivery: Arc<Delivery>,
    mut batcher: Batcher,
    metrics: Arc<Metrics>,
    queue: Arc<Mutex<mpsc::Receiver<Box<RequestSummary>>>>,
    mut stopped: watch::Receiver<bool>,
) {
    // Held for the run: a run that failed let go of it as it unwound.
    let mut spans = queue.lock().await;
    let max_batch = settings.max_export_batch_size;
    let mut in_flight: Option<InFlight> = None;
    // When the batch's first span has waited long enough.
    let mut due = Instant::now() + settings.schedule_delay;
    loop {
        let full = batcher.batch.len() >= max_batch;
        if in_flight.is_none() && !batcher.batch.is_empty() && (full || Instant::now() >= due) {
            in_flight = Some(Box::pin(delivery.clone().deliver(batcher.encode())));
            continue;
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
            request = spans.recv(), if !full => match request {
                Some(request) => {
                    if batcher.batch.is_empty() {
                        due = Instant::now() + settings.schedule_delay;
                    }
                    batcher.batch.push(*request);
                }
                None => break,
            },
            _ = tokio::time::sleep_until(due),
                if in_flight.is_none() && !batcher.batch.is_empty() => {}
        }
    }

    // Shutdown: no request gets a span any more; send what is left within `timeout`.
    spans.close();
    let deadline = Instant::now() + settings.link.timeout;
    let flush = async {
        if let Some(in_flight) = in_flight.take() {
            delivery.count(&metrics, in_flight.await);
        }
        loop {
            while batcher.batch.len() < max_batch {
                match spans.try_recv() {
                    Ok(request) => batcher.batch.push(*request),
                    Err(_) => break,
                }
            }
            if batcher.batch.is_empty() {
                break;
            }
            let body = batcher.encode();
            delivery.count(&metrics, delivery.once(&body).await);
        }
    };
    if tokio::time::timeout_at(deadline, flush).await.is_err() {
        let mut left = batcher.batch.len() as u64;
        while spans.try_recv().is_ok() {
            left += 1;
        }
        tracing::warn!(spans = left, "OTLP spans not sent at shutdown");
        metrics
            .otlp_export_dropped_counter(SIGNAL, "shutdown")
            .inc_by(left.max(1));
    }
}
