//! The `runs` section of `antler.yaml`.
//!
//! It has no settings yet; unknown keys are still refused, so a setting written for a later release
//! fails loudly instead of being ignored.

use antler_kit::Config;
use antler_kit::config::ConfigError;
use serde::Deserialize;

/// Settings of the runs service.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsConfig {}

/// Parses and checks the `runs` section.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    config.section::<RunsConfig>("runs").map(|_| ())
}
