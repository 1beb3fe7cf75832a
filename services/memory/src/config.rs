//! The `memory` section of `antler.yaml`. Names and defaults follow DeerFlow's `memory:` and DeerMem
//! settings where it has them (`enabled`, `injection_enabled`, `debounce_seconds`, `queue_max_depth`,
//! `max_facts`, `fact_confidence_threshold`, `max_injection_tokens`, `guaranteed_token_budget`); every
//! limit is checked against its documented range at start-up and on reload.

use antler_kit::Config;
use antler_kit::config::{ConfigError, check_range};
use serde::{Deserialize, Serialize};

/// Settings of the memory service.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Serve memory at all. false: every RPC answers FAILED_PRECONDITION and nothing is extracted.
    pub enabled: bool,
    /// Render injection blocks. false: RenderInjection returns empty text with `injection_disabled`.
    pub injection_enabled: bool,
    /// Database connection.
    pub database: DatabaseConfig,
    /// Seconds an update waits for a newer one of the same (user, agent, thread) before processing (1–300).
    pub debounce_seconds: u64,
    /// Updates waiting in the queue, all users together; beyond it QueueUpdate answers RESOURCE_EXHAUSTED
    /// (0 = unbounded).
    pub queue_max_depth: u64,
    /// Live facts per (user, agent) scope; beyond it the lowest (confidence, recency) are evicted (10–500).
    pub max_facts: u32,
    /// Extracted facts below this confidence are dropped (0–1).
    pub fact_confidence_threshold: f64,
    /// Token-set (Jaccard) similarity at or above which an extracted fact counts as a duplicate of a live
    /// one and confirms it instead of being added (0.5–1; 1 = exact duplicates only).
    pub duplicate_similarity: f64,
    /// Default token budget of RenderInjection for summaries and regular facts (100–8000).
    pub max_injection_tokens: u32,
    /// Tokens reserved for corrections on top of the budget (50–2000).
    pub correction_token_budget: u32,
    /// How RenderInjection counts tokens: `tiktoken` (cl100k_base, as the models service) or `chars`.
    pub token_counting: TokenCounting,
    /// Longest fact content, in characters.
    pub max_fact_chars: u32,
    /// Longest SearchFacts / RenderInjection query, in characters.
    pub max_query_chars: u32,
    /// Scopes whose sections and live facts RenderInjection keeps between calls, while their revisions
    /// stand (0 = off).
    pub render_cache_scopes: u32,
    /// Messages in one QueueUpdate.
    pub max_update_messages: u32,
    /// Characters of conversation kept per update (the newest are kept when cut).
    pub max_conversation_chars: u32,
    /// Largest ImportMemory document, in bytes.
    pub max_import_bytes: u32,
    /// Extraction model; empty = the update's model_name, else the models service's default.
    pub model_name: String,
    /// Existing facts shown to the extraction model (most relevant to the conversation first).
    pub extraction_context_facts: u32,
    /// How long one extraction model call may take, in seconds.
    pub extraction_timeout_secs: u64,
    /// How long a worker owns an update without renewing, in seconds (renewed every third of it).
    pub lease_secs: u64,
    /// Attempts per update before it is given up as failed.
    pub max_attempts: u32,
    /// Updates processed at once by this replica.
    pub workers: u32,
    /// How often a worker looks for due updates another replica queued, in milliseconds (in one
    /// process, FlushUpdates and a QueueUpdate due sooner than this wake the workers at once).
    pub poll_interval_ms: u64,
    /// Finished updates kept for FlushUpdates outcomes, in seconds, then deleted.
    pub retain_finished_secs: u64,
    /// Extracted facts matching any of these regular expressions are refused (transient states, upload
    /// notices, agent self-talk). Empty list = none; the defaults are in the README.
    pub refuse_patterns: Vec<String>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            injection_enabled: true,
            database: DatabaseConfig::default(),
            debounce_seconds: 30,
            queue_max_depth: 1000,
            max_facts: 100,
            fact_confidence_threshold: 0.7,
            duplicate_similarity: 0.8,
            max_injection_tokens: 2000,
            correction_token_budget: 500,
            token_counting: TokenCounting::Tiktoken,
            max_fact_chars: 4000,
            max_query_chars: 1000,
            render_cache_scopes: 1024,
            max_update_messages: 500,
            max_conversation_chars: 40_000,
            max_import_bytes: 8 * 1024 * 1024,
            model_name: String::new(),
            extraction_context_facts: 50,
            extraction_timeout_secs: 120,
            lease_secs: 30,
            max_attempts: 3,
            workers: 2,
            poll_interval_ms: 1000,
            retain_finished_secs: 3600,
            refuse_patterns: DEFAULT_REFUSE_PATTERNS.iter().map(|p| (*p).to_owned()).collect(),
        }
    }
}

/// Transient states and bookkeeping that are not durable facts about a user.
pub const DEFAULT_REFUSE_PATTERNS: [&str; 6] = [
    r"(?i)\b(the )?user is (currently |now |still )?(waiting|typing|online|offline|here|away|idle)\b",
    r"(?i)\b(uploaded|attached|shared) (a |an |the |some )?(file|files|document|image|screenshot)s?\b",
    r"(?i)\bin (this|the current) (conversation|session|chat|thread)\b",
    r"(?i)^(the )?(assistant|agent|ai|model) (is|was|will|has|should)\b",
    r"(?i)\b(tool[_ ]call|function[_ ]call|json schema|system prompt)\b",
    r"(?i)<\/?(memory|system-reminder|uploaded_files|current_uploads)>",
];

