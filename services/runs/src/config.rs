//! The `runs` section of `antler.yaml`.

use std::time::Duration;

use antler_kit::Config;
use antler_kit::config::{ConfigError, check_range};
use serde::{Deserialize, Serialize};

/// `runs.context_keys` by default: presentation hints a client may pass to the agent.
pub const DEFAULT_CONTEXT_KEYS: [&str; 4] = ["locale", "timezone", "mode", "client"];

/// Context keys the server owns (never settable by a request, whatever `runs.context_keys` says).
pub const CONTEXT_OWNED_KEYS: [&str; 3] = ["thread_id", "run_id", "is_internal"];

/// Settings of the runs service. Every limit is configurable; the defaults follow DeerFlow where it
/// has one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsConfig {
    /// Database connection.
    pub database: DatabaseConfig,
    /// Runs executing at once on this replica; further admitted runs wait PENDING.
    pub max_concurrent_runs: u32,
    /// How long a worker owns a RUNNING run without renewing, in seconds (renewed every third of it).
    pub lease_secs: u64,
    /// Extra time after a lease expires before another worker may claim the run, in seconds.
    pub lease_grace_secs: u64,
    /// How often expired leases, startable PENDING runs and stale idempotency keys are swept, in seconds.
    pub sweep_interval_secs: u64,
    /// Rows one sweeper query reads (expired leases, stranded queued threads): a sweep works through
    /// any number of them a batch at a time, never holding more than this many in memory.
    pub sweep_batch: u32,
    /// Attempts (starts plus takeovers) before a run ends ERROR with stop_reason `max_attempts_exceeded`.
    pub max_attempts: u32,
    /// On SIGTERM, how long running runs may go on before their leases are released for another
    /// replica (or the next start) to resume them, in seconds.
    pub drain_secs: u64,
    /// Recursion limit when a request gives none.
    pub recursion_limit_default: u32,
    /// Wall-clock limit of a run from RUNNING, in seconds: the default and the largest
    /// `config.max_duration` a request may ask for (1..604800).
    pub max_run_duration_secs: u64,
    /// Largest recursion limit a request may ask for (larger values are clamped to it).
    pub recursion_limit_max: u32,
    /// How long an idempotency key keeps naming its run, in seconds.
    pub idempotency_retention_secs: u64,
    /// Interval of heartbeat events on an idle stream, in seconds.
    pub heartbeat_secs: u64,
    /// ENQUEUE runs waiting on one thread.
    pub max_queued_per_thread: u32,
    /// PENDING runs (all replicas together) beyond which CreateRun answers RESOURCE_EXHAUSTED with
    /// retry-after instead of queueing without bound; 0 = no limit.
    pub max_pending_runs: u64,
    /// Runs of one user that have not ended (PENDING, RUNNING, FINALIZING) beyond which CreateRun
    /// answers RESOURCE_EXHAUSTED naming this setting; 0 = no limit.
    pub max_active_runs_per_user: u64,
    /// PENDING runs of one user beyond which CreateRun answers RESOURCE_EXHAUSTED naming this
    /// setting; 0 = no limit.
    pub max_pending_runs_per_user: u64,
    /// Event streams (StreamRun, JoinRun, and the LangGraph edge's SSE streams) open at once on this
    /// replica; one more answers RESOURCE_EXHAUSTED naming this setting. Calls of the services
    /// themselves (in-process, service principals) do not count.
    pub max_streams: u64,
    /// Event streams of one user open at once on this replica (RESOURCE_EXHAUSTED beyond).
    pub max_streams_per_user: u64,
    /// Messages in one CreateRun input.
    pub max_input_messages: u32,
    /// Size of CreateRun metadata (as JSON), in bytes.
    pub max_metadata_bytes: u32,
    /// Size of a whole CreateRunRequest (also inside StreamRun / WaitRun), in bytes; larger requests
    /// get RESOURCE_EXHAUSTED naming this setting. Independent of (and below) the server-wide
    /// `server.max_message_bytes`, which also bounds sandbox uploads.
    pub max_request_bytes: u32,
    /// Keys a request may set in `config.context` (made available to the agent as run context);
    /// any other key is refused with INVALID_ARGUMENT naming it.
    pub context_keys: Vec<String>,
    /// Live events buffered per run for subscribers; a subscriber further behind re-reads the store.
    pub event_buffer: u32,
    /// The fallback of wake-ups (see `crate::notify`), in milliseconds: this often the replica reads
    /// the progress of every run its subscribers and waiters watch, in one query, and wakes those a
    /// notification missed. Live events, waits and cross-replica cancels do not wait for it.
    pub safety_poll_ms: u64,
    /// A checkpoint is stored as what changed since its parent, and as a full snapshot when its
    /// parent is this many deltas from its own snapshot: a read replays at most this many deltas.
    /// 1 stores every checkpoint whole (the storage of before compact checkpoints).
    pub checkpoint_snapshot_every: u32,
    /// Messages whose protobuf encoding is at least this many bytes are stored once per thread
    /// (`checkpoint_blobs`, by sha256) and referenced from every checkpoint that holds them.
    pub checkpoint_blob_min_bytes: u32,
    /// The most message bytes GetThreadState and WaitRun put in one answer: the newest messages
    /// that fit are returned, with a token for the older ones (keeps answers under the gRPC
    /// message limit, `server.max_message_bytes`).
    pub state_max_message_bytes: u32,
    /// The agent runs execute. `lead` (the default): the lead agent, a model ⇄ tools loop through the
    /// models and sandbox services (settings in `lead`). `script`: a deterministic agent with no model
    /// that echoes the input, or follows a JSON script given as the input text (see the README); the
    /// runs service's own tests and benchmarks drive the lifecycle with it.
    pub agent: AgentKind,
    /// Settings of the lead agent (used with `agent: lead`).
    pub lead: antler_agent::lead::config::LeadConfig,
    /// Moved: the HTTP edge is a service of its own, configured in the top-level `edge` section. Kept
    /// only to refuse an old file with a hint instead of "unknown field".
    #[serde(skip_serializing)]
    pub langgraph_api: Option<serde_json::Value>,
}

