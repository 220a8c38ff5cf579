//! The proof that the direct encoder changed nothing a scraper sees: the same observations
//! go into [`Metrics`] and into prometheus-crate families built the way tokentap built them
//! before (same names, help, labels and buckets), and the two expositions must be equal
//! byte for byte; so must the text the crate writes for [`Metrics::snapshot`] (which
//! proves the snapshot holds every family, series and value the text shows).
//!
//! Both with every family carrying `tenant` (what tokentap exported before
//! `labels.tenant.families`, which must still render exactly as it did) and with the
//! default set, where the crate's families that are per model have only `model`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use prometheus::proto;
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::families::INTER_CHUNK_HELP;
use super::snapshot::{Label, Series, Snapshot, Values};
use super::{Buckets, EngineFigures, LabelPolicy, Labels, Metrics, RequestFigures, StreamSeries};
use crate::outcome::{Outcome, StatusClass, Verdict};

/// The families as the prometheus crate held them.
struct Reference {
    registry: Registry,
    /// The families that carry `tenant`; the others are per model.
    tenant_families: BTreeSet<&'static str>,
    ttfb: HistogramVec,
    ttft: HistogramVec,
    ttft_content: HistogramVec,
    itl: HistogramVec,
    inter_chunk: HistogramVec,
    tpot: HistogramVec,
    tokens_per_second: HistogramVec,
    tokens_per_event: HistogramVec,
    duration: HistogramVec,
    requests: IntCounterVec,
    output_tokens: IntCounterVec,
    input_tokens: IntCounterVec,
    token_counts: IntCounterVec,
    stalls: IntCounterVec,
    engine_queue: HistogramVec,
    engine_prefill: HistogramVec,
    ttft_outside_engine: HistogramVec,
}

/// `labels` without `tenant` unless `name` is one of `tenant_families`.
fn family_labels<'l>(
    tenant_families: &BTreeSet<&str>,
    name: &str,
    labels: &[&'l str],
) -> Vec<&'l str> {
    labels
        .iter()
        .copied()
        .filter(|l| *l != "tenant" || tenant_families.contains(name))
        .collect()
}

fn histogram(
    registry: &Registry,
    tenant_families: &BTreeSet<&str>,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &family_labels(tenant_families, name, &["model", "tenant"]),
    )
    .unwrap();
    registry.register(Box::new(h.clone())).unwrap();
    h
}

fn counter(
    registry: &Registry,
    tenant_families: &BTreeSet<&str>,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let labels = family_labels(tenant_families, name, labels);
    let c = IntCounterVec::new(Opts::new(name, help), &labels).unwrap();
    registry.register(Box::new(c.clone())).unwrap();
    c
}

