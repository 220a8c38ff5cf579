//! The per-pair families written straight into the Prometheus text format (0.0.4).
//!
//! The bytes are exactly what the prometheus crate's `TextEncoder` wrote for the same
//! series (dashboards, alert rules and tests read them): samples ordered by label values,
//! labels in name order, values formatted as Rust's `f64` `Display` does, `le` bounds as
//! `f64::to_string`, label values escaped (`\\`, `\"`, `\n`). What is different is the
//! work: the escaped `model="…",tenant="…"` text is kept with each pair and every
//! `name_bucket{`, `,le="…"} ` and header string is rendered once per family, so a scrape
//! only copies those and formats numbers (`itoa`, `ryu`), with no intermediate snapshot.
//!
//! A family can be written in parts (`Family::render_part`, resumed with a `Cursor`), so
//! that `/metrics` is streamed in chunks of bounded size rather than built as one buffer
//! of 150 MB when there are 10,000 label pairs.

use std::ops::Range;
use std::sync::Arc;

use prometheus::proto;

use super::series::{Counter, Histogram, PairSeries, ACCURACY};
use super::Outcome;

/// The pairs of one scrape in label order, and the ranges of pairs sharing a model.
pub(super) struct Snapshot {
    pub pairs: Vec<Arc<PairSeries>>,
    pub models: Vec<Range<usize>>,
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

/// What a family reads from each pair.
pub(super) enum Series {
    /// A histogram; `always`: the series exists as soon as the pair does (handles taken
    /// at `stream()`), else only once something was observed.
    Histogram {
        get: fn(&PairSeries) -> &Histogram,
        always: bool,
    },
    /// A counter; `always` as for histograms.
    Counter {
        get: fn(&PairSeries) -> &Counter,
        always: bool,
    },
    /// `tokentap_requests_total`: one series per outcome that happened.
    Requests,
    /// `tokentap_event_tokens_total`: one series per accuracy that was counted.
    EventTokens,
}

/// One family over every pair, with its constant text rendered once.
pub(super) struct Family {
    pub name: &'static str,
    help: &'static str,
    series: Series,
    /// `# HELP` and `# TYPE` lines.
    header: Box<[u8]>,
    /// `name{` (counters) or `name_bucket{` (histograms).
    prefix: Box<[u8]>,
    /// Histograms: `name_sum{` and `name_count{`.
    sum_prefix: Box<[u8]>,
    count_prefix: Box<[u8]>,
    /// Histograms: the finite bounds, and `,le="…"} ` for each, then for `+Inf`.
    bounds: Arc<[f64]>,
    le: Vec<Box<[u8]>>,
    /// Requests: outcomes in label-value order; event tokens: accuracies.
    sub_labels: Vec<SubLabel>,
}

/// A value of the extra label of requests (`outcome`) or event tokens (`accuracy`).
struct SubLabel {
    /// Index of the pair's counter for it.
    index: usize,
    value: &'static str,
    /// `,outcome="…"` or `accuracy="…",`: where it goes between the pair's labels.
    text: Box<[u8]>,
}

const POSITIVE_INF: &str = "+Inf";

/// Pairs whose values are read before any of them is written: the pairs are scattered
/// over the heap, and a tight loop of independent loads lets the CPU wait for many cache
/// misses at once instead of one per pair and family (the encoder was bound by them).
const READ_AHEAD: usize = 32;

impl Family {
    pub fn histogram(
        name: &'static str,
        help: &'static str,
        bounds: &Arc<[f64]>,
        get: fn(&PairSeries) -> &Histogram,
        always: bool,
    ) -> Family {
        let mut family = Family::new(name, help, "histogram", Series::Histogram { get, always });
        family.prefix = format!("{name}_bucket{{").into_bytes().into();
        family.sum_prefix = format!("{name}_sum{{").into_bytes().into();
        family.count_prefix = format!("{name}_count{{").into_bytes().into();
        family.bounds = bounds.clone();
        family.le = bounds
            .iter()
            .map(|b| b.to_string())
            .chain([POSITIVE_INF.to_string()])
            .map(|le| {
                let mut escaped = String::new();
                escape_label_value(&le, &mut escaped);
                format!(",le=\"{escaped}\"}} ").into_bytes().into()
            })
            .collect();
        family
    }

