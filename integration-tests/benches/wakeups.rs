//! Wake-ups across replicas (issue #15), measured as a client meets them: two `antler-runs` processes
//! (release build) on one PostgreSQL database, this program their client.
//!
//! Run: `cargo build --release --bins && cargo bench -p antler-integration-tests --bench wakeups`
//! (binaries from `target/release`, or `ANTLER_BIN_DIR`). `WAKEUPS_BASELINE=1` leaves out the settings
//! of issue #15, to measure binaries built before it (main before: subscribers polled every 500 ms).
//! `WAKEUPS_RUNS` (10) × `WAKEUPS_EVENTS` (100) size the latency phase; `WAKEUPS_IDLE` (1000)
//! subscribers and `WAKEUPS_WINDOW_SECS` (10) the idle phase.
//!
//! Phases:
//! - **latency**: runs admitted through replica A (so executed by A) each write one event every 20 ms;
//!   every run is followed by one client through A and one through B. Per event: write → receipt on B
//!   (the event's timestamp, written by A, has millisecond resolution: figures are ±1 ms), the same on
//!   A (the same-replica reference of this run), and receipt on A → receipt on B (this program's clock).
//! - **idle**: subscribers on B to runs executing on A that write nothing; database transactions per
//!   second (`pg_stat_database.xact_commit`, both replicas together) over a window without them and a
//!   window with them. The difference is what the subscribers cost.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::percentile::percentile;
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, Process, start};
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::*;
use anyhow::{Context, Result};
use sea_orm::ConnectionTrait;
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn baseline() -> bool {
    std::env::var_os("WAKEUPS_BASELINE").is_some()
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Production-like settings: 30 s leases, a 10 s sweep, 15 s heartbeats; no stream or user caps in
/// the way of one user's thousand subscribers.
fn replica_config(db: &TestDb) -> String {
    let extra = if baseline() {
        "  max_concurrent_runs: 400\n".to_owned()
    } else {
        "  max_concurrent_runs: 400\n  max_streams_per_user: 100000\n  max_active_runs_per_user: 0\n  max_pending_runs_per_user: 0\n"
            .to_owned()
    };
    config(db, &extra)
        .replace("  lease_secs: 3\n", "  lease_secs: 30\n")
        .replace("  sweep_interval_secs: 1\n", "  sweep_interval_secs: 10\n")
        .replace("  heartbeat_secs: 1\n", "  heartbeat_secs: 15\n")
}

fn start_replica(db: &TestDb) -> Result<Process> {
    start("antler-runs", Launch::default().config(replica_config(db)).env("RUST_LOG", "warn"))
}

/// One received event: (seq, when this program got it, the event's own timestamp in ms, the wall
/// clock at receipt in ms).
type Receipt = (u64, Instant, i64, i64);

async fn follow(mut runs: RunServiceClient<Channel>, run_id: String) -> Result<Vec<Receipt>> {
    let request = JoinRunRequest { run_id: run_id.clone(), on_disconnect: OnDisconnect::Continue as i32, ..Default::default() };
    let mut stream = runs.join_run(authed(request, ALICE)).await?.into_inner();
    let mut seen = Vec::new();
    while let Some(message) = tokio::time::timeout(Duration::from_secs(60), stream.next()).await.context("no event for 60 s")? {
        let event = message?.event.unwrap_or_default();
        let written = event.time.as_ref().map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000).unwrap_or(0);
        match event.kind {
            Some(run_event::Kind::Custom(_)) => seen.push((event.seq, Instant::now(), written, now_ms())),
            Some(run_event::Kind::End(_)) => return Ok(seen),
            _ => {}
        }
    }
    anyhow::bail!("the stream of {run_id} closed before its END")
}

fn summary(mut values: Vec<f64>, unit: &str) -> String {
    values.sort_by(f64::total_cmp);
    format!(
        "p50 {:.1} {unit}, p99 {:.1} {unit}, max {:.1} {unit} (n = {})",
        percentile(&values, 0.5).unwrap_or(f64::NAN),
        percentile(&values, 0.99).unwrap_or(f64::NAN),
        values.last().copied().unwrap_or(f64::NAN),
        values.len()
    )
}

