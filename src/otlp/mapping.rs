//! A [`Snapshot`] as one OTLP `ExportMetricsServiceRequest`: the same families and series
//! `/metrics` shows, in the OpenTelemetry project's generated types (`opentelemetry-proto`),
//! so prost does every byte of the encoding.
//!
//! | snapshot | OTLP |
//! |---|---|
//! | counter | `Sum`, monotonic, cumulative, double points |
//! | gauge | `Gauge`, double points |
//! | histogram with native buckets | `ExponentialHistogram`, cumulative: scale = schema, the same zero bucket |
//! | histogram without | `Histogram` (explicit bounds), cumulative |
//!
//! OTLP gives a metric one point type, so a histogram with native buckets is sent as the
//! exponential histogram alone: its buckets hold the same observations at a finer
//! resolution than the classic ones (which stay on `/metrics` for Prometheus).
//!
//! Bucket indices: Prometheus' native bucket `i` holds `(base^(i-1), base^i]`, OTLP's
//! `(base^i, base^(i+1)]`, with the same `base = 2^(2^-scale)`; so Prometheus' `i` is
//! OTLP's `i - 1`, and the populated sparse buckets become one dense run from the lowest
//! (`offset`) to the highest, gaps as zeros.
//!
//! Labels become attributes of the same names (`model`, `tenant`, `outcome`, ...). An
//! exemplar carries its trace and span id as bytes; its only other attribute would be the
//! series' own labels, which OTLP keeps on the point, so `filtered_attributes` is empty.
//! Every point's start time is the start of the metrics (cumulative temporality).

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    exemplar, exponential_histogram_data_point::Buckets, metric::Data, number_data_point,
    AggregationTemporality, Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge,
    Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::clock::saturating_nanos;
use crate::metrics::gen_ai;
use crate::metrics::snapshot::{
    Exemplar as ExemplarSnapshot, FamilySnapshot, HistogramSnapshot, Label,
    NativeHistogramSnapshot, Series, Snapshot, Values,
};

/// The instrumentation scope every metric is sent under.
pub const SCOPE: &str = "tokentap";

/// What every export of one process shares: who sends (the resource) and since when.
#[derive(Clone, Debug)]
pub struct Origin {
    /// Resource attributes, in the order they are sent.
    pub resource: Vec<(String, String)>,
    /// The start of every cumulative point: when the metrics began counting.
    pub start: SystemTime,
}

/// `snapshot` as read at `now`, as one export request.
pub fn export_request(
    snapshot: &Snapshot,
    origin: &Origin,
    now: SystemTime,
) -> ExportMetricsServiceRequest {
    let times = Times {
        start: unix_nanos(origin.start),
        now: unix_nanos(now),
    };
    let metrics = snapshot
        .families
        .iter()
        .filter(|family| !family.values.is_empty())
        .map(|family| metric(family, times))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: origin
                    .resource
                    .iter()
                    .map(|(key, value)| attribute(key, value))
                    .collect(),
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SCOPE.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

#[derive(Clone, Copy)]
struct Times {
    start: u64,
    now: u64,
}

/// `at` in nanoseconds since the Unix epoch, 0 before it: OTLP's timestamps, metrics' and
/// spans' alike.
pub(super) fn unix_nanos(at: SystemTime) -> u64 {
    saturating_nanos(at.duration_since(UNIX_EPOCH).unwrap_or_default())
}

const CUMULATIVE: i32 = AggregationTemporality::Cumulative as i32;

fn metric(family: &FamilySnapshot, times: Times) -> Metric {
    let data = match &family.values {
        Values::Counter(series) => Data::Sum(Sum {
            data_points: number_points(series, times),
            aggregation_temporality: CUMULATIVE,
            is_monotonic: true,
        }),
        Values::Gauge(series) => Data::Gauge(Gauge {
            data_points: number_points(series, times),
        }),
        Values::Histogram(series) if series.iter().any(|s| s.value.native.is_some()) => {
            Data::ExponentialHistogram(ExponentialHistogram {
                data_points: series
                    .iter()
                    .filter_map(|s| exponential_point(s, times))
                    .collect(),
                aggregation_temporality: CUMULATIVE,
            })
        }
        Values::Histogram(series) => Data::Histogram(Histogram {
            data_points: series.iter().map(|s| explicit_point(s, times)).collect(),
            aggregation_temporality: CUMULATIVE,
        }),
    };
    // A GenAI family goes by its OpenTelemetry name, as an SDK would send it.
    let (name, unit) =
        gen_ai::otel_name(&family.name).unwrap_or((&family.name, unit(&family.name)));
    Metric {
        name: name.to_string(),
        description: family.help.to_string(),
        unit: unit.to_string(),
        data: Some(data),
        ..Default::default()
    }
}

/// The UCUM unit a Prometheus base-unit suffix names (what the collector's Prometheus
/// translation maps back to the same suffix); none for plain counts.
fn unit(name: &str) -> &'static str {
    let name = name.strip_suffix("_total").unwrap_or(name);
    if name.ends_with("_seconds") {
        "s"
    } else if name.ends_with("_bytes") {
        "By"
    } else {
        ""
    }
}

