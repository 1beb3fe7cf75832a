//! The Anthropic provider against the upstream double: thinking with signatures, redacted thinking, tool
//! use, usage with cache counts, the budget rules, thinking on/off bodies and passing thinking back.

mod support;

use antler_proto::common::{Message, Role};
use antler_proto::models::FinishReason;
use antler_proto::models::chat_stream_response::Delta;
use serde_json::json;
use support::upstream::{Reply, Upstream};
use support::*;
use tonic::Code;

fn claude(url: &str, extra: &str) -> String {
    config(&format!(
        "    - name: claude\n      provider: anthropic\n      model: claude-sonnet-4-20250514\n      base_url: {url}\n      api_key: sk-ant-test\n      max_tokens: 16000\n      supports_thinking: true\n      when_thinking_enabled:\n        thinking: {{type: enabled, budget_tokens: 4096}}\n{extra}"
    ))
}

#[tokio::test]
async fn thinking_with_signature_redacted_thinking_text_and_tool_use_stream_in_order() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("anthropic_thinking_tools.sse")).header("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy"));
    let service = serve(&claude(&upstream.url(), "")).await?;
    let mut req = request("claude", "list my files");
    req.thinking_enabled = true;
    req.tools = vec![antler_proto::common::ToolSpec { name: "ls".into(), description: "list".into(), ..Default::default() }];
    let (deltas, finish) = stream(&service.client, req).await?;

    let kinds: Vec<&str> = deltas
        .iter()
        .map(|d| match &d.delta {
            Some(Delta::Thinking(t)) if t.signature_delta.is_empty() => "thinking",
            Some(Delta::Thinking(_)) => "signature",
            Some(Delta::ThinkingEnd(_)) => "thinking_end",
            Some(Delta::RedactedThinking(_)) => "redacted",
            Some(Delta::Text(_)) => "text",
            Some(Delta::ToolCallStart(_)) => "tool_start",
            Some(Delta::ToolCallDelta(_)) => "tool_args",
            Some(Delta::ToolCallEnd(_)) => "tool_end",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "thinking",
            "thinking",
            "signature",
            "thinking_end",
            "redacted",
            "text",
            "text",
            "tool_start",
            "tool_args",
            "tool_args",
            "tool_end"
        ]
    );
    let signature = deltas.iter().find_map(|d| match &d.delta {
        Some(Delta::ThinkingEnd(e)) => Some(e.signature.clone()),
        _ => None,
    });
    assert_eq!(signature.as_deref(), Some("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"));
    let parts: Vec<u32> = deltas
        .iter()
        .filter_map(|d| match &d.delta {
            Some(Delta::Thinking(t)) => Some(t.part_index),
            Some(Delta::RedactedThinking(r)) => Some(r.part_index),
            Some(Delta::Text(t)) => Some(t.part_index),
            _ => None,
        })
        .collect();
    assert_eq!(parts, [0, 0, 0, 1, 2, 2], "parts are numbered in the order the model produced them");

    let info = finish.info.unwrap_or_default();
    assert_eq!((info.finish_reason(), info.raw_finish_reason.as_str()), (FinishReason::ToolCalls, "tool_use"));
    let usage = info.usage.unwrap_or_default();
    assert_eq!((usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.total_tokens), (600, 89, 128, 689));
    assert_eq!(info.upstream_request_id, "req_011CSHoEeqs5C35K2UUqR7Fy");
    let message = finish.message.unwrap_or_default();
    assert_eq!(message.content.len(), 3);
    assert_eq!(message.tool_calls[0].id, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");

    let seen = &upstream.seen()[0];
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert!(seen.header("authorization").is_none());
    assert_eq!(seen.body["thinking"], json!({ "type": "enabled", "budget_tokens": 4096 }));
    assert_eq!(seen.body["max_tokens"], 16000);
    assert_eq!(seen.body["tools"][0]["input_schema"], json!({ "type": "object", "properties": {} }));
    Ok(())
}

