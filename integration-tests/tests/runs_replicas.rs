//! Two `antler-runs` replicas on one PostgreSQL database: the invariants hold across processes.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::runs::*;
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
