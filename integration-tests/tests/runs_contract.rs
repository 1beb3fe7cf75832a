//! Promises of the runs contract that an acceptance run found broken, each tested as a class: repeated
//! cancels, cancelled runs and FINALIZING, JoinRun at or past the end, keys a client may not set on
//! any surface, why a run was interrupted, empty required ids, the request size limit, stop reasons,
//! and what DeleteThread leaves behind.

use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::*;
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;

const T: Duration = Duration::from_secs(20);

fn value(v: serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        serde_json::Value::Object(map) => Kind::StructValue(object(map)),
        _ => Kind::NullValue(0),
    };
    prost_types::Value { kind: Some(kind) }
}

fn object(map: serde_json::Map<String, serde_json::Value>) -> prost_types::Struct {
    prost_types::Struct { fields: map.into_iter().map(|(k, v)| (k, value(v))).collect() }
}

fn structure(v: serde_json::Value) -> prost_types::Struct {
    match v {
        serde_json::Value::Object(map) => object(map),
        _ => prost_types::Struct::default(),
    }
}

async fn get(runs: &mut run_service_client::RunServiceClient<tonic::transport::Channel>, run_id: &str) -> anyhow::Result<Run> {
    Ok(runs
        .get_run(authed(GetRunRequest { run_id: run_id.to_owned(), ..Default::default() }, ALICE))
        .await?
        .into_inner()
        .run
        .unwrap_or_default())
}

/// The first cancel wins; every repeat — right after it, concurrently, with another action, after the
/// end — answers OK with the same action, and the run goes RUNNING → INTERRUPTED without FINALIZING
/// and without a receipt. Ten runs per backend: the old code failed most of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_cancel_answers_ok_with_the_first_outcome_and_never_sees_finalizing() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        for round in 0..10 {
            let run =
                runs.create_run(authed(run_request("", json!([{"wait_cancel": true}])), ALICE)).await?.into_inner().run.unwrap_or_default();
            wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
            // Watch every status the run passes through while it stops.
            let watcher = {
                let (mut runs, run_id) = (runs.clone(), run.run_id.clone());
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    loop {
                        let run = get(&mut runs, &run_id).await?;
                        if seen.last() != Some(&run.status()) {
                            seen.push(run.status());
                        }
                        if is_terminal(&run) {
                            return anyhow::Ok(seen);
                        }
                    }
                })
            };
            let cancel =
                |action: CancelAction| CancelRunRequest { run_id: run.run_id.clone(), action: action as i32, ..Default::default() };
            let first = runs.cancel_run(authed(cancel(CancelAction::Interrupt), ALICE)).await?.into_inner();
            assert_eq!(first.action(), CancelAction::Interrupt);
            let mut repeats = Vec::new();
            for i in 0..8 {
                let mut runs = runs.clone();
                let request = cancel(if i % 2 == 0 { CancelAction::Interrupt } else { CancelAction::Rollback });
                repeats.push(tokio::spawn(async move { runs.cancel_run(authed(request, ALICE)).await }));
            }
            for repeat in repeats {
                let answer = repeat.await?.map_err(|s| anyhow::anyhow!("{backend:?} round {round}: a repeated cancel failed: {s:?}"))?;
                assert_eq!(answer.into_inner().action(), CancelAction::Interrupt, "{backend:?}: the first action stands");
            }
            let seen = watcher.await??;
            assert!(!seen.contains(&RunStatus::Finalizing), "{backend:?} round {round}: a cancelled run passed FINALIZING: {seen:?}");
            let after = runs.cancel_run(authed(cancel(CancelAction::Rollback), ALICE)).await?.into_inner();
            let ended = after.run.unwrap_or_default();
            assert_eq!(
                (ended.status(), ended.stop_reason.as_str(), after.action),
                (RunStatus::Interrupted, "cancelled", CancelAction::Interrupt as i32)
            );
            assert!(ended.delivery.is_none(), "{backend:?}: no receipt for a cancelled run");
            let events = run_events(&mut runs, ALICE, &run.run_id).await?;
            assert!(!events.iter().any(|e| matches!(e.kind, Some(run_event::Kind::Delivery(_)))), "{backend:?}: {events:?}");
        }
        // A run that completed is not cancellable, also on a retry.
        let done = run_to_end(&mut runs, run_request("", json!([{"say": "done"}])), T).await?;
        for _ in 0..2 {
            let refused =
                runs.cancel_run(authed(CancelRunRequest { run_id: done.run_id.clone(), ..Default::default() }, ALICE)).await.err();
            assert_eq!(refused.map(|s| s.code()), Some(Code::FailedPrecondition), "{backend:?}");
        }
    }
    Ok(())
}

