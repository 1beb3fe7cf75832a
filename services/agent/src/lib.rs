//! The Antler lead agent (DESIGN §5): a model ⇄ tools loop with a middleware pipeline and built-in
//! tools ([`lead`]), and the interface through which any agent meets the run it executes.
//!
//! An agent knows its run only through [`AgentContext`], which holds the run's [`RunSpec`], a
//! cancellation token, the clients of the other services, and a [`Host`]: the narrow interface the
//! runs service implements (atomic writes of events, checkpoints and usage; the side-effect journal;
//! fencing). Every host write is refused once the worker lost its lease ([`Fenced`]), so an agent
//! cannot write after fencing even by mistake. The crate has no database and no import of the runs
//! service: [`memory_host::MemoryHost`] runs an agent with everything kept in memory, for tests.

pub mod agent_context;
pub mod host;
pub mod lead;
pub mod memory_host;
pub mod metrics_catalog;
pub mod outcome;
pub mod run_secrets;
pub mod spec;

pub use agent_context::AgentContext;
pub use host::{Batch, Effect, EffectResult, Fenced, Host, NewCheckpoint, SubagentCall, SubagentEnd, SubagentUpdate};
pub use outcome::{Outcome, Outputs};
pub use run_secrets::RunSecrets;
pub use spec::RunSpec;

use futures::future::BoxFuture;

/// Builds agents. Called only after the run passed the runs service's start gate: a run cancelled
/// while PENDING never gets this far.
pub trait AgentFactory: Send + Sync {
    fn build(&self, spec: &RunSpec) -> Result<Box<dyn Agent>, antler_proto::runs::RunError>;
}

/// The work inside a run.
pub trait Agent: Send {
    /// Runs to an outcome. Must return promptly once `ctx.cancelled()` fires.
    fn run(self: Box<Self>, ctx: AgentContext) -> BoxFuture<'static, Outcome>;
}
