//! The live view: what changed in the last minutes, per model, served on its own listener
//! (`ui.listen`, by [`crate::admin::serve_live`]: `/ui`, `/api/live/snapshot`,
//! `/api/live/stream`) and read by `tokentap top`.
//!
//! One ticker task, once a second, whether or not anyone watches:
//! - reads the TTFT, ITL, request and output-token families ([`window::FAMILIES`]) and
//!   pushes the change since the previous tick into the [`window::Ring`] (ten minutes,
//!   bounded), so a viewer who arrives sees the last minutes;
//! - moves the tick's slowest finished requests (kept by its [`Sink`], a few per
//!   tick) into a ring of its own (five minutes).
//!
//! Only while someone watches, once per tick and per window someone watches (at most
//! [`WINDOWS`]`.len()` frames, however many viewers): the windowed figures, the requests
//! in flight (each from its head, with its phase) and the tick's finished requests,
//! serialized once to the SSE bytes that every subscriber of that window receives (a
//! `tokio::sync::broadcast` of `Bytes`). A subscriber more than [`BACKLOG`] frames behind
//! is dropped, not buffered (one whose client stops reading is dropped by its listener's
//! write stall timeout); at most [`MAX_SUBSCRIBERS`] are served at once.
//!
//! Nothing here shows a request's text, headers or keys: model and tenant label values
//! (bounded by the label policy), figures, outcomes and trace ids, as the metrics and the
//! access log carry them. docs/LIVE.md documents the API.

pub mod frame;
pub mod page;
pub mod window;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::metrics::in_flight::LiveStreamView;
use crate::metrics::snapshot::Values;
use crate::metrics::Metrics;
use crate::outcome::Outcome;
use crate::summary::{RequestSummary, Sink, Sinks, TapId};
use crate::supervise::Supervisor;
use frame::{
    Attainment, Bounds, Column, Columns, Finished, Frame, Heatmap, InFlight, Judged, ModelFigures,
    Quantiles, Rows, StreamFigures,
};
use window::{quantile, Ring, Windowed, OUTCOMES};

/// How often the ring takes a tick and frames go out.
pub const TICK: Duration = Duration::from_secs(1);
/// The windows a viewer may choose, in seconds; the first page shows [`DEFAULT_WINDOW`].
pub const WINDOWS: [u64; 3] = [10, 60, 300];
pub const DEFAULT_WINDOW: u64 = 60;
/// Ticks of TTFT/ITL columns in a snapshot's heatmaps (five minutes).
pub const HEATMAP_TICKS: usize = 300;
/// Requests in flight listed in a frame (the longest running first); the total is given.
pub const IN_FLIGHT_SHOWN: usize = frame::MAX_STREAM_ROWS;
/// Slowest finished requests kept per tick, and listed in a snapshot.
pub const SLOWEST_PER_TICK: usize = 5;
pub const SLOWEST_SHOWN: usize = 20;
/// Ticks of slowest requests kept (five minutes).
pub const SLOWEST_TICKS: usize = 300;
/// Finished requests sent per tick to subscribers (the rest are counted as `dropped`).
pub const REQUESTS_PER_TICK: usize = 100;
/// SSE subscribers served at once (the live view's listener serves 15 connections: the
/// rest stay for the page's files and snapshots).
pub const MAX_SUBSCRIBERS: usize = 8;
/// Frames a subscriber may be behind before it is dropped.
pub const BACKLOG: usize = 8;

