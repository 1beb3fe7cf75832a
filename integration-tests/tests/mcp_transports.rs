//! McpService end to end over every transport, against real MCP servers: server-everything (npm) over
//! stdio, legacy SSE and streamable HTTP; server-filesystem over stdio; this crate's Python server over
//! stdio and as a 2026-07-28 stateless HTTP server. Also naming, search, content mapping, path rewriting
//! and argument validation.

use std::time::Duration;

use antler_integration_tests::mcp::{self, HttpServer, call, text};
use antler_proto::mcp::{ListServersRequest, ListToolsRequest, QueryKind, SearchToolsRequest, ServerStatus, Transport, tool_content};
use anyhow::{Result, ensure};
use serde_json::json;
use tonic::Code;

#[tokio::test]
async fn every_transport_answers_call_tool_with_the_servers_content() -> Result<()> {
    let sse = HttpServer::everything("sse")?;
    let streamable = HttpServer::everything("streamableHttp")?;
    let stateless = HttpServer::python(&["--stateless"], None)?;
    let servers = json!({
        "stdio": {"type": "stdio", "command": "node", "args": [mcp::everything_js()?, "stdio"]},
        "legacy": {"type": "sse", "url": sse.url()},
        "streamable": {"type": "http", "url": streamable.url()},
        "pystdio": mcp::python_stdio_entry()?,
        "modern": {"type": "http", "url": stateless.url()},
    });
    let service = mcp::start(servers, "", "", &[])?;
    let mut client = service.client().await?;

    for (server, expected) in [
        ("stdio", "Echo: hi stdio"),
        ("legacy", "Echo: hi legacy"),
        ("streamable", "Echo: hi streamable"),
        ("pystdio", "Echo: hi pystdio"),
        ("modern", "Echo: hi modern"),
    ] {
        let message = format!("hi {server}");
        let response = client.call_tool(call(&format!("{server}_echo"), json!({"message": message}))).await?.into_inner();
        ensure!(text(&response) == expected, "{server}: {response:?}");
        ensure!(response.server == server && response.original_name == "echo" && !response.is_error, "{response:?}");
    }

    let servers = client.list_servers(ListServersRequest {}).await?.into_inner();
    let by_name = |n: &str| servers.servers.iter().find(|s| s.name == n).cloned();
    for (name, transport) in [
        ("stdio", Transport::Stdio),
        ("legacy", Transport::Sse),
        ("streamable", Transport::StreamableHttp),
        ("modern", Transport::StreamableHttp),
    ] {
        let info = by_name(name).ok_or_else(|| anyhow::anyhow!("{name} missing"))?;
        ensure!(info.transport() == transport && info.status() == ServerStatus::Ready && info.tool_count > 0, "{info:?}");
    }
    ensure!(by_name("modern").map(|s| s.protocol_version) == Some("2026-07-28".to_owned()), "stateless server: {servers:?}");
    ensure!(by_name("stdio").map(|s| s.protocol_version) == Some("2025-11-25".to_owned()), "session server: {servers:?}");
    ensure!(servers.config_hash.len() == 16 && servers.errors.is_empty(), "{servers:?}");

    // A stateless server is reached without initialize and without a session id.
    let stats = stateless.stats().await?;
    ensure!(stats["initializes"] == 0 && stats["discovers"].as_u64().unwrap_or(0) >= 1, "{stats}");
    ensure!(stats["seen_sessions"].as_array().is_some_and(|s| s.is_empty()), "{stats}");

    // Content blocks keep their kind: an image, resource links, structured content.
    let image = client.call_tool(call("stdio_get-tiny-image", json!({}))).await?.into_inner();
    let png = image.content.iter().find_map(|c| match &c.content {
        Some(tool_content::Content::Image(i)) => Some(i.clone()),
        _ => None,
    });
    ensure!(png.as_ref().is_some_and(|i| i.mime_type == "image/png" && i.data.starts_with(b"\x89PNG")), "{image:?}");
    let links = client.call_tool(call("streamable_get-resource-links", json!({"count": 2}))).await?.into_inner();
    let count = links.content.iter().filter(|c| matches!(c.content, Some(tool_content::Content::ResourceLink(_)))).count();
    ensure!(count == 2, "{links:?}");
    let structured = client.call_tool(call("legacy_get-structured-content", json!({"location": "New York"}))).await?.into_inner();
    ensure!(structured.structured_content.is_some(), "{structured:?}");
    Ok(())
}

