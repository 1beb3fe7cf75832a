//! Azure OpenAI: the Chat Completions of one deployment,
//! `POST https://{resource}.openai.azure.com/openai/deployments/{deployment}/chat/completions?api-version=…`,
//! with the resource key in `api-key` (or a Microsoft Entra ID token as `Authorization: Bearer`).
//!
//! The body and the stream are OpenAI's, so both are the OpenAI provider's; what differs is handled
//! here:
//! * The deployment, not the body's `model`, picks the model; the URL carries the `api-version`
//!   (Azure's v1 API, `…/openai/v1`, takes none).
//! * From api-version 2024-09-01 (and on the v1 API) the output limit is `max_completion_tokens`, which
//!   reasoning deployments require, as on OpenAI itself.
//! * The first event carries only `prompt_filter_results`, with `choices: []` and an empty `model`;
//!   chunks carry `content_filter_results`. An empty `model` is not the model's name, so it is skipped
//!   and the first real one is reported.
//! * A filtered answer ends with finish reason `content_filter`; a filtered prompt is HTTP 400 with code
//!   `content_filter`. Throttling is 429 with `retry-after` / `retry-after-ms`.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName};
use serde_json::{Map, Value};

use super::http::{Http, SseEvent, SseParser};
use super::openai::{self, OpenAi};
use super::{Attempt, Provider};
use crate::error::{ModelError, UpstreamError};
use crate::events::Event;
use crate::request::ChatCall;
use crate::spec::ModelSpec;

/// An Azure OpenAI deployment.
#[derive(Debug)]
pub struct Azure {
    /// Builds the body: Azure's is OpenAI's.
    body: OpenAi,
    http: Arc<Http>,
    max_completion_tokens: bool,
}

/// The chat completions URL of a deployment root (`…/openai/deployments/{deployment}` or `…/openai/v1`).
pub fn chat_url(base_url: &str, api_version: &str) -> String {
    let url = format!("{base_url}/chat/completions");
    if api_version.is_empty() { url } else { format!("{url}?api-version={api_version}") }
}

/// True when `api_version` takes `max_completion_tokens` (2024-09-01 and later, previews included, and
/// the v1 API, whose versions are words).
pub fn takes_max_completion_tokens(base_url: &str, api_version: &str) -> bool {
    base_url.ends_with("/openai/v1") || !api_version.starts_with("20") || api_version.get(..10).is_some_and(|date| date >= "2024-09-01")
}

impl Azure {
    pub fn new(spec: &ModelSpec) -> Result<Self, String> {
        let mut headers = HeaderMap::new();
        if let Some(key) = spec.api_key.value() {
            if spec.bearer_token {
                headers.insert(AUTHORIZATION, Http::secret(&format!("Bearer {key}"))?);
            } else {
                headers.insert(HeaderName::from_static("api-key"), Http::secret(key)?);
            }
        }
        let http = Http::new(spec, chat_url(&spec.base_url, &spec.api_version), headers)?;
        Ok(Self {
            body: OpenAi::new(spec)?,
            http: Arc::new(http),
            max_completion_tokens: takes_max_completion_tokens(&spec.base_url, &spec.api_version),
        })
    }
}

impl Provider for Azure {
    fn prepare(&self, call: &ChatCall, settings: Map<String, Value>) -> Result<Value, ModelError> {
        let mut body = self.body.prepare(call, settings)?;
        if self.max_completion_tokens
            && let Some(obj) = body.as_object_mut()
            && let Some(max) = obj.remove("max_tokens")
        {
            obj.entry("max_completion_tokens").or_insert(max);
        }
        Ok(body)
    }

    fn send(&self, body: &Bytes) -> BoxFuture<'static, Result<Attempt, UpstreamError>> {
        let http = self.http.clone();
        let bytes = body.clone();
        Box::pin(async move {
            let (request_id, sse) = http.open(bytes).await?;
            Ok(Attempt { events: super::http::parse(sse, Parser::default()), request_id })
        })
    }
}

/// OpenAI's stream reader, minus Azure's empty `model` fields.
#[derive(Debug, Default)]
pub struct Parser {
    inner: openai::Parser,
}

impl SseParser for Parser {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<Event>, UpstreamError> {
        // Only Azure's filter-result events have an empty model; the rest pass untouched.
        if event.data.contains("\"model\":\"\"")
            && let Ok(Value::Object(mut chunk)) = serde_json::from_str::<Value>(&event.data)
        {
            chunk.remove("model");
            let data = Value::Object(chunk).to_string();
            return self.inner.on_event(&SseEvent { event: event.event.clone(), data });
        }
        self.inner.on_event(event)
    }

    fn on_eof(&mut self) -> Result<Vec<Event>, UpstreamError> {
        self.inner.on_eof()
    }
}

#[cfg(test)]
mod tests;
