//! Antler's threads, runs, states and agents as the JSON objects of the LangGraph API
//! (`Thread`, `Run`, `ThreadState`, `Assistant` of langgraph-sdk's `schema.py`).

use antler_kit::json::struct_to_json;
use antler_proto::runs::{Checkpoint, MultitaskStrategy, Run, RunStatus, Thread, ThreadState, ThreadStatus};
use serde_json::{Value, json};

use super::stream::{clarification_json, run_status, state_values};
use antler_runs::config::AgentKind;

/// RFC 3339, as LangGraph writes times.
pub fn time(ts: Option<&prost_types::Timestamp>) -> Value {
    ts.map(|t| Value::String(t.to_string())).unwrap_or(Value::Null)
}

pub fn thread_status(status: ThreadStatus) -> &'static str {
    match status {
        ThreadStatus::Busy => "busy",
        ThreadStatus::Interrupted => "interrupted",
        ThreadStatus::Error => "error",
        ThreadStatus::Unspecified | ThreadStatus::Idle => "idle",
    }
}

pub fn strategy(strategy: i32) -> &'static str {
    match MultitaskStrategy::try_from(strategy) {
        Ok(MultitaskStrategy::Interrupt) => "interrupt",
        Ok(MultitaskStrategy::Rollback) => "rollback",
        Ok(MultitaskStrategy::Enqueue) => "enqueue",
        _ => "reject",
    }
}

/// A thread. `values` is the caller's choice: the whole state for GET /threads/{id}, the channels
/// only (title, todos, artifacts…, no messages) in search results.
pub fn thread(thread: &Thread, values: Value, interrupts: Value) -> Value {
    json!({
        "thread_id": thread.thread_id,
        "created_at": time(thread.created_at.as_ref()),
        "updated_at": time(thread.updated_at.as_ref()),
        "state_updated_at": time(thread.updated_at.as_ref()),
        "metadata": thread.metadata.as_ref().map(struct_to_json).unwrap_or_else(|| json!({})),
        "status": thread_status(ThreadStatus::try_from(thread.status).unwrap_or(ThreadStatus::Idle)),
        "values": values,
        "interrupts": interrupts,
        "config": {},
    })
}

