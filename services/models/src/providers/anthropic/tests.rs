use super::*;
use crate::request::tests::{call, user};
use crate::spec::ProviderKind;
use crate::spec::tests::spec;
use antler_proto::common::{RedactedThinkingPart, TextPart, ThinkingPart, ToolCall};

fn feed(events: &[(&str, &str)]) -> Result<Vec<Event>, UpstreamError> {
    let mut parser = Parser::default();
    let mut out = Vec::new();
    for (event, data) in events {
        out.extend(parser.on_event(&SseEvent { event: (*event).to_owned(), data: (*data).to_owned() })?);
    }
    out.extend(parser.on_eof()?);
    Ok(out)
}

#[test]
fn thinking_with_signature_text_and_tool_use_are_read() -> Result<(), UpstreamError> {
    let events = feed(&[
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"usage":{"input_tokens":100,"cache_read_input_tokens":20,"cache_creation_input_tokens":5,"output_tokens":1}}}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
        ),
        ("ping", r#"{"type":"ping"}"#),
        ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"I should list"}}"#),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM"}}"#,
        ),
        ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"EmwKAhgB"}}"#,
        ),
        ("content_block_stop", r#"{"type":"content_block_stop","index":1}"#),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01","name":"ls","input":{}}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"path\":"}}"#,
        ),
        ("content_block_delta", r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"/\"}"}}"#),
        ("content_block_stop", r#"{"type":"content_block_stop","index":2}"#),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ])?;
    assert!(events.contains(&Event::Model("claude-sonnet-4-20250514".into())));
    assert!(events.contains(&Event::Signature("EqQBCgIYAhIM".into())));
    assert!(events.contains(&Event::ThinkingStop));
    assert!(events.contains(&Event::Redacted("EmwKAhgB".into())));
    assert!(events.contains(&Event::ToolStart { key: 2, id: "toolu_01".into(), name: "ls".into() }));
    assert!(events.contains(&Event::ToolStop { key: 2 }));
    assert!(events.contains(&Event::Finish { stop: Stop::ToolCalls, raw: "tool_use".into(), stop_sequence: String::new() }));
    let last_usage = events.iter().rev().find_map(|e| if let Event::Usage(u) = e { Some(*u) } else { None }).unwrap_or_default();
    assert_eq!(
        (last_usage.input, last_usage.output, last_usage.cache_read),
        (Some(125), Some(42), Some(20)),
        "input includes cached tokens"
    );
    assert_eq!(events.last(), Some(&Event::Done));
    Ok(())
}

#[test]
fn error_events_and_cut_streams_are_reported() {
    let overloaded = feed(&[("error", r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)]).err();
    assert!(matches!(overloaded, Some(UpstreamError { kind: UpstreamKind::Unavailable, status: 529, .. })), "{overloaded:?}");
    let cut = feed(&[("message_start", r#"{"type":"message_start","message":{"model":"m","usage":{"input_tokens":1}}}"#)]).err();
    assert!(matches!(cut, Some(UpstreamError { kind: UpstreamKind::Broken, .. })), "{cut:?}");
    assert_eq!(stop_of("pause_turn"), Stop::Paused);
    assert_eq!(stop_of("refusal"), Stop::ContentFilter);
    assert_eq!(stop_of("max_tokens"), Stop::Length);
}

fn claude() -> Anthropic {
    let mut model = spec("claude", ProviderKind::Anthropic);
    model.base_url = "https://api.anthropic.com".into();
    Anthropic::new(&model).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn system_prompts_are_split_out_and_thinking_is_passed_back_unchanged() -> Result<(), ModelError> {
    let mut c = call();
    let system = Message {
        role: Role::System as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "be brief".into() })) }],
        ..Message::default()
    };
    let assistant = Message {
        role: Role::Assistant as i32,
        content: vec![
            ContentPart { part: Some(content_part::Part::Thinking(ThinkingPart { text: "hmm".into(), signature: "sig".into() })) },
            ContentPart { part: Some(content_part::Part::RedactedThinking(RedactedThinkingPart { data: "opaque".into() })) },
            ContentPart { part: Some(content_part::Part::Thinking(ThinkingPart { text: "unsigned".into(), signature: String::new() })) },
        ],
        tool_calls: vec![ToolCall {
            id: "toolu_1".into(),
            name: "ls".into(),
            arguments: Some(Default::default()),
            raw_arguments: String::new(),
        }],
        ..Message::default()
    };
    let result = |id: &str| Message {
        role: Role::Tool as i32,
        tool_call_id: id.into(),
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "ok".into() })) }],
        ..Message::default()
    };
    c.messages = vec![system, user("go"), assistant, result("toolu_1"), result("toolu_2")];
    let body = claude().prepare(&c, Map::new())?;
    assert_eq!(body["system"], json!("be brief"));
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(3), "consecutive tool results share one user turn");
    assert_eq!(
        body["messages"][1]["content"],
        json!([
            { "type": "thinking", "thinking": "hmm", "signature": "sig" },
            { "type": "redacted_thinking", "data": "opaque" },
            { "type": "tool_use", "id": "toolu_1", "name": "ls", "input": {} }
        ])
    );
    assert_eq!(body["messages"][2]["content"][1]["tool_use_id"], json!("toolu_2"));
    assert_eq!(body["max_tokens"], json!(DEFAULT_MAX_TOKENS));
    Ok(())
}

#[test]
fn thinking_budgets_are_checked_before_any_call() {
    let provider = claude();
    let with = |budget: u64, max: u64| {
        let mut settings = Map::new();
        settings.insert("thinking".into(), json!({ "type": "enabled", "budget_tokens": budget }));
        settings.insert("max_tokens".into(), json!(max));
        settings.insert("temperature".into(), json!(0.3));
        provider.prepare(&call(), settings)
    };
    assert!(matches!(with(512, 4096), Err(ModelError::InvalidArgument { .. })));
    assert!(matches!(with(4096, 4096), Err(ModelError::InvalidArgument { .. })));
    let ok = with(2048, 4096);
    assert!(ok.as_ref().is_ok_and(|b| b.get("temperature").is_none()), "{ok:?}");
    let mut missing = Map::new();
    missing.insert("thinking".into(), json!({ "type": "enabled" }));
    let err = provider.prepare(&call(), missing).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("thinking_budget_tokens"), "{err}");
}
