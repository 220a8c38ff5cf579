//! The demo's summary: tokentap's own view, read from a snapshot of its metric families.
//!
//! `tokentap demo` (the binary's `demo_cmd`: the simulator, tokentap in front of it and a
//! traffic generator, in one process) prints this every few seconds: per model and
//! tenant, requests (and how many the upstream refused or failed), TTFT and ITL p50/p99
//! and decode tokens/s, read from the native histograms exactly as Prometheus'
//! `histogram_quantile` would (each p99 with the classic buckets' coarser estimate beside
//! it), and below it every request counted by outcome and status. The simulator is not a
//! dependency of the library: this module reads metrics only.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use crate::live::frame::Attainment;
use crate::metrics::snapshot::{HistogramSnapshot, Series, Values};
use crate::metrics::{Metrics, ObjectiveTotals, Snapshot};

/// The demo's figures for one (model, tenant) pair, from tokentap's own histograms.
///
/// Quantiles come from the native (sparse exponential) buckets, as `histogram_quantile`
/// reads a native histogram, so they are within a few percent of the exact quantile;
/// the `classic_*` figures are the same quantile interpolated from the classic buckets,
/// shown beside them for comparison (their error is up to a bucket's width). A figure
/// is `None` while the pair has no observation of it. In seconds, tokens/s for
/// `tokens_per_second_p50`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SummaryRow {
    pub model: String,
    pub tenant: String,
    pub requests: u64,
    /// Requests the upstream refused (`upstream_refused`).
    pub refused: u64,
    /// Requests that failed (`upstream_error`, `timeout`, `overloaded`).
    pub failed: u64,
    pub ttft_p50: Option<f64>,
    pub ttft_p99: Option<f64>,
    pub classic_ttft_p99: Option<f64>,
    pub itl_p50: Option<f64>,
    pub itl_p99: Option<f64>,
    pub classic_itl_p99: Option<f64>,
    pub tokens_per_second_p50: Option<f64>,
}

/// The `q`-quantile of a histogram the pair may not have (yet): from its native buckets
/// when it keeps them, else from the classic ones.
fn quantile(histogram: Option<&HistogramSnapshot>, q: f64) -> Option<f64> {
    let histogram = histogram?;
    match &histogram.native {
        Some(native) => native.quantile(q),
        None => histogram.quantile(q),
    }
}

fn classic_quantile(histogram: Option<&HistogramSnapshot>, q: f64) -> Option<f64> {
    histogram.and_then(|h| h.quantile(q))
}

fn key<T>(series: &Series<T>) -> (String, String) {
    let label = |name| series.label(name).unwrap_or_default().to_string();
    (label("model"), label("tenant"))
}

/// Per (model, tenant): requests, histogram snapshots.
#[derive(Default)]
struct Pair<'a> {
    requests: u64,
    refused: u64,
    failed: u64,
    ttft: Option<&'a HistogramSnapshot>,
    itl: Option<&'a HistogramSnapshot>,
    tokens_per_second: Option<&'a HistogramSnapshot>,
}

/// The summary table's rows, one per (model, tenant) pair in name order. A family
/// without `tenant` (see `labels.tenant.families`) gives its per-model figures to
/// every tenant row of that model.
pub fn summarize(snapshot: &Snapshot) -> Vec<SummaryRow> {
    let mut pairs: BTreeMap<(String, String), Pair<'_>> = BTreeMap::new();
    let mut per_model: BTreeMap<String, Pair<'_>> = BTreeMap::new();
    for family in &snapshot.families {
        match (&*family.name, &family.values) {
            ("tokentap_requests_total", Values::Counter(series)) => {
                for s in series {
                    let pair = pairs.entry(key(s)).or_default();
                    let n = s.value as u64;
                    pair.requests += n;
                    match s.label("outcome").unwrap_or_default() {
                        "upstream_refused" => pair.refused += n,
                        "upstream_error" | "timeout" | "overloaded" => pair.failed += n,
                        _ => {}
                    }
                }
            }
            (name, Values::Histogram(series)) => {
                let set: for<'h> fn(&mut Pair<'h>, &'h HistogramSnapshot) = match name {
                    "tokentap_time_to_first_token_seconds" => |pair, h| pair.ttft = Some(h),
                    "tokentap_inter_token_latency_seconds" => |pair, h| pair.itl = Some(h),
                    "tokentap_output_tokens_per_second" => {
                        |pair, h| pair.tokens_per_second = Some(h)
                    }
                    _ => continue,
                };
                for s in series {
                    let (model, tenant) = key(s);
                    if s.label("tenant").is_some() {
                        set(pairs.entry((model, tenant)).or_default(), &s.value);
                    } else {
                        set(per_model.entry(model).or_default(), &s.value);
                    }
                }
            }
            _ => {}
        }
    }
    pairs
        .into_iter()
        .map(|((model, tenant), pair)| {
            let model_wide = per_model.get(&model);
            let ttft = pair.ttft.or(model_wide.and_then(|m| m.ttft));
            let itl = pair.itl.or(model_wide.and_then(|m| m.itl));
            let tokens_per_second = pair
                .tokens_per_second
                .or(model_wide.and_then(|m| m.tokens_per_second));
            SummaryRow {
                requests: pair.requests,
                refused: pair.refused,
                failed: pair.failed,
                ttft_p50: quantile(ttft, 0.5),
                ttft_p99: quantile(ttft, 0.99),
                classic_ttft_p99: classic_quantile(ttft, 0.99),
                itl_p50: quantile(itl, 0.5),
                itl_p99: quantile(itl, 0.99),
                classic_itl_p99: classic_quantile(itl, 0.99),
                tokens_per_second_p50: quantile(tokens_per_second, 0.5),
                model,
                tenant,
            }
        })
        .collect()
}

