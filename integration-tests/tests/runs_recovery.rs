//! Crashes, fencing and shutdown against real `antler-runs` processes on SQLite and PostgreSQL.

use std::collections::HashSet;
use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::*;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;
use tokio_stream::StreamExt;

const T: Duration = Duration::from_secs(30);

fn says(event: &RunEvent) -> Option<String> {
    match &event.kind {
        Some(run_event::Kind::Message(m)) => m.message.as_ref().and_then(|m| m.content.first()).and_then(|p| match &p.part {
            Some(antler_proto::common::content_part::Part::Text(t)) => Some(t.text.clone()),
            _ => None,
        }),
        _ => None,
    }
}

/// kill -9 of the runs binary mid-run; after a restart the run resumes from its last checkpoint with
/// attempt 2, and a client joining with `after_seq` sees every durable event exactly once.
#[tokio::test]
async fn a_killed_worker_s_run_resumes_from_its_checkpoint_with_attempt_2() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let first = start_runs(&db, "")?;
        let (mut runs, _) = clients(&first).await?;
        let steps = json!([{"say": "before"}, {"checkpoint": true}, {"sleep_ms": 1500}, {"say": "after"}, {"checkpoint": true}]);
        let run = runs.create_run(authed(run_request("", steps), ALICE)).await?.into_inner().run.unwrap_or_default();
        // Wait for the checkpoint (metadata, delta, message, then its VALUES event = seq 4), then kill
        // the process without warning during the sleep that follows.
        let seen = wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.last_seq >= 4).await?;
        assert_eq!(seen.last_seq, 4, "{backend:?}: killed during the sleep, before `after`");
        let mut first = first;
        first.signal(libc::SIGKILL)?;
        first.wait_exit(Duration::from_secs(5))?;

        let second = start_runs(&db, "")?;
        let (mut runs, _) = clients(&second).await?;
        let mut stream = runs
            .join_run(authed(JoinRunRequest { run_id: run.run_id.clone(), after_seq: seen.last_seq, ..Default::default() }, ALICE))
            .await?
            .into_inner();
        let mut joined = Vec::new();
        while let Some(event) = tokio::time::timeout(T, stream.next()).await? {
            let event = event?.event.unwrap_or_default();
            if matches!(event.kind, Some(run_event::Kind::Heartbeat(_))) {
                continue;
            }
            let end = matches!(event.kind, Some(run_event::Kind::End(_)));
            joined.push(event);
            if end {
                break;
            }
        }
        let done = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        assert_eq!(done.status(), RunStatus::Success, "{backend:?}: {:?}", done.error);
        assert_eq!(done.attempt, 2, "{backend:?}");
        let seqs: Vec<u64> = joined.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (seen.last_seq + 1..=done.last_seq).collect::<Vec<_>>(), "{backend:?}: no gap, no duplicate");
        assert!(
            joined.iter().any(|e| matches!(&e.kind, Some(run_event::Kind::Metadata(m)) if m.attempt == 2)),
            "{backend:?}: the takeover announced attempt 2"
        );

        // The whole log: the step before the checkpoint ran once, the one after it once.
        let all = runs
            .list_run_events(authed(ListRunEventsRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .events;
        let said: Vec<String> = all.iter().filter_map(says).collect();
        assert_eq!(said, vec!["before".to_owned(), "after".to_owned()], "{backend:?}");
        let unique: HashSet<u64> = all.iter().map(|e| e.seq).collect();
        assert_eq!(unique.len(), all.len());
    }
    Ok(())
}

