//! Middleware behaviour of the lead agent seen from outside: loop detection's hard stop, the
//! clarification interrupt, dangling tool calls repaired on the next run.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::runs::*;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{RunEvent, RunStatus};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

fn last_assistant_text(events: &[RunEvent]) -> String {
    events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            Some(Kind::Message(m)) => m.message.as_ref().filter(|m| m.role == antler_proto::common::Role::Assistant as i32).map(|m| {
                m.content
                    .iter()
                    .filter_map(|p| match &p.part {
                        Some(antler_proto::common::content_part::Part::Text(t)) => Some(t.text.clone()),
                        _ => None,
                    })
                    .collect::<String>()
            }),
            _ => None,
        })
        .unwrap_or_default()
}

/// The run's (first) clarification event.
fn clarification_of(events: &[RunEvent]) -> antler_proto::runs::ClarificationEvent {
    events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::Clarification(c)) => Some(c.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// A model that calls the same tool with the same arguments forever: warned at the 3rd repetition,
/// stopped at the 5th with the forced-stop note and stop_reason `loop_capped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_identical_tool_calls_are_warned_then_hard_stopped() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![Turn::tools("Checking again.", vec![call("l", "ls", json!({"description": "look", "path": "/mnt/user-data"}))])],
        AfterLast::Repeat,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "List the files"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    assert_eq!(run.stop_reason, "loop_capped");

    let requests = double.requests();
    assert_eq!(requests.len(), 5, "the 5th identical turn is the last model call");
    let warned: Vec<usize> =
        requests.iter().enumerate().filter(|(_, r)| r["messages"].to_string().contains("[LOOP DETECTED]")).map(|(i, _)| i).collect();
    assert_eq!(warned, vec![3], "the warning is injected once, before the 4th call");

    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let tools = events.iter().filter(|e| matches!(e.kind, Some(Kind::ToolStarted(_)))).count();
    assert_eq!(tools, 4, "the capped turn's tool call is stripped, not run");
    let answer = last_assistant_text(&events);
    assert!(answer.starts_with("Checking again.") && answer.contains("[FORCED STOP]"), "{answer}");
    Ok(())
}

/// `ask_clarification` never executes: the run ends with a ClarificationEvent and stop_reason
/// `clarification`; the next run on the thread carries the answer and the model sees the question.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_clarification_interrupts_and_the_next_run_carries_the_answer() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "",
                vec![call(
                    "q1",
                    "ask_clarification",
                    json!({"question": "Which format?", "clarification_type": "approach_choice", "options": ["markdown", "pdf"]}),
                )],
            ),
            Turn::text("Markdown it is."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let first = run_to_end(&mut runs, prompt_request("", "Write a report"), T).await?;
    assert_eq!(first.stop_reason, "clarification", "{:?}\n{}", first.error, server.stderr());
    let events = run_events(&mut runs, ALICE, &first.run_id).await?;
    let question = clarification_of(&events);
    assert_eq!(question.question, "Which format?");
    assert_eq!(question.category, "approach_choice");
    assert_eq!(question.options.iter().map(|o| o.label.as_str()).collect::<Vec<_>>(), vec!["markdown", "pdf"]);
    assert_eq!(question.tool_call_id, "q1");
    let (_, mut threads) = clients(&server).await?;
    let thread = threads
        .get_thread(authed(antler_proto::runs::GetThreadRequest { thread_id: first.thread_id.clone() }, ALICE))
        .await?
        .into_inner()
        .thread
        .unwrap_or_default();
    assert_eq!(thread.status(), antler_proto::runs::ThreadStatus::Interrupted, "a thread waiting for an answer is interrupted");
    let state_request =
        || authed(antler_proto::runs::GetThreadStateRequest { thread_id: first.thread_id.clone(), ..Default::default() }, ALICE);
    let pending = threads.get_thread_state(state_request()).await?.into_inner().state.and_then(|s| s.pending_clarification);
    assert_eq!(
        pending.map(|p| (p.question, p.tool_call_id)),
        Some(("Which format?".to_owned(), "q1".to_owned())),
        "the state names the question"
    );

    let second = run_to_end(&mut runs, prompt_request(&first.thread_id, "markdown"), T).await?;
    let answered = threads.get_thread_state(state_request()).await?.into_inner().state.and_then(|s| s.pending_clarification);
    assert!(answered.is_none(), "answered: nothing pending any more");
    assert_eq!(second.status(), RunStatus::Success, "{:?}", second.error);
    let requests = double.requests();
    assert_eq!(requests.len(), 2, "the clarification ended the first run without another model call");
    let seen = requests[1]["messages"].to_string();
    assert!(seen.contains("Which format?") && seen.contains("markdown"), "{seen}");
    Ok(())
}

