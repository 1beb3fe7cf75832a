//! Throughput and CPU per run of `antler up` (issue #32): the server is the release `antler` binary in
//! a process of its own (optionally pinned with `taskset`), the load is this process, so every CPU
//! second counted for the server (`/proc/<pid>/stat`: all its threads, nothing else) is the server's.
//!
//! For each shape (lead runs with the `replay` model and no delays: a one-step run answers at once; a
//! ten-turn run calls the no-op `write_todos` nine times, then answers: 19 steps, a step being each
//! model call and each tool round), each number of runs in flight and each CPU set, it keeps that many
//! `StreamRun`s going on `BENCH_CONNECTIONS` channels for a warm-up and then a measured window, and
//! prints runs/s, steps/s, the run latency (StreamRun to END) at p50 / p99, server CPU per run, the
//! SQLite writer's holding time and its transactions per run (the runs service's
//! `antler_runs_sqlite_write_seconds`, also as the share of the window it was held), database
//! statements per run, and the client's own CPU. The last lines give the CPU per extra step (ten-turn
//! minus one-step, over 18 steps), the scaling ratio between CPU sets and, with a baseline, the ratios
//! against it.
//!
//! Run: `cargo bench -p antler --bench run_throughput`. Environment (all optional):
//! `BENCH_CPUS` — CPU sets for the server, `;`-separated `taskset -c` lists, `all` for none (default
//! `all`; e.g. `1;0-1` on two cores: one core, then two); `BENCH_INFLIGHT` (default `64,256`);
//! `BENCH_SHAPES` (turns per run, default `1,10`); `BENCH_SECS` (window, default 8);
//! `BENCH_WARMUP_SECS` (default 2); `BENCH_CONNECTIONS` (default 8); `BENCH_DATABASE_URL` (an admin
//! `postgres://` URL: each server gets a fresh database, dropped after); `ANTLER_BIN` (the server
//! binary, default the `antler` this bench was built with); `BENCH_BASELINE_BIN` (a second server
//! binary, measured before `ANTLER_BIN` in every round; the last lines give the ratios of the medians);
//! `BENCH_ROUNDS` (default 1); `BENCH_LOG` (the server's log filter,
//! default `warn`; `antler up` logs at `info` by default); `BENCH_ADDR` + `BENCH_SERVER_PID` (drive a
//! server that is already running, e.g. under a profiler, instead of starting one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use antler_proto::runs::run_service_client::RunServiceClient;
use anyhow::bail;
use tonic::transport::Channel;

#[path = "common/services.rs"]
#[allow(dead_code)]
mod services;

#[path = "common/server_process.rs"]
#[allow(dead_code)]
mod server_process;

use server_process::{Target, cpu_secs, metric_sum, one_run, scrape, steps_of};
use services::percentile;

/// What the database side of the server did, from its metrics.
#[derive(Default, Clone, Copy)]
struct DbCounters {
    statements: f64,
    write_secs: f64,
    writes: f64,
}

impl DbCounters {
    fn read(text: &str) -> Self {
        Self {
            statements: metric_sum(text, "antler_runs_db_statements_total"),
            write_secs: metric_sum(text, "antler_runs_sqlite_write_seconds_sum"),
            writes: metric_sum(text, "antler_runs_sqlite_write_seconds_count"),
        }
    }

    fn minus(self, before: Self) -> Self {
        Self {
            statements: self.statements - before.statements,
            write_secs: self.write_secs - before.write_secs,
            writes: self.writes - before.writes,
        }
    }
}

/// What one measured window saw.
struct Window {
    runs: usize,
    latencies: Vec<f64>,
    secs: f64,
    server_cpu: f64,
    client_cpu: f64,
    db: DbCounters,
}

