//! Summarization (`lead.summarization`, DeerFlow's SummarizationMiddleware): before a model call
//! whose input meets any trigger (approximate tokens, messages, or a fraction of the model's context
//! window), the older messages are summarized by a model (caller `middleware:summarization`) and
//! dropped; the summary lives in the state (`summary_text`, rendered into the system prompt), not as a
//! message. The newest `keep` messages stay as they are, a tool result never loses the call it answers,
//! and the latest real user request is kept even when it is older than the cut.
//!
//! Tokens are counted the way DeerFlow's default counter does (about four characters per token plus
//! a few per message): the trigger is a budget, not an exact count, and the agent does not carry a
//! tokenizer for it.

use antler_proto::common::{Message, Role};
use futures::future::BoxFuture;
use tokio::sync::OnceCell;

use crate::lead::config::{ContextSize, SizeKind, SummarizationConfig};
use crate::lead::pipeline::{LoopError, Middleware};
use crate::lead::run_env::RunEnv;
use crate::lead::state::{ThreadState, text_of};

pub const CALLER: &str = "middleware:summarization";

/// Used when `summary_prompt` is empty.
const DEFAULT_PROMPT: &str = "Condense the conversation below into a summary that another assistant can continue from without \
seeing it. Keep: what the user asked for and every constraint they gave; decisions made and why; files created, changed or read \
(with their paths) and what they contain that matters; results of tool calls that later steps rely on; errors met and how they \
were handled; what is still open and the next step. Leave out pleasantries and anything superseded. Write plain text, no \
preamble.\n\n<messages>\n{messages}\n</messages>";

#[derive(Debug)]
pub struct Summarization {
    config: SummarizationConfig,
    /// The run model's context window, asked once per run (only for `fraction` sizes).
    context_window: OnceCell<Option<u64>>,
}

impl Summarization {
    pub fn new(config: SummarizationConfig) -> Self {
        Self { config, context_window: OnceCell::new() }
    }

    fn model(&self, env: &RunEnv) -> String {
        if !self.config.model_name.is_empty() {
            return self.config.model_name.clone();
        }
        env.ctx.spec.request.config.as_ref().map(|c| c.model_name.clone()).unwrap_or_default()
    }

    async fn context_window(&self, env: &RunEnv) -> Option<u64> {
        *self
            .context_window
            .get_or_init(|| async {
                let model = crate::lead::model_info::run_model(&env.ctx).await?;
                (model.context_window > 0).then_some(u64::from(model.context_window))
            })
            .await
    }

    /// A size in approximate tokens (None: a fraction of an unknown context window).
    async fn tokens_of(&self, env: &RunEnv, size: &ContextSize) -> Option<u64> {
        match size.kind {
            SizeKind::Tokens => Some(size.value as u64),
            SizeKind::Fraction => self.context_window(env).await.map(|w| (w as f64 * size.value) as u64),
            SizeKind::Messages => None,
        }
    }

    async fn triggered(&self, env: &RunEnv, messages: &[Message]) -> bool {
        let tokens = approx_tokens(messages);
        for trigger in &self.config.trigger {
            let met = match trigger.kind {
                SizeKind::Messages => messages.len() as f64 >= trigger.value,
                _ => self.tokens_of(env, trigger).await.is_some_and(|limit| tokens >= limit),
            };
            if met {
                return true;
            }
        }
        false
    }

    /// How many of the newest messages `keep` keeps.
    async fn kept(&self, env: &RunEnv, messages: &[Message]) -> usize {
        match self.config.keep.kind {
            SizeKind::Messages => (self.config.keep.value as usize).min(messages.len()),
            _ => {
                let Some(budget) = self.tokens_of(env, &self.config.keep).await else { return messages.len() };
                let mut used = 0;
                let mut count = 0;
                for message in messages.iter().rev() {
                    used += approx_tokens(std::slice::from_ref(message));
                    if used > budget {
                        break;
                    }
                    count += 1;
                }
                count
            }
        }
    }

    /// Asks the model for the summary; None when it cannot answer (the run goes on unsummarized).
    async fn summarize(&self, env: &RunEnv, previous: &str, older: &[Message]) -> Result<Option<String>, LoopError> {
        let mut transcript = String::new();
        if !previous.is_empty() {
            transcript.push_str(&format!("[summary of the conversation before these messages]\n{previous}\n\n"));
        }
        transcript.push_str(&render(trim_to_tokens(older, self.config.trim_tokens_to_summarize)));
        let template = if self.config.summary_prompt.is_empty() { DEFAULT_PROMPT } else { self.config.summary_prompt.as_str() };
        let Some(answer) = super::side_call::ask(env, CALLER, &self.model(env), template.replace("{messages}", &transcript)).await? else {
            return Ok(None);
        };
        let summary = answer.trim().to_owned();
        Ok((!summary.is_empty()).then_some(summary))
    }
}

