//! What the proxy holds the metrics crate (crates/metrics) to, where the facts are the
//! proxy's: docs/METRICS.md's tables (read with the one table reader, `doc_table`), the
//! settings its configuration fills in when nothing is written, and the version its
//! `tokentap_build_info` states. The crate's own tests check everything else beside the
//! code; these moved here from `metrics::families` and `outcome` when it became a crate,
//! each with its assertions.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{Config, Overrides};
use crate::metrics;
use crate::outcome::Verdict;

fn flag_only() -> Config {
    Config::from_overrides(&Overrides {
        upstream: Some("http://127.0.0.1:9".to_string()),
        ..Default::default()
    })
    .expect("flag-only config is valid")
}

/// The rows of docs/METRICS.md's `| metric | type | labels | ...` tables:
/// name -> (type, labels).
fn documented_families(doc: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut rows = BTreeMap::new();
    for line in crate::doc_table::rows(doc, "| metric | type | labels |") {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        let spans = |cell: &str| -> Vec<String> {
            crate::doc_table::code_spans(cell)
                .map(str::to_string)
                .collect()
        };
        let name = spans(cells[0]).first().cloned().unwrap_or_default();
        let labels = spans(cells[2]).into_iter().collect();
        let twice = rows.insert(name.clone(), (cells[1].to_string(), labels));
        assert!(twice.is_none(), "docs/METRICS.md: {name} has two rows");
    }
    rows
}

/// docs/METRICS.md lists every family `/metrics` can serve (the contract's, the GenAI
/// names' and the process collector's), each with its type and its labels under the
/// default `labels.tenant.families`, and no family `/metrics` cannot serve.
#[test]
fn docs_metrics_lists_every_family() {
    const DOC: &str = include_str!("../docs/METRICS.md");
    /// Served by the process collector only where the process has an address-space
    /// limit.
    const SOMETIMES: &[&str] = &["process_virtual_memory_max_bytes"];
    let set = |labels: &[&str]| labels.iter().map(|l| l.to_string()).collect();
    let mut served: BTreeMap<String, (String, BTreeSet<String>)> = metrics::contract()
        .chain(metrics::gen_ai_contract())
        .map(|(name, kind, labels)| (name.to_string(), (kind.to_string(), set(&labels))))
        .collect();
    let config = flag_only();
    let metrics = metrics::Metrics::new(&config.metrics.buckets, &config.labels);
    let text = String::from_utf8(metrics.render()).unwrap();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE process_") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        served.insert(
            format!("process_{name}"),
            (kind.to_string(), BTreeSet::new()),
        );
    }
    let mut documented = documented_families(DOC);
    for name in SOMETIMES {
        if !served.contains_key(*name) {
            documented.remove(*name);
        }
    }
    let missing: Vec<_> = served
        .keys()
        .filter(|n| !documented.contains_key(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/METRICS.md misses these families: {missing:?}"
    );
    let unknown: Vec<_> = documented
        .keys()
        .filter(|n| !served.contains_key(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/METRICS.md lists families /metrics cannot serve: {unknown:?}"
    );
    for (name, (kind, labels)) in &served {
        assert_eq!(
            &documented[name],
            &(kind.clone(), labels.clone()),
            "docs/METRICS.md: {name}'s type and labels (left) against the code's (right)"
        );
    }
}

/// docs/METRICS.md's table of the (outcome, status) pairs is exactly `statuses()`'s, and
/// the count it states is theirs.
#[test]
fn docs_metrics_lists_every_pair() {
    const DOC: &str = include_str!("../docs/METRICS.md");
    let mut documented = Vec::new();
    for line in crate::doc_table::rows(DOC, "| outcome | statuses |") {
        let mut spans = crate::doc_table::code_spans(line);
        let outcome = spans.next().unwrap_or_default().to_string();
        for status in spans {
            documented.push((outcome.clone(), status.to_string()));
        }
    }
    let mut code: Vec<(String, String)> = Verdict::ALL
        .iter()
        .map(|v| {
            (
                v.outcome.as_str().to_string(),
                v.status.as_str().to_string(),
            )
        })
        .collect();
    documented.sort();
    code.sort();
    let extra: Vec<_> = documented.iter().filter(|p| !code.contains(p)).collect();
    let missing: Vec<_> = code.iter().filter(|p| !documented.contains(p)).collect();
    assert!(
        extra.is_empty() && missing.is_empty() && documented.len() == code.len(),
        "docs/METRICS.md lists (outcome, status) pairs statuses() does not give: {extra:?}; \
         and misses pairs it gives: {missing:?}"
    );
    let count = format!(
        "only these {} (outcome, status) pairs exist",
        Verdict::COUNT
    );
    assert!(
        DOC.replace('\n', " ").contains(&count),
        "docs/METRICS.md says \"{count}\""
    );
}

/// An unwritten `metrics.buckets` and `labels` mean the metric crate's defaults, which its
/// own tests (the ops contract's buckets, the scrapes) are built with.
#[test]
fn flag_only_settings_are_the_metric_crates_defaults() {
    let config = flag_only();
    assert_eq!(config.metrics.buckets, metrics::Buckets::default());
    assert_eq!(config.labels, metrics::Labels::default());
    assert_eq!(
        config.metrics.native_histograms,
        metrics::NativeHistograms::default()
    );
}

/// `tokentap_build_info{version}` is the proxy's version: the metrics crate writes its own
/// `CARGO_PKG_VERSION`, which the workspace keeps the same (`[workspace.package]`).
#[test]
fn build_info_states_the_proxys_version() {
    let config = flag_only();
    let metrics = metrics::Metrics::new(&config.metrics.buckets, &config.labels);
    let text = String::from_utf8(metrics.render()).expect("the exposition is UTF-8");
    let line = format!(
        "tokentap_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&line), "{line}");
}
