//! docs/metrics.md and the Grafana dashboard stay true: every metric the coordinator and the
//! reference store export is documented, every documented metric is exported, and the
//! dashboard queries only documented metrics.

use crate::common;

use std::collections::BTreeSet;

use common::{ResourceProcess, ServerProcess};

/// The exported names (`_total` on counters, as Prometheus shows them) in a /metrics page.
fn exported(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| {
            let mut parts = rest.split_whitespace();
            let name = parts.next().unwrap().to_owned();
            match parts.next() {
                Some("counter") => format!("{name}_total"),
                _ => name,
            }
        })
        .collect()
}

/// The metrics docs/metrics.md documents: its tables' first column (`docs_names.rs` weighs
/// the metric names other pages cite against it too).
pub(crate) fn documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    doc.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|name| name.starts_with("palisade_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_exported_metric_is_documented_and_every_documented_one_exported() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let store = ResourceProcess::start(&dir.path().join("store"), "strict", &server.url);
    let (status, coordinator) = server.http("GET", "/metrics", None, "");
    assert_eq!(status, 200);
    let (status, resource) = common::http_request(
        store.url.trim_start_matches("http://"),
        "GET",
        "/metrics",
        None,
        "",
    );
    assert_eq!(status, 200);
    let mut exported_names = exported(&coordinator);
    exported_names.extend(exported(&resource));
    let documented = documented();
    let undocumented: Vec<_> = exported_names.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/metrics.md: {undocumented:?}"
    );
    let missing: Vec<_> = documented.difference(&exported_names).collect();
    assert!(
        missing.is_empty(),
        "in docs/metrics.md but not exported: {missing:?}"
    );
    // Label values documented as exported from the start are there before any event.
    for sample in [
        "palisade_acquires_refused_total{reason=\"policy_no_boundary\"} 0",
        "palisade_policy_reloads_total{result=\"error\"} 0",
        "palisade_ownership_transitions_total{class=\"efficiency\",transition=\"expired\"} 0",
    ] {
        assert!(
            coordinator.contains(sample),
            "{sample} missing:\n{coordinator}"
        );
    }
    for sample in [
        "palisade_resource_rejections_total{reason=\"missing_token\"} 0",
        "palisade_effects_reconciliations_total{result=\"to_review\"} 0",
    ] {
        assert!(resource.contains(sample), "{sample} missing:\n{resource}");
    }
}

#[test]
fn the_grafana_dashboard_queries_only_documented_metrics() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana/palisade.json"
    ))
    .unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let documented = documented();
    let mut used = BTreeSet::new();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !token.starts_with("palisade_") {
                    continue;
                }
                let name = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| {
                        token
                            .strip_suffix(suffix)
                            .filter(|base| documented.contains(*base))
                    })
                    .unwrap_or(token);
                assert!(
                    documented.contains(name),
                    "panel {:?} queries {token}, not in docs/metrics.md",
                    panel["title"]
                );
                used.insert(name.to_owned());
            }
        }
    }
    // The dashboard covers what the issue asked to see: refusals by reason, the epoch, Raft,
    // key changes, missing tokens, reconciliations.
    for name in [
        "palisade_acquires_refused_total",
        "palisade_epoch",
        "palisade_raft_term",
        "palisade_raft_leader_changes_total",
        "palisade_raft_members",
        "palisade_commit_duration_seconds",
        "palisade_resource_trusted_key_changes_total",
        "palisade_resource_rejections_total",
        "palisade_effects_reconciliations_total",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}
