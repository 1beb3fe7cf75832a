use super::*;
use crate::config::Config;

fn lookup(name: &str) -> Option<String> {
    match name {
        "OPENAI_API_KEY" => Some("sk-from-env".to_owned()),
        "PG_URL" => Some("postgresql+asyncpg://deer@db.internal:5432/flow".to_owned()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse_at(text, "config.yaml", Some(Path::new("/srv/deerflow")), &lookup)
}

fn error(text: &str) -> String {
    parse(text).err().map(|e| e.to_string()).unwrap_or_else(|| "no error".to_owned())
}

fn lines(config: &Config) -> Vec<String> {
    config.deerflow.as_ref().map(|t| t.lines.iter().map(ToString::to_string).collect()).unwrap_or_default()
}

fn has_line(config: &Config, start: &str) -> bool {
    lines(config).iter().any(|l| l.starts_with(start))
}

fn section(config: &Config, name: &str) -> Value {
    config.section::<Option<Value>>(name).ok().flatten().unwrap_or(Value::Null)
}

fn at<'v>(value: &'v Value, path: &str) -> &'v Value {
    path.split('.').fold(value, |v, key| v.get(key).unwrap_or(&Value::Null))
}

#[test]
fn a_file_is_deerflows_by_its_version_or_its_own_sections() {
    let detect = |text: &str| serde_yaml_ng::from_str::<Mapping>(text).map(|m| is_deerflow(&m)).unwrap_or(false);
    assert!(detect("config_version: 34\n"));
    assert!(detect("title: {enabled: true}\n"));
    assert!(detect("sandbox: {use: 'deerflow.sandbox.local:LocalSandboxProvider'}\n"));
    assert!(detect("memory: {manager_class: deermem}\n"));
    assert!(!detect("models: []\nserver: {}\n"), "a models list alone is a native file (as before)");
    assert!(!detect("serverr: {}\n"), "a misspelt native section stays native, and an error");
    assert!(!detect("sandbox: {provider: local}\nmemory: {enabled: true}\n"));
}

#[test]
fn a_native_file_stays_strict() {
    let text = error("serverr: {}\n");
    assert!(text.contains("unknown top-level section `serverr`"), "{text}");
    assert!(parse("server: {}\n").is_ok_and(|c| c.deerflow.is_none()));
}