/// A clarification with options and a form: the event carries the fields; `resume` answers are
/// checked against them (unknown option, missing required field, wrong type, wrong interrupt id,
/// nothing pending) and a valid one reaches the model as a readable answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clarification_form_is_answered_with_resume_and_bad_answers_are_refused() -> anyhow::Result<()> {
    use antler_proto::runs::{FormFieldKind, ResumeInput};
    use prost_types::value::Kind as V;
    let form = json!({
        "question": "How should the report look?",
        "clarification_type": "missing_info",
        "options": ["markdown", "pdf"],
        "fields": [
            {"name": "budget", "label": "Budget (EUR)", "kind": "number", "required": true},
            {"name": "due", "label": "Due date", "kind": "date"},
            {"name": "sections", "label": "Sections", "kind": "multi_select", "options": ["summary", "figures", "appendix"]},
            {"name": "bad name!", "label": "dropped", "kind": "text"}
        ]
    });
    let double =
        LlmDouble::start(vec![Turn::tools("", vec![call("q1", "ask_clarification", form)]), Turn::text("Noted.")], AfterLast::Refuse)
            .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let first = run_to_end(&mut runs, prompt_request("", "Write a report"), T).await?;
    assert_eq!(first.stop_reason, "clarification", "{:?}\n{}", first.error, server.stderr());
    let events = run_events(&mut runs, ALICE, &first.run_id).await?;
    let asked = clarification_of(&events);
    let fields: Vec<(&str, FormFieldKind, bool)> = asked.fields.iter().map(|f| (f.name.as_str(), f.kind(), f.required)).collect();
    assert_eq!(
        fields,
        vec![("budget", FormFieldKind::Number, true), ("due", FormFieldKind::Date, false), ("sections", FormFieldKind::MultiSelect, false)],
        "an invalid field name is dropped"
    );
    assert_eq!(asked.fields[2].options.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), vec!["1", "2", "3"]);

    let value = |kind: V| prost_types::Value { kind: Some(kind) };
    let answer = |resume: ResumeInput| antler_proto::runs::CreateRunRequest {
        thread_id: first.thread_id.clone(),
        resume: Some(resume),
        ..Default::default()
    };
    let values =
        |pairs: Vec<(&str, V)>| Some(prost_types::Struct { fields: pairs.into_iter().map(|(k, v)| (k.to_owned(), value(v))).collect() });
    let refused = [
        (
            ResumeInput {
                selected_option_ids: vec!["7".into()],
                values: values(vec![("budget", V::NumberValue(5.0))]),
                ..Default::default()
            },
            "resume.selected_option_ids",
        ),
        (ResumeInput { text: "whatever".into(), ..Default::default() }, "resume.values.budget"),
        (ResumeInput { values: values(vec![("budget", V::StringValue("a lot".into()))]), ..Default::default() }, "resume.values.budget"),
    ];
    for (resume, field) in refused {
        let status =
            runs.create_run(authed(answer(resume), ALICE)).await.err().ok_or_else(|| anyhow::anyhow!("a bad answer was admitted"))?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{field}: {}", status.message());
    }
    let wrong_id = ResumeInput { interrupt_id: "q9".into(), values: values(vec![("budget", V::NumberValue(5.0))]), ..Default::default() };
    let status =
        runs.create_run(authed(answer(wrong_id), ALICE)).await.err().ok_or_else(|| anyhow::anyhow!("a wrong interrupt id was admitted"))?;
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{}", status.message());

    let good = ResumeInput {
        interrupt_id: "q1".into(),
        selected_option_ids: vec!["2".into()],
        values: values(vec![
            ("budget", V::NumberValue(500.0)),
            (
                "sections",
                V::ListValue(prost_types::ListValue { values: vec![value(V::StringValue("1".into())), value(V::StringValue("3".into()))] }),
            ),
        ]),
        text: "Keep it short.".into(),
    };
    let mut request = answer(good);
    request.idempotency_key = "answer-1".into();
    let second = run_to_end(&mut runs, request.clone(), T).await?;
    assert_eq!(second.status(), RunStatus::Success, "{:?}", second.error);
    let seen = double.requests()[1]["messages"].to_string();
    assert!(seen.contains("Answer to your clarification question"), "{seen}");
    for part in ["chosen: pdf", "Budget (EUR): 500", "Sections: summary, appendix", "Keep it short."] {
        assert!(seen.contains(part), "{part:?} missing from {seen}");
    }
    // A retry with the same key is the same run, although nothing is pending any more.
    let again = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
    assert!(again.reused && again.run_id == second.run_id, "{again:?}");
    // A new answer on a thread with nothing pending is refused.
    let late = ResumeInput { text: "one more thing".into(), ..Default::default() };
    let status = runs
        .create_run(authed(answer(late), ALICE))
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("an answer without a question was admitted"))?;
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{}", status.message());
    Ok(())
}

