//! The streams in flight right now, one by one, for the live view (`live`): which model
//! and tenant, when it started, its tokens so far and its largest gap so far.
//!
//! Off unless the live view switches it on ([`LiveStreams::enable`]); then the recorder
//! registers each measured stream once (a lock on one of [`SHARDS`] shards, picked by a
//! counter, so concurrent registrations on different workers rarely meet) and updates it
//! per event with relaxed atomics on the stream's own [`LiveStream`]: no lock and no
//! shared line per event. The entry leaves the registry when the request is recorded (its
//! [`LiveEntry`] is dropped). Like the rest of `metrics`, it takes plain values: instants
//! and counts, whoever measured them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Registry shards: enough that the workers (one per CPU) seldom share one.
pub const SHARDS: usize = 16;

/// One stream in flight, as the recorder updates it.
#[derive(Debug)]
pub struct LiveStream {
    pub model: Arc<str>,
    pub tenant: Arc<str>,
    /// When the request head was received (`t_req`).
    pub started: Instant,
    tokens: AtomicU64,
    /// Nanoseconds from `started` to the latest token-bearing event (0: none yet).
    last_event_ns: AtomicU64,
    /// The longest gap between consecutive token-bearing events, in nanoseconds.
    largest_gap_ns: AtomicU64,
}

impl LiveStream {
    /// A token-bearing event at `at` with `tokens` tokens, `gap` after the previous one
    /// (none for the first).
    pub fn event(&self, at: Instant, tokens: u64, gap: Option<Duration>) {
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        let since = at.saturating_duration_since(self.started).as_nanos() as u64;
        self.last_event_ns.store(since.max(1), Ordering::Relaxed);
        if let Some(gap) = gap {
            self.largest_gap_ns
                .fetch_max(gap.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// What the stream has come to at `now`.
    pub fn view(&self, now: Instant) -> LiveStreamView {
        let nanos = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        let last = self.last_event_ns.load(Ordering::Relaxed);
        LiveStreamView {
            model: self.model.clone(),
            tenant: self.tenant.clone(),
            elapsed: now.saturating_duration_since(self.started),
            tokens: self.tokens.load(Ordering::Relaxed),
            last_event: (last > 0).then(|| Duration::from_nanos(last)),
            largest_gap: Some(nanos(&self.largest_gap_ns)).filter(|gap| !gap.is_zero()),
        }
    }
}

/// A stream in flight as read at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveStreamView {
    pub model: Arc<str>,
    pub tenant: Arc<str>,
    /// From `t_req` to the reading.
    pub elapsed: Duration,
    pub tokens: u64,
    /// From `t_req` to the latest token-bearing event, if any came.
    pub last_event: Option<Duration>,
    pub largest_gap: Option<Duration>,
}

#[derive(Default)]
struct Shard(Mutex<HashMap<u64, Arc<LiveStream>>>);

/// The registry of streams in flight; see the module docs.
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

    /// Register a stream, if the registry is on; it stays listed until the entry drops.
    pub fn register(
        self: &Arc<Self>,
        model: Arc<str>,
        tenant: Arc<str>,
        started: Instant,
    ) -> Option<LiveEntry> {
        if !self.is_enabled() {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(LiveStream {
            model,
            tenant,
            started,
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

    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, Arc<LiveStream>>> {
        &self.shards[(id % SHARDS as u64) as usize].0
    }

    /// Every stream in flight, as read at `now`.
    pub fn views(&self, now: Instant) -> Vec<LiveStreamView> {
        let mut views = Vec::new();
        for shard in self.shards.iter() {
            let streams = shard.0.lock().unwrap_or_else(|e| e.into_inner());
            views.extend(streams.values().map(|s| s.view(now)));
        }
        views
    }

    /// How many streams are listed.
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

/// A registered stream: updated through [`LiveEntry::stream`], unlisted on drop.
pub struct LiveEntry {
    registry: Arc<LiveStreams>,
    id: u64,
    stream: Arc<LiveStream>,
}

impl LiveEntry {
    pub fn stream(&self) -> &LiveStream {
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
    fn streams_are_listed_while_their_entry_lives() {
        let registry = Arc::new(LiveStreams::default());
        let t0 = Instant::now();
        assert!(registry
            .register(Arc::from("m"), Arc::from("t"), t0)
            .is_none());
        registry.enable();
        let entry = registry
            .register(Arc::from("m"), Arc::from("t"), t0)
            .expect("on");
        let other = registry
            .register(Arc::from("n"), Arc::from("u"), t0)
            .expect("on");
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
        assert_eq!(view.tokens, 6);
        assert_eq!(view.elapsed, Duration::from_secs(1));
        assert_eq!(view.last_event, Some(Duration::from_millis(450)));
        assert_eq!(view.largest_gap, Some(Duration::from_millis(300)));
        assert_eq!(registry.len(), 2);
        drop(other);
        let views = registry.views(t0);
        assert_eq!(views.len(), 1);
        assert_eq!(&*views[0].model, "m");
        drop(entry);
        assert!(registry.is_empty());
    }
}
