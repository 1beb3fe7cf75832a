//! A [`Host`] that keeps everything in memory: what the agent wrote (events in order, checkpoints,
//! usage, the title) and its side-effect journal, with fencing on demand. For unit tests of agents
//! and for embedding programs that want a run without a database.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use antler_proto::common::Usage;
use antler_proto::runs::run_event::Kind;
use futures::future::BoxFuture;

use crate::host::{Batch, Effect, Fenced, Host, NewCheckpoint};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct MemoryHost {
    written: Mutex<Written>,
    journal: Mutex<HashMap<String, Effect>>,
    fenced: AtomicBool,
}

/// Everything written so far.
#[derive(Debug, Default, Clone)]
pub struct Written {
    pub events: Vec<Kind>,
    pub checkpoints: Vec<NewCheckpoint>,
    pub usage: Vec<(String, String, Usage)>,
    pub title: Option<String>,
    /// How many writes (batches) there were.
    pub writes: usize,
}

impl MemoryHost {
    /// A copy of what was written.
    pub fn written(&self) -> Written {
        self.written.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// From now on every write is refused, as after a lost lease.
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), Fenced> {
        if self.fenced() { Err(Fenced) } else { Ok(()) }
    }
}

impl Host for MemoryHost {
    fn write(&self, batch: Batch) -> BoxFuture<'_, Result<(), Fenced>> {
        Box::pin(async move {
            self.check()?;
            let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
            written.events.extend(batch.events);
            written.usage.extend(batch.usage);
            written.checkpoints.extend(batch.checkpoint);
            if batch.title.is_some() {
                written.title = batch.title;
            }
            let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            for done in batch.results {
                journal.insert(done.tool_call_id, Effect::Done { result: done.result, is_error: done.is_error });
            }
            written.writes += 1;
            Ok(())
        })
    }

    fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    fn effect<'a>(&'a self, tool_call_id: &'a str) -> BoxFuture<'a, Result<Effect, Fenced>> {
        Box::pin(async move {
            self.check()?;
            Ok(self.journal.lock().unwrap_or_else(|p| p.into_inner()).get(tool_call_id).cloned().unwrap_or(Effect::None))
        })
    }

    fn record_intent<'a>(&'a self, tool_call_id: &'a str, _tool_name: &'a str, _arguments: &'a str) -> BoxFuture<'a, Result<(), Fenced>> {
        Box::pin(async move {
            self.check()?;
            self.journal.lock().unwrap_or_else(|p| p.into_inner()).entry(tool_call_id.to_owned()).or_insert(Effect::Unknown);
            Ok(())
        })
    }

    fn record_result<'a>(&'a self, tool_call_id: &'a str, result: &'a str, is_error: bool) -> BoxFuture<'a, Result<(), Fenced>> {
        Box::pin(async move {
            self.check()?;
            let done = Effect::Done { result: result.to_owned(), is_error };
            self.journal.lock().unwrap_or_else(|p| p.into_inner()).insert(tool_call_id.to_owned(), done);
            Ok(())
        })
    }
}
