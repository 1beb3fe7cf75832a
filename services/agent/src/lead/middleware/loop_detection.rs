//! LoopDetection: the same set of tool calls made again and again. Each assistant turn's calls are
//! hashed (order-independent, on the salient arguments); within the last `window_size` turns, the
//! `warn_threshold`-th repetition injects a warning before the next model call (once per hash), and
//! the `hard_limit`-th strips the turn's tool calls, appends DeerFlow's forced-stop note and ends the
//! run with stop_reason `loop_capped`. A second layer counts calls per tool name, whatever the
//! arguments (`tool_freq_warn` / `tool_freq_hard_limit`), with the same two responses.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use antler_proto::common::{Role, ToolCall};
use antler_proto::models::ChatRequest;
use futures::future::BoxFuture;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::lead::config::LoopDetectionConfig;
use crate::lead::pipeline::{LoopError, Middleware, ModelNext, ModelResult};
use crate::lead::run_env::RunEnv;
use crate::lead::state::{ThreadState, finish_with_note, text_message};

pub const WARNING: &str = "[LOOP DETECTED] You are repeating the same tool calls. Stop calling tools and produce your final answer now. \
If you cannot complete the task, summarize what you accomplished so far.";
pub const FORCED_STOP: &str =
    "\n\n[FORCED STOP] Repeated tool calls exceeded the safety limit. Producing final answer with results collected so far.";

#[derive(Debug)]
pub struct LoopDetection {
    config: LoopDetectionConfig,
    state: Mutex<Tracker>,
}

#[derive(Debug, Default)]
struct Tracker {
    window: VecDeque<String>,
    warned: HashSet<String>,
    /// The warning to inject before the next model call.
    pending_warning: Option<String>,
    /// Names of the most recent tool calls.
    calls: VecDeque<String>,
    freq_warned: HashSet<String>,
}

/// What one turn's observation concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Fine,
    Warned,
    /// Forced stop; the note to append.
    Stop(String),
}

/// The per-tool warning.
pub fn freq_warning(tool: &str, count: u32) -> String {
    format!(
        "[LOOP DETECTED] You have called {tool} {count} times without producing a final answer. Consider whether further calls \
         are necessary, and produce your final answer if you have enough information."
    )
}

/// The per-tool forced-stop note.
pub fn freq_stop(tool: &str, count: u32) -> String {
    format!(
        "\n\n[FORCED STOP] Tool {tool} called {count} times — exceeded the per-tool safety limit. Producing final answer with \
         results collected so far."
    )
}

impl LoopDetection {
    pub fn new(config: LoopDetectionConfig) -> Self {
        Self { config, state: Mutex::new(Tracker::default()) }
    }

    /// Records one turn's calls (their set hash and their tool names) and decides.
    fn observe(&self, hash: String, names: &[String]) -> Verdict {
        let config = &self.config;
        let mut tracker = self.state.lock().unwrap_or_else(|p| p.into_inner());
        tracker.window.push_back(hash.clone());
        while tracker.window.len() > config.window_size as usize {
            tracker.window.pop_front();
        }
        let count = tracker.window.iter().filter(|h| **h == hash).count() as u32;
        if count >= config.hard_limit {
            return Verdict::Stop(FORCED_STOP.to_owned());
        }
        let freq_window = config.window_size.max(config.tool_freq_hard_limit) as usize;
        let mut verdict = Verdict::Fine;
        for name in names {
            tracker.calls.push_back(name.clone());
            while tracker.calls.len() > freq_window {
                tracker.calls.pop_front();
            }
            let calls = tracker.calls.iter().filter(|n| *n == name).count() as u32;
            if calls >= config.tool_freq_hard_limit {
                return Verdict::Stop(freq_stop(name, calls));
            }
            if calls >= config.tool_freq_warn && tracker.freq_warned.insert(name.clone()) {
                tracker.pending_warning.get_or_insert_with(|| freq_warning(name, calls));
                verdict = Verdict::Warned;
            }
        }
        if count >= config.warn_threshold && tracker.warned.insert(hash) {
            // The repetition warning wins over a frequency warning of the same turn.
            tracker.pending_warning = Some(WARNING.to_owned());
            verdict = Verdict::Warned;
        }
        verdict
    }
}

