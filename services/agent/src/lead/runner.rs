//! The loop: thread state → model (streamed) → tools → checkpoint, step after step, until a final
//! answer, a stop reason or the recursion limit. Cancellation is checked at every model chunk (in
//! `model.rs`) and at every tool boundary.

use std::time::Instant;

use antler_proto::common::{Message, Role, ToolCall};
use antler_proto::models::{ChatRequest, FinishReason};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CustomEvent, MessageEvent, RunError, ToolFinished, ToolStarted};

use super::LeadAgent;
use super::config::TruncatedAnswer;
use super::model::ChatStreamCall;
use super::pipeline::LoopError;
use super::run_env::RunEnv;
use super::state::{ThreadState, text_message, tool_message};
use super::tools::view_image::images_message;
use super::tools::{Args, ToolError, ToolOutput};
use crate::AgentContext;
use crate::outcome::{Outcome, Outputs};

/// The stop reason (and, by default, the error code) of a final answer cut at the model's output limit.
pub const LENGTH_CAPPED: &str = "model_length_capped";

/// Longest result summary in a ToolFinished event, in characters.
const SUMMARY_CHARS: usize = 2000;

/// Runs one attempt to its outcome.
pub async fn run(agent: &LeadAgent, ctx: AgentContext) -> Outcome {
    let env = RunEnv::with_catalog(ctx, agent.catalog_hash.clone());
    env.set_skills(agent.skills.clone());
    let result = drive(agent, &env).await;
    // A fenced worker no longer owns the run: another one may be using the thread's sandbox now.
    if !matches!(result, Err(LoopError::Fenced)) {
        // Events staged after the last checkpoint (a cut-short tool round) still belong in the log.
        if env.ctx.flush().await.is_err() {
            tracing::info!(run_id = %env.ctx.spec.run_id, "staged events not written: fenced");
        }
        env.release_sandbox().await;
    }
    let outputs = Outputs { presented: env.presented(), baseline: env.outputs_before(), ..Outputs::default() };
    match result {
        Ok(stop_reason) if stop_reason == LENGTH_CAPPED && agent.truncated_answer == TruncatedAnswer::Error => Outcome::Failed(RunError {
            code: LENGTH_CAPPED.to_owned(),
            message: "the model's final answer was cut off at its output limit (finish reason `length`), so the run did not \
                     complete\nhint: raise the model's max_tokens (models[].max_tokens), ask for a shorter answer, or set \
                     runs.lead.truncated_answer: accept to end such runs SUCCESS; the cut answer is in the thread's state"
                .to_owned(),
            retryable: false,
            details: None,
        }),
        Ok(stop_reason) => Outcome::Completed { stop_reason, outputs },
        Err(LoopError::Cancelled | LoopError::Fenced) => Outcome::Cancelled { outputs },
        Err(LoopError::Model { code, message, retryable }) => Outcome::Failed(RunError { code, message, retryable, details: None }),
        Err(LoopError::RecursionLimit(limit)) => Outcome::Failed(RunError {
            code: "recursion_limit".to_owned(),
            message: format!(
                "the run reached its recursion limit of {limit} steps without a final answer\nhint: raise config.recursion_limit or split the task"
            ),
            retryable: false,
            details: None,
        }),
    }
}

/// The initial state of this attempt: a resumed attempt continues its own run's last checkpoint;
/// a new run starts from the thread's state plus the request's input.
async fn initial_state(env: &RunEnv) -> Result<(ThreadState, bool), LoopError> {
    let spec = &env.ctx.spec;
    let mut state = spec.resume_from.as_ref().map(ThreadState::from_checkpoint).unwrap_or_default();
    let continuing = spec.resumed && state.step_run_id == spec.run_id;
    if continuing {
        if !state.stop_reason.is_empty() {
            env.stop(&state.stop_reason);
        }
    } else {
        state.step = 0;
        state.step_run_id = spec.run_id.clone();
        state.stop_reason.clear();
        state.outputs_before = None;
        for input in &spec.request.input {
            let mut message = input.clone();
            if message.id.is_empty() {
                message.id = uuid::Uuid::now_v7().to_string();
            }
            state.messages.push(message);
        }
    }
    // Files presented earlier on this thread are still its deliverables, promoted tools still offered.
    env.present(&state.artifacts);
    env.set_promoted(state.promoted.clone());
    Ok((state, continuing))
}

