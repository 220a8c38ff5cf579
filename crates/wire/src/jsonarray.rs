//! A JSON array streamed element by element (Gemini's `streamGenerateContent` without
//! `alt=sse`), cut into its top-level elements as they complete.
//!
//! Gemini answers a streaming request without `alt=sse` with `application/json` whose body
//! is one array, written a chunk at a time: `[{...}` then `,\r\n{...}` then `]`. Waiting for
//! the whole array would put every token at the end of the response, so [`ArraySplitter`]
//! tracks just enough JSON structure (nesting depth, and string and escape state) to
//! see where each top-level element ends, and hands it over right then. It does not
//! validate: an element is whatever lies between the separators, and the dialect's parser
//! decides whether it is well formed.
//!
//! A body whose top level is an object is not a stream but one whole document (Gemini's
//! non-streaming answer); it is buffered, bounded by the body limit, and handed over at the
//! end. Anything else at the top level is reported once as malformed and the rest of the
//! body is ignored. Punctuation errors between elements are tolerated: a missing comma, a
//! doubled one, a trailing one.

use memchr::memchr2;

use super::buffer::BodyBuffer;
use super::types::DecodeError;

/// What the splitter found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// One complete top-level element of the array (an object, usually).
    Element(&'a [u8]),
    /// The body was a single JSON object, not an array: the whole of it.
    Document(&'a [u8]),
    /// The body is neither an array nor an object, or an element was cut off by the end.
    Malformed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the top-level value (whitespace or a byte-order mark may come first).
    Start,
    /// Inside the array, expecting an element or its end.
    Expect,
    /// Inside an element.
    Element,
    /// After an element, expecting `,` or `]`.
    After,
    /// The array ended, or the body is not one: nothing more to find.
    End,
    /// The top level is an object: buffering it whole.
    Document,
}

/// Incremental top-level-array splitter.
#[derive(Debug)]
pub struct ArraySplitter {
    max_element_bytes: usize,
    state: State,
    /// Nesting depth inside the current element (0 for a scalar element).
    depth: u32,
    in_string: bool,
    escape: bool,
    /// Start of an element cut by a frame edge.
    element: Vec<u8>,
    document: BodyBuffer,
}

impl ArraySplitter {
    /// A splitter that buffers at most `max_element_bytes` of one element, and at most
    /// `max_body_bytes` of a top-level object.
    pub fn new(max_element_bytes: usize, max_body_bytes: usize) -> Self {
        ArraySplitter {
            max_element_bytes,
            state: State::Start,
            depth: 0,
            in_string: false,
            escape: false,
            element: Vec::new(),
            document: BodyBuffer::new(max_body_bytes),
        }
    }

    /// Consume the next bytes, calling `on_piece` for every element they complete.
    /// After an `Err` the splitter must not be fed again.
    pub fn feed<F>(&mut self, input: &[u8], on_piece: &mut F) -> Result<(), DecodeError>
    where
        F: FnMut(Piece<'_>),
    {
        let mut i = 0;
        // Where the current element's bytes start within `input`, while in one.
        let mut start = (self.state == State::Element).then_some(0);
        while let Some(&byte) = input.get(i) {
            match self.state {
                State::End => return Ok(()),
                State::Document => return self.document.extend(input.get(i..).unwrap_or_default()),
                State::Start => {
                    match byte {
                        b'[' => self.state = State::Expect,
                        b'{' => {
                            self.state = State::Document;
                            continue; // the brace belongs to the document
                        }
                        b' ' | b'\t' | b'\r' | b'\n' | 0xEF | 0xBB | 0xBF => {}
                        _ => {
                            self.state = State::End;
                            on_piece(Piece::Malformed);
                            return Ok(());
                        }
                    }
                    i = i.saturating_add(1);
                }
                State::Expect | State::After => {
                    match byte {
                        b' ' | b'\t' | b'\r' | b'\n' | b',' => {}
                        b']' => self.state = State::End,
                        _ => {
                            self.begin_element();
                            start = Some(i);
                            continue;
                        }
                    }
                    i = i.saturating_add(1);
                }
                State::Element => {
                    let Some(end) = self.scan(input, i) else {
                        i = input.len();
                        break;
                    };
                    let from = start.take().unwrap_or(i);
                    let last = input.get(from..end).unwrap_or_default();
                    let total = self.element.len().saturating_add(last.len());
                    self.check(total)?;
                    if self.element.is_empty() {
                        on_piece(Piece::Element(last.trim_ascii()));
                    } else {
                        self.element.extend_from_slice(last);
                        on_piece(Piece::Element(self.element.trim_ascii()));
                        self.element.clear();
                    }
                    self.state = State::After;
                    i = end;
                }
            }
        }
        if let (State::Element, Some(from)) = (self.state, start) {
            let rest = input.get(from..i).unwrap_or_default();
            self.check(self.element.len().saturating_add(rest.len()))?;
            self.element.extend_from_slice(rest);
        }
        Ok(())
    }

    /// The body ended: hand over a top-level object; report an element cut off by the
    /// end, or a body that held no JSON value at all.
    pub fn finish<F>(&mut self, on_piece: &mut F)
    where
        F: FnMut(Piece<'_>),
    {
        match self.state {
            State::Document => on_piece(Piece::Document(&self.document.take())),
            State::Element | State::Start => on_piece(Piece::Malformed),
            State::Expect | State::After | State::End => {}
        }
        self.element.clear();
        self.state = State::End;
    }

    fn begin_element(&mut self) {
        self.state = State::Element;
        self.depth = 0;
        self.in_string = false;
        self.escape = false;
        self.element.clear();
    }

    fn check(&self, len: usize) -> Result<(), DecodeError> {
        if len > self.max_element_bytes {
            return Err(DecodeError::EventTooLarge {
                limit: self.max_element_bytes,
            });
        }
        Ok(())
    }

    /// Scan the element from `input[i..]`; the index just past its end if it ends in this
    /// input. A scalar element ends before the `,`, `]` or whitespace that follows it;
    /// that byte is left for the `After` state.
    fn scan(&mut self, input: &[u8], mut i: usize) -> Option<usize> {
        let first_of_element = self.element.is_empty() && self.depth == 0 && !self.in_string;
        let mut scalar_started = !first_of_element;
        while let Some(&byte) = input.get(i) {
            if self.in_string {
                if self.escape {
                    self.escape = false;
                    i = i.saturating_add(1);
                    continue;
                }
                match memchr2(b'"', b'\\', input.get(i..).unwrap_or_default()) {
                    None => return None,
                    Some(at) => {
                        i = i.saturating_add(at);
                        if input.get(i) == Some(&b'\\') {
                            self.escape = true;
                        } else {
                            self.in_string = false;
                            if self.depth == 0 {
                                return Some(i.saturating_add(1)); // a string scalar
                            }
                        }
                        i = i.saturating_add(1);
                        continue;
                    }
                }
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth = self.depth.saturating_add(1),
                b'}' | b']' if self.depth > 0 => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i.saturating_add(1));
                    }
                }
                b'}' | b']' | b',' | b' ' | b'\t' | b'\r' | b'\n'
                    if self.depth == 0 && scalar_started =>
                {
                    return Some(i);
                }
                _ => {}
            }
            scalar_started = true;
            i = i.saturating_add(1);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    enum P {
        E(String),
        D(String),
        M,
    }

    fn split(frames: &[&[u8]]) -> Result<Vec<P>, DecodeError> {
        let mut s = ArraySplitter::new(64, 128);
        let mut got = Vec::new();
        let mut push = |p: Piece<'_>| {
            got.push(match p {
                Piece::Element(e) => P::E(String::from_utf8_lossy(e).into_owned()),
                Piece::Document(d) => P::D(String::from_utf8_lossy(d).into_owned()),
                Piece::Malformed => P::M,
            })
        };
        for frame in frames {
            s.feed(frame, &mut push)?;
        }
        s.finish(&mut push);
        Ok(got)
    }

    /// Whole, byte by byte and at every single cut give the same pieces.
    fn all_splits(body: &[u8]) -> Result<Vec<P>, DecodeError> {
        let whole = split(&[body]);
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(split(&bytes), whole, "byte by byte");
        for cut in 0..=body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(split(&[a, b]), whole, "cut at {cut}");
        }
        whole
    }

    fn e(s: &str) -> P {
        P::E(s.to_owned())
    }

    #[test]
    fn gemini_style_array() {
        let body = b"[{\r\n  \"a\": \"x]}\\\"{\"\r\n}\r\n,\r\n{\"b\": [1, {\"c\": 2}]}\r\n]";
        assert_eq!(
            all_splits(body),
            Ok(vec![
                e("{\r\n  \"a\": \"x]}\\\"{\"\r\n}"),
                e("{\"b\": [1, {\"c\": 2}]}")
            ])
        );
    }

    #[test]
    fn scalars_and_sloppy_punctuation() {
        assert_eq!(
            all_splits(b" [1, \"s,]\" ,, true [2] {}  ,] trailing"),
            Ok(vec![e("1"), e("\"s,]\""), e("true"), e("[2]"), e("{}")])
        );
        assert_eq!(all_splits(b"[]"), Ok(vec![]));
        assert_eq!(all_splits(b"[3]"), Ok(vec![e("3")]));
    }

    #[test]
    fn object_at_top_level_is_a_document() {
        assert_eq!(
            all_splits(b"\xEF\xBB\xBF {\"model\": \"m\"}\n"),
            Ok(vec![P::D("{\"model\": \"m\"}\n".to_owned())])
        );
    }

    #[test]
    fn not_json_and_cut_off() {
        assert_eq!(all_splits(b"data: {}"), Ok(vec![P::M]));
        assert_eq!(all_splits(b""), Ok(vec![P::M]));
        assert_eq!(
            all_splits(b"[{\"a\":1},{\"b\""),
            Ok(vec![e("{\"a\":1}"), P::M])
        );
        // An array left open after a complete element is only unterminated.
        assert_eq!(all_splits(b"[{\"a\":1}"), Ok(vec![e("{\"a\":1}")]));
    }

    #[test]
    fn bounds() {
        let big = format!("[{{\"a\":\"{}\"}}]", "x".repeat(64));
        assert_eq!(
            all_splits(big.as_bytes()),
            Err(DecodeError::EventTooLarge { limit: 64 })
        );
        let doc = format!("{{\"a\":\"{}\"}}", "x".repeat(128));
        assert_eq!(
            all_splits(doc.as_bytes()),
            Err(DecodeError::BodyTooLarge { limit: 128 })
        );
    }
}
