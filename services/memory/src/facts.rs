//! Facts: writing versions, invalidating them, the per-scope cap, listing and full-text search.
//!
//! A change is always a new row plus, for the row it replaces, `invalidated_at` set once (guarded by
//! `invalidated_at IS NULL`, so two writers racing on one version cannot both replace it).

use std::collections::BTreeSet;

use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use sha2::Digest;

use crate::config::TokenCounting;
use crate::error::MemoryError;
use crate::store::entity::{facts, scopes};
use crate::store::{StoreError, execute, now_ms, statement};
use crate::tokens;

/// One user's bucket of facts: (user, agent name; "" = the default agent).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub user: String,
    pub agent: String,
}

impl Scope {
    pub fn new(user: impl Into<String>, agent: impl Into<String>) -> Self {
        Self { user: user.into(), agent: agent.into() }
    }

    /// The scope's token in the SQLite full-text index: one word no content can contain.
    pub fn key(&self) -> String {
        let digest = sha2::Sha256::digest(format!("{}\0{}", self.user, self.agent).as_bytes());
        format!("scope{}", &hex::encode(digest)[..24])
    }
}

/// The categories a fact may have (DeerFlow's prompt categories plus DeerMem's storage set).
pub const CATEGORIES: [&str; 10] =
    ["preference", "knowledge", "context", "behavior", "goal", "correction", "identity", "constraint", "decision", "other"];

pub const CORRECTION: &str = "correction";

/// Where a fact came from.
pub mod source {
    pub const CONVERSATION: &str = "conversation";
    pub const MANUAL: &str = "manual";
    pub const CONSOLIDATION: &str = "consolidation";
    pub const IMPORT: &str = "import";
}

/// Lower-cased, whitespace collapsed: the key of exact duplicates.
pub fn normalise(content: &str) -> String {
    content.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

pub use crate::relevance::words;

/// Jaccard similarity of the word sets of two texts (1.0 = the same words).
pub fn similarity(a: &str, b: &str) -> f64 {
    let a: BTreeSet<String> = words(a).into_iter().collect();
    let b: BTreeSet<String> = words(b).into_iter().collect();
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let shared = a.intersection(&b).count();
    shared as f64 / (a.len() + b.len() - shared) as f64
}

/// Escapes the characters that could open or close a tag in the injected block.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\r' => out.push(' '),
            _ => out.push(ch),
        }
    }
    out
}

/// The line a fact renders as in the injection block, newline included.
pub fn line(category: &str, label: &str, confidence: f64, content: &str, source_error: &str) -> String {
    let shown = if category == "other" && !label.is_empty() { label } else { category };
    let mut line = format!("- [{} | {confidence:.2}] {}", escape(shown), escape(content));
    if category == CORRECTION && !source_error.is_empty() {
        line.push_str(&format!(" (avoid: {})", escape(source_error)));
    }
    line.push('\n');
    line
}

/// A fact to write.
#[derive(Debug, Clone, Default)]
pub struct NewFact {
    pub content: String,
    pub category: String,
    pub category_label: String,
    pub confidence: f64,
    pub source_kind: String,
    pub thread_id: String,
    pub run_id: String,
    pub message_id: String,
    pub source_error: String,
    /// None = now.
    pub valid_from: Option<i64>,
    pub created_at: Option<i64>,
    pub supersedes: String,
    pub confirmation_count: i32,
    pub last_confirmed_at: Option<i64>,
}

pub fn new_fact_id() -> String {
    format!("fact_{}", uuid::Uuid::new_v4().simple())
}

/// Writes one version and returns it.
pub async fn insert(db: &impl ConnectionTrait, scope: &Scope, new: NewFact) -> Result<facts::Model, StoreError> {
    let now = now_ms();
    let created_at = new.created_at.unwrap_or(now);
    let line_tokens =
        tokens::count(&line(&new.category, &new.category_label, new.confidence, &new.content, &new.source_error), TokenCounting::Tiktoken);
    let row = facts::ActiveModel {
        doc: Default::default(),
        fact_id: Set(new_fact_id()),
        user_id: Set(scope.user.clone()),
        agent_name: Set(scope.agent.clone()),
        scope_key: Set(scope.key()),
        norm: Set(normalise(&new.content)),
        content: Set(new.content),
        category: Set(new.category),
        category_label: Set(new.category_label),
        confidence: Set(new.confidence),
        source_kind: Set(new.source_kind),
        source_thread_id: Set(new.thread_id),
        source_run_id: Set(new.run_id),
        source_message_id: Set(new.message_id),
        source_error: Set(new.source_error),
        line_tokens: Set(i32::try_from(line_tokens).unwrap_or(i32::MAX)),
        created_at: Set(created_at),
        valid_from: Set(new.valid_from.unwrap_or(created_at)),
        invalidated_at: Set(None),
        invalidation_reason: Set(String::new()),
        superseded_by: Set(String::new()),
        supersedes: Set(new.supersedes),
        confirmation_count: Set(new.confirmation_count),
        last_confirmed_at: Set(new.last_confirmed_at),
    };
    Ok(facts::Entity::insert(row).exec_with_returning(db).await?)
}

