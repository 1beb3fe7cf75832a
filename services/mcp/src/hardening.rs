//! What a stdio server entry may run, as DeerFlow's gateway checks it: a command allowlist, no
//! interpreter flags that execute inline code, and no environment variables that inject code or redirect
//! package downloads. Each refusal names the field so the entry can be fixed.

use std::collections::BTreeMap;

/// Commands allowed when `mcp.stdio.command_allowlist` is not set.
pub const DEFAULT_ALLOWLIST: &[&str] = &["npx", "uvx", "node", "python3"];

/// DeerFlow's variable for extending the allowlist (comma-separated), honoured for compatibility.
pub const ALLOWLIST_ENV: &str = "DEER_FLOW_MCP_STDIO_COMMAND_ALLOWLIST";

/// Interpreter options that run code given on the command line (python `-c`, node `-e`/`-p`/`-r`, npx
/// `-c`, …). Only options before the first positional argument are checked: what follows the script or
/// package name belongs to the server (`server.py -p 8080` is fine).
const EXEC_LONG_FLAGS: &[&str] =
    &["--eval", "--print", "--require", "--import", "--loader", "--experimental-loader", "--call", "--command"];
const EXEC_SHORT_FLAGS: &[char] = &['c', 'e', 'p', 'r'];

/// Options that take the next argument as their value and end the interpreter's own options.
const MODULE_FLAGS: &[&str] = &["-m", "--module"];

/// Variables that make an interpreter or the dynamic linker load code from elsewhere, or point a package
/// runner (npx, uvx, pip) at another registry, or change where the command is looked up.
const DENIED_ENV: &[&str] = &[
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONUSERBASE",
    "PYTHONEXECUTABLE",
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_REPL_EXTERNAL_MODULE",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "BASH_ENV",
    "ENV",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PATH",
];
const DENIED_ENV_PREFIXES: &[&str] = &["LD_", "DYLD_", "npm_config_", "NPM_CONFIG_", "UV_INDEX", "UV_EXTRA_INDEX"];

/// The effective stdio policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioPolicy {
    pub allowlist: Vec<String>,
}

impl StdioPolicy {
    /// The configured allowlist (or the default) plus DeerFlow's environment variable.
    pub fn new(configured: Option<&[String]>, env_extra: Option<&str>) -> Self {
        let mut allowlist: Vec<String> = match configured {
            Some(list) => list.to_vec(),
            None => DEFAULT_ALLOWLIST.iter().map(|s| (*s).to_owned()).collect(),
        };
        for extra in env_extra.unwrap_or_default().split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !allowlist.iter().any(|a| a == extra) {
                allowlist.push(extra.to_owned());
            }
        }
        Self { allowlist }
    }
}

/// A refused entry: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub field: String,
    pub message: String,
}

/// Checks a stdio entry's command, arguments and environment.
pub fn check(command: &str, args: &[String], env: &BTreeMap<String, String>, policy: &StdioPolicy) -> Result<(), Refusal> {
    check_command(command, policy)?;
    check_args(args)?;
    check_env(env)
}

fn check_command(command: &str, policy: &StdioPolicy) -> Result<(), Refusal> {
    // A bare name must be listed; a path must be listed verbatim (a basename match would let
    // `/tmp/evil/node` pass as `node`).
    let allowed = policy.allowlist.iter().any(|a| a == command);
    if allowed {
        return Ok(());
    }
    let shown = if policy.allowlist.is_empty() { "(empty)".to_owned() } else { policy.allowlist.join(", ") };
    Err(Refusal {
        field: "command".to_owned(),
        message: format!(
            "`{command}` is not in the stdio command allowlist ({shown})\nhint: add it to mcp.stdio.command_allowlist in antler.yaml"
        ),
    })
}

fn check_args(args: &[String]) -> Result<(), Refusal> {
    let mut index = 0;
    while index < args.len() {
        let arg = &args[index];
        if arg == "--" || !arg.starts_with('-') || arg == "-" {
            return Ok(());
        }
        let refuse = || Refusal {
            field: format!("args[{index}]"),
            message: format!("`{arg}` makes the interpreter run code given on the command line; put the code in a file"),
        };
        if let Some(long) = arg.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or(long);
            if EXEC_LONG_FLAGS.contains(&format!("--{name}").as_str()) {
                return Err(refuse());
            }
            if MODULE_FLAGS.contains(&arg.as_str()) {
                return Ok(());
            }
        } else {
            if MODULE_FLAGS.contains(&arg.as_str()) {
                return Ok(());
            }
            // A cluster such as `-Bc` runs code too.
            if arg[1..].chars().any(|c| EXEC_SHORT_FLAGS.contains(&c)) {
                return Err(refuse());
            }
        }
        index += 1;
    }
    Ok(())
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), Refusal> {
    for key in env.keys() {
        let denied = DENIED_ENV.contains(&key.as_str()) || DENIED_ENV_PREFIXES.iter().any(|p| key.starts_with(p));
        if denied {
            return Err(Refusal {
                field: format!("env.{key}"),
                message: format!("`{key}` can make the server load code from elsewhere and may not be set for a stdio server"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> StdioPolicy {
        StdioPolicy::new(None, None)
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_default_allowlist_admits_package_runners_and_interpreters_only() {
        for ok in ["npx", "uvx", "node", "python3"] {
            assert!(check(ok, &[], &BTreeMap::new(), &policy()).is_ok(), "{ok}");
        }
        for bad in ["bash", "sh", "/tmp/evil/node", "python"] {
            let refusal = check(bad, &[], &BTreeMap::new(), &policy()).err();
            assert_eq!(refusal.map(|r| r.field), Some("command".to_owned()), "{bad}");
        }
    }

    #[test]
    fn the_env_variable_extends_the_list() {
        let p = StdioPolicy::new(None, Some("bun, /opt/venv/bin/python"));
        assert!(check("/opt/venv/bin/python", &[], &BTreeMap::new(), &p).is_ok());
        assert!(check("bun", &[], &BTreeMap::new(), &p).is_ok());
    }

    #[test]
    fn inline_code_flags_are_refused_before_the_script_only() {
        for bad in [&["-c", "import os"][..], &["-e", "x"], &["--eval=x"], &["-Bc", "x"], &["-y", "--call", "sh"]] {
            let refusal = check("python3", &args(bad), &BTreeMap::new(), &policy()).err();
            assert!(refusal.is_some_and(|r| r.field.starts_with("args[")), "{bad:?}");
        }
        for ok in [&["server.py", "-p", "8080"][..], &["-m", "my_server", "-c", "conf"], &["-y", "@scope/pkg", "-e"], &["-u", "s.py"]] {
            assert!(check("python3", &args(ok), &BTreeMap::new(), &policy()).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn code_injecting_environment_is_refused_by_name() {
        for key in ["PYTHONPATH", "NODE_OPTIONS", "LD_PRELOAD", "npm_config_registry", "PATH"] {
            let env = BTreeMap::from([(key.to_owned(), "x".to_owned())]);
            let refusal = check("node", &[], &env, &policy()).err();
            assert_eq!(refusal.map(|r| r.field), Some(format!("env.{key}")));
        }
        let env = BTreeMap::from([("GITHUB_TOKEN".to_owned(), "x".to_owned())]);
        assert!(check("node", &[], &env, &policy()).is_ok());
    }
}
