//! The small families, kept on a `prometheus` registry: process-wide counters and gauges
//! (refusals, OTLP exports, objectives, upstream quotas, ...) and the process collector's
//! `process_*`. Here they are registered, counted and set through [`Metrics`]' methods,
//! and read back as snapshot values; their definitions are in `families.rs`, the
//! per-pair families elsewhere (`series`, `series_sets`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec};

use super::families::BUILD_INFO;
use super::snapshot::{FamilySnapshot, Label, Series, Values};
use super::{defined, gauge_vec, Metrics, StreamSeries};
use tokentap_wire::Unobservable;

/// A family gathered from the prometheus registry, as snapshot values.
pub(super) fn registry_snapshot(family: &proto::MetricFamily) -> Option<FamilySnapshot> {
    let series = |value: fn(&proto::Metric) -> f64| -> Vec<Series<f64>> {
        family
            .get_metric()
            .iter()
            .map(|metric| Series {
                labels: metric
                    .get_label()
                    .iter()
                    .map(|label| Label {
                        name: Cow::Owned(label.name().to_string()),
                        value: Arc::from(label.value()),
                    })
                    .collect(),
                value: value(metric),
            })
            .collect()
    };
    let values = match family.get_field_type() {
        proto::MetricType::COUNTER => Values::Counter(series(|m| m.get_counter().get_value())),
        proto::MetricType::GAUGE => Values::Gauge(series(|m| m.get_gauge().get_value())),
        // Counters and gauges are all the registry holds (tokentap's small families and
        // the process collector's); the snapshot test compares every family with the
        // text, so one of another type would show there.
        _ => return None,
    };
    Some(FamilySnapshot {
        name: Cow::Owned(family.name().to_string()),
        help: Cow::Owned(family.help().to_string()),
        values,
    })
}

