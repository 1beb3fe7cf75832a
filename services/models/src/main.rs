//! `antler-models`: serves the models service alone (for a multi-process or Kubernetes install).

antler_kit::service_main!(
    "antler-models",
    "model service (config-driven streaming chat against OpenAI-compatible, Anthropic and replay providers)",
    antler_models::SERVICE
);