impl Default for RunsConfig {
    fn default() -> Self {
        Self {
            database: DatabaseConfig::default(),
            max_concurrent_runs: 32,
            lease_secs: 30,
            lease_grace_secs: 10,
            sweep_interval_secs: 10,
            sweep_batch: 256,
            max_attempts: 3,
            drain_secs: 10,
            recursion_limit_default: 100,
            recursion_limit_max: 1000,
            max_run_duration_secs: 3600,
            idempotency_retention_secs: 24 * 3600,
            heartbeat_secs: 15,
            max_queued_per_thread: 10,
            max_pending_runs: 10_000,
            max_active_runs_per_user: 2_000,
            max_pending_runs_per_user: 1_000,
            max_streams: 10_000,
            max_streams_per_user: 100,
            max_input_messages: 100,
            max_metadata_bytes: 16 * 1024,
            max_request_bytes: 4 * 1024 * 1024,
            context_keys: DEFAULT_CONTEXT_KEYS.iter().map(|k| (*k).to_owned()).collect(),
            event_buffer: 1024,
            safety_poll_ms: 5_000,
            checkpoint_snapshot_every: 32,
            checkpoint_blob_min_bytes: 4096,
            state_max_message_bytes: 8 * 1024 * 1024,
            agent: AgentKind::Lead,
            lead: Default::default(),
            langgraph_api: None,
        }
    }
}

/// Which agent executes runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    Script,
    Lead,
}

