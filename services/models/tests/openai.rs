//! The OpenAI-compatible provider against the upstream double: streaming, tool calls, reasoning, usage,
//! retries, fallbacks, timeouts, malformed chunks, error mapping and cancellation.

mod support;

use std::time::{Duration, Instant};

use antler_proto::common::{ContentPart, ImagePart, ToolSpec, content_part, image_part};
use antler_proto::models::chat_stream_response::Delta;
use antler_proto::models::{ChatStreamRequest, FinishReason};
use serde_json::json;
use support::upstream::{Reply, Upstream};
use support::*;
use tonic::Code;

#[tokio::test]
async fn text_streams_as_deltas_and_the_usage_only_final_chunk_is_read() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("openai_text.sse")).header("x-request-id", "req_123"));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;

    let (deltas, finish) = stream(&service.client, request("gpt", "Say hello")).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::Stop);
    let usage = info.usage.unwrap_or_default();
    assert_eq!((usage.input_tokens, usage.output_tokens, usage.total_tokens), (19, 4, 23));
    assert!(!info.usage_estimated);
    assert_eq!(info.upstream_model, "gpt-4o-2024-08-06");
    assert_eq!(info.upstream_request_id, "req_123");
    assert_eq!((info.attempts, info.model_name.as_str(), info.requested_model_name.as_str()), (1, "gpt", "gpt"));
    assert!(info.time_to_first_token.is_some() && info.latency.is_some());
    assert_eq!(message_text(&finish.message.unwrap_or_default()), "Hello, world!");

    let seen = upstream.seen();
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-test-gpt"));
    assert_eq!(seen[0].body["model"], "gpt-upstream");
    assert_eq!(seen[0].body["stream"], true);
    assert_eq!(seen[0].body["stream_options"], json!({ "include_usage": true }));
    assert_eq!(seen[0].body["messages"], json!([{ "role": "user", "content": "Say hello" }]));
    Ok(())
}

#[tokio::test]
async fn unary_chat_assembles_the_same_answer_even_from_byte_split_chunks() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    // Seven-byte HTTP chunks split events, JSON and UTF-8 boundaries anywhere.
    upstream.push(Reply::sse_bytes(&fixture("openai_text.sse"), 7));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;
    let response = bounded("Chat", service.client.clone().chat(request("gpt", "hi"))).await?.into_inner();
    assert_eq!(message_text(&response.message.unwrap_or_default()), "Hello, world!");
    assert_eq!(response.info.and_then(|i| i.usage).map(|u| u.total_tokens), Some(23));
    Ok(())
}

