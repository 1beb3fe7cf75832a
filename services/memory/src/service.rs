//! The memory of users: what the RPCs do, behind the thin handlers of [`crate::api`].

use std::collections::HashMap;
use std::sync::Arc;

use antler_kit::client::Clients;
use regex::RegexSet;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::MemoryConfig;
use crate::error::MemoryError;
use crate::facts::{self, NewFact, Scope};
use crate::profile::{self, Profile};
use crate::render::{self, Budget, Rendered};
use crate::render_cache::{Loaded, Snapshot};
use crate::store::entity::facts::Model as Fact;
use crate::store::{Store, StoreError};

/// Everything the service holds.
pub struct Memory {
    pub store: Store,
    pub config: MemoryConfig,
    pub clients: Clients,
    pub patterns: RegexSet,
    /// This replica's name in lease columns.
    pub worker_id: String,
    /// Wakes the workers: an update was queued or flushed.
    pub wake: Notify,
    /// Signalled whenever this replica finishes an update (FlushUpdates waiters re-check).
    pub finished: tokio::sync::watch::Sender<u64>,
    pub shutdown: CancellationToken,
    pub render_cache: crate::render_cache::RenderCache,
    /// QueueUpdate's group commit.
    pub queue_writer: crate::queue_batch::QueueWriter,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory").field("store", &self.store).field("worker_id", &self.worker_id).finish_non_exhaustive()
    }
}

/// A fact change asked for through the API.
#[derive(Debug, Clone, Default)]
pub struct FactChange {
    pub content: Option<String>,
    pub category: Option<String>,
    pub category_label: Option<String>,
    pub confidence: Option<f64>,
    pub source_error: Option<String>,
    pub reason: String,
}

/// What AddFact did.
#[derive(Debug)]
pub struct Added {
    pub fact: Fact,
    pub deduplicated: bool,
    pub evicted: Vec<String>,
}

/// The summary of a scope, for GetMemory.
#[derive(Debug)]
pub struct Overview {
    pub profile: Profile,
    pub revision: u64,
    pub updated_at: Option<i64>,
    pub active: u64,
    pub invalidated: u64,
}

