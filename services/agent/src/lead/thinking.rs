//! Thinking asked of a model that cannot think. DeerFlow's web UI asks for thinking on every run
//! but its "flash" mode (`thinking_enabled: true` in the run context), whatever model is picked;
//! DeerFlow then logs a warning and runs without thinking. So does the lead agent, by default
//! (`runs.lead.thinking_unsupported: ignore`): its model calls go without thinking, and the run says
//! so once — a CUSTOM event `antler.thinking_unsupported` and a WARN log line. `refuse` keeps the
//! models service's refusal: the first model call fails and the run ends ERROR `model_error`.

use antler_proto::models::ModelInfo;
use antler_proto::runs::CustomEvent;
use antler_proto::runs::run_event::Kind;
use serde::{Deserialize, Serialize};

/// The name of the event that says a run goes without the thinking it asked for.
pub const EVENT: &str = "antler.thinking_unsupported";

/// `runs.lead.thinking_unsupported`: what a run that asks for thinking on a model without it does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingUnsupported {
    /// Run without thinking, with one CUSTOM event and one WARN line saying so (DeerFlow's way).
    #[default]
    Ignore,
    /// Leave the request as it is: the model call is refused and the run ends ERROR `model_error`.
    Refuse,
}

/// The model a run asked to think but that cannot, when `policy` drops the request: None when the
/// run did not ask, the model can, `policy` is `refuse`, or the model is not known (no models
/// service, or one that did not answer: the call then reports the problem itself).
pub fn dropped(asked: bool, model: Option<&ModelInfo>, policy: ThinkingUnsupported) -> Option<String> {
    let model = model?;
    let can = model.capabilities.as_ref().is_some_and(|c| c.supports_thinking);
    (asked && !can && policy == ThinkingUnsupported::Ignore).then(|| model.name.clone())
}

/// The event of a run that goes without thinking on `model`.
pub fn event(model: &str) -> Kind {
    let data = serde_json::json!({
        "model_name": model,
        "thinking_enabled": false,
        "reason": format!("model `{model}` does not support thinking (supports_thinking is false); the run goes on without it"),
        "hint": "pick a model with supports_thinking, or set runs.lead.thinking_unsupported: refuse to fail such runs instead",
    });
    Kind::Custom(CustomEvent { name: EVENT.to_owned(), data: Some(antler_kit::json::json_to_value(&data)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_proto::models::ModelCapabilities;

    fn model(thinks: bool) -> ModelInfo {
        ModelInfo {
            name: "demo".to_owned(),
            capabilities: Some(ModelCapabilities { supports_thinking: thinks, ..ModelCapabilities::default() }),
            ..ModelInfo::default()
        }
    }

    #[test]
    fn only_a_request_the_model_cannot_honour_is_dropped_and_only_when_ignoring() {
        assert_eq!(dropped(true, Some(&model(false)), ThinkingUnsupported::Ignore), Some("demo".to_owned()));
        assert_eq!(dropped(true, Some(&model(false)), ThinkingUnsupported::Refuse), None);
        assert_eq!(dropped(true, Some(&model(true)), ThinkingUnsupported::Ignore), None);
        assert_eq!(dropped(false, Some(&model(false)), ThinkingUnsupported::Ignore), None);
        assert_eq!(dropped(true, None, ThinkingUnsupported::Ignore), None);
    }

    #[test]
    fn the_event_names_the_model() {
        let Kind::Custom(event) = event("demo") else { panic!("a custom event") };
        assert_eq!(event.name, EVENT);
        let data = event.data.as_ref().map(antler_kit::json::value_to_json).unwrap_or_default();
        assert_eq!(data["model_name"], "demo");
    }
}
