//! TokenBudget (`config.token_budget`, default `lead.token_budget.default_tokens`): at `warn_fraction`
//! of the run's budget the model is told once to wrap up; the model turn that takes the run past the
//! budget has its tool calls dropped (nothing more is spent on them), gets a note, and the run ends
//! SUCCESS with stop_reason `token_capped`. Tokens are every model call's input + output as the
//! providers report them, over all attempts of the run (`AgentContext::tokens_spent`).

use std::sync::atomic::{AtomicBool, Ordering};

use antler_proto::common::Role;
use antler_proto::models::ChatRequest;
use futures::future::BoxFuture;

use crate::lead::pipeline::{LoopError, Middleware, ModelNext, ModelResult};
use crate::lead::run_env::RunEnv;
use crate::lead::state::{ThreadState, finish_with_note, text_message};

#[derive(Debug)]
pub struct TokenBudget {
    budget: u64,
    warn_at: u64,
    warned: AtomicBool,
    /// Set by after_model, injected by the next wrap_model_call.
    warn_next: AtomicBool,
}

impl TokenBudget {
    pub fn new(budget: u64, warn_fraction: f64) -> Self {
        Self { budget, warn_at: (budget as f64 * warn_fraction) as u64, warned: AtomicBool::new(false), warn_next: AtomicBool::new(false) }
    }
}

fn stop_note(spent: u64, budget: u64) -> String {
    format!(
        "\n\n[TOKEN BUDGET REACHED] This run has used {spent} tokens of its budget of {budget}. No further tool calls are made; \
         this is the final answer with the results collected so far."
    )
}

impl Middleware for TokenBudget {
    fn name(&self) -> &'static str {
        "TokenBudget"
    }

    fn wrap_model_call<'a>(&'a self, env: &'a RunEnv, mut request: ChatRequest, next: ModelNext<'a>) -> BoxFuture<'a, ModelResult> {
        if self.warn_next.swap(false, Ordering::SeqCst) {
            let spent = env.ctx.tokens_spent();
            let mut warning = text_message(
                Role::User,
                format!(
                    "[TOKEN BUDGET] This run has used {spent} of its {} tokens. Finish the task with as few further steps as possible \
                     and give your final answer soon.",
                    self.budget
                ),
            );
            warning.name = "token_budget_warning".to_owned();
            request.messages.push(warning);
        }
        next.run(env, request)
    }

    fn after_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        let spent = env.ctx.tokens_spent();
        if spent >= self.budget {
            if let Some(last) = state.messages.last_mut().filter(|m| m.role == Role::Assistant as i32) {
                tracing::warn!(run_id = %env.ctx.spec.run_id, spent, budget = self.budget, dropped_calls = last.tool_calls.len(), "token budget reached");
                finish_with_note(last, &stop_note(spent, self.budget));
                env.stop("token_capped");
            }
        } else if spent >= self.warn_at && !self.warned.swap(true, Ordering::SeqCst) {
            self.warn_next.store(true, Ordering::SeqCst);
        }
        Box::pin(async { Ok(()) })
    }
}
