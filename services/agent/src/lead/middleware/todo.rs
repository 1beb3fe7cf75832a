//! Todo (plan mode): keeps the model on its `write_todos` plan. Before a model call, if the plan is
//! no longer visible in the messages (no `write_todos` call left in them), a reminder listing it is
//! added to the request; after a final answer that leaves items unfinished, a completion reminder is
//! queued and the loop goes back to the model — at most twice per run.

use std::sync::Mutex;

use antler_proto::common::Role;
use antler_proto::models::ChatRequest;
use futures::future::BoxFuture;

use crate::lead::pipeline::{LoopError, Middleware, ModelNext, ModelResult};
use crate::lead::run_env::RunEnv;
use crate::lead::state::{ThreadState, Todo, text_message};

/// Completion reminders per run (DeerFlow's `_MAX_COMPLETION_REMINDERS`).
pub const MAX_COMPLETION_REMINDERS: u32 = 2;

#[derive(Debug, Default)]
pub struct TodoMiddleware {
    state: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    /// The reminder to add to the next request.
    reminder: Option<String>,
    completion_reminders: u32,
}

fn listing(todos: &[Todo]) -> String {
    todos.iter().map(|t| format!("- [{}] {}", t.status, t.content)).collect::<Vec<_>>().join("\n")
}

/// The reminder for a plan that scrolled out of the messages.
pub fn plan_reminder(todos: &[Todo]) -> String {
    format!(
        "<system_reminder>\nYour todo list from earlier is no longer visible in the current context window, but it is still active. \
         Here is the current state:\n\n{}\n\nContinue tracking and updating this todo list as you work. Call `write_todos` whenever \
         the status of any item changes.\n</system_reminder>",
        listing(todos)
    )
}

/// The reminder after a final answer with unfinished items.
pub fn completion_reminder(todos: &[Todo]) -> String {
    format!(
        "<system_reminder>\nYou are about to finish, but your todo list still has incomplete items:\n\n{}\n\nComplete them (and \
         update the list with `write_todos`) before giving your final answer, or mark them completed if they are already done.\n\
         </system_reminder>",
        listing(todos)
    )
}

impl Middleware for TodoMiddleware {
    fn name(&self) -> &'static str {
        "Todo"
    }

    fn before_model<'a>(&'a self, _env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        let visible = state.messages.iter().any(|m| m.tool_calls.iter().any(|c| c.name == "write_todos"));
        if !state.todos.is_empty() && !visible {
            let mut pending = self.state.lock().unwrap_or_else(|p| p.into_inner());
            pending.reminder.get_or_insert_with(|| plan_reminder(&state.todos));
        }
        Box::pin(async { Ok(()) })
    }

    fn wrap_model_call<'a>(&'a self, env: &'a RunEnv, mut request: ChatRequest, next: ModelNext<'a>) -> BoxFuture<'a, ModelResult> {
        if let Some(reminder) = self.state.lock().unwrap_or_else(|p| p.into_inner()).reminder.take() {
            let mut message = text_message(Role::User, reminder);
            message.name = "todo_reminder".to_owned();
            request.messages.push(message);
        }
        next.run(env, request)
    }

    fn after_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        let final_answer = state.messages.last().is_some_and(|m| m.role == Role::Assistant as i32 && m.tool_calls.is_empty());
        let unfinished: Vec<Todo> = state.todos.iter().filter(|t| !t.done()).cloned().collect();
        if final_answer && !unfinished.is_empty() && env.stop_reason().is_none() {
            let mut pending = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if pending.completion_reminders < MAX_COMPLETION_REMINDERS {
                pending.completion_reminders += 1;
                pending.reminder = Some(completion_reminder(&state.todos));
                env.jump_to_model();
            }
        }
        Box::pin(async { Ok(()) })
    }
}
