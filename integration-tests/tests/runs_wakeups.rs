//! Wake-ups instead of polling (issue #15): events, waits and cancels reach their clients through
//! notifications — in process, and across two `antler-runs` replicas on PostgreSQL through
//! LISTEN/NOTIFY — with the safety poll set to ten minutes so that nothing else could deliver them in
//! time; a killed listener connection loses nothing; idle subscribers cost no queries; and the
//! stream and per-user run limits answer RESOURCE_EXHAUSTED naming their setting.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::metrics::{metrics_url, scrape, with_metrics};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, Process, start};
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::*;
use anyhow::{Context, Result, bail};
use sea_orm::ConnectionTrait;
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

const T: Duration = Duration::from_secs(20);
/// Far longer than any test: only notifications can deliver within the assertions' bounds.
const NO_SAFETY_POLL: &str = "  safety_poll_ms: 600000\n";

/// [`config`] with `lease_secs` 30 (so a lease renewal, which also reads cancel requests, comes only
/// every 10 s) and heartbeats every 15 s, plus `extra`.
fn slow_lease_config(db: &TestDb, extra: &str) -> String {
    config(db, extra).replace("  lease_secs: 3\n", "  lease_secs: 30\n").replace("  heartbeat_secs: 1\n", "  heartbeat_secs: 15\n")
}

fn start_with(yaml: String) -> Result<Process> {
    start("antler-runs", Launch::default().config(yaml))
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn event_ms(event: &RunEvent) -> i64 {
    event.time.as_ref().map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000).unwrap_or(0)
}

/// A run admitted through `runs` (so executed by that replica) following `steps`.
async fn create(runs: &mut RunServiceClient<Channel>, steps: serde_json::Value) -> Result<Run> {
    Ok(runs.create_run(authed(run_request("", steps), ALICE)).await?.into_inner().run.unwrap_or_default())
}

/// Follows `run_id` through `runs` to its END; each event with the delay between its write (its
/// timestamp, written by the replica that appended it) and its receipt here, in ms.
async fn follow_to_end(runs: &mut RunServiceClient<Channel>, run_id: &str) -> Result<Vec<(RunEvent, i64)>> {
    let stream = runs.join_run(authed(JoinRunRequest { run_id: run_id.to_owned(), ..Default::default() }, ALICE)).await?.into_inner();
    to_end(stream, |m| m.event).await.with_context(|| format!("following {run_id}"))
}

/// The events of `stream` (heartbeats left out) up to its END, each with its delay as in
/// [`follow_to_end`].
async fn to_end<M>(mut stream: tonic::Streaming<M>, event_of: impl Fn(M) -> Option<RunEvent>) -> Result<Vec<(RunEvent, i64)>> {
    let mut seen = Vec::new();
    while let Some(message) = tokio::time::timeout(T, stream.next()).await.context("no event for 20 s")? {
        let event = event_of(message?).unwrap_or_default();
        if matches!(event.kind, Some(run_event::Kind::Heartbeat(_))) {
            continue;
        }
        let delay = now_ms() - event_ms(&event);
        let end = matches!(event.kind, Some(run_event::Kind::End(_)));
        seen.push((event, delay));
        if end {
            return Ok(seen);
        }
    }
    bail!("the stream closed before its END")
}

fn assert_contiguous(events: &[(RunEvent, i64)]) {
    let seqs: Vec<u64> = events.iter().map(|(e, _)| e.seq).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "every event once, in order, no gap");
}

/// Delays of the events written after `joined` (the earlier ones are replayed, not live).
fn live_delays(events: &[(RunEvent, i64)], joined: i64) -> Vec<i64> {
    let mut delays: Vec<i64> = events.iter().filter(|(e, _)| event_ms(e) > joined).map(|(_, d)| *d).collect();
    delays.sort_unstable();
    delays
}

fn check_live(delays: &[i64], what: &str) {
    assert!(delays.len() >= 5, "{what}: too few live events to judge: {delays:?}");
    let median = delays[delays.len() / 2];
    // A 500 ms poll would put the median near 250 ms; a wake-up puts it at a few ms.
    assert!(median < 100, "{what}: median delay {median} ms: {delays:?}");
    assert!(delays.iter().all(|d| *d < 1000), "{what}: an event took a second or more: {delays:?}");
}

