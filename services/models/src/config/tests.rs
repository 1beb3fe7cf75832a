use super::*;

const DEERFLOW: &str = include_str!("../../tests/fixtures/deerflow_config.yaml");

fn env(name: &str) -> Option<String> {
    name.ends_with("_API_KEY").then(|| format!("key-of-{name}"))
}

fn parse(text: &str) -> Result<Resolved, ConfigError> {
    let config = Config::parse(text, "antler.yaml", &env)?;
    resolve(&config)
}

fn error_of(text: &str) -> String {
    match parse(text) {
        Ok(_) => "no error".to_owned(),
        Err(e) => e.to_string(),
    }
}

fn by_name<'a>(resolved: &'a Resolved, name: &str) -> &'a ModelSpec {
    resolved.models.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no model {name}"))
}

#[test]
fn every_deerflow_example_model_entry_loads() -> Result<(), ConfigError> {
    let resolved = parse(DEERFLOW)?;
    assert_eq!(resolved.models.len(), 24, "{:?}", resolved.models.iter().map(|m| &m.name).collect::<Vec<_>>());
    for model in &resolved.models {
        assert!(model.api_key.value().is_some() || model.kind == ProviderKind::Replay || model.name.contains("local"), "{}", model.name);
    }
    Ok(())
}

#[test]
fn deerflow_entries_map_to_the_right_provider_and_endpoint() -> Result<(), ConfigError> {
    let r = parse(DEERFLOW)?;
    let doubao = by_name(&r, "doubao-seed-1.8");
    assert_eq!((doubao.kind, doubao.base_url.as_str()), (ProviderKind::OpenAi, "https://ark.cn-beijing.volces.com/api/v3"));
    assert!(doubao.send_reasoning_content);
    assert_eq!(doubao.timeouts.first_byte, Duration::from_secs(600));
    assert_eq!(doubao.api_key.source, "models[0].api_key", "no file, so no variable name to recover");

    let claude = by_name(&r, "claude-sonnet-4");
    assert_eq!(
        (claude.kind, claude.base_url.as_str(), claude.max_tokens),
        (ProviderKind::Anthropic, "https://api.anthropic.com", Some(16000))
    );
    assert_eq!(claude.api_key.value(), Some("key-of-ANTHROPIC_API_KEY"));

    let ollama = by_name(&r, "qwen3-local");
    assert_eq!((ollama.base_url.as_str(), ollama.max_tokens), ("http://localhost:11434/v1", Some(8192)));
    let gemini = by_name(&r, "gemini-2.5-pro");
    assert_eq!((gemini.kind, gemini.base_url.as_str()), (ProviderKind::Gemini, "https://generativelanguage.googleapis.com"));
    assert_eq!(gemini.api_key.value(), Some("key-of-GEMINI_API_KEY"));
    let deepseek = by_name(&r, "deepseek-v4");
    assert_eq!(deepseek.base_url, "https://api.deepseek.com/v1");
    let mindie = by_name(&r, "Qwen3_Coder_480B_MindIE");
    assert_eq!(
        (mindie.max_retries, mindie.timeouts.first_byte, mindie.timeouts.connect),
        (1, Duration::from_secs(900), Duration::from_secs(30))
    );
    assert_eq!(by_name(&r, "gpt-4").timeouts.chunk, Duration::from_secs(240), "DeerFlow's stream_chunk_timeout default");
    assert!(!by_name(&r, "gpt-5-responses").notes.is_empty(), "use_responses_api is noted");
    Ok(())
}

#[test]
fn the_thinking_shortcut_is_folded_into_when_thinking_enabled() -> Result<(), ConfigError> {
    let r = parse(
        "models:\n  - name: c\n    provider: anthropic\n    model: claude\n    supports_thinking: true\n    when_thinking_enabled:\n      thinking: {type: enabled, budget_tokens: 1024}\n    thinking: {budget_tokens: 3000}\n",
    )?;
    let wte = r.models[0].when_thinking_enabled.clone().unwrap_or_default();
    assert_eq!(wte["thinking"], serde_json::json!({ "type": "enabled", "budget_tokens": 3000 }));
    Ok(())
}

#[test]
fn the_mapping_form_takes_retry_timing() -> Result<(), ConfigError> {
    let r =
        parse("models:\n  retry: {base_delay_ms: 10, cap_delay_ms: 20}\n  models:\n    - {name: a, provider: openai, model: gpt-4o}\n")?;
    assert_eq!(r.retry.base_delay, Duration::from_millis(10));
    assert_eq!(r.models[0].base_url, "https://api.openai.com/v1");
    Ok(())
}

