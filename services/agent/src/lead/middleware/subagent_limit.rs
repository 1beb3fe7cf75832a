//! SubagentLimit (DeerFlow's `SubagentLimitMiddleware`, on when the run may delegate): after each
//! model turn, its `task` calls are cut to what the run may still start — at most `max_concurrent`
//! per turn (1..4, default 3) and `max_total` per run (1..50, default 6) — and the calls beyond are
//! dropped (other tools are kept). A turn that asks for a task once the total is used up gets the
//! "[SUBAGENT LIMIT REACHED]" note instead of tool calls, and the run ends with stop_reason
//! `subagent_limit_capped`.

use antler_proto::common::{Message, Role};
use futures::future::BoxFuture;
use prost_types::value::Kind;

use crate::lead::pipeline::{LoopError, Middleware};
use crate::lead::run_env::RunEnv;
use crate::lead::state::{ThreadState, finish_with_note};

#[derive(Debug)]
pub struct SubagentLimit {
    pub max_concurrent: u32,
    pub max_total: u32,
}

/// Appended to the turn that asked for more tasks than the run may start.
pub const LIMIT_NOTE: &str = "\n\n[SUBAGENT LIMIT REACHED] The subagent delegation limit for this run has been reached. \
No further subagent tasks are started; this is the final answer with the results collected so far.";

fn is_task(message: &Message) -> usize {
    message.tool_calls.iter().filter(|c| c.name == "task").count()
}

/// Where this run's messages start: its first input message (stamped with the run id by the
/// ThreadData layer). Without one, every message counts, as DeerFlow counts a ledger without run ids.
fn run_start(messages: &[Message], run_id: &str) -> usize {
    messages
        .iter()
        .position(|m| {
            m.metadata.as_ref().and_then(|meta| meta.fields.get("run_id")).and_then(|v| v.kind.as_ref())
                == Some(&Kind::StringValue(run_id.to_owned()))
        })
        .unwrap_or(0)
}

impl Middleware for SubagentLimit {
    fn name(&self) -> &'static str {
        "SubagentLimit"
    }

    fn after_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        let Some((last, earlier)) = state.messages.split_last_mut() else { return Box::pin(async { Ok(()) }) };
        if last.role != Role::Assistant as i32 || is_task(last) == 0 {
            return Box::pin(async { Ok(()) });
        }
        let start = run_start(earlier, &env.ctx.spec.run_id);
        let prior: usize = earlier[start..].iter().filter(|m| m.role == Role::Assistant as i32).map(is_task).sum();
        let left = (self.max_total as usize).saturating_sub(prior);
        let asked = is_task(last);
        if left == 0 {
            tracing::warn!(run_id = %env.ctx.spec.run_id, prior, asked, max_total = self.max_total, "subagent limit reached; the run ends");
            finish_with_note(last, LIMIT_NOTE);
            env.stop("subagent_limit_capped");
            return Box::pin(async { Ok(()) });
        }
        let allowed = left.min(self.max_concurrent as usize);
        if asked > allowed {
            tracing::warn!(run_id = %env.ctx.spec.run_id, asked, allowed, "task calls beyond the subagent limit dropped");
            let mut kept = 0;
            last.tool_calls.retain(|c| {
                if c.name != "task" {
                    return true;
                }
                kept += 1;
                kept <= allowed
            });
        }
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lead::state::text_message;
    use antler_proto::common::ToolCall;

    fn turn(tasks: usize, others: usize) -> Message {
        let mut message = text_message(Role::Assistant, "delegating");
        for i in 0..tasks {
            message.tool_calls.push(ToolCall { id: format!("t{i}"), name: "task".to_owned(), ..ToolCall::default() });
        }
        for i in 0..others {
            message.tool_calls.push(ToolCall { id: format!("o{i}"), name: "ls".to_owned(), ..ToolCall::default() });
        }
        message
    }

    fn env() -> RunEnv {
        let spec = crate::RunSpec::new("r1", "t1", "u1", Default::default());
        let host = std::sync::Arc::new(crate::memory_host::MemoryHost::default());
        let clients = antler_kit::Clients::from_config(&Default::default(), ([127, 0, 0, 1], 1).into()).expect("no clients configured");
        RunEnv::new(crate::AgentContext::new(spec, host, Default::default(), clients))
    }

    #[tokio::test]
    async fn excess_task_calls_are_dropped_and_the_total_ends_the_run() {
        let limit = SubagentLimit { max_concurrent: 3, max_total: 6 };
        let env = env();
        let mut state = ThreadState::default();
        state.messages.push(turn(4, 1));
        limit.after_model(&env, &mut state).await.ok();
        let names: Vec<&str> = state.messages[0].tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["task", "task", "task", "ls"], "three tasks a turn, other tools kept");
        state.messages.push(turn(4, 0));
        limit.after_model(&env, &mut state).await.ok();
        assert_eq!(state.messages[1].tool_calls.len(), 3, "three more: six in all");
        assert!(env.stop_reason().is_none());
        state.messages.push(turn(1, 1));
        limit.after_model(&env, &mut state).await.ok();
        assert!(state.messages[2].tool_calls.is_empty());
        assert!(crate::lead::tools::task::message_text(&state.messages[2]).contains("[SUBAGENT LIMIT REACHED]"));
        assert_eq!(env.stop_reason().as_deref(), Some("subagent_limit_capped"));
    }
}
