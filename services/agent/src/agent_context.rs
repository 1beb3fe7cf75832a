//! [`AgentContext`]: the agent's handle on its run. It stages what can wait for the next write and
//! turns every write into one [`Batch`] for the [`Host`].

use std::sync::{Arc, Mutex};

use antler_proto::common::{Message, Usage};
use antler_proto::runs::ValuesEvent;
use antler_proto::runs::run_event::Kind;
use tokio_util::sync::CancellationToken;

use crate::host::{Batch, Effect, EffectResult, Fenced, Host, NewCheckpoint, SubagentCall, SubagentUpdate};
use crate::spec::RunSpec;

/// See the module documentation.
#[derive(Clone)]
pub struct AgentContext {
    pub spec: RunSpec,
    host: Arc<dyn Host>,
    cancel: CancellationToken,
    clients: antler_kit::Clients,
    /// Events, usage and a title held back to be written with the next write (see [`Self::stage`]).
    staged: Arc<Mutex<Batch>>,
    /// Tokens of the model calls staged by this attempt (shared by clones, like `staged`).
    spent: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext").field("run_id", &self.spec.run_id).finish_non_exhaustive()
    }
}

impl AgentContext {
    /// The context of one attempt: `cancel` fires when the agent must stop (cancel, fencing,
    /// shutdown, timeout).
    pub fn new(spec: RunSpec, host: Arc<dyn Host>, cancel: CancellationToken, clients: antler_kit::Clients) -> Self {
        Self { spec, host, cancel, clients, staged: Arc::default(), spent: Arc::default() }
    }

    /// Channels to the other services (sandbox, models, …).
    pub fn clients(&self) -> &antler_kit::Clients {
        &self.clients
    }

    /// The identity calls made for this run carry: the run's user, presented with this service's
    /// `clients.<service>.service_token` (the worker has no caller token of its own), and the run
    /// attempt as the fencing token the sandbox service enforces.
    pub fn call_context(&self) -> antler_kit::CallContext {
        antler_kit::CallContext::background(self.spec.user_id.clone()).for_run(self.spec.run_id.clone(), self.spec.attempt)
    }

    /// Fires when the agent must stop (cancel, fencing, shutdown).
    pub fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }

    fn staged(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends one event (durable before it is delivered to any subscriber).
    pub async fn emit(&self, kind: Kind) -> Result<(), Fenced> {
        self.emit_many(vec![kind]).await
    }

    /// Appends events in one write, after anything staged (so the order of the run's events is the
    /// order the agent produced them).
    pub async fn emit_many(&self, kinds: Vec<Kind>) -> Result<(), Fenced> {
        self.write(kinds, None, Vec::new()).await
    }

    /// Holds an event back to be written in the same write as the next checkpoint (or the next
    /// [`emit`](Self::emit) / [`flush`](Self::flush)): a step's results and its checkpoint become
    /// durable together, in one write instead of several. Use it for events a live client can wait a
    /// step for (the finished message, tool results); stream deltas with `emit`.
    pub fn stage(&self, kind: Kind) {
        self.staged().events.push(kind);
    }

    /// Holds one model call's usage back to be added to the run's totals with the next write.
    /// `caller` is `lead_agent`, `subagent:<name>` or `middleware:<name>`.
    pub fn stage_usage(&self, caller: &str, model: &str, usage: &Usage) {
        let total = if usage.total_tokens > 0 { usage.total_tokens } else { usage.input_tokens + usage.output_tokens };
        self.spent.fetch_add(total, std::sync::atomic::Ordering::Relaxed);
        self.staged().usage.push((caller.to_owned(), model.to_owned(), *usage));
    }

    /// Tokens the run has spent so far: earlier attempts plus every model call of this one.
    pub fn tokens_spent(&self) -> u64 {
        self.spec.tokens_before + self.spent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the title of the run's thread (at most 256 characters are kept, the API's limit), written
    /// with the next checkpoint or flush.
    pub fn stage_thread_title(&self, title: &str) {
        self.staged().title = Some(title.chars().take(256).collect());
    }

    /// Writes whatever is staged.
    pub async fn flush(&self) -> Result<(), Fenced> {
        self.emit_many(Vec::new()).await
    }

    /// Records the usage of one model call now.
    pub async fn record_usage(&self, caller: &str, model: &str, usage: &Usage) -> Result<(), Fenced> {
        self.stage_usage(caller, model, usage);
        self.flush().await
    }

    /// Saves the thread state after a step; it becomes the thread's head and the resume point of
    /// this run. Emits a VALUES event after the staged ones, in the same write.
    pub async fn checkpoint(&self, step: i64, values: prost_types::Struct, messages: Vec<Message>) -> Result<String, Fenced> {
        self.checkpoint_then(step, values, messages, Vec::new()).await
    }

    /// [`checkpoint`](Self::checkpoint), with `then` appended after its VALUES event in the same
    /// write (the loop announces the next tool round's TOOL_STARTED events this way).
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

    /// Writes what is staged, then `kinds`, the checkpoint (with its VALUES event) and `after`.
    async fn write(&self, kinds: Vec<Kind>, checkpoint: Option<NewCheckpoint>, after: Vec<Kind>) -> Result<(), Fenced> {
        if self.host.fenced() {
            return Err(Fenced);
        }
        let mut batch = std::mem::take(&mut *self.staged());
        batch.events.extend(kinds);
        if let Some(c) = &checkpoint {
            let message_ids = c.messages.iter().map(|m| m.id.clone()).collect();
            batch.events.push(Kind::Values(ValuesEvent {
                values: Some(c.values.clone()),
                message_ids,
                checkpoint_id: c.checkpoint_id.clone(),
                step: c.step,
            }));
        }
        batch.events.extend(after);
        batch.checkpoint = checkpoint;
        if batch.is_empty() {
            return Ok(());
        }
        self.host.write(batch).await
    }

    /// Writes what is staged, then `kinds`, and records `result` in the journal, in one write: the
    /// events, the usage staged with them and the journal entry are durable together or not at all
    /// (the `task` tool's end: a resumed attempt finds the result and adds the usage no second time).
    pub async fn finish_effect(&self, kinds: Vec<Kind>, result: EffectResult) -> Result<(), Fenced> {
        if self.host.fenced() {
            return Err(Fenced);
        }
        let mut batch = std::mem::take(&mut *self.staged());
        batch.events.extend(kinds);
        batch.results.push(result);
        self.host.write(batch).await
    }

    /// Runs a subagent task as a child run of this run (see [`Host::subagent`]).
    pub async fn subagent(&self, call: SubagentCall) -> Result<tokio::sync::mpsc::Receiver<SubagentUpdate>, Fenced> {
        if self.host.fenced() {
            return Err(Fenced);
        }
        self.host.subagent(call).await
    }

    /// The journal's record of `tool_call_id` (see [`Effect`]).
    pub async fn effect(&self, tool_call_id: &str) -> Result<Effect, Fenced> {
        self.host.effect(tool_call_id).await
    }

    /// Records that `tool_call_id` is about to run (durable before the call starts).
    pub async fn record_intent(&self, tool_call_id: &str, tool_name: &str, arguments: &str) -> Result<(), Fenced> {
        self.host.record_intent(tool_call_id, tool_name, arguments).await
    }

    /// Records the result of `tool_call_id`.
    pub async fn record_result(&self, tool_call_id: &str, result: &str, is_error: bool) -> Result<(), Fenced> {
        self.host.record_result(tool_call_id, result, is_error).await
    }
}
