//! The built-in `script` agent (the default until the lead agent lands): deterministic, so demos and
//! the lifecycle tests can drive every path of a run.
//!
//! If the first input message's text is a JSON object `{"script": [step, …]}`, the agent performs the
//! steps in order; otherwise it answers `echo: <text>`. Steps:
//!
//! | step | effect |
//! |---|---|
//! | `{"say": "text"}` | streams the text as message deltas, then a complete assistant message |
//! | `{"sleep_ms": n}` | waits (cancellable) |
//! | `{"checkpoint": true}` | saves the state; a run resumed after a takeover continues after it |
//! | `{"usage": {"model": m, "caller": c, "input": i, "output": o}}` | records token usage |
//! | `{"produce": path, "text": t}` | writes the file through the sandbox service (`size` n: n bytes of `x`); journalled |
//! | `{"present": path}` | reports an output file as presented |
//! | `{"custom": value}` | emits a custom event named `script`; journalled |
//! | `{"task_event": id}` | emits a SUBAGENT event (phase STEP) of subagent task `id` |
//! | `{"exec": command}` | runs the command in the run's sandbox (acquiring it first) until it exits; a CUSTOM event `exec` reports the exit |
//! | `{"fail": "message"}` | ends the run ERROR |
//! | `{"wait_cancel": true}` | waits until cancelled |
//! | `{"stop_reason": "r"}` | sets the stop reason of a successful end |
//!
//! A resumed run continues after its last checkpoint; the journalled steps between that checkpoint
//! and the crash are not repeated (see [`effects`]).

use std::sync::Arc;
use std::time::Duration;

use antler_proto::common::{ContentPart, Message, Role, TextPart, Usage, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{MessageDelta, MessageEvent, RunError};
use futures::future::BoxFuture;
use serde_json::Value;

use antler_agent::{Agent, AgentContext, AgentFactory, RunSpec};

pub mod effects;
use antler_agent::{Outcome, Outputs};

/// Builds [`ScriptAgent`]s and logs each construction (tests count them).
#[derive(Debug, Default)]
pub struct ScriptFactory;

impl AgentFactory for ScriptFactory {
    fn build(&self, spec: &RunSpec) -> Result<Box<dyn Agent>, RunError> {
        let text = spec
            .request
            .input
            .iter()
            .find(|m| m.role == Role::User as i32)
            .and_then(|m| {
                m.content.iter().find_map(|p| match &p.part {
                    Some(content_part::Part::Text(t)) => Some(t.text.clone()),
                    _ => None,
                })
            })
            .unwrap_or_default();
        let steps = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(map)) if map.contains_key("script") => match map.get("script") {
                Some(Value::Array(steps)) => steps.clone(),
                _ => {
                    return Err(RunError {
                        code: "bad_script".to_owned(),
                        message: "`script` must be an array of steps".to_owned(),
                        retryable: false,
                        details: None,
                    });
                }
            },
            _ => vec![serde_json::json!({"say": format!("echo: {text}")}), serde_json::json!({"checkpoint": true})],
        };
        Ok(Box::new(ScriptAgent { steps: Arc::new(steps) }))
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct ScriptAgent {
    steps: Arc<Vec<Value>>,
}

impl Agent for ScriptAgent {
    fn run(self: Box<Self>, ctx: AgentContext) -> BoxFuture<'static, Outcome> {
        Box::pin(async move { execute(&self.steps, ctx).await })
    }
}

