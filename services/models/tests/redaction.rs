//! A provider's API key never leaves the models service, whatever the upstream echoes: not in a Chat
//! status, not in a ChatStream status, not in the in-band error of a stream that broke after its first delta, for
//! each provider. (A key from `api_key_env` is covered by `integration-tests/tests/redaction.rs`, which
//! can give a started binary its own environment.)

mod support;

use antler_proto::models::chat_stream_response::Delta;
use support::upstream::{Reply, Upstream};
use support::*;
use tonic::Code;

const OPENAI_KEY: &str = "sk-proj-redaction-test-0a1b2c3d4e5f";
const ANTHROPIC_KEY: &str = "sk-ant-api03-redaction-test-9z8y7x";

/// Both kinds of model, pointing at `url`.
fn models(url: &str) -> String {
    config(&format!(
        "    - name: gpt\n      provider: openai\n      model: gpt-4o\n      base_url: {url}/v1\n      api_key: {OPENAI_KEY}\n      max_retries: 0\n\
         \x20   - name: claude\n      provider: anthropic\n      model: claude-sonnet-4-5\n      base_url: {url}\n      api_key: {ANTHROPIC_KEY}\n      max_tokens: 1000\n      max_retries: 0\n"
    ))
}

/// What OpenAI answers for a wrong key: the key itself, quoted back.
fn echo_401(key: &str) -> Reply {
    Reply::error(
        401,
        &format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
        ),
    )
}

fn assert_clean(status: &tonic::Status, key: &str, what: &str) {
    assert!(!status.message().contains(key), "{what}: the key leaked: {}", status.message());
    assert!(status.message().contains("[redacted]"), "{what}: expected the echo to be redacted: {}", status.message());
}

#[tokio::test]
async fn an_echoed_key_is_redacted_from_chat_and_chat_stream_for_every_provider() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let service = serve(&models(&upstream.url())).await?;
    for (model, key) in [("gpt", OPENAI_KEY), ("claude", ANTHROPIC_KEY)] {
        upstream.push(echo_401(key));
        let status = service.client.clone().chat(request(model, "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
        assert_eq!(status.code(), Code::FailedPrecondition, "{model}: {status:?}");
        assert_clean(&status, key, &format!("{model} Chat"));

        upstream.push(echo_401(key));
        let status = stream(&service.client, request(model, "hi")).await.err().unwrap_or_else(|| tonic::Status::ok(""));
        assert_eq!(status.code(), Code::FailedPrecondition, "{model}: {status:?}");
        assert_clean(&status, key, &format!("{model} ChatStream"));
    }
    Ok(())
}

#[tokio::test]
async fn a_key_in_an_error_after_the_first_delta_is_redacted_from_the_in_band_error() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let service = serve(&models(&upstream.url())).await?;
    let broken = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"usage\":{{\"input_tokens\":5,\"output_tokens\":1}}}}}}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Hel\"}}}}\n\n\
         event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"overloaded_error\",\"message\":\"Overloaded (key {ANTHROPIC_KEY})\"}}}}\n\n"
    );
    upstream.push(Reply::sse(&broken));
    let mut client = service.client.clone();
    let call = antler_proto::models::ChatStreamRequest { request: Some(request("claude", "hi")) };
    let mut deltas = client.chat_stream(call).await?.into_inner();
    let mut received = 0;
    let message = loop {
        match deltas.message().await {
            // A failure after the first delta arrives in-band, in the finish's CompletionInfo.error.
            Ok(Some(item)) => match item.delta {
                Some(Delta::Finish(finish)) => break finish.info.and_then(|i| i.error).map(|e| e.message).unwrap_or_default(),
                _ => received += 1,
            },
            Ok(None) => anyhow::bail!("the stream ended without a finish"),
            Err(status) => anyhow::bail!("expected the error in-band, got {status:?}"),
        }
    };
    assert!(received >= 1, "the error was meant to come after a delta");
    assert!(!message.contains(ANTHROPIC_KEY) && message.contains("[redacted]"), "{message}");
    Ok(())
}
