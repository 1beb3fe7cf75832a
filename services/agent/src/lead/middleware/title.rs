//! Title: after the first exchange (one user message, at least one assistant message), the thread
//! gets a title — written by `title.model_name` (caller `middleware:title`, usage recorded in the
//! middleware bucket) or, without a model or when the call fails, by DeerFlow's local fallback: the
//! first user message, cut to fit. The title goes into the state and onto the thread.

use antler_proto::common::Role;
use futures::future::BoxFuture;

use crate::lead::config::TitleConfig;
use crate::lead::pipeline::{LoopError, Middleware};
use crate::lead::run_env::RunEnv;
use crate::lead::state::{ThreadState, text_of};

/// The caller tag of title calls.
pub const CALLER: &str = "middleware:title";

#[derive(Debug)]
pub struct Title {
    config: TitleConfig,
}

impl Title {
    pub fn new(config: TitleConfig) -> Self {
        Self { config }
    }

    /// Asks the title model; None when it cannot answer (the caller falls back).
    async fn generate(&self, env: &RunEnv, user: &str, assistant: &str) -> Result<Option<String>, LoopError> {
        let cut = |s: &str| s.chars().take(500).collect::<String>();
        let prompt = self
            .config
            .prompt_template
            .replace("{max_words}", &self.config.max_words.to_string())
            .replace("{user_msg}", &cut(user))
            .replace("{assistant_msg}", &cut(assistant));
        let Some(text) = super::side_call::ask(env, CALLER, &self.config.model_name, prompt).await? else { return Ok(None) };
        Ok(clean(&text, self.config.max_chars as usize))
    }
}

/// A model's title without `<think>` blocks, quotes or extra lines, cut to `max_chars`.
pub fn clean(text: &str, max_chars: usize) -> Option<String> {
    let mut text = text.to_owned();
    while let (Some(start), Some(end)) = (text.find("<think>"), text.find("</think>")) {
        if end < start {
            break;
        }
        text.replace_range(start..end + "</think>".len(), "");
    }
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line.trim_matches(|c| c == '"' || c == '\'' || c == '“' || c == '”').trim();
    let title: String = line.chars().take(max_chars).collect();
    (!title.is_empty()).then_some(title)
}

/// DeerFlow's fallback: at most min(max_chars, 50) characters, `...` when cut, `New Conversation`
/// when empty.
pub fn fallback_title(user_text: &str, max_chars: usize) -> String {
    let text = user_text.split_whitespace().collect::<Vec<_>>().join(" ");
    let n = max_chars.min(50);
    if text.is_empty() {
        return "New Conversation".to_owned();
    }
    if text.chars().count() > n {
        let keep = n.min(max_chars.saturating_sub(3));
        let cut: String = text.chars().take(keep).collect();
        return format!("{}...", cut.trim_end());
    }
    text
}

impl Middleware for Title {
    fn name(&self) -> &'static str {
        "Title"
    }

    fn after_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        Box::pin(async move {
            let users: Vec<_> = state.messages.iter().filter(|m| m.role == Role::User as i32).collect();
            let assistant = state.messages.iter().rev().find(|m| m.role == Role::Assistant as i32);
            let (Some(assistant), true, true) = (assistant, users.len() == 1, state.title.is_empty()) else { return Ok(()) };
            let user = text_of(users[0]);
            let generated = if self.config.model_name.is_empty() { None } else { self.generate(env, &user, &text_of(assistant)).await? };
            let title = generated.unwrap_or_else(|| fallback_title(&user, self.config.max_chars as usize));
            env.ctx.stage_thread_title(&title);
            state.title = title;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_cuts_long_text_and_names_empty_threads() {
        assert_eq!(fallback_title("Write  a\nreport", 60), "Write a report");
        assert_eq!(fallback_title("", 60), "New Conversation");
        let long = "x".repeat(80);
        assert_eq!(fallback_title(&long, 60), format!("{}...", "x".repeat(50)));
    }

    #[test]
    fn model_titles_lose_thinking_and_quotes() {
        assert_eq!(clean("<think>hmm</think>\n\"Quarterly Report\"\n", 60), Some("Quarterly Report".to_owned()));
        assert_eq!(clean("A very long title indeed", 10), Some("A very lon".to_owned()));
        assert_eq!(clean("<think>only</think>", 60), None);
    }
}
