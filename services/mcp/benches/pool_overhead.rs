//! What the pool costs and saves: server-everything's `echo` called over stdio and streamable HTTP
//!
//! * pooled: through McpService (`antler-mcp`, a separate process, over gRPC);
//! * floor: a direct rmcp client in this process that keeps one session open;
//! * unpooled: a direct rmcp client that opens a session per call (what a client without a pool pays);
//! * grpc-only (at 1 in flight): a GetPoolStats round trip to the same service, the gRPC hop's own cost;
//!
//! at 1 and 16 calls in flight, in one run, printing p50 / p99 / calls per second and the pooled p99
//! overhead over the floor (at 1 in flight the pooled and floor calls take turns, so both see the same
//! background load; calls/s is then per path's own time); then the pool's hit rate over the 10,000 pooled calls of each transport, and
//! the service's RSS per idle pooled session (200 streamable-HTTP sessions of 200 users: no child process
//! is counted, the servers run elsewhere).
//!
//! Run: `cargo bench -p antler-mcp --bench pool_overhead` (release build; needs `scripts/setup`'s tools under
//! `$ANTLER_TOOLS`). Environment: `BENCH_CALLS` (pooled and floor calls per transport and concurrency,
//! default 5000: 2 × 5000 = 10,000 pooled calls per transport), `BENCH_UNPOOLED` (calls of the
//! session-per-call client, default 40), `BENCH_SESSIONS` (idle sessions for the RSS figure, default 200).

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use antler_proto::mcp::mcp_service_client::McpServiceClient;
use antler_proto::mcp::{CallToolRequest, GetPoolStatsRequest};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tonic::transport::Channel;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type CallFn = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> + Send + Sync>;

const GOAL_OVERHEAD_P99: Duration = Duration::from_micros(500);
const GOAL_HIT_RATE: f64 = 0.999;
const GOAL_RSS_PER_SESSION: f64 = 64.0 * 1024.0;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn tools() -> PathBuf {
    std::env::var_os("ANTLER_TOOLS").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools"))
}

fn everything_js() -> Result<PathBuf, BoxError> {
    let path = tools().join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !path.exists() {
        return Err(format!("{} is missing; run scripts/setup", path.display()).into());
    }
    Ok(path)
}

/// Kills a child process when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start_everything_http() -> Result<(Guard, String), BoxError> {
    let port = free_port()?;
    let child = Command::new("node")
        .arg(everything_js()?)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("server-everything did not listen".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((Guard(child), format!("http://127.0.0.1:{port}/mcp")))
}

fn key(user: usize) -> String {
    format!("bench-key-{user:012}")
}

/// Starts antler-mcp with both servers and `users` API keys; returns it, its address and its pid.
fn start_service(dir: &Path, http_url: &str, users: usize) -> Result<(Guard, String, u32), BoxError> {
    let servers = serde_json::json!({"mcpServers": {
        "stdio": {"command": "node", "args": [everything_js()?, "stdio"]},
        "http": {"type": "http", "url": http_url},
    }});
    let extensions = dir.join("extensions_config.json");
    std::fs::write(&extensions, serde_json::to_string(&servers)?)?;
    let mut yaml = format!(
        "mcp:\n  extensions_config: {}\n  pool:\n    max_sessions: {}\nserver:\n  log:\n    filter: warn\n  auth:\n    enabled: true\n    api_keys:\n",
        extensions.display(),
        users + 16
    );
    for user in 0..users {
        yaml.push_str(&format!("      - key: {}\n        user: u{user}\n", key(user)));
    }
    let config = dir.join("antler.yaml");
    std::fs::write(&config, yaml)?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_antler-mcp"))
        .arg("--config")
        .arg(&config)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let guard = Guard(child);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(addr) = line.split(" listening on ").nth(1) {
            return Ok((guard, format!("http://{}", addr.trim()), pid));
        }
    }
    Err("antler-mcp exited before listening".into())
}

fn rss_bytes(pid: u32) -> Result<f64, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kib * 1024.0)
}

#[derive(Debug)]
struct Figures {
    p50: Duration,
    p99: Duration,
    per_sec: f64,
}

/// `calls` calls of `f`, `concurrency` at a time.
async fn measure(f: CallFn, concurrency: usize, calls: usize) -> Result<Figures, BoxError> {
    let per_task = calls.div_ceil(concurrency);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let f = f.clone();
        tasks.spawn(async move {
            let mut samples = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t = Instant::now();
                f().await?;
                samples.push(t.elapsed());
            }
            Ok::<_, BoxError>(samples)
        });
    }
    let mut all = Vec::with_capacity(calls);
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined??);
    }
    Ok(figures(all, started.elapsed()))
}