impl Finished {
    fn of(request: &RequestSummary) -> Finished {
        let ended = request.started + request.duration;
        Finished {
            model: request.model.clone(),
            tenant: request.tenant.clone(),
            outcome: Cow::Borrowed(request.verdict.outcome.as_str()),
            status: request.http_status,
            ended_ms: unix_ms(ended),
            duration_s: request.duration.as_secs_f64(),
            ttft_s: request.ttft.map(|d| d.as_secs_f64()),
            slowest_gap_s: request
                .slowest_gap
                .filter(|_| !request.buffered)
                .map(|d| d.as_secs_f64()),
            output_tokens: request.output_tokens,
            buffered: request.buffered,
            objectives: Rows::from(
                request
                    .judged()
                    .map(|(name, met)| Judged {
                        objective: Arc::from(name),
                        met,
                    })
                    .collect::<Vec<_>>(),
            ),
            trace_id: request.trace().map(|t| t.trace_id_hex()),
        }
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the request tap keeps between ticks.
#[derive(Default)]
struct Recent {
    /// This tick's slowest, at most [`SLOWEST_PER_TICK`].
    slowest: Vec<Finished>,
    /// This tick's finished requests, kept only while someone watches.
    feed: Vec<Finished>,
    dropped: u64,
}

/// The tap: on the request's thread, so it takes one short lock, and none when the
/// request is neither among the tick's slowest nor watched.
struct Tap {
    shared: Weak<Shared>,
}

impl Sink for Tap {
    fn finished(&self, request: &RequestSummary) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let nanos = crate::clock::saturating_nanos(request.duration);
        let watching = shared.watching.load(Ordering::Relaxed);
        if !watching && nanos <= shared.slowest_floor.load(Ordering::Relaxed) {
            return;
        }
        let finished = Finished::of(request);
        let mut recent = shared.recent.lock().unwrap_or_else(|e| e.into_inner());
        if watching {
            if recent.feed.len() < REQUESTS_PER_TICK {
                recent.feed.push(finished.clone());
            } else {
                recent.dropped += 1;
            }
        }
        let slowest = &mut recent.slowest;
        if slowest.len() < SLOWEST_PER_TICK {
            slowest.push(finished);
        } else if let Some(min) = slowest
            .iter_mut()
            .min_by(|a, b| a.duration_s.total_cmp(&b.duration_s))
        {
            if finished.duration_s > min.duration_s {
                *min = finished;
            }
        }
        if slowest.len() == SLOWEST_PER_TICK {
            let floor = slowest
                .iter()
                .map(|f| f.duration_s)
                .fold(f64::INFINITY, f64::min);
            shared
                .slowest_floor
                .store((floor * 1e9) as u64, Ordering::Relaxed);
        }
    }
}

/// What the ticker writes and the admin port reads.
struct Shared {
    metrics: Arc<Metrics>,
    /// Where the requests in flight are listed and the tap is registered.
    sinks: Arc<Sinks>,
    ring: Mutex<Ring>,
    bounds: Mutex<Bounds>,
    slowest: Mutex<VecDeque<Vec<Finished>>>,
    recent: Mutex<Recent>,
    /// Whether any subscriber was there at the latest tick.
    watching: AtomicBool,
    /// The shortest duration among this tick's kept slowest, once they are
    /// [`SLOWEST_PER_TICK`] (ns): shorter requests are not even locked for.
    slowest_floor: AtomicU64,
    channels: Vec<broadcast::Sender<Bytes>>,
    /// Set when the live view stops: every subscription ends.
    stopped: tokio::sync::watch::Sender<bool>,
    subscribers: AtomicUsize,
    /// Ticks taken and frames serialized, for tests and the bench's note.
    ticks: AtomicU64,
    frames: AtomicU64,
}

/// The live view's handle: started by the server when `ui.enabled`, stopped with it.
pub struct Live {
    shared: Arc<Shared>,
    tap: TapId,
    ticker: tokio::task::JoinHandle<()>,
}

impl Live {
    /// Switch on the registry of requests in flight and the request tap, and spawn the
    /// ticker on the current runtime, under `supervisor` (as `live_ticker`).
    pub fn start(sinks: Arc<Sinks>, supervisor: &Supervisor) -> Arc<Live> {
        sinks.in_flight.enable();
        let shared = Arc::new(Shared {
            metrics: sinks.metrics().clone(),
            sinks: sinks.clone(),
            ring: Mutex::default(),
            bounds: Mutex::default(),
            slowest: Mutex::default(),
            recent: Mutex::default(),
            watching: AtomicBool::new(false),
            slowest_floor: AtomicU64::new(0),
            channels: WINDOWS
                .iter()
                .map(|_| broadcast::channel(BACKLOG).0)
                .collect(),
            stopped: tokio::sync::watch::channel(false).0,
            subscribers: AtomicUsize::new(0),
            ticks: AtomicU64::new(0),
            frames: AtomicU64::new(0),
        });
        let tap = sinks.taps().add(Arc::new(Tap {
            shared: Arc::downgrade(&shared),
        }));
        let ticking = Arc::downgrade(&shared);
        let ticker = supervisor.spawn("live_ticker", move || {
            let ticking = ticking.clone();
            async move {
                let mut interval = tokio::time::interval(TICK);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    interval.tick().await;
                    let Some(shared) = ticking.upgrade() else {
                        return;
                    };
                    shared.tick(SystemTime::now(), Instant::now());
                }
            }
        });
        Arc::new(Live {
            shared,
            tap,
            ticker,
        })
    }

