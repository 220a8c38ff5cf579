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
pub(crate) fn estimate_tokens(text: &str) -> u64 {
    let mut count = 0u64;
    let mut in_word = false;
    for c in text.chars() {
        let starts_token = if c.is_ascii() {
            if c.is_ascii_alphanumeric() {
                let first = !in_word;
                in_word = true;
                first
            } else {
                in_word = false;
                !c.is_ascii_whitespace()
            }
        } else if c.is_whitespace() {
            in_word = false;
            false
        } else if c >= '\u{2E80}' {
            in_word = false;
            true
        } else if c.is_alphanumeric() {
            let first = !in_word;
            in_word = true;
            first
        } else {
            in_word = false;
            true
        };
        count = count.saturating_add(u64::from(starts_token));
    }
    count
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
    fn invalid_utf8_is_a_symbol() {
        assert_eq!(estimate_bytes(b" two words"), 2);
        assert_eq!(estimate_bytes(b"a\xffb"), 3);
        assert_eq!(estimate_bytes("é".as_bytes()), 1);
    }
}
