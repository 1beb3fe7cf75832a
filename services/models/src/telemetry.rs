//! The service's metrics, through the `metrics` facade (whatever recorder the process installs exports
//! them). Labels are bounded: `model` is a configured model name, `caller` one of three buckets, `outcome`
//! and `reason` fixed words. Run ids and user ids never become labels.

use std::time::Duration;

use antler_proto::common::Usage;

/// Completed calls by model, caller bucket and outcome (`ok`, `error`, `stream_error`, `cancelled`).
pub const REQUESTS: &str = "antler_model_requests_total";
/// RPC latency in seconds (receipt to last byte), by model and caller bucket.
pub const LATENCY: &str = "antler_model_request_duration_seconds";
/// Time to first content delta in seconds, by model and caller bucket.
pub const TTFT: &str = "antler_model_time_to_first_token_seconds";
/// Gaps between upstream stream events in seconds, by model.
pub const CHUNK_GAP: &str = "antler_model_inter_chunk_seconds";
/// Tokens by model, caller bucket and kind (`input`, `output`, `cache_read`, `reasoning`).
pub const TOKENS: &str = "antler_model_tokens_total";
/// Calls whose usage had to be estimated, by model.
pub const ESTIMATED: &str = "antler_model_usage_estimated_total";
/// Retries by model and reason.
pub const RETRIES: &str = "antler_model_retries_total";
/// Fallbacks taken, by the model given up on and the next one tried.
pub const FALLBACKS: &str = "antler_model_fallbacks_total";
/// Gateway time not spent waiting on an upstream, a backoff or the client, in seconds, by model.
pub const OVERHEAD: &str = "antler_model_gateway_overhead_seconds";
/// Registry (re)loads by outcome.
pub const RELOADS: &str = "antler_model_registry_reloads_total";

pub fn request(model: &str, caller: &'static str, outcome: &'static str, latency: Duration) {
    metrics::counter!(REQUESTS, "model" => model.to_owned(), "caller" => caller, "outcome" => outcome).increment(1);
    metrics::histogram!(LATENCY, "model" => model.to_owned(), "caller" => caller).record(latency.as_secs_f64());
}

pub fn first_token(model: &str, caller: &'static str, ttft: Duration) {
    metrics::histogram!(TTFT, "model" => model.to_owned(), "caller" => caller).record(ttft.as_secs_f64());
}

/// The inter-chunk histogram of `model`, taken once per attempt rather than per event: building the labelled
/// key allocates, and a stream has dozens to thousands of events.
pub fn chunk_gaps(model: &str) -> metrics::Histogram {
    metrics::histogram!(CHUNK_GAP, "model" => model.to_owned())
}

pub fn tokens(model: &str, caller: &'static str, usage: &Usage, estimated: bool) {
    for (kind, count) in [
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_tokens),
        ("reasoning", usage.reasoning_tokens),
    ] {
        if count > 0 {
            metrics::counter!(TOKENS, "model" => model.to_owned(), "caller" => caller, "kind" => kind).increment(count);
        }
    }
    if estimated {
        metrics::counter!(ESTIMATED, "model" => model.to_owned()).increment(1);
    }
}

pub fn retry(model: &str, reason: &'static str) {
    metrics::counter!(RETRIES, "model" => model.to_owned(), "reason" => reason).increment(1);
}

pub fn fallback(from: &str, to: &str) {
    metrics::counter!(FALLBACKS, "from" => from.to_owned(), "to" => to.to_owned()).increment(1);
}

pub fn overhead(model: &str, overhead: Duration) {
    metrics::histogram!(OVERHEAD, "model" => model.to_owned()).record(overhead.as_secs_f64());
}

pub fn reload(outcome: &'static str) {
    metrics::counter!(RELOADS, "outcome" => outcome).increment(1);
}
