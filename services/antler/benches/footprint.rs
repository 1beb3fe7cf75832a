//! Memory and threads of `antler up` idle and after a burst of runs (issue #32, finding 4): the server
//! is the release `antler` binary in a process of its own (lead agent, the `replay` model, SQLite under
//! a temporary data dir), the load is this process. For each server binary it prints, from
//! `/proc/<pid>/status`, the resident set (VmRSS), its anonymous part (RssAnon) and the threads: idle
//! (`BENCH_IDLE_SECS` after it listens), then after `BENCH_RUNS` one-step `StreamRun`s at
//! `BENCH_INFLIGHT` in flight, once per delay in `BENCH_SETTLE_SECS` after the last run ended (tokio
//! lets an idle blocking thread go after 10 s, so the default reads once before and once after that).
//! With `BENCH_BASELINE_BIN` the baseline binary is measured the same way, alternating with `ANTLER_BIN`
//! for `BENCH_ROUNDS` rounds, and the last lines give the ratios.
//!
//! Run: `cargo bench -p antler --bench footprint`. Environment (all optional): `ANTLER_BIN` (default the
//! `antler` this bench was built with), `BENCH_BASELINE_BIN`, `BENCH_ROUNDS` (default 1), `BENCH_RUNS`
//! (default 10000), `BENCH_INFLIGHT` (default 64), `BENCH_CONNECTIONS` (default 8),
//! `BENCH_IDLE_SECS` (default 3), `BENCH_SETTLE_SECS` (comma-separated, default `1,15`),
//! `BENCH_DATABASE_URL` (an admin `postgres://` URL: each server gets a fresh database, dropped after),
//! `BENCH_LOG` (the server's log filter, default `warn`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

use server_process::{Footprint, Target, cpu_secs, one_run};

/// The goals of #32 on the 2-core machine, MiB of VmRSS.
const IDLE_GOAL_MIB: f64 = 24.0;
const AFTER_GOAL_MIB: f64 = 40.0;

/// What one server showed.
struct Reading {
    idle: Footprint,
    /// One per settle delay.
    after: Vec<Footprint>,
    runs_per_sec: f64,
    cpu_ms_per_run: f64,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs exactly `runs` one-step runs, `inflight` at a time; returns how long they took.
async fn burst(channels: &[Channel], runs: usize, inflight: usize) -> anyhow::Result<Duration> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..inflight.min(runs) {
        let client = RunServiceClient::new(channels[i % channels.len()].clone());
        let next = next.clone();
        tasks.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                one_run(client.clone(), 1).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed())
}