/// JoinRun at or past a finished run's last event closes at once with nothing; a join past the end of
/// an active run closes when the run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_run_at_or_past_the_end_closes() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, _) = clients(&server).await?;
    let done = run_to_end(&mut runs, run_request("", json!([{"say": "hi"}])), T).await?;
    for after_seq in [done.last_seq, done.last_seq + 1, done.last_seq + 1000] {
        let join = JoinRunRequest { run_id: done.run_id.clone(), after_seq, ..Default::default() };
        let mut stream = runs.join_run(authed(join, ALICE)).await?.into_inner();
        let next = tokio::time::timeout(Duration::from_secs(3), stream.next()).await;
        assert!(matches!(next, Ok(None)), "after_seq {after_seq} of {}: expected the stream to close at once, got {next:?}", done.last_seq);
    }

    let active =
        runs.create_run(authed(run_request("", json!([{"wait_cancel": true}])), ALICE)).await?.into_inner().run.unwrap_or_default();
    wait_run(&mut runs, ALICE, &active.run_id, T, |r| r.status() == RunStatus::Running).await?;
    let join = JoinRunRequest {
        run_id: active.run_id.clone(),
        after_seq: 10_000,
        on_disconnect: OnDisconnect::Continue as i32,
        ..Default::default()
    };
    let mut stream = runs.join_run(authed(join, ALICE)).await?.into_inner();
    runs.cancel_run(authed(CancelRunRequest { run_id: active.run_id.clone(), ..Default::default() }, ALICE)).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(None) => break,
            Ok(Some(item)) => {
                let kind = item?.event.and_then(|e| e.kind);
                assert!(matches!(kind, Some(run_event::Kind::Heartbeat(_))), "only heartbeats lie past seq 10000: {kind:?}");
            }
            Err(_) => anyhow::bail!("the stream stayed open after the run ended"),
        }
    }
    Ok(())
}

