//! A Gemini API double: `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` with
//! `x-goog-api-key`, answered with SSE events that are each a whole `GenerateContentResponse`
//! (`candidates[0].content.parts` of `text`, `thought` text and whole `functionCall`s, `finishReason`
//! on the last, `usageMetadata`, `modelVersion`), and no end marker. It refuses what the real API
//! refuses before it answers: another path (404), a wrong key (400 `API_KEY_INVALID`), and a body with
//! a field the API does not have ("Invalid JSON payload received. Unknown name …", 400), and it
//! answers scripted errors in Google's shape (`{"error": {"code", "message", "status", "details"}}`,
//! a 429 with a `RetryInfo` detail).

use anyhow::Result;
use serde_json::{Value, json};

use super::{Answer, CACHED_TOKENS, Config, Double, OUTPUT_TOKENS, PROMPT_TOKENS, Reply, Seen, THOUGHT_TOKENS, pieces};

/// Starts a double that accepts `key` and answers requests with `replies`, in order.
pub async fn start(key: &str, replies: Vec<Reply>) -> Result<Double> {
    Double::start(replies, Config { key: key.to_owned(), deployment: String::new() }, respond).await
}

/// Fields of a request body the API knows.
const BODY: &[&str] = &["contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings", "cachedContent"];
const GENERATION: &[&str] = &[
    "temperature",
    "topP",
    "topK",
    "maxOutputTokens",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseMimeType",
    "stopSequences",
    "thinkingConfig",
    "candidateCount",
];
const THINKING: &[&str] = &["thinkingBudget", "includeThoughts", "thinkingLevel"];
const PART: &[&str] = &["text", "thought", "thoughtSignature", "inlineData", "fileData", "functionCall", "functionResponse"];