    pub fn counter(
        name: &'static str,
        help: &'static str,
        get: fn(&PairSeries) -> &Counter,
        always: bool,
    ) -> Family {
        Family::new(name, help, "counter", Series::Counter { get, always })
    }

    pub fn requests(name: &'static str, help: &'static str) -> Family {
        let mut family = Family::new(name, help, "counter", Series::Requests);
        let mut outcomes = Outcome::ALL;
        outcomes.sort_by_key(|o| o.as_str());
        family.sub_labels = outcomes
            .iter()
            .map(|o| SubLabel {
                index: *o as usize,
                value: o.as_str(),
                text: format!(",outcome=\"{}\"", o.as_str()).into_bytes().into(),
            })
            .collect();
        family
    }

    pub fn event_tokens(name: &'static str, help: &'static str) -> Family {
        let mut family = Family::new(name, help, "counter", Series::EventTokens);
        family.sub_labels = ACCURACY
            .iter()
            .enumerate()
            .map(|(index, value)| SubLabel {
                index,
                value,
                text: format!("accuracy=\"{value}\",").into_bytes().into(),
            })
            .collect();
        family
    }

    fn new(name: &'static str, help: &'static str, kind: &str, series: Series) -> Family {
        let mut header = String::new();
        if !help.is_empty() {
            header.push_str(&format!("# HELP {name} {}\n", escape_help(help)));
        }
        header.push_str(&format!("# TYPE {name} {kind}\n"));
        Family {
            name,
            help,
            series,
            header: header.into_bytes().into(),
            prefix: format!("{name}{{").into_bytes().into(),
            sum_prefix: Box::default(),
            count_prefix: Box::default(),
            bounds: Arc::from(Vec::new()),
            le: Vec::new(),
            sub_labels: Vec::new(),
        }
    }

    /// Roughly the bytes this family writes for `pairs` pairs whose label texts add up to
    /// `label_bytes` (to size the buffer once).
    pub fn estimate(&self, pairs: usize, label_bytes: usize) -> usize {
        let (lines, overhead) = match self.series {
            Series::Histogram { .. } => (self.le.len() + 2, self.prefix.len() + 32),
            Series::Counter { .. } => (1, self.prefix.len() + 12),
            Series::Requests | Series::EventTokens => (2, self.prefix.len() + 40),
        };
        lines * (pairs * overhead + label_bytes)
    }

    /// How many runs of pairs this family's samples come in: one for histograms and
    /// counters, one per (model, outcome) for requests (ordered by model, then outcome,
    /// then tenant), one per accuracy for event tokens.
    fn runs(&self, snapshot: &Snapshot) -> usize {
        match self.series {
            Series::Histogram { .. } | Series::Counter { .. } => 1,
            Series::Requests => snapshot.models.len() * self.sub_labels.len(),
            Series::EventTokens => self.sub_labels.len(),
        }
    }

    /// The pairs of run `run` and the index of the sub-label its samples carry.
    fn run<'s>(&self, snapshot: &'s Snapshot, run: usize) -> (&'s [Arc<PairSeries>], usize) {
        match self.series {
            Series::Histogram { .. } | Series::Counter { .. } => (&snapshot.pairs, 0),
            Series::Requests => {
                let outcomes = self.sub_labels.len();
                let models = snapshot.models[run / outcomes].clone();
                (&snapshot.pairs[models], run % outcomes)
            }
            Series::EventTokens => (&snapshot.pairs, run),
        }
    }

