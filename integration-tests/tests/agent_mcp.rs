//! MCP tools in lead-agent runs, on `antler up` with real MCP servers (this crate's Python server over
//! stdio and streamable HTTP): a tool discovered, offered to the model and called; deferred tools
//! hidden until `tool_search` promotes them; and `kill -9` in the middle of a side-effecting MCP call
//! → the resumed run is told the outcome is unknown and the server sees the call once.

use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::mcp::{self, HttpServer};
use antler_integration_tests::runs::*;
use antler_proto::runs::RunStatus;
use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// The `mcp:` section and `clients.mcp` token for an `antler up` whose extensions file lists `servers`.
fn mcp_section(dir: &std::path::Path, servers: &Value, extra: &str) -> Result<String> {
    let extensions = dir.join("extensions_config.json");
    mcp::write_servers(&extensions, servers)?;
    mcp::mcp_yaml(&extensions, extra)
}

/// Names of the tools a model request offered.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_run_calls_mcp_tools_over_stdio_and_http() -> Result<()> {
    let http = HttpServer::python(&[], None)?;
    let dir = tempfile::tempdir()?;
    let servers = json!({"local": mcp::python_stdio_entry()?, "remote": {"type": "http", "url": http.url()}});
    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "Echoing.",
                vec![
                    call("c1", "local_echo", json!({"message": "over stdio"})),
                    call("c2", "remote_echo", json!({"message": "over http"})),
                ],
            ),
            Turn::tools("Bad arguments.", vec![call("c3", "remote_echo", json!({"wrong": 1}))]),
            Turn::text("Both servers echoed."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let up = start_agent_up(&db, &double.models_yaml(), &mcp_section(dir.path(), &servers, "")?, None)?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Echo twice"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());

    let requests = double.requests();
    let tools = offered(&requests[0]);
    for name in ["local_echo", "remote_echo", "remote_hang", "bash"] {
        ensure!(tools.iter().any(|t| t == name), "{name} offered to the model: {tools:?}\n{}", up.stderr());
    }
    ensure!(!tools.iter().any(|t| t == "tool_search"), "no deferred tools, no tool_search: {tools:?}");

    let results = tool_finished(&run_events(&mut runs, ALICE, &run.run_id).await?);
    let by_id = |id: &str| results.iter().find(|f| f.tool_call_id == id).cloned().context("no result");
    let (local, remote, bad) = (by_id("c1")?, by_id("c2")?, by_id("c3")?);
    ensure!(!local.is_error && local.result_summary.contains("over stdio"), "{local:?}");
    ensure!(!remote.is_error && remote.result_summary.contains("over http"), "{remote:?}");
    // Checked against the tool's schema by the MCP service before anything was sent.
    ensure!(bad.is_error && bad.result_summary.contains("invalid arguments"), "{bad:?}");
    // Each call names its server, so a run's MCP use can be counted per server from its events.
    ensure!(local.mcp_server == "local" && remote.mcp_server == "remote" && bad.mcp_server == "remote", "{local:?} {remote:?} {bad:?}");
    let stats = http.stats().await?;
    ensure!(stats["tool_calls"]["echo"] == 1, "the HTTP server saw one echo (the bad call never reached it): {stats}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_mcp_tools_are_hidden_until_tool_search_promotes_them() -> Result<()> {
    let http = HttpServer::python(&[], None)?;
    let dir = tempfile::tempdir()?;
    let servers = json!({"remote": {"type": "http", "url": http.url()}});
    let double = LlmDouble::start(
        vec![
            Turn::tools("Trying directly.", vec![call("c1", "remote_echo", json!({"message": "too early"}))]),
            Turn::tools("Searching.", vec![call("c2", "tool_search", json!({"query": "select:remote_echo"}))]),
            Turn::tools("Now.", vec![call("c3", "remote_echo", json!({"message": "promoted"}))]),
            Turn::text("Done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let section = mcp_section(dir.path(), &servers, "  tool_search:\n    enabled: true\n")?;
    let up = start_agent_up(&db, &double.models_yaml(), &section, None)?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Echo"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());

    let requests = double.requests();
    ensure!(requests.len() == 4, "{}", requests.len());
    let first = offered(&requests[0]);
    ensure!(first.iter().any(|t| t == "tool_search") && !first.iter().any(|t| t.starts_with("remote_")), "{first:?}");
    let system = requests[0]["messages"][0]["content"].to_string();
    ensure!(system.contains("<available-deferred-tools>") && system.contains("remote_echo"), "{system}");
    let third = offered(&requests[2]);
    ensure!(third.iter().any(|t| t == "remote_echo") && !third.iter().any(|t| t == "remote_hang"), "only the promoted tool: {third:?}");

    let results = tool_finished(&run_events(&mut runs, ALICE, &run.run_id).await?);
    ensure!(results.len() == 3, "{results:?}");
    ensure!(results[0].is_error && results[0].result_summary.contains("deferred and has not been promoted"), "{:?}", results[0]);
    ensure!(results[1].result_summary.contains("\"name\":\"remote_echo\""), "the schema is returned: {:?}", results[1]);
    ensure!(!results[2].is_error && results[2].result_summary.contains("promoted"), "{:?}", results[2]);
    let stats = http.stats().await?;
    ensure!(stats["tool_calls"]["echo"] == 1, "the unpromoted call never reached the server: {stats}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_does_not_repeat_an_mcp_call_on_resume() -> Result<()> {
    // The MCP server is its own process: it outlives the killed `antler up` and counts every call.
    let http = HttpServer::python(&[], None)?;
    let dir = tempfile::tempdir()?;
    let servers = json!({"remote": {"type": "http", "url": http.url()}});
    let double = LlmDouble::start(
        vec![
            Turn::tools("Starting the job.", vec![call("job-1", "remote_hang", json!({"tag": "job"}))]),
            Turn::text("The job's outcome is unknown; I did not start it again."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let section = mcp_section(dir.path(), &servers, "")?;
    let first = start_agent_up(&db, &double.models_yaml(), &section, Some(data.path()))?;
    let (mut runs, _) = clients(&first).await?;
    let run = runs.create_run(authed(prompt_request("", "Start the job"), ALICE)).await?.into_inner().run.unwrap_or_default();

    let deadline = Instant::now() + T;
    while http.stats().await?["tool_calls"]["hang"] != 1 {
        ensure!(Instant::now() < deadline, "the MCP call never started\n{}", first.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut first = first;
    first.signal(libc::SIGKILL)?;
    first.wait_exit(Duration::from_secs(5))?;

    let second = start_agent_up(&db, &double.models_yaml(), &section, Some(data.path()))?;
    let (mut runs, _) = clients(&second).await?;
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, second.stderr());
    ensure!(run.attempt == 2, "resumed by a second attempt: {}", run.attempt);
    let results = tool_finished(&run_events(&mut runs, ALICE, &run.run_id).await?);
    ensure!(results.len() == 1 && results[0].outcome_unknown && results[0].is_error, "{results:?}");
    let told = double.requests()[1]["messages"].to_string();
    ensure!(told.contains("outcome of this `remote_hang` call is unknown"), "{told}");
    let stats = http.stats().await?;
    ensure!(stats["tool_calls"]["hang"] == 1, "the remote tool ran once: {stats}");
    Ok(())
}