impl Reference {
    fn new(b: &Buckets, tenant_families: &BTreeSet<&'static str>) -> Reference {
        let r = Registry::new();
        let t = tenant_families;
        let histogram = |name, help, buckets: &[f64]| histogram(&r, t, name, help, buckets);
        let counter = |name, help, labels: &[&str]| counter(&r, t, name, help, labels);
        Reference {
            tenant_families: tenant_families.clone(),
            ttfb: histogram(
                "tokentap_time_to_first_byte_seconds",
                "From request head received to upstream response head received.",
                &b.time_to_first_byte_seconds,
            ),
            ttft: histogram(
                "tokentap_time_to_first_token_seconds",
                "From request head received to the first token-bearing event (any output, reasoning included).",
                &b.time_to_first_token_seconds,
            ),
            ttft_content: histogram(
                "tokentap_time_to_first_content_token_seconds",
                "From request head received to the first event with visible (non-reasoning) output.",
                &b.time_to_first_token_seconds,
            ),
            itl: histogram(
                "tokentap_inter_token_latency_seconds",
                "Gap between token-bearing events divided by the event's tokens, observed once per token after the first event.",
                &b.inter_token_latency_seconds,
            ),
            inter_chunk: histogram(
                "tokentap_inter_chunk_latency_seconds",
                INTER_CHUNK_HELP,
                &b.inter_chunk_latency_seconds,
            ),
            tpot: histogram(
                "tokentap_time_per_output_token_seconds",
                "Per request: (last event - first event) / (output tokens - first event's tokens).",
                &b.time_per_output_token_seconds,
            ),
            tokens_per_second: histogram(
                "tokentap_output_tokens_per_second",
                "Per request decode rate: (output tokens - first event's tokens) / (last event - first event).",
                &b.output_tokens_per_second,
            ),
            tokens_per_event: histogram(
                "tokentap_output_tokens_per_event",
                "Tokens each token-bearing event carried, observed once per event whose count the wire format gave exactly (token ids, logprobs, cumulative usage, TGI): speculative-decoding acceptance and batching.",
                &b.output_tokens_per_event,
            ),
            duration: histogram(
                "tokentap_request_duration_seconds",
                "From request head received to the end of the response (or its failure).",
                &b.request_duration_seconds,
            ),
            requests: counter(
                "tokentap_requests_total",
                "Requests on LLM routes by how they ended (outcome) and what the client was told (status).",
                &["model", "tenant", "outcome", "status"],
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
                "Output tokens by how their per-event count was known: given by the wire format (exact), an estimate (words and symbols of the event's text, or the configured tokenizer's count of the event's text) apportioned from the N the stream reported (apportioned), or an estimate nothing corrected (estimated).",
                &["model", "tenant", "accuracy"],
            ),
            stalls: counter(
                "tokentap_stream_stalls_total",
                "Gaps between token-bearing events at least as long as the configured stall threshold.",
                &["model", "tenant"],
            ),
            engine_queue: histogram(
                "tokentap_engine_queue_seconds",
                "Time the engine says the request waited before it started on it (TensorRT-LLM and hosted APIs' queue time, Ollama's load_duration); per request, where the response reported it.",
                &b.time_to_first_token_seconds,
            ),
            engine_prefill: histogram(
                "tokentap_engine_prefill_seconds",
                "Time the engine says it spent processing the prompt (prefill); per request, where the response reported it.",
                &b.time_to_first_token_seconds,
            ),
            ttft_outside_engine: histogram(
                "tokentap_time_to_first_token_outside_engine_seconds",
                "TTFT minus the engine's own TTFT (its reported first-token time, else its queue plus prefill): time spent outside the engine (network, proxies, the server's request handling); 0 where the engine's is longer. Per streamed request whose response reported it.",
                &b.time_to_first_token_seconds,
            ),
            registry: r,
        }
    }

    /// The label values of `family`'s series for `model` and `tenant`: both if it
    /// carries `tenant`, else the model alone (a sub-label's value goes after them).
    fn pair<'v>(&self, family: &str, model: &'v str, tenant: &'v str) -> Vec<&'v str> {
        if self.tenant_families.contains(family) {
            vec![model, tenant]
        } else {
            vec![model]
        }
    }

    /// What `Metrics::stream` did: the children created up front.
    fn stream(&self, model: &str, tenant: &str) {
        let v = |name: &str| self.pair(name, model, tenant);
        self.ttfb
            .with_label_values(&v("tokentap_time_to_first_byte_seconds"));
        self.ttft
            .with_label_values(&v("tokentap_time_to_first_token_seconds"));
        self.ttft_content
            .with_label_values(&v("tokentap_time_to_first_content_token_seconds"));
        self.itl
            .with_label_values(&v("tokentap_inter_token_latency_seconds"));
        self.inter_chunk
            .with_label_values(&v("tokentap_inter_chunk_latency_seconds"));
        self.stalls
            .with_label_values(&v("tokentap_stream_stalls_total"));
    }

    /// What `Metrics::record_request` did.
    fn finish(&self, model: &str, tenant: &str, verdict: Verdict, timings: &RequestFigures) {
        let v = |name: &str| self.pair(name, model, tenant);
        let mut requests = v("tokentap_requests_total");
        requests.extend([verdict.outcome.as_str(), verdict.status.as_str()]);
        self.requests.with_label_values(&requests).inc();
        self.duration
            .with_label_values(&v("tokentap_request_duration_seconds"))
            .observe(timings.duration.as_secs_f64());
        if timings.output_tokens > 0 {
            self.output_tokens
                .with_label_values(&v("tokentap_output_tokens_total"))
                .inc_by(timings.output_tokens);
        }
        if let Some(input) = timings.input_tokens.filter(|n| *n > 0) {
            self.input_tokens
                .with_label_values(&v("tokentap_input_tokens_total"))
                .inc_by(input);
        }
        for (accuracy, count) in [
            ("exact", timings.exact_event_tokens),
            ("apportioned", timings.apportioned_event_tokens),
            ("estimated", timings.estimated_event_tokens),
        ] {
            if count > 0 {
                let mut values = v("tokentap_event_tokens_total");
                values.push(accuracy);
                self.token_counts.with_label_values(&values).inc_by(count);
            }
        }
        if let Some(tpot) = timings.tpot {
            self.tpot
                .with_label_values(&v("tokentap_time_per_output_token_seconds"))
                .observe(tpot.as_secs_f64());
        }
        if let Some(tokens_per_second) = timings.tokens_per_second {
            self.tokens_per_second
                .with_label_values(&v("tokentap_output_tokens_per_second"))
                .observe(tokens_per_second);
        }
    }