async fn drive(agent: &LeadAgent, env: &RunEnv) -> Result<String, LoopError> {
    let ctx = &env.ctx;
    let cancel = ctx.cancelled();
    let limit = i64::from(ctx.spec.request.config.as_ref().map(|c| c.recursion_limit).filter(|l| *l > 0).unwrap_or(100));
    let (mut state, continuing) = initial_state(env).await?;
    // DEBUG, not INFO: at the default level a run logs one line, `run finished` (#32).
    tracing::debug!(run_id = %ctx.spec.run_id, attempt = ctx.spec.attempt, continuing, step = state.step, layers = ?agent.pipeline.names(), "lead agent started");
    agent.pipeline.before_agent(env, &mut state).await?;
    if !continuing {
        // The input as the before_agent layers left it (stamped, uploads announced).
        let first_input = state.messages.len().saturating_sub(ctx.spec.request.input.len());
        for message in &state.messages[first_input..] {
            ctx.emit(Kind::Message(MessageEvent { message: Some(message.clone()) })).await?;
        }
        // Once per run (a resumed attempt already said it).
        if let Some(model) = &agent.thinking_dropped {
            tracing::warn!(run_id = %ctx.spec.run_id, model = %model, "thinking requested on a model without supports_thinking; the run goes on without thinking (runs.lead.thinking_unsupported: ignore)");
            ctx.emit(super::thinking::event(model)).await?;
        }
    }

    // The previous attempt died between its model turn and the end of the tool round: finish the
    // round (the journal keeps side effects from happening twice).
    let mut answered = false;
    if continuing {
        let pending = state.pending_tool_calls();
        if !pending.is_empty() {
            tool_round(agent, env, &mut state, batches(agent, pending), false).await?;
            if let Some(todos) = env.take_todos() {
                state.todos = todos;
            }
            state.step += 1;
            save(env, &mut state).await?;
        } else {
            // The previous attempt got its final answer and died before the run was finalized.
            answered = state.messages.last().is_some_and(|m| m.role == Role::Assistant as i32 && m.tool_calls.is_empty());
        }
    }

    loop {
        if answered || env.stop_reason().is_some() {
            break;
        }
        if cancel.is_cancelled() {
            return Err(LoopError::Cancelled);
        }
        if state.step >= limit {
            return Err(LoopError::RecursionLimit(limit as u32));
        }
        // A subagent's turn limit: its thread holds only its own run, so every assistant message is
        // one of its turns. It stops with what it has (DeerFlow: completed, `turn_capped`).
        if let Some(def) = &agent.subagent {
            let turns = state.messages.iter().filter(|m| m.role == Role::Assistant as i32).count();
            if turns >= def.max_turns as usize {
                tracing::info!(run_id = %ctx.spec.run_id, turns, "subagent turn limit reached");
                env.stop("turn_capped");
                break;
            }
        }
        agent.pipeline.before_model(env, &mut state).await?;
        let request = build_request(agent, env, &state);
        let requested_model = request.model_name.clone();
        let turn = agent.pipeline.model_call(env, request, &ChatStreamCall).await?;
        let model = if turn.model_name.is_empty() { requested_model.as_str() } else { turn.model_name.as_str() };
        let model = if model.is_empty() { "default" } else { model };
        if let Some(usage) = &turn.usage {
            ctx.stage_usage(&agent.caller, model, usage);
        }
        let mut message = turn.message;
        message.role = Role::Assistant as i32;
        unique_call_ids(&state.messages, &mut message);
        match turn.finish_reason {
            FinishReason::Length if message.tool_calls.is_empty() => env.stop(LENGTH_CAPPED),
            FinishReason::ContentFilter => {
                let dropped = message.tool_calls.len();
                message.tool_calls.clear();
                env.stop("safety_capped");
                ctx.stage(safety_audit(&agent.caller, model, &message.id, state.step, dropped));
                metrics::counter!("antler_agent_safety_finishes_total", "caller" => caller_bucket(&agent.caller)).increment(1);
                tracing::warn!(run_id = %ctx.spec.run_id, model, caller = %agent.caller, dropped_tool_calls = dropped, "the provider's safety system stopped the answer");
            }
            _ => {}
        }
        state.messages.push(message);
        agent.pipeline.after_model(env, &mut state).await?;
        // The message as the middlewares left it is the authoritative one. It becomes durable with
        // the step's checkpoint, in the same transaction (its text already streamed as deltas).
        if let Some(last) = state.messages.last() {
            ctx.stage(Kind::Message(MessageEvent { message: Some(last.clone()) }));
        }
        state.step += 1;
        let calls = state.messages.last().map(|m| m.tool_calls.clone()).unwrap_or_default();
        let batches = if state.step < limit { batches(agent, calls.clone()) } else { Vec::new() };
        // The first batch's TOOL_STARTED events go with the step's checkpoint: one write fewer per
        // round, and the tools start right after it.
        let announced = batches.first().map(|batch| batch.iter().map(started).collect()).unwrap_or_default();
        save_then(env, &mut state, announced).await?;

        if calls.is_empty() {
            if env.stop_reason().is_none() && env.take_jump() {
                continue;
            }
            break;
        }
        if state.step >= limit {
            return Err(LoopError::RecursionLimit(limit as u32));
        }
        tool_round(agent, env, &mut state, batches, true).await?;
        if let Some(todos) = env.take_todos() {
            state.todos = todos;
        }
        state.step += 1;
        save(env, &mut state).await?;
    }
    let before = settled(env, &mut state);
    agent.pipeline.after_agent(env, &mut state).await?;
    // The last step's checkpoint already holds the state unless an after_agent hook changed it.
    if settled(env, &mut state) != before {
        save(env, &mut state).await?;
    }
    // Empty for a plain final answer, as Run.stop_reason documents.
    Ok(env.stop_reason().unwrap_or_default())
}

