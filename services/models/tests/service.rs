//! The service surface with the replay provider (no network): model listing, resolution, validation,
//! streaming, injected failures, concurrency limits, attribution echo and registry reloads.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use antler_kit::Config;
use antler_proto::models::chat_stream_response::Delta;
use antler_proto::models::{ChatStreamRequest, FinishReason, GetModelRequest, ListModelsRequest, ProviderKind};
use support::*;
use tonic::Code;

const REPLAY: &str = r#"models:
  retry: {base_delay_ms: 10, cap_delay_ms: 20}
  models:
    - name: demo
      display_name: Demo
      description: scripted
      provider: replay
      supports_thinking: true
      context_window: 32768
      max_tokens: 2048
      fallbacks: [spare]
      replay:
        chunk_chars: 4
        turns:
          - thinking: Plan the answer.
            signature: sig-1
            text: Hello there, agent.
            usage: {input_tokens: 11, output_tokens: 7}
          - tool_calls:
              - {id: call_x, name: bash, arguments: {command: ls}}
          - text: done
    - name: spare
      provider: replay
      api_key: sk-never-shown
      replay:
        turns: [{text: from the spare}]
    - name: flaky
      provider: replay
      max_retries: 2
      replay:
        turns:
          - text: recovered
            fail: {status: 500, times: 2, message: boom}
    - name: slow
      provider: replay
      max_concurrency: 1
      replay:
        chunk_delay_ms: 100
        after_last: repeat_last
        turns: [{text: slow answer here}]
    - name: broken
      provider: replay
      replay:
        turns: [{text: partial answer that breaks, break_after_chunks: 2, chunk_chars: 8}]
"#;

#[tokio::test]
async fn models_are_listed_in_order_with_capabilities_and_never_keys() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let list = bounded("ListModels", service.client.clone().list_models(ListModelsRequest {})).await?.into_inner();
    let names: Vec<&str> = list.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["demo", "spare", "flaky", "slow", "broken"]);
    assert_eq!(list.default_model_name, "demo");
    let demo = &list.models[0];
    assert!(demo.is_default && !list.models[1].is_default);
    assert_eq!((demo.provider(), demo.context_window, demo.max_output_tokens), (ProviderKind::Replay, 32768, 2048));
    assert_eq!(demo.fallbacks, ["spare"]);
    let caps = demo.capabilities.unwrap_or_default();
    assert!(caps.supports_thinking && caps.supports_tools && !caps.supports_vision);
    assert!(!format!("{list:?}").contains("sk-never-shown"));

    let got = bounded("GetModel", service.client.clone().get_model(GetModelRequest { name: "spare".into() })).await?.into_inner();
    assert_eq!(got.model.map(|m| (m.name, m.is_default)), Some(("spare".to_owned(), false)));
    Ok(())
}

#[tokio::test]
async fn unknown_models_are_not_found_with_the_valid_names() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let mut client = service.client.clone();
    let status = client.get_model(GetModelRequest { name: "gpt-9".into() }).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("demo, spare, flaky, slow, broken"), "{}", status.message());
    let status = client.get_model(GetModelRequest { name: String::new() }).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = stream(&client, request("gpt-9", "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn replay_streams_thinking_and_text_in_chunks_and_echoes_attribution() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let mut req = request("", "hello");
    req.thinking_enabled = true;
    req.caller = "subagent:research".into();
    req.run_id = "run-42".into();
    let (deltas, finish) = stream(&service.client, req).await?;
    assert_eq!(text_of(&deltas), "Hello there, agent.");
    let text_chunks = deltas.iter().filter(|d| matches!(d.delta, Some(Delta::Text(_)))).count();
    assert_eq!(text_chunks, 5, "19 characters in chunks of 4");
    assert!(deltas.iter().any(|d| matches!(&d.delta, Some(Delta::ThinkingEnd(e)) if e.signature == "sig-1")));
    let info = finish.info.unwrap_or_default();
    assert_eq!((info.model_name.as_str(), info.caller.as_str(), info.run_id.as_str()), ("demo", "subagent:research", "run-42"));
    assert_eq!(info.usage.map(|u| (u.input_tokens, u.output_tokens)), Some((11, 7)));
    let message = finish.message.unwrap_or_default();
    assert!(message.id.starts_with("msg_") && message.created_at.is_some());
    Ok(())
}

#[tokio::test]
async fn the_turn_follows_the_conversation_and_tool_calls_are_scripted() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let first = bounded("Chat", service.client.clone().chat(request("demo", "hello"))).await?.into_inner();
    let mut req = request("demo", "hello");
    req.messages.push(first.message.unwrap_or_default());
    let second = bounded("Chat", service.client.clone().chat(req)).await?.into_inner();
    let info = second.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::ToolCalls);
    assert!(info.usage_estimated, "turn 1 scripts no usage, so it is estimated");
    let call = second.message.unwrap_or_default().tool_calls.pop().unwrap_or_default();
    assert_eq!((call.id.as_str(), call.name.as_str()), ("call_x", "bash"));
    assert!(call.arguments.is_some_and(|a| a.fields.contains_key("command")));
    Ok(())
}

