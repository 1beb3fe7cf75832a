//! Schema migrations (sea-orm-migration), applied at start-up, in their own migrations table so the
//! memory service can share a database with the runs service. The full-text index differs by backend:
//! an external-content FTS5 table kept by triggers on SQLite, a generated `tsvector` column with a
//! partial GIN index on PostgreSQL; both cover live facts only.

use sea_orm::DbBackend;
use sea_orm_migration::prelude::*;

/// Every migration, in order.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(Initial)]
    }

    fn migration_table_name() -> DynIden {
        "antler_memory_migrations".into_iden()
    }
}

struct Initial;

impl MigrationName for Initial {
    fn name(&self) -> &str {
        "m0001_initial"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Initial {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let postgres = manager.get_database_backend() == DbBackend::Postgres;
        let (key, blob) = if postgres { ("BIGSERIAL PRIMARY KEY", "BYTEA") } else { ("INTEGER PRIMARY KEY", "BLOB") };
        let mut statements = vec![
            format!(
                "CREATE TABLE memory_facts (
                doc {key},
                fact_id TEXT NOT NULL UNIQUE,
                user_id TEXT NOT NULL,
                agent_name TEXT NOT NULL,
                scope_key TEXT NOT NULL,
                content TEXT NOT NULL,
                norm TEXT NOT NULL,
                category TEXT NOT NULL,
                category_label TEXT NOT NULL DEFAULT '',
                confidence DOUBLE PRECISION NOT NULL,
                source_kind TEXT NOT NULL,
                source_thread_id TEXT NOT NULL DEFAULT '',
                source_run_id TEXT NOT NULL DEFAULT '',
                source_message_id TEXT NOT NULL DEFAULT '',
                source_error TEXT NOT NULL DEFAULT '',
                line_tokens INTEGER NOT NULL,
                created_at BIGINT NOT NULL,
                valid_from BIGINT NOT NULL,
                invalidated_at BIGINT,
                invalidation_reason TEXT NOT NULL DEFAULT '',
                superseded_by TEXT NOT NULL DEFAULT '',
                supersedes TEXT NOT NULL DEFAULT '',
                confirmation_count INTEGER NOT NULL DEFAULT 0,
                last_confirmed_at BIGINT
            )"
            ),
            "CREATE INDEX memory_facts_by_scope ON memory_facts (user_id, agent_name, created_at)".to_owned(),
            "CREATE INDEX memory_facts_live ON memory_facts (user_id, agent_name, norm) WHERE invalidated_at IS NULL".to_owned(),
            "CREATE INDEX memory_facts_by_supersedes ON memory_facts (supersedes)".to_owned(),
            "CREATE TABLE memory_profiles (
                user_id TEXT PRIMARY KEY,
                work_context TEXT NOT NULL DEFAULT '',
                work_context_at BIGINT,
                personal_context TEXT NOT NULL DEFAULT '',
                personal_context_at BIGINT,
                top_of_mind TEXT NOT NULL DEFAULT '',
                top_of_mind_at BIGINT,
                recent_months TEXT NOT NULL DEFAULT '',
                recent_months_at BIGINT,
                earlier_context TEXT NOT NULL DEFAULT '',
                earlier_context_at BIGINT,
                long_term_background TEXT NOT NULL DEFAULT '',
                long_term_background_at BIGINT,
                revision BIGINT NOT NULL,
                updated_at BIGINT NOT NULL
            )"
            .to_owned(),
            "CREATE TABLE memory_scopes (
                user_id TEXT NOT NULL,
                agent_name TEXT NOT NULL,
                revision BIGINT NOT NULL,
                updated_at BIGINT NOT NULL,
                PRIMARY KEY (user_id, agent_name)
            )"
            .to_owned(),
            format!(
                "CREATE TABLE memory_updates (
                update_id TEXT PRIMARY KEY,
                user_id TEXT NOT NULL,
                agent_name TEXT NOT NULL,
                thread_id TEXT NOT NULL,
                run_id TEXT NOT NULL DEFAULT '',
                model_name TEXT NOT NULL DEFAULT '',
                conversation TEXT NOT NULL,
                refusals TEXT NOT NULL,
                message_id TEXT NOT NULL DEFAULT '',
                status TEXT NOT NULL,
                scheduled_at BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL,
                owner TEXT,
                lease_expires_at BIGINT,
                attempts INTEGER NOT NULL DEFAULT 0,
                outcome {blob}
            )"
            ),
            // A newer update for the same key replaces the waiting one; across replicas this index
            // makes the second insert fail, and the loser replaces instead.
            "CREATE UNIQUE INDEX memory_updates_one_pending ON memory_updates (user_id, agent_name, thread_id) WHERE status = 'pending'"
                .to_owned(),
            "CREATE INDEX memory_updates_due ON memory_updates (status, scheduled_at)".to_owned(),
            "CREATE INDEX memory_updates_by_user ON memory_updates (user_id, status)".to_owned(),
        ];
        if postgres {
            statements.extend([
                "ALTER TABLE memory_facts ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED".to_owned(),
                "CREATE INDEX memory_facts_tsv ON memory_facts USING GIN (tsv) WHERE invalidated_at IS NULL".to_owned(),
            ]);
        } else {
            statements.extend([
                "CREATE VIRTUAL TABLE memory_facts_fts USING fts5(content, scope_key, content='memory_facts', content_rowid='doc', \
                 tokenize='unicode61 remove_diacritics 2')"
                    .to_owned(),
                "CREATE TRIGGER memory_facts_fts_insert AFTER INSERT ON memory_facts WHEN new.invalidated_at IS NULL BEGIN
                    INSERT INTO memory_facts_fts (rowid, content, scope_key) VALUES (new.doc, new.content, new.scope_key);
                END"
                .to_owned(),
                "CREATE TRIGGER memory_facts_fts_invalidate AFTER UPDATE OF invalidated_at ON memory_facts
                    WHEN old.invalidated_at IS NULL AND new.invalidated_at IS NOT NULL BEGIN
                    INSERT INTO memory_facts_fts (memory_facts_fts, rowid, content, scope_key) VALUES ('delete', old.doc, old.content, old.scope_key);
                END"
                .to_owned(),
                "CREATE TRIGGER memory_facts_fts_delete AFTER DELETE ON memory_facts WHEN old.invalidated_at IS NULL BEGIN
                    INSERT INTO memory_facts_fts (memory_facts_fts, rowid, content, scope_key) VALUES ('delete', old.doc, old.content, old.scope_key);
                END"
                .to_owned(),
            ]);
        }
        let db = manager.get_connection();
        for statement in statements {
            db.execute_unprepared(&statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for table in ["memory_facts_fts", "memory_updates", "memory_scopes", "memory_profiles", "memory_facts"] {
            db.execute_unprepared(&format!("DROP TABLE IF EXISTS {table}")).await?;
        }
        Ok(())
    }
}
