//! `runs.lead.acp_agents` (DeerFlow's `acp_agents`: the agents `invoke_acp_agent` may start) and
//! `runs.lead.acp` (how a call is bounded and what its permission requests are answered with).

use std::collections::BTreeMap;

use antler_kit::config::{ConfigError, check_range};
pub use antler_sandbox::config::SeccompMode;
use serde::{Deserialize, Serialize};

use super::policy::PermissionPolicy;

/// One external agent that speaks the Agent Client Protocol on its stdio.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AcpAgentConfig {
    /// The program (a path, or a name looked up on the runs service's PATH).
    pub command: String,
    pub args: Vec<String>,
    /// Added to the agent's environment (which is otherwise the runs service's own: an agent needs
    /// its API key and PATH; see the agent README).
    pub env: BTreeMap<String, String>,
    /// What the agent is good at: shown to the model in the tool's description.
    pub description: String,
}

/// `runs.lead.acp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AcpConfig {
    /// How long one call may take, start-up included; then its process group is killed.
    pub timeout_seconds: u64,
    /// The longest final text handed back to the model (the rest is cut with a marker).
    pub max_output_chars: usize,
    /// Permission requests granted without asking anyone: an ACP tool kind (`read`, `edit`, `delete`,
    /// `move`, `search`, `execute`, `think`, `fetch`, `switch_mode`, `other`), `title:<prefix>` or `*`.
    /// Empty (the default): every request is denied.
    pub permissions: Vec<String>,
    /// The sandbox service's directory (`{server.data_dir}/sandbox`, where it keeps
    /// `users/{user}/threads/{thread}/acp-workspace`). Empty: the runs service's own
    /// `{server.data_dir}/sandbox`, right when both run in one process (`antler up`) or share the data
    /// directory; set it when the sandbox service's data directory is mounted elsewhere.
    pub workspace_root: String,
    /// How the agent's process is confined (see the agent README).
    pub isolation: Isolation,
    /// Whether a confined agent shares the host's network (its model API is usually remote).
    pub network: bool,
    /// The system-call filter of a confined agent: the sandbox service's (`strict`) or none (`off`).
    pub seccomp: SeccompMode,
    /// Host paths a confined agent must not see, besides the data directory and `workspace_root`
    /// (absolute; directories become empty, files read as empty).
    pub hidden_paths: Vec<String>,
    /// `server.data_dir`, hidden from a confined agent (the database, every thread's files); filled
    /// in by the runs service, not a setting.
    #[serde(skip)]
    pub data_dir: String,
}

/// `runs.lead.acp.isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Under bubblewrap: the host read-only, the hidden paths empty, the ACP workspace the only
    /// writable place.
    Bwrap,
    /// A plain child process of the runs service, as DeerFlow runs it.
    #[serde(rename = "none")]
    Unconfined,
}

impl Default for AcpConfig {
    fn default() -> Self {
        Self {
            timeout_seconds: 600,
            max_output_chars: 20_000,
            permissions: Vec::new(),
            workspace_root: String::new(),
            isolation: Isolation::Bwrap,
            network: true,
            seccomp: SeccompMode::Strict,
            hidden_paths: Vec::new(),
            data_dir: String::new(),
        }
    }
}

/// Checks both sections; the error names the setting.
pub fn validate(agents: &BTreeMap<String, AcpAgentConfig>, acp: &AcpConfig) -> Result<(), ConfigError> {
    for (name, agent) in agents {
        let valid = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(ConfigError::Invalid {
                path: "runs.lead.acp_agents".to_owned(),
                message: format!("`{name}` is not a valid agent name (letters, digits, `-` and `_`, at most 64)"),
            });
        }
        if agent.command.trim().is_empty() {
            return Err(ConfigError::Invalid {
                path: format!("runs.lead.acp_agents.{name}.command"),
                message: "is empty; give the program that speaks ACP on its stdio".to_owned(),
            });
        }
    }
    check_range("runs.lead.acp.timeout_seconds", acp.timeout_seconds, 1, 86_400)?;
    check_range("runs.lead.acp.max_output_chars", acp.max_output_chars as u64, 100, 1_000_000)?;
    PermissionPolicy::parse(&acp.permissions)
        .map_err(|message| ConfigError::Invalid { path: "runs.lead.acp.permissions".to_owned(), message })?;
    for (i, hidden) in acp.hidden_paths.iter().enumerate() {
        let path = std::path::Path::new(hidden);
        if !path.is_absolute() || path.parent().is_none() {
            return Err(ConfigError::Invalid {
                path: format!("runs.lead.acp.hidden_paths[{i}]"),
                message: format!("`{hidden}` is not an absolute path below /; name the directory or file the agent must not see"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_commands_and_permissions_are_checked() {
        let good = AcpAgentConfig { command: "codex-acp".to_owned(), ..Default::default() };
        let agents = BTreeMap::from([("codex".to_owned(), good.clone())]);
        assert!(validate(&agents, &AcpConfig::default()).is_ok());
        let bad_name = BTreeMap::from([("a b".to_owned(), good)]);
        assert!(validate(&bad_name, &AcpConfig::default()).is_err());
        let no_command = BTreeMap::from([("x".to_owned(), AcpAgentConfig::default())]);
        let error = validate(&no_command, &AcpConfig::default()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("runs.lead.acp_agents.x.command"), "{error}");
        let unknown = AcpConfig { permissions: vec!["write".to_owned()], ..Default::default() };
        assert!(validate(&BTreeMap::new(), &unknown).is_err());
        let zero = AcpConfig { timeout_seconds: 0, ..Default::default() };
        assert!(validate(&BTreeMap::new(), &zero).is_err());
        for bad in ["relative/dir", "/"] {
            let hidden = AcpConfig { hidden_paths: vec!["/etc/ssh".to_owned(), bad.to_owned()], ..Default::default() };
            let error = validate(&BTreeMap::new(), &hidden).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("runs.lead.acp.hidden_paths[1]"), "{error}");
        }
    }

    #[test]
    fn agents_are_confined_by_default_and_the_keys_parse() -> Result<(), serde_yaml_ng::Error> {
        let default = AcpConfig::default();
        assert_eq!((default.isolation, default.network, default.seccomp), (Isolation::Bwrap, true, SeccompMode::Strict));
        let set: AcpConfig = serde_yaml_ng::from_str("isolation: none\nnetwork: false\nseccomp: off\nhidden_paths: [/etc/ssh]\n")?;
        assert_eq!((set.isolation, set.network, set.seccomp), (Isolation::Unconfined, false, SeccompMode::Off));
        assert_eq!(set.hidden_paths, ["/etc/ssh"]);
        assert!(serde_yaml_ng::from_str::<AcpConfig>("isolation: docker\n").is_err());
        assert!(serde_yaml_ng::from_str::<AcpConfig>("data_dir: /x\n").is_err(), "filled in, not set");
        Ok(())
    }
}
