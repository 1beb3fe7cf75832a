//! One translator per DeerFlow section. Each reads the keys it applies through a [`Reader`] (which
//! resolves their variables and checks their types), sets the Antler settings they become, and lists
//! the keys it leaves with the reason.

use serde_yaml_ng::{Mapping, Value};

use super::{Ctx, Line, Reader, describe, tools_mapper, wrong_type};
use crate::config::ConfigError;
use crate::config::env;

/// Why a whole section has no effect in Antler; None for the sections that are translated.
fn not_applied_reason(section: &str) -> Option<&'static str> {
    Some(match section {
        "token_usage" => "Antler always records token usage, per run, per model and per caller (lead agent, subagent, middleware)",
        "tool_groups" => "Antler offers every configured tool to every run; groups only select tools for DeerFlow's custom agents",
        "tool_output" => {
            "Antler bounds tool output where it is produced (sandbox.commands.output_max_chars, sandbox.files.read_max_chars, \
             mcp.calls.max_result_bytes) instead of moving large results to files"
        }
        "input_polish" => "a DeerFlow UI endpoint (/api/input-polish) that Antler does not serve",
        "tool_progress" => "Antler has no tool-progress state machine; loop_detection bounds repeated calls",
        "read_before_write" => "Antler's write_file and str_replace do not require an earlier read_file",
        "agents_api" => "Antler has no custom-agent management API; subagent types are configured in runs.lead.subagents.custom_agents",
        "checkpointer" => "Antler checkpoints in the runs database (see the database section)",
        "dedupe_storage" => "webhook dedupe of messaging channels, which Antler does not have",
        "run_events" => "Antler stores every run event in the runs database, always",
        "agent_storage" => "Antler has no custom-agent definitions to store",
        "scheduler" => "Antler has no scheduled runs",
        "mcp_tasks" => "Antler calls MCP tools synchronously and polls no long-running MCP task toolsets",
        "stream_bridge" => "Antler fans events out in process, and across replicas with PostgreSQL LISTEN/NOTIFY; it needs no Redis",
        "channel_connections" | "channels" => "Antler has no messaging channels",
        "authorization" => {
            "Antler's access control is server.auth (API keys, JWTs) with per-user ownership of every thread, run and memory; \
             it has no roles"
        }
        "circuit_breaker" => "Antler has no circuit breaker across model calls; each model's retries and fallbacks apply",
        "auth" => {
            "DeerFlow's user accounts, registration and OIDC login; Antler authenticates each call with server.auth (API keys or JWTs)"
        }
        "plugins" => "Python extension packages; Antler loads no code from its configuration",
        _ => return None,
    })
}

/// Translates top-level section `name`; its own line comes first, then those about its keys.
pub(super) fn translate_section(ctx: &mut Ctx, name: &str, value: Value) -> Result<(), ConfigError> {
    let first = ctx.translation.lines.len();
    translate(ctx, name, value)?;
    let lines = &mut ctx.translation.lines[first..];
    if let Some(own) = lines.iter().position(|l| l.section == name) {
        lines[..=own].rotate_right(1);
    }
    Ok(())
}

fn translate(ctx: &mut Ctx, name: &str, value: Value) -> Result<(), ConfigError> {
    if let Some(why) = not_applied_reason(name) {
        ctx.line(Line::not_applied(name, why));
        return Ok(());
    }
    match name {
        "config_version" => config_version(ctx, value),
        "log_level" => log_level(ctx, value),
        "logging" => logging(ctx, value),
        "extensions" => extensions(ctx, value),
        "token_budget" => token_budget(ctx, value),
        "max_recursion_limit" => max_recursion_limit(ctx, value),
        "models" => models(ctx, value),
        "tools" => tools(ctx, value),
        "tool_search" => tool_search(ctx, value),
        "loop_detection" => loop_detection(ctx, value),
        "safety_finish_reason" => safety_finish_reason(ctx, value),
        "uploads" => uploads(ctx, value),
        "sandbox" => sandbox(ctx, value),
        "subagents" => subagents(ctx, value),
        "skills" => skills(ctx, value),
        "skill_scan" => skill_scan(ctx, value),
        "skill_evolution" => skill_evolution(ctx, value),
        "acp_agents" => acp_agents(ctx, value),
        "title" => title(ctx, value),
        "summarization" => summarization(ctx, value),
        "memory" => memory(ctx, value),
        "database" => database(ctx, value),
        "run_ownership" => run_ownership(ctx, value),
        "guardrails" => guardrails(ctx, value),
        "llm_call" => llm_call(ctx, value),
        "suggestions" => suggestions(ctx, value),
        _ => {
            ctx.line(Line::not_applied(
                name,
                "not a section of DeerFlow's config.yaml (schema 34) that Antler knows; DeerFlow keeps unknown sections as extras",
            ));
            Ok(())
        }
    }
}

/// Lists the keys `reader` still holds as not applied, with the reason `why` gives for a key (or the
/// general one).
fn leftovers(ctx: &mut Ctx, reader: &Reader, why: &dyn Fn(&str) -> Option<&'static str>) {
    for key in reader.rest() {
        let reason = why(&key).unwrap_or("not a setting Antler maps");
        ctx.line(Line::not_applied(format!("{}.{key}", reader.path), reason));
    }
}

fn no_reason(_: &str) -> Option<&'static str> {
    None
}

