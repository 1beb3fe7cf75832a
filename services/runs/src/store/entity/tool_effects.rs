//! `tool_effects`: the side-effect journal. One row per side-effecting tool call of a run, keyed by
//! (run_id, tool_call_id): the intent is written before the call executes, the result after. A row
//! with an intent and no result means the outcome is unknown (the worker died in between).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tool_effects")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub tool_call_id: String,
    pub tool_name: String,
    /// The arguments as JSON text.
    pub arguments: String,
    /// Attempt that wrote the intent.
    pub attempt: i32,
    pub intent_at: i64,
    /// The tool result text; NULL while the outcome is unknown.
    pub result: Option<String>,
    pub is_error: bool,
    pub result_at: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
