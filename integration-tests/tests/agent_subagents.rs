//! Subagents as durable child runs (issue #14 §2): `antler up` with the lead agent, the model upstream
//! double routing each conversation (the lead's, each subagent's) to its own script.

use std::time::{Duration, Instant};

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, COMPLETION_TOKENS, LlmDouble, PROMPT_TOKENS, Turn, call, route};
use antler_integration_tests::runs::*;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{
    CancelRunRequest, CreateRunRequest, ListRunsRequest, ListThreadsRequest, Run, RunConfig, RunEvent, RunStatus, SubagentEvent,
    SubagentPhase, SubagentStatus, SubagentTask,
};
use serde_json::{Value, json};
use tonic::transport::Channel;

const T: Duration = Duration::from_secs(60);
/// Tokens one scripted model call reports.
const CALL_TOKENS: u64 = PROMPT_TOKENS + COMPLETION_TOKENS;

fn task(id: &str, subagent_type: &str, prompt: &str) -> antler_integration_tests::llm_double::Call {
    call(id, "task", json!({"description": format!("work {id}"), "prompt": prompt, "subagent_type": subagent_type}))
}

/// A request that lets the lead agent delegate.
fn delegating(text: &str) -> CreateRunRequest {
    let mut request = prompt_request("", text);
    request.config = Some(RunConfig { subagents_enabled: true, ..RunConfig::default() });
    request
}