/// A worker whose lease renewal fails (here: another worker took the row) stops its agent and makes
/// no durable write afterwards.
#[tokio::test]
async fn a_worker_that_cannot_renew_its_lease_writes_nothing_more() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        let run = runs
            .create_run(authed(run_request("", json!([{"say": "working"}, {"wait_cancel": true}, {"say": "too late"}])), ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        let running = wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running && r.last_seq >= 3).await?;

        let conn = db.connect().await?;
        let far = 4_102_444_800_000i64; // 2100-01-01: the intruder's lease never lapses during the test
        conn.execute_raw(Statement::from_string(
            conn.get_database_backend(),
            format!("UPDATE runs SET owner_worker_id = 'intruder', lease_expires_at = {far} WHERE run_id = '{}'", run.run_id),
        ))
        .await?;
        // The worker notices at its next renewal (every lease/3 = 1 s) and stops.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !server.stderr().contains("lease lost") {
            anyhow::ensure!(std::time::Instant::now() < deadline, "{backend:?}: the worker never noticed:\n{}", server.stderr());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A cancel now reaches the (fenced) local agent; nothing it does may be written.
        runs.cancel_run(authed(CancelRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = runs
            .get_run(authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        assert_eq!(after.status(), RunStatus::Running, "{backend:?}: the fenced worker must not write a status");
        assert_eq!(after.last_seq, running.last_seq, "{backend:?}: no event after fencing");
        assert!(after.delivery.is_none(), "{backend:?}: no receipt after fencing");
    }
    Ok(())
}

/// SIGTERM: running runs get `drain_secs`, then their leases are released (not failed), and the next
/// start resumes them.
#[tokio::test]
async fn shutdown_releases_leases_and_the_next_start_resumes() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let mut first = start_runs(&db, "")?;
        let (mut runs, _) = clients(&first).await?;
        let steps = json!([{"checkpoint": true}, {"sleep_ms": 4000}, {"say": "resumed"}]);
        let run = runs.create_run(authed(run_request("", steps), ALICE)).await?.into_inner().run.unwrap_or_default();
        wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.last_seq >= 2).await?;
        first.signal(libc::SIGTERM)?;
        let status = first.wait_exit(Duration::from_secs(15))?;
        assert!(status.is_some_and(|s| s.success()), "{backend:?}: {status:?}\n{}", first.stderr());
        assert!(first.stderr().contains("lease released"), "{backend:?}:\n{}", first.stderr());

        let second = start_runs(&db, "")?;
        let (mut runs, _) = clients(&second).await?;
        let done = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        assert_eq!((done.status(), done.attempt), (RunStatus::Success, 2), "{backend:?}");
    }
    Ok(())
}