/// Steps that write an event every `gap_ms` for `count` rounds.
fn paced(count: usize, gap_ms: u64) -> serde_json::Value {
    let mut steps = Vec::new();
    for i in 0..count {
        steps.push(json!({"sleep_ms": gap_ms}));
        steps.push(json!({"custom": {"i": i}}));
    }
    serde_json::Value::Array(steps)
}

#[tokio::test]
async fn a_client_on_one_replica_sees_events_written_on_the_other_at_once() -> Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let a = start_with(slow_lease_config(&db, NO_SAFETY_POLL))?;
    let b = start_with(slow_lease_config(&db, NO_SAFETY_POLL))?;
    let (mut runs_a, _) = clients(&a).await?;
    let (mut runs_b, _) = clients(&b).await?;

    let run = create(&mut runs_a, paced(10, 150)).await?;
    let joined = now_ms();
    let events = follow_to_end(&mut runs_b, &run.run_id).await?;
    assert_contiguous(&events);
    check_live(&live_delays(&events, joined), "A → B");

    // WaitRun through B of a run executed by A returns as soon as the run ends.
    let mut request = run_request("", json!([{"sleep_ms": 300}, {"say": "done"}]));
    request.on_disconnect = OnDisconnect::Continue as i32;
    let started = Instant::now();
    let waited = runs_b.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner();
    let run = waited.run.unwrap_or_default();
    assert_eq!(run.status(), RunStatus::Success);
    let finished_ms = run.finished_at.as_ref().map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000).unwrap_or(0);
    let lag = now_ms() - finished_ms;
    assert!(lag < 1000, "WaitRun answered {lag} ms after the run ended (took {:?} in all)", started.elapsed());
    Ok(())
}

/// StreamRun watches its run before admitting it and reads nothing from the store until something
/// announces events it has not got (#32): when another replica executes the run, the stream must
/// still get every event, in order, as it is written.
#[tokio::test]
async fn a_stream_run_whose_run_another_replica_executes_gets_every_event_live() -> Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    // B alone first, its one slot taken by a long run, so that A (started after) executes what B admits
    // (once B's admission lease of 3 s has passed: the admitting replica has the first claim).
    let b = start_with(config(&db, &format!("{NO_SAFETY_POLL}  max_concurrent_runs: 1\n")))?;
    let (mut runs_b, _) = clients(&b).await?;
    let long = create(&mut runs_b, json!([{"sleep_ms": 600000}])).await?;
    wait_run(&mut runs_b, ALICE, &long.run_id, T, |r| r.status() == RunStatus::Running).await?;
    let a = start_with(config(&db, NO_SAFETY_POLL))?;
    let (mut runs_a, _) = clients(&a).await?;

    for round in 0..3 {
        let joined = now_ms();
        let stream =
            runs_b.stream_run(authed(StreamRunRequest { create: Some(run_request("", paced(8, 100))) }, ALICE)).await?.into_inner();
        let events = to_end(stream, |m| m.event).await.with_context(|| format!("round {round}"))?;
        assert_contiguous(&events);
        check_live(&live_delays(&events, joined), &format!("round {round}: written on A, streamed from B"));
        let run_id = events[0].0.run_id.clone();
        let run = runs_a.get_run(authed(GetRunRequest { run_id, ..Default::default() }, ALICE)).await?.into_inner().run.unwrap_or_default();
        assert_eq!(run.status(), RunStatus::Success, "round {round}");
    }
    let owner = runs_a.get_run(authed(GetRunRequest { run_id: long.run_id.clone(), ..Default::default() }, ALICE)).await?.into_inner();
    assert_eq!(owner.run.unwrap_or_default().status(), RunStatus::Running, "B's slot stayed taken: A executed the streamed runs");
    Ok(())
}

