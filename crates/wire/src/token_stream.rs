//! Incremental token counting for one response's text deltas.
//!
//! A tokenizer splits text into pieces before it encodes each piece, and a piece may
//! span what a server sent as two deltas: `"Hi "` encodes to two tokens alone (`"Hi"`,
//! `" "`) but the space belongs to the next word inside `"Hi there"` (`"Hi"`,
//! `" there"`). Counting every delta alone counts such a piece twice, 1.8x the true
//! count on a stream that sends one word and a space per delta. A [`TokenStream`] keeps
//! the text the tokenizer could still join with what comes next, counts text once it is
//! settled ([`TokenStream::push`] returns the tokens a delta settled, often 0) and the
//! rest at the end ([`TokenStream::finish`]).
//!
//! # Where the text is cut
//!
//! Text is settled up to the last *safe cut* in it: a position `c` between two
//! characters `x = T[c-1]` and `y = T[c]` such that
//!
//! - (R1) `x` is not white space and `y` is white space other than `\r` and `\n`, or
//! - (R2) `x` is a letter (`\p{L}`) and `y` is neither a letter, nor a mark (`\p{M}`),
//!   nor an apostrophe `'`.
//!
//! Whether `c` is a cut depends on `x` and `y` only, never on where the deltas were split,
//! so a cut of the whole text is a cut of every suffix that contains it.
//!
//! # Why the sum is exact for the built-in tiktoken encodings
//!
//! `count_ordinary(T)` runs the encoding's pre-tokenizer regex over `T` (leftmost-first
//! matches, one after another) and encodes each match with BPE, which looks at nothing
//! but the match. The claim is `count(T) = count(T[..c]) + count(T[c..])` at every safe
//! cut `c`; applied at each cut the stream settles, the sum of all [`TokenStream::push`]
//! results and [`TokenStream::finish`] is `count(T)`.
//!
//! - Text from `c` on: neither pattern has a look-behind, `^` or `\b`, so a match
//!   starting at `p` depends on `T[p..]` alone, and matching `T[c..]` from its start is
//!   matching `T` from `c`, provided no match of `T` crosses `c` (next point).
//! - Text before `c`: a backtracking matcher's result from a start `p < c` is decided by
//!   the outcomes of the tests it makes. It can only test position `c` after consuming
//!   `x`, and every test it can make there fails both on `y` and at the end of the text
//!   that `T[..c]` has there; the zero-width tests that succeed at the end of a text
//!   (`(?!\S)`, cl100k's `$`) follow only a run of white space, which `x` cannot be part
//!   of under R1 and R2 (R1: `x` is not white space; R2: `x` is a letter). So the same
//!   matches are found in `T` and in `T[..c]` before `c`, and none of them crosses `c`.
//! - The tests possible right after `x`, alternative by alternative (`o200k_base` /
//!   `cl100k_base`): letter and mark classes and the apostrophe of a contraction (after
//!   letters); the letters of a contraction (after `'`, `l`, `r`, `v`); `\p{N}` (after a
//!   digit); `[^\s\p{L}\p{N}]` and `[\r\n/]` / `[\r\n]` (after punctuation or a symbol).
//!   Under R1 `y` is white space but not `\r`/`\n`: all fail. Under R2 `x` is a letter, so
//!   only the letter-side tests are possible, and `y` fails the letter and mark classes,
//!   the apostrophe and every contraction letter. `\s` is Unicode `White_Space`, the same
//!   as [`char::is_whitespace`], and the classes here are matched with the same `regex`
//!   crate tables the encodings use.
//!
//! The property tests in `tests/token_stream.rs` check the sum against `count_ordinary`
//! over multilingual prose, code, emoji sequences and random splits, for both encodings.
//!
//! # Other counters
//!
//! A Hugging Face `tokenizer.json` or any [`TokenCounter`] is cut at the same places. The
//! sum is exact when the counter is additive at these cuts: its pre-tokenizer splits there
//! and treats the start of a text like any other position (a `Split` regex of the GPT-2,
//! cl100k or o200k kind before `ByteLevel` without a prefix space, as in GPT-2, Llama 3
//! and Qwen 2; BERT's white-space and punctuation splitting). Otherwise each settled text
//! after the first may be off by what the counter does differently across its cut or at
//! the start of a text: a SentencePiece-style `Metaspace` pre-tokenizer keeps `word.` as
//! one piece and puts `▁` in front of a text's first word, so it counts at most one piece
//! more per settled text. `push` settles at most once, so the sum is made of at most as
//! many separately counted texts as there are deltas (plus the rest at the end): the same
//! bound as counting each delta alone, but cut where pre-tokenizers split rather than
//! where the server flushed, so most cuts cost nothing (`tests/token_stream.rs` checks
//! both kinds with `--features tokenizers`).
//!
//! # Bounds
//!
//! The pending text is at most [`MAX_PENDING`] bytes (plus at most 3 bytes of an
//! incomplete UTF-8 sequence given to [`TokenStream::push_bytes`]). Text that runs longer
//! without a safe cut (one unbroken word, number, symbol run or run of white space over
//! 4 KiB) is counted as it stands: that forced cut is the only place where the sum can
//! differ from the whole text's count, by the tokens of the one or two pieces it splits.
//! Each `push` scans only the new delta (and the character before it) for cuts and counts
//! at most the pending text and the delta, so its work is proportional to the delta, not
//! to the text so far.

