//! The request-scoped `secrets` of the runs this replica admitted: never stored, kept in memory until
//! the run ends and handed to its attempt here (see `antler_agent::RunSecrets`). An attempt that
//! another replica (or this one after a restart) takes over runs without them; the stored request
//! keeps their names, so it knows what it lacks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use antler_agent::RunSecrets;

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

    /// Gives run `to` (a subagent run) the secrets of run `from` (its parent), if kept here.
    pub fn share(&self, from: &str, to: &str) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(secrets) = runs.get(from).cloned() {
            runs.insert(to.to_owned(), secrets);
        }
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
        assert_eq!(antler_kit::redact::redact("token ghp_vault_test_value_123"), "token [redacted]");
        vault.forget("r1");
        drop(attempt);
        assert_eq!(antler_kit::redact::redact("token ghp_vault_test_value_123"), "token ghp_vault_test_value_123");
    }

    #[test]
    fn a_taken_over_run_knows_which_secrets_it_lacks() {
        let vault = Vault::default();
        let attempt = vault.for_attempt("r2", vec!["api_token".to_owned()]);
        assert_eq!(attempt.missing(), ["api_token"]);
        assert!(attempt.env().is_empty());
    }
}
