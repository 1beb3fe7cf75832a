//! A LangGraph `RunCreateStateful` body → Antler's `CreateRunRequest`. Every option the SDKs send is
//! read: one Antler honours is translated, one it cannot honour with the value given is refused (422
//! naming it and saying why) instead of being ignored, and the SDKs' defaults are accepted.

use antler_kit::json::json_to_value;
use antler_proto::common::ReasoningEffort;
use antler_proto::runs::{CreateRunRequest, MultitaskStrategy, OnDisconnect, ResumeInput, RunConfig};
use serde_json::{Map, Value};

use super::convert::Assistant;
use super::messages::from_langchain;
use super::stream::{StreamMode, kinds_for};
use crate::error::ApiError;
use crate::request::Fields;

/// What a run request asks for.
#[derive(Debug)]
pub struct RunRequest {
    pub create: CreateRunRequest,
    pub modes: Vec<StreamMode>,
}

/// Parses `stream_mode` (a name or a list; absent or empty: `values`).
pub fn stream_modes(field: &str, value: Option<Value>) -> Result<Vec<StreamMode>, ApiError> {
    let names: Vec<(String, Value)> = match value {
        None => Vec::new(),
        Some(Value::String(s)) => vec![(field.to_owned(), Value::String(s))],
        Some(Value::Array(items)) => items.into_iter().enumerate().map(|(i, v)| (format!("{field}[{i}]"), v)).collect(),
        Some(_) => return Err(ApiError::invalid(field, "must be a stream mode or a list of them")),
    };
    let mut modes = Vec::new();
    for (at, name) in names {
        let Value::String(name) = name else { return Err(ApiError::invalid(&at, "must be a string")) };
        let mode = StreamMode::parse(&name).map_err(|why| ApiError::invalid(&at, why))?;
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    if modes.is_empty() {
        modes.push(StreamMode::Values);
    }
    Ok(modes)
}

/// The run options of `config.configurable` and `context` that map to Antler's `RunConfig`; any
/// other key goes to `RunConfig.context` when `context_keys` allows it (DeerFlow's `mode`, …).
fn apply_option(
    field: &str,
    key: &str,
    value: &Value,
    config: &mut RunConfig,
    context_keys: &[String],
    thread_id: &str,
) -> Result<(), ApiError> {
    let at = format!("{field}.{key}");
    let boolean = || value.as_bool().ok_or_else(|| ApiError::invalid(&at, "must be true or false"));
    let count = |max: u64| match value.as_u64() {
        Some(n) if n <= max => Ok(n as u32),
        _ => Err(ApiError::invalid(&at, format!("must be a whole number from 0 to {max}"))),
    };
    match key {
        "model_name" | "model" => config.model_name = value.as_str().ok_or_else(|| ApiError::invalid(&at, "must be a string"))?.to_owned(),
        "thinking_enabled" => config.thinking_enabled = Some(boolean()?),
        "is_plan_mode" | "plan_mode" => config.plan_mode = boolean()?,
        "subagent_enabled" | "subagents_enabled" => config.subagents_enabled = boolean()?,
        "max_concurrent_subagents" => config.max_concurrent_subagents = count(64)?,
        "max_total_subagents" => config.max_total_subagents = count(1000)?,
        "clarification_disabled" | "disable_clarification" => config.clarification_disabled = boolean()?,
        "agent_name" => config.agent_name = value.as_str().ok_or_else(|| ApiError::invalid(&at, "must be a string"))?.to_owned(),
        "reasoning_effort" => {
            config.reasoning_effort = match value.as_str() {
                Some("minimal") => ReasoningEffort::Minimal,
                Some("low") => ReasoningEffort::Low,
                Some("medium") => ReasoningEffort::Medium,
                Some("high") => ReasoningEffort::High,
                _ => return Err(ApiError::invalid(&at, "must be one of minimal, low, medium, high")),
            } as i32;
        }
        // LangGraph puts the thread id here; it must be the one in the path.
        "thread_id" => {
            if value.as_str() != Some(thread_id) {
                return Err(ApiError::invalid(&at, format!("must equal the thread id of the path ({thread_id})")));
            }
        }
        other if context_keys.iter().any(|k| k == other) => {
            config.context.get_or_insert_with(Default::default).fields.insert(other.to_owned(), json_to_value(value));
        }
        other => {
            return Err(ApiError::invalid(
                &at,
                format!(
                    "`{other}` is not a run option Antler knows; known: model_name, thinking_enabled, reasoning_effort, is_plan_mode, subagent_enabled, max_concurrent_subagents, max_total_subagents, agent_name, clarification_disabled, and the context keys {} (runs.context_keys)",
                    context_keys.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn struct_of(map: Map<String, Value>) -> prost_types::Struct {
    match json_to_value(&Value::Object(map)).kind {
        Some(prost_types::value::Kind::StructValue(s)) => s,
        _ => prost_types::Struct::default(),
    }
}

/// `command.resume` → Antler's answer to the pending clarification: a string is the free-text
/// answer, a list the chosen option ids, an object either `ResumeInput`'s own fields or form values.
fn resume_input(value: Value) -> Result<ResumeInput, ApiError> {
    match value {
        Value::String(text) => Ok(ResumeInput { text, ..ResumeInput::default() }),
        Value::Array(items) => {
            let ids = items.into_iter().map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid("command.resume", "a list answer must hold option ids (strings)")),
            });
            Ok(ResumeInput { selected_option_ids: ids.collect::<Result<_, _>>()?, ..ResumeInput::default() })
        }
        Value::Object(map) if map.keys().all(|k| matches!(k.as_str(), "interrupt_id" | "text" | "selected_option_ids" | "values")) => {
            let mut fields = Fields::nested("command.resume", map);
            let interrupt_id = fields.string("interrupt_id")?.unwrap_or_default();
            let text = fields.string("text")?.unwrap_or_default();
            let selected_option_ids = match fields.take("selected_option_ids") {
                None => Vec::new(),
                Some(Value::Array(items)) => items
                    .into_iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| ApiError::invalid("command.resume.selected_option_ids", "must hold strings"))
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(ApiError::invalid("command.resume.selected_option_ids", "must be a list of option ids")),
            };
            let values = fields.object("values")?.map(struct_of);
            Ok(ResumeInput { interrupt_id, text, selected_option_ids, values })
        }
        Value::Object(map) => Ok(ResumeInput { values: Some(struct_of(map)), ..ResumeInput::default() }),
        _ => Err(ApiError::invalid("command.resume", "must be a string, a list of option ids or an object")),
    }
}

/// Translates a run request on `thread_id`.
pub fn parse(fields: &mut Fields, thread_id: &str, assistant: &Assistant, context_keys: &[String]) -> Result<RunRequest, ApiError> {
    let requested = fields.string("assistant_id")?.ok_or_else(|| ApiError::invalid("assistant_id", "is required"))?;
    if !assistant.answers_to(&requested) {
        return Err(ApiError::not_found(format!(
            "assistant `{requested}` (this server runs `{}`, graph `{}`: runs.agent)",
            assistant.id(),
            assistant.graph_id()
        )));
    }
    let mut create = CreateRunRequest { thread_id: thread_id.to_owned(), ..CreateRunRequest::default() };
    let mut config = RunConfig::default();

    let command = fields.object("command")?;
    match fields.take("input") {
        None => {}
        Some(Value::Object(input)) => {
            let mut input = Fields::nested("input", input);
            match input.take("messages") {
                None => {}
                Some(Value::Array(messages)) => {
                    for (i, message) in messages.iter().enumerate() {
                        create.input.push(from_langchain(&format!("input.messages[{i}]"), message)?);
                    }
                }
                Some(_) => return Err(ApiError::invalid("input.messages", "must be a list of messages")),
            }
            input.finish("the lead agent's input (it reads `messages` only)")?;
        }
        Some(_) => {
            return Err(ApiError::invalid("input", "must be an object, e.g. {\"messages\": [{\"role\": \"user\", \"content\": \"…\"}]}"));
        }
    }
    if let Some(command) = command {
        if !create.input.is_empty() {
            return Err(ApiError::invalid("command", "cannot be combined with input"));
        }
        let mut command = Fields::nested("command", command);
        if let Some(resume) = command.take("resume") {
            create.resume = Some(resume_input(resume)?);
        }
        for key in ["goto", "update"] {
            if command.take(key).is_some() {
                return Err(ApiError::unsupported_option(
                    &format!("command.{key}"),
                    "Antler's agent has no graph nodes to jump to or state to patch; answer a clarification with command.resume",
                ));
            }
        }
        command.finish("command")?;
    }

    if let Some(metadata) = fields.object("metadata")? {
        create.metadata = Some(struct_of(metadata));
    }
    if let Some(cfg) = fields.object("config")? {
        let mut cfg = Fields::nested("config", cfg);
        if let Some(limit) = cfg.integer("recursion_limit", 1, 1_000_000)? {
            config.recursion_limit = u32::try_from(limit).unwrap_or(u32::MAX);
        }
        if let Some(configurable) = cfg.object("configurable")? {
            for (key, value) in &configurable {
                if !value.is_null() {
                    apply_option("config.configurable", key, value, &mut config, context_keys, thread_id)?;
                }
            }
        }
        // Tracing labels of LangChain runnables: accepted, not used (Antler traces with its own spans).
        for key in ["tags", "run_name", "run_id", "callbacks", "metadata", "max_concurrency"] {
            cfg.take(key);
        }
        cfg.finish("config")?;
    }
    if let Some(context) = fields.object("context")? {
        for (key, value) in &context {
            if !value.is_null() {
                apply_option("context", key, value, &mut config, context_keys, thread_id)?;
            }
        }
    }
    let modes = stream_modes("stream_mode", fields.take("stream_mode"))?;
    // Antler has no subgraphs to stream and every stream is resumable: both flags hold either way.
    fields.bool("stream_subgraphs")?;
    fields.bool("stream_resumable")?;
    create.multitask_strategy = match fields.choice("multitask_strategy", &["reject", "interrupt", "rollback", "enqueue"])?.as_deref() {
        Some("interrupt") => MultitaskStrategy::Interrupt,
        Some("rollback") => MultitaskStrategy::Rollback,
        Some("enqueue") => MultitaskStrategy::Enqueue,
        _ => MultitaskStrategy::Reject,
    } as i32;
    // LangGraph's default is `continue`: a client that reconnects (the SDKs follow `Location`) finds
    // the run still going. gRPC's StreamRun defaults to CANCEL; this edge follows LangGraph.
    create.on_disconnect = match fields.choice("on_disconnect", &["cancel", "continue"])?.as_deref() {
        Some("cancel") => OnDisconnect::Cancel,
        _ => OnDisconnect::Continue,
    } as i32;
    create.create_thread = fields.choice("if_not_exists", &["reject", "create"])?.as_deref() == Some("create");

    let checkpoint_id = fields.string("checkpoint_id")?;
    let checkpoint = match fields.object("checkpoint")? {
        None => None,
        Some(map) => {
            let mut checkpoint = Fields::nested("checkpoint", map);
            if let Some(other) = checkpoint.string("thread_id")?
                && other != thread_id
            {
                return Err(ApiError::invalid("checkpoint.thread_id", format!("`{other}` is not the thread of the path ({thread_id})")));
            }
            if checkpoint.string("checkpoint_ns")?.is_some_and(|ns| !ns.is_empty()) {
                return Err(ApiError::unsupported_option("checkpoint.checkpoint_ns", "Antler has no subgraph checkpoint namespaces"));
            }
            checkpoint.take("checkpoint_map");
            let id = checkpoint.string("checkpoint_id")?;
            checkpoint.finish("checkpoint")?;
            id
        }
    };
    create.checkpoint_id = match (checkpoint_id, checkpoint) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid("checkpoint_id", "names another checkpoint than checkpoint.checkpoint_id"));
        }
        (a, b) => a.or(b).unwrap_or_default(),
    };

    refuse_unsupported(fields)?;
    create.config = Some(config);
    create.stream_kinds = kinds_for(&modes);
    create.langgraph_stream_modes = modes.iter().map(|m| m.name().to_owned()).collect();
    Ok(RunRequest { create, modes })
}

