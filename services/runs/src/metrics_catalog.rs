//! Every metric family this crate records (see [`antler_kit::metrics_catalog`]): described and registered
//! at zero when a binary serving the runs service installs its Prometheus recorder. The lead agent's own
//! families are in `antler_agent::metrics_catalog`; the runs README's Metrics table documents both.

use antler_kit::metrics_catalog::{Catalogue, Family, Label};
use metrics::Unit;

const CALLER: &[&str] = &["lead_agent", "subagent", "middleware"];

pub const CATALOGUE: Catalogue = &[
    Family::counter("antler_run_admissions_total", "CreateRun / StreamRun / WaitRun admissions by how they ended.")
        .labels(&[Label::known("outcome", &["admitted", "reused", "rejected", "invalid", "shed", "error"])]),
    Family::counter("antler_runs_admitted_total", "Runs inserted PENDING, by multitask strategy (SUBAGENT: a subagent's child run).")
        .labels(&[Label::known(
            "strategy",
            &[
                "MULTITASK_STRATEGY_REJECT",
                "MULTITASK_STRATEGY_INTERRUPT",
                "MULTITASK_STRATEGY_ROLLBACK",
                "MULTITASK_STRATEGY_ENQUEUE",
                "SUBAGENT",
            ],
        )]),
    Family::sizes("antler_admission_batch_size", "Admissions committed per group-commit transaction."),
    Family::counter("antler_run_transitions_total", "Run status changes written, by the status entered.")
        .labels(&[Label::known("to", &["running", "finalizing", "success", "error", "interrupted", "timeout"])]),
    Family::counter("antler_run_handovers_total", "Runs started in the closing commit of the run whose worker slot they take."),
    Family::counter("antler_lease_renewals_total", "Run leases renewed by this replica's workers."),
    Family::counter("antler_run_takeovers_total", "Runs claimed after their owner's lease expired (attempt + 1)."),
    Family::counter("antler_runs_fenced_total", "Run attempts stopped because they no longer own their run.")
        .labels(&[Label::known("cause", &["lease_lost", "lease_expired", "write_refused"])]),
    Family::gauge("antler_runs_active", "Runs executing on this replica now."),
    Family::gauge("antler_runs_stream_subscribers", "Event streams (StreamRun, JoinRun) open on this replica now."),
    Family::counter(
        "antler_runs_streams_refused_total",
        "Event streams refused by runs.max_streams_per_user (user) or runs.max_streams (replica).",
    )
    .labels(&[Label::known("limit", &["user", "replica"])]),
    Family::counter(
        "antler_runs_notifications_total",
        "PostgreSQL notifications this replica's listener received (resync: it (re)connected).",
    )
    .labels(&[Label::known("kind", &["events", "cancel", "resync"])]),
    Family::counter(
        "antler_runs_safety_polls_total",
        "Safety polls run while something is watched (found: a change no wake-up announced).",
    )
    .labels(&[Label::known("outcome", &["found", "nothing", "error"])]),
    Family::counter("antler_runs_db_statements_total", "Statements this replica sent to its database."),
    Family::seconds("antler_runs_event_append_seconds", "Time to make a step's events durable, commit included.")
        .labels(&[Label::known("path", &["statement", "transaction"])]),
    Family::counter("antler_runs_checkpoint_bytes_total", "Bytes of checkpoint rows written (blobs not included).")
        .unit(Unit::Bytes)
        .labels(&[Label::known("kind", &["snapshot", "delta"])]),
    Family::counter("antler_tokens_total", "Tokens written to runs' usage, by caller bucket.").labels(&[Label::known("caller", CALLER)]),
    Family::counter("antler_runs_wal_truncations_total", "SQLite WAL checkpoints that truncated the log."),
    Family::sizes("antler_runs_sqlite_group_writes", "SQLite: lifecycle writes committed per group-commit transaction."),
    Family::seconds("antler_runs_sqlite_write_seconds", "SQLite: how long each write transaction held the write slot, by priority.")
        .labels(&[Label::known("priority", &["lifecycle", "admission"])]),
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
