//! The checks a client's CreateRunRequest passes before any transaction: fields and limits
//! (`sanitise`, no I/O), the model allowlist (`check_model`), and what makes two requests the same
//! for an idempotency key (`fingerprint`).

use antler_kit::CallContext;
use antler_kit::input_keys::{self, Reserved};
use antler_proto::common::Role;
use antler_proto::models::ListModelsRequest;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::runs::{CreateRunRequest, EventKind, MultitaskStrategy, OnDisconnect};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::config::CONTEXT_OWNED_KEYS;
use crate::engine::Engine;
use crate::error::RunsError;
use crate::threads::valid_thread_id;

/// The LangGraph stream modes a run may record (`CreateRunRequest.langgraph_stream_modes`): the ones
/// the LangGraph edge (`crate::langgraph`) can translate Antler's events into.
pub const LANGGRAPH_STREAM_MODES: [&str; 5] = ["values", "updates", "messages-tuple", "events", "custom"];

/// Validates and sanitises a request in place (no I/O). Errors name the field and the limit.
pub fn sanitise(engine: &Engine, req: &mut CreateRunRequest) -> Result<(), RunsError> {
    let cfg = engine.config();
    let size = req.encoded_len();
    if size > cfg.max_request_bytes as usize {
        return Err(RunsError::ResourceExhausted(format!(
            "the CreateRunRequest is {size} bytes; the limit is {} (runs.max_request_bytes)\nhint: put large files in the thread's sandbox (SandboxService.UploadFiles) and refer to their paths",
            cfg.max_request_bytes
        )));
    }
    if !req.thread_id.is_empty() && !valid_thread_id(&req.thread_id) {
        return Err(RunsError::invalid("thread_id", format!("`{}` must match ^[A-Za-z0-9_-]{{1,64}}$", req.thread_id)));
    }
    if req.input.len() > cfg.max_input_messages as usize {
        return Err(RunsError::invalid(
            "input",
            format!("{} messages; the limit is {} (runs.max_input_messages)", req.input.len(), cfg.max_input_messages),
        ));
    }
    if req.input.is_empty() && req.resume.is_none() {
        return Err(RunsError::invalid("input", "is empty: send at least one ROLE_USER message (or `resume` to answer a clarification)"));
    }
    if !req.input.is_empty() && req.resume.is_some() {
        return Err(RunsError::invalid("resume", "must not be combined with input"));
    }
    for (i, message) in req.input.iter_mut().enumerate() {
        match Role::try_from(message.role) {
            Ok(Role::User | Role::Assistant | Role::Tool) => {}
            Ok(Role::System) => {
                return Err(RunsError::invalid(
                    format!("input[{i}].role"),
                    "ROLE_SYSTEM is not accepted: the system prompt comes from the agent",
                ));
            }
            _ => return Err(RunsError::invalid(format!("input[{i}].role"), "must be ROLE_USER, ROLE_ASSISTANT or ROLE_TOOL")),
        }
        if message.content.is_empty() && message.tool_calls.is_empty() {
            return Err(RunsError::invalid(format!("input[{i}].content"), "is empty"));
        }
        if let Some(meta) = message.metadata.as_mut() {
            // Reserved keys are stripped here (a client may echo back messages it read).
            input_keys::check(&format!("input[{i}].metadata"), meta, Reserved::Strip, &[])?;
        }
    }
    for (i, kind) in req.stream_kinds.iter().enumerate() {
        if !matches!(EventKind::try_from(*kind), Ok(k) if k != EventKind::Unspecified) {
            return Err(RunsError::invalid(format!("stream_kinds[{i}]"), format!("{kind} is not an EventKind")));
        }
    }
    if req.langgraph_stream_modes.len() > 8 {
        return Err(RunsError::invalid("langgraph_stream_modes", format!("{} entries; the limit is 8", req.langgraph_stream_modes.len())));
    }
    for (i, mode) in req.langgraph_stream_modes.iter().enumerate() {
        if !LANGGRAPH_STREAM_MODES.contains(&mode.as_str()) {
            return Err(RunsError::invalid(
                format!("langgraph_stream_modes[{i}]"),
                format!("`{mode}` is not one of {}", LANGGRAPH_STREAM_MODES.join(", ")),
            ));
        }
    }
    if let Some(meta) = req.metadata.as_mut() {
        input_keys::check("metadata", meta, Reserved::Refuse, &[])?;
        let size = meta.encoded_len();
        if size > cfg.max_metadata_bytes as usize {
            return Err(RunsError::invalid(
                "metadata",
                format!("{size} bytes; the limit is {} (runs.max_metadata_bytes)", cfg.max_metadata_bytes),
            ));
        }
    }
    if !req.idempotency_key.is_empty()
        && (req.idempotency_key.len() > 255 || !req.idempotency_key.bytes().all(|b| (0x21..0x7f).contains(&b)))
    {
        return Err(RunsError::invalid("idempotency_key", "must be 1-255 printable ASCII characters without spaces"));
    }
    if req.expected_outputs.len() > 100 {
        return Err(RunsError::invalid("expected_outputs", format!("{} paths; the limit is 100", req.expected_outputs.len())));
    }
    for (i, path) in req.expected_outputs.iter().enumerate() {
        let inside = path
            .strip_prefix("/mnt/user-data/outputs/")
            .is_some_and(|rest| !rest.is_empty() && !rest.split('/').any(|seg| seg.is_empty() || seg == "." || seg == ".."));
        if !inside {
            return Err(RunsError::invalid(
                format!("expected_outputs[{i}]"),
                format!("`{path}` must be a file path under /mnt/user-data/outputs/"),
            ));
        }
    }
    if req.secrets.len() > 16 {
        return Err(RunsError::invalid("secrets", format!("{} entries; the limit is 16", req.secrets.len())));
    }
    // Names become environment variables of sandbox commands (upper-cased), so no leading digit.
    if let Some(key) = req.secrets.keys().find(|k| {
        k.is_empty()
            || k.len() > 64
            || k.starts_with(|c: char| c.is_ascii_digit())
            || !k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    }) {
        return Err(RunsError::invalid(format!("secrets.{key}"), "keys must match ^[a-z_][a-z0-9_]{0,63}$"));
    }
    let config = req.config.get_or_insert_with(Default::default);
    if config.recursion_limit == 0 {
        config.recursion_limit = cfg.recursion_limit_default;
    }
    config.recursion_limit = config.recursion_limit.min(cfg.recursion_limit_max);
    let limit = cfg.max_run_duration_secs as i64;
    config.max_duration = match config.max_duration {
        Some(d) if d.seconds < 0 || d.nanos < 0 => {
            return Err(RunsError::invalid("config.max_duration", "must not be negative"));
        }
        // Absent or zero: the server default; longer than the setting: clamped to it.
        Some(d) if (d.seconds, d.nanos) != (0, 0) && d.seconds < limit => Some(d),
        _ => Some(prost_types::Duration { seconds: limit, nanos: 0 }),
    };
    if let Some(context) = config.context.as_mut() {
        input_keys::check("config.context", context, Reserved::Refuse, &CONTEXT_OWNED_KEYS)?;
        if let Some(key) = context.fields.keys().find(|k| !cfg.context_keys.contains(k)) {
            return Err(RunsError::invalid(
                format!("config.context.{key}"),
                format!("is not an allowed context key; allowed: {} (runs.context_keys)", cfg.context_keys.join(", ")),
            ));
        }
        let size = context.encoded_len();
        if size > cfg.max_metadata_bytes as usize {
            return Err(RunsError::invalid(
                "config.context",
                format!("{size} bytes; the limit is {} (runs.max_metadata_bytes)", cfg.max_metadata_bytes),
            ));
        }
    }
    if MultitaskStrategy::try_from(req.multitask_strategy).is_err() {
        return Err(RunsError::invalid("multitask_strategy", format!("{} is not a MultitaskStrategy", req.multitask_strategy)));
    }
    if OnDisconnect::try_from(req.on_disconnect).is_err() {
        return Err(RunsError::invalid("on_disconnect", format!("{} is not an OnDisconnect", req.on_disconnect)));
    }
    Ok(())
}