/// The name of the audit event of a safety finish.
pub const SAFETY_EVENT: &str = "antler.safety_finish";

/// The audit event of a model answer the provider's safety system stopped (finish reason
/// `content_filter`, which also stands for Anthropic's `refusal`): which model, which call (the
/// message id and step), the caller, and how many tool calls were dropped. Never any content.
fn safety_audit(caller: &str, model: &str, message_id: &str, step: i64, dropped: usize) -> Kind {
    let data = serde_json::json!({
        "finish_reason": "content_filter",
        "model_name": model,
        "caller": caller,
        "message_id": message_id,
        "step": step,
        "dropped_tool_calls": dropped,
        "stop_reason": "safety_capped",
    });
    Kind::Custom(CustomEvent { name: SAFETY_EVENT.to_owned(), data: Some(antler_kit::json::json_to_value(&data)) })
}

/// The bounded metric label of a caller tag.
fn caller_bucket(caller: &str) -> &'static str {
    if caller.starts_with("subagent") { "subagent" } else { "lead_agent" }
}

/// Gives every tool call of `message` an id no earlier call of the thread has. Some OpenAI-compatible
/// servers send no ids or reuse `call_0` every turn; the journal is keyed by the id, so a reused id
/// would make a new call look like an old one. The rewritten message is what gets checkpointed, so a
/// resumed attempt sees the same ids.
fn unique_call_ids(history: &[Message], message: &mut Message) {
    let mut seen: std::collections::HashSet<String> = history.iter().flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone())).collect();
    for call in &mut message.tool_calls {
        if call.id.is_empty() || seen.contains(&call.id) {
            call.id = format!("call_{}", uuid::Uuid::now_v7().simple());
        }
        seen.insert(call.id.clone());
    }
}