#[tokio::test]
async fn a_cancel_through_the_other_replica_stops_the_run_within_a_second() -> Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let a = start_with(slow_lease_config(&db, NO_SAFETY_POLL))?;
    let b = start_with(slow_lease_config(&db, NO_SAFETY_POLL))?;
    let (mut runs_a, mut threads_a) = clients(&a).await?;
    let (mut runs_b, mut threads_b) = clients(&b).await?;
    for _ in 0..3 {
        let run = create(&mut runs_a, json!([{"wait_cancel": true}])).await?;
        wait_run(&mut runs_a, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
        let started = Instant::now();
        let cancel = CancelRunRequest { run_id: run.run_id.clone(), wait: true, ..Default::default() };
        let done = runs_b.cancel_run(authed(cancel, ALICE)).await?.into_inner().run.unwrap_or_default();
        let took = started.elapsed();
        assert_eq!((done.status(), done.attempt), (RunStatus::Interrupted, 1), "stopped by its owner on A, not taken over");
        assert!(took < Duration::from_secs(1), "CancelRun(wait) through B took {took:?}");
    }

    // DeleteThread through B of a thread whose run executes on A: cancelled, waited for, deleted.
    let run = create(&mut runs_a, json!([{"wait_cancel": true}])).await?;
    wait_run(&mut runs_a, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
    let started = Instant::now();
    let delete = DeleteThreadRequest { thread_id: run.thread_id.clone(), cancel_active_run: true };
    threads_b.delete_thread(authed(delete, ALICE)).await?;
    assert!(started.elapsed() < Duration::from_secs(1), "DeleteThread took {:?}", started.elapsed());
    let gone = threads_a.get_thread(authed(GetThreadRequest { thread_id: run.thread_id.clone() }, ALICE)).await;
    assert_eq!(gone.err().map(|s| s.code()), Some(Code::NotFound));
    Ok(())
}

/// The replicas' listener connections (the only sessions that ran LISTEN).
async fn listeners(admin: &sea_orm::DatabaseConnection) -> Result<Vec<i32>> {
    let rows = admin
        .query_all_raw(sea_orm::Statement::from_string(
            admin.get_database_backend(),
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
        ))
        .await?;
    rows.iter().map(|r| r.try_get::<i32>("", "pid").map_err(Into::into)).collect()
}

#[tokio::test]
async fn a_killed_listener_connection_is_replaced_and_no_event_is_missed() -> Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let a = start_with(slow_lease_config(&db, NO_SAFETY_POLL))?;
    let b = start_with(slow_lease_config(&db, NO_SAFETY_POLL))?;
    let (mut runs_a, _) = clients(&a).await?;
    let (mut runs_b, _) = clients(&b).await?;
    let admin = db.connect().await?;
    let deadline = Instant::now() + T;
    while listeners(&admin).await?.len() < 2 {
        anyhow::ensure!(Instant::now() < deadline, "the two replicas never LISTENed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 40 events over ~4 s; the listeners are killed in the middle, twice.
    let run = create(&mut runs_a, paced(40, 100)).await?;
    let follower = tokio::spawn(async move { follow_to_end(&mut runs_b, &run.run_id).await });
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let killed = admin
            .query_all_raw(sea_orm::Statement::from_string(
                admin.get_database_backend(),
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
            ))
            .await?;
        assert_eq!(killed.len(), 2, "both replicas' listeners were killed");
    }
    let events = tokio::time::timeout(T, follower).await???;
    assert_contiguous(&events);
    // The END too arrived by a wake-up: the run ended ~4 s in, the safety poll is ten minutes away.
    let (_, end_delay) = events.last().cloned().unwrap_or_default();
    assert!(end_delay < 1000, "END reached B {end_delay} ms after it was written");
    let deadline = Instant::now() + T;
    while listeners(&admin).await?.len() < 2 {
        anyhow::ensure!(Instant::now() < deadline, "the listeners did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And live delivery works again through the new connections.
    let (mut runs_b, _) = clients(&b).await?;
    let run = create(&mut runs_a, paced(8, 150)).await?;
    let joined = now_ms();
    let events = follow_to_end(&mut runs_b, &run.run_id).await?;
    assert_contiguous(&events);
    check_live(&live_delays(&events, joined), "after reconnecting");
    Ok(())
}

#[tokio::test]
async fn a_thousand_idle_subscribers_cost_no_queries_between_safety_polls() -> Result<()> {
    const RUNS: usize = 200;
    const PER_RUN: usize = 5;
    let db = TestDb::new(Backend::Postgres).await?;
    let extra = format!("  max_concurrent_runs: {RUNS}\n  max_streams_per_user: 5000\n  safety_poll_ms: 2000\n");
    let quiet = |yaml: String| yaml.replace("  sweep_interval_secs: 1\n", "  sweep_interval_secs: 10\n");
    let a = start_with(quiet(slow_lease_config(&db, &extra)))?;
    let b = start_with(with_metrics(&quiet(slow_lease_config(&db, &extra)), "[0.01, 0.1, 1]"))?;
    let url = metrics_url(&b)?;
    let (mut runs_a, _) = clients(&a).await?;
    let (runs_b, _) = clients(&b).await?;

    let mut ids = Vec::new();
    for _ in 0..RUNS {
        ids.push(create(&mut runs_a, json!([{"wait_cancel": true}])).await?.run_id);
    }
    for id in &ids {
        wait_run(&mut runs_a, ALICE, id, T, |r| r.status() == RunStatus::Running).await?;
    }
    let statements = |scrape: &antler_integration_tests::metrics::Scrape| scrape.value("antler_runs_db_statements_total", &[]);
    let polls = |scrape: &antler_integration_tests::metrics::Scrape| {
        ["found", "nothing", "error"].iter().map(|o| scrape.value("antler_runs_safety_polls_total", &[("outcome", o)])).sum::<f64>()
    };

    // B's own background work (sweeper, statistics), with no subscriber.
    let window = Duration::from_secs(8);
    let before = scrape(&url).await?;
    tokio::time::sleep(window).await;
    let after = scrape(&url).await?;
    let idle = statements(&after) - statements(&before);

    // 1,000 subscribers on B, to runs that write nothing.
    let mut streams = Vec::new();
    for id in &ids {
        for _ in 0..PER_RUN {
            let mut runs = runs_b.clone();
            let request = JoinRunRequest { run_id: id.clone(), on_disconnect: OnDisconnect::Continue as i32, ..Default::default() };
            streams.push(runs.join_run(authed(request, ALICE)).await?.into_inner());
        }
    }
    // Each subscriber's join reads the store once; wait until they all have.
    let joined = scrape(&url).await?;
    assert!(joined.value("antler_runs_stream_subscribers", &[]) >= (RUNS * PER_RUN) as f64, "{}", joined.text);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = scrape(&url).await?;
    tokio::time::sleep(window).await;
    let after = scrape(&url).await?;
    let subscribed = statements(&after) - statements(&before);
    let safety_polls = polls(&after) - polls(&before);
    println!(
        "B's statements over {window:?}: {idle} with no subscriber, {subscribed} with {} idle subscribers ({safety_polls} safety polls)",
        RUNS * PER_RUN
    );
    // One statement per safety poll (200 runs fit one query); a 500 ms poll per subscriber would have
    // made ~32,000.
    assert!(safety_polls >= 3.0, "the safety poll ran {safety_polls} times in {window:?}");
    assert!(subscribed <= idle + safety_polls + 10.0, "{subscribed} statements with subscribers vs {idle} without");
    drop(streams);
    Ok(())
}

#[tokio::test]
async fn one_replica_wakes_its_subscribers_and_waiters_without_polling() -> Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_with(slow_lease_config(&db, NO_SAFETY_POLL))?;
        let (mut runs, mut threads) = clients(&server).await?;

        let run = create(&mut runs, paced(8, 150)).await?;
        let joined = now_ms();
        let events = follow_to_end(&mut runs, &run.run_id).await?;
        assert_contiguous(&events);
        check_live(&live_delays(&events, joined), &format!("{backend:?}"));

        let run = create(&mut runs, json!([{"wait_cancel": true}])).await?;
        wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
        let started = Instant::now();
        let cancel = CancelRunRequest { run_id: run.run_id.clone(), wait: true, ..Default::default() };
        let done = runs.cancel_run(authed(cancel, ALICE)).await?.into_inner().run.unwrap_or_default();
        assert_eq!(done.status(), RunStatus::Interrupted);
        assert!(started.elapsed() < Duration::from_secs(1), "{backend:?}: CancelRun(wait) took {:?}", started.elapsed());

        let run = create(&mut runs, json!([{"wait_cancel": true}])).await?;
        wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
        let started = Instant::now();
        threads.delete_thread(authed(DeleteThreadRequest { thread_id: run.thread_id.clone(), cancel_active_run: true }, ALICE)).await?;
        assert!(started.elapsed() < Duration::from_secs(1), "{backend:?}: DeleteThread took {:?}", started.elapsed());

        let request = run_request("", json!([{"sleep_ms": 300}, {"say": "done"}]));
        let waited = runs.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner();
        let run = waited.run.unwrap_or_default();
        let finished_ms = run.finished_at.as_ref().map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000).unwrap_or(0);
        assert!(now_ms() - finished_ms < 1000, "{backend:?}: WaitRun answered {} ms after the end", now_ms() - finished_ms);
    }
    Ok(())
}

