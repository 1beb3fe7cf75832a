//! The runs service's side of [`antler_agent::Host`]: how an agent's writes reach the store. Every
//! write is one transaction (on PostgreSQL a lone event is one statement) that first checks, in the
//! same statement that allocates the events' seqs, that this worker still owns the run; a write that
//! finds otherwise fences the agent, so nothing is written after a lost lease.
//!
//! Here: the host of one attempt ([`RunHost`]) and its writes. `journal.rs`: the side-effect
//! journal. `agent_calls.rs`: the `antler_agent::Host` calls the agent makes, which include starting
//! subagent runs (`crate::subagent`, which executes them through `crate::worker`); the worker only
//! needs this file, so the recursion run → subagent → run goes through the agent's `dyn Host`, not
//! through a circle of imports.

mod agent_calls;
pub mod journal;

use std::sync::{Arc, Mutex};

use antler_agent::{Batch, Fenced};
use antler_proto::common::Usage;
use antler_proto::runs::{Checkpoint, RunEvent, RunUsage};
use prost::Message as _;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseTransaction, DbBackend, EntityTrait, QueryFilter};

use crate::engine::{Engine, LocalRun, StopCause};
use crate::error::RunsError;
use crate::store::entity::{checkpoints, runs, threads, tool_effects};
use crate::store::{Priority, now_ms};
use crate::stream::{Writer, append_one_postgres, append_setting};

/// Which run a host writes for.
#[derive(Debug, Clone)]
pub struct RunIds {
    pub run_id: String,
    pub thread_id: String,
    pub user_id: String,
    pub attempt: u32,
}

/// See the module documentation. One per attempt.
pub struct RunHost {
    pub(crate) engine: Arc<Engine>,
    pub(crate) spec: RunIds,
    pub(crate) local: LocalRun,
    known: Mutex<Known>,
    /// What the run's subagent runs inherit (its request's secret names and context).
    inherit: Inherited,
    /// The drivers of this attempt's subagent runs (see `crate::subagent`) by task, joined before
    /// finalizing.
    children: Mutex<Vec<Child>>,
    /// Fired once the agent returned: subagent runs still going are interrupted.
    done: tokio_util::sync::CancellationToken,
}

/// One subagent task of this attempt: which task, and its driver (see `crate::subagent::spawn`).
struct Child {
    task_id: String,
    subagent_type: String,
    driver: tokio::task::JoinHandle<Option<antler_agent::SubagentEnd>>,
}

/// What a run's subagent runs inherit from its request.
#[derive(Debug, Clone, Default)]
pub struct Inherited {
    pub secret_names: Vec<String>,
    pub context: Option<prost_types::Struct>,
}

/// What this attempt wrote last, so the next write needs no lookup.
#[derive(Debug, Default)]
struct Known {
    /// The checkpoint this attempt wrote last: the thread's head while the run is active (nothing
    /// else moves the head of a thread with an active run).
    head: Option<String>,
    /// Before this attempt wrote a checkpoint: the head its first checkpoint should find, from where
    /// the attempt started (the checkpoint it resumed from, or the run's base). Unverified: the write
    /// that relies on it checks it in its own statement (see [`Parent::Expected`]).
    expected_head: Option<Option<String>>,
    /// The run's usage totals as last written by this attempt (only the owner writes them while the
    /// run is RUNNING), so adding a call's usage needs no read.
    usage_total: Option<RunUsage>,
    /// The whole (redacted) state of `head` as written (before the first write: of the starting
    /// checkpoint, as read), so the next checkpoint is stored as a delta against it without reading
    /// it back. Taken by a checkpoint write and put back after it.
    last: Option<crate::checkpoints::Full>,
    /// The `task` calls whose journal result (and END event) this attempt wrote.
    closed_tasks: Vec<String>,
}

impl std::fmt::Debug for RunHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHost").field("run_id", &self.spec.run_id).finish_non_exhaustive()
    }
}

