//! Reads `model` and `stream` from a JSON request body as it streams upstream.
//!
//! The body is never buffered: an incremental scanner walks the bytes once, tracking only
//! nesting depth and string state, and captures the values of the two top-level keys it
//! cares about (bounded). So `model` is found even after a megabyte of prompt, the memory
//! cost is a few hundred bytes whatever the body size, and forwarding never waits.

use memchr::memchr2;

/// Longest `model` value captured (raw JSON string bytes); a longer one is reported as
/// [`RequestScanner::model_too_long`], not captured.
pub const MAX_VALUE: usize = 256;
/// Longest top-level key captured; longer keys are not ones we look for.
const MAX_KEY: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Model,
    Stream,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the opening `{` of the document.
    Start,
    /// Inside the document, outside any string.
    Structure,
    /// Inside a string; `escape` after a backslash.
    Str { escape: bool },
    /// The document is not a JSON object, or it ended: nothing more to learn.
    Done,
}

/// Incremental scanner for the top-level `model` (string) and `stream` (bool) fields.
#[derive(Debug)]
pub struct RequestScanner {
    state: State,
    depth: u32,
    /// At depth 1, whether the next string is a key (after `{` or `,`).
    expect_key: bool,
    /// Capturing the string being scanned: a top-level key, or a wanted value.
    capture: Option<Vec<u8>>,
    capturing_key: bool,
    /// The key whose value comes next (after `:`).
    pending: Option<Target>,
    /// Raw bytes of a literal value at depth 1 (`true`/`false`).
    literal: Vec<u8>,
    model: Option<String>,
    /// The top-level `model` was a string longer than [`MAX_VALUE`].
    model_too_long: bool,
    stream: Option<bool>,
}

impl Default for RequestScanner {
    fn default() -> Self {
        RequestScanner::new()
    }
}

impl RequestScanner {
    pub fn new() -> Self {
        RequestScanner {
            state: State::Start,
            depth: 0,
            expect_key: false,
            capture: None,
            capturing_key: false,
            pending: None,
            literal: Vec::new(),
            model: None,
            model_too_long: false,
            stream: None,
        }
    }

    /// The `model` found so far.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Whether the top-level `model` is a string too long to capture: present, so not
    /// "missing", but with no value a label could use.
    pub fn model_too_long(&self) -> bool {
        self.model_too_long
    }

    /// The `stream` flag found so far.
    pub fn stream(&self) -> Option<bool> {
        self.stream
    }

