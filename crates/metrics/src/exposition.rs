//! The per-pair families: written straight into the Prometheus text format (0.0.4), and
//! read into the typed [`Snapshot`](super::Snapshot).
//!
//! The bytes are exactly what the prometheus crate's `TextEncoder` wrote for the same
//! series (dashboards, alert rules and tests read them): samples ordered by label values,
//! labels in name order, values formatted as Rust's `f64` `Display` does, `le` bounds as
//! `f64::to_string`, label values escaped (`\\`, `\"`, `\n`). What is different is the
//! work: the escaped `model="…",tenant="…"` (or `model="…"`) text is kept with each series
//! set (a pair's, or a model's for the families that are per model) and every
//! `name_bucket{`, `,le="…"} ` and header string is rendered once per family, so a scrape
//! only copies those and formats numbers (`itoa`, `ryu`), with no intermediate snapshot.
//!
//! The same walk writes the OpenMetrics text (1.0.0, [`TextFormat::OpenMetrics`]), which
//! differs only in its family headers (a counter family is named without `_total`; help
//! escapes `"` too), its canonical `le` values (`1.0`, not `1`), `+Inf` for an infinite sum,
//! and the exemplar after a bucket's count (` # {trace_id="…",span_id="…"} value time`).
//! The small registry families are translated to it by [`registry_family_openmetrics`].
//!
//! A family can be written in parts (`Family::render_part`, resumed with a `Cursor`), so
//! that `/metrics` is streamed in chunks of bounded size rather than built as one buffer
//! of 150 MB when there are 10,000 label pairs.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use prometheus::proto;

use super::exemplar::Exemplar;
use super::families::{PairFamily, PairKind};
use super::series::{Counter, SeriesSet, ACCURACY};
use super::settings::Buckets;
use super::snapshot::{FamilySnapshot, HistogramSnapshot, Label, Series, Values};
use super::text::{
    escape_help, escape_label_value, escape_openmetrics_help, openmetrics_le, push_count, push_f64,
    push_openmetrics_f64,
};
use crate::outcome::Verdict;

/// The series sets of one level for one scrape in label order, and the ranges of sets
/// sharing a model (one set each in the per-model level).
pub(super) struct Level {
    pub series: Vec<Arc<SeriesSet>>,
    pub models: Vec<Range<usize>>,
}

/// Every level of one scrape: the (model, tenant) pairs' sets, the models' sets and the
/// GenAI attribute sets.
pub(super) struct Pairs {
    pub pairs: Level,
    pub models: Level,
    pub gen_ai: Level,
}

/// Which sets keep a family's series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SetLevel {
    /// The (model, tenant) pairs': the family carries `tenant`.
    Pair,
    /// The models'.
    Model,
    /// The GenAI attribute sets' (`gen_ai`).
    GenAi,
}

impl Pairs {
    /// The sets of `level`.
    pub fn level(&self, level: SetLevel) -> &Level {
        match level {
            SetLevel::Pair => &self.pairs,
            SetLevel::Model => &self.models,
            SetLevel::GenAi => &self.gen_ai,
        }
    }
}

/// Which text exposition a scrape gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TextFormat {
    /// The Prometheus text format 0.0.4: no exemplars.
    Prometheus,
    /// OpenMetrics text 1.0.0: exemplars on histogram buckets, `# EOF` at the end.
    OpenMetrics,
}

/// How one scrape writes its text, with the buffers its families reuse.
pub(super) struct Writer {
    pub format: TextFormat,
    /// Per-slot bucket counts of the pairs being written.
    counts: Vec<u64>,
    /// One pair's bucket exemplars (OpenMetrics only).
    exemplars: Vec<Option<Exemplar>>,
}

impl Writer {
    pub fn new(format: TextFormat) -> Writer {
        Writer {
            format,
            counts: Vec::new(),
            exemplars: Vec::new(),
        }
    }
}

/// Where a family's text stopped: it can be written in parts (one or more per chunk of a
/// streamed `/metrics` body), each resuming at the next pair.
#[derive(Default)]
pub(super) struct Cursor {
    /// The header, and at least one sample, are out.
    started: bool,
    /// The run of pairs (see [`Family::runs`]) and the next pair in it.
    run: usize,
    pair: usize,
    /// Bytes of the last pair written: to read ahead about as many pairs as fit.
    pair_bytes: usize,
}

