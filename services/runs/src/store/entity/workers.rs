//! `workers`: one row per runs replica (its `worker_id`, the value it writes into
//! `runs.owner_worker_id`), with a heartbeat. A replica renews `expires_at` every third of
//! `runs.lease_secs`; a row whose `expires_at` is past (plus `runs.lease_grace_secs`) is a dead
//! replica, whose admitted PENDING runs the others start at once (see `lifecycle/liveness.rs`).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "workers")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub worker_id: String,
    pub started_at: i64,
    /// Until when the replica answers for itself (last heartbeat + lease), ms since the epoch; in
    /// the past once it shut down.
    pub expires_at: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