/// Sets `antler` from an optional value, remembering the target.
fn put(ctx: &mut Ctx, targets: &mut Vec<String>, antler: &str, value: Option<Value>, from: &str) {
    if let Some(value) = value {
        ctx.set(antler, value, from);
        targets.push(antler.to_owned());
    }
}

fn config_version(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let version = match &value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let version = version.ok_or_else(|| wrong_type("config_version", "a whole number", &value))?;
    ctx.translation.config_version = Some(version);
    ctx.line(Line::applied("config_version", Some(format!("{version}: read as DeerFlow's config.yaml")), &[]));
    Ok(())
}

fn log_level(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut value = value;
    env::substitute(&mut value, "log_level", ctx.lookup)?;
    let Value::String(level) = &value else { return Err(wrong_type("log_level", "debug, info, warning or error", &value)) };
    let filter = match level.trim().to_ascii_lowercase().as_str() {
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "critical" | "fatal" => "error",
        _ => return Err(wrong_type("log_level", "debug, info, warning or error", &value)),
    };
    // The database driver's per-statement notices stay out, as in Antler's default filter.
    ctx.set("server.log.filter", Value::from(format!("{filter},sqlx=warn")), "log_level");
    ctx.line(Line::applied("log_level", Some(level.trim().to_owned()), &["server.log.filter".to_owned()]));
    Ok(())
}

fn logging(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("logging", value, ctx.lookup)?;
    if let Some(enhance) = reader.take("enhance")? {
        let mut enhance = Reader::new("logging.enhance", enhance, ctx.lookup)?;
        let enabled = enhance.bool("enabled")?.unwrap_or(false);
        let format = enhance.string("format")?.unwrap_or_else(|| "text".to_owned());
        if enabled && format == "json" {
            ctx.set("server.log.format", Value::from("json"), "logging.enhance.format");
            ctx.line(Line::applied("logging", Some("enhance.format json".to_owned()), &["server.log.format".to_owned()]));
        } else {
            ctx.line(Line::not_applied(
                "logging",
                "request trace ids: every Antler log line inside a call carries its span, and a W3C traceparent is followed",
            ));
        }
        leftovers(ctx, &enhance, &no_reason);
    } else {
        ctx.line(Line::not_applied("logging", "empty"));
    }
    leftovers(ctx, &reader, &no_reason);
    Ok(())
}

fn extensions(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("extensions", value, ctx.lookup)?;
    let key = if reader.has("mcpServers") { "mcpServers" } else { "mcp_servers" };
    let servers = reader.take(key)?;
    let mut targets = Vec::new();
    let mut note = None;
    if let Some(servers) = servers {
        let Value::Mapping(map) = &servers else { return Err(wrong_type(&format!("extensions.{key}"), "a mapping of servers", &servers)) };
        let names: Vec<String> = map.keys().map(env::key_name).collect();
        note = Some(format!("MCP servers: {}", names.join(", ")));
        put(ctx, &mut targets, "mcp.servers", Some(servers), &format!("extensions.{key}"));
    }
    if targets.is_empty() {
        ctx.line(Line::not_applied("extensions", "no MCP servers"));
    } else {
        ctx.line(Line::applied("extensions", note, &targets));
    }
    leftovers(ctx, &reader, &|key| match key {
        "middlewares" => Some("Python middleware classes; Antler's layers are built in (runs.lead.middlewares)"),
        "mcpInterceptors" => Some("Python interceptors; Antler adds OAuth headers itself (mcpServers.*.oauth)"),
        "skills" => Some("skill enable state: Antler reads it from extensions_config.json (sandbox.skills.extensions_config)"),
        _ => None,
    });
    Ok(())
}

fn token_budget(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("token_budget", value, ctx.lookup)?;
    let enabled = reader.bool("enabled")?.unwrap_or(false);
    let max = reader.u64("max_tokens")?.unwrap_or(200_000);
    let warn = reader.f64("warn_threshold")?.unwrap_or(0.8);
    let hard_stop = reader.f64("hard_stop_threshold")?;
    let max_input = reader.u64("max_input_tokens")?;
    let max_output = reader.u64("max_output_tokens")?;
    if enabled {
        let mut targets = Vec::new();
        put(ctx, &mut targets, "runs.lead.token_budget.default_tokens", Some(Value::from(max)), "token_budget.max_tokens");
        put(ctx, &mut targets, "runs.lead.token_budget.max_tokens", Some(Value::from(max)), "token_budget.max_tokens");
        put(ctx, &mut targets, "runs.lead.token_budget.warn_fraction", Some(Value::from(warn)), "token_budget.warn_threshold");
        ctx.line(Line::applied("token_budget", Some(format!("{max} tokens per run, warning at {warn}")), &targets));
    } else {
        ctx.line(Line::applied("token_budget", Some("disabled: runs have no budget unless they ask for one".to_owned()), &[]));
    }
    if hard_stop.is_some_and(|h| h != 1.0) {
        ctx.line(Line::not_applied("token_budget.hard_stop_threshold", "Antler forces the final answer when the whole budget is spent"));
    }
    if max_input.is_some() || max_output.is_some() {
        ctx.line(Line::not_applied("token_budget.max_input_tokens/max_output_tokens", "Antler budgets input and output tokens together"));
    }
    leftovers(ctx, &reader, &no_reason);
    Ok(())
}

