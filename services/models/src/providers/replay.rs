//! The replay provider: deterministic scripted answers, streamed in chunks like a real provider, with
//! optional delays, injected failures and cut streams. For demos and tests; it never touches the network.
//!
//! A script is a list of turns. The turn answered is the number of assistant messages in the request (the
//! first call of a conversation gets turn 0, the call after one assistant reply and its tool results gets
//! turn 1, …), so a script plays an agent loop through without any state kept between calls — except the
//! count of injected failures, which is per process (`fail.times` failures, then the turn succeeds).

use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use antler_kit::config::ConfigError;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Attempt, Provider};
use crate::error::{ModelError, UpstreamError, UpstreamKind};
use crate::events::{Event, Stop, UsageReport};
use crate::request::ChatCall;
use crate::spec::ModelSpec;

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
    /// The answers, in order. At least one.
    pub turns: Vec<ReplayTurn>,
}

fn default_chunk_chars() -> usize {
    16
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

/// A replay model.
#[derive(Debug)]
pub struct Replay {
    name: String,
    upstream_model: String,
    script: Arc<ReplayScript>,
    /// Failures injected so far, per turn.
    failures: Arc<Vec<AtomicU32>>,
}

impl Replay {
    pub fn new(spec: &ModelSpec) -> Result<Self, String> {
        let script = spec.replay.clone().ok_or_else(|| "a replay model needs a script".to_owned())?;
        let failures = Arc::new(script.turns.iter().map(|_| AtomicU32::new(0)).collect());
        Ok(Self { name: spec.name.clone(), upstream_model: spec.upstream_model.clone(), script, failures })
    }
}

impl Provider for Replay {
    /// The "body" of a replay call says which turn is played and whether thinking is shown.
    fn prepare(&self, call: &ChatCall, _settings: Map<String, Value>) -> Result<Value, ModelError> {
        let turns = self.script.turns.len();
        let asked = call.assistant_turns();
        let turn = match self.script.after_last {
            _ if asked < turns => asked,
            AfterLast::RepeatLast => turns - 1,
            AfterLast::Cycle => asked % turns,
            AfterLast::Error => {
                return Err(ModelError::Replay {
                    model: self.name.clone(),
                    message: format!(
                        "the script has {turns} turn(s) and the conversation already has {asked} assistant message(s)\nhint: add turns, or set after_last: repeat_last | cycle"
                    ),
                });
            }
        };
        Ok(json!({ "turn": turn, "thinking": call.thinking_enabled }))
    }

    fn send(&self, body: &Bytes) -> BoxFuture<'static, Result<Attempt, UpstreamError>> {
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let turn_index = body.get("turn").and_then(Value::as_u64).and_then(|t| usize::try_from(t).ok()).unwrap_or(0);
        let thinking = body.get("thinking").and_then(Value::as_bool).unwrap_or(false);
        let script = self.script.clone();
        let failures = self.failures.clone();
        let upstream_model = self.upstream_model.clone();
        Box::pin(async move {
            let Some(turn) = script.turns.get(turn_index) else {
                return Err(UpstreamError::new(UpstreamKind::Malformed, format!("turn {turn_index} is not in the script")));
            };
            let first_byte = Duration::from_millis(turn.first_byte_delay_ms.unwrap_or(script.first_byte_delay_ms));
            if !first_byte.is_zero() {
                tokio::time::sleep(first_byte).await;
            }
            if let Some(fail) = &turn.fail {
                let so_far = failures.get(turn_index).map(|c| c.fetch_add(1, Ordering::Relaxed)).unwrap_or(0);
                if fail.times == 0 || so_far < fail.times {
                    return Err(injected(fail));
                }
            }
            let events = script_events(turn, turn_index, thinking, &upstream_model, script.chunk_chars);
            let delay = Duration::from_millis(turn.chunk_delay_ms.unwrap_or(script.chunk_delay_ms));
            let stream = futures::stream::iter(events).then(move |item| async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                item
            });
            Ok(Attempt { events: stream.boxed(), request_id: format!("replay-{turn_index}") })
        })
    }
}

fn injected(fail: &ReplayFailure) -> UpstreamError {
    let message = if fail.message.is_empty() { format!("injected failure (HTTP {})", fail.status) } else { fail.message.clone() };
    if fail.status == 0 {
        return UpstreamError::new(UpstreamKind::Connect, message);
    }
    UpstreamError::from_status(fail.status, message, fail.retry_after_secs.map(Duration::from_secs))
}

fn chunks(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(size.max(1)).map(|c| c.iter().collect()).collect()
}