use std::fmt;
use std::sync::{Arc, LazyLock};

use regex::Regex;

use super::tokenize::{TokenCounter, Tokenizer};

/// Most bytes of text kept pending; past it the pending text is counted as it stands.
pub const MAX_PENDING: usize = 4096;

/// The safe cuts (see the module docs), R2 then R1: `x` then `y`, the cut between them.
#[allow(
    clippy::expect_used,
    reason = "a constant pattern: the tests compile it, no input reaches it"
)]
static CUT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\p{L}[^\p{L}\p{M}']|\S[^\S\r\n]").expect("constant pattern compiles")
});

/// Counts the tokens of one response's text as it streams, delta by delta, so that the
/// counts add up to the count of the whole text ([module docs](self)).
#[derive(Clone)]
pub struct TokenStream {
    counter: Arc<dyn TokenCounter>,
    /// Text not yet counted: it starts at a safe cut (or the start of the response).
    pending: String,
    /// The start of an incomplete UTF-8 sequence from [`TokenStream::push_bytes`].
    partial_utf8: Vec<u8>,
}

impl TokenStream {
    /// A stream counting with `counter` (usually [`Tokenizer::stream`](super::Tokenizer::stream)).
    pub fn new(counter: Arc<dyn TokenCounter>) -> TokenStream {
        TokenStream {
            counter,
            pending: String::new(),
            partial_utf8: Vec::new(),
        }
    }

    /// Adds the next delta of text; returns the tokens it settled (possibly 0, possibly
    /// tokens of earlier deltas that only this one settled).
    pub fn push(&mut self, delta: &str) -> u32 {
        if delta.is_empty() {
            return 0;
        }
        let scan_from = self.last_char_start();
        if self.partial_utf8.is_empty() {
            self.pending.push_str(delta);
        } else {
            // A `&str` after an incomplete sequence: the sequence is broken.
            self.partial_utf8.clear();
            self.pending.push(char::REPLACEMENT_CHARACTER);
            self.pending.push_str(delta);
        }
        self.settle(scan_from)
    }

