//! Compact checkpoints (issue #14 §5) against real `antler-runs` processes on SQLite and PostgreSQL:
//! rows hold deltas with a snapshot every `runs.checkpoint_snapshot_every`, every read equals the
//! whole state, large messages are stored once, and a state past the gRPC message limit is paged.

use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::common::{Message, PageRequest, content_part};
use antler_proto::runs::*;
use prost::Message as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde_json::json;

const T: Duration = Duration::from_secs(60);
/// What these clients accept in one answer (the server sends at most 16 MiB).
const LARGE: usize = 32 << 20;

fn text_of(message: &Message) -> String {
    message
        .content
        .iter()
        .filter_map(|p| match &p.part {
            Some(content_part::Part::Text(t)) => Some(t.text.clone()),
            _ => None,
        })
        .collect()
}

/// (step, bytes of `state`, encoding) of every checkpoint row of a run, by step.
async fn rows(db: &DatabaseConnection, backend: Backend, run_id: &str) -> anyhow::Result<Vec<(i64, i64, i64)>> {
    let (sql, backend_kind) = match backend {
        Backend::Sqlite => (
            format!("SELECT step, length(state) AS bytes, encoding FROM checkpoints WHERE run_id = '{run_id}' ORDER BY step"),
            sea_orm::DbBackend::Sqlite,
        ),
        Backend::Postgres => (
            format!(
                "SELECT step, octet_length(state)::BIGINT AS bytes, encoding::BIGINT AS encoding FROM checkpoints WHERE run_id = '{run_id}' ORDER BY step"
            ),
            sea_orm::DbBackend::Postgres,
        ),
    };
    let mut out = Vec::new();
    for row in db.query_all_raw(Statement::from_string(backend_kind, sql)).await? {
        out.push((row.try_get::<i64>("", "step")?, row.try_get::<i64>("", "bytes")?, row.try_get::<i64>("", "encoding")?));
    }
    Ok(out)
}

async fn count(db: &DatabaseConnection, backend: Backend, sql: &str) -> anyhow::Result<i64> {
    let kind = if backend == Backend::Sqlite { sea_orm::DbBackend::Sqlite } else { sea_orm::DbBackend::Postgres };
    let row = db.query_one_raw(Statement::from_string(kind, sql.to_owned())).await?.ok_or_else(|| anyhow::anyhow!("no row"))?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// Every checkpoint of a thread, newest first, with messages.
async fn history(
    threads: &mut thread_service_client::ThreadServiceClient<tonic::transport::Channel>,
    thread_id: &str,
) -> anyhow::Result<Vec<Checkpoint>> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = threads
            .list_thread_history(authed(
                ListThreadHistoryRequest {
                    thread_id: thread_id.to_owned(),
                    include_messages: true,
                    page: Some(PageRequest { page_size: 10, page_token: token.clone() }),
                    ..Default::default()
                },
                ALICE,
            ))
            .await?
            .into_inner();
        out.extend(page.checkpoints);
        token = page.page.map(|p| p.next_page_token).unwrap_or_default();
        if token.is_empty() {
            return Ok(out);
        }
    }
}

/// A run that creates thread `thread_id` and follows `steps`.
fn new_thread(thread_id: &str, steps: serde_json::Value) -> CreateRunRequest {
    CreateRunRequest { create_thread: true, ..run_request(thread_id, steps) }
}

fn say_text(i: usize) -> String {
    format!("step {i:03}: {}", "lorem ipsum dolor sit amet ".repeat(8))
}

