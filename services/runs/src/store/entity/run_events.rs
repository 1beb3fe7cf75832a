//! `run_events`: the durable event log, `seq` strictly increasing per run.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "run_events")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub seq: i64,
    /// `EventKind` number, for filtering without decoding.
    pub kind: i32,
    /// RunEvent, protobuf-encoded.
    pub payload: Vec<u8>,
    pub created_at: i64,
    /// The subagent task the event belongs to (see `crate::stream::task_of`); None for the lead
    /// agent's own events.
    pub task_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