async fn latency(a: &Process, b: &Process) -> Result<()> {
    let (runs, events) = (env_usize("WAKEUPS_RUNS", 10), env_usize("WAKEUPS_EVENTS", 100));
    let (mut runs_a, _) = clients(a).await?;
    let (runs_b, _) = clients(b).await?;
    // Warm-up: connections and statement caches of both replicas.
    let warm = runs_a.create_run(authed(run_request("", json!([{"custom": 0}])), ALICE)).await?.into_inner().run.unwrap_or_default();
    follow(runs_b.clone(), warm.run_id.clone()).await?;

    let mut steps = vec![json!({"sleep_ms": 1000})];
    for i in 0..events {
        steps.push(json!({"custom": {"i": i}}));
        steps.push(json!({"sleep_ms": 20}));
    }
    let mut followers = Vec::new();
    for _ in 0..runs {
        let run = runs_a.create_run(authed(run_request("", json!(steps.clone())), ALICE)).await?.into_inner().run.unwrap_or_default();
        followers
            .push((tokio::spawn(follow(runs_a.clone(), run.run_id.clone())), tokio::spawn(follow(runs_b.clone(), run.run_id.clone()))));
    }
    let (mut on_a, mut on_b, mut a_to_b) = (Vec::new(), Vec::new(), Vec::new());
    for (from_a, from_b) in followers {
        let from_a: HashMap<u64, Receipt> = from_a.await??.into_iter().map(|r| (r.0, r)).collect();
        for (seq, received, written, wall) in from_b.await?? {
            on_b.push((wall - written) as f64);
            if let Some((_, received_a, _, wall_a)) = from_a.get(&seq) {
                on_a.push((wall_a - written) as f64);
                a_to_b.push(
                    received.saturating_duration_since(*received_a).as_secs_f64() * 1e6
                        - received_a.saturating_duration_since(received).as_secs_f64() * 1e6,
                );
            }
        }
    }
    let label = if baseline() { "baseline" } else { "wake-ups" };
    println!("PostgreSQL {label}: {runs} runs × {events} events, one every 20 ms per run, executed by replica A");
    println!("  write → client on B (other replica): {}", summary(on_b, "ms"));
    println!("  write → client on A (same replica):  {}", summary(on_a, "ms"));
    println!("  receipt on A → receipt on B:         {}", summary(a_to_b, "µs"));
    Ok(())
}

async fn transactions(admin: &sea_orm::DatabaseConnection) -> Result<f64> {
    admin.execute_unprepared("SELECT pg_stat_clear_snapshot()").await?;
    let row = admin
        .query_one_raw(sea_orm::Statement::from_string(
            admin.get_database_backend(),
            "SELECT (xact_commit + xact_rollback)::float8 AS n FROM pg_stat_database WHERE datname = current_database()",
        ))
        .await?
        .context("no pg_stat_database row")?;
    Ok(row.try_get::<f64>("", "n")?)
}

/// Transactions per second of the database over `window` (this program's own two reads excluded).
async fn rate(admin: &sea_orm::DatabaseConnection, window: Duration) -> Result<f64> {
    let before = transactions(admin).await?;
    tokio::time::sleep(window).await;
    let after = transactions(admin).await?;
    Ok((after - before - 2.0) / window.as_secs_f64())
}

async fn idle(db: &TestDb, a: &Process, b: &Process) -> Result<()> {
    let subscribers = env_usize("WAKEUPS_IDLE", 1000);
    let window = Duration::from_secs(env_usize("WAKEUPS_WINDOW_SECS", 10) as u64);
    let per_run = 5;
    let (mut runs_a, _) = clients(a).await?;
    let (runs_b, _) = clients(b).await?;
    let admin = db.connect().await?;
    let mut ids = Vec::new();
    for _ in 0..subscribers.div_ceil(per_run) {
        ids.push(
            runs_a
                .create_run(authed(run_request("", json!([{"wait_cancel": true}])), ALICE))
                .await?
                .into_inner()
                .run
                .unwrap_or_default()
                .run_id,
        );
    }
    for id in &ids {
        wait_run(&mut runs_a, ALICE, id, Duration::from_secs(60), |r| r.status() == RunStatus::Running).await?;
    }
    // Statistics of the burst above settle; then the reference window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let without = rate(&admin, window).await?;
    let mut streams = Vec::new();
    for i in 0..subscribers {
        let mut runs = runs_b.clone();
        let request =
            JoinRunRequest { run_id: ids[i / per_run].clone(), on_disconnect: OnDisconnect::Continue as i32, ..Default::default() };
        streams.push(runs.join_run(authed(request, ALICE)).await?.into_inner());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let with = rate(&admin, window).await?;
    println!(
        "  idle: database transactions/s (both replicas, {} runs on A holding leases): {without:.1} without subscribers, {with:.1} with {subscribers} idle subscribers on B (Δ {:.1}/s)",
        ids.len(),
        with - without
    );
    for id in ids {
        runs_a.cancel_run(authed(CancelRunRequest { run_id: id, ..Default::default() }, ALICE)).await.ok();
    }
    drop(streams);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let a = start_replica(&db)?;
    let b = start_replica(&db)?;
    latency(&a, &b).await?;
    idle(&db, &a, &b).await?;
    Ok(())
}