/// What a checkpoint of `state` would hold besides the messages, and how many messages.
fn settled(env: &RunEnv, state: &mut ThreadState) -> (prost_types::Struct, usize) {
    state.artifacts = env.presented();
    state.stop_reason = env.stop_reason().unwrap_or_default();
    state.promoted = env.promoted();
    (state.values(), state.messages.len())
}

async fn save(env: &RunEnv, state: &mut ThreadState) -> Result<(), LoopError> {
    save_then(env, state, Vec::new()).await
}

/// Checkpoints the state, then appends `then` in the same transaction.
async fn save_then(env: &RunEnv, state: &mut ThreadState, then: Vec<Kind>) -> Result<(), LoopError> {
    let (values, _) = settled(env, state);
    env.ctx.checkpoint_then(state.step, values, state.messages.clone(), then).await?;
    Ok(())
}

fn build_request(agent: &LeadAgent, env: &RunEnv, state: &ThreadState) -> ChatRequest {
    let spec = &env.ctx.spec;
    let config = spec.request.config.clone().unwrap_or_default();
    let mut messages = Vec::with_capacity(state.messages.len() + 1);
    if state.summary_text.is_empty() {
        messages.push(text_message(Role::System, agent.system_prompt.clone()));
    } else {
        // After the prompt, so the prompt's cached prefix survives a new summary.
        let system = format!("{}\n\n<conversation_summary>\n{}\n</conversation_summary>", agent.system_prompt, state.summary_text);
        messages.push(text_message(Role::System, system));
    }
    messages.extend(state.messages.iter().cloned());
    // ViewImage: images from the last tool round, for this call only (never in the state).
    if let Some(message) = images_message(env.take_images()) {
        messages.push(message);
    }
    ChatRequest {
        model_name: config.model_name.clone(),
        messages,
        tools: agent.tools.specs_where(|t| !t.deferred() || env.is_promoted(t.name())),
        thinking_enabled: config.thinking_enabled.unwrap_or(false) && agent.thinking_dropped.is_none(),
        reasoning_effort: config.reasoning_effort,
        caller: agent.caller.clone(),
        run_id: spec.run_id.clone(),
        thread_id: spec.thread_id.clone(),
        ..ChatRequest::default()
    }
}

/// A turn's tool calls in the groups they run in: consecutive read-only calls together (in
/// parallel), each side-effecting call alone, in order, since later calls may depend on it.
fn batches(agent: &LeadAgent, calls: Vec<ToolCall>) -> Vec<Vec<ToolCall>> {
    let mut batches: Vec<Vec<ToolCall>> = Vec::new();
    for call in calls {
        let effectful = agent.tools.get(&call.name).is_some_and(|t| t.side_effect());
        match batches.last_mut() {
            Some(batch) if !effectful && batch.iter().all(|c| !agent.tools.get(&c.name).is_some_and(|t| t.side_effect())) => {
                batch.push(call)
            }
            _ => batches.push(vec![call]),
        }
    }
    batches
}

/// The TOOL_STARTED event of `call`.
fn started(call: &ToolCall) -> Kind {
    Kind::ToolStarted(ToolStarted {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        arguments: call.arguments.clone(),
        raw_arguments: if call.arguments.is_some() { String::new() } else { call.raw_arguments.clone() },
    })
}

