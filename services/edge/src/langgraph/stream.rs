//! Antler's durable run events → LangGraph's SSE frames, per stream mode.
//!
//! | Antler event | `values` | `updates` | `messages-tuple` (SSE `messages`) | `events` | `custom` |
//! |---|---|---|---|---|---|
//! | METADATA | `metadata` frame (every mode) | | | + `on_chain_start` | |
//! | MESSAGE_DELTA | | | `[AIMessageChunk, meta]` | `on_chat_model_start` (first), `on_chat_model_stream` | |
//! | MESSAGE | kept for the next `values` | kept for the next `updates` | tool results; a final empty chunk with usage after a streamed turn | `on_chat_model_end` | |
//! | VALUES | full state (channels + messages) | `{node: new messages + changed channels}` | | | |
//! | UPDATE | | `{node: update}` | | `on_chain_stream` | |
//! | TOOL_STARTED / _FINISHED | | | | `on_tool_start` / `on_tool_end` | |
//! | CUSTOM | | | | `on_custom_event` | `{name, data}` |
//! | CLARIFICATION | | `{"__interrupt__": [{value, id}]}` | | | |
//! | ERROR (fatal), END with ERROR/TIMEOUT | `error` frame `{error, message}` (every mode, once) | | | | |
//! | HEARTBEAT | `: heartbeat` comment | | | | |
//! | END | `end` frame, data null (every mode) | | | + `on_chain_end` | |
//!
//! Every frame carries an SSE `id:` derived from the run's durable event seq (see [`frame_ids`]), so a
//! client that reconnects with `Last-Event-ID` resumes exactly where it stopped.

use std::collections::{HashMap, HashSet};

use antler_kit::json::{struct_to_json, value_to_json};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{Checkpoint, EventKind, RunEvent, RunStatus};
use serde_json::{Map, Value, json};

use super::messages::{to_langchain, usage_metadata};

/// A LangGraph stream mode the edge serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamMode {
    Values,
    Updates,
    MessagesTuple,
    Events,
    Custom,
}

impl StreamMode {
    pub const ALL: [StreamMode; 5] = [Self::Values, Self::Updates, Self::MessagesTuple, Self::Events, Self::Custom];

    pub fn name(self) -> &'static str {
        match self {
            Self::Values => "values",
            Self::Updates => "updates",
            Self::MessagesTuple => "messages-tuple",
            Self::Events => "events",
            Self::Custom => "custom",
        }
    }

    /// The mode called `name`, or why it is not served.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|m| m.name() == name).ok_or_else(|| match name {
            "messages" => "stream mode `messages` (partial/complete message frames) is not supported; use `messages-tuple`".to_owned(),
            "debug" | "tasks" | "checkpoints" => format!(
                "stream mode `{name}` is not supported: Antler's loop has no LangGraph tasks or checkpoint frames; use `values` or `updates` (checkpoints are read with GET /threads/{{id}}/history)"
            ),
            "tools" | "lifecycle" => format!("stream mode `{name}` is not supported; use `events` (on_tool_start / on_tool_end)"),
            other => format!("`{other}` is not a LangGraph stream mode; Antler serves values, updates, messages-tuple, events, custom"),
        })
    }

    /// The Antler event kinds a subscription needs for this mode (METADATA, ERROR, HEARTBEAT and END
    /// are always delivered).
    pub fn kinds(self) -> &'static [EventKind] {
        match self {
            Self::Values => &[EventKind::Values, EventKind::Message],
            Self::Updates => &[EventKind::Values, EventKind::Message, EventKind::Update, EventKind::Clarification],
            Self::MessagesTuple => &[EventKind::MessageDelta, EventKind::Message],
            Self::Events => &[
                EventKind::MessageDelta,
                EventKind::Message,
                EventKind::Update,
                EventKind::ToolStarted,
                EventKind::ToolFinished,
                EventKind::Custom,
            ],
            Self::Custom => &[EventKind::Custom],
        }
    }
}

/// The event kinds (as `i32`, sorted, deduplicated) that `modes` need.
pub fn kinds_for(modes: &[StreamMode]) -> Vec<i32> {
    let mut kinds: Vec<i32> = modes.iter().flat_map(|m| m.kinds().iter().map(|k| *k as i32)).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Event {
        name: String,
        data: Value,
    },
    /// `: heartbeat` — keeps proxies from closing an idle stream; no id, no event.
    Heartbeat,
}