impl RunHost {
    pub fn new(engine: Arc<Engine>, spec: RunIds, local: LocalRun) -> Self {
        Self::inheriting(engine, spec, local, Inherited::default())
    }

    /// A host whose subagent runs inherit `inherit`.
    pub fn inheriting(engine: Arc<Engine>, spec: RunIds, local: LocalRun, inherit: Inherited) -> Self {
        Self { engine, spec, local, known: Mutex::default(), inherit, children: Mutex::default(), done: Default::default() }
    }

    /// A host that knows the run's usage totals already (`total`: the run's first attempt, whose
    /// totals nobody but this attempt writes), so its first write of usage reads nothing.
    pub fn with_usage_total(self, total: RunUsage) -> Self {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).usage_total = Some(total);
        self
    }

    /// A host whose attempt started from `start` (the checkpoint it resumed from or the run's base,
    /// as stored; None: an empty thread), so its first checkpoint's write need not read the thread's
    /// head nor that checkpoint: it checks instead that the head is still `start`, and reads it only
    /// when not.
    pub fn with_start(self, start: Option<crate::checkpoints::Full>) -> Self {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.expected_head = Some(start.as_ref().map(|s| s.checkpoint_id.clone()));
        known.last = start;
        drop(known);
        self
    }

    /// Called once the agent returned: interrupts subagent runs still going (none, unless the agent
    /// stopped mid-task) and waits for their drivers, so no child outlives its parent's attempt. A
    /// task whose `task` call stopped before it recorded the end (the parent was cancelled or timed
    /// out while its child ran) is closed here, in one write before the parent is finalized: its END
    /// event, the child's usage and the call's journal result — every START in the log gets its END.
    pub async fn join_children(&self) {
        self.done.cancel();
        let children = std::mem::take(&mut *self.children.lock().unwrap_or_else(|p| p.into_inner()));
        let mut batch = antler_agent::Batch::default();
        for child in children {
            let end = match tokio::time::timeout(std::time::Duration::from_secs(30), child.driver).await {
                Ok(Ok(end)) => end,
                Ok(Err(join)) => {
                    tracing::warn!(run_id = %self.spec.run_id, task_id = %child.task_id, error = %join, "a subagent driver failed");
                    None
                }
                Err(_) => {
                    tracing::warn!(run_id = %self.spec.run_id, task_id = %child.task_id, "a subagent run did not stop within 30 s of its parent; finalizing without it");
                    None
                }
            };
            let closed = self.known.lock().unwrap_or_else(|p| p.into_inner()).closed_tasks.contains(&child.task_id);
            if let Some(end) = end.filter(|_| !closed) {
                let closing = antler_agent::lead::tools::task::closing(&child.task_id, &child.subagent_type, &end.child_run_id, &end);
                batch.events.push(antler_proto::runs::run_event::Kind::Subagent(closing.event));
                batch.usage.extend(closing.usage);
                batch.results.push(closing.record);
            }
        }
        if !batch.events.is_empty() && self.write_batch(batch).await.is_err() {
            tracing::info!(run_id = %self.spec.run_id, "subagent END events not written: fenced");
        }
    }

    fn check(&self) -> Result<(), Fenced> {
        match self.local.cause() {
            Some(StopCause::Fenced | StopCause::Release) => Err(Fenced),
            _ => Ok(()),
        }
    }

    fn fence(&self) -> Fenced {
        metrics::counter!("antler_runs_fenced_total", "cause" => "write_refused").increment(1);
        self.local.stop(StopCause::Fenced);
        Fenced
    }

    /// Writes `batch`: a lone event on PostgreSQL in one statement, anything else in one
    /// transaction. Fences on failure.
    async fn write_batch(&self, batch: Batch) -> Result<(), Fenced> {
        self.check()?;
        let batch = Arc::new(batch);
        let (parent, known_usage, known_last) = {
            let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            let last = if batch.checkpoint.is_some() { known.last.take() } else { None };
            let parent = match (&known.head, &known.expected_head) {
                (Some(head), _) => Parent::Known(head.clone()),
                (None, Some(expected)) => Parent::Expected(expected.clone()),
                (None, None) => Parent::Unknown,
            };
            (parent, known.usage_total.clone(), last)
        };
        let engine = &self.engine;
        let spec = &self.spec;
        // The streaming hot path on PostgreSQL: one event, nothing else, one statement.
        let lone_event = batch.events.len() == 1
            && batch.checkpoint.is_none()
            && batch.results.is_empty()
            && batch.usage.is_empty()
            && batch.title.is_none()
            && engine.store().backend() == DbBackend::Postgres;
        let started = std::time::Instant::now();
        let result = match batch.events.first() {
            Some(kind) if lone_event => {
                append_one_postgres(engine.store().db(), &spec.run_id, &spec.thread_id, engine.worker_id(), kind.clone())
                    .await
                    .map(|written| written.map(|event| (vec![event], None, None)))
            }
            _ => self.transaction(&batch, parent, known_usage, known_last).await,
        };
        match result {
            Ok(Some((written, new_usage, last))) => {
                {
                    let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(c) = &batch.checkpoint {
                        known.head = Some(c.checkpoint_id.clone());
                        known.last = last;
                    }
                    if new_usage.is_some() {
                        known.usage_total = new_usage;
                    }
                    known.closed_tasks.extend(batch.results.iter().map(|done| done.tool_call_id.clone()));
                }
                if !written.is_empty() {
                    let path = if lone_event { "statement" } else { "transaction" };
                    metrics::histogram!("antler_runs_event_append_seconds", "path" => path).record(started.elapsed().as_secs_f64());
                }
                engine.hub().publish(&written);
                for (caller, _, usage) in &batch.usage {
                    metrics::counter!("antler_tokens_total", "caller" => caller_bucket(caller)).increment(usage.total_tokens);
                }
                Ok(())
            }
            Ok(None) => Err(self.fence()),
            Err(error) => {
                tracing::warn!(run_id = %spec.run_id, %error, "run state not written");
                Err(self.fence())
            }
        }
    }

    /// The general write: one transaction with the ownership check and seq allocation (and usage),
    /// the checkpoint, the thread's head and title, then the events. None when fenced. A checkpoint
    /// encoded against an expected head that turns out not to be the thread's is rolled back and
    /// written again against the head read from the store.
    async fn transaction(
        &self,
        batch: &Arc<Batch>,
        parent: Parent,
        known_usage: Option<RunUsage>,
        known_last: Option<crate::checkpoints::Full>,
    ) -> Result<Option<StepWritten>, RunsError> {
        match self.write_step(batch, parent, known_usage, known_last).await {
            Err(StepError::HeadMoved) => {
                tracing::debug!(run_id = %self.spec.run_id, "the thread's head was not the attempt's starting checkpoint; reading it");
                // Against the head read from the store nothing is checked: no second retry. The usage
                // totals are read back too (the rolled-back write left the stored ones current), so
                // the common path keeps no copy of them for this rare one.
                self.write_step(batch, Parent::Unknown, None, None).await.map_err(RunsError::from)
            }
            other => other.map_err(RunsError::from),
        }
    }

    async fn write_step(
        &self,
        batch: &Arc<Batch>,
        parent: Parent,
        known_usage: Option<RunUsage>,
        known_last: Option<crate::checkpoints::Full>,
    ) -> Result<Option<StepWritten>, StepError> {
        let step = Arc::new(
            StepWrite::prepare(&self.engine, &self.spec, batch.clone(), parent, known_usage, known_last).await.map_err(StepError::Runs)?,
        );
        self.engine
            .store()
            .write(Priority::Lifecycle, move |tx| {
                let step = step.clone();
                Box::pin(async move { step.write(tx).await })
            })
            .await
    }
}

