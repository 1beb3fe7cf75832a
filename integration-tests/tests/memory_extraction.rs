//! Extraction through the real models service and the LLM upstream double (`antler up`): the prompt the
//! model sees, every junk guard, a malformed answer dropped and counted, a contradiction that
//! invalidates the old fact, and a second thread that gets the first thread's fact injected.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn};
use antler_integration_tests::memory::*;
use antler_integration_tests::runs::authed;
use antler_proto::common::Role;
use antler_proto::memory::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn prompt_of(request: &serde_json::Value) -> String {
    request["messages"].as_array().into_iter().flatten().map(|m| m["content"].to_string()).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn extraction_applies_operations_through_the_junk_guards() -> anyhow::Result<()> {
    let first = json!({
        "operations": [
            {"op": "ADD", "content": "Works as a data engineer at Acme", "category": "context", "confidence": 0.95},
            {"op": "ADD", "content": "Might enjoy hiking", "category": "preference", "confidence": 0.5},
            {"op": "ADD", "content": "The user is waiting for the report", "category": "context", "confidence": 0.9},
            {"op": "ADD", "content": "Always cite your sources and answer in the language of the user", "category": "behavior", "confidence": 0.9},
            {"op": "ADD", "content": "Quarterly revenue grew 12 percent in the northern region last year", "category": "knowledge", "confidence": 0.9},
            {"op": "ADD", "content": "prefers rust over go for backend services!", "category": "preference", "confidence": 0.9},
            {"op": "ADD", "content": "Prefers Rust over Go for all backend services", "category": "preference", "confidence": 0.9},
            {"op": "ADD", "content": "Works as a  data engineer at ACME", "category": "context", "confidence": 0.9},
            {"op": "ADD", "content": "{\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}}}", "category": "knowledge", "confidence": 0.9},
            {"op": "NOOP"}
        ],
        "summaries": {"workContext": "Data engineer at Acme"}
    });
    let turns = vec![
        Turn::text(&format!("```json\n{first}\n```")),
        Turn::text("Sure! The user works at Acme and likes Rust. {\"operations\": ["),
        Turn::text(
            &json!({"operations": [{"op": "UPDATE", "id": "f1", "content": "Lives in Lisbon", "category": "context", "confidence": 0.95}]})
                .to_string(),
        ),
    ];
    let double = LlmDouble::start(turns, AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_up(&db, "  debounce_seconds: 300\n", &double.models_yaml(), None)?;
    let mut memory = client(&server).await?;
    let rust = add_fact(&mut memory, ALICE, add("Prefers Rust over Go for backend services", FactCategory::Preference, 0.9)).await?;

    let messages = vec![
        message(
            Role::System,
            "You are DeerFlow, an open-source super agent. Always cite your sources and answer in the language of the user.",
        ),
        message(Role::User, "I'm a data engineer at Acme. Can you summarise the sales file? I'm waiting."),
        tool_call("read_file"),
        message(Role::Tool, "Quarterly revenue grew 12 percent in the northern region last year, driven by retail."),
        message(Role::Assistant, "Revenue grew 12% in the north. Anything else?"),
    ];
    let queued = queue(&mut memory, ALICE, "thread-1", messages, false).await?;
    let scheduled = queued.scheduled_at.map(|t| t.seconds).unwrap_or_default();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    assert!(scheduled >= now + 290, "debounced by memory.debounce_seconds");
    let flushed = flush_wait(&mut memory, ALICE, WAIT).await?;
    assert!(flushed.completed && flushed.flushed == 1, "{flushed:?}");
    let outcome = flushed.outcomes.first().cloned().unwrap_or_default();
    assert_eq!(outcome.error, "", "{outcome:?}");
    assert_eq!(
        (outcome.facts_added, outcome.facts_reinforced, outcome.facts_rejected, outcome.facts_invalidated, outcome.sections_updated),
        (1, 1, 7, 0, 1),
        "{outcome:?}"
    );
    let requests = double.requests();
    let prompt = prompt_of(&requests[0]);
    assert!(
        prompt.contains("data engineer at Acme") && prompt.contains("Prefers Rust over Go"),
        "the prompt has the conversation and the existing facts"
    );
    assert!(prompt.contains("\\\"id\\\":\\\"f1\\\""), "existing facts under short ids: {prompt}");
    assert!(!prompt.contains("northern region"), "tool results never reach the extraction prompt");
    assert!(!prompt.contains("read_file"));
    let facts = active_facts(&mut memory, ALICE).await?;
    let mut contents: Vec<&str> = facts.iter().map(|f| f.content.as_str()).collect();
    contents.sort();
    assert_eq!(contents, ["Prefers Rust over Go for backend services", "Works as a data engineer at Acme"]);
    let reinforced = facts.iter().find(|f| f.id == rust.id).map(|f| f.confirmation_count);
    assert_eq!(reinforced, Some(1), "a duplicate confirms the existing fact instead of adding one");
    let learned = facts.iter().find(|f| f.content.starts_with("Works")).cloned().unwrap_or_default();
    let source = learned.source.clone().unwrap_or_default();
    assert_eq!((source.kind(), source.thread_id.as_str()), (FactSourceKind::Conversation, "thread-1"));
    let summary = memory.get_memory(authed(GetMemoryRequest::default(), ALICE)).await?.into_inner().memory.unwrap_or_default();
    assert_eq!(summary.profile.and_then(|p| p.work_context).map(|s| s.summary).unwrap_or_default(), "Data engineer at Acme");

    // A second thread sees what the first one taught.
    let injected = memory
        .render_injection(authed(RenderInjectionRequest { query: "Which tools should I use at work?".into(), ..Default::default() }, ALICE))
        .await?
        .into_inner();
    assert!(injected.text.contains("- Work: Data engineer at Acme"), "{}", injected.text);
    assert!(injected.included_fact_ids.contains(&learned.id), "{}", injected.text);

    // A malformed answer is dropped whole and counted.
    queue(&mut memory, ALICE, "thread-2", conversation("I also like Haskell a lot"), false).await?;
    let flushed = flush_wait(&mut memory, ALICE, WAIT).await?;
    let outcome = flushed.outcomes.first().cloned().unwrap_or_default();
    assert!(outcome.error.contains("malformed"), "{outcome:?}");
    assert_eq!((outcome.facts_added, outcome.facts_rejected), (0, 0));
    assert_eq!(active_facts(&mut memory, ALICE).await?.len(), 2, "nothing of a malformed answer is saved");

    // A contradiction replaces the old fact: new version, the old one invalidated and linked.
    let berlin = add_fact(&mut memory, BOB, add("Lives in Berlin", FactCategory::Context, 0.9)).await?;
    queue(&mut memory, BOB, "thread-3", conversation("I moved from Berlin to Lisbon last month"), false).await?;
    let flushed = flush_wait(&mut memory, BOB, WAIT).await?;
    let outcome = flushed.outcomes.first().cloned().unwrap_or_default();
    assert_eq!((outcome.facts_added, outcome.facts_invalidated), (1, 1), "{outcome:?}");
    let bob =
        memory.list_facts(authed(ListFactsRequest { include_invalidated: true, ..Default::default() }, BOB)).await?.into_inner().facts;
    let old = bob.iter().find(|f| f.id == berlin.id).cloned().unwrap_or_default();
    let new = bob.iter().find(|f| f.content == "Lives in Lisbon").cloned().unwrap_or_default();
    assert!(old.invalidated_at.is_some() && old.invalidation_reason == "superseded", "{old:?}");
    assert_eq!((old.superseded_by.as_str(), new.supersedes.as_str()), (new.id.as_str(), berlin.id.as_str()));
    assert_eq!(double.requests().len(), 3, "one model call per update");
    Ok(())
}
