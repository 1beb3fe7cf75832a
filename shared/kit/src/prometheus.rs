//! The Prometheus endpoint (`server.metrics`): installs the process's `metrics` recorder and serves
//! `GET /metrics` in the text exposition format on its own port.
//!
//! Every `metrics::counter!` / `histogram!` / `gauge!` in the services is a no-op until a recorder is
//! installed, so with `server.metrics.listen` empty nothing is recorded at all. The recorder is
//! `metrics-exporter-prometheus`'s; before it is installed, every family of the binary's catalogues
//! ([`crate::metrics_catalog`]) is described (`# HELP`) and its known series registered at zero, so the
//! first scrape already shows them. The HTTP side is a few lines of hyper (already in the tree through
//! tonic) rather than the crate's own listener, so a port 0 can be reported and the endpoint stops with
//! the server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::MetricsConfig;
use crate::metrics_catalog::{self, Catalogue};

/// Buckets of histograms whose unit is not seconds, unless `server.metrics.buckets_by_metric` names them.
const BUILT_IN_BUCKETS: &[(&str, &[f64])] =
    &[("antler_admission_batch_size", &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0])];

/// How often histogram samples are folded into their buckets between scrapes, so a process nobody
/// scrapes for a while does not keep every sample.
const UPKEEP: Duration = Duration::from_secs(5);

/// Failures setting the endpoint up.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen for metrics on {addr} (server.metrics.listen): {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// The running endpoint.
#[derive(Debug)]
pub struct MetricsEndpoint {
    /// The address it actually listens on.
    pub local_addr: SocketAddr,
    pub handle: PrometheusHandle,
}

/// Builds the recorder from `config` (buckets) without installing it: for tests that want their own.
pub fn recorder(config: &MetricsConfig) -> Result<metrics_exporter_prometheus::PrometheusRecorder, MetricsError> {
    let recorder_error = |e: metrics_exporter_prometheus::BuildError| MetricsError::Recorder(e.to_string());
    let mut builder = PrometheusBuilder::new().set_buckets(&config.buckets).map_err(recorder_error)?;
    for (name, buckets) in BUILT_IN_BUCKETS {
        if !config.buckets_by_metric.contains_key(*name) {
            builder = builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets).map_err(recorder_error)?;
        }
    }
    for (name, buckets) in &config.buckets_by_metric {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.clone()), buckets).map_err(recorder_error)?;
    }
    Ok(builder.build_recorder())
}

/// Installs the global recorder, with the families of `catalogues` described and registered at zero,
/// and starts serving `/metrics` when `server.metrics.listen` is set; None when it is empty. The
/// endpoint stops when `shutdown` is cancelled.
pub async fn start(
    config: &MetricsConfig,
    catalogues: &[Catalogue],
    shutdown: CancellationToken,
) -> Result<Option<MetricsEndpoint>, MetricsError> {
    let Some(addr) = config.listen_addr()? else { return Ok(None) };
    let listener = TcpListener::bind(addr).await.map_err(|source| MetricsError::Bind { addr, source })?;
    let local_addr = listener.local_addr().map_err(|source| MetricsError::Bind { addr, source })?;
    let recorder = recorder(config)?;
    metrics_catalog::register(&recorder, catalogues);
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| MetricsError::Recorder(e.to_string()))?;
    tokio::spawn(upkeep(handle.clone(), shutdown.clone()));
    tokio::spawn(serve(listener, handle.clone(), shutdown));
    Ok(Some(MetricsEndpoint { local_addr, handle }))
}

async fn upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(UPKEEP) => handle.run_upkeep(),
        }
    }
}

/// Accepts scrapes until shutdown. A scrape is one small HTTP/1 exchange; each connection gets its
/// own task, so a slow scraper holds only its own connection.
async fn serve(listener: TcpListener, handle: PrometheusHandle, shutdown: CancellationToken) {
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handle = handle.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let handle = handle.clone();
                async move { Ok::<_, Infallible>(answer(&handle, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                () = shutdown.cancelled() => {}
                result = connection => if let Err(error) = result {
                    tracing::debug!(%error, "metrics endpoint: connection ended with an error");
                },
            }
        });
    }
}

