//! The environment a command gets: the host variables on the allowlist, HOME and TMPDIR, then the
//! request's injected variables (which win). Nothing else of the service's environment — API keys,
//! database URLs — reaches a command.

use std::collections::HashMap;

use crate::error::{Result, SandboxError};

/// `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_') && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks injected variables: names, count, value sizes, no NUL (it cannot be passed to a process).
pub fn check_injected(env: &HashMap<String, String>, max_vars: u64, max_value_bytes: u64) -> Result<()> {
    if env.len() as u64 > max_vars {
        return Err(SandboxError::invalid(
            "env",
            format!("{} variables, at most {max_vars} allowed (sandbox.commands.max_env_vars)", env.len()),
        ));
    }
    for (name, value) in env {
        if !valid_name(name) {
            return Err(SandboxError::invalid(
                format!("env[{}]", crate::error::echo(name)),
                "the name must match ^[A-Za-z_][A-Za-z0-9_]*$",
            ));
        }
        if value.len() as u64 > max_value_bytes {
            return Err(SandboxError::invalid(
                format!("env[{name}]"),
                format!("the value is {} bytes, at most {max_value_bytes} allowed (sandbox.commands.max_env_value_bytes)", value.len()),
            ));
        }
        if value.contains('\0') {
            return Err(SandboxError::invalid(format!("env[{name}]"), "the value contains a NUL byte"));
        }
    }
    Ok(())
}

/// Used when the service itself has no PATH.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The full environment of a command. `home` is the working directory as the command sees it.
pub fn build(allowlist: &[String], injected: &HashMap<String, String>, home: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        allowlist.iter().filter_map(|name| std::env::var(name).ok().map(|value| (name.clone(), value))).collect();
    if !env.iter().any(|(name, _)| name == "PATH") {
        env.push(("PATH".to_owned(), DEFAULT_PATH.to_owned()));
    }
    env.push(("HOME".to_owned(), home.to_owned()));
    env.push(("TMPDIR".to_owned(), "/tmp".to_owned()));
    let mut sorted: Vec<(&String, &String)> = injected.iter().collect();
    sorted.sort();
    for (name, value) in sorted {
        env.retain(|(existing, _)| existing != name);
        env.push((name.clone(), value.clone()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_shell_rule() {
        for ok in ["A", "_x", "PATH", "a1_B2"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B", "é"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn injected_variables_are_checked() {
        let ok = HashMap::from([("TOKEN".to_owned(), "v".to_owned())]);
        assert!(check_injected(&ok, 4, 10).is_ok());
        assert!(check_injected(&HashMap::from([("BAD-NAME".to_owned(), String::new())]), 4, 10).is_err());
        assert!(check_injected(&HashMap::from([("A".to_owned(), "x".repeat(11))]), 4, 10).is_err());
        assert!(check_injected(&ok, 0, 10).is_err());
    }

    #[test]
    fn only_the_allowlist_and_injected_variables_pass() {
        let env =
            build(&["PATH".to_owned(), "ANTLER_SURELY_UNSET_VAR".to_owned()], &HashMap::from([("HOME".to_owned(), "/x".to_owned())]), "/w");
        assert!(env.iter().any(|(k, _)| k == "PATH"));
        assert!(!env.iter().any(|(k, _)| k == "ANTLER_SURELY_UNSET_VAR"));
        let homes: Vec<&str> = env.iter().filter(|(k, _)| k == "HOME").map(|(_, v)| v.as_str()).collect();
        assert_eq!(homes, ["/x"], "an injected variable replaces the default");
    }
}
