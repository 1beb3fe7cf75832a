//! Model providers: one wire protocol per file behind one trait (OpenAI Chat Completions, Anthropic
//! Messages, Gemini `streamGenerateContent`, Azure OpenAI deployments, scripted replay).
//!
//! A provider does two things: turn a validated call plus its parameters into a request body
//! ([`Provider::prepare`], where provider-specific rules such as Anthropic's thinking budget are checked
//! before anything is sent), and make one attempt with that body ([`Provider::send`]), returning the answer
//! as a stream of provider-neutral [`Event`]s. Retries, fallbacks, timeouts between events, cancellation and
//! usage accounting are the gateway's, so every provider gets them alike.

pub mod anthropic;
pub mod azure;
pub mod gemini;
pub mod http;
pub mod openai;
pub mod replay;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde_json::{Map, Value};

use crate::error::{ModelError, UpstreamError};
use crate::events::Event;
use crate::request::ChatCall;
use crate::spec::{ModelSpec, ProviderKind};

/// The events of one attempt. Dropping it aborts the upstream request.
pub type EventStream = BoxStream<'static, Result<Event, UpstreamError>>;

/// An upstream that has started answering.
pub struct Attempt {
    pub events: EventStream,
    /// The provider's request id (`x-request-id` / `request-id`), empty when none was sent.
    pub request_id: String,
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt").field("request_id", &self.request_id).finish_non_exhaustive()
    }
}

/// One wire protocol.
pub trait Provider: Send + Sync + fmt::Debug {
    /// The request body for `call`, given the call's merged parameters ([`crate::thinking::settings`]).
    /// Errors are the caller's (INVALID_ARGUMENT) and mean nothing was sent.
    fn prepare(&self, call: &ChatCall, settings: Map<String, Value>) -> Result<Value, ModelError>;

    /// Makes one attempt with the body [`prepare`](Self::prepare) made, serialised once (the tree of a
    /// body with a dozen tool schemas is five times the size of its text, and a stream keeps its body
    /// for retries while it lasts). Resolves once the upstream has accepted the request and its stream
    /// has begun, or with the failure. The first-byte timeout is applied here; the inter-chunk timeout
    /// by the caller.
    fn send(&self, body: &Bytes) -> BoxFuture<'static, Result<Attempt, UpstreamError>>;
}

/// Builds the provider of a model.
pub fn build(spec: &ModelSpec) -> Result<Arc<dyn Provider>, String> {
    Ok(match spec.kind {
        ProviderKind::OpenAi => Arc::new(openai::OpenAi::new(spec)?),
        ProviderKind::Anthropic => Arc::new(anthropic::Anthropic::new(spec)?),
        ProviderKind::Replay => Arc::new(replay::Replay::new(spec)?),
        ProviderKind::Gemini => Arc::new(gemini::Gemini::new(spec)?),
        ProviderKind::Azure => Arc::new(azure::Azure::new(spec)?),
    })
}

/// Moves `extra_body` / `model_kwargs` contents to the body's top level and every other setting to a field
/// of the same name, as LangChain does with constructor keyword arguments. Keys in `reserved` are set by
/// the provider itself and are not overwritten by parameters.
pub(crate) fn apply_settings(body: &mut Map<String, Value>, settings: Map<String, Value>, reserved: &[&str]) {
    let mut flattened = Map::new();
    for (key, value) in settings {
        match (key.as_str(), value) {
            ("extra_body" | "model_kwargs", Value::Object(inner)) => crate::thinking::deep_merge(&mut flattened, &inner),
            (_, value) => {
                flattened.insert(key, value);
            }
        }
    }
    for (key, value) in flattened {
        if reserved.contains(&key.as_str()) {
            continue;
        }
        match (body.get_mut(&key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => crate::thinking::deep_merge(existing, &incoming),
            (_, value) => {
                body.insert(key, value);
            }
        }
    }
}
