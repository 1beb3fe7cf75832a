//! Every metric family this crate records (see [`antler_kit::metrics_catalog`]): described and registered
//! at zero when a binary serving the edge installs its Prometheus recorder. Refused credentials count in
//! the kit's shared `antler_auth_failures_total`.

use antler_kit::metrics_catalog::{Catalogue, Family, Label};

pub const CATALOGUE: Catalogue = &[Family::counter(
    "antler_langgraph_requests_total",
    "Requests to the HTTP edge (the LangGraph API, and DeerFlow's gateway routes as `gateway`), by endpoint and the HTTP status answered.",
)
.labels(&[
    Label::known(
        "endpoint",
        &["threads", "state", "history", "runs", "stream", "wait", "join", "cancel", "assistants", "system", "gateway", "other"],
    ),
    Label::runtime("status", "the HTTP status answered, known once a request is answered"),
])];

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
