//! Gateway overhead: the same streaming chat request sent directly to the upstream double and through
//! ModelService (kit server stack + gateway + OpenAI provider), in one process and one run. Two load models,
//! both printed:
//!
//! * closed loop: 1, 16 or 64 tasks, each sending its next request as soon as the previous one ends. This
//!   runs the machine flat out, so on 2 cores the difference is mostly the extra hop's CPU queueing.
//! * open loop (as TensorZero measures): requests are due at a fixed rate, at most 16 (or 64) in flight, and
//!   every latency counts from the request's scheduled send time, so time spent waiting for a free slot or
//!   for a late dispatcher is part of the figure (no coordinated omission).
//!
//! Then the process RSS before and after 100,000 requests through the gateway.
//!
//! Run: `cargo bench -p antler-models --bench gateway_overhead` (release build; a few minutes on 2 cores).
//! Environment: `BENCH_REQUESTS` (closed loop, per path and concurrency, default 4000), `BENCH_RATES`
//! (open loop, requests per second, default `200,500,1000,2000`), `BENCH_CAPS` (open loop, most in flight,
//! default `16,64`), `BENCH_OPEN_SECS` (open loop, seconds per path and round, 2 rounds, default 3),
//! `BENCH_SOAK` (default 100000), `BENCH_ONLY` (`closed`, `open` or `soak` to run one part),
//! `BENCH_TELEMETRY` (`on`, `metrics` or `logs`: the telemetry a deployment runs, see below).
//!
//! The double and the gateway run on one tokio runtime ("server side"), the load generator on another
//! (threads named apart), both in this process on the machine's cores. The "direct" figures include the
//! client and double costs that the gateway path also pays; the difference is what the gateway adds. CPU
//! per request is the server side's (from its threads' /proc counters): the double alone on the direct
//! path, double + gateway through it, so their difference is the gateway's own CPU per request. Only the gateway's own-time histogram is recorded; every other
//! metric goes to a no-op, and no tracing subscriber is installed. With `BENCH_TELEMETRY=on` the process
//! runs what `antler serve` installs instead: the kit's Prometheus recorder (every metric recorded, the
//! catalogues described, upkeep running, `/metrics` served) and its log subscriber at `info` (stderr),
//! so the cost of per-request metrics and spans is in the figures; the gateway's own time is then not
//! collected (printed as "not collected"). `metrics` or `logs` installs only that half, to tell their costs apart.

#[path = "../tests/support/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use antler_kit::{Authenticator, Config, ServiceSet};
use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::models::chat_stream_response::Delta;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::model_service_server::ModelServiceServer;
use antler_proto::models::{ChatRequest, ChatStreamRequest};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use upstream::{Reply, Upstream};

const CHANNELS: usize = 4;
/// The target for the p99 added latency at 16 in flight.
const GOAL_P99: Duration = Duration::from_millis(1);

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

static OVERHEAD_SAMPLES: OnceLock<Arc<Mutex<Vec<f64>>>> = OnceLock::new();

/// The gateway's own time since the last call, "p50 X ms, p99 Y ms" (the buffer is emptied); "not
/// collected" when `BENCH_TELEMETRY` put the kit's recorder in place of the one that collects it.
fn take_overhead() -> String {
    let Some(samples) = OVERHEAD_SAMPLES.get() else { return "not collected".to_owned() };
    let taken = std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner()));
    let mut values: Vec<Duration> = taken.into_iter().map(Duration::from_secs_f64).collect();
    values.sort_unstable();
    format!("p50 {} ms, p99 {} ms", ms(percentile(&values, 0.5)), ms(percentile(&values, 0.99)))
}

#[derive(Clone, Copy)]
struct Sample {
    total: Duration,
    ttft: Duration,
}

fn fixture() -> anyhow::Result<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openai_text.sse");
    Ok(std::fs::read_to_string(path)?)
}

/// Thread-name prefixes of the two runtimes: the server side (upstream double and gateway) and the
/// load generator. Kept apart so the clients' work never queues behind the server's on one runtime
/// (which flattered neither path the same way), and so CPU is counted per side.
const SERVER_THREADS: &str = "bench-server";
const CLIENT_THREADS: &str = "bench-client";

/// User + system CPU time so far of this process's threads whose name starts with `prefix` (Linux
/// clock ticks are 10 ms; runs are long enough).
fn cpu_time_of(prefix: &str) -> Duration {
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The thread name may hold spaces; the fields after the closing parenthesis are fixed.
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        if !head.split_once('(').is_some_and(|(_, name)| name.starts_with(prefix)) {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += [11, 12].iter().filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok())).sum::<u64>();
    }
    Duration::from_millis(ticks * 10)
}

