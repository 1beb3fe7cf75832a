//! Two `antler-runs` replicas on one PostgreSQL database: the invariants hold across processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn two_replicas_admit_one_run_per_key_and_one_active_run_per_thread() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let (a, b) = (start_runs(&db, "")?, start_runs(&db, "")?);
    let (runs_a, mut threads_a) = clients(&a).await?;
    let (runs_b, _) = clients(&b).await?;

    // One idempotency key, 50 requests to each replica at once: one run.
    let mut tasks = Vec::new();
    for i in 0..100 {
        let mut runs = if i % 2 == 0 { runs_a.clone() } else { runs_b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut request = run_request("", json!([{"say": "once"}]));
            request.idempotency_key = "across-replicas".to_owned();
            runs.create_run(authed(request, ALICE)).await.map(|r| r.into_inner().run.unwrap_or_default())
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await??.run_id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let mut runs_a = runs_a;
    let done = wait_run(&mut runs_a, ALICE, &ids[0], T, is_terminal).await?;
    assert_eq!((done.attempt, said(&mut runs_a, ALICE, &ids[0]).await?), (1, 1), "executed once across both replicas");

    // One thread, REJECT, 20 concurrent requests across both replicas: exactly one admitted.
    threads_a.create_thread(authed(CreateThreadRequest { thread_id: "shared".into(), ..Default::default() }, ALICE)).await?;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut runs = if i % 2 == 0 { runs_a.clone() } else { runs_b.clone() };
        tasks.push(tokio::spawn(async move {
            runs.create_run(authed(run_request("shared", json!([{"wait_cancel": true}])), ALICE)).await.map(|r| r.into_inner())
        }));
    }
    let (mut admitted, mut aborted) = (Vec::new(), 0);
    let mut admitted_by_a = false;
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await? {
            Ok(response) => {
                admitted.push(response.run.unwrap_or_default().run_id);
                admitted_by_a = i % 2 == 0;
            }
            Err(status) if status.code() == Code::Aborted => aborted += 1,
            Err(status) => anyhow::bail!("unexpected {status:?}"),
        }
    }
    assert_eq!((admitted.len(), aborted), (1, 19));

    // A cancel sent to the replica that does not run it reaches the owner at its next renewal.
    let run_id = admitted[0].clone();
    // Admission gives the admitting replica the lease of the PENDING run; the store shows whether it
    // is still that replica that runs it (same owner, first attempt).
    let conn = db.connect().await?;
    let owner_of = |conn: sea_orm::DatabaseConnection, run_id: String| async move {
        use sea_orm::ConnectionTrait;
        let row = conn
            .query_one_raw(sea_orm::Statement::from_string(
                conn.get_database_backend(),
                format!("SELECT owner_worker_id FROM runs WHERE run_id = '{run_id}'"),
            ))
            .await?
            .ok_or_else(|| anyhow::anyhow!("run {run_id} not in the store"))?;
        anyhow::Ok(row.try_get::<Option<String>>("", "owner_worker_id")?)
    };
    let admitter = owner_of(conn.clone(), run_id.clone()).await?;
    let running = wait_run(&mut runs_a, ALICE, &run_id, T, |r| r.status() == RunStatus::Running).await?;
    assert_eq!((running.attempt, owner_of(conn.clone(), run_id.clone()).await?), (1, admitter), "the admitting replica runs it");
    let mut other = if admitted_by_a { runs_b.clone() } else { runs_a.clone() };
    // Follow the run from the replica that does not run it: events reach it through the database.
    let mut stream = other.join_run(authed(JoinRunRequest { run_id: run_id.clone(), ..Default::default() }, ALICE)).await?.into_inner();
    other.cancel_run(authed(CancelRunRequest { run_id: run_id.clone(), ..Default::default() }, ALICE)).await?;
    let done = wait_run(&mut other, ALICE, &run_id, T, is_terminal).await?;
    assert_eq!(done.status(), RunStatus::Interrupted);
    assert_eq!(done.attempt, 1, "stopped by its owner, not taken over");
    let mut last = None;
    while let Some(event) = tokio::time::timeout(T, stream.next()).await? {
        let event = event?.event.unwrap_or_default();
        if matches!(event.kind, Some(run_event::Kind::End(_))) {
            last = event.kind;
            break;
        }
    }
    assert!(matches!(last, Some(run_event::Kind::End(ref end)) if end.status() == RunStatus::Interrupted), "{last:?}");
    Ok(())
}

