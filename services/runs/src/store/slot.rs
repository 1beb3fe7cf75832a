//! The SQLite write slot: one write transaction at a time in this process, with the run lifecycle
//! (starting, renewing, checkpointing, finishing, cancelling runs) served before admissions.
//!
//! A plain FIFO mutex let an admission flood starve the workers: every start and every finish waited
//! behind all the admissions queued before it, so runs were admitted far faster than they could run.
//! Here the slot keeps the share of its recent holding time that went to admissions (decayed with a
//! time constant of [`SHARE_WINDOW`]). When both kinds wait, an admission gets the slot only while
//! that share is below `admission_share` (`runs.database.sqlite_admission_share_percent`); when no
//! lifecycle writer waits, admissions take the slot whenever it is free, so an admission flood alone
//! runs at full speed and one beside busy workers is slowed but never stopped.
//!
//! The share is counted in time, not in grants: an admission turn is a batch of up to hundreds of
//! runs (see `lifecycle::admission::Batcher`) and holds the slot far longer than one lifecycle write, so a count
//! of turns (what this did before: one admission turn every eight lifecycle grants) says little about
//! who has the writer. Under a flood beside busy workers the writer is what limits completions (the
//! server used half of the 2 cores), and the share sets the balance: 20 % kept 57 % of the completion
//! rate without the flood, 5 % (the default) 88–99 % (runs README, "Under load").

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Who is asking for the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Writes of runs that were admitted already: they turn PENDING runs into finished ones.
    Lifecycle,
    /// Admissions of new runs.
    Admission,
}

/// The time constant of the holding-time shares: a burst this long ago weighs 1/e of a new one.
pub const SHARE_WINDOW: Duration = Duration::from_secs(1);

/// A wait for the slot longer than this is logged (a write transaction takes milliseconds).
const SLOW_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct State {
    held: bool,
    lifecycle: VecDeque<oneshot::Sender<SlotGuard>>,
    admission: VecDeque<oneshot::Sender<SlotGuard>>,
    /// Decayed seconds the slot was held by admissions and by lifecycle writers.
    admission_secs: f64,
    lifecycle_secs: f64,
    decayed_at: Instant,
}

impl State {
    /// Counts a finished hold and brings both sums to now.
    fn count(&mut self, priority: Priority, held: Duration) {
        let now = Instant::now();
        let factor = (-(now - self.decayed_at).as_secs_f64() / SHARE_WINDOW.as_secs_f64()).exp();
        self.admission_secs *= factor;
        self.lifecycle_secs *= factor;
        self.decayed_at = now;
        match priority {
            Priority::Admission => self.admission_secs += held.as_secs_f64(),
            Priority::Lifecycle => self.lifecycle_secs += held.as_secs_f64(),
        }
    }