/// The whole answer as stream items, chunked; a `break_after_chunks` cut ends it with a broken-stream error.
fn script_events(
    turn: &ReplayTurn,
    turn_index: usize,
    thinking: bool,
    default_model: &str,
    default_chunk: usize,
) -> Vec<Result<Event, UpstreamError>> {
    let size = turn.chunk_chars.unwrap_or(default_chunk);
    let mut content: Vec<Event> = Vec::new();
    if thinking {
        if let Some(text) = &turn.thinking {
            content.extend(chunks(text, size).into_iter().map(Event::Thinking));
            if let Some(signature) = &turn.signature {
                content.push(Event::Signature(signature.clone()));
            }
            content.push(Event::ThinkingStop);
        }
        if let Some(data) = &turn.redacted_thinking {
            content.push(Event::Redacted(data.clone()));
        }
    }
    if let Some(text) = &turn.text {
        content.extend(chunks(text, size).into_iter().map(Event::Text));
    }
    for (k, call) in turn.tool_calls.iter().enumerate() {
        let key = u32::try_from(k).unwrap_or(u32::MAX);
        let id = call.id.clone().unwrap_or_else(|| format!("call_{turn_index}_{k}"));
        content.push(Event::ToolStart { key, id, name: call.name.clone() });
        let arguments = match &call.arguments {
            Value::String(raw) => raw.clone(),
            Value::Null => "{}".to_owned(),
            other => other.to_string(),
        };
        content.extend(chunks(&arguments, size).into_iter().map(|delta| Event::ToolArgs { key, delta }));
        content.push(Event::ToolStop { key });
    }

    let mut items: Vec<Result<Event, UpstreamError>> =
        vec![Ok(Event::Model(turn.model.clone().unwrap_or_else(|| default_model.to_owned())))];
    if let Some(cut) = turn.break_after_chunks {
        items.extend(content.into_iter().take(cut).map(Ok));
        items.push(Err(UpstreamError::new(UpstreamKind::Broken, format!("scripted cut after {cut} chunk(s)"))));
        return items;
    }
    items.extend(content.into_iter().map(Ok));
    let stop = match turn.finish_reason.as_deref() {
        Some("tool_calls") => Stop::ToolCalls,
        Some("length") => Stop::Length,
        Some("content_filter") => Stop::ContentFilter,
        Some("paused") => Stop::Paused,
        Some(_) => Stop::Stop,
        None if turn.tool_calls.is_empty() => Stop::Stop,
        None => Stop::ToolCalls,
    };
    let raw = turn.finish_reason.clone().unwrap_or_else(|| if stop == Stop::ToolCalls { "tool_calls".into() } else { "stop".into() });
    items.push(Ok(Event::Finish { stop, raw, stop_sequence: String::new() }));
    if let Some(u) = turn.usage {
        items.push(Ok(Event::Usage(UsageReport {
            input: Some(u.input_tokens),
            output: Some(u.output_tokens),
            total: Some(u.input_tokens + u.output_tokens),
            cache_read: Some(u.cache_read_tokens),
            cache_creation: Some(u.cache_creation_tokens),
            reasoning: Some(u.reasoning_tokens),
        })));
    }
    items.push(Ok(Event::Done));
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_streamed_in_chunks_of_the_configured_size() {
        let turn = ReplayTurn { text: Some("abcdefgh".into()), ..ReplayTurn::default() };
        let items = script_events(&turn, 0, false, "m", 3);
        let texts: Vec<String> = items
            .iter()
            .filter_map(|i| match i {
                Ok(Event::Text(t)) => Some(t.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["abc", "def", "gh"]);
        assert!(matches!(items.last(), Some(Ok(Event::Done))));
    }

    #[test]
    fn thinking_is_only_played_when_asked_for() {
        let turn = ReplayTurn { thinking: Some("hmm".into()), text: Some("ok".into()), ..ReplayTurn::default() };
        let has_thinking = |items: &[Result<Event, UpstreamError>]| items.iter().any(|i| matches!(i, Ok(Event::Thinking(_))));
        assert!(has_thinking(&script_events(&turn, 0, true, "m", 16)));
        assert!(!has_thinking(&script_events(&turn, 0, false, "m", 16)));
    }

    #[test]
    fn a_cut_ends_with_a_broken_stream() {
        let turn = ReplayTurn { text: Some("abcdefgh".into()), break_after_chunks: Some(2), ..ReplayTurn::default() };
        let items = script_events(&turn, 0, false, "m", 2);
        assert!(matches!(items.last(), Some(Err(UpstreamError { kind: UpstreamKind::Broken, .. }))));
        assert!(!items.iter().any(|i| matches!(i, Ok(Event::Finish { .. }))));
    }

    #[test]
    fn scripts_are_checked() {
        let script: Result<ReplayScript, _> = serde_yaml_ng::from_str("turns: [{text: hi, finish_reason: maybe}]");
        let err = script.map_err(|e| e.to_string()).and_then(|s| s.check("x").map_err(|e| e.to_string())).err().unwrap_or_default();
        assert!(err.contains("x.turns[0].finish_reason"), "{err}");
        let empty: Result<ReplayScript, _> = serde_yaml_ng::from_str("turns: []");
        assert!(empty.map(|s| s.check("x").is_err()).unwrap_or(false));
    }
}