/// Sessions of the test's database that sit inside a transaction waiting for their client.
async fn idle_in_transaction(admin: &DatabaseConnection) -> anyhow::Result<i64> {
    let row = admin
        .query_one_raw(Statement::from_string(
            admin.get_database_backend(),
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'",
        ))
        .await?
        .ok_or_else(|| anyhow::anyhow!("count(*) returned no row"))?;
    Ok(row.try_get_by_index(0)?)
}

/// A replica frozen inside a transaction (SIGSTOP while its admission transaction is open) holds that
/// transaction's row locks no longer than `postgres_idle_in_transaction_timeout_ms`: PostgreSQL ends the
/// session, another replica works on, and the frozen one, resumed, replaces the lost connection. Before
/// the setting, the session (and the locks of every run it had written) stayed as long as the freeze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_frozen_inside_a_transaction_holds_its_locks_no_longer_than_the_timeout() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let yaml = config(&db, "").replacen("  database:\n", "  database:\n    postgres_idle_in_transaction_timeout_ms: 1000\n", 1);
    let a = start("antler-runs", Launch::default().config(yaml.clone()))?;
    let (runs_a, _) = clients(&a).await?;
    let admin = db.connect().await?;

    // A flood of admissions keeps a's admission transaction open most of the time.
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    for _ in 0..8 {
        let (mut runs, stop) = (runs_a.clone(), stop.clone());
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = runs.create_run(authed(run_request("", json!([{"say": "flood"}])), ALICE)).await;
            }
        }));
    }
    let mut frozen = false;
    for attempt in 0..200u64 {
        tokio::time::sleep(Duration::from_millis(20 + attempt % 7)).await;
        a.signal(libc::SIGSTOP)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if idle_in_transaction(&admin).await? > 0 {
            frozen = true;
            break;
        }
        a.signal(libc::SIGCONT)?;
    }
    stop.store(true, Ordering::Relaxed);
    anyhow::ensure!(frozen, "never caught the replica inside a transaction in 200 tries\n{}", a.stderr());

    let frozen_at = Instant::now();
    while idle_in_transaction(&admin).await? > 0 {
        anyhow::ensure!(frozen_at.elapsed() < Duration::from_secs(5), "the frozen replica's transaction outlived the 1 s timeout by 4 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Another replica works while the first is still frozen.
    let b = start("antler-runs", Launch::default().config(yaml))?;
    let (mut runs_b, _) = clients(&b).await?;
    let done = run_to_end(&mut runs_b, run_request("", json!([{"say": "on b"}])), T).await?;
    assert_eq!(done.status(), RunStatus::Success, "{:?}\n{}", done.error, b.stderr());

    // Resumed, the first replica replaces the connection PostgreSQL closed and works on.
    a.signal(libc::SIGCONT)?;
    let (mut runs_a, _) = clients(&a).await?;
    let deadline = Instant::now() + T;
    let done = loop {
        match run_to_end(&mut runs_a, run_request("", json!([{"say": "on a"}])), T).await {
            Ok(done) => break done,
            // The first request after the resume may meet the closed connection: UNAVAILABLE, retryable.
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(error) => return Err(error.context(a.stderr())),
        }
    };
    assert_eq!(done.status(), RunStatus::Success, "{:?}\n{}", done.error, a.stderr());
    for task in flood {
        task.abort();
    }
    Ok(())
}
