use super::*;
use crate::request::tests::{call, user};
use crate::spec::ProviderKind;
use crate::spec::tests::spec;
use antler_proto::common::{TextPart, ThinkingPart, ToolCall, ToolSpec};

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
fn split_tool_call_arguments_and_parallel_calls_are_keyed_by_index() -> Result<(), UpstreamError> {
    let events = feed(&[
        r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"ls","arguments":""}}]},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"cat","arguments":""}}]},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"pa"}}]},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"f\":1}"}}]},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\":\"/\"}"}}]},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":null}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":0}}}"#,
        "[DONE]",
    ])?;
    let args: Vec<(u32, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolArgs { key, delta } => Some((*key, delta.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(args, [(0, "{\"pa".to_owned()), (1, "{\"f\":1}".to_owned()), (0, "th\":\"/\"}".to_owned())]);
    assert!(events.contains(&Event::ToolStart { key: 1, id: "call_b".into(), name: "cat".into() }));
    assert!(events.contains(&Event::Finish { stop: Stop::ToolCalls, raw: "tool_calls".into(), stop_sequence: String::new() }));
    let usage = events.iter().find_map(|e| if let Event::Usage(u) = e { Some(*u) } else { None });
    assert_eq!(usage.map(|u| (u.input, u.output, u.cache_read)), Some((Some(20), Some(9), Some(4))));
    assert_eq!(events.last(), Some(&Event::Done));
    Ok(())
}

#[test]
fn reasoning_content_becomes_thinking() -> Result<(), UpstreamError> {
    let events = feed(&[
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":"Let me think"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning":"…"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"42"},"finish_reason":"stop"}]}"#,
        "[DONE]",
    ])?;
    assert_eq!(events[0], Event::Thinking("Let me think".into()));
    assert_eq!(events[1], Event::Thinking("…".into()));
    assert_eq!(events[2], Event::Text("42".into()));
    Ok(())
}

#[test]
fn finish_reasons_are_mapped() {
    assert_eq!(stop_of("length"), Stop::Length);
    assert_eq!(stop_of("content_filter"), Stop::ContentFilter);
    assert_eq!(stop_of("function_call"), Stop::ToolCalls);
    assert_eq!(stop_of("eos"), Stop::Stop);
}

#[test]
fn a_cut_stream_is_broken_and_a_bad_chunk_is_malformed() {
    let cut = feed(&[r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#]).err();
    assert!(matches!(cut, Some(UpstreamError { kind: UpstreamKind::Broken, .. })), "{cut:?}");
    let bad = feed(&["{not json"]).err();
    assert!(
        matches!(bad, Some(UpstreamError { kind: UpstreamKind::Malformed, ref message, .. }) if message.contains("{not json")),
        "{bad:?}"
    );
    let error = feed(&[r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error"}}"#]).err();
    assert!(matches!(error, Some(UpstreamError { kind: UpstreamKind::RateLimited, .. })), "{error:?}");
}

#[test]
fn the_body_carries_tools_usage_option_and_replayed_reasoning() -> Result<(), ModelError> {
    let mut model = spec("deepseek", ProviderKind::OpenAi);
    model.send_reasoning_content = true;
    let provider = OpenAi::new(&model).map_err(|e| ModelError::invalid("spec", e))?;
    let mut c = call();
    let assistant = Message {
        role: Role::Assistant as i32,
        content: vec![ContentPart {
            part: Some(content_part::Part::Thinking(ThinkingPart { text: "why".into(), signature: String::new() })),
        }],
        tool_calls: vec![ToolCall {
            id: "call_1".into(),
            name: "ls".into(),
            arguments: Some(Default::default()),
            raw_arguments: String::new(),
        }],
        ..Message::default()
    };
    let tool = Message {
        role: Role::Tool as i32,
        tool_call_id: "call_1".into(),
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "a b".into() })) }],
        ..Message::default()
    };
    c.messages = vec![user("list"), assistant, tool];
    c.tools = vec![std::sync::Arc::new(crate::request::CallTool::from(ToolSpec {
        name: "ls".into(),
        description: "list".into(),
        ..ToolSpec::default()
    }))];
    let mut settings = Map::new();
    settings.insert("extra_body".into(), json!({ "thinking": { "type": "disabled" } }));
    settings.insert("temperature".into(), json!(0.2));
    settings.insert("stream".into(), json!(false));
    let body = provider.prepare(&c, settings)?;
    assert_eq!(body["stream"], json!(true), "reserved fields are not overridden");
    assert_eq!(body["stream_options"], json!({ "include_usage": true }));
    assert_eq!(body["thinking"], json!({ "type": "disabled" }), "extra_body is flattened");
    assert_eq!(body["temperature"], json!(0.2));
    assert_eq!(body["messages"][1]["reasoning_content"], json!("why"));
    assert_eq!(body["messages"][1]["tool_calls"][0]["function"]["arguments"], json!("{}"));
    assert_eq!(body["messages"][2], json!({ "role": "tool", "tool_call_id": "call_1", "content": "a b" }));
    assert_eq!(body["tools"][0]["function"]["parameters"], json!({ "type": "object", "properties": {} }));
    assert_eq!(body["tool_choice"], json!("auto"));
    Ok(())
}