async fn execute(steps: &[Value], ctx: AgentContext) -> Outcome {
    let cancel = ctx.cancelled();
    // A resumed run continues after its last checkpoint.
    let start = ctx
        .spec
        .resume_from
        .as_ref()
        .filter(|c| ctx.spec.resumed && c.run_id == ctx.spec.run_id)
        .and_then(|c| c.values.as_ref())
        .and_then(|v| v.fields.get("script_step"))
        .and_then(|v| match v.kind {
            Some(prost_types::value::Kind::NumberValue(n)) => Some(n as usize + 1),
            _ => None,
        })
        .unwrap_or(0);
    let mut messages: Vec<Message> = ctx.spec.resume_from.as_ref().map(|c| c.messages.clone()).unwrap_or_default();
    if start == 0 {
        messages.extend(ctx.spec.request.input.iter().cloned());
    }
    let mut outputs = Outputs::default();
    // Empty: the agent simply finished (Run.stop_reason is empty for a plain final answer).
    let mut stop_reason = String::new();
    for (index, step) in steps.iter().enumerate().skip(start) {
        if cancel.is_cancelled() {
            return Outcome::Cancelled { outputs };
        }
        let Value::Object(step) = step else { return bad_step(index) };
        let result = if let Some(Value::String(text)) = step.get("say") {
            say(&ctx, index, text, &mut messages).await
        } else if let Some(ms) = step.get("sleep_ms").and_then(Value::as_u64) {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(()),
                () = cancel.cancelled() => return Outcome::Cancelled { outputs },
            }
        } else if step.contains_key("checkpoint") {
            let mut values = prost_types::Struct::default();
            values
                .fields
                .insert("script_step".to_owned(), prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(index as f64)) });
            ctx.checkpoint(index as i64, values, messages.clone()).await.map(|_| ())
        } else if let Some(Value::Object(usage)) = step.get("usage") {
            let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
            let model = usage.get("model").and_then(Value::as_str).unwrap_or("script");
            let caller = usage.get("caller").and_then(Value::as_str).unwrap_or("lead_agent");
            let usage =
                Usage { input_tokens: n("input"), output_tokens: n("output"), total_tokens: n("input") + n("output"), ..Usage::default() };
            ctx.record_usage(caller, model, &usage).await
        } else if let Some(Value::String(path)) = step.get("produce") {
            let text = match step.get("text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => "x".repeat(step.get("size").and_then(Value::as_u64).unwrap_or(0).min(1 << 20) as usize),
            };
            // The file is written for real; what counts as produced is what the sandbox then holds.
            effects::produce(&ctx, index, path, text).await
        } else if let Some(Value::String(path)) = step.get("present") {
            outputs.presented.push(path.clone());
            Ok(())
        } else if let Some(Value::String(task_id)) = step.get("task_event") {
            let event = antler_proto::runs::SubagentEvent {
                task_id: task_id.clone(),
                phase: antler_proto::runs::SubagentPhase::Step as i32,
                ..Default::default()
            };
            ctx.emit(Kind::Subagent(event)).await
        } else if let Some(Value::String(command)) = step.get("exec") {
            let exit = tokio::select! {
                exit = exec(&ctx, command) => exit,
                () = cancel.cancelled() => return Outcome::Cancelled { outputs },
            };
            let data = match exit {
                Ok((code, kill_reason)) => serde_json::json!({"exit_code": code, "kill_reason": kill_reason}),
                Err(status) => serde_json::json!({"error": format!("{:?}: {}", status.code(), status.message())}),
            };
            ctx.emit(Kind::Custom(antler_proto::runs::CustomEvent {
                name: "exec".to_owned(),
                data: Some(antler_kit::json::json_to_value(&data)),
            }))
            .await
        } else if let Some(value) = step.get("custom") {
            effects::custom(&ctx, index, value).await
        } else if let Some(Value::String(message)) = step.get("fail") {
            return Outcome::Failed(RunError { code: "agent_error".to_owned(), message: message.clone(), retryable: false, details: None });
        } else if step.contains_key("wait_cancel") {
            cancel.cancelled().await;
            return Outcome::Cancelled { outputs };
        } else if let Some(Value::String(reason)) = step.get("stop_reason") {
            stop_reason = reason.clone();
            Ok(())
        } else {
            return bad_step(index);
        };
        if result.is_err() {
            // Fenced: the worker discards whatever is returned.
            return Outcome::Cancelled { outputs };
        }
    }
    Outcome::Completed { stop_reason, outputs }
}

/// Runs `command` in the run's sandbox (acquiring it first) until it exits: (exit code, kill reason
/// name). The call carries the run's fencing token, like every sandbox call of an agent.
async fn exec(ctx: &AgentContext, command: &str) -> Result<(i32, String), tonic::Status> {
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    use antler_proto::sandbox::{AcquireSandboxRequest, ExecuteCommandRequest, KillReason, execute_command_response};
    let client = ctx.clients().get("sandbox").ok_or_else(|| tonic::Status::unavailable("no sandbox client"))?;
    let call = ctx.call_context();
    let mut grpc = SandboxServiceClient::new(client.channel());
    let thread_id = ctx.spec.thread_id.clone();
    grpc.acquire_sandbox(client.request(&call, AcquireSandboxRequest { thread_id: thread_id.clone() })).await?;
    let mut request = client.request(&call, ExecuteCommandRequest { thread_id, command: command.to_owned(), ..Default::default() });
    // The command decides how long it runs, not the client's unary deadline.
    request.set_timeout(Duration::from_secs(3600));
    let mut stream = grpc.execute_command(request).await?.into_inner();
    while let Some(response) = stream.message().await? {
        if let Some(execute_command_response::Event::Exit(exit)) = response.event {
            let reason = KillReason::try_from(exit.kill_reason).unwrap_or(KillReason::Unspecified);
            return Ok((exit.exit_code, reason.as_str_name().to_owned()));
        }
    }
    Err(tonic::Status::unavailable("the command's stream ended without an exit"))
}

fn bad_step(index: usize) -> Outcome {
    Outcome::Failed(RunError {
        code: "bad_script".to_owned(),
        message: format!("script step {index} is not a known step"),
        retryable: false,
        details: None,
    })
}

async fn say(ctx: &AgentContext, index: usize, text: &str, messages: &mut Vec<Message>) -> Result<(), antler_agent::Fenced> {
    let message_id = format!("{}-{index}", ctx.spec.run_id);
    let mut offset = 0u64;
    for chunk in text.split_inclusive(' ') {
        let delta = MessageDelta {
            message_id: message_id.clone(),
            text: chunk.to_owned(),
            text_offset: offset,
            replayable: true,
            ..MessageDelta::default()
        };
        ctx.emit(Kind::MessageDelta(delta)).await?;
        offset += chunk.len() as u64;
    }
    let message = Message {
        id: message_id,
        role: Role::Assistant as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    };
    messages.push(message.clone());
    ctx.emit(Kind::Message(MessageEvent { message: Some(message) })).await
}
