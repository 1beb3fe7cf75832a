//! The provider-neutral events every provider turns its wire format into. The assembler
//! ([`crate::assemble`]) builds the caller's deltas and the final message from these alone.

/// Why generation stopped, normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Stop,
    ToolCalls,
    Length,
    ContentFilter,
    Paused,
}

/// Token counts as far as the provider reported them; `None` = not reported (yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageReport {
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub total: Option<u64>,
    pub cache_read: Option<u64>,
    pub cache_creation: Option<u64>,
    pub reasoning: Option<u64>,
}

impl UsageReport {
    /// Later reports win field by field: providers repeat or complete counts (Anthropic sends input tokens
    /// at the start and output tokens at the end; vLLM sends cumulative counts on every chunk).
    pub fn merge(&mut self, later: UsageReport) {
        let pick = |old: &mut Option<u64>, new: Option<u64>| {
            if new.is_some() {
                *old = new;
            }
        };
        pick(&mut self.input, later.input);
        pick(&mut self.output, later.output);
        pick(&mut self.total, later.total);
        pick(&mut self.cache_read, later.cache_read);
        pick(&mut self.cache_creation, later.cache_creation);
        pick(&mut self.reasoning, later.reasoning);
    }

    /// True when the provider reported at least the input or output count.
    pub fn is_reported(&self) -> bool {
        self.input.is_some() || self.output.is_some()
    }
}

/// One thing a provider stream said.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Answer text.
    Text(String),
    /// Thinking text (Anthropic `thinking`, DeepSeek/vLLM `reasoning_content`, Ollama `reasoning`).
    Thinking(String),
    /// A piece of the current thinking block's signature.
    Signature(String),
    /// The current thinking block is complete.
    ThinkingStop,
    /// A whole redacted thinking block.
    Redacted(String),
    /// A tool call begins. `key` is the provider's handle for it (OpenAI `index`, Anthropic block index).
    ToolStart { key: u32, id: String, name: String },
    /// More argument JSON for the tool call `key`.
    ToolArgs { key: u32, delta: String },
    /// The tool call `key` is complete.
    ToolStop { key: u32 },
    /// Token counts (merged with earlier reports).
    Usage(UsageReport),
    /// Why generation stopped; `raw` is the provider's own word for it.
    Finish { stop: Stop, raw: String, stop_sequence: String },
    /// The upstream model id the provider reported.
    Model(String),
    /// The provider says the response is complete (OpenAI `[DONE]`, Anthropic `message_stop`). Anything after
    /// it is ignored; a stream that ends without it was cut.
    Done,
}
