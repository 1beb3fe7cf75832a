//! The rest of the runs API as a client meets it: streaming and disconnects, heartbeats, feedback,
//! token usage, thread listing and deletion.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::runs::*;
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;

const T: Duration = Duration::from_secs(20);

fn string(v: &str) -> prost_types::Value {
    prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(v.to_owned())) }
}

#[tokio::test]
async fn a_stream_client_that_goes_away_cancels_its_run_unless_continue() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, _) = clients(&server).await?;
    for (on_disconnect, expected) in [(OnDisconnect::Unspecified, RunStatus::Interrupted), (OnDisconnect::Continue, RunStatus::Success)] {
        let mut create = run_request("", json!([{"say": "started"}, {"sleep_ms": 1500}, {"say": "finished"}]));
        create.on_disconnect = on_disconnect as i32;
        let mut stream = runs.stream_run(authed(StreamRunRequest { create: Some(create) }, ALICE)).await?.into_inner();
        let first = stream.next().await.ok_or_else(|| anyhow::anyhow!("empty stream"))??.event.unwrap_or_default();
        let run_id = first.run_id.clone();
        assert!(matches!(first.kind, Some(run_event::Kind::Metadata(_))), "the first event is METADATA");
        drop(stream);
        let run = wait_run(&mut runs, ALICE, &run_id, T, is_terminal).await?;
        assert_eq!(run.status(), expected, "{on_disconnect:?}");
    }
    Ok(())
}

#[tokio::test]
async fn idle_streams_get_heartbeats_and_stream_kinds_filter_events() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, _) = clients(&server).await?;
    let mut create = run_request("", json!([{"say": "a b c"}, {"sleep_ms": 2500}, {"custom": 1}]));
    create.stream_kinds = vec![EventKind::Custom as i32];
    let mut stream = runs.stream_run(authed(StreamRunRequest { create: Some(create) }, ALICE)).await?.into_inner();
    let mut kinds = Vec::new();
    while let Some(event) = tokio::time::timeout(T, stream.next()).await? {
        let kind = event?.event.and_then(|e| e.kind).ok_or_else(|| anyhow::anyhow!("event without kind"))?;
        let end = matches!(kind, run_event::Kind::End(_));
        kinds.push(kind);
        if end {
            break;
        }
    }
    assert!(
        kinds.iter().any(|k| matches!(k, run_event::Kind::Heartbeat(h) if h.last_seq > 0)),
        "a heartbeat during the 2.5 s pause: {kinds:?}"
    );
    assert!(!kinds.iter().any(|k| matches!(k, run_event::Kind::MessageDelta(_) | run_event::Kind::Message(_))), "messages filtered out");
    assert!(kinds.iter().any(|k| matches!(k, run_event::Kind::Custom(_))));
    assert!(matches!(kinds.first(), Some(run_event::Kind::Metadata(_))), "METADATA always sent");
    Ok(())
}

