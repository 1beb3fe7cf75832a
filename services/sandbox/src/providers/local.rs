//! The `local` provider: commands are plain host processes (`/bin/sh -c`) running as the service's user,
//! in the thread's host workspace. It is not a security boundary — a command can read anything the
//! service can — so it is for trusted single-user set-ups, and commands are refused unless
//! `sandbox.allow_host_bash` is set. The file tools still enforce the path policy.
//!
//! Virtual paths in the command line are rewritten to the thread's host directories (commands expect
//! `/mnt/user-data/...` to exist), and output is masked back by the runner.

use aho_corasick::{AhoCorasick, MatchKind};
use tokio::process::Command;

use crate::paths::{Root, USER_DATA};
use crate::providers::{Launch, Provider, ProviderKind};

#[derive(Debug)]
pub struct LocalProvider {
    allow_host_bash: bool,
}

impl LocalProvider {
    pub fn new(allow_host_bash: bool) -> Self {
        Self { allow_host_bash }
    }
}

impl Provider for LocalProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Local
    }

    fn exec_refusal(&self) -> Option<String> {
        (!self.allow_host_bash).then(|| {
            "command execution is disabled: the local provider runs commands as plain host processes, which is not a security boundary\nhint: use the bwrap provider, or set sandbox.allow_host_bash: true for a trusted single-user setup".to_owned()
        })
    }

    fn network_enabled(&self) -> bool {
        true
    }

    fn command_refusal(&self, command: &str, cwd_in_skills: bool) -> Option<String> {
        super::read_only_guard::refusal(command, cwd_in_skills)
    }

    fn command(&self, launch: &Launch<'_>) -> std::io::Result<Command> {
        let home = launch.workspace.host_root(Root::Workspace);
        let env = crate::exec::env::build(launch.allowlist, launch.injected, &home.to_string_lossy());
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(map_virtual_paths(launch.command, launch.workspace)).current_dir(launch.cwd_host).env_clear().envs(env);
        Ok(command)
    }
}

/// Rewrites `/mnt/user-data/...` and `/mnt/skills...` in a command line to host paths. A match counts
/// only when the next character ends the path component (so `/mnt/user-data/workspace2` is left alone).
pub fn map_virtual_paths(command: &str, workspace: &crate::workspace::Workspace) -> String {
    let mut pairs: Vec<(String, String)> =
        Root::ALL.iter().map(|root| (root.virtual_path().to_owned(), workspace.host_root(*root).to_string_lossy().into_owned())).collect();
    if let Some(workspace_root) = workspace.host_root(Root::Workspace).parent() {
        pairs.push((USER_DATA.to_owned(), workspace_root.to_string_lossy().into_owned()));
    }
    let needles: Vec<&str> = pairs.iter().map(|(v, _)| v.as_str()).collect();
    let Ok(matcher) = AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&needles) else {
        return command.to_owned();
    };
    let mut out = String::with_capacity(command.len());
    let mut last = 0;
    for m in matcher.find_iter(command) {
        let boundary = command[m.end()..].chars().next().is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'));
        if !boundary {
            continue;
        }
        out.push_str(&command[last..m.start()]);
        out.push_str(&pairs[m.pattern().as_usize()].1);
        last = m.end();
    }
    out.push_str(&command[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    #[test]
    fn virtual_paths_map_to_host_paths_at_component_boundaries() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        let host = ws.host_root(Root::Workspace).to_string_lossy().into_owned();
        let mapped = map_virtual_paths("cat /mnt/user-data/workspace/a.txt > /mnt/user-data/workspace2/x", &ws);
        assert_eq!(mapped, format!("cat {host}/a.txt > /mnt/user-data/workspace2/x"));
        assert!(map_virtual_paths("ls /mnt/user-data", &ws).ends_with("/user-data"));
        Ok(())
    }

    #[test]
    fn commands_are_refused_without_allow_host_bash() {
        assert!(LocalProvider::new(false).exec_refusal().is_some());
        assert!(LocalProvider::new(true).exec_refusal().is_none());
    }
}
