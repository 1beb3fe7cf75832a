//! Subagents (`runs.lead.subagents`): the types the `task` tool delegates to, their settings, and the
//! limits of delegation. DeerFlow's `SubagentConfig` and `subagents:` section, with two built-ins
//! (`general-purpose`, `bash`) and custom agents from the configuration. Each task runs as a child run
//! of the run that called `task` (see the runs service's `subagent.rs`).

use std::collections::BTreeMap;

use antler_kit::config::{ConfigError, check_range};
use serde::{Deserialize, Serialize};

/// Built-in subagent types, in the order the `task` tool lists them.
pub const BUILTIN: [&str; 2] = ["general-purpose", "bash"];
/// Tools no subagent gets unless its `disallowed_tools` is set otherwise: no nesting, no pausing to
/// ask the user (nobody answers a child run), no deliverables of its own (the lead agent presents).
pub const DEFAULT_DISALLOWED: [&str; 3] = ["task", "ask_clarification", "present_files"];
/// Longest `description` of a custom agent (it goes into the `task` tool's description).
const MAX_DESCRIPTION: usize = 1024;

/// The `runs.lead.subagents` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubagentsConfig {
    /// Offer the `task` tool to every run, as if each asked with `config.subagents_enabled`.
    pub enabled: bool,
    /// Task calls of one model turn that run at once (RunConfig.max_concurrent_subagents overrides);
    /// 1..4, DeerFlow's default 3. Extra calls of the turn are dropped.
    pub max_concurrent: u32,
    /// Task calls one run may make in total (RunConfig.max_total_subagents overrides); 1..50, default
    /// 6. A turn that asks for more once it is reached ends the run with stop_reason
    /// `subagent_limit_capped`.
    pub max_total_per_run: u32,
    /// Time limit of the built-in types, in seconds (default 900); at most `max_timeout_seconds`.
    pub timeout_seconds: u64,
    /// The cap on every subagent's time limit, in seconds (default 1800, at most 86400).
    pub max_timeout_seconds: u64,
    /// Token budget of the built-in types (0: none). A subagent over its budget stops with
    /// stop_reason `token_capped` and returns what it has.
    pub token_budget: u64,
    /// Custom subagent types by name (`^[a-z0-9-]{1,64}$`). A name of a built-in replaces it.
    pub custom_agents: BTreeMap<String, SubagentDef>,
}

impl Default for SubagentsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_concurrent: 3,
            max_total_per_run: 6,
            timeout_seconds: 900,
            max_timeout_seconds: 1800,
            token_budget: 0,
            custom_agents: BTreeMap::new(),
        }
    }
}

/// One subagent type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubagentDef {
    /// When the lead agent should pick this type (shown in the `task` tool's description).
    pub description: String,
    /// The subagent's system prompt; empty: the built-in subagent prompt.
    pub system_prompt: String,
    /// Tools it may use, by name; absent: every tool of the lead agent (MCP tools included).
    pub tools: Option<Vec<String>>,
    /// Tools taken away even when `tools` lists them.
    pub disallowed_tools: Vec<String>,
    /// Skills it may see and activate, by name (absent: all the user's enabled ones, empty: none).
    /// Only the listed ones appear in its `<available_skills>`; reading another skill's SKILL.md
    /// does not activate it.
    pub skills: Option<Vec<String>>,
    /// A model name from the models service, or `inherit` (the lead run's model).
    pub model: String,
    /// Model turns before it must stop (stop_reason `turn_capped`); 1..1000.
    pub max_turns: u32,
    /// Wall-clock limit in seconds; at most `subagents.max_timeout_seconds`. Past it the task ends
    /// timed_out ("Task timed out. Error: …").
    pub timeout_seconds: u64,
    /// Tokens it may spend (input + output over its model calls); 0 = none.
    pub token_budget: u64,
}

impl Default for SubagentDef {
    fn default() -> Self {
        Self {
            description: String::new(),
            system_prompt: String::new(),
            tools: None,
            disallowed_tools: DEFAULT_DISALLOWED.iter().map(|s| (*s).to_owned()).collect(),
            skills: None,
            model: "inherit".to_owned(),
            max_turns: 50,
            timeout_seconds: 900,
            token_budget: 0,
        }
    }
}

