//! `antler-mcp`: serves the mcp service alone (for a multi-process or Kubernetes install).

antler_kit::service_main!("antler-mcp", "MCP service (the MCP session pool; not implemented yet)", antler_mcp::SERVICE);