fn figures(mut samples: Vec<Duration>, wall: Duration) -> Figures {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Figures { p50: at(0.50), p99: at(0.99), per_sec: samples.len() as f64 / wall.as_secs_f64() }
}

/// One call in flight, the paths taking turns call by call, so that whatever else the machine does at a
/// moment weighs on each path alike.
async fn measure_interleaved(paths: &[CallFn], calls: usize) -> Result<Vec<Figures>, BoxError> {
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(calls); paths.len()];
    let mut spent = vec![Duration::ZERO; paths.len()];
    for _ in 0..calls {
        for (i, path) in paths.iter().enumerate() {
            let t = Instant::now();
            path().await?;
            let took = t.elapsed();
            samples[i].push(took);
            spent[i] += took;
        }
    }
    Ok(samples.into_iter().zip(spent).map(|(s, wall)| figures(s, wall)).collect())
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn echo_args() -> rmcp::model::JsonObject {
    let mut args = serde_json::Map::new();
    args.insert("message".into(), serde_json::Value::String("bench".into()));
    args
}

fn pooled(client: McpServiceClient<Channel>, tool: &'static str) -> CallFn {
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            let arguments = antler_kit::json::map_to_struct(&echo_args());
            let mut request =
                tonic::Request::new(CallToolRequest { tool_name: tool.into(), arguments: Some(arguments), ..CallToolRequest::default() });
            request.metadata_mut().insert("authorization", format!("Bearer {}", key(0)).parse()?);
            let response = client.call_tool(request).await?.into_inner();
            if response.is_error {
                return Err("tool error".into());
            }
            Ok(())
        })
    })
}

type Direct = Arc<rmcp::service::RunningService<rmcp::service::RoleClient, ()>>;

async fn connect(transport: &str, url: &str) -> Result<rmcp::service::RunningService<rmcp::service::RoleClient, ()>, BoxError> {
    Ok(match transport {
        "stdio" => {
            let mut command = tokio::process::Command::new("node");
            command.arg(everything_js()?).arg("stdio");
            let (transport, _) = TokioChildProcess::builder(command).stderr(Stdio::null()).spawn()?;
            ().serve(transport).await?
        }
        _ => ().serve(StreamableHttpClientTransport::from_uri(url.to_owned())).await?,
    })
}

/// A gRPC round trip to the same service that does no MCP work (GetPoolStats): the hop's own cost.
fn grpc_only(client: McpServiceClient<Channel>) -> CallFn {
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            let mut request = tonic::Request::new(GetPoolStatsRequest { server: "http".into() });
            request.metadata_mut().insert("authorization", format!("Bearer {}", key(0)).parse()?);
            client.get_pool_stats(request).await?;
            Ok(())
        })
    })
}

fn floor(session: Direct) -> CallFn {
    Arc::new(move || {
        let session = session.clone();
        Box::pin(async move {
            session.call_tool(CallToolRequestParams::new("echo").with_arguments(echo_args())).await?;
            Ok(())
        })
    })
}

fn unpooled(transport: &'static str, url: String) -> CallFn {
    Arc::new(move || {
        let url = url.clone();
        Box::pin(async move {
            let session = connect(transport, &url).await?;
            session.call_tool(CallToolRequestParams::new("echo").with_arguments(echo_args())).await?;
            session.cancel().await?;
            Ok(())
        })
    })
}