#[test]
fn mapped_sections_land_in_antler_settings() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\nlog_level: warning\nmax_recursion_limit: 60\n\
         title: {enabled: false, max_words: 4, max_chars: 40, model_name: null}\n\
         loop_detection: {enabled: true, warn_threshold: 2, hard_limit: 4, window_size: 10, max_tracked_threads: 5}\n\
         token_budget: {enabled: true, max_tokens: 50000, warn_threshold: 0.5, hard_stop_threshold: 1.0}\n\
         tool_search: {enabled: true, auto_promote_top_k: 2}\n\
         uploads: {max_files: 3, max_file_size: 1000, max_total_size: 3000, pdf_converter: auto}\n\
         sandbox: {use: 'deerflow.sandbox.local:LocalSandboxProvider', allow_host_bash: true, bash_output_max_chars: 900, bash_command_timeout: 7200}\n\
         skills: {path: ../skills, container_path: /mnt/skills}\n\
         run_ownership: {lease_seconds: 45, grace_seconds: 5, heartbeat_enabled: true}\n\
         database: {backend: postgres, postgres_url: $PG_URL, pool_size: 7}\n\
         llm_call: {retry_base_delay_ms: 250, retry_cap_delay_ms: 4000, retry_max_attempts: 3}\n\
         suggestions: {enabled: false, max_suggestions: 2}\n",
    )?;
    assert_eq!(at(&section(&config, "edge"), "gateway.suggestions.max_suggestions").as_u64(), Some(2));
    let runs = section(&config, "runs");
    assert_eq!(config.server.log.filter, "warn,sqlx=warn");
    assert_eq!(at(&runs, "recursion_limit_max").as_u64(), Some(60));
    assert_eq!(at(&runs, "recursion_limit_default").as_u64(), Some(60), "a ceiling under 100 lowers the default too");
    assert_eq!(at(&runs, "lead.title.enabled").as_bool(), Some(false));
    assert_eq!(at(&runs, "lead.title.model_name").as_str(), Some(""), "null: the local fallback");
    assert_eq!(at(&runs, "lead.loop_detection.window_size").as_u64(), Some(10));
    assert_eq!(at(&runs, "lead.token_budget.default_tokens").as_u64(), Some(50_000));
    assert_eq!(at(&runs, "lead.token_budget.warn_fraction").as_f64(), Some(0.5));
    assert_eq!((at(&runs, "lease_secs").as_u64(), at(&runs, "lease_grace_secs").as_u64()), (Some(45), Some(5)));
    assert_eq!(at(&runs, "database.url").as_str(), Some("postgres://deer@db.internal:5432/flow"));
    assert_eq!(at(&section(&config, "memory"), "database.max_connections").as_u64(), Some(7));
    assert_eq!(at(&section(&config, "mcp"), "tool_search.enabled").as_bool(), Some(true));
    let sandbox = section(&config, "sandbox");
    assert_eq!(at(&sandbox, "provider").as_str(), Some("local"));
    assert_eq!(at(&sandbox, "uploads.max_file_bytes").as_u64(), Some(1000));
    assert_eq!(at(&sandbox, "commands.output_max_chars").as_u64(), Some(900));
    assert_eq!(at(&sandbox, "commands.max_timeout_secs").as_u64(), Some(7200), "a default above the cap raises the cap");
    assert_eq!(at(&sandbox, "skills.public_dir").as_str(), Some("/srv/deerflow/../skills/public"), "relative to the file");
    assert_eq!(at(&section(&config, "models"), "retry.base_delay_ms").as_u64(), Some(250));

    assert!(has_line(&config, "applied: title → runs.lead.title.enabled"), "{:#?}", lines(&config));
    assert!(has_line(&config, "accepted, not applied: loop_detection.max_tracked_threads ("), "{:#?}", lines(&config));
    assert!(has_line(&config, "accepted, not applied: tool_search.auto_promote_top_k ("));
    assert!(has_line(&config, "accepted, not applied: uploads.pdf_converter ("));
    assert!(has_line(&config, "accepted, not applied: llm_call.retry_max_attempts ("));
    assert!(has_line(&config, "accepted, not applied: run_ownership.heartbeat_enabled ("));
    Ok(())
}