#[tokio::test]
async fn a_script_past_its_end_is_failed_precondition() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let mut req = request("spare", "hello");
    req.messages.push(antler_proto::common::Message { role: antler_proto::common::Role::Assistant as i32, ..user("x") });
    let status = bounded("Chat", service.client.clone().chat(req)).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("1 turn"), "{}", status.message());
    Ok(())
}

#[tokio::test]
async fn injected_failures_are_retried_until_the_turn_succeeds() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let response = bounded("Chat", service.client.clone().chat(request("flaky", "hi"))).await?.into_inner();
    assert_eq!(message_text(&response.message.unwrap_or_default()), "recovered");
    assert_eq!(response.info.map(|i| i.attempts), Some(3));
    Ok(())
}

#[tokio::test]
async fn a_broken_replay_stream_keeps_the_partial_answer() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let (deltas, finish) = stream(&service.client, request("broken", "hi")).await?;
    assert_eq!(text_of(&deltas), "partial answer t");
    let info = finish.info.unwrap_or_default();
    assert_eq!(info.finish_reason(), FinishReason::Error);
    assert!(info.usage_estimated);
    Ok(())
}

#[tokio::test]
async fn thinking_on_a_model_without_it_is_invalid_argument() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let mut req = request("spare", "hi");
    req.thinking_enabled = true;
    let status = stream(&service.client, req).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("thinking_enabled"), "{}", status.message());
    Ok(())
}

#[tokio::test]
async fn invalid_requests_name_the_field() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let mut client = service.client.clone();
    let mut req = request("demo", "hi");
    req.max_tokens = 4096;
    let status = client.chat(req).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert!(status.code() == Code::InvalidArgument && status.message().starts_with("max_tokens"), "{status:?}");
    let status = client.chat_stream(ChatStreamRequest { request: None }).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert!(status.code() == Code::InvalidArgument && status.message().starts_with("request"), "{status:?}");
    Ok(())
}

#[tokio::test]
async fn the_concurrency_cap_refuses_with_resource_exhausted() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let mut client = service.client.clone();
    let mut first = bounded("open", client.chat_stream(ChatStreamRequest { request: Some(request("slow", "a")) })).await?.into_inner();
    assert!(bounded("first delta", first.message()).await?.is_some());
    let status = stream(&service.client, request("slow", "b")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(antler_kit::status::retry_after(&status), Some(1));
    // Draining the first stream frees the permit.
    while bounded("drain", first.message()).await?.is_some() {}
    stream(&service.client, request("slow", "c")).await?;
    Ok(())
}

#[tokio::test]
async fn a_reload_rebuilds_the_registry() -> anyhow::Result<()> {
    let service = serve(REPLAY).await?;
    let initial = Arc::new(Config::load(Some(&service.config_path))?);
    let (tx, rx) = tokio::sync::watch::channel(initial);
    let stop = tokio_util::sync::CancellationToken::new();
    let follower = tokio::spawn(antler_models::follow_reloads(service.gateway.clone(), rx, stop.clone()));

    std::fs::write(&service.config_path, "models:\n  - {name: fresh, provider: replay, replay: {turns: [{text: new}]}}\n")?;
    tx.send(Arc::new(Config::load(Some(&service.config_path))?))?;
    let started = Instant::now();
    loop {
        let list = service.client.clone().list_models(ListModelsRequest {}).await?.into_inner();
        if list.default_model_name == "fresh" {
            assert_eq!(list.models.len(), 1);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the registry was not reloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let response = bounded("Chat", service.client.clone().chat(request("", "hi"))).await?.into_inner();
    assert_eq!(message_text(&response.message.unwrap_or_default()), "new");
    stop.cancel();
    bounded("follower stop", follower).await?;
    Ok(())
}

#[tokio::test]
async fn images_given_as_sandbox_paths_are_read_from_the_threads_sandbox() -> anyhow::Result<()> {
    let service = serve(&REPLAY.replace(
        "      supports_thinking: true\n      context_window",
        "      supports_thinking: true\n      supports_vision: true\n      context_window",
    ))
    .await?;
    let image = antler_proto::common::ContentPart {
        part: Some(antler_proto::common::content_part::Part::Image(antler_proto::common::ImagePart {
            source: Some(antler_proto::common::image_part::Source::Url("/mnt/user-data/uploads/cat.png".into())),
            ..Default::default()
        })),
    };
    let mut req = request("demo", "what is this?");
    req.messages[0].content.push(image);

    let status = stream(&service.client, req.clone()).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("messages[0].content[1].image.url") && status.message().contains("thread_id"),
        "{}",
        status.message()
    );

    // With a thread, the gateway asks the sandbox service (here: the same server, which mounts none, so the
    // sandbox's own answer, UNIMPLEMENTED, comes back naming the part and the path).
    req.thread_id = "t-1".into();
    let status = stream(&service.client, req).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert!(status.message().contains("messages[0].content[1].image.url") && status.message().contains("cat.png"), "{}", status.message());
    Ok(())
}
