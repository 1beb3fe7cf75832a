//! Per-user caps checked at admission: `runs.max_active_runs_per_user` (runs not yet ended: PENDING,
//! RUNNING or FINALIZING) and `runs.max_pending_runs_per_user` (runs waiting for a worker), so one
//! user cannot fill the shared backlog or every worker slot.
//!
//! Like [`super::backlog`], the counts are taken from the store at most every [`REFRESH`] per user
//! (one indexed count, `runs_active_by_user`), and the runs this replica admitted since are added, so
//! the estimate errs high: a run that started or ended meanwhile is still counted until the next
//! refresh. Across replicas a cap can be exceeded by what the other replicas admit for the same user
//! within one refresh.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QuerySelect};

use crate::config::RunsConfig;
use crate::error::RunsError;
use crate::status::Status;

use crate::store::entity::runs;

/// How old a user's counts may get before they are taken again.
pub const REFRESH: Duration = Duration::from_millis(250);

/// Users whose counts are kept before stale entries are dropped.
const KEEP_USERS: usize = 10_000;

/// A user's runs, as far as admission knows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// PENDING, RUNNING or FINALIZING.
    pub active: u64,
    /// PENDING.
    pub pending: u64,
}

#[derive(Debug, Default)]
pub struct UserRuns {
    state: Mutex<HashMap<String, (Counts, Instant)>>,
}

impl UserRuns {
    /// `user_id`'s counts (counted inside `db` when older than [`REFRESH`]). Nothing is read when
    /// both caps are off.
    pub async fn counts(&self, config: &RunsConfig, db: &impl ConnectionTrait, user_id: &str) -> Result<Counts, RunsError> {
        if config.max_active_runs_per_user == 0 && config.max_pending_runs_per_user == 0 {
            return Ok(Counts::default());
        }
        let cached = self.state.lock().unwrap_or_else(|p| p.into_inner()).get(user_id).copied();
        if let Some((counts, at)) = cached
            && at.elapsed() < REFRESH
        {
            return Ok(counts);
        }
        // Read by column name, not position: inside an admission batch this runs on the store's
        // writer connection, which serves rows by name only (see `store::direct`).
        #[derive(sea_orm::FromQueryResult)]
        struct ByStatus {
            status: Status,
            n: i64,
        }
        let rows: Vec<ByStatus> = runs::Entity::find()
            .select_only()
            .column(runs::Column::Status)
            .column_as(runs::Column::RunId.count(), "n")
            .filter(runs::Column::UserId.eq(user_id))
            .filter(runs::Column::Status.is_in(Status::ACTIVE))
            .group_by(runs::Column::Status)
            .into_model()
            .all(db)
            .await?;
        let mut counts = Counts::default();
        for ByStatus { status, n } in rows {
            let n = u64::try_from(n).unwrap_or(0);
            counts.active += n;
            if status == Status::Pending {
                counts.pending += n;
            }
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.len() >= KEEP_USERS {
            state.retain(|_, (_, at)| at.elapsed() < REFRESH);
        }
        state.insert(user_id.to_owned(), (counts, Instant::now()));
        Ok(counts)
    }

    /// Records `n` runs this replica just admitted for `user_id`.
    pub fn admitted(&self, user_id: &str, n: u64) {
        if let Some((counts, _)) = self.state.lock().unwrap_or_else(|p| p.into_inner()).get_mut(user_id) {
            counts.active += n;
            counts.pending += n;
        }
    }
}

/// RESOURCE_EXHAUSTED naming the cap when `counts` leave no room for one more run of the user.
pub fn check(config: &RunsConfig, counts: Counts) -> Result<(), RunsError> {
    let cap = config.max_active_runs_per_user;
    if cap > 0 && counts.active >= cap {
        return Err(RunsError::ResourceExhausted(format!(
            "you have {} runs that have not ended; the limit is {cap} per user (runs.max_active_runs_per_user)\nhint: wait for some to end (WaitRun, JoinRun) or cancel them, then retry",
            counts.active
        )));
    }
    let cap = config.max_pending_runs_per_user;
    if cap > 0 && counts.pending >= cap {
        return Err(RunsError::ResourceExhausted(format!(
            "you have {} runs waiting for a worker; the limit is {cap} per user (runs.max_pending_runs_per_user)\nhint: wait for some to start, or cancel them, then retry",
            counts.pending
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cap_refuses_at_its_limit_and_names_its_setting() {
        let config = RunsConfig { max_active_runs_per_user: 3, max_pending_runs_per_user: 2, ..RunsConfig::default() };
        assert!(check(&config, Counts { active: 2, pending: 1 }).is_ok());
        let active = check(&config, Counts { active: 3, pending: 0 }).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(active.contains("runs.max_active_runs_per_user") && active.contains("limit is 3"), "{active}");
        let pending = check(&config, Counts { active: 2, pending: 2 }).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(pending.contains("runs.max_pending_runs_per_user") && pending.contains("limit is 2"), "{pending}");
        let off = RunsConfig { max_active_runs_per_user: 0, max_pending_runs_per_user: 0, ..RunsConfig::default() };
        assert!(check(&off, Counts { active: 1_000_000, pending: 1_000_000 }).is_ok());
    }
}