    /// [`TokenStream::push`] for raw bytes that may split a UTF-8 sequence: an incomplete
    /// sequence at the end waits for the next call, and invalid bytes count as
    /// U+FFFD the way [`String::from_utf8_lossy`] of the whole text has them.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> u32 {
        if bytes.is_empty() {
            return 0;
        }
        let scan_from = self.last_char_start();
        if self.partial_utf8.is_empty() {
            self.append_lossy(bytes);
        } else {
            let mut joined = std::mem::take(&mut self.partial_utf8);
            joined.extend_from_slice(bytes);
            self.append_lossy(&joined);
        }
        self.settle(scan_from)
    }

    /// The tokens of the text still pending; the stream is done.
    pub fn finish(mut self) -> u32 {
        if !self.partial_utf8.is_empty() {
            self.pending.push(char::REPLACEMENT_CHARACTER);
        }
        self.count(self.pending.len())
    }

    /// Where to start looking for cuts after appending: the last pending character, which
    /// is `x` of a cut right before the new text.
    fn last_char_start(&self) -> usize {
        self.pending
            .char_indices()
            .next_back()
            .map_or(0, |(start, _)| start)
    }

    /// Counts and drops the pending text up to its last safe cut at or after `scan_from`,
    /// or all of it when what would stay pending is over [`MAX_PENDING`].
    fn settle(&mut self, scan_from: usize) -> u32 {
        let cut = last_cut(&self.pending, scan_from).unwrap_or(0);
        let settle_to = if self.pending.len().saturating_sub(cut) > MAX_PENDING {
            self.pending.len()
        } else {
            cut
        };
        if settle_to == 0 {
            return 0;
        }
        let tokens = self.count(settle_to);
        self.pending.drain(..settle_to);
        tokens
    }

    fn count(&self, end: usize) -> u32 {
        if end == 0 {
            return 0;
        }
        u32::try_from(self.counter.count(&self.pending[..end])).unwrap_or(u32::MAX)
    }

    /// Appends `bytes` to the pending text, lossily, keeping an incomplete sequence at the
    /// end in `partial_utf8`.
    fn append_lossy(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            self.pending.push_str(chunk.valid());
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let incomplete = chunks.peek().is_none()
                && std::str::from_utf8(invalid).is_err_and(|err| err.error_len().is_none());
            if incomplete {
                self.partial_utf8.extend_from_slice(invalid);
            } else {
                self.pending.push(char::REPLACEMENT_CHARACTER);
            }
        }
    }
}

/// The last safe cut in `text` whose `x` starts at or after `from`.
fn last_cut(text: &str, from: usize) -> Option<usize> {
    let mut last = None;
    let mut at = from;
    while let Some(found) = CUT.find_at(text, at) {
        // The cut is after `x`, the match's first character; the next `x` may be this `y`.
        let x_len = text[found.start()..]
            .chars()
            .next()
            .map_or(1, char::len_utf8);
        let cut = found.start().saturating_add(x_len);
        last = Some(cut);
        at = cut;
    }
    last
}

impl fmt::Debug for TokenStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenStream")
            .field("pending_bytes", &self.pending.len())
            .field("partial_utf8", &self.partial_utf8.len())
            .finish()
    }
}

