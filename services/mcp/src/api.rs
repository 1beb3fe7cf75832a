//! Thin tonic handlers for `antler.mcp.v1`. The capability behind them has not landed yet, so each RPC
//! answers UNIMPLEMENTED with a message naming what is missing, never a fake success.

use antler_kit::status::unimplemented;
use antler_proto::mcp::*;
use tonic::{Request, Response, Status};

/// `antler.mcp.v1.McpService`: every RPC answers UNIMPLEMENTED until its capability lands.
#[derive(Debug, Default, Clone)]
pub struct McpApi;

const MCP_SERVICE_CAPABILITY: &str = "the MCP session pool and tool catalog are not scheduled in an issue yet";

#[tonic::async_trait]
impl mcp_service_server::McpService for McpApi {
    async fn list_servers(&self, _request: Request<ListServersRequest>) -> Result<Response<ListServersResponse>, Status> {
        Err(unimplemented("McpService.ListServers", MCP_SERVICE_CAPABILITY))
    }

    async fn list_tools(&self, _request: Request<ListToolsRequest>) -> Result<Response<ListToolsResponse>, Status> {
        Err(unimplemented("McpService.ListTools", MCP_SERVICE_CAPABILITY))
    }

    async fn search_tools(&self, _request: Request<SearchToolsRequest>) -> Result<Response<SearchToolsResponse>, Status> {
        Err(unimplemented("McpService.SearchTools", MCP_SERVICE_CAPABILITY))
    }

    async fn call_tool(&self, _request: Request<CallToolRequest>) -> Result<Response<CallToolResponse>, Status> {
        Err(unimplemented("McpService.CallTool", MCP_SERVICE_CAPABILITY))
    }

    async fn reload_config(&self, _request: Request<ReloadConfigRequest>) -> Result<Response<ReloadConfigResponse>, Status> {
        Err(unimplemented("McpService.ReloadConfig", MCP_SERVICE_CAPABILITY))
    }

    async fn get_pool_stats(&self, _request: Request<GetPoolStatsRequest>) -> Result<Response<GetPoolStatsResponse>, Status> {
        Err(unimplemented("McpService.GetPoolStats", MCP_SERVICE_CAPABILITY))
    }
}
