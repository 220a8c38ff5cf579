//! The threads that serve proxy connections: one single-threaded tokio runtime per CPU.
//!
//! On a work-stealing runtime a streamed event often wakes a second worker thread: the
//! task that relays a stream reschedules itself, and a rescheduled task notifies an idle
//! worker. At the rates a sidecar sees, that thread wake-up costs more than relaying the
//! event (measured in `docs/PERFORMANCE.md`: one worker spent 18-27% less CPU per event
//! than two). Here each accepted connection is handed to one worker and lives there: its
//! client side, its upstream connections (kept idle per worker thread, see
//! [`idle_pool`](crate::idle_pool)) and its timers, so an event is read, measured and
//! written on one thread. More workers still use more cores, as
//! nginx's worker processes do.
//!
//! Connections go to the worker serving the fewest, since SSE streams are long-lived and
//! a round-robin would leave one worker with the streams that happened to last.
//!
//! A worker thread knows which worker it is ([`this_worker`](crate::worker_slot::this_worker)),
//! so that what is bounded for the whole process can be split over the workers without a
//! shared counter (the idle upstream connections of [`idle_pool`](crate::idle_pool)).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::worker_slot::WorkerSlot;

/// How long a stopping worker waits for blocking work (a DNS lookup) before it lets go.
const STOP_GRACE: Duration = Duration::from_secs(1);

type Job = Box<dyn FnOnce(Occupancy) + Send>;

/// The connection-serving threads of one server.
pub struct Workers {
    workers: Vec<Worker>,
}

struct Worker {
    jobs: mpsc::UnboundedSender<Job>,
    /// Connections this worker is serving.
    connections: Arc<AtomicUsize>,
    stop: oneshot::Sender<()>,
    stopped: oneshot::Receiver<()>,
}

/// Counts one connection against its worker until dropped.
struct Occupancy(Arc<AtomicUsize>);

impl Drop for Occupancy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// A connection's future with its count, and the memory its next poll wants first,
    /// fetched as that poll starts (`prefetch::TaskLines`). (Not an `async` block: one
    /// that awaits a captured future keeps room for it twice, and connections are the
    /// largest tasks.)
    struct Occupied<F> {
        #[pin]
        connection: F,
        _occupancy: Occupancy,
        lines: crate::prefetch::TaskLines,
    }
}

impl<F: Future<Output = ()>> Future for Occupied<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let connection = this.connection;
        this.lines.around(|| connection.poll(cx))
    }
}

impl Workers {
    /// Start `count` worker threads (at least one).
    pub fn start(count: usize) -> std::io::Result<Workers> {
        let count = count.max(1);
        let workers = (0..count)
            .map(|index| Worker::start(WorkerSlot { index, count }))
            .collect::<std::io::Result<_>>()?;
        Ok(Workers { workers })
    }

    /// The number of workers to start: `TOKIO_WORKER_THREADS` if set, else the CPUs this
    /// process may use (which follows a container's CPU limit).
    pub fn default_count() -> usize {
        let per_cpu = std::thread::available_parallelism().map_or(1, Into::into);
        match std::env::var("TOKIO_WORKER_THREADS") {
            Err(_) => per_cpu,
            Ok(value) => match value.trim().parse::<usize>() {
                Ok(count) if count > 0 => count,
                _ => {
                    tracing::warn!(
                        TOKIO_WORKER_THREADS = %value,
                        workers = per_cpu,
                        "TOKIO_WORKER_THREADS is not a positive whole number; using one worker per CPU"
                    );
                    per_cpu
                }
            },
        }
    }

    /// How many workers there are.
    pub fn count(&self) -> usize {
        self.workers.len()
    }

