//! The Prometheus protobuf exposition: what `/metrics` answers a scraper that asks for
//! `application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
//! encoding=delimited` (Prometheus does when native histograms are enabled), because
//! native histograms exist only in this format.
//!
//! The messages are the `io.prometheus.client` definitions of `prometheus/client_model`'s
//! `io/prometheus/client/metrics.proto` (proto2, field numbers as there), written as
//! `prost` derives so that prost does every byte of the wire encoding. The body is each
//! [`MetricFamily`] of a [`Snapshot`], length-delimited, one after the other.
//!
//! A histogram carries its native part (schema, zero bucket, positive spans and deltas)
//! when the snapshot has one, and its classic buckets unless `metrics.native_histograms.
//! classic` is false. Its `sample_count` is the native buckets' total: Prometheus rejects a
//! native histogram whose count differs from its buckets', while the classic buckets,
//! read a moment apart, may differ from it by the observations made in between.
//!
//! Exemplars: each classic bucket carries its latest one (`Bucket.exemplar`; the implicit
//! `+Inf` bucket is written explicitly only when it has one, since Prometheus 2.42 reads
//! exemplars from the classic buckets and ignores the native list), and a native histogram
//! its latest few (`Histogram.exemplars`), each with its `trace_id` and `span_id` labels
//! and its timestamp. With `classic: false` only the native list carries them.

use super::snapshot::{
    Exemplar as ExemplarSnapshot, FamilySnapshot, HistogramSnapshot, Label,
    NativeHistogramSnapshot, Series, Snapshot, Values,
};