fn frame(name: &str, data: Value) -> Frame {
    Frame::Event { name: name.to_owned(), data }
}

/// Where a reconnecting client stands: after event `after_seq`, having already received the first
/// `skip` frames that event `after_seq + 1` produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resume {
    pub after_seq: u64,
    pub skip: usize,
}

/// SSE ids of the frames one event produces: the last frame of event `seq` is `seq`, the ones before
/// it `seq-1.k` ("after seq-1, k+1 frames of the next event received"). A drop between two frames of
/// one event therefore resumes with neither a gap nor a duplicate, and single-frame events (nearly
/// all) carry the plain durable seq.
pub fn frame_ids(seq: u64, frames: usize) -> Vec<String> {
    (0..frames).map(|i| if i + 1 == frames { seq.to_string() } else { format!("{}.{i}", seq.saturating_sub(1)) }).collect()
}

/// Parses a `Last-Event-ID` written by [`frame_ids`]. An id before the run's first event — `0`, or
/// a negative one such as the `-1` with which the SDKs' `useStream` rejoins a run after a page
/// reload — replays from the start, as LangGraph does.
pub fn parse_last_event_id(value: &str) -> Result<Resume, String> {
    let value = value.trim();
    let bad = || format!("`{value}` is not an event id this server sent (a run event seq, e.g. 42, or -1 for the start)");
    if value.strip_prefix('-').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
        return Ok(Resume::default());
    }
    match value.split_once('.') {
        None => Ok(Resume { after_seq: value.parse().map_err(|_| bad())?, skip: 0 }),
        Some((seq, k)) => {
            let k: usize = k.parse().map_err(|_| bad())?;
            Ok(Resume { after_seq: seq.parse().map_err(|_| bad())?, skip: k.checked_add(1).ok_or_else(bad)? })
        }
    }
}

/// Reads checkpoints by id (the thread's state at a step), for frames that carry whole messages.
pub trait CheckpointSource {
    fn checkpoint(&self, checkpoint_id: &str) -> impl Future<Output = Option<Checkpoint>> + Send;
}

/// State channels that are the agent's own bookkeeping, not the thread's state as a UI shows it.
const HIDDEN_CHANNELS: [&str; 3] = ["lead_step", "outputs_before", "promoted"];

fn visible_channels(values: Option<&prost_types::Struct>) -> Map<String, Value> {
    match values.map(struct_to_json) {
        Some(Value::Object(mut map)) => {
            map.retain(|k, _| !HIDDEN_CHANNELS.contains(&k.as_str()));
            map
        }
        _ => Map::new(),
    }
}

/// LangGraph's run statuses: FINALIZING (seconds between the agent's answer and the receipt) reads
/// as `running`, since LangGraph has no such state.
pub fn run_status(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Unspecified | RunStatus::Pending => "pending",
        RunStatus::Running | RunStatus::Finalizing => "running",
        RunStatus::Success => "success",
        RunStatus::Error => "error",
        RunStatus::Interrupted => "interrupted",
        RunStatus::Timeout => "timeout",
    }
}

/// The whole thread state as LangGraph's `values`: the channels plus `messages`.
pub fn state_values(checkpoint: Option<&Checkpoint>) -> Value {
    let mut values = visible_channels(checkpoint.and_then(|c| c.values.as_ref()));
    let messages = checkpoint.map(|c| c.messages.iter().map(to_langchain).collect()).unwrap_or_default();
    values.insert("messages".to_owned(), Value::Array(messages));
    Value::Object(values)
}

/// Turns one connection's events into frames. It keeps what `values` and `updates` need between
/// events (message bodies by id, the previous step's state); what it has not seen on this connection
/// it reads from the checkpoint the event names.
#[derive(Debug)]
pub struct Translator {
    modes: Vec<StreamMode>,
    run_id: String,
    thread_id: String,
    /// The connection replays the run from its first event (not a resume).
    from_start: bool,
    /// Still at the run's input echo (the messages it was given, written right after METADATA): a
    /// LangGraph stream does not send a run's input back as `messages` frames.
    at_input: bool,
    messages: HashMap<String, Value>,
    previous: Option<(Vec<String>, Map<String, Value>)>,
    streamed: HashSet<String>,
    error_sent: bool,
}

