//! Configuration of the mcp service as an operator meets it: DeerFlow's extensions file with hostile and
//! broken entries, `$VAR` references and the child's environment, inline servers in antler.yaml, reloads
//! that keep unchanged servers' sessions, and OAuth-protected servers whose tokens never leak.

use std::time::Duration;

use antler_integration_tests::mcp::{self, HttpServer, call, eventually, text};
use antler_integration_tests::runs::authed;
use antler_integration_tests::{Launch, try_start};
use antler_proto::mcp::{ListServersRequest, ListToolsRequest, ReloadConfigRequest, ServerStatus};
use anyhow::{Result, anyhow, ensure};
use serde_json::json;
use tonic::Code;

fn pid(response: &antler_proto::mcp::CallToolResponse) -> Result<u64> {
    let who: serde_json::Value = serde_json::from_str(&text(response))?;
    who["pid"].as_u64().ok_or_else(|| anyhow!("no pid in {who}"))
}

fn process_gone(pid: u64) -> bool {
    // Gone, or a zombie nobody reaped yet (it no longer runs).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn hostile_and_broken_entries_are_refused_by_name_and_the_rest_loads() -> Result<()> {
    let dead_port = mcp::free_port()?;
    let servers = json!({
        "good": mcp::python_stdio_entry()?,
        "not_allowed": {"command": "bash", "args": ["-lc", "id"]},
        "inline_code": {"command": mcp::python()?, "args": ["-c", "import os"]},
        "injected": {"command": mcp::python()?, "args": ["server.py"], "env": {"PYTHONPATH": "/tmp/evil"}},
        "wrong_type": {"type": "websocket", "url": "ws://127.0.0.1:1"},
        "unreachable": {"type": "http", "url": format!("http://127.0.0.1:{dead_port}/mcp"), "session_init_timeout": 3},
    });
    let service = mcp::start(servers, "", "", &[])?;
    let mut client = service.client().await?;
    let listed = client.list_servers(ListServersRequest {}).await?.into_inner();
    let problem = |server: &str| listed.errors.iter().find(|e| e.server == server).map(|e| e.message.clone()).unwrap_or_default();
    ensure!(problem("not_allowed").contains("command") && problem("not_allowed").contains("allowlist"), "{listed:?}");
    ensure!(problem("inline_code").contains("args[0]"), "{listed:?}");
    ensure!(problem("injected").contains("env.PYTHONPATH"), "{listed:?}");
    ensure!(problem("wrong_type").contains("type") && problem("wrong_type").contains("websocket"), "{listed:?}");
    ensure!(listed.errors.len() == 4, "{listed:?}");
    let names: Vec<&str> = listed.servers.iter().map(|s| s.name.as_str()).collect();
    ensure!(names == ["good", "unreachable"], "{names:?}");

    // A listing answers with what is ready; the Python server may take seconds to start on a loaded
    // machine, so list until it is (the unreachable one must never hold it up past its own start).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let tools = loop {
        let tools = client.list_tools(ListToolsRequest::default()).await?.into_inner();
        if !tools.not_ready.iter().any(|n| n.server == "good") || std::time::Instant::now() > deadline {
            break tools;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(tools.unavailable_servers == ["unreachable"], "{tools:?}");
    ensure!(tools.tools.iter().any(|t| t.name == "good_echo"), "the good server is unaffected");
    let listed = client.list_servers(ListServersRequest {}).await?.into_inner();
    let unreachable = listed.servers.iter().find(|s| s.name == "unreachable").ok_or_else(|| anyhow!("missing"))?;
    ensure!(unreachable.status() == ServerStatus::Error && unreachable.last_error.contains("unreachable"), "{unreachable:?}");
    ensure!(unreachable.last_error_at.is_some(), "{unreachable:?}");
    let echo = client.call_tool(call("good_echo", json!({"message": "fine"}))).await?.into_inner();
    ensure!(text(&echo) == "Echo: fine", "{echo:?}");

    // Invalid JSON on reload: refused, the last good config stays in effect.
    let hash = listed.config_hash.clone();
    std::fs::write(&service.extensions, "{\"mcpServers\": {")?;
    let refused = client.reload_config(ReloadConfigRequest { force: false }).await.err().ok_or_else(|| anyhow!("accepted"))?;
    ensure!(refused.code() == Code::FailedPrecondition && refused.message().contains("not valid JSON"), "{refused:?}");
    let echo = client.call_tool(call("good_echo", json!({"message": "still"}))).await?.into_inner();
    ensure!(text(&echo) == "Echo: still", "{echo:?}");
    ensure!(client.list_servers(ListServersRequest {}).await?.into_inner().config_hash == hash, "config unchanged");
    Ok(())
}

#[tokio::test]
async fn a_file_that_is_not_json_stops_start_up_with_its_path() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("extensions_config.json");
    std::fs::write(&path, "{ not json")?;
    let launch = Launch::default().config(mcp::mcp_yaml(&path, "")?);
    let failure = match try_start("antler-mcp", launch)? {
        Ok(_) => return Err(anyhow!("antler-mcp started on a broken file")),
        Err(failure) => failure,
    };
    ensure!(failure.stderr.contains("not valid JSON") && failure.stderr.contains("extensions_config.json"), "{}", failure.stderr);
    Ok(())
}

