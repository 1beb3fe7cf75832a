//! An Azure OpenAI double: `POST /openai/deployments/{deployment}/chat/completions?api-version=…` with
//! the resource key in `api-key` (or an Entra ID token as `Authorization: Bearer`), answered in Azure's
//! streaming format: a first event with only `prompt_filter_results` (`choices: []`, `model: ""`),
//! then Chat Completions chunks with `content_filter_results`, tool calls in pieces keyed by `index`,
//! the finish chunk, the usage chunk when `stream_options.include_usage` asks for it, and
//! `data: [DONE]`. Like the real service it answers 404 without an api-version or for another
//! deployment (`DeploymentNotFound`), 401 for a wrong key, and scripted errors as
//! `{"error": {"code": "<status>", "message": …}}`, a 429 with `retry-after` and `retry-after-ms`.

use anyhow::Result;
use serde_json::{Value, json};

use super::{Answer, Config, Double, OUTPUT_TOKENS, PROMPT_TOKENS, Reply, Seen, pieces};

/// Starts a double of a resource with one deployment, `deployment`, that accepts `key`.
pub async fn start(key: &str, deployment: &str, replies: Vec<Reply>) -> Result<Double> {
    Double::start(replies, Config { key: key.to_owned(), deployment: deployment.to_owned() }, respond).await
}

/// The model a deployment reports in its chunks.
pub const MODEL: &str = "gpt-4o-2024-11-20";

fn error(status: u16, code: &str, message: &str) -> Answer {
    let body = json!({ "error": { "code": code, "message": message } }).to_string();
    let headers = if status == 429 { vec![("retry-after", "1".to_owned()), ("retry-after-ms", "1000".to_owned())] } else { Vec::new() };
    Answer::Plain { status, body, headers }
}

fn respond(seen: &Seen, reply: Option<&Reply>, config: &Config) -> (Answer, bool) {
    let (path, query) = seen.target.split_once('?').unwrap_or((seen.target.as_str(), ""));
    let version = query.split('&').find_map(|kv| kv.strip_prefix("api-version=")).unwrap_or_default();
    if version.is_empty() {
        return (error(404, "404", "Resource not found"), false);
    }
    let Some(deployment) = path.strip_prefix("/openai/deployments/").and_then(|rest| rest.strip_suffix("/chat/completions")) else {
        return (error(404, "404", "Resource not found"), false);
    };
    let key_ok = seen.header("api-key") == Some(config.key.as_str())
        || seen.header("authorization") == Some(format!("Bearer {}", config.key).as_str());
    if !key_ok {
        return (
            error(
                401,
                "401",
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active \
                 subscription and use a correct regional API endpoint for your resource.",
            ),
            false,
        );
    }
    if deployment != config.deployment {
        return (
            error(
                404,
                "DeploymentNotFound",
                "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.",
            ),
            false,
        );
    }
    if seen.body.get("max_tokens").is_some() && seen.body.get("max_completion_tokens").is_some() {
        return (error(400, "invalid_request_error", "max_tokens and max_completion_tokens cannot both be set"), false);
    }
    let Some(reply) = reply else {
        return (error(500, "500", "the double's script is used up"), false);
    };
    if let Some((status, message)) = &reply.error {
        let code =
            if *status == 400 && message.contains("content management policy") { "content_filter".to_owned() } else { status.to_string() };
        return (error(*status, &code, message), true);
    }
    let usage = seen.body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    (Answer::Stream { events: events(reply, usage), cut: reply.break_after }, true)
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    json!({
        "choices": [{ "content_filter_results": {}, "delta": delta, "finish_reason": finish, "index": 0, "logprobs": null }],
        "created": 1_732_000_000,
        "id": "chatcmpl-double",
        "model": MODEL,
        "object": "chat.completion.chunk",
        "system_fingerprint": "fp_double",
        "usage": null,
    })
    .to_string()
}

fn events(reply: &Reply, usage: bool) -> Vec<String> {
    let safe = json!({ "filtered": false, "severity": "safe" });
    let mut out = vec![
        json!({
            "choices": [], "created": 0, "id": "", "model": "", "object": "",
            "prompt_filter_results": [{ "prompt_index": 0, "content_filter_results": { "hate": safe, "self_harm": safe, "sexual": safe, "violence": safe } }],
        })
        .to_string(),
        chunk(json!({ "content": "", "refusal": null, "role": "assistant" }), None),
    ];
    for piece in pieces(&reply.text) {
        out.push(chunk(json!({ "content": piece }), None));
    }
    for (i, call) in reply.calls.iter().enumerate() {
        out.push(chunk(json!({ "tool_calls": [{ "index": i, "id": call.id, "type": "function", "function": { "name": call.name, "arguments": "" } }] }), None));
        for piece in pieces(&call.arguments.to_string()) {
            out.push(chunk(json!({ "tool_calls": [{ "index": i, "function": { "arguments": piece } }] }), None));
        }
    }
    let finish = reply.finish.unwrap_or(if reply.calls.is_empty() { "stop" } else { "tool_calls" });
    out.push(chunk(json!({}), Some(finish)));
    if usage {
        out.push(
            json!({
                "choices": [], "created": 1_732_000_000, "id": "chatcmpl-double", "model": MODEL, "object": "chat.completion.chunk",
                "usage": { "prompt_tokens": PROMPT_TOKENS, "completion_tokens": OUTPUT_TOKENS, "total_tokens": PROMPT_TOKENS + OUTPUT_TOKENS,
                           "prompt_tokens_details": { "cached_tokens": 0 }, "completion_tokens_details": { "reasoning_tokens": 0 } },
            })
            .to_string(),
        );
    }
    out.push("[DONE]".to_owned());
    out
}
