//! The requests in flight right now, one by one, for the live view (`live`): which model
//! and tenant, when it started, what it waits for (its [`Phase`]), its tokens so far and
//! its largest gap so far.
//!
//! Off unless the live view switches it on ([`LiveStreams::enable`]); then each measured
//! request is registered once, when its observation starts at the request head
//! (`observe::start`, which the exchange policy calls for either transport): a lock on
//! one of [`SHARDS`] shards, picked by a counter, so concurrent registrations on different
//! workers rarely meet. Its response head and its token-bearing events are noted by its
//! recorder, the one writer, with relaxed loads and stores on the request's own
//! [`LiveStream`]: no lock, no locked instruction and no shared line per event. The entry
//! leaves the registry when the request is recorded, however it ends (its [`LiveEntry`]
//! is dropped).
//!
//! The tenant label is known at registration (the head says it); the model label is set
//! once, when the request body names the model, or, for a request that names none, when
//! its series are resolved (its first token, or its end). Like the rest of `metrics`, it
//! takes plain values: instants, counts and label values, whoever measured them.

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(clippy::indexing_slicing)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Registry shards: enough that the workers (one per CPU) seldom share one.
pub const SHARDS: usize = 16;

/// What a request in flight is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The upstream's response head.
    Head,
    /// The first token: the head came, no token-bearing event yet.
    FirstToken,
    /// Tokens are arriving.
    Streaming,
}

impl Phase {
    /// The name the live API gives the phase.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Head => "waiting_head",
            Phase::FirstToken => "waiting_first_token",
            Phase::Streaming => "streaming",
        }
    }
}

/// One request in flight, as its recorder updates it.
#[derive(Debug)]
pub struct LiveStream {
    /// The model label, once known (see the module docs).
    model: OnceLock<Arc<str>>,
    pub tenant: Arc<str>,
    /// When the request head was received (`t_req`).
    pub started: Instant,
    /// Nanoseconds from `started` to the response head (0: none yet).
    head_ns: AtomicU64,
    tokens: AtomicU64,
    /// Nanoseconds from `started` to the latest token-bearing event (0: none yet).
    last_event_ns: AtomicU64,
    /// The longest gap between consecutive token-bearing events, in nanoseconds.
    largest_gap_ns: AtomicU64,
}

impl LiveStream {
    /// The model label, if it is known yet.
    pub fn model(&self) -> Option<&Arc<str>> {
        self.model.get()
    }

    /// The model label, set by `label` if nobody has set it yet: whoever comes first
    /// resolves it, once.
    pub fn model_or_init(&self, label: impl FnOnce() -> Arc<str>) -> &Arc<str> {
        self.model.get_or_init(label)
    }

    /// The upstream's response head arrived at `at`.
    pub fn response_head(&self, at: Instant) {
        let since = at.saturating_duration_since(self.started).as_nanos() as u64;
        self.head_ns.store(since.max(1), Ordering::Relaxed);
    }

    /// A token-bearing event at `at` with `tokens` tokens, `gap` after the previous one
    /// (none for the first).
    ///
    /// The request's recorder is the one writer, so the counters are loaded and stored,
    /// not updated by read-modify-write: that would be a locked instruction per counter
    /// per event, guarding against a second writer there is not.
    pub fn event(&self, at: Instant, tokens: u64, gap: Option<Duration>) {
        let total = self.tokens.load(Ordering::Relaxed).saturating_add(tokens);
        self.tokens.store(total, Ordering::Relaxed);
        // Casts, not saturating conversions: these are this process's own clock readings
        // (a cast wraps only past 584 years), and a saturating one cost ~30 instructions
        // per event in the recorder it inlines into (budget.sh, 2026-12-06).
        let since = at.saturating_duration_since(self.started).as_nanos() as u64;
        self.last_event_ns.store(since.max(1), Ordering::Relaxed);
        if let Some(gap) = gap {
            let gap = gap.as_nanos() as u64;
            if gap > self.largest_gap_ns.load(Ordering::Relaxed) {
                self.largest_gap_ns.store(gap, Ordering::Relaxed);
            }
        }
    }

    /// What the request has come to at `now`.
    pub fn view(&self, now: Instant) -> LiveStreamView {
        let nanos = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        let last = self.last_event_ns.load(Ordering::Relaxed);
        let phase = if last > 0 {
            Phase::Streaming
        } else if self.head_ns.load(Ordering::Relaxed) > 0 {
            Phase::FirstToken
        } else {
            Phase::Head
        };
        LiveStreamView {
            model: self.model.get().cloned(),
            tenant: self.tenant.clone(),
            phase,
            elapsed: now.saturating_duration_since(self.started),
            tokens: self.tokens.load(Ordering::Relaxed),
            last_event: (last > 0).then(|| Duration::from_nanos(last)),
            largest_gap: Some(nanos(&self.largest_gap_ns)).filter(|gap| !gap.is_zero()),
        }
    }
}

