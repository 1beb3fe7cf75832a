//! The lead agent end to end: `antler up` (runs, models, sandbox in one process) with the model
//! upstream double speaking the OpenAI streaming format.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, COMPLETION_TOKENS, LlmDouble, PROMPT_TOKENS, Turn, call};
use antler_integration_tests::runs::*;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{GetThreadRequest, RunStatus};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
const REPORT: &str = "/mnt/user-data/outputs/report.md";

/// The messages of one request the double received, as (role, content-as-text).
fn request_messages(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .map(|messages| messages.iter().map(|m| (m["role"].as_str().unwrap_or_default().to_owned(), m["content"].to_string())).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_several_tool_rounds_succeeds_with_receipt_title_and_usage() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "Let me look around.",
                vec![
                    call("c1", "ls", json!({"description": "see the workspace", "path": "/mnt/user-data"})),
                    call("c2", "bash", json!({"description": "say hi", "command": "echo hello from bash"})),
                ],
            ),
            Turn::tools(
                "",
                vec![call("c3", "write_file", json!({"description": "write it", "path": REPORT, "content": "# Report\n\nAll good.\n"}))],
            ),
            Turn::tools(
                "",
                vec![
                    call("c4", "read_file", json!({"description": "check it", "path": REPORT})),
                    call("c5", "present_files", json!({"filepaths": [REPORT]})),
                ],
            ),
            Turn::text("Done: the report is in /mnt/user-data/outputs/report.md."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let mut request = prompt_request("", "Write a short report");
    request.expected_outputs = vec![REPORT.to_owned()];
    let run = run_to_end(&mut runs, request, T).await?;
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let finished = tool_finished(&events);
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{finished:#?}\n{}", run.error, server.stderr());
    assert_eq!(run.stop_reason, "", "a plain final answer has no stop reason");

    let receipt = run.delivery.clone().unwrap_or_default();
    assert!(receipt.satisfied, "{receipt:?}");
    assert_eq!(receipt.produced.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), vec![REPORT]);
    assert_eq!(receipt.presented, vec![REPORT.to_owned()]);

    let usage = run.usage.clone().unwrap_or_default();
    assert_eq!(usage.llm_calls, 4);
    assert_eq!(usage.lead_agent_tokens, 4 * (PROMPT_TOKENS + COMPLETION_TOKENS));
    assert_eq!(usage.input_tokens, 4 * PROMPT_TOKENS);

    let names: Vec<&str> = finished.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(finished.iter().all(|f| !f.is_error), "{finished:?}");
    let bash = finished.iter().find(|f| f.name == "bash").map(|f| f.result_summary.clone()).unwrap_or_default();
    assert!(bash.contains("hello from bash"), "{bash}");
    let read = finished.iter().find(|f| f.name == "read_file").map(|f| f.result_summary.clone()).unwrap_or_default();
    assert!(read.contains("All good."), "{read}");
    // Text and tool-call arguments were streamed as deltas before the complete messages.
    let deltas: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::MessageDelta(d)) => Some(d.clone()),
            _ => None,
        })
        .collect();
    let text: String = deltas.iter().map(|d| d.text.as_str()).collect();
    assert!(text.contains("Let me look around.") && text.contains("Done: the report"), "{text}");
    let arguments: String = deltas.iter().flat_map(|d| d.tool_calls.iter().map(|c| c.arguments.clone())).collect();
    assert!(arguments.contains("All good."), "{arguments}");
    // A checkpoint after every step, carrying the title.
    let values: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Values(v)) => Some(v.clone()),
            _ => None,
        })
        .collect();
    assert!(values.len() >= 7, "4 model steps + 3 tool rounds, got {}", values.len());
    let title = values.last().and_then(|v| v.values.as_ref()).and_then(|s| s.fields.get("title")).cloned();
    assert_eq!(
        title.and_then(|v| match v.kind {
            Some(prost_types::value::Kind::StringValue(s)) => Some(s),
            _ => None,
        }),
        Some("Write a short report".to_owned())
    );

    let (_, mut threads) = clients(&server).await?;
    let thread = threads
        .get_thread(authed(GetThreadRequest { thread_id: run.thread_id.clone() }, ALICE))
        .await?
        .into_inner()
        .thread
        .unwrap_or_default();
    assert_eq!(thread.title, "Write a short report", "the local fallback titles the thread");

    // The model saw the tools, the system prompt and every tool result, in call order.
    let requests = double.requests();
    assert_eq!(requests.len(), 4);
    let tools: Vec<&str> =
        requests[0]["tools"].as_array().map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str()).collect()).unwrap_or_default();
    for name in ["bash", "ls", "read_file", "write_file", "str_replace", "glob", "grep", "present_files", "ask_clarification"] {
        assert!(tools.contains(&name), "{name} missing from {tools:?}");
    }
    // The schemas travel as JSON text (ToolSpec.parameters_json) and reach the provider as written.
    let read_file = requests[0]["tools"].as_array().and_then(|t| t.iter().find(|t| t["function"]["name"] == "read_file")).cloned();
    let schema = read_file.map(|t| t["function"]["parameters"].clone()).unwrap_or_default();
    assert_eq!(schema["type"], "object", "{schema}");
    assert_eq!(schema["properties"]["start_line"]["type"], "integer", "{schema}");
    assert_eq!(schema["required"], serde_json::json!(["description", "path"]), "{schema}");
    let second = request_messages(&requests[1]);
    assert_eq!(second[0].0, "system");
    let results: Vec<&(String, String)> = second.iter().filter(|(role, _)| role == "tool").collect();
    assert_eq!(results.len(), 2);
    assert!(results[1].1.contains("hello from bash"), "{results:?}");
    Ok(())
}