fn max_recursion_limit(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut value = value;
    env::substitute(&mut value, "max_recursion_limit", ctx.lookup)?;
    let limit = match &value {
        Value::Null => return Ok(()),
        Value::Number(n) if n.as_u64().is_some() => n.as_u64().unwrap_or_default(),
        other => return Err(wrong_type("max_recursion_limit", "a whole number", other)),
    };
    let mut targets = vec!["runs.recursion_limit_max".to_owned()];
    ctx.set("runs.recursion_limit_max", Value::from(limit), "max_recursion_limit");
    // A run that asks for nothing gets 100, unless the ceiling is lower (DeerFlow clamps it too).
    if limit < 100 {
        ctx.set("runs.recursion_limit_default", Value::from(limit), "max_recursion_limit");
        targets.push("runs.recursion_limit_default".to_owned());
    }
    ctx.line(Line::applied("max_recursion_limit", Some(limit.to_string()), &targets));
    Ok(())
}

fn models(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut value = value;
    env::substitute(&mut value, "models", ctx.lookup)?;
    let entries = match value {
        Value::Null => Vec::new(),
        Value::Sequence(list) => list,
        other => return Err(wrong_type("models", "a list of models", &other)),
    };
    let names: Vec<String> = entries.iter().map(|e| e.get("name").map(describe).unwrap_or_else(|| "?".to_owned())).collect();
    let note = if names.is_empty() {
        "none: Antler serves its built-in `demo` replay model".to_owned()
    } else {
        format!("{} models: {}", names.len(), names.join(", "))
    };
    // The mapping form, so that llm_call can set the retry timing beside the list.
    ctx.set("models.models", Value::Sequence(entries), "models");
    ctx.line(Line::applied("models", Some(note), &["models".to_owned()]));
    Ok(())
}

/// `deerflow.sandbox.tools:<name>_tool`: Antler's built-in of that name.
const BUILTIN_TOOLS: [&str; 7] = ["ls", "read_file", "glob", "grep", "write_file", "str_replace", "bash"];

fn tools(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let entries = match value {
        Value::Null => Vec::new(),
        Value::Sequence(list) => list,
        other => return Err(wrong_type("tools", "a list of tools", &other)),
    };
    let mut builtins = Vec::new();
    let mut targets = Vec::new();
    let mut others = Vec::new();
    for (index, entry) in entries.into_iter().enumerate() {
        let path = format!("tools[{index}]");
        let mut reader = Reader::new(&path, entry.clone(), ctx.lookup)?;
        let use_path = match reader.map.get("use") {
            Some(Value::String(s)) => s.trim().to_owned(),
            Some(other) => return Err(wrong_type(&format!("{path}.use"), "a `module:attribute` string", other)),
            None => {
                return Err(ConfigError::Invalid {
                    path: format!("{path}.use"),
                    message: "missing: every tool names its `use:`".to_owned(),
                });
            }
        };
        let builtin = use_path
            .strip_prefix("deerflow.sandbox.tools:")
            .and_then(|attribute| attribute.strip_suffix("_tool"))
            .and_then(|name| BUILTIN_TOOLS.iter().find(|b| **b == name));
        let Some(builtin) = builtin else {
            let mut entry = entry;
            env::substitute(&mut entry, &path, ctx.lookup)?;
            others.push((index, entry));
            continue;
        };
        builtins.push(*builtin);
        reader.drop_key("name");
        reader.drop_key("group");
        reader.drop_key("use");
        let setting = match *builtin {
            "glob" => Some("sandbox.files.glob_default_results"),
            "grep" => Some("sandbox.files.grep_default_results"),
            _ => None,
        };
        if let Some(setting) = setting
            && let Some(max) = reader.u64("max_results")?
        {
            put(ctx, &mut targets, setting, Some(Value::from(max)), &format!("{path}.max_results"));
        }
        leftovers(ctx, &reader, &no_reason);
    }
    let mut web = Vec::new();
    match (tools_mapper(), others.is_empty()) {
        (_, true) => {}
        (Some(mapper), false) => {
            let mapping = mapper(&others)?;
            if let Some(section) = mapping.web {
                ctx.set("runs.lead.web", section, "tools");
                targets.push("runs.lead.web".to_owned());
            }
            for (index, outcome) in mapping.entries {
                let name = others.iter().find(|(i, _)| *i == index).and_then(|(_, e)| e.get("name")).map(describe).unwrap_or_default();
                match outcome {
                    Ok(target) => web.push(format!("{name} → {target}")),
                    Err(why) => ctx.line(Line::not_applied(format!("tools[{index}] {name}"), why)),
                }
            }
        }
        (None, false) => {
            for (index, entry) in &others {
                let name = entry.get("name").map(describe).unwrap_or_default();
                let use_path = entry.get("use").map(describe).unwrap_or_default();
                ctx.line(Line::not_applied(
                    format!("tools[{index}] {name}"),
                    format!("`use: {use_path}`: this program does not map DeerFlow's web tools; `antler up` and `antler serve runs` do"),
                ));
            }
        }
    }
    let mut note = Vec::new();
    if !builtins.is_empty() {
        note.push(format!("{} → built-in tools", builtins.join(", ")));
    }
    note.extend(web);
    if note.is_empty() {
        ctx.line(Line::not_applied("tools", "no tool Antler has"));
    } else {
        ctx.line(Line::applied("tools", Some(note.join("; ")), &targets));
    }
    let missing: Vec<&str> = BUILTIN_TOOLS.iter().copied().filter(|b| !builtins.contains(b)).collect();
    if !missing.is_empty() {
        ctx.line(Line::not_applied(
            format!("tools ({} not listed)", missing.join(", ")),
            "Antler offers its sandbox tools to every run; whether bash runs is sandbox.allow_host_bash and the sandbox provider's call",
        ));
    }
    Ok(())
}

