//! What an agent needs from the run it executes, and nothing more: the runs service implements
//! [`Host`] over its store; [`crate::memory_host::MemoryHost`] implements it in memory for tests.

use antler_proto::common::{Message, Usage};
use antler_proto::runs::run_event::Kind;
use futures::future::BoxFuture;

/// The worker lost ownership of the run; the agent must stop and write nothing more.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("this worker no longer owns the run")]
pub struct Fenced;

/// Everything one host write commits, atomically and in this order.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// In log order: staged events, the caller's, the checkpoint's VALUES, then what follows it.
    pub events: Vec<Kind>,
    /// Model calls to add to the run's usage: (caller tag, model name, usage).
    pub usage: Vec<(String, String, Usage)>,
    /// A new title for the thread.
    pub title: Option<String>,
    /// The thread state after a step: becomes the thread's head and the run's resume point.
    pub checkpoint: Option<NewCheckpoint>,
    /// Journal results to record with the rest (tool calls whose intent is recorded): a tool whose
    /// result must be recorded exactly once together with its events and usage (`task`) uses this.
    pub results: Vec<EffectResult>,
}

/// The result of one journalled tool call.
#[derive(Debug, Clone)]
pub struct EffectResult {
    pub tool_call_id: String,
    pub result: String,
    pub is_error: bool,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.usage.is_empty() && self.title.is_none() && self.checkpoint.is_none() && self.results.is_empty()
    }
}

/// A subagent task the `task` tool hands to the host, which runs it as a child run of this run
/// (admitted once per `task_id`: an attempt that resumes the parent finds its child again).
#[derive(Debug, Clone, Default)]
pub struct SubagentCall {
    /// The `task` tool call id.
    pub task_id: String,
    pub subagent_type: String,
    /// The short description the lead agent gave.
    pub description: String,
    /// The task itself: the child run's input.
    pub prompt: String,
    /// The child's model ("" = the server default).
    pub model_name: String,
    /// Model turns before the child stops with `turn_capped`.
    pub max_turns: u32,
    /// The child's wall-clock limit (it ends TIMEOUT past it).
    pub timeout: std::time::Duration,
    /// The child's token budget (0 = none).
    pub token_budget: u64,
    /// The call's arguments as JSON, for the journal intent the host writes with the child's
    /// admission (see [`Host::subagent`]).
    pub arguments: String,
}

/// What the host reports about a child run, in this order: `Started` (again after each takeover),
/// any number of `Step`s, then `Ended`. The channel closes without `Ended` only when this attempt of
/// the parent must stop (cancelled, fenced, shutting down).
#[derive(Debug, Clone)]
pub enum SubagentUpdate {
    Started {
        child_run_id: String,
        attempt: u32,
        model_name: String,
        /// The host wrote the parent's `subagent` START event itself (in the child's admission
        /// transaction, one commit sooner); the `task` call writes it otherwise.
        announced: bool,
    },
    /// The child produced an assistant message.
    Step {
        message: Message,
    },
    Ended(SubagentEnd),
}

/// How a child run ended, as the parent's `task` call reports it.
#[derive(Debug, Clone, Default)]
pub struct SubagentEnd {
    pub child_run_id: String,
    pub status: antler_proto::runs::SubagentStatus,
    /// The child's final answer (its last assistant message with text).
    pub result: String,
    pub error: String,
    /// `token_capped`, `turn_capped`, `loop_capped`, … (empty: a plain final answer).
    pub stop_reason: String,
    /// The child run's total usage.
    pub usage: Usage,
    pub model_name: String,
}

/// A checkpoint to write.
#[derive(Debug, Clone)]
pub struct NewCheckpoint {
    pub checkpoint_id: String,
    pub step: i64,
    pub values: prost_types::Struct,
    pub messages: Vec<Message>,
}

/// What the side-effect journal knows about one tool call of this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Never started.
    None,
    /// Started (intent recorded) but its result was never recorded: the outcome is unknown.
    Unknown,
    /// Finished, with this result.
    Done { result: String, is_error: bool },
}

/// The run, as the agent sees it. Every method fails with [`Fenced`] once this worker no longer
/// owns the run, and writes nothing then.
pub trait Host: Send + Sync {
    /// Commits `batch` in one write (events durable before any subscriber sees them).
    fn write(&self, batch: Batch) -> BoxFuture<'_, Result<(), Fenced>>;

    /// Whether the worker was fenced (or released the run at shutdown): nothing may be written.
    fn fenced(&self) -> bool;

    /// The journal's record of `tool_call_id`.
    fn effect<'a>(&'a self, tool_call_id: &'a str) -> BoxFuture<'a, Result<Effect, Fenced>>;

    /// Records that `tool_call_id` is about to run (durable before the call starts).
    fn record_intent<'a>(&'a self, tool_call_id: &'a str, tool_name: &'a str, arguments: &'a str) -> BoxFuture<'a, Result<(), Fenced>>;

    /// Records the result of `tool_call_id`.
    fn record_result<'a>(&'a self, tool_call_id: &'a str, result: &'a str, is_error: bool) -> BoxFuture<'a, Result<(), Fenced>>;

    /// Runs `call` as a child run of this run (or finds the one an earlier attempt started) and
    /// reports on it through the returned channel. The journal intent of the `task` call (tool name
    /// `task`, `call.arguments`) is the host's to write, durable no later than the child's admission
    /// (the runs host writes both in one transaction, which saves a commit before the child starts).
    /// Nothing the caller holds is held while it waits: the child executes in a task of its own.
    /// Hosts without child runs record the intent and answer with one `Ended` (failed) update.
    fn subagent(&self, call: SubagentCall) -> BoxFuture<'_, Result<tokio::sync::mpsc::Receiver<SubagentUpdate>, Fenced>> {
        Box::pin(async move {
            self.record_intent(&call.task_id, "task", &call.arguments).await?;
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let end = SubagentEnd {
                status: antler_proto::runs::SubagentStatus::Failed,
                error: format!("this host cannot run subagents (task {})", call.task_id),
                ..SubagentEnd::default()
            };
            let _ = tx.send(SubagentUpdate::Ended(end)).await;
            Ok(rx)
        })
    }
}