/// Experiment C: the model says "report.md generated" but never wrote it. Success cannot rest on
/// words: present_files refuses a missing file and the receipt lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_but_unwritten_report_does_not_succeed() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![Turn::tools("", vec![call("p1", "present_files", json!({"filepaths": [REPORT]}))]), Turn::text("report.md generated.")],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let mut request = prompt_request("", "Write report.md");
    request.expected_outputs = vec![REPORT.to_owned()];
    let run = run_to_end(&mut runs, request, T).await?;
    assert_ne!(run.status(), RunStatus::Success);
    assert_eq!(run.status(), RunStatus::Error, "{}", server.stderr());
    assert_eq!(run.stop_reason, "delivery_incomplete");
    let receipt = run.delivery.clone().unwrap_or_default();
    assert!(!receipt.satisfied);
    assert_eq!(receipt.missing, vec![REPORT.to_owned()]);
    assert!(receipt.presented.is_empty(), "a missing file is never presented: {receipt:?}");

    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let present = tool_finished(&events).into_iter().find(|f| f.name == "present_files").unwrap_or_default();
    assert!(present.is_error && present.result_summary.starts_with("Error:"), "{present:?}");
    Ok(())
}

/// With `title.model_name`, the title comes from a model call tagged `middleware:title`, whose
/// tokens land in the middleware bucket, apart from the lead agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_title_model_names_the_thread_and_its_usage_has_its_own_bucket() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![Turn::text("Hello! How can I help?"), Turn::text("<think>short</think>\"Friendly Greeting\"")],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "  lead:\n    title:\n      model_name: double\n", None)?;
    let (mut runs, mut threads) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "hi there"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let usage = run.usage.clone().unwrap_or_default();
    assert_eq!(usage.llm_calls, 2);
    assert_eq!(usage.lead_agent_tokens, PROMPT_TOKENS + COMPLETION_TOKENS);
    assert_eq!(usage.middleware_tokens, PROMPT_TOKENS + COMPLETION_TOKENS);
    let thread = threads
        .get_thread(authed(GetThreadRequest { thread_id: run.thread_id.clone() }, ALICE))
        .await?
        .into_inner()
        .thread
        .unwrap_or_default();
    assert_eq!(thread.title, "Friendly Greeting");
    let requests = double.requests();
    assert!(requests[1]["messages"].to_string().contains("Generate a concise title"), "{}", requests[1]);
    Ok(())
}

/// Each model call and each tool round is a step; a run that reaches `recursion_limit` without a
/// final answer ends ERROR `recursion_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_recursion_limit_ends_error() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![Turn::tools("", vec![call("g", "glob", json!({"description": "find", "pattern": "**/*", "path": "/mnt/user-data"}))])],
        AfterLast::Repeat,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let mut request = prompt_request("", "Search forever");
    request.config = Some(antler_proto::runs::RunConfig { recursion_limit: 3, ..Default::default() });
    let run = run_to_end(&mut runs, request, T).await?;
    assert_eq!(run.status(), RunStatus::Error, "{}", server.stderr());
    assert_eq!(run.error.clone().unwrap_or_default().code, "recursion_limit");
    assert_eq!(double.requests().len(), 2, "model, tools, model = 3 steps; the next tool round is refused");
    Ok(())
}

