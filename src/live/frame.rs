//! The live API's data, as the server writes it and as `tokentap top` reads it back: one
//! set of types, so a field the server renames or retypes is a compile error or a failing
//! round trip in top, not a column that silently goes blank. docs/LIVE.md documents it.
//!
//! The server fills and serializes them ([`super`]). A reader deserializes them from a
//! server it does not trust, so reading is bounded and clean, whatever the server sent:
//! - every string is [`shown`] as it is read: no control character, bidirectional override
//!   or line break survives, and at most [`MAX_TEXT_CHARS`] characters are kept;
//! - every list is read into [`Rows`], which keeps its first `N` items and skips the rest
//!   unread, counting them; outcome names are kept only when they are the ones tokentap
//!   counts;
//! - what top does not draw (the bucket bounds, heatmaps, the slowest requests, the
//!   latest column) is skipped unread;
//! - a number of the wrong type or range fails the frame, which the reader drops.
//!
//! An event is bounded before it is parsed (top's SSE decoder refuses one over 1 MiB), so
//! what parsing keeps is bounded by the caps here.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::outcome::Outcome;

/// Characters of one server string kept when read (the label policy's default cap on a
/// label value is 128 bytes).
pub const MAX_TEXT_CHARS: usize = 128;
/// Models read from a frame: every model the live view keeps, `other` and `unknown`.
pub const MAX_MODEL_ROWS: usize = crate::live::window::MAX_MODELS + 2;
/// Requests in flight a frame lists (the longest running; the total is given), and reads.
pub const MAX_STREAM_ROWS: usize = 20;
/// Objectives read per model or request: as many as the config allows.
pub const MAX_OBJECTIVE_ROWS: usize = crate::config::MAX_OBJECTIVES;

/// A server string as a reader shows it: every control character (C0, DEL and C1, which
/// start or carry every terminal escape sequence, and line breaks) and every character
/// that reorders or breaks the text around it (bidirectional overrides and isolates, line
/// and paragraph separators) becomes `�`, and at most [`MAX_TEXT_CHARS`] characters are
/// kept, the last of them `…` when cut. What is left is printable text.
pub fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_TEXT_CHARS * 4));
    for (i, c) in text.chars().enumerate() {
        if i + 1 == MAX_TEXT_CHARS && text.chars().nth(MAX_TEXT_CHARS).is_some() {
            out.push('…');
            break;
        }
        let unsafe_char = c.is_control()
            || matches!(
                c,
                '\u{061C}'
                    | '\u{200E}'
                    | '\u{200F}'
                    | '\u{2028}'..='\u{202E}'
                    | '\u{2066}'..='\u{2069}'
            );
        out.push(if unsafe_char { '\u{FFFD}' } else { c });
    }
    out
}

/// A list: written whole; read as its first `N` items, the rest skipped unread and counted.
#[derive(Clone, Debug, PartialEq)]
pub struct Rows<T, const N: usize> {
    pub kept: Vec<T>,
    /// Items past `N` in what was read (0 for what the server built).
    pub skipped: u64,
}

impl<T, const N: usize> Default for Rows<T, N> {
    fn default() -> Self {
        Rows {
            kept: Vec::new(),
            skipped: 0,
        }
    }
}

impl<T, const N: usize> From<Vec<T>> for Rows<T, N> {
    fn from(kept: Vec<T>) -> Self {
        Rows { kept, skipped: 0 }
    }
}

impl<T: Serialize, const N: usize> Serialize for Rows<T, N> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.kept.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Rows<T, N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
            type Value = Rows<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Rows<T, N>, A::Error> {
                let mut rows = Rows::default();
                while rows.kept.len() < N {
                    match seq.next_element()? {
                        Some(row) => rows.kept.push(row),
                        None => return Ok(rows),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    rows.skipped = rows.skipped.saturating_add(1);
                }
                Ok(rows)
            }
        }
        deserializer.deserialize_seq(V(PhantomData))
    }
}

/// Reads a string keeping no more of it than [`shown`] does.
struct ShownVisitor;

impl Visitor<'_> for ShownVisitor {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(shown(v))
    }
}

