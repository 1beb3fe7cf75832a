//! The parameters of one call: the model's configured parameters, then its thinking blocks, then the
//! request's own values — DeerFlow's `create_chat_model` rules (reference §3.2 steps 5–8), applied per call.
//!
//! The result is a map of LangChain-style keyword arguments. Providers turn it into a request body: every
//! key becomes a body field, except `extra_body` and `model_kwargs`, whose contents are merged into the body's
//! top level.

use serde_json::{Map, Value};

use crate::error::ModelError;
use crate::request::ChatCall;
use crate::spec::{ModelSpec, ProviderKind};

/// Recursively merges `overlay` into `base`: objects merge key by key, anything else replaces.
pub fn deep_merge(base: &mut Map<String, Value>, overlay: &Map<String, Value>) {
    for (key, value) in overlay {
        match (base.get_mut(key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => deep_merge(existing, incoming),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

fn object_at<'a>(map: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Map<String, Value>> {
    let mut current = map;
    for key in path {
        current = current.get(*key)?.as_object()?;
    }
    Some(current)
}

/// The keyword arguments for `call` on `model`, or INVALID_ARGUMENT when the model cannot honour it.
pub fn settings(model: &ModelSpec, call: &ChatCall) -> Result<Map<String, Value>, ModelError> {
    let mut settings = model.params.clone();
    if let Some(max) = model.max_tokens {
        settings.insert("max_tokens".to_owned(), Value::from(max));
    }

    let wte = model.when_thinking_enabled.as_ref();
    if call.thinking_enabled {
        if !model.capabilities.thinking {
            return Err(ModelError::invalid(
                "thinking_enabled",
                format!(
                    "model `{}` does not support thinking\nhint: send thinking_enabled=false, or pick a model with supports_thinking",
                    model.name
                ),
            ));
        }
        if let Some(wte) = wte {
            deep_merge(&mut settings, wte);
        } else if model.kind == ProviderKind::Anthropic {
            // Anthropic thinks only when asked; without a configured block, ask with the request's budget
            // (checked against the budget rules by the provider).
            let mut thinking = Map::new();
            thinking.insert("type".to_owned(), Value::from("enabled"));
            settings.insert("thinking".to_owned(), Value::Object(thinking));
        }
        if call.thinking_budget_tokens > 0
            && model.kind == ProviderKind::Anthropic
            && let Some(Value::Object(thinking)) = settings.get_mut("thinking")
        {
            thinking.insert("budget_tokens".to_owned(), Value::from(call.thinking_budget_tokens));
        }
    } else {
        apply_thinking_off(model, &mut settings);
    }

    // The caller's explicit values come last: they are what this call asked for.
    if call.max_tokens > 0 {
        settings.insert("max_tokens".to_owned(), Value::from(call.max_tokens));
    }
    if let Some(temperature) = call.temperature {
        settings.insert("temperature".to_owned(), Value::from(temperature));
    }
    if let Some(effort) = call.reasoning_effort {
        settings.insert("reasoning_effort".to_owned(), Value::from(effort));
    }
    // DeerFlow step 8: reasoning_effort only reaches providers that understand it.
    if !model.capabilities.reasoning_effort {
        settings.remove("reasoning_effort");
        if let Some(Value::Object(extra)) = settings.get_mut("extra_body") {
            extra.remove("reasoning_effort");
        }
    }
    Ok(settings)
}

/// DeerFlow step 7: the first matching rule switches thinking off.
fn apply_thinking_off(model: &ModelSpec, settings: &mut Map<String, Value>) {
    if let Some(wtd) = &model.when_thinking_disabled {
        deep_merge(settings, wtd);
        return;
    }
    let empty = Map::new();
    let wte = model.when_thinking_enabled.as_ref().unwrap_or(&empty);
    if object_at(wte, &["extra_body", "thinking"]).is_some_and(|t| t.contains_key("type")) {
        // OpenAI-compatible gateways (Doubao, DeepSeek, Kimi, MiMo): extra_body.thinking.type = disabled.
        let overlay = serde_json::json!({ "extra_body": { "thinking": { "type": "disabled" } }, "reasoning_effort": "minimal" });
        if let Value::Object(overlay) = overlay {
            deep_merge(settings, &overlay);
        }
        return;
    }
    if let Some(kwargs) = object_at(wte, &["extra_body", "chat_template_kwargs"]) {
        // vLLM / Qwen: the chat template's thinking switches, whichever of them the model uses.
        let mut off = Map::new();
        for key in ["thinking", "enable_thinking"] {
            if kwargs.contains_key(key) {
                off.insert(key.to_owned(), Value::Bool(false));
            }
        }
        if !off.is_empty() {
            let overlay = serde_json::json!({ "extra_body": { "chat_template_kwargs": off } });
            if let Value::Object(overlay) = overlay {
                deep_merge(settings, &overlay);
            }
            return;
        }
    }
    let native_anthropic = object_at(wte, &["thinking"]).is_some_and(|t| t.contains_key("type"));
    if native_anthropic || (model.kind == ProviderKind::Anthropic && model.capabilities.thinking) {
        settings.insert("thinking".to_owned(), serde_json::json!({ "type": "disabled" }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::tests::call;
    use crate::spec::tests::spec;
    use serde_json::json;

    fn obj(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn thinking_on_merges_when_thinking_enabled_and_the_shortcut() -> Result<(), ModelError> {
        let mut model = spec("doubao", ProviderKind::OpenAi);
        model.capabilities.thinking = true;
        model.when_thinking_enabled = Some(obj(json!({ "extra_body": { "thinking": { "type": "enabled" } } })));
        let mut c = call();
        c.thinking_enabled = true;
        let s = settings(&model, &c)?;
        assert_eq!(s["extra_body"]["thinking"]["type"], "enabled");
        Ok(())
    }

    #[test]
    fn thinking_on_without_support_is_invalid_argument() {
        let model = spec("gpt", ProviderKind::OpenAi);
        let mut c = call();
        c.thinking_enabled = true;
        let err = settings(&model, &c).err();
        assert!(matches!(err, Some(ModelError::InvalidArgument { ref field, .. }) if field == "thinking_enabled"), "{err:?}");
    }

    #[test]
    fn thinking_off_prefers_when_thinking_disabled() -> Result<(), ModelError> {
        let mut model = spec("m", ProviderKind::OpenAi);
        model.when_thinking_enabled = Some(obj(json!({ "extra_body": { "thinking": { "type": "enabled" } } })));
        model.when_thinking_disabled = Some(obj(json!({ "extra_body": { "thinking": { "type": "off-by-config" } } })));
        let s = settings(&model, &call())?;
        assert_eq!(s["extra_body"]["thinking"]["type"], "off-by-config");
        Ok(())
    }

    #[test]
    fn thinking_off_derives_the_gateway_switch_and_drops_effort_when_unsupported() -> Result<(), ModelError> {
        let mut model = spec("m", ProviderKind::OpenAi);
        model.when_thinking_enabled = Some(obj(json!({ "extra_body": { "thinking": { "type": "enabled" } } })));
        let s = settings(&model, &call())?;
        assert_eq!(s["extra_body"]["thinking"]["type"], "disabled");
        assert!(!s.contains_key("reasoning_effort"), "{s:?}");
        model.capabilities.reasoning_effort = true;
        let s = settings(&model, &call())?;
        assert_eq!(s["reasoning_effort"], "minimal");
        Ok(())
    }

    #[test]
    fn thinking_off_for_vllm_sets_the_template_flags_false() -> Result<(), ModelError> {
        let mut model = spec("qwen", ProviderKind::OpenAi);
        model.when_thinking_enabled = Some(obj(json!({ "extra_body": { "chat_template_kwargs": { "enable_thinking": true } } })));
        let s = settings(&model, &call())?;
        assert_eq!(s["extra_body"]["chat_template_kwargs"], json!({ "enable_thinking": false }));
        Ok(())
    }

    #[test]
    fn thinking_off_for_anthropic_disables_it_natively() -> Result<(), ModelError> {
        let mut model = spec("claude", ProviderKind::Anthropic);
        model.when_thinking_enabled = Some(obj(json!({ "thinking": { "type": "enabled", "budget_tokens": 2048 } })));
        let s = settings(&model, &call())?;
        assert_eq!(s["thinking"], json!({ "type": "disabled" }));
        Ok(())
    }

    #[test]
    fn request_values_win_over_configured_ones() -> Result<(), ModelError> {
        let mut model = spec("m", ProviderKind::OpenAi);
        model.params.insert("temperature".into(), json!(0.7));
        model.max_tokens = Some(4096);
        let mut c = call();
        c.temperature = Some(0.1);
        c.max_tokens = 100;
        let s = settings(&model, &c)?;
        assert_eq!(s["temperature"], json!(0.1));
        assert_eq!(s["max_tokens"], json!(100));
        Ok(())
    }

    #[test]
    fn the_request_budget_replaces_the_configured_one_for_anthropic() -> Result<(), ModelError> {
        let mut model = spec("claude", ProviderKind::Anthropic);
        model.capabilities.thinking = true;
        model.when_thinking_enabled = Some(obj(json!({ "thinking": { "type": "enabled", "budget_tokens": 4096 } })));
        let mut c = call();
        c.thinking_enabled = true;
        c.thinking_budget_tokens = 2000;
        let s = settings(&model, &c)?;
        assert_eq!(s["thinking"]["budget_tokens"], json!(2000));
        Ok(())
    }
}
