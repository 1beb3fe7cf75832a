use super::*;
use crate::events::Stop;
use crate::request::tests::call;
use crate::spec::ProviderKind;
use crate::spec::tests::spec;
use serde_json::json;

fn feed(datas: &[&str]) -> Result<Vec<Event>, UpstreamError> {
    let mut parser = Parser::default();
    let mut out = Vec::new();
    for data in datas {
        out.extend(parser.on_event(&SseEvent { event: "message".into(), data: (*data).to_owned() })?);
    }
    out.extend(parser.on_eof()?);
    Ok(out)
}

#[test]
fn the_url_carries_the_api_version_and_the_v1_api_none() {
    let root = "https://res.openai.azure.com/openai/deployments/gpt4o";
    assert_eq!(chat_url(root, "2024-10-21"), format!("{root}/chat/completions?api-version=2024-10-21"));
    assert_eq!(chat_url("https://res.openai.azure.com/openai/v1", ""), "https://res.openai.azure.com/openai/v1/chat/completions");
}

#[test]
fn newer_api_versions_take_max_completion_tokens() -> Result<(), ModelError> {
    assert!(takes_max_completion_tokens("x", "2024-10-21"));
    assert!(takes_max_completion_tokens("x", "2025-04-01-preview"));
    assert!(!takes_max_completion_tokens("x", "2024-06-01"));
    assert!(takes_max_completion_tokens("https://r.openai.azure.com/openai/v1", ""));
    let mut model = spec("azure", ProviderKind::Azure);
    model.base_url = "https://res.openai.azure.com/openai/deployments/gpt4o".into();
    model.api_version = "2024-10-21".into();
    let provider = Azure::new(&model).map_err(|e| ModelError::invalid("model", e))?;
    let body = provider.prepare(&call(), json!({"max_tokens": 64}).as_object().cloned().unwrap_or_default())?;
    assert_eq!((body.get("max_tokens"), body["max_completion_tokens"].as_u64()), (None, Some(64)));
    assert_eq!(body["stream_options"], json!({"include_usage": true}), "the body is OpenAI's");
    model.api_version = "2024-06-01".into();
    let provider = Azure::new(&model).map_err(|e| ModelError::invalid("model", e))?;
    let body = provider.prepare(&call(), json!({"max_tokens": 64}).as_object().cloned().unwrap_or_default())?;
    assert_eq!(body["max_tokens"].as_u64(), Some(64));
    Ok(())
}

#[test]
fn the_filter_results_event_does_not_hide_the_model_name() -> Result<(), UpstreamError> {
    let events = feed(&[
        r#"{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}]}"#,
        r#"{"choices":[{"content_filter_results":{},"delta":{"content":"Hi","role":"assistant"},"finish_reason":null,"index":0}],"created":1,"id":"chatcmpl-1","model":"gpt-4o-2024-11-20","object":"chat.completion.chunk"}"#,
        r#"{"choices":[{"content_filter_results":{},"delta":{},"finish_reason":"content_filter","index":0}],"created":1,"id":"chatcmpl-1","model":"gpt-4o-2024-11-20","object":"chat.completion.chunk"}"#,
        r#"{"choices":[],"created":1,"id":"chatcmpl-1","model":"gpt-4o-2024-11-20","object":"chat.completion.chunk","usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#,
        "[DONE]",
    ])?;
    assert_eq!(events[0], Event::Model("gpt-4o-2024-11-20".into()));
    assert!(events.contains(&Event::Text("Hi".into())));
    assert!(events.contains(&Event::Finish { stop: Stop::ContentFilter, raw: "content_filter".into(), stop_sequence: String::new() }));
    Ok(())
}
