//! Schema migrations (sea-orm-migration), applied at start-up. Each migration is DDL written once for
//! both backends; the few differences (binary column type) are chosen by backend.

use sea_orm::DbBackend;
use sea_orm_migration::prelude::*;

/// Every migration, in order.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(Initial),
            Box::new(ToolEffects),
            Box::new(RunInputs),
            Box::new(CancelCause),
            Box::new(Subagents),
            Box::new(CompactCheckpoints),
            Box::new(Workers),
            Box::new(Notify),
            Box::new(ActiveByUser),
            Box::new(SqlAggregates),
            Box::new(PendingByAge),
        ]
    }

    fn migration_table_name() -> DynIden {
        "antler_runs_migrations".into_iden()
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
        let blob = match manager.get_database_backend() {
            DbBackend::Postgres => "BYTEA",
            _ => "BLOB",
        };
        let db = manager.get_connection();
        let statements = [
            "CREATE TABLE threads (
                user_id TEXT NOT NULL,
                thread_id TEXT NOT NULL,
                title TEXT NOT NULL DEFAULT '',
                metadata TEXT NOT NULL DEFAULT '{}',
                head_checkpoint_id TEXT,
                latest_run_id TEXT,
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL,
                PRIMARY KEY (user_id, thread_id)
            )"
            .to_owned(),
            "CREATE INDEX threads_by_user_created ON threads (user_id, created_at)".to_owned(),
            format!(
                "CREATE TABLE runs (
                run_id TEXT PRIMARY KEY,
                user_id TEXT NOT NULL,
                thread_id TEXT NOT NULL,
                status TEXT NOT NULL,
                queued BOOLEAN NOT NULL DEFAULT FALSE,
                attempt INTEGER NOT NULL DEFAULT 0,
                owner_worker_id TEXT,
                lease_expires_at BIGINT,
                cancel_action TEXT,
                idempotency_key TEXT,
                fingerprint TEXT NOT NULL,
                multitask_strategy TEXT NOT NULL,
                on_disconnect TEXT NOT NULL,
                model_name TEXT NOT NULL DEFAULT '',
                request {blob} NOT NULL,
                metadata TEXT NOT NULL DEFAULT '{{}}',
                base_checkpoint_id TEXT,
                stop_reason TEXT,
                error_code TEXT,
                error_message TEXT,
                final_status TEXT,
                usage {blob} NOT NULL,
                delivery {blob},
                last_seq BIGINT NOT NULL DEFAULT 0,
                created_at BIGINT NOT NULL,
                started_at BIGINT,
                finished_at BIGINT,
                updated_at BIGINT NOT NULL
            )"
            ),
            // Invariant 2: one admitted (not queued), non-terminal run per thread, whatever the number
            // of replicas.
            "CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (user_id, thread_id)
                WHERE status IN ('pending', 'running', 'finalizing') AND queued = FALSE"
                .to_owned(),
            // Invariant 1: an idempotency key names one run per user while it is retained.
            "CREATE UNIQUE INDEX runs_idempotency ON runs (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL".to_owned(),
            "CREATE INDEX runs_by_thread ON runs (user_id, thread_id, created_at)".to_owned(),
            "CREATE INDEX runs_by_status ON runs (status, lease_expires_at)".to_owned(),
            format!(
                "CREATE TABLE run_events (
                run_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                kind INTEGER NOT NULL,
                payload {blob} NOT NULL,
                created_at BIGINT NOT NULL,
                PRIMARY KEY (run_id, seq)
            )"
            ),
            format!(
                "CREATE TABLE checkpoints (
                checkpoint_id TEXT PRIMARY KEY,
                user_id TEXT NOT NULL,
                thread_id TEXT NOT NULL,
                parent_checkpoint_id TEXT,
                run_id TEXT,
                step BIGINT NOT NULL,
                state {blob} NOT NULL,
                created_at BIGINT NOT NULL
            )"
            ),
            "CREATE INDEX checkpoints_by_thread ON checkpoints (user_id, thread_id, created_at)".to_owned(),
            "CREATE TABLE feedback (
                run_id TEXT NOT NULL,
                user_id TEXT NOT NULL,
                feedback_id TEXT NOT NULL,
                thread_id TEXT NOT NULL,
                message_id TEXT NOT NULL DEFAULT '',
                rating INTEGER NOT NULL,
                comment TEXT NOT NULL DEFAULT '',
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL,
                PRIMARY KEY (run_id, user_id)
            )"
            .to_owned(),
        ];
        for statement in statements {
            db.execute_unprepared(&statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for table in ["feedback", "checkpoints", "run_events", "runs", "threads"] {
            db.execute_unprepared(&format!("DROP TABLE IF EXISTS {table}")).await?;
        }
        Ok(())
    }
}

