//! SkillToolPolicy (DeerFlow's SkillToolPolicyMiddleware): once the model has read a skill's SKILL.md
//! (see `lead::skills` for what activates a skill), the `allowed-tools` of the active skills apply for
//! the rest of the thread: the model is offered only those tools (plus `read_file` and `tool_search`),
//! and a call to any other tool is refused with DeerFlow's error text without running it. The active
//! skills are kept in the thread state (`skill_context`), so a resumed attempt or a summarised history
//! keeps the restriction.

use std::collections::BTreeSet;
use std::sync::Mutex;

use antler_proto::common::ToolCall;
use antler_proto::models::ChatRequest;
use futures::future::BoxFuture;

use crate::lead::pipeline::{LoopError, Middleware, ModelNext, ModelResult, ToolNext, ToolResult};
use crate::lead::run_env::RunEnv;
use crate::lead::skills;
use crate::lead::state::ThreadState;
use crate::lead::tools::{Args, ToolOutput};

#[derive(Debug, Default)]
pub struct SkillToolPolicy {
    /// The tools allowed now (None: no restriction), computed from the state before each model call.
    allowed: Mutex<Option<BTreeSet<String>>>,
}

/// The result text of a refused call (DeerFlow's wording).
pub fn refusal_text(name: &str) -> String {
    format!("Error: Tool '{name}' is not allowed by the active skill policy.")
}

impl SkillToolPolicy {
    fn update(&self, env: &RunEnv, state: &mut ThreadState) {
        let enabled = env.skills();
        for path in skills::activated(&state.messages, enabled) {
            if !state.skill_context.contains(&path) {
                tracing::info!(run_id = %env.ctx.spec.run_id, skill = %path, "skill activated");
                state.skill_context.push(path);
            }
        }
        *self.allowed.lock().unwrap_or_else(|p| p.into_inner()) = skills::allowed_tools(&state.skill_context, enabled);
    }

    fn allowed(&self) -> Option<BTreeSet<String>> {
        self.allowed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Middleware for SkillToolPolicy {
    fn name(&self) -> &'static str {
        "SkillToolPolicy"
    }

    // Also before the agent: a resumed attempt may finish a tool round before its first model call.
    fn before_agent<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        self.update(env, state);
        Box::pin(async { Ok(()) })
    }

    fn before_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        self.update(env, state);
        Box::pin(async { Ok(()) })
    }

    fn wrap_model_call<'a>(&'a self, env: &'a RunEnv, mut request: ChatRequest, next: ModelNext<'a>) -> BoxFuture<'a, ModelResult> {
        if let Some(allowed) = self.allowed() {
            request.tools.retain(|tool| allowed.contains(&tool.name));
        }
        next.run(env, request)
    }

    fn wrap_tool_call<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args, next: ToolNext<'a>) -> BoxFuture<'a, ToolResult> {
        match self.allowed() {
            Some(allowed) if !allowed.contains(&call.name) => {
                tracing::info!(run_id = %env.ctx.spec.run_id, tool = %call.name, "tool refused by the active skill policy");
                Box::pin(async move { Ok(ToolOutput::error(refusal_text(&call.name))) })
            }
            _ => next.run(env, call, args),
        }
    }
}