fn exhausted(result: Result<impl Sized, tonic::Status>, setting: &str) {
    match result {
        Err(status) => {
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            assert!(status.message().contains(setting), "{setting} not named: {}", status.message());
        }
        Ok(_) => panic!("{setting}: accepted beyond the limit"),
    }
}

#[tokio::test]
async fn open_streams_are_limited_per_user_and_per_replica_but_not_for_the_services() -> Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_with(config(&db, "  max_streams: 3\n  max_streams_per_user: 2\n"))?;
        let (mut runs, _) = clients(&server).await?;
        let run = create(&mut runs, json!([{"wait_cancel": true}])).await?;
        let join = |key: &str| {
            let request = JoinRunRequest { run_id: run.run_id.clone(), on_disconnect: OnDisconnect::Continue as i32, ..Default::default() };
            authed(request, key)
        };
        let first = runs.join_run(join(ALICE)).await?;
        let second = runs.join_run(join(ALICE)).await?;
        exhausted(runs.join_run(join(ALICE)).await, "runs.max_streams_per_user");
        // A StreamRun refused for its stream admits nothing.
        let before = runs.list_runs(authed(ListRunsRequest::default(), ALICE)).await?.into_inner().runs.len();
        let stream = StreamRunRequest { create: Some(run_request("", json!([{"say": "x"}]))) };
        exhausted(runs.stream_run(authed(stream, ALICE)).await, "runs.max_streams_per_user");
        let after = runs.list_runs(authed(ListRunsRequest::default(), ALICE)).await?.into_inner().runs.len();
        assert_eq!(before, after, "{backend:?}: a refused StreamRun left a run behind");

        // Bob's first stream takes the replica's last room; his second meets the replica's limit.
        let bob_run =
            runs.create_run(authed(run_request("", json!([{"wait_cancel": true}])), BOB)).await?.into_inner().run.unwrap_or_default();
        let bob_join = |run_id: &str| {
            authed(JoinRunRequest { run_id: run_id.to_owned(), on_disconnect: OnDisconnect::Continue as i32, ..Default::default() }, BOB)
        };
        let bob = runs.join_run(bob_join(&bob_run.run_id)).await?;
        exhausted(runs.join_run(bob_join(&bob_run.run_id)).await, "runs.max_streams");

        // A service principal's streams are not counted against the clients' limits.
        let service = StreamRunRequest { create: Some(run_request("", json!([{"say": "from a service"}]))) };
        let mut from_service = runs.stream_run(authed(service, SERVICE)).await?.into_inner();
        let first_event = tokio::time::timeout(T, from_service.next()).await?;
        assert!(matches!(first_event, Some(Ok(_))), "{backend:?}: {first_event:?}");

        // A closed stream frees its room.
        drop(first);
        let deadline = Instant::now() + T;
        loop {
            match runs.join_run(join(ALICE)).await {
                Ok(_) => break,
                Err(status) if status.code() == Code::ResourceExhausted && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(status) => bail!("{backend:?}: a closed stream's room never came back: {status:?}"),
            }
        }
        drop((second, bob));
    }
    Ok(())
}