fn tool_search(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("tool_search", value, ctx.lookup)?;
    let mut targets = Vec::new();
    put(ctx, &mut targets, "mcp.tool_search.enabled", reader.bool("enabled")?.map(Value::from), "tool_search.enabled");
    ctx.line(Line::applied("tool_search", None, &targets));
    leftovers(ctx, &reader, &|key| {
        (key == "auto_promote_top_k")
            .then_some("Antler promotes deferred MCP tools only through tool_search calls; it has no routing keywords")
    });
    Ok(())
}

fn loop_detection(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("loop_detection", value, ctx.lookup)?;
    let mut targets = Vec::new();
    put(ctx, &mut targets, "runs.lead.loop_detection.enabled", reader.bool("enabled")?.map(Value::from), "loop_detection.enabled");
    for key in ["warn_threshold", "hard_limit", "window_size", "tool_freq_warn", "tool_freq_hard_limit"] {
        let value = reader.u64(key)?.map(Value::from);
        put(ctx, &mut targets, &format!("runs.lead.loop_detection.{key}"), value, &format!("loop_detection.{key}"));
    }
    ctx.line(Line::applied("loop_detection", None, &targets));
    leftovers(ctx, &reader, &|key| match key {
        "max_tracked_threads" => Some("Antler keeps loop state per run, in its checkpoints; there is no process-wide table to bound"),
        "tool_freq_overrides" => Some("Antler has one tool_freq_warn / tool_freq_hard_limit for every tool"),
        _ => None,
    });
    Ok(())
}

fn safety_finish_reason(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("safety_finish_reason", value, ctx.lookup)?;
    if reader.bool("enabled")?.unwrap_or(true) {
        ctx.line(Line::applied(
            "safety_finish_reason",
            Some(
                "always on in Antler: a turn that ends content_filter, refusal or SAFETY runs none of its tool calls and ends the \
                 run safety_capped"
                    .to_owned(),
            ),
            &[],
        ));
    } else {
        ctx.line(Line::not_applied("safety_finish_reason", "enabled: false — Antler always stops on a provider's safety finish"));
    }
    leftovers(ctx, &reader, &|key| {
        (key == "detectors").then_some("Python detector classes; Antler reads OpenAI, Anthropic and Gemini safety finishes itself")
    });
    Ok(())
}

fn uploads(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("uploads", value, ctx.lookup)?;
    let mut targets = Vec::new();
    for (from, to) in [("max_files", "max_files"), ("max_file_size", "max_file_bytes"), ("max_total_size", "max_total_bytes")] {
        let value = reader.u64(from)?.map(Value::from);
        put(ctx, &mut targets, &format!("sandbox.uploads.{to}"), value, &format!("uploads.{from}"));
    }
    let convert = reader.bool("auto_convert_documents")?.map(Value::from);
    put(ctx, &mut targets, "sandbox.uploads.auto_convert_documents", convert, "uploads.auto_convert_documents");
    ctx.line(Line::applied("uploads", None, &targets));
    leftovers(ctx, &reader, &|key| {
        (key == "pdf_converter").then_some("Antler converts PDFs with its own converter, in an isolated child (sandbox.uploads.convert)")
    });
    Ok(())
}

fn sandbox(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("sandbox", value, ctx.lookup)?;
    let mut targets = Vec::new();
    let mut note = None;
    if let Some(use_path) = reader.string("use")? {
        let class = use_path.rsplit(':').next().unwrap_or(&use_path).trim().to_owned();
        let (provider, why) = if class == "LocalSandboxProvider" {
            ("local", "host processes, as DeerFlow's; `sandbox.provider: auto` would isolate commands with bubblewrap")
        } else {
            ("bwrap", "Antler isolates commands in bubblewrap namespaces on this host, not in containers or VMs")
        };
        ctx.set("sandbox.provider", Value::from(provider), "sandbox.use");
        targets.push("sandbox.provider".to_owned());
        note = Some(format!("{class} → {provider}: {why}"));
    }
    put(ctx, &mut targets, "sandbox.allow_host_bash", reader.bool("allow_host_bash")?.map(Value::from), "sandbox.allow_host_bash");
    for (from, to) in [
        ("bash_output_max_chars", "sandbox.commands.output_max_chars"),
        ("read_file_output_max_chars", "sandbox.files.read_max_chars"),
        ("ls_output_max_chars", "sandbox.files.list_max_chars"),
        ("idle_timeout", "sandbox.idle_release_secs"),
    ] {
        let value = reader.u64(from)?.map(Value::from);
        put(ctx, &mut targets, to, value, &format!("sandbox.{from}"));
    }
    if let Some(timeout) = reader.u64("bash_command_timeout")? {
        put(ctx, &mut targets, "sandbox.commands.default_timeout_secs", Some(Value::from(timeout)), "sandbox.bash_command_timeout");
        // A default above Antler's cap raises the cap with it (DeerFlow has no separate cap).
        if timeout > 3600 {
            put(ctx, &mut targets, "sandbox.commands.max_timeout_secs", Some(Value::from(timeout)), "sandbox.bash_command_timeout");
        }
    }
    ctx.line(Line::applied("sandbox", note, &targets));
    leftovers(ctx, &reader, &|key| match key {
        "mounts" | "thread_data_mounts" => {
            Some("Antler mounts only the thread's user-data directories and, read-only, the skills and the ACP workspace")
        }
        "environment" => Some("Antler passes commands only the host variables in sandbox.commands.env_allowlist"),
        _ => Some("a container or VM sandbox setting; Antler's sandboxes are bubblewrap namespaces or host processes on this host"),
    });
    Ok(())
}

