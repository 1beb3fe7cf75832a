//! Every metric family this crate records (see [`antler_kit::metrics_catalog`]): described at start-up
//! when a binary serving the MCP service installs its Prometheus recorder. The pool's families carry the
//! `server` label, a name from the MCP configuration (which reloads), so their series appear when a
//! server is first used. The README's Metrics table documents them.

use antler_kit::metrics_catalog::{Catalogue, Family, Label};

const SERVER: Label = Label::runtime("server", "a server name from the MCP configuration, known when the server is first used");
const BY_SERVER: &[Label] = &[SERVER];

pub const CATALOGUE: Catalogue = &[
    Family::counter("antler_mcp_pool_hits_total", "Session acquisitions served by a ready pooled session.").labels(BY_SERVER),
    Family::counter("antler_mcp_pool_misses_total", "Session acquisitions that found no ready session and waited for one to start.")
        .labels(BY_SERVER),
    Family::counter("antler_mcp_pool_creations_total", "Sessions started (process spawned or connection opened, then initialized).")
        .labels(BY_SERVER),
    Family::counter("antler_mcp_pool_creation_failures_total", "Sessions that failed to start.").labels(BY_SERVER),
    Family::counter("antler_mcp_pool_evictions_total", "Least recently used idle sessions closed to make room (mcp.pool.max_sessions).")
        .labels(BY_SERVER),
    Family::counter("antler_mcp_pool_expirations_total", "Sessions closed after session_ttl_secs or idle_evict_secs.").labels(BY_SERVER),
    Family::counter(
        "antler_mcp_session_reinitializations_total",
        "Sessions re-initialized after the server lost them (HTTP 404 on a session id).",
    )
    .labels(BY_SERVER),
    Family::counter(
        "antler_mcp_server_restarts_total",
        "Pooled sessions replaced because the server closed them or failed the health check.",
    )
    .labels(BY_SERVER),
    Family::seconds("antler_mcp_call_duration_seconds", "CallTool duration inside the MCP service, by server and outcome.").labels(&[
        SERVER,
        Label::known(
            "outcome",
            &[
                "ok",
                "tool_error",
                "invalid_argument",
                "not_found",
                "failed_precondition",
                "permission_denied",
                "unavailable",
                "deadline_exceeded",
                "resource_exhausted",
                "cancelled",
                "internal",
            ],
        ),
    ]),
    Family::counter("antler_mcp_config_reloads_total", "MCP server configuration loads: applied, or rejected (the last good one stays).")
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