/// A request in flight as read at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveStreamView {
    /// The model label; `None` until it is known.
    pub model: Option<Arc<str>>,
    pub tenant: Arc<str>,
    pub phase: Phase,
    /// From `t_req` to the reading.
    pub elapsed: Duration,
    pub tokens: u64,
    /// From `t_req` to the latest token-bearing event, if any came.
    pub last_event: Option<Duration>,
    pub largest_gap: Option<Duration>,
}

#[derive(Default)]
struct Shard(Mutex<HashMap<u64, Arc<LiveStream>>>);

/// The registry of requests in flight; see the module docs.
pub struct LiveStreams {
    enabled: AtomicBool,
    next: AtomicU64,
    shards: Box<[Shard]>,
}

impl Default for LiveStreams {
    fn default() -> LiveStreams {
        LiveStreams {
            enabled: AtomicBool::new(false),
            next: AtomicU64::new(0),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl LiveStreams {
    /// Start registering streams (the live view is on).
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Register a request whose head was received at `started`, if the registry is on;
    /// it stays listed until the entry drops. `model`: its label, if known already.
    pub fn register(
        self: &Arc<Self>,
        model: Option<Arc<str>>,
        tenant: Arc<str>,
        started: Instant,
    ) -> Option<LiveEntry> {
        if !self.is_enabled() {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(LiveStream {
            model: model.map(OnceLock::from).unwrap_or_default(),
            tenant,
            started,
            head_ns: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            last_event_ns: AtomicU64::new(0),
            largest_gap_ns: AtomicU64::new(0),
        });
        self.shard(id)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, stream.clone());
        Some(LiveEntry {
            registry: self.clone(),
            id,
            stream,
        })
    }

    #[allow(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        reason = "a remainder by the shard count (a constant, not 0) indexes the shards"
    )]
    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, Arc<LiveStream>>> {
        &self.shards[(id % SHARDS as u64) as usize].0
    }

    /// Every request in flight, as read at `now`.
    pub fn views(&self, now: Instant) -> Vec<LiveStreamView> {
        let mut views = Vec::new();
        for shard in self.shards.iter() {
            let streams = shard.0.lock().unwrap_or_else(|e| e.into_inner());
            views.extend(streams.values().map(|s| s.view(now)));
        }
        views
    }

    /// How many requests are listed.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.0.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registered request: updated through [`LiveEntry::stream`], unlisted on drop.
pub struct LiveEntry {
    registry: Arc<LiveStreams>,
    id: u64,
    stream: Arc<LiveStream>,
}

impl LiveEntry {
    pub fn stream(&self) -> &Arc<LiveStream> {
        &self.stream
    }
}

impl Drop for LiveEntry {
    fn drop(&mut self) {
        self.registry
            .shard(self.id)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_listed_while_their_entry_lives() {
        let registry = Arc::new(LiveStreams::default());
        let t0 = Instant::now();
        assert!(registry.register(None, Arc::from("t"), t0).is_none());
        registry.enable();
        let entry = registry.register(None, Arc::from("t"), t0).expect("on");
        let other = registry
            .register(Some(Arc::from("n")), Arc::from("u"), t0)
            .expect("on");
        let waiting = entry.stream().view(t0 + Duration::from_millis(50));
        assert_eq!(waiting.phase, Phase::Head);
        assert_eq!(waiting.model, None);
        assert_eq!(waiting.elapsed, Duration::from_millis(50));
        assert_eq!((waiting.tokens, waiting.last_event), (0, None));
        assert_eq!(waiting.largest_gap, None);
        // The first to set the model label wins.
        assert_eq!(&**entry.stream().model_or_init(|| Arc::from("m")), "m");
        assert_eq!(&**entry.stream().model_or_init(|| Arc::from("x")), "m");
        entry.stream().response_head(t0 + Duration::from_millis(60));
        let head = entry.stream().view(t0 + Duration::from_millis(80));
        assert_eq!(head.phase, Phase::FirstToken);
        assert_eq!(head.tokens, 0);
        entry
            .stream()
            .event(t0 + Duration::from_millis(100), 1, None);
        entry.stream().event(
            t0 + Duration::from_millis(400),
            3,
            Some(Duration::from_millis(300)),
        );
        entry.stream().event(
            t0 + Duration::from_millis(450),
            2,
            Some(Duration::from_millis(50)),
        );
        let view = entry.stream().view(t0 + Duration::from_secs(1));
        assert_eq!(view.phase, Phase::Streaming);
        assert_eq!(view.model.as_deref(), Some("m"));
        assert_eq!(view.tokens, 6);
        assert_eq!(view.elapsed, Duration::from_secs(1));
        assert_eq!(view.last_event, Some(Duration::from_millis(450)));
        assert_eq!(view.largest_gap, Some(Duration::from_millis(300)));
        assert_eq!(registry.len(), 2);
        drop(other);
        let views = registry.views(t0);
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].model.as_deref(), Some("m"));
        drop(entry);
        assert!(registry.is_empty());
    }
}
