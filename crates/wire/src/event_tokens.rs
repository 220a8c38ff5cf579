//! Token counts of the output texts in one event, for the dialects whose wire format gives
//! no exact count. With `observe.tokenizer` the texts are pushed into the response's
//! incremental [`TokenStream`], so the counts of one response add up to its whole text's,
//! and what is still pending at the end goes to the last event
//! ([`Signal::TrailingTokens`]). Without one the count is the text-shape estimate the
//! decoder summed while parsing the event ([`super::text_estimate`]). It sits on top of
//! [`tokenize`](super::tokenize) and [`token_stream`](super::token_stream), which know
//! nothing of events.

use super::token_stream::TokenStream;
use super::types::Signal;

/// Picks the output texts out of one event's JSON, calling back with each.
pub(crate) type SelectTexts = fn(&serde_json::Value, &mut dyn FnMut(&str));

/// The estimated tokens of one token-bearing event, for when the wire format gave no
/// exact count. With a tokenizer (`tokens`), what the texts `select` finds in the
/// event's JSON `data` settle in the response's incremental count (possibly 0: text a
/// later delta may still join; see [`TokenStream`]), or `None` when the event holds no
/// text. Without one, `shape`: the [`estimate_tokens`](super::text_estimate::estimate_tokens)
/// of the event's output texts, which the decoder summed as it parsed them, at least 1
/// (the event carried output, if only whitespace). Inlined for the estimate (every event
/// without a tokenizer); the tokenizer's count is out of line.
#[inline]
pub(crate) fn count_event(
    tokens: Option<&mut TokenStream>,
    data: &[u8],
    select: SelectTexts,
    shape: u64,
) -> Option<u64> {
    match tokens {
        None => Some(shape.max(1)),
        Some(tokens) => tokenized(tokens, data, select),
    }
}

#[inline(never)]
fn tokenized(tokens: &mut TokenStream, data: &[u8], select: SelectTexts) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_slice(data).ok()?;
    let mut total = 0u64;
    let mut any_text = false;
    select(&value, &mut |text: &str| {
        if !text.is_empty() {
            any_text = true;
            total = total.saturating_add(u64::from(tokens.push(text)));
        }
    });
    any_text.then_some(total)
}

/// The response ended: the tokens of the text still pending in `tokens` belong to the
/// last token-bearing event ([`Signal::TrailingTokens`]).
pub(crate) fn finish_count(tokens: &mut Option<TokenStream>, out: &mut Vec<Signal>) {
    if let Some(stream) = tokens.take() {
        let trailing = stream.finish();
        if trailing > 0 {
            out.push(Signal::TrailingTokens(trailing));
        }
    }
}

/// Text helpers for the dialects' `select` functions.
pub(crate) mod text {
    use serde_json::Value;

    /// A string as is; an array of strings or of content parts (`{"text": ...}`) part by
    /// part; anything else is no text.
    pub(crate) fn of(value: Option<&Value>, f: &mut dyn FnMut(&str)) {
        match value {
            Some(Value::String(s)) => f(s),
            Some(Value::Array(items)) => {
                for item in items {
                    match item {
                        Value::String(s) => f(s),
                        Value::Object(part) => {
                            if let Some(Value::String(s)) = part.get("text") {
                                f(s);
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    /// Tool-call arguments: a string (streamed JSON text) as is, a structured value as
    /// its compact JSON, which is about what the model wrote.
    pub(crate) fn arguments(value: Option<&Value>, f: &mut dyn FnMut(&str)) {
        match value {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => f(s),
            Some(other) => f(&other.to_string()),
        }
    }

    /// The elements of an array (nothing for anything else).
    pub(crate) fn each(value: Option<&Value>) -> impl Iterator<Item = &Value> {
        value
            .and_then(Value::as_array)
            .map(|items| items.iter())
            .into_iter()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::tokenize::{TokenCounter, Tokenizer};

    #[test]
    fn without_a_tokenizer_the_shape_is_the_count() {
        let select: SelectTexts = |v, f| text::of(v.get("text"), f);
        let data = br#"{"text":"one two three"}"#;
        assert_eq!(count_event(None, data, select, 3), Some(3));
        // Output that is only whitespace is still an event with output: one token.
        assert_eq!(count_event(None, br#"{"text":" "}"#, select, 0), Some(1));
    }

    #[test]
    fn a_tokenizer_counts_the_event_text_whatever_the_shape() {
        let select: SelectTexts = |v, f| text::of(v.get("text"), f);
        let data = br#"{"text":"one two three"}"#;
        let words = Tokenizer::new(
            "words",
            Arc::new(|t: &str| t.split_whitespace().count()) as Arc<dyn TokenCounter>,
        );
        // The event settles "one two"; " three" could still join what follows, so it
        // is counted at the end, for the last event.
        let mut tokens = Some(words.stream());
        assert_eq!(count_event(tokens.as_mut(), data, select, 9), Some(2));
        assert_eq!(
            count_event(tokens.as_mut(), br#"{"text":""}"#, select, 9),
            None
        );
        assert_eq!(count_event(tokens.as_mut(), b"not json", select, 9), None);
        let mut out = Vec::new();
        finish_count(&mut tokens, &mut out);
        assert_eq!(out, vec![Signal::TrailingTokens(1)]);
        assert!(tokens.is_none(), "finished once");
        // Parts are one text: "a b" then "c" is "a bc", two words (not three).
        let mut tokens = Some(words.stream());
        let parts = br#"{"text":["a b",{"type":"text","text":"c"},7]}"#;
        assert_eq!(count_event(tokens.as_mut(), parts, select, 9), Some(1));
        let mut out = Vec::new();
        finish_count(&mut tokens, &mut out);
        assert_eq!(out, vec![Signal::TrailingTokens(1)]);
        // Nothing pending: nothing at the end.
        let mut tokens = Some(words.stream());
        let mut out = Vec::new();
        finish_count(&mut tokens, &mut out);
        assert!(out.is_empty());
    }
}
