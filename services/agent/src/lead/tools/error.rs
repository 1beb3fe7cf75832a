//! What an unexpected tool failure is (expected ones are `Error: …` results the model reads), and the
//! text the model reads instead when one happens (used by the ToolErrorHandling middleware, the
//! journalled tool call and the loop).

/// An unexpected tool failure.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("the sandbox service answered {:?}: {}", .0.code(), .0.message())]
    Sandbox(tonic::Status),
    #[error("no sandbox client is configured (clients.sandbox)")]
    NoSandboxClient,
    #[error("the MCP service answered {:?}: {}", .0.code(), .0.message())]
    Mcp(tonic::Status),
    #[error("no MCP client is configured (clients.mcp)")]
    NoMcpClient,
    /// The run is stopping (cancel or lost ownership): not a tool failure, the loop ends.
    #[error("the run is stopping")]
    Stopping,
}

impl ToolError {
    /// The exception-like kind name in the error text the model reads.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::InvalidArguments(_) => "InvalidArguments",
            ToolError::Sandbox(_) => "SandboxError",
            ToolError::NoSandboxClient | ToolError::NoMcpClient => "ConfigurationError",
            ToolError::Mcp(_) => "McpError",
            ToolError::Stopping => "Stopping",
        }
    }
}

/// The result text for a tool that failed with `error`.
pub fn error_text(name: &str, error: &ToolError) -> String {
    let detail: String = error.to_string().chars().take(500).collect();
    format!("Error: Tool '{name}' failed with {}: {detail}. Continue with available context, or choose an alternative tool.", error.kind())
}
