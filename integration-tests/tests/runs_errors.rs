//! Database failures reach clients honestly: a failure a retry cannot fix is INTERNAL with a stable
//! message (the database's own text, which names tables and values, stays in the server log), not a
//! retryable UNAVAILABLE that would make every gRPC client retry a broken schema forever.

use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::runs::GetRunRequest;
use anyhow::{Result, ensure};
use sea_orm::ConnectionTrait;
use serde_json::json;
use tonic::Code;

const T: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_broken_schema_is_internal_and_its_text_stays_in_the_log() -> Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        let run = run_to_end(&mut runs, run_request("", json!([{"say": "hi"}])), T).await?;
        let get = || authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE);

        let tamper = db.connect().await?;
        tamper.execute_unprepared("ALTER TABLE runs RENAME TO runs_moved_away").await?;
        let status = runs.get_run(get()).await.err();
        let (code, message) = status.as_ref().map(|s| (s.code(), s.message().to_owned())).unwrap_or((Code::Ok, String::new()));
        ensure!(code == Code::Internal, "{backend:?}: {status:?}");
        ensure!(message.starts_with("the runs database failed"), "{message}");
        ensure!(!message.contains("runs_moved_away") && !message.to_lowercase().contains("table"), "no database text: {message}");
        ensure!(status.as_ref().is_some_and(|s| s.metadata().get("retry-after").is_none()), "not presented as retryable");
        ensure!(server.stderr().contains("runs database error"), "the detail is logged\n{}", server.stderr());

        tamper.execute_unprepared("ALTER TABLE runs_moved_away RENAME TO runs").await?;
        let back = runs.get_run(get()).await?.into_inner();
        ensure!(back.run.is_some_and(|r| r.run_id == run.run_id), "{backend:?}: served again once the table is back");
    }
    Ok(())
}
