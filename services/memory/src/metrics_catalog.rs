//! Every metric family this crate records (see [`antler_kit::metrics_catalog`]): described and registered
//! at zero when a binary serving the memory service installs its Prometheus recorder; the README's
//! Metrics table documents them.

use antler_kit::metrics_catalog::{Catalogue, Family, Label};

pub const CATALOGUE: Catalogue = &[
    Family::counter(
        "antler_memory_updates_queued_total",
        "Conversation updates accepted into the extraction queue (replaced: a pending update of the same thread was superseded).",
    )
    .labels(&[Label::known("replaced", &["true", "false"])]),
    Family::counter("antler_memory_queue_rejected_total", "Updates refused because the queue held memory.queue_max_depth updates."),
    Family::sizes("antler_memory_queue_batch_size", "Updates stored per group-commit transaction of the queue."),
    Family::counter("antler_memory_updates_processed_total", "Queued updates the worker finished an attempt on, by result.")
        .labels(&[Label::known("result", &["ok", "malformed", "retry", "lease_lost"])]),
    Family::seconds("antler_memory_update_seconds", "Time to extract and apply one update that succeeded (model call included)."),
    Family::counter(
        "antler_memory_extraction_malformed_total",
        "Extraction answers that were not a valid operations object (nothing applied).",
    ),
    Family::counter("antler_memory_facts_written_total", "Facts added: from a conversation's extraction or by AddFact (manual).")
        .labels(&[Label::known("source", &["conversation", "manual"])]),
    Family::counter("antler_memory_facts_rejected_total", "Extracted facts the junk guards refused, by reason.")
        .labels(&[Label::known("reason", &["low_confidence", "duplicate", "stale_target", "copied", "schema", "pattern"])]),
    Family::counter("antler_memory_facts_evicted_total", "Live facts invalidated to keep a scope within memory.max_facts."),
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
