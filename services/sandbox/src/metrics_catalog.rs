//! Every metric family this crate records (see [`antler_kit::metrics_catalog`]): described and registered
//! at zero when a binary serving the sandbox service installs its Prometheus recorder; the README's
//! Metrics table documents them.

use antler_kit::metrics_catalog::{Catalogue, Family, Label};

const PROVIDER: Label = Label::known("provider", &["local", "bwrap"]);
const FORMAT: Label = Label::known("format", &["pdf", "docx", "pptx", "xlsx", "html"]);
const OPS: &[&str] = &["read", "write", "edit", "delete", "list", "glob", "grep", "download", "snapshot"];

pub const CATALOGUE: Catalogue = &[
    Family::seconds("antler_sandbox_exec_seconds", "Command run time (ExecuteCommand), by provider and how the command ended.")
        .labels(&[PROVIDER, Label::known("outcome", &["ok", "nonzero", "timeout", "killed"])]),
    Family::counter("antler_sandbox_exec_kills_total", "Commands whose process group the service killed, by provider and reason.")
        .labels(&[PROVIDER, Label::known("reason", &["timeout", "release", "reset", "shutdown", "cancelled", "fenced"])]),
    Family::counter("antler_sandbox_file_ops_total", "File operations by kind and outcome (ok, or the error's status in snake case).")
        .labels(&[
            Label::known("op", OPS),
            Label::known(
                "outcome",
                &[
                    "ok",
                    "invalid_argument",
                    "not_found",
                    "failed_precondition",
                    "permission_denied",
                    "resource_exhausted",
                    "unavailable",
                    "internal",
                ],
            ),
        ]),
    Family::seconds("antler_sandbox_file_op_seconds", "File operation latency, by kind.").labels(&[Label::known("op", OPS)]),
    Family::counter("antler_sandbox_acquires_total", "AcquireSandbox calls (created: whether the workspace was made new).")
        .labels(&[Label::known("created", &["true", "false"])]),
    Family::counter(
        "antler_sandbox_evictions_total",
        "Idle sandboxes dropped from memory to stay within sandbox.max_live_sandboxes (their files stay on disk).",
    ),
    Family::gauge("antler_sandbox_live", "Sandboxes held in memory now."),
    Family::counter("antler_sandbox_uploaded_files_total", "Files stored by UploadFiles."),
    Family::counter("antler_sandbox_conversions_total", "Document conversions (uploads and ConvertDocument), by format and outcome.")
        .labels(&[
            FORMAT,
            Label::known(
                "outcome",
                &["ok", "unsupported", "encrypted", "broken", "too_large", "timeout", "out_of_memory", "crashed", "unavailable"],
            ),
        ]),
    Family::seconds(
        "antler_sandbox_conversion_seconds",
        "Time one document conversion took (the converter process, start to exit), by format.",
    )
    .labels(&[FORMAT]),
    Family::counter(
        "antler_sandbox_skill_scan_decisions_total",
        "Skills the static skill scan decided on (InstallSkill, the agent's skill_manage included): allow, warn (installed with WARNING findings) or block (a CRITICAL finding refused it).",
    )
    .labels(&[Label::known("decision", &["allow", "warn", "block"])]),
    Family::counter("antler_sandbox_fenced_calls_total", "Calls refused because a higher attempt of their run took over."),
    Family::counter(
        "antler_sandbox_fences_forgotten_total",
        "Runs' fencing tokens forgotten before sandbox.fence_retention_secs because sandbox.fence_max_runs was reached.",
    ),
    Family::counter("antler_sandbox_resolve_fallbacks_total", "Paths resolved in user space after openat2 kept answering EAGAIN."),
    Family::gauge(
        "antler_sandbox_provider",
        "1 for the active provider (fallback: true when auto fell back to local, unusable when provider: bwrap cannot run).",
    )
    .labels(&[
        Label::runtime("provider", "the provider selected when the service starts (set then, so present from the first scrape)"),
        Label::runtime("fallback", "true, false or unusable, decided with the provider at start-up"),
    ]),
    Family::gauge(
        "antler_sandbox_seccomp",
        "1 for the seccomp mode bwrap commands run under: strict (the filter is installed) or off (sandbox.seccomp: off, or commands do not run under bwrap).",
    )
    .labels(&[Label::runtime("mode", "strict or off, decided with the provider at start-up")]),
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
