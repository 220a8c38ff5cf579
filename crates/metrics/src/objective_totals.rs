//! Each model's requests judged against each objective, met and missed, summed over
//! tenants (`Metrics::objective_totals`): what the live view reads once a tick for its
//! objectives column. The counters
//! are a registry family (`tokentap_objective_requests_total`), not one of the per-pair
//! families a [`super::Snapshot`] of the live view's families holds, so they are read here.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus::core::Collector;
use prometheus::IntCounterVec;

/// Met and missed counts, by model and then objective, in name order.
pub type ObjectiveTotals = BTreeMap<Arc<str>, BTreeMap<Arc<str>, [u64; 2]>>;

/// The totals of `objective_requests`, the family's counters. Cost: one pass over its
/// series (bounded by the label policy and `objectives`' own cap).
pub(super) fn of(objective_requests: &IntCounterVec) -> ObjectiveTotals {
    let mut totals = ObjectiveTotals::new();
    for family in objective_requests.collect() {
        for metric in family.get_metric() {
            let label = |name: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value())
            };
            let (Some(model), Some(objective), Some(result)) =
                (label("model"), label("objective"), label("result"))
            else {
                continue;
            };
            let slot = usize::from(result != "met");
            let count = metric.get_counter().get_value() as u64;
            let counts = totals
                .entry(Arc::from(model))
                .or_default()
                .entry(Arc::from(objective))
                .or_default();
            counts[slot] = counts[slot].saturating_add(count);
        }
    }
    totals
}
