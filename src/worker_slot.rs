//! Which of the server's workers the calling thread is.
//!
//! The server's workers ([`server`](crate::server)'s `workers.rs`: one thread and one
//! current-thread runtime each) set it when they start; what is bounded for the whole
//! process reads it to split the bound over the workers without a shared counter (the
//! idle upstream connections of [`idle_pool`](crate::idle_pool)). A leaf, so that a reader
//! below the server need not import the server to learn which worker it runs on.

use std::cell::Cell;

/// Which of a server's workers a thread is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerSlot {
    /// From 0.
    pub index: usize,
    /// The server's workers.
    pub count: usize,
}

thread_local! {
    static THIS_WORKER: Cell<Option<WorkerSlot>> = const { Cell::new(None) };
}

/// The worker the calling thread is, or `None` on any other thread.
pub fn this_worker() -> Option<WorkerSlot> {
    THIS_WORKER.with(Cell::get)
}

impl WorkerSlot {
    /// Make the calling thread this worker, for the rest of its life: called once by a
    /// worker thread as it starts.
    pub(crate) fn enter(self) {
        THIS_WORKER.with(|this| this.set(Some(self)));
    }
}