/// One family over every pair, with its constant text rendered once.
pub(super) struct Family {
    pub name: &'static str,
    spec: &'static PairFamily,
    /// Which sets hold the family's series.
    pub level: SetLevel,
    /// `# HELP` and `# TYPE` lines.
    header: Box<[u8]>,
    /// The same in OpenMetrics.
    openmetrics_header: Box<[u8]>,
    /// `name{` (counters) or `name_bucket{` (histograms).
    prefix: Box<[u8]>,
    /// Histograms: `name_sum{` and `name_count{`.
    sum_prefix: Box<[u8]>,
    count_prefix: Box<[u8]>,
    /// Histograms: `,le="…"} ` for each finite bound, then for `+Inf`.
    le: Vec<Box<[u8]>>,
    /// The same with OpenMetrics' canonical bounds.
    openmetrics_le: Vec<Box<[u8]>>,
    /// Requests: verdicts in label-value order; event tokens: accuracies.
    sub_labels: Vec<SubLabel>,
}

/// The values of the extra labels of requests (`outcome`, `status`) or event tokens
/// (`accuracy`).
struct SubLabel {
    /// Index of the pair's counter for it.
    index: usize,
    /// (label name, value).
    values: Vec<(&'static str, Arc<str>)>,
    /// `,outcome="…",status="…"` or `accuracy="…",`: where it goes between the pair's
    /// labels (both sort between `model` and `tenant`, or before `model`).
    text: Box<[u8]>,
}

const POSITIVE_INF: &str = "+Inf";

/// Pairs whose values are read before any of them is written: the pairs are scattered
/// over the heap, and a tight loop of independent loads lets the CPU wait for many cache
/// misses at once instead of one per pair and family (the encoder was bound by them).
const READ_AHEAD: usize = 32;

impl Family {
    /// The family of `spec`, with histogram bounds taken from `buckets`, over the sets of
    /// `level`.
    pub fn new(spec: &'static PairFamily, buckets: &Buckets, level: SetLevel) -> Family {
        let name = spec.name;
        let mut header = String::new();
        if !spec.help.is_empty() {
            header.push_str(&format!("# HELP {name} {}\n", escape_help(spec.help)));
        }
        header.push_str(&format!("# TYPE {name} {}\n", spec.kind.type_name()));
        let mut family = Family {
            name,
            spec,
            level,
            header: header.into_bytes().into(),
            openmetrics_header: openmetrics_header(name, spec.help, spec.kind.type_name()),
            prefix: format!("{name}{{").into_bytes().into(),
            sum_prefix: Box::default(),
            count_prefix: Box::default(),
            le: Vec::new(),
            openmetrics_le: Vec::new(),
            sub_labels: Vec::new(),
        };
        match spec.kind {
            PairKind::Histogram {
                buckets: bounds, ..
            } => {
                family.prefix = format!("{name}_bucket{{").into_bytes().into();
                family.sum_prefix = format!("{name}_sum{{").into_bytes().into();
                family.count_prefix = format!("{name}_count{{").into_bytes().into();
                let le_text = |le: String| -> Box<[u8]> {
                    let mut escaped = String::new();
                    escape_label_value(&le, &mut escaped);
                    format!(",le=\"{escaped}\"}} ").into_bytes().into()
                };
                let bounds = bounds(buckets);
                family.le = bounds
                    .iter()
                    .map(|b| b.to_string())
                    .chain([POSITIVE_INF.to_string()])
                    .map(le_text)
                    .collect();
                family.openmetrics_le = bounds
                    .iter()
                    .copied()
                    .chain([f64::INFINITY])
                    .map(|b| le_text(openmetrics_le(b)))
                    .collect();
            }
            PairKind::Counter { .. } => {}
            PairKind::Requests => {
                let mut verdicts: Vec<(usize, Verdict)> =
                    Verdict::ALL.iter().copied().enumerate().collect();
                verdicts.sort_by_key(|(_, v)| (v.outcome.as_str(), v.status.as_str()));
                family.sub_labels = verdicts
                    .into_iter()
                    .map(|(index, v)| SubLabel {
                        index,
                        values: vec![
                            ("outcome", Arc::from(v.outcome.as_str())),
                            ("status", Arc::from(v.status.as_str())),
                        ],
                        text: format!(
                            ",outcome=\"{}\",status=\"{}\"",
                            v.outcome.as_str(),
                            v.status.as_str()
                        )
                        .into_bytes()
                        .into(),
                    })
                    .collect();
            }
            PairKind::EventTokens => {
                family.sub_labels = ACCURACY
                    .iter()
                    .enumerate()
                    .map(|(index, value)| SubLabel {
                        index,
                        values: vec![("accuracy", Arc::from(*value))],
                        text: format!("accuracy=\"{value}\",").into_bytes().into(),
                    })
                    .collect();
            }
        }
        family
    }

