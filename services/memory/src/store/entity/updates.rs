//! `memory_updates`: the durable extraction queue. A row is `pending` (waiting for its debounce; at most
//! one per (user, agent, thread), by a partial unique index), `running` (claimed by `owner` until
//! `lease_expires_at`), then `done` or `failed` with its outcome, kept for a while for FlushUpdates.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "memory_updates")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub update_id: String,
    pub user_id: String,
    pub agent_name: String,
    pub thread_id: String,
    pub run_id: String,
    pub model_name: String,
    /// The filtered conversation, JSON `[{"role": "user"|"assistant", "text": …}]`.
    pub conversation: String,
    /// Text a fact must not repeat (system prompts, tool results, file contents), JSON array of strings.
    pub refusals: String,
    /// Id of the last user message of the slice (the facts' source message).
    pub message_id: String,
    pub status: String,
    pub scheduled_at: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub attempts: i32,
    /// The `UpdateOutcome` (protobuf) once done or failed.
    pub outcome: Option<Vec<u8>>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
