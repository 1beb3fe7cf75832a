//! `write_todos` (plan mode): replaces the run's plan. The Todo middleware reminds the model of it.

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;
use crate::lead::state::Todo;

#[derive(Debug)]
pub struct WriteTodos;

const STATUSES: [&str; 3] = ["pending", "in_progress", "completed"];

impl Tool for WriteTodos {
    fn name(&self) -> &'static str {
        "write_todos"
    }

    fn description(&self) -> &'static str {
        "Use this tool to create and manage a structured task list for your current work session. It helps you track progress, \
         organize complex tasks, and demonstrate thoroughness to the user.\n\n\
         Use it for complex multi-step tasks (3 or more distinct steps). Do not use it for single, trivial tasks.\n\n\
         Task states: pending (not yet started), in_progress (currently working on it), completed (finished successfully). \
         Mark tasks completed IMMEDIATELY after finishing them, and keep at least one task in_progress while work remains. \
         Each call replaces the whole list."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "description": "The complete, updated todo list.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string", "description": "The task."},
                            "status": {"type": "string", "enum": STATUSES}
                        },
                        "required": ["content", "status"]
                    }
                }
            },
            "required": ["todos"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let raw = match args.0.get("todos") {
                Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(Value::Null),
                Some(value) => value.clone(),
                None => Value::Null,
            };
            let todos: Vec<Todo> = match serde_json::from_value(raw) {
                Ok(todos) => todos,
                Err(error) => {
                    return Ok(ToolOutput::error(format!("Error: `todos` must be a list of {{content, status}} objects: {error}")));
                }
            };
            if let Some(bad) = todos.iter().find(|t| !STATUSES.contains(&t.status.as_str())) {
                return Ok(ToolOutput::error(format!(
                    "Error: status `{}` of `{}` is not one of pending, in_progress, completed",
                    bad.status, bad.content
                )));
            }
            let listed = serde_json::to_string(&todos).unwrap_or_default();
            env.set_todos(todos);
            Ok(ToolOutput::ok(format!("Updated todo list to {listed}")))
        })
    }
}