    /// Roughly the bytes this family writes for `pairs` sets whose label texts add up to
    /// `label_bytes` (to size the buffer once).
    pub fn estimate(&self, pairs: usize, label_bytes: usize) -> usize {
        let (lines, overhead) = match self.spec.kind {
            PairKind::Histogram { .. } => (self.le.len() + 2, self.prefix.len() + 32),
            PairKind::Counter { .. } => (1, self.prefix.len() + 12),
            PairKind::Requests | PairKind::EventTokens => (2, self.prefix.len() + 40),
        };
        lines * (pairs * overhead + label_bytes)
    }

    /// How many runs of pairs this family's samples come in: one for histograms and
    /// counters, one per (model, verdict) for requests (ordered by model, then outcome and
    /// status, then tenant), one per accuracy for event tokens.
    fn runs(&self, pairs: &Level) -> usize {
        match self.spec.kind {
            PairKind::Histogram { .. } | PairKind::Counter { .. } => 1,
            PairKind::Requests => pairs.models.len() * self.sub_labels.len(),
            PairKind::EventTokens => self.sub_labels.len(),
        }
    }

    /// The pairs of run `run` and the index of the sub-label its samples carry.
    fn run<'s>(&self, pairs: &'s Level, run: usize) -> (&'s [Arc<SeriesSet>], usize) {
        match self.spec.kind {
            PairKind::Histogram { .. } | PairKind::Counter { .. } => (&pairs.series, 0),
            PairKind::Requests => {
                let verdicts = self.sub_labels.len();
                let models = pairs.models[run / verdicts].clone();
                (&pairs.series[models], run % verdicts)
            }
            PairKind::EventTokens => (&pairs.series, run),
        }
    }