/// A fact of `scope` by id, any version.
pub async fn find(db: &impl ConnectionTrait, scope: &Scope, fact_id: &str) -> Result<Option<facts::Model>, StoreError> {
    Ok(facts::Entity::find()
        .filter(facts::Column::FactId.eq(fact_id))
        .filter(facts::Column::UserId.eq(scope.user.as_str()))
        .filter(facts::Column::AgentName.eq(scope.agent.as_str()))
        .one(db)
        .await?)
}

/// Every live fact of `scope` (at most the cap, plus what a write is about to evict).
pub async fn live(db: &impl ConnectionTrait, scope: &Scope) -> Result<Vec<facts::Model>, StoreError> {
    Ok(facts::Entity::find()
        .filter(facts::Column::UserId.eq(scope.user.as_str()))
        .filter(facts::Column::AgentName.eq(scope.agent.as_str()))
        .filter(facts::Column::InvalidatedAt.is_null())
        .all(db)
        .await?)
}

/// The live fact of `scope` whose normalised content is `norm`.
pub async fn live_by_norm(db: &impl ConnectionTrait, scope: &Scope, norm: &str) -> Result<Option<facts::Model>, StoreError> {
    Ok(facts::Entity::find()
        .filter(facts::Column::UserId.eq(scope.user.as_str()))
        .filter(facts::Column::AgentName.eq(scope.agent.as_str()))
        .filter(facts::Column::InvalidatedAt.is_null())
        .filter(facts::Column::Norm.eq(norm))
        .one(db)
        .await?)
}

/// Invalidates one live version; false when it was no longer live (someone else got there first).
pub async fn invalidate(db: &impl ConnectionTrait, doc: i64, reason: &str, superseded_by: &str) -> Result<bool, StoreError> {
    let result = facts::Entity::update_many()
        .col_expr(facts::Column::InvalidatedAt, Expr::value(now_ms()))
        .col_expr(facts::Column::InvalidationReason, Expr::value(reason))
        .col_expr(facts::Column::SupersededBy, Expr::value(superseded_by))
        .filter(facts::Column::Doc.eq(doc))
        .filter(facts::Column::InvalidatedAt.is_null())
        .exec(db)
        .await?;
    Ok(result.rows_affected == 1)
}

/// Counts one more confirmation of a live fact by a later conversation.
pub async fn confirm(db: &impl ConnectionTrait, doc: i64) -> Result<(), StoreError> {
    facts::Entity::update_many()
        .col_expr(facts::Column::ConfirmationCount, sea_orm::sea_query::ExprTrait::add(Expr::col(facts::Column::ConfirmationCount), 1))
        .col_expr(facts::Column::LastConfirmedAt, Expr::value(now_ms()))
        .filter(facts::Column::Doc.eq(doc))
        .filter(facts::Column::InvalidatedAt.is_null())
        .exec(db)
        .await?;
    Ok(())
}

/// Invalidates (reason "evicted") the lowest-ranked live facts while the scope holds more than `max`:
/// other categories before corrections, then lowest confidence, then oldest. Returns their ids.
pub async fn enforce_cap(db: &impl ConnectionTrait, scope: &Scope, max: usize) -> Result<Vec<String>, StoreError> {
    let mut live = live(db, scope).await?;
    if live.len() <= max {
        return Ok(Vec::new());
    }
    live.sort_by(|a, b| {
        (a.category == CORRECTION)
            .cmp(&(b.category == CORRECTION))
            .then(a.confidence.total_cmp(&b.confidence))
            .then(a.created_at.cmp(&b.created_at))
            .then(a.fact_id.cmp(&b.fact_id))
    });
    let excess = live.len() - max;
    let mut evicted = Vec::with_capacity(excess);
    for fact in live.into_iter().take(excess) {
        if invalidate(db, fact.doc, "evicted", "").await? {
            evicted.push(fact.fact_id);
        }
    }
    if !evicted.is_empty() {
        metrics::counter!("antler_memory_facts_evicted_total").increment(evicted.len() as u64);
    }
    Ok(evicted)
}

