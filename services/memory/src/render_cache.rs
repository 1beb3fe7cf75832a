//! The sections and live facts of recently rendered scopes, reused while their revisions stand.
//!
//! RenderInjection runs before a lead run's first model call. Loading a scope's live facts (up to
//! `memory.max_facts` rows) was most of its time: sqlx's SQLite driver hands each row from its worker
//! thread to the async task through a channel. Every change to a scope's facts bumps its revision and
//! every change to a user's sections bumps theirs, in the same transaction as the change, on every
//! replica; so the revisions tell whether a kept copy is still exact. One statement reads the
//! revisions and, only when they differ from the kept copy's, the scope itself
//! ([`Snapshot::load_if_changed`]). Bounded by `memory.render_cache_scopes` (least recently used out;
//! 0 = off).

use std::sync::{Arc, Mutex};

use hashlink::LruCache;
use sea_orm::{ConnectionTrait, DbBackend};

use crate::facts::Scope;
use crate::profile::Profile;
use crate::render::RenderFact;
use crate::store::entity::profiles;
use crate::store::{StoreError, statement};

/// What a render reads, as of two revisions.
#[derive(Debug)]
pub struct Snapshot {
    pub revisions: (i64, i64),
    pub profile: Profile,
    pub live: Vec<RenderFact>,
}

/// The columns of `memory_profiles` in [`profiles::Model`]'s field order.
const PROFILE_COLUMNS: &str = "user_id, work_context, work_context_at, personal_context, personal_context_at, top_of_mind, \
     top_of_mind_at, recent_months, recent_months_at, earlier_context, earlier_context_at, long_term_background, \
     long_term_background_at, revision, updated_at";

/// What [`Snapshot::load_if_changed`] found.
#[derive(Debug)]
pub enum Loaded {
    /// The revisions are still those of the kept snapshot.
    Unchanged,
    Fresh(Box<Snapshot>),
}

impl Snapshot {
    /// The revisions, sections and live facts of `scope` — or only [`Loaded::Unchanged`] when its
    /// revisions are still `kept` — in one statement that returns one row: the facts travel as one JSON
    /// array (SQLite `json_group_array`, PostgreSQL `json_agg`). sqlx's SQLite driver hands every row
    /// from its worker thread to the async task through a channel, a thread wake-up each; for a scope
    /// of 100 facts that hand-off was most of a cold render. Being one statement, it also reads the
    /// revisions and the rows at one point in time, and a kept snapshot costs the same one round trip.
    pub async fn load_if_changed(db: &impl ConnectionTrait, scope: &Scope, kept: Option<(i64, i64)>) -> Result<Loaded, StoreError> {
        let backend = db.get_database_backend();
        let revisions = "SELECT COALESCE((SELECT revision FROM memory_profiles WHERE user_id = $1), 0) AS profile_revision, \
             COALESCE((SELECT revision FROM memory_scopes WHERE user_id = $1 AND agent_name = $2), 0) AS scope_revision";
        let unchanged = "r.profile_revision = $3 AND r.scope_revision = $4";
        let sql = if backend == DbBackend::Postgres {
            format!(
                "WITH r AS ({revisions}) SELECT r.profile_revision, r.scope_revision, \
                 CASE WHEN {unchanged} THEN NULL ELSE \
                   (SELECT json_build_array({PROFILE_COLUMNS})::text FROM memory_profiles WHERE user_id = $1) END AS profile, \
                 CASE WHEN {unchanged} THEN NULL ELSE \
                   (SELECT COALESCE(json_agg(json_build_array({})), '[]'::json)::text FROM memory_facts \
                    WHERE user_id = $1 AND agent_name = $2 AND invalidated_at IS NULL) END AS facts FROM r",
                // PostgreSQL prints a float8 with the shortest digits that read back as the same value.
                RenderFact::COLUMNS.replace("{confidence}", "confidence")
            )
        } else {
            format!(
                "WITH r AS ({revisions}) SELECT r.profile_revision, r.scope_revision, \
                 CASE WHEN {unchanged} THEN NULL ELSE \
                   (SELECT json_array({PROFILE_COLUMNS}) FROM memory_profiles WHERE user_id = $1) END AS profile, \
                 CASE WHEN {unchanged} THEN NULL ELSE \
                   (SELECT json_group_array(json_array({})) FROM memory_facts \
                    WHERE user_id = $1 AND agent_name = $2 AND invalidated_at IS NULL) END AS facts FROM r",
                // SQLite's JSON prints a REAL with 15 digits; 17 read back exactly (see `store::json_f64`).
                RenderFact::COLUMNS.replace("{confidence}", "printf('%!.17g', confidence)")
            )
        };
        // Revisions start at 0, so -1 never matches: load.
        let (p, f) = kept.unwrap_or((-1, -1));
        let values = vec![scope.user.clone().into(), scope.agent.clone().into(), p.into(), f.into()];
        let Some(row) = db.query_one_raw(statement(backend, &sql, values)).await? else {
            return Err(StoreError::Corrupt("the render snapshot query returned no row".to_owned()));
        };
        // The facts column is a JSON array whenever the scope was read (`[]` for none), NULL only when
        // the revisions matched.
        let Some(facts) = row.try_get::<Option<String>>("", "facts")? else { return Ok(Loaded::Unchanged) };
        let revisions = (row.try_get("", "profile_revision")?, row.try_get("", "scope_revision")?);
        let profile = match row.try_get::<Option<String>>("", "profile")? {
            Some(json) => Profile::from(
                serde_json::from_str::<profiles::Model>(&json).map_err(|e| StoreError::Corrupt(format!("a profile row as JSON: {e}")))?,
            ),
            None => Profile::default(),
        };
        let live = serde_json::from_str::<Vec<RenderFact>>(&facts).map_err(|e| StoreError::Corrupt(format!("fact rows as JSON: {e}")))?;
        Ok(Loaded::Fresh(Box::new(Self { revisions, profile, live })))
    }