/// A run stopped because its client went away says so: `client_disconnected`, for StreamRun and
/// WaitRun, where an explicit cancel says `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_by_a_departed_client_ends_client_disconnected() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, _) = clients(&server).await?;
    let create = run_request("", json!([{"say": "started"}, {"wait_cancel": true}]));
    let mut stream = runs.stream_run(authed(StreamRunRequest { create: Some(create.clone()) }, ALICE)).await?.into_inner();
    let run_id = stream.next().await.ok_or_else(|| anyhow::anyhow!("empty stream"))??.event.unwrap_or_default().run_id;
    drop(stream);
    let ended = wait_run(&mut runs, ALICE, &run_id, T, is_terminal).await?;
    assert_eq!((ended.status(), ended.stop_reason.as_str()), (RunStatus::Interrupted, "client_disconnected"), "StreamRun");

    let mut waiting = runs.clone();
    let wait = tokio::spawn(async move { waiting.wait_run(authed(WaitRunRequest { create: Some(create) }, ALICE)).await });
    let listed = tokio::time::timeout(T, async {
        loop {
            let page = runs.list_runs(authed(ListRunsRequest::default(), ALICE)).await?.into_inner().runs;
            if let Some(run) = page.into_iter().find(|r| r.status() == RunStatus::Running) {
                return anyhow::Ok(run);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await??;
    wait.abort();
    let ended = wait_run(&mut runs, ALICE, &listed.run_id, T, is_terminal).await?;
    assert_eq!((ended.status(), ended.stop_reason.as_str()), (RunStatus::Interrupted, "client_disconnected"), "WaitRun");
    Ok(())
}

/// Server-owned and credential keys are refused (or, in message metadata, stripped) on every surface
/// a client writes a map to, with the field named.
#[tokio::test]
async fn reserved_and_credential_keys_are_refused_on_every_surface() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, mut threads) = clients(&server).await?;
    let refused = |result: Result<(), tonic::Status>, field: &str| {
        let status = result.err().unwrap_or_else(|| tonic::Status::ok(""));
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().starts_with(field), "expected the message to name {field}: {}", status.message());
    };

    for (key, field) in [
        ("thread_id", "config.context.thread_id"),
        ("run_id", "config.context.run_id"),
        ("is_internal", "config.context.is_internal"),
        ("user_id", "config.context.user_id"),
        ("auth_token", "config.context.auth_token"),
        ("__checkpoint_mode", "config.context.__checkpoint_mode"),
        ("antler_user", "config.context.antler_user"),
        ("favourite_colour", "config.context.favourite_colour"),
    ] {
        let mut request = run_request("", json!([{"say": "x"}]));
        request.config = Some(RunConfig { context: Some(structure(json!({ key: "v" }))), ..Default::default() });
        refused(runs.create_run(authed(request, ALICE)).await.map(|_| ()), field);
    }
    for (metadata, field) in [
        (json!({"auth_token": "x"}), "metadata.auth_token"),
        (json!({"antler_owner": "x"}), "metadata.antler_owner"),
        (json!({"__internal": 1}), "metadata.__internal"),
        (json!({"user_id": "mallory"}), "metadata.user_id"),
        (json!({"cfg": {"GitHub_Token": "x"}}), "metadata.cfg.GitHub_Token"),
    ] {
        let mut request = run_request("", json!([{"say": "x"}]));
        request.metadata = Some(structure(metadata.clone()));
        refused(runs.create_run(authed(request, ALICE)).await.map(|_| ()), field);
        let create = CreateThreadRequest { metadata: Some(structure(metadata.clone())), ..Default::default() };
        refused(threads.create_thread(authed(create, ALICE)).await.map(|_| ()), field);
        threads.create_thread(authed(CreateThreadRequest { thread_id: "t-keys".into(), ..Default::default() }, ALICE)).await?;
        let update = UpdateThreadRequest { thread_id: "t-keys".into(), metadata: Some(structure(metadata)), ..Default::default() };
        refused(threads.update_thread(authed(update, ALICE)).await.map(|_| ()), field);
    }
    let mut request = run_request("", json!([{"say": "x"}]));
    request.input[0].metadata = Some(structure(json!({"api_key": "x"})));
    refused(runs.create_run(authed(request, ALICE)).await.map(|_| ()), "input[0].metadata.api_key");

    // Allowed context keys pass; reserved keys of a message's metadata are stripped, the rest kept.
    let mut request = run_request("", json!([{"checkpoint": true}]));
    request.config = Some(RunConfig { context: Some(structure(json!({"locale": "de-DE"}))), ..Default::default() });
    request.input[0].metadata = Some(structure(json!({"antler_seen": true, "__x": 1, "owner": "m", "topic": "kept"})));
    request.metadata = Some(structure(json!({"topic": "fine"})));
    let run = run_to_end(&mut runs, request, T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}", run.error);
    let state = threads
        .get_thread_state(authed(GetThreadStateRequest { thread_id: run.thread_id.clone(), ..Default::default() }, ALICE))
        .await?
        .into_inner()
        .state
        .unwrap_or_default();
    let stored = state.checkpoint.unwrap_or_default().messages.first().and_then(|m| m.metadata.clone()).unwrap_or_default();
    assert_eq!(stored.fields.keys().collect::<Vec<_>>(), ["topic"], "{stored:?}");
    Ok(())
}

/// Every RPC of the runs service with a required id answers INVALID_ARGUMENT naming it when it is
/// empty, never NOT_FOUND.
#[tokio::test]
async fn empty_required_ids_name_the_field() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, mut threads) = clients(&server).await?;
    let check = |result: Result<(), tonic::Status>, rpc: &str, field: &str| {
        let status = result.err().unwrap_or_else(|| tonic::Status::ok(""));
        assert_eq!(status.code(), Code::InvalidArgument, "{rpc}: {status:?}");
        assert!(status.message().starts_with(&format!("{field}:")), "{rpc}: {}", status.message());
    };
    check(runs.get_run(authed(GetRunRequest::default(), ALICE)).await.map(|_| ()), "GetRun", "run_id");
    check(runs.cancel_run(authed(CancelRunRequest::default(), ALICE)).await.map(|_| ()), "CancelRun", "run_id");
    check(runs.join_run(authed(JoinRunRequest::default(), ALICE)).await.map(|_| ()), "JoinRun", "run_id");
    check(runs.list_run_events(authed(ListRunEventsRequest::default(), ALICE)).await.map(|_| ()), "ListRunEvents", "run_id");
    check(
        runs.submit_feedback(authed(SubmitFeedbackRequest { rating: 1, ..Default::default() }, ALICE)).await.map(|_| ()),
        "SubmitFeedback",
        "run_id",
    );
    check(runs.get_token_usage(authed(GetTokenUsageRequest::default(), ALICE)).await.map(|_| ()), "GetTokenUsage", "thread_id");
    check(runs.delete_feedback(authed(DeleteFeedbackRequest::default(), ALICE)).await.map(|_| ()), "DeleteFeedback", "run_id");
    check(threads.get_thread(authed(GetThreadRequest::default(), ALICE)).await.map(|_| ()), "GetThread", "thread_id");
    check(threads.update_thread(authed(UpdateThreadRequest::default(), ALICE)).await.map(|_| ()), "UpdateThread", "thread_id");
    check(threads.delete_thread(authed(DeleteThreadRequest::default(), ALICE)).await.map(|_| ()), "DeleteThread", "thread_id");
    check(threads.get_thread_state(authed(GetThreadStateRequest::default(), ALICE)).await.map(|_| ()), "GetThreadState", "thread_id");
    check(
        threads.list_thread_history(authed(ListThreadHistoryRequest::default(), ALICE)).await.map(|_| ()),
        "ListThreadHistory",
        "thread_id",
    );
    Ok(())
}