fn subagents(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("subagents", value, ctx.lookup)?;
    let mut targets = Vec::new();
    if let Some(timeout) = reader.u64("timeout_seconds")? {
        put(ctx, &mut targets, "runs.lead.subagents.timeout_seconds", Some(Value::from(timeout)), "subagents.timeout_seconds");
        if timeout > 1800 {
            put(ctx, &mut targets, "runs.lead.subagents.max_timeout_seconds", Some(Value::from(timeout)), "subagents.timeout_seconds");
        }
    }
    let total = reader.u64("max_total_per_run")?.map(Value::from);
    put(ctx, &mut targets, "runs.lead.subagents.max_total_per_run", total, "subagents.max_total_per_run");
    if let Some(budget) = reader.take("token_budget")? {
        let mut budget = Reader::new("subagents.token_budget", budget, ctx.lookup)?;
        let enabled = budget.bool("enabled")?.unwrap_or(false);
        let max = budget.u64("max_tokens")?.unwrap_or(200_000);
        let tokens = if enabled { max } else { 0 };
        put(ctx, &mut targets, "runs.lead.subagents.token_budget", Some(Value::from(tokens)), "subagents.token_budget");
        leftovers(ctx, &budget, &|_| Some("Antler's subagent budget is one total of input and output tokens"));
    }
    if let Some(custom) = reader.take("custom_agents")? {
        let Value::Mapping(agents) = custom else { return Err(wrong_type("subagents.custom_agents", "a mapping of agents", &custom)) };
        // DeerFlow writes `null` for "unset"; Antler's fields are then absent.
        let agents: Mapping = agents
            .into_iter()
            .map(|(name, agent)| match agent {
                Value::Mapping(fields) => (name, Value::Mapping(fields.into_iter().filter(|(_, v)| !v.is_null()).collect())),
                other => (name, other),
            })
            .collect();
        put(ctx, &mut targets, "runs.lead.subagents.custom_agents", Some(Value::Mapping(agents)), "subagents.custom_agents");
    }
    ctx.line(Line::applied("subagents", None, &targets));
    leftovers(ctx, &reader, &|key| match key {
        "max_turns" | "agents" => {
            Some("per-type overrides of the built-in subagents: Antler's are replaced by a custom agent of the same name")
        }
        _ => None,
    });
    Ok(())
}

fn skills(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("skills", value, ctx.lookup)?;
    let mut targets = Vec::new();
    if let Some(path) = reader.string("path")? {
        // DeerFlow's skills directory holds public/ and custom/; Antler reads the public ones from it
        // and keeps each user's custom skills in its data directory.
        let public = ctx.path(&path).join("public");
        ctx.set("sandbox.skills.public_dir", Value::from(public.display().to_string()), "skills.path");
        targets.push("sandbox.skills.public_dir".to_owned());
    }
    match reader.string("container_path")? {
        Some(path) if path.trim_end_matches('/') != "/mnt/skills" => {
            ctx.line(Line::not_applied("skills.container_path", format!("{path}: Antler mounts skills at /mnt/skills")));
        }
        _ => {}
    }
    ctx.line(Line::applied("skills", Some("mounted read-only at /mnt/skills".to_owned()), &targets));
    leftovers(ctx, &reader, &|key| match key {
        "deferred_discovery" => Some("Antler lists the enabled skills' names and descriptions in the system prompt"),
        "use" => Some("a Python skill-storage class; Antler stores skills in files"),
        _ => None,
    });
    Ok(())
}

fn skill_scan(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("skill_scan", value, ctx.lookup)?;
    let mut targets = Vec::new();
    put(ctx, &mut targets, "sandbox.skills.scan.enabled", reader.bool("enabled")?.map(Value::from), "skill_scan.enabled");
    ctx.line(Line::applied("skill_scan", Some("the sandbox's static skill scan".to_owned()), &targets));
    leftovers(ctx, &reader, &|_| Some("Antler's scan limits are the archive limits in sandbox.skills.install"));
    Ok(())
}

fn skill_evolution(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("skill_evolution", value, ctx.lookup)?;
    let mut targets = Vec::new();
    put(ctx, &mut targets, "runs.lead.skill_evolution.enabled", reader.bool("enabled")?.map(Value::from), "skill_evolution.enabled");
    // null: no moderation pass, as Antler's empty model_name.
    if reader.has("moderation_model_name") {
        let model = reader.string("moderation_model_name")?.unwrap_or_default();
        put(ctx, &mut targets, "sandbox.skills.moderation.model_name", Some(Value::from(model)), "skill_evolution.moderation_model_name");
    }
    let fail_closed = reader.bool("security_fail_closed")?.map(Value::from);
    put(ctx, &mut targets, "sandbox.skills.moderation.fail_closed", fail_closed, "skill_evolution.security_fail_closed");
    ctx.line(Line::applied(
        "skill_evolution",
        Some("the lead agent's skill_manage tool and the skills' moderation pass".to_owned()),
        &targets,
    ));
    leftovers(ctx, &reader, &no_reason);
    Ok(())
}

