//! DeerFlow's own `config.yaml` as `antler up --config` and `antler config check --config` take it: the
//! fixture (`fixtures/deerflow/config.yaml`) carries every top-level section of DeerFlow's
//! config.example.yaml. At start-up each section is logged once as applied (with the Antler settings
//! it became) or as accepted and not applied (with the reason); `config check` prints the same lines;
//! and a model block of each provider class DeerFlow knows is accepted or refused by its class name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use antler_integration_tests::{Launch, binary, start};
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::{ListModelsRequest, ProviderKind};
use serde_json::Value;

/// The fixture's text.
fn fixture() -> anyhow::Result<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/deerflow/config.yaml");
    Ok(std::fs::read_to_string(path)?)
}

/// The variables the fixture references (never TELEGRAM_BOT_TOKEN: `channels` is not applied), with a
/// skills directory made under `dir`.
fn variables(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    std::fs::create_dir_all(dir.join("skills/public"))?;
    let mut vars: Vec<(String, String)> = [
        "GEMINI_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "MOONSHOT_API_KEY",
        "MIMO_API_KEY",
        "STEPFUN_API_KEY",
        "MINIMAX_API_KEY",
        "VLLM_API_KEY",
    ]
    .iter()
    .map(|k| ((*k).to_owned(), format!("{}-value-0123456789", k.to_ascii_lowercase())))
    .collect();
    // Nothing listens on port 9; nothing is called in these tests.
    for url in ["GEMINI_DOUBLE_URL", "AZURE_DOUBLE_URL", "OPENAI_DOUBLE_URL"] {
        vars.push((url.to_owned(), "http://127.0.0.1:9".to_owned()));
    }
    vars.push(("DEERFLOW_SKILLS_PATH".to_owned(), dir.join("skills").display().to_string()));
    Ok(vars)
}

/// `antler config check --config FILE` on `text`, with `vars` set.
fn config_check(dir: &Path, text: &str, vars: &[(String, String)]) -> anyhow::Result<Output> {
    let path = dir.join("config.yaml");
    std::fs::write(&path, text)?;
    let mut command = Command::new(binary("antler")?);
    command.args(["config", "check", "--config"]).arg(&path).env_remove("ANTLER_CONFIG").env_remove("RUST_LOG");
    for (key, value) in vars {
        command.env(key, value);
    }
    Ok(command.output()?)
}

/// The fixture's top-level keys, in file order (its top level is plain `key:` lines).
fn top_level_keys(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.starts_with(|c: char| c.is_ascii_alphabetic()))
        .filter_map(|line| line.split_once(':').map(|(key, _)| key.trim().to_owned()))
        .collect()
}

/// The mapping lines of a start-up log (JSON lines): every event with a `deerflow_section` field.
fn logged_lines(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event.get("deerflow_section").is_some())
        .filter_map(|event| event.get("message").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// The lines of a section: those about it, or about one of its keys.
fn about<'a>(lines: &'a [String], section: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|l| {
            let rest = l.strip_prefix("applied: ").or_else(|| l.strip_prefix("accepted, not applied: ")).unwrap_or_default();
            rest.strip_prefix(section).is_some_and(|tail| tail.is_empty() || tail.starts_with([' ', '.', '[']))
        })
        .collect()
}

/// Sections an Antler feature takes: each must be logged as applied.
const APPLIED: &[&str] = &[
    "config_version",
    "log_level",
    "logging",
    "extensions",
    "token_budget",
    "max_recursion_limit",
    "models",
    "tools",
    "tool_search",
    "loop_detection",
    "safety_finish_reason",
    "uploads",
    "sandbox",
    "subagents",
    "skills",
    "skill_scan",
    "skill_evolution",
    "acp_agents",
    "title",
    "summarization",
    "memory",
    "database",
    "run_ownership",
    "guardrails",
    "llm_call",
    "suggestions",
];

/// Sections with no Antler feature: each is accepted and listed with its reason.
const NOT_APPLIED: &[&str] = &[
    "token_usage",
    "tool_groups",
    "tool_output",
    "input_polish",
    "tool_progress",
    "read_before_write",
    "agents_api",
    "checkpointer",
    "dedupe_storage",
    "run_events",
    "agent_storage",
    "scheduler",
    "mcp_tasks",
    "stream_bridge",
    "channel_connections",
    "channels",
    "authorization",
    "circuit_breaker",
    "auth",
    "plugins",
];