/// The bounded bucket of a caller tag.
pub fn caller_bucket(caller: &str) -> &'static str {
    if caller.starts_with("subagent") {
        "subagent"
    } else if caller.starts_with("middleware") {
        "middleware"
    } else {
        "lead_agent"
    }
}

/// Adds one call's usage to a run's totals.
pub fn add_usage(total: &mut RunUsage, caller: &str, model: &str, usage: &Usage) {
    total.input_tokens += usage.input_tokens;
    total.output_tokens += usage.output_tokens;
    total.total_tokens += usage.total_tokens;
    total.cache_read_tokens += usage.cache_read_tokens;
    total.reasoning_tokens += usage.reasoning_tokens;
    total.llm_calls += 1;
    match caller_bucket(caller) {
        "subagent" => total.subagent_tokens += usage.total_tokens,
        "middleware" => total.middleware_tokens += usage.total_tokens,
        _ => total.lead_agent_tokens += usage.total_tokens,
    }
    let entry = total.by_model.entry(model.to_owned()).or_default();
    let per = entry.usage.get_or_insert_with(Usage::default);
    per.input_tokens += usage.input_tokens;
    per.output_tokens += usage.output_tokens;
    per.total_tokens += usage.total_tokens;
    per.cache_read_tokens += usage.cache_read_tokens;
    per.reasoning_tokens += usage.reasoning_tokens;
    entry.llm_calls += 1;
}

