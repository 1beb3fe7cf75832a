//! ThreadData: stamps this run's input messages — `name = "user-input"` on user messages, the run id
//! in their metadata and a creation time — so later layers (and readers of the thread) can tell the
//! user's words of each run apart from injected context.

use antler_proto::common::Role;
use futures::future::BoxFuture;
use prost_types::value::Kind;

use crate::lead::pipeline::{LoopError, Middleware};
use crate::lead::run_env::RunEnv;
use crate::lead::state::ThreadState;

#[derive(Debug)]
pub struct ThreadData;

impl Middleware for ThreadData {
    fn name(&self) -> &'static str {
        "ThreadData"
    }

    fn before_agent<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        let run_id = env.ctx.spec.run_id.clone();
        let input_ids: Vec<String> = env.ctx.spec.request.input.iter().map(|m| m.id.clone()).collect();
        let now = prost_types::Timestamp::from(std::time::SystemTime::now());
        // This run's input is the tail of the messages when the run starts (before any model turn).
        let first_input = state.messages.len().saturating_sub(input_ids.len());
        for message in state.messages.iter_mut().skip(first_input) {
            if message.role != Role::User as i32 || message.metadata.as_ref().is_some_and(|m| m.fields.contains_key("run_id")) {
                continue;
            }
            if message.name.is_empty() {
                message.name = "user-input".to_owned();
            }
            message
                .metadata
                .get_or_insert_with(Default::default)
                .fields
                .insert("run_id".to_owned(), prost_types::Value { kind: Some(Kind::StringValue(run_id.clone())) });
            message.created_at.get_or_insert(now);
        }
        Box::pin(async { Ok(()) })
    }
}