    /// Whether there is nothing more to learn from the rest of the body.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
            || ((self.model.is_some() || self.model_too_long) && self.stream.is_some())
    }

    /// Scan the next bytes of the body.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while let Some((&b, rest)) = bytes.split_first() {
            if self.is_done() {
                return;
            }
            match self.state {
                State::Done => return,
                State::Start => {
                    bytes = rest;
                    match b {
                        b'{' => {
                            self.state = State::Structure;
                            self.depth = 1;
                            self.expect_key = true;
                        }
                        b' ' | b'\t' | b'\r' | b'\n' => {}
                        // A UTF-8 byte-order mark is tolerated before the document.
                        0xEF | 0xBB | 0xBF => {}
                        _ => self.state = State::Done,
                    }
                }
                State::Str { escape } => {
                    if escape {
                        self.push_capture(b);
                        bytes = rest;
                        self.state = State::Str { escape: false };
                        continue;
                    }
                    match memchr2(b'"', b'\\', bytes) {
                        None => {
                            self.extend_capture(bytes);
                            bytes = &[];
                        }
                        Some(i) => {
                            // `at` starts with the quote or backslash found.
                            let (before, at) = bytes.split_at_checked(i).unwrap_or((bytes, &[]));
                            self.extend_capture(before);
                            if at.first() == Some(&b'\\') {
                                self.push_capture(b'\\');
                                self.state = State::Str { escape: true };
                            } else {
                                self.end_string();
                                self.state = State::Structure;
                            }
                            bytes = at.get(1..).unwrap_or_default();
                        }
                    }
                }
                State::Structure => {
                    bytes = rest;
                    self.structure_byte(b);
                }
            }
        }
    }

    fn structure_byte(&mut self, b: u8) {
        let top = self.depth == 1;
        match b {
            b'"' => {
                if top && self.expect_key {
                    self.capture = Some(Vec::new());
                    self.capturing_key = true;
                } else if top && self.pending == Some(Target::Model) {
                    self.capture = Some(Vec::with_capacity(32));
                    self.capturing_key = false;
                }
                self.state = State::Str { escape: false };
            }
            b'{' | b'[' => {
                self.end_literal();
                self.depth = self.depth.saturating_add(1);
                if top {
                    self.pending = None;
                }
            }
            b'}' | b']' => {
                self.end_literal();
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.state = State::Done;
                }
            }
            b':' if top => self.expect_key = false,
            b',' if top => {
                self.end_literal();
                self.expect_key = true;
                self.pending = None;
            }
            b' ' | b'\t' | b'\r' | b'\n' => self.end_literal(),
            _ if top && self.pending.is_some() && self.literal.len() < 8 => self.literal.push(b),
            _ => {}
        }
    }

    fn push_capture(&mut self, b: u8) {
        if let Some(capture) = self.capture.as_mut() {
            if capture.len() < MAX_VALUE {
                capture.push(b);
            } else {
                // Over the bound: give up on this value.
                self.give_up_capture();
            }
        }
    }

    fn extend_capture(&mut self, bytes: &[u8]) {
        if let Some(capture) = self.capture.as_mut() {
            let limit = if self.capturing_key {
                MAX_KEY
            } else {
                MAX_VALUE
            };
            if capture.len().saturating_add(bytes.len()) <= limit {
                capture.extend_from_slice(bytes);
            } else {
                self.give_up_capture();
            }
        }
    }

    /// Stop capturing a key or value over its bound. An over-long key is not one we look
    /// for; an over-long value is still the `model` the request carried.
    fn give_up_capture(&mut self) {
        self.capture = None;
        if !self.capturing_key {
            if self.pending == Some(Target::Model) && self.model.is_none() {
                self.model_too_long = true;
            }
            self.pending = None;
        }
    }

    fn end_string(&mut self) {
        let Some(raw) = self.capture.take() else {
            if self.capturing_key {
                // A long key: not one we want.
                self.pending = None;
                self.capturing_key = false;
            }
            return;
        };
        if self.capturing_key {
            self.capturing_key = false;
            self.pending = match raw.as_slice() {
                b"model" => Some(Target::Model),
                b"stream" => Some(Target::Stream),
                _ => None,
            };
        } else if self.pending == Some(Target::Model) {
            self.pending = None;
            if self.model.is_none() && !self.model_too_long {
                self.model = unescape(&raw);
            }
        }
    }

    fn end_literal(&mut self) {
        if self.literal.is_empty() {
            return;
        }
        if self.pending == Some(Target::Stream) && self.stream.is_none() {
            self.stream = match self.literal.as_slice() {
                b"true" => Some(true),
                b"false" => Some(false),
                _ => None,
            };
        }
        self.literal.clear();
        self.pending = None;
    }
}

