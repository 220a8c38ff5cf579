//! The metric contract of DESIGN.md: families built once from an explicit registry, and
//! per-stream handles resolved once per request so the token path only touches atomics.
//!
//! Names, labels and base units here are shared with the dashboards, the alert rules and
//! the README; change them only together.
//!
//! The per-(model, tenant) families are kept in tokentap's own atomics (`series`) and
//! written straight to text (`exposition`): with thousands of label pairs the prometheus
//! crate's snapshot-then-encode made each scrape take most of a second. The text is the
//! same byte for byte (`equivalence` proves it against the crate).

pub mod buckets;
#[cfg(test)]
mod equivalence;
mod exposition;
pub mod labels;
mod series;

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use bytes::Bytes;
use prometheus::core::Collector;
use prometheus::proto;
use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::clock::Timings;
use crate::config::{Buckets, Labels};
use crate::wire::Unobservable;
use exposition::{Cursor, Family, Snapshot};
use labels::{LabelSet, PairCap};
use series::Bounds;
pub use series::{Counter, Histogram, PairSeries};

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
    /// The client's own request was at fault (a malformed or stalled body, duplicate
    /// `Host`): tokentap answered 4xx itself and the upstream is not to blame.
    ClientError,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Completed,
        Outcome::Cancelled,
        Outcome::UpstreamError,
        Outcome::Timeout,
        Outcome::ClientError,
    ];

    /// The `outcome` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Timeout => "timeout",
            Outcome::ClientError => "client_error",
        }
    }
}

/// model -> tenant -> series.
type PairMap = BTreeMap<Arc<str>, BTreeMap<Arc<str>, Arc<PairSeries>>>;

/// Every metric family tokentap exports.
///
/// The per-(model, tenant) families live in [`PairSeries`] (one per pair, written straight
/// to text by `exposition`); the few small families stay on a prometheus registry.
pub struct Metrics {
    registry: Registry,
    bounds: Bounds,
    /// model -> tenant -> series: ordered as the exposition lists them.
    pairs: RwLock<PairMap>,
    /// The per-pair families, sorted by name.
    families: Vec<Family>,
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
    pair_cap: PairCap,
    last_render_bytes: AtomicUsize,
}