/// Deserializes a string as [`shown`].
struct Shown(String);

impl<'de> Deserialize<'de> for Shown {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(ShownVisitor).map(Shown)
    }
}

fn text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Arc<str>, D::Error> {
    Ok(Arc::from(Shown::deserialize(deserializer)?.0))
}

fn optional_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<str>>, D::Error> {
    Ok(Option::<Shown>::deserialize(d)?.map(|s| Arc::from(s.0)))
}

fn optional_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Shown>::deserialize(d)?.map(|s| s.0))
}

fn cow_text<'de, D: Deserializer<'de>>(d: D) -> Result<Cow<'static, str>, D::Error> {
    Ok(Cow::Owned(Shown::deserialize(d)?.0))
}

/// Requests by outcome: only the outcomes tokentap counts are kept, each once.
fn outcome_counts<'de, D: Deserializer<'de>>(d: D) -> Result<Outcomes, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Outcomes;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of outcome to count")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Outcomes, A::Error> {
            let mut out = Outcomes::new();
            while let Some(name) = map.next_key::<Shown>()? {
                match Outcome::ALL.iter().find(|o| o.as_str() == name.0) {
                    Some(o) => {
                        out.insert(Cow::Borrowed(o.as_str()), map.next_value()?);
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(out)
        }
    }
    d.deserialize_map(V)
}

/// Requests by outcome.
pub type Outcomes = BTreeMap<Cow<'static, str>, u64>;

/// A finished request as the live view shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Finished {
    #[serde(deserialize_with = "text")]
    pub model: Arc<str>,
    #[serde(deserialize_with = "text")]
    pub tenant: Arc<str>,
    #[serde(deserialize_with = "cow_text")]
    pub outcome: Cow<'static, str>,
    pub status: Option<u16>,
    /// When it ended, ms since the Unix epoch.
    pub ended_ms: u64,
    pub duration_s: f64,
    pub ttft_s: Option<f64>,
    pub slowest_gap_s: Option<f64>,
    pub output_tokens: u64,
    /// Its tokens reached tokentap in one burst (a buffering hop).
    pub buffered: bool,
    /// The objectives that judged it, in name order, with whether it met each.
    pub objectives: Rows<Judged, MAX_OBJECTIVE_ROWS>,
    /// W3C trace id, when the request carried a trace context that was read
    /// (`metrics.exemplars.enabled`).
    #[serde(deserialize_with = "optional_string")]
    pub trace_id: Option<String>,
}

/// One objective's judgement of a finished request.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Judged {
    #[serde(deserialize_with = "text")]
    pub objective: Arc<str>,
    pub met: bool,
}

/// The finite bucket bounds of the TTFT and ITL histograms.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Bounds {
    pub ttft: Arc<[f64]>,
    pub itl: Arc<[f64]>,
}

/// A tick's frame, or the snapshot (with `heatmap` and `ring_bytes`).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Frame {
    pub at_ms: u64,
    pub window_s: u64,
    #[serde(skip_deserializing)]
    pub bounds: Bounds,
    pub models: Rows<ModelFigures, MAX_MODEL_ROWS>,
    pub in_flight: InFlight,
    pub models_over_cap: usize,
    /// The ring's memory now (snapshot only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", skip_deserializing)]
    pub heatmap: Option<Heatmap>,
    #[serde(skip_deserializing)]
    pub slowest: Vec<Finished>,
}

/// The requests in flight: how many, and the longest running.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct InFlight {
    pub total: usize,
    pub streams: Rows<StreamFigures, MAX_STREAM_ROWS>,
}

/// One request in flight.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamFigures {
    /// `None` until the request body (or, for a request that names none, the response)
    /// names the model.
    #[serde(deserialize_with = "optional_text")]
    pub model: Option<Arc<str>>,
    #[serde(deserialize_with = "text")]
    pub tenant: Arc<str>,
    /// What it waits for: `waiting_head`, `waiting_first_token` or `streaming`.
    #[serde(deserialize_with = "cow_text")]
    pub phase: Cow<'static, str>,
    pub elapsed_s: f64,
    pub tokens: u64,
    /// Tokens per second from the request head to the latest event.
    pub tokens_per_s: Option<f64>,
    pub largest_gap_s: Option<f64>,
    /// Seconds since the latest token-bearing event (a stream stalled right now).
    pub since_last_event_s: Option<f64>,
}

