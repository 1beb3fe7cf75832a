//! How an ACP agent's process is started (`runs.lead.acp.isolation`): under bubblewrap with the
//! thread's ACP workspace as its only writable place (`bwrap`, the default; the mount plan is the
//! sandbox crate's [`antler_sandbox::confine`]), or as a plain child of the runs service (`none`).
//!
//! Hidden from a confined agent: the data directory (`server.data_dir`: the database, every user's
//! sandbox files), the sandbox directory (`workspace_root`, when it lies elsewhere) and
//! `hidden_paths`. Its own workspace is bound back on top at its host path, so the cwd and the paths
//! in `session/new` are the same inside and out.

use std::path::{Path, PathBuf};

use antler_sandbox::confine::{Confinement, find_bwrap};
use antler_sandbox::seccomp::{Filter, SeccompError};

use super::config::{AcpAgentConfig, AcpConfig, Isolation, SeccompMode};

/// The agent's process, not yet started: environment and cwd set, stdio left to the caller. Err
/// says why it cannot be started, naming the setting.
pub fn command(agent: &AcpAgentConfig, config: &AcpConfig, workspace: &Path) -> Result<tokio::process::Command, String> {
    let mut command = match config.isolation {
        Isolation::Unconfined => {
            let mut plain = tokio::process::Command::new(&agent.command);
            plain.args(&agent.args);
            plain
        }
        Isolation::Bwrap => confined(agent, config, workspace)?,
    };
    // bwrap hands its environment on to the agent.
    command.envs(&agent.env).current_dir(workspace);
    Ok(command)
}

fn confined(agent: &AcpAgentConfig, config: &AcpConfig, workspace: &Path) -> Result<tokio::process::Command, String> {
    let bwrap = find_bwrap().map_err(|e| {
        format!(
            "{e}, and runs.lead.acp.isolation is bwrap\nhint: install bubblewrap on the runs host, or set runs.lead.acp.isolation: none to run ACP agents unconfined"
        )
    })?;
    let filter = match config.seccomp {
        SeccompMode::Off => None,
        SeccompMode::Strict => Some(host_filter().map_err(|e| seccomp_refusal(e.clone()))?),
    };
    let confinement = Confinement { writable: workspace.to_path_buf(), hidden: hidden(config), network: config.network };
    confinement
        .command(&bwrap, filter, agent.command.as_ref(), &agent.args)
        .map_err(|e| format!("cannot confine the agent (runs.lead.acp.isolation: bwrap): {e}"))
}

/// The strict filter, compiled once per process (it depends on the host's architecture only).
fn host_filter() -> Result<&'static Filter, &'static SeccompError> {
    static FILTER: std::sync::OnceLock<Result<Filter, SeccompError>> = std::sync::OnceLock::new();
    FILTER.get_or_init(Filter::for_this_host).as_ref()
}

/// What a confined agent must not see.
fn hidden(config: &AcpConfig) -> Vec<PathBuf> {
    [&config.data_dir, &config.workspace_root]
        .into_iter()
        .chain(&config.hidden_paths)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The sandbox crate's message names `sandbox.seccomp`; this filter is `runs.lead.acp.seccomp`.
fn seccomp_refusal(error: SeccompError) -> String {
    let why = match error {
        SeccompError::UnsupportedArch { arch } => format!("the filter is built for x86_64 and aarch64 only and this host is {arch}"),
        SeccompError::Build(why) => format!("the filter could not be built: {why}"),
    };
    format!(
        "runs.lead.acp.seccomp is strict, but {why}\nhint: set runs.lead.acp.seccomp: off to run ACP agents under bwrap without a seccomp filter"
    )
}

/// A hint for a confined agent that failed with bwrap's own complaint on its stderr.
pub fn hint(config: &AcpConfig, stderr: &str) -> Option<&'static str> {
    (config.isolation == Isolation::Bwrap && stderr.lines().any(|l| l.starts_with("bwrap: "))).then_some(
        "hint: bubblewrap could not build the agent's sandbox (runs.lead.acp.isolation: bwrap; it needs unprivileged user namespaces), \
         or could not start the agent's command in it; runs.lead.acp.isolation: none runs agents unconfined",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_directory_and_the_sandbox_directory_are_hidden_with_the_listed_paths() {
        let config = AcpConfig {
            data_dir: "/srv/antler".to_owned(),
            workspace_root: "/mnt/sandbox".to_owned(),
            hidden_paths: vec!["/etc/ssh".to_owned()],
            ..AcpConfig::default()
        };
        assert_eq!(hidden(&config), [PathBuf::from("/srv/antler"), "/mnt/sandbox".into(), "/etc/ssh".into()]);
        assert!(hidden(&AcpConfig::default()).is_empty());
    }

    #[test]
    fn seccomp_errors_name_the_acp_setting() {
        let message = seccomp_refusal(SeccompError::UnsupportedArch { arch: "riscv64" });
        assert!(
            message.contains("runs.lead.acp.seccomp") && !message.contains("sandbox.seccomp") && message.contains("riscv64"),
            "{message}"
        );
    }

    #[test]
    fn an_unconfined_agent_is_its_own_command_and_a_confined_one_runs_under_bwrap() -> Result<(), String> {
        let agent = AcpAgentConfig { command: "my-agent".to_owned(), args: vec!["--acp".to_owned()], ..Default::default() };
        let ws = Path::new("/srv/ws");
        let plain = command(&agent, &AcpConfig { isolation: Isolation::Unconfined, ..AcpConfig::default() }, ws)?;
        assert_eq!(plain.as_std().get_program(), "my-agent");
        // Real bwrap: CI installs it, so a missing one fails here rather than passing unchecked.
        let confined = command(&agent, &AcpConfig { seccomp: SeccompMode::Off, ..AcpConfig::default() }, ws)?;
        let std = confined.as_std();
        assert!(std.get_program().to_string_lossy().ends_with("/bwrap"), "{:?}", std.get_program());
        let args: Vec<String> = std.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(
            args.ends_with(&["--chdir".to_owned(), "/srv/ws".to_owned(), "--".to_owned(), "my-agent".to_owned(), "--acp".to_owned()]),
            "{args:?}"
        );
        assert!(!args.iter().any(|a| a == "--seccomp"), "seccomp: off: {args:?}");
        let filtered = command(&agent, &AcpConfig::default(), ws)?;
        assert!(filtered.as_std().get_args().any(|a| a == "--seccomp"), "strict by default");
        Ok(())
    }

    #[test]
    fn bwrap_failures_get_the_isolation_hint() {
        let config = AcpConfig::default();
        assert!(hint(&config, "bwrap: No permissions to creating new namespace").is_some());
        assert!(hint(&config, "Traceback: boom").is_none());
        assert!(hint(&AcpConfig { isolation: Isolation::Unconfined, ..config }, "bwrap: x").is_none());
    }
}
