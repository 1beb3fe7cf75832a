//! Lists and sums done in SQL (issue #15), on SQLite and PostgreSQL: ListThreads' metadata and status
//! filters before the page's LIMIT, GetTokenUsage's aggregates and context window fill,
//! ListRunEvents' `task_id` filter before the LIMIT, and the sweeper working in batches.

use std::collections::HashSet;
use std::time::Duration;

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::common::PageRequest;
use antler_proto::runs::thread_service_client::ThreadServiceClient;
use antler_proto::runs::*;
use serde_json::json;
use tonic::transport::Channel;

const T: Duration = Duration::from_secs(30);

fn value(kind: prost_types::value::Kind) -> prost_types::Value {
    prost_types::Value { kind: Some(kind) }
}

fn metadata(pairs: &[(&str, prost_types::value::Kind)]) -> prost_types::Struct {
    prost_types::Struct { fields: pairs.iter().map(|(k, v)| ((*k).to_owned(), value(v.clone()))).collect() }
}

fn text(s: &str) -> prost_types::value::Kind {
    prost_types::value::Kind::StringValue(s.to_owned())
}

/// Every page of ListThreads with `filter` and `status`, `page_size` at a time: the thread ids in
/// order, and the size of each page.
async fn all_pages(
    threads: &mut ThreadServiceClient<Channel>,
    filter: Option<prost_types::Struct>,
    status: ThreadStatus,
    page_size: u32,
) -> anyhow::Result<(Vec<String>, Vec<usize>)> {
    let (mut ids, mut sizes, mut token) = (Vec::new(), Vec::new(), String::new());
    loop {
        let request = ListThreadsRequest {
            metadata: filter.clone(),
            status: status as i32,
            page: Some(PageRequest { page_size, page_token: token.clone() }),
            ..Default::default()
        };
        let page = threads.list_threads(authed(request, ALICE)).await?.into_inner();
        sizes.push(page.threads.len());
        for thread in page.threads.iter().filter(|_| status != ThreadStatus::Unspecified) {
            assert_eq!(thread.status, status as i32, "{status:?} filter returned {}: {:?}", thread.thread_id, thread.status());
        }
        ids.extend(page.threads.into_iter().map(|t| t.thread_id));
        token = page.page.unwrap_or_default().next_page_token;
        if token.is_empty() {
            return Ok((ids, sizes));
        }
        anyhow::ensure!(sizes.len() < 500, "paging does not end");
    }
}

