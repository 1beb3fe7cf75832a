//! The session pool against real servers: reuse, dedup of concurrent first calls, per-user isolation,
//! transparent re-initialisation of an expired session with exactly one retry, restart after a crash,
//! timeouts and cancellations the server sees, the circuit breaker, and LRU eviction.

use std::time::{Duration, Instant};

use antler_integration_tests::mcp::{self, HttpServer, call, eventually, text};
use antler_integration_tests::runs::authed;
use antler_proto::mcp::{CallToolRequest, CircuitState, GetPoolStatsRequest, ListServersRequest, ServerPoolStats};
use anyhow::{Result, anyhow, ensure};
use serde_json::json;
use tonic::Code;

async fn stats(
    client: &mut antler_proto::mcp::mcp_service_client::McpServiceClient<tonic::transport::Channel>,
    server: &str,
) -> Result<ServerPoolStats> {
    let response = client.get_pool_stats(GetPoolStatsRequest { server: server.into() }).await?.into_inner();
    response.per_server.into_iter().next().ok_or_else(|| anyhow!("no stats for {server}"))
}

fn on_thread(mut request: CallToolRequest, thread: &str) -> CallToolRequest {
    request.thread_id = thread.into();
    request
}

fn pid(response: &antler_proto::mcp::CallToolResponse) -> Result<u64> {
    let who: serde_json::Value = serde_json::from_str(&text(response))?;
    who["pid"].as_u64().ok_or_else(|| anyhow!("no pid in {who}"))
}

#[tokio::test]
async fn calls_reuse_one_session_and_100_concurrent_first_calls_start_one() -> Result<()> {
    let service = mcp::start(json!({"py": mcp::python_stdio_entry()?}), "", "", &[])?;
    let mut client = service.client().await?;
    let first = client.call_tool(on_thread(call("py_whoami", json!({})), "t1")).await?.into_inner();
    let second = client.call_tool(on_thread(call("py_whoami", json!({})), "t1")).await?.into_inner();
    ensure!(second.session_reused && pid(&first)? == pid(&second)?, "{first:?} / {second:?}");
    let before = stats(&mut client, "py").await?;

    // 100 concurrent first calls of a new scope (thread t-dedup): one session start, one server process.
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let mut client = client.clone();
        calls.spawn(async move { client.call_tool(on_thread(call("py_whoami", json!({})), "t-dedup")).await });
    }
    let mut pids = std::collections::BTreeSet::new();
    while let Some(joined) = calls.join_next().await {
        pids.insert(pid(&joined??.into_inner())?);
    }
    let after = stats(&mut client, "py").await?;
    ensure!(pids.len() == 1, "one process for the scope, got {pids:?}");
    ensure!(after.creations == before.creations + 1, "one creation: before {before:?}, after {after:?}");
    ensure!(after.hits + after.misses - before.hits - before.misses == 100, "{after:?}");
    // The discovery session ("default"), t1 and t-dedup.
    ensure!(after.sessions_open == 3 && after.in_flight_calls == 0, "{after:?}");
    Ok(())
}

const AUTH: &str = "server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: alice-key-0123456789\n        user: alice\n      - key: bob-key-0123456789ab\n        user: bob\n";
const ALICE: &str = "alice-key-0123456789";
const BOB: &str = "bob-key-0123456789ab";

#[tokio::test]
async fn two_users_never_share_a_session() -> Result<()> {
    let remote = HttpServer::python(&[], None)?;
    let servers = json!({
        "py": mcp::python_stdio_entry()?,
        "remote": {"type": "http", "url": remote.url(), "protocol": "initialize", "headers": {"X-Api-Key": "shared-config-key"}},
        "alice_only": {"type": "http", "url": remote.url(), "users": ["alice"]},
    });
    let service = mcp::start(servers, "", AUTH, &[])?;
    let mut client = service.client().await?;
    let alice = client.call_tool(authed(on_thread(call("py_whoami", json!({})), "same"), ALICE)).await?.into_inner();
    let bob = client.call_tool(authed(on_thread(call("py_whoami", json!({})), "same"), BOB)).await?.into_inner();
    ensure!(pid(&alice)? != pid(&bob)?, "one thread id, two users: two server processes");
    let alice_again = client.call_tool(authed(on_thread(call("py_whoami", json!({})), "same"), ALICE)).await?.into_inner();
    ensure!(pid(&alice)? == pid(&alice_again)? && alice_again.session_reused, "alice keeps her session");

    client.call_tool(authed(call("remote_echo", json!({"message": "a"})), ALICE)).await?;
    client.call_tool(authed(call("remote_echo", json!({"message": "b"})), BOB)).await?;
    client.call_tool(authed(call("remote_echo", json!({"message": "a2"})), ALICE)).await?;
    let seen = remote.stats().await?;
    ensure!(seen["seen_sessions"].as_array().map(Vec::len) == Some(2), "two remote sessions, one per user: {seen}");
    ensure!(seen["initializes"] == 2, "{seen}");

    let bobs = client.list_servers(authed(ListServersRequest {}, BOB)).await?.into_inner();
    ensure!(!bobs.servers.iter().any(|s| s.name == "alice_only"), "bob does not see alice's server");
    let denied = client.call_tool(authed(call("alice_only_echo", json!({"message": "x"})), BOB)).await.err().map(|s| s.code());
    ensure!(denied == Some(Code::NotFound), "{denied:?}");
    let allowed = client.call_tool(authed(call("alice_only_echo", json!({"message": "x"})), ALICE)).await?.into_inner();
    ensure!(text(&allowed) == "Echo: x", "{allowed:?}");
    Ok(())
}