#[tokio::test]
async fn thinking_blocks_go_back_unchanged_with_the_tool_results() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("anthropic_thinking_tools.sse")));
    upstream.push(Reply::sse(&fixture("anthropic_text.sse")));
    let service = serve(&claude(&upstream.url(), "")).await?;
    let mut first = request("claude", "list my files");
    first.thinking_enabled = true;
    let (_, finish) = stream(&service.client, first.clone()).await?;
    let assistant = finish.message.unwrap_or_default();

    let tool_result = Message {
        role: Role::Tool as i32,
        tool_call_id: assistant.tool_calls[0].id.clone(),
        content: user("a.txt b.txt").content,
        ..Message::default()
    };
    let mut second = first;
    second.messages.push(assistant);
    second.messages.push(tool_result);
    let (deltas, _) = stream(&service.client, second).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");

    let body = &upstream.seen()[1].body;
    assert_eq!(
        body["messages"][1]["content"],
        json!([
            { "type": "thinking", "thinking": "The user wants the file listing.\nI will call ls.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds" },
            { "type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP" },
            { "type": "text", "text": "Let me list the files." },
            { "type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "ls", "input": { "path": "/mnt/user-data" } }
        ])
    );
    assert_eq!(body["messages"][2]["content"][0]["type"], "tool_result");
    Ok(())
}

#[tokio::test]
async fn thinking_off_is_sent_as_disabled_and_system_prompts_are_split_out() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("anthropic_text.sse")));
    let service = serve(&claude(&upstream.url(), "      when_thinking_disabled:\n        thinking: {type: disabled}\n")).await?;
    let mut req = request("claude", "hi");
    req.messages.insert(0, Message { role: Role::System as i32, content: user("You are terse.").content, ..Message::default() });
    req.temperature = Some(0.2);
    let (deltas, finish) = stream(&service.client, req).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");
    assert_eq!(finish.info.map(|i| i.finish_reason()), Some(FinishReason::Stop));
    let body = &upstream.seen()[0].body;
    assert_eq!(body["thinking"], json!({ "type": "disabled" }));
    assert_eq!(body["system"], "You are terse.");
    assert_eq!(body["messages"], json!([{ "role": "user", "content": [{ "type": "text", "text": "hi" }] }]));
    assert_eq!(body["temperature"], 0.2);
    Ok(())
}

#[tokio::test]
async fn a_thinking_budget_outside_the_rules_is_invalid_before_any_upstream_call() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let service = serve(&claude(&upstream.url(), "")).await?;
    for (budget, max_tokens) in [(512, 0), (16000, 0), (3000, 2000)] {
        let mut req = request("claude", "hi");
        req.thinking_enabled = true;
        req.thinking_budget_tokens = budget;
        req.max_tokens = max_tokens;
        let status = stream(&service.client, req).await.err().unwrap_or_else(|| tonic::Status::ok(""));
        assert_eq!(status.code(), Code::InvalidArgument, "budget {budget}: {status:?}");
        assert!(status.message().contains("thinking_budget_tokens"), "{}", status.message());
    }
    assert!(upstream.seen().is_empty(), "nothing was sent upstream");
    Ok(())
}

#[tokio::test]
async fn an_overloaded_error_event_before_output_is_retried() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let overloaded = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-20250514\",\"content\":[],\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    upstream.push(Reply::sse(overloaded));
    upstream.push(Reply::sse(&fixture("anthropic_text.sse")));
    let service = serve(&claude(&upstream.url(), "")).await?;
    let (deltas, finish) = stream(&service.client, request("claude", "hi")).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");
    assert_eq!(finish.info.map(|i| i.attempts), Some(2));
    Ok(())
}

#[tokio::test]
async fn a_529_answer_is_unavailable_after_the_retries() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.always(Reply::error(529, r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#));
    let service = serve(&claude(&upstream.url(), "      max_retries: 1\n")).await?;
    let status = bounded("Chat", service.client.clone().chat(request("claude", "hi"))).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.message().contains("Overloaded"), "{}", status.message());
    assert_eq!(upstream.seen().len(), 2);
    Ok(())
}
