//! The metric families a crate can emit, written down once per crate: name, kind, unit, help text and
//! label sets. The Prometheus endpoint ([`crate::prometheus`]) describes every family of the catalogues a
//! binary carries (the `# HELP` line) and registers its series at zero before anything is recorded, so
//! a dashboard or an alert reads 0 from the first scrape instead of "No data" until the first event.
//!
//! Which series exist at zero: an unlabelled family has its one series; a labelled family has every
//! combination of its label values when all of its labels are [`Values::Known`] (fixed words such as
//! `outcome` = `applied` | `rejected`). A label whose values are only known at run time ([`Values::Runtime`]:
//! a configured model or MCP server name, an HTTP status) cannot be enumerated here, so such a family is
//! described at start-up and its series appear when first recorded.
//!
//! Each crate keeps its catalogue in `src/metrics_catalog.rs` and tests it with [`audit`]: every `counter!`,
//! `gauge!` and `histogram!` in its source must name a catalogued family with the catalogued label keys,
//! so a metric cannot be added undocumented.

pub mod audit;

use metrics::{Key, Level, Metadata, Recorder, Unit};

/// Prometheus metric types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The word of the `# TYPE` line (and of the README tables).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// The values one label takes.
#[derive(Debug, Clone, Copy)]
pub enum Values {
    /// Every value the code records: each one is registered at zero.
    Known(&'static [&'static str]),
    /// Values known only at run time; the text says what they are (and so why the family's series appear
    /// on first use).
    Runtime(&'static str),
}

/// One label of a family.
#[derive(Debug, Clone, Copy)]
pub struct Label {
    pub key: &'static str,
    pub values: Values,
}

impl Label {
    pub const fn known(key: &'static str, values: &'static [&'static str]) -> Label {
        Label { key, values: Values::Known(values) }
    }

    pub const fn runtime(key: &'static str, what: &'static str) -> Label {
        Label { key, values: Values::Runtime(what) }
    }
}

/// One metric family.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    /// The `# HELP` text: what one increment, sample or level means.
    pub help: &'static str,
    pub labels: &'static [Label],
}

impl Family {
    pub const fn counter(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: Kind::Counter, unit: None, help, labels: &[] }
    }

    pub const fn gauge(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: Kind::Gauge, unit: None, help, labels: &[] }
    }

    /// A histogram of durations in seconds.
    pub const fn seconds(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: Kind::Histogram, unit: Some(Unit::Seconds), help, labels: &[] }
    }

    /// A histogram of counts (batch sizes and the like).
    pub const fn sizes(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: Kind::Histogram, unit: Some(Unit::Count), help, labels: &[] }
    }

    pub const fn unit(self, unit: Unit) -> Family {
        Family { unit: Some(unit), ..self }
    }

    pub const fn labels(self, labels: &'static [Label]) -> Family {
        Family { labels, ..self }
    }

    /// The label sets registered at zero: one empty set when unlabelled, every combination of the values
    /// when all labels are known, none when a label's values are known only at run time.
    pub fn zero_series(&self) -> Vec<Vec<(&'static str, &'static str)>> {
        let mut sets: Vec<Vec<(&'static str, &'static str)>> = vec![Vec::new()];
        for label in self.labels {
            let Values::Known(values) = label.values else { return Vec::new() };
            sets = sets.iter().flat_map(|set| values.iter().map(move |v| [set.as_slice(), &[(label.key, *v)]].concat())).collect();
        }
        sets
    }
}

/// A crate's families.
pub type Catalogue = &'static [Family];

/// The families this crate's server stack records in every binary: config reloads, load shedding,
/// deadlines, message sizes, authentication and TLS.
pub const KIT: Catalogue = &[
    Family::counter(
        "antler_config_reloads_total",
        "Changes of the configuration file: applied (in force now) or rejected (invalid; the previous configuration stays).",
    )
    .labels(&[Label::known("outcome", &["applied", "rejected"])]),
    Family::counter(
        "antler_requests_shed_total",
        "Requests refused with UNAVAILABLE because every permit was taken (client: server.concurrency_limit; internal: server.internal_concurrency_limit).",
    )
    .labels(&[Label::known("kind", &["client", "internal"])]),
    Family::counter(
        "antler_requests_default_deadline_total",
        "Calls without a grpc-timeout that got no answer within server.default_deadline_secs (answered DEADLINE_EXCEEDED).",
    ),
    Family::counter("antler_requests_too_large_total", "Requests refused because a message exceeded server.max_message_bytes."),
    Family::counter(
        "antler_auth_failures_total",
        "Requests refused as UNAUTHENTICATED: a missing, unknown or invalid credential (gRPC and the LangGraph HTTP edge).",
    ),
    Family::counter("antler_tls_handshakes_total", "TLS handshakes on the server port: ok, failed, or timeout (server.tls.handshake_timeout_ms).")
        .labels(&[Label::known("outcome", &["ok", "failed", "timeout"])]),
    Family::counter(
        "antler_tls_reloads_total",
        "Changed certificate files: applied (new connections use them) or rejected (unusable; the previous ones stay).",
    )
    .labels(&[Label::known("outcome", &["applied", "rejected"])]),
];

/// Describes every family of `catalogues` to `recorder` and registers its zero series (see the module
/// doc). A name in two catalogues keeps its first description; its series are registered once.
pub fn register(recorder: &impl Recorder, catalogues: &[Catalogue]) {
    static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));
    let mut seen = std::collections::HashSet::new();
    for family in catalogues.iter().flat_map(|c| c.iter()) {
        if !seen.insert(family.name) {
            continue;
        }
        let (name, help) = (family.name, family.help);
        match family.kind {
            Kind::Counter => recorder.describe_counter(name.into(), family.unit, help.into()),
            Kind::Gauge => recorder.describe_gauge(name.into(), family.unit, help.into()),
            Kind::Histogram => recorder.describe_histogram(name.into(), family.unit, help.into()),
        }
        for set in family.zero_series() {
            let labels: Vec<metrics::Label> = set.into_iter().map(|(k, v)| metrics::Label::from_static_parts(k, v)).collect();
            let key = Key::from_parts(name, labels);
            // Registering is what makes the series exist; the handle itself is not needed.
            match family.kind {
                Kind::Counter => drop(recorder.register_counter(&key, &METADATA)),
                Kind::Gauge => drop(recorder.register_gauge(&key, &METADATA)),
                Kind::Histogram => drop(recorder.register_histogram(&key, &METADATA)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_labels_register_every_combination_and_runtime_ones_none() {
        const BOTH: &[Label] = &[Label::known("op", &["read", "write"]), Label::known("outcome", &["ok", "error"])];
        let family = Family::counter("antler_x_total", "x").labels(BOTH);
        assert_eq!(family.zero_series().len(), 4);
        assert!(family.zero_series().contains(&vec![("op", "write"), ("outcome", "error")]));
        assert_eq!(Family::gauge("antler_y", "y").zero_series(), vec![Vec::<(&str, &str)>::new()]);
        const MODEL: &[Label] = &[Label::runtime("model", "a configured model name"), Label::known("kind", &["input"])];
        assert!(Family::counter("antler_z_total", "z").labels(MODEL).zero_series().is_empty());
    }

    #[test]
    fn the_kit_catalogue_covers_the_kit_source_and_the_top_readme() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let problems = audit::audit(&src, KIT, &[]);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let readme = include_str!("../../../../README.md");
        let missing = audit::undocumented_in_text(readme, KIT);
        assert!(missing.is_empty(), "the README's Metrics paragraph does not name {missing:?}");
    }
}