/// What one step's write was: its events, the run's usage totals after it, and the whole state of the
/// checkpoint it wrote.
type StepWritten = (Vec<RunEvent>, Option<RunUsage>, Option<crate::checkpoints::Full>);

/// The parent of a step's checkpoint, as far as the host knows it before the write.
enum Parent {
    /// The checkpoint this attempt wrote last: the thread's head (nothing else moves the head of a
    /// thread whose run is active).
    Known(String),
    /// Where the attempt started: the head the thread should have, checked by the write itself.
    Expected(Option<String>),
    /// Read from the thread before the write.
    Unknown,
}

/// Why a step's write did not commit.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error(transparent)]
    Runs(#[from] RunsError),
    /// The thread's head was not the expected parent: rolled back, to be encoded again against the
    /// head read from the store.
    #[error(
        "the thread's head is not the checkpoint the step was encoded against\nhint: the write is retried against the head read from the store"
    )]
    HeadMoved,
}

impl From<crate::store::StoreError> for StepError {
    fn from(e: crate::store::StoreError) -> Self {
        StepError::Runs(e.into())
    }
}

impl From<sea_orm::DbErr> for StepError {
    fn from(e: sea_orm::DbErr) -> Self {
        StepError::Runs(e.into())
    }
}

impl crate::store::Busy for StepError {
    fn is_busy(&self) -> bool {
        matches!(self, StepError::Runs(e) if e.is_busy())
    }
}

impl From<StepError> for RunsError {
    fn from(e: StepError) -> Self {
        match e {
            StepError::Runs(e) => e,
            moved @ StepError::HeadMoved => RunsError::Aborted(moved.to_string()),
        }
    }
}

/// One write of [`RunHost::write_batch`], owned: it runs on the store's writer thread. What needs no
/// lock is done before ([`StepWrite::prepare`]): the usage totals, the reads of the parent checkpoint
/// and the checkpoint's redaction and encoding, so the write slot is held for statements only.
struct StepWrite {
    worker_id: String,
    spec: RunIds,
    batch: Arc<Batch>,
    now: i64,
    /// The run's usage totals after this step, when it used a model.
    usage_total: Option<RunUsage>,
    checkpoint: Option<EncodedCheckpoint>,
}

