//! The built-in tools, one file each, behind [`Tool`]. Schemas are what the model sees; they follow
//! DeerFlow's (a leading `description` argument, the same names and defaults) so prompts carry over.
//!
//! Expected failures (a missing file, a bad argument) are results starting with `Error:` that the
//! model can read; a [`ToolError`] is an unexpected failure, turned into such a result by the
//! ToolErrorHandling middleware. Neither fails the run.

pub mod acp;
pub mod ask_clarification;
pub mod bash;
pub mod error;
pub mod glob;
pub mod grep;
pub mod image_search;
pub mod ls;
pub mod mcp;
pub mod present_files;
pub mod read_file;
pub mod skill_manage;
pub mod str_replace;
pub mod task;
pub mod tool_search;
pub mod view_image;
pub mod web;
pub mod web_fetch;
pub mod web_search;
pub mod write_file;
pub mod write_todos;

use std::sync::Arc;

use antler_proto::common::ToolSpec;
use futures::future::BoxFuture;
use serde_json::{Map, Value};

use super::run_env::RunEnv;

/// Where every file tool's paths live.
pub const USER_DATA: &str = "/mnt/user-data";
/// Deliverables: the only place `present_files` accepts.
pub const OUTPUTS: &str = "/mnt/user-data/outputs";

pub use error::{ToolError, error_text};

/// A tool result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
    /// When the call's outcome is unknown (intent journalled by an attempt that died).
    pub outcome_unknown: bool,
}

impl ToolOutput {
    pub fn ok(text: impl Into<String>) -> Self {
        Self { text: text.into(), is_error: false, outcome_unknown: false }
    }

    /// An `Error: …` result.
    pub fn error(text: impl Into<String>) -> Self {
        let text = text.into();
        let text = if text.starts_with("Error:") { text } else { format!("Error: {text}") };
        Self { text, is_error: true, outcome_unknown: false }
    }
}

/// One tool the model can call.
pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// JSON schema of the arguments.
    fn parameters(&self) -> Value;
    /// True when a call changes the world (journalled: never blindly re-run after a crash).
    fn side_effect(&self) -> bool {
        false
    }
    /// True when the model is not shown the tool until `tool_search` promotes it (MCP tools when the
    /// MCP service defers them).
    fn deferred(&self) -> bool {
        false
    }
    /// The schema, when the tool keeps its own (built-ins have theirs built once per process).
    fn own_spec(&self) -> Option<Arc<ToolSpec>> {
        None
    }
    /// The MCP server behind the tool (None for built-ins): recorded in its ToolFinished event.
    fn mcp_server(&self) -> Option<&str> {
        None
    }
    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
    /// [`call`](Self::call) for a tool that needs its call's id (`task`: the id names its child run).
    fn call_for<'a>(
        &'a self,
        env: &'a RunEnv,
        call: &'a antler_proto::common::ToolCall,
        args: &'a Args,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        let _ = call;
        self.call(env, args)
    }
}

/// The tools of one agent, in the order the model sees them.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: Vec<Arc<dyn Tool>>,
}

/// A tool as the model is shown it, its schema as JSON text (`ToolSpec.parameters_json`, not the
/// `parameters` Struct): every model call sends every tool, and as a Struct each schema was a tree of
/// maps and values built, encoded and decoded again per call — the largest source of a one-step
/// run's allocations (heaptrack, #32: figures in the runs README). A null schema (no arguments) is
/// sent as none.
pub fn spec_with_schema(name: String, description: String, schema: &Value) -> ToolSpec {
    let parameters_json = if schema.is_null() { String::new() } else { schema.to_string() };
    ToolSpec { name, description, parameters: None, parameters_json }
}

/// The schema of each built-in tool, built once per process: every run and every model call sends
/// the same ones, and a per-run copy of them was the largest thing a run waiting on its model held
/// (about 40 KiB).
fn cached_spec(tool: &dyn Tool) -> Arc<ToolSpec> {
    if let Some(spec) = tool.own_spec() {
        return spec;
    }
    static SPECS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, Arc<ToolSpec>>>> =
        std::sync::LazyLock::new(Default::default);
    let mut specs = SPECS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(spec) = specs.get(tool.name()) {
        return spec.clone();
    }
    specs
        .entry(tool.name().to_owned())
        .or_insert_with(|| Arc::new(spec_with_schema(tool.name().to_owned(), tool.description().to_owned(), &tool.parameters())))
        .clone()
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.iter().map(|t| t.name())).finish()
    }
}

