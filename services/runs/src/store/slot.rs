//! The SQLite write slot: one write transaction at a time in this process, with the run lifecycle
//! (starting, renewing, checkpointing, finishing, cancelling runs) served before admissions.
//!
//! A plain FIFO mutex let an admission flood starve the workers: every start and every finish waited
//! behind all the admissions queued before it, so runs were admitted far faster than they could run.
//! Here a lifecycle writer waiting for the slot always goes first, except that after
//! [`LIFECYCLE_STREAK`] lifecycle grants in a row an admission batch gets one turn, so admissions are
//! slowed by the workers' writes but never stopped by them. Admissions arrive as batches (see
//! `lifecycle::admitter`), so one turn admits many runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Who is asking for the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Writes of runs that were admitted already: they turn PENDING runs into finished ones.
    Lifecycle,
    /// Admissions of new runs.
    Admission,
}

/// Lifecycle grants in a row before a waiting admission gets the slot.
pub const LIFECYCLE_STREAK: u32 = 8;

/// A wait for the slot longer than this is logged (a write transaction takes milliseconds).
const SLOW_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    held: bool,
    lifecycle: VecDeque<oneshot::Sender<SlotGuard>>,
    admission: VecDeque<oneshot::Sender<SlotGuard>>,
    streak: u32,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct WriteSlot {
    state: Mutex<State>,
    /// Times the slot was granted: the WAL checkpointer's measure of whether anyone wrote lately.
    grants: AtomicU64,
}

/// Holds the slot; dropping it hands the slot to the next waiter.
#[derive(Debug)]
pub struct SlotGuard {
    slot: Option<Arc<WriteSlot>>,
}

impl WriteSlot {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the slot. Cancel-safe: a waiter dropped before or after being handed the slot passes
    /// it on.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> SlotGuard {
        let waiting = {
            let mut state = self.state();
            if !state.held {
                state.held = true;
                self.grants.fetch_add(1, Ordering::Relaxed);
                state.streak = if priority == Priority::Lifecycle { state.streak + 1 } else { 0 };
                return SlotGuard { slot: Some(self.clone()) };
            }
            let (tx, rx) = oneshot::channel();
            match priority {
                Priority::Lifecycle => state.lifecycle.push_back(tx),
                Priority::Admission => state.admission.push_back(tx),
            }
            rx
        };
        let since = std::time::Instant::now();
        match waiting.await {
            Ok(guard) => {
                // A writer holding the slot while it waits for something that needs the slot stalls
                // every writer of the process; this line names the waiter when that happens.
                let waited = since.elapsed();
                if waited > SLOW_WAIT {
                    tracing::warn!(?priority, waited_ms = waited.as_millis() as u64, "waited long for the SQLite write slot");
                }
                guard
            }
            // The slot never drops a sender it holds without sending, so this cannot happen; taking
            // the slot anyway would break mutual exclusion, so wait for it again instead.
            Err(_) => Box::pin(self.acquire(priority)).await,
        }
    }

    /// The slot if it is free and nobody waits for it; never waits.
    pub fn try_acquire(self: &Arc<Self>) -> Option<SlotGuard> {
        let mut state = self.state();
        if state.held || !state.lifecycle.is_empty() || !state.admission.is_empty() {
            return None;
        }
        state.held = true;
        self.grants.fetch_add(1, Ordering::Relaxed);
        Some(SlotGuard { slot: Some(self.clone()) })
    }

    /// How many times the slot has been granted so far.
    pub fn grants(&self) -> u64 {
        self.grants.load(Ordering::Relaxed)
    }

    /// Passes the slot to the next waiter, or frees it.
    fn release(self: &Arc<Self>) {
        let mut state = self.state();
        loop {
            let admission_turn = !state.admission.is_empty() && (state.lifecycle.is_empty() || state.streak >= LIFECYCLE_STREAK);
            let next = if admission_turn {
                state.streak = 0;
                state.admission.pop_front()
            } else {
                state.streak += 1;
                state.lifecycle.pop_front()
            };
            let Some(next) = next else {
                state.held = false;
                return;
            };
            // A waiter that gave up returns the guard: disarm it (we still hold the slot) and try the next.
            if let Err(mut unwanted) = next.send(SlotGuard { slot: Some(self.clone()) }) {
                unwanted.slot = None;
            } else {
                self.grants.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn lifecycle_writers_go_first_but_admissions_get_a_turn() {
        let slot = Arc::new(WriteSlot::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = slot.acquire(Priority::Lifecycle).await;
        let mut tasks = Vec::new();
        for (i, priority) in [(0, Priority::Admission)].into_iter().chain((1..=10).map(|i| (i, Priority::Lifecycle))) {
            let (slot, order) = (slot.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _guard = slot.acquire(priority).await;
                order.lock().unwrap_or_else(|p| p.into_inner()).push(i);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }));
            // Queue them in this order.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(held);
        for task in tasks {
            task.await.ok();
        }
        let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // The holder counted as the first of the streak: 7 more lifecycle grants, then the admission.
        assert_eq!(order, vec![1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 10]);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_passes_the_slot_on() {
        let slot = Arc::new(WriteSlot::default());
        let held = slot.acquire(Priority::Lifecycle).await;
        let gone = tokio::spawn({
            let slot = slot.clone();
            async move {
                let _guard = slot.acquire(Priority::Lifecycle).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        gone.abort();
        let next = tokio::spawn({
            let slot = slot.clone();
            async move {
                let _guard = slot.acquire(Priority::Admission).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(held);
        tokio::time::timeout(Duration::from_secs(1), next).await.ok().and_then(Result::ok).expect("the slot reached the next waiter");
        assert!(!slot.state().held, "free again");
    }
}
