//! `examples/grafana-dashboard.json` against the metric catalogues `antler up` registers: every metric an
//! expression names is a catalogued family (a histogram's through its `_bucket` / `_count` / `_sum`
//! series), so a renamed or invented metric cannot leave a panel reading "No data" for ever. Whether the
//! expressions are valid PromQL is checked by a real Prometheus (`integration-tests/python/test_prometheus.py`).

use std::collections::HashSet;

use antler_kit::metrics_catalog::{Catalogue, Family, KIT, Kind};

const DASHBOARD: &str = include_str!("../../../examples/grafana-dashboard.json");

fn families() -> Vec<&'static Family> {
    let services = [
        antler_runs::SERVICE,
        antler_sandbox::SERVICE,
        antler_mcp::SERVICE,
        antler_models::SERVICE,
        antler_memory::SERVICE,
        antler_edge::SERVICE,
    ];
    let catalogues: Vec<Catalogue> = std::iter::once(KIT).chain(services.iter().flat_map(|s| s.metrics.iter().copied())).collect();
    catalogues.into_iter().flat_map(|c| c.iter()).collect()
}

/// The family a series name belongs to, if any.
fn family_of<'a>(families: &[&'a Family], series: &str) -> Option<&'a Family> {
    families.iter().copied().find(|f| f.name == series).or_else(|| {
        let base = ["_bucket", "_count", "_sum"].iter().find_map(|suffix| series.strip_suffix(suffix))?;
        families.iter().copied().find(|f| f.name == base && f.kind == Kind::Histogram)
    })
}

/// Every `antler_…` identifier in a PromQL expression.
fn metric_names(expr: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("antler_") {
        let tail = &rest[start..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.push(&tail[..end]);
        rest = &tail[end..];
    }
    names
}

fn panels() -> anyhow::Result<Vec<serde_json::Value>> {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD)?;
    let panels = dashboard.get("panels").and_then(|p| p.as_array()).ok_or_else(|| anyhow::anyhow!("the dashboard has no panels"))?;
    Ok(panels.clone())
}

fn exprs(panel: &serde_json::Value) -> Vec<String> {
    let targets = panel.get("targets").and_then(|t| t.as_array()).cloned().unwrap_or_default();
    targets.iter().filter_map(|t| t.get("expr").and_then(|e| e.as_str()).map(str::to_owned)).collect()
}

#[test]
fn every_metric_the_dashboard_queries_is_catalogued() -> anyhow::Result<()> {
    let families = families();
    let mut problems = Vec::new();
    for panel in panels()? {
        let title = panel.get("title").and_then(|t| t.as_str()).unwrap_or("?").to_owned();
        for expr in exprs(&panel) {
            let names = metric_names(&expr);
            if names.is_empty() {
                problems.push(format!("{title}: `{expr}` names no antler_ metric"));
            }
            for name in names {
                if family_of(&families, name).is_none() {
                    problems.push(format!("{title}: {name} is not a catalogued metric"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn the_dashboard_has_panels_for_the_langgraph_edge_memory_and_tls() -> anyhow::Result<()> {
    let queried: HashSet<String> =
        panels()?.iter().flat_map(exprs).flat_map(|e| metric_names(&e).into_iter().map(str::to_owned).collect::<Vec<_>>()).collect();
    for prefix in ["antler_langgraph_", "antler_memory_", "antler_tls_", "antler_run", "antler_model_", "antler_sandbox_", "antler_mcp_"] {
        assert!(queried.iter().any(|n| n.starts_with(prefix)), "no panel queries an {prefix}* metric");
    }
    assert!(queried.contains("antler_memory_facts_written_total"), "{queried:?}");
    Ok(())
}

#[test]
fn panel_ids_are_unique_and_panels_do_not_overlap() -> anyhow::Result<()> {
    let panels = panels()?;
    let mut ids = HashSet::new();
    let mut cells = HashSet::new();
    for panel in &panels {
        let id = panel.get("id").and_then(|i| i.as_u64()).ok_or_else(|| anyhow::anyhow!("a panel without an id: {panel}"))?;
        assert!(ids.insert(id), "panel id {id} used twice");
        let grid = |k: &str| panel.get("gridPos").and_then(|g| g.get(k)).and_then(|v| v.as_u64()).unwrap_or(0);
        for x in grid("x")..grid("x") + grid("w") {
            for y in grid("y")..grid("y") + grid("h") {
                assert!(cells.insert((x, y)), "panel {id} overlaps another at ({x}, {y})");
            }
        }
    }
    Ok(())
}
