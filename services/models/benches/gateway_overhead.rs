//! Gateway overhead: the same streaming chat request sent directly to the upstream double and through
//! ModelService (kit server stack + gateway + OpenAI provider), in one process and one run, at concurrency
//! 1, 16 and 64. Prints p50/p99 end-to-end latency and time to first token for both paths and their
//! difference (the added latency), then the process RSS before and after 100,000 requests through the
//! gateway.
//!
//! Run: `cargo bench -p antler-models --bench gateway_overhead` (release build; about a minute on 2 cores).
//! Environment: `BENCH_REQUESTS` (per path and concurrency, default 4000), `BENCH_SOAK` (default 100000).
//!
//! Everything shares the machine: the double, the gateway and both clients run on the same runtime, so the
//! "direct" figures already include the client and double costs that the gateway path also pays; the
//! difference is what the gateway adds. No metrics recorder is installed (the facade is a no-op).

#[path = "../tests/support/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use antler_kit::{Authenticator, Config, ServiceSet};
use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::models::chat_stream_response::Delta;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::model_service_server::ModelServiceServer;
use antler_proto::models::{ChatRequest, ChatStreamRequest};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use upstream::{Reply, Upstream};

const CHANNELS: usize = 4;

/// Collects the gateway's own `antler_model_gateway_overhead_seconds` samples; every other metric is
/// dropped, as with no recorder at all.
#[derive(Default)]
struct OverheadRecorder {
    samples: Arc<Mutex<Vec<f64>>>,
}

struct Collect(Arc<Mutex<Vec<f64>>>);

impl metrics::HistogramFn for Collect {
    fn record(&self, value: f64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(value);
    }
}

impl metrics::Recorder for OverheadRecorder {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        if key.name() == antler_models::telemetry::OVERHEAD {
            metrics::Histogram::from_arc(Arc::new(Collect(self.samples.clone())))
        } else {
            metrics::Histogram::noop()
        }
    }
}

fn take_overhead(samples: &Mutex<Vec<f64>>) -> (Duration, Duration) {
    let mut values = std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner()));
    values.sort_by(f64::total_cmp);
    let pick = |p: f64| values.get(((values.len().saturating_sub(1)) as f64 * p).round() as usize).copied().unwrap_or(0.0);
    (Duration::from_secs_f64(pick(0.5)), Duration::from_secs_f64(pick(0.99)))
}

static OVERHEAD_SAMPLES: std::sync::OnceLock<Arc<Mutex<Vec<f64>>>> = std::sync::OnceLock::new();

#[derive(Clone, Copy)]
struct Sample {
    total: Duration,
    ttft: Duration,
}

fn fixture() -> anyhow::Result<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openai_text.sse");
    Ok(std::fs::read_to_string(path)?)
}

/// User + system CPU time of this process so far (Linux clock ticks are 10 ms; runs are long enough).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name may hold spaces; the fields after the closing parenthesis are fixed.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok())).sum();
    Duration::from_millis(ticks * 10)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

async fn gateway(upstream: &str, shutdown: CancellationToken, nodelay: bool) -> anyhow::Result<SocketAddr> {
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:0\n  concurrency_limit: 4096\nmodels:\n  - name: gpt\n    provider: openai\n    model: gpt-4o\n    base_url: {upstream}/v1\n    api_key: sk-bench\n"
    );
    let config = Config::parse(&yaml, "bench.yaml", &|_| None)?;
    let auth = Authenticator::new(&config.server.auth)?;
    let listener = if nodelay {
        // Linux copies TCP_NODELAY from a listening socket to the sockets it accepts.
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_nodelay(true)?;
        socket.bind(config.server.listen)?;
        socket.listen(1024)?
    } else {
        antler_kit::server::bind(&config.server, &auth).await?
    };
    let addr = listener.local_addr()?;
    let service = antler_models::gateway(&config, shutdown.clone(), None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut set = ServiceSet::new(&config.server);
    set.describe(antler_proto::FILE_DESCRIPTOR_SET);
    antler_kit::add_service!(set, ModelServiceServer::new(antler_models::api::ModelApi::new(service)));
    let server = config.server.clone();
    tokio::spawn(async move { antler_kit::server::serve(listener, set, &server, auth, shutdown).await });
    Ok(addr)
}

