//! Every metric family this crate records (see [`antler_kit::metrics_catalog`]; the names are
//! [`crate::telemetry`]'s): described at start-up when a binary serving the models service installs its
//! Prometheus recorder. Most carry the `model` label, a configured model name: those series appear when
//! a model is first called (zero-valued series for every configured model would have to follow each
//! registry reload). The README's Metrics table documents them.

use antler_kit::metrics_catalog::{Catalogue, Family, Label};

use crate::telemetry::{CHUNK_GAP, ESTIMATED, FALLBACKS, LATENCY, OVERHEAD, RELOADS, REQUESTS, RETRIES, TOKENS, TTFT};

const MODEL: Label = Label::runtime("model", "a configured model name, known when the model is first called");
const CALLER: Label = Label::known("caller", &["lead_agent", "subagent", "middleware"]);

pub const CATALOGUE: Catalogue = &[
    Family::counter(REQUESTS, "Completed model calls by model, caller bucket and outcome.").labels(&[
        MODEL,
        CALLER,
        Label::known("outcome", &["ok", "error", "stream_error", "cancelled"]),
    ]),
    Family::seconds(LATENCY, "Model call latency, receipt to last byte, by model and caller bucket.").labels(&[MODEL, CALLER]),
    Family::seconds(TTFT, "Time to the first content delta, by model and caller bucket.").labels(&[MODEL, CALLER]),
    Family::seconds(CHUNK_GAP, "Gaps between upstream stream events, by model.").labels(&[MODEL]),
    Family::counter(TOKENS, "Tokens by model, caller bucket and kind.").labels(&[
        MODEL,
        CALLER,
        Label::known("kind", &["input", "output", "cache_read", "reasoning"]),
    ]),
    Family::counter(ESTIMATED, "Calls whose usage the upstream did not report and the gateway estimated, by model.").labels(&[MODEL]),
    Family::counter(RETRIES, "Upstream attempts retried, by model and the failure's reason.").labels(&[
        MODEL,
        Label::known(
            "reason",
            &[
                "bad_request",
                "auth",
                "not_found",
                "rate_limited",
                "unavailable",
                "refused",
                "connect",
                "first_byte_timeout",
                "chunk_timeout",
                "broken",
                "malformed",
            ],
        ),
    ]),
    Family::counter(FALLBACKS, "Fallbacks taken, by the model given up on and the next one tried.").labels(&[
        Label::runtime("from", "a configured model name, known when its fallback is first taken"),
        Label::runtime("to", "a configured model name, known when its fallback is first taken"),
    ]),
    Family::seconds(OVERHEAD, "Gateway time not spent waiting on the upstream, a backoff or the client, by model.").labels(&[MODEL]),
    Family::counter(RELOADS, "Model registry rebuilds after a configuration change: applied, or rejected (the previous registry stays).")
        .labels(&[Label::known("outcome", &["applied", "rejected"])]),
];

#[cfg(test)]
mod tests {
    use antler_kit::metrics_catalog::{KIT, audit};

    #[test]
    fn every_metric_of_the_source_is_catalogued_and_in_the_readme() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let problems = audit::audit(&src, super::CATALOGUE, &[KIT]);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let missing = audit::undocumented_in_table(include_str!("../README.md"), super::CATALOGUE);
        assert!(missing.is_empty(), "README.md, Metrics:\n{}", missing.join("\n"));
    }
}