#[tokio::test]
async fn an_expired_session_is_reinitialised_with_exactly_one_retry() -> Result<()> {
    let remote = HttpServer::python(&[], None)?;
    let servers = json!({"remote": {"type": "http", "url": remote.url(), "protocol": "initialize"}});
    let service = mcp::start(servers, "", "", &[])?;
    let mut client = service.client().await?;
    let first = client.call_tool(call("remote_echo", json!({"message": "one"}))).await?.into_inner();
    ensure!(!first.session_reinitialized, "{first:?}");
    remote.admin("expire").await?;
    let second = client.call_tool(call("remote_echo", json!({"message": "two"}))).await?.into_inner();
    ensure!(text(&second) == "Echo: two" && second.session_reinitialized, "{second:?}");
    let seen = remote.stats().await?;
    ensure!(seen["tool_call_404s"] == 1 && seen["tool_calls"]["echo"] == 2 && seen["initializes"] == 2, "{seen}");
    ensure!(stats(&mut client, "remote").await?.reinitializations == 1, "counted");

    // A server that keeps refusing: one re-initialisation, one retry, then the error.
    remote.admin("expire-always").await?;
    let failed = client.call_tool(call("remote_echo", json!({"message": "three"}))).await.err().ok_or_else(|| anyhow!("succeeded"))?;
    ensure!(failed.code() == Code::Unavailable && failed.message().contains("remote"), "{failed:?}");
    let seen = remote.stats().await?;
    ensure!(seen["tool_call_404s"] == 3, "the original request and exactly one retry: {seen}");
    Ok(())
}

#[tokio::test]
async fn a_crashed_server_is_restarted_on_the_next_call() -> Result<()> {
    let service = mcp::start(json!({"py": mcp::python_stdio_entry()?}), "", "", &[])?;
    let mut client = service.client().await?;
    let before = pid(&client.call_tool(call("py_whoami", json!({}))).await?.into_inner())?;
    let crashed = client.call_tool(call("py_crash", json!({}))).await.err().ok_or_else(|| anyhow!("crash returned"))?;
    ensure!(crashed.code() == Code::Unavailable, "{crashed:?}");
    ensure!(crashed.message().contains("crashing on request") && crashed.message().contains("may have taken effect"), "{crashed:?}");
    let after = client.call_tool(call("py_whoami", json!({}))).await?.into_inner();
    ensure!(pid(&after)? != before && !after.session_reused, "a new process: {after:?}");
    let line = stats(&mut client, "py").await?;
    ensure!(line.creations == 2 && line.circuit_state() == CircuitState::Closed, "{line:?}");
    Ok(())
}

