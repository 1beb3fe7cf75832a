//! `checkpoints`: thread state after each agent step. Since `m0005_compact_checkpoints` a row holds
//! what changed since its parent, or a full snapshot every `runs.checkpoint_snapshot_every` steps
//! (see `crate::checkpoints`); rows written before hold a whole `Checkpoint` (`encoding` 0).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "checkpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub checkpoint_id: String,
    pub user_id: String,
    pub thread_id: String,
    pub parent_checkpoint_id: Option<String>,
    pub run_id: Option<String>,
    pub step: i64,
    /// `encoding` 0: a whole `antler.runs.v1.Checkpoint`; 1: a `crate::checkpoints::Stored` (a delta
    /// or a snapshot), protobuf-encoded.
    pub state: Vec<u8>,
    pub created_at: i64,
    /// How `state` is encoded (see there).
    pub encoding: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