    /// The JSON snapshot: the figures over `window` seconds (one of [`WINDOWS`], else
    /// the default), the heatmaps of the last [`HEATMAP_TICKS`] ticks, the streams in
    /// flight and the slowest recent requests.
    pub fn snapshot(&self, window: Option<u64>) -> Bytes {
        let window = window_index(window);
        let frame = self.shared.frame(window, Instant::now(), true);
        Bytes::from(serde_json::to_vec(&frame).expect("plain data serializes"))
    }

    /// Subscribe to the SSE frames of `window`; `None` at [`MAX_SUBSCRIBERS`].
    pub fn subscribe(&self, window: Option<u64>) -> Option<Subscription> {
        let taken = self.shared.subscribers.fetch_add(1, Ordering::AcqRel);
        if taken >= MAX_SUBSCRIBERS {
            self.shared.subscribers.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let receiver = self.shared.channels[window_index(window)].subscribe();
        // Collect this second's finished requests for it already.
        self.shared.watching.store(true, Ordering::Relaxed);
        Some(Subscription {
            receiver,
            stopped: self.shared.stopped.subscribe(),
            shared: self.shared.clone(),
        })
    }

    /// Ticks taken and frames serialized so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.ticks.load(Ordering::Relaxed),
            self.shared.frames.load(Ordering::Relaxed),
        )
    }

    /// The ring's memory now, in bytes.
    pub fn ring_bytes(&self) -> usize {
        self.shared.lock_ring().bytes()
    }
}

impl Live {
    /// Stop: the ticker and the tap, and every subscription ends. The admin port's
    /// connections may still hold the handle; this does not wait for them to go.
    pub fn stop(&self) {
        self.ticker.abort();
        self.shared.sinks.taps().remove(self.tap);
        self.shared.stopped.send_replace(true);
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop();
    }
}

fn window_index(window: Option<u64>) -> usize {
    let window = window.unwrap_or(DEFAULT_WINDOW);
    WINDOWS
        .iter()
        .position(|&w| w == window)
        .or_else(|| WINDOWS.iter().position(|&w| w == DEFAULT_WINDOW))
        .unwrap_or(0)
}

/// One SSE subscriber: its frames, and its place among [`MAX_SUBSCRIBERS`].
pub struct Subscription {
    receiver: broadcast::Receiver<Bytes>,
    stopped: tokio::sync::watch::Receiver<bool>,
    shared: Arc<Shared>,
}