#[tokio::test]
async fn variables_resolve_and_the_child_gets_only_its_own_environment() -> Result<()> {
    let servers = json!({
        "every": {"command": "node", "args": [mcp::everything_js()?, "stdio"], "env": {"ANTLER_PASSED": "$ANTLER_MCP_TEST_VALUE", "WITH_DEFAULT": "${ANTLER_UNSET_VAR:-fallback}"}},
        "missing": {"command": "node", "args": ["x.js"], "env": {"X": "$ANTLER_MCP_NOT_SET_ANYWHERE"}},
    });
    let inline = format!(
        "  servers:\n    inline:\n      command: \"{}\"\n      args: [\"{}\", stdio]\n",
        mcp::python()?.display(),
        mcp::test_server_py()?.display()
    );
    let service =
        mcp::start(servers, &inline, "", &[("ANTLER_MCP_TEST_VALUE", "from-env"), ("ANTLER_MCP_SERVICE_SECRET", "hidden-value")])?;
    let mut client = service.client().await?;
    let env = text(&client.call_tool(call("every_get-env", json!({}))).await?.into_inner());
    ensure!(env.contains("\"ANTLER_PASSED\": \"from-env\"") || env.contains("\"ANTLER_PASSED\":\"from-env\""), "{env}");
    ensure!(env.contains("fallback"), "{env}");
    ensure!(!env.contains("ANTLER_MCP_SERVICE_SECRET") && !env.contains("hidden-value"), "the service's environment leaked: {env}");
    let listed = client.list_servers(ListServersRequest {}).await?.into_inner();
    let missing = listed.errors.iter().find(|e| e.server == "missing").map(|e| e.message.clone()).unwrap_or_default();
    ensure!(missing.contains("ANTLER_MCP_NOT_SET_ANYWHERE"), "{listed:?}");
    let inline = client.call_tool(call("inline_echo", json!({"message": "from antler.yaml"}))).await?.into_inner();
    ensure!(text(&inline) == "Echo: from antler.yaml", "{inline:?}");
    Ok(())
}

const AUTH: &str = "server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: alice-key-0123456789\n        user: alice\n      - key: bob-key-0123456789ab\n        user: bob\n";

