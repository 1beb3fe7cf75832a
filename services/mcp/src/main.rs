//! `antler-mcp`: serves the mcp service alone (for a multi-process or Kubernetes install).

antler_kit::service_main!("antler-mcp", "MCP service (tools of MCP servers through a session pool)", antler_mcp::SERVICE);
