//! `task(description, prompt, subagent_type)`: delegates one task to a subagent (DeerFlow's task
//! tool). The subagent is a child run of this run (see `Host::subagent`): its own attempt, lease,
//! checkpoints, events and usage; this call reports its progress as `subagent` events (START, a STEP
//! per assistant message, END) and returns its final answer in DeerFlow's wording.
//!
//! Exactly once: the call's result, its END event and the child's usage (added to this run's
//! `subagent_tokens`) are written in one write with the journal entry of the call. An attempt that
//! resumes this run finds the entry and returns the result again without counting anything twice;
//! without an entry it asks the host again, which finds the same child run (one per task id) and
//! waits on it — or takes it over when its worker died.

use std::collections::BTreeMap;
use std::sync::Arc;

use antler_proto::common::{ToolCall, ToolSpec, Usage, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{SubagentEvent, SubagentPhase, SubagentStatus};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;
use crate::lead::subagents::SubagentDef;
use crate::{Effect, EffectResult, SubagentCall, SubagentEnd, SubagentUpdate};

/// See the module documentation.
pub struct Task {
    types: Arc<BTreeMap<String, SubagentDef>>,
    spec: Arc<ToolSpec>,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").field("types", &self.types.keys().collect::<Vec<_>>()).finish()
    }
}

const DESCRIPTION: &str = "Delegate a task to a specialized subagent that works in its own context and reports back.\n\n\
Subagents help you:\n\
- Keep your context small: exploration and implementation happen in the subagent\n\
- Handle complex multi-step work autonomously\n\
- Do independent pieces of work in parallel (several task calls in one turn run at the same time)\n\n\
The subagent shares your workspace (/mnt/user-data) but not your conversation: give it everything it needs in the \
prompt. It cannot ask the user questions. You receive only its final answer.\n\n\
Available subagent types:";

impl Task {
    pub fn new(types: BTreeMap<String, SubagentDef>) -> Self {
        let mut description = DESCRIPTION.to_owned();
        for (name, def) in &types {
            description.push_str(&format!("\n- **{name}**: {}", def.description.trim()));
        }
        description.push_str(
            "\n\nWhen NOT to use it: for a single quick step you can do yourself (reading one file, one command), \
             or when the task needs the user's input.",
        );
        let names: Vec<&String> = types.keys().collect();
        let parameters = json!({
            "type": "object",
            "properties": {
                "description": {"type": "string", "description": "A short (3-5 word) description of the task, for logging and display. ALWAYS PROVIDE THIS PARAMETER FIRST."},
                "prompt": {"type": "string", "description": "The task for the subagent. Be specific and complete: what to do, where, and what to report back. ALWAYS PROVIDE THIS PARAMETER SECOND."},
                "subagent_type": {"type": "string", "enum": names, "description": "The type of subagent to use. ALWAYS PROVIDE THIS PARAMETER THIRD."}
            },
            "required": ["description", "prompt", "subagent_type"]
        });
        let spec = super::spec_with_schema("task".to_owned(), description, &parameters);
        Self { types: Arc::new(types), spec: Arc::new(spec) }
    }
}

/// The tool result the lead agent reads, in DeerFlow's wording, and whether it is an error.
pub fn result_text(end: &SubagentEnd) -> (String, bool) {
    match end.status {
        SubagentStatus::Completed => {
            let capped = match end.stop_reason.as_str() {
                "token_capped" => Some("token budget"),
                "turn_capped" => Some("turn budget"),
                "loop_capped" => Some("repeated tool-call loop"),
                _ => None,
            };
            match capped {
                Some(cap) => (format!("Task Succeeded (capped: {cap}). Result: {}", end.result), false),
                None => (format!("Task Succeeded. Result: {}", end.result), false),
            }
        }
        SubagentStatus::TimedOut => (format!("Task timed out. Error: {}", end.error), true),
        SubagentStatus::Cancelled => (format!("Task cancelled by user. Error: {}", end.error), true),
        _ => (format!("Task failed. Error: {}", end.error), true),
    }
}

fn add(total: &mut Usage, usage: &Usage) {
    total.input_tokens += usage.input_tokens;
    total.output_tokens += usage.output_tokens;
    total.total_tokens += if usage.total_tokens > 0 { usage.total_tokens } else { usage.input_tokens + usage.output_tokens };
    total.cache_read_tokens += usage.cache_read_tokens;
    total.reasoning_tokens += usage.reasoning_tokens;
}