impl Translator {
    pub fn new(modes: Vec<StreamMode>, run_id: &str, thread_id: &str, after_seq: u64) -> Self {
        Self {
            modes,
            run_id: run_id.to_owned(),
            thread_id: thread_id.to_owned(),
            from_start: after_seq == 0,
            at_input: after_seq == 0,
            messages: HashMap::new(),
            previous: None,
            streamed: HashSet::new(),
            error_sent: false,
        }
    }

    fn wants(&self, mode: StreamMode) -> bool {
        self.modes.contains(&mode)
    }

    fn meta(&self, node: &str) -> Value {
        json!({ "run_id": self.run_id, "thread_id": self.thread_id, "langgraph_node": node })
    }

    fn lc_event(&self, event: &str, name: &str, run_id: &str, data: Value) -> Value {
        let parents = if run_id == self.run_id { json!([]) } else { json!([self.run_id]) };
        json!({ "event": event, "name": name, "run_id": run_id, "tags": [], "metadata": self.meta(name), "data": data, "parent_ids": parents })
    }

    /// The frames `event` produces, in the order the modes were asked for.
    pub async fn translate(&mut self, event: &RunEvent, source: &impl CheckpointSource) -> Vec<Frame> {
        let Some(kind) = &event.kind else { return Vec::new() };
        if !matches!(kind, Kind::Metadata(_) | Kind::Message(_) | Kind::Heartbeat(_)) {
            self.at_input = false;
        }
        let mut out = Vec::new();
        match kind {
            Kind::Heartbeat(_) => out.push(Frame::Heartbeat),
            Kind::Metadata(m) => {
                out.push(frame("metadata", json!({ "run_id": m.run_id, "thread_id": m.thread_id, "attempt": m.attempt })));
                if self.wants(StreamMode::Events) {
                    let data = json!({ "input": null });
                    out.push(frame("events", self.lc_event("on_chain_start", "LangGraph", &self.run_id, data)));
                }
            }
            Kind::MessageDelta(delta) => {
                let first = self.streamed.insert(delta.message_id.clone());
                let mut additional = Map::new();
                if !delta.thinking.is_empty() {
                    additional.insert("reasoning_content".to_owned(), Value::String(delta.thinking.clone()));
                }
                let chunks: Vec<Value> = delta
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({ "type": "tool_call_chunk", "index": c.index,
                                "id": if c.id.is_empty() { Value::Null } else { Value::String(c.id.clone()) },
                                "name": if c.name.is_empty() { Value::Null } else { Value::String(c.name.clone()) },
                                "args": c.arguments })
                    })
                    .collect();
                let chunk = json!({ "type": "AIMessageChunk", "id": delta.message_id, "content": delta.text, "name": null,
                                    "additional_kwargs": additional, "response_metadata": {}, "tool_call_chunks": chunks,
                                    "usage_metadata": null });
                for mode in self.modes.clone() {
                    match mode {
                        StreamMode::MessagesTuple => out.push(frame("messages", json!([chunk, self.meta("model")]))),
                        StreamMode::Events => {
                            if first {
                                let start = self.lc_event("on_chat_model_start", "model", &delta.message_id, json!({ "input": null }));
                                out.push(frame("events", start));
                            }
                            let stream = self.lc_event("on_chat_model_stream", "model", &delta.message_id, json!({ "chunk": chunk }));
                            out.push(frame("events", stream));
                        }
                        _ => {}
                    }
                }
            }
            Kind::Message(m) => {
                let Some(message) = &m.message else { return out };
                let lc = to_langchain(message);
                self.messages.insert(message.id.clone(), lc.clone());
                let role = antler_proto::common::Role::try_from(message.role).unwrap_or(antler_proto::common::Role::Unspecified);
                if self.at_input {
                    return out;
                }
                for mode in self.modes.clone() {
                    match (mode, role) {
                        (StreamMode::MessagesTuple, antler_proto::common::Role::Tool) => {
                            out.push(frame("messages", json!([lc, self.meta("tools")])));
                        }
                        (StreamMode::MessagesTuple, antler_proto::common::Role::Assistant) => {
                            if self.streamed.contains(&message.id) {
                                // The deltas carried the text and the tool-call arguments; the last
                                // chunk adds what only the finished turn knows (token usage), as a
                                // provider's final chunk does. Concatenating it changes no text.
                                let last = json!({ "type": "AIMessageChunk", "id": message.id, "content": "", "name": null,
                                                   "additional_kwargs": {}, "response_metadata": { "finish_reason": "stop" },
                                                   "tool_call_chunks": [],
                                                   "usage_metadata": message.usage.as_ref().map(usage_metadata).unwrap_or(Value::Null),
                                                   "chunk_position": "last" });
                                out.push(frame("messages", json!([last, self.meta("model")])));
                            } else if self.from_start {
                                // A turn with no deltas (e.g. history seeded in the input): sent whole.
                                out.push(frame("messages", json!([lc, self.meta("model")])));
                            }
                        }
                        (StreamMode::Events, antler_proto::common::Role::Assistant) => {
                            let end = self.lc_event("on_chat_model_end", "model", &message.id, json!({ "output": lc }));
                            out.push(frame("events", end));
                        }
                        _ => {}
                    }
                }
            }
            Kind::Values(v) => {
                if !(self.wants(StreamMode::Values) || self.wants(StreamMode::Updates)) {
                    return out;
                }
                if v.message_ids.iter().any(|id| !self.messages.contains_key(id))
                    && let Some(checkpoint) = source.checkpoint(&v.checkpoint_id).await
                {
                    self.learn(&checkpoint);
                }
                if self.previous.is_none() {
                    self.previous = Some(self.parent_state(&v.checkpoint_id, source).await);
                }
                let channels = visible_channels(v.values.as_ref());
                let messages: Vec<Value> = v.message_ids.iter().filter_map(|id| self.messages.get(id).cloned()).collect();
                let (previous_ids, previous_channels) = self.previous.take().unwrap_or_default();
                for mode in self.modes.clone() {
                    match mode {
                        StreamMode::Values => {
                            let mut values = channels.clone();
                            values.insert("messages".to_owned(), Value::Array(messages.clone()));
                            out.push(frame("values", Value::Object(values)));
                        }
                        StreamMode::Updates => {
                            if let Some(update) = self.step_update(&v.message_ids, &previous_ids, &channels, &previous_channels) {
                                out.push(frame("updates", update));
                            }
                        }
                        _ => {}
                    }
                }
                self.previous = Some((v.message_ids.clone(), channels));
            }
            Kind::Update(u) => {
                let update = u.update.as_ref().map(struct_to_json).unwrap_or_else(|| json!({}));
                for mode in self.modes.clone() {
                    match mode {
                        StreamMode::Updates => out.push(frame("updates", keyed(&u.node, update.clone()))),
                        StreamMode::Events => {
                            let run_id = self.run_id.clone();
                            out.push(frame("events", self.lc_event("on_chain_stream", &u.node, &run_id, json!({ "chunk": update }))));
                        }
                        _ => {}
                    }
                }
            }
            Kind::ToolStarted(t) if self.wants(StreamMode::Events) => {
                let input = t.arguments.as_ref().map(struct_to_json).unwrap_or_else(|| Value::String(t.raw_arguments.clone()));
                out.push(frame("events", self.lc_event("on_tool_start", &t.name, &t.tool_call_id, json!({ "input": input }))));
            }
            Kind::ToolFinished(t) if self.wants(StreamMode::Events) => {
                let input = t.arguments.as_ref().map(struct_to_json).unwrap_or(Value::Null);
                // The summary (≤ 2000 characters); the whole result is the tool message in `values`.
                let output = json!({ "type": "tool", "content": t.result_summary, "tool_call_id": t.tool_call_id,
                                     "name": t.name, "status": if t.is_error { "error" } else { "success" },
                                     "id": t.result_message_id });
                out.push(frame(
                    "events",
                    self.lc_event("on_tool_end", &t.name, &t.tool_call_id, json!({ "input": input, "output": output })),
                ));
            }
            Kind::Custom(c) => {
                let data = c.data.as_ref().map(value_to_json).unwrap_or(Value::Null);
                for mode in self.modes.clone() {
                    match mode {
                        StreamMode::Custom => out.push(frame("custom", json!({ "name": c.name, "data": data }))),
                        StreamMode::Events => {
                            let run_id = self.run_id.clone();
                            out.push(frame("events", self.lc_event("on_custom_event", &c.name, &run_id, json!(data))));
                        }
                        _ => {}
                    }
                }
            }
            Kind::Clarification(c) if self.wants(StreamMode::Updates) => {
                let value = serde_json::to_value(clarification_json(c)).unwrap_or(Value::Null);
                out.push(frame("updates", json!({ "__interrupt__": [{ "value": value, "id": c.interrupt_id }] })));
            }
            Kind::Error(e) if e.fatal => {
                let error = e.error.clone().unwrap_or_default();
                self.error_sent = true;
                out.push(frame("error", json!({ "error": error.code, "message": error.message })));
            }
            Kind::End(end) => {
                let status = RunStatus::try_from(end.status).unwrap_or(RunStatus::Unspecified);
                if matches!(status, RunStatus::Error | RunStatus::Timeout) && !self.error_sent {
                    let error = end.error.clone().unwrap_or_default();
                    self.error_sent = true;
                    out.push(frame("error", json!({ "error": error.code, "message": error.message })));
                }
                if self.wants(StreamMode::Events) {
                    let data = json!({ "output": null, "status": run_status(status) });
                    out.push(frame("events", self.lc_event("on_chain_end", "LangGraph", &self.run_id, data)));
                }
                out.push(frame("end", Value::Null));
            }
            _ => {}
        }
        out
    }

    fn learn(&mut self, checkpoint: &Checkpoint) {
        for message in &checkpoint.messages {
            self.messages.entry(message.id.clone()).or_insert_with(|| to_langchain(message));
        }
    }

    /// The message ids and channels of the step before `checkpoint_id` (nothing for a thread's first).
    async fn parent_state(&mut self, checkpoint_id: &str, source: &impl CheckpointSource) -> (Vec<String>, Map<String, Value>) {
        let Some(current) = source.checkpoint(checkpoint_id).await else { return Default::default() };
        if current.parent_checkpoint_id.is_empty() {
            return Default::default();
        }
        let Some(parent) = source.checkpoint(&current.parent_checkpoint_id).await else { return Default::default() };
        self.learn(&parent);
        (parent.messages.iter().map(|m| m.id.clone()).collect(), visible_channels(parent.values.as_ref()))
    }

    /// `{node: {messages: [new non-user messages], changed channels…}}` for one step, or None when the
    /// step changed nothing a client sees. The node is `tools` for a round of tool results, else
    /// `model` (the node names of DeerFlow's agent graph).
    fn step_update(
        &self,
        ids: &[String],
        previous_ids: &[String],
        channels: &Map<String, Value>,
        previous_channels: &Map<String, Value>,
    ) -> Option<Value> {
        let before: HashSet<&String> = previous_ids.iter().collect();
        let new: Vec<Value> = ids
            .iter()
            .filter(|id| !before.contains(id))
            .filter_map(|id| self.messages.get(id))
            .filter(|m| m["type"] != "human")
            .cloned()
            .collect();
        let mut update = Map::new();
        for (key, value) in channels {
            if previous_channels.get(key) != Some(value) {
                update.insert(key.clone(), value.clone());
            }
        }
        if new.is_empty() && update.is_empty() {
            return None;
        }
        let node = if !new.is_empty() && new.iter().all(|m| m["type"] == "tool") { "tools" } else { "model" };
        if !new.is_empty() {
            update.insert("messages".to_owned(), Value::Array(new));
        }
        Some(keyed(node, Value::Object(update)))
    }
}

