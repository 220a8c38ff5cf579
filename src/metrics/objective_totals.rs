//! Each model's requests judged against each objective, met and missed, summed over
//! tenants: what the live view reads once a tick for its objectives column. The counters
//! are a registry family (`tokentap_objective_requests_total`), not one of the per-pair
//! families a [`super::Snapshot`] of the live view's families holds, so they are read here.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus::core::Collector;

use super::Metrics;

/// Met and missed counts, by model and then objective, in name order.
pub type ObjectiveTotals = BTreeMap<Arc<str>, BTreeMap<Arc<str>, [u64; 2]>>;

impl Metrics {
    /// See the module docs. Cost: one pass over the family's series (bounded by the label
    /// policy and `objectives`' own cap), once per live-view tick.
    pub fn objective_totals(&self) -> ObjectiveTotals {
        let mut totals = ObjectiveTotals::new();
        for family in self.objective_requests.collect() {
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
}
