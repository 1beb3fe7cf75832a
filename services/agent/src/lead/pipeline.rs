//! The middleware pipeline around the loop. Hooks: `before_agent`, `before_model`,
//! `wrap_model_call`, `after_model`, `wrap_tool_call`, `after_agent`. Before-hooks run in list
//! order, after-hooks in reverse, and wrappers nest with the first middleware outermost (DESIGN §5).

use std::sync::Arc;

use antler_proto::common::{Message, ToolCall, Usage};
use antler_proto::models::{ChatRequest, FinishReason};
use futures::future::BoxFuture;

use super::run_env::RunEnv;
use super::state::ThreadState;
use super::tools::{Args, ToolError, ToolOutput};

/// Why the loop stops other than by a final answer.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The worker lost the run: write nothing more.
    #[error("this worker no longer owns the run")]
    Fenced,
    #[error("the run was cancelled")]
    Cancelled,
    #[error("recursion limit {0} reached")]
    RecursionLimit(u32),
    #[error("{message}")]
    Model { code: String, message: String, retryable: bool },
}

impl From<crate::Fenced> for LoopError {
    fn from(_: crate::Fenced) -> Self {
        LoopError::Fenced
    }
}

/// One assistant turn as the model produced it.
#[derive(Debug, Clone, Default)]
pub struct ModelTurn {
    pub message: Message,
    pub finish_reason: FinishReason,
    pub usage: Option<Usage>,
    /// The model that answered (may be a fallback).
    pub model_name: String,
}

pub type ModelResult = Result<ModelTurn, LoopError>;
pub type ToolResult = Result<ToolOutput, ToolError>;

/// The innermost model call.
pub trait ModelTerminal: Send + Sync {
    fn call<'a>(&'a self, env: &'a RunEnv, request: ChatRequest) -> BoxFuture<'a, ModelResult>;
}

/// The innermost tool call.
pub trait ToolTerminal: Send + Sync {
    fn call<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args) -> BoxFuture<'a, ToolResult>;
}

/// The rest of the model-call chain.
pub struct ModelNext<'a> {
    rest: &'a [Arc<dyn Middleware>],
    terminal: &'a dyn ModelTerminal,
}

impl<'a> ModelNext<'a> {
    pub fn run(self, env: &'a RunEnv, request: ChatRequest) -> BoxFuture<'a, ModelResult> {
        match self.rest.split_first() {
            Some((first, rest)) => first.wrap_model_call(env, request, ModelNext { rest, terminal: self.terminal }),
            None => self.terminal.call(env, request),
        }
    }
}

/// The rest of the tool-call chain.
pub struct ToolNext<'a> {
    rest: &'a [Arc<dyn Middleware>],
    terminal: &'a dyn ToolTerminal,
}

impl<'a> ToolNext<'a> {
    pub fn run(self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args) -> BoxFuture<'a, ToolResult> {
        match self.rest.split_first() {
            Some((first, rest)) => first.wrap_tool_call(env, call, args, ToolNext { rest, terminal: self.terminal }),
            None => self.terminal.call(env, call, args),
        }
    }
}

fn done<'a>() -> BoxFuture<'a, Result<(), LoopError>> {
    Box::pin(async { Ok(()) })
}

/// One layer of the pipeline. Every hook defaults to doing nothing.
pub trait Middleware: Send + Sync {
    /// The layer's name, e.g. `LoopDetection` (anchors and logs use it).
    fn name(&self) -> &'static str;

    fn before_agent<'a>(&'a self, _env: &'a RunEnv, _state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        done()
    }

    fn before_model<'a>(&'a self, _env: &'a RunEnv, _state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        done()
    }

    fn wrap_model_call<'a>(&'a self, env: &'a RunEnv, request: ChatRequest, next: ModelNext<'a>) -> BoxFuture<'a, ModelResult> {
        next.run(env, request)
    }

    /// Runs after the assistant turn was appended to `state.messages` (it is the last message).
    fn after_model<'a>(&'a self, _env: &'a RunEnv, _state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        done()
    }

    fn wrap_tool_call<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args, next: ToolNext<'a>) -> BoxFuture<'a, ToolResult> {
        next.run(env, call, args)
    }

    fn after_agent<'a>(&'a self, _env: &'a RunEnv, _state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        done()
    }
}