#[tokio::test]
async fn the_filesystem_server_works_inside_its_allowed_directory() -> Result<()> {
    let allowed = tempfile::tempdir()?;
    std::fs::write(allowed.path().join("notes.txt"), "antler reads this")?;
    let servers = json!({"fs": {"command": "node", "args": [mcp::filesystem_js()?, allowed.path()]}});
    let service = mcp::start(servers, "", "", &[])?;
    let mut client = service.client().await?;
    let path = allowed.path().join("notes.txt");
    let read = client.call_tool(call("fs_read_text_file", json!({"path": path}))).await?.into_inner();
    ensure!(text(&read).contains("antler reads this"), "{read:?}");
    let outside = client.call_tool(call("fs_read_text_file", json!({"path": "/etc/hostname"}))).await?.into_inner();
    ensure!(outside.is_error, "a tool error is a normal response with is_error: {outside:?}");
    Ok(())
}

#[tokio::test]
async fn stdio_servers_run_in_the_threads_workspace_and_host_paths_come_back_virtual() -> Result<()> {
    let service = mcp::start(json!({"py": mcp::python_stdio_entry()?}), "", "", &[])?;
    let mut client = service.client().await?;
    let mut request = call("py_whoami", json!({}));
    request.thread_id = "thread-a".into();
    let who: serde_json::Value = serde_json::from_str(&text(&client.call_tool(request).await?.into_inner()))?;
    ensure!(who["cwd"] == "/mnt/user-data/workspace", "{who}");
    ensure!(who["tmpdir"] == "/mnt/user-data/workspace/.mcp/tmp", "{who}");

    let mut request = call("py_write_output", json!({"name": "report.txt", "text": "done"}));
    request.thread_id = "thread-a".into();
    let wrote = client.call_tool(request).await?.into_inner();
    ensure!(text(&wrote) == "wrote /mnt/user-data/workspace/report.txt", "{wrote:?}");
    let link = wrote.content.iter().find_map(|c| match &c.content {
        Some(tool_content::Content::ResourceLink(l)) => Some(l.uri.clone()),
        _ => None,
    });
    ensure!(link.as_deref() == Some("/mnt/user-data/workspace/report.txt"), "{wrote:?}");
    let host = service.data_dir.join("sandbox/users/local/threads/thread-a/user-data/workspace/report.txt");
    ensure!(std::fs::read_to_string(&host)? == "done", "the file is in the sandbox's workspace of the thread");
    Ok(())
}

