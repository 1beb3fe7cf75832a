//! What the sandbox service's common operations cost, over gRPC, in one process. Prints p50/p99 per
//! operation:
//!
//! * ExecuteCommand(`true`) round trip, local provider and bwrap provider (goals: p50 < 5 ms local,
//!   < 15 ms bwrap on 2 cores);
//! * ReadFile and WriteFile of 4 KiB;
//! * AcquireSandbox of a new thread;
//! * Grep over a generated ~100 MB tree, against `rg` (if installed) or `grep -r` on the same tree in the
//!   same run (goal: at most 2x the baseline).
//!
//! The first four run twice: through the kit's server stack (auth on; the production path) and on bare
//! tonic with TCP_NODELAY on accepted connections, which isolates the service's own cost from the
//! transport (the kit's listener leaves Nagle's algorithm on, which can add a delayed-ACK wait to small
//! responses).
//!
//! Run: `cargo bench -p antler-sandbox --bench sandbox_ops` (release build; about a minute once built).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use antler_kit::{Authenticator, Config, ServiceSet};
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::sandbox_service_server::SandboxServiceServer;
use antler_proto::sandbox::*;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const KEY: &str = "bench-api-key-0123456789";

/// Which server stack answers: the kit's (auth, trace, limits; the production path) or bare tonic with
/// TCP_NODELAY on accepted connections (the service's own cost, without the transport).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stack {
    Kit,
    Bare,
}

async fn server(dir: &std::path::Path, sandbox_yaml: &str, stack: Stack, shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:0\n  data_dir: {}\n  reload_interval_ms: 0\n  auth:\n    enabled: true\n    api_keys:\n      - key: {KEY}\n        user: bench\nsandbox:\n  {sandbox_yaml}\n",
        dir.display()
    );
    let config = Config::parse(&yaml, "bench.yaml", &|_| None)?;
    let build = (config.clone(), shutdown.clone());
    let sandboxes =
        tokio::task::spawn_blocking(move || antler_sandbox::build(&build.0, build.1)).await?.map_err(|e| anyhow::anyhow!("{e}"))?;
    sandboxes.spawn_background(shutdown.clone());
    let api = antler_sandbox::api::SandboxApi::new(sandboxes);
    let addr = match stack {
        Stack::Kit => {
            let auth = Authenticator::new(&config.server.auth)?;
            let listener = antler_kit::server::bind(&config.server, &auth).await?;
            let addr = listener.local_addr()?;
            let mut set = ServiceSet::new(&config.server);
            set.describe(antler_proto::FILE_DESCRIPTOR_SET);
            antler_kit::add_service!(set, SandboxServiceServer::new(api));
            let server_config = config.server.clone();
            tokio::spawn(async move { antler_kit::server::serve(listener, set, &server_config, auth, shutdown).await });
            addr
        }
        Stack::Bare => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            // The kit's auth layer is what puts the caller's identity on a request; stand in for it.
            let service = SandboxServiceServer::with_interceptor(api, |mut request: tonic::Request<()>| {
                request.extensions_mut().insert(antler_kit::Identity::local("bench"));
                Ok(request)
            });
            let server =
                tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned());
            tokio::spawn(server);
            addr
        }
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(addr)
}

