//! Log output: structured `tracing` events to stderr, as text or JSON, with every registered secret
//! redacted (see [`crate::redact`]).
//!
//! stdout is left to the binaries for what a person or a test harness reads (the listening address).

use std::io::{IsTerminal, Write};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `RUST_LOG` overrides `config.filter`. Calling it twice is harmless.
pub fn init(config: &LogConfig) {
    let filter =
        EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(&config.filter)).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(RedactingStderr).with_ansi(std::io::stderr().is_terminal());
    let _ = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
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
