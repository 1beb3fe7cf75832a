//! The runs store under load (issue #11), measured the way a user meets it: the server is a separate
//! `antler-runs` / `antler` process (release build), this program is its client, and every figure
//! comes with the server's CPU per call and a reference measured in the same run.
//!
//! Run: `cargo build --release --bins && cargo bench -p antler-integration-tests --bench store_load`
//! (the binaries come from `target/release`, or `ANTLER_BIN_DIR`). PostgreSQL as for the tests.
//! `STORE_BENCH_ONLY=admission,completion,wal,cancel` picks phases; `STORE_BENCH_PG=0` skips
//! PostgreSQL; `STORE_BENCH_SECS` (5) is each admission window; `STORE_BENCH_WAL_RUNS` (20000) and
//! `STORE_BENCH_HELD_RUNS` (1000) size the WAL and cancel phases; `STORE_BENCH_HOLD_SECS` keeps the held
//! runs that long before cancelling them (to inspect the server). `STORE_BENCH_BASELINE=1` leaves out
//! the settings of issue #15 (per-user caps), to measure binaries built before them.
//!
//! Phases:
//! - **admission**: CreateRun on a new thread each, c = 1 / 16 / 64 (over 4 HTTP/2 connections), with
//!   and without an idempotency key, for a fixed window; the one worker slot is held, so admitted
//!   runs stay PENDING and the admission path is alone. Prints admissions/s and the server's CPU per
//!   admission (from /proc/<pid>/stat).
//! - **completion**: the default 32 worker slots and an empty script. First the workers alone (2,000
//!   runs admitted while 32 runs that wait for their cancel hold every slot, then the slots released:
//!   completions/s while runs are still PENDING, so every slot can be busy; the whole drain, tail
//!   included, is printed beside it), then
//!   the same while a c = 64 admission
//!   flood goes on: completions/s in the window (goal ≥ 80 % of the reference), worker slots in use
//!   while runs were PENDING, and the PENDING backlog at the end (read from the store).
//! - **wal**: SQLite only: N one-step runs through the workers; the size of `runs.db-wal` at the end,
//!   after 5 s idle, and after SIGTERM.
//! - **cancel**: `antler up` with the lead agent on a model that streams one chunk every 2 s: N runs
//!   held on open model streams, RSS per held run, then 300 concurrent CancelRun calls (success rate),
//!   then the rest. Twice: the upstream double on HTTP/1.1 (a connection per call in flight) and on
//!   HTTP/2 (h2c; calls multiplexed on one connection, as OpenAI and Anthropic are reached over TLS);
//!   `STORE_BENCH_UPSTREAM=http1` or `http2` picks one. The connections the double accepted are printed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Select, Turn};
use antler_integration_tests::procfs::{cpu_secs, rss_kib};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, Process, start};
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::*;
use anyhow::{Context, Result};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;
use tonic::transport::Channel;

const CHANNELS: usize = 4;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn wanted(phase: &str) -> bool {
    std::env::var("STORE_BENCH_ONLY").map(|only| only.split(',').any(|p| p.trim() == phase)).unwrap_or(true)
}

/// The CPU the server and this client process used over a window, in cores.
struct Cpu {
    server: f64,
    client: f64,
}

impl Cpu {
    fn since(server: &Process, server0: f64, client0: f64, window: Duration) -> Self {
        let secs = window.as_secs_f64().max(1e-9);
        Self { server: (cpu_secs(server.pid()) - server0) / secs, client: (cpu_secs(std::process::id()) - client0) / secs }
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CPU: server {:.2} cores, bench client {:.2}", self.server, self.client)
    }
}

async fn channels(server: &Process) -> Result<Vec<RunServiceClient<Channel>>> {
    let mut out = Vec::new();
    for _ in 0..CHANNELS {
        out.push(RunServiceClient::new(server.channel().await?));
    }
    Ok(out)
}

/// A counter of unique keys for this process's requests.
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

fn empty_run(with_key: bool) -> CreateRunRequest {
    let mut request = run_request("", json!([]));
    if with_key {
        request.idempotency_key = format!("bench-{}-{}", std::process::id(), NEXT_KEY.fetch_add(1, Ordering::Relaxed));
    }
    request
}

#[derive(Debug, Default, Clone, Copy)]
struct Rate {
    per_sec: f64,
    server_cpu_us: f64,
    refused: u64,
}