#[tokio::test]
async fn antler_up_applies_or_lists_every_deerflow_section_once_and_config_check_prints_the_same() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let text = fixture()?;
    let vars = variables(dir.path())?;
    let keys = top_level_keys(&text);
    let every: BTreeSet<&str> = APPLIED.iter().chain(NOT_APPLIED).copied().collect();
    assert_eq!(keys.iter().map(String::as_str).collect::<BTreeSet<_>>(), every, "the fixture carries every DeerFlow section");
    assert_eq!(keys.len(), 46);

    let mut launch = Launch::new(["up"]).config(text.clone());
    for (key, value) in &vars {
        launch = launch.env(key.clone(), value.clone());
    }
    let server = start("antler", launch)?;
    let stderr = server.stderr();
    let lines = logged_lines(&stderr);
    let summaries: Vec<&str> = stderr.lines().filter(|l| l.contains("DeerFlow config.yaml (config_version 34)")).collect();
    assert_eq!(summaries.len(), 1, "the mapping is logged once: {summaries:#?}");
    assert!(summaries[0].contains("26 sections applied, 20 accepted but not applied"), "{}", summaries[0]);

    for section in APPLIED {
        let found = about(&lines, section);
        assert!(found.iter().any(|l| l.starts_with(&format!("applied: {section}"))), "{section} is not logged as applied: {lines:#?}");
    }
    for section in NOT_APPLIED {
        let found = about(&lines, section);
        assert_eq!(found.len(), 1, "{section}: {found:#?}");
        assert!(
            found[0].starts_with(&format!("accepted, not applied: {section} (")) && found[0].ends_with(')'),
            "{section} is listed with its reason: {}",
            found[0]
        );
    }
    // What became of a few sections, as the user reads it.
    let has = |start: &str| lines.iter().any(|l| l.starts_with(start));
    assert!(has("applied: models (12 models: gemini-flash, azure-4o, gpt-main, "), "{lines:#?}");
    assert!(has(
        "applied: title → runs.lead.title.enabled, runs.lead.title.max_words, runs.lead.title.max_chars, runs.lead.title.model_name"
    ));
    assert!(has("applied: database (SQLite: runs.db and memory.db in server.data_dir"));
    assert!(has("applied: sandbox (LocalSandboxProvider → local: "));
    assert!(has("accepted, not applied: sandbox.mounts ("));
    assert!(has(
        "accepted, not applied: tools[2] image_search (`use: deerflow.community.image_search.tools:image_search_tool` is not a tool Antler has;"
    ));
    assert!(has("accepted, not applied: tools[3] browser_navigate ("));
    assert!(
        has(
            "applied: tools (ls, read_file, glob, grep, write_file, str_replace, bash → built-in tools; web_search → runs.lead.web.search; web_fetch → runs.lead.web.fetch)"
        ),
        "{lines:#?}"
    );
    assert!(has("accepted, not applied: channels (Antler has no messaging channels)"));
    assert!(has("applied: acp_agents (the lead agent's invoke_acp_agent tool) → runs.lead.acp_agents"), "{lines:#?}");
    assert!(
        has("accepted, not applied: memory.backend_config.{storage_path, staleness_review_enabled, staleness_age_days} ("),
        "{lines:#?}"
    );

    // The models section took effect: the models service serves the fixture's models by provider.
    let mut models = ModelServiceClient::new(server.channel().await?);
    let list = models.list_models(ListModelsRequest {}).await?.into_inner();
    assert_eq!(list.models.len(), 12);
    assert_eq!(list.default_model_name, "gemini-flash");
    let provider = |name: &str| list.models.iter().find(|m| m.name == name).map(|m| m.provider());
    assert_eq!(provider("gemini-flash"), Some(ProviderKind::Gemini));
    assert_eq!(provider("azure-4o"), Some(ProviderKind::AzureOpenai));
    assert_eq!(provider("claude-opus"), Some(ProviderKind::Anthropic));
    assert_eq!(provider("qwen-local"), Some(ProviderKind::Openai));
    drop(server);

    // `antler config check` prints the same mapping, as comments above the translated file.
    let output = config_check(dir.path(), &text, &vars)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed: Vec<String> = stdout.lines().filter_map(|l| l.strip_prefix("#   ")).map(str::to_owned).collect();
    assert_eq!(printed, lines, "config check and start-up list the same mapping");
    assert!(
        stdout.starts_with("# DeerFlow config.yaml (config_version 34): 26 sections applied, 20 accepted but not applied\n"),
        "{stdout}"
    );
    // The translated file, resolved: DeerFlow's values under Antler's names.
    for expected in [
        "recursion_limit_max: 400",
        "max_words: 5",
        "lease_secs: 20",
        "max_file_bytes: 20971520",
        "output_max_chars: 16000",
        "default_timeout_secs: 300",
        "glob_default_results: 150",
        "warn_fraction: 0.75",
        "debounce_seconds: 300",
        "denied_tools:\n      - str_replace",
        "base_delay_ms: 200",
        "format: json",
    ] {
        assert!(stdout.contains(expected), "{expected:?} is not in the translated file:\n{stdout}");
    }
    assert!(!stdout.contains("gemini_api_key-value") && !stdout.contains("gemini_api_key: gemini"), "keys are masked");
    Ok(())
}

