//! What the kit's server stack costs per request: the same RPCs served by bare tonic and through
//! `antler_kit::server::serve` (trace span + W3C context, auth, concurrency limit, size mapping), in one
//! process, at concurrency 1 and 64. Prints p50/p99 latency, throughput and the ratio kit/bare.
//!
//! Run: `cargo bench -p antler-integration-tests --bench kit_overhead` (release build; takes about a minute).
//! Two RPCs: `grpc.health.v1.Health/Check` (public, so auth only classifies the path) and
//! `antler.models.v1.ModelService/ListModels` with an API key (full authentication; with no models
//! configured the handler answers an empty list at once, the same trivial work on both servers).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use antler_integration_tests::percentile::percentile;
use antler_kit::auth::{ApiKeyConfig, AuthConfig};
use antler_kit::config::ServerConfig;
use antler_kit::{Authenticator, ServiceSet};
use antler_proto::models::ListModelsRequest;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::model_service_server::ModelServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const KEY: &str = "bench-api-key-0123456789";
const CHANNELS: usize = 4;
const ROUNDS: usize = 7;

#[derive(Clone, Copy)]
enum Rpc {
    Health,
    ListModels,
}

struct Figures {
    p50: Duration,
    p99: Duration,
    rps: f64,
}

async fn bare_server() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(ModelServiceServer::new(model_api()?))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    Ok(addr)
}

async fn kit_server(shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let config = ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        auth: AuthConfig {
            enabled: true,
            api_keys: vec![ApiKeyConfig { key: KEY.into(), user: "bench".into(), service: false }],
            ..AuthConfig::default()
        },
        ..ServerConfig::default()
    };
    let auth = Authenticator::new(&config.auth)?;
    let listener = antler_kit::server::bind(&config, &auth).await?;
    let addr = listener.local_addr()?;
    let mut set = ServiceSet::new(&config);
    set.describe(antler_proto::FILE_DESCRIPTOR_SET);
    antler_kit::add_service!(set, ModelServiceServer::new(model_api()?));
    tokio::spawn(async move { antler_kit::server::serve(listener, set, &config, auth, shutdown).await });
    // Let the server mark itself SERVING.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(addr)
}

/// The models API with no models configured: ListModels answers an empty list.
fn model_api() -> anyhow::Result<antler_models::api::ModelApi> {
    let gateway =
        antler_models::gateway(&antler_kit::Config::default(), CancellationToken::new(), None).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(antler_models::api::ModelApi::new(gateway))
}

async fn channels(addr: SocketAddr) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::new();
    for _ in 0..CHANNELS {
        out.push(Channel::from_shared(format!("http://{addr}"))?.connect().await?);
    }
    Ok(out)
}

async fn one_call(channel: Channel, rpc: Rpc) -> anyhow::Result<()> {
    match rpc {
        Rpc::Health => {
            HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await?;
        }
        Rpc::ListModels => {
            let mut request = tonic::Request::new(ListModelsRequest::default());
            request.metadata_mut().insert("authorization", format!("Bearer {KEY}").parse()?);
            ModelServiceClient::new(channel).list_models(request).await?;
        }
    }
    Ok(())
}

async fn measure(channels: &[Channel], rpc: Rpc, concurrency: usize, total: usize) -> anyhow::Result<Figures> {
    let per_task = total / concurrency;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let channel = channels[task % channels.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t = Instant::now();
                one_call(channel.clone(), rpc).await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::with_capacity(total);
    for task in tasks {
        all.extend(task.await??);
    }
    let elapsed = started.elapsed();
    all.sort();
    let pct = |p: f64| percentile(&all, p).unwrap_or_default();
    Ok(Figures { p50: pct(0.50), p99: pct(0.99), rps: all.len() as f64 / elapsed.as_secs_f64() })
}

fn main() -> anyhow::Result<()> {
    // Spans are recorded for real (an INFO subscriber writing to a sink), as in production.
    tracing_subscriber::fmt().with_env_filter("info").with_writer(std::io::sink).init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let bare = channels(bare_server().await?).await?;
        let kit = channels(kit_server(shutdown.clone()).await?).await?;
        println!(
            "{:<12} {:>3} {:>6} {:>10} {:>10} {:>10}   {:>8} {:>8}",
            "rpc", "c", "server", "p50 µs", "p99 µs", "req/s", "p50 ×", "rps ×"
        );
        for (rpc, name) in [(Rpc::Health, "health"), (Rpc::ListModels, "list_models")] {
            for (concurrency, total) in [(1usize, 4_000usize), (64, 40_000)] {
                // Warm up both, then alternate rounds so drift hits both servers alike.
                measure(&bare, rpc, concurrency, total / 4).await?;
                measure(&kit, rpc, concurrency, total / 4).await?;
                let mut rounds = Vec::new();
                for _ in 0..ROUNDS {
                    let b = measure(&bare, rpc, concurrency, total).await?;
                    let k = measure(&kit, rpc, concurrency, total).await?;
                    rounds.push((b, k));
                }
                // Report the median round by kit/bare throughput ratio: client and servers share two
                // cores, so single rounds swing by ±20% either way.
                rounds.sort_by(|a, b| (a.1.rps / a.0.rps).total_cmp(&(b.1.rps / b.0.rps)));
                let (b, k) = &rounds[ROUNDS / 2];
                for (label, f) in [("bare", b), ("kit", k)] {
                    println!(
                        "{name:<12} {concurrency:>3} {label:>6} {:>10.1} {:>10.1} {:>10.0}",
                        f.p50.as_secs_f64() * 1e6,
                        f.p99.as_secs_f64() * 1e6,
                        f.rps
                    );
                }
                println!(
                    "{name:<12} {concurrency:>3} {:>6} {:>10} {:>10} {:>10}   {:>8.3} {:>8.3}",
                    "ratio",
                    "",
                    "",
                    "",
                    k.p50.as_secs_f64() / b.p50.as_secs_f64(),
                    k.rps / b.rps
                );
            }
        }
        shutdown.cancel();
        anyhow::Ok(())
    })
}
