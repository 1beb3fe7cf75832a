//! A run's request-scoped `secrets`: never stored, kept in the memory of the replica that admitted
//! the run until the run ends, given to its tools (as environment variables of sandbox commands), and
//! registered with the process's redactor meanwhile, so no event, stored field, status or log line
//! can carry one out (see `antler_kit::redact`).
//!
//! The price of never storing them: a run that another replica (or this one after a restart) takes
//! over runs without them. The stored request keeps the secrets' names with empty values, so the
//! new attempt knows what is missing and says so (`RunSecrets::lost`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

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

/// The secrets of the runs this replica admitted and that have not ended yet.
#[derive(Debug, Default)]
pub struct Vault {
    runs: Mutex<HashMap<String, Arc<RunSecrets>>>,
}

impl Vault {
    /// Keeps `values` for `run_id` (no-op for none).
    pub fn keep(&self, run_id: &str, values: BTreeMap<String, String>) {
        if values.is_empty() {
            return;
        }
        let secrets = Arc::new(RunSecrets::new(values));
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).insert(run_id.to_owned(), secrets);
    }

    /// The secrets for an attempt of `run_id` admitted with secrets named `names`.
    pub fn for_attempt(&self, run_id: &str, names: Vec<String>) -> Arc<RunSecrets> {
        if let Some(secrets) = self.runs.lock().unwrap_or_else(|p| p.into_inner()).get(run_id) {
            return secrets.clone();
        }
        if names.is_empty() { Arc::new(RunSecrets::none()) } else { Arc::new(RunSecrets::lost(names)) }
    }

    /// Forgets `run_id`'s secrets (its run ended, here or elsewhere).
    pub fn forget(&self, run_id: &str) {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).remove(run_id);
    }

    /// The runs whose secrets are kept.
    pub fn run_ids(&self) -> Vec<String> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_secrets_are_redacted_until_the_run_is_forgotten() {
        let vault = Vault::default();
        vault.keep("r1", [("github_token".to_owned(), "ghp_vault_test_value_123".to_owned())].into());
        let attempt = vault.for_attempt("r1", vec!["github_token".to_owned()]);
        assert_eq!(attempt.env().get("GITHUB_TOKEN").map(String::as_str), Some("ghp_vault_test_value_123"));
        assert_eq!(redact::redact("token ghp_vault_test_value_123"), "token [redacted]");
        assert!(!format!("{attempt:?}").contains("ghp_vault"), "Debug never shows a value");
        vault.forget("r1");
        drop(attempt);
        assert_eq!(redact::redact("token ghp_vault_test_value_123"), "token ghp_vault_test_value_123");
    }

    #[test]
    fn a_taken_over_run_knows_which_secrets_it_lacks() {
        let vault = Vault::default();
        let attempt = vault.for_attempt("r2", vec!["api_token".to_owned()]);
        assert_eq!(attempt.missing(), ["api_token"]);
        assert!(attempt.env().is_empty());
    }
}