/// Print the summary (clearing a terminal first), `sent` streams completed by the client.
pub fn print_summary(metrics: &Metrics, sent: u64) {
    let rows = summarize(&metrics.snapshot());
    let mut out = String::new();
    if std::io::stdout().is_terminal() {
        out.push_str("\x1b[2J\x1b[H");
    }
    out.push_str(&format!(
        "tokentap demo: {sent} streams completed by the client; tokentap's own figures:\n\n"
    ));
    out.push_str(&render_table(&rows));
    if rows.is_empty() {
        out.push_str("(waiting for the first streams to finish...)\n");
    } else {
        out.push_str(&render_verdicts(&metrics.snapshot()));
        out.push_str(&render_objectives(&metrics.objective_totals()));
    }
    print!("{out}");
    let _ = std::io::stdout().flush();
}

/// Every request counted so far by outcome and status, most frequent first, in one line
/// under the table: `outcomes: completed/2xx 1520, upstream_refused/429 47`.
pub fn render_verdicts(snapshot: &Snapshot) -> String {
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for family in &snapshot.families {
        if let ("tokentap_requests_total", Values::Counter(series)) =
            (&*family.name, &family.values)
        {
            for s in series {
                let label = |name| s.label(name).unwrap_or_default().to_string();
                *counts
                    .entry((label("outcome"), label("status")))
                    .or_default() += s.value as u64;
            }
        }
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let parts: Vec<String> = counts
        .iter()
        .map(|((outcome, status), n)| format!("{outcome}/{status} {n}"))
        .collect();
    format!("\noutcomes: {}\n", parts.join(", "))
}

/// Each objective's attainment so far, over every model and tenant, in one line under the
/// outcomes: `objectives: interactive 96.2% met (152 of 158 judged)`; empty without any.
pub fn render_objectives(totals: &ObjectiveTotals) -> String {
    let mut counts: BTreeMap<&str, [u64; 2]> = BTreeMap::new();
    for by_objective in totals.values() {
        for (objective, [met, missed]) in by_objective {
            let count = counts.entry(objective).or_default();
            count[0] = count[0].saturating_add(*met);
            count[1] = count[1].saturating_add(*missed);
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .filter_map(|(objective, &[met, missed])| {
            let share = 100.0 * Attainment::share(met, missed)?;
            let judged = met.saturating_add(missed);
            Some(format!(
                "{objective} {share:.1}% met ({met} of {judged} judged)"
            ))
        })
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!("objectives: {}\n", parts.join(", "))
}

/// The summary as a text table: quantiles from the native histograms, each p99 with the
/// classic buckets' estimate beside it in the `classic` column.
pub fn render_table(rows: &[SummaryRow]) -> String {
    fn line(cells: [&str; 12]) -> String {
        let [model, tenant, requests, refused, failed, ttft_p50, ttft_p99, ttft_classic, itl_p50, itl_p99, itl_classic, tokens] =
            cells;
        format!(
            "{model:<14} {tenant:<12} {requests:>8} {refused:>7} {failed:>6} {ttft_p50:>9} \
             {ttft_p99:>9} {ttft_classic:>8} {itl_p50:>8} {itl_p99:>8} {itl_classic:>8} {tokens:>10}\n"
        )
    }
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}", v * 1e3));
    let mut out = line([
        "model",
        "tenant",
        "requests",
        "refused",
        "failed",
        "TTFT p50",
        "TTFT p99",
        "classic",
        "ITL p50",
        "ITL p99",
        "classic",
        "tok/s p50",
    ]);
    out.push_str(&line([
        "", "", "", "", "", "ms", "ms", "p99 ms", "ms", "ms", "p99 ms", "",
    ]));
    for row in rows {
        let tokens_per_second = row
            .tokens_per_second_p50
            .map_or("-".to_string(), |v| format!("{v:.0}"));
        out.push_str(&line([
            &row.model,
            &row.tenant,
            &row.requests.to_string(),
            &row.refused.to_string(),
            &row.failed.to_string(),
            &ms(row.ttft_p50),
            &ms(row.ttft_p99),
            &ms(row.classic_ttft_p99),
            &ms(row.itl_p50),
            &ms(row.itl_p99),
            &ms(row.classic_itl_p99),
            &tokens_per_second,
        ]));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;

    use super::*;
    use crate::metrics::snapshot::{FamilySnapshot, Label, NativeHistogramSnapshot};

    #[test]
    fn objectives_are_summed_over_models_and_tenants() {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        let metrics = Metrics::new(&config.metrics.buckets, &config.labels);
        assert_eq!(render_objectives(&metrics.objective_totals()), "");
        let (a, b) = (
            metrics.stream(Some("a"), Some("t1")),
            metrics.stream(Some("b"), None),
        );
        for (series, met) in [(&a, true), (&a, true), (&b, true), (&b, false)] {
            metrics.count_objective(series, "interactive", met, 10);
        }
        metrics.count_objective(&a, "batch", false, 10);
        assert_eq!(
            render_objectives(&metrics.objective_totals()),
            "objectives: batch 0.0% met (0 of 1 judged), interactive 75.0% met (3 of 4 judged)\n"
        );
    }

    fn labels(pairs: &[(&'static str, &str)]) -> Vec<Label> {
        pairs
            .iter()
            .map(|(name, value)| Label {
                name: Cow::Borrowed(*name),
                value: Arc::from(*value),
            })
            .collect()
    }

    /// Ten observations in the classic bucket (0.1, 0.2] and in the schema-0 native
    /// bucket (0.125, 0.25] (index -2): the two estimates differ, so a row shows which
    /// one it read.
    fn histogram(with_native: bool) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: Arc::from([0.1, 0.2]),
            cumulative_counts: vec![0, 10],
            count: 10,
            sum: 1.5,
            native: with_native.then(|| NativeHistogramSnapshot {
                schema: 0,
                zero_threshold: 0.001,
                zero_count: 0,
                buckets: vec![(-2, 10)],
            }),
            exemplars: Vec::new(),
            native_exemplars: Vec::new(),
        }
    }

    fn family(name: &'static str, values: Values) -> FamilySnapshot {
        FamilySnapshot {
            name: Cow::Borrowed(name),
            help: Cow::Borrowed(""),
            values,
        }
    }

    #[test]
    fn rows_read_native_buckets_and_share_a_per_model_family_with_every_tenant() {
        let requests = |tenant| Series {
            labels: labels(&[
                ("model", "m"),
                ("outcome", "completed"),
                ("status", "2xx"),
                ("tenant", tenant),
            ]),
            value: 3.0,
        };
        let refused = Series {
            labels: labels(&[
                ("model", "m"),
                ("outcome", "upstream_refused"),
                ("status", "429"),
                ("tenant", "a"),
            ]),
            value: 2.0,
        };
        let snapshot = Snapshot {
            families: vec![
                family(
                    "tokentap_output_tokens_per_second",
                    // Per model (no `tenant`), and classic only.
                    Values::Histogram(vec![Series {
                        labels: labels(&[("model", "m")]),
                        value: histogram(false),
                    }]),
                ),
                family(
                    "tokentap_requests_total",
                    Values::Counter(vec![requests("a"), refused, requests("b")]),
                ),
                family(
                    "tokentap_time_to_first_token_seconds",
                    Values::Histogram(vec![Series {
                        labels: labels(&[("model", "m"), ("tenant", "a")]),
                        value: histogram(true),
                    }]),
                ),
            ],
        };
        let rows = summarize(&snapshot);
        assert_eq!(rows.len(), 2);
        let (a, b) = (&rows[0], &rows[1]);
        assert_eq!(
            (&*a.tenant, a.requests, a.refused, &*b.tenant, b.requests, b.refused),
            ("a", 5, 2, "b", 3, 0)
        );
        assert_eq!(
            render_verdicts(&snapshot),
            "\noutcomes: completed/2xx 6, upstream_refused/429 2\n"
        );
        // p50 of ten in (0.125, 0.25]: half-way, from the native bucket; the classic
        // estimate is half-way through (0.1, 0.2].
        assert_eq!(a.ttft_p50, Some(0.1875));
        let classic = a.classic_ttft_p99.expect("classic p99");
        assert!((classic - 0.199).abs() < 1e-12, "{classic}");
        // Tenant b has no TTFT of its own.
        assert_eq!((b.ttft_p50, b.classic_ttft_p99), (None, None));
        // The per-model tokens/s (classic only) is every tenant's.
        for row in [a, b] {
            let p50 = row.tokens_per_second_p50.expect("tokens/s p50");
            assert!((p50 - 0.15).abs() < 1e-12, "{p50}");
        }
        let table = render_table(&rows);
        assert!(
            table.contains("187.5") && table.contains("199.0"),
            "{table}"
        );
    }
}