    /// What `Metrics::record_engine_timings` did.
    fn engine(&self, model: &str, tenant: &str, figures: &EngineFigures) {
        let v = |name: &str| self.pair(name, model, tenant);
        for (family, name, figure) in [
            (
                &self.engine_queue,
                "tokentap_engine_queue_seconds",
                figures.queue,
            ),
            (
                &self.engine_prefill,
                "tokentap_engine_prefill_seconds",
                figures.prefill,
            ),
            (
                &self.ttft_outside_engine,
                "tokentap_time_to_first_token_outside_engine_seconds",
                figures.ttft_outside_engine,
            ),
        ] {
            if let Some(d) = figure {
                family.with_label_values(&v(name)).observe(d.as_secs_f64());
            }
        }
    }
}

fn buckets() -> Buckets {
    Buckets {
        time_to_first_byte_seconds: vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0],
        time_to_first_token_seconds: vec![0.005, 0.1, 0.3, 1.0, 3.0, 60.0],
        inter_token_latency_seconds: vec![0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 5.0],
        inter_chunk_latency_seconds: vec![0.001, 0.01, 0.1, 1.0, 5.0, 30.0],
        time_per_output_token_seconds: vec![0.001, 0.01, 0.1, 1.0],
        output_tokens_per_second: vec![1.0, 10.0, 50.0, 100.0, 1000.0, 2000.0],
        output_tokens_per_event: vec![1.0, 2.0, 3.0, 8.0, 64.0],
        request_duration_seconds: vec![0.05, 1.0, 30.0, 1800.0],
    }
}

/// Every family tokentap can put `tenant` on: the label set tokentap exported before
/// `labels.tenant.families`.
fn tenant_everywhere() -> BTreeSet<&'static str> {
    super::tenant_capable().collect()
}

fn metrics(tenant_families: &BTreeSet<&'static str>) -> Arc<Metrics> {
    let policy = LabelPolicy {
        max_values: None,
        allow: None,
        aliases: Default::default(),
        max_value_len: 64,
    };
    Metrics::new(
        &buckets(),
        &Labels {
            model: policy.clone(),
            tenant: policy,
            max_pairs: usize::MAX,
            tenant_families: tenant_families.clone(),
        },
    )
}

/// A value for a histogram with `bounds`: often exactly on a bound, sometimes 0, tiny,
/// huge, or anywhere in between.
fn value(rng: &mut SmallRng, bounds: &[f64]) -> f64 {
    match rng.gen_range(0..10) {
        0..=2 => bounds[rng.gen_range(0..bounds.len())],
        3 => 0.0,
        4 => rng.gen_range(1..1000) as f64 * 1e-9,
        5 => rng.gen_range(1e6..1e12),
        _ => rng.gen_range(0.0..bounds[bounds.len() - 1] * 2.0),
    }
}

fn seconds(v: f64) -> Duration {
    Duration::try_from_secs_f64(v).expect("a generated value fits a Duration")
}

fn without_process(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !(l.starts_with("process_")
                || l.starts_with("# HELP process_")
                || l.starts_with("# TYPE process_"))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Panics at the first different line (the whole texts are too long to print).
fn assert_same(actual: &str, expected: &str) {
    for (i, (a, e)) in actual.lines().zip(expected.lines()).enumerate() {
        assert_eq!(a, e, "line {}", i + 1);
    }
    assert_eq!(actual.lines().count(), expected.lines().count());
    assert_eq!(actual, expected);
}

/// The reference exposition: tokentap's small families (still on its registry) plus the
/// reference families, sorted by name and encoded by the crate's `TextEncoder`.
fn expected(metrics: &Metrics, reference: &Reference) -> String {
    let mut families = metrics.registry.gather();
    families.extend(reference.registry.gather());
    families.retain(|f| !f.name().starts_with("process_"));
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&families, &mut out)
        .unwrap();
    String::from_utf8(out).unwrap()
}

