//! `checkpoints`: thread state after each agent step.

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
    /// Checkpoint, protobuf-encoded.
    pub state: Vec<u8>,
    pub created_at: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
