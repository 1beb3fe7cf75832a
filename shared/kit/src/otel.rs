//! OTLP export of the `tracing` spans (`server.tracing`).
//!
//! With export on, the span of each request continues the trace of the `traceparent` it arrived with
//! (the bridge is in [`crate::trace_context`]), so a trace reads runs → models → sandbox across
//! processes. With export off, no OpenTelemetry layer is installed and the kit keeps its own ids.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter};

use crate::config::{OtlpProtocol, TracingConfig};
use crate::tls::{ClientTls, Fields};

/// Failures setting export up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up OTLP export to {endpoint} (server.tracing): {message}")]
pub struct ExportError {
    pub endpoint: String,
    pub message: String,
}

/// The tracer provider when `server.tracing.otlp_endpoint` is set. Must be created inside the tokio
/// runtime (exports run on it). An `https://` collector is reached over the kit's own TLS
/// (`server.tracing.tls`, as `clients.<service>.tls`); over gRPC its files are re-read every
/// `reload_interval` (zero: never).
pub fn provider(config: &TracingConfig, program: &str, reload_interval: Duration) -> Result<Option<SdkTracerProvider>, ExportError> {
    let endpoint = config.otlp_endpoint.trim();
    if endpoint.is_empty() {
        return Ok(None);
    }
    let error = |message: String| ExportError { endpoint: endpoint.to_owned(), message };
    let timeout = Duration::from_millis(config.export_timeout_ms);
    let tls = if endpoint.starts_with("https://") {
        let fields = Fields::Yaml("server.tracing.tls".to_owned());
        Some(ClientTls::load(&config.tls, &fields, reload_interval, None).map_err(|e| error(e.to_string()))?)
    } else {
        None
    };
    let exporter = match (config.otlp_protocol, tls) {
        (OtlpProtocol::Grpc, None) => {
            opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).with_timeout(timeout).build()
        }
        // The exporter's own TLS would need one of opentelemetry-otlp's `tls-*` features and could
        // not reload certificates: its channel is made here with the kit's connector instead.
        (OtlpProtocol::Grpc, Some(tls)) => {
            let channel = tls
                .channel(tonic::transport::Endpoint::from_shared(endpoint.to_owned()).map_err(|e| error(e.to_string()))?.timeout(timeout));
            opentelemetry_otlp::SpanExporter::builder().with_tonic().with_channel(channel).with_timeout(timeout).build()
        }
        (OtlpProtocol::Http, None) => {
            opentelemetry_otlp::SpanExporter::builder().with_http().with_endpoint(endpoint).with_timeout(timeout).build()
        }
        (OtlpProtocol::Http, Some(tls)) => {
            // No ALPN: the kit's is h2 only (for gRPC), and an OTLP/HTTP collector speaks HTTP/1.1.
            let mut rustls_config = tls.current_config().as_ref().clone();
            rustls_config.alpn_protocols.clear();
            let client = reqwest::Client::builder()
                .tls_backend_preconfigured(rustls_config)
                .timeout(timeout)
                .build()
                .map_err(|e| error(e.to_string()))?;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_endpoint(endpoint)
                .with_timeout(timeout)
                .build()
        }
    }
    .map_err(|e| error(e.to_string()))?;
    let runtime = tokio::runtime::Handle::try_current().map_err(|e| error(e.to_string()))?;
    let batch = BatchConfigBuilder::default()
        .with_scheduled_delay(Duration::from_millis(config.batch_delay_ms))
        .with_max_queue_size(config.max_queue_size)
        .build();
    let processor = BatchSpanProcessor::builder(OnRuntime { inner: Arc::new(exporter), runtime }).with_batch_config(batch).build();
    let name = if config.service_name.is_empty() { program.to_owned() } else { config.service_name.clone() };
    Ok(Some(
        SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio))))
            .with_resource(Resource::builder().with_service_name(name).build())
            .build(),
    ))
}

/// The `tracing` layer that feeds `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("antler"))
}

/// Runs the exporter's calls on the server's tokio runtime. The SDK's batch processor exports from a
/// thread of its own with a plain executor, where tonic and reqwest find no reactor; the exporter's
/// future is spawned onto the runtime instead and only its JoinHandle is awaited on that thread.
#[derive(Debug)]
struct OnRuntime<E> {
    inner: Arc<E>,
    runtime: tokio::runtime::Handle,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = self.inner.clone();
        match self.runtime.spawn(async move { inner.export(batch).await }).await {
            Ok(result) => result,
            Err(join) => Err(OTelSdkError::InternalFailure(format!("span export task failed: {join}"))),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called once while the provider is built, before any export holds a clone.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}
