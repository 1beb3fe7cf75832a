//! Every metric family the lead agent records (see [`antler_kit::metrics_catalog`]). The runs service
//! hosts the agent, so its binaries register this catalogue beside their own, and the runs README's
//! Metrics table documents it.

use antler_kit::metrics_catalog::{Catalogue, Family, Label};

pub const CATALOGUE: Catalogue = &[
    Family::counter(
        "antler_agent_safety_finishes_total",
        "Model turns that ended with finish reason content_filter (stop reason safety_capped).",
    )
    .labels(&[Label::known("caller", &["lead_agent", "subagent"])]),
    Family::seconds("antler_agent_mcp_call_seconds", "The lead agent's MCP tool calls as the run sees them, gRPC hop included.").labels(&[
        Label::runtime("server", "a server name from the MCP configuration, known when a run first calls one of its tools"),
        Label::known("outcome", &["ok", "tool_error", "rpc_error"]),
    ]),
    Family::seconds("antler_agent_web_call_seconds", "The web tools' calls (search, fetch and conversion), by tool, provider and outcome.")
        .labels(&[
            Label::known("tool", &["web_search", "web_fetch", "image_search"]),
            Label::runtime("provider", "the configured provider: searxng, tavily, brave, serper, exa, firecrawl, jina or direct"),
            Label::known("outcome", &["ok", "error", "refused"]),
        ]),
    Family::counter("antler_agent_acp_calls_total", "invoke_acp_agent calls to external ACP agents, by how they ended.")
        .labels(&[Label::known("outcome", &["ok", "failed", "timeout", "cancelled"])]),
    Family::counter("antler_agent_web_fetch_refused_total", "web_fetch URLs refused by the SSRF rules, by the rule they broke.").labels(&[
        Label::known(
            "rule",
            &[
                "scheme",
                "port",
                "loopback",
                "private",
                "link-local",
                "cgnat",
                "multicast",
                "unspecified",
                "broadcast",
                "reserved",
                "unresolvable",
            ],
        ),
    ]),
    Family::counter("antler_subagent_tasks_total", "Subagent tasks (the task tool) by how they ended.")
        .labels(&[Label::known("status", &["completed", "timed_out", "cancelled", "failed"])]),
];

#[cfg(test)]
mod tests {
    use antler_kit::metrics_catalog::{KIT, audit};

    #[test]
    fn every_metric_of_the_source_is_catalogued_and_in_the_runs_readme() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let problems = audit::audit(&src, super::CATALOGUE, &[KIT]);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let missing = audit::undocumented_in_table(include_str!("../../runs/README.md"), super::CATALOGUE);
        assert!(missing.is_empty(), "services/runs/README.md, Metrics:\n{}", missing.join("\n"));
    }
}