/// Bucket bounds as the prometheus crate took them: none means its defaults, a trailing
/// `+Inf` is implicit. The config validated them; a bad set is a programming error.
fn bounds(buckets: &[f64]) -> Arc<[f64]> {
    let mut bounds = if buckets.is_empty() {
        prometheus::DEFAULT_BUCKETS.to_vec()
    } else {
        buckets.to_vec()
    };
    if bounds.last().is_some_and(|b| *b == f64::INFINITY) {
        bounds.pop();
    }
    assert!(
        bounds.windows(2).all(|w| w[0] < w[1]),
        "histogram buckets must be in increasing order"
    );
    Arc::from(bounds)
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
            "Label values folded into `other` by the label policy (cap, allowlist, length); label=\"pair\": new (model, tenant) pairs folded into (other, other) by labels.max_pairs.",
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

        let bounds = Bounds {
            ttfb: bounds(&buckets.time_to_first_byte_seconds),
            ttft: bounds(&buckets.time_to_first_token_seconds),
            itl: bounds(&buckets.inter_token_latency_seconds),
            tpot: bounds(&buckets.time_per_output_token_seconds),
            tokens_per_second: bounds(&buckets.output_tokens_per_second),
            duration: bounds(&buckets.request_duration_seconds),
        };
        let mut families = vec![
            Family::histogram(
                "tokentap_time_to_first_byte_seconds",
                "From request head received to upstream response head received.",
                &bounds.ttfb,
                |p| &p.ttfb,
                true,
            ),
            Family::histogram(
                "tokentap_time_to_first_token_seconds",
                "From request head received to the first token-bearing event (any output, reasoning included).",
                &bounds.ttft,
                |p| &p.ttft,
                true,
            ),
            Family::histogram(
                "tokentap_time_to_first_content_token_seconds",
                "From request head received to the first event with visible (non-reasoning) output.",
                &bounds.ttft,
                |p| &p.ttft_content,
                true,
            ),
            Family::histogram(
                "tokentap_inter_token_latency_seconds",
                "Gap between token-bearing events divided by the event's tokens, observed once per token after the first event.",
                &bounds.itl,
                |p| &p.itl,
                true,
            ),
            Family::histogram(
                "tokentap_time_per_output_token_seconds",
                "Per request: (last event - first event) / (output tokens - first event's tokens).",
                &bounds.tpot,
                |p| &p.tpot,
                false,
            ),
            Family::histogram(
                "tokentap_output_tokens_per_second",
                "Per request decode rate: (output tokens - first event's tokens) / (last event - first event).",
                &bounds.tokens_per_second,
                |p| &p.tokens_per_second,
                false,
            ),
            Family::histogram(
                "tokentap_request_duration_seconds",
                "From request head received to the end of the response (or its failure).",
                &bounds.duration,
                |p| &p.duration,
                false,
            ),
            Family::requests(
                "tokentap_requests_total",
                "Requests on LLM routes by how they ended.",
            ),
            Family::counter(
                "tokentap_output_tokens_total",
                "Output tokens: the stream's reported usage when present, else counted per event.",
                |p| &p.output_tokens,
                false,
            ),
            Family::counter(
                "tokentap_input_tokens_total",
                "Input (prompt) tokens from reported usage.",
                |p| &p.input_tokens,
                false,
            ),
            Family::event_tokens(
                "tokentap_event_tokens_total",
                "Output tokens counted per event, by whether the wire format gave the count (exact) or it is an estimate (one per event, or the configured tokenizer's count of the event's text).",
            ),
            Family::counter(
                "tokentap_stream_stalls_total",
                "Inter-token gaps at least as long as the configured stall threshold.",
                |p| &p.stalls,
                true,
            ),
        ];
        families.sort_by_key(|f| f.name);

        let metrics = Metrics {
            bounds,
            pairs: RwLock::new(BTreeMap::new()),
            families,
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
            pair_cap: PairCap::new(
                labels.max_pairs,
                label_overflow.with_label_values(&["pair"]),
            ),
            registry,
            last_render_bytes: AtomicUsize::new(0),
        };

        let collectors: Vec<Box<dyn Collector>> = vec![
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

    /// Handles for one request's label pair, resolved through the label policies. The
    /// pair's series exist from here on (TTFB, TTFT, ITL and stalls even if never observed).
    pub fn stream(&self, model: Option<&str>, tenant: Option<&str>) -> StreamMetrics {
        let model = self.models.resolve(model);
        let tenant = self.tenants.resolve(tenant);
        StreamMetrics(self.pair(model, tenant))
    }

    /// The series of a pair of (already resolved) label values, created on first use.
    fn pair(&self, model: Arc<str>, tenant: Arc<str>) -> Arc<PairSeries> {
        if let Some(found) = self.read_pairs().get(&*model).and_then(|t| t.get(&*tenant)) {
            return found.clone();
        }
        let mut pairs = self
            .pairs
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = pairs.get(&*model).and_then(|t| t.get(&*tenant)) {
            return found.clone();
        }
        let (model, tenant) = if self.pair_cap.admit() {
            (model, tenant)
        } else {
            (Arc::from(labels::OTHER), Arc::from(labels::OTHER))
        };
        pairs
            .entry(model.clone())
            .or_default()
            .entry(tenant.clone())
            .or_insert_with(|| Arc::new(PairSeries::new(model, tenant, &self.bounds)))
            .clone()
    }

    fn read_pairs(&self) -> RwLockReadGuard<'_, PairMap> {
        self.pairs
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every pair, in label order, taken under the lock once per scrape; the encoding
    /// then runs without it.
    fn snapshot(&self) -> Snapshot {
        let map = self.read_pairs();
        let mut pairs = Vec::with_capacity(map.values().map(BTreeMap::len).sum());
        let mut models = Vec::with_capacity(map.len());
        for tenants in map.values() {
            let start = pairs.len();
            pairs.extend(tenants.values().cloned());
            models.push(start..pairs.len());
        }
        Snapshot { pairs, models }
    }

    /// Apply new label policies (config reload).
    pub fn set_label_policies(&self, labels: &Labels) {
        self.models.set_policy(labels.model.clone());
        self.tenants.set_policy(labels.tenant.clone());
        self.pair_cap.set_max(labels.max_pairs);
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

    /// Count a request on a non-LLM route.
    pub fn passthrough(&self) {
        self.passthrough.inc();
    }

    /// Record the per-request figures of a finished request (exactly once per request).
    pub fn finish(&self, stream: &StreamMetrics, outcome: Outcome, timings: &Timings) {
        let pair = &stream.0;
        pair.requests(outcome).inc();
        pair.duration.observe(timings.duration.as_secs_f64());
        if timings.output_tokens > 0 {
            pair.output_tokens.inc_by(timings.output_tokens);
        }
        if let Some(input) = timings.input_tokens.filter(|n| *n > 0) {
            pair.input_tokens.inc_by(input);
        }
        // Indexed like `series::ACCURACY`.
        for (counter, count) in pair
            .event_tokens
            .iter()
            .zip([timings.estimated_event_tokens, timings.exact_event_tokens])
        {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        if let Some(decode) = timings.decode {
            pair.tpot.observe(decode.tpot.as_secs_f64());
            pair.tokens_per_second.observe(decode.tokens_per_second);
        }
    }

    /// The Prometheus text exposition of every family, sorted by family name, in one
    /// buffer (tests, the demo's summary, benches). `/metrics` streams the same text as
    /// [`Metrics::exposition`] chunks instead.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.render_into(&mut out);
        out
    }

    /// [`Metrics::render`], appended to `out`.
    pub fn render_into(&self, out: &mut Vec<u8>) {
        let mut render = Render::new(self);
        // One allocation: with many label pairs the text is megabytes, and growing a
        // buffer would copy it over and over.
        let snapshot = &render.snapshot;
        let label_bytes = snapshot.pairs.iter().map(|p| p.labels().len()).sum();
        let estimate: usize = self
            .families
            .iter()
            .map(|f| f.estimate(snapshot.pairs.len(), label_bytes))
            .sum();
        let previous = self.last_render_bytes.load(Ordering::Relaxed);
        out.reserve(estimate.max(previous + (previous >> 4)) + (64 << 10));
        let start = out.len();
        render.fill(self, out, usize::MAX);
        self.last_render_bytes
            .store(out.len() - start, Ordering::Relaxed);
    }

    /// The text of [`Metrics::render`] as `Bytes` chunks of about [`CHUNK_BYTES`], each
    /// rendered only when it is asked for (what `/metrics` serves). The pairs are listed
    /// once, here; their values are read as each chunk is rendered.
    pub fn exposition(self: &Arc<Self>) -> Exposition {
        Exposition {
            render: Some(Render::new(self)),
            metrics: self.clone(),
        }
    }

    /// A snapshot of every family as the prometheus registry gives it (for the demo's
    /// summary and for tests): the same series and order as [`Metrics::render`].
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        let snapshot = self.snapshot();
        let mut families = self.registry.gather();
        families.extend(self.families.iter().filter_map(|f| f.proto(&snapshot)));
        families.sort_by(|a, b| a.name().cmp(b.name()));
        families
    }

    /// Distinct `model` and `tenant` values admitted so far.
    pub fn admitted_labels(&self) -> (usize, usize) {
        (self.models.admitted(), self.tenants.admitted())
    }
}

/// One request's resolved handles: the per-event path uses only these atomics.
#[derive(Clone)]
pub struct StreamMetrics(Arc<PairSeries>);

impl Deref for StreamMetrics {
    type Target = PairSeries;

    fn deref(&self) -> &PairSeries {
        &self.0
    }
}

impl StreamMetrics {
    /// Observe `tokens` ITL samples of `per_token` each (one per token of the event).
    pub fn observe_itl(&self, per_token: Duration, tokens: u32) {
        let value = per_token.as_secs_f64();
        for _ in 0..tokens {
            self.0.itl.observe(value);
        }
    }
}

/// The target size of an [`Exposition`] chunk. A chunk ends after the pair whose lines
/// reach it, so it may exceed it by one pair's lines (and a family header): a few KiB.
pub const CHUNK_BYTES: usize = 48 << 10;

/// What a chunk's buffer starts with: room for the overshoot, and under glibc's 128 KiB
/// `M_MMAP_THRESHOLD`, so chunks come from (and go back to) the heap instead of each
/// mapping fresh pages that the kernel must fault in and zero.
const CHUNK_CAPACITY: usize = 64 << 10;

/// The `/metrics` text rendered a chunk at a time, so that a scrape with thousands of label
/// pairs never holds the whole text (150 MB with 10,000 pairs) and the worker that renders
/// it can serve other tasks between chunks.
///
/// Concatenated, the chunks are exactly [`Metrics::render`]'s text (which is built from the
/// same parts), from a snapshot of the label pairs taken when the exposition was created.
pub struct Exposition {
    metrics: Arc<Metrics>,
    /// `None` once the text is complete.
    render: Option<Render>,
}

impl Exposition {
    /// The next chunk, or `None` at the end of the text (never an empty chunk).
    pub fn next_chunk(&mut self) -> Option<Bytes> {
        let render = self.render.as_mut()?;
        let mut out = Vec::with_capacity(CHUNK_CAPACITY);
        if render.fill(&self.metrics, &mut out, CHUNK_BYTES) {
            self.render = None;
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// Whether every chunk has been returned.
    pub fn is_complete(&self) -> bool {
        self.render.is_none()
    }
}

impl Iterator for Exposition {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        self.next_chunk()
    }
}

/// One scrape's progress through the families: the small registry families (gathered
/// whole) and the per-pair ones (written a part at a time), merged in name order.
struct Render {
    small: Peekable<std::vec::IntoIter<proto::MetricFamily>>,
    snapshot: Snapshot,
    /// The next per-pair family and where its text stopped.
    family: usize,
    cursor: Cursor,
    counts: Vec<u64>,
}

impl Render {
    fn new(metrics: &Metrics) -> Render {
        Render {
            small: metrics.registry.gather().into_iter().peekable(),
            snapshot: metrics.snapshot(),
            family: 0,
            cursor: Cursor::default(),
            counts: Vec::new(),
        }
    }

    /// Append text to `out` until it holds `limit` bytes or more (see
    /// [`Family::render_part`]) or the exposition is complete; true if it is.
    fn fill(&mut self, metrics: &Metrics, out: &mut Vec<u8>, limit: usize) -> bool {
        let encoder = TextEncoder::new();
        while out.len() < limit {
            let family = metrics.families.get(self.family);
            let next = self
                .small
                .next_if(|mf| family.is_none_or(|f| mf.name() < f.name));
            if let Some(mf) = next {
                // Encoding into a Vec cannot fail for a gathered (non-empty) family.
                let _ = encoder.encode(std::slice::from_ref(&mf), out);
                continue;
            }
            let Some(family) = family else {
                return true;
            };
            let counts = &mut self.counts;
            if family.render_part(&self.snapshot, &mut self.cursor, out, limit, counts) {
                self.family += 1;
                self.cursor = Cursor::default();
            }
        }
        self.small.peek().is_none() && self.family == metrics.families.len()
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

    /// Many label pairs over every kind of family (and one family with no series at all),
    /// with the process collector's lines left out: they change from one read to the next.
    fn populated() -> Arc<Metrics> {
        let config = crate::config::Config::from_overrides(&crate::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("flag-only config is valid");
        let metrics = Metrics::new(&config.metrics.buckets, &config.labels);
        for m in 0..7u32 {
            for t in 0..9u32 {
                let (model, tenant) = (format!("model-{m}"), format!("tenant \"{t}\""));
                let stream = metrics.stream(Some(&model), Some(&tenant));
                stream.ttfb.observe(0.001 * f64::from(m * t));
                stream.ttft.observe(0.3);
                stream.observe_itl(Duration::from_millis(u64::from(t)), 3);
                if (m + t) % 4 == 0 {
                    continue;
                }
                let decode = (t % 2 == 0).then_some(crate::clock::Decode {
                    tpot: Duration::from_millis(20),
                    tokens_per_second: 50.0,
                });
                let timings = Timings {
                    ttfb: None,
                    ttft: None,
                    ttft_content: None,
                    duration: Duration::from_millis(u64::from(100 * m + t)),
                    events: 4,
                    output_tokens: 4,
                    output_tokens_reported: false,
                    exact_event_tokens: u64::from(m % 2),
                    estimated_event_tokens: 4,
                    input_tokens: None,
                    mean_itl: None,
                    decode,
                };
                let outcome = Outcome::ALL[(m + t) as usize % Outcome::ALL.len()];
                metrics.finish(&stream, outcome, &timings);
            }
        }
        metrics
    }

    fn without_process(text: &[u8]) -> String {
        String::from_utf8(text.to_vec())
            .expect("the exposition is UTF-8")
            .lines()
            .filter(|l| !l.starts_with("process_") && !l.contains(" process_"))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// The most a chunk may run past [`CHUNK_BYTES`]: the longest run of lines written
    /// after the last check of the size, i.e. a family header with the lines of one pair
    /// (per sub-label), or a whole small family.
    fn longest_step(metrics: &Metrics, text: &str) -> usize {
        let mut longest = 0;
        let (mut family, mut step, mut key) = ("", 0, String::new());
        for line in text.lines() {
            if let Some(name) = line
                .strip_prefix("# HELP ")
                .and_then(|l| l.split(' ').next())
            {
                (family, step, key) = (name, 0, String::new());
            } else if !line.starts_with('#') {
                let per_pair = metrics.families.iter().any(|f| f.name == family);
                // A pair's histogram lines differ only in the metric suffix and `le`.
                let labels = line
                    .split_once('{')
                    .and_then(|(_, rest)| rest.rsplit_once('}'))
                    .map_or("", |(labels, _)| labels);
                let this = if per_pair {
                    labels.split(",le=").next().unwrap_or_default().to_string()
                } else {
                    String::new()
                };
                if this != key && !key.is_empty() {
                    step = 0;
                }
                key = this;
            }
            step += line.len() + 1;
            longest = longest.max(step);
        }
        longest
    }

    #[test]
    fn chunks_concatenate_to_the_rendered_text_and_stay_near_their_size() {
        let metrics = populated();
        let whole = metrics.render();
        let chunks: Vec<Bytes> = metrics.exposition().collect();
        assert!(chunks.len() >= 5, "{} chunks", chunks.len());

        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let text = without_process(&whole);
        assert_eq!(without_process(&joined), text);
        assert!(
            !text.contains("tokentap_input_tokens_total"),
            "empty family"
        );
        for family in ["tokentap_requests_total", "tokentap_event_tokens_total"] {
            assert_eq!(text.matches(&format!("# TYPE {family} ")).count(), 1);
        }

        let step = longest_step(&metrics, &String::from_utf8_lossy(&whole));
        assert!(step < 8 << 10, "one pair's lines: {step} bytes");
        let (last, full) = chunks.split_last().expect("chunks");
        assert!(!last.is_empty() && last.len() < CHUNK_BYTES + step);
        for chunk in full {
            assert!(
                (CHUNK_BYTES..CHUNK_BYTES + step).contains(&chunk.len()),
                "{} bytes",
                chunk.len()
            );
        }
    }

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