/// Options whose non-default values Antler cannot honour, each refused with what is missing.
fn refuse_unsupported(fields: &mut Fields) -> Result<(), ApiError> {
    for key in ["interrupt_before", "interrupt_after"] {
        match fields.take(key) {
            None => {}
            Some(Value::Array(items)) if items.is_empty() => {}
            Some(_) => return Err(ApiError::unsupported_option(key, "breakpoints are not implemented yet (the agent finishes its turn)")),
        }
    }
    match fields.take("feedback_keys") {
        None => {}
        Some(Value::Array(items)) if items.is_empty() => {}
        Some(_) => return Err(ApiError::unsupported_option("feedback_keys", "rate runs with RunService.SubmitFeedback")),
    }
    if fields.take("webhook").is_some() {
        return Err(ApiError::unsupported_option("webhook", "there are no completion webhooks; follow the run with /join or /stream"));
    }
    if fields.integer("after_seconds", 0, u64::MAX)?.is_some_and(|s| s > 0) {
        return Err(ApiError::unsupported_option("after_seconds", "runs cannot be scheduled; create the run when it should start"));
    }
    if fields.take("langsmith_tracer").is_some() {
        return Err(ApiError::unsupported_option("langsmith_tracer", "Antler exports traces over OTLP (server.tracing), not to LangSmith"));
    }
    if fields.choice("on_completion", &["delete", "keep"])?.as_deref() == Some("delete") {
        return Err(ApiError::unsupported_option("on_completion", "threads are kept; delete one with DELETE /threads/{id}"));
    }
    // Antler checkpoints after every step, synchronously with the step's events: `sync` (and the
    // weaker `async`) are what it does; `exit` (only at the end) is not.
    if fields.choice("durability", &["sync", "async", "exit"])?.as_deref() == Some("exit") {
        return Err(ApiError::unsupported_option("durability", "every step is checkpointed (`sync`); `exit` is not available"));
    }
    if fields.bool("checkpoint_during")? == Some(false) {
        return Err(ApiError::unsupported_option("checkpoint_during", "every step is checkpointed"));
    }
    // A resume that answers nothing pending is always refused (409): `strict_resume: true` is how
    // Antler behaves, `false` (ignore the answer) is not.
    if fields.bool("strict_resume")? == Some(false) {
        return Err(ApiError::unsupported_option("strict_resume", "a resume with no pending clarification is always refused"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_runs::config::AgentKind;

    fn lead() -> Assistant {
        Assistant { kind: AgentKind::Lead, since: prost_types::Timestamp::default() }
    }

    fn keys() -> Vec<String> {
        antler_runs::config::DEFAULT_CONTEXT_KEYS.iter().map(|k| (*k).to_owned()).collect()
    }

    fn parse_json(body: Value) -> Result<RunRequest, ApiError> {
        let mut fields = Fields::parse(body.to_string().as_bytes())?;
        let request = parse(&mut fields, "t-1", &lead(), &keys())?;
        fields.finish("a run request")?;
        Ok(request)
    }

    #[test]
    fn the_sdk_s_stream_payload_translates() -> Result<(), ApiError> {
        // What langgraph-sdk 0.4 sends for runs.stream(..., stream_mode=["values", "messages-tuple"]).
        let request = parse_json(serde_json::json!({
            "input": {"messages": [{"role": "user", "content": "hi"}]},
            "config": {"recursion_limit": 50, "configurable": {"model_name": "demo", "is_plan_mode": true, "mode": "pro"}},
            "stream_mode": ["values", "messages-tuple"],
            "stream_subgraphs": false,
            "stream_resumable": false,
            "assistant_id": "lead_agent",
            "multitask_strategy": "enqueue",
            "on_disconnect": "cancel",
            "if_not_exists": "create",
        }))?;
        let create = &request.create;
        assert_eq!(create.thread_id, "t-1");
        assert_eq!(create.input.len(), 1);
        assert_eq!(create.multitask_strategy, MultitaskStrategy::Enqueue as i32);
        assert_eq!(create.on_disconnect, OnDisconnect::Cancel as i32);
        assert!(create.create_thread);
        let config = create.config.clone().unwrap_or_default();
        assert_eq!((config.recursion_limit, config.model_name.as_str(), config.plan_mode), (50, "demo", true));
        assert!(config.context.is_some_and(|c| c.fields.contains_key("mode")));
        assert_eq!(request.modes, vec![StreamMode::Values, StreamMode::MessagesTuple]);
        assert_eq!(create.langgraph_stream_modes, vec!["values".to_owned(), "messages-tuple".to_owned()]);
        Ok(())
    }

    #[test]
    fn defaults_follow_langgraph() -> Result<(), ApiError> {
        let request = parse_json(serde_json::json!({"assistant_id": "lead", "input": {"messages": [{"role": "human", "content": "x"}]}}))?;
        assert_eq!(request.modes, vec![StreamMode::Values]);
        assert_eq!(request.create.on_disconnect, OnDisconnect::Continue as i32);
        assert_eq!(request.create.multitask_strategy, MultitaskStrategy::Reject as i32);
        assert!(!request.create.create_thread);
        Ok(())
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let cases = [
            (serde_json::json!({"assistant_id": "lead", "stream_mode": ["values", "debug"]}), "stream_mode[1]"),
            (serde_json::json!({"assistant_id": "lead", "interrupt_before": ["model"]}), "interrupt_before"),
            (serde_json::json!({"assistant_id": "lead", "webhook": "https://x"}), "webhook"),
            (serde_json::json!({"assistant_id": "lead", "after_seconds": 5}), "after_seconds"),
            (serde_json::json!({"assistant_id": "lead", "multitask_strategy": "queue"}), "multitask_strategy"),
            (
                serde_json::json!({"assistant_id": "lead", "config": {"configurable": {"temperature": 1}}}),
                "config.configurable.temperature",
            ),
            (
                serde_json::json!({"assistant_id": "lead", "config": {"configurable": {"thread_id": "t-2"}}}),
                "config.configurable.thread_id",
            ),
            (serde_json::json!({"assistant_id": "lead", "input": {"messages": [], "files": []}}), "input.files"),
            (serde_json::json!({"assistant_id": "lead", "command": {"goto": "model"}}), "command.goto"),
            (serde_json::json!({"assistant_id": "lead", "durability": "exit"}), "durability"),
            (serde_json::json!({"assistant_id": "lead", "surprise": 1}), "surprise"),
        ];
        for (body, field) in cases {
            let result = parse_json(body.clone());
            assert!(matches!(result, Err(ref e) if e.param.as_deref() == Some(field) && e.status == 422), "{body}: {result:?}");
        }
        let unknown = parse_json(serde_json::json!({"assistant_id": "agent"}));
        assert!(matches!(unknown, Err(ref e) if e.status == 404), "{unknown:?}");
        let missing = parse_json(serde_json::json!({}));
        assert!(matches!(missing, Err(ref e) if e.param.as_deref() == Some("assistant_id")), "{missing:?}");
    }

    #[test]
    fn a_resume_command_answers_the_clarification() -> Result<(), ApiError> {
        let text = parse_json(serde_json::json!({"assistant_id": "lead", "command": {"resume": "blue"}}))?;
        assert_eq!(text.create.resume.map(|r| r.text), Some("blue".to_owned()));
        let form = parse_json(serde_json::json!({"assistant_id": "lead", "command": {"resume": {"budget": 5}}}))?;
        assert!(form.create.resume.and_then(|r| r.values).is_some_and(|v| v.fields.contains_key("budget")));
        let both = parse_json(
            serde_json::json!({"assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "x"}]}, "command": {"resume": "y"}}),
        );
        assert!(matches!(both, Err(ref e) if e.param.as_deref() == Some("command")), "{both:?}");
        Ok(())
    }
}
