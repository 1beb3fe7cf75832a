//! Tool discovery of one server, on its own: each server's discovery (session start + `tools/list`) runs
//! in its own task, shared by every caller that needs that server's tools, so
//!
//! * one server that never answers delays only the callers that need that server (a call of one of its
//!   tools), never a call of another server's tool;
//! * a listing can stop waiting (`mcp.listing_wait_ms`) while the discovery goes on, and a later listing
//!   finds its result;
//! * concurrent callers share one discovery instead of queueing for one each (which, behind a server that
//!   times out, cost the second caller two timeouts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio_util::sync::CancellationToken;

use crate::catalog::ToolEntry;
use crate::error::{McpError, Result};

/// A server's tools, sorted by exposed name.
pub type Tools = Arc<Vec<Arc<ToolEntry>>>;

type Done = Shared<BoxFuture<'static, Result<Tools>>>;

/// A discovery under way.
#[derive(Clone)]
pub struct Flight {
    /// When it began: a listing's wait for this server counts from here, so a server that has been
    /// starting for a while holds up no listing.
    pub started: Instant,
    generation: u64,
    done: Done,
}

impl Flight {
    /// Waits for the outcome (bounded by the server's `session_init_timeout` inside the discovery).
    pub async fn outcome(&self) -> Result<Tools> {
        self.done.clone().await
    }

    /// The outcome if it comes before `deadline`; `None` while the discovery is still running.
    pub async fn outcome_by(&self, deadline: Instant) -> Option<Result<Tools>> {
        tokio::time::timeout_at(deadline.into(), self.done.clone()).await.ok()
    }

    /// How long it has been running.
    pub fn running_for(&self) -> Duration {
        self.started.elapsed()
    }
}

/// The discovery slot of one server: at most one discovery at a time.
#[derive(Default)]
pub struct DiscoverySlot {
    current: Arc<Mutex<Option<Flight>>>,
    generations: AtomicU64,
}

impl std::fmt::Debug for DiscoverySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoverySlot").field("running", &self.lock().is_some()).finish()
    }
}

impl DiscoverySlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Flight>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The discovery under way, or a new one running `work` in its own task. The task ends with `work`
    /// (which bounds itself by the server's `session_init_timeout`) or at `stop` (the service shutting
    /// down); no caller going away ends it.
    pub fn join_or_start(
        &self,
        server: &str,
        stop: &CancellationToken,
        work: impl FnOnce() -> BoxFuture<'static, Result<Tools>>,
    ) -> Flight {
        let mut current = self.lock();
        if let Some(flight) = current.as_ref() {
            return flight.clone();
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let slot = self.current.clone();
        let stop = stop.clone();
        let work = work();
        let task = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let result = tokio::select! {
                    result = work => result,
                    () = stop.cancelled() => Err(McpError::Cancelled("the MCP service is shutting down".to_owned())),
                };
                // The slot is freed after the outcome is recorded on the server, so whoever finds it empty
                // also finds the new tools (or the failure).
                let mut current = slot.lock().unwrap_or_else(|p| p.into_inner());
                if current.as_ref().is_some_and(|f| f.generation == generation) {
                    *current = None;
                }
                result
            },
            tracing::info_span!("mcp_discovery", server = %server),
        ));
        let done: Done = async move {
            match task.await {
                Ok(result) => result,
                Err(error) => Err(McpError::Internal(format!("the tool discovery task failed: {error}"))),
            }
        }
        .boxed()
        .shared();
        let flight = Flight { started: Instant::now(), generation, done };
        *current = Some(flight.clone());
        flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Tools {
        Arc::new(Vec::new())
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_discovery_that_outlives_them() {
        let slot = DiscoverySlot::default();
        let stop = CancellationToken::new();
        let runs = Arc::new(AtomicU64::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let counted = runs.clone();
        let first = slot.join_or_start("s", &stop, move || {
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = released.await;
                Ok(tools())
            }
            .boxed()
        });
        let second = slot.join_or_start("s", &stop, || async { Ok(tools()) }.boxed());
        assert_eq!(first.generation, second.generation, "the second caller joins the first discovery");
        // A caller that stops waiting leaves the discovery running.
        assert!(first.outcome_by(Instant::now() + Duration::from_millis(20)).await.is_none());
        drop(first);
        let _ = release.send(());
        assert!(second.outcome().await.is_ok());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Once finished, the slot is free for the next discovery.
        let third = slot.join_or_start("s", &stop, || async { Err(McpError::Internal("x".into())) }.boxed());
        assert_ne!(third.generation, second.generation);
        assert!(third.outcome().await.is_err());
    }

    #[tokio::test]
    async fn shutdown_ends_a_discovery() {
        let slot = DiscoverySlot::default();
        let stop = CancellationToken::new();
        let flight = slot.join_or_start("s", &stop, || futures::future::pending().boxed());
        stop.cancel();
        assert!(matches!(flight.outcome().await, Err(McpError::Cancelled(_))));
    }
}