/// Where runs, threads, events and checkpoints are stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://path` or `postgres://user@host/db`. Empty: SQLite at `<data_dir>/runs.db`. More than
    /// one replica needs PostgreSQL.
    pub url: String,
    /// Connections in the pool (on SQLite: the connections that read; writes have their own).
    /// Unset: 16 on PostgreSQL, [`SQLITE_READERS`] on SQLite.
    pub max_connections: Option<u32>,
    /// PostgreSQL: connections of a second, small pool kept for lease renewals, replica heartbeats
    /// and takeovers, so run traffic that fills `max_connections` cannot delay the writes that keep a
    /// live replica's leases (a late renewal fences a healthy run) or a dead one's runs moving
    /// (1..16; each replica opens up to `max_connections` + this many). SQLite: unused.
    pub control_connections: u32,
    /// Time to wait for a connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// SQLite: how long a write waits for another process's lock before failing, in milliseconds.
    pub sqlite_busy_timeout_ms: u64,
    /// SQLite: the most the write-ahead log keeps on disk, in MiB. While there are writes it is
    /// rewound every half second (copied into the database, then written again from its start), and
    /// truncated past a quarter of this; a quiet writer's WAL (heartbeats and sweeps only) is
    /// truncated to zero.
    pub sqlite_wal_max_mib: u64,
    /// SQLite: the most of the single writer's time that admissions (CreateRun batches) take while
    /// starts, event appends and finalizations wait for it, in percent (1..100). The rest keeps the
    /// workers finishing runs under an admission flood; a writer nobody else wants is the
    /// admissions' whole. Under a flood beside busy workers, admissions then go about as fast as runs
    /// finish (backpressure), not as fast as the writer could insert them.
    pub sqlite_admission_share_percent: u64,
    /// SQLite: the most lifecycle writes (starts, event appends, checkpoints, finalizations) that
    /// are committed together in one transaction, each in a savepoint of its own (1..1000; 1: each
    /// its own). A group holds what waited for the writer while the one before it ran: every write
    /// is acknowledged only after the COMMIT that holds it, so a bigger group adds at most its own
    /// writes' time to the first one's latency and saves a commit per extra write.
    pub sqlite_group_commit_max: u32,
    /// PostgreSQL: how long a session may sit inside a transaction without sending a statement before
    /// the server ends it, in milliseconds (`idle_in_transaction_session_timeout`; 0 = never). Antler's
    /// transactions are a few statements back to back; one that waits this long belongs to a replica
    /// that is frozen (SIGSTOP, a paused VM, a stalled node) and whose row locks would otherwise stop
    /// every other replica from starting or taking over the runs it touched, for as long as it stays
    /// frozen. Keep it below `lease_secs` so takeovers are not held up past the lease.
    pub postgres_idle_in_transaction_timeout_ms: u64,
}

/// The default pool of a PostgreSQL store.
pub const POSTGRES_CONNECTIONS: u32 = 16;
/// The default reading connections of a SQLite store. Each is a thread of its own with a page cache of
/// up to 2 MiB; a read takes microseconds on the caller's machine, so more readers than cores add
/// threads and memory after a burst of runs (the `footprint` bench shows how much), not throughput.
pub const SQLITE_READERS: u32 = 4;

impl DatabaseConfig {
    /// `max_connections`, or the default of the store's backend.
    pub fn pool_size(&self) -> u32 {
        let sqlite = self.url.is_empty() || self.url.starts_with("sqlite:");
        self.max_connections.unwrap_or(if sqlite { SQLITE_READERS } else { POSTGRES_CONNECTIONS })
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            max_connections: None,
            control_connections: 2,
            connect_timeout_ms: 5_000,
            sqlite_busy_timeout_ms: 5_000,
            sqlite_wal_max_mib: 64,
            sqlite_admission_share_percent: 5,
            sqlite_group_commit_max: 32,
            postgres_idle_in_transaction_timeout_ms: 10_000,
        }
    }
}