    /// Append this family's text from `at` on, stopping right after the pair whose lines
    /// take `out` to `limit` bytes or more; true once the family is complete (`at` then
    /// says nothing more). The header goes out with the first sample, so a family with no
    /// series writes nothing at all, as the prometheus registry drops empty families.
    pub fn render_part(
        &self,
        pairs: &Pairs,
        at: &mut Cursor,
        out: &mut Vec<u8>,
        limit: usize,
        writer: &mut Writer,
    ) -> bool {
        let pairs = pairs.level(self.level);
        let start = out.len();
        if !at.started {
            out.extend_from_slice(match writer.format {
                TextFormat::Prometheus => &self.header,
                TextFormat::OpenMetrics => &self.openmetrics_header,
            });
        }
        let body = out.len();
        let runs = self.runs(pairs);
        let mut complete = true;
        'runs: while at.run < runs {
            let (pairs, sub) = self.run(pairs, at.run);
            while at.pair < pairs.len() {
                // Read ahead only as many pairs as the part probably has room for: the
                // values of pairs left for the next part would be read twice.
                let room = limit.saturating_sub(out.len());
                let ahead = match at.pair_bytes {
                    0 => READ_AHEAD,
                    bytes => (room / bytes).min(READ_AHEAD - 1) + 1,
                };
                let batch = &pairs[at.pair..pairs.len().min(at.pair + ahead)];
                let (used, full) = self.rows(batch, sub, out, limit, &mut at.pair_bytes, writer);
                at.pair += used;
                if full {
                    complete = at.pair == pairs.len() && at.run + 1 == runs;
                    break 'runs;
                }
            }
            at.run += 1;
            at.pair = 0;
        }
        if !at.started {
            if out.len() == body {
                out.truncate(start);
            } else {
                at.started = true;
            }
        }
        complete
    }

    /// The lines of `pairs` (one run's, sub-label `sub`), stopping after the pair that
    /// takes `out` to `limit`: returns how many pairs were done and whether it stopped.
    fn rows(
        &self,
        pairs: &[Arc<SeriesSet>],
        sub: usize,
        out: &mut Vec<u8>,
        limit: usize,
        pair_bytes: &mut usize,
        writer: &mut Writer,
    ) -> (usize, bool) {
        let counts = &mut writer.counts;
        counts.clear();
        match self.spec.kind {
            PairKind::Histogram { get, always, .. } => {
                let slots = self.le.len();
                let mut totals = [(0u64, 0f64); READ_AHEAD];
                for (total, pair) in totals.iter_mut().zip(pairs) {
                    match get(pair) {
                        Some(histogram) => *total = histogram.read(counts),
                        // Not kept by this set (every set of the family's level keeps
                        // it): room in `counts`, and no line below.
                        None => counts.resize(counts.len() + slots, 0),
                    }
                }
                let (le, openmetrics) = match writer.format {
                    TextFormat::Prometheus => (&self.le, false),
                    TextFormat::OpenMetrics => (&self.openmetrics_le, true),
                };
                let rows = pairs.iter().zip(&totals).zip(counts.chunks_exact(slots));
                for (i, ((pair, (total, sum)), counts)) in rows.enumerate() {
                    if get(pair).is_some() && (always || *total > 0) {
                        let before = out.len();
                        let labels = pair.labels().as_bytes();
                        let exemplars = &mut writer.exemplars;
                        exemplars.clear();
                        if let (true, Some(histogram)) = (openmetrics, get(pair)) {
                            histogram.read_exemplars(exemplars);
                        }
                        let lines = HistogramLines {
                            le,
                            counts,
                            total: *total,
                            sum: *sum,
                            exemplars,
                            openmetrics,
                        };
                        self.histogram_lines(labels, &lines, out);
                        *pair_bytes = out.len() - before;
                        if out.len() >= limit {
                            return (i + 1, true);
                        }
                    }
                }
                (pairs.len(), false)
            }
            PairKind::Counter { get, always } => {
                counts.extend(pairs.iter().map(|pair| get(pair).map_or(0, Counter::get)));
                self.counter_rows(
                    pairs,
                    counts,
                    always,
                    out,
                    limit,
                    pair_bytes,
                    |out, pair, n| {
                        sample(out, &self.prefix, &[pair.labels().as_bytes()], n);
                    },
                )
            }
            PairKind::Requests => {
                let outcome = &self.sub_labels[sub];
                counts.extend(
                    pairs
                        .iter()
                        .map(|pair| pair.requests.as_ref().map_or(0, |r| r[outcome.index].get())),
                );
                self.counter_rows(
                    pairs,
                    counts,
                    false,
                    out,
                    limit,
                    pair_bytes,
                    |out, pair, n| {
                        let (model, tenant) = pair.split_labels();
                        let parts = [model.as_bytes(), &outcome.text, tenant.as_bytes()];
                        sample(out, &self.prefix, &parts, n);
                    },
                )
            }
            PairKind::EventTokens => {
                let accuracy = &self.sub_labels[sub];
                counts.extend(pairs.iter().map(|pair| {
                    pair.event_tokens
                        .as_ref()
                        .map_or(0, |e| e[accuracy.index].get())
                }));
                self.counter_rows(
                    pairs,
                    counts,
                    false,
                    out,
                    limit,
                    pair_bytes,
                    |out, pair, n| {
                        let parts = [&accuracy.text[..], pair.labels().as_bytes()];
                        sample(out, &self.prefix, &parts, n);
                    },
                )
            }
        }
    }

    /// [`Family::rows`] for one-line-per-pair families, given the values already read.
    #[allow(clippy::too_many_arguments)]
    fn counter_rows(
        &self,
        pairs: &[Arc<SeriesSet>],
        values: &[u64],
        always: bool,
        out: &mut Vec<u8>,
        limit: usize,
        pair_bytes: &mut usize,
        line: impl Fn(&mut Vec<u8>, &SeriesSet, u64),
    ) -> (usize, bool) {
        for (i, (pair, n)) in pairs.iter().zip(values).enumerate() {
            if always || *n > 0 {
                let before = out.len();
                line(out, pair, *n);
                *pair_bytes = out.len() - before;
                if out.len() >= limit {
                    return (i + 1, true);
                }
            }
        }
        (pairs.len(), false)
    }

    fn histogram_lines(&self, labels: &[u8], lines: &HistogramLines<'_>, out: &mut Vec<u8>) {
        let le = lines.le;
        let exemplar = |slot: usize| lines.exemplars.get(slot).copied().flatten();
        let mut cumulative = 0u64;
        // `counts` has one slot more than there are bounds: above the last one.
        for (slot, (count, le)) in lines.counts.iter().zip(&le[..le.len() - 1]).enumerate() {
            cumulative = cumulative.wrapping_add(*count);
            out.extend_from_slice(&self.prefix);
            out.extend_from_slice(labels);
            out.extend_from_slice(le);
            push_count(out, cumulative);
            if let Some(exemplar) = exemplar(slot) {
                push_exemplar(out, &exemplar);
            }
            out.push(b'\n');
        }
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(labels);
        out.extend_from_slice(&le[le.len() - 1]);
        push_count(out, lines.total);
        if let Some(exemplar) = exemplar(le.len() - 1) {
            push_exemplar(out, &exemplar);
        }
        out.push(b'\n');

        out.extend_from_slice(&self.sum_prefix);
        out.extend_from_slice(labels);
        out.extend_from_slice(b"} ");
        if lines.openmetrics {
            push_openmetrics_f64(out, lines.sum);
        } else {
            push_f64(out, lines.sum);
        }
        out.push(b'\n');

        out.extend_from_slice(&self.count_prefix);
        out.extend_from_slice(labels);
        out.extend_from_slice(b"} ");
        push_count(out, lines.total);
        out.push(b'\n');
    }

    /// This family's series as they are now, labels in name order and series in the
    /// order of the text; `None` if it has none (as the text then leaves it out).
    pub fn snapshot(&self, pairs: &Pairs) -> Option<FamilySnapshot> {
        let pairs = pairs.level(self.level);
        let values = match self.spec.kind {
            PairKind::Histogram { get, always, .. } => {
                let mut counts = Vec::new();
                let mut series = Vec::new();
                for pair in &pairs.series {
                    let Some(histogram) = get(pair) else {
                        continue;
                    };
                    counts.clear();
                    let (count, sum) = histogram.read(&mut counts);
                    if !(always || count > 0) {
                        continue;
                    }
                    let mut cumulative = 0u64;
                    // The last slot is above every bound: it is in `count` only.
                    let cumulative_counts = counts[..histogram.bounds().len()]
                        .iter()
                        .map(|n| {
                            cumulative = cumulative.wrapping_add(*n);
                            cumulative
                        })
                        .collect();
                    let mut exemplars = Vec::new();
                    histogram.read_exemplars(&mut exemplars);
                    series.push(Series {
                        labels: self.series_labels(pair, None),
                        value: HistogramSnapshot {
                            bounds: histogram.bounds().clone(),
                            cumulative_counts,
                            count,
                            sum,
                            native: histogram.read_native(),
                            exemplars,
                            native_exemplars: histogram.read_native_exemplars(),
                        },
                    });
                }
                Values::Histogram(series)
            }
            PairKind::Counter { get, always } => Values::Counter(
                pairs
                    .series
                    .iter()
                    .filter_map(|pair| Some((pair, get(pair)?.get())))
                    .filter(|(_, n)| always || *n > 0)
                    .map(|(pair, n)| counter(self.series_labels(pair, None), n))
                    .collect(),
            ),
            PairKind::Requests => {
                let mut series = Vec::new();
                for models in &pairs.models {
                    for outcome in &self.sub_labels {
                        for pair in &pairs.series[models.clone()] {
                            let n = pair.requests.as_ref().map_or(0, |r| r[outcome.index].get());
                            if n > 0 {
                                series.push(counter(self.series_labels(pair, Some(outcome)), n));
                            }
                        }
                    }
                }
                Values::Counter(series)
            }
            PairKind::EventTokens => {
                let mut series = Vec::new();
                for accuracy in &self.sub_labels {
                    for pair in &pairs.series {
                        let n = pair
                            .event_tokens
                            .as_ref()
                            .map_or(0, |e| e[accuracy.index].get());
                        if n > 0 {
                            series.push(counter(self.series_labels(pair, Some(accuracy)), n));
                        }
                    }
                }
                Values::Counter(series)
            }
        };
        (!values.is_empty()).then_some(FamilySnapshot {
            name: Cow::Borrowed(self.spec.name),
            help: Cow::Borrowed(self.spec.help),
            values,
        })
    }

    /// The labels of a set's series, named and ordered as the family's spec lists them:
    /// `model` and `tenant` from the set (a model's set has no `tenant`), the other one
    /// from the sub-label; a GenAI set's, those of its attributes it has.
    fn series_labels(&self, pair: &SeriesSet, sub: Option<&SubLabel>) -> Vec<Label> {
        self.spec
            .labels
            .iter()
            .filter_map(|&name| {
                let value = match name {
                    _ if pair.gen_ai.is_some() => pair.gen_ai.as_ref()?.value(name)?,
                    "model" => pair.model.clone(),
                    "tenant" => pair.tenant.clone()?,
                    // Only families with sub-labels have more labels.
                    _ => sub?.values.iter().find(|(n, _)| *n == name)?.1.clone(),
                };
                Some(Label {
                    name: Cow::Borrowed(name),
                    value,
                })
            })
            .collect()
    }
}