#[tokio::test]
async fn a_user_cannot_exceed_the_caps_on_active_and_pending_runs() -> Result<()> {
    for backend in BACKENDS {
        // Active: the one running run and one waiting fill the cap of 2.
        let db = TestDb::new(backend).await?;
        let caps = "  max_concurrent_runs: 1\n  max_active_runs_per_user: 2\n  max_pending_runs_per_user: 100\n";
        let server = start_with(config(&db, caps))?;
        let (mut runs, _) = clients(&server).await?;
        hold_the_only_slot(&mut runs).await?;
        create(&mut runs, json!([{"say": "waits"}])).await?;
        exhausted(runs.create_run(authed(run_request("", json!([{"say": "x"}])), ALICE)).await, "runs.max_active_runs_per_user");
        let wait = WaitRunRequest { create: Some(run_request("", json!([{"say": "x"}]))) };
        exhausted(runs.wait_run(authed(wait, ALICE)).await, "runs.max_active_runs_per_user");
        // Another user is not affected.
        runs.create_run(authed(run_request("", json!([{"say": "bob"}])), BOB)).await?;
        drop(server);

        // Pending: two waiting fill the cap of 2, whatever the active cap.
        let db = TestDb::new(backend).await?;
        let caps = "  max_concurrent_runs: 1\n  max_active_runs_per_user: 100\n  max_pending_runs_per_user: 2\n";
        let server = start_with(config(&db, caps))?;
        let (mut runs, mut threads) = clients(&server).await?;
        hold_the_only_slot(&mut runs).await?;
        // The counts are re-read every 250 ms and err high meanwhile: the blocker, now RUNNING, may
        // still count as waiting until then.
        tokio::time::sleep(Duration::from_millis(300)).await;
        create(&mut runs, json!([{"say": "one"}])).await?;
        create(&mut runs, json!([{"say": "two"}])).await?;
        exhausted(runs.create_run(authed(run_request("", json!([{"say": "x"}])), ALICE)).await, "runs.max_pending_runs_per_user");
        // On an existing thread too (the one-at-a-time admission path).
        let thread = threads.create_thread(authed(CreateThreadRequest::default(), ALICE)).await?.into_inner().thread.unwrap_or_default();
        let on_thread = run_request(&thread.thread_id, json!([{"say": "x"}]));
        exhausted(runs.create_run(authed(on_thread, ALICE)).await, "runs.max_pending_runs_per_user");
    }
    Ok(())
}

