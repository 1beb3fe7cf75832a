//! What TLS costs: the kit's server stack serving `grpc.health.v1.Health/Check`, once in plaintext and
//! once over TLS (`server.tls`, the kit's acceptor), measured in the same run, with the kit's own client
//! TLS (what the services use between themselves) on the other side.
//!
//! * connection set-up: a new channel (TCP connect, for TLS the handshake, the HTTP/2 preface) plus its
//!   first call, p50/p99, at 1 and 16 connecting at once. Two TLS cases: a full handshake (every
//!   connection from a fresh client configuration) and a resumed one (one client configuration, whose
//!   session cache lets later connections resume, as a service's reconnects do). Also the server side's
//!   CPU time per connection;
//! * per call: unary calls on established channels, p50/p99 and calls per second, at 1 and 16 in flight,
//!   plaintext vs TLS, with the ratio.
//!
//! Certificates: an ECDSA P-256 CA and leaf from rcgen (the key type sets the handshake's signature cost;
//! RSA-2048 signs more slowly). TLS 1.3, aws-lc-rs.
//!
//! Run: `cargo bench -p antler-integration-tests --bench tls_overhead` (release build; about a minute).
//! Environment: `BENCH_CONNECTIONS` (per case and concurrency, default 400), `BENCH_CALLS` (per round at
//! c=1; ×4 at c=16; default 4000).
//!
//! The servers run on one tokio runtime, the load generator on another (threads named apart, so CPU is
//! counted per side), both in this process on the machine's cores.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use antler_integration_tests::percentile::percentile;
use antler_integration_tests::tls::{Ca, LOCAL_NAMES, client};
use antler_kit::auth::AuthConfig;
use antler_kit::config::ServerConfig;
use antler_kit::tls::{ClientTls, ServerTls, ServerTlsConfig};
use antler_kit::{Authenticator, ServiceSet};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const SERVER_THREADS: &str = "bench-server";
const CLIENT_THREADS: &str = "bench-client";
const CHANNELS: usize = 4;
const ROUNDS: usize = 5;

/// User + system CPU time so far of this process's threads whose name starts with `prefix`.
fn cpu_time_of(prefix: &str) -> Duration {
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        if !head.split_once('(').is_some_and(|(_, name)| name.starts_with(prefix)) {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += [11, 12].iter().filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok())).sum::<u64>();
    }
    Duration::from_millis(ticks * 10)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A kit server with health only, over `tls` when given.
