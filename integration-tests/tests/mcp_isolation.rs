//! One MCP server that never answers must not delay the others (#28): beside a stdio server that reads
//! every request and answers none (`integration-tests/mcp/hung_server.py`), a good server's first
//! CallTool, ListTools and SearchTools complete long before the hung server's `session_init_timeout`;
//! listings name the hung server as starting, then as failed with its error once the timeout passed,
//! and never wait for its retries; with its breaker open, nothing is tried and listings say so. A lead
//! run on `antler up` beside the hung server starts with the good server's tools, without waiting for
//! the hung server's start.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{self, AfterLast, LlmDouble, Turn};
use antler_integration_tests::mcp::{self, call, text};
use antler_integration_tests::runs::{ALICE, authed, clients, is_terminal, prompt_request, start_agent_up, tool_finished, wait_run};
use antler_proto::mcp::mcp_service_client::McpServiceClient;
use antler_proto::mcp::{
    GetPoolStatsRequest, ListServersRequest, ListToolsRequest, ListToolsResponse, NotReadyReason, NotReadyServer, SearchToolsRequest,
    ServerStatus,
};
use antler_proto::runs::RunStatus;
use anyhow::{Context, Result, anyhow, ensure};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

/// The hung server's `session_init_timeout`: long enough that "well before it" has a wide margin on a
/// busy two-core machine.
const HUNG_INIT: Duration = Duration::from_secs(18);
/// What "does not wait for the hung server" means: a third of the time that waiting would take.
const PROMPT: Duration = Duration::from_secs(6);

fn hung_server_py() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp").join("hung_server.py")
}

/// A stdio entry for the hung server; it logs what it was asked to `marks`.
fn hung_entry(marks: &std::path::Path, init_timeout_secs: f64) -> Result<serde_json::Value> {
    Ok(json!({
        "type": "stdio",
        "command": mcp::python()?,
        "args": [hung_server_py(), marks],
        "session_init_timeout": init_timeout_secs,
    }))
}

/// server-everything over stdio: the good server.
fn good_entry() -> Result<serde_json::Value> {
    Ok(json!({"type": "stdio", "command": "node", "args": [mcp::everything_js()?, "stdio"]}))
}

fn not_ready<'a>(listing: &'a [NotReadyServer], server: &str) -> Option<&'a NotReadyServer> {
    listing.iter().find(|n| n.server == server)
}