fn actual(metrics: &Metrics) -> String {
    without_process(&String::from_utf8(metrics.render()).unwrap())
}

/// The snapshot as the prometheus crate's own model of a family, for its encoder.
fn proto_families(snapshot: &Snapshot) -> Vec<proto::MetricFamily> {
    fn metric<T>(series: &Series<T>) -> proto::Metric {
        let labels = series
            .labels
            .iter()
            .map(|Label { name, value }| {
                let mut pair = proto::LabelPair::default();
                pair.set_name(name.to_string());
                pair.set_value(value.to_string());
                pair
            })
            .collect();
        proto::Metric::from_label(labels)
    }
    let mut families = Vec::new();
    for family in &snapshot.families {
        let mut out = proto::MetricFamily::default();
        out.set_name(family.name.to_string());
        out.set_help(family.help.to_string());
        let metrics = match &family.values {
            Values::Counter(series) => {
                out.set_field_type(proto::MetricType::COUNTER);
                let counter = |s: &Series<f64>| {
                    let mut m = metric(s);
                    let mut counter = proto::Counter::default();
                    counter.set_value(s.value);
                    m.set_counter(counter);
                    m
                };
                series.iter().map(counter).collect()
            }
            Values::Gauge(series) => {
                out.set_field_type(proto::MetricType::GAUGE);
                let gauge = |s: &Series<f64>| {
                    let mut m = metric(s);
                    let mut gauge = proto::Gauge::default();
                    gauge.set_value(s.value);
                    m.set_gauge(gauge);
                    m
                };
                series.iter().map(gauge).collect()
            }
            Values::Histogram(series) => {
                out.set_field_type(proto::MetricType::HISTOGRAM);
                let histogram = |s: &Series<super::snapshot::HistogramSnapshot>| {
                    let mut m = metric(s);
                    let mut histogram = proto::Histogram::default();
                    histogram.set_sample_count(s.value.count);
                    histogram.set_sample_sum(s.value.sum);
                    let buckets = s
                        .value
                        .buckets()
                        .map(|(upper_bound, cumulative_count)| {
                            let mut bucket = proto::Bucket::default();
                            bucket.set_upper_bound(upper_bound);
                            bucket.set_cumulative_count(cumulative_count);
                            bucket
                        })
                        .collect();
                    histogram.set_bucket(buckets);
                    m.set_histogram(histogram);
                    m
                };
                series.iter().map(histogram).collect()
            }
        };
        out.set_metric(metrics);
        families.push(out);
    }
    families
}

fn gathered(metrics: &Metrics) -> String {
    let mut families = proto_families(&metrics.snapshot());
    families.retain(|f| !f.name().starts_with("process_"));
    prometheus::TextEncoder::new()
        .encode_to_string(&families)
        .unwrap()
}