/// A counter series: the count as the float the exposition formats carry.
fn counter(labels: Vec<Label>, n: u64) -> Series<f64> {
    Series {
        labels,
        value: n as f64,
    }
}

/// `prefix` + label parts + `} ` + value + newline.
fn sample(out: &mut Vec<u8>, prefix: &[u8], labels: &[&[u8]], n: u64) {
    out.extend_from_slice(prefix);
    for part in labels {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b"} ");
    push_count(out, n);
    out.push(b'\n');
}

/// One pair's histogram values, as [`Family::histogram_lines`] writes them.
struct HistogramLines<'a> {
    /// `,le="…"} ` per slot, in the scrape's format.
    le: &'a [Box<[u8]>],
    /// Per slot, the last one above every bound.
    counts: &'a [u64],
    total: u64,
    sum: f64,
    /// Per slot (or empty): each bucket's exemplar.
    exemplars: &'a [Option<Exemplar>],
    openmetrics: bool,
}

/// `# HELP` and `# TYPE` in OpenMetrics: a counter family is named without its samples'
/// `_total`.
fn openmetrics_header(name: &str, help: &str, type_name: &str) -> Box<[u8]> {
    let family = match type_name {
        "counter" => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    let mut header = String::new();
    if !help.is_empty() {
        let help = escape_openmetrics_help(help);
        header.push_str(&format!("# HELP {family} {help}\n"));
    }
    header.push_str(&format!("# TYPE {family} {type_name}\n"));
    header.into_bytes().into()
}

/// ` # {trace_id="…",span_id="…"} value timestamp`: what follows a bucket's count.
fn push_exemplar(out: &mut Vec<u8>, exemplar: &Exemplar) {
    out.extend_from_slice(b" # {trace_id=\"");
    push_hex(out, &exemplar.trace.trace_id);
    out.extend_from_slice(b"\",span_id=\"");
    push_hex(out, &exemplar.trace.span_id);
    out.extend_from_slice(b"\"} ");
    push_openmetrics_f64(out, exemplar.value);
    out.push(b' ');
    // Seconds with millisecond precision (what Prometheus stores).
    let at = exemplar.timestamp;
    out.extend_from_slice(itoa::Buffer::new().format(at.as_secs()).as_bytes());
    let millis = at.subsec_millis();
    out.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
    ]);
}

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)]);
        out.push(DIGITS[usize::from(byte & 0xf)]);
    }
}