impl Tool for Task {
    fn name(&self) -> &'static str {
        "task"
    }

    fn description(&self) -> &str {
        &self.spec.description
    }

    fn parameters(&self) -> Value {
        serde_json::from_str(&self.spec.parameters_json).unwrap_or(Value::Null)
    }

    fn own_spec(&self) -> Option<Arc<ToolSpec>> {
        Some(self.spec.clone())
    }

    fn call<'a>(&'a self, _env: &'a RunEnv, _args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async { Ok(ToolOutput::error("Error: the task tool needs its call id")) })
    }

    fn call_for<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let description = args.string("description").unwrap_or_default();
            let prompt = args.required("prompt")?;
            let subagent_type = args.required("subagent_type")?;
            let Some(def) = self.types.get(&subagent_type) else {
                let names: Vec<&str> = self.types.keys().map(String::as_str).collect();
                return Ok(ToolOutput::error(format!("Unknown subagent type '{subagent_type}'. Available: {}", names.join(", "))));
            };
            let ctx = &env.ctx;
            let stopping = |_| ToolError::Stopping;
            // A result recorded by an earlier attempt: its events and usage were written with it.
            if let Effect::Done { result, is_error } = ctx.effect(&call.id).await.map_err(stopping)? {
                tracing::info!(run_id = %ctx.spec.run_id, task_id = %call.id, "subagent result reused from the journal");
                return Ok(ToolOutput { text: result, is_error, outcome_unknown: false });
            }
            // DeerFlow hides and refuses the `bash` subagent where host bash is off; here the sandbox
            // says whether it runs commands (it is acquired on first use, after the prompt was built,
            // so the type stays listed and is refused at the call).
            // A sandbox that cannot be reached is that error, not a refusal.
            if subagent_type == "bash" && !env.exec_enabled().await? {
                return Ok(ToolOutput::error(BASH_REFUSED));
            }
            // The journal intent is written by the host together with the child's admission.
            let arguments = serde_json::Value::Object(args.0.clone()).to_string();
            let lead_model = ctx.spec.request.config.as_ref().map(|c| c.model_name.clone()).unwrap_or_default();
            let request = SubagentCall {
                task_id: call.id.clone(),
                subagent_type: subagent_type.clone(),
                description: description.clone(),
                prompt,
                model_name: def.model_for(&lead_model),
                max_turns: def.max_turns,
                timeout: std::time::Duration::from_secs(def.timeout_seconds),
                token_budget: def.token_budget,
                arguments,
            };
            let mut updates = ctx.subagent(request).await.map_err(stopping)?;
            let cancel = ctx.cancelled();
            let event = |phase: SubagentPhase, child_run_id: &str| subagent_event(&call.id, &subagent_type, phase, child_run_id);
            let (mut child, mut used) = (String::new(), Usage::default());
            loop {
                // Nothing is held while waiting: the child runs in a task of its own.
                let update = tokio::select! {
                    update = updates.recv() => update,
                    () = cancel.cancelled() => return Err(ToolError::Stopping),
                };
                match update {
                    // The parent's attempt is stopping (cancel, fencing, shutdown).
                    None => return Err(ToolError::Stopping),
                    Some(SubagentUpdate::Started { child_run_id, attempt, model_name, announced }) => {
                        tracing::info!(run_id = %ctx.spec.run_id, task_id = %call.id, %child_run_id, attempt, "subagent started");
                        child = child_run_id;
                        if !announced {
                            let start = start_event(&call.id, &subagent_type, &description, &child, model_name);
                            ctx.emit(Kind::Subagent(start)).await.map_err(stopping)?;
                        }
                    }
                    Some(SubagentUpdate::Step { message }) => {
                        if let Some(usage) = &message.usage {
                            add(&mut used, usage);
                        }
                        let step = SubagentEvent { message: Some(message), usage: Some(used), ..event(SubagentPhase::Step, &child) };
                        ctx.emit(Kind::Subagent(step)).await.map_err(stopping)?;
                    }
                    Some(SubagentUpdate::Ended(end)) => {
                        let closing = closing(&call.id, &subagent_type, &child, &end);
                        if let Some((caller, model, usage)) = &closing.usage {
                            ctx.stage_usage(caller, model, usage);
                        }
                        let (text, is_error) = (closing.record.result.clone(), closing.record.is_error);
                        ctx.finish_effect(vec![Kind::Subagent(closing.event)], closing.record).await.map_err(stopping)?;
                        return Ok(ToolOutput { text, is_error, outcome_unknown: false });
                    }
                }
            }
        })
    }
}

/// What a `bash` task gets when the sandbox refuses commands.
pub const BASH_REFUSED: &str = "Error: the bash subagent runs shell commands, and this sandbox refuses them (the local provider \
     without sandbox.allow_host_bash is not an isolation boundary). Use the general-purpose subagent, or ask an operator to \
     use the bwrap provider.";

