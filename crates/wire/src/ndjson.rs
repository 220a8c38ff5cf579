//! Newline-delimited JSON (`application/x-ndjson`), cut into lines.
//!
//! Ollama streams one JSON object per line. As with SSE, an HTTP chunk is not a line: a
//! frame can hold several lines and a line can span frames, so [`NdjsonDecoder`] is the one
//! place that finds line ends. Lines end at `\n`; a `\r` before it is dropped with the
//! rest of the surrounding whitespace, and blank lines are skipped. Only a line cut by a
//! frame edge is copied, into a buffer reused from line to line.

use memchr::memchr;

use super::types::DecodeError;

/// Incremental NDJSON line splitter: feed it frames, it calls back once per complete,
/// non-blank line (trimmed of ASCII whitespace).
#[derive(Debug)]
pub struct NdjsonDecoder {
    max_line_bytes: usize,
    /// Start of a line not yet terminated when its frame ended.
    line: Vec<u8>,
}

impl NdjsonDecoder {
    /// A splitter that refuses to buffer a line longer than `max_line_bytes`.
    pub fn new(max_line_bytes: usize) -> Self {
        NdjsonDecoder {
            max_line_bytes,
            line: Vec::new(),
        }
    }

    /// Consume the next bytes, calling `on_line` for every line they complete, in order.
    /// After an `Err` the splitter must not be fed again.
    pub fn feed<F>(&mut self, mut input: &[u8], on_line: &mut F) -> Result<(), DecodeError>
    where
        F: FnMut(&[u8]),
    {
        while let Some(end) = memchr(b'\n', input) {
            // `rest` starts with the newline.
            let (head, rest) = input.split_at_checked(end).unwrap_or((input, &[]));
            if self.line.is_empty() {
                self.check(head.len())?;
                emit(head, on_line);
            } else {
                self.check(self.line.len().saturating_add(head.len()))?;
                self.line.extend_from_slice(head);
                emit(&self.line, on_line);
                self.line.clear();
            }
            input = rest.get(1..).unwrap_or_default();
        }
        if !input.is_empty() {
            self.check(self.line.len().saturating_add(input.len()))?;
            self.line.extend_from_slice(input);
        }
        Ok(())
    }

    /// The body ended: a last line without its `\n` is passed on too.
    pub fn finish<F>(&mut self, on_line: &mut F)
    where
        F: FnMut(&[u8]),
    {
        emit(&self.line, on_line);
        self.line.clear();
    }

    fn check(&self, len: usize) -> Result<(), DecodeError> {
        if len > self.max_line_bytes {
            return Err(DecodeError::EventTooLarge {
                limit: self.max_line_bytes,
            });
        }
        Ok(())
    }
}

fn emit<F: FnMut(&[u8])>(line: &[u8], on_line: &mut F) {
    let line = line.trim_ascii();
    if !line.is_empty() {
        on_line(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(frames: &[&[u8]], limit: usize) -> Result<Vec<String>, DecodeError> {
        let mut dec = NdjsonDecoder::new(limit);
        let mut got = Vec::new();
        let mut push = |l: &[u8]| got.push(String::from_utf8_lossy(l).into_owned());
        for frame in frames {
            dec.feed(frame, &mut push)?;
        }
        dec.finish(&mut push);
        Ok(got)
    }

    #[test]
    fn lines_across_frames_blank_lines_and_crlf() {
        let want = vec![
            "{\"a\":1}".to_owned(),
            "{\"b\":2}".to_owned(),
            "[3]".to_owned(),
        ];
        let body = b"{\"a\":1}\r\n\n  \n{\"b\":2}\n[3]";
        assert_eq!(lines(&[body], 64), Ok(want.clone()));
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(lines(&bytes, 64), Ok(want));
    }

    #[test]
    fn line_bound() {
        let too_long = DecodeError::EventTooLarge { limit: 4 };
        assert_eq!(lines(&[b"12345\n"], 4), Err(too_long.clone()));
        assert_eq!(lines(&[b"12", b"34", b"5"], 4), Err(too_long));
        assert_eq!(lines(&[b"1234\n1234\n"], 4).map(|l| l.len()), Ok(2));
    }

    #[test]
    fn buffer_is_reused() {
        let mut dec = NdjsonDecoder::new(1 << 16);
        dec.feed(b"{\"warm\":\"up the buffer\"", &mut |_| {})
            .expect("ok");
        dec.feed(b"}\n", &mut |_| {}).expect("ok");
        let cap = dec.line.capacity();
        for _ in 0..100 {
            dec.feed(b"{\"x\"", &mut |_| {}).expect("ok");
            dec.feed(b":1}\n", &mut |_| {}).expect("ok");
        }
        assert_eq!(dec.line.capacity(), cap);
    }
}