/// A saturated replica gives its next free slot to a run whose owner died before any PENDING run:
/// the run under way (its clients are waiting) is taken over as soon as a slot frees, not when a
/// sweep happens to find one free while the dispatcher keeps refilling the slot with new work.
#[tokio::test]
async fn a_dead_replica_s_run_gets_the_next_free_slot_before_pending_runs() -> anyhow::Result<()> {
    let extra = "  max_concurrent_runs: 1\n";
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let mut first = start_runs(&db, extra)?;
        let (mut runs, _) = clients(&first).await?;
        let steps = json!([{"say": "before"}, {"checkpoint": true}, {"sleep_ms": 3000}, {"say": "after"}, {"checkpoint": true}]);
        let orphan = runs.create_run(authed(run_request("", steps), ALICE)).await?.into_inner().run.unwrap_or_default();
        wait_run(&mut runs, ALICE, &orphan.run_id, T, |r| r.last_seq >= 4).await?;
        first.signal(libc::SIGKILL)?;
        first.wait_exit(Duration::from_secs(5))?;

        // The survivor's only slot is busy until well after the orphan's lease (3 s) has expired, and
        // more work waits behind it.
        let second = start_runs(&db, extra)?;
        let (mut runs, _) = clients(&second).await?;
        let busy = runs.create_run(authed(run_request("", json!([{"sleep_ms": 5000}])), ALICE)).await?.into_inner().run.unwrap_or_default();
        let mut pending = Vec::new();
        for _ in 0..4 {
            let run =
                runs.create_run(authed(run_request("", json!([{"sleep_ms": 500}])), ALICE)).await?.into_inner().run.unwrap_or_default();
            pending.push(run.run_id);
        }
        let done = wait_run(&mut runs, ALICE, &orphan.run_id, Duration::from_secs(60), is_terminal).await?;
        assert_eq!(done.status(), RunStatus::Success, "{backend:?}: {:?}\n{}", done.error, second.stderr());
        assert_eq!(done.attempt, 2, "{backend:?}");
        let events = runs
            .list_run_events(authed(ListRunEventsRequest { run_id: orphan.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .events;
        let resumed = events
            .iter()
            .find(|e| matches!(&e.kind, Some(run_event::Kind::Metadata(m)) if m.attempt == 2))
            .and_then(|e| e.time)
            .map(|t| (t.seconds, t.nanos))
            .ok_or_else(|| anyhow::anyhow!("{backend:?}: no attempt-2 METADATA event"))?;
        let busy = wait_run(&mut runs, ALICE, &busy.run_id, T, is_terminal).await?;
        let next = wait_run(&mut runs, ALICE, &pending[0], T, is_terminal).await?;
        let started = next.started_at.map(|t| (t.seconds, t.nanos)).unwrap_or_default();
        assert!(
            started >= resumed,
            "{backend:?}: the first PENDING run started at {started:?}, before the orphan was resumed at {resumed:?} (busy run ended {:?})",
            busy.finished_at
        );
    }
    Ok(())
}

/// One row of the side-effect journal, read straight from the store: (attempt, result, is_error).
async fn journal_row(db: &TestDb, run_id: &str, key: &str) -> anyhow::Result<Option<(i32, Option<String>, bool)>> {
    let conn = db.connect().await?;
    let row = conn
        .query_one_raw(Statement::from_string(
            conn.get_database_backend(),
            format!("SELECT attempt, result, is_error FROM tool_effects WHERE run_id = '{run_id}' AND tool_call_id = '{key}'"),
        ))
        .await?;
    Ok(match row {
        Some(row) => Some((row.try_get("", "attempt")?, row.try_get("", "result")?, row.try_get("", "is_error")?)),
        None => None,
    })
}

/// The custom events of a run's whole log, as (event name, data as JSON text).
async fn customs(runs: &mut RunServiceClient<tonic::transport::Channel>, run_id: &str) -> anyhow::Result<Vec<(String, String)>> {
    let events = runs
        .list_run_events(authed(ListRunEventsRequest { run_id: run_id.to_owned(), ..Default::default() }, ALICE))
        .await?
        .into_inner()
        .events;
    Ok(events
        .into_iter()
        .filter_map(|e| match e.kind {
            Some(run_event::Kind::Custom(c)) => {
                let data = c.data.map(|v| antler_kit::json::value_to_json(&v).to_string()).unwrap_or_default();
                Some((c.name, data))
            }
            _ => None,
        })
        .collect())
}

/// The script agent journals its side-effecting steps like the lead agent's tools: after a kill -9
/// and a takeover that resumes before a step that already happened, the step is not repeated; a
/// step whose intent an earlier attempt recorded without a result is recorded as unknown and
/// skipped, never redone blindly.
#[tokio::test]
async fn a_takeover_never_repeats_a_journalled_script_step() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let mut first = start_runs(&db, "")?;
        let (mut runs, _) = clients(&first).await?;
        let steps = json!([
            {"checkpoint": true},
            {"custom": "effect"},
            {"sleep_ms": 2000},
            {"custom": "uncertain"},
            {"checkpoint": true},
            {"say": "done"}
        ]);
        let run = runs.create_run(authed(run_request("", steps), ALICE)).await?.into_inner().run.unwrap_or_default();
        // The effect (step 1) happened and its result is journalled; the worker is in the sleep.
        let deadline = std::time::Instant::now() + T;
        while journal_row(&db, &run.run_id, "script-step-1").await?.and_then(|r| r.1).is_none() {
            anyhow::ensure!(std::time::Instant::now() < deadline, "{backend:?}: step 1 never journalled\n{}", first.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        first.signal(libc::SIGKILL)?;
        first.wait_exit(Duration::from_secs(5))?;
        // As if the dead worker had also recorded step 3's intent and died before its result.
        let conn = db.connect().await?;
        conn.execute_raw(Statement::from_string(
            conn.get_database_backend(),
            format!(
                "INSERT INTO tool_effects (run_id, tool_call_id, tool_name, arguments, attempt, intent_at, is_error) \
                 VALUES ('{}', 'script-step-3', 'script.custom', '\"uncertain\"', 1, 0, FALSE)",
                run.run_id
            ),
        ))
        .await?;

        let second = start_runs(&db, "")?;
        let (mut runs, _) = clients(&second).await?;
        let done = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        assert_eq!((done.status(), done.attempt), (RunStatus::Success, 2), "{backend:?}: {:?}\n{}", done.error, second.stderr());

        let customs = customs(&mut runs, &run.run_id).await?;
        let named = |name: &str, data: &str| customs.iter().filter(|(n, d)| n == name && d == data).count();
        assert_eq!(named("script", "\"effect\""), 1, "{backend:?}: the effect ran once: {customs:?}");
        assert_eq!(named("script", "\"uncertain\""), 0, "{backend:?}: an unknown outcome is not redone: {customs:?}");
        assert_eq!(named("script_effect_unknown", "\"uncertain\""), 1, "{backend:?}: the clients are told: {customs:?}");
        assert_eq!(journal_row(&db, &run.run_id, "script-step-1").await?, Some((1, Some("emitted".to_owned()), false)), "{backend:?}");
        let (attempt, result, is_error) = journal_row(&db, &run.run_id, "script-step-3").await?.unwrap_or_default();
        assert_eq!((attempt, is_error), (1, true), "{backend:?}");
        assert!(result.as_deref().is_some_and(|r| r.starts_with("outcome unknown")), "{backend:?}: {result:?}");
    }
    Ok(())
}

/// Three replicas on PostgreSQL, each with one slot and a backlog of older PENDING runs. A replica
/// that admitted PENDING runs is killed: the survivors start those runs within lease + grace +
/// sweep interval + 1 s of the kill, before their own older backlog, and each exactly once.
#[tokio::test]
async fn a_dead_replica_s_pending_runs_start_elsewhere_within_the_takeover_bound() -> anyhow::Result<()> {
    let extra = "  max_concurrent_runs: 1\n";
    // lease_secs 3 + lease_grace_secs 0 + sweep_interval_secs 1 + 1 s (see `runs::config`).
    let bound_ms = 5_000i64;
    let db = TestDb::new(Backend::Postgres).await?;
    let mut victim = start_runs(&db, extra)?;
    let survivors = [start_runs(&db, extra)?, start_runs(&db, extra)?];
    let (mut on_victim, _) = clients(&victim).await?;
    let (mut on_b, _) = clients(&survivors[0]).await?;
    let (mut on_c, _) = clients(&survivors[1]).await?;

    // The survivors' own work, older than anything the victim admits: about 9 s for two slots.
    let mut backlog = Vec::new();
    for i in 0..60 {
        let runs = if i % 2 == 0 { &mut on_b } else { &mut on_c };
        let run = runs.create_run(authed(run_request("", json!([{"sleep_ms": 300}])), ALICE)).await?.into_inner().run.unwrap_or_default();
        backlog.push(run.run_id);
    }
    // The victim's slot is busy, so what it admits next waits PENDING with the victim as owner.
    let blocker =
        on_victim.create_run(authed(run_request("", json!([{"wait_cancel": true}])), ALICE)).await?.into_inner().run.unwrap_or_default();
    wait_run(&mut on_victim, ALICE, &blocker.run_id, T, |r| r.status() == RunStatus::Running).await?;
    let mut orphans = Vec::new();
    for _ in 0..3 {
        let run =
            on_victim.create_run(authed(run_request("", json!([{"say": "orphan"}])), ALICE)).await?.into_inner().run.unwrap_or_default();
        orphans.push(run.run_id);
    }
    for orphan in &orphans {
        let run = wait_run(&mut on_b, ALICE, orphan, T, |_| true).await?;
        assert_eq!(run.status(), RunStatus::Pending, "admitted while the victim's only slot is busy");
    }
    let killed_at = now_ms();
    victim.signal(libc::SIGKILL)?;
    victim.wait_exit(Duration::from_secs(5))?;
    // The blocker would take a survivor's slot when taken over; cancelled, the sweep just ends it.
    on_b.cancel_run(authed(CancelRunRequest { run_id: blocker.run_id.clone(), ..Default::default() }, ALICE)).await?;

    let mut last_backlog_start = 0i64;
    for run_id in &backlog {
        let run = wait_run(&mut on_b, ALICE, run_id, Duration::from_secs(60), is_terminal).await?;
        last_backlog_start = last_backlog_start.max(ms(run.started_at));
    }
    for orphan in &orphans {
        let run = wait_run(&mut on_b, ALICE, orphan, T, is_terminal).await?;
        let started = ms(run.started_at) - killed_at;
        assert_eq!((run.status(), run.attempt), (RunStatus::Success, 1), "{orphan}: started once: {:?}", run.error);
        assert!(
            started <= bound_ms,
            "{orphan} started {started} ms after the kill (bound {bound_ms} ms)\n{}\n{}",
            survivors[0].stderr(),
            survivors[1].stderr()
        );
        assert!(
            ms(run.started_at) < last_backlog_start,
            "{orphan} started at {} ms, after the survivors' whole older backlog (last started at {last_backlog_start} ms)",
            ms(run.started_at)
        );
    }
    Ok(())
}

fn ms(t: Option<prost_types::Timestamp>) -> i64 {
    t.map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000).unwrap_or(0)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
