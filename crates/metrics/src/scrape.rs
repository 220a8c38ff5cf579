//! One scrape of every family: the text (Prometheus or OpenMetrics) whole or a chunk at a
//! time ([`Exposition`], what `/metrics` streams), the typed [`Snapshot`], and the
//! protobuf exposition; the small registry families merged in name order with the
//! per-pair ones (`Render`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use prometheus::proto;
use prometheus::{Encoder, TextEncoder};

use super::exposition::{registry_family_openmetrics, Cursor, TextFormat, Writer};
use super::registry::registry_snapshot;
use super::series::SeriesSet;
use super::snapshot::{FamilySnapshot, Snapshot};
use super::{protobuf, Exposition, Metrics, Render, CHUNK_BYTES, CHUNK_CAPACITY};

impl Metrics {
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
        self.render_format_into(out, TextFormat::Prometheus);
    }

    /// The OpenMetrics text exposition (1.0.0) of every family, in one buffer: the
    /// families of [`Metrics::render`] with OpenMetrics' headers, the histograms' bucket
    /// exemplars, and `# EOF`. `/metrics` streams it as
    /// [`Metrics::openmetrics_exposition`] chunks instead.
    pub fn render_openmetrics(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.render_format_into(&mut out, TextFormat::OpenMetrics);
        out
    }

    fn render_format_into(&self, out: &mut Vec<u8>, format: TextFormat) {
        let mut render = Render::new(self, format);
        // One allocation: with many label pairs the text is megabytes, and growing a
        // buffer would copy it over and over.
        let level = |sets: &[Arc<SeriesSet>]| {
            let label_bytes: usize = sets.iter().map(|p| p.labels().len()).sum();
            (sets.len(), label_bytes)
        };
        let estimate: usize = self
            .families
            .iter()
            .map(|f| {
                let (sets, label_bytes) = level(&render.pairs.level(f.level).series);
                f.estimate(sets, label_bytes)
            })
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
            render: Some(Render::new(self, TextFormat::Prometheus)),
            metrics: self.clone(),
        }
    }

    /// The text of [`Metrics::render_openmetrics`] as chunks, like [`Metrics::exposition`].
    pub fn openmetrics_exposition(self: &Arc<Self>) -> Exposition {
        Exposition {
            render: Some(Render::new(self, TextFormat::OpenMetrics)),
            metrics: self.clone(),
        }
    }

    /// Every family's series as they are now, typed: the same families, series and
    /// order as [`Metrics::render`]'s text.
    pub fn snapshot(&self) -> Snapshot {
        let pairs = self.pairs();
        // The per-pair counters are read before the registry's gauges, for the reason
        // `Render` gives: no request is both counted and in flight.
        let mut families: Vec<FamilySnapshot> = self
            .families
            .iter()
            .filter_map(|f| f.snapshot(&pairs))
            .collect();
        let small = self
            .process
            .gather()
            .into_iter()
            .chain(self.registry.gather());
        families.extend(small.filter_map(|mf| registry_snapshot(&mf)));
        families.sort_by(|a, b| a.name.cmp(&b.name));
        Snapshot { families }
    }

    /// The per-pair and per-model families called `names` (those with series), as
    /// [`Metrics::snapshot`] reads them, and nothing else: what the live view's ticker
    /// reads each second, without the registry's families or the process collector.
    pub fn snapshot_of(&self, names: &[&str]) -> Snapshot {
        let pairs = self.pairs();
        let mut families: Vec<FamilySnapshot> = self
            .families
            .iter()
            .filter(|f| names.contains(&f.name))
            .filter_map(|f| f.snapshot(&pairs))
            .collect();
        families.sort_by(|a, b| a.name.cmp(&b.name));
        Snapshot { families }
    }

    /// The Prometheus protobuf exposition of [`Metrics::snapshot`] (see [`protobuf`]):
    /// histograms with their native buckets, and their classic ones unless
    /// `metrics.native_histograms.classic` is false. Built whole: per series it is a
    /// fraction of the text's size.
    pub fn protobuf(&self) -> Vec<u8> {
        protobuf::encode(&self.snapshot(), self.protobuf_classic)
    }

    /// The small families of both registries, sorted by name.
    fn small_families(&self) -> Vec<proto::MetricFamily> {
        let mut families = self.process.gather();
        families.extend(self.registry.gather());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        families
    }
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

impl Render {
    fn new(metrics: &Metrics, format: TextFormat) -> Render {
        Render {
            small: metrics.small_families().into_iter().peekable(),
            small_stale: false,
            pairs: metrics.pairs(),
            family: 0,
            cursor: Cursor::default(),
            writer: Writer::new(format),
        }
    }

    /// Append text to `out` until it holds `limit` bytes or more (see
    /// [`Family::render_part`](super::exposition::Family::render_part)) or the exposition is complete; true if it is (the
    /// OpenMetrics text then ends with its `# EOF`).
    fn fill(&mut self, metrics: &Metrics, out: &mut Vec<u8>, limit: usize) -> bool {
        let complete = self.fill_families(metrics, out, limit);
        if complete && self.writer.format == TextFormat::OpenMetrics {
            out.extend_from_slice(b"# EOF\n");
        }
        complete
    }

    fn fill_families(&mut self, metrics: &Metrics, out: &mut Vec<u8>, limit: usize) -> bool {
        let encoder = TextEncoder::new();
        while out.len() < limit {
            let family = metrics.families.get(self.family);
            let small_next =
                (self.small.peek()).is_some_and(|mf| family.is_none_or(|f| mf.name() < f.name));
            if small_next && self.small_stale {
                self.regather(metrics);
            }
            let next = self
                .small
                .next_if(|mf| family.is_none_or(|f| mf.name() < f.name));
            if let Some(mf) = next {
                match self.writer.format {
                    // Encoding into a Vec cannot fail for a gathered (non-empty) family.
                    TextFormat::Prometheus => {
                        let _ = encoder.encode(std::slice::from_ref(&mf), out);
                    }
                    TextFormat::OpenMetrics => registry_family_openmetrics(&mf, out),
                }
                continue;
            }
            let Some(family) = family else {
                return true;
            };
            let writer = &mut self.writer;
            if family.render_part(&self.pairs, &mut self.cursor, out, limit, writer) {
                self.family += 1;
                self.cursor = Cursor::default();
                self.small_stale = true;
            }
        }
        self.small.peek().is_none() && self.family == metrics.families.len()
    }

    /// Gather the registry again, keeping the families after the per-pair ones already
    /// written: those whose names sort after the last per-pair family written. Called
    /// only when a registry family is to be written next, so a scrape gathers once per
    /// run of registry families between per-pair ones.
    fn regather(&mut self, metrics: &Metrics) {
        let written = self
            .family
            .checked_sub(1)
            .and_then(|i| metrics.families.get(i))
            .map(|f| f.name);
        let families: Vec<proto::MetricFamily> = metrics
            .registry
            .gather()
            .into_iter()
            .filter(|mf| written.is_none_or(|name| mf.name() > name))
            .collect();
        self.small = families.into_iter().peekable();
        self.small_stale = false;
    }
}
