//! A replay script: the turns a replay model answers with, read from YAML or JSON and checked when the
//! configuration loads. Data only: the model specs hold a script, and the provider beside this module plays it.

use std::path::Path;

use antler_kit::config::ConfigError;
use serde::Deserialize;
use serde_json::Value;

/// A replay script (YAML or JSON).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayScript {
    /// Characters per streamed chunk (1..65536; default 16).
    #[serde(default = "default_chunk_chars")]
    pub chunk_chars: usize,
    /// Pause between chunks in milliseconds (default 0).
    #[serde(default)]
    pub chunk_delay_ms: u64,
    /// Pause before the stream starts in milliseconds (default 0).
    #[serde(default)]
    pub first_byte_delay_ms: u64,
    /// What to do when the conversation has more assistant turns than the script.
    #[serde(default)]
    pub after_last: AfterLast,
    /// Answers for the memory layer instead of turns (see `memory.rs`); both off by default.
    #[serde(default)]
    pub memory: ReplayMemory,
    /// The answers, in order. At least one.
    pub turns: Vec<ReplayTurn>,
}

fn default_chunk_chars() -> usize {
    16
}

/// What a replay model does for the memory layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayMemory {
    /// Answer the memory service's extraction calls (caller `middleware:memory`) with facts derived from
    /// the conversation, in its strict JSON format, instead of playing a turn.
    pub extract: bool,
    /// Start the first answer of a conversation whose system prompt holds a `<memory>` block with
    /// "From memory: " and the facts the block lists.
    pub recall: bool,
}

/// Behaviour past the script's end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterLast {
    /// FAILED_PRECONDITION naming the script length (default).
    #[default]
    Error,
    /// Answer with the last turn again.
    RepeatLast,
    /// Start over from the first turn.
    Cycle,
}

/// One scripted answer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayTurn {
    /// Thinking text, streamed before the answer when the request enables thinking.
    pub thinking: Option<String>,
    /// Signature of the thinking block.
    pub signature: Option<String>,
    /// A redacted thinking block (sent whole), when thinking is enabled.
    pub redacted_thinking: Option<String>,
    /// Answer text.
    pub text: Option<String>,
    /// Tool calls, streamed after the text.
    pub tool_calls: Vec<ReplayToolCall>,
    /// Usage to report; absent = none reported (the gateway then estimates it).
    pub usage: Option<ReplayUsage>,
    /// `stop`, `tool_calls`, `length`, `content_filter` or `paused`; default `tool_calls` when there are
    /// tool calls, else `stop`.
    pub finish_reason: Option<String>,
    /// Upstream model id to report; default the model's configured `model`.
    pub model: Option<String>,
    /// Per-turn overrides of the script's timing.
    pub chunk_chars: Option<usize>,
    pub chunk_delay_ms: Option<u64>,
    pub first_byte_delay_ms: Option<u64>,
    /// Fail the first `times` attempts at this turn before any output.
    pub fail: Option<ReplayFailure>,
    /// Cut the stream after this many chunks (no finish, no usage), like a dropped connection.
    pub break_after_chunks: Option<usize>,
    /// Play this turn only when the request offers every one of these tools; otherwise the script reads
    /// as if it did not have the turn (turns are counted among those that apply).
    pub if_offered: Vec<String>,
}

/// A scripted tool call.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayToolCall {
    /// Call id; default `call_<turn>_<index>`.
    pub id: Option<String>,
    pub name: String,
    /// A JSON object, or a string streamed verbatim (to script invalid arguments).
    pub arguments: Value,
    /// Send this call only when the request offers a tool of this name; otherwise it is left out of the turn.
    pub if_offered: bool,
}

/// Scripted token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_creation_tokens: u64,
    pub reasoning_tokens: u64,
}

/// An injected upstream failure.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayFailure {
    /// HTTP status to simulate (e.g. 429, 500, 401); 0 = a connection error.
    pub status: u16,
    /// Provider message.
    #[serde(default)]
    pub message: String,
    /// `Retry-After` to report, in seconds.
    #[serde(default)]
    pub retry_after_secs: Option<u64>,
    /// How many attempts fail before the turn succeeds (default 1; 0 = every attempt).
    #[serde(default = "one")]
    pub times: u32,
}

fn one() -> u32 {
    1
}

const FINISH_REASONS: &[&str] = &["stop", "tool_calls", "length", "content_filter", "paused"];

impl ReplayScript {
    /// Reads and checks a script file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read replay script {}: {e}", path.display()))?;
        let script: Self = serde_yaml_ng::from_str(&text).map_err(|e| format!("replay script {}: {e}", path.display()))?;
        script.check(&path.display().to_string()).map_err(|e| e.to_string())?;
        Ok(script)
    }

    /// Checks ranges and references; `path` names the script in errors.
    pub fn check(&self, path: &str) -> Result<(), ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid { path: field, message };
        if self.turns.is_empty() {
            return Err(invalid(format!("{path}.turns"), "a script needs at least one turn".to_owned()));
        }
        antler_kit::config::check_range(&format!("{path}.chunk_chars"), self.chunk_chars as u64, 1, 65_536)?;
        for (i, turn) in self.turns.iter().enumerate() {
            let at = format!("{path}.turns[{i}]");
            if let Some(chars) = turn.chunk_chars {
                antler_kit::config::check_range(&format!("{at}.chunk_chars"), chars as u64, 1, 65_536)?;
            }
            if let Some(reason) = &turn.finish_reason
                && !FINISH_REASONS.contains(&reason.as_str())
            {
                return Err(invalid(format!("{at}.finish_reason"), format!("`{reason}` must be one of {}", FINISH_REASONS.join(", "))));
            }
            for (k, call) in turn.tool_calls.iter().enumerate() {
                if call.name.is_empty() {
                    return Err(invalid(format!("{at}.tool_calls[{k}].name"), "is required".to_owned()));
                }
                if !matches!(call.arguments, Value::Object(_) | Value::String(_) | Value::Null) {
                    return Err(invalid(format!("{at}.tool_calls[{k}].arguments"), "must be a mapping or a string".to_owned()));
                }
            }
            if let Some(fail) = &turn.fail
                && fail.status != 0
                && !(400..600).contains(&fail.status)
            {
                return Err(invalid(format!("{at}.fail.status"), format!("{} is not an HTTP error status (400..599) or 0", fail.status)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_checked() {
        let script: Result<ReplayScript, _> = serde_yaml_ng::from_str("turns: [{text: hi, finish_reason: maybe}]");
        let err = script.map_err(|e| e.to_string()).and_then(|s| s.check("x").map_err(|e| e.to_string())).err().unwrap_or_default();
        assert!(err.contains("x.turns[0].finish_reason"), "{err}");
        let empty: Result<ReplayScript, _> = serde_yaml_ng::from_str("turns: []");
        assert!(empty.map(|s| s.check("x").is_err()).unwrap_or(false));
    }
}