fn answer<B>(handle: &PrometheusHandle, request: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
        response
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", handle.render()),
        (&Method::GET, _) => reply(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "not found: metrics are at /metrics\n".to_owned()),
        _ => reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "only GET /metrics is served here\n".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_use_the_configured_buckets_and_the_built_in_ones() -> Result<(), MetricsError> {
        let config = MetricsConfig {
            buckets: vec![0.5, 1.0],
            buckets_by_metric: [("antler_custom_seconds".to_owned(), vec![7.0])].into_iter().collect(),
            ..MetricsConfig::default()
        };
        let recorder = recorder(&config)?;
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("antler_plain_seconds").record(0.75);
            metrics::histogram!("antler_custom_seconds").record(3.0);
            metrics::histogram!("antler_admission_batch_size").record(3.0);
        });
        let text = handle.render();
        assert!(text.contains("antler_plain_seconds_bucket{le=\"0.5\"} 0"), "{text}");
        assert!(text.contains("antler_plain_seconds_bucket{le=\"1\"} 1"), "{text}");
        assert!(text.contains("antler_custom_seconds_bucket{le=\"7\"} 1"), "{text}");
        assert!(!text.contains("antler_custom_seconds_bucket{le=\"0.5\"}"), "{text}");
        assert!(text.contains("antler_admission_batch_size_bucket{le=\"4\"} 1"), "{text}");
        Ok(())
    }

    #[test]
    fn catalogued_families_have_help_and_their_known_series_start_at_zero() -> Result<(), MetricsError> {
        use crate::metrics_catalog::{Family, Label};
        const CATALOGUE: Catalogue = &[
            Family::counter("antler_things_total", "Things that happened.").labels(&[Label::known("outcome", &["ok", "failed"])]),
            Family::gauge("antler_level", "A level."),
            Family::seconds("antler_wait_seconds", "Waits."),
            Family::counter("antler_by_model_total", "Per model.").labels(&[Label::runtime("model", "a configured model name")]),
        ];
        let config = MetricsConfig { buckets: vec![0.5, 1.0], ..MetricsConfig::default() };
        let recorder = recorder(&config)?;
        metrics_catalog::register(&recorder, &[CATALOGUE, crate::metrics_catalog::KIT]);
        let text = recorder.handle().render();
        for line in [
            "# HELP antler_things_total Things that happened.",
            "# TYPE antler_things_total counter",
            "antler_things_total{outcome=\"ok\"} 0",
            "antler_things_total{outcome=\"failed\"} 0",
            "antler_level 0",
            "antler_wait_seconds_bucket{le=\"0.5\"} 0",
            "antler_wait_seconds_count 0",
            "antler_requests_shed_total{kind=\"client\"} 0",
            "antler_config_reloads_total{outcome=\"rejected\"} 0",
            "antler_auth_failures_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Its model names are not known here: described, but no series until one is recorded.
        assert!(!text.contains("antler_by_model_total"), "{text}");
        metrics::with_local_recorder(&recorder, || metrics::counter!("antler_by_model_total", "model" => "m").increment(2));
        let text = recorder.handle().render();
        assert!(
            text.contains(
                "# HELP antler_by_model_total Per model.\n# TYPE antler_by_model_total counter\nantler_by_model_total{model=\"m\"} 2"
            ),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn only_get_metrics_is_answered() -> Result<(), MetricsError> {
        let handle = recorder(&MetricsConfig::default())?.handle();
        let get = |method: Method, path: &str| {
            let request = Request::builder().method(method).uri(path).body(()).unwrap_or_default();
            answer(&handle, &request).status()
        };
        assert_eq!(get(Method::GET, "/metrics"), StatusCode::OK);
        assert_eq!(get(Method::GET, "/"), StatusCode::NOT_FOUND);
        assert_eq!(get(Method::POST, "/metrics"), StatusCode::METHOD_NOT_ALLOWED);
        Ok(())
    }
}