#[test]
fn the_exposition_is_byte_for_byte_what_the_prometheus_crate_wrote() {
    let text = same_as_the_prometheus_crate(&tenant_everywhere());
    assert!(text.contains(r#"model="say \"hi\"""#), "escaped quote");
    assert!(text.contains(r#"tenant="b\"\\c""#), "escaped backslash");
    assert!(text.contains(r#"model="multi\nline",tenant="t\n\"x\"""#));
    assert!(text.contains(r#"le="+Inf""#));
}

/// The same with the default `labels.tenant.families`: the crate's families that are per
/// model are built with `model` alone, and tokentap's must render exactly as they do.
#[test]
fn the_default_label_set_is_byte_for_byte_what_the_prometheus_crate_writes() {
    let defaults = Labels::default_tenant_families();
    assert!(defaults.len() < tenant_everywhere().len());
    let text = same_as_the_prometheus_crate(&defaults);
    assert!(text.contains(r#"tokentap_time_to_first_byte_seconds_count{model="say \"hi\""} "#));
    assert!(text.contains(
        r#"tokentap_time_to_first_token_seconds_count{model="multi\nline",tenant="t\n\"x\""} "#
    ));
    assert!(!text.contains("tokentap_request_duration_seconds_count{model=\"multi\\nline\",tenant"));
    // No family carries `tenant` at all.
    let text = same_as_the_prometheus_crate(&BTreeSet::new());
    assert!(!text.contains("tenant="), "{text}");
    assert!(text.contains(r#"tokentap_requests_total{model="a",outcome="#));
}

/// One step's live observations of a pair, as its events would make them, on both sides.
fn observe_events(
    rng: &mut SmallRng,
    b: &Buckets,
    handles: &StreamSeries,
    reference: &Reference,
    (m, t): (&str, &str),
) {
    let pair = |family: &str| reference.pair(family, m, t);
    if rng.gen_bool(0.7) {
        let v = value(rng, &b.time_to_first_byte_seconds);
        handles.ttfb().observe(v);
        reference
            .ttfb
            .with_label_values(&pair("tokentap_time_to_first_byte_seconds"))
            .observe(v);
    }
    if rng.gen_bool(0.6) {
        let v = value(rng, &b.time_to_first_token_seconds);
        handles.ttft().observe(v);
        reference
            .ttft
            .with_label_values(&pair("tokentap_time_to_first_token_seconds"))
            .observe(v);
    }
    if rng.gen_bool(0.3) {
        let v = value(rng, &b.time_to_first_token_seconds);
        handles.ttft_content().observe(v);
        reference
            .ttft_content
            .with_label_values(&pair("tokentap_time_to_first_content_token_seconds"))
            .observe(v);
    }
    if rng.gen_bool(0.5) {
        let v = value(rng, &b.inter_token_latency_seconds);
        let tokens = rng.gen_range(0..5);
        handles.observe_itl(seconds(v), tokens);
        let itl = reference
            .itl
            .with_label_values(&pair("tokentap_inter_token_latency_seconds"));
        for _ in 0..tokens {
            itl.observe(seconds(v).as_secs_f64());
        }
    }
    if rng.gen_bool(0.4) {
        let v = value(rng, &b.inter_chunk_latency_seconds);
        handles.inter_chunk().observe(v);
        reference
            .inter_chunk
            .with_label_values(&pair("tokentap_inter_chunk_latency_seconds"))
            .observe(v);
    }
    if rng.gen_bool(0.4) {
        // An exact event's token count: a small integer, sometimes past every bound.
        let v = f64::from(rng.gen_range(1..100u32));
        handles.tokens_per_event().observe(v);
        reference
            .tokens_per_event
            .with_label_values(&pair("tokentap_output_tokens_per_event"))
            .observe(v);
    }
    if rng.gen_bool(0.1) {
        handles.stalls().inc();
        reference
            .stalls
            .with_label_values(&pair("tokentap_stream_stalls_total"))
            .inc();
    }
}

/// A finished request's random verdict and figures.
fn random_request(rng: &mut SmallRng, b: &Buckets) -> (Verdict, RequestFigures) {
    let verdict = Verdict::ALL[rng.gen_range(0..Verdict::COUNT)];
    let decode = rng.gen_bool(0.7).then(|| {
        (
            seconds(value(rng, &b.time_per_output_token_seconds)),
            value(rng, &b.output_tokens_per_second),
        )
    });
    let exact = if rng.gen_bool(0.5) {
        rng.gen_range(0..100)
    } else {
        0
    };
    let estimated = if rng.gen_bool(0.3) {
        rng.gen_range(0..100)
    } else {
        0
    };
    let apportioned = if rng.gen_bool(0.3) {
        rng.gen_range(0..100)
    } else {
        0
    };
    let timings = RequestFigures {
        apportioned_event_tokens: apportioned,
        duration: seconds(value(rng, &b.request_duration_seconds)),
        output_tokens: if rng.gen_bool(0.8) {
            rng.gen_range(0..5000)
        } else {
            0
        },
        exact_event_tokens: exact,
        estimated_event_tokens: estimated,
        input_tokens: match rng.gen_range(0..3) {
            0 => None,
            1 => Some(0),
            _ => Some(rng.gen_range(0..1 << 40)),
        },
        tpot: decode.map(|(tpot, _)| tpot),
        tokens_per_second: decode.map(|(_, tokens_per_second)| tokens_per_second),
        exemplar: None,
    };
    (verdict, timings)
}

/// Random observations of every family over many pairs (odd label values among them),
/// compared with the reference after every few steps; the final text, for the caller's
/// own checks.
fn same_as_the_prometheus_crate(tenant_families: &BTreeSet<&'static str>) -> String {
    let metrics = metrics(tenant_families);
    let reference = Reference::new(&buckets(), tenant_families);
    let b = buckets();
    assert_same(&actual(&metrics), &expected(&metrics, &reference));

    // Raw values as a request carries them (`None`: missing, becomes `unknown`); the
    // resolved values are what both sides see. Quotes and backslashes pass the label
    // policy; a newline never does, so that pair is made below the policy.
    let models = [
        Some("gpt-4o"),
        Some("llama-3.1-8b"),
        Some("say \"hi\""),
        Some("back\\slash\\"),
        Some("zz-last"),
        Some("a"),
        None,
    ];
    let tenants = [Some("acme"), Some("b\"\\c"), Some("tenant-10"), None];
    let mut pairs: Vec<(StreamSeries, Arc<str>, Arc<str>)> = Vec::new();
    let newline = metrics.pair(Arc::from("multi\nline"), Arc::from("t\n\"x\""));
    pairs.push((
        newline.clone(),
        newline.model().clone(),
        newline.tenant().clone(),
    ));
    reference.stream(newline.model(), newline.tenant());

    let mut rng = SmallRng::seed_from_u64(0x70c3);
    for step in 0..4000 {
        let model = models[rng.gen_range(0..models.len())];
        let tenant = tenants[rng.gen_range(0..tenants.len())];
        let handles = if step % 5 == 0 || pairs.is_empty() {
            let handles = metrics.stream(model, tenant);
            reference.stream(handles.model(), handles.tenant());
            let (m, t) = (handles.model().clone(), handles.tenant().clone());
            pairs.push((handles, m, t));
            pairs.len() - 1
        } else {
            rng.gen_range(0..pairs.len())
        };
        let (handles, m, t) = &pairs[handles];
        observe_events(&mut rng, &b, handles, &reference, (m, t));
        if rng.gen_bool(0.6) {
            let (verdict, timings) = random_request(&mut rng, &b);
            metrics.record_request(handles, verdict, timings);
            reference.finish(m, t, verdict, &timings);
        }
        if rng.gen_bool(0.2) {
            let mut figure = || {
                rng.gen_bool(0.7)
                    .then(|| seconds(value(&mut rng, &b.time_to_first_token_seconds)))
            };
            let figures = EngineFigures {
                queue: figure(),
                prefill: figure(),
                ttft_outside_engine: figure(),
            };
            metrics.record_engine_timings(handles, figures);
            reference.engine(m, t, &figures);
        }
        if step % 997 == 0 {
            assert_same(&actual(&metrics), &expected(&metrics, &reference));
        }
    }

    // The small families keep their place in the name order.
    metrics.passthrough();
    metrics.overload_rejection();
    metrics.unobserved(tokentap_wire::Unobservable::ContentType);
    metrics.decode_errors("openai_chat", 3);
    metrics.streams_in_flight.set(2);
    metrics.upstream_up.set(1);

    let text = actual(&metrics);
    assert_same(&text, &expected(&metrics, &reference));
    assert_same(&gathered(&metrics), &text);
    text
}

/// Counters, sums and cumulative counts past 2^53, and sums that are not finite, print as
/// the crate printed the `f64` it converted them to.
#[test]
fn extreme_values_match_too() {
    let tenant_families = tenant_everywhere();
    let metrics = metrics(&tenant_families);
    let reference = Reference::new(&buckets(), &tenant_families);
    let handles = metrics.stream(Some("m"), Some("t"));
    let pair = ["m", "t"];
    reference.stream("m", "t");
    for v in [1e300, 1e300, 5e-324, 0.1, 0.2] {
        handles.ttfb().observe(v);
        reference.ttfb.with_label_values(&pair).observe(v);
    }
    handles.ttft().observe(f64::INFINITY);
    reference
        .ttft
        .with_label_values(&pair)
        .observe(f64::INFINITY);
    handles.stalls().inc_by((1 << 53) + 1);
    reference
        .stalls
        .with_label_values(&pair)
        .inc_by((1 << 53) + 1);
    let timings = RequestFigures {
        duration: Duration::MAX,
        output_tokens: u64::MAX,
        exact_event_tokens: 0,
        apportioned_event_tokens: 3,
        estimated_event_tokens: 12345678901234567,
        input_tokens: Some(u64::MAX - 1),
        tpot: Some(Duration::from_nanos(1)),
        tokens_per_second: Some(1e15),
        exemplar: None,
    };
    let timeout = Verdict::new(Outcome::Timeout, StatusClass::Success);
    metrics.record_request(&handles, timeout, timings);
    reference.finish("m", "t", timeout, &timings);
    let text = actual(&metrics);
    assert_same(&text, &expected(&metrics, &reference));
    assert_same(&gathered(&metrics), &text);
}