/// A step's checkpoint, encoded against its parent.
struct EncodedCheckpoint {
    parent: Option<String>,
    /// Whether `parent` is the head the thread is expected to have ([`Parent::Expected`]): the
    /// write moves the head only from it, and rolls back otherwise.
    checked: bool,
    encoded: crate::checkpoints::Encoded,
    /// Its whole (redacted) state, for the next step's delta: taken by the write that commits it
    /// (a retried write finds it gone, and the next step reads its parent back instead).
    full: std::sync::Mutex<Option<crate::checkpoints::Full>>,
}

impl StepWrite {
    /// The reads are outside the writing transaction, which is as good as inside it: only the run's
    /// owner writes its usage and moves its thread's head while the run is active, and a write by a
    /// worker that no longer owns the run is refused by the transaction's first statement.
    async fn prepare(
        engine: &Engine,
        spec: &RunIds,
        batch: Arc<Batch>,
        parent: Parent,
        known_usage: Option<RunUsage>,
        known_last: Option<crate::checkpoints::Full>,
    ) -> Result<Self, RunsError> {
        let now = now_ms();
        let db = engine.store().db();
        // Usage totals: known from this attempt's last write, read once otherwise.
        let mut usage_total = None;
        if !batch.usage.is_empty() {
            let mut total = match known_usage {
                Some(total) => total,
                None => {
                    let run = runs::Entity::find_by_id(spec.run_id.clone()).one(db).await?;
                    run.map(|r| RunUsage::decode(r.usage.as_slice())).transpose()?.unwrap_or_default()
                }
            };
            for (caller, model, usage) in &batch.usage {
                add_usage(&mut total, caller, model, usage);
            }
            usage_total = Some(total);
        }
        let mut checkpoint = None;
        if let Some(c) = &batch.checkpoint {
            let checked = matches!(parent, Parent::Expected(_));
            let parent = match parent {
                Parent::Known(head) => Some(head),
                Parent::Expected(head) => head,
                Parent::Unknown => crate::store::first(db, threads::Entity::find_by_id((spec.user_id.clone(), spec.thread_id.clone())))
                    .await?
                    .and_then(|t| t.head_checkpoint_id),
            };
            let mut state = Checkpoint {
                checkpoint_id: c.checkpoint_id.clone(),
                parent_checkpoint_id: parent.clone().unwrap_or_default(),
                step: c.step,
                values: Some(c.values.clone()),
                created_at: Some(crate::time::to_timestamp(now)),
                run_id: spec.run_id.clone(),
                messages: c.messages.clone(),
                source: "loop".to_owned(),
            };
            // The agent keeps its own copy; what is stored (and read back by clients) is redacted.
            antler_kit::redact::redact_message_in_place(&mut state);
            // Stored as a delta against the parent's whole state: known when this attempt
            // wrote it, else read once (a new run, a resumed attempt, after a rollback).
            let parent_full = match (&parent, known_last) {
                (Some(id), Some(known)) if &known.checkpoint_id == id => Some(known),
                (Some(id), _) => crate::checkpoints::find(db, &spec.user_id, &spec.thread_id, id, true).await?.map(|(c, depth)| {
                    crate::checkpoints::Full {
                        checkpoint_id: id.clone(),
                        messages: c.messages,
                        values: c.values.unwrap_or_default(),
                        depth,
                    }
                }),
                (None, _) => None,
            };
            let policy = crate::checkpoints::Policy {
                snapshot_every: engine.config().checkpoint_snapshot_every,
                blob_min_bytes: engine.config().checkpoint_blob_min_bytes,
            };
            let encoded = crate::checkpoints::encode(&state, parent_full.as_ref(), policy);
            let full = crate::checkpoints::Full {
                checkpoint_id: c.checkpoint_id.clone(),
                messages: state.messages,
                values: state.values.unwrap_or_default(),
                depth: encoded.depth,
            };
            checkpoint = Some(EncodedCheckpoint { parent, checked, encoded, full: std::sync::Mutex::new(Some(full)) });
        }
        Ok(Self { worker_id: engine.worker_id().to_owned(), spec: spec.clone(), batch, now, usage_total, checkpoint })
    }