fn number_points(series: &[Series<f64>], times: Times) -> Vec<NumberDataPoint> {
    series
        .iter()
        .map(|s| NumberDataPoint {
            attributes: attributes(&s.labels),
            start_time_unix_nano: times.start,
            time_unix_nano: times.now,
            value: Some(number_data_point::Value::AsDouble(s.value)),
            ..Default::default()
        })
        .collect()
}

fn explicit_point(series: &Series<HistogramSnapshot>, times: Times) -> HistogramDataPoint {
    let h = &series.value;
    // Cumulative `<=` counts to per-bucket counts, the last one (`+Inf`) from the total.
    let mut bucket_counts = Vec::with_capacity(h.bounds.len() + 1);
    let mut below = 0u64;
    for &cumulative in h.cumulative_counts.iter().chain(std::iter::once(&h.count)) {
        bucket_counts.push(cumulative.saturating_sub(below));
        below = below.max(cumulative);
    }
    HistogramDataPoint {
        attributes: attributes(&series.labels),
        start_time_unix_nano: times.start,
        time_unix_nano: times.now,
        count: bucket_counts.iter().sum(),
        sum: Some(h.sum),
        bucket_counts,
        explicit_bounds: h.bounds.to_vec(),
        exemplars: h.exemplars.iter().flatten().map(exemplar).collect(),
        ..Default::default()
    }
}

fn exponential_point(
    series: &Series<HistogramSnapshot>,
    times: Times,
) -> Option<ExponentialHistogramDataPoint> {
    let h = &series.value;
    let native = h.native.as_ref()?;
    Some(ExponentialHistogramDataPoint {
        attributes: attributes(&series.labels),
        start_time_unix_nano: times.start,
        time_unix_nano: times.now,
        // The buckets' own total, so that the point adds up (the classic count was read a
        // moment apart).
        count: native.count(),
        sum: Some(h.sum),
        scale: native.schema,
        zero_count: native.zero_count,
        zero_threshold: native.zero_threshold,
        positive: Some(positive_buckets(native)),
        exemplars: h.native_exemplars.iter().map(exemplar).collect(),
        ..Default::default()
    })
}

/// The sparse Prometheus buckets as OTLP's dense positive run (see the module docs for
/// the index shift).
pub(crate) fn positive_buckets(native: &NativeHistogramSnapshot) -> Buckets {
    let (Some(&(first, _)), Some(&(last, _))) = (native.buckets.first(), native.buckets.last())
    else {
        return Buckets::default();
    };
    let mut bucket_counts = vec![0u64; (i64::from(last) - i64::from(first) + 1) as usize];
    for &(index, count) in &native.buckets {
        bucket_counts[(index - first) as usize] += count;
    }
    Buckets {
        offset: first - 1,
        bucket_counts,
    }
}

fn exemplar(e: &ExemplarSnapshot) -> Exemplar {
    Exemplar {
        time_unix_nano: saturating_nanos(e.timestamp),
        span_id: e.trace.span_id.to_vec(),
        trace_id: e.trace.trace_id.to_vec(),
        value: Some(exemplar::Value::AsDouble(e.value)),
        ..Default::default()
    }
}

fn attributes(labels: &[Label]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|l| attribute(gen_ai::otel_attribute(&l.name).unwrap_or(&l.name), &l.value))
        .collect()
}