/// `{key: value}` for a key known only at run time.
fn keyed(key: &str, value: Value) -> Value {
    let mut map = Map::new();
    map.insert(key.to_owned(), value);
    Value::Object(map)
}

/// A clarification as the `value` of a LangGraph interrupt.
pub fn clarification_json(c: &antler_proto::runs::ClarificationEvent) -> Value {
    let options: Vec<Value> = c.options.iter().map(|o| json!({ "id": o.id, "label": o.label, "description": o.description })).collect();
    json!({
        "type": "clarification",
        "question": c.question,
        "category": c.category,
        "context": c.context,
        "options": options,
        "multi_select": c.multi_select,
        "allow_free_text": c.allow_free_text,
        "tool_call_id": c.tool_call_id,
        "fields": c.fields.iter().map(|f| json!({ "name": f.name, "label": f.label, "required": f.required })).collect::<Vec<_>>(),
    })
}

/// The bytes of one frame on the wire (`event`, `data`, `id`, blank line).
pub fn encode(frame: &Frame, id: &str) -> String {
    match frame {
        Frame::Heartbeat => ": heartbeat\n\n".to_owned(),
        Frame::Event { name, data } => {
            // serde_json never writes a raw newline inside a value, so `data:` stays one line.
            format!("event: {name}\ndata: {}\nid: {id}\n\n", crate::json::json_text(data))
        }
    }
}

#[cfg(test)]
mod tests;