fn chat_request() -> ChatRequest {
    ChatRequest {
        model_name: "gpt".into(),
        messages: vec![Message {
            role: Role::User as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "Say hello".into() })) }],
            ..Message::default()
        }],
        ..ChatRequest::default()
    }
}

async fn through_gateway(mut client: ModelServiceClient<Channel>) -> anyhow::Result<Sample> {
    let started = Instant::now();
    let mut stream = client.chat_stream(ChatStreamRequest { request: Some(chat_request()) }).await?.into_inner();
    let mut ttft = None;
    let mut finished = false;
    while let Some(item) = stream.message().await? {
        match item.delta {
            Some(Delta::Text(_)) if ttft.is_none() => ttft = Some(started.elapsed()),
            Some(Delta::Finish(_)) => finished = true,
            _ => {}
        }
    }
    anyhow::ensure!(finished, "no finish");
    Ok(Sample { total: started.elapsed(), ttft: ttft.unwrap_or_default() })
}

async fn direct(client: reqwest::Client, url: String) -> anyhow::Result<Sample> {
    let body = serde_json::json!({
        "model": "gpt-4o",
        "messages": [{ "role": "user", "content": "Say hello" }],
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    let started = Instant::now();
    let response = client.post(&url).bearer_auth("sk-bench").json(&body).send().await?;
    anyhow::ensure!(response.status().is_success(), "status {}", response.status());
    let mut events = response.bytes_stream().eventsource();
    let mut ttft = None;
    let mut done = false;
    while let Some(event) = events.next().await {
        let event = event?;
        if event.data == "[DONE]" {
            done = true;
            continue;
        }
        // The same work a minimal client does: parse each chunk and look for content.
        let chunk: serde_json::Value = serde_json::from_str(&event.data)?;
        let has_content = chunk.pointer("/choices/0/delta/content").and_then(|c| c.as_str()).is_some_and(|c| !c.is_empty());
        if has_content && ttft.is_none() {
            ttft = Some(started.elapsed());
        }
    }
    anyhow::ensure!(done, "no [DONE]");
    Ok(Sample { total: started.elapsed(), ttft: ttft.unwrap_or_default() })
}

#[derive(Clone, Copy)]
enum Path {
    Direct,
    Gateway,
}

async fn run(
    path: Path,
    concurrency: usize,
    total: usize,
    channels: &[Channel],
    http: &reqwest::Client,
    url: &str,
) -> anyhow::Result<(Vec<Sample>, Duration, Duration)> {
    let per_task = total.div_ceil(concurrency);
    let cpu = cpu_time();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for task in 0..concurrency {
        let channel = channels[task % channels.len()].clone();
        let http = http.clone();
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let sample = match path {
                    Path::Direct => direct(http.clone(), url.clone()).await?,
                    Path::Gateway => through_gateway(ModelServiceClient::new(channel.clone())).await?,
                };
                samples.push(sample);
            }
            anyhow::Ok(samples)
        }));
    }
    let mut all = Vec::with_capacity(per_task * concurrency);
    for task in tasks {
        all.extend(task.await??);
    }
    Ok((all, started.elapsed(), cpu_time().saturating_sub(cpu)))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

struct Figures {
    cpu_us: f64,
    p50: Duration,
    p99: Duration,
    ttft_p50: Duration,
    ttft_p99: Duration,
    rps: f64,
}