/// The `Content-Type` of the exposition (and what a scraper's `Accept` names to get it).
pub const CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Summary = 2,
    Untyped = 3,
    Histogram = 4,
    GaugeHistogram = 5,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Gauge {
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Counter {
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
    #[prost(message, optional, tag = "2")]
    pub exemplar: Option<Exemplar>,
    #[prost(message, optional, tag = "3")]
    pub created_timestamp: Option<Timestamp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    #[prost(uint64, optional, tag = "1")]
    pub sample_count: Option<u64>,
    #[prost(double, optional, tag = "4")]
    pub sample_count_float: Option<f64>,
    #[prost(double, optional, tag = "2")]
    pub sample_sum: Option<f64>,
    /// Classic buckets, increasing `upper_bound`; `+Inf` is optional (left out here).
    #[prost(message, repeated, tag = "3")]
    pub bucket: Vec<Bucket>,
    #[prost(message, optional, tag = "15")]
    pub created_timestamp: Option<Timestamp>,
    #[prost(sint32, optional, tag = "5")]
    pub schema: Option<i32>,
    #[prost(double, optional, tag = "6")]
    pub zero_threshold: Option<f64>,
    #[prost(uint64, optional, tag = "7")]
    pub zero_count: Option<u64>,
    #[prost(double, optional, tag = "8")]
    pub zero_count_float: Option<f64>,
    #[prost(message, repeated, tag = "9")]
    pub negative_span: Vec<BucketSpan>,
    #[prost(sint64, repeated, packed = "false", tag = "10")]
    pub negative_delta: Vec<i64>,
    #[prost(double, repeated, packed = "false", tag = "11")]
    pub negative_count: Vec<f64>,
    #[prost(message, repeated, tag = "12")]
    pub positive_span: Vec<BucketSpan>,
    /// Each bucket's count minus the previous bucket's (the first one's minus zero).
    #[prost(sint64, repeated, packed = "false", tag = "13")]
    pub positive_delta: Vec<i64>,
    #[prost(double, repeated, packed = "false", tag = "14")]
    pub positive_count: Vec<f64>,
    #[prost(message, repeated, tag = "16")]
    pub exemplars: Vec<Exemplar>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    #[prost(uint64, optional, tag = "1")]
    pub cumulative_count: Option<u64>,
    #[prost(double, optional, tag = "4")]
    pub cumulative_count_float: Option<f64>,
    #[prost(double, optional, tag = "2")]
    pub upper_bound: Option<f64>,
    #[prost(message, optional, tag = "3")]
    pub exemplar: Option<Exemplar>,
}

/// A run of consecutive native buckets: `offset` is the gap from the previous span's end
/// (the first span's: its starting index).
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketSpan {
    #[prost(sint32, optional, tag = "1")]
    pub offset: Option<i32>,
    #[prost(uint32, optional, tag = "2")]
    pub length: Option<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Exemplar {
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    #[prost(double, optional, tag = "2")]
    pub value: Option<f64>,
    #[prost(message, optional, tag = "3")]
    pub timestamp: Option<Timestamp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    #[prost(message, optional, tag = "2")]
    pub gauge: Option<Gauge>,
    #[prost(message, optional, tag = "3")]
    pub counter: Option<Counter>,
    /// `Summary` and `Untyped` (tags 4 and 5) are left out: tokentap has neither.
    #[prost(message, optional, tag = "7")]
    pub histogram: Option<Histogram>,
    #[prost(int64, optional, tag = "6")]
    pub timestamp_ms: Option<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricFamily {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub help: Option<String>,
    #[prost(enumeration = "MetricType", optional, tag = "3")]
    pub r#type: Option<i32>,
    #[prost(message, repeated, tag = "4")]
    pub metric: Vec<Metric>,
    #[prost(string, optional, tag = "5")]
    pub unit: Option<String>,
}

/// Every family of `snapshot`, each length-delimited, in the snapshot's (name) order;
/// histograms with their classic buckets only if `classic`.
pub fn encode(snapshot: &Snapshot, classic: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for family in &snapshot.families {
        let message = metric_family(family, classic);
        // Encoding into a Vec grows it as needed: it cannot run out of room.
        let _ = prost::Message::encode_length_delimited(&message, &mut out);
    }
    out
}

/// One family as its message.
pub fn metric_family(family: &FamilySnapshot, classic: bool) -> MetricFamily {
    let (kind, metric) = match &family.values {
        Values::Counter(series) => (MetricType::Counter, metrics(series, counter)),
        Values::Gauge(series) => (MetricType::Gauge, metrics(series, gauge)),
        Values::Histogram(series) => (
            MetricType::Histogram,
            metrics(series, |h| histogram(h, classic)),
        ),
    };
    MetricFamily {
        name: Some(family.name.to_string()),
        help: Some(family.help.to_string()),
        r#type: Some(kind as i32),
        metric,
        unit: None,
    }
}

fn metrics<T>(series: &[Series<T>], value: impl Fn(&T) -> Metric) -> Vec<Metric> {
    series
        .iter()
        .map(|s| Metric {
            label: s.labels.iter().map(label_pair).collect(),
            ..value(&s.value)
        })
        .collect()
}

fn label_pair(label: &Label) -> LabelPair {
    LabelPair {
        name: Some(label.name.to_string()),
        value: Some(label.value.to_string()),
    }
}

fn counter(value: &f64) -> Metric {
    Metric {
        counter: Some(Counter {
            value: Some(*value),
            ..Counter::default()
        }),
        ..Metric::default()
    }
}

fn gauge(value: &f64) -> Metric {
    Metric {
        gauge: Some(Gauge {
            value: Some(*value),
        }),
        ..Metric::default()
    }
}

fn histogram(h: &HistogramSnapshot, classic: bool) -> Metric {
    let mut message = Histogram {
        sample_count: Some(h.native.as_ref().map_or(h.count, |n| n.count())),
        sample_sum: Some(h.sum),
        ..Histogram::default()
    };
    if classic {
        message.bucket = h
            .buckets()
            .enumerate()
            .map(|(slot, (upper_bound, cumulative))| Bucket {
                cumulative_count: Some(cumulative),
                upper_bound: Some(upper_bound),
                exemplar: h.exemplars.get(slot).copied().flatten().map(exemplar),
                ..Bucket::default()
            })
            .collect();
        // An exemplar above every bound belongs to the implicit `+Inf` bucket, which is
        // then written explicitly (as client_golang does): Prometheus 2.42 reads the
        // exemplars of a protobuf scrape from its classic buckets only.
        if let Some(above) = h.exemplars.get(h.bounds.len()).copied().flatten() {
            message.bucket.push(Bucket {
                cumulative_count: Some(h.count),
                upper_bound: Some(f64::INFINITY),
                exemplar: Some(exemplar(above)),
                ..Bucket::default()
            });
        }
    }
    if let Some(native) = &h.native {
        native_part(native, &mut message);
        message.exemplars = h.native_exemplars.iter().copied().map(exemplar).collect();
    }
    Metric {
        histogram: Some(message),
        ..Metric::default()
    }
}

fn exemplar(e: ExemplarSnapshot) -> Exemplar {
    let label = |name: &str, value: String| LabelPair {
        name: Some(name.to_string()),
        value: Some(value),
    };
    Exemplar {
        label: vec![
            label("trace_id", e.trace.trace_id_hex()),
            label("span_id", e.trace.span_id_hex()),
        ],
        value: Some(e.value),
        timestamp: Some(Timestamp {
            seconds: i64::try_from(e.timestamp.as_secs()).unwrap_or(i64::MAX),
            // Below 10^9: it fits.
            nanos: e.timestamp.subsec_nanos() as i32,
        }),
    }
}

/// Schema, zero bucket, and the populated buckets as spans of consecutive indices with
/// the count deltas along them.
fn native_part(native: &NativeHistogramSnapshot, message: &mut Histogram) {
    message.schema = Some(native.schema);
    message.zero_threshold = Some(native.zero_threshold);
    message.zero_count = Some(native.zero_count);
    let mut next_index: Option<i32> = None;
    let mut previous_count = 0u64;
    for &(index, count) in &native.buckets {
        match (next_index, message.positive_span.last_mut()) {
            (Some(next), Some(span)) if next == index => {
                span.length = Some(span.length.unwrap_or(0) + 1);
            }
            _ => message.positive_span.push(BucketSpan {
                offset: Some(next_index.map_or(index, |next| index - next)),
                length: Some(1),
            }),
        }
        message
            .positive_delta
            .push(count.wrapping_sub(previous_count) as i64);
        previous_count = count;
        next_index = Some(index + 1);
    }
    if message.positive_span.is_empty() {
        // Prometheus' marker of a native histogram with no buckets yet.
        message.positive_span.push(BucketSpan {
            offset: Some(0),
            length: Some(0),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::borrow::Cow;
    use std::sync::Arc;

    /// Every length-delimited family of a body.
    fn decode(mut body: &[u8]) -> Vec<MetricFamily> {
        let mut families = Vec::new();
        while !body.is_empty() {
            families.push(MetricFamily::decode_length_delimited(&mut body).expect("a family"));
        }
        families
    }

    /// The native buckets of a decoded histogram, back to `(index, count)`.
    fn native_buckets(h: &Histogram) -> Vec<(i32, u64)> {
        let mut out = Vec::new();
        let mut index = 0i32;
        let mut count = 0i64;
        let mut deltas = h.positive_delta.iter();
        for (n, span) in h.positive_span.iter().enumerate() {
            let offset = span.offset.unwrap_or(0);
            index = if n == 0 { offset } else { index + offset };
            for _ in 0..span.length.unwrap_or(0) {
                count += deltas.next().expect("a delta per bucket");
                out.push((index, u64::try_from(count).expect("counts are positive")));
                index += 1;
            }
        }
        out
    }

    fn sample_snapshot() -> Snapshot {
        let labels = |model: &str| {
            vec![Label {
                name: Cow::Borrowed("model"),
                value: Arc::from(model),
            }]
        };
        Snapshot {
            families: vec![
                FamilySnapshot {
                    name: Cow::Borrowed("a_total"),
                    help: Cow::Borrowed("A counter."),
                    values: Values::Counter(vec![Series {
                        labels: labels("m"),
                        value: 3.0,
                    }]),
                },
                FamilySnapshot {
                    name: Cow::Borrowed("b_seconds"),
                    help: Cow::Borrowed("A histogram."),
                    values: Values::Histogram(vec![Series {
                        labels: labels("m"),
                        value: HistogramSnapshot {
                            bounds: Arc::from(vec![0.1, 1.0]),
                            cumulative_counts: vec![1, 5],
                            count: 6,
                            sum: 4.5,
                            native: Some(NativeHistogramSnapshot {
                                schema: 3,
                                zero_threshold: 2f64.powi(-8),
                                zero_count: 1,
                                buckets: vec![(-20, 1), (-19, 3), (-2, 1)],
                            }),
                            exemplars: Vec::new(),
                            native_exemplars: Vec::new(),
                        },
                    }]),
                },
                FamilySnapshot {
                    name: Cow::Borrowed("c"),
                    help: Cow::Borrowed("A gauge."),
                    values: Values::Gauge(vec![Series {
                        labels: Vec::new(),
                        value: -2.0,
                    }]),
                },
            ],
        }
    }

    #[test]
    fn native_buckets_become_spans_and_deltas() {
        let families = decode(&encode(&sample_snapshot(), true));
        let h = families[1].metric[0]
            .histogram
            .as_ref()
            .expect("a histogram");
        assert_eq!(h.schema, Some(3));
        assert_eq!(h.zero_count, Some(1));
        assert_eq!(h.sample_count, Some(6), "zero bucket + 1 + 3 + 1");
        let spans: Vec<(i32, u32)> = h
            .positive_span
            .iter()
            .map(|s| (s.offset.unwrap_or(0), s.length.unwrap_or(0)))
            .collect();
        assert_eq!(spans, [(-20, 2), (16, 1)]);
        assert_eq!(h.positive_delta, [1, 2, -2]);
        assert_eq!(native_buckets(h), [(-20, 1), (-19, 3), (-2, 1)]);
    }

    /// Decoding what we encode gives back the snapshot, family by family.
    #[test]
    fn the_body_decodes_back_to_the_snapshot() {
        let snapshot = sample_snapshot();
        for classic in [true, false] {
            let families = decode(&encode(&snapshot, classic));
            assert_eq!(families.len(), snapshot.families.len());
            for (decoded, family) in families.iter().zip(&snapshot.families) {
                assert_eq!(decoded.name.as_deref(), Some(&*family.name));
                assert_eq!(decoded.help.as_deref(), Some(&*family.help));
                match &family.values {
                    Values::Counter(series) => {
                        assert_eq!(decoded.r#type, Some(MetricType::Counter as i32));
                        let values: Vec<f64> = decoded
                            .metric
                            .iter()
                            .filter_map(|m| m.counter.as_ref()?.value)
                            .collect();
                        assert_eq!(values, series.iter().map(|s| s.value).collect::<Vec<_>>());
                    }
                    Values::Gauge(series) => {
                        assert_eq!(decoded.r#type, Some(MetricType::Gauge as i32));
                        let values: Vec<f64> = decoded
                            .metric
                            .iter()
                            .filter_map(|m| m.gauge.as_ref()?.value)
                            .collect();
                        assert_eq!(values, series.iter().map(|s| s.value).collect::<Vec<_>>());
                    }
                    Values::Histogram(series) => {
                        assert_eq!(decoded.r#type, Some(MetricType::Histogram as i32));
                        for (metric, s) in decoded.metric.iter().zip(series) {
                            let labels: Vec<(String, String)> = metric
                                .label
                                .iter()
                                .map(|l| (l.name().to_string(), l.value().to_string()))
                                .collect();
                            assert_eq!(labels, [("model".to_string(), "m".to_string())]);
                            let h = metric.histogram.as_ref().expect("a histogram");
                            assert_eq!(h.sample_sum, Some(s.value.sum));
                            let buckets: Vec<(f64, u64)> = h
                                .bucket
                                .iter()
                                .map(|b| (b.upper_bound(), b.cumulative_count()))
                                .collect();
                            let expected: Vec<(f64, u64)> = if classic {
                                s.value.buckets().collect()
                            } else {
                                Vec::new()
                            };
                            assert_eq!(buckets, expected);
                            let native = s.value.native.as_ref().expect("native");
                            assert_eq!(native_buckets(h), native.buckets);
                            assert_eq!(h.zero_threshold, Some(native.zero_threshold));
                        }
                    }
                }
            }
        }
    }

    /// A decoded exemplar as the snapshot's.
    fn exemplar_of(e: &Exemplar) -> ExemplarSnapshot {
        let label = |name: &str| {
            let value = e
                .label
                .iter()
                .find(|l| l.name() == name)
                .expect(name)
                .value();
            hex::decode(value).expect("hex")
        };
        let timestamp = e.timestamp.as_ref().expect("a timestamp");
        ExemplarSnapshot {
            trace: crate::snapshot::TraceContext {
                trace_id: label("trace_id").try_into().expect("16 bytes"),
                span_id: label("span_id").try_into().expect("8 bytes"),
            },
            value: e.value(),
            timestamp: std::time::Duration::new(
                u64::try_from(timestamp.seconds).expect("after the epoch"),
                u32::try_from(timestamp.nanos).expect("nanos"),
            ),
        }
    }

    /// A decoded histogram's finite classic buckets (an explicit `+Inf` bucket is the
    /// snapshot's implicit one).
    fn finite_buckets(h: &Histogram) -> impl Iterator<Item = &Bucket> {
        h.bucket.iter().filter(|b| b.upper_bound().is_finite())
    }

    /// A decoded histogram's classic bucket exemplars as the snapshot holds them: one per
    /// bound and `+Inf` (whose bucket the body carries only with an exemplar), or none.
    fn exemplars_of(h: &Histogram) -> Vec<Option<ExemplarSnapshot>> {
        if h.bucket.iter().all(|b| b.exemplar.is_none()) {
            return Vec::new();
        }
        let above = h
            .bucket
            .iter()
            .find(|b| b.upper_bound() == f64::INFINITY)
            .and_then(|b| b.exemplar.as_ref().map(exemplar_of));
        finite_buckets(h)
            .map(|b| b.exemplar.as_ref().map(exemplar_of))
            .chain([above])
            .collect()
    }

    /// A decoded body as the snapshot it was encoded from.
    fn to_snapshot(families: &[MetricFamily]) -> Snapshot {
        let series = |metric: &Metric| -> Vec<Label> {
            metric
                .label
                .iter()
                .map(|l| Label {
                    name: Cow::Owned(l.name().to_string()),
                    value: Arc::from(l.value()),
                })
                .collect()
        };
        let families = families
            .iter()
            .map(|family| {
                let values = match family.r#type() {
                    MetricType::Counter => Values::Counter(
                        family
                            .metric
                            .iter()
                            .map(|m| Series {
                                labels: series(m),
                                value: m.counter.as_ref().expect("a counter").value(),
                            })
                            .collect(),
                    ),
                    MetricType::Gauge => Values::Gauge(
                        family
                            .metric
                            .iter()
                            .map(|m| Series {
                                labels: series(m),
                                value: m.gauge.as_ref().expect("a gauge").value(),
                            })
                            .collect(),
                    ),
                    MetricType::Histogram => Values::Histogram(
                        family
                            .metric
                            .iter()
                            .map(|m| {
                                let h = m.histogram.as_ref().expect("a histogram");
                                let native = h.schema.map(|schema| NativeHistogramSnapshot {
                                    schema,
                                    zero_threshold: h.zero_threshold(),
                                    zero_count: h.zero_count(),
                                    buckets: native_buckets(h),
                                });
                                Series {
                                    labels: series(m),
                                    value: HistogramSnapshot {
                                        bounds: finite_buckets(h)
                                            .map(|b| b.upper_bound())
                                            .collect(),
                                        cumulative_counts: finite_buckets(h)
                                            .map(|b| b.cumulative_count())
                                            .collect(),
                                        count: h.sample_count(),
                                        sum: h.sample_sum(),
                                        native,
                                        exemplars: exemplars_of(h),
                                        native_exemplars: h
                                            .exemplars
                                            .iter()
                                            .map(exemplar_of)
                                            .collect(),
                                    },
                                }
                            })
                            .collect(),
                    ),
                    other => panic!("tokentap exports no {other:?}"),
                };
                FamilySnapshot {
                    name: Cow::Owned(family.name().to_string()),
                    help: Cow::Owned(family.help().to_string()),
                    values,
                }
            })
            .collect();
        Snapshot { families }
    }

    /// Decoding a real scrape gives back [`Metrics::snapshot`] exactly (the process
    /// collector's families aside: they change from one read to the next).
    #[test]
    fn a_scrape_decodes_back_to_the_metrics_snapshot() {
        use crate::outcome::Verdict;
        use crate::{Metrics, RequestFigures};
        use std::time::Duration;
        let metrics = Metrics::new(&crate::Buckets::default(), &crate::Labels::default());
        for (m, t) in [("a", "x"), ("a", "y"), ("b", "x")] {
            let stream = metrics.stream(Some(m), Some(t));
            for i in 0..50u32 {
                stream.ttft().observe(0.08 + 0.002 * f64::from(i));
            }
            stream.observe_itl(Duration::from_millis(23), 7);
            stream.ttfb().observe(0.0);
            metrics.record_request(
                &stream,
                Verdict::COMPLETED,
                RequestFigures {
                    duration: Duration::from_millis(1500),
                    output_tokens: 8,
                    tpot: Some(Duration::from_millis(23)),
                    tokens_per_second: Some(43.0),
                    ..RequestFigures::default()
                },
            );
        }
        let without_process = |mut snapshot: Snapshot| {
            snapshot
                .families
                .retain(|f| !f.name.starts_with("process_"));
            snapshot
        };
        let decoded = without_process(to_snapshot(&decode(&metrics.protobuf())));
        let snapshot = without_process(metrics.snapshot());
        assert!(snapshot.families.len() > 5);
        assert_eq!(decoded, snapshot);
        let ttft = match &snapshot
            .family("tokentap_time_to_first_token_seconds")
            .expect("TTFT")
            .values
        {
            Values::Histogram(series) => series[0].value.clone(),
            _ => panic!("TTFT is a histogram"),
        };
        let native = ttft.native.expect("native buckets by default");
        assert_eq!((native.schema, native.count()), (3, 50));
    }

    #[test]
    fn an_empty_native_histogram_keeps_the_no_op_span() {
        let h = HistogramSnapshot {
            bounds: Arc::from(vec![1.0]),
            cumulative_counts: vec![0],
            count: 0,
            sum: 0.0,
            native: Some(NativeHistogramSnapshot {
                schema: 3,
                zero_threshold: 0.5,
                zero_count: 0,
                buckets: Vec::new(),
            }),
            exemplars: Vec::new(),
            native_exemplars: Vec::new(),
        };
        let metric = histogram(&h, false);
        let encoded = metric.encode_to_vec();
        let decoded = Metric::decode(&encoded[..]).expect("decodes");
        let h = decoded.histogram.expect("a histogram");
        assert_eq!(
            h.positive_span,
            [BucketSpan {
                offset: Some(0),
                length: Some(0)
            }]
        );
        assert!(h.positive_delta.is_empty() && h.bucket.is_empty());
        assert_eq!(h.sample_count, Some(0));
    }

    /// An exemplar above every classic bound travels in an explicit `+Inf` bucket (the
    /// one place Prometheus 2.42 reads a protobuf scrape's exemplars from), which is
    /// written only then.
    #[test]
    fn an_exemplar_above_every_bound_gets_an_explicit_inf_bucket() {
        let above = ExemplarSnapshot {
            trace: crate::exemplar::TraceContext {
                trace_id: [0xab; 16],
                span_id: [0x01; 8],
            },
            value: 5.5,
            timestamp: std::time::Duration::from_secs(1_733_100_000),
        };
        let with = |exemplars: Vec<Option<ExemplarSnapshot>>| HistogramSnapshot {
            bounds: Arc::from(vec![0.1, 1.0]),
            cumulative_counts: vec![1, 5],
            count: 6,
            sum: 9.0,
            native: None,
            exemplars,
            native_exemplars: Vec::new(),
        };
        let buckets = |h: &HistogramSnapshot| {
            let metric = Metric::decode(&histogram(h, true).encode_to_vec()[..]).expect("decodes");
            metric.histogram.expect("a histogram").bucket
        };

        let plain = buckets(&with(Vec::new()));
        assert_eq!(plain.len(), 2, "no exemplar: no +Inf bucket");
        let in_bucket = buckets(&with(vec![None, Some(above), None]));
        assert_eq!(
            in_bucket.len(),
            2,
            "an exemplar within the bounds: no +Inf bucket"
        );
        assert!(in_bucket[1].exemplar.is_some());

        let inf = buckets(&with(vec![None, None, Some(above)]));
        assert_eq!(inf.len(), 3);
        assert_eq!(inf[2].upper_bound(), f64::INFINITY);
        assert_eq!(
            inf[2].cumulative_count(),
            6,
            "the +Inf bucket counts everything"
        );
        assert_eq!(inf[2].exemplar.as_ref().map(exemplar_of), Some(above));
        assert!(inf[..2].iter().all(|b| b.exemplar.is_none()));
        let h = Histogram {
            bucket: inf,
            ..Histogram::default()
        };
        assert_eq!(exemplars_of(&h), [None, None, Some(above)]);
    }
}
