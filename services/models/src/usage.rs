//! Token usage: the provider's report normalised, or an estimate when the provider never sent one (a
//! stream that broke before its usage chunk, a server that ignores `include_usage`).
//!
//! Estimates use the `cl100k_base` BPE from `tiktoken-rs`, whose vocabulary is compiled into the binary
//! (nothing is downloaded). It is exact for GPT-4-class models and within a few percent for most others —
//! good enough for budgets and attribution, and flagged `usage_estimated` so nobody bills from it. The
//! tokenizer is built on first use (a few hundred milliseconds), on a blocking thread.

use antler_proto::common::{Message, Usage, content_part};

use crate::convert::arguments_text;
use crate::events::UsageReport;
use crate::request::ChatCall;

/// Tokens a chat format adds per message (role markers), per OpenAI's published counting recipe.
const PER_MESSAGE: u64 = 4;
/// Tokens that prime the reply.
const REPLY_PRIMING: u64 = 3;

fn tokens(text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    tiktoken_rs::cl100k_base_singleton().encode_ordinary(text).len() as u64
}

fn message_text(message: &Message) -> String {
    let mut text = String::new();
    for part in &message.content {
        match &part.part {
            Some(content_part::Part::Text(t)) => text.push_str(&t.text),
            Some(content_part::Part::Thinking(t)) => text.push_str(&t.text),
            Some(content_part::Part::File(f)) => text.push_str(&f.path),
            _ => {}
        }
        text.push('\n');
    }
    for call in &message.tool_calls {
        text.push_str(&call.name);
        text.push_str(&arguments_text(call));
        text.push('\n');
    }
    text
}

/// Estimated prompt tokens of `call`.
pub fn estimate_input(call: &ChatCall) -> u64 {
    let mut total = REPLY_PRIMING;
    for message in &call.messages {
        total += PER_MESSAGE + tokens(&message_text(message));
    }
    for tool in &call.tools {
        total += tokens(&tool.name) + tokens(&tool.description) + tokens(tool.parameters.as_deref().unwrap_or_default());
    }
    total
}

/// Estimated completion tokens of `message`.
pub fn estimate_output(message: &Message) -> u64 {
    tokens(&message_text(message))
}

/// The usage to report and whether any of it was estimated. `estimate` is only called when the provider
/// left a count out.
pub fn finalize(report: UsageReport, estimate: impl FnOnce() -> (u64, u64)) -> (Usage, bool) {
    let (input, output, estimated) = match (report.input, report.output) {
        (Some(input), Some(output)) => (input, output, false),
        (input, output) => {
            let (guess_in, guess_out) = estimate();
            (input.unwrap_or(guess_in), output.unwrap_or(guess_out), true)
        }
    };
    let total = if estimated { input + output } else { report.total.unwrap_or(input + output) };
    let usage = Usage {
        input_tokens: input,
        output_tokens: output,
        total_tokens: total,
        cache_read_tokens: report.cache_read.unwrap_or(0),
        cache_creation_tokens: report.cache_creation.unwrap_or(0),
        reasoning_tokens: report.reasoning.unwrap_or(0),
    };
    (usage, estimated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_usage_is_kept_and_total_computed_when_missing() {
        let report = UsageReport { input: Some(10), output: Some(5), cache_read: Some(4), ..UsageReport::default() };
        let (usage, estimated) = finalize(report, || (0, 0));
        assert!(!estimated);
        assert_eq!((usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.cache_read_tokens), (10, 5, 15, 4));
    }

    #[test]
    fn missing_usage_is_estimated_with_the_real_tokenizer() {
        // "hello world" is two tokens in cl100k_base.
        assert_eq!(tokens("hello world"), 2);
        let (usage, estimated) = finalize(UsageReport::default(), || (7, tokens("hello world")));
        assert!(estimated);
        assert_eq!((usage.input_tokens, usage.output_tokens, usage.total_tokens), (7, 2, 9));
    }
}
