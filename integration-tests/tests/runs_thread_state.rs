//! ThreadService for DeerFlow's UI (issue #33), on SQLite and PostgreSQL: ListThreads sorted by
//! created_at or updated_at in either direction with stable page tokens (a token of another sort is
//! refused) and a `values.title` filter, and UpdateThreadState — a checkpoint written outside a run,
//! the title on the thread, a fork from an older checkpoint, refused while a run is active.

use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, TestDb};
use antler_integration_tests::runs::*;
use antler_proto::common::PageRequest;
use antler_proto::runs::thread_service_client::ThreadServiceClient;
use antler_proto::runs::*;
use serde_json::json;
use tonic::transport::Channel;

const T: Duration = Duration::from_secs(30);

fn string(s: &str) -> prost_types::Value {
    prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(s.to_owned())) }
}

fn fields(pairs: &[(&str, prost_types::Value)]) -> prost_types::Struct {
    prost_types::Struct { fields: pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect() }
}

/// Every page of ListThreads in `sort` / `order` (metadata `batch` = `batch`), `page_size` at a time.
async fn pages(
    threads: &mut ThreadServiceClient<Channel>,
    batch: &str,
    sort: ThreadSort,
    order: SortOrder,
    page_size: u32,
) -> anyhow::Result<Vec<String>> {
    let (mut ids, mut token) = (Vec::new(), String::new());
    loop {
        let request = ListThreadsRequest {
            metadata: Some(fields(&[("batch", string(batch))])),
            page: Some(PageRequest { page_size, page_token: token.clone() }),
            sort_by: sort as i32,
            sort_order: order as i32,
            ..Default::default()
        };
        let page = threads.list_threads(authed(request, ALICE)).await?.into_inner();
        ids.extend(page.threads.into_iter().map(|t| t.thread_id));
        token = page.page.unwrap_or_default().next_page_token;
        if token.is_empty() {
            return Ok(ids);
        }
        anyhow::ensure!(ids.len() < 1000, "paging does not end");
    }
}

/// The threads' ids ordered by `at` (ascending), ties by id.
fn ordered(threads: &[Thread], at: impl Fn(&Thread) -> Option<prost_types::Timestamp>) -> Vec<String> {
    let mut keyed: Vec<_> = threads.iter().map(|t| (at(t).map(|a| (a.seconds, a.nanos)), t.thread_id.clone())).collect();
    keyed.sort();
    keyed.into_iter().map(|(_, id)| id).collect()
}