/// Per-response incremental counting.
impl Tokenizer {
    /// A counter for one response's text deltas whose counts add up to the whole text's.
    pub fn stream(&self) -> TokenStream {
        TokenStream::new(self.counter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;

    fn o200k() -> Tokenizer {
        Tokenizer::encoding("o200k_base").expect("o200k")
    }

    #[test]
    fn a_trailing_space_waits_for_the_next_word() {
        let tokenizer = o200k();
        let mut stream = tokenizer.stream();
        // "Hi" is settled by the space after it; " " may still join the next word.
        assert_eq!(stream.push("Hi "), 1);
        assert_eq!(stream.push("there"), 0);
        // " there" and "." are settled by the space; the space waits.
        assert_eq!(stream.push(". "), 2);
        assert_eq!(stream.finish(), 1);
        assert_eq!(tokenizer.count("Hi there. "), 4);
    }

    #[test]
    fn cuts_are_found_only_where_the_rules_say() {
        // R1 before the space; R2 between a letter and punctuation or a digit.
        assert_eq!(last_cut("Hi there", 0), Some(2));
        assert_eq!(last_cut("word.", 0), Some(4));
        assert_eq!(last_cut("abc123", 0), Some(3));
        // Not after white space, not before a newline after punctuation, not before an
        // apostrophe or a mark, not inside a word.
        assert_eq!(last_cut(" \n  x", 0), None);
        assert_eq!(last_cut(".\n", 0), None);
        assert_eq!(last_cut("they're", 0), None);
        assert_eq!(last_cut("e\u{301}", 0), None);
        assert_eq!(last_cut("nothing", 0), None);
        // A letter before a newline is a cut (R2), and overlapping cuts are all found.
        assert_eq!(last_cut("a,\n", 0), Some(1));
        assert_eq!(last_cut("a, b", 0), Some(2));
        // CJK has no spaces: cuts between a letter and punctuation.
        assert_eq!(last_cut("你好，世界", 0), Some(6));
        assert_eq!(last_cut("你好，世界。", 0), Some(15));
        // Only cuts whose `x` starts at or after `from`.
        assert_eq!(last_cut("Hi there", 3), None);
    }

    #[test]
    fn pending_text_is_bounded() {
        let tokenizer = o200k();
        let mut stream = tokenizer.stream();
        let word = "a".repeat(MAX_PENDING);
        assert_eq!(stream.push(&word), 0, "exactly the bound stays pending");
        assert_eq!(stream.pending.len(), MAX_PENDING);
        let forced = stream.push("a");
        assert_eq!(forced, tokenizer.count(&"a".repeat(MAX_PENDING + 1)) as u32);
        assert_eq!(stream.pending.len(), 0);
        // A cut inside a long delta settles what precedes it, and the rest stays within
        // the bound.
        let mut stream = tokenizer.stream();
        let long = format!("{} end", "b".repeat(2 * MAX_PENDING));
        let settled = stream.push(&long);
        assert_eq!(
            settled,
            tokenizer.count(&"b".repeat(2 * MAX_PENDING)) as u32
        );
        assert_eq!(stream.pending, " end");
    }

    #[test]
    fn a_forced_cut_is_the_only_inexact_case_and_stays_close() {
        let tokenizer = o200k();
        // 3 * MAX_PENDING letters without a cut: settled as they stand twice.
        let text = "xyz".repeat(MAX_PENDING);
        let mut stream = tokenizer.stream();
        let mut sum = 0;
        for chunk in text.as_bytes().chunks(1000) {
            let chunk = std::str::from_utf8(chunk).expect("ascii");
            sum += u64::from(stream.push(chunk));
            assert!(stream.pending.len() <= MAX_PENDING);
        }
        sum += u64::from(stream.finish());
        let whole = tokenizer.count(&text);
        let forced_cuts = 2;
        assert!(
            sum.abs_diff(whole) <= 2 * forced_cuts,
            "sum {sum} whole {whole}"
        );
    }

    #[test]
    fn bytes_split_inside_a_utf8_sequence_wait_for_the_rest() {
        let tokenizer = o200k();
        let text = "naïve 你好 👩\u{200d}💻 done";
        let mut stream = tokenizer.stream();
        let mut sum = 0u64;
        for byte in text.as_bytes() {
            sum += u64::from(stream.push_bytes(std::slice::from_ref(byte)));
        }
        sum += u64::from(stream.finish());
        assert_eq!(sum, tokenizer.count(text));
    }

    #[test]
    fn invalid_bytes_count_like_a_lossy_decoding_of_the_whole() {
        let tokenizer = o200k();
        let parts: [&[u8]; 5] = [
            b"ok \xF0\x9F",
            b"\x98",
            b"x \xE4\xBD",
            b"\xFF tail \xC3",
            b"",
        ];
        let whole: Vec<u8> = parts.concat();
        let mut stream = tokenizer.stream();
        let mut sum: u64 = parts.iter().map(|p| u64::from(stream.push_bytes(p))).sum();
        sum += u64::from(stream.finish());
        assert_eq!(sum, tokenizer.count(&String::from_utf8_lossy(&whole)));
        // An incomplete sequence followed by a `&str` is broken: one U+FFFD.
        let mut stream = tokenizer.stream();
        let mut sum = u64::from(stream.push_bytes(b"a \xE4\xBD"));
        sum += u64::from(stream.push("b c"));
        sum += u64::from(stream.finish());
        assert_eq!(sum, tokenizer.count("a \u{FFFD}b c"));
    }

    #[test]
    fn a_generic_counter_is_cut_at_white_space() {
        let words = Tokenizer::new(
            "words",
            Arc::new(|t: &str| t.split_whitespace().count()) as Arc<dyn TokenCounter>,
        );
        let mut stream = words.stream();
        let text = ["one tw", "o thr", "ee ", " four"];
        let mut sum: u64 = text.iter().map(|d| u64::from(stream.push(d))).sum();
        sum += u64::from(stream.finish());
        assert_eq!(sum, 4, "a word split across deltas is one word");
        let per_delta: u64 = text.iter().map(|d| words.count(d)).sum();
        assert_eq!(per_delta, 6);
    }
}