/// Bumps the revision of `scope` (every change of its facts).
pub async fn bump_scope(db: &impl ConnectionTrait, scope: &Scope) -> Result<(), StoreError> {
    let now = now_ms();
    execute(
        db,
        statement(
            db.get_database_backend(),
            "INSERT INTO memory_scopes (user_id, agent_name, revision, updated_at) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (user_id, agent_name) DO UPDATE SET revision = memory_scopes.revision + 1, updated_at = $3",
            vec![scope.user.clone().into(), scope.agent.clone().into(), now.into()],
        ),
    )
    .await?;
    Ok(())
}

/// The revisions of the user's sections and of `scope`'s facts (0 before the first change), in one
/// query: what tells whether a kept render snapshot is still exact.
pub async fn revisions(db: &impl ConnectionTrait, scope: &Scope) -> Result<(i64, i64), StoreError> {
    let row = db
        .query_one_raw(statement(
            db.get_database_backend(),
            "SELECT COALESCE((SELECT revision FROM memory_profiles WHERE user_id = $1), 0) AS profile_revision, \
             COALESCE((SELECT revision FROM memory_scopes WHERE user_id = $1 AND agent_name = $2), 0) AS scope_revision",
            vec![scope.user.clone().into(), scope.agent.clone().into()],
        ))
        .await?;
    let Some(row) = row else { return Ok((0, 0)) };
    Ok((row.try_get("", "profile_revision")?, row.try_get("", "scope_revision")?))
}

/// (revision, updated_at) of `scope`'s facts; (0, None) before the first change.
pub async fn scope_revision(db: &impl ConnectionTrait, scope: &Scope) -> Result<(i64, Option<i64>), StoreError> {
    let row = scopes::Entity::find_by_id((scope.user.clone(), scope.agent.clone())).one(db).await?;
    Ok(row.map_or((0, None), |r| (r.revision, Some(r.updated_at))))
}

/// (active, invalidated) fact counts of `scope`.
pub async fn counts(db: &impl ConnectionTrait, scope: &Scope) -> Result<(u64, u64), StoreError> {
    let row = db
        .query_one_raw(statement(
            db.get_database_backend(),
            "SELECT COALESCE(SUM(CASE WHEN invalidated_at IS NULL THEN 1 ELSE 0 END), 0) AS active, \
             COALESCE(SUM(CASE WHEN invalidated_at IS NULL THEN 0 ELSE 1 END), 0) AS invalidated \
             FROM memory_facts WHERE user_id = $1 AND agent_name = $2",
            vec![scope.user.clone().into(), scope.agent.clone().into()],
        ))
        .await?;
    let Some(row) = row else { return Ok((0, 0)) };
    let active: i64 = row.try_get("", "active")?;
    let invalidated: i64 = row.try_get("", "invalidated")?;
    Ok((active.max(0) as u64, invalidated.max(0) as u64))
}

/// One page of facts, newest first; `after` is the (created_at, fact_id) of the last fact of the
/// previous page.
pub async fn page(
    db: &impl ConnectionTrait,
    scope: &Scope,
    categories: &[String],
    include_invalidated: bool,
    after: Option<(i64, String)>,
    limit: u64,
) -> Result<Vec<facts::Model>, StoreError> {
    let mut query = facts::Entity::find()
        .filter(facts::Column::UserId.eq(scope.user.as_str()))
        .filter(facts::Column::AgentName.eq(scope.agent.as_str()));
    if !include_invalidated {
        query = query.filter(facts::Column::InvalidatedAt.is_null());
    }
    if !categories.is_empty() {
        query = query.filter(facts::Column::Category.is_in(categories.iter().cloned()));
    }
    if let Some((at, id)) = after {
        query = query.filter(
            sea_orm::Condition::any()
                .add(facts::Column::CreatedAt.lt(at))
                .add(sea_orm::Condition::all().add(facts::Column::CreatedAt.eq(at)).add(facts::Column::FactId.lt(id))),
        );
    }
    Ok(query.order_by_desc(facts::Column::CreatedAt).order_by_desc(facts::Column::FactId).limit(limit).all(db).await?)
}

/// Most facts a query's index lookup returns: more than a scope can hold live (`memory.max_facts` is
/// at most 500), so the ranking always sees every match.
const MAX_MATCHES: i64 = 1000;