impl Subscription {
    /// The next frame's bytes; `None` when the subscriber fell more than [`BACKLOG`]
    /// frames behind (it is dropped) or the live view stopped.
    pub async fn next(&mut self) -> Option<Bytes> {
        if *self.stopped.borrow() {
            return None;
        }
        tokio::select! {
            frame = self.receiver.recv() => frame.ok(),
            _ = self.stopped.changed() => None,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The SSE bytes of one event.
fn sse_event(name: &str, json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + name.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    out
}

impl Shared {
    fn lock_ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tick(&self, now: SystemTime, instant: Instant) {
        let snapshot = self.metrics.snapshot_of(&window::FAMILIES);
        {
            let mut bounds = self.bounds.lock().unwrap_or_else(|e| e.into_inner());
            for family in &snapshot.families {
                if let Values::Histogram(series) = &family.values {
                    if let Some(first) = series.first() {
                        match &*family.name {
                            window::TTFT => bounds.ttft = first.value.bounds.clone(),
                            window::ITL => bounds.itl = first.value.bounds.clone(),
                            _ => {}
                        }
                    }
                }
            }
        }
        self.lock_ring().push(
            unix_ms(now),
            window::totals(&snapshot, self.metrics.objective_totals()),
        );
        let (finished, dropped) = {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            let slowest = std::mem::take(&mut recent.slowest);
            self.slowest_floor.store(0, Ordering::Relaxed);
            let mut kept = self.slowest.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() == SLOWEST_TICKS {
                kept.pop_front();
            }
            kept.push_back(slowest);
            (
                std::mem::take(&mut recent.feed),
                std::mem::take(&mut recent.dropped),
            )
        };
        self.ticks.fetch_add(1, Ordering::Relaxed);

        let watched: Vec<usize> = (0..WINDOWS.len())
            .filter(|&i| self.channels[i].receiver_count() > 0)
            .collect();
        self.watching.store(!watched.is_empty(), Ordering::Relaxed);
        if watched.is_empty() {
            return;
        }
        let requests = (!finished.is_empty() || dropped > 0).then(|| {
            let json = serde_json::to_vec(&RequestsEvent {
                requests: &finished,
                dropped,
            })
            .expect("plain data serializes");
            Bytes::from(sse_event("requests", &json))
        });
        for i in watched {
            let frame = self.frame(i, instant, false);
            let json = serde_json::to_vec(&frame).expect("plain data serializes");
            self.frames.fetch_add(1, Ordering::Relaxed);
            let _ = self.channels[i].send(Bytes::from(sse_event("tick", &json)));
            if let Some(requests) = &requests {
                let _ = self.channels[i].send(requests.clone());
            }
        }
    }

    /// The figures of window `index`, with the heatmaps when `full`.
    fn frame(&self, index: usize, now: Instant, full: bool) -> Frame {
        let window_s = WINDOWS[index];
        let ticks = (window_s * 1000 / TICK.as_millis() as u64) as usize;
        let bounds = self
            .bounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut streams = self.sinks.in_flight.views(now);
        let mut in_flight: std::collections::HashMap<&str, usize> = Default::default();
        for model in streams.iter().filter_map(|s| s.model.as_deref()) {
            *in_flight.entry(model).or_default() += 1;
        }
        let ring = self.lock_ring();
        let latest = ring.slots().back();
        let models = ring
            .window(ticks)
            .into_iter()
            .enumerate()
            .map(|(index, w)| {
                let column = latest
                    .and_then(|s| s.models.iter().find(|(i, _)| usize::from(*i) == index))
                    .map(|(_, t)| Column {
                        ttft: t.ttft.to_vec(),
                        itl: t.itl.to_vec(),
                    })
                    .unwrap_or_else(|| Column::zeros(&bounds));
                let in_flight = in_flight.get(&*w.model).copied().unwrap_or(0);
                ModelFigures::of(&w, &bounds, column, in_flight)
            })
            .collect::<Vec<_>>()
            .into();
        let heatmap = full.then(|| Heatmap::of(&ring, &bounds));
        let at_ms = ring.latest_ms().unwrap_or(0);
        let models_over_cap = ring.models_over_cap();
        let ring_bytes = full.then(|| ring.bytes());
        drop(ring);
        let total = streams.len();
        streams.sort_by_key(|s| std::cmp::Reverse(s.elapsed));
        streams.truncate(IN_FLIGHT_SHOWN);
        let slowest = {
            let kept = self.slowest.lock().unwrap_or_else(|e| e.into_inner());
            let mut all: Vec<&Finished> = kept.iter().flatten().collect();
            all.sort_by(|a, b| b.duration_s.total_cmp(&a.duration_s));
            all.into_iter().take(SLOWEST_SHOWN).cloned().collect()
        };
        Frame {
            at_ms,
            window_s,
            bounds,
            models,
            in_flight: InFlight {
                total,
                streams: streams
                    .iter()
                    .map(StreamFigures::of)
                    .collect::<Vec<_>>()
                    .into(),
            },
            models_over_cap,
            ring_bytes,
            heatmap,
            slowest,
        }
    }
}

#[derive(Serialize)]
struct RequestsEvent<'a> {
    requests: &'a [Finished],
    dropped: u64,
}

impl StreamFigures {
    fn of(view: &LiveStreamView) -> StreamFigures {
        let last = view.last_event.map(|d| d.as_secs_f64());
        StreamFigures {
            model: view.model.clone(),
            tenant: view.tenant.clone(),
            phase: Cow::Borrowed(view.phase.as_str()),
            elapsed_s: view.elapsed.as_secs_f64(),
            tokens: view.tokens,
            tokens_per_s: last.filter(|&s| s > 0.0).map(|s| view.tokens as f64 / s),
            largest_gap_s: view.largest_gap.map(|d| d.as_secs_f64()),
            since_last_event_s: last.map(|s| (view.elapsed.as_secs_f64() - s).max(0.0)),
        }
    }
}

impl Column {
    fn zeros(bounds: &Bounds) -> Column {
        Column {
            ttft: vec![0; bounds.ttft.len() + 1],
            itl: vec![0; bounds.itl.len() + 1],
        }
    }
}

impl Quantiles {
    fn of(buckets: &window::Buckets, bounds: &[f64]) -> Quantiles {
        let count = buckets.count();
        let q = |q| quantile(q, bounds, &buckets.counts);
        Quantiles {
            count,
            mean: (count > 0).then(|| buckets.sum / count as f64),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
        }
    }
}

impl Attainment {
    fn of(objective: &Arc<str>, [met, missed]: [u64; 2]) -> Attainment {
        Attainment {
            objective: objective.clone(),
            met,
            missed,
            attainment: Attainment::share(met, missed),
        }
    }
}

impl ModelFigures {
    fn of(w: &Windowed, bounds: &Bounds, column: Column, in_flight: usize) -> ModelFigures {
        let covered_s = w.ticks as f64 * TICK.as_secs_f64();
        let per_s = |n: u64| {
            if covered_s > 0.0 {
                n as f64 / covered_s
            } else {
                0.0
            }
        };
        let outcomes = Outcome::ALL
            .iter()
            .zip(w.requests)
            .map(|(o, n)| (Cow::Borrowed(o.as_str()), n))
            .collect();
        debug_assert_eq!(w.requests.len(), OUTCOMES);
        ModelFigures {
            model: w.model.clone(),
            covered_s,
            requests: w.request_count(),
            requests_per_s: per_s(w.request_count()),
            outcomes,
            output_tokens: w.output_tokens,
            tokens_per_s: per_s(w.output_tokens),
            in_flight,
            ttft: Quantiles::of(&w.ttft, &bounds.ttft),
            itl: Quantiles::of(&w.itl, &bounds.itl),
            column,
            objectives: Rows::from(
                w.objectives
                    .iter()
                    .map(|(name, &counts)| Attainment::of(name, counts))
                    .collect::<Vec<_>>(),
            ),
        }
    }
}

impl Heatmap {
    fn of(ring: &Ring, bounds: &Bounds) -> Heatmap {
        let slots = ring.slots();
        let skip = slots.len().saturating_sub(HEATMAP_TICKS);
        let at_ms = slots.iter().skip(skip).map(|s| s.at_ms).collect();
        let zeros = Column::zeros(bounds);
        let models = ring
            .models()
            .iter()
            .enumerate()
            .map(|(index, model)| {
                let mut columns = Columns {
                    ttft: Vec::new(),
                    itl: Vec::new(),
                };
                for slot in slots.iter().skip(skip) {
                    match slot.models.iter().find(|(i, _)| usize::from(*i) == index) {
                        Some((_, t)) => {
                            columns.ttft.push(t.ttft.to_vec());
                            columns.itl.push(t.itl.to_vec());
                        }
                        None => {
                            columns.ttft.push(zeros.ttft.clone());
                            columns.itl.push(zeros.itl.clone());
                        }
                    }
                }
                (model.clone(), columns)
            })
            .collect();
        Heatmap { at_ms, models }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervisor() -> Supervisor {
        Supervisor::new(metrics(), Arc::default())
    }

    fn metrics() -> Arc<Metrics> {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        Metrics::new(&config.metrics.buckets, &config.labels)
    }

    fn tick(live: &Live) {
        live.shared.tick(SystemTime::now(), Instant::now());
    }

    #[tokio::test]
    async fn many_viewers_of_a_window_cost_one_frame_per_tick() {
        let live = Live::start(Sinks::new(metrics()), &supervisor());
        live.ticker.abort();
        tick(&live);
        // Nobody watches: the ring ticks, no frame is built.
        assert_eq!(live.counts(), (1, 0));
        let mut viewers: Vec<Subscription> = (0..5)
            .map(|_| live.subscribe(Some(60)).expect("room"))
            .collect();
        tick(&live);
        assert_eq!(live.counts(), (2, 1), "one frame for five viewers");
        for viewer in &mut viewers {
            let frame = viewer.next().await.expect("a frame");
            assert!(frame.starts_with(b"event: tick\ndata: {"));
        }
        // A second window watched: a second frame per tick, no more.
        let _other = live.subscribe(Some(10)).expect("room");
        tick(&live);
        assert_eq!(live.counts(), (3, 3));
        // At most MAX_SUBSCRIBERS; a place frees when a viewer leaves.
        let mut more: Vec<Subscription> = (0..2).map(|_| live.subscribe(None).unwrap()).collect();
        assert!(live.subscribe(None).is_none());
        more.pop();
        assert!(live.subscribe(None).is_some());
    }

    #[tokio::test]
    async fn a_viewer_that_falls_behind_is_dropped() {
        let live = Live::start(Sinks::new(metrics()), &supervisor());
        live.ticker.abort();
        let mut slow = live.subscribe(None).expect("room");
        for _ in 0..BACKLOG + 2 {
            tick(&live);
        }
        assert!(slow.next().await.is_none(), "dropped, not buffered");
    }

    #[tokio::test]
    async fn switched_on_it_lists_streams_and_keeps_the_slowest() {
        let sinks = Sinks::new(metrics());
        let live = Live::start(sinks.clone(), &supervisor());
        live.ticker.abort();
        assert!(sinks.in_flight.is_enabled());
        let t0 = Instant::now();
        let entry = sinks
            .in_flight
            .register(None, Arc::from("t"), t0)
            .expect("on");
        let snapshot: serde_json::Value =
            serde_json::from_slice(&live.snapshot(None)).expect("JSON");
        let listed = &snapshot["in_flight"]["streams"][0];
        assert_eq!(listed["phase"], "waiting_head");
        assert_eq!(listed["model"], serde_json::Value::Null);
        assert_eq!(listed["tokens"], 0);
        assert_eq!(listed["tokens_per_s"], serde_json::Value::Null);
        entry.stream().model_or_init(|| Arc::from("m"));
        entry.stream().response_head(t0 + Duration::from_millis(2));
        entry.stream().event(t0 + Duration::from_millis(5), 3, None);
        let snapshot: serde_json::Value =
            serde_json::from_slice(&live.snapshot(None)).expect("JSON");
        assert_eq!(snapshot["in_flight"]["total"], 1);
        let listed = &snapshot["in_flight"]["streams"][0];
        assert_eq!(listed["tokens"], 3);
        assert_eq!(listed["phase"], "streaming");
        assert_eq!(listed["model"], "m");
        drop(entry);
        // Dropping the live view removes its tap and ends its subscriptions.
        let mut viewer = live.subscribe(None).expect("room");
        assert!(sinks.taps().any());
        drop(live);
        assert!(!sinks.taps().any());
        assert!(viewer.next().await.is_none());
    }
}