/// One tick's TTFT and ITL bucket counts.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Column {
    pub ttft: Vec<u32>,
    pub itl: Vec<u32>,
}

/// A histogram over the window: its count, mean and quantiles.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Quantiles {
    pub count: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

/// One model's figures over the window.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelFigures {
    #[serde(deserialize_with = "text")]
    pub model: Arc<str>,
    /// Seconds the window covers (less than asked while the ring fills).
    pub covered_s: f64,
    pub requests: u64,
    pub requests_per_s: f64,
    /// Requests by outcome (every outcome, zeros included).
    #[serde(deserialize_with = "outcome_counts")]
    pub outcomes: Outcomes,
    pub output_tokens: u64,
    pub tokens_per_s: f64,
    pub in_flight: usize,
    pub ttft: Quantiles,
    pub itl: Quantiles,
    /// The latest tick's TTFT and ITL bucket counts: the heatmaps' newest column.
    #[serde(skip_deserializing)]
    pub column: Column,
    /// Each objective that judged the model's requests in the window, in name order.
    pub objectives: Rows<Attainment, MAX_OBJECTIVE_ROWS>,
}

/// One objective's requests over the window: how many met and missed it, and the share
/// that met it (`None` with none judged).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Attainment {
    #[serde(deserialize_with = "text")]
    pub objective: Arc<str>,
    pub met: u64,
    pub missed: u64,
    pub attainment: Option<f64>,
}

impl Attainment {
    /// The share of `met + missed` judged requests that met the objective; `None` with
    /// none judged. The server fills `attainment` with it, and a reader that does not
    /// trust the server's ratio computes it again from the counts it read.
    pub fn share(met: u64, missed: u64) -> Option<f64> {
        let judged = met.saturating_add(missed);
        (judged > 0).then(|| met as f64 / judged as f64)
    }
}

/// Per model, one TTFT and one ITL column of bucket counts per tick, oldest first.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Heatmap {
    pub at_ms: Vec<u64>,
    pub models: BTreeMap<Arc<str>, Columns>,
}

