//! The `antler` binary as a server in a process of its own, for the benchmarks that measure the
//! server from outside (`run_throughput`, `footprint`): started with a generated config (lead agent, the
//! `replay` model, SQLite under a temporary data dir or a given database), its CPU and memory read
//! from `/proc/<pid>`, its metrics scraped, and lead runs driven over gRPC.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CreateRunRequest, RunConfig, RunStatus, StreamRunRequest};
use anyhow::{Context, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// Model turns per run for each shape; the model is named after it (`turns1`, `turns10`).
pub fn models_yaml(shapes: &[usize]) -> String {
    let mut out = String::from("models:\n");
    for &turns in shapes {
        let mut script = String::new();
        for i in 0..turns.saturating_sub(1) {
            script.push_str(&format!(
                "          - tool_calls:\n              - {{id: t{i}, name: write_todos, arguments: {{todos: [{{content: \"step {i}\", status: completed}}]}}}}\n            usage: {{input_tokens: 100, output_tokens: 10}}\n"
            ));
        }
        script.push_str("          - text: done\n            usage: {input_tokens: 100, output_tokens: 1}\n");
        out.push_str(&format!(
            "  - name: turns{turns}\n    provider: replay\n    replay:\n      chunk_chars: 65536\n      after_last: cycle\n      turns:\n{script}"
        ));
    }
    out
}

/// Steps of a run of `turns` model turns: each turn but the last also has a tool round.
pub fn steps_of(turns: usize) -> usize {
    2 * turns - 1
}

/// One server under test.
pub struct Target {
    pub addr: String,
    pub pid: u32,
    pub metrics: Option<String>,
    child: Option<Child>,
    _dir: Option<tempfile::TempDir>,
}

impl Target {
    pub fn start(bin: &str, cpus: &str, database_url: &str, shapes: &[usize]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("antler.yaml");
        // The server's log (to this process's stderr): `BENCH_LOG`, `warn` unless set (`info` is what
        // `antler up` logs by default).
        let log = std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".to_owned());
        let yaml = format!(
            "server:\n  shutdown_grace_secs: 2\n  reload_interval_ms: 0\n  concurrency_limit: 100000\n  metrics:\n    listen: 127.0.0.1:0\n  log:\n    filter: {log:?}\n\
             runs:\n  agent: lead\n  drain_secs: 0\n  max_concurrent_runs: 1000\n  max_streams: 100000\n  max_streams_per_user: 100000\n  database:\n    url: {database_url:?}\n\
             sandbox:\n  provider: local\n{}",
            models_yaml(shapes)
        );
        std::fs::write(&config, yaml)?;
        let data = dir.path().join("data");
        let mut command = if cpus == "all" {
            Command::new(bin)
        } else {
            let mut taskset = Command::new("taskset");
            taskset.args(["-c", cpus, bin]);
            taskset
        };
        command
            .args(["up", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().with_context(|| format!("starting {bin}"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let (mut addr, mut metrics) = (None, None);
        while addr.is_none() || metrics.is_none() {
            let line = lines.next().ok_or_else(|| anyhow!("antler up exited before it listened"))??;
            if let Some(a) = line.split(" listening on ").nth(1) {
                addr = Some(a.trim().to_owned());
            } else if let Some(url) = line.trim().strip_prefix("metrics:") {
                metrics = Some(url.trim().trim_start_matches("http://").trim_end_matches("/metrics").to_owned());
            }
        }
        // Keep reading (and dropping) stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let pid = child.id();
        Ok(Self { addr: addr.unwrap_or_default(), pid, metrics, child: Some(child), _dir: Some(dir) })
    }

    /// `n` connections to the server.
    pub async fn channels(&self, n: usize) -> anyhow::Result<Vec<Channel>> {
        let mut channels = Vec::new();
        for _ in 0..n {
            channels.push(tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))?.connect().await?);
        }
        Ok(channels)
    }

    pub fn existing() -> anyhow::Result<Option<Self>> {
        let Ok(addr) = std::env::var("BENCH_ADDR") else { return Ok(None) };
        let pid = std::env::var("BENCH_SERVER_PID").context("BENCH_ADDR needs BENCH_SERVER_PID")?.parse()?;
        Ok(Some(Self { addr, pid, metrics: std::env::var("BENCH_METRICS").ok(), child: None, _dir: None }))
    }

    pub fn stop(mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            // SIGTERM: a graceful stop, so the data dir can go.
            unsafe_free_kill(child.id());
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    child.kill()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}

/// SIGTERM through the `kill` command (the workspace forbids `unsafe`, and `libc::kill` is).
fn unsafe_free_kill(pid: u32) {
    let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
}

/// CPU seconds a process (all its threads) has used: utime + stime from `/proc/<pid>/stat`.
pub fn cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    Ok((ticks(11) + ticks(12)) / clock_ticks())
}

/// `getconf CLK_TCK` (100 on Linux almost always).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The sum of every sample of `name` (all label sets) in a Prometheus text scrape.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

pub async fn scrape(addr: &Option<String>) -> anyhow::Result<String> {
    let Some(addr) = addr else { return Ok(String::new()) };
    let mut stream = tokio::net::TcpStream::connect(addr.as_str()).await?;
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

pub async fn one_run(mut client: RunServiceClient<Channel>, turns: usize) -> anyhow::Result<Duration> {
    let create = CreateRunRequest {
        input: vec![Message {
            role: Role::User as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "go".to_owned() })) }],
            ..Message::default()
        }],
        config: Some(RunConfig { model_name: format!("turns{turns}"), plan_mode: turns > 1, ..Default::default() }),
        ..CreateRunRequest::default()
    };
    let started = Instant::now();
    let mut stream = client.stream_run(StreamRunRequest { create: Some(create) }).await?.into_inner();
    let mut status = RunStatus::Unspecified;
    while let Some(item) = stream.next().await {
        if let Some(Kind::End(end)) = item?.event.and_then(|e| e.kind) {
            status = end.status();
        }
    }
    if status != RunStatus::Success {
        bail!("a run ended {status:?}");
    }
    Ok(started.elapsed())
}

/// A process's memory and threads, from `/proc/<pid>/status`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Footprint {
    /// Resident set (VmRSS), KiB.
    pub rss_kib: u64,
    /// Its anonymous part (RssAnon: heaps, stacks), KiB; the rest is the binary's and libraries' pages.
    pub anon_kib: u64,
    pub threads: u64,
}

impl Footprint {
    pub fn read(pid: u32) -> anyhow::Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            let line = status.lines().find_map(|l| l.strip_prefix(name)).ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))?;
            Ok(line.trim().trim_end_matches("kB").trim().parse()?)
        };
        Ok(Self { rss_kib: field("VmRSS:")?, anon_kib: field("RssAnon:")?, threads: field("Threads:")? })
    }
}
