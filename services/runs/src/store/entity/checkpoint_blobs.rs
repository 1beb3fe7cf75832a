//! `checkpoint_blobs`: large messages of a thread's checkpoints, stored once and referenced by the
//! sha256 of their protobuf encoding from every checkpoint row that holds them (a large tool output
//! is in every snapshot after it; it is written here once). Scoped to the thread, so deleting the
//! thread deletes them and no content is shared between users.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "checkpoint_blobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub thread_id: String,
    /// Hex sha256 of `content`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub sha256: String,
    /// An `antler.common.v1.Message`, protobuf-encoded.
    pub content: Vec<u8>,
    pub created_at: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