#[tokio::test]
async fn tools_are_named_searched_and_their_arguments_checked_before_sending() -> Result<()> {
    let servers = json!({
        "every thing": {"command": "node", "args": [mcp::everything_js()?, "stdio"]},
        "bare": {"command": "node", "args": [mcp::everything_js()?, "stdio"], "tool_name_prefix": false},
        "off": {"command": "node", "args": [mcp::everything_js()?, "stdio"], "enabled": false},
    });
    let service = mcp::start(servers, "  tool_search:\n    enabled: true\n", "", &[])?;
    let mut client = service.client().await?;
    let listing = client.list_tools(ListToolsRequest { server: String::new() }).await?.into_inner();
    let names: Vec<&str> = listing.tools.iter().map(|t| t.name.as_str()).collect();
    ensure!(names.contains(&"every_thing_echo") && names.contains(&"echo"), "{names:?}");
    ensure!(names.iter().all(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')), "{names:?}");
    ensure!(!names.iter().any(|n| n.starts_with("off_")), "a disabled server lists nothing");
    ensure!(listing.tools.iter().all(|t| t.deferred) && listing.catalog_hash.len() == 16, "tool_search marks tools deferred");
    let echo = listing.tools.iter().find(|t| t.name == "every_thing_echo").ok_or_else(|| anyhow::anyhow!("no echo"))?;
    ensure!(echo.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true), "{echo:?}");
    let missing = client.list_tools(ListToolsRequest { server: "nope".into() }).await.err().map(|s| s.code());
    ensure!(missing == Some(Code::NotFound), "{missing:?}");

    let select = client
        .search_tools(SearchToolsRequest { query: "select:echo,nothing,every_thing_get-sum".into(), max_results: 0 })
        .await?
        .into_inner();
    let picked: Vec<&str> = select.tools.iter().map(|t| t.name.as_str()).collect();
    ensure!(picked == ["echo", "every_thing_get-sum"] && select.missing_names == ["nothing"], "{select:?}");
    ensure!(select.query_kind() == QueryKind::Select && select.catalog_hash == listing.catalog_hash, "{select:?}");
    let required = client.search_tools(SearchToolsRequest { query: "+every_thing sum".into(), max_results: 3 }).await?.into_inner();
    ensure!(required.query_kind() == QueryKind::RequiredKeyword && required.tools.len() == 3, "{required:?}");
    ensure!(
        required.tools[0].name == "every_thing_get-sum" && required.tools.iter().all(|t| t.name.contains("every_thing")),
        "{required:?}"
    );
    let regex = client.search_tools(SearchToolsRequest { query: "ech.".into(), max_results: 0 }).await?.into_inner();
    ensure!(regex.query_kind() == QueryKind::Regex && regex.tools.first().is_some_and(|t| t.name.ends_with("echo")), "{regex:?}");
    let literal = client.search_tools(SearchToolsRequest { query: "sum(".into(), max_results: 0 }).await?.into_inner();
    ensure!(literal.query_kind() == QueryKind::Literal, "{literal:?}");
    let empty = client.search_tools(SearchToolsRequest { query: " ".into(), max_results: 0 }).await.err().map(|s| s.code());
    ensure!(empty == Some(Code::InvalidArgument), "{empty:?}");

    let bad = client.call_tool(call("echo", json!({"message": 42}))).await.err().ok_or_else(|| anyhow::anyhow!("accepted"))?;
    ensure!(bad.code() == Code::InvalidArgument && bad.message().starts_with("arguments.message:"), "{bad:?}");
    let missing = client.call_tool(call("echo", json!({}))).await.err().ok_or_else(|| anyhow::anyhow!("accepted"))?;
    ensure!(missing.code() == Code::InvalidArgument && missing.message().contains("message"), "{missing:?}");
    let meta = client
        .call_tool(call("echo", json!({"message": "x", "_meta": {"progressToken": 1}})))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    ensure!(meta.as_ref().is_some_and(|(c, m)| *c == Code::InvalidArgument && m.starts_with("arguments._meta")), "{meta:?}");
    let unknown = client.call_tool(call("no_such_tool", json!({}))).await.err().map(|s| s.code());
    ensure!(unknown == Some(Code::NotFound), "{unknown:?}");
    let disabled = client.call_tool(call("off_echo", json!({"message": "x"}))).await.err().map(|s| s.code());
    ensure!(disabled == Some(Code::FailedPrecondition), "{disabled:?}");
    let mut slow = call("echo", json!({"message": "x"}));
    slow.timeout = Some(prost_types::Duration::try_from(Duration::from_secs(7200))?);
    let slow = client.call_tool(slow).await.err().map(|s| (s.code(), s.message().to_owned()));
    ensure!(slow.as_ref().is_some_and(|(c, m)| *c == Code::InvalidArgument && m.starts_with("timeout")), "{slow:?}");
    let mut bad_thread = call("echo", json!({"message": "x"}));
    bad_thread.thread_id = "../x".into();
    let bad_thread = client.call_tool(bad_thread).await.err().map(|s| s.code());
    ensure!(bad_thread == Some(Code::InvalidArgument), "{bad_thread:?}");
    Ok(())
}

#[tokio::test]
async fn a_stateless_servers_listing_is_cached_for_its_ttl_then_listed_again() -> Result<()> {
    let server = HttpServer::python(&["--stateless", "--tools-ttl-ms", "1500"], None)?;
    let service = mcp::start(json!({"modern": {"type": "http", "url": server.url()}}), "", "", &[])?;
    let mut client = service.client().await?;
    let names = |l: &antler_proto::mcp::ListToolsResponse| l.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    let before = client.list_tools(ListToolsRequest::default()).await?.into_inner();
    ensure!(!names(&before).contains(&"modern_late_tool".to_owned()), "{:?}", names(&before));
    let added = client.call_tool(call("modern_add_tool", json!({"name": "late_tool"}))).await?.into_inner();
    ensure!(text(&added) == "added late_tool", "{added:?}");
    let cached = client.list_tools(ListToolsRequest::default()).await?.into_inner();
    ensure!(names(&cached) == names(&before), "within ttlMs the listing is not fetched again");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let fresh = client.list_tools(ListToolsRequest::default()).await?.into_inner();
    ensure!(names(&fresh).contains(&"modern_late_tool".to_owned()), "after ttlMs it is: {:?}", names(&fresh));
    let late = client.call_tool(call("modern_late_tool", json!({}))).await?.into_inner();
    ensure!(text(&late) == "late_tool", "{late:?}");
    Ok(())
}