    /// Append this family's text from `at` on, stopping right after the pair whose lines
    /// take `out` to `limit` bytes or more; true once the family is complete (`at` then
    /// says nothing more). The header goes out with the first sample, so a family with no
    /// series writes nothing at all, as the prometheus registry drops empty families.
    pub fn render_part(
        &self,
        snapshot: &Snapshot,
        at: &mut Cursor,
        out: &mut Vec<u8>,
        limit: usize,
        counts: &mut Vec<u64>,
    ) -> bool {
        let start = out.len();
        if !at.started {
            out.extend_from_slice(&self.header);
        }
        let body = out.len();
        let runs = self.runs(snapshot);
        let mut complete = true;
        'runs: while at.run < runs {
            let (pairs, sub) = self.run(snapshot, at.run);
            while at.pair < pairs.len() {
                // Read ahead only as many pairs as the part probably has room for: the
                // values of pairs left for the next part would be read twice.
                let room = limit.saturating_sub(out.len());
                let ahead = match at.pair_bytes {
                    0 => READ_AHEAD,
                    bytes => (room / bytes).min(READ_AHEAD - 1) + 1,
                };
                let batch = &pairs[at.pair..pairs.len().min(at.pair + ahead)];
                let (used, full) = self.rows(batch, sub, out, limit, &mut at.pair_bytes, counts);
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
        pairs: &[Arc<PairSeries>],
        sub: usize,
        out: &mut Vec<u8>,
        limit: usize,
        pair_bytes: &mut usize,
        counts: &mut Vec<u64>,
    ) -> (usize, bool) {
        counts.clear();
        match self.series {
            Series::Histogram { get, always } => {
                let slots = self.le.len();
                let mut totals = [(0u64, 0f64); READ_AHEAD];
                for (total, pair) in totals.iter_mut().zip(pairs) {
                    *total = get(pair).read(counts);
                }
                let rows = pairs.iter().zip(&totals).zip(counts.chunks_exact(slots));
                for (i, ((pair, (total, sum)), counts)) in rows.enumerate() {
                    if always || *total > 0 {
                        let before = out.len();
                        let labels = pair.labels().as_bytes();
                        self.histogram_lines(labels, counts, *total, *sum, out);
                        *pair_bytes = out.len() - before;
                        if out.len() >= limit {
                            return (i + 1, true);
                        }
                    }
                }
                (pairs.len(), false)
            }
            Series::Counter { get, always } => {
                counts.extend(pairs.iter().map(|pair| get(pair).get()));
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
            Series::Requests => {
                let outcome = &self.sub_labels[sub];
                counts.extend(pairs.iter().map(|pair| pair.requests[outcome.index].get()));
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
            Series::EventTokens => {
                let accuracy = &self.sub_labels[sub];
                counts.extend(
                    pairs
                        .iter()
                        .map(|pair| pair.event_tokens[accuracy.index].get()),
                );
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
        pairs: &[Arc<PairSeries>],
        values: &[u64],
        always: bool,
        out: &mut Vec<u8>,
        limit: usize,
        pair_bytes: &mut usize,
        line: impl Fn(&mut Vec<u8>, &PairSeries, u64),
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

    fn histogram_lines(
        &self,
        labels: &[u8],
        counts: &[u64],
        total: u64,
        sum: f64,
        out: &mut Vec<u8>,
    ) {
        let mut cumulative = 0u64;
        // `counts` has one slot more than there are bounds: above the last one.
        for (count, le) in counts.iter().zip(&self.le[..self.le.len() - 1]) {
            cumulative = cumulative.wrapping_add(*count);
            out.extend_from_slice(&self.prefix);
            out.extend_from_slice(labels);
            out.extend_from_slice(le);
            push_count(out, cumulative);
            out.push(b'\n');
        }
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(labels);
        out.extend_from_slice(&self.le[self.le.len() - 1]);
        push_count(out, total);
        out.push(b'\n');

        out.extend_from_slice(&self.sum_prefix);
        out.extend_from_slice(labels);
        out.extend_from_slice(b"} ");
        push_f64(out, sum);
        out.push(b'\n');

        out.extend_from_slice(&self.count_prefix);
        out.extend_from_slice(labels);
        out.extend_from_slice(b"} ");
        push_count(out, total);
        out.push(b'\n');
    }

    /// The same series as a protobuf family (what the registry's `gather()` gave), for
    /// the demo's summary and for tests. `None` if the family has no series.
    pub fn proto(&self, snapshot: &Snapshot) -> Option<proto::MetricFamily> {
        let mut metrics = Vec::new();
        let mut counts = Vec::new();
        let field_type = match self.series {
            Series::Histogram { get, always } => {
                for pair in &snapshot.pairs {
                    counts.clear();
                    let (total, sum) = get(pair).read(&mut counts);
                    if !(always || total > 0) {
                        continue;
                    }
                    let mut cumulative = 0u64;
                    let buckets = counts
                        .iter()
                        .zip(get(pair).bounds())
                        .map(|(count, bound)| {
                            cumulative = cumulative.wrapping_add(*count);
                            let mut bucket = proto::Bucket::default();
                            bucket.set_cumulative_count(cumulative);
                            bucket.set_upper_bound(*bound);
                            bucket
                        })
                        .collect();
                    let mut histogram = proto::Histogram::default();
                    histogram.set_sample_count(total);
                    histogram.set_sample_sum(sum);
                    histogram.set_bucket(buckets);
                    let mut metric = metric(&[("model", &*pair.model), ("tenant", &*pair.tenant)]);
                    metric.set_histogram(histogram);
                    metrics.push(metric);
                }
                proto::MetricType::HISTOGRAM
            }
            Series::Counter { get, always } => {
                for pair in &snapshot.pairs {
                    let n = get(pair).get();
                    if always || n > 0 {
                        let labels = [("model", &*pair.model), ("tenant", &*pair.tenant)];
                        metrics.push(counter_metric(&labels, n));
                    }
                }
                proto::MetricType::COUNTER
            }
            Series::Requests => {
                for models in &snapshot.models {
                    for outcome in &self.sub_labels {
                        for pair in &snapshot.pairs[models.clone()] {
                            let n = pair.requests[outcome.index].get();
                            if n > 0 {
                                let labels = [
                                    ("model", &*pair.model),
                                    ("outcome", outcome.value),
                                    ("tenant", &*pair.tenant),
                                ];
                                metrics.push(counter_metric(&labels, n));
                            }
                        }
                    }
                }
                proto::MetricType::COUNTER
            }
            Series::EventTokens => {
                for accuracy in &self.sub_labels {
                    for pair in &snapshot.pairs {
                        let n = pair.event_tokens[accuracy.index].get();
                        if n > 0 {
                            let labels = [
                                ("accuracy", accuracy.value),
                                ("model", &*pair.model),
                                ("tenant", &*pair.tenant),
                            ];
                            metrics.push(counter_metric(&labels, n));
                        }
                    }
                }
                proto::MetricType::COUNTER
            }
        };
        if metrics.is_empty() {
            return None;
        }
        let mut family = proto::MetricFamily::default();
        family.set_name(self.name.to_string());
        family.set_help(self.help.to_string());
        family.set_field_type(field_type);
        family.set_metric(metrics);
        Some(family)
    }
}

fn metric(labels: &[(&str, &str)]) -> proto::Metric {
    let mut metric = proto::Metric::default();
    metric.set_label(
        labels
            .iter()
            .map(|(name, value)| {
                let mut pair = proto::LabelPair::default();
                pair.set_name(name.to_string());
                pair.set_value(value.to_string());
                pair
            })
            .collect(),
    );
    metric
}

fn counter_metric(labels: &[(&str, &str)], n: u64) -> proto::Metric {
    let mut metric = metric(labels);
    let mut counter = proto::Counter::default();
    counter.set_value(n as f64);
    metric.set_counter(counter);
    metric
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

/// Escape a label value as the exposition format (and the prometheus crate) does.
pub(super) fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Escape a HELP text (backslash and newline only).
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Integers up to 2^53 are exact in an `f64`: above, the crate printed the rounded float.
const EXACT_INTEGERS: u64 = 1 << 53;

/// A count, printed as the crate printed it: the `u64` converted to `f64`, `Display`ed.
pub(super) fn push_count(out: &mut Vec<u8>, n: u64) {
    if n <= EXACT_INTEGERS {
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    } else {
        push_f64(out, n as f64);
    }
}

/// `v` exactly as `f64`'s `Display` (`v.to_string()`) prints it: the shortest digits that
/// round-trip, never an exponent, no `.0` on integers; `NaN`, `inf`, `-inf`, `-0`.
///
/// `ryu` finds the same shortest digits (several times faster than `Display`); only their
/// layout differs (`1e-7`, `1.5e300`, `12.0`), so this re-lays them out.
pub(super) fn push_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
        return;
    }
    if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"inf" } else { b"-inf" });
        return;
    }
    if v.is_sign_negative() {
        out.push(b'-');
    }
    let magnitude = v.abs();
    if magnitude.trunc() == magnitude && magnitude < EXACT_INTEGERS as f64 {
        out.extend_from_slice(itoa::Buffer::new().format(magnitude as u64).as_bytes());
        return;
    }
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(magnitude).as_bytes();
    let (mantissa, exponent) = match text.iter().position(|&c| c == b'e') {
        Some(e) => (&text[..e], parse_exponent(&text[e + 1..])),
        None => (text, 0),
    };
    // The value is 0.DIGITS x 10^point.
    let mut digits = [0u8; 24];
    let mut len = 0;
    let mut point = None;
    for &c in mantissa {
        if c == b'.' {
            point = Some(len);
        } else if len < digits.len() {
            digits[len] = c;
            len += 1;
        }
    }
    let mut point = point.unwrap_or(len) as i32 + exponent;
    let mut first = 0;
    while first + 1 < len && digits[first] == b'0' {
        first += 1;
        point -= 1;
    }
    while len > first + 1 && digits[len - 1] == b'0' {
        len -= 1;
    }
    let last = len - 1;
    if digits[last] & 1 == 0 {
        // Between two equally near shortest candidates `ryu` takes the even digit,
        // `Display` the higher one (an even digit plus one never carries).
        let d = digits[first..len]
            .iter()
            .fold(0u64, |n, c| n * 10 + u64::from(c - b'0'));
        if is_midpoint(magnitude, d, point - (len - first) as i32) {
            digits[last] += 1;
        }
    }
    let digits = &digits[first..len];
    if point <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + point.unsigned_abs() as usize, b'0');
        out.extend_from_slice(digits);
    } else if (point as usize) < digits.len() {
        let (int, frac) = digits.split_at(point as usize);
        out.extend_from_slice(int);
        out.push(b'.');
        out.extend_from_slice(frac);
    } else {
        out.extend_from_slice(digits);
        out.resize(out.len() + point as usize - digits.len(), b'0');
    }
}