#[tokio::test]
async fn a_unary_call_without_a_deadline_gets_the_default_but_wait_run_is_exempt() -> Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let deadline = |yaml: String| yaml.replacen("server:\n", "server:\n  default_deadline_secs: 1\n", 1);
    let mut a = start_with(deadline(slow_lease_config(&db, NO_SAFETY_POLL)))?;
    let b = start_with(deadline(slow_lease_config(&db, NO_SAFETY_POLL)))?;
    let (mut runs_a, _) = clients(&a).await?;
    let (mut runs_b, _) = clients(&b).await?;
    let run = create(&mut runs_a, json!([{"wait_cancel": true}])).await?;
    wait_run(&mut runs_a, ALICE, &run.run_id, T, |r| r.status() == RunStatus::Running).await?;
    // A dies holding a 30 s lease: a CancelRun(wait) through B waits for the takeover.
    a.signal(libc::SIGKILL)?;
    a.wait_exit(T)?;
    let started = Instant::now();
    let cancel = CancelRunRequest { run_id: run.run_id.clone(), wait: true, ..Default::default() };
    match runs_b.cancel_run(authed(cancel, ALICE)).await {
        Err(status) => {
            assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
            assert!(status.message().contains("server.default_deadline_secs"), "{}", status.message());
        }
        Ok(response) => bail!("answered {response:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // The client's own deadline wins over the default.
    let mut own = authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE);
    own.set_timeout(Duration::from_secs(30));
    runs_b.get_run(own).await?;
    // WaitRun is not cut at 1 s.
    let request = run_request("", json!([{"sleep_ms": 2500}, {"say": "late"}]));
    let waited = runs_b.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner();
    assert_eq!(waited.run.unwrap_or_default().status(), RunStatus::Success);
    Ok(())
}