#[tokio::test]
async fn feedback_is_one_per_user_per_run_and_usage_adds_up_by_model_and_caller() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, mut threads) = clients(&server).await?;
    threads.create_thread(authed(CreateThreadRequest { thread_id: "t-usage".into(), ..Default::default() }, ALICE)).await?;
    let steps = json!([
        {"usage": {"model": "m1", "caller": "lead_agent", "input": 10, "output": 5}},
        {"usage": {"model": "m2", "caller": "middleware:title", "input": 3, "output": 1}},
    ]);
    let done = runs
        .wait_run(authed(WaitRunRequest { create: Some(run_request("t-usage", steps)) }, ALICE))
        .await?
        .into_inner()
        .run
        .unwrap_or_default();
    let cancelled = runs
        .create_run(authed(
            run_request("t-usage", json!([{"usage": {"model": "m1", "input": 100, "output": 0}}, {"wait_cancel": true}])),
            ALICE,
        ))
        .await?
        .into_inner()
        .run
        .unwrap_or_default();
    wait_run(&mut runs, ALICE, &cancelled.run_id, T, |r| r.usage.as_ref().is_some_and(|u| u.total_tokens == 100)).await?;
    runs.cancel_run(authed(CancelRunRequest { run_id: cancelled.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;

    let usage =
        runs.get_token_usage(authed(GetTokenUsageRequest { thread_id: "t-usage".into(), ..Default::default() }, ALICE)).await?.into_inner();
    assert_eq!(usage.total.map(|u| u.total_tokens), Some(119), "interrupted runs count too");
    assert_eq!(usage.runs, 2);
    assert_eq!(usage.llm_calls, 3);
    let by_caller = usage.by_caller.unwrap_or_default();
    assert_eq!((by_caller.lead_agent_tokens, by_caller.middleware_tokens), (115, 4));
    assert_eq!(usage.by_model.get("m1").and_then(|m| m.usage.as_ref()).map(|u| u.total_tokens), Some(115));

    // ListRuns with no thread lists all of the caller's runs, newest first.
    let all = runs.list_runs(authed(ListRunsRequest::default(), ALICE)).await?.into_inner().runs;
    assert_eq!(all.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(), vec![cancelled.run_id.clone(), done.run_id.clone()]);
    assert!(runs.list_runs(authed(ListRunsRequest::default(), BOB)).await?.into_inner().runs.is_empty());

    let first = runs
        .submit_feedback(authed(
            SubmitFeedbackRequest { run_id: done.run_id.clone(), rating: 1, comment: "good".into(), ..Default::default() },
            ALICE,
        ))
        .await?
        .into_inner();
    let second = runs
        .submit_feedback(authed(
            SubmitFeedbackRequest { run_id: done.run_id.clone(), rating: -1, comment: "changed my mind".into(), ..Default::default() },
            ALICE,
        ))
        .await?
        .into_inner();
    assert!(first.created && !second.created, "upsert");
    let (a, b) = (first.feedback.unwrap_or_default(), second.feedback.unwrap_or_default());
    assert_eq!(a.feedback_id, b.feedback_id);
    assert_eq!((b.rating, b.comment.as_str()), (-1, "changed my mind"));
    Ok(())
}

#[tokio::test]
async fn threads_list_newest_first_with_filters_and_stable_pages_and_delete_cleans_up() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, mut threads) = clients(&server).await?;
    for i in 0..7 {
        let mut metadata = prost_types::Struct::default();
        metadata.fields.insert("team".into(), string(if i % 2 == 0 { "red" } else { "blue" }));
        threads
            .create_thread(authed(
                CreateThreadRequest { thread_id: format!("t-{i}"), metadata: Some(metadata), ..Default::default() },
                ALICE,
            ))
            .await?;
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = antler_proto::common::PageRequest { page_size: 3, page_token: token.clone() };
        let response =
            threads.list_threads(authed(ListThreadsRequest { page: Some(page), ..Default::default() }, ALICE)).await?.into_inner();
        seen.extend(response.threads.iter().map(|t| t.thread_id.clone()));
        token = response.page.unwrap_or_default().next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, (0..7).rev().map(|i| format!("t-{i}")).collect::<Vec<_>>(), "newest first, each once");

    let mut filter = prost_types::Struct::default();
    filter.fields.insert("team".into(), string("red"));
    let red = threads
        .list_threads(authed(ListThreadsRequest { metadata: Some(filter), ..Default::default() }, ALICE))
        .await?
        .into_inner()
        .threads;
    assert_eq!(red.len(), 4);

    // Metadata merge, then status filter: t-0 busy while a run is active.
    let mut patch = prost_types::Struct::default();
    patch.fields.insert("stage".into(), string("review"));
    let updated = threads
        .update_thread(authed(UpdateThreadRequest { thread_id: "t-0".into(), metadata: Some(patch), title: Some("Zero".into()) }, ALICE))
        .await?
        .into_inner()
        .thread
        .unwrap_or_default();
    let fields = updated.metadata.unwrap_or_default().fields;
    assert!(fields.contains_key("team") && fields.contains_key("stage"));
    assert_eq!(updated.title, "Zero");
    let run = runs
        .create_run(authed(run_request("t-0", json!([{"checkpoint": true}, {"wait_cancel": true}])), ALICE))
        .await?
        .into_inner()
        .run
        .unwrap_or_default();
    wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
    let busy = threads
        .list_threads(authed(ListThreadsRequest { status: ThreadStatus::Busy as i32, ..Default::default() }, ALICE))
        .await?
        .into_inner()
        .threads;
    assert_eq!(busy.iter().map(|t| t.thread_id.as_str()).collect::<Vec<_>>(), vec!["t-0"]);

    let refused = threads
        .delete_thread(authed(DeleteThreadRequest { thread_id: "t-0".into(), ..Default::default() }, ALICE))
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(refused, Some(Code::FailedPrecondition), "not while a run is active");
    let deleted =
        threads.delete_thread(authed(DeleteThreadRequest { thread_id: "t-0".into(), cancel_active_run: true }, ALICE)).await?.into_inner();
    assert_eq!(deleted.deleted_runs, 1);
    let gone = threads.get_thread(authed(GetThreadRequest { thread_id: "t-0".into() }, ALICE)).await.err().map(|s| s.code());
    assert_eq!(gone, Some(Code::NotFound));
    let run_gone =
        runs.get_run(authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await.err().map(|s| s.code());
    assert_eq!(run_gone, Some(Code::NotFound));
    Ok(())
}

/// DeleteThread, through `antler up`, also empties the thread's sandbox workspace.
#[tokio::test]
async fn deleting_a_thread_clears_its_workspace() -> anyhow::Result<()> {
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    use antler_proto::sandbox::{AcquireSandboxRequest, ReadFileRequest, WriteFileRequest, write_file_request};
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = antler_integration_tests::start("antler", antler_integration_tests::Launch::new(["up"]).config(config(&db, "")))?;
    let channel = server.channel().await?;
    let (mut threads, mut sandbox) =
        (antler_proto::runs::thread_service_client::ThreadServiceClient::new(channel.clone()), SandboxServiceClient::new(channel));
    threads.create_thread(authed(CreateThreadRequest { thread_id: "t-files".into(), ..Default::default() }, ALICE)).await?;
    sandbox.acquire_sandbox(authed(AcquireSandboxRequest { thread_id: "t-files".into() }, ALICE)).await?;
    let write = WriteFileRequest {
        thread_id: "t-files".into(),
        path: "/mnt/user-data/outputs/secret.md".into(),
        content: Some(write_file_request::Content::Text("private".into())),
        ..Default::default()
    };
    sandbox.write_file(authed(write, ALICE)).await?;
    threads.delete_thread(authed(DeleteThreadRequest { thread_id: "t-files".into(), ..Default::default() }, ALICE)).await?;

    sandbox.acquire_sandbox(authed(AcquireSandboxRequest { thread_id: "t-files".into() }, ALICE)).await?;
    let read = sandbox
        .read_file(authed(
            ReadFileRequest { thread_id: "t-files".into(), path: "/mnt/user-data/outputs/secret.md".into(), ..Default::default() },
            ALICE,
        ))
        .await;
    assert_eq!(read.err().map(|s| s.code()), Some(Code::NotFound), "the file outlived its thread");
    Ok(())
}

/// A large input is kept out of the `runs` row (every event append rewrites that row on SQLite) and
/// still reaches the agent whole, on both backends.
#[tokio::test]
async fn a_large_input_reaches_the_agent_whole() -> anyhow::Result<()> {
    let text = format!("{}END", "x".repeat(200_000));
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        let create = CreateRunRequest { input: vec![user_text(&text)], expected_outputs: vec![], ..CreateRunRequest::default() };
        let run = run_to_end(&mut runs, create, T).await?;
        assert_eq!(run.status(), RunStatus::Success, "{backend:?}: {:?}", run.error);
        let events = run_events(&mut runs, ALICE, &run.run_id).await?;
        let echoed = events.iter().any(|e| match &e.kind {
            Some(run_event::Kind::Message(m)) => m.message.as_ref().is_some_and(|m| {
                m.content.iter().any(
                    |p| matches!(&p.part, Some(antler_proto::common::content_part::Part::Text(t)) if t.text == format!("echo: {text}")),
                )
            }),
            _ => false,
        });
        assert!(echoed, "{backend:?}: the agent saw the whole input");
    }
    Ok(())
}