/// One model's heatmap columns.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Columns {
    pub ttft: Vec<Vec<u32>>,
    pub itl: Vec<Vec<u32>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way a string could drive a terminal, and text that must pass unchanged.
    #[test]
    fn shown_leaves_no_control_character() {
        let cases: &[(&str, &str)] = &[
            // OSC 0 (title) ended by BEL, OSC 2 ended by ST (ESC \).
            ("\x1b]0;pwned\x07x", "�]0;pwned�x"),
            ("\x1b]2;pwned\x1b\\x", "�]2;pwned�\\x"),
            // OSC 52: a clipboard write.
            ("\x1b]52;c;cHduZWQ=\x07", "�]52;c;cHduZWQ=�"),
            // The alternate screen, a clear screen, a cursor move.
            ("\x1b[?1049h\x1b[2J\x1b[H", "�[?1049h�[2J�[H"),
            // C1 controls: OSC ... ST, CSI, NEL, and the rest of the C1 range.
            ("\u{9d}0;pwned\u{9c}", "�0;pwned�"),
            ("\u{9b}?1049h", "�?1049h"),
            ("a\u{85}b\u{80}c\u{9f}", "a�b�c�"),
            // C0: NUL, BS, TAB, LF, CR, DEL.
            ("a\0b\x08c\td\ne\rf\x7f", "a�b�c�d�e�f�"),
            // Reordering: bidi overrides, isolates and marks; line and paragraph breaks.
            ("abc\u{202e}fed", "abc�fed"),
            ("\u{2066}x\u{2069}\u{200f}\u{061c}", "�x���"),
            ("a\u{2028}b\u{2029}c", "a�b�c"),
            // Printable text, wide and combining characters pass unchanged.
            ("llama-3.1-8b", "llama-3.1-8b"),
            ("modèle 中文 🦙 e\u{301}", "modèle 中文 🦙 e\u{301}"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(&shown(input), want, "{input:?}");
            assert!(!shown(input).chars().any(char::is_control), "{input:?}");
        }
    }

    #[test]
    fn shown_keeps_at_most_max_text_chars() {
        let exact = "é".repeat(MAX_TEXT_CHARS);
        assert_eq!(shown(&exact), exact);
        let long = shown(&"é".repeat(MAX_TEXT_CHARS + 1));
        assert_eq!(long.chars().count(), MAX_TEXT_CHARS);
        assert!(long.ends_with("é…"), "{long}");
        let huge = shown(&"\x1b".repeat(1 << 20));
        assert_eq!(huge.chars().count(), MAX_TEXT_CHARS);
    }

    /// What the server writes, a reader reads back: every field top draws, equal.
    #[test]
    fn a_frame_reads_back_as_it_was_written() {
        let mut outcomes = Outcomes::new();
        for o in Outcome::ALL {
            outcomes.insert(Cow::Borrowed(o.as_str()), 0);
        }
        outcomes.insert(Cow::Borrowed("completed"), 9);
        let written = Frame {
            at_ms: 1_764_784_153_000,
            window_s: 60,
            bounds: Bounds {
                ttft: Arc::from([0.1, 0.5]),
                itl: Arc::from([0.01]),
            },
            models: Rows::from(vec![ModelFigures {
                model: Arc::from("llama-3.1-8b"),
                covered_s: 60.0,
                requests: 10,
                requests_per_s: 0.17,
                outcomes,
                output_tokens: 400,
                tokens_per_s: 6.7,
                in_flight: 2,
                ttft: Quantiles {
                    count: 9,
                    mean: Some(0.12),
                    p50: Some(0.1),
                    p90: Some(0.2),
                    p99: Some(0.3),
                },
                itl: Quantiles::default(),
                column: Column {
                    ttft: vec![1, 2, 3],
                    itl: vec![4, 5],
                },
                objectives: Rows::from(vec![Attainment {
                    objective: Arc::from("interactive"),
                    met: 8,
                    missed: 1,
                    attainment: Some(8.0 / 9.0),
                }]),
            }]),
            in_flight: InFlight {
                total: 1,
                streams: Rows::from(vec![StreamFigures {
                    model: None,
                    tenant: Arc::from("team-chat"),
                    phase: Cow::Borrowed("waiting_head"),
                    elapsed_s: 0.4,
                    tokens: 0,
                    tokens_per_s: None,
                    largest_gap_s: None,
                    since_last_event_s: None,
                }]),
            },
            models_over_cap: 0,
            ring_bytes: Some(4096),
            heatmap: Some(Heatmap::default()),
            slowest: vec![Finished::default()],
        };
        let json = serde_json::to_string(&written).expect("serializes");
        let read: Frame = serde_json::from_str(&json).expect("reads back");
        // What a reader skips is left empty; the rest is equal, field by field.
        let mut expected = serde_json::to_value(&written).expect("a value");
        for skipped in ["bounds", "heatmap", "slowest"] {
            expected.as_object_mut().expect("an object").remove(skipped);
        }
        expected["models"][0]
            .as_object_mut()
            .expect("an object")
            .remove("column");
        let mut got = serde_json::to_value(&read).expect("a value");
        for skipped in ["bounds", "slowest"] {
            got.as_object_mut().expect("an object").remove(skipped);
        }
        got["models"][0]
            .as_object_mut()
            .expect("an object")
            .remove("column");
        assert_eq!(got, expected);
    }

    #[test]
    fn outcome_names_are_read_only_when_they_are_outcomes() {
        let read: ModelFigures = serde_json::from_str(
            r#"{"outcomes": {"completed": 3, "\u001b[2J": 7, "timeout": 1, "other": 5}}"#,
        )
        .expect("reads");
        let names: Vec<&str> = read.outcomes.keys().map(|k| &**k).collect();
        assert_eq!(names, ["completed", "timeout"]);
    }
}
