//! Turning the `mcp` section and the extensions file into the list of server entries in force, with the
//! problems found and the hash that identifies this configuration.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::McpConfig;
use crate::extensions::{self, EntryContext, EntryProblem, FileError};
use crate::spec::ServerSpec;

/// The servers a configuration defines.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub servers: BTreeMap<String, ServerSpec>,
    pub problems: Vec<EntryProblem>,
    /// First 16 hex of SHA-256 over the file's bytes, the inline entries and the stdio policy.
    pub hash: String,
    /// The extensions file, when there is one.
    pub file: Option<PathBuf>,
}

/// Reads everything. A file that cannot be read or parsed is an error (the caller keeps what it had); a bad
/// entry is a problem in the result.
pub fn load(mcp: &McpConfig, antler_yaml: Option<&Path>, cwd: &Path) -> Result<Loaded, FileError> {
    let env_path = std::env::var(extensions::PATH_ENV).ok();
    let file = extensions::locate(mcp.configured_file(antler_yaml).as_deref(), env_path.as_deref(), cwd)?;
    let parsed = file.as_deref().map(extensions::read_file).transpose()?;
    let policy = mcp.policy();
    let lookup = |name: &str| std::env::var(name).ok();
    let max_call_timeout = mcp.max_call_timeout();
    let mut servers = BTreeMap::new();
    let mut problems = Vec::new();
    let mut hasher = Sha256::new();
    // What decides which entries load is part of the configuration's identity too.
    hasher.update(policy.allowlist.join("\0").as_bytes());
    hasher.update(max_call_timeout.as_secs().to_le_bytes());
    if let Some(parsed) = &parsed {
        hasher.update(parsed.sha256);
        if !parsed.ignored_keys.is_empty() {
            tracing::info!(file = %parsed.path.display(), keys = ?parsed.ignored_keys, "extensions config: top-level keys not used by Antler are ignored");
        }
        let ctx = EntryContext { policy: &policy, lookup: &lookup, max_call_timeout, strict: false };
        for (name, raw) in &parsed.servers {
            match extensions::parse_entry(name, raw, ctx) {
                Ok(spec) => {
                    if !spec.ignored_keys.is_empty() {
                        tracing::info!(server = %name, keys = ?spec.ignored_keys, "extensions config: keys not used by Antler are ignored");
                    }
                    servers.insert(name.clone(), spec);
                }
                Err(problem) => {
                    tracing::warn!(problem = %problem, "extensions config: server entry skipped");
                    problems.push(problem);
                }
            }
        }
    }
    let ctx = EntryContext { policy: &policy, lookup: &lookup, max_call_timeout, strict: true };
    for (name, raw) in &mcp.servers {
        hasher.update(name.as_bytes());
        hasher.update(raw.to_string().as_bytes());
        match extensions::parse_entry(name, raw, ctx) {
            Ok(spec) => {
                if servers.insert(name.clone(), spec).is_some() {
                    tracing::info!(server = %name, "mcp.servers entry replaces the extensions file's entry of the same name");
                }
            }
            Err(problem) => problems.push(problem),
        }
    }
    let hash = hex::encode(hasher.finalize())[..16].to_owned();
    Ok(Loaded { servers, problems, hash, file })
}
