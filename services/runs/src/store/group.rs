//! Group commit of the run lifecycle's writes on the SQLite writer's connection.
//!
//! The single writer is what limits runs per second on SQLite (`run_throughput`'s writer-busy column:
//! the write slot held 0.91–0.93 of the time at 64 runs in flight), and COMMIT took 28 % of its thread's
//! profile samples: each commit appends every page it changed to the WAL (two `pwrite`s a page), and the step writes and finalizations of different runs change
//! the same pages (the runs and events tables' last leaves and their indexes). So the lifecycle
//! writes waiting for the writer are run one after another in one transaction, each inside a
//! savepoint of its own (a write that fails is rolled back alone, as before), and committed
//! together; every caller hears of its write only after that COMMIT, so nothing is published or
//! acknowledged before it is durable in the same sense as before (`synchronous = NORMAL`).
//!
//! Writes are queued from their callers' threads; the first to find no group running starts a
//! leader task on the writer thread, which takes the write slot, runs the writes queued by then (at
//! most `runs.database.sqlite_group_commit_max`), commits, gives the slot back (so admissions keep
//! their share) and goes on while writes are queued. Queuing on the writer thread itself grouped
//! nothing: it runs a group without yielding, so the tasks that arrived meanwhile had not queued.
//! A group that cannot commit fails every write in it; a busy database (another process holds the
//! lock) fails them with the error [`Store::retry_busy`](super::Store::retry_busy) retries, each
//! write joining a later group. A write that panics fails alone.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use futures::future::BoxFuture;
use sea_orm::{DatabaseTransaction, TransactionTrait};
use tokio::sync::oneshot;

use super::direct::Direct;
use super::slot::{Priority, WriteSlot};

/// A write's operation, run in the group's transaction: true when it succeeded.
type Operation = Box<dyn for<'t> FnOnce(&'t DatabaseTransaction) -> BoxFuture<'t, bool> + Send>;

/// One write of a group: runs its operation, then hears whether the group committed (the error's
/// text when not).
pub struct Member {
    run: Operation,
    done: oneshot::Sender<Result<(), String>>,
}

impl Member {
    pub fn new<F>(run: F) -> (Self, oneshot::Receiver<Result<(), String>>)
    where
        F: for<'t> FnOnce(&'t DatabaseTransaction) -> BoxFuture<'t, bool> + Send + 'static,
    {
        let (done, committed) = oneshot::channel();
        (Self { run: Box::new(run), done }, committed)
    }
}

#[derive(Default)]
struct Queue {
    leading: bool,
    waiting: VecDeque<Member>,
}

/// See the module documentation.
pub struct GroupCommit {
    max: usize,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("max", &self.max).finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// At most `max` writes a transaction (at least one).
    pub fn new(max: u32) -> Self {
        Self { max: max.max(1) as usize, queue: Mutex::default() }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `member`; true when no leader runs and the caller is to start one ([`GroupCommit::lead`]).
    pub fn join(&self, member: Member) -> bool {
        let mut queue = self.queue();
        queue.waiting.push_back(member);
        !std::mem::replace(&mut queue.leading, true)
    }

    /// Runs groups until none is queued: the task of whoever's [`GroupCommit::join`] said so, on the
    /// writer thread (as every write on `direct`); callers wait for their own group only.
    pub async fn lead(&self, direct: &Direct, slot: &Arc<WriteSlot>) {
        // Should this task end half-way (the writer stopping), the next write starts a new leader
        // instead of queuing behind one that is gone.
        struct StepDown<'g>(Option<&'g GroupCommit>);
        impl Drop for StepDown<'_> {
            fn drop(&mut self) {
                if let Some(group) = self.0 {
                    group.queue().leading = false;
                }
            }
        }
        let mut step_down = StepDown(Some(self));
        while self.run_next(direct, slot).await {}
        // Stepped down in `run_next`, under the queue's lock.
        step_down.0 = None;
    }

    /// Runs the next group; true when more are queued (still leading), false when it stepped down.
    async fn run_next(&self, direct: &Direct, slot: &Arc<WriteSlot>) -> bool {
        let slot_guard = slot.acquire(Priority::Lifecycle).await;
        let group: Vec<Member> = {
            let mut queue = self.queue();
            let n = queue.waiting.len().min(self.max);
            queue.waiting.drain(..n).collect()
        };
        metrics::histogram!("antler_runs_sqlite_group_writes").record(group.len() as f64);
        run_group(direct, group).await;
        drop(slot_guard);
        let mut queue = self.queue();
        if queue.waiting.is_empty() {
            queue.leading = false;
            return false;
        }
        true
    }
}