/// The 4 MiB limit the proto states is the one enforced (runs.max_request_bytes), below the server's
/// 16 MiB message limit; a plain success has an empty stop reason; a failed run's stop reason is its
/// error code.
#[tokio::test]
async fn request_size_limit_and_stop_reasons_match_the_contract() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_runs(&db, "")?;
    let (mut runs, _) = clients(&server).await?;
    let big = CreateRunRequest { input: vec![user_text(&"x".repeat(5 << 20))], ..Default::default() };
    let status = runs.create_run(authed(big, ALICE)).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("runs.max_request_bytes"), "{}", status.message());
    let fits = CreateRunRequest { input: vec![user_text(&"x".repeat(3 << 20))], ..Default::default() };
    let fits = run_to_end(&mut runs, fits, T).await?;
    assert_eq!(
        (fits.status(), fits.stop_reason.as_str()),
        (RunStatus::Success, ""),
        "a 3 MiB request is fine; plain success has no stop reason"
    );

    let failed = run_to_end(&mut runs, run_request("", json!([{"fail": "boom"}])), T).await?;
    let code = failed.error.clone().unwrap_or_default().code;
    assert_eq!((failed.status(), failed.stop_reason.as_str()), (RunStatus::Error, code.as_str()));
    Ok(())
}

/// DeleteThread deletes the thread's sandbox too: GetSandbox answers NOT_FOUND and no directory stays.
#[tokio::test]
async fn deleting_a_thread_deletes_its_sandbox() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let server = start("antler", Launch::new(["up"]).config(config(&db, "")).data_dir(data.path()))?;
    let (mut runs, mut threads) = clients(&server).await?;
    let path = "/mnt/user-data/outputs/a.txt";
    let run = run_to_end(&mut runs, run_request("", json!([{"produce": path, "text": "x"}, {"present": path}])), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}", run.error);
    let thread_dir = data.path().join("sandbox/users/alice/threads").join(&run.thread_id);
    assert!(thread_dir.is_dir(), "{thread_dir:?}");
    threads.delete_thread(authed(DeleteThreadRequest { thread_id: run.thread_id.clone(), ..Default::default() }, ALICE)).await?;
    let mut sandbox = antler_proto::sandbox::sandbox_service_client::SandboxServiceClient::new(server.channel().await?);
    let status = sandbox
        .get_sandbox(authed(antler_proto::sandbox::GetSandboxRequest { thread_id: run.thread_id.clone() }, ALICE))
        .await
        .err()
        .unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(!thread_dir.exists(), "{thread_dir:?} stayed on disk");
    Ok(())
}