/// `config.max_duration` stops a run still going at its limit: TIMEOUT, stop_reason and error code
/// `deadline_exceeded`, the thread in error. Longer limits are clamped to `runs.max_run_duration_secs`,
/// an absent one gets it, a negative one is refused naming the field.
#[tokio::test]
async fn a_run_past_its_max_duration_times_out_and_limits_are_clamped() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "  max_run_duration_secs: 600\n")?;
    let (mut runs, mut threads) = clients(&server).await?;
    let seconds = |s: i64| Some(prost_types::Duration { seconds: s, nanos: 0 });

    let mut create = run_request("", json!([{"say": "working"}, {"sleep_ms": 30000}, {"say": "never said"}]));
    create.config = Some(RunConfig { max_duration: seconds(1), ..Default::default() });
    let started = std::time::Instant::now();
    let run = run_to_end(&mut runs, create, T).await?;
    assert_eq!(run.status(), RunStatus::Timeout, "{:?}", run.error);
    assert!(started.elapsed() < Duration::from_secs(10), "stopped at its limit, not after the 30 s sleep");
    assert_eq!(run.stop_reason, "deadline_exceeded");
    assert_eq!(run.error.as_ref().map(|e| e.code.as_str()), Some("deadline_exceeded"));
    assert_eq!(run.config.as_ref().and_then(|c| c.max_duration), seconds(1));
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    assert!(matches!(events.last().and_then(|e| e.kind.clone()), Some(run_event::Kind::End(end)) if end.status() == RunStatus::Timeout));
    let thread = threads.get_thread(authed(GetThreadRequest { thread_id: run.thread_id.clone() }, ALICE)).await?;
    assert_eq!(thread.into_inner().thread.unwrap_or_default().status(), ThreadStatus::Error);

    for (asked, effective) in [(seconds(10 * 86_400), 600), (None, 600), (seconds(5), 5)] {
        let mut create = run_request("", json!([{"say": "hi"}]));
        create.config = Some(RunConfig { max_duration: asked, ..Default::default() });
        let run = runs.create_run(authed(create, ALICE)).await?.into_inner().run.unwrap_or_default();
        assert_eq!(run.config.and_then(|c| c.max_duration), seconds(effective), "asked {asked:?}");
    }
    let mut create = run_request("", json!([{"say": "hi"}]));
    create.config = Some(RunConfig { max_duration: seconds(-1), ..Default::default() });
    let status = runs.create_run(authed(create, ALICE)).await.err().ok_or_else(|| anyhow::anyhow!("a negative limit was accepted"))?;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("config.max_duration"), "{}", status.message());
    Ok(())
}
