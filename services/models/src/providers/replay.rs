//! The replay provider: deterministic scripted answers, streamed in chunks like a real provider, with
//! optional delays, injected failures and cut streams. For demos and tests; it never touches the network.
//!
//! A script is a list of turns. The turn answered is the number of assistant messages in the request (the
//! first call of a conversation gets turn 0, the call after one assistant reply and its tool results gets
//! turn 1, …), so a script plays an agent loop through without any state kept between calls — except the
//! count of injected failures, which is per process (`fail.times` failures, then the turn succeeds).

use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::{Attempt, Provider};
use crate::error::{ModelError, UpstreamError, UpstreamKind};
use crate::events::{Event, Stop, UsageReport};
use crate::request::ChatCall;
use crate::spec::ModelSpec;

pub mod script;

use script::{AfterLast, ReplayFailure, ReplayScript, ReplayTurn};

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
}
