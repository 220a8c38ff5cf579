//! The metric contract of DESIGN.md: families built once from an explicit registry, and
//! per-stream handles resolved once per request so the token path only touches atomics.
//!
//! Names, labels and base units here are shared with the dashboards, the alert rules and
//! the README; change them only together.

pub mod labels;

use std::sync::Arc;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::clock::Timings;
use crate::config::{Buckets, Labels};
use labels::LabelSet;

/// How a request ended. Recorded exactly once per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The response body reached its end (whatever the HTTP status below 500).
    Completed,
    /// The client went away before the end.
    Cancelled,
    /// Connect failure, reset, 5xx status, or an error reported inside the stream.
    UpstreamError,
    /// The response head or a body frame took longer than its timeout.
    Timeout,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Completed,
        Outcome::Cancelled,
        Outcome::UpstreamError,
        Outcome::Timeout,
    ];

    /// The `outcome` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Timeout => "timeout",
        }
    }
}

/// Every metric family tokentap exports.
pub struct Metrics {
    registry: Registry,
    ttfb: HistogramVec,
    ttft: HistogramVec,
    ttft_content: HistogramVec,
    itl: HistogramVec,
    tpot: HistogramVec,
    tokens_per_second: HistogramVec,
    duration: HistogramVec,
    requests: IntCounterVec,
    output_tokens: IntCounterVec,
    input_tokens: IntCounterVec,
    token_counts: IntCounterVec,
    stalls: IntCounterVec,
    /// Requests in flight on LLM routes.
    pub streams_in_flight: IntGauge,
    /// 1 while the readiness probe reaches the upstream.
    pub upstream_up: IntGauge,
    unobserved: IntCounterVec,
    decode_errors: IntCounterVec,
    passthrough: IntCounter,
    overload_rejections: IntCounter,
    models: LabelSet,
    tenants: LabelSet,
    last_render_bytes: std::sync::atomic::AtomicUsize,
}

/// Why a response on an LLM route was passed through without being measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unobserved {
    /// Its content-type is neither an event stream nor JSON.
    ContentType,
    /// It is compressed (`Content-Encoding`); forwarded as it came.
    ContentEncoding,
    /// The decoder gave up (event or body over its bound).
    DecodeLimit,
    /// The decoder failed unexpectedly; the stream went on unobserved.
    ObserverPanic,
}

impl Unobserved {
    const fn as_str(self) -> &'static str {
        match self {
            Unobserved::ContentType => "content_type",
            Unobserved::ContentEncoding => "content_encoding",
            Unobserved::DecodeLimit => "decode_limit",
            Unobserved::ObserverPanic => "observer_panic",
        }
    }
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &["model", "tenant"],
    )
    .expect("static histogram definition is valid")
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("static counter definition is valid")
}

impl Metrics {
    /// Build and register every family. Bucket bounds were validated with the config.
    pub fn new(buckets: &Buckets, labels: &Labels) -> Arc<Metrics> {
        let registry = Registry::new();
        let label_overflow = counter(
            "tokentap_label_overflow_total",
            "Label values folded into `other` by the label policy (cap, allowlist, length).",
            &["label"],
        );
        let build_info = IntGaugeVec::new(
            Opts::new(
                "tokentap_build_info",
                "Always 1; the version label says which tokentap is running.",
            ),
            &["version"],
        )
        .expect("static gauge definition is valid");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);