fn measure(runtime: &tokio::runtime::Runtime, bin: &str, settle: &[f64]) -> anyhow::Result<Reading> {
    let runs: usize = env_or("BENCH_RUNS", "10000").parse()?;
    let inflight: usize = env_or("BENCH_INFLIGHT", "64").parse()?;
    let connections: usize = env_or("BENCH_CONNECTIONS", "8").parse()?;
    let idle_secs: f64 = env_or("BENCH_IDLE_SECS", "3").parse()?;
    if runs == 0 || inflight == 0 || connections == 0 {
        bail!("BENCH_RUNS, BENCH_INFLIGHT and BENCH_CONNECTIONS must be positive");
    }
    let db = runtime.block_on(services::database())?;
    let target = Target::start(bin, "all", &services::url(&db), &[1])?;
    std::thread::sleep(Duration::from_secs_f64(idle_secs));
    let idle = Footprint::read(target.pid)?;
    let channels = runtime.block_on(target.channels(connections))?;
    let cpu0 = cpu_secs(target.pid)?;
    let took = runtime.block_on(burst(&channels, runs, inflight))?;
    let cpu = cpu_secs(target.pid)? - cpu0;
    // The client's connections stay open while the server settles, as a client's would.
    let ended = Instant::now();
    let mut after = Vec::new();
    for &secs in settle {
        let at = ended + Duration::from_secs_f64(secs);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        after.push(Footprint::read(target.pid)?);
    }
    drop(channels);
    target.stop()?;
    drop(db);
    Ok(Reading { idle, after, runs_per_sec: runs as f64 / took.as_secs_f64(), cpu_ms_per_run: cpu * 1e3 / runs as f64 })
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn print(label: &str, r: &Reading) {
    let f = |p: &Footprint| format!("{:>7.1} {:>7.1} {:>4}", mib(p.rss_kib), mib(p.anon_kib), p.threads);
    let mut line = format!("{label:<9} | {} |", f(&r.idle));
    for after in &r.after {
        line.push_str(&format!(" {} |", f(after)));
    }
    line.push_str(&format!(" {:>7.0} {:>7.3}", r.runs_per_sec, r.cpu_ms_per_run));
    println!("{line}");
}

fn main() -> anyhow::Result<()> {
    let bin = env_or("ANTLER_BIN", env!("CARGO_BIN_EXE_antler"));
    let baseline = std::env::var("BENCH_BASELINE_BIN").ok();
    let rounds: usize = env_or("BENCH_ROUNDS", "1").parse()?;
    let settle: Vec<f64> = env_or("BENCH_SETTLE_SECS", "1,15").split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?;
    if settle.is_empty() || rounds == 0 {
        bail!("BENCH_SETTLE_SECS needs at least one delay and BENCH_ROUNDS must be positive");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    println!(
        "footprint: `antler up` idle and after {} one-step lead runs at {} in flight (replay model, {}), server `{bin}`{}",
        env_or("BENCH_RUNS", "10000"),
        env_or("BENCH_INFLIGHT", "64"),
        if std::env::var("BENCH_DATABASE_URL").is_ok() { "PostgreSQL" } else { "SQLite" },
        baseline.as_deref().map(|b| format!(", baseline `{b}`")).unwrap_or_default()
    );
    let mut header = format!("{:<9} | {:>20} |", "server", "idle: RSS anon thr");
    for secs in &settle {
        header.push_str(&format!(" {:>20} |", format!("+{secs}s: RSS anon thr")));
    }
    header.push_str(&format!(" {:>7} {:>7}", "runs/s", "cpu ms"));
    println!("{header}");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        if let Some(base) = &baseline {
            let r = measure(&runtime, base, &settle)?;
            print("baseline", &r);
            theirs.push(r);
        }
        let r = measure(&runtime, &bin, &settle)?;
        print("this", &r);
        ours.push(r);
    }
    println!("(RSS and anon in MiB: VmRSS and its RssAnon part; thr: threads; cpu ms: server CPU per run during the burst)");
    let median = |rs: &[Reading], pick: &dyn Fn(&Reading) -> f64| {
        let mut v: Vec<f64> = rs.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        services::percentile(&v, 0.5)
    };
    let last = settle.len() - 1;
    let idle = median(&ours, &|r| mib(r.idle.rss_kib));
    let after = median(&ours, &|r| mib(r.after[last].rss_kib));
    println!(
        "this server, median of {rounds}: idle {idle:.1} MiB (goal < {IDLE_GOAL_MIB} MiB: {}), +{}s after the burst {after:.1} MiB (goal < {AFTER_GOAL_MIB} MiB: {})",
        if idle < IDLE_GOAL_MIB { "met" } else { "missed" },
        settle[last],
        if after < AFTER_GOAL_MIB { "met" } else { "missed" },
    );
    if !theirs.is_empty() {
        let base_idle = median(&theirs, &|r| mib(r.idle.rss_kib));
        let base_after = median(&theirs, &|r| mib(r.after[last].rss_kib));
        println!(
            "against the baseline: idle {:.2}x ({base_idle:.1} MiB), after the burst {:.2}x ({base_after:.1} MiB), runs/s {:.2}x",
            idle / base_idle,
            after / base_after,
            median(&ours, &|r| r.runs_per_sec) / median(&theirs, &|r| r.runs_per_sec)
        );
    }
    Ok(())
}