/// The salient part of one call's arguments.
fn call_key(call: &ToolCall) -> String {
    let args: Value = match &call.arguments {
        Some(s) => antler_kit::json::struct_to_json(s),
        None => serde_json::from_str(&call.raw_arguments).unwrap_or(Value::Null),
    };
    let key = match call.name.as_str() {
        "read_file" => {
            let line = |k: &str| args.get(k).and_then(Value::as_u64).unwrap_or(1).saturating_sub(1) / 200;
            format!("{}:{}-{}", args.get("path").and_then(Value::as_str).unwrap_or(""), line("start_line"), line("end_line"))
        }
        "write_file" | "str_replace" => args.to_string(),
        _ => {
            let salient: serde_json::Map<String, Value> = ["path", "url", "query", "command", "pattern", "glob", "cmd"]
                .iter()
                .filter_map(|k| args.get(*k).map(|v| ((*k).to_owned(), v.clone())))
                .collect();
            if salient.is_empty() { args.to_string() } else { Value::Object(salient).to_string() }
        }
    };
    format!("{}:{key}", call.name)
}

/// Order-independent hash of a turn's calls.
pub fn calls_hash(calls: &[ToolCall]) -> String {
    let mut keys: Vec<String> = calls.iter().map(call_key).collect();
    keys.sort();
    let digest = Sha256::digest(serde_json::to_string(&keys).unwrap_or_default().as_bytes());
    hex::encode(digest)[..12].to_owned()
}

impl Middleware for LoopDetection {
    fn name(&self) -> &'static str {
        "LoopDetection"
    }

    fn wrap_model_call<'a>(&'a self, env: &'a RunEnv, mut request: ChatRequest, next: ModelNext<'a>) -> BoxFuture<'a, ModelResult> {
        let warning = self.state.lock().unwrap_or_else(|p| p.into_inner()).pending_warning.take();
        if let Some(warning) = warning {
            let mut warning = text_message(Role::User, warning);
            warning.name = "loop_warning".to_owned();
            request.messages.push(warning);
        }
        next.run(env, request)
    }

    fn after_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        let Some(last) = state.messages.last_mut().filter(|m| m.role == Role::Assistant as i32 && !m.tool_calls.is_empty()) else {
            return Box::pin(async { Ok(()) });
        };
        let hash = calls_hash(&last.tool_calls);
        let names: Vec<String> = last.tool_calls.iter().map(|c| c.name.clone()).collect();
        match self.observe(hash.clone(), &names) {
            Verdict::Fine => {}
            Verdict::Warned => tracing::info!(run_id = %env.ctx.spec.run_id, hash, "loop warning queued"),
            Verdict::Stop(note) => {
                tracing::warn!(run_id = %env.ctx.spec.run_id, hash, "repeated tool calls: forced stop");
                finish_with_note(last, &note);
                env.stop("loop_capped");
            }
        }
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: Value) -> ToolCall {
        let arguments = match antler_kit::json::json_to_value(&args).kind {
            Some(prost_types::value::Kind::StructValue(s)) => Some(s),
            _ => None,
        };
        ToolCall { id: uuid::Uuid::new_v4().to_string(), name: name.to_owned(), arguments, raw_arguments: String::new() }
    }

    #[test]
    fn hash_ignores_order_ids_and_non_salient_arguments() {
        let a =
            vec![call("bash", serde_json::json!({"command": "ls", "description": "one"})), call("ls", serde_json::json!({"path": "/x"}))];
        let b =
            vec![call("ls", serde_json::json!({"path": "/x"})), call("bash", serde_json::json!({"command": "ls", "description": "two"}))];
        assert_eq!(calls_hash(&a), calls_hash(&b));
        let c = vec![call("bash", serde_json::json!({"command": "pwd"}))];
        assert_ne!(calls_hash(&a), calls_hash(&c));
    }

    #[test]
    fn warns_once_at_the_threshold_then_caps_at_the_hard_limit() {
        let detector = LoopDetection::new(LoopDetectionConfig::default());
        let names = vec!["ls".to_owned()];
        let results: Vec<Verdict> = (0..5).map(|_| detector.observe("h".to_owned(), &names)).collect();
        let stop = Verdict::Stop(FORCED_STOP.to_owned());
        assert_eq!(results, vec![Verdict::Fine, Verdict::Fine, Verdict::Warned, Verdict::Fine, stop]);
    }

    #[test]
    fn one_tool_called_too_often_with_varying_arguments_is_warned_then_stopped() {
        let config = LoopDetectionConfig { tool_freq_warn: 3, tool_freq_hard_limit: 5, ..LoopDetectionConfig::default() };
        let detector = LoopDetection::new(config);
        let names = vec!["grep".to_owned()];
        let results: Vec<Verdict> = (0..5).map(|i| detector.observe(format!("h{i}"), &names)).collect();
        assert_eq!(&results[..4], &[Verdict::Fine, Verdict::Fine, Verdict::Warned, Verdict::Fine]);
        assert_eq!(results[4], Verdict::Stop(freq_stop("grep", 5)));
        let pending = detector.state.lock().map(|t| t.pending_warning.clone()).unwrap_or_default();
        assert_eq!(pending, Some(freq_warning("grep", 3)));
    }
}