/// Full-text search over the live facts of `scope`: (fact, score) best first, higher is better. The
/// index finds the facts holding any of the query's words; [`crate::relevance`] ranks them.
pub async fn search(
    db: &impl ConnectionTrait,
    scope: &Scope,
    query: &str,
    categories: &[String],
    limit: u64,
) -> Result<Vec<(facts::Model, f64)>, StoreError> {
    let words = crate::relevance::query_words(query);
    if words.is_empty() {
        return Ok(Vec::new());
    }
    let backend = db.get_database_backend();
    let rows = if backend == DbBackend::Postgres {
        let tsquery = words.iter().map(|w| format!("'{}'", w.replace('\'', ""))).collect::<Vec<_>>().join(" | ");
        db.query_all_raw(statement(
            backend,
            "SELECT doc FROM memory_facts \
             WHERE user_id = $1 AND agent_name = $2 AND invalidated_at IS NULL AND tsv @@ to_tsquery('simple', $3) LIMIT $4",
            vec![scope.user.clone().into(), scope.agent.clone().into(), tsquery.into(), MAX_MATCHES.into()],
        ))
        .await?
    } else {
        let terms = words.iter().map(|w| format!("\"{}\"", w.replace('"', ""))).collect::<Vec<_>>().join(" OR ");
        let matcher = format!("scope_key : {} AND content : ({terms})", scope.key());
        db.query_all_raw(statement(
            backend,
            "SELECT rowid AS doc FROM memory_facts_fts WHERE memory_facts_fts MATCH $1 LIMIT $2",
            vec![matcher.into(), MAX_MATCHES.into()],
        ))
        .await?
    };
    let mut docs = Vec::with_capacity(rows.len());
    for row in rows {
        docs.push(row.try_get::<i64>("", "doc")?);
    }
    if docs.is_empty() {
        return Ok(Vec::new());
    }
    let (scope_size, _) = counts(db, scope).await?;
    let mut query = facts::Entity::find().filter(facts::Column::Doc.is_in(docs)).filter(facts::Column::InvalidatedAt.is_null());
    if !categories.is_empty() {
        query = query.filter(facts::Column::Category.is_in(categories.iter().cloned()));
    }
    let matched = query.all(db).await?;
    let scores = crate::relevance::scores(&words, matched.iter().map(|f| f.content.as_str()), scope_size as usize);
    let mut found: Vec<(facts::Model, f64)> = matched.into_iter().zip(scores).filter(|(_, score)| *score > 0.0).collect();
    // Ties broken as RenderInjection ranks: confidence, then newest, then id.
    found.sort_by(|(a, sa), (b, sb)| {
        sb.total_cmp(sa).then(b.confidence.total_cmp(&a.confidence)).then(b.created_at.cmp(&a.created_at)).then(a.fact_id.cmp(&b.fact_id))
    });
    found.truncate(limit as usize);
    Ok(found)
}

/// A fact and every earlier version of it (the `supersedes` chain), newest first.
pub async fn chain(db: &impl ConnectionTrait, scope: &Scope, fact: facts::Model) -> Result<Vec<facts::Model>, StoreError> {
    let mut versions = vec![fact];
    // Bounded by the number of versions; a cycle cannot exist (a version names an older one).
    while let Some(previous) = versions.last().map(|f| f.supersedes.clone()).filter(|s| !s.is_empty()) {
        match find(db, scope, &previous).await? {
            Some(older) if versions.iter().all(|v| v.fact_id != older.fact_id) => versions.push(older),
            _ => break,
        }
    }
    Ok(versions)
}

/// Physically removes rows by key.
pub async fn purge(db: &impl ConnectionTrait, docs: Vec<i64>) -> Result<u64, StoreError> {
    Ok(facts::Entity::delete_many().filter(facts::Column::Doc.is_in(docs)).exec(db).await?.rows_affected)
}

/// Checks a category name; unknown names are refused.
pub fn check_category(field: &str, category: &str) -> Result<(), MemoryError> {
    if CATEGORIES.contains(&category) {
        Ok(())
    } else {
        Err(MemoryError::invalid(field, format!("`{category}` is not a category; use one of {}", CATEGORIES.join(", "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalised_content_ignores_case_and_spacing() {
        assert_eq!(normalise("  Prefers   Rust\n over Go "), "prefers rust over go");
    }

    #[test]
    fn similarity_is_token_set_jaccard() {
        assert!((similarity("The user prefers Rust", "the user prefers rust!") - 1.0).abs() < 1e-9);
        assert!(similarity("User prefers Rust over Go", "User prefers Rust to Go") > 0.6);
        assert!(similarity("User lives in Berlin", "User prefers dark mode") < 0.3);
    }

    #[test]
    fn lines_escape_tags_and_note_corrections() {
        let l = line("correction", "", 0.98, "Uses <b>PG</b>", "said MySQL");
        assert_eq!(l, "- [correction | 0.98] Uses &lt;b&gt;PG&lt;/b&gt; (avoid: said MySQL)\n");
        assert_eq!(line("other", "hobby", 0.7, "a\nb", ""), "- [hobby | 0.70] a b\n");
    }

    #[test]
    fn scope_keys_differ_by_user_and_agent() {
        assert_ne!(Scope::new("a", "").key(), Scope::new("a", "x").key());
        assert_ne!(Scope::new("a", "b").key(), Scope::new("ab", "").key());
    }
}
