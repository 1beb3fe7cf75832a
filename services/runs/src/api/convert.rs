//! Stored rows → protobuf messages.

use antler_proto::runs::{CancelAction, CreateRunRequest, DeliveryReceipt, MultitaskStrategy, OnDisconnect, Run, RunUsage};
use prost::Message;

use crate::lifecycle::{cancel::action_from_str, lease::stored_error};
use crate::store::entity::runs;
use crate::time::{opt_timestamp, to_timestamp};
use antler_kit::json::json_text_to_struct;

pub fn run(model: &runs::Model, reused: bool) -> Run {
    let request = CreateRunRequest::decode(model.request.as_slice()).unwrap_or_default();
    let strategy = match model.multitask_strategy.as_str() {
        "interrupt" => MultitaskStrategy::Interrupt,
        "rollback" => MultitaskStrategy::Rollback,
        "enqueue" => MultitaskStrategy::Enqueue,
        _ => MultitaskStrategy::Reject,
    };
    let cancel_action = action_from_str(model.cancel_action.as_deref());
    Run {
        run_id: model.run_id.clone(),
        thread_id: model.thread_id.clone(),
        status: model.status.to_proto() as i32,
        attempt: model.attempt.max(0) as u32,
        stop_reason: model.stop_reason.clone().unwrap_or_default(),
        error: stored_error(model),
        multitask_strategy: strategy as i32,
        model_name: model.model_name.clone(),
        usage: Some(RunUsage::decode(model.usage.as_slice()).unwrap_or_default()),
        reused,
        created_at: Some(to_timestamp(model.created_at)),
        started_at: opt_timestamp(model.started_at),
        finished_at: opt_timestamp(model.finished_at),
        metadata: Some(json_text_to_struct(&model.metadata)),
        on_disconnect: if model.on_disconnect == "continue" { OnDisconnect::Continue } else { OnDisconnect::Cancel } as i32,
        config: request.config,
        expected_outputs: request.expected_outputs,
        delivery: model.delivery.as_ref().and_then(|d| DeliveryReceipt::decode(d.as_slice()).ok()),
        idempotency_key: model.idempotency_key.clone().unwrap_or_default(),
        checkpoint_id: request.checkpoint_id,
        stream_kinds: request.stream_kinds,
        langgraph_stream_modes: request.langgraph_stream_modes,
        last_seq: model.last_seq.max(0) as u64,
        cancel_action: if cancel_action == CancelAction::Unspecified { 0 } else { cancel_action as i32 },
        updated_at: Some(to_timestamp(model.updated_at)),
        parent_run_id: model.parent_run_id.clone().unwrap_or_default(),
        parent_task_id: model.parent_task_id.clone().unwrap_or_default(),
        subagent_type: request.subagent.map(|s| s.subagent_type).unwrap_or_default(),
    }
}