/// A single-threaded client: on two cores shared with the service and the servers, a second client thread
/// only adds cross-thread wake-ups to every path alike.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let calls = env_usize("BENCH_CALLS", 5000);
    let unpooled_calls = env_usize("BENCH_UNPOOLED", 40);
    let sessions = env_usize("BENCH_SESSIONS", 200);
    let dir = tempfile::tempdir()?;
    let (_http_server, url) = start_everything_http()?;
    let (_service, addr, pid) = start_service(dir.path(), &url, sessions + 1)?;
    let channel = Channel::from_shared(addr)?.connect().await?;
    let client = McpServiceClient::new(channel);

    println!("MCP pool overhead: echo via McpService (pooled) vs a direct rmcp client (floor: one session; unpooled: a session per call)");
    println!("{:<7} {:<3} {:<9} {:>11} {:>11} {:>10}", "server", "c", "path", "p50", "p99", "calls/s");
    let mut goals_met = true;
    for transport in ["stdio", "http"] {
        let tool: &'static str = if transport == "stdio" { "stdio_echo" } else { "http_echo" };
        let stats = |c: &McpServiceClient<Channel>| {
            let mut c = c.clone();
            async move {
                let mut request = tonic::Request::new(GetPoolStatsRequest { server: transport.into() });
                request.metadata_mut().insert("authorization", format!("Bearer {}", key(0)).parse()?);
                let s = c.get_pool_stats(request).await?.into_inner();
                let line = s.per_server.first().cloned().ok_or("no stats")?;
                Ok::<_, BoxError>((line.hits, line.misses))
            }
        };
        // Warm-up: discovery and the first session start.
        measure(pooled(client.clone(), tool), 1, 20).await?;
        let session: Direct = Arc::new(connect(transport, &url).await?);
        measure(floor(session.clone()), 1, 20).await?;
        let (hits0, misses0) = stats(&client).await?;
        for concurrency in [1usize, 16] {
            let (p, f) = if concurrency == 1 {
                let paths = [pooled(client.clone(), tool), floor(session.clone()), grpc_only(client.clone())];
                let mut all = measure_interleaved(&paths, calls).await?.into_iter();
                let (p, f) = (all.next().ok_or("no figures")?, all.next().ok_or("no figures")?);
                let g = all.next().ok_or("no figures")?;
                println!("{transport:<7} {concurrency:<3} {:<9} {:>11} {:>11} {:>10.0}", "grpc-only", ms(g.p50), ms(g.p99), g.per_sec);
                (p, f)
            } else {
                (
                    measure(pooled(client.clone(), tool), concurrency, calls).await?,
                    measure(floor(session.clone()), concurrency, calls).await?,
                )
            };
            let u = measure(unpooled(transport, url.clone()), concurrency.min(4), unpooled_calls).await?;
            for (label, fig) in [("pooled", &p), ("floor", &f), ("unpooled", &u)] {
                println!("{transport:<7} {concurrency:<3} {label:<9} {:>11} {:>11} {:>10.0}", ms(fig.p50), ms(fig.p99), fig.per_sec);
            }
            let overhead = p.p99.saturating_sub(f.p99);
            println!(
                "{transport:<7} {concurrency:<3} pooled p99 overhead over the floor: {} ({:.2}x the floor); unpooled p50 is {:.1}x pooled p50{}",
                ms(overhead),
                p.p99.as_secs_f64() / f.p99.as_secs_f64(),
                u.p50.as_secs_f64() / p.p50.as_secs_f64(),
                if concurrency == 16 { " (unpooled runs 4 in flight)" } else { "" }
            );
            if concurrency == 1 && overhead > GOAL_OVERHEAD_P99 {
                goals_met = false;
                println!("  GOAL MISSED: pooled p99 overhead at c=1 should be < {}", ms(GOAL_OVERHEAD_P99));
            }
        }
        let (hits1, misses1) = stats(&client).await?;
        let (hits, misses) = (hits1 - hits0, misses1 - misses0);
        let rate = hits as f64 / (hits + misses).max(1) as f64;
        println!("{transport:<7} hit rate over {} pooled calls: {:.4}% ({hits} hits, {misses} misses)", hits + misses, rate * 100.0);
        if rate < GOAL_HIT_RATE {
            goals_met = false;
            println!("  GOAL MISSED: hit rate should be >= {:.1}%", GOAL_HIT_RATE * 100.0);
        }
    }

    // RSS per idle session: one session per user on the HTTP server.
    let before = rss_bytes(pid)?;
    for user in 1..=sessions {
        let mut c = client.clone();
        let arguments = antler_kit::json::map_to_struct(&echo_args());
        let mut request = tonic::Request::new(CallToolRequest {
            tool_name: "http_echo".into(),
            arguments: Some(arguments),
            ..CallToolRequest::default()
        });
        request.metadata_mut().insert("authorization", format!("Bearer {}", key(user)).parse()?);
        c.call_tool(request).await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_bytes(pid)?;
    let per_session = (after - before) / sessions as f64;
    println!(
        "antler-mcp RSS: {:.1} MiB before, {:.1} MiB with {sessions} more idle streamable-HTTP sessions: {:.1} KiB per idle pooled session",
        before / 1048576.0,
        after / 1048576.0,
        per_session / 1024.0
    );
    if per_session > GOAL_RSS_PER_SESSION {
        goals_met = false;
        println!("  GOAL MISSED: RSS per idle session should be < 64 KiB");
    }
    println!("goals {}", if goals_met { "met" } else { "missed (see above)" });
    Ok(())
}