#[tokio::test]
async fn split_tool_call_arguments_and_parallel_calls_are_reassembled() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("openai_tools.sse")));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;
    let mut req = request("gpt", "read a.txt and list");
    req.tools = vec![
        ToolSpec { name: "read_file".into(), description: "read".into(), ..Default::default() },
        ToolSpec { name: "bash".into(), description: "run".into(), ..Default::default() },
    ];
    let (deltas, finish) = stream(&service.client, req).await?;

    let starts: Vec<(u32, String, String)> = deltas
        .iter()
        .filter_map(|d| match &d.delta {
            Some(Delta::ToolCallStart(s)) => Some((s.index, s.id.clone(), s.name.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(starts, [(0, "call_Ab12".into(), "read_file".into()), (1, "call_Cd34".into(), "bash".into())]);
    let ends: Vec<(u32, String)> = deltas
        .iter()
        .filter_map(|d| match &d.delta {
            Some(Delta::ToolCallEnd(e)) => {
                assert!(!e.arguments_invalid);
                let call = e.tool_call.clone().unwrap_or_default();
                let args = call.arguments.unwrap_or_default();
                let first = args.fields.values().next().and_then(|v| match &v.kind {
                    Some(prost_types::value::Kind::StringValue(s)) => Some(s.clone()),
                    _ => None,
                });
                Some((e.index, first.unwrap_or_default()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(ends, [(0, "/mnt/user-data/a.txt".into()), (1, "ls -la".into())]);
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::ToolCalls);
    assert_eq!(info.usage.map(|u| u.cache_read_tokens), Some(64));
    assert_eq!(finish.message.map(|m| m.tool_calls.len()), Some(2));
    assert_eq!(upstream.seen()[0].body["tools"][1]["function"]["name"], "bash");
    Ok(())
}

#[tokio::test]
async fn deepseek_reasoning_content_streams_as_thinking() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("openai_reasoning.sse")));
    let model = openai_model("reasoner", &upstream.url(), "      supports_thinking: true\n");
    let service = serve(&config(&model)).await?;
    let mut req = request("reasoner", "6*7?");
    req.thinking_enabled = true;
    let (deltas, finish) = stream(&service.client, req).await?;
    let thinking: String = deltas
        .iter()
        .filter_map(|d| match &d.delta {
            Some(Delta::Thinking(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(thinking, "The user asks 6*7. That is 42.");
    let end = deltas.iter().position(|d| matches!(d.delta, Some(Delta::ThinkingEnd(_))));
    let first_text = deltas.iter().position(|d| matches!(d.delta, Some(Delta::Text(_))));
    assert!(end.is_some() && end < first_text, "thinking ends before the answer starts");
    assert_eq!(text_of(&deltas), "6 × 7 = 42");
    let usage = finish.info.and_then(|i| i.usage).unwrap_or_default();
    assert_eq!(usage.reasoning_tokens, 31);
    let message = finish.message.unwrap_or_default();
    assert!(matches!(&message.content[0].part, Some(content_part::Part::Thinking(t)) if t.signature.is_empty()));
    Ok(())
}

#[tokio::test]
async fn a_stream_cut_mid_way_finishes_with_an_error_and_estimated_usage() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("openai_text.sse")).cut_after(3));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;
    let (deltas, finish) = stream(&service.client, request("gpt", "Say hello")).await?;
    assert_eq!(text_of(&deltas), "Hello,", "the partial answer is kept");
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::Error);
    let error = info.error.unwrap_or_default();
    assert_eq!(error.code, "UNAVAILABLE");
    assert!(error.retryable);
    assert!(info.usage_estimated, "the usage chunk never came");
    let usage = info.usage.unwrap_or_default();
    assert!(usage.input_tokens > 0 && usage.output_tokens == 2, "{usage:?}");
    assert_eq!(upstream.seen().len(), 1, "no retry once output reached the caller");
    Ok(())
}

#[tokio::test]
async fn unary_chat_retries_a_stream_cut_before_answering() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("openai_text.sse")).cut_after(3));
    upstream.push(Reply::sse(&fixture("openai_text.sse")));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;
    let response = bounded("Chat", service.client.clone().chat(request("gpt", "hi"))).await?.into_inner();
    assert_eq!(message_text(&response.message.unwrap_or_default()), "Hello, world!");
    assert_eq!(response.info.map(|i| i.attempts), Some(2));
    Ok(())
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out_then_retried() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(
        Reply::error(429, r#"{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","code":"rate_limit_exceeded"}}"#)
            .header("retry-after", "1"),
    );
    upstream.push(Reply::sse(&fixture("openai_text.sse")));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;
    let started = Instant::now();
    let (deltas, finish) = stream(&service.client, request("gpt", "hi")).await?;
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was honoured ({:?})", started.elapsed());
    assert_eq!(text_of(&deltas), "Hello, world!");
    assert_eq!(finish.info.map(|i| i.attempts), Some(2));
    Ok(())
}

#[tokio::test]
async fn a_persistent_429_is_resource_exhausted_with_retry_after() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.always(Reply::error(429, r#"{"error":{"message":"quota"}}"#).header("retry-after-ms", "20"));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), "      max_retries: 1\n"))).await?;
    let status = bounded("Chat", service.client.clone().chat(request("gpt", "hi"))).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(antler_kit::status::retry_after(&status), Some(1));
    assert!(status.message().contains("quota"), "{}", status.message());
    assert_eq!(upstream.seen().len(), 2, "max_retries 1 = two attempts");
    Ok(())
}

#[tokio::test]
async fn server_errors_exhaust_the_retries_then_the_fallback_answers() -> anyhow::Result<()> {
    let primary = Upstream::start().await?;
    primary.always(Reply::error(500, r#"{"error":{"message":"internal"}}"#));
    let backup = Upstream::start().await?;
    backup.push(Reply::sse(&fixture("openai_text.sse")));
    let models = openai_model("primary", &primary.url(), "      max_retries: 2\n      fallbacks: [backup]\n")
        + &openai_model("backup", &backup.url(), "");
    let service = serve(&config(&models)).await?;
    let (deltas, finish) = stream(&service.client, request("primary", "hi")).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");
    let info = finish.info.unwrap_or_default();
    assert_eq!((info.requested_model_name.as_str(), info.model_name.as_str(), info.attempts), ("primary", "backup", 4));
    assert_eq!(primary.seen().len(), 3);
    assert_eq!(backup.seen()[0].body["model"], "backup-upstream");
    Ok(())
}

#[tokio::test]
async fn server_errors_without_fallback_are_unavailable() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.always(Reply::error(503, r#"{"error":{"message":"overloaded"}}"#));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), "      max_retries: 2\n"))).await?;
    let status = stream(&service.client, request("gpt", "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(antler_kit::status::retry_after(&status).is_some());
    assert_eq!(upstream.seen().len(), 3);
    Ok(())
}

#[tokio::test]
async fn a_malformed_chunk_is_internal_and_quotes_the_line_cut_to_200_chars() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let garbage = format!("data: {{\"choices\": [{}\n\n", "x".repeat(1000));
    upstream.push(Reply::sse(&fixture("openai_text.sse")).replace_event(0, &garbage));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;
    let status = stream(&service.client, request("gpt", "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(status.message().contains("{\\\"choices\\\": [xxx"), "{}", status.message());
    assert!(status.message().len() < 400, "the line is cut: {} bytes", status.message().len());
    assert_eq!(upstream.seen().len(), 1, "malformed answers are not retried");
    Ok(())
}

#[tokio::test]
async fn slow_chunks_hit_the_inter_chunk_timeout() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("openai_text.sse")).pause_before(2, Duration::from_secs(5)));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), "      chunk_timeout_ms: 300\n"))).await?;
    let started = Instant::now();
    let (deltas, finish) = stream(&service.client, request("gpt", "hi")).await?;
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(text_of(&deltas), "Hello");
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::Error);
    let error = info.error.unwrap_or_default();
    assert!(error.code == "UNAVAILABLE" && error.message.contains("chunk_timeout_ms"), "{error:?}");
    assert!(upstream.wait_for(Duration::from_secs(3), |u| u.disconnects() == 1).await, "the stalled upstream was hung up on");
    Ok(())
}