#[tokio::test]
async fn threads_sort_by_creation_or_change_either_way_in_stable_pages() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (_runs, mut threads) = clients(&server).await?;
        let ids: Vec<String> = (0..7).map(|i| format!("s-{i}")).collect();
        for id in &ids {
            let metadata = Some(fields(&[("batch", string("sorted"))]));
            threads.create_thread(authed(CreateThreadRequest { thread_id: id.clone(), metadata, ..Default::default() }, ALICE)).await?;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        // Changed in another order than created: s-0 last, so it is the most recently updated.
        for id in ["s-4", "s-2", "s-6", "s-0"] {
            let metadata = Some(fields(&[("touched", string(id))]));
            threads.update_thread(authed(UpdateThreadRequest { thread_id: id.to_string(), title: None, metadata }, ALICE)).await?;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let mut all = Vec::new();
        for id in &ids {
            all.extend(threads.get_thread(authed(GetThreadRequest { thread_id: id.clone() }, ALICE)).await?.into_inner().thread);
        }
        let by_created = ordered(&all, |t| t.created_at);
        let by_updated = ordered(&all, |t| t.updated_at);
        assert_eq!(by_updated.last().map(String::as_str), Some("s-0"), "{backend:?}");
        assert_ne!(by_created, by_updated, "{backend:?}: the two orders differ, so the test tells them apart");
        let reversed = |v: &[String]| v.iter().rev().cloned().collect::<Vec<_>>();
        for page_size in [2, 3, 50] {
            for (sort, order, want) in [
                (ThreadSort::Unspecified, SortOrder::Unspecified, reversed(&by_created)),
                (ThreadSort::CreatedAt, SortOrder::Asc, by_created.clone()),
                (ThreadSort::UpdatedAt, SortOrder::Desc, reversed(&by_updated)),
                (ThreadSort::UpdatedAt, SortOrder::Asc, by_updated.clone()),
            ] {
                let got = pages(&mut threads, "sorted", sort, order, page_size).await?;
                assert_eq!(got, want, "{backend:?}: {sort:?} {order:?} by {page_size}");
            }
        }

        // A token carries its sort: read back under another one, it is refused by name.
        let first = threads
            .list_threads(authed(
                ListThreadsRequest {
                    page: Some(PageRequest { page_size: 2, page_token: String::new() }),
                    sort_by: ThreadSort::UpdatedAt as i32,
                    ..Default::default()
                },
                ALICE,
            ))
            .await?
            .into_inner();
        let token = first.page.unwrap_or_default().next_page_token;
        assert!(!token.is_empty(), "{backend:?}");
        let mixed = threads
            .list_threads(authed(
                ListThreadsRequest { page: Some(PageRequest { page_size: 2, page_token: token }), ..Default::default() },
                ALICE,
            ))
            .await;
        let status = mixed.err().map(|s| (s.code(), s.message().to_owned()));
        assert!(
            matches!(&status, Some((tonic::Code::InvalidArgument, m)) if m.contains("page.page_token") && m.contains("sort")),
            "{backend:?}: {status:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn threads_are_found_by_title_and_other_channels_are_refused_by_name() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (_runs, mut threads) = clients(&server).await?;
        for (id, title) in [("a", "Trip to Lisbon"), ("b", "Budget"), ("c", "Trip to Lisbon")] {
            threads
                .create_thread(authed(CreateThreadRequest { thread_id: id.into(), title: title.into(), ..Default::default() }, ALICE))
                .await?;
        }
        threads
            .create_thread(authed(CreateThreadRequest { thread_id: "a".into(), title: "Trip to Lisbon".into(), ..Default::default() }, BOB))
            .await?;
        let by_title = |title: &str| ListThreadsRequest { values: Some(fields(&[("title", string(title))])), ..Default::default() };
        let found = threads.list_threads(authed(by_title("Trip to Lisbon"), ALICE)).await?.into_inner().threads;
        assert_eq!(found.iter().map(|t| t.thread_id.as_str()).collect::<Vec<_>>(), ["c", "a"], "{backend:?}: alice's two, newest first");
        assert!(threads.list_threads(authed(by_title("Trip"), ALICE)).await?.into_inner().threads.is_empty(), "{backend:?}: exact match");
        let todos = ListThreadsRequest { values: Some(fields(&[("todos", string("x"))])), ..Default::default() };
        let refused = threads.list_threads(authed(todos, ALICE)).await.err().map(|s| (s.code(), s.message().to_owned()));
        assert!(
            matches!(&refused, Some((tonic::Code::InvalidArgument, m)) if m.contains("values.todos") && m.contains("title")),
            "{backend:?}: {refused:?}"
        );
    }
    Ok(())
}

async fn update_state(
    threads: &mut ThreadServiceClient<Channel>,
    key: &str,
    thread_id: &str,
    values: prost_types::Struct,
    checkpoint_id: &str,
) -> Result<UpdateThreadStateResponse, tonic::Status> {
    let request =
        UpdateThreadStateRequest { thread_id: thread_id.to_owned(), values: Some(values), checkpoint_id: checkpoint_id.to_owned() };
    threads.update_thread_state(authed(request, key)).await.map(tonic::Response::into_inner)
}

async fn head(threads: &mut ThreadServiceClient<Channel>, thread_id: &str, checkpoint_id: &str) -> anyhow::Result<Checkpoint> {
    let request = GetThreadStateRequest { thread_id: thread_id.to_owned(), checkpoint_id: checkpoint_id.to_owned(), ..Default::default() };
    let state = threads.get_thread_state(authed(request, ALICE)).await?.into_inner().state.unwrap_or_default();
    state.checkpoint.ok_or_else(|| anyhow::anyhow!("thread {thread_id} has no checkpoint"))
}

fn title_of(checkpoint: &Checkpoint) -> Option<String> {
    match checkpoint.values.as_ref()?.fields.get("title")?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

#[tokio::test]
async fn a_state_update_writes_a_checkpoint_and_the_title_outside_a_run() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&server).await?;
        threads.create_thread(authed(CreateThreadRequest { thread_id: "u".into(), ..Default::default() }, ALICE)).await?;

        // Before any run: the thread's first checkpoint, with no messages.
        let first = update_state(&mut threads, ALICE, "u", fields(&[("title", string("Early name"))]), "").await?;
        let written = first.checkpoint.unwrap_or_default();
        assert_eq!(
            (written.source.as_str(), written.run_id.as_str(), written.parent_checkpoint_id.as_str()),
            ("update", "", ""),
            "{backend:?}"
        );
        assert_eq!(first.thread.map(|t| t.title), Some("Early name".to_owned()), "{backend:?}");

        run_to_end(&mut runs, run_request("u", json!([{"say": "one"}, {"checkpoint": true}])), T).await?;
        let after_run = head(&mut threads, "u", "").await?;
        assert_eq!(after_run.parent_checkpoint_id, written.checkpoint_id, "{backend:?}: the run started from the update");
        assert_eq!(after_run.messages.len(), 2, "{backend:?}");

        // A rename on the head keeps every message and sets the thread's title.
        let renamed = update_state(&mut threads, ALICE, "u", fields(&[("title", string("Renamed"))]), "").await?;
        let checkpoint = renamed.checkpoint.unwrap_or_default();
        assert_eq!(checkpoint.parent_checkpoint_id, after_run.checkpoint_id, "{backend:?}");
        let now = head(&mut threads, "u", "").await?;
        assert_eq!(now.checkpoint_id, checkpoint.checkpoint_id, "{backend:?}: the update is the head");
        assert_eq!(now.messages, after_run.messages, "{backend:?}: the messages are the parent's");
        assert_eq!(title_of(&now), Some("Renamed".to_owned()), "{backend:?}");
        assert!(now.values.as_ref().is_some_and(|v| v.fields.contains_key("script_step")), "{backend:?}: the other channels are kept");
        let thread =
            threads.get_thread(authed(GetThreadRequest { thread_id: "u".into() }, ALICE)).await?.into_inner().thread.unwrap_or_default();
        assert_eq!(thread.title, "Renamed", "{backend:?}");
        let history = threads
            .list_thread_history(authed(ListThreadHistoryRequest { thread_id: "u".into(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .checkpoints;
        assert_eq!(history.first().map(|c| c.source.as_str()), Some("update"), "{backend:?}: newest first");

        // On an older checkpoint: a fork, whose messages are that checkpoint's.
        let forked = update_state(&mut threads, ALICE, "u", fields(&[("title", string("Forked"))]), &written.checkpoint_id).await?;
        let fork = head(&mut threads, "u", "").await?;
        assert_eq!(fork.checkpoint_id, forked.checkpoint.unwrap_or_default().checkpoint_id, "{backend:?}");
        assert_eq!((fork.parent_checkpoint_id.as_str(), fork.messages.len()), (written.checkpoint_id.as_str(), 0), "{backend:?}");

        // What cannot be written is named; nothing was written for it.
        for (values, field) in [
            (fields(&[("messages", string("x"))]), "values.messages"),
            (fields(&[("todos", string("x"))]), "values.todos"),
            (fields(&[("title", string(&"x".repeat(257)))]), "values.title"),
            (fields(&[]), "values"),
        ] {
            let refused = update_state(&mut threads, ALICE, "u", values, "").await.err().map(|s| (s.code(), s.message().to_owned()));
            assert!(
                matches!(&refused, Some((tonic::Code::InvalidArgument, m)) if m.starts_with(field)),
                "{backend:?}: {field}: {refused:?}"
            );
        }
        assert_eq!(head(&mut threads, "u", "").await?.checkpoint_id, fork.checkpoint_id, "{backend:?}");
        let missing = update_state(&mut threads, ALICE, "u", fields(&[("title", string("x"))]), "no-such-checkpoint").await;
        assert_eq!(missing.err().map(|s| s.code()), Some(tonic::Code::NotFound), "{backend:?}");
        // Another user's thread looks missing.
        let theirs = update_state(&mut threads, BOB, "u", fields(&[("title", string("mine"))]), "").await;
        assert_eq!(theirs.err().map(|s| s.code()), Some(tonic::Code::NotFound), "{backend:?}");

        // While a run is active: ABORTED naming the run, and the state is as it was.
        let active =
            runs.create_run(authed(run_request("u", json!([{"wait_cancel": true}])), ALICE)).await?.into_inner().run.unwrap_or_default();
        wait_run(&mut runs, ALICE, &active.run_id, T, |r| r.status() == RunStatus::Running).await?;
        let busy = update_state(&mut threads, ALICE, "u", fields(&[("title", string("Too soon"))]), "").await;
        let busy = busy.err().map(|s| (s.code(), s.message().to_owned()));
        assert!(matches!(&busy, Some((tonic::Code::Aborted, m)) if m.contains(&active.run_id)), "{backend:?}: {busy:?}");
        runs.cancel_run(authed(CancelRunRequest { run_id: active.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
        assert_eq!(title_of(&head(&mut threads, "u", "").await?), Some("Forked".to_owned()), "{backend:?}");
        let thread =
            threads.get_thread(authed(GetThreadRequest { thread_id: "u".into() }, ALICE)).await?.into_inner().thread.unwrap_or_default();
        assert_eq!(thread.title, "Forked", "{backend:?}");
    }
    Ok(())
}

/// A rename (UpdateThreadState) racing a run's admission on the same thread, many times over: whichever
/// commits first, a rename that succeeded is never lost under the run. Either the run was admitted first
/// (the rename is ABORTED naming it), or the run starts from the renamed checkpoint, or the rename came
/// after the run had finished (it is the head). Before admission read the head again under the thread's
/// row, PostgreSQL let a run admitted at the same moment start from the head before the rename, so the
/// run's checkpoints forked off it and buried the rename.
#[tokio::test]
async fn a_rename_racing_an_admission_is_never_lost_under_the_run() -> anyhow::Result<()> {
    const ROUNDS: usize = 40;
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&server).await?;
        let (mut runs_b, mut threads_b) = clients(&server).await?;
        let (mut renamed_first, mut after_the_run, mut admitted_first) = (0, 0, 0);
        for round in 0..ROUNDS {
            let thread_id = format!("race-{round}");
            threads.create_thread(authed(CreateThreadRequest { thread_id: thread_id.clone(), ..Default::default() }, ALICE)).await?;
            // A first run, so the thread has a head for both to read.
            run_to_end(&mut runs, run_request(&thread_id, json!([{"say": "before"}, {"checkpoint": true}])), T).await?;
            let title = format!("Renamed {round}");
            let (renamed, created) = tokio::join!(
                update_state(&mut threads_b, ALICE, &thread_id, fields(&[("title", string(&title))]), ""),
                runs_b.create_run(authed(run_request(&thread_id, json!([{"say": "after"}, {"checkpoint": true}])), ALICE)),
            );
            let run = created?.into_inner().run.unwrap_or_default();
            wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
            let events = run_events(&mut runs, ALICE, &run.run_id).await?;
            let base = match events.first().and_then(|e| e.kind.as_ref()) {
                Some(run_event::Kind::Metadata(m)) => m.checkpoint_id.clone(),
                other => anyhow::bail!("{backend:?} round {round}: the run's first event is {other:?}"),
            };
            let now = head(&mut threads, &thread_id, "").await?;
            match renamed {
                Ok(response) => {
                    let rename = response.checkpoint.unwrap_or_default();
                    if base == rename.checkpoint_id {
                        renamed_first += 1;
                        assert_eq!(
                            now.parent_checkpoint_id, rename.checkpoint_id,
                            "{backend:?} round {round}: the run continues the rename"
                        );
                    } else {
                        after_the_run += 1;
                        assert_eq!(
                            now.checkpoint_id, rename.checkpoint_id,
                            "{backend:?} round {round}: the rename (over {}) succeeded, but run {} started from {base} and its checkpoint {} is the head",
                            rename.parent_checkpoint_id, run.run_id, now.checkpoint_id
                        );
                        assert_eq!(title_of(&now), Some(title.clone()), "{backend:?} round {round}");
                    }
                }
                Err(status) => {
                    admitted_first += 1;
                    assert!(
                        status.code() == tonic::Code::Aborted && status.message().contains(&run.run_id),
                        "{backend:?} round {round}: {status:?}"
                    );
                    assert_eq!(now.parent_checkpoint_id, base, "{backend:?} round {round}: the run continues the head it was admitted on");
                }
            }
        }
        println!(
            "{backend:?}: {ROUNDS} races: the run started from the rename in {renamed_first}, the rename followed the run in {after_the_run}, the rename was refused in {admitted_first}"
        );
    }
    Ok(())
}