/// A 200-step run: each step appends a message and checkpoints. The rows of step 10 and step 200
/// (both deltas) are the same size, the whole run stores a small fraction of what whole checkpoints
/// took, and every checkpoint reads back as the whole state (messages and values).
#[tokio::test]
async fn checkpoint_bytes_per_step_stay_flat_over_200_steps() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (runs, threads) = clients(&server).await?;
        let (mut runs, mut threads) = (runs.max_decoding_message_size(LARGE), threads.max_decoding_message_size(LARGE));
        let steps: Vec<serde_json::Value> = (0..200).flat_map(|i| [json!({"say": say_text(i)}), json!({"checkpoint": true})]).collect();
        let run = run_to_end(&mut runs, new_thread("t-200", json!(steps)), T).await?;
        assert_eq!(run.status(), RunStatus::Success, "{backend:?}: {:?}", run.error);

        let conn = db.connect().await?;
        let stored = rows(&conn, backend, &run.run_id).await?;
        assert_eq!(stored.len(), 200, "{backend:?}");
        assert!(stored.iter().all(|r| r.2 == 1), "{backend:?}: every row compact");
        let (step10, step200) = (stored[9], stored[199]);
        assert!(
            step200.1 <= step10.1 + 16 && step200.1 * 2 > step10.1,
            "{backend:?}: step 200's row is {} bytes, step 10's {}",
            step200.1,
            step10.1
        );

        // Every step reads back whole: the input, then one message per step so far.
        let all = history(&mut threads, "t-200").await?;
        assert_eq!(all.len(), 200, "{backend:?}");
        let mut whole_bytes = 0usize;
        for checkpoint in &all {
            let i = ((checkpoint.step - 1) / 2) as usize;
            let texts: Vec<String> = checkpoint.messages.iter().skip(1).map(text_of).collect();
            assert_eq!(texts, (0..=i).map(say_text).collect::<Vec<_>>(), "{backend:?}: step {}", checkpoint.step);
            let value = checkpoint.values.as_ref().and_then(|v| v.fields.get("script_step")).cloned();
            assert_eq!(value.and_then(|v| v.kind), Some(prost_types::value::Kind::NumberValue(checkpoint.step as f64)));
            // GetThreadState of that checkpoint reads the same.
            let state = threads
                .get_thread_state(authed(
                    GetThreadStateRequest {
                        thread_id: "t-200".into(),
                        checkpoint_id: checkpoint.checkpoint_id.clone(),
                        ..Default::default()
                    },
                    ALICE,
                ))
                .await?
                .into_inner()
                .state
                .and_then(|s| s.checkpoint)
                .unwrap_or_default();
            assert_eq!(&state, checkpoint, "{backend:?}: step {}", checkpoint.step);
            whole_bytes += checkpoint.encoded_len();
        }
        let compact: i64 = stored.iter().map(|r| r.1).sum();
        let blobs = count(&conn, backend, "SELECT CAST(COALESCE(SUM(LENGTH(content)), 0) AS BIGINT) FROM checkpoint_blobs").await?;
        let ratio = (compact + blobs) as f64 / whole_bytes as f64;
        assert!(ratio < 0.10, "{backend:?}: compact {compact} + blobs {blobs} bytes against {whole_bytes} whole ({ratio:.3})");
    }
    Ok(())
}

