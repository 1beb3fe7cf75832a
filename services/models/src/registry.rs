//! The configured models, ready to call: spec, provider and concurrency limit per model, looked up by name.
//! A registry is immutable; a configuration reload builds a new one and swaps it in
//! ([`crate::gateway::Gateway::replace`]), while calls already running finish on the one they started with.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::config::Resolved;
use crate::error::ModelError;
use crate::providers::{self, Provider};
use crate::spec::{ModelSpec, RetryPolicy};

/// One callable model.
#[derive(Debug)]
pub struct Model {
    pub spec: ModelSpec,
    pub provider: Arc<dyn Provider>,
    /// Present when `max_concurrency` > 0.
    pub limiter: Option<Arc<Semaphore>>,
}

/// Every configured model.
#[derive(Debug, Default)]
pub struct Registry {
    models: Vec<Arc<Model>>,
    by_name: HashMap<String, usize>,
    pub retry: RetryPolicy,
}

impl Registry {
    /// Builds the providers (HTTP clients) of a resolved configuration.
    pub fn build(resolved: Resolved) -> Result<Self, String> {
        let mut models = Vec::with_capacity(resolved.models.len());
        let mut by_name = HashMap::new();
        for spec in resolved.models {
            let provider = providers::build(&spec).map_err(|e| format!("model `{}`: {e}", spec.name))?;
            let limiter = (spec.max_concurrency > 0).then(|| Arc::new(Semaphore::new(spec.max_concurrency as usize)));
            by_name.insert(spec.name.clone(), models.len());
            for note in &spec.notes {
                tracing::info!(model = %spec.name, note = %note, "model configuration note");
            }
            models.push(Arc::new(Model { spec, provider, limiter }));
        }
        Ok(Self { models, by_name, retry: resolved.retry })
    }

    /// All models in configuration order.
    pub fn models(&self) -> &[Arc<Model>] {
        &self.models
    }

    /// The default model (the first configured one).
    pub fn default_model(&self) -> Option<&Arc<Model>> {
        self.models.first()
    }

    /// A model by name; empty = the default. NOT_FOUND lists the valid names.
    pub fn resolve(&self, name: &str) -> Result<&Arc<Model>, ModelError> {
        if name.is_empty() {
            return self.default_model().ok_or(ModelError::NoModels);
        }
        self.by_name.get(name).map(|&i| &self.models[i]).ok_or_else(|| ModelError::UnknownModel {
            name: name.to_owned(),
            known: self.models.iter().map(|m| m.spec.name.clone()).collect(),
        })
    }
}