impl ToolSet {
    /// Every built-in tool (`write_todos` only in plan mode).
    pub fn builtin(plan_mode: bool) -> Self {
        let mut set = Self {
            tools: vec![
                Arc::new(bash::Bash),
                Arc::new(ls::Ls),
                Arc::new(read_file::ReadFile),
                Arc::new(write_file::WriteFile),
                Arc::new(str_replace::StrReplace),
                Arc::new(glob::Glob),
                Arc::new(grep::Grep),
                Arc::new(present_files::PresentFiles),
                Arc::new(ask_clarification::AskClarification),
            ],
        };
        if plan_mode {
            set.tools.push(Arc::new(write_todos::WriteTodos));
        }
        set
    }

    /// Adds the web tools `runs.lead.web` switches on (`web_search`, `web_fetch`, `image_search`),
    /// after the built-ins; their HTTP clients are built once per configuration and shared by runs.
    pub fn add_web(&mut self, config: &web::config::WebConfig) -> Result<(), web::BuildError> {
        self.extend(web::tools(config)?);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// Adds tools after the built-ins (MCP tools, `tool_search`), leaving out any whose name is
    /// already taken: a built-in always wins over a same-named MCP tool.
    pub fn extend(&mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) {
        for tool in tools {
            if self.get(tool.name()).is_some() {
                tracing::warn!(tool = %tool.name(), "tool left out: a tool of that name already exists");
                continue;
            }
            self.tools.push(tool);
        }
    }

    /// Keeps only the tools `keep` accepts (a subagent's allowed tools).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.tools.retain(|t| keep(t.name()));
    }

    /// Every tool's name, in order.
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name().to_owned()).collect()
    }

    /// The schemas the model is given (a copy for the request; prost messages own their values).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.specs_where(|_| true)
    }

    /// The schemas of the tools `shown` keeps.
    pub fn specs_where(&self, shown: impl Fn(&dyn Tool) -> bool) -> Vec<ToolSpec> {
        self.tools.iter().filter(|t| shown(t.as_ref())).map(|t| (*cached_spec(t.as_ref())).clone()).collect()
    }
}

/// A call's arguments, read leniently (models send numbers as strings and the like).
#[derive(Debug, Clone, Default)]
pub struct Args(pub Map<String, Value>);

impl Args {
    pub fn required(&self, key: &str) -> Result<String, ToolError> {
        self.string(key).ok_or_else(|| ToolError::InvalidArguments(format!("missing required argument `{key}` (a string)")))
    }

    pub fn string(&self, key: &str) -> Option<String> {
        match self.0.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    pub fn boolean(&self, key: &str) -> bool {
        match self.0.get(key) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
            _ => false,
        }
    }

    pub fn number(&self, key: &str) -> Option<u64> {
        match self.0.get(key)? {
            Value::Number(n) => n.as_u64().or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    pub fn strings(&self, key: &str) -> Vec<String> {
        match self.0.get(key) {
            Some(Value::Array(items)) => items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
            // Some models send a list as its JSON text, or a single path.
            Some(Value::String(s)) => match serde_json::from_str::<Vec<String>>(s) {
                Ok(list) => list,
                Err(_) => vec![s.clone()],
            },
            _ => Vec::new(),
        }
    }
}

/// The leading `description` parameter every sandbox tool has.
pub fn description_param() -> Value {
    serde_json::json!({
        "type": "string",
        "description": "Explain why you are calling this tool in short words. ALWAYS PROVIDE THIS PARAMETER FIRST."
    })
}

/// Expected sandbox failures become `Error:` results the model can act on; the rest are tool errors.
pub fn sandbox_failure(status: tonic::Status) -> Result<ToolOutput, ToolError> {
    use tonic::Code;
    match status.code() {
        Code::NotFound
        | Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::PermissionDenied
        | Code::OutOfRange
        | Code::ResourceExhausted
        | Code::AlreadyExists => Ok(ToolOutput::error(status.message().to_owned())),
        _ => Err(ToolError::Sandbox(status)),
    }
}