    async fn write(&self, tx: &DatabaseTransaction) -> Result<Option<StepWritten>, StepError> {
        let StepWrite { worker_id, spec, batch, now, usage_total, checkpoint: encoded_checkpoint } = self;
        let now = *now;
        let Batch { events, title, checkpoint, results, .. } = &**batch;
        // The protobuf for GetRun, and its totals as columns for GetTokenUsage's SUM.
        let mut columns = Vec::new();
        if let Some(total) = usage_total {
            columns.push((runs::Column::Usage, sea_orm::Value::from(total.encode_to_vec())));
            columns.extend(crate::usage::columns(total));
        }
        // One statement: still ours? (It also serialises with a concurrent takeover.) Seqs
        // allocated, usage written.
        let Some(written) = append_setting(tx, &spec.run_id, &spec.thread_id, Writer::Owner(worker_id), events.clone(), columns).await?
        else {
            return Ok(None);
        };
        let mut last = None;
        if let (Some(c), Some(EncodedCheckpoint { parent, encoded, full, .. })) = (checkpoint, encoded_checkpoint) {
            crate::checkpoints::insert_blobs(tx, &spec.user_id, &spec.thread_id, &encoded.blobs, now).await?;
            metrics::counter!("antler_runs_checkpoint_bytes_total", "kind" => if encoded.snapshot { "snapshot" } else { "delta" })
                .increment(encoded.state.len() as u64);
            checkpoints::Entity::insert(checkpoints::ActiveModel::from(checkpoints::Model {
                checkpoint_id: c.checkpoint_id.clone(),
                user_id: spec.user_id.clone(),
                thread_id: spec.thread_id.clone(),
                parent_checkpoint_id: parent.clone(),
                run_id: Some(spec.run_id.clone()),
                step: c.step,
                state: encoded.state.clone(),
                created_at: now,
                encoding: crate::checkpoints::ENCODING_STORED,
            }))
            .exec_without_returning(tx)
            .await?;
            last = full.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        // Journal results (the `task` tool's), in the same transaction as their events.
        for done in results {
            tool_effects::Entity::update_many()
                .col_expr(tool_effects::Column::Result, Expr::value(antler_kit::redact::redact(&done.result).into_owned()))
                .col_expr(tool_effects::Column::IsError, Expr::value(done.is_error))
                .col_expr(tool_effects::Column::ResultAt, Expr::value(now))
                .filter(tool_effects::Column::RunId.eq(spec.run_id.as_str()))
                .filter(tool_effects::Column::ToolCallId.eq(done.tool_call_id.as_str()))
                .exec(tx)
                .await?;
        }
        // The thread's head and title: one statement.
        if checkpoint.is_some() || title.is_some() {
            let mut update = threads::Entity::update_many().col_expr(threads::Column::UpdatedAt, Expr::value(now));
            if let Some(c) = &checkpoint {
                update = update.col_expr(threads::Column::HeadCheckpointId, Expr::value(c.checkpoint_id.as_str()));
            }
            if let Some(title) = title {
                update = update.col_expr(threads::Column::Title, Expr::value(title));
            }
            let expected = encoded_checkpoint.as_ref().filter(|c| c.checked).map(|c| c.parent.as_deref());
            update = match expected {
                Some(Some(head)) => update.filter(threads::Column::HeadCheckpointId.eq(head)),
                Some(None) => update.filter(threads::Column::HeadCheckpointId.is_null()),
                None => update,
            };
            let moved = update
                .filter(threads::Column::UserId.eq(spec.user_id.as_str()))
                .filter(threads::Column::ThreadId.eq(spec.thread_id.as_str()))
                .exec(tx)
                .await?
                .rows_affected
                == 0;
            if moved && expected.is_some() {
                return Err(StepError::HeadMoved);
            }
        }
        Ok(Some((written, usage_total.clone(), last)))
    }
}