/// Each agent's `command`, `args`, `env` and `description` become `runs.lead.acp_agents.<name>`;
/// its `model` and `auto_approve_permissions` are listed as not applied (Antler answers permission
/// requests by one policy, `runs.lead.acp.permissions`, deny by default).
fn acp_agents(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let agents = match value {
        Value::Null => Mapping::new(),
        Value::Mapping(agents) => agents,
        other => return Err(wrong_type("acp_agents", "a mapping of agents", &other)),
    };
    let mut translated = Mapping::new();
    for (name, agent) in agents {
        let key = crate::config::env::key_name(&name);
        let path = format!("acp_agents.{key}");
        let mut reader = Reader::new(&path, agent, ctx.lookup)?;
        let mut out = Mapping::new();
        for field in ["command", "description"] {
            if let Some(text) = reader.string(field)? {
                out.insert(Value::from(field), Value::from(text));
            }
        }
        for field in ["args", "env"] {
            if let Some(value) = reader.take(field)? {
                out.insert(Value::from(field), value);
            }
        }
        translated.insert(Value::from(key), Value::Mapping(out));
        leftovers(ctx, &reader, &|field| match field {
            "model" => Some("the agent's own configuration picks its model"),
            "auto_approve_permissions" => {
                Some("Antler answers every agent's permission requests by runs.lead.acp.permissions (deny by default; `*` grants all)")
            }
            _ => None,
        });
    }
    let mut targets = Vec::new();
    put(ctx, &mut targets, "runs.lead.acp_agents", Some(Value::Mapping(translated)), "acp_agents");
    ctx.line(Line::applied("acp_agents", Some("the lead agent's invoke_acp_agent tool".to_owned()), &targets));
    Ok(())
}

fn title(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("title", value, ctx.lookup)?;
    let mut targets = Vec::new();
    put(ctx, &mut targets, "runs.lead.title.enabled", reader.bool("enabled")?.map(Value::from), "title.enabled");
    put(ctx, &mut targets, "runs.lead.title.max_words", reader.u64("max_words")?.map(Value::from), "title.max_words");
    put(ctx, &mut targets, "runs.lead.title.max_chars", reader.u64("max_chars")?.map(Value::from), "title.max_chars");
    if reader.has("model_name") {
        // null: the local fallback title, as Antler's empty model_name.
        let model = reader.string("model_name")?.unwrap_or_default();
        put(ctx, &mut targets, "runs.lead.title.model_name", Some(Value::from(model)), "title.model_name");
    }
    let template = reader.string("prompt_template")?.map(Value::from);
    put(ctx, &mut targets, "runs.lead.title.prompt_template", template, "title.prompt_template");
    ctx.line(Line::applied("title", None, &targets));
    leftovers(ctx, &reader, &no_reason);
    Ok(())
}

fn summarization(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("summarization", value, ctx.lookup)?;
    let mut targets = Vec::new();
    put(ctx, &mut targets, "runs.lead.summarization.enabled", reader.bool("enabled")?.map(Value::from), "summarization.enabled");
    if reader.has("model_name") {
        let model = reader.string("model_name")?.unwrap_or_default();
        put(ctx, &mut targets, "runs.lead.summarization.model_name", Some(Value::from(model)), "summarization.model_name");
    }
    let trigger_given = reader.has("trigger");
    match reader.take("trigger")? {
        Some(trigger) => put(ctx, &mut targets, "runs.lead.summarization.trigger", Some(trigger), "summarization.trigger"),
        None if trigger_given => {
            ctx.line(Line::not_applied("summarization.trigger", "null: Antler keeps its default trigger of 32000 tokens"));
        }
        None => {}
    }
    put(ctx, &mut targets, "runs.lead.summarization.keep", reader.take("keep")?, "summarization.keep");
    if reader.has("trim_tokens_to_summarize") {
        // null: no trimming, which is Antler's largest bound.
        let trim = reader.u64("trim_tokens_to_summarize")?.unwrap_or(1_000_000);
        put(
            ctx,
            &mut targets,
            "runs.lead.summarization.trim_tokens_to_summarize",
            Some(Value::from(trim)),
            "summarization.trim_tokens_to_summarize",
        );
    }
    let prompt = reader.string("summary_prompt")?.map(Value::from);
    put(ctx, &mut targets, "runs.lead.summarization.summary_prompt", prompt, "summarization.summary_prompt");
    ctx.line(Line::applied("summarization", None, &targets));
    leftovers(ctx, &reader, &|key| {
        (key == "skill_file_read_tool_names")
            .then_some("Antler keeps no durable skill-reference channel; the agent re-reads a skill when it needs it")
    });
    Ok(())
}