/// Decode a JSON string's raw contents (escapes included) into text.
fn unescape(raw: &[u8]) -> Option<String> {
    if !raw.contains(&b'\\') {
        return std::str::from_utf8(raw).ok().map(str::to_string);
    }
    let mut quoted = Vec::with_capacity(raw.len().saturating_add(2));
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice(&quoted).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scan(body: &[u8]) -> (Option<String>, Option<bool>) {
        let mut s = RequestScanner::new();
        s.feed(body);
        (s.model().map(str::to_string), s.stream())
    }

    #[test]
    fn finds_model_and_stream() {
        let body = br#"{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "stream": true}"#;
        assert_eq!(scan(body), (Some("llama-3.1-8b".into()), Some(true)));
    }

    #[test]
    fn ignores_nested_keys_named_model() {
        let body = br#"{"messages":[{"model":"fake","stream":true}],"metadata":{"model":"x"},"model":"real","stream":false}"#;
        assert_eq!(scan(body), (Some("real".into()), Some(false)));
    }

    #[test]
    fn ignores_model_text_inside_strings() {
        let body = br#"{"prompt":"\"model\": \"evil\", {\"stream\": true}","model":"m"}"#;
        assert_eq!(scan(body), (Some("m".into()), None));
    }

    #[test]
    fn finds_model_after_a_megabyte_of_prompt() {
        let mut body = br#"{"prompt":""#.to_vec();
        body.extend(std::iter::repeat_n(b'a', 1 << 20));
        body.extend_from_slice(br#"\" tricky","stream":true,"model":"late-model"}"#);
        assert_eq!(scan(&body), (Some("late-model".into()), Some(true)));
    }

    #[test]
    fn unescapes_model() {
        assert_eq!(
            scan(br#"{"model":"org\/name\u0041"}"#).0,
            Some("org/nameA".into())
        );
    }

    #[test]
    fn non_object_or_garbage_finds_nothing() {
        assert_eq!(scan(b"[1,2,3]"), (None, None));
        assert_eq!(scan(b"not json at all"), (None, None));
        assert_eq!(scan(b""), (None, None));
        assert_eq!(scan(br#"{"model": 42}"#), (None, None));
        assert_eq!(scan(br#"{"stream": "yes"}"#), (None, None));
    }

    #[test]
    fn overlong_model_is_ignored() {
        let long = "m".repeat(MAX_VALUE + 1);
        assert_eq!(scan(format!(r#"{{"model":"{long}"}}"#).as_bytes()).0, None);
    }

    #[test]
    fn overlong_model_is_reported_as_too_long_however_it_is_split() {
        let long = "m".repeat(1 << 20);
        let body = format!(r#"{{"model":"{long}","stream":true,"n":{{"model":"short"}}}}"#);
        for piece in [1 << 21, 4096, 7] {
            let mut s = RequestScanner::new();
            for chunk in body.as_bytes().chunks(piece) {
                s.feed(chunk);
            }
            assert_eq!(
                (s.model(), s.model_too_long(), s.stream()),
                (None, true, Some(true))
            );
            assert!(s.is_done());
        }
        // A long string elsewhere, or a long key, is not a long model.
        for body in [
            format!(r#"{{"prompt":"{long}","model":"m"}}"#),
            format!(r#"{{"{long}":"x","model":"m"}}"#),
        ] {
            let mut s = RequestScanner::new();
            s.feed(body.as_bytes());
            assert_eq!((s.model(), s.model_too_long()), (Some("m"), false));
        }
        // The first top-level model wins, long or not.
        let mut s = RequestScanner::new();
        s.feed(format!(r#"{{"model":"{long}","model":"m"}}"#).as_bytes());
        assert_eq!((s.model(), s.model_too_long()), (None, true));
    }

    proptest! {
        #[test]
        fn any_split_gives_same_result(cuts in proptest::collection::vec(0usize..200, 0..12)) {
            let body = br#"{"messages":[{"role":"user","content":"a \"quoted\" {x}"}],"model":"llama\\3","temperature":0.2,"stream":true}"#;
            let whole = scan(body);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % body.len()).collect();
            cuts.sort_unstable();
            let mut s = RequestScanner::new();
            let mut at = 0;
            for cut in cuts {
                s.feed(&body[at..cut]);
                at = cut;
            }
            s.feed(&body[at..]);
            prop_assert_eq!((s.model().map(str::to_string), s.stream()), whole);
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut s = RequestScanner::new();
            s.feed(&body);
        }
    }
}
