//! Server-sent events, cut exactly as the WHATWG HTML spec's event-stream interpretation
//! cuts them.
//!
//! Every streaming LLM API tokentap understands frames its output as SSE, and an HTTP
//! chunk or a TCP read is not an event: one frame can carry several events and one event
//! can span several frames. [`SseDecoder`] is the one place that turns arbitrary frames
//! into whole events, so the dialect decoders above it only ever see complete events and
//! the signals they produce cannot depend on how the body was split.
//!
//! Spec points handled: `\n`, `\r\n` and lone `\r` line endings (also a `\r` that ends one
//! frame followed by the `\n` that starts the next), a UTF-8 BOM at stream start, comment
//! lines (`:`), fields without a colon, one optional space after the colon, `event`,
//! `data` (several lines joined with `\n`), `id` (ignored if it contains NUL), `retry`
//! (digits only), unknown fields ignored, and no dispatch of an event whose data buffer is
//! empty. As the spec says, a final event that is not followed by a blank line is
//! discarded at end of stream ([`SseDecoder::finish`] reports whether that happened).
//!
//! Bounded and allocation-free in steady state: lines are found with `memchr`, complete
//! lines are read straight from the fed slice, and an event whose one `data` line and
//! closing blank line are both in the slice (the usual LLM event) is dispatched from it;
//! only a line cut by a frame edge and the data of other events are copied, into buffers
//! that are reused from event to event.

use memchr::{memchr, memchr2};

use super::types::DecodeError;

/// The UTF-8 byte order mark the spec strips from the start of a stream.
const BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// One dispatched event, borrowed from the decoder's buffers for the duration of the
/// callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The event type; empty when the stream named none (the spec's default, `message`).
    /// Invalid UTF-8 was replaced with U+FFFD.
    pub event: &'a str,
    /// The data lines of the event joined with `\n` (without the final `\n`). Raw bytes:
    /// the dialect decoder decides how to read them.
    pub data: &'a [u8],
    /// The stream's last event ID at dispatch (the spec's `lastEventId`, which persists
    /// across events until an `id` field changes it); `None` when empty.
    pub id: Option<&'a [u8]>,
}

/// Incremental SSE decoder: feed it frames, it calls back once per complete event.
#[derive(Debug)]
pub struct SseDecoder {
    max_event_bytes: usize,
    /// Start of a line that was not yet terminated when its frame ended.
    line: Vec<u8>,
    /// The pending event's data buffer (each data line followed by `\n`).
    data: Vec<u8>,
    /// The pending event's type buffer.
    event: String,
    /// The last event ID buffer (persists across events).
    last_id: Vec<u8>,
    /// The reconnection time the stream asked for, in milliseconds.
    retry: Option<u64>,
    /// The previous frame ended with `\r`: a `\n` at the start of the next one belongs to
    /// the same line ending.
    skip_lf: bool,
    /// How many bytes of the BOM matched so far at stream start; `BOM.len()` once the
    /// start of the stream has been settled either way.
    bom_matched: usize,
}

impl SseDecoder {
    /// A decoder that refuses to buffer more than `max_event_bytes` of one event (its data
    /// so far plus the line being read).
    pub fn new(max_event_bytes: usize) -> Self {
        SseDecoder {
            max_event_bytes,
            line: Vec::new(),
            data: Vec::new(),
            event: String::new(),
            last_id: Vec::new(),
            retry: None,
            skip_lf: false,
            bom_matched: 0,
        }
    }

