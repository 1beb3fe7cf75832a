//! Helpers for driving the memory service: configs for `antler-memory` alone and for `antler up` with
//! the model upstream double, clients, requests.

use std::time::Duration;

use antler_proto::common::{ContentPart, Message, Role, TextPart, ToolCall, content_part};
use antler_proto::memory::memory_service_client::MemoryServiceClient;
use antler_proto::memory::*;
use anyhow::Result;
use tonic::transport::Channel;

use crate::db::TestDb;
use crate::runs::authed;
use crate::{Launch, Process, start};

pub const ALICE: &str = "alice-memory-key-0123456789";
pub const BOB: &str = "bob-memory-key-0123456789";
/// The memory service's own key (a service principal): how its workers call the models service.
pub const SERVICE: &str = "memory-service-key-0123456789";

/// `antler.yaml` with users alice and bob, the memory database `db`, and `memory_extra` lines for the
/// `memory:` section (indented by two spaces), then `rest` (further sections, e.g. `models:`).
pub fn config(db: &TestDb, memory_extra: &str, rest: &str) -> String {
    format!(
        "server:\n  shutdown_grace_secs: 2\n  auth:\n    enabled: true\n    api_keys:\n      - key: {ALICE}\n        user: alice\n      - key: {BOB}\n        user: bob\n      - key: {SERVICE}\n        user: antler-memory\n        service: true\nclients:\n  models:\n    service_token: {SERVICE}\nmemory:\n  database:\n    url: \"{}\"\n{memory_extra}{rest}",
        db.url
    )
}

/// Starts `antler-memory` alone on `db`.
pub fn start_memory(db: &TestDb, memory_extra: &str) -> Result<Process> {
    start("antler-memory", Launch::default().config(config(db, memory_extra, "")))
}

/// Starts `antler up` (memory with the models service in the same process) on `db`; `models` is a
/// `models:` section (e.g. [`crate::llm_double::LlmDouble::models_yaml`]).
pub fn start_up(db: &TestDb, memory_extra: &str, models: &str, data_dir: Option<&std::path::Path>) -> Result<Process> {
    let mut launch = Launch::new(["up"]).config(config(db, memory_extra, models));
    if let Some(dir) = data_dir {
        launch = launch.data_dir(dir);
    }
    start("antler", launch)
}

pub async fn client(process: &Process) -> Result<MemoryServiceClient<Channel>> {
    Ok(MemoryServiceClient::new(process.channel().await?))
}

pub fn message(role: Role, text: &str) -> Message {
    Message {
        role: role as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    }
}

/// An assistant message that calls `tool`.
pub fn tool_call(tool: &str) -> Message {
    let mut m = message(Role::Assistant, "");
    m.tool_calls.push(ToolCall { id: format!("call-{tool}"), name: tool.to_owned(), ..ToolCall::default() });
    m
}

/// A short conversation: the user says `text`, the assistant acknowledges.
pub fn conversation(text: &str) -> Vec<Message> {
    vec![message(Role::User, text), message(Role::Assistant, "Understood, I will remember that.")]
}

pub fn add(content: &str, category: FactCategory, confidence: f64) -> AddFactRequest {
    AddFactRequest { content: content.to_owned(), category: category as i32, confidence: Some(confidence), ..AddFactRequest::default() }
}

/// Adds a fact as `key` and returns it.
pub async fn add_fact(client: &mut MemoryServiceClient<Channel>, key: &str, request: AddFactRequest) -> Result<Fact> {
    Ok(client.add_fact(authed(request, key)).await?.into_inner().fact.unwrap_or_default())
}

/// Every active fact of the default agent as `key`.
pub async fn active_facts(client: &mut MemoryServiceClient<Channel>, key: &str) -> Result<Vec<Fact>> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = antler_proto::common::PageRequest { page_size: 200, page_token: token.clone() };
        let response = client.list_facts(authed(ListFactsRequest { page: Some(page), ..Default::default() }, key)).await?.into_inner();
        out.extend(response.facts);
        token = response.page.map(|p| p.next_page_token).unwrap_or_default();
        if token.is_empty() {
            return Ok(out);
        }
    }
}

/// Queues `messages` on `thread` as `key`.
pub async fn queue(
    client: &mut MemoryServiceClient<Channel>,
    key: &str,
    thread: &str,
    messages: Vec<Message>,
    immediate: bool,
) -> Result<QueueUpdateResponse> {
    let request = QueueUpdateRequest { thread_id: thread.to_owned(), messages, immediate, ..Default::default() };
    Ok(client.queue_update(authed(request, key)).await?.into_inner())
}

/// Flushes every pending update of `key` and waits for them (at most `timeout`).
pub async fn flush_wait(client: &mut MemoryServiceClient<Channel>, key: &str, timeout: Duration) -> Result<FlushUpdatesResponse> {
    let request = FlushUpdatesRequest {
        wait: true,
        timeout: Some(prost_types::Duration { seconds: timeout.as_secs() as i64, nanos: 0 }),
        ..Default::default()
    };
    Ok(client.flush_updates(authed(request, key)).await?.into_inner())
}

/// A scripted extraction answer: one ADD per `(content, category, confidence)`.
pub fn adds(facts: &[(&str, &str, f64)]) -> String {
    let operations: Vec<serde_json::Value> = facts
        .iter()
        .map(|(content, category, confidence)| serde_json::json!({"op": "ADD", "content": content, "category": category, "confidence": confidence}))
        .collect();
    serde_json::json!({ "operations": operations }).to_string()
}