/// How tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenCounting {
    Tiktoken,
    Chars,
}

/// Where facts, summaries and the queue are stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://path` or `postgres://user@host/db`. Empty: SQLite at `<data_dir>/memory.db`. More than one
    /// replica needs PostgreSQL.
    pub url: String,
    /// Connections in the pool.
    pub max_connections: u32,
    /// Time to wait for a connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// SQLite: how long a write waits for another process's lock before failing, in milliseconds.
    pub sqlite_busy_timeout_ms: u64,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self { url: String::new(), max_connections: 16, connect_timeout_ms: 5_000, sqlite_busy_timeout_ms: 5_000 }
    }
}

fn check_fraction(path: &str, value: f64, min: f64, max: f64) -> Result<(), ConfigError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange { path: path.to_owned(), value: value.to_string(), limit: format!("must be between {min} and {max}") })
    }
}

impl MemoryConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let db = &self.database;
        if !(db.url.is_empty() || db.url.starts_with("sqlite:") || db.url.starts_with("postgres://") || db.url.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid {
                path: "memory.database.url".to_owned(),
                message: "must start with sqlite: or postgres:// (or be empty for SQLite in the data directory)".to_owned(),
            });
        }
        check_range("memory.database.max_connections", db.max_connections.into(), 1, 1000)?;
        check_range("memory.database.connect_timeout_ms", db.connect_timeout_ms, 100, 600_000)?;
        check_range("memory.database.sqlite_busy_timeout_ms", db.sqlite_busy_timeout_ms, 0, 600_000)?;
        check_range("memory.debounce_seconds", self.debounce_seconds, 1, 300)?;
        check_range("memory.queue_max_depth", self.queue_max_depth, 0, 10_000_000)?;
        check_range("memory.max_facts", self.max_facts.into(), 10, 500)?;
        check_fraction("memory.fact_confidence_threshold", self.fact_confidence_threshold, 0.0, 1.0)?;
        check_fraction("memory.duplicate_similarity", self.duplicate_similarity, 0.5, 1.0)?;
        check_range("memory.max_injection_tokens", self.max_injection_tokens.into(), 100, 8000)?;
        check_range("memory.correction_token_budget", self.correction_token_budget.into(), 50, 2000)?;
        check_range("memory.max_fact_chars", self.max_fact_chars.into(), 16, 100_000)?;
        check_range("memory.max_query_chars", self.max_query_chars.into(), 16, 100_000)?;
        check_range("memory.render_cache_scopes", self.render_cache_scopes.into(), 0, 1_000_000)?;
        check_range("memory.max_update_messages", self.max_update_messages.into(), 1, 100_000)?;
        check_range("memory.max_conversation_chars", self.max_conversation_chars.into(), 1000, 10_000_000)?;
        check_range("memory.max_import_bytes", self.max_import_bytes.into(), 1024, 1 << 30)?;
        check_range("memory.extraction_context_facts", self.extraction_context_facts.into(), 0, 500)?;
        check_range("memory.extraction_timeout_secs", self.extraction_timeout_secs, 1, 3600)?;
        check_range("memory.lease_secs", self.lease_secs, 3, 3600)?;
        check_range("memory.max_attempts", self.max_attempts.into(), 1, 100)?;
        check_range("memory.workers", self.workers.into(), 1, 256)?;
        check_range("memory.poll_interval_ms", self.poll_interval_ms, 50, 60_000)?;
        check_range("memory.retain_finished_secs", self.retain_finished_secs, 60, 30 * 86_400)?;
        for (i, pattern) in self.refuse_patterns.iter().enumerate() {
            if let Err(e) = regex::Regex::new(pattern) {
                return Err(ConfigError::Invalid { path: format!("memory.refuse_patterns[{i}]"), message: e.to_string() });
            }
        }
        Ok(())
    }
}

/// Parses and checks the `memory` section.
pub fn load(config: &Config) -> Result<MemoryConfig, ConfigError> {
    let memory: MemoryConfig = config.section("memory")?;
    memory.validate()?;
    Ok(memory)
}

/// Parses and checks the `memory` section (for start-up, reloads and `antler config check`).
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    load(config)?;
    // Extraction runs on the queue's own account: no caller token to forward.
    config.require_service_token("memory", "models", "to extract facts from queued conversations")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_follow_deerflow() {
        let config = MemoryConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!((config.debounce_seconds, config.queue_max_depth, config.max_facts), (30, 1000, 100));
        assert_eq!(config.max_injection_tokens, 2000);
    }

    #[test]
    fn out_of_range_values_name_the_key() {
        let config = MemoryConfig { fact_confidence_threshold: 2.0, ..MemoryConfig::default() };
        let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("memory.fact_confidence_threshold"), "{error}");
        let config = MemoryConfig { refuse_patterns: vec!["(".into()], ..MemoryConfig::default() };
        let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("memory.refuse_patterns[0]"), "{error}");
    }
}