fn req<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = format!("Bearer {KEY}").parse() {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

struct Figures {
    p50: Duration,
    p99: Duration,
    n: usize,
}

fn figures(mut samples: Vec<Duration>) -> Figures {
    samples.sort();
    let pick = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    Figures { p50: pick(0.50), p99: pick(0.99), n: samples.len() }
}

fn print(name: &str, f: &Figures, goal: &str) {
    println!("{name:<44} {:>9.2} {:>9.2} {:>6}   {goal}", ms(f.p50), ms(f.p99), f.n);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn exec_true(client: &mut SandboxServiceClient<Channel>, thread: &str) -> anyhow::Result<()> {
    let mut stream = client
        .execute_command(req(ExecuteCommandRequest { thread_id: thread.into(), command: "true".into(), ..Default::default() }))
        .await?
        .into_inner();
    let mut exit = None;
    while let Some(message) = stream.message().await? {
        if let Some(execute_command_response::Event::Exit(e)) = message.event {
            exit = Some(e);
        }
    }
    match exit {
        Some(e) if e.exit_code == 0 => Ok(()),
        other => anyhow::bail!("`true` did not exit 0: {other:?}"),
    }
}

async fn bench_exec(client: &mut SandboxServiceClient<Channel>, thread: &str, n: usize) -> anyhow::Result<Figures> {
    client.acquire_sandbox(req(AcquireSandboxRequest { thread_id: thread.into() })).await?;
    for _ in 0..20 {
        exec_true(client, thread).await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        exec_true(client, thread).await?;
        samples.push(t.elapsed());
    }
    Ok(figures(samples))
}

/// Writes a tree of text files totalling about `total` bytes, with a needle every so often.
fn generate_tree(root: &std::path::Path, total: usize) -> anyhow::Result<usize> {
    let words =
        ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "lambda", "sigma", "omega", "function", "return", "struct", "impl"];
    let file_size = 100 * 1024;
    let files = total / file_size;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut needles = 0;
    for i in 0..files {
        let dir = root.join(format!("dir{:02}/sub{:02}", i % 20, (i / 20) % 5));
        std::fs::create_dir_all(&dir)?;
        let mut text = String::with_capacity(file_size + 100);
        let mut line = 0;
        while text.len() < file_size {
            line += 1;
            for _ in 0..10 {
                text.push_str(words[rng.usize(..words.len())]);
                text.push(' ');
            }
            if (i * 1000 + line) % 5003 == 0 {
                text.push_str("needle_42");
                needles += 1;
            }
            text.push('\n');
        }
        std::fs::write(dir.join(format!("file{i:04}.txt")), text)?;
    }
    Ok(needles)
}

async fn connect(addr: SocketAddr) -> anyhow::Result<SandboxServiceClient<Channel>> {
    Ok(SandboxServiceClient::new(Channel::from_shared(format!("http://{addr}"))?.tcp_nodelay(true).connect().await?))
}

/// ExecuteCommand, WriteFile, ReadFile and AcquireSandbox on one server stack.
async fn bench_stack(dir: &std::path::Path, stack: Stack, bwrap_ok: bool, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let label = match stack {
        Stack::Kit => "kit server",
        Stack::Bare => "bare+nodelay",
    };
    let local_addr = server(&dir.join("local"), "{provider: local, allow_host_bash: true}", stack, shutdown.clone()).await?;
    let mut local = connect(local_addr).await?;
    print(&format!("ExecuteCommand(true) local [{label}]"), &bench_exec(&mut local, "exec", 300).await?, "p50 < 5 ms");
    if bwrap_ok {
        let addr = server(&dir.join("bwrap"), "{provider: bwrap}", stack, shutdown.clone()).await?;
        let mut bwrap = connect(addr).await?;
        print(&format!("ExecuteCommand(true) bwrap [{label}]"), &bench_exec(&mut bwrap, "exec", 300).await?, "p50 < 15 ms");
    }
    local.acquire_sandbox(req(AcquireSandboxRequest { thread_id: "files".into() })).await?;
    let body = "0123456789abcdef".repeat(256);
    let write = |i: usize| WriteFileRequest {
        thread_id: "files".into(),
        path: format!("f{}.txt", i % 64),
        content: Some(write_file_request::Content::Text(body.clone())),
        append: false,
    };
    let mut samples = Vec::new();
    for i in 0..2000 {
        let t = Instant::now();
        local.write_file(req(write(i))).await?;
        samples.push(t.elapsed());
    }
    print(&format!("WriteFile 4 KiB [{label}]"), &figures(samples.split_off(200)), "");
    let mut samples = Vec::new();
    for i in 0..2000 {
        let t = Instant::now();
        let read = local
            .read_file(req(ReadFileRequest { thread_id: "files".into(), path: format!("f{}.txt", i % 64), ..Default::default() }))
            .await?;
        anyhow::ensure!(read.into_inner().content.len() == 4096, "short read");
        samples.push(t.elapsed());
    }
    print(&format!("ReadFile 4 KiB [{label}]"), &figures(samples.split_off(200)), "");
    let mut samples = Vec::new();
    for i in 0..300 {
        let t = Instant::now();
        let out = local.acquire_sandbox(req(AcquireSandboxRequest { thread_id: format!("new-{i}") })).await?.into_inner();
        anyhow::ensure!(out.created, "not a new thread");
        samples.push(t.elapsed());
    }
    print(&format!("AcquireSandbox new thread [{label}]"), &figures(samples), "");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").with_writer(std::io::sink).init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let dir = tempfile::tempdir()?;
        // bwrap may run as an unprivileged user that must traverse to the data directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let shutdown = CancellationToken::new();
        let bwrap_refused = std::process::Command::new("bwrap")
            .args(["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"])
            .output()
            .map(|o| (!o.status.success()).then(|| String::from_utf8_lossy(&o.stderr).trim().to_owned()))
            .unwrap_or_else(|e| Some(e.to_string()));
        if let Some(why) = &bwrap_refused {
            println!("bwrap figures skipped: bwrap cannot run here ({why})");
        }

        println!("{:<44} {:>9} {:>9} {:>6}   goal", "operation", "p50 ms", "p99 ms", "n");
        bench_stack(&dir.path().join("kit"), Stack::Kit, bwrap_refused.is_none(), &shutdown).await?;
        bench_stack(&dir.path().join("bare"), Stack::Bare, bwrap_refused.is_none(), &shutdown).await?;

        // Grep over ~100 MB, through the production stack.
        let addr = server(&dir.path().join("grep"), "{provider: local}", Stack::Kit, shutdown.clone()).await?;
        let mut local = connect(addr).await?;
        local.acquire_sandbox(req(AcquireSandboxRequest { thread_id: "grep".into() })).await?;
        let tree = dir.path().join("grep/sandbox/users/bench/threads/grep/user-data/workspace");
        let needles = generate_tree(&tree, 100 * 1024 * 1024)?;
        let grep = || GrepRequest { thread_id: "grep".into(), pattern: "needle_[0-9]+".into(), max_results: 500, ..Default::default() };
        let (baseline_name, baseline): (&str, Vec<&str>) = if std::process::Command::new("rg").arg("--version").output().is_ok() {
            ("rg", vec!["rg", "-n", "--no-ignore", "--hidden", "needle_[0-9]+"])
        } else {
            ("grep -rnE", vec!["grep", "-rnE", "needle_[0-9]+"])
        };
        let run_baseline = || -> anyhow::Result<(Duration, usize)> {
            let t = Instant::now();
            let output = std::process::Command::new(baseline[0]).args(&baseline[1..]).arg(&tree).output()?;
            Ok((t.elapsed(), String::from_utf8_lossy(&output.stdout).lines().count()))
        };
        // Warm the page cache for both, then alternate.
        run_baseline()?;
        local.grep(req(grep())).await?;
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        let mut found = (0, 0);
        for _ in 0..7 {
            let t = Instant::now();
            let out = local.grep(req(grep())).await?.into_inner();
            ours.push(t.elapsed());
            found.0 = out.matches.len();
            let (elapsed, lines) = run_baseline()?;
            theirs.push(elapsed);
            found.1 = lines;
        }
        anyhow::ensure!(
            found.0 == needles && found.1 == needles,
            "match counts differ: ours {} baseline {} expected {needles}",
            found.0,
            found.1
        );
        let (ours, theirs) = (figures(ours), figures(theirs));
        print("Grep ~100 MB, 1000 files (Antler)", &ours, "");
        print(&format!("Grep ~100 MB, 1000 files ({baseline_name})"), &theirs, "");
        println!("Grep ratio Antler / {baseline_name} (p50): {:.2}x (goal <= 2x); {needles} matching lines", ms(ours.p50) / ms(theirs.p50));
        shutdown.cancel();
        anyhow::Ok(())
    })
}