/// 150 threads, a handful matching each filter: every page is full until the last, newest first,
/// each thread once; metadata values match by JSON type and value; statuses are derived in SQL.
#[tokio::test]
async fn thread_filters_run_in_sql_and_pages_fill_up() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&server).await?;
        let ids: Vec<String> = (0..150).map(|i| format!("t-{i:03}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let team = if i % 50 == 7 { "blue" } else { "red" };
            let mut fields = vec![("team", text(team)), ("n", prost_types::value::Kind::NumberValue((i % 3) as f64))];
            // A boolean and a number 1 must not match each other; nor a string "1".
            match i {
                10 => fields.push(("flag", prost_types::value::Kind::BoolValue(true))),
                11 => fields.push(("flag", prost_types::value::Kind::NumberValue(1.0))),
                12 => fields.push(("flag", text("1"))),
                13 => fields.push(("flag", prost_types::value::Kind::StructValue(metadata(&[("a", text("b"))])))),
                _ => {}
            }
            threads
                .create_thread(authed(
                    CreateThreadRequest { thread_id: id.clone(), metadata: Some(metadata(&fields)), ..Default::default() },
                    ALICE,
                ))
                .await?;
        }
        // Bob's threads never show up in Alice's list.
        threads
            .create_thread(authed(
                CreateThreadRequest {
                    thread_id: "t-bob".into(),
                    metadata: Some(metadata(&[("team", text("blue"))])),
                    ..Default::default()
                },
                BOB,
            ))
            .await?;

        // Few among many, across a page boundary.
        let blue = Some(metadata(&[("team", text("blue"))]));
        let (found, sizes) = all_pages(&mut threads, blue.clone(), ThreadStatus::Unspecified, 2).await?;
        assert_eq!(found, vec!["t-107", "t-057", "t-007"], "{backend:?}: newest first, each once");
        assert_eq!(sizes[..2], [2, 1], "{backend:?}: a page holds page_size matches, not page_size scanned rows");
        let two_keys = Some(metadata(&[("team", text("blue")), ("n", prost_types::value::Kind::NumberValue(1.0))]));
        assert_eq!(all_pages(&mut threads, two_keys, ThreadStatus::Unspecified, 10).await?.0, vec!["t-007"], "{backend:?}");
        for (flag, want) in [
            (prost_types::value::Kind::BoolValue(true), "t-010"),
            (prost_types::value::Kind::NumberValue(1.0), "t-011"),
            (text("1"), "t-012"),
            (prost_types::value::Kind::StructValue(metadata(&[("a", text("b"))])), "t-013"),
        ] {
            let filter = Some(metadata(&[("flag", flag.clone())]));
            assert_eq!(all_pages(&mut threads, filter, ThreadStatus::Unspecified, 50).await?.0, vec![want], "{backend:?}: {flag:?}");
        }
        assert!(all_pages(&mut threads, Some(metadata(&[("team", text("green"))])), ThreadStatus::Unspecified, 5).await?.0.is_empty());

        // Statuses: ERROR (failed run), INTERRUPTED (clarification), BUSY (active), IDLE (the rest).
        let failed = run_to_end(&mut runs, run_request("t-020", json!([{"fail": "boom"}])), T).await?;
        assert_eq!(failed.status(), RunStatus::Error, "{backend:?}");
        let asked = run_to_end(&mut runs, run_request("t-030", json!([{"stop_reason": "clarification"}])), T).await?;
        assert_eq!(asked.stop_reason, "clarification", "{backend:?}");
        let fine = run_to_end(&mut runs, run_request("t-040", json!([{"say": "ok"}])), T).await?;
        assert_eq!(fine.status(), RunStatus::Success, "{backend:?}");
        let busy = runs
            .create_run(authed(run_request("t-057", json!([{"wait_cancel": true}])), ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        wait_run(&mut runs, ALICE, &busy.run_id, T, |r| r.status() == RunStatus::Running).await?;

        assert_eq!(all_pages(&mut threads, None, ThreadStatus::Error, 1).await?.0, vec!["t-020"], "{backend:?}");
        assert_eq!(all_pages(&mut threads, None, ThreadStatus::Interrupted, 1).await?.0, vec!["t-030"], "{backend:?}");
        let (busy_ids, _) = all_pages(&mut threads, None, ThreadStatus::Busy, 1).await?;
        assert_eq!(busy_ids, vec!["t-057"], "{backend:?}");
        let (idle, sizes) = all_pages(&mut threads, None, ThreadStatus::Idle, 40).await?;
        assert_eq!(idle.len(), 147, "{backend:?}");
        assert_eq!(idle.iter().collect::<HashSet<_>>().len(), 147, "{backend:?}: each once");
        assert!(sizes[..sizes.len() - 1].iter().all(|s| *s == 40), "{backend:?}: {sizes:?}");
        let mut expected: Vec<String> = ids.iter().filter(|id| !["t-020", "t-030", "t-057"].contains(&id.as_str())).cloned().collect();
        expected.reverse();
        assert_eq!(idle, expected, "{backend:?}: newest first");
        // Both filters at once.
        assert_eq!(all_pages(&mut threads, blue.clone(), ThreadStatus::Busy, 5).await?.0, vec!["t-057"], "{backend:?}");
        assert_eq!(all_pages(&mut threads, blue, ThreadStatus::Idle, 5).await?.0, vec!["t-107", "t-007"], "{backend:?}");
        // The list reports the same status and active run as GetThread.
        let listed = threads
            .list_threads(authed(ListThreadsRequest { status: ThreadStatus::Busy as i32, ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .threads;
        assert_eq!(listed.first().map(|t| t.active_run_id.clone()), Some(busy.run_id.clone()), "{backend:?}");
        runs.cancel_run(authed(CancelRunRequest { run_id: busy.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
    }
    Ok(())
}

/// GetTokenUsage sums in SQL: totals, per model (with run counts) and per caller over the thread's
/// terminal runs, active ones only when asked, nothing of other threads.
#[tokio::test]
async fn token_usage_is_summed_per_thread_model_and_caller() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, mut threads) = clients(&server).await?;
        threads.create_thread(authed(CreateThreadRequest { thread_id: "u".into(), ..Default::default() }, ALICE)).await?;
        threads.create_thread(authed(CreateThreadRequest { thread_id: "other".into(), ..Default::default() }, ALICE)).await?;
        let usage = |model: &str, caller: &str, input: u64, output: u64| json!({"usage": {"model": model, "caller": caller, "input": input, "output": output}});
        let first = json!([usage("m1", "lead_agent", 10, 5), usage("m2", "middleware:title", 3, 1)]);
        run_to_end(&mut runs, run_request("u", first), T).await?;
        run_to_end(&mut runs, run_request("u", json!([usage("m1", "subagent:bash", 20, 2)])), T).await?;
        run_to_end(&mut runs, run_request("other", json!([usage("m1", "lead_agent", 1000, 1000)])), T).await?;
        let active = runs
            .create_run(authed(run_request("u", json!([usage("m3", "lead_agent", 100, 0), {"wait_cancel": true}])), ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        wait_run(&mut runs, ALICE, &active.run_id, T, |r| r.usage.as_ref().is_some_and(|u| u.llm_calls == 1)).await?;

        let done =
            runs.get_token_usage(authed(GetTokenUsageRequest { thread_id: "u".into(), include_active: false }, ALICE)).await?.into_inner();
        let total = done.total.unwrap_or_default();
        assert_eq!((done.runs, done.llm_calls), (2, 3), "{backend:?}");
        assert_eq!((total.input_tokens, total.output_tokens, total.total_tokens), (33, 8, 41), "{backend:?}");
        let caller = done.by_caller.unwrap_or_default();
        assert_eq!((caller.lead_agent_tokens, caller.subagent_tokens, caller.middleware_tokens), (15, 22, 4), "{backend:?}");
        let m1 = done.by_model.get("m1").cloned().unwrap_or_default();
        assert_eq!((m1.runs, m1.llm_calls, m1.usage.unwrap_or_default().total_tokens), (2, 2, 37), "{backend:?}");
        let m2 = done.by_model.get("m2").cloned().unwrap_or_default();
        assert_eq!((m2.runs, m2.llm_calls, m2.usage.unwrap_or_default().input_tokens), (1, 1, 3), "{backend:?}");
        assert!(!done.by_model.contains_key("m3"), "{backend:?}: the active run is left out");

        let with_active =
            runs.get_token_usage(authed(GetTokenUsageRequest { thread_id: "u".into(), include_active: true }, ALICE)).await?.into_inner();
        assert_eq!((with_active.runs, with_active.total.unwrap_or_default().total_tokens), (3, 141), "{backend:?}");
        assert_eq!(with_active.by_model.get("m3").map(|m| m.runs), Some(1), "{backend:?}");

        // A thread with runs but no usage, and another user's view.
        threads.create_thread(authed(CreateThreadRequest { thread_id: "quiet".into(), ..Default::default() }, ALICE)).await?;
        let quiet = runs.get_token_usage(authed(GetTokenUsageRequest { thread_id: "quiet".into(), ..Default::default() }, ALICE)).await?;
        let quiet = quiet.into_inner();
        assert_eq!((quiet.runs, quiet.by_model.len(), quiet.context_usage.is_none()), (0, 0, true), "{backend:?}: no messages, no fill");
        let refused = runs.get_token_usage(authed(GetTokenUsageRequest { thread_id: "u".into(), ..Default::default() }, BOB)).await;
        assert_eq!(refused.err().map(|s| s.code()), Some(tonic::Code::NotFound), "{backend:?}");
        runs.cancel_run(authed(CancelRunRequest { run_id: active.run_id.clone(), wait: true, ..Default::default() }, ALICE)).await?;
    }
    Ok(())
}

/// DeerFlow's estimate: about four characters per token, plus three per message.
fn approx(texts: &[&str]) -> u64 {
    texts.iter().map(|t| (t.chars().count() as u64).div_ceil(4) + 3).sum()
}

/// GetTokenUsageResponse.context_usage: the head's messages against the context window the models
/// service gives for the thread's model.
#[tokio::test]
async fn context_usage_is_the_head_against_the_model_s_window() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let models = "models:\n  models:\n    - name: small\n      provider: replay\n      context_window: 1000\n      replay:\n        turns:\n          - text: hi\n";
    let server = start("antler", Launch::new(["up"]).config(format!("{}{models}", config(&db, ""))))?;
    let (mut runs, _) = clients(&server).await?;
    let steps = json!([{"say": "the answer is forty-two"}, {"checkpoint": true}]);
    let mut request = run_request("", steps.clone());
    request.config = Some(RunConfig { model_name: "small".into(), ..Default::default() });
    let run = run_to_end(&mut runs, request, T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}", run.error);
    let usage = runs
        .get_token_usage(authed(GetTokenUsageRequest { thread_id: run.thread_id.clone(), ..Default::default() }, ALICE))
        .await?
        .into_inner();
    let context = usage.context_usage.ok_or_else(|| anyhow::anyhow!("context_usage is empty"))?;
    let prompt = json!({"script": steps}).to_string();
    let tokens = approx(&[&prompt, "the answer is forty-two"]);
    assert_eq!((context.token_count, context.max_context_tokens), (tokens, 1000), "{context:?} for {prompt:?}");
    assert!((context.fraction - tokens as f64 / 1000.0).abs() < 1e-9, "{context:?}");
    Ok(())
}

/// ListRunEvents(task_id) filters before its LIMIT: pages of `page_size` events of that task, however
/// many events of the lead agent and of other tasks sit between them.
#[tokio::test]
async fn run_events_of_one_task_page_correctly() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let server = start_runs(&db, "")?;
        let (mut runs, _) = clients(&server).await?;
        let mut steps = Vec::new();
        for i in 0..30 {
            steps.push(json!({"custom": i}));
            if i % 10 == 3 {
                steps.push(json!({"task_event": "task-a"}));
            }
            if i % 15 == 5 {
                steps.push(json!({"task_event": "task-b"}));
            }
        }
        let run = run_to_end(&mut runs, run_request("", json!(steps)), T).await?;
        assert_eq!(run.status(), RunStatus::Success, "{backend:?}: {:?}", run.error);
        let (mut seqs, mut sizes, mut token) = (Vec::new(), Vec::new(), String::new());
        loop {
            let request = ListRunEventsRequest {
                run_id: run.run_id.clone(),
                task_id: "task-a".into(),
                page: Some(PageRequest { page_size: 2, page_token: token.clone() }),
                ..Default::default()
            };
            let page = runs.list_run_events(authed(request, ALICE)).await?.into_inner();
            sizes.push(page.events.len());
            for event in &page.events {
                match &event.kind {
                    Some(run_event::Kind::Subagent(s)) => assert_eq!(s.task_id, "task-a", "{backend:?}"),
                    other => panic!("{backend:?}: an event of another task or of the lead agent: {other:?}"),
                }
            }
            seqs.extend(page.events.iter().map(|e| e.seq));
            token = page.page.unwrap_or_default().next_page_token;
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(seqs.len(), 3, "{backend:?}: {seqs:?}");
        assert_eq!(sizes[..2], [2, 1], "{backend:?}: pages fill with the task's events");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{backend:?}");
        let b = runs
            .list_run_events(authed(
                ListRunEventsRequest { run_id: run.run_id.clone(), task_id: "task-b".into(), ..Default::default() },
                ALICE,
            ))
            .await?
            .into_inner();
        assert_eq!(b.events.len(), 2, "{backend:?}");
    }
    Ok(())
}

/// With `runs.sweep_batch: 2`, a restarted replica takes over all five runs its crashed predecessor
/// left, across batch boundaries, each exactly once.
#[tokio::test]
async fn the_sweeper_takes_over_many_orphans_in_small_batches() -> anyhow::Result<()> {
    for backend in BACKENDS {
        let db = TestDb::new(backend).await?;
        let extra = "  sweep_batch: 2\n  max_concurrent_runs: 8\n";
        let mut first = start_runs(&db, extra)?;
        let (mut runs, _) = clients(&first).await?;
        let steps = json!([{"checkpoint": true}, {"sleep_ms": 2000}, {"say": "done"}]);
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(runs.create_run(authed(run_request("", steps.clone()), ALICE)).await?.into_inner().run.unwrap_or_default().run_id);
        }
        for id in &ids {
            wait_run(&mut runs, ALICE, id, T, |r| r.status() == RunStatus::Running && r.last_seq >= 2).await?;
        }
        first.signal(libc::SIGKILL)?;
        first.wait_exit(Duration::from_secs(5))?;

        let second = start_runs(&db, extra)?;
        let (mut runs, _) = clients(&second).await?;
        for id in &ids {
            let done = wait_run(&mut runs, ALICE, id, T, is_terminal).await?;
            assert_eq!((done.status(), done.attempt), (RunStatus::Success, 2), "{backend:?}: {id}: {:?}", done.error);
            assert_eq!(said(&mut runs, ALICE, id).await?, 1, "{backend:?}: {id} resumed once");
        }
    }
    Ok(())
}
