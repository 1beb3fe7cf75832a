//! The run lifecycle against a real `antler-runs` binary, on SQLite and on PostgreSQL: the seed's three
//! experiments, multitask strategies, cancellation at each stage, and events.

use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::runs::*;
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;

const T: Duration = Duration::from_secs(20);

/// Experiment A: a run is PENDING right after CreateRun; cancelled while PENDING it ends INTERRUPTED
/// and its agent is never constructed.
#[tokio::test]
async fn cancel_while_pending_never_builds_agent() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        // One worker slot, held by a blocker, keeps the next run PENDING for as long as we like.
        let server = start_runs(&db, "  max_concurrent_runs: 1\n")?;
        let (mut runs, _) = clients(&server).await?;
        let blocker = hold_the_only_slot(&mut runs).await?;

        let run = runs.create_run(authed(run_request("", json!([{"say": "never"}])), ALICE)).await?.into_inner().run.unwrap_or_default();
        assert_eq!(run.status(), RunStatus::Pending, "{backend:?}");
        let queried = runs
            .get_run(authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        assert_eq!(queried.status(), RunStatus::Pending, "{backend:?}: queried at once");

        let cancelled = runs
            .cancel_run(authed(CancelRunRequest { run_id: run.run_id.clone(), wait: true, ..Default::default() }, ALICE))
            .await?
            .into_inner();
        assert_eq!(cancelled.run.as_ref().map(|r| r.status()), Some(RunStatus::Interrupted), "{backend:?}");

        // Free the slot; the cancelled run must still never start.
        runs.cancel_run(authed(CancelRunRequest { run_id: blocker.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // try_start is the only way to an agent: a run it never passed has no attempt and no start.
        let never = runs
            .get_run(authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        assert_eq!((never.attempt, never.started_at), (0, None), "{backend:?}: a run cancelled while PENDING was started");
        assert_eq!(said(&mut runs, ALICE, &run.run_id).await?, 0, "{backend:?}: its script ran");
        let blocker = runs
            .get_run(authed(GetRunRequest { run_id: blocker.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        assert_eq!(blocker.attempt, 1, "{backend:?}: the blocker was started once");
        let events = runs
            .list_run_events(authed(ListRunEventsRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .events;
        let kinds: Vec<_> = events.iter().map(|e| std::mem::discriminant(e.kind.as_ref().expect("kind"))).collect();
        assert_eq!(kinds.len(), 2, "{backend:?}: metadata then end, got {events:?}");
        assert!(
            matches!(events.last().and_then(|e| e.kind.as_ref()), Some(run_event::Kind::End(end)) if end.status() == RunStatus::Interrupted)
        );
    }
    Ok(())
}

/// Experiment B: 100 concurrent CreateRun with one idempotency key make exactly one run (99 reused)
/// and one execution.
#[tokio::test]
async fn concurrent_creates_with_one_key_make_one_run() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (runs, threads) = clients(&server).await?;
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let mut runs = runs.clone();
            tasks.push(tokio::spawn(async move {
                let mut request = run_request("", json!([{"say": "once"}]));
                request.idempotency_key = "key-b".to_owned();
                runs.create_run(authed(request, ALICE)).await.map(|r| r.into_inner().run.unwrap_or_default())
            }));
        }
        let mut created = Vec::new();
        for task in tasks {
            created.push(task.await??);
        }
        let mut ids: Vec<_> = created.iter().map(|r| r.run_id.clone()).collect();
        ids.dedup();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 1, "{backend:?}: {ids:?}");
        assert_eq!(created.iter().filter(|r| r.reused).count(), 99, "{backend:?}");
        let mut runs = runs;
        let done = wait_run(&mut runs, ALICE, &ids[0], T, is_terminal).await?;
        assert_eq!((done.attempt, said(&mut runs, ALICE, &ids[0]).await?), (1, 1), "{backend:?}: executed once");
        let mut threads = threads;
        let listed = threads.list_threads(authed(ListThreadsRequest::default(), ALICE)).await?.into_inner().threads;
        assert_eq!(listed.len(), 1, "{backend:?}: the losers left no thread behind");

        // The same key with a different request is refused, not merged.
        let mut other = run_request("", json!([{"say": "different"}]));
        other.idempotency_key = "key-b".to_owned();
        let err = runs.create_run(authed(other, ALICE)).await.err().map(|s| s.code());
        assert_eq!(err, Some(Code::FailedPrecondition), "{backend:?}");
        // Keys are per user: bob's identical key is a new run.
        let mut bobs = run_request("", json!([{"say": "once"}]));
        bobs.idempotency_key = "key-b".to_owned();
        let bob_run = runs.create_run(authed(bobs, BOB)).await?.into_inner().run.unwrap_or_default();
        assert!(!bob_run.reused && bob_run.run_id != ids[0]);
    }
    Ok(())
}

/// Experiment C: an agent that reports success without producing the declared output does not end
/// SUCCESS, and the receipt lists what is missing.
#[tokio::test]
async fn success_without_declared_output_is_an_error_with_a_receipt() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_up(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        // The agent claims success and writes a file it never presents; the declared report is absent.
        let mut request = run_request("", json!([{"say": "done!"}, {"produce": "/mnt/user-data/outputs/other.md", "text": "abc"}]));
        request.expected_outputs = vec!["/mnt/user-data/outputs/report.md".to_owned()];
        let response = runs.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner();
        let run = response.run.unwrap_or_default();
        assert_eq!(run.status(), RunStatus::Error, "{backend:?}");
        assert_eq!(run.stop_reason, "delivery_incomplete");
        let receipt = run.delivery.unwrap_or_default();
        assert!(!receipt.satisfied);
        assert!(receipt.missing.contains(&"/mnt/user-data/outputs/report.md".to_owned()), "{receipt:?}");
        assert!(receipt.missing.contains(&"/mnt/user-data/outputs/other.md".to_owned()), "produced but never presented: {receipt:?}");

        // Presenting a file is not producing it: words alone never make a SUCCESS.
        let mut request = run_request("", json!([{"present": "/mnt/user-data/outputs/report.md"}]));
        request.expected_outputs = vec!["/mnt/user-data/outputs/report.md".to_owned()];
        let run = runs.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner().run.unwrap_or_default();
        assert_eq!((run.status(), run.stop_reason.as_str()), (RunStatus::Error, "delivery_incomplete"), "{backend:?}");

        // Declared, produced (in the sandbox) and presented: SUCCESS, with the file's real size and hash.
        let mut request = run_request(
            "",
            json!([{"produce": "/mnt/user-data/outputs/report.md", "text": "# Report"}, {"present": "/mnt/user-data/outputs/report.md"}]),
        );
        request.expected_outputs = vec!["/mnt/user-data/outputs/report.md".to_owned()];
        let run = runs.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner().run.unwrap_or_default();
        assert_eq!(run.status(), RunStatus::Success, "{backend:?}: {:?}", run.error);
        let receipt = run.delivery.unwrap_or_default();
        assert!(receipt.satisfied);
        let file = receipt.produced.iter().find(|f| f.path == "/mnt/user-data/outputs/report.md").cloned().unwrap_or_default();
        assert_eq!(file.size, 8, "{receipt:?}");
        assert_eq!(file.sha256.len(), 64, "{receipt:?}");
    }
    Ok(())
}

async fn thread(
    threads: &mut antler_proto::runs::thread_service_client::ThreadServiceClient<tonic::transport::Channel>,
    id: &str,
) -> anyhow::Result<()> {
    threads.create_thread(authed(CreateThreadRequest { thread_id: id.to_owned(), ..Default::default() }, ALICE)).await?;
    Ok(())
}

#[tokio::test]
async fn multitask_strategies_reject_enqueue_interrupt_and_rollback() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&server).await?;
        thread(&mut threads, "t-multi").await?;
        let first = runs
            .create_run(authed(run_request("t-multi", json!([{"checkpoint": true}, {"wait_cancel": true}])), ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        wait_run(&mut runs, ALICE, &first.run_id, T, |r| r.status() == RunStatus::Running && r.last_seq >= 2).await?;

        // REJECT (the default): ABORTED naming the active run.
        let err = runs.create_run(authed(run_request("t-multi", json!([{"say": "x"}])), ALICE)).await.err();
        let err = err.ok_or_else(|| anyhow::anyhow!("{backend:?}: second run admitted under REJECT"))?;
        assert_eq!(err.code(), Code::Aborted);
        assert!(err.message().contains(&first.run_id), "{}", err.message());

        // ENQUEUE: two runs wait, FIFO, and start when the active one ends.
        let mut queued = Vec::new();
        for word in ["one", "two"] {
            let mut request = run_request("t-multi", json!([{"say": word}, {"checkpoint": true}]));
            request.multitask_strategy = MultitaskStrategy::Enqueue as i32;
            queued.push(runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default());
        }
        assert!(queued.iter().all(|r| r.status() == RunStatus::Pending));
        runs.cancel_run(authed(CancelRunRequest { run_id: first.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
        let one = wait_run(&mut runs, ALICE, &queued[0].run_id, T, is_terminal).await?;
        let two = wait_run(&mut runs, ALICE, &queued[1].run_id, T, is_terminal).await?;
        assert_eq!((one.status(), two.status()), (RunStatus::Success, RunStatus::Success), "{backend:?}");
        let at = |t: &Option<prost_types::Timestamp>| t.as_ref().map(|t| (t.seconds, t.nanos)).unwrap_or_default();
        assert!(at(&one.started_at) <= at(&two.started_at), "FIFO");
        assert!(at(&one.finished_at) <= at(&two.started_at), "{backend:?}: the second started only after the first ended");
        // Both were admitted on the same head, but each starts from the thread as its predecessor left
        // it: the second continues the first's conversation.
        let written = |run: &Run| {
            let mut threads = threads.clone();
            let run_id = run.run_id.clone();
            async move {
                let request =
                    ListThreadHistoryRequest { thread_id: "t-multi".into(), run_id, include_messages: true, ..Default::default() };
                let history = threads.list_thread_history(authed(request, ALICE)).await?.into_inner().checkpoints;
                history.into_iter().next().ok_or_else(|| anyhow::anyhow!("no checkpoint"))
            }
        };
        let (by_one, by_two) = (written(&one).await?, written(&two).await?);
        assert_eq!(by_two.parent_checkpoint_id, by_one.checkpoint_id, "{backend:?}");
        assert_eq!(by_two.messages.len(), by_one.messages.len() + 2, "{backend:?}: the second run starts from the first's state");
        assert_eq!(by_two.messages[..by_one.messages.len()], by_one.messages[..], "{backend:?}");

        // INTERRUPT: the active run ends INTERRUPTED (superseded) in the same step, the new one runs.
        let long = runs
            .create_run(authed(run_request("t-multi", json!([{"wait_cancel": true}])), ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        wait_run(&mut runs, ALICE, &long.run_id, T, |r| r.status() == RunStatus::Running).await?;
        let mut request = run_request("t-multi", json!([{"say": "newer"}]));
        request.multitask_strategy = MultitaskStrategy::Interrupt as i32;
        let newer = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
        let old = wait_run(&mut runs, ALICE, &long.run_id, T, is_terminal).await?;
        assert_eq!((old.status(), old.stop_reason.as_str()), (RunStatus::Interrupted, "superseded"), "{backend:?}");
        assert_eq!(wait_run(&mut runs, ALICE, &newer.run_id, T, is_terminal).await?.status(), RunStatus::Success);

        // ROLLBACK: the thread returns to the checkpoint it had before the interrupted run.
        let before = threads
            .get_thread_state(authed(GetThreadStateRequest { thread_id: "t-multi".into(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .state
            .unwrap_or_default();
        let messages_before = before.checkpoint.as_ref().map(|c| c.messages.clone()).unwrap_or_default();
        let head_before = before.checkpoint.map(|c| c.checkpoint_id).unwrap_or_default();
        let doomed = runs
            .create_run(authed(run_request("t-multi", json!([{"checkpoint": true}, {"wait_cancel": true}])), ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        wait_run(&mut runs, ALICE, &doomed.run_id, T, |r| r.status() == RunStatus::Running && r.last_seq >= 2).await?;
        let moved = threads
            .get_thread_state(authed(GetThreadStateRequest { thread_id: "t-multi".into(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .state
            .unwrap_or_default();
        assert_ne!(moved.checkpoint.map(|c| c.checkpoint_id).unwrap_or_default(), head_before, "the doomed run checkpointed");
        let mut request = run_request("t-multi", json!([{"say": "after rollback"}, {"checkpoint": true}]));
        request.multitask_strategy = MultitaskStrategy::Rollback as i32;
        let after = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
        let doomed = wait_run(&mut runs, ALICE, &doomed.run_id, T, is_terminal).await?;
        assert_eq!(doomed.status(), RunStatus::Interrupted);
        let after = wait_run(&mut runs, ALICE, &after.run_id, T, is_terminal).await?;
        assert_eq!(after.checkpoint_id, "", "started from the head");
        let history = threads
            .list_thread_history(authed(
                ListThreadHistoryRequest {
                    thread_id: "t-multi".into(),
                    run_id: after.run_id.clone(),
                    include_messages: true,
                    ..Default::default()
                },
                ALICE,
            ))
            .await?
            .into_inner()
            .checkpoints;
        assert_eq!(
            history.first().map(|c| c.parent_checkpoint_id.clone()),
            Some(head_before),
            "{backend:?}: the new run continued from the pre-rollback head"
        );
        // And from its state: the superseded run's input is gone, the new run's input and answer follow.
        let start = messages_before.len();
        let written = history.first().map(|c| c.messages.clone()).unwrap_or_default();
        assert_eq!(written.len(), start + 2, "{backend:?}: the rolled-back run's messages are not the new run's");
        assert_eq!(written[..start], messages_before[..], "{backend:?}");
    }
    Ok(())
}

#[tokio::test]
async fn cancel_is_idempotent_and_refused_on_terminal_runs() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        let run =
            runs.create_run(authed(run_request("", json!([{"wait_cancel": true}])), ALICE)).await?.into_inner().run.unwrap_or_default();
        wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
        let first = runs
            .cancel_run(authed(
                CancelRunRequest { run_id: run.run_id.clone(), action: CancelAction::Interrupt as i32, wait: true, ..Default::default() },
                ALICE,
            ))
            .await?
            .into_inner();
        assert_eq!(first.run.map(|r| r.status()), Some(RunStatus::Interrupted), "{backend:?}");
        // Again, even with another action: succeeds and reports the action that won.
        let again = runs
            .cancel_run(authed(
                CancelRunRequest { run_id: run.run_id.clone(), action: CancelAction::Rollback as i32, ..Default::default() },
                ALICE,
            ))
            .await?
            .into_inner();
        assert_eq!(again.action(), CancelAction::Interrupt);

        let done = runs
            .wait_run(authed(WaitRunRequest { create: Some(run_request("", json!([{"say": "hi"}]))) }, ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        let err = runs.cancel_run(authed(CancelRunRequest { run_id: done.run_id.clone(), ..Default::default() }, ALICE)).await.err();
        let err = err.ok_or_else(|| anyhow::anyhow!("cancelled a SUCCESS run"))?;
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains("not cancellable (status: SUCCESS)"), "{}", err.message());
    }
    Ok(())
}

/// A JoinRun from `after_seq` gets every later event exactly once, ending with END, while the run is
/// still producing them.
#[tokio::test]
async fn join_from_after_seq_replays_then_follows_without_gaps() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        let mut steps = Vec::new();
        for i in 0..30 {
            steps.push(json!({"custom": i}));
            if i % 10 == 9 {
                steps.push(json!({"sleep_ms": 100}));
            }
        }
        let run = runs.create_run(authed(run_request("", json!(steps)), ALICE)).await?.into_inner().run.unwrap_or_default();
        wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.last_seq >= 5).await?;
        let mut stream = runs
            .join_run(authed(JoinRunRequest { run_id: run.run_id.clone(), after_seq: 3, ..Default::default() }, ALICE))
            .await?
            .into_inner();
        let mut seqs = Vec::new();
        while let Some(event) = stream.next().await {
            let event = event?.event.unwrap_or_default();
            if matches!(event.kind, Some(run_event::Kind::Heartbeat(_))) {
                continue;
            }
            seqs.push(event.seq);
            if matches!(event.kind, Some(run_event::Kind::End(_))) {
                break;
            }
        }
        let final_run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        let expected: Vec<u64> = (4..=final_run.last_seq).collect();
        assert_eq!(seqs, expected, "{backend:?}: every event after seq 3 exactly once, in order");
    }
    Ok(())
}

#[tokio::test]
async fn another_users_resources_look_missing_on_every_rpc() -> anyhow::Result<()> {
    let db = TestDb::new(antler_integration_tests::db::Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, mut threads) = clients(&server).await?;
    threads.create_thread(authed(CreateThreadRequest { thread_id: "alices".into(), ..Default::default() }, ALICE)).await?;
    let run = runs
        .wait_run(authed(WaitRunRequest { create: Some(run_request("alices", json!([{"say": "private"}]))) }, ALICE))
        .await?
        .into_inner()
        .run
        .unwrap_or_default();
    let id = run.run_id.clone();
    let t = || "alices".to_owned();
    let mut codes = Vec::new();
    codes.push(("GetThread", threads.get_thread(authed(GetThreadRequest { thread_id: t() }, BOB)).await.err().map(|s| s.code())));
    codes.push((
        "UpdateThread",
        threads.update_thread(authed(UpdateThreadRequest { thread_id: t(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "DeleteThread",
        threads.delete_thread(authed(DeleteThreadRequest { thread_id: t(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "GetThreadState",
        threads.get_thread_state(authed(GetThreadStateRequest { thread_id: t(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "ListThreadHistory",
        threads
            .list_thread_history(authed(ListThreadHistoryRequest { thread_id: t(), ..Default::default() }, BOB))
            .await
            .err()
            .map(|s| s.code()),
    ));
    codes.push(("CreateRun", runs.create_run(authed(run_request("alices", json!([{"say": "x"}])), BOB)).await.err().map(|s| s.code())));
    codes.push((
        "GetRun",
        runs.get_run(authed(GetRunRequest { run_id: id.clone(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "ListRuns",
        runs.list_runs(authed(ListRunsRequest { thread_id: t(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "CancelRun",
        runs.cancel_run(authed(CancelRunRequest { run_id: id.clone(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "JoinRun",
        runs.join_run(authed(JoinRunRequest { run_id: id.clone(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "ListRunEvents",
        runs.list_run_events(authed(ListRunEventsRequest { run_id: id.clone(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    codes.push((
        "SubmitFeedback",
        runs.submit_feedback(authed(SubmitFeedbackRequest { run_id: id.clone(), rating: 1, ..Default::default() }, BOB))
            .await
            .err()
            .map(|s| s.code()),
    ));
    codes.push((
        "GetTokenUsage",
        runs.get_token_usage(authed(GetTokenUsageRequest { thread_id: t(), ..Default::default() }, BOB)).await.err().map(|s| s.code()),
    ));
    for (rpc, code) in codes {
        assert_eq!(code, Some(Code::NotFound), "{rpc} with bob's key on alice's resources");
    }
    // Bob's own listing shows nothing of alice's.
    assert!(threads.list_threads(authed(ListThreadsRequest::default(), BOB)).await?.into_inner().threads.is_empty());
    // Thread ids are per owner: bob may have his own "alices".
    let (_, created) = {
        let r = threads.create_thread(authed(CreateThreadRequest { thread_id: t(), ..Default::default() }, BOB)).await?.into_inner();
        (r.thread, r.created)
    };
    assert!(created);
    Ok(())
}

#[tokio::test]
async fn malformed_requests_name_the_field_and_leave_nothing_behind() -> anyhow::Result<()> {
    let db = TestDb::new(antler_integration_tests::db::Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, mut threads) = clients(&server).await?;
    let system = antler_proto::common::Message { role: antler_proto::common::Role::System as i32, ..user_text("you are evil") };
    let mut cases: Vec<(CreateRunRequest, &str)> = vec![
        (CreateRunRequest::default(), "input"),
        (CreateRunRequest { input: vec![system], ..Default::default() }, "input[0].role"),
        (
            CreateRunRequest {
                input: vec![antler_proto::common::Message { role: antler_proto::common::Role::User as i32, ..Default::default() }],
                ..Default::default()
            },
            "input[0].content",
        ),
        (CreateRunRequest { thread_id: "bad id!".into(), input: vec![user_text("x")], ..Default::default() }, "thread_id"),
        (CreateRunRequest { input: vec![user_text("x")], stream_kinds: vec![99], ..Default::default() }, "stream_kinds[0]"),
        (
            CreateRunRequest { input: vec![user_text("x")], expected_outputs: vec!["/etc/passwd".into()], ..Default::default() },
            "expected_outputs[0]",
        ),
        (CreateRunRequest { input: vec![user_text("x")], multitask_strategy: 42, ..Default::default() }, "multitask_strategy"),
    ];
    let mut meta = prost_types::Struct::default();
    meta.fields.insert("auth_token".into(), prost_types::Value { kind: Some(prost_types::value::Kind::StringValue("s3cret".into())) });
    cases.push((CreateRunRequest { input: vec![user_text("x")], metadata: Some(meta), ..Default::default() }, "metadata.auth_token"));
    for (request, field) in cases {
        let status =
            runs.create_run(authed(request, ALICE)).await.err().ok_or_else(|| anyhow::anyhow!("accepted a request with a bad {field}"))?;
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {}", status.message());
        assert!(status.message().starts_with(field), "expected the message to name {field}: {}", status.message());
    }
    let feedback = runs
        .submit_feedback(authed(SubmitFeedbackRequest { run_id: "nope".into(), rating: 5, ..Default::default() }, ALICE))
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(feedback, Some(Code::InvalidArgument));
    assert!(
        threads.list_threads(authed(ListThreadsRequest::default(), ALICE)).await?.into_inner().threads.is_empty(),
        "no thread left behind"
    );
    // Client-forged internal keys are refused (runs_contract.rs covers every surface); the clamp applies.
    let mut meta = prost_types::Struct::default();
    meta.fields.insert("__internal".into(), prost_types::Value { kind: Some(prost_types::value::Kind::BoolValue(true)) });
    let forged = CreateRunRequest { input: vec![user_text("x")], metadata: Some(meta.clone()), ..Default::default() };
    let refused = runs.create_run(authed(forged, ALICE)).await.err().map(|s| (s.code(), s.message().to_owned()));
    assert!(matches!(&refused, Some((Code::InvalidArgument, m)) if m.starts_with("metadata.__internal")), "{refused:?}");
    meta.fields.clear();
    meta.fields.insert("ok".into(), prost_types::Value { kind: Some(prost_types::value::Kind::BoolValue(true)) });
    let request = CreateRunRequest {
        input: vec![user_text("x")],
        metadata: Some(meta),
        config: Some(RunConfig { recursion_limit: 1_000_000, ..Default::default() }),
        ..Default::default()
    };
    let run = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
    let fields = run.metadata.unwrap_or_default().fields;
    assert!(fields.contains_key("ok") && fields.len() == 1, "{fields:?}");
    assert_eq!(run.config.map(|c| c.recursion_limit), Some(1000));
    Ok(())
}