/// DeerFlow's approximate count: about four characters per token, plus three per message.
pub fn approx_tokens(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            // Counted in place on every model call: no text is copied, arguments by their encoded size.
            let text: usize = m
                .content
                .iter()
                .map(|p| match &p.part {
                    Some(antler_proto::common::content_part::Part::Text(t)) => t.text.chars().count(),
                    _ => 0,
                })
                .sum();
            let calls: usize = m
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.raw_arguments.len() + c.arguments.as_ref().map_or(0, prost::Message::encoded_len))
                .sum();
            ((text + calls) as u64).div_ceil(4) + 3
        })
        .sum()
}

/// Where the kept part starts when the newest `keep` messages stay: moved back so a kept tool result
/// keeps the assistant turn that called it.
pub fn cut_point(messages: &[Message], keep: usize) -> usize {
    let mut cut = messages.len().saturating_sub(keep);
    while cut > 0 && messages.get(cut).is_some_and(|m| m.role == Role::Tool as i32) {
        cut -= 1;
    }
    cut
}

/// The newest messages of `messages` whose approximate tokens fit in `budget`.
fn trim_to_tokens(messages: &[Message], budget: u64) -> &[Message] {
    let mut used = 0;
    let mut start = messages.len();
    while start > 0 {
        used += approx_tokens(&messages[start - 1..start]);
        if used > budget {
            break;
        }
        start -= 1;
    }
    &messages[start..]
}

fn render(messages: &[Message]) -> String {
    let mut out = String::new();
    for message in messages {
        let role = match Role::try_from(message.role) {
            Ok(Role::User) => "user",
            Ok(Role::Assistant) => "assistant",
            Ok(Role::Tool) => "tool result",
            _ => "system",
        };
        out.push_str(&format!("{role}: {}\n", text_of(message)));
        for call in &message.tool_calls {
            let arguments = call
                .arguments
                .as_ref()
                .map(|a| antler_kit::json::struct_to_json(a).to_string())
                .unwrap_or_else(|| call.raw_arguments.clone());
            out.push_str(&format!("  (called {} {arguments})\n", call.name));
        }
    }
    out
}

impl Middleware for Summarization {
    fn name(&self) -> &'static str {
        "Summarization"
    }

    fn before_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        Box::pin(async move {
            if !self.triggered(env, &state.messages).await {
                return Ok(());
            }
            let keep = self.kept(env, &state.messages).await;
            let cut = cut_point(&state.messages, keep);
            if cut == 0 {
                return Ok(());
            }
            // The latest real user request stays, whatever its age: it is what the run is for.
            let last_user = state.messages.iter().rposition(|m| m.role == Role::User as i32);
            let preserved = last_user.filter(|&i| i < cut);
            let older: Vec<Message> =
                state.messages[..cut].iter().enumerate().filter(|(i, _)| Some(*i) != preserved).map(|(_, m)| m.clone()).collect();
            let tokens_before = approx_tokens(&state.messages);
            let Some(summary) = self.summarize(env, &state.summary_text, &older).await? else { return Ok(()) };
            let mut kept = Vec::with_capacity(state.messages.len() - cut + 1);
            if let Some(i) = preserved {
                kept.push(state.messages[i].clone());
            }
            kept.extend(state.messages.drain(cut..));
            tracing::info!(
                run_id = %env.ctx.spec.run_id,
                summarized = older.len(),
                kept = kept.len(),
                tokens_before,
                tokens_after = approx_tokens(&kept),
                "older messages summarized"
            );
            state.messages = kept;
            state.summary_text = summary;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lead::state::text_message;
    use antler_proto::common::ToolCall;

    fn assistant_calling(id: &str) -> Message {
        let mut m = text_message(Role::Assistant, "");
        m.tool_calls = vec![ToolCall { id: id.to_owned(), name: "ls".to_owned(), ..ToolCall::default() }];
        m
    }

    fn result(id: &str) -> Message {
        let mut m = text_message(Role::Tool, "a b c");
        m.tool_call_id = id.to_owned();
        m
    }

    #[test]
    fn the_cut_never_separates_a_result_from_its_call() {
        let messages = vec![text_message(Role::User, "go"), assistant_calling("1"), result("1"), assistant_calling("2"), result("2")];
        // Keeping 1 would keep only result 2: its call is kept with it.
        assert_eq!(cut_point(&messages, 1), 3);
        assert_eq!(cut_point(&messages, 2), 3);
        assert_eq!(cut_point(&messages, 10), 0);
    }

    #[test]
    fn tokens_are_about_four_characters_each_plus_three_per_message() {
        assert_eq!(approx_tokens(&[text_message(Role::User, "x".repeat(40))]), 13);
        let many: Vec<Message> = (0..10).map(|_| text_message(Role::User, "x".repeat(40))).collect();
        assert_eq!(trim_to_tokens(&many, 30).len(), 2);
    }
}