fn subagent_events(events: &[RunEvent]) -> Vec<(String, SubagentEvent)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Subagent(s)) => Some((e.task_id.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

async fn children(runs: &mut RunServiceClient<Channel>, parent: &str) -> anyhow::Result<Vec<Run>> {
    let request = ListRunsRequest { parent_run_id: parent.to_owned(), ..Default::default() };
    let mut listed = runs.list_runs(authed(request, ALICE)).await?.into_inner().runs;
    listed.sort_by(|a, b| a.parent_task_id.cmp(&b.parent_task_id));
    Ok(listed)
}

/// The tool messages of one request the double received, as (tool_call_id, content).
fn tool_results(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| (m["tool_call_id"].as_str().unwrap_or_default().to_owned(), m["content"].to_string()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_run_delegates_two_parallel_subagents_and_merges_their_results() -> anyhow::Result<()> {
    for backend in BACKENDS {
        two_parallel_subagents(backend).await?;
    }
    Ok(())
}

async fn two_parallel_subagents(backend: Backend) -> anyhow::Result<()> {
    let double = LlmDouble::start_routed(
        vec![
            route(
                "LEAD compare",
                vec![
                    Turn::tools(
                        "Delegating both.",
                        vec![task("t-a", "general-purpose", "CHILD-A list the workspace"), task("t-b", "bash", "CHILD-B count")],
                    ),
                    Turn::text("Merged: alpha and beta."),
                ],
            ),
            // Slow answers: the two children overlap only if they really run at the same time.
            route(
                "CHILD-A",
                vec![
                    Turn::tools("", vec![call("a-ls", "ls", json!({"description": "look", "path": "/mnt/user-data"}))]).slow(40),
                    Turn::text("alpha found").slow(40),
                ],
            ),
            route("CHILD-B", vec![Turn::text("beta counted").slow(40)]),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(backend).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, mut threads) = clients(&server).await?;
    let run = run_to_end(&mut runs, delegating("LEAD compare the two"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{backend:?}: {:?}\n{}", run.error, server.stderr());

    // The lead got both results, in call order, in DeerFlow's wording.
    let lead = double.requests_of("LEAD compare");
    assert_eq!(lead.len(), 2, "{backend:?}");
    let results = tool_results(&lead[1]);
    assert_eq!(results.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["t-a", "t-b"]);
    assert!(results[0].1.contains("Task Succeeded. Result: alpha found"), "{results:?}");
    assert!(results[1].1.contains("Task Succeeded. Result: beta counted"), "{results:?}");

    // Each subagent had its own conversation: the subagent prompt, its type's tools, no `task`.
    let child_a = double.requests_of("CHILD-A");
    assert_eq!(child_a.len(), 2);
    assert!(child_a[0]["messages"][0]["content"].to_string().contains("You are a subagent"), "{}", child_a[0]["messages"][0]);
    let tool_names = |request: &Value| -> Vec<String> {
        request["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let a_tools = tool_names(&child_a[0]);
    assert!(
        a_tools.contains(&"bash".to_owned()) && !a_tools.iter().any(|t| t == "task" || t == "present_files" || t == "ask_clarification"),
        "{a_tools:?}"
    );
    let b_tools = tool_names(&double.requests_of("CHILD-B")[0]);
    assert_eq!(b_tools, ["bash", "ls", "read_file", "write_file", "str_replace"], "the bash type's tools");
    assert!(tool_names(&lead[0]).contains(&"task".to_owned()));

    // Two child runs, each its own run with its own events and usage, on hidden threads.
    let kids = children(&mut runs, &run.run_id).await?;
    assert_eq!(kids.len(), 2, "{kids:?}");
    for (kid, (task_id, kind)) in kids.iter().zip([("t-a", "general-purpose"), ("t-b", "bash")]) {
        assert_eq!(kid.status(), RunStatus::Success, "{kid:?}");
        assert_eq!(
            (kid.parent_run_id.as_str(), kid.parent_task_id.as_str(), kid.subagent_type.as_str()),
            (run.run_id.as_str(), task_id, kind)
        );
        assert_eq!(kid.attempt, 1);
        assert_ne!(kid.thread_id, run.thread_id);
        let usage = kid.usage.clone().unwrap_or_default();
        assert_eq!((usage.lead_agent_tokens, usage.subagent_tokens), (0, usage.total_tokens), "caller subagent:{kind}: {usage:?}");
        // Joinable on its own: its log ends with END.
        let own = run_events(&mut runs, ALICE, &kid.run_id).await?;
        assert!(matches!(own.last().and_then(|e| e.kind.as_ref()), Some(Kind::End(_))), "{own:?}");
    }
    let listed = threads.list_threads(authed(ListThreadsRequest::default(), ALICE)).await?.into_inner().threads;
    assert_eq!(listed.iter().map(|t| t.thread_id.as_str()).collect::<Vec<_>>(), [run.thread_id.as_str()], "child threads are hidden");

    // The parent's stream: START, STEP(s), END per task, with the child run ids and task ids.
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let sub = subagent_events(&events);
    for kid in &kids {
        let of: Vec<&SubagentEvent> = sub.iter().filter(|(t, _)| *t == kid.parent_task_id).map(|(_, s)| s).collect();
        let phases: Vec<SubagentPhase> = of.iter().map(|s| s.phase()).collect();
        assert_eq!(phases.first(), Some(&SubagentPhase::Start), "{phases:?}");
        assert_eq!(
            phases.iter().filter(|p| **p == SubagentPhase::Start).count(),
            1,
            "one START (written with the child's admission): {phases:?}"
        );
        assert_eq!(of[0].description, format!("work {}", kid.parent_task_id), "{:?}", of[0]);
        // After the call's TOOL_STARTED, though written by another transaction.
        let tool_started =
            events.iter().position(|e| matches!(&e.kind, Some(Kind::ToolStarted(t)) if t.tool_call_id == kid.parent_task_id));
        let start = events.iter().position(
            |e| matches!(&e.kind, Some(Kind::Subagent(s)) if s.task_id == kid.parent_task_id && s.phase() == SubagentPhase::Start),
        );
        assert!(tool_started.is_some() && tool_started < start, "TOOL_STARTED at {tool_started:?}, START at {start:?}");
        assert_eq!(phases.last(), Some(&SubagentPhase::End), "{phases:?}");
        assert!(phases.contains(&SubagentPhase::Step), "{phases:?}");
        assert!(of.iter().all(|s| s.child_run_id == kid.run_id && s.task_id == kid.parent_task_id));
        let end = of.last().copied().cloned().unwrap_or_default();
        assert_eq!(end.status(), SubagentStatus::Completed);
        assert_eq!(end.usage.unwrap_or_default().total_tokens, kid.usage.clone().unwrap_or_default().total_tokens);
    }
    // They ran at the same time: the second started before the first ended.
    let position = |task: &str, phase: SubagentPhase| sub.iter().position(|(t, s)| t == task && s.phase() == phase);
    assert!(position("t-b", SubagentPhase::Start) < position("t-a", SubagentPhase::End), "{sub:?}");

    // The children's tokens count as the parent's subagent tokens.
    let usage = run.usage.clone().unwrap_or_default();
    assert_eq!(usage.lead_agent_tokens, 2 * CALL_TOKENS);
    assert_eq!(usage.subagent_tokens, 3 * CALL_TOKENS, "child A made two calls, child B one: {usage:?}");
    assert_eq!(usage.total_tokens, 5 * CALL_TOKENS);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_resumes_the_subagent_run_and_its_side_effect_happens_once() -> anyhow::Result<()> {
    for backend in BACKENDS {
        killed_during_subagent(backend).await?;
    }
    Ok(())
}

async fn killed_during_subagent(backend: Backend) -> anyhow::Result<()> {
    let double = LlmDouble::start_routed(
        vec![
            route("LEAD append", vec![Turn::tools("", vec![task("t-1", "general-purpose", "CHILD-W append a line")]), Turn::text("The child is done.")]),
            route(
                "CHILD-W",
                vec![
                    Turn::tools(
                        "",
                        vec![call("w-1", "bash", json!({"description": "append", "command": "echo child-line >> /mnt/user-data/workspace/child.txt && sleep 20"}))],
                    ),
                    Turn::text("I checked the file instead of appending again."),
                ],
            ),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(backend).await?;
    let data = tempfile::tempdir()?;
    let first = start_agent_up(&db, &double.models_yaml(), "", Some(data.path()))?;
    let (mut runs, _) = clients(&first).await?;
    let run = runs.create_run(authed(delegating("LEAD append via a subagent"), ALICE)).await?.into_inner().run.unwrap_or_default();
    // The subagent works in the parent's workspace.
    let file = data.path().join(format!("sandbox/users/alice/threads/{}/user-data/workspace/child.txt", run.thread_id));
    let deadline = Instant::now() + T;
    while !std::fs::read_to_string(&file).is_ok_and(|t| t.contains("child-line")) {
        anyhow::ensure!(Instant::now() < deadline, "the subagent's command never ran\n{}", first.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut first = first;
    first.signal(libc::SIGKILL)?;
    first.wait_exit(Duration::from_secs(5))?;

    let second = start_agent_up(&db, &double.models_yaml(), "", Some(data.path()))?;
    let (mut runs, _) = clients(&second).await?;
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    assert_eq!(run.status(), RunStatus::Success, "{backend:?}: {:?}\n{}", run.error, second.stderr());
    assert_eq!(run.attempt, 2, "{backend:?}");
    let kids = children(&mut runs, &run.run_id).await?;
    assert_eq!(kids.len(), 1, "one child per task call, also across attempts: {kids:?}");
    assert_eq!(kids[0].status(), RunStatus::Success, "{:?}", kids[0].error);
    assert_eq!(kids[0].attempt, 2, "the child was taken over and resumed");
    assert_eq!(std::fs::read_to_string(&file)?.matches("child-line").count(), 1, "the child's side effect happened once");

    // The child resumed from its checkpoint: its journalled call was not run again.
    let child_requests = double.requests_of("CHILD-W");
    assert_eq!(child_requests.len(), 2, "{child_requests:?}");
    assert!(child_requests[1]["messages"].to_string().contains("outcome of this `bash` call is unknown"));
    let kid_events = run_events(&mut runs, ALICE, &kids[0].run_id).await?;
    let finished = tool_finished(&kid_events);
    assert_eq!(finished.len(), 1);
    assert!(finished[0].outcome_unknown, "{finished:?}");

    // The parent: started twice (once per attempt), ended once, the result counted once.
    let sub = subagent_events(&run_events(&mut runs, ALICE, &run.run_id).await?);
    let phases: Vec<SubagentPhase> = sub.iter().map(|(_, s)| s.phase()).collect();
    assert_eq!(phases.iter().filter(|p| **p == SubagentPhase::End).count(), 1, "{phases:?}");
    assert!(phases.iter().filter(|p| **p == SubagentPhase::Start).count() >= 2, "{phases:?}");
    let lead = double.requests_of("LEAD append");
    assert!(
        tool_results(lead.last().unwrap_or(&Value::Null))
            .iter()
            .any(|(id, text)| id == "t-1" && text.contains("Task Succeeded. Result: I checked"))
    );
    let usage = run.usage.clone().unwrap_or_default();
    assert_eq!(usage.subagent_tokens, kids[0].usage.clone().unwrap_or_default().total_tokens, "{usage:?}");
    // The task call's journal entry: its intent written by the first attempt (with the child's
    // admission), its result by the second (with the END event).
    let (attempt, result) = task_journal(&db, &run.run_id, "t-1").await?;
    assert_eq!(attempt, 1, "{backend:?}");
    assert!(result.is_some_and(|r| r.contains("Task Succeeded. Result: I checked")), "{backend:?}");
    Ok(())
}

/// The side-effect journal's row of a `task` call, read from the store: (attempt of the intent, result).
async fn task_journal(db: &TestDb, run_id: &str, task_id: &str) -> anyhow::Result<(i32, Option<String>)> {
    use sea_orm::ConnectionTrait;
    let conn = db.connect().await?;
    let sql = format!("SELECT attempt, result FROM tool_effects WHERE run_id = '{run_id}' AND tool_call_id = '{task_id}'");
    let row = conn.query_one_raw(sea_orm::Statement::from_string(conn.get_database_backend(), sql)).await?;
    let row = row.ok_or_else(|| anyhow::anyhow!("no journal entry for task {task_id}"))?;
    Ok((row.try_get("", "attempt")?, row.try_get("", "result")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_parent_interrupts_every_child() -> anyhow::Result<()> {
    for backend in BACKENDS {
        cancel_cascades(backend).await?;
    }
    Ok(())
}

async fn cancel_cascades(backend: Backend) -> anyhow::Result<()> {
    let sleeping = || vec![Turn::tools("", vec![call("s", "bash", json!({"description": "wait", "command": "sleep 30"}))])];
    let double = LlmDouble::start_routed(
        vec![
            route("LEAD wait", vec![Turn::tools("", vec![task("t-1", "bash", "CHILD-1 wait"), task("t-2", "bash", "CHILD-2 wait")])]),
            route("CHILD-1", sleeping()),
            route("CHILD-2", sleeping()),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(backend).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let run = runs.create_run(authed(delegating("LEAD wait for two"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let deadline = Instant::now() + T;
    while children(&mut runs, &run.run_id).await?.iter().filter(|k| k.status() == RunStatus::Running).count() < 2 {
        anyhow::ensure!(Instant::now() < deadline, "the children never ran\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runs.cancel_run(authed(CancelRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await?;
    let cancelled = wait_run(&mut runs, ALICE, &run.run_id, Duration::from_secs(10), is_terminal).await?;
    assert_eq!(cancelled.status(), RunStatus::Interrupted, "{backend:?}");
    // Children end before their parent is finalized.
    for kid in children(&mut runs, &run.run_id).await? {
        assert_eq!(kid.status(), RunStatus::Interrupted, "{backend:?}: {kid:?}");
    }
    // Every task the parent started is closed in its log: START, then an END saying cancelled, both
    // before the parent's own END, and the `task` call's journal entry has its result.
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let tasks = subagent_events(&events);
    for task in ["t-1", "t-2"] {
        let phases: Vec<SubagentPhase> = tasks.iter().filter(|(_, e)| e.task_id == task).map(|(_, e)| e.phase()).collect();
        assert_eq!(phases.first(), Some(&SubagentPhase::Start), "{backend:?} {task}: {phases:?}");
        let ends: Vec<&SubagentEvent> =
            tasks.iter().filter(|(_, e)| e.task_id == task && e.phase() == SubagentPhase::End).map(|(_, e)| e).collect();
        assert_eq!(ends.len(), 1, "{backend:?} {task}: one END per task: {phases:?}");
        assert_eq!(ends[0].status(), SubagentStatus::Cancelled, "{backend:?} {task}: {:?}", ends[0]);
        assert!(!ends[0].child_run_id.is_empty(), "{:?}", ends[0]);
        let (_, result) = task_journal(&db, &run.run_id, task).await?;
        assert!(result.is_some_and(|r| r.starts_with("Task cancelled")), "{backend:?} {task}: the journal entry is closed");
    }
    assert!(matches!(events.last().and_then(|e| e.kind.as_ref()), Some(Kind::End(_))), "END is the parent's last event");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subagents_time_out_and_are_capped_at_their_turns_and_tokens() -> anyhow::Result<()> {
    let double = LlmDouble::start_routed(
        vec![
            route(
                "LEAD limits",
                vec![
                    Turn::tools(
                        "",
                        vec![
                            task("t-slow", "slow", "CHILD-SLOW wait"),
                            task("t-short", "short", "CHILD-SHORT look"),
                            task("t-thrifty", "thrifty", "CHILD-THRIFTY spend"),
                        ],
                    ),
                    Turn::text("ok"),
                ],
            ),
            route("CHILD-SLOW", vec![Turn::tools("", vec![call("s", "bash", json!({"description": "wait", "command": "sleep 30"}))])]),
            route(
                "CHILD-THRIFTY",
                vec![Turn::tools("partial", vec![call("p", "ls", json!({"description": "look", "path": "/mnt/user-data"}))])],
            ),
            route(
                "CHILD-SHORT",
                vec![Turn::tools("looking around", vec![call("l", "ls", json!({"description": "look", "path": "/mnt/user-data"}))])],
            ),
        ],
        AfterLast::Repeat,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let agents = "  lead:\n    subagents:\n      custom_agents:\n        slow:\n          description: Waits\n          timeout_seconds: 2\n        short:\n          description: Looks briefly\n          max_turns: 2\n        thrifty:\n          description: Spends little\n          token_budget: 100\n";
    let server = start_agent_up(&db, &double.models_yaml(), agents, None)?;
    let (mut runs, _) = clients(&server).await?;
    let started = Instant::now();
    let run = run_to_end(&mut runs, delegating("LEAD limits"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    assert!(started.elapsed() < Duration::from_secs(20), "the slow child was cut at 2 s: {:?}", started.elapsed());
    let kids = children(&mut runs, &run.run_id).await?;
    let slow = kids.iter().find(|k| k.parent_task_id == "t-slow").cloned().unwrap_or_default();
    let short = kids.iter().find(|k| k.parent_task_id == "t-short").cloned().unwrap_or_default();
    assert_eq!(slow.status(), RunStatus::Timeout, "{slow:?}");
    assert_eq!((short.status(), short.stop_reason.as_str()), (RunStatus::Success, "turn_capped"), "{short:?}");
    assert_eq!(double.requests_of("CHILD-SHORT").len(), 2, "two turns, then the cap");
    let thrifty = kids.iter().find(|k| k.parent_task_id == "t-thrifty").cloned().unwrap_or_default();
    assert_eq!((thrifty.status(), thrifty.stop_reason.as_str()), (RunStatus::Success, "token_capped"), "{thrifty:?}");
    assert_eq!(double.requests_of("CHILD-THRIFTY").len(), 1, "its first turn spent the budget; its tool call was dropped");
    let results = tool_results(double.requests_of("LEAD limits").last().unwrap_or(&Value::Null));
    assert!(results[0].1.contains("Task timed out. Error: Execution timed out after 2 seconds"), "{results:?}");
    assert!(results[1].1.contains("Task Succeeded (capped: turn budget). Result: looking around"), "{results:?}");
    assert!(results[2].1.contains("Task Succeeded (capped: token budget). Result: partial"), "{results:?}");
    let sub = subagent_events(&run_events(&mut runs, ALICE, &run.run_id).await?);
    let ends: Vec<(String, SubagentStatus, String)> =
        sub.iter().filter(|(_, s)| s.phase() == SubagentPhase::End).map(|(t, s)| (t.clone(), s.status(), s.stop_reason.clone())).collect();
    assert!(ends.contains(&("t-slow".to_owned(), SubagentStatus::TimedOut, String::new())), "{ends:?}");
    assert!(ends.contains(&("t-short".to_owned(), SubagentStatus::Completed, "turn_capped".to_owned())), "{ends:?}");
    assert!(ends.contains(&("t-thrifty".to_owned(), SubagentStatus::Completed, "token_capped".to_owned())), "{ends:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subagent_limit_keeps_three_per_turn_and_caps_the_run_at_six() -> anyhow::Result<()> {
    let turn =
        |first: usize, n: usize| Turn::tools("", (first..first + n).map(|i| task(&format!("t{i}"), "bash", "CHILD-LIMIT go")).collect());
    let double = LlmDouble::start_routed(
        vec![
            route("LEAD many", vec![turn(0, 4), turn(4, 4), turn(8, 1), Turn::text("never asked")]),
            route("CHILD-LIMIT", vec![Turn::text("ok")]),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, delegating("LEAD many tasks"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    assert_eq!(run.stop_reason, "subagent_limit_capped");
    let kids = children(&mut runs, &run.run_id).await?;
    let mut ids: Vec<&str> = kids.iter().map(|k| k.parent_task_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["t0", "t1", "t2", "t4", "t5", "t6"], "three per turn, six in all");
    let lead = double.requests_of("LEAD many");
    assert_eq!(lead.len(), 3, "the third turn ended the run");
    // The dropped calls never reached the model's history as calls.
    let second = lead[1]["messages"].to_string();
    assert!(!second.contains("\"t3\""), "{second}");
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let last = events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            Some(Kind::Message(m)) => m.message.clone(),
            _ => None,
        })
        .unwrap_or_default();
    assert!(last.tool_calls.is_empty());
    assert!(format!("{:?}", last.content).contains("[SUBAGENT LIMIT REACHED]"), "{last:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_create_a_child_run() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let double = LlmDouble::start(vec![Turn::text("never")], AfterLast::Refuse).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let mut request = prompt_request("", "pretend");
    request.subagent = Some(SubagentTask { parent_run_id: "r".to_owned(), task_id: "t".to_owned(), ..Default::default() });
    let status = runs.create_run(authed(request, ALICE)).await.err().unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("subagent"), "{}", status.message());
    assert!(double.requests().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_safety_finish_is_audited_without_content() -> anyhow::Result<()> {
    use antler_integration_tests::metrics::{metrics_url, scrape_until, with_metrics};
    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "partial words",
                vec![call("x", "bash", json!({"description": "d", "command": "echo never > /mnt/user-data/workspace/x"}))],
            )
            .finish("content_filter"),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let yaml = with_metrics(&agent_config(&db, &double.models_yaml(), ""), "[0.01]");
    let server = antler_integration_tests::start("antler", antler_integration_tests::Launch::new(["up"]).config(yaml))?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Say something risky"), T).await?;
    assert_eq!((run.status(), run.stop_reason.as_str()), (RunStatus::Success, "safety_capped"), "{:?}", run.error);
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    assert!(tool_finished(&events).is_empty(), "the withheld turn's tool calls were dropped");
    let audits: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Custom(c)) if c.name == "antler.safety_finish" => c.data.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(audits.len(), 1, "{events:?}");
    let audit = antler_kit::json::value_to_json(&audits[0]);
    assert_eq!(audit["finish_reason"], "content_filter");
    assert_eq!(audit["model_name"], "double");
    assert_eq!(audit["caller"], "lead_agent");
    assert_eq!(audit["dropped_tool_calls"], 1.0);
    assert!(!audit["message_id"].as_str().unwrap_or_default().is_empty());
    assert!(!audit.to_string().contains("partial words"), "no content in the audit: {audit}");
    let url = metrics_url(&server)?;
    scrape_until(&url, T, |s| s.value("antler_agent_safety_finishes_total", &[("caller", "lead_agent")]) >= 1.0).await?;
    Ok(())
}

/// A subagent gets its parent's request secrets: the child run is admitted with their names (the store
/// never holds a value), its sandbox commands see the values in their environment on the replica that
/// holds them, and neither the events of either run nor anything the model is sent shows a value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_gets_its_parent_s_secrets_and_nothing_shows_them() -> anyhow::Result<()> {
    use prost::Message as _;
    use sea_orm::{ConnectionTrait, Statement};
    const VALUE: &str = "tok-9f8e7d6c5b4a39281706";
    let double = LlmDouble::start_routed(
        vec![
            route("LEAD secret", vec![Turn::tools("", vec![task("t-s", "bash", "CHILD-S check the token")]), Turn::text("Checked.")]),
            route(
                "CHILD-S",
                vec![
                    Turn::tools(
                        "",
                        vec![call("s-1", "bash", json!({"description": "check", "command": "echo token-length-${#DEPLOY_TOKEN}"}))],
                    ),
                    Turn::text("The token is there."),
                ],
            ),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let mut request = delegating("LEAD secret check through a subagent");
    request.secrets.insert("deploy_token".to_owned(), VALUE.to_owned());
    let run = run_to_end(&mut runs, request, T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let kids = children(&mut runs, &run.run_id).await?;
    assert_eq!(kids.len(), 1, "{kids:?}");
    assert_eq!(kids[0].status(), RunStatus::Success, "{:?}", kids[0].error);

    // The child's command saw the value (24 characters) under the secret's name in upper case.
    let child = double.requests_of("CHILD-S");
    let results = tool_results(child.last().unwrap_or(&Value::Null));
    assert!(results.iter().any(|(id, text)| id == "s-1" && text.contains("token-length-24")), "{results:?}");

    // The child run was admitted with the name and no value.
    let conn = db.connect().await?;
    let row = conn
        .query_one_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            "SELECT request FROM runs WHERE run_id = ?",
            [kids[0].run_id.clone().into()],
        ))
        .await?
        .ok_or_else(|| anyhow::anyhow!("the child's row is missing"))?;
    let stored = CreateRunRequest::decode(row.try_get_by_index::<Vec<u8>>(0)?.as_slice())?;
    assert_eq!(stored.secrets.get("deploy_token").map(String::as_str), Some(""), "{:?}", stored.secrets);

    // No value anywhere a client or the model can read.
    for id in [&run.run_id, &kids[0].run_id] {
        let events = run_events(&mut runs, ALICE, id).await?;
        assert!(!format!("{events:?}").contains(VALUE), "run {id}'s events show the secret");
    }
    for marker in ["LEAD secret", "CHILD-S"] {
        assert!(!Value::Array(double.requests_of(marker)).to_string().contains(VALUE), "the model was sent the secret ({marker})");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bash_subagent_is_refused_where_the_sandbox_runs_no_commands() -> anyhow::Result<()> {
    let double = LlmDouble::start_routed(
        vec![
            route("LEAD count", vec![Turn::tools("", vec![task("t-x", "bash", "CHILD-X count the files")]), Turn::text("Could not.")]),
            route("CHILD-X", vec![Turn::text("counted")]),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    // The local provider without allow_host_bash: ExecuteCommand is refused, as DeerFlow's host bash gate.
    let config = agent_config(&db, &double.models_yaml(), "").replace("allow_host_bash: true", "allow_host_bash: false");
    let server = antler_integration_tests::start("antler", antler_integration_tests::Launch::new(["up"]).config(config))?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, delegating("LEAD count the files"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let lead = double.requests_of("LEAD count");
    assert_eq!(lead.len(), 2);
    let results = tool_results(&lead[1]);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].1.contains("the bash subagent runs shell commands, and this sandbox refuses them"), "{results:?}");
    assert!(double.requests_of("CHILD-X").is_empty(), "no child conversation");
    assert!(children(&mut runs, &run.run_id).await?.is_empty(), "no child run admitted");
    Ok(())
}