/// One transaction for `group`: a savepoint per write, then COMMIT, then every write is told.
async fn run_group(direct: &Direct, group: Vec<Member>) {
    // Rolled back unless committed, also when this task is dropped half-way (the writer stopping).
    let open = match super::OpenDirect::begin(direct) {
        Ok(open) => open,
        Err(error) => {
            let error = error.to_string();
            for member in group {
                let _ = member.done.send(Err(error.clone()));
            }
            return;
        }
    };
    let mut told = Vec::with_capacity(group.len());
    // Set when the transaction itself is lost: what ran before is gone, so nothing may commit.
    let mut broken: Option<String> = None;
    for member in group {
        told.push(member.done);
        if broken.is_some() {
            continue;
        }
        if let Err(error) = direct.savepoint() {
            broken = Some(error.to_string());
            continue;
        }
        let ok = match direct.db().begin().await {
            Ok(tx) => {
                // A write that panics fails alone (its caller hears it did not complete).
                let ok = std::panic::AssertUnwindSafe((member.run)(&tx)).catch_unwind().await.unwrap_or(false);
                if ok {
                    // Depth 0 of sea-orm's nesting is the store's: no statement.
                    let _ = tx.commit().await;
                }
                ok
            }
            Err(_) => false,
        };
        let closed = if ok { direct.release() } else { direct.rollback_to() };
        if let Err(error) = closed {
            broken = Some(error.to_string());
        }
    }
    let outcome = match broken {
        Some(error) => {
            drop(open);
            Err(error)
        }
        None => open.commit().map_err(|e| e.to_string()),
    };
    for done in told {
        let _ = done.send(outcome.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

    use crate::store::entity::threads;
    use crate::store::{Priority, Store, StoreError};

    fn thread(id: String) -> threads::ActiveModel {
        threads::ActiveModel::from(threads::Model {
            user_id: "u".to_owned(),
            thread_id: id,
            title: String::new(),
            metadata: "{}".to_owned(),
            head_checkpoint_id: None,
            latest_run_id: None,
            created_at: 0,
            updated_at: 0,
            parent_thread_id: None,
        })
    }

    /// Writes that wait while one runs are committed together; one that fails (a duplicate key, after
    /// an insert of its own) is undone alone.
    #[tokio::test]
    async fn waiting_writes_commit_together_and_a_failed_one_is_undone_alone() {
        let grants = writes_with_one_slow(crate::config::DatabaseConfig::default()).await;
        assert!(grants <= 5, "41 writes took {grants} transactions (or WAL checkpoints): the ones that waited were not grouped");
        // The same with groups off: a transaction each.
        let config = crate::config::DatabaseConfig { sqlite_group_commit_max: 1, ..Default::default() };
        // (At least: the WAL checkpointer may take the slot once meanwhile.)
        let grants = writes_with_one_slow(config).await;
        assert!(grants >= 41, "{grants}");
    }

    /// The threads the writes left, sorted.
    async fn kept(store: &Store) -> Vec<String> {
        let threads = threads::Entity::find().filter(threads::Column::UserId.eq("u")).all(store.db()).await.expect("read");
        let mut kept: Vec<String> = threads.into_iter().map(|t| t.thread_id).collect();
        kept.sort();
        kept
    }

    /// A write that panics in a group fails alone: the others in its group commit, and later writes
    /// still find a leader.
    #[tokio::test]
    async fn a_write_that_panics_fails_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(&crate::config::DatabaseConfig::default(), dir.path()).await.expect("store");
        let write = |id: &'static str, panics: bool, hold: Duration| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(Priority::Lifecycle, move |tx| {
                        Box::pin(async move {
                            threads::Entity::insert(thread(id.to_owned())).exec_without_returning(tx).await?;
                            tokio::time::sleep(hold).await;
                            assert!(!panics, "this write panics on purpose");
                            Ok::<_, StoreError>(())
                        })
                    })
                    .await
            })
        };
        let slow = write("slow", false, Duration::from_millis(200));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (panicking, after) = (write("panics", true, Duration::ZERO), write("after", false, Duration::ZERO));
        slow.await.expect("join").expect("slow");
        assert!(panicking.await.expect("join").is_err(), "the panicking write reports an error");
        after.await.expect("join").expect("the write grouped with it");
        write("later", false, Duration::ZERO).await.expect("join").expect("a later write");
        assert_eq!(kept(&store).await, ["after", "later", "slow"]);
    }

    /// One slow write, then 40 while it runs (every tenth failing after its insert); the write slot's
    /// grants meanwhile (the transactions).
    async fn writes_with_one_slow(config: crate::config::DatabaseConfig) -> u64 {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(&config, dir.path()).await.expect("store");
        assert_eq!(store.group.is_some(), config.sqlite_group_commit_max > 1);
        let slot = store.write_slot.clone().expect("slot");
        let before = slot.grants();
        // The first write holds the writer for a while: the others queue behind it.
        let first = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write(Priority::Lifecycle, |tx| {
                        Box::pin(async move {
                            threads::Entity::insert(thread("slow".to_owned())).exec_without_returning(tx).await?;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            Ok::<_, StoreError>(())
                        })
                    })
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut writes = Vec::new();
        for i in 0..40 {
            let store = store.clone();
            writes.push(tokio::spawn(async move {
                store
                    .write(Priority::Lifecycle, move |tx| {
                        Box::pin(async move {
                            threads::Entity::insert(thread(format!("t{i}"))).exec_without_returning(tx).await?;
                            if i % 10 == 3 {
                                // Its own row is in, then it fails: both are undone, nothing else.
                                threads::Entity::insert(thread("slow".to_owned())).exec_without_returning(tx).await?;
                            }
                            Ok::<_, StoreError>(i)
                        })
                    })
                    .await
            }));
        }
        first.await.expect("join").expect("the first write");
        for (i, write) in writes.into_iter().enumerate() {
            let outcome = write.await.expect("join");
            assert_eq!(outcome.is_err(), i % 10 == 3, "write {i}: {outcome:?}");
        }
        let grants = slot.grants() - before;
        let mut expected: Vec<String> = (0..40).filter(|i| i % 10 != 3).map(|i| format!("t{i}")).chain(["slow".to_owned()]).collect();
        expected.sort();
        assert_eq!(kept(&store).await, expected);
        grants
    }
}