#[tokio::test]
async fn a_slow_first_byte_hits_the_first_byte_timeout_and_is_retried() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.push(Reply::sse(&fixture("openai_text.sse")).delayed(Duration::from_secs(5)));
    upstream.push(Reply::sse(&fixture("openai_text.sse")));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), "      first_byte_timeout_ms: 300\n"))).await?;
    let (deltas, finish) = stream(&service.client, request("gpt", "hi")).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");
    assert_eq!(finish.info.map(|i| i.attempts), Some(2));
    Ok(())
}

#[tokio::test]
async fn client_cancellation_aborts_the_upstream_request() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    // The third event comes only after 10 s: a disconnect noticed at once beats it by far.
    upstream.push(Reply::sse(&fixture("openai_text.sse")).pause_before(2, Duration::from_secs(10)));
    let service = serve(&config(&openai_model("gpt", &upstream.url(), ""))).await?;
    let mut client = service.client.clone();
    let mut stream = bounded("open", client.chat_stream(ChatStreamRequest { request: Some(request("gpt", "hi")) })).await?.into_inner();
    let first = bounded("first delta", stream.message()).await?;
    assert!(first.is_some());
    let dropped = Instant::now();
    drop(stream);
    assert!(upstream.wait_for(Duration::from_secs(5), |u| u.disconnects() == 1).await, "the upstream never saw the disconnect");
    assert!(dropped.elapsed() < Duration::from_secs(2), "aborted at once, not at the next chunk: {:?}", dropped.elapsed());
    Ok(())
}