/// Whether the positive finite `v` is exactly `(d + 1/2) x 10^q`.
fn is_midpoint(v: f64, d: u64, q: i32) -> bool {
    // v = odd x 2^exp.
    let bits = v.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    let (mantissa, exp) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    let zeros = mantissa.trailing_zeros();
    let (odd, exp) = (u128::from(mantissa >> zeros), exp + zeros as i32);
    // (d + 1/2) x 10^q = (2d + 1) x 5^q x 2^(q - 1), with 2d + 1 odd.
    let twice = u128::from(d) * 2 + 1;
    if q >= 0 {
        exp == q - 1
            && 5u128
                .checked_pow(q.unsigned_abs())
                .and_then(|p| p.checked_mul(twice))
                == Some(odd)
    } else {
        exp == q - 1
            && 5u128
                .checked_pow(q.unsigned_abs())
                .is_some_and(|p| twice % p == 0 && twice / p == odd)
    }
}

fn parse_exponent(text: &[u8]) -> i32 {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let magnitude = digits
        .iter()
        .fold(0i32, |n, d| n * 10 + i32::from(d.wrapping_sub(b'0')));
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn f64_text(v: f64) -> String {
        let mut out = Vec::new();
        push_f64(&mut out, v);
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn floats_print_like_display() {
        let fixed = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.1,
            0.25,
            1e-7,
            1.5e-300,
            5e-324,
            f64::MIN_POSITIVE,
            123.456,
            1e15,
            1e16,
            1e17,
            1e21,
            1.5e300,
            f64::MAX,
            -f64::MAX,
            9007199254740992.0,
            9007199254740993.0,
            4503599627370495.5,
            0.005,
            0.3,
            2.0 / 3.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for v in fixed {
            assert_eq!(f64_text(v), v.to_string(), "{v:e}");
        }
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..200_000 {
            // Any bit pattern, and sums of durations in seconds (the usual `_sum`).
            let any = f64::from_bits(rng.gen());
            assert_eq!(f64_text(any), any.to_string(), "{any:e}");
            let seconds = rng.gen_range(0..10_000_000_000u64) as f64 * 1e-9
                + rng.gen_range(0..1000u64) as f64 * 1e-3;
            assert_eq!(f64_text(seconds), seconds.to_string(), "{seconds:e}");
            // Few fraction bits: the decimal expansion is short, so ties between two
            // shortest candidates are common.
            let dyadic = rng.gen_range(0..1u64 << 53) as f64 / f64::from(1 << rng.gen_range(0..12));
            assert_eq!(f64_text(dyadic), dyadic.to_string(), "{dyadic:e}");
            let scaled = dyadic * 2f64.powi(rng.gen_range(-80..80));
            assert_eq!(f64_text(scaled), scaled.to_string(), "{scaled:e}");
        }
    }

    #[test]
    fn counts_print_like_the_float_they_were() {
        for n in [
            0,
            1,
            10,
            1 << 53,
            (1 << 53) + 1,
            u64::MAX,
            12345678901234567890,
        ] {
            let mut out = Vec::new();
            push_count(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), (n as f64).to_string());
        }
    }
}