/// What makes two requests "the same" for an idempotency key: everything but request-scoped
/// delivery settings (secrets, stream selection, disconnect handling). A `resume` answer counts as
/// itself, not as the input admission writes from it (which depends on the pending clarification).
pub fn fingerprint(req: &CreateRunRequest) -> String {
    let mut canonical = req.clone();
    if canonical.resume.is_some() {
        canonical.input.clear();
    }
    canonical.secrets.clear();
    canonical.stream_kinds.clear();
    canonical.langgraph_stream_modes.clear();
    canonical.on_disconnect = 0;
    hex::encode(Sha256::digest(canonical.encode_to_vec()))
}

/// Checks `model_name` against the models service. Empty means the default model.
pub async fn check_model(engine: &Engine, ctx: &CallContext, model_name: &str) -> Result<(), RunsError> {
    if model_name.is_empty() {
        return Ok(());
    }
    let Some(client) = engine.clients().get("models") else {
        return Err(RunsError::Unavailable("no models client configured".to_owned()));
    };
    let listed = client
        .with_retry(|| {
            let request = client.request(ctx, ListModelsRequest::default());
            let mut grpc = ModelServiceClient::new(client.channel());
            async move { grpc.list_models(request).await }
        })
        .await
        .map_err(|status| {
            RunsError::Unavailable(format!(
                "cannot check model `{model_name}`: the models service answered {:?}: {}",
                status.code(),
                status.message()
            ))
        })?
        .into_inner();
    let names: Vec<String> = listed.models.into_iter().map(|m| m.name).collect();
    if names.iter().any(|n| n == model_name) {
        Ok(())
    } else {
        Err(RunsError::invalid("config.model_name", format!("unknown model `{model_name}`; valid names: {}", names.join(", "))))
    }
}