async fn list(client: &mut McpServiceClient<Channel>) -> Result<(ListToolsResponse, Duration)> {
    let started = Instant::now();
    let listing = client.list_tools(ListToolsRequest::default()).await?.into_inner();
    Ok((listing, started.elapsed()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_delays_no_call_or_listing_of_the_others() -> Result<()> {
    let marks = tempfile::tempdir()?;
    let servers = json!({"good": good_entry()?, "hung": hung_entry(marks.path(), HUNG_INIT.as_secs_f64())?});
    // The listing waits 2 s for a server still starting: long enough for server-everything to come up
    // on an idle machine, a ninth of the hung server's timeout.
    let service = mcp::start(servers, "  listing_wait_ms: 2000\n", "", &[])?;
    let client = service.client().await?;
    let started = Instant::now();

    // All at once on a fresh service: a call to the hung server (which waits for its start), the good
    // server's first calls, and a listing.
    let hung_call = {
        let mut c = client.clone();
        tokio::spawn(async move {
            let result = c.call_tool(call("hung_anything", json!({}))).await;
            (result, started.elapsed())
        })
    };
    let mut good_calls = tokio::task::JoinSet::new();
    for i in 0..6 {
        let mut c = client.clone();
        good_calls.spawn(async move {
            let t = Instant::now();
            let result = c.call_tool(call("good_echo", json!({"message": format!("m{i}")}))).await;
            (i, result, t.elapsed())
        });
    }
    let first_listing = {
        let mut c = client.clone();
        tokio::spawn(async move { list(&mut c).await })
    };

    while let Some(joined) = good_calls.join_next().await {
        let (i, result, elapsed) = joined?;
        let response = result.with_context(|| format!("good call {i}"))?.into_inner();
        ensure!(text(&response) == format!("Echo: m{i}"), "{response:?}");
        ensure!(elapsed < PROMPT, "the good server's first call {i} took {elapsed:?}: it waited for the hung server");
    }
    let (listing, elapsed) = first_listing.await??;
    ensure!(elapsed < PROMPT, "the first listing took {elapsed:?}: it waited for the hung server ({listing:?})");
    let hung = not_ready(&listing.not_ready, "hung").ok_or_else(|| anyhow!("the hung server is not named: {listing:?}"))?;
    ensure!(hung.reason() == NotReadyReason::Starting && hung.error.is_empty() && hung.starting_for.is_some(), "{hung:?}");
    ensure!(listing.unavailable_servers.contains(&"hung".to_owned()), "{listing:?}");
    ensure!(!listing.tools.iter().any(|t| t.server == "hung"), "{listing:?}");

    // The good server is up now: its tools are listed at once, the hung server still named as starting.
    ensure!(started.elapsed() < HUNG_INIT - Duration::from_secs(4), "too slow to judge: {:?} since start", started.elapsed());
    let (listing, elapsed) = list(&mut client.clone()).await?;
    ensure!(elapsed < PROMPT, "{elapsed:?}");
    ensure!(listing.tools.iter().any(|t| t.name == "good_echo"), "{listing:?}");
    ensure!(listing.unavailable_servers == ["hung"], "{listing:?}");
    ensure!(not_ready(&listing.not_ready, "hung").is_some_and(|h| h.reason() == NotReadyReason::Starting), "{listing:?}");
    let t = Instant::now();
    let search = client.clone().search_tools(SearchToolsRequest { query: "echo".into(), max_results: 5 }).await?.into_inner();
    ensure!(t.elapsed() < PROMPT, "{:?}", t.elapsed());
    ensure!(search.tools.iter().any(|t| t.name == "good_echo"), "{search:?}");
    ensure!(not_ready(&search.not_ready, "hung").is_some_and(|h| h.reason() == NotReadyReason::Starting), "{search:?}");
    let requests = std::fs::read_to_string(marks.path().join("requests.log")).unwrap_or_default();
    ensure!(!requests.is_empty(), "the hung server was never asked anything: its start is not what hangs");

    // The call to the hung server waited for its start and failed with the timeout, naming the server.
    let (result, hung_elapsed) = hung_call.await?;
    let error = result.err().ok_or_else(|| anyhow!("a call to the hung server succeeded"))?;
    ensure!(error.code() == Code::Unavailable, "{error:?}");
    ensure!(error.message().contains("`hung`") && error.message().contains("session_init_timeout"), "{error:?}");
    ensure!(hung_elapsed >= HUNG_INIT - Duration::from_secs(1), "the hung call ended after {hung_elapsed:?}, before the timeout");

    // After the timeout: named as failed with its error, and listings do not wait for the retry.
    let (listing, elapsed) = list(&mut client.clone()).await?;
    ensure!(elapsed < PROMPT, "a listing after the failure waited {elapsed:?} for the retry");
    let hung = not_ready(&listing.not_ready, "hung").ok_or_else(|| anyhow!("not named after failing: {listing:?}"))?;
    ensure!(hung.reason() == NotReadyReason::Failed, "{hung:?}");
    ensure!(hung.error.contains("timed out") && hung.error.contains("session_init_timeout"), "{hung:?}");
    ensure!(listing.tools.iter().any(|t| t.name == "good_echo"), "{listing:?}");
    let servers = client.clone().list_servers(ListServersRequest {}).await?.into_inner();
    let info = servers.servers.iter().find(|s| s.name == "hung").ok_or_else(|| anyhow!("no hung server"))?;
    ensure!(info.status() == ServerStatus::Error && info.last_error.contains("timed out"), "{info:?}");
    let echo = client.clone().call_tool(call("good_echo", json!({"message": "after"}))).await?.into_inner();
    ensure!(text(&echo) == "Echo: after" && echo.session_reused, "{echo:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_is_named_and_nothing_is_retried_while_it_is_open() -> Result<()> {
    let marks = tempfile::tempdir()?;
    let servers = json!({"good": good_entry()?, "hung": hung_entry(marks.path(), 1.0)?});
    let pool = "  listing_wait_ms: 3000\n  pool:\n    breaker_failures: 1\n    breaker_reset_secs: 600\n";
    let service = mcp::start(servers, pool, "", &[])?;
    let mut client = service.client().await?;

    // The first listing waits for both starts (the hung one times out after 1 s, inside the wait).
    let (listing, _) = list(&mut client).await?;
    let hung = not_ready(&listing.not_ready, "hung").ok_or_else(|| anyhow!("{listing:?}"))?;
    ensure!(hung.reason() == NotReadyReason::Failed && hung.error.contains("timed out"), "{hung:?}");
    // The listing's own timeout (session_init_timeout around the whole discovery) and the start's
    // (the same length, around the session start) expire together; when the listing's fires first it
    // answers a moment before the start task records its failure (and opens the breaker). Wait for
    // that record, briefly: it must come, once.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = client.get_pool_stats(GetPoolStatsRequest { server: "hung".into() }).await?.into_inner();
        let line = stats.per_server.first().ok_or_else(|| anyhow!("no stats"))?.clone();
        if line.creation_failures == 1 {
            break;
        }
        ensure!(line.creation_failures == 0 && Instant::now() < deadline, "the start's failure was not recorded once: {line:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // One failure opened the breaker: listings say so, keep the real cause, and start nothing.
    for _ in 0..3 {
        let (listing, elapsed) = list(&mut client).await?;
        ensure!(elapsed < Duration::from_secs(2), "{elapsed:?}");
        let hung = not_ready(&listing.not_ready, "hung").ok_or_else(|| anyhow!("{listing:?}"))?;
        ensure!(hung.reason() == NotReadyReason::BreakerOpen && hung.error.contains("timed out"), "{hung:?}");
        ensure!(listing.tools.iter().any(|t| t.name == "good_echo"), "{listing:?}");
    }
    let t = Instant::now();
    let refused = client.call_tool(call("hung_anything", json!({}))).await.err().ok_or_else(|| anyhow!("succeeded"))?;
    ensure!(refused.code() == Code::Unavailable && refused.message().contains("circuit breaker"), "{refused:?}");
    ensure!(t.elapsed() < Duration::from_secs(2), "an open breaker answers at once: {:?}", t.elapsed());
    let stats = client.get_pool_stats(GetPoolStatsRequest { server: "hung".into() }).await?.into_inner();
    let line = stats.per_server.first().ok_or_else(|| anyhow!("no stats"))?;
    ensure!(line.creation_failures == 1 && line.sessions_starting == 0, "nothing was started while open: {line:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_run_starts_beside_a_hung_server_with_the_ready_tools() -> Result<()> {
    let marks = tempfile::tempdir()?;
    let dir = tempfile::tempdir()?;
    let extensions = dir.path().join("extensions_config.json");
    // The hung server keeps DeerFlow's default `session_init_timeout` (60 s): what every run start waited
    // for before, and what the runs here must not wait for.
    let mut hung = hung_entry(marks.path(), 60.0)?;
    hung.as_object_mut().map(|entry| entry.remove("session_init_timeout"));
    mcp::write_servers(&extensions, &json!({"good": good_entry()?, "hung": hung}))?;
    let double = LlmDouble::start(
        vec![
            Turn::tools("Echoing.", vec![llm_double::call("c1", "good_echo", json!({"message": "beside a hung server"}))]),
            Turn::text("Echoed."),
            Turn::text("Second run."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let up = start_agent_up(&db, &double.models_yaml(), &mcp::mcp_yaml(&extensions, "")?, None)?;
    let (mut runs, _) = clients(&up).await?;

    let started = Instant::now();
    let run = runs.create_run(authed(prompt_request("", "Echo"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, Duration::from_secs(60), is_terminal).await?;
    let took = started.elapsed();
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());
    ensure!(took < Duration::from_secs(20), "the run took {took:?}: its start waited for the hung server\n{}", up.stderr());
    let requests = double.requests();
    let offered: Vec<&str> = requests
        .first()
        .and_then(|r| r["tools"].as_array())
        .map(|tools| tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect())
        .unwrap_or_default();
    ensure!(offered.contains(&"good_echo"), "the good server's tools are offered: {offered:?}");
    ensure!(!offered.iter().any(|name| name.starts_with("hung_")), "{offered:?}");
    let results = tool_finished(&antler_integration_tests::runs::run_events(&mut runs, ALICE, &run.run_id).await?);
    ensure!(
        results.iter().any(|f| f.tool_call_id == "c1" && !f.is_error && f.result_summary.contains("beside a hung server")),
        "{results:?}"
    );

    // A second run while the hung server is still starting does not wait for it at all.
    let started = Instant::now();
    let second = runs.create_run(authed(prompt_request("", "Again"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let second = wait_run(&mut runs, ALICE, &second.run_id, Duration::from_secs(60), is_terminal).await?;
    ensure!(second.status() == RunStatus::Success, "{:?}", second.error);
    ensure!(started.elapsed() < Duration::from_secs(20), "the second run took {:?}", started.elapsed());
    Ok(())
}