#[tokio::test]
async fn upstream_errors_map_to_the_documented_codes() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let models = "    - name: gpt\n      provider: openai\n      model: gpt-4o\n      base_url: URL/v1\n      api_key: ${ANTLER_TEST_OPENAI_KEY_UNSET:-sk-secret-value}\n".replace("URL", &upstream.url());
    let service = serve(&config(&models)).await?;
    let mut client = service.client.clone();

    upstream.push(Reply::error(400, r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#));
    let status = client.chat(request("gpt", "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("maximum context length"), "{}", status.message());

    upstream.push(Reply::error(
        401,
        r#"{"error":{"message":"Incorrect API key provided: sk-secr***alue.","type":"invalid_request_error","code":"invalid_api_key"}}"#,
    ));
    let status = client.chat(request("gpt", "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("`gpt`") && status.message().contains("$ANTLER_TEST_OPENAI_KEY_UNSET"), "{}", status.message());
    assert!(!status.message().contains("sk-secret-value"), "{}", status.message());

    upstream.push(Reply::error(
        404,
        r#"{"error":{"message":"The model `gpt-4o` does not exist","type":"invalid_request_error","code":"model_not_found"}}"#,
    ));
    let status = client.chat(request("gpt", "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(upstream.seen().len(), 3, "none of these is retried");
    Ok(())
}

#[tokio::test]
async fn an_unreachable_upstream_is_unavailable() -> anyhow::Result<()> {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let service = serve(&config(&openai_model("gpt", &format!("http://127.0.0.1:{port}"), "      max_retries: 1\n"))).await?;
    let status = bounded("Chat", service.client.clone().chat(request("gpt", "hi"))).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("cannot connect"), "{}", status.message());
    Ok(())
}

#[tokio::test]
async fn thinking_on_and_off_request_bodies_for_gateways_and_vllm() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.always(Reply::sse(&fixture("openai_text.sse")));
    let models = "    - name: doubao\n      use: deerflow.models.patched_deepseek:PatchedChatDeepSeek\n      model: doubao-seed\n      api_base: URL/api/v3\n      api_key: k\n      supports_thinking: true\n      supports_reasoning_effort: true\n      when_thinking_enabled:\n        extra_body: {thinking: {type: enabled}}\n    - name: qwen\n      use: deerflow.models.vllm_provider:VllmChatModel\n      model: Qwen/Qwen3-32B\n      base_url: URL/v1\n      supports_thinking: true\n      when_thinking_enabled:\n        extra_body: {chat_template_kwargs: {enable_thinking: true}}\n    - name: plain\n      provider: openai\n      model: gpt-4o\n      base_url: URL/v1\n".replace("URL", &upstream.url());
    let service = serve(&config(&models)).await?;
    for (model, thinking) in [("doubao", true), ("doubao", false), ("qwen", true), ("qwen", false), ("plain", false)] {
        let mut req = request(model, "hi");
        req.thinking_enabled = thinking;
        req.reasoning_effort = antler_proto::common::ReasoningEffort::High as i32;
        stream(&service.client, req).await?;
    }
    let bodies: Vec<serde_json::Value> = upstream.seen().into_iter().map(|s| s.body).collect();
    assert_eq!(bodies[0]["thinking"], json!({ "type": "enabled" }));
    assert_eq!(bodies[0]["reasoning_effort"], "high");
    assert_eq!(bodies[1]["thinking"], json!({ "type": "disabled" }));
    assert_eq!(bodies[1]["reasoning_effort"], "high", "the caller's effort wins over DeerFlow's `minimal`");
    assert_eq!(bodies[2]["chat_template_kwargs"], json!({ "enable_thinking": true }));
    assert_eq!(bodies[3]["chat_template_kwargs"], json!({ "enable_thinking": false }));
    assert!(bodies[3].get("reasoning_effort").is_none(), "dropped: qwen does not support reasoning_effort");
    assert!(bodies[4].get("thinking").is_none() && bodies[4].get("chat_template_kwargs").is_none());
    assert!(upstream.seen()[0].path.ends_with("/api/v3/chat/completions"));
    Ok(())
}

#[tokio::test]
async fn images_are_sent_as_data_urls_to_vision_models_and_refused_elsewhere() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.always(Reply::sse(&fixture("openai_text.sse")));
    let models = openai_model("vision", &upstream.url(), "      supports_vision: true\n") + &openai_model("text", &upstream.url(), "");
    let service = serve(&config(&models)).await?;
    let mut req = request("vision", "what is this?");
    req.messages[0].content.push(ContentPart {
        part: Some(content_part::Part::Image(ImagePart {
            source: Some(image_part::Source::Data(vec![0x89, b'P', b'N', b'G'])),
            mime_type: "image/png".into(),
            detail: "low".into(),
        })),
    });
    stream(&service.client, req.clone()).await?;
    let body = &upstream.seen()[0].body;
    assert_eq!(
        body["messages"][0]["content"][1],
        json!({ "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw==", "detail": "low" } })
    );
    req.model_name = "text".into();
    let status = stream(&service.client, req).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("messages[0].content[1]"), "{}", status.message());
    assert_eq!(upstream.seen().len(), 1);
    Ok(())
}