/// A small family gathered from the prometheus registry (counters and gauges: all it
/// holds), written as OpenMetrics text: the crate has no OpenMetrics encoder.
pub(super) fn registry_family_openmetrics(family: &proto::MetricFamily, out: &mut Vec<u8>) {
    let (type_name, value): (&str, fn(&proto::Metric) -> f64) = match family.get_field_type() {
        proto::MetricType::COUNTER => ("counter", |m| m.get_counter().get_value()),
        proto::MetricType::GAUGE => ("gauge", |m| m.get_gauge().get_value()),
        // As in `registry_snapshot`: the registry holds no other type.
        _ => return,
    };
    if family.get_metric().is_empty() {
        return;
    }
    let name = family.name();
    out.extend_from_slice(&openmetrics_header(name, family.help(), type_name));
    for metric in family.get_metric() {
        out.extend_from_slice(name.as_bytes());
        let labels = metric.get_label();
        if !labels.is_empty() {
            let mut text = String::from("{");
            for (i, label) in labels.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(label.name());
                text.push_str("=\"");
                escape_label_value(label.value(), &mut text);
                text.push('"');
            }
            text.push('}');
            out.extend_from_slice(text.as_bytes());
        }
        out.push(b' ');
        push_openmetrics_f64(out, value(metric));
        out.push(b'\n');
    }
}