        let metrics = Metrics {
            ttfb: histogram(
                "tokentap_time_to_first_byte_seconds",
                "From request head received to upstream response head received.",
                &buckets.time_to_first_byte_seconds,
            ),
            ttft: histogram(
                "tokentap_time_to_first_token_seconds",
                "From request head received to the first token-bearing event (any output, reasoning included).",
                &buckets.time_to_first_token_seconds,
            ),
            ttft_content: histogram(
                "tokentap_time_to_first_content_token_seconds",
                "From request head received to the first event with visible (non-reasoning) output.",
                &buckets.time_to_first_token_seconds,
            ),
            itl: histogram(
                "tokentap_inter_token_latency_seconds",
                "Gap between token-bearing events divided by the event's tokens, observed once per token after the first event.",
                &buckets.inter_token_latency_seconds,
            ),
            tpot: histogram(
                "tokentap_time_per_output_token_seconds",
                "Per request: (last event - first event) / (output tokens - first event's tokens).",
                &buckets.time_per_output_token_seconds,
            ),
            tokens_per_second: histogram(
                "tokentap_output_tokens_per_second",
                "Per request decode rate: (output tokens - first event's tokens) / (last event - first event).",
                &buckets.output_tokens_per_second,
            ),
            duration: histogram(
                "tokentap_request_duration_seconds",
                "From request head received to the end of the response (or its failure).",
                &buckets.request_duration_seconds,
            ),
            requests: counter(
                "tokentap_requests_total",
                "Requests on LLM routes by how they ended.",
                &["model", "tenant", "outcome"],
            ),
            output_tokens: counter(
                "tokentap_output_tokens_total",
                "Output tokens: the stream's reported usage when present, else counted per event.",
                &["model", "tenant"],
            ),
            input_tokens: counter(
                "tokentap_input_tokens_total",
                "Input (prompt) tokens from reported usage.",
                &["model", "tenant"],
            ),
            token_counts: counter(
                "tokentap_event_tokens_total",
                "Output tokens counted per event, by whether the wire format gave the count (exact) or it is an estimate (one per event, or the configured tokenizer's count of the event's text).",
                &["model", "tenant", "accuracy"],
            ),
            stalls: counter(
                "tokentap_stream_stalls_total",
                "Inter-token gaps at least as long as the configured stall threshold.",
                &["model", "tenant"],
            ),
            streams_in_flight: IntGauge::new(
                "tokentap_streams_in_flight",
                "Requests on LLM routes currently in flight.",
            )
            .expect("static gauge definition is valid"),
            upstream_up: IntGauge::new(
                "tokentap_upstream_up",
                "1 if the last readiness probe connected to the upstream, else 0.",
            )
            .expect("static gauge definition is valid"),
            unobserved: counter(
                "tokentap_unobserved_responses_total",
                "LLM-route responses forwarded without measurement, by reason.",
                &["reason"],
            ),
            decode_errors: counter(
                "tokentap_decode_errors_total",
                "Events that could not be decoded and were skipped, by dialect.",
                &["dialect"],
            ),
            passthrough: IntCounter::new(
                "tokentap_passthrough_requests_total",
                "Requests on non-LLM routes, forwarded without measurement.",
            )
            .expect("static counter definition is valid"),
            overload_rejections: IntCounter::new(
                "tokentap_overload_rejections_total",
                "Requests answered 503 because limits.max_in_flight requests were in flight.",
            )
            .expect("static counter definition is valid"),
            models: LabelSet::new(
                labels.model.clone(),
                label_overflow.with_label_values(&["model"]),
            ),
            tenants: LabelSet::new(
                labels.tenant.clone(),
                label_overflow.with_label_values(&["tenant"]),
            ),
            registry,
            last_render_bytes: std::sync::atomic::AtomicUsize::new(0),
        };

        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(metrics.ttfb.clone()),
            Box::new(metrics.ttft.clone()),
            Box::new(metrics.ttft_content.clone()),
            Box::new(metrics.itl.clone()),
            Box::new(metrics.tpot.clone()),
            Box::new(metrics.tokens_per_second.clone()),
            Box::new(metrics.duration.clone()),
            Box::new(metrics.requests.clone()),
            Box::new(metrics.output_tokens.clone()),
            Box::new(metrics.input_tokens.clone()),
            Box::new(metrics.token_counts.clone()),
            Box::new(metrics.stalls.clone()),
            Box::new(metrics.streams_in_flight.clone()),
            Box::new(metrics.upstream_up.clone()),
            Box::new(metrics.unobserved.clone()),
            Box::new(metrics.decode_errors.clone()),
            Box::new(metrics.passthrough.clone()),
            Box::new(metrics.overload_rejections.clone()),
            Box::new(label_overflow),
            Box::new(build_info),
        ];
        for collector in collectors {
            metrics
                .registry
                .register(collector)
                .expect("metric names are unique");
        }
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            // Best effort: a sandbox without /proc still serves tokentap's own metrics.
            let _ = metrics.registry.register(Box::new(process));
        }
        Arc::new(metrics)
    }

    /// Handles for one request's label pair, resolved through the label policies.
    pub fn stream(&self, model: Option<&str>, tenant: Option<&str>) -> StreamMetrics {
        let model = self.models.resolve(model);
        let tenant = self.tenants.resolve(tenant);
        let pair = [&*model, &*tenant];
        StreamMetrics {
            ttfb: self.ttfb.with_label_values(&pair),
            ttft: self.ttft.with_label_values(&pair),
            ttft_content: self.ttft_content.with_label_values(&pair),
            itl: self.itl.with_label_values(&pair),
            stalls: self.stalls.with_label_values(&pair),
            model,
            tenant,
        }
    }

    /// Apply new label policies (config reload).
    pub fn set_label_policies(&self, labels: &Labels) {
        self.models.set_policy(labels.model.clone());
        self.tenants.set_policy(labels.tenant.clone());
    }

    /// Count a response that is forwarded but not measured.
    pub fn unobserved(&self, reason: Unobserved) {
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

    /// Count a request on a non-LLM route.
    pub fn passthrough(&self) {
        self.passthrough.inc();
    }

    /// Record the per-request figures of a finished request (exactly once per request).
    pub fn finish(&self, stream: &StreamMetrics, outcome: Outcome, timings: &Timings) {
        let pair = [&*stream.model, &*stream.tenant];
        self.requests
            .with_label_values(&[pair[0], pair[1], outcome.as_str()])
            .inc();
        self.duration
            .with_label_values(&pair)
            .observe(timings.duration.as_secs_f64());
        if timings.output_tokens > 0 {
            self.output_tokens
                .with_label_values(&pair)
                .inc_by(timings.output_tokens);
        }
        if let Some(input) = timings.input_tokens.filter(|n| *n > 0) {
            self.input_tokens.with_label_values(&pair).inc_by(input);
        }
        for (accuracy, count) in [
            ("exact", timings.exact_event_tokens),
            ("estimated", timings.estimated_event_tokens),
        ] {
            if count > 0 {
                self.token_counts
                    .with_label_values(&[pair[0], pair[1], accuracy])
                    .inc_by(count);
            }
        }
        if let Some(decode) = timings.decode {
            self.tpot
                .with_label_values(&pair)
                .observe(decode.tpot.as_secs_f64());
            self.tokens_per_second
                .with_label_values(&pair)
                .observe(decode.tokens_per_second);
        }
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> Vec<u8> {
        // Start at the last exposition's size: with many label pairs it is megabytes,
        // and growing a small buffer there would copy it over and over.
        let previous = self
            .last_render_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut out = Vec::with_capacity(previous.max(64 << 10) + (previous >> 4));
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        self.last_render_bytes
            .store(out.len(), std::sync::atomic::Ordering::Relaxed);
        out
    }

    /// A snapshot of every family (for the demo's summary and for tests).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }

    /// Distinct `model` and `tenant` values admitted so far.
    pub fn admitted_labels(&self) -> (usize, usize) {
        (self.models.admitted(), self.tenants.admitted())
    }
}

/// One request's resolved handles: the per-event path uses only these.
pub struct StreamMetrics {
    pub ttfb: Histogram,
    pub ttft: Histogram,
    pub ttft_content: Histogram,
    pub itl: Histogram,
    pub stalls: IntCounter,
    pub model: Arc<str>,
    pub tenant: Arc<str>,
}

impl StreamMetrics {
    /// Observe `tokens` ITL samples of `per_token` each (one per token of the event).
    pub fn observe_itl(&self, per_token: Duration, tokens: u32) {
        let value = per_token.as_secs_f64();
        for _ in 0..tokens {
            self.itl.observe(value);
        }
    }
}

/// The `q`-quantile of a classic histogram, interpolated linearly within the bucket the
/// way Prometheus' `histogram_quantile` does. `buckets` are `(upper bound, cumulative
/// count)` in increasing order, without `+Inf`; `total` is the count including `+Inf`.
pub fn histogram_quantile(q: f64, buckets: &[(f64, u64)], total: u64) -> Option<f64> {
    if total == 0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = q * total as f64;
    let mut lower_bound = 0.0;
    let mut lower_count = 0u64;
    for &(upper, cumulative) in buckets {
        if cumulative as f64 >= rank && cumulative > lower_count {
            let in_bucket = (cumulative - lower_count) as f64;
            return Some(
                lower_bound + (upper - lower_bound) * (rank - lower_count as f64) / in_bucket,
            );
        }
        lower_bound = upper;
        lower_count = cumulative;
    }
    // The rank falls in the +Inf bucket: Prometheus answers the highest finite bound.
    buckets.last().map(|&(upper, _)| upper)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_like_prometheus() {
        // 10 observations in (0, 0.1], 10 in (0.1, 0.2]: p50 = 0.1, p75 = 0.15.
        let buckets = [(0.1, 10), (0.2, 20), (0.4, 20)];
        assert_eq!(histogram_quantile(0.5, &buckets, 20), Some(0.1));
        assert!((histogram_quantile(0.75, &buckets, 20).unwrap() - 0.15).abs() < 1e-12);
        assert_eq!(histogram_quantile(0.5, &buckets, 0), None);
        // Everything beyond the last bound: the last bound.
        assert_eq!(histogram_quantile(0.99, &[(0.1, 0)], 5), Some(0.1));
    }
}