/// The built-in subagent prompt (DeerFlow's general-purpose prompt, shortened).
pub const SUBAGENT_PROMPT: &str = "You are a subagent: the lead agent delegated one task to you. Work on it autonomously with \
the tools you have, in the same workspace as the lead agent (/mnt/user-data). Nobody will answer questions: make reasonable \
assumptions and say which. When done, reply with a concise, complete report of what you found or did (file paths, commands, \
results, open issues): the lead agent sees only that final answer.";

impl SubagentsConfig {
    /// The types a run may delegate to, by name: the built-ins (with this section's time limit and
    /// budget), then the custom agents (which replace a built-in of the same name).
    pub fn registry(&self) -> BTreeMap<String, SubagentDef> {
        let mut types = BTreeMap::new();
        types.insert(
            "general-purpose".to_owned(),
            SubagentDef {
                description: "A capable agent for complex, multi-step tasks that need exploration and action: research, \
                              reading and writing files, running commands. Use it for work that can be done independently."
                    .to_owned(),
                max_turns: 150,
                timeout_seconds: self.timeout_seconds,
                token_budget: self.token_budget,
                ..SubagentDef::default()
            },
        );
        types.insert(
            "bash".to_owned(),
            SubagentDef {
                description: "A command-line specialist: runs sequences of shell commands (builds, tests, git, data processing) \
                              and reports their results."
                    .to_owned(),
                tools: Some(["bash", "ls", "read_file", "write_file", "str_replace"].iter().map(|s| (*s).to_owned()).collect()),
                max_turns: 60,
                timeout_seconds: self.timeout_seconds,
                token_budget: self.token_budget,
                ..SubagentDef::default()
            },
        );
        for (name, def) in &self.custom_agents {
            types.insert(name.clone(), def.clone());
        }
        types
    }

    /// The number of task calls of one turn that run at once for a run that asked for `requested`
    /// (0: the configured default), clamped to 1..4.
    pub fn concurrent(&self, requested: u32) -> u32 {
        (if requested == 0 { self.max_concurrent } else { requested }).clamp(1, 4)
    }

    /// The total task calls for a run that asked for `requested` (0: the default), clamped to 1..50.
    pub fn total(&self, requested: u32) -> u32 {
        (if requested == 0 { self.max_total_per_run } else { requested }).clamp(1, 50)
    }

    /// Checks ranges and names; the error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let path = "runs.lead.subagents";
        check_range(&format!("{path}.max_concurrent"), self.max_concurrent.into(), 1, 4)?;
        check_range(&format!("{path}.max_total_per_run"), self.max_total_per_run.into(), 1, 50)?;
        check_range(&format!("{path}.max_timeout_seconds"), self.max_timeout_seconds, 1, 86_400)?;
        check_range(&format!("{path}.timeout_seconds"), self.timeout_seconds, 1, self.max_timeout_seconds)?;
        for (name, def) in &self.custom_agents {
            let at = format!("{path}.custom_agents.{name}");
            let valid_name =
                !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !valid_name {
                return Err(ConfigError::Invalid { path: at, message: "the name must match ^[a-z0-9-]{1,64}$".to_owned() });
            }
            if def.description.trim().is_empty() || def.description.chars().count() > MAX_DESCRIPTION {
                return Err(ConfigError::Invalid {
                    path: format!("{at}.description"),
                    message: format!("is required and at most {MAX_DESCRIPTION} characters (the lead agent picks a type by it)"),
                });
            }
            if def.model.trim().is_empty() {
                return Err(ConfigError::Invalid { path: format!("{at}.model"), message: "must be a model name or `inherit`".to_owned() });
            }
            if def.tools.as_ref().is_some_and(|tools| tools.iter().any(|t| t == "task")) {
                return Err(ConfigError::Invalid {
                    path: format!("{at}.tools"),
                    message: "must not list `task`: subagents do not delegate further".to_owned(),
                });
            }
            check_range(&format!("{at}.max_turns"), def.max_turns.into(), 1, 1_000)?;
            check_range(&format!("{at}.timeout_seconds"), def.timeout_seconds, 1, self.max_timeout_seconds)?;
        }
        Ok(())
    }
}

impl SubagentDef {
    /// Whether a subagent of this type gets the tool `name`.
    pub fn allows(&self, name: &str) -> bool {
        // Never nested, whatever the configuration says.
        if name == "task" || self.disallowed_tools.iter().any(|d| d == name) {
            return false;
        }
        self.tools.as_ref().is_none_or(|tools| tools.iter().any(|t| t == name))
    }