/// Keeps `inflight` runs going for the warm-up and then the window.
async fn window(
    target: &Target,
    channels: &[Channel],
    turns: usize,
    inflight: usize,
    warmup: Duration,
    secs: Duration,
) -> anyhow::Result<Window> {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..inflight {
        let client = RunServiceClient::new(channels[i % channels.len()].clone());
        let (measuring, stop) = (measuring.clone(), stop.clone());
        tasks.spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let counted = measuring.load(Ordering::Relaxed);
                let took = one_run(client.clone(), turns).await?;
                // A run counts when it started and ended inside the window.
                if counted && measuring.load(Ordering::Relaxed) {
                    seen.push(took.as_secs_f64() * 1e3);
                }
            }
            anyhow::Ok(seen)
        });
    }
    tokio::time::sleep(warmup).await;
    let (cpu0, client0, db0) = (cpu_secs(target.pid)?, cpu_secs(std::process::id())?, DbCounters::read(&scrape(&target.metrics).await?));
    let started = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(secs).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (cpu1, client1, db1) = (cpu_secs(target.pid)?, cpu_secs(std::process::id())?, DbCounters::read(&scrape(&target.metrics).await?));
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done??);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(Window {
        runs: latencies.len(),
        latencies,
        secs: elapsed,
        server_cpu: cpu1 - cpu0,
        client_cpu: client1 - client0,
        db: db1.minus(db0),
    })
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// One measured window of one server.
struct Row {
    server: &'static str,
    cpus: String,
    inflight: usize,
    turns: usize,
    cpu_ms_per_run: f64,
    rate: f64,
}

/// The median of `pick` over the rows of `server` with this CPU set, load and shape (None: none ran).
fn median_of(rows: &[Row], server: &str, cpus: &str, inflight: usize, turns: usize, pick: fn(&Row) -> f64) -> Option<f64> {
    let mut values: Vec<f64> =
        rows.iter().filter(|r| r.server == server && r.cpus == cpus && r.inflight == inflight && r.turns == turns).map(pick).collect();
    values.sort_by(f64::total_cmp);
    (!values.is_empty()).then(|| percentile(&values, 0.5))
}