/// A stored request that no longer decodes fails its run with `corrupt_request` instead of running an
/// empty request in its place.
#[tokio::test]
async fn a_corrupt_stored_request_fails_the_run_instead_of_running_an_empty_one() -> anyhow::Result<()> {
    use sea_orm::ConnectionTrait;
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "  max_concurrent_runs: 1\n")?;
        let (mut runs, _) = clients(&server).await?;
        let blocker = hold_the_only_slot(&mut runs).await?;
        let run = runs.create_run(authed(run_request("", json!([{"say": "never"}])), ALICE)).await?.into_inner().run.unwrap_or_default();
        let conn = db.connect().await?;
        let garbage = if backend == Backend::Postgres { "'\\xff'::bytea" } else { "x'ff'" };
        conn.execute_raw(sea_orm::Statement::from_string(
            conn.get_database_backend(),
            format!("UPDATE runs SET request = {garbage} WHERE run_id = '{}'", run.run_id),
        ))
        .await?;
        runs.cancel_run(authed(CancelRunRequest { run_id: blocker.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
        let ended = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        let error = ended.error.clone().unwrap_or_default();
        assert_eq!((ended.status(), error.code.as_str()), (RunStatus::Error, "corrupt_request"), "{backend:?}: {ended:?}");
        assert!(error.message.contains("could not be decoded"), "{}", error.message);
        assert_eq!(said(&mut runs, ALICE, &run.run_id).await?, 0, "{backend:?}: nothing ran");
    }
    Ok(())
}

/// `create_thread` (LangGraph's if_not_exists=create) makes the named thread in the run's admission
/// transaction: a refused run leaves no thread, concurrent creators of one id share one thread, and
/// an existing thread is used as it is (its multitask policy applies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_thread_makes_the_named_thread_with_the_run_or_not_at_all() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&server).await?;
        let get = |id: &str| GetThreadRequest { thread_id: id.to_owned() };

        let missing = CreateRunRequest { create_thread: false, ..run_request("t-named-1", json!([{"say": "hi"}])) };
        let refused = runs.create_run(authed(missing, ALICE)).await.map(|_| ());
        assert_eq!(refused.map_err(|s| s.code()), Err(Code::NotFound), "{backend:?}: without create_thread a missing thread is NOT_FOUND");

        // Refused inside the admission transaction (after the thread row was written): nothing stays.
        let bad = CreateRunRequest {
            create_thread: true,
            checkpoint_id: "no-such-checkpoint".to_owned(),
            ..run_request("t-named-1", json!([{"say": "hi"}]))
        };
        let refused = runs.create_run(authed(bad, ALICE)).await.map(|_| ());
        assert_eq!(refused.map_err(|s| s.code()), Err(Code::NotFound), "{backend:?}");
        let thread = threads.get_thread(authed(get("t-named-1"), ALICE)).await.map(|_| ());
        assert_eq!(thread.map_err(|s| s.code()), Err(Code::NotFound), "{backend:?}: a refused run left its thread behind");

        // Four creators of one new id at once: one thread, four runs (ENQUEUE queues them).
        let mut tasks = Vec::new();
        for i in 0..4 {
            let mut runs = runs.clone();
            let request = CreateRunRequest {
                create_thread: true,
                multitask_strategy: MultitaskStrategy::Enqueue as i32,
                ..run_request("t-named-2", json!([{"say": format!("hi {i}")}]))
            };
            tasks.push(tokio::spawn(async move {
                runs.create_run(authed(request, ALICE)).await.map(|r| r.into_inner().run.unwrap_or_default())
            }));
        }
        let mut admitted = Vec::new();
        for task in tasks {
            admitted.push(task.await??);
        }
        assert!(admitted.iter().all(|r| r.thread_id == "t-named-2"), "{backend:?}: {admitted:?}");
        for run in &admitted {
            wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        }
        let listed = runs
            .list_runs(authed(ListRunsRequest { thread_id: "t-named-2".to_owned(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .runs;
        assert_eq!(listed.len(), 4, "{backend:?}");
        assert!(listed.iter().all(|r| r.status() == RunStatus::Success), "{backend:?}: {listed:?}");

        // An existing thread is used as it is; bob's create_thread of the same id makes his own.
        let again = CreateRunRequest { create_thread: true, ..run_request("t-named-2", json!([{"say": "again"}])) };
        let run = run_to_end(&mut runs, again, T).await?;
        assert_eq!(run.status(), RunStatus::Success, "{backend:?}");
        let bobs = CreateRunRequest { create_thread: true, ..run_request("t-named-2", json!([{"say": "mine"}])) };
        let bobs = runs.create_run(authed(bobs, BOB)).await?.into_inner().run.unwrap_or_default();
        let bob_runs = runs
            .list_runs(authed(ListRunsRequest { thread_id: "t-named-2".to_owned(), ..Default::default() }, BOB))
            .await?
            .into_inner()
            .runs;
        assert_eq!(bob_runs.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(), vec![bobs.run_id], "{backend:?}: threads are per owner");
    }
    Ok(())
}