/// CPU of the server side: the upstream double alone on the direct path, double + gateway through it.
fn cpu_time() -> Duration {
    cpu_time_of(SERVER_THREADS)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// What `BENCH_TELEMETRY` installs of a deployment's telemetry.
#[derive(Clone, Copy)]
struct Telemetry {
    metrics: bool,
    logs: bool,
}

impl Telemetry {
    fn from_env() -> anyhow::Result<Self> {
        let value = std::env::var("BENCH_TELEMETRY").unwrap_or_default();
        if !matches!(value.as_str(), "" | "on" | "metrics" | "logs") {
            anyhow::bail!("BENCH_TELEMETRY={value:?}: expected on, metrics or logs (or unset for neither)");
        }
        Ok(Self { metrics: matches!(value.as_str(), "on" | "metrics"), logs: matches!(value.as_str(), "on" | "logs") })
    }
}

async fn gateway(upstream: &str, telemetry: Telemetry, shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let metrics = if telemetry.metrics { "  metrics:\n    listen: 127.0.0.1:0\n" } else { "" };
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:0\n  concurrency_limit: 4096\n{metrics}models:\n  - name: gpt\n    provider: openai\n    model: gpt-4o\n    base_url: {upstream}/v1\n    api_key: sk-bench\n"
    );
    let config = Config::parse(&yaml, "bench.yaml", &|_| None)?;
    if telemetry.logs {
        antler_kit::telemetry::init(&config.server.log);
    }
    if telemetry.metrics {
        let catalogues = [antler_kit::metrics_catalog::KIT, antler_models::metrics_catalog::CATALOGUE];
        antler_kit::prometheus::start(&config.server.metrics, &catalogues, shutdown.clone()).await?;
    }
    let auth = Authenticator::new(&config.server.auth)?;
    let listener = antler_kit::server::bind(&config.server, &auth).await?;
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

/// `from` is when the request counts as sent: now in the closed loop, its scheduled time in the open loop.
async fn through_gateway(mut client: ModelServiceClient<Channel>, from: Instant) -> anyhow::Result<Sample> {
    let mut stream = client.chat_stream(ChatStreamRequest { request: Some(chat_request()) }).await?.into_inner();
    let mut ttft = None;
    let mut finished = false;
    while let Some(item) = stream.message().await? {
        match item.delta {
            Some(Delta::Text(_)) if ttft.is_none() => ttft = Some(from.elapsed()),
            Some(Delta::Finish(_)) => finished = true,
            _ => {}
        }
    }
    anyhow::ensure!(finished, "no finish");
    Ok(Sample { total: from.elapsed(), ttft: ttft.unwrap_or_default() })
}

async fn direct(client: &reqwest::Client, url: &str, from: Instant) -> anyhow::Result<Sample> {
    let body = serde_json::json!({
        "model": "gpt-4o",
        "messages": [{ "role": "user", "content": "Say hello" }],
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    let response = client.post(url).bearer_auth("sk-bench").json(&body).send().await?;
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
            ttft = Some(from.elapsed());
        }
    }
    anyhow::ensure!(done, "no [DONE]");
    Ok(Sample { total: from.elapsed(), ttft: ttft.unwrap_or_default() })
}

#[derive(Clone, Copy)]
enum Path {
    Direct,
    Gateway,
}

/// Closed loop: `concurrency` tasks, each sending its next request when the previous one has ended.
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
                    Path::Direct => direct(&http, &url, Instant::now()).await?,
                    Path::Gateway => through_gateway(ModelServiceClient::new(channel.clone()), Instant::now()).await?,
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

/// One or more open-loop rounds of one path.
#[derive(Default)]
struct OpenRun {
    samples: Vec<Sample>,
    /// Due time to the request's start: dispatcher lateness, runtime queueing and waiting for a slot.
    delays: Vec<Duration>,
    /// Requests that found every slot taken.
    slot_waits: usize,
    /// First due time to last completion, summed over rounds.
    wall: Duration,
    cpu: Duration,
}

impl OpenRun {
    fn absorb(&mut self, other: OpenRun) {
        self.samples.extend(other.samples);
        self.delays.extend(other.delays);
        self.slot_waits += other.slot_waits;
        self.wall += other.wall;
        self.cpu += other.cpu;
    }
}

/// Open loop: request `i` is due at `start + i / rate`, at most `cap` are in flight, and its latency and
/// time to first token count from its due time.
async fn open_loop(
    path: Path,
    rate: f64,
    cap: usize,
    count: usize,
    channels: &[Channel],
    http: &reqwest::Client,
    url: &str,
) -> anyhow::Result<OpenRun> {
    let slots = Arc::new(Semaphore::new(cap));
    let channels = channels.to_vec();
    let http = http.clone();
    let url: Arc<str> = Arc::from(url);
    let runtime = tokio::runtime::Handle::current();
    let cpu = cpu_time();
    let start = Instant::now() + Duration::from_millis(2);
    // The schedule is kept by a thread of its own: tokio's timer has millisecond ticks, as coarse as the gap
    // between requests at 1000/s. Whatever lateness remains is counted against the request anyway.
    let dispatch = tokio::task::spawn_blocking(move || {
        let mut tasks = Vec::with_capacity(count);
        for i in 0..count {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let (slots, http, url) = (slots.clone(), http.clone(), url.clone());
            let channel = channels[i % channels.len()].clone();
            tasks.push(runtime.spawn(async move {
                let (slot, waited) = match slots.clone().try_acquire_owned() {
                    Ok(slot) => (slot, false),
                    Err(_) => (slots.acquire_owned().await?, true),
                };
                let delay = due.elapsed();
                let sample = match path {
                    Path::Direct => direct(&http, &url, due).await?,
                    Path::Gateway => through_gateway(ModelServiceClient::new(channel), due).await?,
                };
                drop(slot);
                anyhow::Ok((sample, delay, waited, Instant::now()))
            }));
        }
        tasks
    });
    let mut run = OpenRun { samples: Vec::with_capacity(count), delays: Vec::with_capacity(count), ..OpenRun::default() };
    let mut last = start;
    for task in dispatch.await? {
        let (sample, delay, waited, ended) = task.await??;
        run.samples.push(sample);
        run.delays.push(delay);
        run.slot_waits += usize::from(waited);
        last = last.max(ended);
    }
    run.wall = last.saturating_duration_since(start);
    run.cpu = cpu_time().saturating_sub(cpu);
    Ok(run)
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
        rps: samples.len() as f64 / wall.as_secs_f64().max(1e-9),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn delta(a: Duration, b: Duration) -> String {
    format!("{:+.3}", (a.as_secs_f64() - b.as_secs_f64()) * 1000.0)
}

fn verdict(gateway: Duration, direct: Duration) -> &'static str {
    if gateway.saturating_sub(direct) < GOAL_P99 { "met" } else { "NOT met" }
}

/// The header both tables share; `load` is the first column (concurrency, or rate and cap).
fn table_header(load: &str, rate: &str) {
    println!(
        "{load:>10} | {:>9} {:>9} {:>10} {:>10} {:>8} | {:>9} {:>9} {:>10} {:>10} {:>8} | {:>9} {:>9} {:>10} {:>10}",
        "direct50",
        "direct99",
        "dTTFT50",
        "dTTFT99",
        rate,
        "gw50",
        "gw99",
        "gwTTFT50",
        "gwTTFT99",
        rate,
        "+p50",
        "+p99",
        "+TTFT50",
        "+TTFT99"
    );
}

fn table_row(load: &str, d: &Figures, g: &Figures) {
    println!(
        "{load:>10} | {:>9} {:>9} {:>10} {:>10} {:>8.0} | {:>9} {:>9} {:>10} {:>10} {:>8.0} | {:>9} {:>9} {:>10} {:>10}",
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

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn env_list<T: std::str::FromStr + Clone>(name: &str, default: &[T]) -> Vec<T> {
    let parsed: Option<Vec<T>> = std::env::var(name).ok().and_then(|v| v.split(',').map(|x| x.trim().parse().ok()).collect());
    parsed.filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_vec())
}

fn main() -> anyhow::Result<()> {
    let telemetry = Telemetry::from_env()?;
    if !telemetry.metrics {
        let recorder = OverheadRecorder::default();
        let samples = recorder.samples.clone();
        metrics::set_global_recorder(recorder).map_err(|e| anyhow::anyhow!("{e}"))?;
        OVERHEAD_SAMPLES.set(samples).map_err(|_| anyhow::anyhow!("recorder set twice"))?;
    }
    let server_runtime = tokio::runtime::Builder::new_multi_thread().thread_name(SERVER_THREADS).enable_all().build()?;
    let client_runtime = tokio::runtime::Builder::new_multi_thread().thread_name(CLIENT_THREADS).enable_all().build()?;
    let shutdown = CancellationToken::new();
    // The double and the gateway run on the server runtime (its tasks keep running after block_on).
    let (upstream, addr) = server_runtime.block_on(async {
        let upstream = Upstream::start().await?;
        upstream.always(Reply::sse(&fixture()?));
        upstream.forget_requests();
        // The kit's own listener and server stack, as deployed (it sets TCP_NODELAY on accepted connections).
        let addr = gateway(&upstream.url(), telemetry, shutdown.clone()).await?;
        anyhow::Ok((upstream, addr))
    })?;
    let result = client_runtime.block_on(bench(upstream.url(), addr, telemetry));
    shutdown.cancel();
    server_runtime.block_on(async move { drop(upstream) });
    result
}

/// What the benchmark is pointed at.
struct Target {
    channels: Vec<Channel>,
    http: reqwest::Client,
    url: String,
}

async fn bench(upstream: String, addr: SocketAddr, telemetry: Telemetry) -> anyhow::Result<()> {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let part = |name: &str| only.is_empty() || only == name;
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        channels.push(Channel::from_shared(format!("http://{addr}"))?.connect().await?);
    }
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("{upstream}/v1/chat/completions");
    let target = Target { channels, http, url };

    if std::env::var("BENCH_PROFILE").is_ok() {
        // Only the gateway path, for `perf record`.
        let requests = env_or("BENCH_REQUESTS", 4000);
        let (_, wall, cpu) = run(Path::Gateway, 16, requests, &target.channels, &target.http, &target.url).await?;
        println!("profile run: {requests} requests in {wall:?}, {cpu:?} server-side CPU");
        return Ok(());
    }
    println!(
        "gateway overhead: streaming chat (5 content chunks + finish + usage chunk), direct to the upstream double vs through ModelService"
    );
    println!("cores: {}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    if telemetry.metrics {
        println!("telemetry: the kit's Prometheus recorder, as `antler serve` with server.metrics set");
    }
    if telemetry.logs {
        println!("telemetry: the kit's log subscriber (info), as `antler serve`");
    }
    let mut goal = Vec::new();
    if part("closed") {
        closed(&target, &mut goal).await?;
    }
    if part("open") {
        open(&target, &mut goal).await?;
    }
    if !goal.is_empty() {
        println!("goal: p99 added latency < {} ms at 16 in flight", ms(GOAL_P99));
        for line in &goal {
            println!("  {line}");
        }
        println!();
    }
    if part("soak") {
        soak(&target).await?;
    }
    println!("load generator CPU over the whole run: {:.2} s", cpu_time_of(CLIENT_THREADS).as_secs_f64());
    Ok(())
}

async fn closed(target: &Target, goal: &mut Vec<String>) -> anyhow::Result<()> {
    let Target { channels, http, url } = target;
    let requests: usize = env_or("BENCH_REQUESTS", 4000);
    println!();
    println!("CLOSED LOOP: c tasks, each sending its next request as soon as the previous one ends (the machine runs flat out);");
    println!("{requests} requests per path and concurrency, 2 interleaved rounds; latency from each request's actual send");
    table_header("c", "rps");
    let mut cpu_rows = Vec::new();
    for concurrency in [1usize, 16, 64] {
        // Warm both paths (connections, the tokenizer is not involved: usage is reported).
        run(Path::Direct, concurrency, concurrency * 20, channels, http, url).await?;
        run(Path::Gateway, concurrency, concurrency * 20, channels, http, url).await?;
        take_overhead();
        // Two interleaved rounds per path, so drift on a shared machine hits both alike.
        let mut direct_samples = Vec::new();
        let mut gateway_samples = Vec::new();
        let (mut direct_wall, mut direct_cpu) = (Duration::ZERO, Duration::ZERO);
        let (mut gateway_wall, mut gateway_cpu) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..2 {
            let (s, w, c) = run(Path::Direct, concurrency, requests / 2, channels, http, url).await?;
            direct_samples.extend(s);
            direct_wall += w;
            direct_cpu += c;
            let (s, w, c) = run(Path::Gateway, concurrency, requests / 2, channels, http, url).await?;
            gateway_samples.extend(s);
            gateway_wall += w;
            gateway_cpu += c;
        }
        let d = figures(&direct_samples, direct_wall, direct_cpu);
        let g = figures(&gateway_samples, gateway_wall, gateway_cpu);
        cpu_rows.push((concurrency, d.cpu_us, g.cpu_us, take_overhead()));
        table_row(&concurrency.to_string(), &d, &g);
        if concurrency == 16 {
            goal.push(format!("closed loop c=16: {} ms — {}", delta(g.p99, d.p99), verdict(g.p99, d.p99)));
        }
    }
    println!("(milliseconds; + columns = through the gateway minus direct)");
    for (concurrency, direct_cpu, gateway_cpu, own) in &cpu_rows {
        println!(
            "c={concurrency:>2}: server-side CPU per request: the double alone (direct) {direct_cpu:.0} µs, double + gateway {gateway_cpu:.0} µs (gateway {:+.0} µs); gateway's own time (antler_model_gateway_overhead_seconds) {own}",
            gateway_cpu - direct_cpu,
        );
    }
    println!();
    Ok(())
}

async fn open(target: &Target, goal: &mut Vec<String>) -> anyhow::Result<()> {
    let Target { channels, http, url } = target;
    let rates: Vec<f64> = env_list("BENCH_RATES", &[200.0, 500.0, 1000.0, 2000.0]);
    let caps: Vec<usize> = env_list("BENCH_CAPS", &[16, 64]);
    let seconds: f64 = env_or("BENCH_OPEN_SECS", 3.0);
    println!("OPEN LOOP: requests due at a fixed rate with at most `cap` in flight; latency and TTFT from each request's scheduled");
    println!("send time (waiting for a slot counts); {seconds} s per path and round, 2 rounds alternating which path goes first");
    table_header("rate/cap", "achieved");
    let mut details = Vec::new();
    for &cap in &caps {
        for &rate in &rates {
            let count = ((rate * seconds).round() as usize).max(1);
            let warm = ((rate / 4.0).round() as usize).max(cap);
            open_loop(Path::Direct, rate, cap, warm, channels, http, url).await?;
            open_loop(Path::Gateway, rate, cap, warm, channels, http, url).await?;
            take_overhead();
            let (mut d, mut g) = (OpenRun::default(), OpenRun::default());
            for round in 0..2 {
                let order = if round == 0 { [Path::Direct, Path::Gateway] } else { [Path::Gateway, Path::Direct] };
                for path in order {
                    let result = open_loop(path, rate, cap, count, channels, http, url).await?;
                    match path {
                        Path::Direct => d.absorb(result),
                        Path::Gateway => g.absorb(result),
                    }
                }
            }
            let (df, gf) = (figures(&d.samples, d.wall, d.cpu), figures(&g.samples, g.wall, g.cpu));
            let load = format!("{rate:.0}/{cap}");
            table_row(&load, &df, &gf);
            if cap == 16 {
                goal.push(format!("open loop {rate:.0}/s, cap 16: {} ms — {}", delta(gf.p99, df.p99), verdict(gf.p99, df.p99)));
            }
            let delay99 = |run: &mut OpenRun| {
                run.delays.sort_unstable();
                percentile(&run.delays, 0.99)
            };
            let own = take_overhead();
            details.push(format!(
                "{load:>9}: server-side CPU per request direct {:.0} µs, through the gateway {:.0} µs; start delay p99 direct {} ms, gateway {} ms; slot waits direct {}, gateway {}; gateway's own time {own}",
                df.cpu_us,
                gf.cpu_us,
                ms(delay99(&mut d)),
                ms(delay99(&mut g)),
                d.slot_waits,
                g.slot_waits,
            ));
        }
    }
    println!("(milliseconds; rate/cap = requests due per second / most in flight; achieved = completed per second)");
    for line in &details {
        println!("{line}");
    }
    println!();
    Ok(())
}

async fn soak(target: &Target) -> anyhow::Result<()> {
    let Target { channels, http, url } = target;
    let soak: usize = env_or("BENCH_SOAK", 100_000);
    let before = rss_kib();
    let started = Instant::now();
    let mut checkpoints = Vec::new();
    let step = soak / 4;
    let mut soak_overhead = Vec::new();
    for quarter in 0..4 {
        run(Path::Gateway, 16, step.max(1), channels, http, url).await?;
        // Drain the collected samples so the recorder's own buffer does not count as growth.
        soak_overhead.push(take_overhead());
        checkpoints.push((step * (quarter + 1), rss_kib()));
    }
    let after = rss_kib();
    println!(
        "memory: RSS before {before} KiB, after {soak} requests through the gateway (closed loop, c=16) {after} KiB ({:+} KiB) in {:.1} s",
        after as i64 - before as i64,
        started.elapsed().as_secs_f64()
    );
    let trail: Vec<String> = checkpoints.iter().map(|(n, kib)| format!("{n}: {kib} KiB")).collect();
    println!("        RSS along the way: {}", trail.join(", "));
    println!("        gateway's own time per quarter: {}", soak_overhead.join("; "));
    Ok(())
}