#[tokio::test]
async fn timeouts_and_dropped_calls_are_cancelled_on_the_server() -> Result<()> {
    let marks = tempfile::tempdir()?;
    let mut entry = mcp::python_stdio_entry()?;
    entry["env"] = json!({"MARK_DIR": marks.path()});
    let remote = HttpServer::python(&["--stateless"], None)?;
    let servers = json!({"py": entry, "remote": {"type": "http", "url": remote.url()}});
    let service = mcp::start(servers, "", "", &[])?;
    let mut client = service.client().await?;
    client.call_tool(call("py_echo", json!({"message": "warm"}))).await?;

    let mut hang = call("py_hang", json!({"tag": "timeout"}));
    hang.timeout = Some(prost_types::Duration::try_from(Duration::from_secs(1))?);
    let started = Instant::now();
    let timed_out = client.call_tool(hang).await.err().ok_or_else(|| anyhow!("hang returned"))?;
    ensure!(timed_out.code() == Code::DeadlineExceeded && started.elapsed() < Duration::from_secs(5), "{timed_out:?}");
    let mark = marks.path().join("cancelled-timeout");
    ensure!(eventually(Duration::from_secs(10), || mark.exists()).await, "the server saw no cancellation after the timeout");

    // The caller goes away (a run is cancelled, the gRPC call is dropped): the server is told as well.
    let mut dropped = client.clone();
    let call_task = tokio::spawn(async move { dropped.call_tool(call("py_hang", json!({"tag": "dropped"}))).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    call_task.abort();
    let mark = marks.path().join("cancelled-dropped");
    ensure!(eventually(Duration::from_secs(10), || mark.exists()).await, "the server saw no cancellation after the caller left");

    let remote_task = {
        let mut c = client.clone();
        tokio::spawn(async move { c.call_tool(call("remote_hang", json!({"tag": "remote"}))).await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    remote_task.abort();
    let mut seen = serde_json::Value::Null;
    for _ in 0..100 {
        seen = remote.stats().await?;
        if seen["cancelled"].as_array().is_some_and(|c| c.iter().any(|t| t == "remote")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(seen["cancelled"].as_array().is_some_and(|c| c.iter().any(|t| t == "remote")), "HTTP server saw no cancellation: {seen}");
    // The pool still serves calls afterwards.
    let echo = client.call_tool(call("py_echo", json!({"message": "after"}))).await?.into_inner();
    ensure!(text(&echo) == "Echo: after", "{echo:?}");
    Ok(())
}

#[tokio::test]
async fn the_breaker_opens_after_five_failed_starts_and_a_trial_closes_it() -> Result<()> {
    let port = mcp::free_port()?;
    let mut remote = HttpServer::python(&[], Some(port))?;
    let servers = json!({"remote": {"type": "http", "url": remote.url(), "protocol": "initialize", "session_init_timeout": 5}});
    let service = mcp::start(servers, "  pool:\n    breaker_reset_secs: 2\n", "", &[])?;
    let mut client = service.client().await?;
    client.call_tool(call("remote_echo", json!({"message": "up"}))).await?;
    remote.kill();

    // The broken session, then five failed starts.
    for attempt in 0..6 {
        let error = client.call_tool(call("remote_echo", json!({"message": "down"}))).await.err().ok_or_else(|| anyhow!("succeeded"))?;
        ensure!(error.code() == Code::Unavailable, "attempt {attempt}: {error:?}");
    }
    let line = stats(&mut client, "remote").await?;
    ensure!(line.creation_failures == 5 && line.circuit_state() == CircuitState::Open, "{line:?}");
    let started = Instant::now();
    let fast = client.call_tool(call("remote_echo", json!({"message": "down"}))).await.err().ok_or_else(|| anyhow!("succeeded"))?;
    ensure!(fast.code() == Code::Unavailable && started.elapsed() < Duration::from_millis(500), "{fast:?}");
    ensure!(fast.message().contains("`remote`") && fast.message().contains("circuit breaker"), "{fast:?}");
    ensure!(fast.metadata().get("retry-after").is_some(), "{fast:?}");
    ensure!(stats(&mut client, "remote").await?.creation_failures == 5, "an open breaker does not try");

    tokio::time::sleep(Duration::from_millis(2200)).await;
    ensure!(stats(&mut client, "remote").await?.circuit_state() == CircuitState::HalfOpen, "half-open after the reset time");
    let _remote = HttpServer::python(&[], Some(port))?;
    let back = client.call_tool(call("remote_echo", json!({"message": "back"}))).await?.into_inner();
    ensure!(text(&back) == "Echo: back", "{back:?}");
    ensure!(stats(&mut client, "remote").await?.circuit_state() == CircuitState::Closed, "the trial closed it");
    Ok(())
}

#[tokio::test]
async fn the_least_recently_used_idle_session_makes_room() -> Result<()> {
    let service = mcp::start(json!({"py": mcp::python_stdio_entry()?}), "  pool:\n    max_sessions: 2\n", "", &[])?;
    let mut client = service.client().await?;
    // Discovery opened the "default" session; t1 fills the pool; t2 evicts the older ("default").
    let t1 = pid(&client.call_tool(on_thread(call("py_whoami", json!({})), "t1")).await?.into_inner())?;
    client.call_tool(on_thread(call("py_whoami", json!({})), "t2")).await?;
    let line = stats(&mut client, "py").await?;
    ensure!(line.sessions_open == 2 && line.evictions == 1, "{line:?}");
    let again = client.call_tool(on_thread(call("py_whoami", json!({})), "t1")).await?.into_inner();
    ensure!(pid(&again)? == t1 && again.session_reused, "t1 was more recent than default and stayed");
    let capacity = client.get_pool_stats(GetPoolStatsRequest::default()).await?.into_inner().capacity;
    ensure!(capacity == 2, "{capacity}");
    Ok(())
}
