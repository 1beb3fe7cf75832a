//! What can be wrong with a configuration, at the bottom of the kit: every section's validation (auth,
//! TLS, each service's own) returns these, so this file imports none of them.

use std::path::PathBuf;

use crate::tls::error::TlsError;

/// The top-level sections `antler.yaml` may contain.
pub const SECTIONS: &[&str] = &["server", "clients", "runs", "sandbox", "mcp", "models", "memory", "edge"];

/// Everything that can be wrong with a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}\nhint: pass an existing file with --config, or omit it to use the defaults")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin} is not valid YAML: {message}")]
    Parse { origin: String, message: String },
    #[error(
        "environment variable `{var}` referenced at `{path}` is not set\nhint: export it, or write `${{{var}:-default}}` to give a default"
    )]
    MissingEnv { var: String, path: String },
    #[error("bad variable reference at `{path}`: {problem}")]
    BadReference { path: String, problem: String },
    #[error(
        "unknown top-level section `{section}`\nhint: the sections are {}; a DeerFlow config.yaml is read as such when it has \
         config_version or a section only DeerFlow has",
        SECTIONS.join(", ")
    )]
    UnknownSection { section: String },
    #[error("invalid config at `{path}`: {message}")]
    Invalid { path: String, message: String },
    #[error("`{path}` = {value} is out of range: {limit}")]
    OutOfRange { path: String, value: String, limit: String },
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// An error about a setting that a DeerFlow `config.yaml` supplied, with the DeerFlow key named.
    // `error`, not `source`: the note belongs to the message, and a source would be printed twice by
    // error chains.
    #[error("{error}\nnote: `{antler_path}` is set from DeerFlow's `{deerflow_path}`")]
    FromDeerflow { error: Box<ConfigError>, antler_path: String, deerflow_path: String },
}

impl ConfigError {
    /// The YAML path the error is about, when it names one.
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Invalid { path, .. } | Self::OutOfRange { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// Checks `min <= value <= max`, naming the path and the limit otherwise.
pub fn check_range(path: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange { path: path.to_owned(), value: value.to_string(), limit: format!("must be between {min} and {max}") })
    }
}
