//! DeerFlow `config.yaml` compatibility: which provider a `use:` class path stands for.
//!
//! DeerFlow instantiates a LangChain class named by `use: "module:Class"`. Antler has no classes, only wire
//! protocols, so each known class maps to a provider kind plus the few defaults the class carries (its
//! endpoint, whether it replays `reasoning_content`, its retry count). Matching is on the class name alone,
//! because DeerFlow has moved its modules between releases while keeping the class names.

use crate::spec::ProviderKind;

/// What a DeerFlow class means for Antler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flavor {
    pub kind: ProviderKind,
    /// The class's built-in endpoint, used when the entry has no `base_url` / `api_base`.
    pub default_base_url: Option<&'static str>,
    /// The class sends earlier turns' reasoning back as `reasoning_content`.
    pub send_reasoning_content: bool,
    /// The class's own `max_retries` default (DeerFlow gives MindIE 1).
    pub default_max_retries: Option<u32>,
    /// Ollama's native API root; the OpenAI-compatible endpoint lives under `/v1`.
    pub ollama: bool,
    /// Said in the log when the model loads: a behaviour of the class Antler does not reproduce.
    pub note: Option<&'static str>,
}

impl Flavor {
    fn openai() -> Self {
        Self {
            kind: ProviderKind::OpenAi,
            default_base_url: None,
            send_reasoning_content: false,
            default_max_retries: None,
            ollama: false,
            note: None,
        }
    }

    fn reasoning_replay(mut self) -> Self {
        self.send_reasoning_content = true;
        self
    }
}

/// Classes that are mapped, for the hint of an unknown one.
pub const KNOWN_CLASSES: &[&str] = &[
    "ChatOpenAI",
    "ChatDeepSeek",
    "PatchedChatOpenAI",
    "PatchedChatDeepSeek",
    "PatchedChatMiMo",
    "PatchedChatStepFun",
    "PatchedChatMiniMax",
    "PatchedChatKimi",
    "PatchedChatSiliconFlow",
    "PatchedChat360",
    "PatchedChatGemini",
    "VllmChatModel",
    "MindIEChatModel",
    "ChatOllama",
    "ChatAnthropic",
    "ClaudeChatModel",
    "ChatGoogleGenerativeAI",
];

/// Maps `use:` to a flavor, or explains why the class cannot be served.
pub fn map_class(use_path: &str) -> Result<Flavor, String> {
    let class = use_path.rsplit(':').next().unwrap_or(use_path).rsplit('.').next().unwrap_or(use_path).trim();
    let flavor = match class {
        "ChatOpenAI" => Flavor::openai(),
        "ChatDeepSeek" | "PatchedChatDeepSeek" => {
            Flavor { default_base_url: Some("https://api.deepseek.com/v1"), ..Flavor::openai() }.reasoning_replay()
        }
        "PatchedChatOpenAI" => Flavor {
            note: Some("Gemini tool-call thought signatures (extra_content) are not replayed; reasoning_content is"),
            ..Flavor::openai()
        }
        .reasoning_replay(),
        "PatchedChatMiMo"
        | "PatchedChatStepFun"
        | "PatchedChatKimi"
        | "PatchedChatSiliconFlow"
        | "PatchedChat360"
        | "PatchedChatGemini" => Flavor::openai().reasoning_replay(),
        "PatchedChatMiniMax" => Flavor {
            // The class strips per-message `name` fields; Antler never sends them, so nothing to do.
            note: Some("MiniMax structured reasoning is read from reasoning_content / reasoning deltas only"),
            ..Flavor::openai()
        }
        .reasoning_replay(),
        "VllmChatModel" | "RvllmChatModel" => Flavor::openai().reasoning_replay(),
        "MindIEChatModel" => Flavor {
            default_max_retries: Some(1),
            note: Some("MindIE mock-streaming is not needed: the response is read as a normal stream"),
            ..Flavor::openai()
        },
        "SambaNovaChatModel" | "ChatSambaNova" => Flavor::openai(),
        "ChatOllama" => Flavor {
            default_base_url: Some("http://localhost:11434"),
            ollama: true,
            note: Some("served through Ollama's OpenAI-compatible /v1 endpoint; thinking arrives as `reasoning` deltas"),
            ..Flavor::openai()
        },
        "ChatGoogleGenerativeAI" => Flavor {
            default_base_url: Some("https://generativelanguage.googleapis.com/v1beta/openai"),
            note: Some("served through Gemini's OpenAI-compatible endpoint"),
            ..Flavor::openai()
        },
        "ChatAnthropic" | "ClaudeChatModel" | "PatchedChatAnthropic" => Flavor {
            kind: ProviderKind::Anthropic,
            default_base_url: None,
            send_reasoning_content: false,
            default_max_retries: None,
            ollama: false,
            note: None,
        },
        "CodexChatModel" => {
            return Err("CodexChatModel signs in with a ChatGPT account (OAuth) and speaks the Responses API; Antler supports \
                 neither\nhint: use `langchain_openai:ChatOpenAI` (or `provider: openai`) with an OpenAI API key"
                .to_owned());
        }
        "ClaudeCliChatModel" | "ClaudeCodeChatModel" => {
            return Err(format!(
                "{class} drives the local `claude` command-line program, which a gateway cannot do\nhint: use \
                 `langchain_anthropic:ChatAnthropic` (or `provider: anthropic`) with an API key"
            ));
        }
        "AzureChatOpenAI" => {
            return Err("AzureChatOpenAI addresses Azure deployments with an api-version query, which Antler does not \
                 build\nhint: set `provider: openai` and `base_url` to the deployment's OpenAI-compatible /openai/v1 \
                 endpoint"
                .to_owned());
        }
        _ => {
            return Err(format!(
                "class `{class}` is not known to Antler\nhint: known classes are {}; or add `provider: openai` (any \
                 OpenAI-compatible endpoint) or `provider: anthropic` to the entry",
                KNOWN_CLASSES.join(", ")
            ));
        }
    };
    Ok(flavor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_by_name_whatever_the_module() {
        for path in ["deerflow.models.patched_deepseek:PatchedChatDeepSeek", "src.models.patched_deepseek:PatchedChatDeepSeek"] {
            let flavor = map_class(path);
            assert!(matches!(flavor, Ok(Flavor { kind: ProviderKind::OpenAi, send_reasoning_content: true, .. })), "{path}: {flavor:?}");
        }
        assert!(matches!(map_class("langchain_anthropic:ChatAnthropic"), Ok(Flavor { kind: ProviderKind::Anthropic, .. })));
        assert!(matches!(map_class("langchain_ollama:ChatOllama"), Ok(Flavor { ollama: true, .. })));
        assert_eq!(map_class("deerflow.models.mindie_provider:MindIEChatModel").ok().and_then(|f| f.default_max_retries), Some(1));
    }

    #[test]
    fn unmappable_classes_are_explained() {
        let codex = map_class("deerflow.models.openai_codex_provider:CodexChatModel").err().unwrap_or_default();
        assert!(codex.contains("Responses API") && codex.contains("hint:"), "{codex}");
        let unknown = map_class("langchain_aws:ChatBedrock").err().unwrap_or_default();
        assert!(unknown.contains("ChatBedrock") && unknown.contains("provider: openai"), "{unknown}");
    }
}
