//! The memory service under load (issue #13), measured as a client meets it: the server is a separate
//! `antler` process (`antler up`, release build, SQLite), this program its gRPC client. It prints
//! figures; nothing here asserts a time.
//!
//! Run: `cargo build --release --bins && cargo bench -p antler-integration-tests --bench memory_load`
//! (binaries from `target/release`, or `ANTLER_BIN_DIR`). `MEMORY_BENCH_USERS` (10000) users get
//! `MEMORY_BENCH_FACTS` (100) live facts each through ImportMemory (one document per user), so the
//! store holds users × facts facts; `MEMORY_BENCH_CALLS` (5000) calls per latency phase;
//! `MEMORY_BENCH_SECS` (5) is the QueueUpdate window; `MEMORY_BENCH_EXTRACT` (500) updates for the
//! extraction phase. `MEMORY_BENCH_STORE=<file>`: the populated store is saved there (`VACUUM INTO`)
//! and, when the file exists, copied in instead of populating (to compare binaries on one store;
//! the users and facts are then those it was saved with).
//!
//! Phases:
//! - **populate**: ImportMemory at c = 16, documents/s and facts/s.
//! - **render**: RenderInjection for a random user (default 2,000-token budget) at c = 1, with and
//!   without a query (the current user message): p50 / p99 (goal p99 < 2 ms).
//! - **search**: SearchFacts for a random user and two or three words, c = 1: p50 / p99 (goal p99 < 10 ms).
//! - **queue**: QueueUpdate on distinct threads at c = 16 for the window: accepted/s (goal ≥ 2,000/s),
//!   durable (the rows are committed before the answer).
//! - **extract**: updates queued `immediate` against a zero-latency model double, until the last is
//!   finished (read from the store: the workers start on the first update, so most are finished
//!   before the last is queued): updates/s through the workers (model call, validation, guards,
//!   apply), done and failed counts, model calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Select, Turn};
use antler_integration_tests::memory::{SERVICE, adds, config, conversation};
use antler_integration_tests::percentile::percentile;
use antler_integration_tests::{Launch, Process, start};
use antler_proto::memory::memory_service_client::MemoryServiceClient;
use antler_proto::memory::*;
use anyhow::Result;
use sea_orm::{ConnectionTrait, Statement};
use tonic::transport::Channel;

const CHANNELS: usize = 4;
const WORDS: [&str; 40] = [
    "rust",
    "python",
    "billing",
    "kubernetes",
    "coffee",
    "marathon",
    "berlin",
    "lisbon",
    "postgres",
    "sqlite",
    "helm",
    "react",
    "cats",
    "dogs",
    "piano",
    "chess",
    "hiking",
    "sourdough",
    "spanish",
    "german",
    "reports",
    "deadline",
    "budget",
    "migration",
    "airflow",
    "duckdb",
    "iceberg",
    "terraform",
    "grafana",
    "oncall",
    "mentoring",
    "hiring",
    "roadmap",
    "design",
    "testing",
    "latency",
    "security",
    "privacy",
    "travel",
    "music",
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A request for `user`, made by the benchmark's service principal acting for them.
fn as_user<T>(message: T, user: usize) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let (Ok(auth), Ok(act)) = (format!("Bearer {SERVICE}").parse(), format!("user-{user}").parse()) {
        request.metadata_mut().insert("authorization", auth);
        request.metadata_mut().insert(antler_kit::auth::ACT_AS_HEADER, act);
    }
    request
}

fn word(seed: u64) -> &'static str {
    WORDS[(seed % WORDS.len() as u64) as usize]
}

fn document(user: usize, facts: usize) -> String {
    let list: Vec<serde_json::Value> = (0..facts)
        .map(|i| {
            let s = (user * 7919 + i * 104_729) as u64;
            let category = ["preference", "knowledge", "context", "goal"][i % 4];
            serde_json::json!({"content": format!("User {user} cares about {} and {} (note {i}: {} matters for {})", word(s), word(s / 3 + 1), word(s / 7 + 2), word(s / 11 + 3)),
                "category": category, "confidence": 0.7 + (i % 30) as f64 / 100.0})
        })
        .collect();
    serde_json::json!({"version": "1.0", "user": {"workContext": {"summary": format!("User {user} is an engineer working on {}", word(user as u64))},
        "personalContext": {"summary": "Prefers concise answers"}}, "history": {"recentMonths": {"summary": "Shipped a migration"}}, "facts": list})
    .to_string()
}