fn status_name(code: u16) -> &'static str {
    match code {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

fn error(code: u16, message: &str, details: Value) -> Answer {
    let body = json!({ "error": { "code": code, "message": message, "status": status_name(code), "details": details } });
    Answer::Plain { status: code, body: body.to_string(), headers: Vec::new() }
}

/// The first field of `object` not in `known`, with where it is.
fn unknown(object: &Value, known: &[&str], at: &str) -> Option<String> {
    object
        .as_object()?
        .keys()
        .find(|k| !known.contains(&k.as_str()))
        .map(|k| format!("Invalid JSON payload received. Unknown name \"{k}\" at '{at}': Cannot find field."))
}

fn check_body(body: &Value) -> Option<String> {
    if let Some(problem) = unknown(body, BODY, "") {
        return Some(problem);
    }
    let generation = body.get("generationConfig").cloned().unwrap_or(Value::Null);
    if let Some(problem) = unknown(&generation, GENERATION, "generation_config") {
        return Some(problem);
    }
    if let Some(problem) = unknown(generation.get("thinkingConfig").unwrap_or(&Value::Null), THINKING, "generation_config.thinking_config")
    {
        return Some(problem);
    }
    let contents = body.get("contents").and_then(Value::as_array)?;
    if contents.is_empty() {
        return Some("* GenerateContentRequest.contents: contents is not specified".to_owned());
    }
    for (i, content) in contents.iter().enumerate() {
        let role = content.get("role").and_then(Value::as_str).unwrap_or_default();
        if !["user", "model"].contains(&role) {
            return Some(format!("Please use a valid role: user, model. (contents[{i}].role = {role:?})"));
        }
        for (j, part) in content.get("parts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
            if let Some(problem) = unknown(part, PART, &format!("contents[{i}].parts[{j}]")) {
                return Some(problem);
            }
        }
    }
    None
}

fn respond(seen: &Seen, reply: Option<&Reply>, config: &Config) -> (Answer, bool) {
    let path = seen.target.split('?').next().unwrap_or_default();
    let Some(model) = path.strip_prefix("/v1beta/models/").and_then(|rest| rest.strip_suffix(":streamGenerateContent")) else {
        return (error(404, &format!("Requested entity was not found: {path}"), json!([])), false);
    };
    if !seen.target.contains("alt=sse") {
        // Without alt=sse the answer is one JSON array, which is not what this double is for.
        return (error(400, "this double answers streamGenerateContent with alt=sse only", json!([])), false);
    }
    if seen.header("x-goog-api-key") != Some(config.key.as_str()) {
        let details =
            json!([{ "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com" }]);
        return (error(400, "API key not valid. Please pass a valid API key.", details), false);
    }
    if let Some(problem) = check_body(&seen.body) {
        return (error(400, &problem, json!([])), false);
    }
    let Some(reply) = reply else {
        return (error(500, "the double's script is used up", json!([])), false);
    };
    if let Some((status, message)) = &reply.error {
        let details =
            if *status == 429 { json!([{ "@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s" }]) } else { json!([]) };
        return (error(*status, message, details), true);
    }
    let events = events(reply, model);
    (Answer::Stream { events, cut: reply.break_after }, true)
}

fn event(parts: Vec<Value>, model: &str, finish: Option<&str>, usage: Value) -> String {
    let mut candidate = json!({ "content": { "parts": parts, "role": "model" }, "index": 0 });
    if let (Some(reason), Some(obj)) = (finish, candidate.as_object_mut()) {
        obj.insert("finishReason".into(), Value::from(reason));
    }
    json!({ "candidates": [candidate], "usageMetadata": usage, "modelVersion": model, "responseId": "resp-double" }).to_string()
}

/// The events of one reply.
fn events(reply: &Reply, model: &str) -> Vec<String> {
    let thoughts = if reply.thought.is_empty() { 0 } else { THOUGHT_TOKENS };
    let running = json!({ "promptTokenCount": PROMPT_TOKENS, "totalTokenCount": PROMPT_TOKENS });
    let mut last = json!({
        "promptTokenCount": PROMPT_TOKENS,
        "candidatesTokenCount": OUTPUT_TOKENS,
        "cachedContentTokenCount": CACHED_TOKENS,
        "totalTokenCount": PROMPT_TOKENS + OUTPUT_TOKENS + thoughts,
    });
    // The API leaves the count out when the model did not think.
    if thoughts > 0
        && let Some(obj) = last.as_object_mut()
    {
        obj.insert("thoughtsTokenCount".into(), Value::from(thoughts));
    }
    let finish = reply.finish.unwrap_or("STOP");
    let mut out = Vec::new();
    for piece in pieces(&reply.thought) {
        out.push(event(vec![json!({ "text": piece, "thought": true })], model, None, running.clone()));
    }
    let texts = pieces(&reply.text);
    for (i, piece) in texts.iter().enumerate() {
        let final_text = i + 1 == texts.len() && reply.calls.is_empty();
        let mut part = json!({ "text": piece });
        if final_text && let (Some(signature), Some(obj)) = (&reply.signature, part.as_object_mut()) {
            obj.insert("thoughtSignature".into(), Value::from(signature.clone()));
        }
        let (finish, usage) = if final_text { (Some(finish), last.clone()) } else { (None, running.clone()) };
        out.push(event(vec![part], model, finish, usage));
    }
    if !reply.calls.is_empty() {
        // Calls arrive whole, all in one event, the first carrying the turn's signature.
        let parts = reply
            .calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let mut part = json!({ "functionCall": { "name": call.name, "args": call.arguments } });
                if i == 0
                    && let (Some(signature), Some(obj)) = (&reply.signature, part.as_object_mut())
                {
                    obj.insert("thoughtSignature".into(), Value::from(signature.clone()));
                }
                part
            })
            .collect();
        out.push(event(parts, model, Some(finish), last.clone()));
    } else if texts.is_empty() {
        out.push(event(Vec::new(), model, Some(finish), last));
    }
    out
}