fn main() -> anyhow::Result<()> {
    let shapes: Vec<usize> = env_or("BENCH_SHAPES", "1,10").split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?;
    let inflights: Vec<usize> = env_or("BENCH_INFLIGHT", "64,256").split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?;
    let cpu_sets: Vec<String> = env_or("BENCH_CPUS", "all").split(';').map(|s| s.trim().to_owned()).collect();
    let secs = Duration::from_secs_f64(env_or("BENCH_SECS", "8").parse()?);
    let warmup = Duration::from_secs_f64(env_or("BENCH_WARMUP_SECS", "2").parse()?);
    let connections: usize = env_or("BENCH_CONNECTIONS", "8").parse()?;
    let rounds: usize = env_or("BENCH_ROUNDS", "1").parse()?;
    let bin = env_or("ANTLER_BIN", env!("CARGO_BIN_EXE_antler"));
    let baseline = std::env::var("BENCH_BASELINE_BIN").ok();
    if shapes.contains(&0) || inflights.contains(&0) || connections == 0 || rounds == 0 {
        bail!("BENCH_SHAPES, BENCH_INFLIGHT, BENCH_CONNECTIONS and BENCH_ROUNDS must be positive");
    }
    // Each round measures the baseline (when there is one), then this server, so both see the
    // machine in the same state.
    let servers: Vec<(&'static str, String)> = baseline.iter().map(|b| ("baseline", b.clone())).chain([("this", bin.clone())]).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let backend = if std::env::var("BENCH_DATABASE_URL").is_ok() { "PostgreSQL" } else { "SQLite" };
    println!(
        "run_throughput: lead runs with the replay model, {backend}, server `{bin}`{}, {connections} connections, {} s windows after {} s warm-up, {rounds} round(s), {} cores here",
        baseline.as_deref().map(|b| format!(", baseline `{b}`")).unwrap_or_default(),
        secs.as_secs_f64(),
        warmup.as_secs_f64(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!(
        "{:<8} {:<6} {:>5} {:>4} | {:>8} {:>9} {:>8} {:>8} | {:>10} {:>9} | {:>9} {:>9} {:>11} {:>8} | {:>9}",
        "server",
        "cpus",
        "turns",
        "c",
        "runs/s",
        "steps/s",
        "p50 ms",
        "p99 ms",
        "cpu ms/run",
        "cpu cores",
        "writer ms",
        "writes",
        "writer busy",
        "stmts",
        "client cpu"
    );
    let mut rows: Vec<Row> = Vec::new();
    for _ in 0..rounds {
        for (server, bin) in &servers {
            for cpus in &cpu_sets {
                for &inflight in &inflights {
                    for &turns in &shapes {
                        let db = runtime.block_on(services::database())?;
                        let url = services::url(&db);
                        let target = match Target::existing()? {
                            Some(target) => target,
                            None => Target::start(bin, cpus, &url, &shapes)?,
                        };
                        let channels = runtime.block_on(target.channels(connections))?;
                        let w = runtime.block_on(window(&target, &channels, turns, inflight, warmup, secs))?;
                        drop(channels);
                        target.stop()?;
                        drop(db);
                        let runs = w.runs.max(1) as f64;
                        let rate = w.runs as f64 / w.secs;
                        println!(
                            "{:<8} {:<6} {:>5} {:>4} | {:>8.0} {:>9.0} {:>8.2} {:>8.2} | {:>10.3} {:>9.2} | {:>9.3} {:>9.2} {:>11.2} {:>8.1} | {:>9.2}",
                            server,
                            cpus,
                            turns,
                            inflight,
                            rate,
                            rate * steps_of(turns) as f64,
                            percentile(&w.latencies, 0.5),
                            percentile(&w.latencies, 0.99),
                            w.server_cpu * 1e3 / runs,
                            w.server_cpu / w.secs,
                            w.db.write_secs * 1e3 / runs,
                            w.db.writes / runs,
                            w.db.write_secs / w.secs,
                            w.db.statements / runs,
                            w.client_cpu / w.secs,
                        );
                        rows.push(Row { server, cpus: cpus.clone(), inflight, turns, cpu_ms_per_run: w.server_cpu * 1e3 / runs, rate });
                    }
                }
            }
        }
    }
    println!(
        "(writer ms and writes: the SQLite write slot's holding time and transactions per run; writer busy: the share of the window the slot was held; stmts: database statements per run; cpu cores: server CPU seconds per second)"
    );
    let cpu = |r: &Row| r.cpu_ms_per_run;
    let rate = |r: &Row| r.rate;
    for cpus in &cpu_sets {
        for &inflight in &inflights {
            // CPU per extra step: the ten-turn shape against the one-step shape at the same load and CPUs.
            for &turns in shapes.iter().filter(|&&t| t > 1) {
                if let (Some(one), Some(many)) =
                    (median_of(&rows, "this", cpus, inflight, 1, cpu), median_of(&rows, "this", cpus, inflight, turns, cpu))
                {
                    let extra = (steps_of(turns) - 1) as f64;
                    println!(
                        "cpus {cpus}, c={inflight}: {:.3} ms of server CPU per extra step ({turns}-turn vs 1-step)",
                        (many - one) / extra
                    );
                }
            }
            for &turns in &shapes {
                // Scaling: each CPU set's rate against the first one's.
                if cpus != &cpu_sets[0]
                    && let (Some(here), Some(first)) = (
                        median_of(&rows, "this", cpus, inflight, turns, rate),
                        median_of(&rows, "this", &cpu_sets[0], inflight, turns, rate),
                    )
                {
                    println!("scaling: cpus {cpus} vs {} ({turns} turns, c={inflight}): {:.2}x", cpu_sets[0], here / first);
                }
                // Against the baseline, medians of the rounds.
                if let (Some(ours), Some(theirs), Some(our_cpu), Some(their_cpu)) = (
                    median_of(&rows, "this", cpus, inflight, turns, rate),
                    median_of(&rows, "baseline", cpus, inflight, turns, rate),
                    median_of(&rows, "this", cpus, inflight, turns, cpu),
                    median_of(&rows, "baseline", cpus, inflight, turns, cpu),
                ) {
                    println!(
                        "against the baseline, cpus {cpus}, {turns} turns, c={inflight}, median of {rounds}: runs/s {:.2}x ({ours:.0} vs {theirs:.0}), server CPU per run {:.2}x ({our_cpu:.3} vs {their_cpu:.3} ms)",
                        ours / theirs,
                        our_cpu / their_cpu
                    );
                }
            }
        }
    }
    Ok(())
}