#[tokio::test]
async fn a_reload_keeps_unchanged_servers_sessions_and_closes_changed_ones() -> Result<()> {
    let servers = json!({"a": mcp::python_stdio_entry()?, "b": mcp::python_stdio_entry()?});
    let service = mcp::start(servers, "  reload_interval_ms: 100\n  operators: [alice]\n", AUTH, &[])?;
    let mut client = service.client().await?;
    let key = "alice-key-0123456789";
    let a = pid(&client.call_tool(authed(call("a_whoami", json!({})), key)).await?.into_inner())?;
    let b = pid(&client.call_tool(authed(call("b_whoami", json!({})), key)).await?.into_inner())?;
    let grandchild: u64 = text(&client.call_tool(authed(call("b_spawn_child", json!({})), key)).await?.into_inner()).parse()?;
    let hash = client.list_servers(authed(ListServersRequest {}, key)).await?.into_inner().config_hash;

    // The file changes under the service: the watcher applies it.
    let mut changed_b = mcp::python_stdio_entry()?;
    changed_b["description"] = json!("now described");
    mcp::write_servers(&service.extensions, &json!({"a": mcp::python_stdio_entry()?, "b": changed_b}))?;
    let mut applied = false;
    for _ in 0..100 {
        if client.list_servers(authed(ListServersRequest {}, key)).await?.into_inner().config_hash != hash {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(applied, "the watcher did not pick the change up");
    let a_after = client.call_tool(authed(call("a_whoami", json!({})), key)).await?.into_inner();
    ensure!(pid(&a_after)? == a && a_after.session_reused, "the unchanged server kept its session");
    let b_after = pid(&client.call_tool(authed(call("b_whoami", json!({})), key)).await?.into_inner())?;
    ensure!(b_after != b, "the changed server was restarted");
    ensure!(eventually(Duration::from_secs(5), || process_gone(b) && process_gone(grandchild)).await, "b's process group was not killed");

    let unchanged = client.reload_config(authed(ReloadConfigRequest { force: false }, key)).await?.into_inner();
    ensure!(!unchanged.changed && unchanged.sessions_closed == 0, "{unchanged:?}");
    let denied = client.reload_config(authed(ReloadConfigRequest { force: false }, "bob-key-0123456789ab")).await.err().map(|s| s.code());
    ensure!(denied == Some(Code::PermissionDenied), "{denied:?}");
    let forced = client.reload_config(authed(ReloadConfigRequest { force: true }, key)).await?.into_inner();
    ensure!(forced.changed && forced.sessions_closed == 2 && forced.changed_servers == ["a", "b"], "{forced:?}");
    ensure!(eventually(Duration::from_secs(5), || process_gone(a)).await, "a's process was not stopped by the forced reload");

    mcp::write_servers(&service.extensions, &json!({"a": mcp::python_stdio_entry()?}))?;
    let mut removed = false;
    for _ in 0..100 {
        let tools = client.list_tools(authed(ListToolsRequest::default(), key)).await?.into_inner();
        if !tools.tools.iter().any(|t| t.server == "b") {
            removed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(removed, "b was not removed");
    let gone = client.call_tool(authed(call("b_whoami", json!({})), key)).await.err().map(|s| s.code());
    ensure!(gone == Some(Code::NotFound), "{gone:?}");
    Ok(())
}

#[tokio::test]
async fn oauth_tokens_are_fetched_refreshed_before_expiry_rotated_and_never_shown() -> Result<()> {
    let credentials = HttpServer::python(&["--oauth", "--token-ttl", "3"], None)?;
    let refreshing = HttpServer::python(&["--oauth", "--token-ttl", "2"], None)?;
    let token_url = |s: &HttpServer| format!("http://127.0.0.1:{}/token", s.port);
    let servers = json!({
        "cc": {"type": "http", "url": credentials.url(), "oauth": {
            "token_url": token_url(&credentials), "grant_type": "client_credentials",
            "client_id": "antler", "client_secret": "$ANTLER_TEST_CLIENT_SECRET", "refresh_skew_seconds": 1}},
        "rt": {"type": "http", "url": refreshing.url(), "oauth": {
            "token_url": token_url(&refreshing), "grant_type": "refresh_token", "refresh_token": "rt-initial-0123456789",
            "refresh_skew_seconds": 1}},
        "bad": {"type": "http", "url": credentials.url(), "oauth": {
            "token_url": token_url(&credentials), "client_id": "antler", "client_secret": "wrong-secret-value-123"}},
    });
    let log = "server:\n  log:\n    filter: debug\n";
    let service = mcp::start(servers, "", log, &[("ANTLER_TEST_CLIENT_SECRET", "s3cret-client-value")])?;
    let mut client = service.client().await?;

    let first = client.call_tool(call("cc_echo", json!({"message": "one"}))).await?.into_inner();
    ensure!(text(&first) == "Echo: one", "{first:?}");
    client.call_tool(call("cc_echo", json!({"message": "two"}))).await?;
    ensure!(credentials.stats().await?["grants"]["client_credentials"] == 1, "the token is cached");
    // 3 s tokens, refreshed 1 s before expiry: after 2.2 s the next call fetches a new one first.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    client.call_tool(call("cc_echo", json!({"message": "three"}))).await?;
    let seen = credentials.stats().await?;
    ensure!(seen["grants"]["client_credentials"] == 2 && seen["bad_tokens"] == 0, "refreshed before it expired: {seen}");

    client.call_tool(call("rt_echo", json!({"message": "a"}))).await?;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    client.call_tool(call("rt_echo", json!({"message": "b"}))).await?;
    let seen = refreshing.stats().await?;
    let used: Vec<String> = seen["refresh_tokens_used"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    // Every refresh after the first sends the token the previous one rotated in (the server accepts only
    // the current one, so a stale token would have failed with invalid_grant).
    let distinct: std::collections::BTreeSet<&String> = used.iter().collect();
    ensure!(used.len() >= 2 && used[0] == "rt-initial-0123456789" && distinct.len() == used.len(), "{used:?}");
    ensure!(seen["grants"]["refresh_token"] == used.len() && seen["bad_tokens"] == 0, "{seen}");

    let refused = client.call_tool(call("bad_echo", json!({"message": "x"}))).await.err().ok_or_else(|| anyhow!("accepted"))?;
    ensure!(refused.code() == Code::Unavailable || refused.code() == Code::NotFound, "{refused:?}");
    let listed = client.list_servers(ListServersRequest {}).await?.into_inner();
    let bad = listed.servers.iter().find(|s| s.name == "bad").ok_or_else(|| anyhow!("bad missing"))?;
    ensure!(bad.oauth_enabled && bad.last_error.contains("OAuth") && bad.last_error.contains("401"), "{bad:?}");

    let mut secrets: Vec<String> =
        credentials.stats().await?["issued"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect();
    secrets.extend(refreshing.stats().await?["issued"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)));
    secrets.extend(used.iter().skip(1).cloned());
    secrets.extend(["s3cret-client-value".to_owned(), "wrong-secret-value-123".to_owned(), "rt-initial-0123456789".to_owned()]);
    ensure!(secrets.len() >= 8, "{secrets:?}");
    let logs = service.process.stderr();
    let shown = format!("{listed:?} {refused:?}");
    for secret in &secrets {
        ensure!(!logs.contains(secret.as_str()), "a credential is in the logs");
        ensure!(!shown.contains(secret.as_str()), "a credential is in a response: {shown}");
    }
    ensure!(logs.contains("OAuth token obtained"), "the log says a token was fetched (without it)");
    Ok(())
}