/// Runs a turn's tool calls, batch after batch, and appends their results in call order. With
/// `first_announced`, the first batch's TOOL_STARTED events were already written (with the
/// checkpoint before the round).
async fn tool_round(
    agent: &LeadAgent,
    env: &RunEnv,
    state: &mut ThreadState,
    batches: Vec<Vec<ToolCall>>,
    first_announced: bool,
) -> Result<(), LoopError> {
    let cancel = env.ctx.cancelled();
    for (index, batch) in batches.into_iter().enumerate() {
        if cancel.is_cancelled() {
            return Err(LoopError::Cancelled);
        }
        let announced = first_announced && index == 0;
        let results = futures::future::join_all(batch.iter().map(|call| one_tool(agent, env, call, announced))).await;
        for result in results {
            let message = result?;
            env.ctx.stage(Kind::Message(MessageEvent { message: Some(message.clone()) }));
            state.messages.push(message);
        }
        // A clarification ends the run: later calls of the turn are not run (the DanglingToolCall
        // layer answers them before any later model call).
        if env.stop_reason().is_some() {
            break;
        }
    }
    if cancel.is_cancelled() {
        return Err(LoopError::Cancelled);
    }
    Ok(())
}

fn parse_args(call: &ToolCall) -> Result<Args, String> {
    match &call.arguments {
        Some(arguments) => match antler_kit::json::struct_to_json(arguments) {
            serde_json::Value::Object(map) => Ok(Args(map)),
            _ => Ok(Args::default()),
        },
        None if call.raw_arguments.trim().is_empty() => Ok(Args::default()),
        None => match serde_json::from_str::<serde_json::Value>(&call.raw_arguments) {
            Ok(serde_json::Value::Object(map)) => Ok(Args(map)),
            _ => Err(call.raw_arguments.chars().take(500).collect()),
        },
    }
}

async fn one_tool(agent: &LeadAgent, env: &RunEnv, call: &ToolCall, announced: bool) -> Result<Message, LoopError> {
    let ctx = &env.ctx;
    if !announced {
        ctx.emit(started(call)).await?;
    }
    let started = Instant::now();
    let output = match parse_args(call) {
        Err(raw) => ToolOutput::error(format!("Error: the arguments of `{}` are not a JSON object: {raw}", call.name)),
        Ok(args) => match agent.pipeline.tool_call(env, call, &args, &agent.executor).await {
            Ok(output) => output,
            Err(ToolError::Stopping) => return Err(if ctx.cancelled().is_cancelled() { LoopError::Cancelled } else { LoopError::Fenced }),
            // ToolErrorHandling normally turns these into results; without it, the same rule holds.
            Err(error) => ToolOutput::error(super::tools::error_text(&call.name, &error)),
        },
    };
    let message = tool_message(call, output.text.clone(), output.is_error);
    let truncated = output.text.chars().count() > SUMMARY_CHARS;
    // Staged: written with the round's checkpoint, or before the next event (see AgentContext::stage).
    ctx.stage(Kind::ToolFinished(ToolFinished {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        arguments: call.arguments.clone(),
        result_summary: output.text.chars().take(SUMMARY_CHARS).collect(),
        result_truncated: truncated,
        is_error: output.is_error,
        duration: prost_types::Duration::try_from(started.elapsed()).ok(),
        outcome_unknown: output.outcome_unknown,
        result_message_id: message.id.clone(),
        mcp_server: agent.tools.get(&call.name).and_then(|t| t.mcp_server().map(str::to_owned)).unwrap_or_default(),
    }));
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_or_missing_call_ids_are_replaced() {
        let call = |id: &str| ToolCall { id: id.to_owned(), name: "bash".to_owned(), ..ToolCall::default() };
        let mut earlier = text_message(Role::Assistant, "");
        earlier.tool_calls = vec![call("call_0")];
        let mut turn = text_message(Role::Assistant, "");
        turn.tool_calls = vec![call("call_0"), call(""), call("fresh"), call("fresh")];
        unique_call_ids(&[earlier], &mut turn);
        let ids: Vec<&str> = turn.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_ne!(ids[0], "call_0");
        assert!(!ids[1].is_empty());
        assert_eq!(ids[2], "fresh");
        assert_ne!(ids[3], "fresh");
        let unique: std::collections::HashSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), 4);
    }
}