    fn admission_share(&self) -> f64 {
        let total = self.admission_secs + self.lifecycle_secs;
        if total <= 0.0 { 0.0 } else { self.admission_secs / total }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct WriteSlot {
    state: Mutex<State>,
    /// Most of the slot's holding time admissions get while lifecycle writers wait (0..1).
    admission_share: f64,
    /// Times the slot was granted: the WAL checkpointer's measure of whether anyone wrote lately.
    grants: AtomicU64,
}

/// Holds the slot; dropping it hands the slot to the next waiter.
#[derive(Debug)]
pub struct SlotGuard {
    slot: Option<Arc<WriteSlot>>,
    priority: Priority,
    since: Instant,
}

impl WriteSlot {
    /// `admission_share`: see [`WriteSlot`]'s field (clamped to 0.01..=1).
    pub fn new(admission_share: f64) -> Self {
        Self {
            state: Mutex::new(State {
                held: false,
                lifecycle: VecDeque::new(),
                admission: VecDeque::new(),
                admission_secs: 0.0,
                lifecycle_secs: 0.0,
                decayed_at: Instant::now(),
            }),
            admission_share: admission_share.clamp(0.01, 1.0),
            grants: AtomicU64::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn guard(self: &Arc<Self>, priority: Priority) -> SlotGuard {
        self.grants.fetch_add(1, Ordering::Relaxed);
        SlotGuard { slot: Some(self.clone()), priority, since: Instant::now() }
    }

    /// Waits for the slot. Cancel-safe: a waiter dropped before or after being handed the slot passes
    /// it on.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> SlotGuard {
        let waiting = {
            let mut state = self.state();
            if !state.held {
                state.held = true;
                return self.guard(priority);
            }
            let (tx, rx) = oneshot::channel();
            match priority {
                Priority::Lifecycle => state.lifecycle.push_back(tx),
                Priority::Admission => state.admission.push_back(tx),
            }
            rx
        };
        let since = Instant::now();
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

    /// How many times the slot has been granted so far.
    pub fn grants(&self) -> u64 {
        self.grants.load(Ordering::Relaxed)
    }

    /// Counts the hold that ends and passes the slot to the next waiter, or frees it.
    fn release(self: &Arc<Self>, priority: Priority, held: Duration) {
        let kind = match priority {
            Priority::Lifecycle => "lifecycle",
            Priority::Admission => "admission",
        };
        // Sum and count: the writer's holding time and its write transactions, the SQLite ceiling of a
        // replica's throughput (the runs README's benchmark reads both per run and per step).
        metrics::histogram!("antler_runs_sqlite_write_seconds", "priority" => kind).record(held.as_secs_f64());
        let mut state = self.state();
        state.count(priority, held);
        loop {
            let admission_turn =
                !state.admission.is_empty() && (state.lifecycle.is_empty() || state.admission_share() < self.admission_share);
            let (next, priority) = if admission_turn {
                (state.admission.pop_front(), Priority::Admission)
            } else {
                (state.lifecycle.pop_front(), Priority::Lifecycle)
            };
            let Some(next) = next else {
                state.held = false;
                return;
            };
            // A waiter that gave up returns the guard: disarm it (we still hold the slot) and try the next.
            if let Err(mut unwanted) = next.send(SlotGuard { slot: Some(self.clone()), priority, since: Instant::now() }) {
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
            slot.release(self.priority, self.since.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holds the slot with `first` for `first_hold`, queues `waiters` (index, priority, hold) in this
    /// order meanwhile, and returns the order in which they got it.
    async fn grant_order(first: Priority, first_hold: Duration, waiters: Vec<(usize, Priority, Duration)>) -> Vec<usize> {
        let slot = Arc::new(WriteSlot::new(0.2));
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = slot.acquire(first).await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (i, priority, hold) in waiters {
            let (slot, order) = (slot.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _guard = slot.acquire(priority).await;
                order.lock().unwrap_or_else(|p| p.into_inner()).push(i);
                tokio::time::sleep(hold).await;
            }));
            // Queue them in this order.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(first_hold.saturating_sub(started.elapsed())).await;
        drop(held);
        for task in tasks {
            task.await.ok();
        }
        order.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    #[tokio::test]
    async fn an_admission_that_had_its_share_waits_for_the_lifecycle_writers() {
        // 60 ms of admission, then ten 2 ms lifecycle writes: the admission share never falls to 20 %
        // while they wait, so they all go first.
        let lifecycle = (1..=10).map(|i| (i, Priority::Lifecycle, Duration::from_millis(2)));
        let order = grant_order(
            Priority::Admission,
            Duration::from_millis(60),
            std::iter::once((0, Priority::Admission, Duration::ZERO)).chain(lifecycle).collect(),
        )
        .await;
        assert_eq!(order, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0]);
    }

    #[tokio::test]
    async fn an_admission_under_its_share_goes_before_waiting_lifecycle_writers() {
        let order = grant_order(
            Priority::Lifecycle,
            Duration::from_millis(30),
            vec![
                (1, Priority::Lifecycle, Duration::ZERO),
                (0, Priority::Admission, Duration::ZERO),
                (2, Priority::Lifecycle, Duration::ZERO),
            ],
        )
        .await;
        assert_eq!(order, vec![0, 1, 2]);
    }

    #[test]
    fn the_shares_count_holding_time_and_fade_with_age() {
        let slot = WriteSlot::new(0.2);
        let mut state = slot.state();
        state.count(Priority::Admission, Duration::from_millis(10));
        state.count(Priority::Lifecycle, Duration::from_millis(30));
        assert!((state.admission_share() - 0.25).abs() < 0.01, "{}", state.admission_share());
        // One window later both sums weigh 1/e: the share is the same, the next hold weighs more.
        state.decayed_at -= SHARE_WINDOW;
        state.count(Priority::Lifecycle, Duration::from_millis(40) / 3);
        let expected = 10.0 / std::f64::consts::E / (40.0 / std::f64::consts::E + 40.0 / 3.0);
        assert!((state.admission_share() - expected).abs() < 0.01, "{} vs {expected}", state.admission_share());
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_passes_the_slot_on() {
        let slot = Arc::new(WriteSlot::new(0.2));
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