async fn server(tls: Option<ServerTls>, shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let config = ServerConfig { listen: SocketAddr::from(([127, 0, 0, 1], 0)), concurrency_limit: 100_000, ..ServerConfig::default() };
    let auth = Authenticator::new(&AuthConfig::default())?;
    let listener = antler_kit::server::bind(&config, &auth).await?;
    let addr = listener.local_addr()?;
    let set = ServiceSet::new(&config);
    tokio::spawn(async move { antler_kit::server::serve_with_tls(listener, set, &config, auth, tls, shutdown).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(addr)
}

/// How a benchmark client connects.
#[derive(Clone)]
enum Dial {
    Plain(SocketAddr),
    Tls(SocketAddr, ClientTls),
}

impl Dial {
    async fn connect(&self) -> anyhow::Result<Channel> {
        Ok(match self {
            Dial::Plain(addr) => Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true).connect().await?,
            Dial::Tls(addr, tls) => tls.connect(Endpoint::from_shared(format!("https://{addr}"))?).await?,
        })
    }
}

async fn call(channel: Channel) -> anyhow::Result<()> {
    HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await?;
    Ok(())
}

struct Figures {
    p50: Duration,
    p99: Duration,
    per_second: f64,
}

fn figures(mut all: Vec<Duration>, elapsed: Duration) -> Figures {
    all.sort();
    let pct = |p: f64| percentile(&all, p).unwrap_or_default();
    Figures { p50: pct(0.50), p99: pct(0.99), per_second: all.len() as f64 / elapsed.as_secs_f64() }
}

/// `total` new connections plus their first call, `concurrency` at once; `dials` yields the dialer of
/// each connection (a fresh client configuration each for full handshakes). Also the server-side CPU
/// per connection.
async fn connections(dials: Vec<Dial>, concurrency: usize) -> anyhow::Result<(Figures, Duration)> {
    let total = dials.len();
    let cpu_before = cpu_time_of(SERVER_THREADS);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let mut dials = dials.into_iter();
    for _ in 0..concurrency {
        let mine: Vec<Dial> = dials.by_ref().take(total / concurrency).collect();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(mine.len());
            for dial in mine {
                let t = Instant::now();
                let channel = dial.connect().await?;
                call(channel.clone()).await?;
                latencies.push(t.elapsed());
                drop(channel);
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::with_capacity(total);
    for task in tasks {
        all.extend(task.await??);
    }
    let elapsed = started.elapsed();
    let cpu = (cpu_time_of(SERVER_THREADS).saturating_sub(cpu_before)).checked_div(all.len() as u32).unwrap_or_default();
    Ok((figures(all, elapsed), cpu))
}

async fn calls(channels: &[Channel], concurrency: usize, total: usize) -> anyhow::Result<Figures> {
    let per_task = total / concurrency;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let channel = channels[task % channels.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t = Instant::now();
                call(channel.clone()).await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::with_capacity(total);
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(figures(all, started.elapsed()))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn bench(plain: SocketAddr, tls: SocketAddr, ca: &Ca) -> anyhow::Result<()> {
    let n = env_usize("BENCH_CONNECTIONS", 400);
    let base_calls = env_usize("BENCH_CALLS", 4000);
    let shared = client(Some(&ca.cert), None, None)?;

    println!("connection set-up (new channel + first Health/Check), {n} per row");
    println!("{:<20} {:>3} {:>10} {:>10} {:>10} {:>14}", "case", "c", "p50 µs", "p99 µs", "conn/s", "server CPU µs");
    for concurrency in [1usize, 16] {
        // Warm up each path (code paths, allocator, the resumption cache of `shared`).
        connections(vec![Dial::Plain(plain); 32], concurrency.min(32)).await?;
        connections(vec![Dial::Tls(tls, shared.clone()); 32], concurrency.min(32)).await?;
        let mut full = Vec::with_capacity(n);
        for _ in 0..n {
            full.push(Dial::Tls(tls, client(Some(&ca.cert), None, None)?));
        }
        let rows = [
            ("plaintext", connections(vec![Dial::Plain(plain); n], concurrency).await?),
            ("tls full", connections(full, concurrency).await?),
            ("tls resumed", connections(vec![Dial::Tls(tls, shared.clone()); n], concurrency).await?),
        ];
        for (name, (f, cpu)) in &rows {
            println!("{name:<20} {concurrency:>3} {:>10.0} {:>10.0} {:>10.0} {:>14.0}", us(f.p50), us(f.p99), f.per_second, us(*cpu));
        }
        let (p, _) = &rows[0].1;
        for (name, (f, _)) in &rows[1..] {
            println!(
                "{:<20} {concurrency:>3} {:>+10.0} {:>+10.0}   (added by TLS, µs)",
                format!("{name} - plain"),
                us(f.p50) - us(p.p50),
                us(f.p99) - us(p.p99)
            );
        }
    }

    println!("\nper call (Health/Check on {CHANNELS} established channels), median of {ROUNDS} alternating rounds");
    println!(
        "{:<10} {:>3} {:>10} {:>10} {:>10}   {:>8} {:>8} {:>8}",
        "case", "c", "p50 µs", "p99 µs", "calls/s", "p50 ×", "p99 ×", "rate ×"
    );
    let mut plain_channels = Vec::new();
    let mut tls_channels = Vec::new();
    for _ in 0..CHANNELS {
        plain_channels.push(Dial::Plain(plain).connect().await?);
        tls_channels.push(Dial::Tls(tls, shared.clone()).connect().await?);
    }
    for (concurrency, total) in [(1usize, base_calls), (16, base_calls * 4)] {
        calls(&plain_channels, concurrency, total / 4).await?;
        calls(&tls_channels, concurrency, total / 4).await?;
        let mut rounds = Vec::new();
        for _ in 0..ROUNDS {
            let p = calls(&plain_channels, concurrency, total).await?;
            let t = calls(&tls_channels, concurrency, total).await?;
            rounds.push((p, t));
        }
        // The median round by the p50 ratio: client and servers share the machine's cores, so single
        // rounds swing either way.
        rounds.sort_by(|a, b| (a.1.p50.as_secs_f64() / a.0.p50.as_secs_f64()).total_cmp(&(b.1.p50.as_secs_f64() / b.0.p50.as_secs_f64())));
        let (p, t) = &rounds[ROUNDS / 2];
        for (name, f) in [("plaintext", p), ("tls", t)] {
            println!("{name:<10} {concurrency:>3} {:>10.1} {:>10.1} {:>10.0}", us(f.p50), us(f.p99), f.per_second);
        }
        println!(
            "{:<10} {concurrency:>3} {:>10} {:>10} {:>10}   {:>8.3} {:>8.3} {:>8.3}",
            "ratio",
            "",
            "",
            "",
            t.p50.as_secs_f64() / p.p50.as_secs_f64(),
            t.p99.as_secs_f64() / p.p99.as_secs_f64(),
            t.per_second / p.per_second
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let server_runtime = tokio::runtime::Builder::new_multi_thread().thread_name(SERVER_THREADS).enable_all().build()?;
    let client_runtime = tokio::runtime::Builder::new_multi_thread().thread_name(CLIENT_THREADS).enable_all().build()?;
    let ca = Ca::new("bench CA")?;
    let leaf = ca.issue("server", &LOCAL_NAMES)?;
    let shutdown = CancellationToken::new();
    let (plain, tls) = server_runtime.block_on(async {
        let config = ServerTlsConfig { cert: leaf.cert.clone(), key: leaf.key.clone(), ..ServerTlsConfig::default() };
        let tls = ServerTls::load(&config, Duration::ZERO, None)?;
        let plain = server(None, shutdown.clone()).await?;
        let tls = server(tls, shutdown.clone()).await?;
        anyhow::Ok((plain, tls))
    })?;
    let result = client_runtime.block_on(bench(plain, tls, &ca));
    shutdown.cancel();
    result
}