/// The parent's `subagent` START event of a task (written by the host when it admits the child, or
/// by the `task` call on a takeover).
pub fn start_event(task_id: &str, subagent_type: &str, description: &str, child_run_id: &str, model_name: String) -> SubagentEvent {
    SubagentEvent {
        description: description.to_owned(),
        model_name,
        ..subagent_event(task_id, subagent_type, SubagentPhase::Start, child_run_id)
    }
}

/// What closing a task writes to its parent run, in one batch: the `subagent` END event, the child's
/// usage under the `subagent:<type>` caller, and the journal result of the `task` call.
#[derive(Debug, Clone)]
pub struct Closing {
    pub event: SubagentEvent,
    /// (caller tag, model, usage), when the child spent any tokens.
    pub usage: Option<(String, String, Usage)>,
    pub record: EffectResult,
}

/// The [`Closing`] of task `task_id` that ended as `end`: written by the `task` call, or by the runs
/// service for a parent whose attempt stopped (cancelled, timed out) while the child ran, so that
/// every START in the parent's log has its END. `child_run_id` stands in when `end` names none.
pub fn closing(task_id: &str, subagent_type: &str, child_run_id: &str, end: &SubagentEnd) -> Closing {
    let (text, is_error) = result_text(end);
    let total = end.usage.total_tokens.max(end.usage.input_tokens + end.usage.output_tokens);
    let usage = (total > 0).then(|| {
        let model = if end.model_name.is_empty() { "default" } else { end.model_name.as_str() };
        (format!("subagent:{subagent_type}"), model.to_owned(), end.usage)
    });
    let child_run_id = if end.child_run_id.is_empty() { child_run_id } else { end.child_run_id.as_str() };
    metrics::counter!("antler_subagent_tasks_total", "status" => status_label(end.status)).increment(1);
    let event = SubagentEvent {
        status: end.status as i32,
        result: end.result.clone(),
        error: end.error.clone(),
        stop_reason: end.stop_reason.clone(),
        usage: Some(end.usage),
        ..subagent_event(task_id, subagent_type, SubagentPhase::End, child_run_id)
    };
    Closing { event, usage, record: EffectResult { tool_call_id: task_id.to_owned(), result: text, is_error } }
}

/// The fields every `subagent` event of a task carries.
fn subagent_event(task_id: &str, subagent_type: &str, phase: SubagentPhase, child_run_id: &str) -> SubagentEvent {
    SubagentEvent {
        task_id: task_id.to_owned(),
        phase: phase as i32,
        subagent_type: subagent_type.to_owned(),
        child_run_id: child_run_id.to_owned(),
        ..SubagentEvent::default()
    }
}

/// The bounded label of a task's ending.
fn status_label(status: SubagentStatus) -> &'static str {
    match status {
        SubagentStatus::Completed => "completed",
        SubagentStatus::TimedOut => "timed_out",
        SubagentStatus::Cancelled => "cancelled",
        _ => "failed",
    }
}

/// The text of an assistant message (its text parts, joined).
pub fn message_text(message: &antler_proto::common::Message) -> String {
    message
        .content
        .iter()
        .filter_map(|p| match &p.part {
            Some(content_part::Part::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_use_deerflow_wording() {
        let end = |status, stop: &str| SubagentEnd {
            status,
            result: "42".to_owned(),
            error: "boom".to_owned(),
            stop_reason: stop.to_owned(),
            ..SubagentEnd::default()
        };
        assert_eq!(result_text(&end(SubagentStatus::Completed, "")), ("Task Succeeded. Result: 42".to_owned(), false));
        assert_eq!(result_text(&end(SubagentStatus::Completed, "turn_capped")).0, "Task Succeeded (capped: turn budget). Result: 42");
        assert_eq!(result_text(&end(SubagentStatus::Completed, "token_capped")).0, "Task Succeeded (capped: token budget). Result: 42");
        assert_eq!(result_text(&end(SubagentStatus::Failed, "")), ("Task failed. Error: boom".to_owned(), true));
        assert_eq!(result_text(&end(SubagentStatus::TimedOut, "")).0, "Task timed out. Error: boom");
        assert_eq!(result_text(&end(SubagentStatus::Cancelled, "")).0, "Task cancelled by user. Error: boom");
    }

    #[test]
    fn the_schema_lists_every_type() {
        let task = Task::new(crate::lead::subagents::SubagentsConfig::default().registry());
        let schema = task.parameters().to_string();
        assert!(schema.contains("general-purpose") && schema.contains("\"bash\""), "{schema}");
        assert!(task.description().contains("**general-purpose**"));
    }
}
