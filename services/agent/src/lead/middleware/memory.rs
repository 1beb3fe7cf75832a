//! Memory (`lead.memory`, DeerFlow's MemoryMiddleware): the user's memory, rendered once per
//! attempt by the memory service (RenderInjection, within `max_injection_tokens`, facts ranked by the
//! user's current message), goes into the
//! system prompt of every model call as `<memory>…</memory>` (one rendering per attempt, so the
//! prompt prefix stays the same from call to call and provider prompt caches hit); when the agent
//! finishes, the conversation's user turns and final answers go to QueueUpdate, where the memory
//! service extracts facts from them later (caller `middleware:memory` there). Failed and interrupted
//! runs never reach after_agent, so they queue nothing. A memory service that is absent or down
//! costs the run nothing but a log line.

use antler_proto::common::{Message, Role};
use antler_proto::memory::memory_service_client::MemoryServiceClient;
use antler_proto::memory::{QueueUpdateRequest, RenderInjectionRequest};
use antler_proto::models::ChatRequest;
use futures::future::BoxFuture;
use tokio::sync::OnceCell;

use crate::lead::config::MemoryConfig;
use crate::lead::pipeline::{LoopError, Middleware, ModelNext, ModelResult};
use crate::lead::run_env::RunEnv;
use crate::lead::state::{ThreadState, text_of};

/// Names of the messages the agent's own layers add (reminders, warnings, image context): not the
/// user's words, so not memory. The user's input is named `user-input` by ThreadData and kept.
const INJECTED: [&str; 4] = ["loop_warning", "todo_reminder", "token_budget_warning", "view_image_context"];

/// Most messages of the conversation one update carries (the newest).
const MAX_UPDATE_MESSAGES: usize = 100;

#[derive(Debug)]
pub struct MemoryMiddleware {
    config: MemoryConfig,
    /// The `<memory>` block of this attempt (None: nothing to inject).
    block: OnceCell<Option<String>>,
}

impl MemoryMiddleware {
    pub fn new(config: MemoryConfig) -> Self {
        Self { config, block: OnceCell::new() }
    }

    fn agent_name(env: &RunEnv) -> String {
        env.ctx.spec.request.config.as_ref().map(|c| c.agent_name.clone()).unwrap_or_default()
    }

    /// `query`: the user's current message, by which the memory service ranks the facts.
    async fn render(&self, env: &RunEnv, query: String) -> Option<String> {
        let ctx = &env.ctx;
        let client = ctx.clients().get("memory")?;
        let request = client.request(
            &ctx.call_context(),
            RenderInjectionRequest {
                agent_name: Self::agent_name(env),
                max_tokens: self.config.max_injection_tokens,
                query,
                ..Default::default()
            },
        );
        match MemoryServiceClient::new(client.channel()).render_injection(request).await {
            Ok(response) => {
                let response = response.into_inner();
                tracing::debug!(run_id = %ctx.spec.run_id, tokens = response.token_estimate, facts = response.included_fact_ids.len(), "memory rendered");
                (!response.text.trim().is_empty()).then(|| format!("<memory>\n{}\n</memory>", response.text.trim()))
            }
            Err(status) => {
                log_unavailable(env, "RenderInjection", &status);
                None
            }
        }
    }
}

fn log_unavailable(env: &RunEnv, rpc: &str, status: &tonic::Status) {
    if status.code() == tonic::Code::Unimplemented {
        tracing::debug!(run_id = %env.ctx.spec.run_id, rpc, "no memory service here");
    } else {
        tracing::warn!(run_id = %env.ctx.spec.run_id, rpc, code = ?status.code(), "memory service call failed; the run goes on without it: {}", status.message());
    }
}

/// What of the conversation is worth remembering: the user's own messages and the agent's final
/// answers (no tool traffic, no injected reminders), newest last, secrets of
/// the process (run secrets included) removed.
pub fn conversation(messages: &[Message]) -> Vec<Message> {
    let kept: Vec<Message> = messages
        .iter()
        .filter(|m| !INJECTED.contains(&m.name.as_str()))
        .filter(|m| m.role == Role::User as i32 || (m.role == Role::Assistant as i32 && m.tool_calls.is_empty()))
        .filter(|m| !text_of(m).trim().is_empty())
        .map(|m| antler_kit::redact::redact_message(m).unwrap_or_else(|| m.clone()))
        .collect();
    let skip = kept.len().saturating_sub(MAX_UPDATE_MESSAGES);
    kept.into_iter().skip(skip).collect()
}

impl Middleware for MemoryMiddleware {
    fn name(&self) -> &'static str {
        "Memory"
    }

    fn wrap_model_call<'a>(&'a self, env: &'a RunEnv, mut request: ChatRequest, next: ModelNext<'a>) -> BoxFuture<'a, ModelResult> {
        Box::pin(async move {
            if self.config.injection_enabled {
                // Rendered once per attempt, ranked by the latest real user message (not a reminder).
                let block = self
                    .block
                    .get_or_init(|| {
                        let query = request
                            .messages
                            .iter()
                            .rev()
                            .find(|m| m.role == Role::User as i32 && !INJECTED.contains(&m.name.as_str()))
                            .map(|m| text_of(m).chars().take(1000).collect())
                            .unwrap_or_default();
                        self.render(env, query)
                    })
                    .await;
                if let (Some(block), Some(system)) = (block, request.messages.first_mut().filter(|m| m.role == Role::System as i32))
                    && let Some(antler_proto::common::content_part::Part::Text(text)) =
                        system.content.first_mut().and_then(|p| p.part.as_mut())
                {
                    text.text.push_str("\n\n");
                    text.text.push_str(block);
                }
            }
            next.run(env, request).await
        })
    }

    fn after_agent<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        Box::pin(async move {
            let ctx = &env.ctx;
            let messages = conversation(&state.messages);
            let Some(client) = ctx.clients().get("memory") else { return Ok(()) };
            if messages.is_empty() {
                return Ok(());
            }
            let request = client.request(
                &ctx.call_context(),
                QueueUpdateRequest {
                    thread_id: ctx.spec.thread_id.clone(),
                    agent_name: Self::agent_name(env),
                    messages,
                    run_id: ctx.spec.run_id.clone(),
                    immediate: false,
                    // Extraction with the run's model unless memory.model_name says otherwise.
                    model_name: ctx.spec.request.config.as_ref().map(|c| c.model_name.clone()).unwrap_or_default(),
                },
            );
            match MemoryServiceClient::new(client.channel()).queue_update(request).await {
                Ok(response) => {
                    let response = response.into_inner();
                    tracing::debug!(run_id = %ctx.spec.run_id, depth = response.queue_depth, replaced = response.replaced_pending, "memory update queued");
                }
                Err(status) => log_unavailable(env, "QueueUpdate", &status),
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lead::state::text_message;

    #[test]
    fn only_user_turns_and_final_answers_are_remembered() {
        let mut call = text_message(Role::Assistant, "Let me look.");
        call.tool_calls = vec![antler_proto::common::ToolCall { id: "1".into(), name: "ls".into(), ..Default::default() }];
        let mut reminder = text_message(Role::User, "[LOOP DETECTED] stop");
        reminder.name = "loop_warning".into();
        let messages = vec![
            {
                let mut input = text_message(Role::User, "I prefer Rust.");
                input.name = "user-input".into();
                input
            },
            call,
            text_message(Role::Tool, "a.txt"),
            reminder,
            text_message(Role::Assistant, "Noted."),
        ];
        let kept: Vec<String> = conversation(&messages).iter().map(text_of).collect();
        assert_eq!(kept, vec!["I prefer Rust.", "Noted."]);
    }
}