impl Metrics {
    /// Register the small families on the registry (with `label_overflow`, which the
    /// label sets count through, and the build's info), and the process collector's on
    /// `process`.
    pub(super) fn register(&self, label_overflow: IntCounterVec) {
        let build_info = gauge_vec(&BUILD_INFO);
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(self.streams_in_flight.clone()),
            Box::new(self.upstream_up.clone()),
            Box::new(self.unobserved.clone()),
            Box::new(self.decode_errors.clone()),
            Box::new(self.passthrough.clone()),
            Box::new(self.overload_rejections.clone()),
            Box::new(self.client_connections.clone()),
            Box::new(self.client_connections_limit.clone()),
            Box::new(self.client_connection_limit_reached.clone()),
            Box::new(self.otlp_exports.clone()),
            Box::new(self.otlp_exports_dropped.clone()),
            Box::new(self.task_restarts.clone()),
            Box::new(self.objective_requests.clone()),
            Box::new(self.objective_output_tokens.clone()),
            Box::new(self.objective_target.clone()),
            Box::new(self.buffered_responses.clone()),
            Box::new(self.usage_detail_tokens.clone()),
            Box::new(label_overflow),
            Box::new(self.rate_limit_limit.clone()),
            Box::new(self.rate_limit_remaining.clone()),
            Box::new(self.retry_after.clone()),
            Box::new(build_info),
        ];
        for collector in collectors {
            defined(self.registry.register(collector));
        }
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            // Best effort: a sandbox without /proc still serves tokentap's own metrics.
            let _ = self.process.register(Box::new(process));
        }
    }

    /// Count a response that is forwarded but not measured.
    pub fn unobserved(&self, reason: Unobservable) {
        self.unobserved.with_label_values(&[reason.as_str()]).inc();
    }

    /// Count skipped (undecodable) events of a dialect.
    pub fn decode_errors(&self, dialect: &str, count: u64) {
        if count > 0 {
            self.decode_errors
                .with_label_values(&[dialect])
                .inc_by(count);
        }
    }

    /// Count a request refused by the in-flight limit.
    pub fn overload_rejection(&self) {
        self.overload_rejections.inc();
    }

    /// Count a time the proxy port stopped accepting at `limits.max_connections`.
    pub fn client_connection_limit_reached(&self) {
        self.client_connection_limit_reached.inc();
    }

    /// Count a finished OTLP export of `signal` (`metrics`, ...): `success` or `failed`.
    pub fn otlp_export(&self, signal: &str, result: &str) {
        self.otlp_exports.with_label_values(&[result, signal]).inc();
    }

    /// Count an OTLP export of `signal` never sent, and why (`replaced`, `shutdown`).
    pub fn otlp_export_dropped(&self, signal: &str, reason: &str) {
        self.otlp_exports_dropped
            .with_label_values(&[reason, signal])
            .inc();
    }

    /// The counter of OTLP exports of `signal` never sent for `reason`, to count without
    /// a label lookup (the span queue's drops, in the request path).
    pub fn otlp_export_dropped_counter(&self, signal: &str, reason: &str) -> IntCounter {
        self.otlp_exports_dropped
            .with_label_values(&[reason, signal])
    }

    /// Count a background task (`supervise`'s name for it) that failed and is restarted.
    pub fn task_restart(&self, task: &str) {
        self.task_restarts.with_label_values(&[task]).inc();
    }

    /// Count a request of `stream` judged against `objective`: met or missed, with its
    /// output tokens.
    pub fn count_objective(
        &self,
        stream: &StreamSeries,
        objective: &str,
        met: bool,
        output_tokens: u64,
    ) {
        let result = if met { "met" } else { "missed" };
        // In the family's label order (the registry writes label names sorted).
        let labels = [&**stream.model(), objective, result, &**stream.tenant()];
        self.objective_requests.with_label_values(&labels).inc();
        if output_tokens > 0 {
            self.objective_output_tokens
                .with_label_values(&labels)
                .inc_by(output_tokens);
        }
    }

    /// Each objective's target, replacing those set before (at start and on reload: an
    /// objective no longer configured leaves `tokentap_objective_target`).
    pub fn set_objective_targets<'a>(&self, targets: impl IntoIterator<Item = (&'a str, f64)>) {
        self.objective_target.reset();
        for (objective, target) in targets {
            self.objective_target
                .with_label_values(&[objective])
                .set(target);
        }
    }

    /// Each model's requests judged against each objective, met and missed, summed over
    /// tenants: what the live view reads once a tick.
    pub fn objective_totals(&self) -> super::ObjectiveTotals {
        super::objective_totals::of(&self.objective_requests)
    }

    /// Count a response of `stream`'s model that arrived in one burst.
    pub fn count_buffered(&self, stream: &StreamSeries) {
        self.buffered_responses
            .with_label_values(&[&**stream.model()])
            .inc();
    }

    /// Count `tokens` of a usage part (`kind`: `cache_read_input`, `cache_write_input`,
    /// `reasoning_output`) of a request of `stream`.
    pub fn count_usage_detail(&self, stream: &StreamSeries, kind: &str, tokens: u64) {
        self.usage_detail_tokens
            .with_label_values(&[kind, &**stream.model(), &**stream.tenant()])
            .inc_by(tokens);
    }

    /// Count a request on a non-LLM route.
    pub fn passthrough(&self) {
        self.passthrough.inc();
    }

    /// The latest quota an upstream reported for `stream`'s model: `resource`'s `limit`
    /// and what `remaining` of it (each only where reported). A value past `i64::MAX`
    /// shows as `i64::MAX`.
    pub fn upstream_quota(
        &self,
        stream: &StreamSeries,
        resource: &str,
        limit: Option<u64>,
        remaining: Option<u64>,
    ) {
        let labels = [&**stream.model(), resource];
        let set = |gauges: &IntGaugeVec, n: u64| {
            gauges
                .with_label_values(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        if let Some(n) = limit {
            set(&self.rate_limit_limit, n);
        }
        if let Some(n) = remaining {
            set(&self.rate_limit_remaining, n);
        }
    }

    /// The latest wait an upstream asked a refused client of `stream`'s model for.
    pub fn upstream_retry_after(&self, stream: &StreamSeries, wait: Duration) {
        self.retry_after
            .with_label_values(&[&**stream.model()])
            .set(wait.as_secs_f64());
    }
}