impl RunsConfig {
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }

    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.lease_grace_secs)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let db = &self.database;
        if !(db.url.is_empty() || db.url.starts_with("sqlite:") || db.url.starts_with("postgres://") || db.url.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid {
                path: "runs.database.url".to_owned(),
                message: "must start with sqlite: or postgres:// (or be empty for SQLite in the data directory)".to_owned(),
            });
        }
        if let Some(max) = db.max_connections {
            check_range("runs.database.max_connections", max.into(), 1, 1000)?;
        }
        check_range("runs.database.control_connections", db.control_connections.into(), 1, 16)?;
        check_range("runs.database.connect_timeout_ms", db.connect_timeout_ms, 100, 600_000)?;
        check_range("runs.database.sqlite_busy_timeout_ms", db.sqlite_busy_timeout_ms, 0, 600_000)?;
        check_range("runs.database.sqlite_wal_max_mib", db.sqlite_wal_max_mib, 4, 65_536)?;
        check_range("runs.database.sqlite_admission_share_percent", db.sqlite_admission_share_percent, 1, 100)?;
        check_range("runs.database.sqlite_group_commit_max", u64::from(db.sqlite_group_commit_max), 1, 1000)?;
        let idle = db.postgres_idle_in_transaction_timeout_ms;
        if idle != 0 && !(100..=3_600_000).contains(&idle) {
            return Err(ConfigError::OutOfRange {
                path: "runs.database.postgres_idle_in_transaction_timeout_ms".to_owned(),
                value: idle.to_string(),
                limit: "must be 0 (never) or between 100 and 3600000 (keep it below lease_secs)".to_owned(),
            });
        }
        check_range("runs.max_concurrent_runs", self.max_concurrent_runs.into(), 1, 100_000)?;
        check_range("runs.lease_secs", self.lease_secs, 3, 3600)?;
        check_range("runs.lease_grace_secs", self.lease_grace_secs, 0, 3600)?;
        check_range("runs.sweep_interval_secs", self.sweep_interval_secs, 1, 10)?;
        check_range("runs.sweep_batch", self.sweep_batch.into(), 1, 100_000)?;
        check_range("runs.max_attempts", self.max_attempts.into(), 1, 100)?;
        check_range("runs.drain_secs", self.drain_secs, 0, 3600)?;
        check_range("runs.max_run_duration_secs", self.max_run_duration_secs, 1, 7 * 86_400)?;
        check_range("runs.recursion_limit_max", self.recursion_limit_max.into(), 1, 100_000)?;
        check_range("runs.recursion_limit_default", self.recursion_limit_default.into(), 1, self.recursion_limit_max.into())?;
        check_range("runs.idempotency_retention_secs", self.idempotency_retention_secs, 60, 30 * 86_400)?;
        check_range("runs.heartbeat_secs", self.heartbeat_secs, 1, 3600)?;
        check_range("runs.max_queued_per_thread", self.max_queued_per_thread.into(), 0, 10_000)?;
        check_range("runs.max_pending_runs", self.max_pending_runs, 0, 100_000_000)?;
        check_range("runs.max_active_runs_per_user", self.max_active_runs_per_user, 0, 100_000_000)?;
        check_range("runs.max_pending_runs_per_user", self.max_pending_runs_per_user, 0, 100_000_000)?;
        check_range("runs.max_streams", self.max_streams, 1, 10_000_000)?;
        check_range("runs.max_streams_per_user", self.max_streams_per_user, 1, 10_000_000)?;
        check_range("runs.max_input_messages", self.max_input_messages.into(), 1, 100_000)?;
        check_range("runs.max_metadata_bytes", self.max_metadata_bytes.into(), 256, 16 * 1024 * 1024)?;
        check_range("runs.max_request_bytes", self.max_request_bytes.into(), 4096, 1 << 30)?;
        check_range("runs.checkpoint_snapshot_every", self.checkpoint_snapshot_every.into(), 1, 1024)?;
        check_range("runs.checkpoint_blob_min_bytes", self.checkpoint_blob_min_bytes.into(), 256, 1 << 30)?;
        check_range("runs.state_max_message_bytes", self.state_max_message_bytes.into(), 65_536, 1 << 30)?;
        check_range("runs.context_keys (entries)", self.context_keys.len() as u64, 0, 256)?;
        if let Some(key) = self.context_keys.iter().find(|k| {
            k.is_empty()
                || antler_kit::input_keys::is_reserved(k)
                || antler_kit::input_keys::is_credential(k)
                || CONTEXT_OWNED_KEYS.contains(&k.as_str())
        }) {
            return Err(ConfigError::Invalid {
                path: "runs.context_keys".to_owned(),
                message: format!("`{key}` cannot be allowed: it is empty, reserved for the server or names a credential"),
            });
        }
        check_range("runs.event_buffer", self.event_buffer.into(), 16, 1_000_000)?;
        check_range("runs.safety_poll_ms", self.safety_poll_ms, 100, 3_600_000)?;
        self.lead.validate()?;
        if self.langgraph_api.is_some() {
            return Err(ConfigError::Invalid {
                path: "runs.langgraph_api".to_owned(),
                message: "the LangGraph API moved to the HTTP edge service, configured in the top-level `edge` section with the \
                          same keys\nhint: rename `runs: {langgraph_api: {...}}` to `edge: {...}`; `antler up` serves it, or \
                          `antler serve edge` on its own"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// Parses and checks the `runs` section.
pub fn load(config: &Config) -> Result<RunsConfig, ConfigError> {
    let runs: RunsConfig = config.section("runs")?;
    runs.validate()?;
    Ok(runs)
}

/// Parses and checks the `runs` section (for start-up, reloads and `antler config check`), and that
/// the run workers can reach the services they call with auth on (see
/// [`Config::require_service_token`]).
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    let runs = load(config)?;
    let worker = "for each run's worker (background work)";
    config.require_service_token("runs", "sandbox", worker)?;
    if runs.agent == AgentKind::Lead {
        config.require_service_token("runs", "models", worker)?;
        if runs.lead.mcp.enabled {
            config.require_service_token("runs", "mcp", worker)?;
        }
        if runs.lead.memory.enabled {
            config.require_service_token("runs", "memory", worker)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_defaults_to_the_backend_s_and_a_set_size_wins() {
        let db = |url: &str, max: Option<u32>| DatabaseConfig { url: url.to_owned(), max_connections: max, ..DatabaseConfig::default() };
        assert_eq!(db("", None).pool_size(), SQLITE_READERS);
        assert_eq!(db("sqlite:///tmp/runs.db", None).pool_size(), SQLITE_READERS);
        assert_eq!(db("postgres://u@h/d", None).pool_size(), POSTGRES_CONNECTIONS);
        assert_eq!(db("", Some(9)).pool_size(), 9);
        assert_eq!(db("postgres://u@h/d", Some(3)).pool_size(), 3);
    }

    #[test]
    fn with_auth_on_a_remote_service_without_a_service_token_is_refused_by_name() {
        let yaml = |extra: &str| {
            format!(
                "server:\n  auth:\n    enabled: true\n    api_keys: [{{key: alice-key-0123456789, user: alice}}]\nclients:\n  sandbox: {{endpoint: 'http://sandbox:50051', service_token: svc-key-0123456789}}\n  memory: {{endpoint: 'http://memory:50051'}}\n{extra}"
            )
        };
        let check = |extra: &str| Config::parse(&yaml(extra), "test", &|_| None).and_then(|c| validate(&c));
        // Memory off: the workers never call it, so no token is needed for it.
        assert!(check("").is_ok(), "{:?}", check(""));
        let error = check("runs:\n  lead:\n    memory:\n      enabled: true\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("clients.memory.service_token") && error.contains("http://memory:50051"), "{error}");
        assert!(error.contains("hint:"), "{error}");
        // One process (empty endpoints): no token needed whatever is on.
        let one_process = "server:\n  auth:\n    enabled: true\n    api_keys: [{key: alice-key-0123456789, user: alice}]\nruns:\n  lead:\n    memory:\n      enabled: true\n";
        assert!(Config::parse(one_process, "test", &|_| None).and_then(|c| validate(&c)).is_ok());
        // Auth off: nothing to present.
        let no_auth = "clients:\n  memory: {endpoint: 'http://memory:50051'}\nruns:\n  lead:\n    memory:\n      enabled: true\n";
        assert!(Config::parse(no_auth, "test", &|_| None).and_then(|c| validate(&c)).is_ok());
    }

    #[test]
    fn the_old_langgraph_api_block_is_refused_with_the_section_it_moved_to() {
        let old = "runs:\n  langgraph_api:\n    listen: 127.0.0.1:2024\n";
        let error = Config::parse(old, "test", &|_| None).and_then(|c| validate(&c)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("runs.langgraph_api") && error.contains("`edge`"), "{error}");
    }

    #[test]
    fn the_idle_in_transaction_timeout_is_off_or_in_range() {
        let mut config = RunsConfig::default();
        for ok in [0, 100, 10_000, 3_600_000] {
            config.database.postgres_idle_in_transaction_timeout_ms = ok;
            assert!(config.validate().is_ok(), "{ok}");
        }
        for bad in [1, 99, 3_600_001] {
            config.database.postgres_idle_in_transaction_timeout_ms = bad;
            let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("postgres_idle_in_transaction_timeout_ms") && error.contains("0 (never)"), "{bad}: {error}");
        }
    }
}
