//! Log output: structured `tracing` events to stderr, as text or JSON, with every registered secret
//! redacted (see [`crate::redact`]); and, with `server.tracing.otlp_endpoint` set, the spans exported
//! over OTLP (see [`crate::otel`]).
//!
//! stdout is left to the binaries for what a person or a test harness reads (the listening address).

use std::io::{IsTerminal, Write};

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogConfig, LogFormat, TracingConfig};

/// Installs the global subscriber for logs only. `RUST_LOG` overrides `config.filter`. Calling it twice
/// is harmless.
pub fn init(config: &LogConfig) {
    let _ = init_with_export(config, &TracingConfig::default(), "antler", std::time::Duration::ZERO);
}

/// What [`init_with_export`] started: the span exporter, flushed by [`Telemetry::shutdown`].
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is still queued (waiting at most the export timeout) and stops the exporter.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else { return };
        // shutdown blocks until the batch thread has exported, and that export runs on this runtime:
        // block a blocking-pool thread, not a worker.
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "span export did not shut down cleanly"),
            Err(error) => tracing::warn!(%error, "span export shutdown task failed"),
        }
    }
}

/// Installs the global subscriber: logs as [`init`], plus OTLP export of spans when
/// `tracing.otlp_endpoint` is set (`program` is the default `service.name`). Must run inside the tokio
/// runtime. A second call installs nothing and exports nothing. `tls_reload_interval` is how often
/// the files of `tracing.tls` are re-read (zero: never).
pub fn init_with_export(
    log: &LogConfig,
    tracing: &TracingConfig,
    program: &str,
    tls_reload_interval: std::time::Duration,
) -> Result<Telemetry, crate::otel::ExportError> {
    let filter = EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(&log.filter)).unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(RedactingStderr).with_ansi(std::io::stderr().is_terminal());
    let fmt = match log.format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).with_current_span(true).with_filter(filter).boxed(),
    };
    let provider = crate::otel::provider(tracing, program, tls_reload_interval)?;
    let export = provider.as_ref().map(|provider| {
        let filter = EnvFilter::try_new(&tracing.filter).unwrap_or_else(|_| EnvFilter::new("info"));
        crate::otel::layer(provider).with_filter(filter)
    });
    match tracing_subscriber::registry().with(fmt).with(export).try_init() {
        Ok(()) => Ok(Telemetry { provider }),
        Err(_) => Ok(Telemetry::default()),
    }
}

/// Stderr, with secrets redacted. The fmt layer formats each event into one buffer and writes it with
/// one `write_all`, so a secret is never split across two writes.
#[derive(Debug, Clone, Copy)]
struct RedactingStderr;

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingWriter<std::io::Stderr>;
    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter(std::io::stderr())
    }
}

/// A writer that redacts each buffer before passing it on.
#[derive(Debug)]
struct RedactingWriter<W>(W);

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_all(&crate::redact::redact_bytes(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_leave_without_secrets() -> std::io::Result<()> {
        crate::redact::register_static("log-secret-value-31");
        let mut writer = RedactingWriter(Vec::new());
        writer.write_all(b"error=upstream said log-secret-value-31 is wrong\n")?;
        assert_eq!(String::from_utf8_lossy(&writer.0), "error=upstream said [redacted] is wrong\n");
        Ok(())
    }
}