#[test]
fn sections_without_an_antler_feature_are_listed_with_the_reason() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\nchannels: {telegram: {enabled: true, bot_token: $TELEGRAM_BOT_TOKEN}}\nscheduler: {enabled: false}\nmy_extra: 1\n",
    )?;
    let lines = lines(&config);
    assert!(lines.contains(&"accepted, not applied: channels (Antler has no messaging channels)".to_owned()), "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("accepted, not applied: scheduler (")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("accepted, not applied: my_extra (not a section")), "{lines:#?}");
    // The unset $TELEGRAM_BOT_TOKEN did not matter: nothing of `channels` is applied.
    let summary = config.deerflow.as_ref().map(|t| t.summary()).unwrap_or_default();
    assert!(summary.contains("config_version 34") && summary.contains("3 accepted but not applied"), "{summary}");
    Ok(())
}

#[test]
fn variables_of_applied_values_are_resolved_and_missing_ones_named_at_the_deerflow_path() {
    let config = parse(
        "config_version: 34\nmodels:\n  - {name: gpt, use: 'langchain_openai:ChatOpenAI', model: gpt-4o, api_key: $OPENAI_API_KEY}\n",
    );
    let models = config.map(|c| section(&c, "models")).unwrap_or(Value::Null);
    let key = at(&models, "models").get(0).and_then(|m| m.get("api_key")).and_then(Value::as_str).map(str::to_owned);
    assert_eq!(key.as_deref(), Some("sk-from-env"));
    let text = error("config_version: 34\ntitle: {model_name: $TITLE_MODEL}\n");
    assert!(text.contains("TITLE_MODEL") && text.contains("title.model_name"), "{text}");
}

#[test]
fn wrong_types_are_named_by_their_deerflow_path() {
    let text = error("config_version: 34\ntitle: {max_words: six}\n");
    assert!(text.contains("title.max_words") && text.contains("six"), "{text}");
    let text = error("config_version: 34\ndatabase: {backend: postgres}\n");
    assert!(text.contains("database.postgres_url") && text.contains("missing"), "{text}");
    let text = error("config_version: 34\nlog_level: loud\n");
    assert!(text.contains("log_level") && text.contains("loud"), "{text}");
}

#[test]
fn an_antler_range_error_names_the_deerflow_key_behind_it() -> Result<(), ConfigError> {
    let translation = parse("config_version: 34\ntitle: {max_words: 99}\n")?.deerflow.unwrap_or_default();
    assert_eq!(translation.origin_of("runs.lead.title.max_words").as_deref(), Some("title.max_words"));
    assert_eq!(translation.origin_of("runs.lead.title"), None);
    let config = parse("config_version: 34\nmodels: []\n")?;
    let explained = config.explain(ConfigError::Invalid { path: "models.models[2].use".into(), message: "bad".into() }).to_string();
    assert!(explained.contains("DeerFlow's `models[2].use`"), "{explained}");
    let text = error("config_version: 34\nsandbox: {use: x, idle_timeout: 5}\nserver: {max_message_bytes: 10}\n");
    assert!(text.contains("server.max_message_bytes") && !text.contains("DeerFlow's"), "an overlay is the user's own: {text}");
    Ok(())
}

#[test]
fn antler_sections_in_a_deerflow_file_are_applied_over_the_translation() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\nlog_level: debug\nserver: {log: {format: json}}\nruns: {lead: {title: {max_words: 3}}}\ntitle: {max_words: 5, enabled: true}\n",
    )?;
    assert_eq!((config.server.log.filter.as_str(), config.server.log.format), ("debug,sqlx=warn", crate::config::LogFormat::Json));
    let runs = section(&config, "runs");
    assert_eq!(at(&runs, "lead.title.max_words").as_u64(), Some(3), "the native section wins");
    assert_eq!(at(&runs, "lead.title.enabled").as_bool(), Some(true), "and the rest of the translation stays");
    assert!(has_line(&config, "applied: server (an Antler section, as written) → server"));
    Ok(())
}

#[test]
fn sandbox_tools_are_built_ins_and_web_tools_need_a_mapper() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\ntools:\n  - {name: glob, group: 'file:read', use: 'deerflow.sandbox.tools:glob_tool', max_results: 150}\n  \
         - {name: bash, group: bash, use: 'deerflow.sandbox.tools:bash_tool'}\n  \
         - {name: web_search, group: web, use: 'deerflow.community.tavily.tools:web_search_tool', api_key: $OPENAI_API_KEY}\n",
    )?;
    assert_eq!(at(&section(&config, "sandbox"), "files.glob_default_results").as_u64(), Some(150));
    assert!(has_line(&config, "applied: tools (glob, bash → built-in tools)"), "{:#?}", lines(&config));
    assert!(has_line(&config, "accepted, not applied: tools[2] web_search (`use: deerflow.community.tavily"), "{:#?}", lines(&config));
    assert!(has_line(&config, "accepted, not applied: tools (ls, read_file, grep, write_file, str_replace not listed)"));
    Ok(())
}