/// `use:` of each provider class, and what `antler config check` must answer for a model block of it
/// in the fixture: Ok (accepted) or Err(words the refusal must contain besides the class name).
const CLASSES: &[(&str, Result<(), &[&str]>)] = &[
    ("langchain_openai:ChatOpenAI", Ok(())),
    ("langchain_openai:AzureChatOpenAI", Ok(())),
    ("langchain_anthropic:ChatAnthropic", Ok(())),
    ("langchain_google_genai:ChatGoogleGenerativeAI", Ok(())),
    ("langchain_deepseek:ChatDeepSeek", Ok(())),
    ("langchain_ollama:ChatOllama", Ok(())),
    ("deerflow.models.patched_openai:PatchedChatOpenAI", Ok(())),
    ("deerflow.models.patched_deepseek:PatchedChatDeepSeek", Ok(())),
    ("deerflow.models.patched_mimo:PatchedChatMiMo", Ok(())),
    ("deerflow.models.patched_stepfun:PatchedChatStepFun", Ok(())),
    ("deerflow.models.patched_minimax:PatchedChatMiniMax", Ok(())),
    ("deerflow.models.vllm_provider:VllmChatModel", Ok(())),
    ("deerflow.models.mindie_provider:MindIEChatModel", Ok(())),
    ("deerflow.models.claude_provider:ClaudeChatModel", Ok(())),
    ("deerflow.models.openai_codex_provider:CodexChatModel", Err(&["Responses API", "langchain_openai:ChatOpenAI"])),
    ("langchain_google_vertexai:ChatVertexAI", Err(&["langchain_google_genai:ChatGoogleGenerativeAI"])),
    ("langchain_aws:ChatBedrockConverse", Err(&["langchain_anthropic:ChatAnthropic"])),
    ("langchain_groq:ChatGroq", Err(&["langchain_openai:ChatOpenAI", "https://api.groq.com/openai/v1"])),
    ("langchain_openai:ChatOpenAl", Err(&["did you mean `ChatOpenAI`?"])),
];

#[test]
fn a_model_block_of_each_provider_class_is_accepted_or_refused_by_name() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let text = fixture()?;
    let vars = variables(dir.path())?;
    for (use_path, expected) in CLASSES {
        // The probe goes first, so it is models[0]; the Azure keys are the probe's own when it is Azure.
        let azure = if use_path.ends_with("AzureChatOpenAI") {
            ", azure_endpoint: 'https://probe.openai.azure.com', openai_api_version: 2024-10-21"
        } else {
            ""
        };
        let block = format!("models:\n  - {{name: probe, use: '{use_path}', model: probe-model, api_key: sk-probe-0123456789{azure}}}\n");
        let with_probe = text.replacen("models:\n", &block, 1);
        let output = config_check(dir.path(), &with_probe, &vars)?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let class = use_path.rsplit(':').next().unwrap_or_default();
        match expected {
            Ok(()) => {
                assert!(output.status.success(), "{use_path} was refused: {stderr}");
                assert!(stdout.contains("#   applied: models (13 models: probe, gemini-flash"), "{use_path}: {stdout}");
            }
            Err(words) => {
                assert!(!output.status.success(), "{use_path} was accepted:\n{stdout}");
                assert!(stderr.contains(class), "{use_path}: the refusal names the class: {stderr}");
                assert!(stderr.contains("hint:"), "{use_path}: {stderr}");
                assert!(stderr.contains("DeerFlow's `models[0].use`"), "{use_path}: the DeerFlow key is named: {stderr}");
                for word in *words {
                    assert!(stderr.contains(word), "{use_path}: the alternative {word:?} is named: {stderr}");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn a_range_error_names_the_deerflow_key_and_an_antler_file_stays_strict() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let vars = variables(dir.path())?;
    let text = fixture()?.replace("  max_words: 5\n", "  max_words: 50\n");
    let output = config_check(dir.path(), &text, &vars)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("runs.lead.title.max_words") && stderr.contains("DeerFlow's `title.max_words`"), "{stderr}");

    // Without config_version or any DeerFlow-only section, a file is antler.yaml: a misspelt section is
    // an error, as before.
    let output = config_check(dir.path(), "serverr: {}\n", &vars)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("unknown top-level section `serverr`"), "{stderr}");
    Ok(())
}