/// The channels of a thread listing (`Thread.values` of ListThreads) with its title.
pub fn listed_values(thread: &Thread) -> Value {
    let mut values = match thread.values.as_ref().map(struct_to_json) {
        Some(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    for hidden in ["lead_step", "outputs_before", "promoted"] {
        values.remove(hidden);
    }
    if !thread.title.is_empty() {
        values.insert("title".to_owned(), Value::String(thread.title.clone()));
    }
    Value::Object(values)
}

/// A thread's pending clarification as LangGraph interrupts: `{task id: [{value, id}]}` on a thread,
/// a plain list on a state.
pub fn interrupts(state: &ThreadState) -> (Value, Value) {
    match &state.pending_clarification {
        Some(c) => {
            let list = json!([{ "value": clarification_json(c), "id": c.interrupt_id }]);
            let mut by_task = serde_json::Map::new();
            by_task.insert(c.tool_call_id.clone(), list.clone());
            (Value::Object(by_task), list)
        }
        None => (json!({}), json!([])),
    }
}

/// LangGraph's checkpoint config: `{thread_id, checkpoint_ns, checkpoint_id, checkpoint_map}` (null
/// for no checkpoint).
pub fn checkpoint_ref(thread_id: &str, checkpoint_id: &str) -> Value {
    if checkpoint_id.is_empty() {
        return Value::Null;
    }
    json!({ "thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id, "checkpoint_map": null })
}

/// A `ThreadState` for one checkpoint (`interrupts` only for the thread's head).
pub fn state(thread_id: &str, checkpoint: Option<&Checkpoint>, interrupts: Value) -> Value {
    let id = checkpoint.map(|c| c.checkpoint_id.as_str()).unwrap_or_default();
    let parent = checkpoint.map(|c| c.parent_checkpoint_id.as_str()).unwrap_or_default();
    json!({
        "values": state_values(checkpoint),
        // Antler's agent finishes its turn before a run ends (no breakpoints), so nothing runs next.
        "next": [],
        "tasks": [],
        "checkpoint": checkpoint_ref(thread_id, id),
        "metadata": match checkpoint {
            Some(c) => json!({ "step": c.step, "source": c.source, "run_id": c.run_id, "parents": {} }),
            None => json!({}),
        },
        "created_at": time(checkpoint.and_then(|c| c.created_at.as_ref())),
        "parent_checkpoint": checkpoint_ref(thread_id, parent),
        "interrupts": interrupts,
        "checkpoint_id": if id.is_empty() { Value::Null } else { Value::String(id.to_owned()) },
        "parent_checkpoint_id": if parent.is_empty() { Value::Null } else { Value::String(parent.to_owned()) },
    })
}

/// A run, with Antler's own outcome fields beside LangGraph's (`stop_reason`, `error`, `attempt`,
/// `usage`, `last_seq`).
pub fn run(run: &Run, assistant_id: &str) -> Value {
    let status = RunStatus::try_from(run.status).unwrap_or(RunStatus::Unspecified);
    let usage = run.usage.clone().unwrap_or_default();
    json!({
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "assistant_id": assistant_id,
        "created_at": time(run.created_at.as_ref()),
        "updated_at": time(run.updated_at.as_ref()),
        "status": run_status(status),
        "metadata": run.metadata.as_ref().map(struct_to_json).unwrap_or_else(|| json!({})),
        "multitask_strategy": strategy(run.multitask_strategy),
        "kwargs": {},
        "stop_reason": if run.stop_reason.is_empty() { Value::Null } else { Value::String(run.stop_reason.clone()) },
        "error": run.error.as_ref().map(|e| json!({ "code": e.code, "message": e.message, "retryable": e.retryable })).unwrap_or(Value::Null),
        "attempt": run.attempt,
        "last_seq": run.last_seq,
        "usage": { "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens, "total_tokens": usage.total_tokens, "llm_calls": usage.llm_calls },
    })
}

/// The one assistant a replica serves: the agent `runs.agent` configures.
#[derive(Debug, Clone)]
pub struct Assistant {
    pub kind: AgentKind,
    /// When this edge started (an assistant's created_at/updated_at).
    pub since: prost_types::Timestamp,
}

impl Assistant {
    pub fn id(&self) -> &'static str {
        match self.kind {
            AgentKind::Lead => "lead",
            AgentKind::Script => "script",
        }
    }

    /// The LangGraph graph id: DeerFlow's `lead_agent` for the lead agent.
    pub fn graph_id(&self) -> &'static str {
        match self.kind {
            AgentKind::Lead => "lead_agent",
            AgentKind::Script => "script",
        }
    }

    /// Whether a client's `assistant_id` names this assistant: its id, its graph id, or those with
    /// `_` and `-` interchanged and any case (DeerFlow's UI sends `lead_agent`).
    pub fn answers_to(&self, requested: &str) -> bool {
        let norm = |s: &str| s.trim().to_ascii_lowercase().replace('_', "-");
        let wanted = norm(requested);
        wanted == norm(self.id()) || wanted == norm(self.graph_id())
    }

    pub fn to_json(&self) -> Value {
        let description = match self.kind {
            AgentKind::Lead => "Antler's lead agent: a model ⇄ tools loop with DeerFlow's middlewares (runs.agent: lead)",
            AgentKind::Script => "Antler's deterministic script agent, no model (runs.agent: script)",
        };
        json!({
            "assistant_id": self.id(),
            "graph_id": self.graph_id(),
            "name": self.id(),
            "description": description,
            "config": {},
            "context": {},
            "metadata": { "created_by": "system" },
            "version": 1,
            "created_at": time(Some(&self.since)),
            "updated_at": time(Some(&self.since)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deerflow_assistant_ids_map_to_the_lead_agent() {
        let lead = Assistant { kind: AgentKind::Lead, since: prost_types::Timestamp::default() };
        for id in ["lead", "lead_agent", "lead-agent", "Lead_Agent"] {
            assert!(lead.answers_to(id), "{id}");
        }
        assert!(!lead.answers_to("script"));
        assert!(!lead.answers_to("agent"));
    }

    #[test]
    fn run_statuses_read_as_langgraph_s() {
        assert_eq!(run_status(RunStatus::Finalizing), "running");
        assert_eq!(run_status(RunStatus::Interrupted), "interrupted");
        assert_eq!(run_status(RunStatus::Timeout), "timeout");
    }
}