fn attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::metrics::snapshot::TraceContext;

    fn label(name: &'static str, value: &str) -> Label {
        Label {
            name: Cow::Borrowed(name),
            value: Arc::from(value),
        }
    }

    fn family(name: &'static str, values: Values) -> FamilySnapshot {
        FamilySnapshot {
            name: Cow::Borrowed(name),
            help: Cow::Borrowed("help"),
            values,
        }
    }

    fn origin() -> Origin {
        Origin {
            resource: vec![("service.name".into(), "tokentap".into())],
            start: UNIX_EPOCH + Duration::from_secs(100),
        }
    }

    fn at() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(160)
    }

    fn trace() -> TraceContext {
        TraceContext {
            trace_id: [0xab; 16],
            span_id: [0x01, 2, 3, 4, 5, 6, 7, 8],
        }
    }

    fn histogram(native: Option<NativeHistogramSnapshot>) -> HistogramSnapshot {
        let exemplar = ExemplarSnapshot {
            trace: trace(),
            value: 0.3,
            timestamp: Duration::from_secs(150),
        };
        HistogramSnapshot {
            bounds: Arc::from(&[0.1, 0.5, 1.0][..]),
            cumulative_counts: vec![2, 5, 5],
            count: 7,
            sum: 9.5,
            native,
            exemplars: vec![None, Some(exemplar), None, None],
            native_exemplars: vec![exemplar],
        }
    }

    fn only_metric(family: FamilySnapshot) -> Metric {
        let request = export_request(
            &Snapshot {
                families: vec![family],
            },
            &origin(),
            at(),
        );
        let resource_metrics = &request.resource_metrics[0];
        let scope = &resource_metrics.scope_metrics[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "tokentap");
        scope.metrics[0].clone()
    }

    #[test]
    fn counters_are_monotonic_cumulative_sums_with_labels_as_attributes() {
        let metric = only_metric(family(
            "tokentap_requests_total",
            Values::Counter(vec![Series {
                labels: vec![label("model", "m"), label("outcome", "completed")],
                value: 42.0,
            }]),
        ));
        let Some(Data::Sum(sum)) = metric.data else {
            panic!("{metric:?}")
        };
        assert!(sum.is_monotonic);
        assert_eq!(sum.aggregation_temporality, CUMULATIVE);
        let point = &sum.data_points[0];
        assert_eq!(point.value, Some(number_data_point::Value::AsDouble(42.0)));
        assert_eq!(point.start_time_unix_nano, 100_000_000_000);
        assert_eq!(point.time_unix_nano, 160_000_000_000);
        let keys: Vec<_> = point.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["model", "outcome"]);
        assert_eq!(metric.unit, "");
    }

    /// A GenAI family is sent under its OpenTelemetry name, unit and attribute names.
    #[test]
    fn gen_ai_families_go_by_their_opentelemetry_names() {
        let metric = only_metric(family(
            "gen_ai_client_token_usage",
            Values::Histogram(vec![Series {
                labels: vec![
                    label("gen_ai_operation_name", "chat"),
                    label("gen_ai_provider_name", "openai"),
                    label("gen_ai_request_model", "m"),
                    label("gen_ai_token_type", "input"),
                ],
                value: histogram(None),
            }]),
        ));
        assert_eq!(metric.name, "gen_ai.client.token.usage");
        assert_eq!(metric.unit, "{token}");
        let Some(Data::Histogram(h)) = metric.data else {
            panic!("{metric:?}")
        };
        let keys: Vec<_> = h.data_points[0]
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "gen_ai.request.model",
                "gen_ai.token.type"
            ]
        );
        let duration = only_metric(family(
            "gen_ai_server_request_duration_seconds",
            Values::Histogram(vec![Series {
                labels: vec![label("error_type", "timeout")],
                value: histogram(None),
            }]),
        ));
        assert_eq!(
            (duration.name.as_str(), duration.unit.as_str()),
            ("gen_ai.server.request.duration", "s")
        );
    }

    #[test]
    fn gauges_are_gauges() {
        let metric = only_metric(family(
            "tokentap_streams_in_flight",
            Values::Gauge(vec![Series {
                labels: vec![],
                value: 3.0,
            }]),
        ));
        let Some(Data::Gauge(gauge)) = metric.data else {
            panic!("{metric:?}")
        };
        assert_eq!(
            gauge.data_points[0].value,
            Some(number_data_point::Value::AsDouble(3.0))
        );
    }

    #[test]
    fn classic_histograms_become_explicit_bucket_histograms_with_exemplars() {
        let metric = only_metric(family(
            "tokentap_time_to_first_token_seconds",
            Values::Histogram(vec![Series {
                labels: vec![label("model", "m")],
                value: histogram(None),
            }]),
        ));
        assert_eq!(metric.unit, "s");
        let Some(Data::Histogram(h)) = metric.data else {
            panic!("{metric:?}")
        };
        assert_eq!(h.aggregation_temporality, CUMULATIVE);
        let point = &h.data_points[0];
        assert_eq!(point.explicit_bounds, [0.1, 0.5, 1.0]);
        // 2 in (0, 0.1], 3 in (0.1, 0.5], none in (0.5, 1], 2 above.
        assert_eq!(point.bucket_counts, [2, 3, 0, 2]);
        assert_eq!(point.count, 7);
        assert_eq!(point.sum, Some(9.5));
        assert_eq!(point.exemplars.len(), 1);
        let exemplar = &point.exemplars[0];
        assert_eq!(exemplar.trace_id, vec![0xab; 16]);
        assert_eq!(exemplar.span_id, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(exemplar.time_unix_nano, 150_000_000_000);
        assert_eq!(exemplar.value, Some(exemplar::Value::AsDouble(0.3)));
    }

    #[test]
    fn native_histograms_become_exponential_ones_with_the_index_shifted() {
        let native = NativeHistogramSnapshot {
            schema: 3,
            zero_threshold: 1e-9,
            zero_count: 1,
            buckets: vec![(-4, 2), (-2, 3), (5, 1)],
        };
        let metric = only_metric(family(
            "tokentap_inter_token_latency_seconds",
            Values::Histogram(vec![Series {
                labels: vec![label("model", "m")],
                value: histogram(Some(native)),
            }]),
        ));
        let Some(Data::ExponentialHistogram(h)) = metric.data else {
            panic!("exponential only when native buckets exist: {metric:?}")
        };
        assert_eq!(h.aggregation_temporality, CUMULATIVE);
        let point = &h.data_points[0];
        assert_eq!(point.scale, 3);
        assert_eq!(point.zero_count, 1);
        assert_eq!(point.zero_threshold, 1e-9);
        assert_eq!(point.count, 7);
        assert_eq!(point.sum, Some(9.5));
        let positive = point.positive.as_ref().unwrap();
        assert_eq!(positive.offset, -5);
        assert_eq!(positive.bucket_counts, [2, 0, 3, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(point.exemplars[0].trace_id, vec![0xab; 16]);
    }

    /// The q-quantile of an OTLP exponential point read the way OTLP defines its buckets
    /// (`(base^i, base^(i+1)]`), interpolated linearly within the bucket as Prometheus does.
    fn otlp_quantile(point: &ExponentialHistogramDataPoint, q: f64) -> f64 {
        let base = 2f64.powf(2f64.powi(-point.scale));
        let rank = q * point.count as f64;
        let positive = point.positive.as_ref().unwrap();
        let mut below = point.zero_count as f64;
        if rank <= below {
            return point.zero_threshold * rank / below;
        }
        for (k, &n) in positive.bucket_counts.iter().enumerate() {
            let index = positive.offset + k as i32;
            let (lower, upper) = (base.powi(index), base.powi(index + 1));
            if n > 0 && below + n as f64 >= rank {
                return lower + (upper - lower) * (rank - below) / n as f64;
            }
            below += n as f64;
        }
        unreachable!("rank past the last bucket")
    }

    #[test]
    fn quantiles_read_from_otlp_buckets_equal_those_read_from_prometheus_ones() {
        for schema in [-2, 0, 3, 8] {
            let native = NativeHistogramSnapshot {
                schema,
                zero_threshold: 2f64.powi(-128),
                zero_count: 3,
                buckets: vec![(-20, 5), (-3, 40), (-2, 30), (1, 17), (9, 5)],
            };
            let mut h = histogram(Some(native.clone()));
            h.sum = 1.0;
            let metric = only_metric(family(
                "tokentap_inter_token_latency_seconds",
                Values::Histogram(vec![Series {
                    labels: vec![],
                    value: h,
                }]),
            ));
            let Some(Data::ExponentialHistogram(otlp)) = metric.data else {
                panic!()
            };
            let point = &otlp.data_points[0];
            for q in [0.01, 0.1, 0.5, 0.9, 0.99, 1.0] {
                let prometheus = native.quantile(q).unwrap();
                let otlp = otlp_quantile(point, q);
                assert!(
                    (prometheus - otlp).abs() <= 1e-12 * prometheus.abs().max(1e-300),
                    "schema {schema} q {q}: prometheus {prometheus} otlp {otlp}"
                );
            }
        }
    }

    #[test]
    fn the_resource_and_the_encoding_round_trip() {
        let request = export_request(&Snapshot { families: vec![] }, &origin(), at());
        let bytes = prost::Message::encode_to_vec(&request);
        let decoded: ExportMetricsServiceRequest = prost::Message::decode(&bytes[..]).unwrap();
        assert_eq!(decoded, request);
        let resource = decoded.resource_metrics[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "service.name");
    }
}