/// A tool on the guardrail's denylist never runs; the model reads the denial as an error result and
/// the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guardrail_denial_reaches_the_model_and_the_tool_never_runs() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools("", vec![call("b1", "bash", json!({"description": "x", "command": "echo ran > /mnt/user-data/workspace/ran"}))]),
            Turn::text("bash is not allowed here."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let extra = "  lead:\n    guardrails:\n      enabled: true\n      denied_tools: [bash]\n";
    let server = start_agent_up(&db, &double.models_yaml(), extra, Some(data.path()))?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Run something"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let ran = data.path().join(format!("sandbox/users/alice/threads/{}/user-data/workspace/ran", run.thread_id));
    assert!(!ran.exists(), "the denied command never ran");
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    assert!(events.iter().any(|e| matches!(&e.kind, Some(Kind::Custom(c)) if c.name == "guardrail_denied")));
    let told = double.requests()[1]["messages"].to_string();
    assert!(told.contains("Guardrail denied: tool 'bash' was blocked (oap.tool_denied)"), "{told}");
    Ok(())
}

/// A guardrail provider that cannot answer (the policy webhook's port is closed) denies every call
/// when `fail_closed` (the default): the command never runs and the model reads DeerFlow's
/// fail-closed text. With `fail_closed: false` the same failure lets the call run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_guardrail_provider_denies_when_fail_closed_and_allows_when_fail_open() -> anyhow::Result<()> {
    // A port nothing listens on: bound, then closed, so the connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    for fail_closed in [true, false] {
        let double = LlmDouble::start(
            vec![
                Turn::tools(
                    "",
                    vec![call("b1", "bash", json!({"description": "x", "command": "echo ran > /mnt/user-data/workspace/ran"}))],
                ),
                Turn::text("Done."),
            ],
            AfterLast::Refuse,
        )
        .await?;
        let db = TestDb::new(Backend::Sqlite).await?;
        let data = tempfile::tempdir()?;
        let extra = format!(
            "  lead:\n    guardrails:\n      enabled: true\n      fail_closed: {fail_closed}\n      webhook:\n        url: http://{closed}/evaluate\n        timeout_ms: 500\n"
        );
        let server = start_agent_up(&db, &double.models_yaml(), &extra, Some(data.path()))?;
        let (mut runs, _) = clients(&server).await?;
        let run = run_to_end(&mut runs, prompt_request("", "Run something"), T).await?;
        assert_eq!(run.status(), RunStatus::Success, "a denial is not a failed run: {:?}\n{}", run.error, server.stderr());
        let ran = data.path().join(format!("sandbox/users/alice/threads/{}/user-data/workspace/ran", run.thread_id));
        let told = double.requests()[1]["messages"].to_string();
        if fail_closed {
            assert!(!ran.exists(), "fail-closed: the command never ran");
            assert!(told.contains("Guardrail denied: tool 'bash' was blocked (oap.evaluator_error)"), "{told}");
            assert!(told.contains("guardrail provider error (fail-closed)"), "{told}");
            assert!(server.stderr().contains("guardrail provider failed"), "the failure is logged");
        } else {
            assert!(ran.exists(), "fail-open: the command ran");
            assert!(!told.contains("Guardrail denied"), "{told}");
        }
    }
    Ok(())
}

