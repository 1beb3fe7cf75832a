//! `runs`: the work orders. The partial unique index `runs_one_active_per_thread` (see the migration)
//! allows at most one admitted, not-queued, non-terminal run per (user, thread).

use sea_orm::entity::prelude::*;

use crate::status::Status;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "runs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: String,
    pub user_id: String,
    pub thread_id: String,
    /// Stored as text: pending | running | finalizing | success | error | interrupted | timeout.
    pub status: Status,
    /// An ENQUEUE run waiting behind the thread's active run.
    pub queued: bool,
    pub attempt: i32,
    pub owner_worker_id: Option<String>,
    pub lease_expires_at: Option<i64>,
    /// First cancel request wins: interrupt | rollback.
    pub cancel_action: Option<String>,
    /// Why, decided by the same first request: requested | client_disconnected | superseded.
    pub cancel_cause: Option<String>,
    pub idempotency_key: Option<String>,
    pub fingerprint: String,
    pub multitask_strategy: String,
    pub on_disconnect: String,
    pub model_name: String,
    /// The admitted CreateRunRequest (secrets removed), protobuf-encoded.
    pub request: Vec<u8>,
    pub metadata: String,
    /// The thread head when the run was admitted: where ROLLBACK returns to.
    pub base_checkpoint_id: Option<String>,
    pub stop_reason: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// Status the run ends with once FINALIZING completes (lets a successor finish a crashed finalize).
    pub final_status: Option<Status>,
    /// RunUsage, protobuf-encoded.
    pub usage: Vec<u8>,
    /// DeliveryReceipt, protobuf-encoded, written once in FINALIZING.
    pub delivery: Option<Vec<u8>>,
    pub last_seq: i64,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub updated_at: i64,
    /// For a subagent run: the run whose `task` call started it (it executes the child itself).
    pub parent_run_id: Option<String>,
    /// For a subagent run: that `task` tool call's id.
    pub parent_task_id: Option<String>,
    /// The totals of `usage` as columns, for GetTokenUsage's SUM (see `crate::usage`).
    pub usage_input_tokens: i64,
    pub usage_output_tokens: i64,
    pub usage_total_tokens: i64,
    pub usage_cache_read_tokens: i64,
    pub usage_reasoning_tokens: i64,
    pub usage_llm_calls: i64,
    pub usage_lead_agent_tokens: i64,
    pub usage_subagent_tokens: i64,
    pub usage_middleware_tokens: i64,
    /// `usage.by_model` as a JSON object: model → {input_tokens, output_tokens, total_tokens,
    /// cache_read_tokens, reasoning_tokens, llm_calls}.
    pub usage_by_model: String,
}

/// The numeric usage columns (`usage_*` above), for the SQL that sums them.
pub const USAGE_COLUMNS: [&str; 9] = [
    "usage_input_tokens",
    "usage_output_tokens",
    "usage_total_tokens",
    "usage_cache_read_tokens",
    "usage_reasoning_tokens",
    "usage_llm_calls",
    "usage_lead_agent_tokens",
    "usage_subagent_tokens",
    "usage_middleware_tokens",
];

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
