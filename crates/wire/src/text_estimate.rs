//! A tokenizer-free guess at how many tokens a piece of output text holds, from its shape.
//!
//! Where a wire format gives no per-event count and no `observe.tokenizer` is configured,
//! the event's estimate is this guess, so that an event carrying three words weighs three
//! times one carrying one when the reported N is apportioned over the gaps
//! (docs/DIALECTS.md, "How close each count gets"). The decoders call it on each output
//! string as their serde parse hands it over ([`super::json::Text`]), so the estimate
//! costs a walk over the text alone, never a second pass over the event.

/// The tokens in `text`, split the way BPE pre-tokenizers split it: each run of letters
/// and digits is one (with the space before it, as in `" token"`), each other visible
/// character (punctuation, symbols) one, and each character from U+2E80 on (CJK, kana,
/// Hangul, emoji: about one token apiece) one; whitespace counts for nothing. Common
/// English words are one token each in the usual vocabularies, so on English prose this
/// is close; long or rare words and code are undercounted. Once N is reported only the
/// proportions between events matter.
#[inline]
pub(crate) fn estimate_tokens(text: &str) -> u64 {
    estimate_ascii(text.as_bytes()).unwrap_or_else(|| estimate_chars(text))
}

/// The rule, a character at a time. Out of line: inlined, its registers were saved and
/// restored on every call of the ASCII path.
#[cold]
#[inline(never)]
fn estimate_chars(text: &str) -> u64 {
    let mut count = 0u64;
    let mut in_word = false;
    for c in text.chars() {
        let (word, space) = if c.is_ascii() {
            (c.is_ascii_alphanumeric(), c.is_ascii_whitespace())
        } else {
            let wide = c >= '\u{2E80}';
            (!wide && c.is_alphanumeric(), c.is_whitespace())
        };
        let starts_token = if word { !in_word } else { !space };
        count = count.saturating_add(u64::from(starts_token));
        in_word = word;
    }
    count
}

/// A byte's class, as bits: a letter or digit, a symbol (any other visible ASCII
/// character, one token each), or not ASCII at all. ASCII whitespace is none of them.
const WORD: u8 = 1;
const SYMBOL: u8 = 2;
const NOT_ASCII: u8 = 4;

#[allow(
    clippy::indexing_slicing,
    reason = "evaluated at compile time: an index out of bounds fails the build"
)]
const CLASS: [u8; 256] = {
    let mut table = [NOT_ASCII; 256];
    let mut byte = 0;
    while byte < 128 {
        let c = byte as u8;
        table[byte] = if c.is_ascii_alphanumeric() {
            WORD
        } else if c.is_ascii_whitespace() {
            0
        } else {
            SYMBOL
        };
        byte += 1;
    }
    table
};

/// [`estimate_chars`] of text that is all ASCII, a byte at a time through a table and
/// without a branch (this runs on every streamed output string, most of them a word
/// long); `None` when some byte is not ASCII.
fn estimate_ascii(bytes: &[u8]) -> Option<u64> {
    let mut count = 0u64;
    let mut word_before = 0u8;
    let mut seen = 0u8;
    for &byte in bytes {
        // The table has all 256 entries: the lookup cannot miss.
        let class = CLASS.get(usize::from(byte)).copied().unwrap_or(NOT_ASCII);
        let word = class & WORD;
        // A symbol, or a letter or digit after something else. At most one per byte,
        // so the count cannot wrap.
        let starts = (class >> 1 | word & !word_before) & 1;
        count = count.wrapping_add(u64::from(starts));
        word_before = word;
        seen |= class;
    }
    (seen & NOT_ASCII == 0).then_some(count)
}

/// [`estimate_tokens`] of bytes that should be UTF-8 (a gRPC tensor's text): the invalid
/// sequences count as symbols, one each.
pub(crate) fn estimate_bytes(bytes: &[u8]) -> u64 {
    bytes
        .utf8_chunks()
        .map(|chunk| {
            let invalid = u64::from(!chunk.invalid().is_empty());
            estimate_tokens(chunk.valid()).saturating_add(invalid)
        })
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_symbols_and_wide_characters() {
        assert_eq!(estimate_tokens(" the token streams"), 3);
        assert_eq!(estimate_tokens(" boundary."), 2);
        assert_eq!(estimate_tokens("fn f(x: u32) {}"), 9);
        assert_eq!(estimate_tokens("get_weather"), 3);
        assert_eq!(estimate_tokens("{\"city\""), 4);
        assert_eq!(estimate_tokens("café über"), 2, "letters beyond ASCII");
        assert_eq!(estimate_tokens("トークン数"), 5);
        assert_eq!(estimate_tokens("ok 👍"), 2);
        assert_eq!(estimate_tokens(" \n\t\u{3000}"), 0, "whitespace is nothing");
        assert_eq!(estimate_tokens(""), 0);
    }

    #[test]
    fn eight_bytes_at_a_time_agrees_with_a_character_at_a_time() {
        let alphabet: Vec<u8> = (0u8..128).collect();
        // Every ASCII string of up to two bytes, then every length up to 40 over a
        // generator's strings: word boundaries across the eight-byte words, tails, and
        // each class beside each other.
        let mut texts: Vec<Vec<u8>> = vec![vec![]];
        for &a in &alphabet {
            texts.push(vec![a]);
            for &b in &alphabet {
                texts.push(vec![a, b]);
            }
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 3..=40 {
            for _ in 0..500 {
                let text = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        b"aZ9 \t\n\x0b\x0c\r.,_-{}\x00\x7f"[(state % 17) as usize]
                    })
                    .collect();
                texts.push(text);
            }
        }
        for text in texts {
            let text = String::from_utf8(text).expect("ASCII");
            assert_eq!(
                estimate_ascii(text.as_bytes()),
                Some(estimate_chars(&text)),
                "{text:?}"
            );
        }
        assert_eq!(estimate_ascii("ok é".as_bytes()), None);
        assert_eq!(
            estimate_ascii("ok ok ok é".as_bytes()),
            None,
            "in the second word"
        );
    }

    #[test]
    fn invalid_utf8_is_a_symbol() {
        assert_eq!(estimate_bytes(b" two words"), 2);
        assert_eq!(estimate_bytes(b"a\xffb"), 3);
        assert_eq!(estimate_bytes("é".as_bytes()), 1);
    }
}
