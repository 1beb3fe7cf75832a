//! A run's request-scoped `secrets` as an agent gets them: values for the environment of its sandbox
//! commands, each registered with the process's redactor while this lives, and the names of those the
//! attempt lacks (the runs service never stores the values, so an attempt resumed elsewhere has none).

use std::collections::{BTreeMap, HashMap};

use antler_kit::redact;
/// The secrets of one run.
pub struct RunSecrets {
    values: BTreeMap<String, String>,
    /// Names the run was admitted with whose values this replica does not have.
    lost: Vec<String>,
    _registered: Vec<redact::Secret>,
}

impl std::fmt::Debug for RunSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSecrets").field("names", &self.values.keys().collect::<Vec<_>>()).field("lost", &self.lost).finish()
    }
}

impl RunSecrets {
    /// Registers `values` with the redactor for as long as this lives.
    pub fn new(values: BTreeMap<String, String>) -> Self {
        let registered = values.values().map(|v| redact::register(v)).collect();
        Self { values, lost: Vec::new(), _registered: registered }
    }

    /// A run admitted with secrets `names` that this replica never saw (taken over after a crash).
    pub fn lost(names: Vec<String>) -> Self {
        Self { values: BTreeMap::new(), lost: names, _registered: Vec::new() }
    }

    /// No secrets at all.
    pub fn none() -> Self {
        Self::new(BTreeMap::new())
    }

    /// The environment a sandbox command gets: each secret under its name in upper case
    /// (`github_token` → `GITHUB_TOKEN`).
    pub fn env(&self) -> HashMap<String, String> {
        self.values.iter().map(|(k, v)| (k.to_ascii_uppercase(), v.clone())).collect()
    }

    /// Names whose values are not available on this attempt.
    pub fn missing(&self) -> &[String] {
        &self.lost
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.lost.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_redacted_while_held_and_named_in_upper_case_for_commands() {
        let secrets = RunSecrets::new([("deploy_key".to_owned(), "agent-secret-value-42".to_owned())].into());
        assert_eq!(secrets.env().get("DEPLOY_KEY").map(String::as_str), Some("agent-secret-value-42"));
        assert_eq!(redact::redact("x agent-secret-value-42"), "x [redacted]");
        assert!(!format!("{secrets:?}").contains("agent-secret"), "Debug never shows a value");
        drop(secrets);
        assert_eq!(redact::redact("x agent-secret-value-42"), "x agent-secret-value-42");
    }
}