/// A run started from a delta checkpoint (a rollback to an older step) continues from exactly that
/// state; the older steps still read as before.
#[tokio::test]
async fn a_run_from_a_delta_checkpoint_continues_from_its_state() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (runs, threads) = clients(&server).await?;
        let (mut runs, mut threads) = (runs.max_decoding_message_size(LARGE), threads.max_decoding_message_size(LARGE));
        let steps: Vec<serde_json::Value> = (0..40).flat_map(|i| [json!({"say": say_text(i)}), json!({"checkpoint": true})]).collect();
        let first = run_to_end(&mut runs, new_thread("t-back", json!(steps)), T).await?;
        assert_eq!(first.status(), RunStatus::Success, "{backend:?}");
        let before = history(&mut threads, "t-back").await?;
        // Step 5 of 40 (script step 9): a delta, 4 from its snapshot.
        let target = before.iter().find(|c| c.step == 9).cloned().ok_or_else(|| anyhow::anyhow!("no step 9"))?;
        let conn = db.connect().await?;
        assert_eq!(rows(&conn, backend, &first.run_id).await?[4].2, 1);

        let mut request = run_request("t-back", json!([{"say": "after rollback"}, {"checkpoint": true}]));
        request.checkpoint_id = target.checkpoint_id.clone();
        let second = run_to_end(&mut runs, request, T).await?;
        assert_eq!(second.status(), RunStatus::Success, "{backend:?}: {:?}", second.error);
        let head = threads
            .get_thread_state(authed(GetThreadStateRequest { thread_id: "t-back".into(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .state
            .and_then(|s| s.checkpoint)
            .unwrap_or_default();
        let n = target.messages.len();
        assert_eq!(head.messages[..n], target.messages[..], "{backend:?}: the rolled-back state, then the new run's");
        assert_eq!(head.messages.iter().skip(n + 1).map(text_of).collect::<Vec<_>>(), vec!["after rollback".to_owned()]);
        // The older branch is unchanged.
        let after = history(&mut threads, "t-back").await?;
        for old in &before {
            assert!(after.contains(old), "{backend:?}: step {} changed", old.step);
        }
    }
    Ok(())
}

/// kill -9 after twenty checkpoints (the last a delta); the takeover resumes from that delta's whole
/// state and the run's final state has every message once.
#[tokio::test]
async fn a_takeover_resumes_from_a_delta_checkpoint() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let first = start_runs(&db, "")?;
        let (mut runs, _) = clients(&first).await?;
        let mut steps: Vec<serde_json::Value> = (0..20).flat_map(|i| [json!({"say": say_text(i)}), json!({"checkpoint": true})]).collect();
        steps.push(json!({"sleep_ms": 2000}));
        steps.extend((20..25).flat_map(|i| [json!({"say": say_text(i)}), json!({"checkpoint": true})]));
        let run = runs.create_run(authed(new_thread("t-take", json!(steps)), ALICE)).await?.into_inner().run.unwrap_or_default();
        let conn = db.connect().await?;
        let deadline = std::time::Instant::now() + T;
        while rows(&conn, backend, &run.run_id).await?.len() < 20 {
            anyhow::ensure!(std::time::Instant::now() < deadline, "{backend:?}: 20 checkpoints not written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut first = first;
        first.signal(libc::SIGKILL)?;
        first.wait_exit(Duration::from_secs(5))?;
        let written = rows(&conn, backend, &run.run_id).await?;
        assert_eq!((written.len(), written[19].2), (20, 1), "{backend:?}: killed during the sleep, the last row a delta");

        let second = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&second).await?;
        let done = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
        assert_eq!((done.status(), done.attempt), (RunStatus::Success, 2), "{backend:?}: {:?}", done.error);
        let head = threads
            .get_thread_state(authed(GetThreadStateRequest { thread_id: "t-take".into(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .state
            .and_then(|s| s.checkpoint)
            .unwrap_or_default();
        let texts: Vec<String> = head.messages.iter().skip(1).map(text_of).collect();
        assert_eq!(texts, (0..25).map(say_text).collect::<Vec<_>>(), "{backend:?}");
        assert_eq!(rows(&conn, backend, &run.run_id).await?.len(), 25);
    }
    Ok(())
}

/// One 200 KB message followed by 40 steps: every snapshot after it holds it, yet it is stored once.
#[tokio::test]
async fn a_large_message_in_many_checkpoints_is_stored_once() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "  checkpoint_snapshot_every: 4\n")?;
        let (runs, threads) = clients(&server).await?;
        let (mut runs, mut threads) = (runs.max_decoding_message_size(LARGE), threads.max_decoding_message_size(LARGE));
        let big = "tool-output-line\n".repeat(12_000);
        let mut steps = vec![json!({"say": big.clone()}), json!({"checkpoint": true})];
        steps.extend((0..40).flat_map(|i| [json!({"say": format!("small {i}")}), json!({"checkpoint": true})]));
        let run = run_to_end(&mut runs, new_thread("t-big", json!(steps)), T).await?;
        assert_eq!(run.status(), RunStatus::Success, "{backend:?}");
        let conn = db.connect().await?;
        let stored = rows(&conn, backend, &run.run_id).await?;
        let snapshots = stored.len() / 4;
        assert!(snapshots >= 10, "{backend:?}: {snapshots} snapshots hold the big message");
        // The script input (over the blob threshold too) and the big message.
        assert_eq!(count(&conn, backend, "SELECT COUNT(*) FROM checkpoint_blobs").await?, 2, "{backend:?}");
        let total: i64 = stored.iter().map(|r| r.1).sum();
        assert!(total < big.len() as i64 / 4, "{backend:?}: checkpoint rows hold {total} bytes");
        let all = history(&mut threads, "t-big").await?;
        assert!(all.iter().all(|c| c.messages.get(1).map(text_of).as_deref() == Some(big.as_str())), "{backend:?}");
        // Deleting the thread deletes its blobs.
        threads.delete_thread(authed(DeleteThreadRequest { thread_id: "t-big".into(), ..Default::default() }, ALICE)).await?;
        assert_eq!(count(&conn, backend, "SELECT COUNT(*) FROM checkpoint_blobs").await?, 0, "{backend:?}");
    }
    Ok(())
}

/// A thread whose state is about 18 MiB (three runs of 3 MiB inputs echoed back): GetThreadState and
/// WaitRun answer with the newest messages within `runs.state_max_message_bytes` and a token, and
/// the pages put together are the whole list.
#[tokio::test]
async fn a_state_past_the_message_limit_is_paged() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "  max_request_bytes: 8388608\n")?;
        let (runs, threads) = clients(&server).await?;
        let (mut runs, mut threads) = (runs.max_decoding_message_size(LARGE), threads.max_decoding_message_size(LARGE));
        let mut last = None;
        for i in 0..3 {
            let input = format!("{i}{}", "y".repeat(3 * 1024 * 1024));
            let request = CreateRunRequest {
                thread_id: "t-huge".into(),
                create_thread: i == 0,
                input: vec![user_text(&input)],
                ..Default::default()
            };
            let response = runs.wait_run(authed(WaitRunRequest { create: Some(request) }, ALICE)).await?.into_inner();
            assert_eq!(response.run.as_ref().map(|r| r.status()), Some(RunStatus::Success), "{backend:?}");
            last = response.state;
        }
        let waited = last.unwrap_or_default();
        assert_eq!(waited.messages_total, 6, "{backend:?}");
        assert!(waited.checkpoint.as_ref().map(|c| c.encoded_len()).unwrap_or(0) <= 8 * 1024 * 1024 + 1024);
        assert!(!waited.messages_next_page_token.is_empty(), "{backend:?}: WaitRun left older messages out");

        let mut pages: Vec<Vec<Message>> = Vec::new();
        let mut token = String::new();
        loop {
            let state = threads
                .get_thread_state(authed(
                    GetThreadStateRequest { thread_id: "t-huge".into(), messages_page_token: token.clone(), ..Default::default() },
                    ALICE,
                ))
                .await?
                .into_inner()
                .state
                .unwrap_or_default();
            let checkpoint = state.checkpoint.unwrap_or_default();
            assert!(checkpoint.encoded_len() <= 8 * 1024 * 1024 + 1024, "{backend:?}: {} bytes", checkpoint.encoded_len());
            assert_eq!(state.messages_offset as usize + checkpoint.messages.len(), 6 - pages.iter().map(Vec::len).sum::<usize>());
            pages.push(checkpoint.messages);
            token = state.messages_next_page_token;
            if token.is_empty() {
                break;
            }
        }
        assert!(pages.len() >= 3, "{backend:?}: {} pages", pages.len());
        let whole: Vec<String> = pages.into_iter().rev().flatten().map(|m| text_of(&m).chars().take(8).collect()).collect();
        let first = |i: usize| format!("{i}yyyyyyy");
        let echo = |i: usize| format!("echo: {i}y");
        assert_eq!(whole, vec![first(0), echo(0), first(1), echo(1), first(2), echo(2)], "{backend:?}");

        // A count bound, and a token that is not one.
        let state = threads
            .get_thread_state(authed(GetThreadStateRequest { thread_id: "t-huge".into(), messages_limit: 1, ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .state
            .unwrap_or_default();
        assert_eq!((state.messages_offset, state.checkpoint.map(|c| c.messages.len())), (5, Some(1)));
        let bad = threads
            .get_thread_state(authed(
                GetThreadStateRequest { thread_id: "t-huge".into(), messages_page_token: "zz".into(), ..Default::default() },
                ALICE,
            ))
            .await
            .err()
            .map(|s| (s.code(), s.message().contains("messages_page_token")));
        assert_eq!(bad, Some((tonic::Code::InvalidArgument, true)), "{backend:?}");
    }
    Ok(())
}

/// A whole checkpoint as rows were written before compact checkpoints (`encoding` 0) reads as it
/// did, and the next run stores its delta against it.
#[tokio::test]
async fn a_whole_checkpoint_of_before_still_reads_and_takes_deltas() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&server).await?;
        let first = run_to_end(&mut runs, new_thread("t-old", json!([{"say": say_text(0)}, {"checkpoint": true}])), T).await?;
        assert_eq!(first.status(), RunStatus::Success, "{backend:?}");
        let get = |threads: &mut thread_service_client::ThreadServiceClient<tonic::transport::Channel>| {
            let mut threads = threads.clone();
            async move {
                anyhow::Ok(
                    threads
                        .get_thread_state(authed(GetThreadStateRequest { thread_id: "t-old".into(), ..Default::default() }, ALICE))
                        .await?
                        .into_inner()
                        .state
                        .and_then(|s| s.checkpoint)
                        .unwrap_or_default(),
                )
            }
        };
        let whole = get(&mut threads).await?;
        // Rewrite the row the way it was stored before the migration.
        let conn = db.connect().await?;
        let (kind, sql) = match backend {
            Backend::Sqlite => (sea_orm::DbBackend::Sqlite, "UPDATE checkpoints SET state = ?, encoding = 0 WHERE checkpoint_id = ?"),
            Backend::Postgres => (sea_orm::DbBackend::Postgres, "UPDATE checkpoints SET state = $1, encoding = 0 WHERE checkpoint_id = $2"),
        };
        conn.execute_raw(Statement::from_sql_and_values(kind, sql, [whole.encode_to_vec().into(), whole.checkpoint_id.clone().into()]))
            .await?;
        assert_eq!(rows(&conn, backend, &first.run_id).await?[0].2, 0);
        assert_eq!(get(&mut threads).await?, whole, "{backend:?}: the whole row reads as before");

        let second = run_to_end(&mut runs, run_request("t-old", json!([{"say": say_text(1)}, {"checkpoint": true}])), T).await?;
        assert_eq!(second.status(), RunStatus::Success, "{backend:?}");
        let head = get(&mut threads).await?;
        assert_eq!(head.messages[..whole.messages.len()], whole.messages[..], "{backend:?}");
        assert_eq!(head.messages.last().map(text_of), Some(say_text(1)));
        let row = rows(&conn, backend, &second.run_id).await?;
        assert_eq!(row[0].2, 1, "{backend:?}: the new row is compact");
        // Only the two new messages (the run's input and its answer), not the old ones again.
        let appended: usize = head.messages[whole.messages.len()..].iter().map(|m| m.encoded_len() + 4).sum();
        assert!((row[0].1 as usize) < appended + 256, "{backend:?}: {} bytes, a delta against the old whole row", row[0].1);
    }
    Ok(())
}
