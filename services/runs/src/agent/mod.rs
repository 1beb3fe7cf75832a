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
use antler_proto::runs::{Checkpoint, CreateRunRequest, RunUsage, ValuesEvent};
use futures::future::BoxFuture;
use prost::Message as _;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, LocalRun, StopCause};
use crate::error::RunsError;
use crate::lifecycle::RUNNING;
use crate::lifecycle::finalize::Outcome;
use crate::store::entity::{checkpoints, runs, threads};
use crate::store::now_ms;
use crate::stream::{Writer, append};

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
    /// The admitted request (secrets removed).
    pub request: CreateRunRequest,
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
        self.check()?;
        let engine = &self.engine;
        let written = engine
            .store
            .retry_busy(|| async {
                let tx = engine.store.tx().await?;
                let event = append(&*tx, &self.spec.run_id, &self.spec.thread_id, Writer::Owner(&engine.worker_id), kind.clone()).await?;
                tx.commit().await?;
                Ok::<_, RunsError>(event)
            })
            .await;
        match written {
            Ok(Some(event)) => {
                engine.hub.publish(&[event]);
                Ok(())
            }
            Ok(None) => Err(self.fence()),
            Err(error) => {
                tracing::warn!(run_id = %self.spec.run_id, %error, "event not written");
                Err(self.fence())
            }
        }
    }

    /// Saves the thread state after a step; it becomes the thread's head and the resume point of
    /// this run. Emits a VALUES event.
    pub async fn checkpoint(&self, step: i64, values: prost_types::Struct, messages: Vec<Message>) -> Result<String, Fenced> {
        self.check()?;
        let engine = &self.engine;
        let checkpoint_id = uuid::Uuid::now_v7().to_string();
        let result = engine
            .store
            .retry_busy(|| async {
                let tx = engine.store.tx().await?;
                let now = now_ms();
                // Still ours? (Touching the row also serialises with a concurrent takeover.)
                let owned = runs::Entity::update_many()
                    .col_expr(runs::Column::UpdatedAt, Expr::value(now))
                    .filter(runs::Column::RunId.eq(self.spec.run_id.as_str()))
                    .filter(runs::Column::OwnerWorkerId.eq(engine.worker_id.as_str()))
                    .filter(runs::Column::Status.eq(RUNNING))
                    .exec(&*tx)
                    .await?
                    .rows_affected;
                if owned == 0 {
                    return Ok(None);
                }
                let head: Option<Option<String>> = threads::Entity::find_by_id((self.spec.user_id.clone(), self.spec.thread_id.clone()))
                    .one(&*tx)
                    .await?
                    .map(|t| t.head_checkpoint_id);
                let parent = head.flatten();
                let message_ids: Vec<String> = messages.iter().map(|m| m.id.clone()).collect();
                let checkpoint = Checkpoint {
                    checkpoint_id: checkpoint_id.clone(),
                    parent_checkpoint_id: parent.clone().unwrap_or_default(),
                    step,
                    values: Some(values.clone()),
                    created_at: Some(crate::time::to_timestamp(now)),
                    run_id: self.spec.run_id.clone(),
                    messages: messages.clone(),
                    source: "loop".to_owned(),
                };
                checkpoints::Entity::insert(checkpoints::ActiveModel::from(checkpoints::Model {
                    checkpoint_id: checkpoint_id.clone(),
                    user_id: self.spec.user_id.clone(),
                    thread_id: self.spec.thread_id.clone(),
                    parent_checkpoint_id: parent,
                    run_id: Some(self.spec.run_id.clone()),
                    step,
                    state: checkpoint.encode_to_vec(),
                    created_at: now,
                }))
                .exec_without_returning(&*tx)
                .await?;
                threads::Entity::update_many()
                    .col_expr(threads::Column::HeadCheckpointId, Expr::value(checkpoint_id.as_str()))
                    .col_expr(threads::Column::UpdatedAt, Expr::value(now))
                    .filter(threads::Column::UserId.eq(self.spec.user_id.as_str()))
                    .filter(threads::Column::ThreadId.eq(self.spec.thread_id.as_str()))
                    .exec(&*tx)
                    .await?;
                let values_event =
                    Kind::Values(ValuesEvent { values: Some(values.clone()), message_ids, checkpoint_id: checkpoint_id.clone(), step });
                let event = append(&*tx, &self.spec.run_id, &self.spec.thread_id, Writer::Owner(&engine.worker_id), values_event).await?;
                tx.commit().await?;
                Ok::<_, RunsError>(event)
            })
            .await;
        match result {
            Ok(Some(event)) => {
                engine.hub.publish(&[event]);
                Ok(checkpoint_id)
            }
            Ok(None) => Err(self.fence()),
            Err(error) => {
                tracing::warn!(run_id = %self.spec.run_id, %error, "checkpoint not written");
                Err(self.fence())
            }
        }
    }

    /// Records the usage of one model call. `caller` is `lead_agent`, `subagent:<name>` or
    /// `middleware:<name>`.
    pub async fn record_usage(&self, caller: &str, model: &str, usage: &Usage) -> Result<(), Fenced> {
        self.check()?;
        let engine = &self.engine;
        let result = engine
            .store
            .retry_busy(|| async {
                let tx = engine.store.tx().await?;
                let Some(run) = runs::Entity::find_by_id(self.spec.run_id.clone())
                    .filter(runs::Column::OwnerWorkerId.eq(engine.worker_id.as_str()))
                    .filter(runs::Column::Status.eq(RUNNING))
                    .one(&*tx)
                    .await?
                else {
                    return Ok(false);
                };
                let mut total = RunUsage::decode(run.usage.as_slice())?;
                add_usage(&mut total, caller, model, usage);
                runs::Entity::update_many()
                    .col_expr(runs::Column::Usage, Expr::value(total.encode_to_vec()))
                    .filter(runs::Column::RunId.eq(self.spec.run_id.as_str()))
                    .exec(&*tx)
                    .await?;
                tx.commit().await?;
                Ok::<_, RunsError>(true)
            })
            .await;
        match result {
            Ok(true) => {
                metrics::counter!("antler_tokens_total", "caller" => caller_bucket(caller)).increment(usage.total_tokens);
                Ok(())
            }
            _ => Err(self.fence()),
        }
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