impl Memory {
    pub fn new(
        store: Store,
        config: MemoryConfig,
        clients: Clients,
        worker_id: String,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, regex::Error> {
        let patterns = RegexSet::new(&config.refuse_patterns)?;
        let render_cache = crate::render_cache::RenderCache::new(config.render_cache_scopes as usize);
        let queue_writer = crate::queue_batch::QueueWriter::start(store.clone(), config.queue_max_depth);
        Ok(Arc::new(Self {
            store,
            config,
            clients,
            patterns,
            worker_id,
            wake: Notify::new(),
            finished: tokio::sync::watch::channel(0).0,
            shutdown,
            render_cache,
            queue_writer,
        }))
    }

    pub fn check_enabled(&self) -> Result<(), MemoryError> {
        if self.config.enabled {
            Ok(())
        } else {
            Err(MemoryError::FailedPrecondition("memory is disabled on this server (memory.enabled: false)".to_owned()))
        }
    }

    /// Summaries, revision and counts of a scope.
    pub async fn overview(&self, scope: &Scope) -> Result<Overview, MemoryError> {
        let db = self.store.db();
        let profile = profile::load(db, &scope.user).await?;
        let (scope_revision, scope_updated) = facts::scope_revision(db, scope).await?;
        let (active, invalidated) = facts::counts(db, scope).await?;
        let updated_at = match (profile.updated_at, scope_updated) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Ok(Overview { revision: (profile.revision + scope_revision).max(0) as u64, updated_at, active, invalidated, profile })
    }

    /// AddFact: an active fact with the same normalised content is returned instead of a duplicate.
    pub async fn add_fact(&self, scope: &Scope, new: NewFact) -> Result<Added, MemoryError> {
        let tx = self.store.tx().await?;
        if let Some(existing) = facts::live_by_norm(&*tx, scope, &facts::normalise(&new.content)).await? {
            return Ok(Added { fact: existing, deduplicated: true, evicted: Vec::new() });
        }
        let fact = facts::insert(&*tx, scope, new).await?;
        let evicted = facts::enforce_cap(&*tx, scope, self.config.max_facts as usize).await?;
        facts::bump_scope(&*tx, scope).await?;
        tx.commit().await?;
        metrics::counter!("antler_memory_facts_written_total", "source" => "manual").increment(1);
        Ok(Added { fact, deduplicated: false, evicted })
    }

    /// UpdateFact: a new version, the old one invalidated ("superseded: reason").
    pub async fn update_fact(&self, scope: &Scope, fact_id: &str, change: FactChange) -> Result<(Fact, Fact), MemoryError> {
        let tx = self.store.tx().await?;
        let old = facts::find(&*tx, scope, fact_id).await?.ok_or_else(|| MemoryError::not_found_fact(fact_id))?;
        if old.invalidated_at.is_some() {
            let hint = if old.superseded_by.is_empty() {
                "it was deleted or evicted; AddFact writes a new one".to_owned()
            } else {
                format!("update its newer version {}", old.superseded_by)
            };
            return Err(MemoryError::FailedPrecondition(format!(
                "fact {fact_id} is already invalidated ({})\nhint: {hint}",
                old.invalidation_reason
            )));
        }
        let category = change.category.unwrap_or_else(|| old.category.clone());
        let category_label =
            if category == "other" { change.category_label.unwrap_or_else(|| old.category_label.clone()) } else { String::new() };
        let new = NewFact {
            content: change.content.unwrap_or_else(|| old.content.clone()),
            category,
            category_label,
            confidence: change.confidence.unwrap_or(old.confidence),
            source_kind: facts::source::MANUAL.to_owned(),
            thread_id: String::new(),
            run_id: String::new(),
            message_id: String::new(),
            source_error: change.source_error.unwrap_or_else(|| old.source_error.clone()),
            valid_from: None,
            created_at: None,
            supersedes: old.fact_id.clone(),
            confirmation_count: 0,
            last_confirmed_at: None,
        };
        let unchanged = facts::normalise(&new.content) == old.norm
            && new.category == old.category
            && new.category_label == old.category_label
            && new.confidence == old.confidence
            && new.source_error == old.source_error;
        if unchanged {
            return Err(MemoryError::invalid("content", "nothing to change: every given field equals the current version"));
        }
        let fact = facts::insert(&*tx, scope, new).await?;
        let reason = if change.reason.is_empty() { "superseded".to_owned() } else { format!("superseded: {}", change.reason) };
        if !facts::invalidate(&*tx, old.doc, &reason, &fact.fact_id).await? {
            return Err(MemoryError::FailedPrecondition(format!("fact {fact_id} was invalidated meanwhile\nhint: list the facts again")));
        }
        facts::bump_scope(&*tx, scope).await?;
        let previous = facts::find(&*tx, scope, fact_id).await?.unwrap_or(old);
        tx.commit().await?;
        Ok((fact, previous))
    }

    /// DeleteFact: invalidates (idempotent), or with `purge` removes the fact and its earlier versions.
    pub async fn delete_fact(&self, scope: &Scope, fact_id: &str, reason: &str, purge: bool) -> Result<(Option<Fact>, u32), MemoryError> {
        let tx = self.store.tx().await?;
        let fact = facts::find(&*tx, scope, fact_id).await?.ok_or_else(|| MemoryError::not_found_fact(fact_id))?;
        if purge {
            let versions = facts::chain(&*tx, scope, fact).await?;
            let purged = facts::purge(&*tx, versions.iter().map(|v| v.doc).collect()).await?;
            facts::bump_scope(&*tx, scope).await?;
            tx.commit().await?;
            return Ok((None, u32::try_from(purged).unwrap_or(u32::MAX)));
        }
        if fact.invalidated_at.is_some() {
            return Ok((Some(fact), 0));
        }
        let reason = if reason.is_empty() { "deleted".to_owned() } else { format!("deleted: {reason}") };
        facts::invalidate(&*tx, fact.doc, &reason, "").await?;
        facts::bump_scope(&*tx, scope).await?;
        let fact = facts::find(&*tx, scope, fact_id).await?.unwrap_or(fact);
        tx.commit().await?;
        Ok((Some(fact), 0))
    }

    /// RenderInjection.
    pub async fn render(&self, scope: &Scope, query: &str, budget: &Budget) -> Result<(Rendered, u64), MemoryError> {
        let db = self.store.db();
        let kept = self.render_cache.latest(scope);
        let snapshot = match (Snapshot::load_if_changed(db, scope, kept.as_ref().map(|s| s.revisions)).await?, kept) {
            (Loaded::Unchanged, Some(kept)) => kept,
            (Loaded::Fresh(snapshot), _) => {
                let snapshot: Arc<Snapshot> = Arc::from(snapshot);
                self.render_cache.put(scope, snapshot.clone());
                snapshot
            }
            (Loaded::Unchanged, None) => return Err(StoreError::Corrupt("a render without a kept snapshot read none".to_owned()).into()),
        };
        let revisions = snapshot.revisions;
        let live: &[render::RenderFact] = if budget.summaries_only { &[] } else { &snapshot.live };
        // Every live fact is at hand, so they are ranked here without asking the index.
        let words = crate::relevance::query_words(query);
        let scores: HashMap<i64, f64> = if words.is_empty() {
            HashMap::new()
        } else {
            let scores = crate::relevance::scores(&words, live.iter().map(|f| f.content.as_str()), live.len());
            live.iter().zip(scores).filter(|(_, s)| *s > 0.0).map(|(f, s)| (f.doc, s)).collect()
        };
        let revision = (revisions.0 + revisions.1).max(0) as u64;
        Ok((render::render(&snapshot.profile, live, &scores, budget), revision))
    }

    /// Writes imported facts and sections in one transaction (see [`crate::import`]).
    pub async fn import(
        &self,
        scope: &Scope,
        sections: Vec<(profile::Section, String, Option<i64>)>,
        new_facts: Vec<NewFact>,
    ) -> Result<(u32, u32, u32, Vec<String>), MemoryError> {
        let tx = self.store.tx().await?;
        let sections_written = profile::write(&*tx, &scope.user, &sections).await?;
        let mut seen = std::collections::HashSet::new();
        let (mut imported, mut skipped) = (0u32, 0u32);
        for new in new_facts {
            let norm = facts::normalise(&new.content);
            if !seen.insert(norm.clone()) || facts::live_by_norm(&*tx, scope, &norm).await?.is_some() {
                skipped += 1;
                continue;
            }
            facts::insert(&*tx, scope, new).await?;
            imported += 1;
        }
        let evicted = facts::enforce_cap(&*tx, scope, self.config.max_facts as usize).await?;
        if imported > 0 || !evicted.is_empty() {
            facts::bump_scope(&*tx, scope).await?;
        }
        tx.commit().await?;
        Ok((imported, skipped, sections_written, evicted))
    }

    /// ClearMemory: invalidates every active fact of the scope (reason "cleared") and, unless
    /// `keep_sections`, empties the user's summary sections, in one transaction.
    pub async fn clear(&self, scope: &Scope, keep_sections: bool) -> Result<(u32, u32), MemoryError> {
        let tx = self.store.tx().await?;
        let live = facts::live(&*tx, scope).await?;
        for fact in &live {
            facts::invalidate(&*tx, fact.doc, "cleared", "").await?;
        }
        let sections = if keep_sections {
            0
        } else {
            let empty: Vec<_> = profile::Section::ALL.into_iter().map(|section| (section, String::new(), None)).collect();
            profile::write(&*tx, &scope.user, &empty).await?
        };
        if !live.is_empty() {
            facts::bump_scope(&*tx, scope).await?;
        }
        tx.commit().await?;
        Ok((u32::try_from(live.len()).unwrap_or(u32::MAX), sections))
    }

    /// The sections and live facts of a scope, for ExportMemory.
    pub async fn export(&self, scope: &Scope) -> Result<(Profile, Vec<Fact>, i64), MemoryError> {
        let db = self.store.db();
        let profile = profile::load(db, &scope.user).await?;
        let mut live = facts::live(db, scope).await?;
        live.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.fact_id.cmp(&b.fact_id)));
        let (scope_revision, _) = facts::scope_revision(db, scope).await?;
        let revision = profile.revision + scope_revision;
        Ok((profile, live, revision))
    }
}
