//! SQLite: the thread that runs the hot write transactions (starting, checkpointing, journalling and
//! finishing runs), on a single-threaded tokio runtime of its own.
//!
//! sqlx executes every SQLite statement on a thread per connection: the statement goes there over a
//! channel and its answer wakes the task that sent it. A task on the main runtime waits for that
//! wake-up behind whatever the busy workers are polling (64 runs' model rounds, JSON and protobuf),
//! and it holds the write slot all the while: #32's profile found a write transaction of five
//! statements holding the slot ~0.9 ms, almost all of it waiting to be polled again, so the one
//! writer of the file, not the CPUs, set the rate of runs. Here the transaction runs on a thread that
//! does nothing else: each statement's answer finds it idle and it goes straight on with the next.
//!
//! On a database file the transaction's statements also execute on this thread, synchronously, on a
//! connection of its own (see `direct`): no hand-off per statement at all. The write slot is the same
//! one the other write transactions (`Store::tx`, on the pool's writer connection) take, so the two
//! kinds exclude each other as before.

use std::future::Future;
use std::thread::JoinHandle;

use tokio::runtime::{Builder, Handle};
use tokio_util::sync::CancellationToken;

/// The writer thread: its runtime's handle, and how to stop it.
#[derive(Debug)]
pub struct WriterThread {
    handle: Handle,
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl WriterThread {
    /// Starts the thread (named `antler-runs-writer`).
    pub fn start() -> std::io::Result<Self> {
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let thread = std::thread::Builder::new().name("antler-runs-writer".to_owned()).spawn(move || {
            runtime.block_on(stopped.cancelled());
            // Transactions still in flight are dropped (rolled back) with the runtime; their callers
            // get an error, as from a connection that went away.
        })?;
        Ok(Self { handle, stop, thread: Some(thread) })
    }

    /// Runs `task` on the writer thread and waits for its result. An error only when the thread has
    /// stopped (the store is being dropped) or the task panicked.
    pub async fn run<T: Send + 'static>(&self, task: impl Future<Output = T> + Send + 'static) -> Result<T, tokio::task::JoinError> {
        self.handle.spawn(task).await
    }

    /// Starts `task` on the writer thread without waiting for it (it reports through channels of
    /// its own; it is dropped if the thread stops first).
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        drop(self.handle.spawn(task));
    }
}

impl Drop for WriterThread {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            // The last store handle may be dropped on the writer thread itself (inside a task it
            // runs); joining there would wait for ever.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_on_the_writer_thread_and_it_stops_when_dropped() {
        let writer = WriterThread::start().expect("writer thread");
        let name = writer.run(async { std::thread::current().name().map(str::to_owned) }).await.expect("ran");
        assert_eq!(name.as_deref(), Some("antler-runs-writer"));
        drop(writer);
    }
}