    /// Whether a subagent of this type may see and activate the skill `name`.
    pub fn allows_skill(&self, name: &str) -> bool {
        self.skills.as_ref().is_none_or(|skills| skills.iter().any(|s| s == name))
    }

    /// The model name a child run of this type asks for: its own, or the lead run's (`inherit`).
    pub fn model_for(&self, lead_model: &str) -> String {
        if self.model == "inherit" { lead_model.to_owned() } else { self.model.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_follow_deerflow_and_custom_agents_are_added_or_replace_them() {
        let mut config = SubagentsConfig::default();
        let registry = config.registry();
        let general = &registry["general-purpose"];
        assert_eq!((general.max_turns, general.timeout_seconds), (150, 900));
        assert!(general.allows("bash") && general.allows("web_search") && !general.allows("task") && !general.allows("present_files"));
        let bash = &registry["bash"];
        assert!(bash.allows("str_replace") && !bash.allows("grep") && !bash.allows("ask_clarification"));
        config.custom_agents.insert(
            "researcher".to_owned(),
            SubagentDef { description: "Finds things".to_owned(), model: "small".to_owned(), ..SubagentDef::default() },
        );
        config
            .custom_agents
            .insert("bash".to_owned(), SubagentDef { description: "Mine".to_owned(), max_turns: 5, ..SubagentDef::default() });
        let registry = config.registry();
        assert_eq!(registry.keys().collect::<Vec<_>>(), ["bash", "general-purpose", "researcher"]);
        assert_eq!(registry["bash"].max_turns, 5);
        assert_eq!(registry["researcher"].model_for("lead-model"), "small");
        assert_eq!(registry["general-purpose"].model_for("lead-model"), "lead-model");
        assert!(registry["general-purpose"].allows_skill("anything"), "no list: every enabled skill");
        let picky = SubagentDef { skills: Some(vec!["pdf".to_owned()]), ..SubagentDef::default() };
        assert!(picky.allows_skill("pdf") && !picky.allows_skill("xlsx"));
        assert!(!SubagentDef { skills: Some(Vec::new()), ..SubagentDef::default() }.allows_skill("pdf"), "empty: none");
        assert!(config.validate().is_ok());
    }

    #[test]
    fn limits_are_clamped_like_deerflow() {
        let config = SubagentsConfig::default();
        assert_eq!((config.concurrent(0), config.concurrent(9), config.concurrent(2)), (3, 4, 2));
        assert_eq!((config.total(0), config.total(99), config.total(1)), (6, 50, 1));
    }

    #[test]
    fn bad_settings_are_refused_with_the_setting_named() {
        let bad = |edit: &dyn Fn(&mut SubagentsConfig)| {
            let mut config = SubagentsConfig::default();
            edit(&mut config);
            config.validate().map_err(|e| e.to_string()).err().unwrap_or_default()
        };
        assert!(bad(&|c| c.max_concurrent = 5).contains("runs.lead.subagents.max_concurrent"));
        assert!(bad(&|c| c.max_total_per_run = 0).contains("max_total_per_run"));
        assert!(bad(&|c| c.timeout_seconds = 2000).contains("runs.lead.subagents.timeout_seconds"));
        let custom = |def: SubagentDef| {
            move |c: &mut SubagentsConfig| {
                c.custom_agents.insert("x".to_owned(), def.clone());
            }
        };
        assert!(bad(&custom(SubagentDef::default())).contains("custom_agents.x.description"));
        let described = SubagentDef { description: "d".to_owned(), ..SubagentDef::default() };
        assert!(bad(&custom(SubagentDef { timeout_seconds: 1801, ..described.clone() })).contains("custom_agents.x.timeout_seconds"));
        assert!(bad(&custom(SubagentDef { max_turns: 0, ..described.clone() })).contains("custom_agents.x.max_turns"));
        assert!(bad(&custom(SubagentDef { tools: Some(vec!["task".to_owned()]), ..described.clone() })).contains("custom_agents.x.tools"));
        assert!(
            bad(&|c| {
                c.custom_agents.insert("Bad Name".to_owned(), described.clone());
            })
            .contains("^[a-z0-9-]{1,64}$")
        );
    }
}