/// The side-effect journal (DESIGN §4 invariant 6): intent before a side-effecting tool call, result
/// after, keyed by (run, tool call id).
struct ToolEffects;

impl MigrationName for ToolEffects {
    fn name(&self) -> &str {
        "m0002_tool_effects"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for ToolEffects {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE TABLE tool_effects (
                run_id TEXT NOT NULL,
                tool_call_id TEXT NOT NULL,
                tool_name TEXT NOT NULL,
                arguments TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                intent_at BIGINT NOT NULL,
                result TEXT,
                is_error BOOLEAN NOT NULL DEFAULT FALSE,
                result_at BIGINT,
                PRIMARY KEY (run_id, tool_call_id)
            )",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("DROP TABLE IF EXISTS tool_effects").await?;
        Ok(())
    }
}

/// Large run inputs out of the `runs` row (see `entity/run_inputs.rs`). Existing rows keep their input
/// inline, which readers still understand.
struct RunInputs;

impl MigrationName for RunInputs {
    fn name(&self) -> &str {
        "m0003_run_inputs"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for RunInputs {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let blob = match manager.get_database_backend() {
            DbBackend::Postgres => "BYTEA",
            _ => "BLOB",
        };
        manager
            .get_connection()
            .execute_unprepared(&format!("CREATE TABLE run_inputs (run_id TEXT PRIMARY KEY, input {blob} NOT NULL)"))
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("DROP TABLE IF EXISTS run_inputs").await?;
        Ok(())
    }
}

/// Why a cancel was requested (`runs.cancel_cause`), decided with `cancel_action` by the first
/// request: it becomes the run's stop_reason ("cancelled", "client_disconnected", "superseded").
struct CancelCause;

impl MigrationName for CancelCause {
    fn name(&self) -> &str {
        "m0004_cancel_cause"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CancelCause {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("ALTER TABLE runs ADD COLUMN cancel_cause TEXT").await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("ALTER TABLE runs DROP COLUMN cancel_cause").await?;
        Ok(())
    }
}

/// Compact checkpoints (see `crate::checkpoints`): how a row's `state` is encoded (0, the default
/// for every row written before, is a whole Checkpoint, which readers still understand), and the
/// thread-scoped table of large messages stored once.
struct CompactCheckpoints;

impl MigrationName for CompactCheckpoints {
    fn name(&self) -> &str {
        "m0006_compact_checkpoints"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CompactCheckpoints {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let blob = match manager.get_database_backend() {
            DbBackend::Postgres => "BYTEA",
            _ => "BLOB",
        };
        let db = manager.get_connection();
        db.execute_unprepared("ALTER TABLE checkpoints ADD COLUMN encoding INTEGER NOT NULL DEFAULT 0").await?;
        db.execute_unprepared(&format!(
            "CREATE TABLE checkpoint_blobs (
                user_id TEXT NOT NULL,
                thread_id TEXT NOT NULL,
                sha256 TEXT NOT NULL,
                content {blob} NOT NULL,
                created_at BIGINT NOT NULL,
                PRIMARY KEY (user_id, thread_id, sha256)
            )"
        ))
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP TABLE IF EXISTS checkpoint_blobs").await?;
        db.execute_unprepared("ALTER TABLE checkpoints DROP COLUMN encoding").await?;
        Ok(())
    }
}

/// Subagent runs (DESIGN §5): a child run names the run and `task` call that started it, which
/// identify it exactly once (a resumed parent finds its child again); its thread names the parent's
/// thread, so ListThreads leaves child threads out and deleting a thread deletes its children's.
struct Subagents;

impl MigrationName for Subagents {
    fn name(&self) -> &str {
        "m0005_subagents"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Subagents {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "ALTER TABLE runs ADD COLUMN parent_run_id TEXT",
            "ALTER TABLE runs ADD COLUMN parent_task_id TEXT",
            "CREATE UNIQUE INDEX runs_one_child_per_task ON runs (parent_run_id, parent_task_id) WHERE parent_run_id IS NOT NULL",
            "ALTER TABLE threads ADD COLUMN parent_thread_id TEXT",
            "CREATE INDEX threads_by_parent ON threads (user_id, parent_thread_id) WHERE parent_thread_id IS NOT NULL",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "DROP INDEX threads_by_parent",
            "ALTER TABLE threads DROP COLUMN parent_thread_id",
            "DROP INDEX runs_one_child_per_task",
            "ALTER TABLE runs DROP COLUMN parent_task_id",
            "ALTER TABLE runs DROP COLUMN parent_run_id",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}

/// What lists and sums need as columns, so SQL can filter and aggregate instead of the service
/// loading rows and decoding them (issue #15):
/// - the run's usage totals (`usage_*`) beside the protobuf `usage` (which GetRun still returns), and
///   the per-model split as a JSON object (`usage_by_model`, summed with `json_each`/`jsonb_each`);
/// - `run_events.task_id`: the subagent task an event belongs to (RunEvent.task_id, or for a
///   SubagentEvent its own task_id), so ListRunEvents filters on it before its LIMIT.
///
/// Existing rows are filled in by decoding them: every run's usage, and the SUBAGENT events (no
/// earlier version wrote a non-empty RunEvent.task_id, so no other event needs it).
struct SqlAggregates;

impl MigrationName for SqlAggregates {
    fn name(&self) -> &str {
        "m0010_sql_aggregates"
    }
}

// A migration is history: it must do the same on every database it ever meets, whatever the
// service above it becomes. So what m0010 needs of the domain (the usage columns and how a usage
// maps onto them, the task an event belongs to) is copied here as it was when m0010 was written,
// not called: changing `crate::usage` or `crate::stream` must not change this migration.

/// The numeric usage columns m0010 added to `runs` (frozen; the live list is
/// `entity::runs::USAGE_COLUMNS`).
const USAGE_COLUMNS: [&str; 9] = [
    "usage_input_tokens",
    "usage_output_tokens",
    "usage_total_tokens",
    "usage_cache_read_tokens",
    "usage_reasoning_tokens",
    "usage_llm_calls",
    "usage_lead_agent_tokens",
    "usage_subagent_tokens",
    "usage_middleware_tokens",
];

/// Rows decoded per statement while filling existing rows in.
const BACKFILL_BATCH: u64 = 500;

#[async_trait::async_trait]
impl MigrationTrait for SqlAggregates {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

        use super::entity::{run_events, runs};
        let db = manager.get_connection();
        for column in USAGE_COLUMNS {
            db.execute_unprepared(&format!("ALTER TABLE runs ADD COLUMN {column} BIGINT NOT NULL DEFAULT 0")).await?;
        }
        db.execute_unprepared("ALTER TABLE runs ADD COLUMN usage_by_model TEXT NOT NULL DEFAULT '{}'").await?;
        db.execute_unprepared("ALTER TABLE run_events ADD COLUMN task_id TEXT").await?;
        db.execute_unprepared("CREATE INDEX run_events_by_task ON run_events (run_id, task_id, seq) WHERE task_id IS NOT NULL").await?;

        // Runs: the totals from the stored protobuf, in keyset-paged batches.
        let mut after = String::new();
        loop {
            let rows: Vec<(String, Vec<u8>)> = runs::Entity::find()
                .select_only()
                .column(runs::Column::RunId)
                .column(runs::Column::Usage)
                .filter(runs::Column::RunId.gt(after.as_str()))
                .order_by_asc(runs::Column::RunId)
                .limit(BACKFILL_BATCH)
                .into_tuple()
                .all(db)
                .await?;
            let Some((last, _)) = rows.last() else { break };
            after = last.clone();
            for (run_id, usage) in rows {
                let Ok(usage) = <antler_proto::runs::RunUsage as prost::Message>::decode(usage.as_slice()) else { continue };
                if usage == antler_proto::runs::RunUsage::default() {
                    continue;
                }
                let mut update = runs::Entity::update_many().filter(runs::Column::RunId.eq(run_id.as_str()));
                for (column, value) in usage_columns(&usage) {
                    update = update.col_expr(column, sea_orm::sea_query::Expr::value(value));
                }
                update.exec(db).await?;
            }
        }

        // Subagent events: their task id.
        let subagent = antler_proto::runs::EventKind::Subagent as i32;
        let mut after = (String::new(), 0i64);
        loop {
            let rows: Vec<(String, i64, Vec<u8>)> = run_events::Entity::find()
                .select_only()
                .column(run_events::Column::RunId)
                .column(run_events::Column::Seq)
                .column(run_events::Column::Payload)
                .filter(run_events::Column::Kind.eq(subagent))
                .filter(
                    sea_orm::sea_query::Condition::any().add(run_events::Column::RunId.gt(after.0.as_str())).add(
                        sea_orm::sea_query::Condition::all()
                            .add(run_events::Column::RunId.eq(after.0.as_str()))
                            .add(run_events::Column::Seq.gt(after.1)),
                    ),
                )
                .order_by_asc(run_events::Column::RunId)
                .order_by_asc(run_events::Column::Seq)
                .limit(BACKFILL_BATCH)
                .into_tuple()
                .all(db)
                .await?;
            let Some((run_id, seq, _)) = rows.last() else { break };
            after = (run_id.clone(), *seq);
            for (run_id, seq, payload) in rows {
                let Ok(event) = <antler_proto::runs::RunEvent as prost::Message>::decode(payload.as_slice()) else { continue };
                let Some(task_id) = task_of(&event) else { continue };
                run_events::Entity::update_many()
                    .col_expr(run_events::Column::TaskId, sea_orm::sea_query::Expr::value(task_id.to_owned()))
                    .filter(run_events::Column::RunId.eq(run_id.as_str()))
                    .filter(run_events::Column::Seq.eq(seq))
                    .exec(db)
                    .await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX run_events_by_task").await?;
        db.execute_unprepared("ALTER TABLE run_events DROP COLUMN task_id").await?;
        db.execute_unprepared("ALTER TABLE runs DROP COLUMN usage_by_model").await?;
        for column in USAGE_COLUMNS {
            db.execute_unprepared(&format!("ALTER TABLE runs DROP COLUMN {column}")).await?;
        }
        Ok(())
    }
}

/// The run-row columns that mirror a run's usage, as m0010 fills them in (frozen copy of what
/// `crate::usage::columns` was then).
fn usage_columns(usage: &antler_proto::runs::RunUsage) -> Vec<(super::entity::runs::Column, sea_orm::Value)> {
    use super::entity::runs::Column;
    let int = |value: u64| <i64 as TryFrom<u64>>::try_from(value).unwrap_or(i64::MAX);
    let by_model: serde_json::Map<String, serde_json::Value> = usage
        .by_model
        .iter()
        .map(|(model, per)| {
            let u = per.usage.unwrap_or_default();
            let counts = serde_json::json!({
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "total_tokens": u.total_tokens,
                "cache_read_tokens": u.cache_read_tokens,
                "reasoning_tokens": u.reasoning_tokens,
                "llm_calls": per.llm_calls,
            });
            (model.clone(), counts)
        })
        .collect();
    vec![
        (Column::UsageInputTokens, int(usage.input_tokens).into()),
        (Column::UsageOutputTokens, int(usage.output_tokens).into()),
        (Column::UsageTotalTokens, int(usage.total_tokens).into()),
        (Column::UsageCacheReadTokens, int(usage.cache_read_tokens).into()),
        (Column::UsageReasoningTokens, int(usage.reasoning_tokens).into()),
        (Column::UsageLlmCalls, int(usage.llm_calls).into()),
        (Column::UsageLeadAgentTokens, int(usage.lead_agent_tokens).into()),
        (Column::UsageSubagentTokens, int(usage.subagent_tokens).into()),
        (Column::UsageMiddlewareTokens, int(usage.middleware_tokens).into()),
        (Column::UsageByModel, serde_json::Value::Object(by_model).to_string().into()),
    ]
}

/// The subagent task an event belongs to, as m0010 fills in `run_events.task_id` (frozen copy of
/// what `crate::stream::task_of` was then): its RunEvent.task_id, or a SUBAGENT event's own task_id.
fn task_of(event: &antler_proto::runs::RunEvent) -> Option<&str> {
    use antler_proto::runs::run_event::Kind;
    if !event.task_id.is_empty() {
        return Some(&event.task_id);
    }
    match &event.kind {
        Some(Kind::Subagent(subagent)) if !subagent.task_id.is_empty() => Some(&subagent.task_id),
        _ => None,
    }
}

/// Replica heartbeats (see `entity/workers.rs`): how a replica tells that the one that admitted a
/// PENDING run is dead, without waiting for the run's admission lease.
struct Workers;

impl MigrationName for Workers {
    fn name(&self) -> &str {
        "m0007_workers"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Workers {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE TABLE workers (
                worker_id TEXT PRIMARY KEY,
                started_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL
            )",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("DROP TABLE IF EXISTS workers").await?;
        Ok(())
    }
}

/// PostgreSQL only: wake-ups across replicas (see `crate::notify`). Triggers call `pg_notify` in the
/// transaction of the write itself, so a notification exists exactly when the write committed, and
/// every path that appends events or requests a cancel is covered, including single-statement
/// appends and writes by code that does not know about wake-ups. Payloads are small:
/// `e:<seq>:<end>:<run_id>` (the highest seq the statement inserted for the run, and 1 when it
/// inserted the run's END) and `c:<run_id>` (the first cancel request of a run).
/// One notification per run per statement: a multi-row insert of a step's events sends one.
struct Notify;

impl MigrationName for Notify {
    fn name(&self) -> &str {
        "m0008_notify"
    }
}

/// The channel every replica LISTENs on.
pub const NOTIFY_CHANNEL: &str = "antler_runs";

#[async_trait::async_trait]
impl MigrationTrait for Notify {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let end = antler_proto::runs::EventKind::End as i32;
        let db = manager.get_connection();
        for statement in [
            format!(
                "CREATE FUNCTION antler_notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM pg_notify('{NOTIFY_CHANNEL}', 'e:' || max(seq) || ':' || (bool_or(kind = {end}))::int || ':' || run_id)
                        FROM added GROUP BY run_id;
                    RETURN NULL;
                END $$"
            ),
            "CREATE TRIGGER run_events_notify AFTER INSERT ON run_events REFERENCING NEW TABLE AS added \
             FOR EACH STATEMENT EXECUTE FUNCTION antler_notify_events()"
                .to_owned(),
            format!(
                "CREATE FUNCTION antler_notify_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM pg_notify('{NOTIFY_CHANNEL}', 'c:' || NEW.run_id);
                    RETURN NULL;
                END $$"
            ),
            "CREATE TRIGGER runs_notify_cancel AFTER UPDATE OF cancel_action ON runs FOR EACH ROW \
             WHEN (OLD.cancel_action IS NULL AND NEW.cancel_action IS NOT NULL) EXECUTE FUNCTION antler_notify_cancel()"
                .to_owned(),
        ] {
            db.execute_unprepared(&statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        for statement in [
            "DROP TRIGGER IF EXISTS runs_notify_cancel ON runs",
            "DROP FUNCTION IF EXISTS antler_notify_cancel()",
            "DROP TRIGGER IF EXISTS run_events_notify ON run_events",
            "DROP FUNCTION IF EXISTS antler_notify_events()",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}

/// The per-user caps of admission (`lifecycle::user_caps`) count a user's runs that have not ended:
/// a partial index keeps that count to the user's active runs, however many ended runs they have.
struct ActiveByUser;

impl MigrationName for ActiveByUser {
    fn name(&self) -> &str {
        "m0009_runs_active_by_user"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for ActiveByUser {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX runs_active_by_user ON runs (user_id, status) WHERE status IN ('pending', 'running', 'finalizing')",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("DROP INDEX runs_active_by_user").await?;
        Ok(())
    }
}

/// The dispatcher and a closing worker's hand-over (`lifecycle::start`) take the oldest startable
/// PENDING run: with only `runs_by_status` (status, lease) that was a scan and sort of every PENDING
/// run on each call — inside the closing transaction, on the one SQLite writer, for a hand-over.
/// In this order the first index entry that passes the other conditions is the answer.
struct PendingByAge;

impl MigrationName for PendingByAge {
    fn name(&self) -> &str {
        "m0011_runs_pending_by_age"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for PendingByAge {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("CREATE INDEX runs_by_status_created ON runs (status, created_at)").await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared("DROP INDEX runs_by_status_created").await?;
        Ok(())
    }
}