/// Where a custom layer goes.
#[derive(Debug, Clone)]
pub enum Anchor {
    After(&'static str),
    Before(&'static str),
}

/// Placing layers failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    #[error("middleware {0} is anchored both after and before another layer; give it one anchor")]
    ConflictingAnchors(&'static str),
    #[error("middlewares {0} and {1} are anchored on the same side of {2}; anchor one of them on the other")]
    SameAnchor(&'static str, &'static str, &'static str),
    #[error("circular dependency among extra middlewares: {0}")]
    Cycle(String),
    #[error("cannot resolve positions of {0}: anchors not found")]
    MissingAnchor(String),
}

/// The ordered layers of one run.
#[derive(Clone, Default)]
pub struct Pipeline {
    layers: Vec<Arc<dyn Middleware>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// A custom layer and where it goes (`None`: just before Clarification).
pub struct Extra {
    pub layer: Arc<dyn Middleware>,
    pub after: Option<&'static str>,
    pub before: Option<&'static str>,
}

impl Pipeline {
    /// The built-in layers in order, then `extras` placed by their anchors. `Clarification` always
    /// ends up last.
    pub fn build(base: Vec<Arc<dyn Middleware>>, extras: Vec<Extra>) -> Result<Self, PipelineError> {
        let mut layers = base;
        let mut anchored = Vec::new();
        for extra in extras {
            match (extra.after, extra.before) {
                (Some(_), Some(_)) => return Err(PipelineError::ConflictingAnchors(extra.layer.name())),
                (None, None) => {
                    let at = layers.iter().position(|l| l.name() == "Clarification").unwrap_or(layers.len());
                    layers.insert(at, extra.layer);
                }
                (Some(a), None) => anchored.push((extra.layer, Anchor::After(a))),
                (None, Some(b)) => anchored.push((extra.layer, Anchor::Before(b))),
            }
        }
        for (i, (layer, anchor)) in anchored.iter().enumerate() {
            for (other, other_anchor) in &anchored[i + 1..] {
                let same = match (anchor, other_anchor) {
                    (Anchor::After(a) | Anchor::Before(a), Anchor::After(b) | Anchor::Before(b)) => a == b,
                };
                if same {
                    let target = match anchor {
                        Anchor::After(a) | Anchor::Before(a) => a,
                    };
                    return Err(PipelineError::SameAnchor(layer.name(), other.name(), target));
                }
            }
        }
        // Anchored extras may anchor on each other: place what can be placed, round after round.
        let mut pending = anchored;
        for _ in 0..=pending.len() {
            if pending.is_empty() {
                break;
            }
            let mut still = Vec::new();
            for (layer, anchor) in pending {
                let target = match &anchor {
                    Anchor::After(a) | Anchor::Before(a) => *a,
                };
                match layers.iter().position(|l| l.name() == target) {
                    Some(at) => {
                        let at = if matches!(anchor, Anchor::After(_)) { at + 1 } else { at };
                        layers.insert(at, layer);
                    }
                    None => still.push((layer, anchor)),
                }
            }
            pending = still;
        }
        if !pending.is_empty() {
            let names: Vec<&str> = pending.iter().map(|(l, _)| l.name()).collect();
            let anchors_are_pending = pending.iter().all(|(_, a)| {
                let target = match a {
                    Anchor::After(t) | Anchor::Before(t) => *t,
                };
                names.contains(&target)
            });
            return Err(if anchors_are_pending {
                PipelineError::Cycle(names.join(", "))
            } else {
                PipelineError::MissingAnchor(names.join(", "))
            });
        }
        if let Some(at) = layers.iter().position(|l| l.name() == "Clarification") {
            let clarification = layers.remove(at);
            layers.push(clarification);
        }
        Ok(Self { layers })
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.layers.iter().map(|l| l.name()).collect()
    }

    pub async fn before_agent(&self, env: &RunEnv, state: &mut ThreadState) -> Result<(), LoopError> {
        for layer in &self.layers {
            layer.before_agent(env, state).await?;
        }
        Ok(())
    }

    pub async fn before_model(&self, env: &RunEnv, state: &mut ThreadState) -> Result<(), LoopError> {
        for layer in &self.layers {
            layer.before_model(env, state).await?;
        }
        Ok(())
    }

    pub async fn model_call(&self, env: &RunEnv, request: ChatRequest, terminal: &dyn ModelTerminal) -> ModelResult {
        ModelNext { rest: &self.layers, terminal }.run(env, request).await
    }

    pub async fn after_model(&self, env: &RunEnv, state: &mut ThreadState) -> Result<(), LoopError> {
        for layer in self.layers.iter().rev() {
            layer.after_model(env, state).await?;
        }
        Ok(())
    }

    pub async fn tool_call(&self, env: &RunEnv, call: &ToolCall, args: &Args, terminal: &dyn ToolTerminal) -> ToolResult {
        ToolNext { rest: &self.layers, terminal }.run(env, call, args).await
    }

    pub async fn after_agent(&self, env: &RunEnv, state: &mut ThreadState) -> Result<(), LoopError> {
        for layer in self.layers.iter().rev() {
            layer.after_agent(env, state).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str);
    impl Middleware for Named {
        fn name(&self) -> &'static str {
            self.0
        }
    }

    fn base() -> Vec<Arc<dyn Middleware>> {
        vec![Arc::new(Named("Sandbox")), Arc::new(Named("Clarification")), Arc::new(Named("Title"))]
    }

    fn extra(name: &'static str, after: Option<&'static str>, before: Option<&'static str>) -> Extra {
        Extra { layer: Arc::new(Named(name)), after, before }
    }

    #[test]
    fn extras_follow_their_anchors_and_clarification_stays_last() {
        let pipeline = Pipeline::build(
            base(),
            vec![extra("A", Some("Sandbox"), None), extra("B", None, None), extra("C", Some("A"), None), extra("D", None, Some("Title"))],
        )
        .unwrap_or_default();
        assert_eq!(pipeline.names(), vec!["Sandbox", "A", "C", "B", "D", "Title", "Clarification"]);
    }

    #[test]
    fn bad_anchors_are_errors() {
        let both = Pipeline::build(base(), vec![extra("A", Some("Sandbox"), Some("Title"))]);
        assert!(matches!(both, Err(PipelineError::ConflictingAnchors("A"))));
        let same = Pipeline::build(base(), vec![extra("A", Some("Sandbox"), None), extra("B", None, Some("Sandbox"))]);
        assert!(matches!(same, Err(PipelineError::SameAnchor(..))));
        let cycle = Pipeline::build(base(), vec![extra("A", Some("B"), None), extra("B", Some("A"), None)]);
        assert!(matches!(cycle, Err(PipelineError::Cycle(_))));
        let missing = Pipeline::build(base(), vec![extra("A", Some("Nope"), None)]);
        assert!(matches!(missing, Err(PipelineError::MissingAnchor(_))));
    }
}
