//! What an agent needs from the run it executes, and nothing more: the runs service implements
//! [`Host`] over its store; [`crate::memory::MemoryHost`] implements it in memory for tests.

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
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.usage.is_empty() && self.title.is_none() && self.checkpoint.is_none()
    }
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
}