    /// The revisions, sections and live facts of `scope`, read now (see [`Snapshot::load_if_changed`]).
    pub async fn load(db: &impl ConnectionTrait, scope: &Scope) -> Result<Self, StoreError> {
        match Self::load_if_changed(db, scope, None).await? {
            Loaded::Fresh(snapshot) => Ok(*snapshot),
            Loaded::Unchanged => Err(StoreError::Corrupt("a render snapshot read without a kept one came back unchanged".to_owned())),
        }
    }
}

/// See the module documentation.
pub struct RenderCache {
    entries: Option<Mutex<LruCache<Scope, Arc<Snapshot>>>>,
}

impl RenderCache {
    pub fn new(capacity: usize) -> Self {
        Self { entries: (capacity > 0).then(|| Mutex::new(LruCache::new(capacity))) }
    }

    /// The kept snapshot of `scope`, whatever its revisions (the caller checks them).
    pub fn latest(&self, scope: &Scope) -> Option<Arc<Snapshot>> {
        self.entries.as_ref()?.lock().unwrap_or_else(|p| p.into_inner()).get(scope).cloned()
    }

    /// The kept snapshot of `scope`, if it is as of `revisions` (profile, scope).
    pub fn get(&self, scope: &Scope, revisions: (i64, i64)) -> Option<Arc<Snapshot>> {
        let mut entries = self.entries.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(scope) {
            Some(snapshot) if snapshot.revisions == revisions => Some(snapshot.clone()),
            _ => None,
        }
    }

    /// Keeps `snapshot`. Its revisions were read in the same statement as its rows, so they describe
    /// them exactly; any later change bumps a revision, and the next render reloads.
    pub fn put(&self, scope: &Scope, snapshot: Arc<Snapshot>) {
        if let Some(entries) = &self.entries {
            entries.lock().unwrap_or_else(|p| p.into_inner()).insert(scope.clone(), snapshot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(revisions: (i64, i64)) -> Arc<Snapshot> {
        Arc::new(Snapshot { revisions, profile: Profile::default(), live: Vec::new() })
    }

    #[test]
    fn a_snapshot_is_used_only_at_its_revisions() {
        let cache = RenderCache::new(4);
        let alice = Scope::new("alice", "");
        cache.put(&alice, snapshot((1, 7)));
        assert!(cache.get(&alice, (1, 7)).is_some());
        assert!(cache.get(&alice, (1, 8)).is_none(), "a fact changed");
        assert!(cache.get(&alice, (2, 7)).is_none(), "a section changed");
        assert!(cache.get(&Scope::new("alice", "coder"), (1, 7)).is_none(), "another agent's bucket");
        assert!(cache.get(&Scope::new("bob", ""), (1, 7)).is_none(), "another user");
    }

    #[test]
    fn the_least_recently_used_scope_goes_first_and_zero_turns_it_off() {
        let cache = RenderCache::new(2);
        let (a, b, c) = (Scope::new("a", ""), Scope::new("b", ""), Scope::new("c", ""));
        cache.put(&a, snapshot((0, 1)));
        cache.put(&b, snapshot((0, 1)));
        assert!(cache.get(&a, (0, 1)).is_some());
        cache.put(&c, snapshot((0, 1)));
        assert!(cache.get(&b, (0, 1)).is_none(), "b was the least recently used");
        assert!(cache.get(&a, (0, 1)).is_some() && cache.get(&c, (0, 1)).is_some());

        let off = RenderCache::new(0);
        off.put(&a, snapshot((0, 1)));
        assert!(off.get(&a, (0, 1)).is_none());
    }
}
