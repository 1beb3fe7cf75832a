//! FINALIZING is exclusive: cancels are refused while in it, and a finalizer that died after writing
//! its receipt and intended status is closed by the sweeper without anything being re-run.

use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::runs::*;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;
use tonic::Code;

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_finalizing_run_cannot_be_cancelled_and_a_dead_finalizer_is_closed_by_the_sweeper() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        // One slot, held by a blocker, keeps the run we tamper with from ever starting here.
        let server = start_runs(&db, "  max_concurrent_runs: 1\n")?;
        let (mut runs, _) = clients(&server).await?;
        let blocker = hold_the_only_slot(&mut runs).await?;
        let run = runs.create_run(authed(run_request("", json!([{"say": "x"}])), ALICE)).await?.into_inner().run.unwrap_or_default();

        // Pretend a worker on another replica got as far as FINALIZING (receipt and intended status
        // written) and still holds its lease.
        let conn = db.connect().await?;
        let sql = |lease: i64| {
            format!(
                "UPDATE runs SET status = 'finalizing', owner_worker_id = 'gone', lease_expires_at = {lease}, final_status = 'success', stop_reason = '', attempt = 1 WHERE run_id = '{}'",
                run.run_id
            )
        };
        conn.execute_raw(Statement::from_string(conn.get_database_backend(), sql(4_102_444_800_000))).await?;
        let refused = runs.cancel_run(authed(CancelRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await.err();
        let refused = refused.ok_or_else(|| anyhow::anyhow!("{backend:?}: cancelled a FINALIZING run"))?;
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert!(refused.message().contains("FINALIZING"), "{}", refused.message());

        // The finalizer dies: its lease lapses, and the sweeper adds only the closing.
        conn.execute_raw(Statement::from_string(conn.get_database_backend(), sql(1))).await?;
        let closed = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        assert_eq!((closed.status(), closed.stop_reason.as_str()), (RunStatus::Success, ""), "{backend:?}");
        let events = runs
            .list_run_events(authed(ListRunEventsRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .events;
        assert!(
            matches!(events.last().and_then(|e| e.kind.as_ref()), Some(run_event::Kind::End(end)) if end.status() == RunStatus::Success),
            "END last"
        );
        assert_eq!((closed.attempt, said(&mut runs, ALICE, &run.run_id).await?), (1, 0), "{backend:?}: nothing was re-run");
        runs.cancel_run(authed(CancelRunRequest { run_id: blocker.run_id.clone(), ..Default::default() }, ALICE)).await?;
    }
    Ok(())
}

/// A run whose workers keep dying is not retried forever: past `runs.max_attempts` it ends ERROR.
#[tokio::test]
async fn a_run_past_max_attempts_ends_error_instead_of_another_takeover() -> anyhow::Result<()> {
    let db = TestDb::new(antler_integration_tests::db::Backend::Sqlite).await?;
    let server = start_runs(&db, "  max_concurrent_runs: 1\n  max_attempts: 2\n")?;
    let (mut runs, _) = clients(&server).await?;
    hold_the_only_slot(&mut runs).await?;
    let run = runs.create_run(authed(run_request("", json!([{"say": "x"}])), ALICE)).await?.into_inner().run.unwrap_or_default();
    let conn = db.connect().await?;
    conn.execute_raw(Statement::from_string(
        conn.get_database_backend(),
        format!(
            "UPDATE runs SET status = 'running', owner_worker_id = 'gone', lease_expires_at = 1, attempt = 2 WHERE run_id = '{}'",
            run.run_id
        ),
    ))
    .await?;
    let ended = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    assert_eq!((ended.status(), ended.stop_reason.as_str()), (RunStatus::Error, "max_attempts_exceeded"));
    assert_eq!(ended.error.map(|e| e.code), Some("max_attempts_exceeded".to_owned()));
    assert_eq!((ended.attempt, said(&mut runs, ALICE, &run.run_id).await?), (2, 0), "no further attempt ran the script");
    Ok(())
}