fn figures(samples: &[Sample], wall: Duration, cpu: Duration) -> Figures {
    let mut totals: Vec<Duration> = samples.iter().map(|s| s.total).collect();
    let mut ttfts: Vec<Duration> = samples.iter().map(|s| s.ttft).collect();
    totals.sort_unstable();
    ttfts.sort_unstable();
    Figures {
        cpu_us: cpu.as_secs_f64() * 1e6 / samples.len().max(1) as f64,
        p50: percentile(&totals, 0.50),
        p99: percentile(&totals, 0.99),
        ttft_p50: percentile(&ttfts, 0.50),
        ttft_p99: percentile(&ttfts, 0.99),
        rps: samples.len() as f64 / wall.as_secs_f64(),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn delta(a: Duration, b: Duration) -> String {
    format!("{:+.3}", (a.as_secs_f64() - b.as_secs_f64()) * 1000.0)
}

fn main() -> anyhow::Result<()> {
    let recorder = OverheadRecorder::default();
    let samples = recorder.samples.clone();
    metrics::set_global_recorder(recorder).map_err(|e| anyhow::anyhow!("{e}"))?;
    OVERHEAD_SAMPLES.set(samples).map_err(|_| anyhow::anyhow!("recorder set twice"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    let requests: usize = std::env::var("BENCH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    let soak: usize = std::env::var("BENCH_SOAK").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let upstream = Upstream::start().await?;
    upstream.always(Reply::sse(&fixture()?));
    upstream.forget_requests();
    let shutdown = CancellationToken::new();
    // The kit's accepted sockets keep Nagle's algorithm on; the main figures use a listener with TCP_NODELAY
    // (inherited by accepted sockets), and one line below shows the kit's listener as it is.
    let addr = gateway(&upstream.url(), shutdown.clone(), true).await?;
    let kit_addr = gateway(&upstream.url(), shutdown.clone(), false).await?;
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        channels.push(Channel::from_shared(format!("http://{addr}"))?.connect().await?);
    }
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{}/v1/chat/completions", upstream.url());

    if std::env::var("BENCH_PROFILE").is_ok() {
        // Only the gateway path, for `perf record`.
        let (_, wall, cpu) = run(Path::Gateway, 16, requests, &channels, &http, &url).await?;
        println!("profile run: {requests} requests in {wall:?}, {cpu:?} CPU");
        shutdown.cancel();
        return Ok(());
    }
    println!("gateway overhead: streaming chat (5 content chunks + finish + usage chunk), {requests} requests per path and concurrency");
    println!("cores: {}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    println!();
    println!(
        "{:>4} | {:>9} {:>9} {:>10} {:>10} {:>8} | {:>9} {:>9} {:>10} {:>10} {:>8} | {:>9} {:>9} {:>10} {:>10}",
        "c",
        "direct50",
        "direct99",
        "dTTFT50",
        "dTTFT99",
        "rps",
        "gw50",
        "gw99",
        "gwTTFT50",
        "gwTTFT99",
        "rps",
        "+p50",
        "+p99",
        "+TTFT50",
        "+TTFT99"
    );
    let mut cpu_rows = Vec::new();
    for concurrency in [1usize, 16, 64] {
        // Warm both paths (connections, the tokenizer is not involved: usage is reported).
        run(Path::Direct, concurrency, concurrency * 20, &channels, &http, &url).await?;
        run(Path::Gateway, concurrency, concurrency * 20, &channels, &http, &url).await?;
        if let Some(samples) = OVERHEAD_SAMPLES.get() {
            take_overhead(samples);
        }
        // Two interleaved rounds per path, so drift on a shared machine hits both alike.
        let mut direct_samples = Vec::new();
        let mut gateway_samples = Vec::new();
        let (mut direct_wall, mut direct_cpu) = (Duration::ZERO, Duration::ZERO);
        let (mut gateway_wall, mut gateway_cpu) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..2 {
            let (s, w, c) = run(Path::Direct, concurrency, requests / 2, &channels, &http, &url).await?;
            direct_samples.extend(s);
            direct_wall += w;
            direct_cpu += c;
            let (s, w, c) = run(Path::Gateway, concurrency, requests / 2, &channels, &http, &url).await?;
            gateway_samples.extend(s);
            gateway_wall += w;
            gateway_cpu += c;
        }
        let d = figures(&direct_samples, direct_wall, direct_cpu);
        let g = figures(&gateway_samples, gateway_wall, gateway_cpu);
        let own = OVERHEAD_SAMPLES.get().map(|s| take_overhead(s)).unwrap_or_default();
        cpu_rows.push((concurrency, d.cpu_us, g.cpu_us, own));
        println!(
            "{:>4} | {:>9} {:>9} {:>10} {:>10} {:>8.0} | {:>9} {:>9} {:>10} {:>10} {:>8.0} | {:>9} {:>9} {:>10} {:>10}",
            concurrency,
            ms(d.p50),
            ms(d.p99),
            ms(d.ttft_p50),
            ms(d.ttft_p99),
            d.rps,
            ms(g.p50),
            ms(g.p99),
            ms(g.ttft_p50),
            ms(g.ttft_p99),
            g.rps,
            delta(g.p50, d.p50),
            delta(g.p99, d.p99),
            delta(g.ttft_p50, d.ttft_p50),
            delta(g.ttft_p99, d.ttft_p99),
        );
    }
    println!("(milliseconds; + columns = through the gateway minus direct)");
    println!();
    for (concurrency, direct_cpu, gateway_cpu, (own50, own99)) in &cpu_rows {
        println!(
            "c={concurrency:>2}: CPU per request direct {direct_cpu:.0} µs, through the gateway {gateway_cpu:.0} µs (+{:.0} µs); gateway's own time (antler_model_gateway_overhead_seconds) p50 {} ms, p99 {} ms",
            gateway_cpu - direct_cpu,
            ms(*own50),
            ms(*own99),
        );
    }
    let kit_channels = vec![Channel::from_shared(format!("http://{kit_addr}"))?.connect().await?];
    run(Path::Gateway, 1, 20, &kit_channels, &http, &url).await?;
    let (kit_samples, kit_wall, kit_cpu) = run(Path::Gateway, 1, 200, &kit_channels, &http, &url).await?;
    let kit = figures(&kit_samples, kit_wall, kit_cpu);
    println!(
        "kit listener as it is (no TCP_NODELAY on accepted sockets), c=1: p50 {} ms, p99 {} ms, TTFT p50 {} ms",
        ms(kit.p50),
        ms(kit.p99),
        ms(kit.ttft_p50)
    );
    println!();

    let before = rss_kib();
    let started = Instant::now();
    let mut checkpoints = Vec::new();
    let step = soak / 4;
    let mut soak_overhead = Vec::new();
    for quarter in 0..4 {
        run(Path::Gateway, 16, step.max(1), &channels, &http, &url).await?;
        // Drain the collected samples so the recorder's own buffer does not count as growth.
        soak_overhead.push(OVERHEAD_SAMPLES.get().map(|s| take_overhead(s)).unwrap_or_default());
        checkpoints.push((step * (quarter + 1), rss_kib()));
    }
    let after = rss_kib();
    println!(
        "memory: RSS before {before} KiB, after {soak} requests through the gateway (c=16) {after} KiB ({:+} KiB) in {:.1} s",
        after as i64 - before as i64,
        started.elapsed().as_secs_f64()
    );
    let trail: Vec<String> = checkpoints.iter().map(|(n, kib)| format!("{n}: {kib} KiB")).collect();
    println!("        RSS along the way: {}", trail.join(", "));
    let own: Vec<String> = soak_overhead.iter().map(|(p50, p99)| format!("{}/{}", ms(*p50), ms(*p99))).collect();
    println!("        gateway's own time p50/p99 per quarter (ms): {}", own.join(", "));
    shutdown.cancel();
    Ok(())
}
