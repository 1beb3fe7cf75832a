//! The `models` section of `antler.yaml`.
//!
//! It has no settings yet; unknown keys are still refused, so a setting written for a later release
//! fails loudly instead of being ignored.

use antler_kit::Config;
use antler_kit::config::ConfigError;
use serde::Deserialize;

/// Settings of the models service.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelsConfig {}

/// Parses and checks the `models` section.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    config.section::<ModelsConfig>("models").map(|_| ())
}
