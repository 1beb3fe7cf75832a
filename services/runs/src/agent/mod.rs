//! What executes inside a run: anything implementing [`Agent`]. `runs.agent` picks one: the built-in
//! [`script::ScriptAgent`] (the default; it echoes its input or follows a JSON script, which is what
//! the lifecycle tests drive) or the [`lead::LeadAgent`] (a model ⇄ tools loop).
//!
//! An agent talks to the run only through [`AgentContext`]: it emits events, writes checkpoints and
//! reports usage there, and every one of those writes is refused once the worker lost its lease
//! ([`Fenced`]) — so an agent cannot write after fencing even by mistake.

pub mod journal;
pub mod lead;
pub mod script;
pub mod thread_title;

use std::sync::Arc;

use antler_proto::common::{Message, Usage};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{Checkpoint, CreateRunRequest, RunEvent, RunUsage, ValuesEvent};
use futures::future::BoxFuture;
use prost::Message as _;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DbBackend, EntityTrait, QueryFilter};
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, LocalRun, StopCause};
use crate::error::RunsError;
use crate::lifecycle::finalize::Outcome;
use crate::store::entity::{checkpoints, runs, threads};
use crate::store::now_ms;
use crate::stream::{Writer, append_one_postgres, append_setting};

/// The worker lost ownership of the run; the agent must stop and write nothing more.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("this worker no longer owns the run")]
pub struct Fenced;

/// What an agent is built from.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub run_id: String,
    pub thread_id: String,
    pub user_id: String,
    pub attempt: u32,
    /// The admitted request (secret values removed; their names are kept).
    pub request: CreateRunRequest,
    /// The run's secrets, as far as this replica has them.
    pub secrets: std::sync::Arc<crate::secrets::RunSecrets>,
    /// The checkpoint to start from: the run's own latest one when resuming after a takeover, else
    /// the thread's state when the run was admitted.
    pub resume_from: Option<Checkpoint>,
    /// True when this attempt continues a run another worker started.
    pub resumed: bool,
}

/// Builds agents. Called only after `try_start` succeeded: a run cancelled while PENDING never gets
/// this far.
pub trait AgentFactory: Send + Sync {
    fn build(&self, spec: &RunSpec) -> Result<Box<dyn Agent>, antler_proto::runs::RunError>;
}

/// The work inside a run.
pub trait Agent: Send {
    /// Runs to an outcome. Must return promptly once `ctx.cancelled()` fires.
    fn run(self: Box<Self>, ctx: AgentContext) -> BoxFuture<'static, Outcome>;
}

/// The agent's handle on its run.
#[derive(Clone)]
pub struct AgentContext {
    pub(crate) engine: Arc<Engine>,
    pub spec: RunSpec,
    pub(crate) local: LocalRun,
    /// Events and usage held back to be written with the next checkpoint (see [`AgentContext::stage`]).
    pub(crate) staged: Arc<std::sync::Mutex<Staged>>,
}

/// What [`AgentContext::stage`] and [`AgentContext::stage_usage`] hold until the next write.
#[derive(Debug, Default)]
pub(crate) struct Staged {
    events: Vec<Kind>,
    usage: Vec<(String, String, Usage)>,
    /// The checkpoint this attempt wrote last: the thread's head while the run is active (nothing
    /// else moves the head of a thread with an active run), so the next one needs no lookup.
    head: Option<String>,
    /// The run's usage totals as last written by this attempt (only the owner writes them while the
    /// run is RUNNING), so adding a call's usage needs no read.
    usage_total: Option<RunUsage>,
    /// A new title for the thread.
    title: Option<String>,
}

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext").field("run_id", &self.spec.run_id).finish_non_exhaustive()
    }
}

impl AgentContext {
    /// Channels to the other services (sandbox, models, …).
    pub fn clients(&self) -> &antler_kit::Clients {
        &self.engine.clients
    }

    /// The identity calls made for this run carry: the run's user, presented with this service's
    /// `clients.<service>.service_token` (the worker has no caller token of its own).
    pub fn call_context(&self) -> antler_kit::CallContext {
        antler_kit::CallContext::background(self.spec.user_id.clone())
    }

    /// Fires when the agent must stop (cancel, fencing, shutdown).
    pub fn cancelled(&self) -> CancellationToken {
        self.local.token.clone()
    }

