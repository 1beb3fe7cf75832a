//! DanglingToolCall: before each model call, every tool call without a result gets an error result
//! right after its assistant message, and tool results answering no call are dropped — providers
//! refuse both. This repairs threads whose previous run was interrupted mid-tool.

use antler_proto::common::{Message, Role};
use antler_proto::models::ChatRequest;
use futures::future::BoxFuture;

use crate::lead::pipeline::{Middleware, ModelNext, ModelResult};
use crate::lead::run_env::RunEnv;
use crate::lead::state::tool_message;

/// DeerFlow's text for a call that never returned.
pub const INTERRUPTED: &str = "[Tool call was interrupted and did not return a result.]";

#[derive(Debug)]
pub struct DanglingToolCall;

impl Middleware for DanglingToolCall {
    fn name(&self) -> &'static str {
        "DanglingToolCall"
    }

    fn wrap_model_call<'a>(&'a self, env: &'a RunEnv, mut request: ChatRequest, next: ModelNext<'a>) -> BoxFuture<'a, ModelResult> {
        let repaired = repair(std::mem::take(&mut request.messages));
        if repaired.patched > 0 || repaired.dropped > 0 {
            tracing::info!(run_id = %env.ctx.spec.run_id, patched = repaired.patched, dropped = repaired.dropped, "dangling tool calls repaired");
        }
        request.messages = repaired.messages;
        next.run(env, request)
    }
}

/// The outcome of [`repair`].
#[derive(Debug)]
pub struct Repaired {
    pub messages: Vec<Message>,
    pub patched: usize,
    pub dropped: usize,
}

/// Pairs every tool call with a result and drops orphan results.
pub fn repair(messages: Vec<Message>) -> Repaired {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let (mut patched, mut dropped) = (0, 0);
    let mut open: Vec<antler_proto::common::ToolCall> = Vec::new();
    let close = |out: &mut Vec<Message>, open: &mut Vec<antler_proto::common::ToolCall>, patched: &mut usize| {
        for call in open.drain(..) {
            let mut call = call;
            if call.name.is_empty() {
                call.name = "unknown_tool".to_owned();
            }
            out.push(tool_message(&call, INTERRUPTED, true));
            *patched += 1;
        }
    };
    for message in messages {
        if message.role == Role::Tool as i32 {
            match open.iter().position(|c| c.id == message.tool_call_id) {
                Some(at) => {
                    open.remove(at);
                    out.push(message);
                }
                None => dropped += 1,
            }
            continue;
        }
        close(&mut out, &mut open, &mut patched);
        if message.role == Role::Assistant as i32 {
            open = message.tool_calls.clone();
        }
        out.push(message);
    }
    close(&mut out, &mut open, &mut patched);
    Repaired { messages: out, patched, dropped }
}

#[cfg(test)]
mod tests {
    use antler_proto::common::ToolCall;

    use super::*;
    use crate::lead::state::text_message;

    #[test]
    fn unanswered_calls_get_an_error_result_and_orphans_go() {
        let call = |id: &str| ToolCall { id: id.to_owned(), name: "bash".to_owned(), ..ToolCall::default() };
        let mut assistant = text_message(Role::Assistant, "");
        assistant.tool_calls = vec![call("a"), call("b")];
        let messages = vec![
            text_message(Role::User, "hi"),
            assistant,
            tool_message(&call("a"), "ok", false),
            tool_message(&call("zzz"), "orphan", false),
            text_message(Role::User, "again"),
        ];
        let repaired = repair(messages);
        assert_eq!((repaired.patched, repaired.dropped), (1, 1));
        let roles: Vec<(i32, String)> = repaired.messages.iter().map(|m| (m.role, m.tool_call_id.clone())).collect();
        assert_eq!(roles[2], (Role::Tool as i32, "a".to_owned()));
        assert_eq!(roles[3], (Role::Tool as i32, "b".to_owned()));
        assert!(repaired.messages[3].is_error);
        assert_eq!(repaired.messages.len(), 5);
    }
}