/// A final answer cut at the model's output limit (finish reason `length`, no tool calls) is not a
/// success: the run ends ERROR `model_length_capped` and the cut words stay in the thread's state;
/// `runs.lead.truncated_answer: accept` ends it SUCCESS with that stop reason instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_answer_cut_at_the_output_limit_ends_error_unless_accepted() -> anyhow::Result<()> {
    let double = LlmDouble::start(vec![Turn::text("The three reasons are: first, the").finish("length")], AfterLast::Repeat).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, mut threads) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Give me three reasons"), T).await?;
    assert_eq!(run.status(), RunStatus::Error, "{}", server.stderr());
    let error = run.error.clone().unwrap_or_default();
    assert_eq!((error.code.as_str(), run.stop_reason.as_str()), ("model_length_capped", "model_length_capped"));
    assert!(error.message.contains("max_tokens") && error.message.contains("truncated_answer"), "{}", error.message);
    let state = threads
        .get_thread_state(authed(
            antler_proto::runs::GetThreadStateRequest { thread_id: run.thread_id.clone(), ..Default::default() },
            ALICE,
        ))
        .await?
        .into_inner();
    assert!(format!("{state:?}").contains("first, the"), "the cut answer stays in the thread's state: {state:?}");
    drop(server);

    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "  lead:\n    truncated_answer: accept\n", None)?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Give me three reasons"), T).await?;
    assert_eq!((run.status(), run.stop_reason.as_str()), (RunStatus::Success, "model_length_capped"), "{:?}", run.error);
    Ok(())
}

/// The receipt's `produced` is what this run created or changed: the outputs directory is listed
/// before the run (the baseline) and after it. A file an earlier run on the thread left unchanged is
/// neither produced again nor owed a presentation, yet still satisfies a declared output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receipt_counts_only_what_this_run_produced() -> anyhow::Result<()> {
    const A: &str = "/mnt/user-data/outputs/a.md";
    const B: &str = "/mnt/user-data/outputs/b.md";
    let write = |id: &str, path: &str| call(id, "write_file", json!({"description": "w", "path": path, "content": "text"}));
    let double = LlmDouble::start(
        vec![
            // Run 1: writes and presents a.md.
            Turn::tools("", vec![write("w1", A)]),
            Turn::tools("", vec![call("p1", "present_files", json!({"filepaths": [A]}))]),
            Turn::text("a.md is ready."),
            // Run 2: writes b.md and never presents it.
            Turn::tools("", vec![write("w2", B)]),
            Turn::text("b.md is ready."),
            // Run 3: touches nothing.
            Turn::text("Nothing to do."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let paths = |receipt: &antler_proto::runs::DeliveryReceipt| receipt.produced.iter().map(|f| f.path.clone()).collect::<Vec<_>>();

    let first = run_to_end(&mut runs, prompt_request("", "Write a.md"), T).await?;
    assert_eq!(first.status(), RunStatus::Success, "{:?}\n{}", first.error, server.stderr());
    assert_eq!(paths(&first.delivery.clone().unwrap_or_default()), vec![A.to_owned()]);

    let second = run_to_end(&mut runs, prompt_request(&first.thread_id, "Write b.md"), T).await?;
    let receipt = second.delivery.clone().unwrap_or_default();
    assert_eq!((second.status(), second.stop_reason.as_str()), (RunStatus::Error, "delivery_incomplete"));
    assert_eq!(paths(&receipt), vec![B.to_owned()], "a.md is unchanged since the run started: not produced by it");
    assert_eq!(receipt.missing, vec![B.to_owned()]);

    let mut request = prompt_request(&first.thread_id, "Is a.md still there?");
    request.expected_outputs = vec![A.to_owned()];
    let third = run_to_end(&mut runs, request, T).await?;
    let receipt = third.delivery.clone().unwrap_or_default();
    assert_eq!(third.status(), RunStatus::Success, "{receipt:?}");
    assert!(receipt.produced.is_empty() && receipt.satisfied, "{receipt:?}");
    Ok(())
}