#[test]
fn memory_maps_onto_the_memory_service_and_the_lead_layer() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\nmemory:\n  enabled: true\n  injection_enabled: false\n  manager_class: mem0\n  mode: tool\n  \
         backend_config: {debounce_seconds: 12, max_facts: 80, fact_confidence_threshold: 0.6, token_counting: char, \
         guaranteed_token_budget: 300, storage_path: '', staleness_age_days: 90, model: {provider: openai}}\n",
    )?;
    let memory = section(&config, "memory");
    assert_eq!(at(&memory, "debounce_seconds").as_u64(), Some(12));
    assert_eq!(at(&memory, "token_counting").as_str(), Some("chars"));
    assert_eq!(at(&memory, "correction_token_budget").as_u64(), Some(300));
    assert_eq!(at(&section(&config, "runs"), "lead.memory.enabled").as_bool(), Some(true));
    assert_eq!(at(&section(&config, "runs"), "lead.memory.injection_enabled").as_bool(), Some(false));
    assert!(has_line(&config, "accepted, not applied: memory.manager_class (mem0:"));
    assert!(has_line(&config, "accepted, not applied: memory.mode (tool:"));
    assert!(has_line(&config, "accepted, not applied: memory.backend_config.model ("));
    assert!(
        has_line(&config, "accepted, not applied: memory.backend_config.{storage_path, staleness_age_days} ("),
        "{:#?}",
        lines(&config)
    );
    Ok(())
}

#[test]
fn guardrails_map_only_the_allowlist_provider() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\nguardrails:\n  enabled: true\n  provider:\n    use: 'deerflow.guardrails.builtin:AllowlistProvider'\n    config: {denied_tools: [bash]}\n",
    )?;
    assert_eq!(at(&section(&config, "runs"), "lead.guardrails.denied_tools").get(0).and_then(Value::as_str), Some("bash"));
    let other = parse("config_version: 34\nguardrails: {enabled: true, provider: {use: 'my_pkg:MyProvider'}}\n")?;
    assert!(has_line(&other, "accepted, not applied: guardrails (provider `MyProvider`"), "{:#?}", lines(&other));
    assert_eq!(at(&section(&other, "runs"), "lead.guardrails"), &Value::Null);
    Ok(())
}

#[test]
fn skill_scan_and_skill_evolution_map_onto_the_sandbox_scan_and_skill_manage() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\nskill_scan: {enabled: false}\nskill_evolution: {enabled: true, moderation_model_name: gpt, security_fail_closed: true}\n",
    )?;
    assert_eq!(at(&section(&config, "sandbox"), "skills.scan.enabled").as_bool(), Some(false));
    assert_eq!(at(&section(&config, "runs"), "lead.skill_evolution.enabled").as_bool(), Some(true));
    assert!(has_line(&config, "applied: skill_scan"), "{:#?}", lines(&config));
    assert_eq!(at(&section(&config, "sandbox"), "skills.moderation.model_name").as_str(), Some("gpt"));
    assert_eq!(at(&section(&config, "sandbox"), "skills.moderation.fail_closed").as_bool(), Some(true));
    assert!(!has_line(&config, "accepted, not applied: skill_evolution"), "{:#?}", lines(&config));
    Ok(())
}

#[test]
fn acp_agents_become_the_lead_agents_acp_agents() -> Result<(), ConfigError> {
    let config = parse(
        "config_version: 34\nacp_agents:\n  claude_code:\n    command: npx\n    args: ['-y', '@zed-industries/claude-code-acp']\n    description: Claude Code\n    model: null\n    auto_approve_permissions: true\n    env: {ANTHROPIC_API_KEY: sk-test}\n",
    )?;
    let runs = section(&config, "runs");
    assert_eq!(at(&runs, "lead.acp_agents.claude_code.command").as_str(), Some("npx"));
    assert_eq!(at(&runs, "lead.acp_agents.claude_code.description").as_str(), Some("Claude Code"));
    assert_eq!(at(&runs, "lead.acp_agents.claude_code.env.ANTHROPIC_API_KEY").as_str(), Some("sk-test"));
    assert!(at(&runs, "lead.acp_agents.claude_code.args").as_sequence().is_some_and(|a| a.len() == 2));
    assert!(has_line(&config, "applied: acp_agents"), "{:#?}", lines(&config));
    assert!(has_line(&config, "accepted, not applied: acp_agents.claude_code.auto_approve_permissions"), "{:#?}", lines(&config));
    assert!(has_line(&config, "accepted, not applied: acp_agents.claude_code.model"), "{:#?}", lines(&config));
    Ok(())
}
