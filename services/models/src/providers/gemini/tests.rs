use super::*;
use crate::request::tests::{call, user};
use crate::spec::ProviderKind;
use crate::spec::tests::spec;
use crate::tool_intern::CallTool;
use antler_proto::common::{TextPart, ThinkingPart, ToolCall};

fn feed(datas: &[&str]) -> Result<Vec<Event>, UpstreamError> {
    let mut parser = Parser::default();
    let mut out = Vec::new();
    for data in datas {
        out.extend(parser.on_event(&SseEvent { event: "message".into(), data: (*data).to_owned() })?);
    }
    out.extend(parser.on_eof()?);
    Ok(out)
}

fn provider() -> Gemini {
    let mut model = spec("gemini", ProviderKind::Gemini);
    model.upstream_model = "gemini-2.5-pro".into();
    Gemini::new(&model).unwrap_or_else(|e| panic!("{e}"))
}

fn settings(pairs: Value) -> Map<String, Value> {
    pairs.as_object().cloned().unwrap_or_default()
}

#[test]
fn the_url_names_the_model_and_asks_for_sse() {
    assert_eq!(
        stream_url("https://generativelanguage.googleapis.com", "gemini-2.5-pro"),
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
    assert_eq!(
        stream_url("http://proxy/v1beta", "models/gemini-2.0-flash"),
        "http://proxy/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse"
    );
}

#[test]
fn text_thoughts_usage_and_the_model_version_are_read() -> Result<(), UpstreamError> {
    let events = feed(&[
        r#"{"candidates":[{"content":{"parts":[{"text":"Weighing it","thought":true}],"role":"model"},"index":0}],"usageMetadata":{"promptTokenCount":12,"totalTokenCount":12},"modelVersion":"gemini-2.5-pro","responseId":"r1"}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"Hello, "}],"role":"model"},"index":0}],"modelVersion":"gemini-2.5-pro"}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"world!"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":12,"candidatesTokenCount":4,"thoughtsTokenCount":30,"cachedContentTokenCount":8,"totalTokenCount":46},"modelVersion":"gemini-2.5-pro"}"#,
    ])?;
    assert_eq!(events[0], Event::Model("gemini-2.5-pro".into()));
    assert_eq!(events[1], Event::Thinking("Weighing it".into()));
    let text: String = events.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None }).collect();
    assert_eq!(text, "Hello, world!");
    assert!(events.contains(&Event::Finish { stop: Stop::Stop, raw: "STOP".into(), stop_sequence: String::new() }));
    let usage = events.iter().filter_map(|e| if let Event::Usage(u) = e { Some(*u) } else { None }).next_back().unwrap_or_default();
    assert_eq!(
        (usage.input, usage.output, usage.total, usage.cache_read, usage.reasoning),
        (Some(12), Some(34), Some(46), Some(8), Some(30))
    );
    assert_eq!(events.iter().filter(|e| matches!(e, Event::Model(_))).count(), 1);
    assert_eq!(events.last(), Some(&Event::Done));
    Ok(())
}

