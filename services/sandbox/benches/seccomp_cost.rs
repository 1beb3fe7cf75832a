//! What the seccomp filter (`sandbox.seccomp: strict`) adds to a bwrap command, measured against the same
//! server with `sandbox.seccomp: off` in the same run: ExecuteCommand round trips of `true` (bwrap,
//! prlimit and the shell) and of `bash -c true` (one more program started under the filter), the two
//! servers called in alternation so that drift in the machine's load falls on both alike.
//!
//! Run: `cargo bench -p antler-sandbox --bench seccomp_cost` (release build). `ANTLER_SECCOMP_BENCH_N`
//! sets the round trips per command and mode (default 400).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use antler_kit::Config;
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::sandbox_service_server::SandboxServiceServer;
use antler_proto::sandbox::*;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// A sandbox server on bare tonic (no auth layer: the identity is set by an interceptor), so the figures
/// hold the service's and the sandbox's cost and little else.
async fn server(dir: &std::path::Path, seccomp: &str, shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:0\n  data_dir: {}\n  reload_interval_ms: 0\nsandbox:\n  provider: bwrap\n  seccomp: {seccomp}\n  uploads:\n    auto_convert_documents: false\n",
        dir.display()
    );
    let config = Config::parse(&yaml, "bench.yaml", &|_| None)?;
    let build = (config.clone(), shutdown.clone());
    let sandboxes =
        tokio::task::spawn_blocking(move || antler_sandbox::build(&build.0, build.1)).await?.map_err(|e| anyhow::anyhow!("{e}"))?;
    sandboxes.spawn_background(shutdown.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let service =
        SandboxServiceServer::with_interceptor(antler_sandbox::api::SandboxApi::new(sandboxes), |mut request: tonic::Request<()>| {
            request.extensions_mut().insert(antler_kit::Identity::local("bench"));
            Ok(request)
        });
    tokio::spawn(
        tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned()),
    );
    Ok(addr)
}

async fn connect(addr: SocketAddr) -> anyhow::Result<SandboxServiceClient<Channel>> {
    for _ in 0..50 {
        if let Ok(channel) = Channel::from_shared(format!("http://{addr}"))?.tcp_nodelay(true).connect().await {
            let mut client = SandboxServiceClient::new(channel);
            client.acquire_sandbox(AcquireSandboxRequest { thread_id: "bench".into() }).await?;
            return Ok(client);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("cannot connect to {addr}")
}

/// One ExecuteCommand round trip; fails unless the command exits 0.
async fn run(client: &mut SandboxServiceClient<Channel>, command: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let request = ExecuteCommandRequest { thread_id: "bench".into(), command: command.into(), ..Default::default() };
    let mut stream = client.execute_command(request).await?.into_inner();
    let mut exit = None;
    while let Some(message) = stream.message().await? {
        if let Some(execute_command_response::Event::Exit(e)) = message.event {
            exit = Some(e);
        }
    }
    match exit {
        Some(e) if e.exit_code == 0 => Ok(started.elapsed()),
        other => anyhow::bail!("{command:?} did not exit 0: {other:?}"),
    }
}

struct Figures {
    p50: f64,
    p90: f64,
    mean: f64,
}

fn figures(mut samples: Vec<Duration>) -> Figures {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pick = |p: f64| ms(samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)]);
    let mean = samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len() as f64;
    Figures { p50: pick(0.50), p90: pick(0.90), mean }
}

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("ANTLER_SECCOMP_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let dir = tempfile::tempdir()?;
        // bwrap may run as an unprivileged user that must traverse to the data directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let shutdown = CancellationToken::new();
        let mut strict = connect(server(&dir.path().join("strict"), "strict", shutdown.clone()).await?).await?;
        let mut off = connect(server(&dir.path().join("off"), "off", shutdown.clone()).await?).await?;
        println!("{n} round trips per command and mode, alternating; milliseconds");
        println!(
            "{:<14} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10}",
            "command", "off p50", "p90", "mean", "strict p50", "p90", "mean", "added p50"
        );
        for command in ["true", "bash -c true"] {
            for _ in 0..20 {
                run(&mut strict, command).await?;
                run(&mut off, command).await?;
            }
            let (mut with, mut without) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for i in 0..n {
                // Alternate which goes first, so neither always runs right after the other.
                if i % 2 == 0 {
                    with.push(run(&mut strict, command).await?);
                    without.push(run(&mut off, command).await?);
                } else {
                    without.push(run(&mut off, command).await?);
                    with.push(run(&mut strict, command).await?);
                }
            }
            let (a, b) = (figures(without), figures(with));
            println!(
                "{command:<14} {:>8.2} {:>8.2} {:>8.2} {:>10.2} {:>8.2} {:>8.2} {:>+10.2}",
                a.p50,
                a.p90,
                a.mean,
                b.p50,
                b.p90,
                b.mean,
                b.p50 - a.p50
            );
        }
        shutdown.cancel();
        anyhow::Ok(())
    })
}
