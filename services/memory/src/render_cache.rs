//! The sections and live facts of recently rendered scopes, reused while their revisions stand.
//!
//! RenderInjection runs before a lead run's first model call. Loading a scope's live facts (up to
//! `memory.max_facts` rows) was most of its time: sqlx's SQLite driver hands each row from its worker
//! thread to the async task through a channel. Every change to a scope's facts bumps its revision and
//! every change to a user's sections bumps theirs, in the same transaction as the change, on every
//! replica; so one small query for the two revisions tells whether a kept copy is still exact. Bounded
//! by `memory.render_cache_scopes` (least recently used out; 0 = off).

use std::sync::{Arc, Mutex};

use hashlink::LruCache;

use crate::facts::Scope;
use crate::profile::Profile;
use crate::store::entity::facts::Model as Fact;

/// What a render reads, as of two revisions.
#[derive(Debug)]
pub struct Snapshot {
    pub revisions: (i64, i64),
    pub profile: Profile,
    pub live: Vec<Fact>,
}

/// See the module documentation.
pub struct RenderCache {
    entries: Option<Mutex<LruCache<Scope, Arc<Snapshot>>>>,
}

impl RenderCache {
    pub fn new(capacity: usize) -> Self {
        Self { entries: (capacity > 0).then(|| Mutex::new(LruCache::new(capacity))) }
    }

    /// The kept snapshot of `scope`, if it is as of `revisions` (profile, scope).
    pub fn get(&self, scope: &Scope, revisions: (i64, i64)) -> Option<Arc<Snapshot>> {
        let mut entries = self.entries.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(scope) {
            Some(snapshot) if snapshot.revisions == revisions => Some(snapshot.clone()),
            _ => None,
        }
    }

    /// Keeps `snapshot`. It was loaded after its revisions were read, so it is at least that new; a
    /// change in between bumped a revision, and the next render reloads.
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
