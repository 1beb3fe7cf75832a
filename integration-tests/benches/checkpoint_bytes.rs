//! Checkpoint storage per step (issue #14 §5): bytes the store holds per checkpoint for threads of
//! 10 / 100 / 200 steps, before compact checkpoints (every checkpoint whole:
//! `checkpoint_snapshot_every: 1`, no blobs) and after (the defaults), with the ratio.
//!
//! Run: `cargo build --release --bins && cargo bench -p antler-integration-tests --bench checkpoint_bytes`
//! (the binaries come from `target/release`, or `ANTLER_BIN_DIR`). PostgreSQL as for the tests;
//! `CKPT_BENCH_PG=0` skips it.
//!
//! A step is one run of the built-in `script` agent's echo on the same thread: a user message of
//! ~400 bytes and its echo, one checkpoint (a chat of n turns; a single run's steps store the same
//! rows, see `runs_checkpoints.rs`). Figures per thread: the mean bytes per checkpoint (rows'
//! `state` plus `checkpoint_blobs`), the last row's bytes, and GetThreadState at the head (median of
//! 30, which replays up to `checkpoint_snapshot_every` deltas).

use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_integration_tests::start;
use antler_proto::runs::*;
use anyhow::Result;
use sea_orm::{ConnectionTrait, Statement};

struct Figures {
    per_step: f64,
    last_row: i64,
    read_ms: f64,
}

async fn scalar(db: &sea_orm::DatabaseConnection, backend: Backend, sql: &str) -> Result<i64> {
    let kind = if backend == Backend::Sqlite { sea_orm::DbBackend::Sqlite } else { sea_orm::DbBackend::Postgres };
    let row = db.query_one_raw(Statement::from_string(kind, sql.to_owned())).await?.ok_or_else(|| anyhow::anyhow!("no row"))?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

async fn measure(backend: Backend, extra: &str, steps: usize) -> Result<Figures> {
    let db = TestDb::new(backend).await?;
    let server = start("antler-runs", antler_integration_tests::Launch::default().config(config(&db, extra)))?;
    let (mut runs, mut threads) = clients(&server).await?;
    let thread = "bench";
    for i in 0..steps {
        let text = format!("turn {i}: {}", "a realistic user question of some length ".repeat(10));
        let request =
            CreateRunRequest { thread_id: thread.into(), create_thread: i == 0, input: vec![user_text(&text)], ..Default::default() };
        let done = runs.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner();
        anyhow::ensure!(done.run.map(|r| r.status()) == Some(RunStatus::Success), "run {i} failed");
    }
    let conn = db.connect().await?;
    let len = if backend == Backend::Sqlite { "length" } else { "octet_length" };
    let rows = scalar(&conn, backend, &format!("SELECT CAST(COALESCE(SUM({len}(state)), 0) AS BIGINT) FROM checkpoints")).await?;
    let blobs = scalar(&conn, backend, &format!("SELECT CAST(COALESCE(SUM({len}(content)), 0) AS BIGINT) FROM checkpoint_blobs")).await?;
    let last_row = scalar(
        &conn,
        backend,
        &format!("SELECT CAST({len}(state) AS BIGINT) FROM checkpoints ORDER BY created_at DESC, checkpoint_id DESC LIMIT 1"),
    )
    .await?;
    let mut reads = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        threads.get_thread_state(authed(GetThreadStateRequest { thread_id: thread.into(), ..Default::default() }, ALICE)).await?;
        reads.push(started.elapsed());
    }
    reads.sort();
    Ok(Figures { per_step: (rows + blobs) as f64 / steps as f64, last_row, read_ms: reads[reads.len() / 2].as_secs_f64() * 1e3 })
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut backends = vec![Backend::Sqlite];
    if std::env::var("CKPT_BENCH_PG").map(|v| v != "0").unwrap_or(true) {
        backends.push(Backend::Postgres);
    }
    let before = "  checkpoint_snapshot_every: 1\n  checkpoint_blob_min_bytes: 1073741824\n";
    println!("backend   steps  before B/step  after B/step  ratio  before last row  after last row  GetThreadState before / after (ms)");
    for backend in backends {
        for steps in [10, 100, 200] {
            let b = measure(backend, before, steps).await?;
            let a = measure(backend, "", steps).await?;
            println!(
                "{:<9} {steps:>5}  {:>13.0}  {:>12.0}  {:>5.3}  {:>15}  {:>14}  {:.2} / {:.2}",
                format!("{backend:?}"),
                b.per_step,
                a.per_step,
                a.per_step / b.per_step,
                b.last_row,
                a.last_row,
                b.read_ms,
                a.read_ms
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
