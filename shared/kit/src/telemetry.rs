//! Log output: structured `tracing` events to stderr, as text or JSON.
//!
//! stdout is left to the binaries for what a person or a test harness reads (the listening address).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `RUST_LOG` overrides `config.filter`. Calling it twice is harmless.
pub fn init(config: &LogConfig) {
    let filter =
        EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(&config.filter)).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    let _ = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
}