fn memory(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("memory", value, ctx.lookup)?;
    let mut targets = Vec::new();
    if let Some(enabled) = reader.bool("enabled")? {
        put(ctx, &mut targets, "memory.enabled", Some(Value::from(enabled)), "memory.enabled");
        put(ctx, &mut targets, "runs.lead.memory.enabled", Some(Value::from(enabled)), "memory.enabled");
    }
    if let Some(injection) = reader.bool("injection_enabled")? {
        put(ctx, &mut targets, "memory.injection_enabled", Some(Value::from(injection)), "memory.injection_enabled");
        put(ctx, &mut targets, "runs.lead.memory.injection_enabled", Some(Value::from(injection)), "memory.injection_enabled");
    }
    match reader.string("manager_class")? {
        Some(class) if !["deermem", ""].contains(&class.trim()) && !class.ends_with("DeerMemManager") => {
            ctx.line(Line::not_applied(
                "memory.manager_class",
                format!("{class}: Antler's memory service keeps DeerMem-style facts itself; no other backend is run"),
            ));
        }
        _ => {}
    }
    if reader.string("mode")?.is_some_and(|mode| mode == "tool") {
        ctx.line(Line::not_applied(
            "memory.mode",
            "tool: Antler's memory works as DeerFlow's middleware mode (extraction after each run, injection before it); \
             the model gets no memory tools",
        ));
    }
    if let Some(backend) = reader.take("backend_config")? {
        let mut backend = Reader::new("memory.backend_config", backend, ctx.lookup)?;
        for (from, to) in [
            ("debounce_seconds", "memory.debounce_seconds"),
            ("max_facts", "memory.max_facts"),
            ("max_injection_tokens", "memory.max_injection_tokens"),
            ("guaranteed_token_budget", "memory.correction_token_budget"),
        ] {
            let value = backend.u64(from)?.map(Value::from);
            put(ctx, &mut targets, to, value, &format!("memory.backend_config.{from}"));
        }
        let threshold = backend.f64("fact_confidence_threshold")?.map(Value::from);
        put(ctx, &mut targets, "memory.fact_confidence_threshold", threshold, "memory.backend_config.fact_confidence_threshold");
        if let Some(counting) = backend.string("token_counting")? {
            let antler = match counting.trim() {
                "tiktoken" => "tiktoken",
                "char" | "chars" => "chars",
                _ => return Err(wrong_type("memory.backend_config.token_counting", "tiktoken or char", &Value::from(counting))),
            };
            put(ctx, &mut targets, "memory.token_counting", Some(Value::from(antler)), "memory.backend_config.token_counting");
        }
        if let Some(categories) = backend.take("guaranteed_categories")? {
            let only_corrections = matches!(&categories, Value::Sequence(list) if list.iter().all(|c| c.as_str() == Some("correction")));
            if !only_corrections {
                ctx.line(Line::not_applied(
                    "memory.backend_config.guaranteed_categories",
                    format!("{}: Antler reserves its extra allowance for corrections only", describe(&categories)),
                ));
            }
        }
        let rest = backend.rest();
        if !rest.is_empty() {
            let model = rest.iter().any(|k| k == "model");
            let others: Vec<&String> = rest.iter().filter(|k| *k != "model").collect();
            if model {
                ctx.line(Line::not_applied(
                    "memory.backend_config.model",
                    "Antler's memory service extracts facts with a configured model: memory.model_name (empty: the run's)",
                ));
            }
            if !others.is_empty() {
                let names: Vec<&str> = others.iter().map(|s| s.as_str()).collect();
                ctx.line(Line::not_applied(
                    format!("memory.backend_config.{{{}}}", names.join(", ")),
                    "DeerMem's storage, staleness and consolidation settings; Antler keeps facts in its memory database with its own rules",
                ));
            }
        }
    }
    ctx.line(Line::applied("memory", None, &targets));
    leftovers(ctx, &reader, &|key| {
        (key == "shutdown_flush_timeout_seconds")
            .then_some("Antler's update queue is durable: updates pending at shutdown are processed after the restart")
    });
    Ok(())
}

fn database(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("database", value, ctx.lookup)?;
    let backend = reader.string("backend")?.unwrap_or_else(|| "sqlite".to_owned());
    let mut targets = Vec::new();
    let note = match backend.trim() {
        "sqlite" => {
            if let Some(dir) = reader.string("sqlite_dir")? {
                let dir = ctx.path(&dir);
                ctx.set("server.data_dir", Value::from(dir.display().to_string()), "database.sqlite_dir");
                targets.push("server.data_dir".to_owned());
            }
            reader.drop_key("postgres_url");
            "SQLite: runs.db and memory.db in server.data_dir (--data-dir overrides it)".to_owned()
        }
        "postgres" | "postgresql" => {
            let url = reader.string("postgres_url")?.filter(|u| !u.trim().is_empty()).ok_or_else(|| ConfigError::Invalid {
                path: "database.postgres_url".to_owned(),
                message: "missing: backend postgres needs it".to_owned(),
            })?;
            // SQLAlchemy's driver suffix (postgresql+asyncpg://) is not part of a libpq URL.
            let url = match url.split_once("://") {
                Some((scheme, rest)) if scheme.starts_with("postgres") => format!("postgres://{rest}"),
                _ => url,
            };
            for service in ["runs", "memory"] {
                ctx.set(&format!("{service}.database.url"), Value::from(url.clone()), "database.postgres_url");
                targets.push(format!("{service}.database.url"));
            }
            if let Some(pool) = reader.u64("pool_size")? {
                for service in ["runs", "memory"] {
                    ctx.set(&format!("{service}.database.max_connections"), Value::from(pool), "database.pool_size");
                    targets.push(format!("{service}.database.max_connections"));
                }
            }
            reader.drop_key("sqlite_dir");
            "PostgreSQL, shared by the runs and memory services".to_owned()
        }
        "memory" => {
            ctx.line(Line::not_applied(
                "database.backend",
                "memory: Antler always persists; runs and memory use SQLite in server.data_dir",
            ));
            reader.drop_key("sqlite_dir");
            reader.drop_key("postgres_url");
            "SQLite in server.data_dir".to_owned()
        }
        other => {
            return Err(wrong_type("database.backend", "sqlite, postgres or memory", &Value::from(other)));
        }
    };
    ctx.line(Line::applied("database", Some(note), &targets));
    leftovers(ctx, &reader, &|key| match key {
        "checkpoint_channel_mode" | "checkpoint_delta" | "checkpoint_graph_cache" | "checkpoint_cache" => {
            Some("Antler stores checkpoints as deltas with periodic snapshots (runs.checkpoint_snapshot_every)")
        }
        "echo_sql" => Some("statements are logged with server.log.filter sqlx=debug"),
        "pool_size" => Some("SQLite has one writer; the pool is runs.database.max_connections"),
        "postgres_schema" => Some("Antler's tables live in the connection's default schema (search_path)"),
        _ => None,
    });
    Ok(())
}