#[test]
fn an_empty_section_serves_the_built_in_demo_model() -> Result<(), ConfigError> {
    for text in ["models: {}\n", "", "models: []\n"] {
        let r = parse(text)?;
        assert_eq!(r.models.len(), 1, "{text:?}");
        assert_eq!(r.models[0].name, "demo");
        let script = r.models[0].replay.as_ref().map(|s| s.turns.len());
        assert_eq!(script, Some(5), "the shipped transcript: plan, write, check, present, answer");
    }
    let configured = parse("models:\n  - {name: a, provider: openai, model: gpt-4o}\n")?;
    assert_eq!(configured.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["a"], "a configured model replaces the demo");
    Ok(())
}

#[test]
fn unknown_keys_are_named_with_their_path() {
    let text = error_of("models:\n  - {name: a, provider: openai, model: m, temprature: 1}\n");
    assert!(text.contains("models") && text.contains("temprature"), "{text}");
}

#[test]
fn unmappable_deerflow_classes_are_explained() {
    let text = error_of("models:\n  - {name: codex, use: 'deerflow.models.openai_codex_provider:CodexChatModel', model: gpt-5}\n");
    assert!(text.contains("models[0].use") && text.contains("Responses API"), "{text}");
    let text = error_of("models:\n  - {name: b, use: 'langchain_aws:ChatBedrock', model: x}\n");
    assert!(text.contains("ChatBedrock") && text.contains("hint"), "{text}");
    // An explicit provider says how to call an unknown class.
    assert_eq!(error_of("models:\n  - {name: b, use: 'my.pkg:MyChat', provider: openai, model: x}\n"), "no error");
}

#[test]
fn azure_deployments_are_built_from_endpoint_deployment_and_api_version() -> Result<(), ConfigError> {
    let r = parse(
        "models:\n  - {name: az, use: 'langchain_openai:AzureChatOpenAI', model: gpt-4o, azure_endpoint: 'https://res.openai.azure.com/', \
         azure_deployment: prod-4o, openai_api_version: 2024-10-21, api_key: k}\n  \
         - {name: az-ad, provider: azure, azure_deployment: mini, azure_endpoint: 'https://res.openai.azure.com', api_version: 2024-10-21, azure_ad_token: t}\n  \
         - {name: az-v1, provider: azure, model: gpt-4.1, base_url: 'https://res.openai.azure.com/openai/v1', api_key: k}\n",
    )?;
    let az = by_name(&r, "az");
    assert_eq!(
        (az.kind, az.base_url.as_str(), az.api_version.as_str()),
        (ProviderKind::Azure, "https://res.openai.azure.com/openai/deployments/prod-4o", "2024-10-21")
    );
    assert!(!az.bearer_token);
    let ad = by_name(&r, "az-ad");
    assert_eq!(
        (ad.upstream_model.as_str(), ad.bearer_token, ad.api_key.value()),
        ("mini", true, Some("t")),
        "the deployment names the model"
    );
    assert_eq!(by_name(&r, "az-v1").api_version, "", "the v1 API takes no api-version");
    Ok(())
}

#[test]
fn azure_and_gemini_settings_are_checked() {
    let text = error_of("models:\n  - {name: az, provider: azure, model: m, azure_endpoint: 'https://r.openai.azure.com'}\n");
    assert!(text.contains("models[0].api_version") && text.contains("OPENAI_API_VERSION"), "{text}");
    let text = error_of(
        "models:\n  - {name: az, provider: azure, model: 'a b', azure_endpoint: 'https://r.openai.azure.com', api_version: 2024-10-21}\n",
    );
    assert!(text.contains("models[0].azure_deployment"), "{text}");
    let text = error_of("models:\n  - {name: g, provider: openai, model: m, thinking_budget: 10}\n");
    assert!(text.contains("models[0].thinking_budget") && text.contains("gemini"), "{text}");
    let text = error_of(
        "models:\n  - {name: g, provider: gemini, model: gemini-2.5-pro, api_key: k, when_thinking_enabled: {thinking: {type: enabled}}}\n",
    );
    assert!(text.contains("models[0].when_thinking_enabled.thinking") && text.contains("thinking_budget"), "{text}");
    assert_eq!(
        error_of(
            "models:\n  - {name: g, use: 'langchain_google_genai:ChatGoogleGenerativeAI', model: gemini-2.5-flash, google_api_key: k, thinking_budget: 1024, include_thoughts: true, supports_thinking: true}\n"
        ),
        "no error"
    );
}

