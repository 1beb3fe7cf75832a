//! What the agent calls on the host of its run ([`antler_agent::Host`]): its writes and journal
//! entries (see `mod.rs` and `journal.rs`), and its `task` calls, each started as a subagent run by
//! `crate::subagent`.

use antler_agent::{Batch, Effect, Fenced, Host, SubagentCall, SubagentUpdate};
use futures::future::BoxFuture;

use super::{Child, RunHost};

impl Host for RunHost {
    fn write(&self, batch: Batch) -> BoxFuture<'_, Result<(), Fenced>> {
        Box::pin(self.write_batch(batch))
    }

    fn fenced(&self) -> bool {
        self.check().is_err()
    }

    fn effect<'a>(&'a self, tool_call_id: &'a str) -> BoxFuture<'a, Result<Effect, Fenced>> {
        Box::pin(self.journal_effect(tool_call_id))
    }

    fn record_intent<'a>(&'a self, tool_call_id: &'a str, tool_name: &'a str, arguments: &'a str) -> BoxFuture<'a, Result<(), Fenced>> {
        Box::pin(self.journal_intent(tool_call_id, tool_name, arguments))
    }

    fn record_result<'a>(&'a self, tool_call_id: &'a str, result: &'a str, is_error: bool) -> BoxFuture<'a, Result<(), Fenced>> {
        Box::pin(self.journal_result(tool_call_id, result, is_error))
    }

    fn subagent(&self, call: SubagentCall) -> BoxFuture<'_, Result<tokio::sync::mpsc::Receiver<SubagentUpdate>, Fenced>> {
        Box::pin(async move {
            self.check()?;
            let parent = crate::subagent::Parent {
                run_id: self.spec.run_id.clone(),
                thread_id: self.spec.thread_id.clone(),
                user_id: self.spec.user_id.clone(),
                attempt: self.spec.attempt,
                secret_names: self.inherit.secret_names.clone(),
                context: self.inherit.context.clone(),
                local: self.local.clone(),
                done: self.done.clone(),
            };
            let (task_id, subagent_type) = (call.task_id.clone(), call.subagent_type.clone());
            let (updates, driver) = crate::subagent::spawn(self.engine.clone(), parent, call);
            self.children.lock().unwrap_or_else(|p| p.into_inner()).push(Child { task_id, subagent_type, driver });
            Ok(updates)
        })
    }
}