    fn check(&self) -> Result<(), Fenced> {
        match self.local.cause() {
            Some(StopCause::Fenced | StopCause::Release) => Err(Fenced),
            _ => Ok(()),
        }
    }

    fn fence(&self) -> Fenced {
        self.local.stop(StopCause::Fenced);
        Fenced
    }

    /// Appends one event (durable before it is delivered to any subscriber).
    pub async fn emit(&self, kind: Kind) -> Result<(), Fenced> {
        self.emit_many(vec![kind]).await
    }

    /// Appends events in one transaction, after anything staged (so the order of the run's events is
    /// the order the agent produced them). Published to live subscribers once committed.
    pub async fn emit_many(&self, kinds: Vec<Kind>) -> Result<(), Fenced> {
        self.write(kinds, None, Vec::new()).await
    }

    /// Holds an event back to be written in the same transaction as the next checkpoint (or the next
    /// [`emit`](Self::emit) / [`flush`](Self::flush)): a step's results and its checkpoint become
    /// durable together, in one write instead of several. Use it for events a live client can wait a
    /// step for (the finished message, tool results); stream deltas with `emit`.
    pub fn stage(&self, kind: Kind) {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).events.push(kind);
    }

    /// Holds one model call's usage back to be added to the run's totals with the next write.
    pub fn stage_usage(&self, caller: &str, model: &str, usage: &Usage) {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).usage.push((caller.to_owned(), model.to_owned(), *usage));
    }

    /// Writes whatever is staged.
    pub async fn flush(&self) -> Result<(), Fenced> {
        self.emit_many(Vec::new()).await
    }

    /// Saves the thread state after a step; it becomes the thread's head and the resume point of
    /// this run. Emits a VALUES event after the staged ones, in the same transaction.
    pub async fn checkpoint(&self, step: i64, values: prost_types::Struct, messages: Vec<Message>) -> Result<String, Fenced> {
        self.checkpoint_then(step, values, messages, Vec::new()).await
    }

    /// [`checkpoint`](Self::checkpoint), with `then` appended after its VALUES event in the same
    /// transaction (the loop announces the next tool round's TOOL_STARTED events this way).
    pub async fn checkpoint_then(
        &self,
        step: i64,
        values: prost_types::Struct,
        messages: Vec<Message>,
        then: Vec<Kind>,
    ) -> Result<String, Fenced> {
        let checkpoint_id = uuid::Uuid::now_v7().to_string();
        self.write(Vec::new(), Some(NewCheckpoint { checkpoint_id: checkpoint_id.clone(), step, values, messages }), then).await?;
        Ok(checkpoint_id)
    }

    /// Writes what is staged, then `kinds`, the checkpoint (with its VALUES event) and `after`: a lone
    /// event on PostgreSQL in one statement, anything else in one transaction. Fences on failure.
    async fn write(&self, kinds: Vec<Kind>, checkpoint: Option<NewCheckpoint>, after: Vec<Kind>) -> Result<(), Fenced> {
        self.check()?;
        let (mut events, usage, title, known_head, known_usage) = {
            let mut guard = self.staged.lock().unwrap_or_else(|p| p.into_inner());
            let taken = (std::mem::take(&mut guard.events), std::mem::take(&mut guard.usage), guard.title.take());
            (taken.0, taken.1, taken.2, guard.head.clone(), guard.usage_total.clone())
        };
        events.extend(kinds);
        if let Some(c) = &checkpoint {
            let message_ids = c.messages.iter().map(|m| m.id.clone()).collect();
            events.push(Kind::Values(ValuesEvent {
                values: Some(c.values.clone()),
                message_ids,
                checkpoint_id: c.checkpoint_id.clone(),
                step: c.step,
            }));
        }
        events.extend(after);
        // A checkpoint always brings its VALUES event, so no events means no checkpoint either.
        if events.is_empty() && usage.is_empty() && title.is_none() {
            return Ok(());
        }
        let batch = Batch { events, usage, title, checkpoint };
        let engine = &self.engine;
        let spec = &self.spec;
        // The streaming hot path on PostgreSQL: one event, nothing else, one statement.
        let lone_event = batch.events.len() == 1
            && batch.checkpoint.is_none()
            && batch.usage.is_empty()
            && batch.title.is_none()
            && engine.store.backend() == DbBackend::Postgres;
        let result = match batch.events.first() {
            Some(kind) if lone_event => {
                append_one_postgres(engine.store.db(), &spec.run_id, &spec.thread_id, &engine.worker_id, kind.clone())
                    .await
                    .map(|written| written.map(|event| (vec![event], None)))
            }
            _ => self.transaction(&batch, known_head, known_usage).await,
        };
        match result {
            Ok(Some((written, new_usage))) => {
                {
                    let mut guard = self.staged.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(c) = &batch.checkpoint {
                        guard.head = Some(c.checkpoint_id.clone());
                    }
                    if new_usage.is_some() {
                        guard.usage_total = new_usage;
                    }
                }
                engine.hub.publish(&written);
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
    /// the checkpoint, the thread's head and title, then the events. None when fenced.
    async fn transaction(
        &self,
        batch: &Batch,
        known_head: Option<String>,
        known_usage: Option<RunUsage>,
    ) -> Result<Option<(Vec<RunEvent>, Option<RunUsage>)>, RunsError> {
        let engine = &self.engine;
        let spec = &self.spec;
        let Batch { events, usage, title, checkpoint } = batch;
        engine
            .store
            .retry_busy(|| async {
                let tx = engine.store.tx().await?;
                let now = now_ms();
                // Usage totals: known from this attempt's last write, read once otherwise.
                let mut new_usage = None;
                if !usage.is_empty() {
                    let mut total = match &known_usage {
                        Some(total) => total.clone(),
                        None => {
                            let run = runs::Entity::find_by_id(spec.run_id.clone()).one(&*tx).await?;
                            run.map(|r| RunUsage::decode(r.usage.as_slice())).transpose()?.unwrap_or_default()
                        }
                    };
                    for (caller, model, usage) in usage {
                        add_usage(&mut total, caller, model, usage);
                    }
                    new_usage = Some(total);
                }
                let columns = new_usage.iter().map(|total| (runs::Column::Usage, sea_orm::Value::from(total.encode_to_vec()))).collect();
                // One statement: still ours? (It also serialises with a concurrent takeover.) Seqs
                // allocated, usage written.
                let Some(written) =
                    append_setting(&*tx, &spec.run_id, &spec.thread_id, Writer::Owner(&engine.worker_id), events.clone(), columns).await?
                else {
                    return Ok(None);
                };
                if let Some(c) = &checkpoint {
                    let parent = match &known_head {
                        Some(head) => Some(head.clone()),
                        None => threads::Entity::find_by_id((spec.user_id.clone(), spec.thread_id.clone()))
                            .one(&*tx)
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
                    checkpoints::Entity::insert(checkpoints::ActiveModel::from(checkpoints::Model {
                        checkpoint_id: c.checkpoint_id.clone(),
                        user_id: spec.user_id.clone(),
                        thread_id: spec.thread_id.clone(),
                        parent_checkpoint_id: parent,
                        run_id: Some(spec.run_id.clone()),
                        step: c.step,
                        state: state.encode_to_vec(),
                        created_at: now,
                    }))
                    .exec_without_returning(&*tx)
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
                    update
                        .filter(threads::Column::UserId.eq(spec.user_id.as_str()))
                        .filter(threads::Column::ThreadId.eq(spec.thread_id.as_str()))
                        .exec(&*tx)
                        .await?;
                }
                tx.commit().await?;
                Ok::<_, RunsError>(Some((written, new_usage)))
            })
            .await
    }

    /// Records the usage of one model call now. `caller` is `lead_agent`, `subagent:<name>` or
    /// `middleware:<name>`.
    pub async fn record_usage(&self, caller: &str, model: &str, usage: &Usage) -> Result<(), Fenced> {
        self.stage_usage(caller, model, usage);
        self.flush().await
    }
}

/// Everything one write commits.
struct Batch {
    /// In log order: staged events, the caller's, the checkpoint's VALUES, then what follows it.
    events: Vec<Kind>,
    usage: Vec<(String, String, Usage)>,
    title: Option<String>,
    checkpoint: Option<NewCheckpoint>,
}

/// A checkpoint to write.
struct NewCheckpoint {
    checkpoint_id: String,
    step: i64,
    values: prost_types::Struct,
    messages: Vec<Message>,
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