/// Plan mode: `write_todos` keeps a plan in the thread state; a final answer that leaves items
/// unfinished sends the model back with a completion reminder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_mode_reminds_the_model_of_unfinished_todos() -> anyhow::Result<()> {
    let plan = |second: &str| json!({"todos": [{"content": "collect", "status": "completed"}, {"content": "summarise", "status": second}]});
    let double = LlmDouble::start(
        vec![
            Turn::tools("", vec![call("t1", "write_todos", plan("in_progress"))]),
            Turn::text("All done."),
            Turn::tools("", vec![call("t2", "write_todos", plan("completed"))]),
            Turn::text("Now all done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let mut request = prompt_request("", "Collect and summarise");
    request.config = Some(antler_proto::runs::RunConfig { plan_mode: true, ..Default::default() });
    let run = run_to_end(&mut runs, request, T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let requests = double.requests();
    assert_eq!(requests.len(), 4);
    let tools = requests[0]["tools"].to_string();
    assert!(tools.contains("write_todos"), "plan mode offers write_todos");
    assert!(!requests[1]["messages"].to_string().contains("incomplete items"));
    let reminded = requests[2]["messages"].to_string();
    assert!(reminded.contains("incomplete items") && reminded.contains("[in_progress] summarise"), "{reminded}");
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let todos = events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            Some(Kind::Values(v)) => v.values.as_ref().and_then(|s| s.fields.get("todos")).cloned(),
            _ => None,
        })
        .unwrap_or_default();
    assert_eq!(format!("{todos:?}").matches("completed").count(), 2, "{todos:?}");
    Ok(())
}

/// Files uploaded with a message (and still there) are announced to the model before the message's
/// text; a file part naming a missing upload is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_files_are_announced_to_the_model() -> anyhow::Result<()> {
    use antler_proto::common::{ContentPart, FilePart, content_part};
    use antler_proto::runs::CreateThreadRequest;
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    use antler_proto::sandbox::{
        AcquireSandboxRequest, UploadChunk, UploadFileSpec, UploadFilesRequest, UploadHeader, upload_files_request,
    };

    let double = LlmDouble::start(vec![Turn::text("I see the notes.")], AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, mut threads) = clients(&server).await?;
    let thread = threads
        .create_thread(authed(CreateThreadRequest { thread_id: "uploads-1".to_owned(), ..Default::default() }, ALICE))
        .await?
        .into_inner()
        .thread
        .unwrap_or_default();
    let mut sandbox = SandboxServiceClient::new(server.channel().await?);
    sandbox.acquire_sandbox(authed(AcquireSandboxRequest { thread_id: thread.thread_id.clone() }, ALICE)).await?;
    let data = b"hello notes".to_vec();
    let header = UploadHeader {
        thread_id: thread.thread_id.clone(),
        files: vec![UploadFileSpec { filename: "notes.txt".to_owned(), size_bytes: data.len() as u64, ..Default::default() }],
        ..Default::default()
    };
    let stream = tokio_stream::iter(vec![
        UploadFilesRequest { payload: Some(upload_files_request::Payload::Header(header)) },
        UploadFilesRequest { payload: Some(upload_files_request::Payload::Chunk(UploadChunk { file_index: 0, data: data.clone() })) },
    ]);
    let uploaded = sandbox.upload_files(authed(stream, ALICE)).await?.into_inner();
    let path = uploaded.files.first().map(|f| f.virtual_path.clone()).unwrap_or_default();
    assert_eq!(path, "/mnt/user-data/uploads/notes.txt");

    let mut message = user_text("Summarise the notes");
    for (name, size) in [("notes.txt", data.len() as u64), ("ghost.txt", 1)] {
        message.content.push(ContentPart {
            part: Some(content_part::Part::File(FilePart {
                path: format!("/mnt/user-data/uploads/{name}"),
                name: name.to_owned(),
                size_bytes: size,
                ..Default::default()
            })),
        });
    }
    let request = antler_proto::runs::CreateRunRequest { thread_id: thread.thread_id.clone(), input: vec![message], ..Default::default() };
    let run = run_to_end(&mut runs, request, T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let seen = double.requests()[0]["messages"].to_string();
    assert!(seen.contains("<current_uploads>") && seen.contains("Path: /mnt/user-data/uploads/notes.txt"), "{seen}\n{}", server.stderr());
    assert!(!seen.contains("Path: /mnt/user-data/uploads/ghost.txt"), "{seen}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_warns_then_caps_the_run() -> anyhow::Result<()> {
    // Every turn of the double costs 120 tokens: the budget of 300 warns after the second (240 ≥
    // 0.7 × 300) and caps after the third (360).
    let ls = |id: &str| Turn::tools("Looking.", vec![call(id, "ls", json!({"description": "look", "path": "/mnt/user-data/workspace"}))]);
    let double = LlmDouble::start(vec![ls("a"), ls("b"), ls("c")], AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let up = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&up).await?;
    let mut request = prompt_request("", "Keep looking");
    request.config = Some(antler_proto::runs::RunConfig { token_budget: 300, ..Default::default() });
    let run = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, up.stderr());
    assert_eq!(run.stop_reason, "token_capped");
    let requests = double.requests();
    assert_eq!(requests.len(), 3);
    assert!(!requests[1]["messages"].to_string().contains("[TOKEN BUDGET]"));
    assert!(requests[2]["messages"].to_string().contains("[TOKEN BUDGET] This run has used 240 of its 300 tokens"), "{}", requests[2]);
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let finished = events.iter().filter(|e| matches!(e.kind, Some(Kind::ToolFinished(_)))).count();
    assert_eq!(finished, 2, "the capped turn's call is not run");
    assert!(last_assistant_text(&events).contains("[TOKEN BUDGET REACHED]"));
    Ok(())
}