fn run_ownership(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("run_ownership", value, ctx.lookup)?;
    let mut targets = Vec::new();
    put(ctx, &mut targets, "runs.lease_secs", reader.u64("lease_seconds")?.map(Value::from), "run_ownership.lease_seconds");
    put(ctx, &mut targets, "runs.lease_grace_secs", reader.u64("grace_seconds")?.map(Value::from), "run_ownership.grace_seconds");
    ctx.line(Line::applied("run_ownership", None, &targets));
    leftovers(ctx, &reader, &|key| {
        (key == "heartbeat_enabled")
            .then_some("always on in Antler: leases are renewed every lease_secs/3 and a worker that cannot is fenced")
    });
    Ok(())
}

fn guardrails(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("guardrails", value, ctx.lookup)?;
    let enabled = reader.bool("enabled")?.unwrap_or(false);
    let provider = reader.take("provider")?;
    let class = provider.as_ref().and_then(|p| p.get("use")).and_then(Value::as_str).map(|u| u.rsplit(':').next().unwrap_or(u).to_owned());
    let mut targets = Vec::new();
    match (enabled, class.as_deref()) {
        (false, _) => {
            put(ctx, &mut targets, "runs.lead.guardrails.enabled", Some(Value::from(false)), "guardrails.enabled");
            ctx.line(Line::applied("guardrails", Some("disabled".to_owned()), &targets));
        }
        (true, Some("AllowlistProvider")) => {
            put(ctx, &mut targets, "runs.lead.guardrails.enabled", Some(Value::from(true)), "guardrails.enabled");
            let fail_closed = reader.bool("fail_closed")?.map(Value::from);
            put(ctx, &mut targets, "runs.lead.guardrails.fail_closed", fail_closed, "guardrails.fail_closed");
            let config = provider.as_ref().and_then(|p| p.get("config")).cloned().unwrap_or(Value::Null);
            let mut config = Reader::new("guardrails.provider.config", config, ctx.lookup)?;
            for key in ["denied_tools", "allowed_tools"] {
                let value = config.take(key)?;
                put(ctx, &mut targets, &format!("runs.lead.guardrails.{key}"), value, &format!("guardrails.provider.config.{key}"));
            }
            leftovers(ctx, &config, &no_reason);
            ctx.line(Line::applied("guardrails", Some("AllowlistProvider".to_owned()), &targets));
        }
        (true, class) => {
            ctx.line(Line::not_applied(
                "guardrails",
                format!(
                    "provider `{}`: Antler's guardrail providers are the allow/deny lists (AllowlistProvider) and a webhook \
                     (runs.lead.guardrails.webhook)",
                    class.unwrap_or("none")
                ),
            ));
            reader.drop_key("fail_closed");
        }
    }
    leftovers(ctx, &reader, &|key| (key == "passport").then_some("OAP passports are read by OAP providers, which Antler does not run"));
    Ok(())
}

fn llm_call(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("llm_call", value, ctx.lookup)?;
    let mut targets = Vec::new();
    let base = reader.u64("retry_base_delay_ms")?.map(Value::from);
    put(ctx, &mut targets, "models.retry.base_delay_ms", base, "llm_call.retry_base_delay_ms");
    let cap = reader.u64("retry_cap_delay_ms")?.map(Value::from);
    put(ctx, &mut targets, "models.retry.cap_delay_ms", cap, "llm_call.retry_cap_delay_ms");
    if ctx.get("models.models").is_none() && !targets.is_empty() {
        // The mapping form needs its list; none configured still means the demo model.
        ctx.set("models.models", Value::Sequence(Vec::new()), "models");
    }
    if reader.u64("max_concurrent_calls")?.is_some_and(|n| n > 0) {
        ctx.line(Line::not_applied("llm_call.max_concurrent_calls", "Antler caps calls in flight per model: models[].max_concurrency"));
    }
    ctx.line(Line::applied("llm_call", None, &targets));
    leftovers(ctx, &reader, &|key| match key {
        "retry_max_attempts" => Some("attempts are per model in Antler: models[].max_retries"),
        "burst_retry_base_delay_ms" => Some("Antler honours the provider's Retry-After and otherwise backs off alike for every 429"),
        _ => None,
    });
    Ok(())
}

fn suggestions(ctx: &mut Ctx, value: Value) -> Result<(), ConfigError> {
    let mut reader = Reader::new("suggestions", value, ctx.lookup)?;
    let mut targets = Vec::new();
    let enabled = reader.bool("enabled")?.map(Value::from);
    put(ctx, &mut targets, "edge.gateway.suggestions.enabled", enabled, "suggestions.enabled");
    let max = reader.u64("max_suggestions")?.map(Value::from);
    put(ctx, &mut targets, "edge.gateway.suggestions.max_suggestions", max, "suggestions.max_suggestions");
    ctx.line(Line::applied("suggestions", Some("the HTTP edge's /api/threads/{id}/suggestions".to_owned()), &targets));
    leftovers(ctx, &reader, &no_reason);
    Ok(())
}