#[test]
fn names_must_be_unique_and_fallbacks_known() {
    let text = error_of("models:\n  - {name: a, provider: openai, model: m}\n  - {name: a, provider: openai, model: m}\n");
    assert!(text.contains("models[1].name") && text.contains("unique"), "{text}");
    let text = error_of("models:\n  - {name: a, provider: openai, model: m, fallbacks: [zz]}\n");
    assert!(text.contains("models[0].fallbacks[0]") && text.contains("zz"), "{text}");
    let text = error_of("models:\n  - {name: a, provider: openai, model: m, fallbacks: [a]}\n");
    assert!(text.contains("the model itself"), "{text}");
}

#[test]
fn ranges_are_named_in_errors() {
    let text = error_of("models:\n  - {name: a, provider: openai, model: m, temperature: 3}\n");
    assert!(text.contains("models[0].temperature") && text.contains("between 0 and 2"), "{text}");
    let text = error_of("models:\n  - {name: a, provider: openai, model: m, max_retries: 99}\n");
    assert!(text.contains("models[0].max_retries") && text.contains("between 0 and 20"), "{text}");
    let text = error_of("models:\n  - {name: a, provider: openai, model: m, chunk_timeout_ms: 0}\n");
    assert!(text.contains("chunk_timeout_ms"), "{text}");
    let text = error_of("models:\n  retry: {base_delay_ms: 100, cap_delay_ms: 10}\n");
    assert!(text.contains("models.retry.cap_delay_ms"), "{text}");
}

#[test]
fn required_fields_are_asked_for() {
    assert!(error_of("models:\n  - {name: a, model: m}\n").contains("provider"));
    assert!(error_of("models:\n  - {name: a, provider: openai}\n").contains("models[0].model"));
    assert!(error_of("models:\n  - {name: a, provider: replay}\n").contains("replay"));
    assert!(error_of("models:\n  - {name: a, provider: openai, model: m, base_url: 'ftp://x'}\n").contains("base_url"));
}

#[test]
fn a_missing_key_variable_is_named() {
    let text = error_of("models:\n  - {name: a, provider: openai, model: m, api_key: $NOT_SET_ANYWHERE}\n");
    assert!(text.contains("NOT_SET_ANYWHERE") && text.contains("models[0].api_key"), "{text}");
}

#[test]
fn the_key_variable_is_recovered_from_the_file_for_error_messages() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("antler.yaml");
    std::fs::write(&path, "models:\n  - name: a\n    provider: openai\n    model: m\n    api_key: ${ANTLER_TEST_KEY_VAR}\n")?;
    let refs = key_references(&path);
    assert_eq!(refs.get("a").map(String::as_str), Some("ANTLER_TEST_KEY_VAR"));
    assert_eq!(variable_name("$FOO"), Some("FOO".to_owned()));
    assert_eq!(variable_name("${FOO:-x}"), Some("FOO".to_owned()));
    assert_eq!(variable_name("literal"), None);
    Ok(())
}

#[test]
fn replay_files_are_read_relative_to_the_config() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("script.yaml"), "turns:\n  - text: hello\n")?;
    let section: ModelsConfig = serde_yaml_ng::from_str("- {name: r, provider: replay, replay_file: script.yaml}\n")?;
    let resolved = resolve_section(&section, dir.path(), &BTreeMap::new())?;
    assert_eq!(resolved.models[0].replay.as_ref().map(|s| s.turns.len()), Some(1));
    let missing: ModelsConfig = serde_yaml_ng::from_str("- {name: r, provider: replay, replay_file: nope.yaml}\n")?;
    let text = resolve_section(&missing, dir.path(), &BTreeMap::new()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("models[0].replay_file") && text.contains("nope.yaml"), "{text}");
    Ok(())
}

#[test]
fn the_example_config_is_valid() -> Result<(), ConfigError> {
    let text = include_str!("../../../../examples/antler.yaml");
    let config = Config::parse(text, "examples/antler.yaml", &|_| None)?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let section: ModelsConfig = config.section("models")?;
    resolve_section(&section, &dir, &BTreeMap::new())?;
    Ok(())
}