#[test]
fn whole_function_calls_become_tool_calls_and_stop_means_tool_calls_then() -> Result<(), UpstreamError> {
    let events = feed(&[
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"read_file","args":{"path":"/a"}},"thoughtSignature":"c2ln"},{"functionCall":{"name":"ls","args":{}}}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":7,"totalTokenCount":12}}"#,
    ])?;
    assert_eq!(events[0], Event::Signature("c2ln".into()), "the call's signature is kept as a thinking block's");
    assert_eq!(events[1], Event::ThinkingStop);
    assert_eq!(events[2], Event::ToolStart { key: 0, id: String::new(), name: "read_file".into() });
    assert_eq!(events[3], Event::ToolArgs { key: 0, delta: r#"{"path":"/a"}"#.into() });
    assert_eq!(events[4], Event::ToolStop { key: 0 });
    assert!(events.contains(&Event::ToolStart { key: 1, id: String::new(), name: "ls".into() }));
    assert!(events.contains(&Event::Finish { stop: Stop::ToolCalls, raw: "STOP".into(), stop_sequence: String::new() }));
    Ok(())
}

#[test]
fn safety_length_blocked_prompts_and_errors_are_mapped() {
    let safety = feed(&[r#"{"candidates":[{"content":{"parts":[]},"finishReason":"SAFETY","index":0}]}"#]).unwrap_or_default();
    assert!(safety.contains(&Event::Finish { stop: Stop::ContentFilter, raw: "SAFETY".into(), stop_sequence: String::new() }));
    let length =
        feed(&[r#"{"candidates":[{"content":{"parts":[{"text":"cut"}]},"finishReason":"MAX_TOKENS","index":0}]}"#]).unwrap_or_default();
    assert!(length.contains(&Event::Finish { stop: Stop::Length, raw: "MAX_TOKENS".into(), stop_sequence: String::new() }));
    let blocked =
        feed(&[r#"{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},"usageMetadata":{"promptTokenCount":3,"totalTokenCount":3}}"#])
            .unwrap_or_default();
    assert!(blocked.contains(&Event::Finish { stop: Stop::ContentFilter, raw: "PROHIBITED_CONTENT".into(), stop_sequence: String::new() }));
    let malformed = feed(&[r#"{"candidates":[{"content":{"parts":[]},"finishReason":"MALFORMED_FUNCTION_CALL","index":0}]}"#]).err();
    assert!(matches!(malformed, Some(UpstreamError { kind: UpstreamKind::Broken, .. })), "{malformed:?}");
    let cut = feed(&[r#"{"candidates":[{"content":{"parts":[{"text":"Hel"}]},"index":0}]}"#]).err();
    assert!(matches!(cut, Some(UpstreamError { kind: UpstreamKind::Broken, .. })), "no finishReason: {cut:?}");
    let error = feed(&[r#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"7s"}]}}"#]).err();
    assert!(
        matches!(error, Some(UpstreamError { kind: UpstreamKind::RateLimited, retry_after: Some(d), .. }) if d == Duration::from_secs(7)),
        "{error:?}"
    );
    let bad = feed(&["{not json"]).err();
    assert!(matches!(bad, Some(UpstreamError { kind: UpstreamKind::Malformed, .. })), "{bad:?}");
}

#[test]
fn an_invalid_key_is_a_credential_failure_not_a_bad_request() {
    let body = r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#;
    assert_eq!(read_error(400, body), (401, None));
    assert_eq!(read_error(400, r#"{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}"#), (400, None));
}

#[test]
fn the_request_has_contents_system_tools_and_generation_config() -> Result<(), ModelError> {
    let mut c = call();
    c.messages = vec![
        Message {
            role: Role::System as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "Be brief.".into() })) }],
            ..Message::default()
        },
        user("List /"),
        Message {
            role: Role::Assistant as i32,
            content: vec![ContentPart {
                part: Some(content_part::Part::Thinking(ThinkingPart { text: "plan".into(), signature: "sig-1".into() })),
            }],
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "ls".into(),
                arguments: Some(antler_kit::json::map_to_struct(&settings(json!({"path": "/"})))),
                ..ToolCall::default()
            }],
            ..Message::default()
        },
        Message {
            role: Role::Tool as i32,
            tool_call_id: "call_1".into(),
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "a b".into() })) }],
            ..Message::default()
        },
    ];
    let schema = json!({"type": "object", "properties": {"path": {"type": ["string", "null"], "description": "dir"}}, "required": ["path"], "additionalProperties": false, "$schema": "x"});
    c.tools =
        crate::tool_intern::intern(vec![CallTool { name: "ls".into(), description: "list".into(), parameters: Some(schema.to_string()) }]);
    c.stop = vec!["END".into()];
    c.thinking_enabled = true;
    let body = provider().prepare(&c, settings(json!({"temperature": 0.2, "max_tokens": 100, "thinking_budget": 512, "safety_settings": {"HARM_CATEGORY_HARASSMENT": "BLOCK_NONE"}})))?;
    assert_eq!(body["systemInstruction"], json!({"parts": [{"text": "Be brief."}]}));
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "List /"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"path": "/"}}, "thoughtSignature": "sig-1"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a b"}}}]},
        ])
    );
    assert_eq!(
        body["tools"][0]["functionDeclarations"][0]["parameters"],
        json!({"type": "object", "properties": {"path": {"type": "string", "nullable": true, "description": "dir"}}, "required": ["path"]}),
        "keywords the API's Schema lacks are dropped"
    );
    assert_eq!(
        body["generationConfig"],
        json!({"temperature": 0.2, "maxOutputTokens": 100, "stopSequences": ["END"], "thinkingConfig": {"thinkingBudget": 512, "includeThoughts": true}})
    );
    assert_eq!(body["safetySettings"], json!([{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]));
    assert!(body.get("toolConfig").is_none(), "auto is the default");
    Ok(())
}

#[test]
fn unknown_settings_are_refused_by_name_and_extra_body_is_raw() -> Result<(), ModelError> {
    let err = provider().prepare(&call(), settings(json!({"logit_bias": {}}))).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("logit_bias") && err.contains("extra_body"), "{err}");
    let body = provider().prepare(&call(), settings(json!({"extra_body": {"cachedContent": "cachedContents/x"}})))?;
    assert_eq!(body["cachedContent"], "cachedContents/x");
    Ok(())
}

#[test]
fn a_result_for_an_unknown_call_is_refused() {
    let mut c = call();
    c.messages.push(Message { role: Role::Tool as i32, tool_call_id: "nope".into(), ..Message::default() });
    let err = provider().prepare(&c, Map::new()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("messages[1].tool_call_id"), "{err}");
}