    /// Serve a connection on the least busy worker, where it counts as one of the
    /// worker's connections until it ends. `serve` is called on that worker's thread,
    /// inside its runtime (so that is where sockets get registered), and the future it
    /// returns is spawned there: only `serve`'s captures cross threads, not the future,
    /// which is allocated once, where it runs.
    pub fn dispatch<F, Fut>(&self, serve: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let worker = self
            .workers
            .iter()
            .min_by_key(|worker| worker.connections.load(Ordering::Relaxed))
            .expect("at least one worker");
        worker.connections.fetch_add(1, Ordering::Relaxed);
        let job: Job = Box::new(move |occupancy| {
            // Boxed: a connection's future is tens of KiB (the whole exchange's state), and
            // a task's future is moved several times as it is spawned and each time its
            // stage changes; the box moves as a pointer.
            let task = Occupied {
                connection: Box::pin(serve()),
                _occupancy: occupancy,
                lines: Default::default(),
            };
            tokio::spawn(task);
        });
        if worker.jobs.send(job).is_err() {
            // The worker has stopped, which happens only while the server shuts down; the
            // job came back and was dropped, which closed the connection.
            worker.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Stop every worker and wait until each has dropped what it was still serving, so
    /// that streams cut here are counted (as cancelled) before this returns.
    pub async fn stop(self) {
        let mut stopped = Vec::with_capacity(self.workers.len());
        for worker in self.workers {
            let _ = worker.stop.send(());
            stopped.push(worker.stopped);
        }
        for worker in stopped {
            let _ = worker.await;
        }
    }
}

impl Worker {
    fn start(slot: WorkerSlot) -> std::io::Result<Worker> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let (stop, stop_requested) = oneshot::channel::<()>();
        let (stopped_tx, stopped) = oneshot::channel::<()>();
        let connections = Arc::new(AtomicUsize::new(0));
        let occupancy = connections.clone();
        std::thread::Builder::new()
            .name(format!("tokentap-worker-{}", slot.index))
            .spawn(move || {
                slot.enter();
                runtime.block_on(async move {
                    let serve = async {
                        while let Some(job) = queue.recv().await {
                            job(Occupancy(occupancy.clone()));
                        }
                        std::future::pending::<()>().await
                    };
                    // A dropped `Workers` (the server's future dropped) also stops it.
                    tokio::select! {
                        _ = stop_requested => {}
                        () = serve => {}
                    }
                });
                // Drops every connection still open here, which records each stream.
                runtime.shutdown_timeout(STOP_GRACE);
                let _ = stopped_tx.send(());
            })?;
        Ok(Worker {
            jobs,
            connections,
            stop,
            stopped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker_slot::this_worker;

    #[tokio::test]
    async fn connections_go_to_the_least_busy_worker() {
        let workers = Workers::start(2).unwrap();
        let (release, hold) = tokio::sync::watch::channel(false);
        let (started_tx, mut started) = mpsc::unbounded_channel();
        for _ in 0..4 {
            let mut hold = hold.clone();
            let started_tx = started_tx.clone();
            workers.dispatch(move || async move {
                let _ = started_tx.send(std::thread::current().name().map(String::from));
                let _ = hold.wait_for(|released| *released).await;
            });
        }
        let mut threads = Vec::new();
        for _ in 0..4 {
            threads.push(started.recv().await.unwrap().unwrap());
        }
        threads.sort();
        assert_eq!(
            threads,
            [
                "tokentap-worker-0",
                "tokentap-worker-0",
                "tokentap-worker-1",
                "tokentap-worker-1"
            ]
        );
        release.send(true).unwrap();
        workers.stop().await;
    }

    #[tokio::test]
    async fn a_worker_thread_knows_which_worker_it_is() {
        assert_eq!(this_worker(), None);
        let workers = Workers::start(2).unwrap();
        let (release, hold) = tokio::sync::watch::channel(false);
        let (slot_tx, mut slots) = mpsc::unbounded_channel();
        for _ in 0..2 {
            let mut hold = hold.clone();
            let slot_tx = slot_tx.clone();
            workers.dispatch(move || async move {
                let _ = slot_tx.send(this_worker());
                let _ = hold.wait_for(|released| *released).await;
            });
        }
        let mut seen = vec![slots.recv().await.unwrap(), slots.recv().await.unwrap()];
        seen.sort_by_key(|slot| slot.map(|slot| slot.index));
        assert_eq!(
            seen,
            [
                Some(WorkerSlot { index: 0, count: 2 }),
                Some(WorkerSlot { index: 1, count: 2 })
            ]
        );
        release.send(true).unwrap();
        workers.stop().await;
    }

    #[tokio::test]
    async fn stop_drops_what_workers_still_serve() {
        struct Recorded(Arc<AtomicUsize>);
        impl Drop for Recorded {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let workers = Workers::start(2).unwrap();
        let dropped = Arc::new(AtomicUsize::new(0));
        let (started_tx, mut started) = mpsc::unbounded_channel();
        for _ in 0..3 {
            let recorded = Recorded(dropped.clone());
            let started_tx = started_tx.clone();
            workers.dispatch(move || async move {
                let _recorded = recorded;
                let _ = started_tx.send(());
                std::future::pending::<()>().await;
            });
        }
        for _ in 0..3 {
            started.recv().await.unwrap();
        }
        workers.stop().await;
        assert_eq!(dropped.load(Ordering::SeqCst), 3);
    }
}
