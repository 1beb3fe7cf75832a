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
    "AzureChatOpenAI",
];

/// LangChain classes of providers with an OpenAI-compatible endpoint: not DeerFlow's, so refused, with
/// the entry that calls the same provider (`use: langchain_openai:ChatOpenAI` and this `base_url`).
const COMPATIBLE_VENDORS: &[(&str, &str)] = &[
    ("ChatGroq", "https://api.groq.com/openai/v1"),
    ("ChatMistralAI", "https://api.mistral.ai/v1"),
    ("ChatXAI", "https://api.x.ai/v1"),
    ("ChatFireworks", "https://api.fireworks.ai/inference/v1"),
    ("ChatTogether", "https://api.together.xyz/v1"),
    ("ChatOpenRouter", "https://openrouter.ai/api/v1"),
    ("ChatDeepInfra", "https://api.deepinfra.com/v1/openai"),
    ("ChatPerplexity", "https://api.perplexity.ai"),
    ("MoonshotChat", "https://api.moonshot.cn/v1"),
    ("ChatMoonshot", "https://api.moonshot.cn/v1"),
    ("ChatTongyi", "https://dashscope.aliyuncs.com/compatible-mode/v1"),
    ("ChatQwen", "https://dashscope.aliyuncs.com/compatible-mode/v1"),
    ("ChatZhipuAI", "https://open.bigmodel.cn/api/paas/v4"),
    ("ChatNVIDIA", "https://integrate.api.nvidia.com/v1"),
    ("ChatCerebras", "https://api.cerebras.ai/v1"),
    ("ChatCohere", "https://api.cohere.ai/compatibility/v1"),
];

/// The closest supported alternative to an unknown class: the entry for a known OpenAI-compatible
/// vendor, the native provider of a cloud's other API, or the known class it most resembles.
fn alternative(class: &str) -> String {
    if let Some((_, base)) = COMPATIBLE_VENDORS.iter().find(|(name, _)| *name == class) {
        return format!("the provider has an OpenAI-compatible endpoint: use `langchain_openai:ChatOpenAI` with `base_url: {base}`");
    }
    match class {
        "ChatVertexAI" | "ChatAnthropicVertex" | "VertexAI" => {
            return "Vertex AI's endpoints and Google Cloud credentials are not supported: use                     `langchain_google_genai:ChatGoogleGenerativeAI` (Gemini API key), or `langchain_anthropic:ChatAnthropic`                     for Claude"
                .to_owned();
        }
        "ChatBedrock" | "ChatBedrockConverse" | "BedrockChat" => {
            return "Bedrock's signed (SigV4) API is not supported: use `langchain_anthropic:ChatAnthropic` with an Anthropic                     key, or `langchain_openai:ChatOpenAI` with the base_url of an OpenAI-compatible Bedrock gateway"
                .to_owned();
        }
        "AzureAIChatCompletionsModel" | "AzureMLChatOnlineEndpoint" => {
            return "use `langchain_openai:AzureChatOpenAI` for an Azure OpenAI deployment, or `langchain_openai:ChatOpenAI`                     with the endpoint's OpenAI-compatible base_url"
                .to_owned();
        }
        "ChatHuggingFace" | "HuggingFaceEndpoint" => {
            return "use `langchain_openai:ChatOpenAI` with the base_url of the server's OpenAI-compatible /v1 endpoint (TGI, vLLM)"
                .to_owned();
        }
        _ => {}
    }
    let nearest = KNOWN_CLASSES.iter().map(|known| (distance(&class.to_ascii_lowercase(), &known.to_ascii_lowercase()), known)).min();
    match nearest {
        Some((d, known)) if d <= 3 => format!("did you mean `{known}`?"),
        _ => format!(
            "known classes are {}; or add `provider: openai` (any OpenAI-compatible endpoint), `anthropic`, `gemini` or `azure`              to the entry",
            KNOWN_CLASSES.join(", ")
        ),
    }
}

/// Levenshtein distance, for "did you mean" (class names are short).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = (previous + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            previous = current;
        }
    }
    row[b.len()]
}

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
        "ChatGoogleGenerativeAI" => Flavor { kind: ProviderKind::Gemini, ..Flavor::openai() },
        "AzureChatOpenAI" => Flavor { kind: ProviderKind::Azure, ..Flavor::openai() },
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
        _ => {
            return Err(format!("class `{class}` is not one Antler serves\nhint: {}", alternative(class)));
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
        assert!(matches!(map_class("langchain_google_genai:ChatGoogleGenerativeAI"), Ok(Flavor { kind: ProviderKind::Gemini, .. })));
        assert!(matches!(map_class("langchain_openai:AzureChatOpenAI"), Ok(Flavor { kind: ProviderKind::Azure, .. })));
        assert_eq!(map_class("deerflow.models.mindie_provider:MindIEChatModel").ok().and_then(|f| f.default_max_retries), Some(1));
    }

    #[test]
    fn unmappable_classes_are_explained() {
        let codex = map_class("deerflow.models.openai_codex_provider:CodexChatModel").err().unwrap_or_default();
        assert!(codex.contains("Responses API") && codex.contains("hint:"), "{codex}");
        let bedrock = map_class("langchain_aws:ChatBedrock").err().unwrap_or_default();
        assert!(bedrock.contains("ChatBedrock") && bedrock.contains("ChatAnthropic"), "{bedrock}");
        let groq = map_class("langchain_groq:ChatGroq").err().unwrap_or_default();
        assert!(groq.contains("`ChatGroq`") && groq.contains("base_url: https://api.groq.com/openai/v1"), "{groq}");
        let typo = map_class("langchain_openai:ChatOpenAl").err().unwrap_or_default();
        assert!(typo.contains("did you mean `ChatOpenAI`?"), "{typo}");
        let unknown = map_class("my_pkg:SomethingElse").err().unwrap_or_default();
        assert!(unknown.contains("SomethingElse") && unknown.contains("provider: openai"), "{unknown}");
    }
}