    /// The reconnection time (milliseconds) from the last valid `retry` field, if any.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// Consume the next bytes of the stream, calling `on_event` for every event they
    /// complete, in order. After an `Err` the decoder must not be fed again.
    pub fn feed<F>(&mut self, bytes: &[u8], on_event: &mut F) -> Result<(), DecodeError>
    where
        F: FnMut(SseEvent<'_>),
    {
        let mut input = self.strip_bom(bytes);
        if self.skip_lf {
            if let Some((&first, rest)) = input.split_first() {
                self.skip_lf = false;
                if first == b'\n' {
                    input = rest;
                }
            }
        }
        while let Some(end) = memchr2(b'\n', b'\r', input) {
            let (head, tail) = input.split_at(end);
            let Some((&terminator, mut rest)) = tail.split_first() else {
                break; // unreachable: memchr2 found a byte at `end`
            };
            if terminator == b'\r' {
                match rest.split_first() {
                    Some((b'\n', after)) => rest = after,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            if self.line.is_empty() {
                if let Some(after) = self.whole_data_event(head, rest, on_event)? {
                    input = after;
                    continue;
                }
                self.line_complete(head, on_event)?;
            } else {
                self.check(self.line.len().saturating_add(head.len()))?;
                self.line.extend_from_slice(head);
                let line = std::mem::take(&mut self.line);
                let result = self.line_complete(&line, on_event);
                self.line = line;
                self.line.clear();
                result?;
            }
            input = rest;
        }
        if !input.is_empty() {
            self.check(self.line.len().saturating_add(input.len()))?;
            self.line.extend_from_slice(input);
        }
        Ok(())
    }

    /// The stream ended. Per the spec, an event not yet terminated by a blank line is
    /// discarded rather than dispatched. Returns `true` if that discarded anything that
    /// would have carried data (a non-empty data buffer or an unterminated `data` line),
    /// so the caller can report the loss.
    pub fn finish(&mut self) -> bool {
        let lost = !self.data.is_empty() || is_data_field(&self.line);
        self.line.clear();
        self.data.clear();
        self.event.clear();
        self.skip_lf = false;
        lost
    }

    /// Strip a BOM (possibly split across frames) from the very start of the stream.
    fn strip_bom<'b>(&mut self, mut input: &'b [u8]) -> &'b [u8] {
        while self.bom_matched < BOM.len() {
            let Some((&byte, rest)) = input.split_first() else {
                break;
            };
            if BOM.get(self.bom_matched) == Some(&byte) {
                self.bom_matched = self.bom_matched.saturating_add(1);
                input = rest;
            } else {
                // Not a BOM after all: what matched so far is ordinary line content.
                self.line
                    .extend_from_slice(BOM.get(..self.bom_matched).unwrap_or_default());
                self.bom_matched = BOM.len();
            }
        }
        input
    }

    /// Fail if the pending event plus a line of `line_len` bytes exceeds the bound.
    fn check(&self, line_len: usize) -> Result<(), DecodeError> {
        if self.data.len().saturating_add(line_len) > self.max_event_bytes {
            return Err(DecodeError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(())
    }

    /// The common case, read without copying: `line` is an event's only `data` line and
    /// the blank line that ends the event starts `rest`, all in the fed slice. Then the
    /// event is dispatched straight from the slice (exactly as `line_complete` would
    /// dispatch it, bound check included) and the input after the blank line is
    /// returned; `None` leaves both lines to the general path.
    fn whole_data_event<'b, F>(
        &mut self,
        line: &[u8],
        rest: &'b [u8],
        on_event: &mut F,
    ) -> Result<Option<&'b [u8]>, DecodeError>
    where
        F: FnMut(SseEvent<'_>),
    {
        let Some(value) = line.strip_prefix(b"data:") else {
            return Ok(None);
        };
        if !self.data.is_empty() {
            return Ok(None);
        }
        // The blank line, with a terminator that this slice settles: a `\r` at its very
        // end might be the first half of a `\r\n` that the next frame completes.
        let after = match rest {
            [b'\n', after @ ..] => after,
            [b'\r', b'\n', after @ ..] => after,
            [b'\r', after @ ..] if !after.is_empty() => after,
            _ => return Ok(None),
        };
        self.check(line.len())?;
        self.emit(value.strip_prefix(b" ").unwrap_or(value), on_event);
        self.event.clear();
        Ok(Some(after))
    }

    /// Interpret one complete line (without its terminator).
    fn line_complete<F>(&mut self, line: &[u8], on_event: &mut F) -> Result<(), DecodeError>
    where
        F: FnMut(SseEvent<'_>),
    {
        if line.is_empty() {
            self.dispatch(on_event);
            return Ok(());
        }
        self.check(line.len())?;
        let (field, value) = match memchr(b':', line) {
            Some(0) => return Ok(()), // comment
            Some(colon) => {
                let (field, value) = line.split_at_checked(colon).unwrap_or((line, &[]));
                // `value` starts with the colon.
                let value = value.get(1..).unwrap_or_default();
                (field, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => {
                self.event.clear();
                // Checked whole first: the lossy walk goes a character at a time.
                match std::str::from_utf8(value) {
                    Ok(name) => self.event.push_str(name),
                    Err(_) => self.event.push_str(&String::from_utf8_lossy(value)),
                }
            }
            // An id containing NUL is ignored.
            b"id" if memchr(0, value).is_none() => {
                self.last_id.clear();
                self.last_id.extend_from_slice(value);
            }
            // Digits only (so valid UTF-8); a value that overflows is ignored too.
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                if let Some(ms) = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()) {
                    self.retry = Some(ms);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A blank line: dispatch the pending event (unless its data buffer is empty) and
    /// reset the per-event buffers.
    fn dispatch<F>(&mut self, on_event: &mut F)
    where
        F: FnMut(SseEvent<'_>),
    {
        if let Some((_, data)) = self.data.split_last() {
            self.emit(data, on_event);
        }
        self.data.clear();
        self.event.clear();
    }

    /// Hand the pending event, with `data`, to the callback.
    fn emit<F>(&self, data: &[u8], on_event: &mut F)
    where
        F: FnMut(SseEvent<'_>),
    {
        on_event(SseEvent {
            event: &self.event,
            data,
            id: (!self.last_id.is_empty()).then_some(&self.last_id[..]),
        });
    }
}

/// Whether an (unterminated) line is a `data` field.
fn is_data_field(line: &[u8]) -> bool {
    line.strip_prefix(b"data")
        .is_some_and(|rest| rest.is_empty() || rest.first() == Some(&b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An owned copy of an event, for assertions.
    #[derive(Debug, PartialEq, Eq)]
    struct Ev {
        event: String,
        data: String,
        id: Option<String>,
    }

    fn ev(data: &str) -> Ev {
        Ev {
            event: String::new(),
            data: data.to_owned(),
            id: None,
        }
    }

    fn feed_frames(dec: &mut SseDecoder, frames: &[&[u8]]) -> Result<Vec<Ev>, DecodeError> {
        let mut got = Vec::new();
        for frame in frames {
            dec.feed(frame, &mut |e: SseEvent<'_>| {
                got.push(Ev {
                    event: e.event.to_owned(),
                    data: String::from_utf8_lossy(e.data).into_owned(),
                    id: e.id.map(|id| String::from_utf8_lossy(id).into_owned()),
                })
            })?;
        }
        Ok(got)
    }

    fn decode(input: &[u8]) -> Vec<Ev> {
        let mut dec = SseDecoder::new(1 << 16);
        let whole = feed_frames(&mut dec, &[input]).expect("within limits");
        // Byte-at-a-time gives the same events.
        let mut dec = SseDecoder::new(1 << 16);
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(feed_frames(&mut dec, &bytes).expect("within limits"), whole);
        whole
    }

    #[test]
    fn line_endings_lf_crlf_cr() {
        let want = vec![ev("a"), ev("b"), ev("c")];
        assert_eq!(decode(b"data: a\n\ndata: b\n\ndata: c\n\n"), want);
        assert_eq!(
            decode(b"data: a\r\n\r\ndata: b\r\n\r\ndata: c\r\n\r\n"),
            want
        );
        assert_eq!(decode(b"data: a\r\rdata: b\r\rdata: c\r\r"), want);
        assert_eq!(decode(b"data: a\r\n\ndata: b\n\r\ndata: c\r\r\n"), want);
    }

    #[test]
    fn event_names_as_text_invalid_utf8_replaced() {
        let named = |event: &str, data: &str| Ev {
            event: event.to_owned(),
            ..ev(data)
        };
        assert_eq!(
            decode("event: content_block_delta\ndata: a\n\nevent: réponse\ndata: b\n\n".as_bytes()),
            vec![named("content_block_delta", "a"), named("réponse", "b")]
        );
        assert_eq!(
            decode(b"event: bad\xff\xfe name\ndata: c\n\n"),
            vec![named("bad\u{FFFD}\u{FFFD} name", "c")]
        );
    }

    #[test]
    fn cr_at_frame_edge_then_lf() {
        let mut dec = SseDecoder::new(1024);
        let got = feed_frames(
            &mut dec,
            &[b"data: a\r", b"\n", b"\r", b"\ndata: b\r", b"\r"],
        );
        assert_eq!(got, Ok(vec![ev("a"), ev("b")]));
        // A lone CR at the edge followed by a non-LF byte is a line end on its own.
        let mut dec = SseDecoder::new(1024);
        let got = feed_frames(&mut dec, &[b"data: a\r", b"\rdata: b\r", b"", b"\r"]);
        assert_eq!(got, Ok(vec![ev("a"), ev("b")]));
    }

    #[test]
    fn bom_stripped_once_at_start_even_if_split() {
        assert_eq!(decode(b"\xEF\xBB\xBFdata: x\n\n"), vec![ev("x")]);
        let mut dec = SseDecoder::new(1024);
        let got = feed_frames(&mut dec, &[b"\xEF", b"\xBB", b"\xBFdata: x\n\n"]);
        assert_eq!(got, Ok(vec![ev("x")]));
        // A second BOM is part of the field name, which is then unknown.
        assert_eq!(
            decode(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\ndata: y\n\n"),
            vec![ev("y")]
        );
        // A partial BOM is ordinary content of the first line.
        assert_eq!(decode(b"\xEF\xBBdata: x\n\ndata: y\n\n"), vec![ev("y")]);
    }

    #[test]
    fn comments_ignored() {
        assert_eq!(
            decode(b": keep-alive\n\n:\ndata: a\n: in the middle\ndata: b\n\n"),
            vec![ev("a\nb")]
        );
    }

    #[test]
    fn multi_line_data_joined_with_lf() {
        assert_eq!(
            decode(b"data: one\ndata: two\ndata:\ndata: four\n\n"),
            vec![ev("one\ntwo\n\nfour")]
        );
    }

    #[test]
    fn optional_single_space_after_colon() {
        assert_eq!(
            decode(b"data:x\n\ndata: x\n\ndata:  x\n\n"),
            vec![ev("x"), ev("x"), ev(" x")]
        );
    }

    #[test]
    fn field_without_colon() {
        // `data` alone appends an empty line; the buffer "\n" is not empty, so it dispatches.
        assert_eq!(decode(b"data\n\n"), vec![ev("")]);
        assert_eq!(decode(b"data\ndata\n\n"), vec![ev("\n")]);
        // Unknown fields, with or without colon, are ignored.
        assert_eq!(decode(b"foo\nbar: baz\ndata: a\n\n"), vec![ev("a")]);
    }

    #[test]
    fn empty_data_buffer_not_dispatched() {
        assert_eq!(decode(b"event: ping\n\n\n\nid: 1\n\n"), vec![]);
        // ... and the event type does not leak into the next event.
        assert_eq!(decode(b"event: ping\n\ndata: a\n\n"), vec![ev("a")]);
    }

    #[test]
    fn event_type_and_last_event_id() {
        let got = decode(
            b"event: delta\nid: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\nid: x\0y\ndata: d\n\n",
        );
        let with = |event: &str, data: &str, id: Option<&str>| Ev {
            event: event.to_owned(),
            data: data.to_owned(),
            id: id.map(str::to_owned),
        };
        assert_eq!(
            got,
            vec![
                with("delta", "a", Some("7")),
                with("", "b", Some("7")), // the last event ID persists
                with("", "c", None),      // `id` with an empty value resets it
                with("", "d", None),      // an id containing NUL is ignored
            ]
        );
    }

    #[test]
    fn retry_digits_only() {
        let mut dec = SseDecoder::new(1024);
        feed_frames(&mut dec, &[b"retry: 3000\n\n"]).expect("ok");
        assert_eq!(dec.retry(), Some(3000));
        feed_frames(&mut dec, &[b"retry: 12a\nretry:\nretry: -1\n\n"]).expect("ok");
        assert_eq!(dec.retry(), Some(3000));
    }

    #[test]
    fn unterminated_final_event_is_discarded() {
        let mut dec = SseDecoder::new(1024);
        let got = feed_frames(&mut dec, &[b"data: a\n\ndata: b\n"]);
        assert_eq!(got, Ok(vec![ev("a")]));
        assert!(dec.finish(), "the pending event is reported as lost");

        let mut dec = SseDecoder::new(1024);
        feed_frames(&mut dec, &[b"data: a\n\ndata: b"]).expect("ok");
        assert!(
            dec.finish(),
            "an unterminated data line is reported as lost"
        );

        let mut dec = SseDecoder::new(1024);
        feed_frames(&mut dec, &[b"data: a\n\n: ping"]).expect("ok");
        assert!(!dec.finish(), "a trailing comment carries no data");
    }

    #[test]
    fn event_too_large() {
        let limit = DecodeError::EventTooLarge { limit: 16 };
        // One long line in one frame.
        let mut dec = SseDecoder::new(16);
        assert_eq!(
            feed_frames(&mut dec, &[b"data: 0123456789abcdef\n\n"]),
            Err(limit.clone())
        );
        // The same line cut into small frames fails before the line ends.
        let mut dec = SseDecoder::new(16);
        assert_eq!(
            feed_frames(&mut dec, &[b"data: 0123", b"456789abcdef"]),
            Err(limit.clone())
        );
        // Accumulated data lines count too.
        let mut dec = SseDecoder::new(16);
        assert_eq!(
            feed_frames(&mut dec, &[b"data: 012345\ndata: 6789ab\n"]),
            Err(limit)
        );
        // The bound is per event: many small events are fine.
        let mut dec = SseDecoder::new(16);
        let got = feed_frames(&mut dec, &[&b"data: 0123456789\n\n".repeat(100)[..]]);
        assert_eq!(got.map(|v| v.len()), Ok(100));
    }

    #[test]
    fn buffers_are_reused() {
        let mut dec = SseDecoder::new(1 << 16);
        feed_frames(&mut dec, &[b"data: warm up", b" the buffers a bit\n\n"]).expect("ok");
        let (line_cap, data_cap) = (dec.line.capacity(), dec.data.capacity());
        for _ in 0..100 {
            feed_frames(&mut dec, &[b"data: short", b"\n\n"]).expect("ok");
        }
        assert_eq!(
            (dec.line.capacity(), dec.data.capacity()),
            (line_cap, data_cap)
        );
    }

    /// Events read straight from the fed slice (`whole_data_event`) are the events the
    /// general path reads, at its edges: a `\r` that ends a frame, fields before the
    /// data, several data lines, an empty value, no colon, lone `\r` blank lines.
    #[test]
    fn whole_events_read_from_the_slice_match_the_general_path() {
        let with = |event: &str, data: &str, id: Option<&str>| Ev {
            event: event.to_owned(),
            data: data.to_owned(),
            id: id.map(str::to_owned),
        };
        let cases: &[(&[u8], Vec<Ev>)] = &[
            (b"data: a\n\n", vec![ev("a")]),
            (b"data:a\r\n\r\n", vec![ev("a")]),
            (b"data:  a\r\rdata: b\r\n\n", vec![ev(" a"), ev("b")]),
            (b"data:\n\ndata: \n\n", vec![ev(""), ev("")]),
            (b"data\n\n", vec![ev("")]),
            (
                b"event: e\nid: 7\ndata: x\n\ndata: y\n\n",
                vec![with("e", "x", Some("7")), with("", "y", Some("7"))],
            ),
            (b"data: a\ndata: b\n\n", vec![ev("a\nb")]),
            (b"data: a\n: comment\n\n", vec![ev("a")]),
            (b"datum: a\n\ndata: b\n\n", vec![ev("b")]),
        ];
        for (input, expected) in cases {
            assert_eq!(
                &decode(input),
                expected,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        // A `\r` that ends a frame may be half of `\r\n`: the next frame settles it.
        let mut dec = SseDecoder::new(1024);
        let got = feed_frames(&mut dec, &[b"data: a\n\r", b"\ndata: b\n\n"]).expect("ok");
        assert_eq!(got, vec![ev("a"), ev("b")]);
        // The bound is the general path's: a data line of exactly the limit passes.
        let mut dec = SseDecoder::new(9);
        assert_eq!(
            feed_frames(&mut dec, &[b"data: abc\n\n"]),
            Ok(vec![ev("abc")])
        );
        let mut dec = SseDecoder::new(8);
        assert_eq!(
            feed_frames(&mut dec, &[b"data: abc\n\n"]),
            Err(DecodeError::EventTooLarge { limit: 8 })
        );
    }

    proptest::proptest! {
        /// Any stream of SSE lines gives the same events (or the same error) fed whole,
        /// cut anywhere, or a byte at a time: the slice-borrowing read of whole events
        /// only takes what it sees entire, so the cuts decide which path reads an event
        /// and never what it is.
        #[test]
        fn any_cut_gives_the_same_events(
            lines in proptest::collection::vec(
                (proptest::sample::select(vec![
                    "data: x", "data:{\"a\":1}", "data", "data: ", "event: e", "id: 1",
                    "retry: 5", ": c", "", "", "junk", "data: [DONE]",
                ]), proptest::sample::select(vec!["\n", "\r\n", "\r"])),
                0..24,
            ),
            cuts in proptest::collection::vec(0usize..400, 0..6),
            limit in proptest::sample::select(vec![12usize, 1 << 16]),
        ) {
            let input: Vec<u8> = lines.iter().flat_map(|(l, t)| [l.as_bytes(), t.as_bytes()].concat()).collect();
            let run = |frames: Vec<&[u8]>| {
                let mut dec = SseDecoder::new(limit);
                feed_frames(&mut dec, &frames)
            };
            let whole = run(vec![&input[..]]);
            let mut at: Vec<usize> = cuts.into_iter().map(|c| c % (input.len() + 1)).collect();
            at.sort_unstable();
            let mut frames = Vec::new();
            let mut from = 0;
            for cut in at {
                frames.push(&input[from..cut]);
                from = cut;
            }
            frames.push(&input[from..]);
            proptest::prop_assert_eq!(&run(frames), &whole);
            proptest::prop_assert_eq!(&run(input.chunks(1).collect()), &whole);
        }
    }
}