async fn clients(server: &Process) -> Result<Vec<MemoryServiceClient<Channel>>> {
    let mut out = Vec::new();
    for _ in 0..CHANNELS {
        out.push(MemoryServiceClient::new(server.channel().await?).max_decoding_message_size(64 << 20));
    }
    Ok(out)
}

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let at = |q: f64| percentile(&samples, q).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    (at(0.5), at(0.99), at(1.0))
}

fn server_config(db: &TestDb, memory_extra: &str, models: &str) -> String {
    config(db, &format!("  queue_max_depth: 0\n{memory_extra}"), models)
}

#[tokio::main]
async fn main() -> Result<()> {
    let users: usize = env_or("MEMORY_BENCH_USERS", 10_000);
    let facts: usize = env_or("MEMORY_BENCH_FACTS", 100);
    let calls: usize = env_or("MEMORY_BENCH_CALLS", 5000);
    let window = Duration::from_secs(env_or("MEMORY_BENCH_SECS", 5));
    let extract: usize = env_or("MEMORY_BENCH_EXTRACT", 500);

    let answer = adds(&[("The user keeps a detailed engineering journal", "behavior", 0.9)]);
    let double = LlmDouble::start_with(vec![Turn::text(&answer)], AfterLast::Repeat, Select::InOrder).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let yaml = server_config(
        &db,
        &format!("  max_facts: {}\n  debounce_seconds: 300\n  workers: 4\n", facts.clamp(10, 500)),
        &double.models_yaml(),
    );
    // populate (or reuse a store an earlier run saved: comparing binaries costs one populate)
    let saved = std::env::var_os("MEMORY_BENCH_STORE").map(std::path::PathBuf::from);
    let db_path = std::path::PathBuf::from(db.url.trim_start_matches("sqlite://").split('?').next().unwrap_or_default());
    let reuse = saved.as_ref().filter(|p| p.exists());
    if let Some(saved) = reuse {
        std::fs::copy(saved, &db_path)?;
        println!("populate: reused {} (users and facts as when it was saved)", saved.display());
    }
    let server = start("antler", Launch::new(["up"]).config(yaml))?;
    let memory = clients(&server).await?;
    println!("memory_load: {users} users x {facts} facts, SQLite, antler up (pid {})", server.pid());
    if reuse.is_none() {
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for t in 0..16 {
            let mut client = memory[t % CHANNELS].clone();
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let user = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if user >= users {
                        return Ok::<_, anyhow::Error>(());
                    }
                    client
                        .import_memory(as_user(ImportMemoryRequest { document: document(user, facts), ..Default::default() }, user))
                        .await?;
                }
            }));
        }
        for task in tasks {
            task.await??;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "populate: {:.0} documents/s, {:.0} facts/s ({:.1} s for {} facts)",
            users as f64 / secs,
            (users * facts) as f64 / secs,
            secs,
            users * facts
        );
        if let Some(saved) = &saved {
            // A consistent copy of the live database, WAL included.
            let conn = db.connect().await?;
            conn.execute_unprepared(&format!("VACUUM INTO '{}'", saved.display().to_string().replace('\'', "''"))).await?;
            println!("          saved to {} (MEMORY_BENCH_STORE)", saved.display());
        }
    }
    let db_size = std::fs::metadata(&db_path).map(|m| m.len()).unwrap_or(0);
    println!("          memory.db {:.0} MiB", db_size as f64 / (1 << 20) as f64);

    // render
    let mut client = memory[0].clone();
    for (label, with_query) in [("no query", false), ("with query", true)] {
        let mut samples = Vec::with_capacity(calls);
        let mut tokens = 0u64;
        let mut included = 0u64;
        for i in 0..calls {
            let user = fastrand_like(i as u64) as usize % users;
            let query = if with_query {
                format!("how should I approach {} and {} this week?", word(i as u64), word(i as u64 / 5))
            } else {
                String::new()
            };
            let t = Instant::now();
            let r = client.render_injection(as_user(RenderInjectionRequest { query, ..Default::default() }, user)).await?.into_inner();
            samples.push(t.elapsed());
            tokens += u64::from(r.token_estimate);
            included += r.included_fact_ids.len() as u64;
        }
        let (p50, p99, max) = percentiles(samples);
        println!(
            "render ({label}): p50 {p50:.3} ms, p99 {p99:.3} ms, max {max:.3} ms (goal p99 < 2 ms); mean {:.0} tokens, {:.1} facts per block",
            tokens as f64 / calls as f64,
            included as f64 / calls as f64
        );
    }

    // search
    let mut samples = Vec::with_capacity(calls);
    let mut hits = 0u64;
    for i in 0..calls {
        let user = fastrand_like(i as u64 + 17) as usize % users;
        let query = format!("{} {} {}", word(i as u64 * 3), word(i as u64 / 2 + 1), if i % 2 == 0 { "notes" } else { word(i as u64 / 9) });
        let t = Instant::now();
        let r = client.search_facts(as_user(SearchFactsRequest { query, ..Default::default() }, user)).await?.into_inner();
        samples.push(t.elapsed());
        hits += r.results.len() as u64;
    }
    let (p50, p99, max) = percentiles(samples);
    println!(
        "search over {} facts: p50 {p50:.3} ms, p99 {p99:.3} ms, max {max:.3} ms (goal p99 < 10 ms); {:.1} results per query",
        users * facts,
        hits as f64 / calls as f64
    );

    // queue
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..16 {
        let mut client = memory[t % CHANNELS].clone();
        let (accepted, refused) = (accepted.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while Instant::now() < deadline {
                let request = QueueUpdateRequest {
                    thread_id: format!("bench-{t}-{n}"),
                    messages: conversation("I have started learning the cello and practise every evening"),
                    ..Default::default()
                };
                match client.queue_update(as_user(request, n % users.max(1))).await {
                    Ok(_) => accepted.fetch_add(1, Ordering::Relaxed),
                    Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                };
                n += 1;
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "queue: {:.0} QueueUpdate accepted/s at c = 16 (goal >= 2,000/s), {} refused",
        accepted.load(Ordering::Relaxed) as f64 / secs,
        refused.load(Ordering::Relaxed)
    );
    drop(server);

    // extract: a fresh server so the queue holds only these updates.
    let db = TestDb::new(Backend::Sqlite).await?;
    let yaml = server_config(&db, "  workers: 4\n  poll_interval_ms: 100\n", &double.models_yaml());
    let server = start("antler", Launch::new(["up"]).config(yaml))?;
    let mut client = clients(&server).await?.remove(0);
    let before = double.requests().len();
    let conn = db.connect().await?;
    let started = Instant::now();
    for i in 0..extract {
        let request = QueueUpdateRequest {
            thread_id: format!("x-{i}"),
            messages: conversation(&format!("Fact {i} about me")),
            immediate: true,
            ..Default::default()
        };
        client.queue_update(as_user(request, i % 50)).await?;
    }
    let queued_in = started.elapsed().as_secs_f64();
    // The workers start on the first update, so by the time the last is queued many are finished:
    // their progress is read from the store (the server's own database file; WAL lets a reader in).
    let finished = |status: &'static str| {
        let conn = conn.clone();
        async move {
            let sql = format!("SELECT COUNT(*) AS n FROM memory_updates WHERE status = '{status}'");
            let row = conn.query_one_raw(Statement::from_string(conn.get_database_backend(), sql)).await?;
            anyhow::Ok(row.map(|r| r.try_get::<i64>("", "n")).transpose()?.unwrap_or(0) as usize)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    let (mut done, mut failed) = (0, 0);
    while done + failed < extract && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        (done, failed) = (finished("done").await?, finished("failed").await?);
    }
    let secs = started.elapsed().as_secs_f64();
    let row = conn.query_one_raw(Statement::from_string(conn.get_database_backend(), "SELECT COUNT(*) AS n FROM memory_facts")).await?;
    let facts_written = row.map(|r| r.try_get::<i64>("", "n")).transpose()?.unwrap_or(0);
    println!(
        "extract: {:.0} updates/s through 4 workers with a zero-latency model: {done} done, {failed} failed of {extract} in {secs:.2} s \
         (queued in {queued_in:.2} s), {} model calls, {facts_written} facts written (the double answers one fact, so each user's later updates confirm it)",
        (done + failed) as f64 / secs,
        double.requests().len() - before,
    );
    Ok(())
}

/// A cheap deterministic spread of user ids (no RNG dependency; the same users every run).
fn fastrand_like(i: u64) -> u64 {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 7
}
