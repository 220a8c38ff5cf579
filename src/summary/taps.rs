//! [`Taps`]: the sinks registered while their owner runs (the live view), each handed
//! every request's summary on the thread that ended the request, so each must return at
//! once: copy what it needs, queue it, or drop it when its queue is full.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::request::RequestSummary;

/// A consumer of [`RequestSummary`]s. `finished` runs in the request path: it must not
/// block, and a panic in it is caught as an observer panic.
pub trait Sink: Send + Sync {
    fn finished(&self, request: &RequestSummary);
}

/// Identifies a registered tap, to remove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapId(u64);

/// The registered taps. Reading them costs one atomic load while there are none.
#[derive(Default)]
pub struct Taps {
    count: AtomicUsize,
    next_id: AtomicU64,
    taps: RwLock<Vec<(TapId, Arc<dyn Sink>)>>,
}

impl Taps {
    pub fn add(&self, tap: Arc<dyn Sink>) -> TapId {
        let id = TapId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut taps = self.taps.write().unwrap_or_else(|e| e.into_inner());
        taps.push((id, tap));
        self.count.store(taps.len(), Ordering::Release);
        id
    }

    pub fn remove(&self, id: TapId) {
        let mut taps = self.taps.write().unwrap_or_else(|e| e.into_inner());
        taps.retain(|(tap_id, _)| *tap_id != id);
        self.count.store(taps.len(), Ordering::Release);
    }

    /// Whether any tap listens.
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// Hand `request` to every tap.
    pub fn finished(&self, request: &RequestSummary) {
        let taps = self.taps.read().unwrap_or_else(|e| e.into_inner());
        for (_, tap) in taps.iter() {
            tap.finished(request);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A sink that keeps the model of each request it hears (the sinks' tests share it).
    #[derive(Default)]
    pub(in crate::summary) struct Models(pub(in crate::summary) Mutex<Vec<String>>);

    impl Sink for Models {
        fn finished(&self, request: &RequestSummary) {
            self.0.lock().unwrap().push(request.model.to_string());
        }
    }

    #[test]
    fn taps_hear_each_request_until_removed() {
        let taps = Taps::default();
        assert!(!taps.any());
        let first = Arc::new(Models::default());
        let second = Arc::new(Models::default());
        let first_id = taps.add(first.clone());
        taps.add(second.clone());
        assert!(taps.any());
        taps.finished(&super::super::request::example("a"));
        taps.remove(first_id);
        taps.finished(&super::super::request::example("b"));
        assert_eq!(*first.0.lock().unwrap(), ["a"]);
        assert_eq!(*second.0.lock().unwrap(), ["a", "b"]);
    }
}