/// CreateRun at `concurrency` for `window`: admissions/s and the server's CPU per admission.
async fn admit_for(server: &Process, concurrency: usize, with_key: bool, window: Duration) -> Result<Rate> {
    let clients = channels(server).await?;
    let (done, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let cpu0 = cpu_secs(server.pid());
    let started = Instant::now();
    let deadline = started + window;
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let mut client = clients[i % CHANNELS].clone();
        let (done, refused) = (done.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match client.create_run(authed(empty_run(with_key), ALICE)).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let cpu = cpu_secs(server.pid()) - cpu0;
    Ok(Rate {
        per_sec: n as f64 / secs,
        server_cpu_us: if n > 0 { cpu * 1e6 / n as f64 } else { 0.0 },
        refused: refused.load(Ordering::Relaxed),
    })
}

/// Counts runs by status straight from the store.
async fn count(conn: &sea_orm::DatabaseConnection, status: &str) -> Result<u64> {
    count_in(conn, &format!("'{status}'")).await
}

/// Counts runs in any of `statuses` (a quoted SQL list) in one statement.
async fn count_in(conn: &sea_orm::DatabaseConnection, statuses: &str) -> Result<u64> {
    let row = conn
        .query_one_raw(Statement::from_string(
            conn.get_database_backend(),
            format!("SELECT COUNT(*) AS n FROM runs WHERE status IN ({statuses})"),
        ))
        .await?
        .context("no count")?;
    Ok(row.try_get::<i64>("", "n")? as u64)
}

fn runs_config(db: &TestDb, extra: &str) -> String {
    // The test helper's config, with production lease settings and no per-run logging noise.
    let mut config = config(db, extra).replace("  lease_secs: 3\n  lease_grace_secs: 0\n  sweep_interval_secs: 1\n", "");
    // `STORE_BENCH_ADMISSION_SHARE=<percent>`: the SQLite write slot's admission share, for an A/B of it.
    if let Ok(share) = std::env::var("STORE_BENCH_ADMISSION_SHARE") {
        config = config.replacen("  database:\n", &format!("  database:\n    sqlite_admission_share_percent: {share}\n"), 1);
    }
    // One user admits everything here: the per-user caps are set out of reach, not off, so their
    // count is still paid. `STORE_BENCH_BASELINE=1` leaves them out, for binaries that predate them.
    if std::env::var_os("STORE_BENCH_BASELINE").is_some() {
        config
    } else {
        format!("{config}  max_active_runs_per_user: 100000000\n  max_pending_runs_per_user: 100000000\n")
    }
}

fn start_runs_bench(db: &TestDb, extra: &str) -> Result<Process> {
    start("antler-runs", Launch::default().config(runs_config(db, extra)).env("RUST_LOG", "warn"))
}

async fn admission_phase(backend: Backend, window: Duration) -> Result<Vec<String>> {
    let db = TestDb::new(backend).await?;
    // Everything admitted stays PENDING here: no backlog limit for this phase.
    let server = start_runs_bench(&db, "  max_concurrent_runs: 1\n  max_pending_runs: 0\n")?;
    let (mut runs, _) = clients(&server).await?;
    hold_the_only_slot(&mut runs).await?;
    // Warm-up: connections, statement caches, the database file.
    admit_for(&server, 16, true, Duration::from_millis(500)).await?;
    let mut lines = Vec::new();
    for with_key in [false, true] {
        for concurrency in [1, 16, 64] {
            let rate = admit_for(&server, concurrency, with_key, window).await?;
            let line = format!(
                "{backend:?} admission c={concurrency:<2} {:<7}: {:>7.0} /s, server CPU {:>5.0} µs per admission{}",
                if with_key { "key" } else { "no key" },
                rate.per_sec,
                rate.server_cpu_us,
                if rate.refused > 0 { format!(", {} refused", rate.refused) } else { String::new() }
            );
            println!("{line}");
            lines.push(line);
        }
    }
    Ok(lines)
}

/// Waits until no run is PENDING or RUNNING (at most `limit`); returns how long it took.
async fn drain(conn: &sea_orm::DatabaseConnection, limit: Duration) -> Result<Duration> {
    let started = Instant::now();
    while count(conn, "pending").await? + count(conn, "running").await? + count(conn, "finalizing").await? > 0 {
        anyhow::ensure!(started.elapsed() < limit, "runs still active after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(started.elapsed())
}

async fn completion_phase(backend: Backend, window: Duration) -> Result<Vec<String>> {
    let db = TestDb::new(backend).await?;
    let server = start_runs_bench(&db, "")?;
    let conn = db.connect().await?;
    // Reference: 2,000 runs admitted up front, then the workers alone. Every one of the 32 slots is
    // held by a run that waits for its cancel while the 2,000 are admitted, so they all stay PENDING
    // (on PostgreSQL the free workers used to finish them as fast as they came: 11 were left for the
    // "alone" window, and the figure was noise).
    let mut client = RunServiceClient::new(server.channel().await?);
    let mut blockers = Vec::new();
    for _ in 0..32 {
        let run = client.create_run(authed(run_request("", json!([{"wait_cancel": true}])), ALICE)).await?.into_inner().run;
        blockers.push(run.unwrap_or_default().run_id);
    }
    for id in &blockers {
        wait_run(&mut client, ALICE, id, Duration::from_secs(60), |r| r.status() == RunStatus::Running).await?;
    }
    let mut tasks = Vec::new();
    for chunk in 0..16 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..125 {
                client.create_run(authed(empty_run(false), ALICE)).await?;
            }
            anyhow::Ok(chunk)
        }));
    }
    for task in tasks {
        task.await??;
    }
    let left = count(&conn, "pending").await?;
    let mut cancels = Vec::new();
    for id in blockers {
        let mut client = client.clone();
        cancels.push(tokio::spawn(
            async move { client.cancel_run(authed(CancelRunRequest { run_id: id, ..Default::default() }, ALICE)).await },
        ));
    }
    // The reference is the rate while every slot can be busy: from the release of the slots until no
    // run is PENDING any more. The drain's tail (the last 32 runs finishing, the last finalizations)
    // is not part of it: a fixed tail divided into few runs reads as a fraction of the real rate.
    let started = Instant::now();
    let (cpu0, client_cpu0) = (cpu_secs(server.pid()), cpu_secs(std::process::id()));
    let before = count(&conn, "success").await?;
    for cancel in cancels {
        cancel.await??;
    }
    let mut saturated = None;
    while saturated.is_none() && started.elapsed() < Duration::from_secs(300) {
        if count(&conn, "pending").await? == 0 {
            saturated = Some((count(&conn, "success").await? - before, started.elapsed()));
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (saturated_runs, saturated_for) = saturated.context("runs still PENDING after 300 s")?;
    let alone_cpu = Cpu::since(&server, cpu0, client_cpu0, saturated_for);
    let took = started.elapsed() + drain(&conn, Duration::from_secs(300)).await?;
    let drained = (count(&conn, "success").await? - before) as f64;
    let reference = saturated_runs as f64 / saturated_for.as_secs_f64().max(1e-9);

    // The same workers while a c=64 flood admits new runs.
    let before = count(&conn, "success").await?;
    let started = Instant::now();
    let (cpu0, client_cpu0) = (cpu_secs(server.pid()), cpu_secs(std::process::id()));
    let sampler = {
        let conn = db.connect().await?;
        tokio::spawn(async move {
            // Worker slots in use while runs were waiting.
            let mut samples = Vec::new();
            while started.elapsed() < window {
                let pending = count(&conn, "pending").await?;
                // One statement: two counts at two moments miss the runs that move between them
                // (on PostgreSQL ~2 of 32 at these rates).
                let busy = count_in(&conn, "'running', 'finalizing'").await?;
                if pending > 0 {
                    samples.push(busy);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            anyhow::Ok(samples)
        })
    };
    let flood = admit_for(&server, 64, false, window).await?;
    let completed = (count(&conn, "success").await? - before) as f64 / started.elapsed().as_secs_f64();
    let flood_cpu = Cpu::since(&server, cpu0, client_cpu0, started.elapsed());
    let samples = sampler.await??;
    let slots = if samples.is_empty() { 0.0 } else { samples.iter().sum::<u64>() as f64 / samples.len() as f64 };
    let backlog = count(&conn, "pending").await?;
    drain(&conn, Duration::from_secs(600)).await?;
    client.get_run(authed(GetRunRequest { run_id: "warm".into(), ..Default::default() }, ALICE)).await.ok();
    let lines = vec![
        format!(
            "{backend:?} completion, workers alone: {reference:>7.0} runs/s ({saturated_runs} runs in {:.2} s while runs were PENDING; {left} PENDING when the 32 held slots were released; the whole drain {drained:.0} runs in {:.2} s = {:.0} runs/s); {alone_cpu}",
            saturated_for.as_secs_f64(),
            took.as_secs_f64(),
            drained / took.as_secs_f64().max(1e-9)
        ),
        format!(
            "{backend:?} completion under a c=64 flood ({:.0} admissions/s, {} refused at the backlog limit): {completed:>7.0} runs/s = {:.0} % of alone; {slots:.1} of 32 slots busy while runs waited; {backlog} PENDING at the end; {flood_cpu}",
            flood.per_sec,
            flood.refused,
            100.0 * completed / reference.max(1e-9)
        ),
    ];
    for line in &lines {
        println!("{line}");
    }
    Ok(lines)
}

fn file_mib(path: &Path) -> f64 {
    std::fs::metadata(path).map(|m| m.len() as f64 / (1024.0 * 1024.0)).unwrap_or(0.0)
}

async fn wal_phase(runs_total: usize) -> Result<Vec<String>> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let path = PathBuf::from(db.url.trim_start_matches("sqlite://").trim_end_matches("?mode=rwc"));
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    let mut server = start_runs_bench(&db, "")?;
    let conn = db.connect().await?;
    let clients = channels(&server).await?;
    let started = Instant::now();
    let per_task = runs_total / 64;
    let mut tasks = Vec::new();
    let peak = Arc::new(AtomicU64::new(0));
    for i in 0..64 {
        let mut client = clients[i % CHANNELS].clone();
        let (peak, wal) = (peak.clone(), wal.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..per_task {
                // As a client should: a full backlog says when to come back.
                while let Err(status) = client.create_run(authed(empty_run(false), ALICE)).await {
                    anyhow::ensure!(status.code() == tonic::Code::ResourceExhausted, "CreateRun failed: {status:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if n % 50 == 0 {
                    peak.fetch_max((file_mib(&wal) * 1024.0) as u64, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    drain(&conn, Duration::from_secs(900)).await?;
    let at_end = file_mib(&wal);
    let runs_per_sec = (per_task * 64) as f64 / started.elapsed().as_secs_f64();
    drop(conn);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = file_mib(&wal);
    server.signal(libc::SIGTERM)?;
    server.wait_exit(Duration::from_secs(60))?;
    let shut = file_mib(&wal);
    let line = format!(
        "SQLite WAL after {} runs ({runs_per_sec:.0} runs/s end to end): peak {:.1} MiB, {at_end:.1} MiB at the end, {idle:.1} MiB after 5 s idle, {shut:.1} MiB after SIGTERM (database {:.1} MiB)",
        per_task * 64,
        peak.load(Ordering::Relaxed) as f64 / 1024.0,
        file_mib(&path)
    );
    println!("{line}");
    Ok(vec![line])
}

async fn cancel_phase(held: usize, http2: bool) -> Result<Vec<String>> {
    // A model that keeps its stream open: one chunk every 2 s for a minute.
    let turn = Turn::text(&"slow ".repeat(30)).slow(2000);
    let (double, models) = if http2 {
        // As OpenAI and Anthropic are reached (HTTP/2 over TLS): every call a stream on one connection.
        // The double allows all the held streams at once; a real upstream advertises its own limit.
        let double = LlmDouble::start_h2(vec![turn], AfterLast::Repeat, Select::ByHistory, (held + 100) as u32).await?;
        let models = double.models_yaml_h2();
        (double, models)
    } else {
        let double = LlmDouble::start_with(vec![turn], AfterLast::Repeat, Select::ByHistory).await?;
        let models = double.models_yaml();
        (double, models)
    };
    let db = TestDb::new(Backend::Sqlite).await?;
    let extra = format!("  max_concurrent_runs: {}\n", held + 10);
    let server = start("antler", Launch::new(["up"]).config(agent_config(&db, &models, &extra)).env("RUST_LOG", "warn"))?;
    let clients = channels(&server).await?;
    // Warm up with one run so first-use allocations are not counted per run.
    let mut first = clients[0].clone();
    let warm = first.create_run(authed(prompt_request("", "hi"), ALICE)).await?.into_inner().run.unwrap_or_default();
    wait_run(&mut first, ALICE, &warm.run_id, Duration::from_secs(30), |r| r.last_seq >= 3).await?;
    first.cancel_run(authed(CancelRunRequest { run_id: warm.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss0 = rss_kib(server.pid());
    let mut ids = Vec::new();
    for i in 0..held {
        let mut client = clients[i % CHANNELS].clone();
        ids.push(client.create_run(authed(prompt_request("", "hi"), ALICE)).await?.into_inner().run.unwrap_or_default().run_id);
    }
    // Held: RUNNING with the first model delta written (so the model stream is open).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut ready = 0;
        for (i, id) in ids.iter().enumerate().step_by(10) {
            let mut client = clients[i % CHANNELS].clone();
            let run = client
                .get_run(authed(GetRunRequest { run_id: id.clone(), ..Default::default() }, ALICE))
                .await?
                .into_inner()
                .run
                .unwrap_or_default();
            if run.status() == RunStatus::Running && run.last_seq >= 3 {
                ready += 1;
            }
        }
        if ready * 10 >= held || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss1 = rss_kib(server.pid());
    let connections = double.connections();
    let per_run = (rss1.saturating_sub(rss0)) as f64 / held as f64;
    // Time to look inside the server while the runs are held (a heap profiler's snapshot, say).
    let hold = env_or("STORE_BENCH_HOLD_SECS", 0u64);
    if hold > 0 {
        println!("holding {held} runs for {hold} s (server pid {})", server.pid());
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    // 300 cancels at once.
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().take(300).enumerate() {
        let mut client = clients[i % CHANNELS].clone();
        let id = id.clone();
        tasks.push(tokio::spawn(
            async move { client.cancel_run(authed(CancelRunRequest { run_id: id, ..Default::default() }, ALICE)).await },
        ));
    }
    let (mut ok, mut refused) = (0, Vec::new());
    for task in tasks {
        match task.await? {
            Ok(_) => ok += 1,
            Err(status) => refused.push(status.code()),
        }
    }
    let mut rest_ok = 0;
    for (i, id) in ids.iter().enumerate().skip(300) {
        let mut client = clients[i % CHANNELS].clone();
        if client.cancel_run(authed(CancelRunRequest { run_id: id.clone(), ..Default::default() }, ALICE)).await.is_ok() {
            rest_ok += 1;
        }
    }
    let line = format!(
        "{held} lead runs held on open model streams (upstream {}, {connections} connections): RSS +{:.1} MiB = {per_run:.1} KiB per run; 300 concurrent CancelRun: {ok} OK, {} refused {:?}; the other {}: {rest_ok} OK",
        if http2 { "HTTP/2 h2c" } else { "HTTP/1.1" },
        (rss1.saturating_sub(rss0)) as f64 / 1024.0,
        refused.len(),
        refused.first(),
        held.saturating_sub(300)
    );
    println!("{line}");
    Ok(vec![line])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let window = Duration::from_secs(env_or("STORE_BENCH_SECS", 5));
    let backends: Vec<Backend> =
        if env_or("STORE_BENCH_PG", 1) == 0 { vec![Backend::Sqlite] } else { vec![Backend::Sqlite, Backend::Postgres] };
    println!("store_load: server = separate release process, client = this process (2 tokio workers); {} cores", num_cpus());
    let mut report = Vec::new();
    if wanted("admission") {
        for backend in &backends {
            report.extend(admission_phase(*backend, window).await?);
        }
    }
    if wanted("completion") {
        for backend in &backends {
            report.extend(completion_phase(*backend, window).await?);
        }
    }
    if wanted("wal") {
        report.extend(wal_phase(env_or("STORE_BENCH_WAL_RUNS", 20_000)).await?);
    }
    if wanted("cancel") {
        let upstream = std::env::var("STORE_BENCH_UPSTREAM").unwrap_or_else(|_| "http1,http2".to_owned());
        for http2 in [false, true] {
            if upstream.split(',').any(|u| u.trim() == if http2 { "http2" } else { "http1" }) {
                report.extend(cancel_phase(env_or("STORE_BENCH_HELD_RUNS", 1000), http2).await?);
            }
        }
    }
    println!("\n== summary");
    for line in report {
        println!("{line}");
    }
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
