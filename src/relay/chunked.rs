//! The chunked transfer coding (RFC 9112 7.1), read strictly and without copying: bytes
//! go in as they arrive, and the reader says how many belong to the message and where in
//! them the data is. The relay forwards the message's bytes as they came; only the
//! observer's view is de-chunked.
//!
//! Strict means that whatever could be read two ways is an error, never a guess: chunk
//! sizes are hex digits that fit in 64 bits, a size line ends in CRLF (no bare LF, no
//! bare CR), extensions hold no control bytes, chunk data is followed by exactly CRLF,
//! trailer fields are `name: value` lines with a token name and no whitespace before
//! the colon, and the size line and the trailer section are bounded. So the end of the
//! message, and with it the start of the next pipelined one, is never in doubt.

use std::ops::Range;

/// The longest chunk-size line (size, extensions and CRLF) accepted.
pub const MAX_SIZE_LINE: usize = 4096;

/// Why a chunked message body cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkedError {
    #[error("invalid chunk size")]
    InvalidSize,
    #[error("chunk size does not fit in 64 bits")]
    SizeOverflow,
    #[error("invalid chunk extension")]
    InvalidExtension,
    #[error("chunk-size line longer than {MAX_SIZE_LINE} bytes")]
    SizeLineTooLong,
    #[error("chunk data not followed by CRLF")]
    MissingDataCrlf,
    #[error("invalid trailer field")]
    InvalidTrailer,
    #[error("trailer section larger than its limit")]
    TrailersTooLarge,
}

/// Where the reader is in the chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the hex digits of a chunk size (`digits` of them so far).
    Size { value: u64, digits: usize },
    /// Whitespace after the size, before `;` or CR.
    SizeSpace { value: u64 },
    /// Inside a chunk extension, up to CR.
    Extension { value: u64 },
    /// Saw the CR that ends a size line.
    SizeLf { value: u64 },
    /// Inside chunk data.
    Data { remaining: u64 },
    /// Chunk data ended; CR expected.
    DataCr,
    /// CR after chunk data; LF expected.
    DataLf,
    /// At the start of a trailer line, or of the empty line that ends the message.
    TrailerStart,
    /// In a trailer field's name.
    TrailerName,
    /// In a trailer field's value.
    TrailerValue,
    /// Saw the CR that ends a trailer field line.
    TrailerLf,
    /// Saw the CR of the empty line that ends the message.
    EndLf,
    /// The message is complete.
    Done,
}

/// Reads one chunked body, fed in arbitrary pieces.
#[derive(Debug, Clone)]
pub struct ChunkedReader {
    state: State,
    /// Bytes of the current size line so far.
    line_bytes: usize,
    /// Bytes of the trailer section so far.
    trailer_bytes: usize,
    max_trailer_bytes: usize,
    trailer_fields: usize,
    /// The trailer section as received (bounded like `trailer_bytes`).
    trailer_section: Vec<u8>,
}

impl ChunkedReader {
    /// A reader whose trailer section may hold at most `max_trailer_bytes`.
    pub fn new(max_trailer_bytes: usize) -> ChunkedReader {
        ChunkedReader {
            state: State::Size {
                value: 0,
                digits: 0,
            },
            line_bytes: 0,
            trailer_bytes: 0,
            max_trailer_bytes,
            trailer_fields: 0,
            trailer_section: Vec::new(),
        }
    }

    /// Whether the whole body (last chunk and trailers) has been read.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether the body carried trailer fields (known once it is done).
    pub fn has_trailers(&self) -> bool {
        self.trailer_fields > 0
    }

    /// The trailer section as it came (its field lines, each ending in CRLF, then the
    /// empty line that ends the body), once the body is done; taken, so it is given once.
    pub fn take_trailer_section(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.trailer_section)
    }

    /// Read the next bytes of the body. Returns how many of `input` belong to it (all of
    /// them unless the body ends inside `input`; what follows is the next message) and
    /// hands `data` each range of `input` that is chunk data, in order.
    pub fn feed(
        &mut self,
        input: &[u8],
        mut data: impl FnMut(Range<usize>),
    ) -> Result<usize, ChunkedError> {
        let mut at = 0;
        while let Some(rest @ [first, ..]) = input.get(at..) {
            if let State::Data { remaining } = self.state {
                let available = rest.len();
                let take = usize::try_from(remaining).map_or(available, |r| r.min(available));
                let end = at.saturating_add(take);
                data(at..end);
                at = end;
                let left = remaining.saturating_sub(take as u64);
                self.state = if left != 0 {
                    State::Data { remaining: left }
                } else if input
                    .get(at..)
                    .is_some_and(|rest| rest.starts_with(b"\r\n"))
                {
                    // The CRLF after the data, read with it when it came with it (as
                    // `DataCr` then `DataLf` would leave it).
                    at = at.saturating_add(2);
                    State::Size {
                        value: 0,
                        digits: 0,
                    }
                } else {
                    State::DataCr
                };
                continue;
            }
            if matches!(self.state, State::Done) {
                break;
            }
            let whole = self.whole_framing(rest);
            if whole > 0 {
                at = at.saturating_add(whole);
                continue;
            }
            self.step(*first)?;
            at = at.saturating_add(1);
        }
        Ok(at)
    }

    /// The usual framing between two chunks' data, read at once when all of it is in
    /// `input`: the CRLF after chunk data and a size line of at most 16 hex digits and
    /// its CRLF. Returns the bytes read, leaving the state exactly where reading them a
    /// byte at a time leaves it; 0 for anything else (extensions, whitespace, a line cut
    /// by the end of `input`, an error), which [`step`](Self::step) then reads.
    // Matched by pattern rather than compared (`==` on `State` compares the variant, then
    // its fields): this runs twice per relayed chunk.
    #[inline]
    fn whole_framing(&mut self, input: &[u8]) -> usize {
        let at = match (self.state, input) {
            (State::DataCr, [b'\r', b'\n', ..]) => {
                self.state = State::Size {
                    value: 0,
                    digits: 0,
                };
                2
            }
            (
                State::Size {
                    value: 0,
                    digits: 0,
                },
                _,
            ) => 0,
            _ => return 0,
        };
        let line = input.get(at..).unwrap_or_default();
        let (mut value, mut digits) = (0u64, 0usize);
        // One digit past the 16 that fit is enough to leave the line to `step`.
        for digit in line.iter().take(17).map_while(|byte| hex_value(*byte)) {
            value = value << 4 | u64::from(digit);
            digits = digits.saturating_add(1);
        }
        if digits == 0 || digits > 16 || line.get(digits..digits.saturating_add(2)) != Some(b"\r\n")
        {
            return at;
        }
        self.state = if value == 0 {
            State::TrailerStart
        } else {
            State::Data { remaining: value }
        };
        at.saturating_add(digits).saturating_add(2)
    }

    /// One framing byte.
    fn step(&mut self, byte: u8) -> Result<(), ChunkedError> {
        self.state = match self.state {
            State::Size { .. }
            | State::SizeSpace { .. }
            | State::Extension { .. }
            | State::SizeLf { .. } => self.size_line_step(byte)?,
            State::DataCr => match byte {
                b'\r' => State::DataLf,
                _ => return Err(ChunkedError::MissingDataCrlf),
            },
            State::DataLf => match byte {
                b'\n' => State::Size {
                    value: 0,
                    digits: 0,
                },
                _ => return Err(ChunkedError::MissingDataCrlf),
            },
            State::TrailerStart
            | State::TrailerName
            | State::TrailerValue
            | State::TrailerLf
            | State::EndLf => self.trailer_step(byte)?,
            State::Data { .. } | State::Done => self.state,
        };
        Ok(())
    }

    /// One byte of a chunk-size line (its size, whitespace, extensions, CRLF): the state
    /// after it.
    #[inline]
    fn size_line_step(&mut self, byte: u8) -> Result<State, ChunkedError> {
        self.line_bytes = self.line_bytes.saturating_add(1);
        if self.line_bytes > MAX_SIZE_LINE {
            return Err(ChunkedError::SizeLineTooLong);
        }
        Ok(match self.state {
            State::Size { value, digits } => match hex_value(byte) {
                Some(digit) => {
                    if value > u64::MAX >> 4 {
                        return Err(ChunkedError::SizeOverflow);
                    }
                    State::Size {
                        value: value << 4 | u64::from(digit),
                        digits: digits.saturating_add(1),
                    }
                }
                None if digits == 0 => return Err(ChunkedError::InvalidSize),
                None => match byte {
                    b' ' | b'\t' => State::SizeSpace { value },
                    b';' => State::Extension { value },
                    b'\r' => State::SizeLf { value },
                    _ => return Err(ChunkedError::InvalidSize),
                },
            },
            State::SizeSpace { value } => match byte {
                b' ' | b'\t' => State::SizeSpace { value },
                b';' => State::Extension { value },
                b'\r' => State::SizeLf { value },
                _ => return Err(ChunkedError::InvalidSize),
            },
            State::Extension { value } => match byte {
                b'\r' => State::SizeLf { value },
                b'\t' | b' '..=0x7e | 0x80..=0xff => State::Extension { value },
                _ => return Err(ChunkedError::InvalidExtension),
            },
            State::SizeLf { value } => {
                if byte != b'\n' {
                    return Err(ChunkedError::InvalidSize);
                }
                self.line_bytes = 0;
                if value == 0 {
                    State::TrailerStart
                } else {
                    State::Data { remaining: value }
                }
            }
            other => other,
        })
    }

    /// One byte of the trailer section (a field line, or the empty line that ends the
    /// body), kept as it came: the state after it.
    #[inline]
    fn trailer_step(&mut self, byte: u8) -> Result<State, ChunkedError> {
        self.trailer_bytes = self.trailer_bytes.saturating_add(1);
        if self.trailer_bytes > self.max_trailer_bytes {
            return Err(ChunkedError::TrailersTooLarge);
        }
        self.trailer_section.push(byte);
        Ok(match self.state {
            State::TrailerStart => match byte {
                b'\r' => State::EndLf,
                _ if is_token(byte) => {
                    self.trailer_fields = self.trailer_fields.saturating_add(1);
                    State::TrailerName
                }
                _ => return Err(ChunkedError::InvalidTrailer),
            },
            State::TrailerName => match byte {
                b':' => State::TrailerValue,
                _ if is_token(byte) => State::TrailerName,
                _ => return Err(ChunkedError::InvalidTrailer),
            },
            State::TrailerValue => match byte {
                b'\r' => State::TrailerLf,
                b'\t' | b' '..=0x7e | 0x80..=0xff => State::TrailerValue,
                _ => return Err(ChunkedError::InvalidTrailer),
            },
            State::TrailerLf => match byte {
                b'\n' => State::TrailerStart,
                _ => return Err(ChunkedError::InvalidTrailer),
            },
            State::EndLf => match byte {
                b'\n' => State::Done,
                _ => return Err(ChunkedError::InvalidTrailer),
            },
            other => other,
        })
    }
}

/// The value of a hex digit (RFC 9112's `HEXDIG`, either case).
#[inline]
fn hex_value(byte: u8) -> Option<u8> {
    HEX_VALUES
        .get(usize::from(byte))
        .copied()
        .filter(|value| *value != NOT_HEX)
}

/// In [`HEX_VALUES`], a byte that is not a hex digit.
const NOT_HEX: u8 = 0xff;

/// Each byte's value as a hex digit, or [`NOT_HEX`]: a size line's digits are read
/// once per relayed chunk, and a lookup is cheaper than three range tests. (Built at
/// compile time, where an index out of bounds or an overflow fails the build.)
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
static HEX_VALUES: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut digit = 0u8;
    while digit < 10 {
        table[(b'0' + digit) as usize] = digit;
        digit += 1;
    }
    let mut letter = 0u8;
    while letter < 6 {
        table[(b'a' + letter) as usize] = 10 + letter;
        table[(b'A' + letter) as usize] = 10 + letter;
        letter += 1;
    }
    table
};

/// An RFC 9110 `tchar`: what a field name is made of.
pub(crate) fn is_token(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The whole of `input` read at once: (consumed, data, done).
    fn read(input: &[u8]) -> Result<(usize, Vec<u8>, bool), ChunkedError> {
        read_split(input, &[])
    }

    /// `input` fed in pieces cut at `cuts`.
    fn read_split(input: &[u8], cuts: &[usize]) -> Result<(usize, Vec<u8>, bool), ChunkedError> {
        let mut reader = ChunkedReader::new(1024);
        let mut data = Vec::new();
        let mut consumed = 0;
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(input.len())).collect();
        bounds.sort_unstable();
        bounds.push(input.len());
        let mut start = 0;
        for end in bounds {
            if reader.is_done() || end < start {
                continue;
            }
            let piece = &input[start..end];
            let mut ranges = Vec::new();
            let took = reader.feed(piece, |range| ranges.push(range))?;
            for range in ranges {
                data.extend_from_slice(&piece[range]);
            }
            consumed += took;
            start = end;
        }
        Ok((consumed, data, reader.is_done()))
    }

    #[test]
    fn each_case_reads_as_the_table_says() {
        type Expected = Result<(usize, &'static [u8], bool), ChunkedError>;
        let cases: &[(&[u8], Expected)] = &[
            (b"5\r\nhello\r\n0\r\n\r\n", Ok((15, b"hello", true))),
            (b"5\r\nhello\r\n0\r\n\r\nGET /", Ok((15, b"hello", true))),
            (
                b"5;ext=1;q=\"a b\"\r\nhello\r\n0\r\n\r\n",
                Ok((29, b"hello", true)),
            ),
            (b"5 \t;x\r\nhello\r\n0\r\n\r\n", Ok((19, b"hello", true))),
            (
                b"A\r\n0123456789\r\n0\r\n\r\n",
                Ok((20, b"0123456789", true)),
            ),
            (
                b"00a\r\n0123456789\r\n0\r\n\r\n",
                Ok((22, b"0123456789", true)),
            ),
            (
                b"2\r\nhi\r\n0\r\nX-Sum: 1\r\nx-b:\r\n\r\n",
                Ok((28, b"hi", true)),
            ),
            (b"5\r\nhel", Ok((6, b"hel", false))),
            (b"5\r\nhello\r\n", Ok((10, b"hello", false))),
            (b"0\r\n\r", Ok((4, b"", false))),
            (b"\r\n", Err(ChunkedError::InvalidSize)),
            // The malformed sizes hyper's path answers with 400 (docs/RELIABILITY.md).
            (b" 5\r\nhello\r\n0\r\n\r\n", Err(ChunkedError::InvalidSize)),
            (b"FFFFFFFFFFFFFFFFFF\r\n", Err(ChunkedError::SizeOverflow)),
            (b"x\r\n", Err(ChunkedError::InvalidSize)),
            (b"-1\r\n", Err(ChunkedError::InvalidSize)),
            (b"+1\r\n", Err(ChunkedError::InvalidSize)),
            (b"0x5\r\n", Err(ChunkedError::InvalidSize)),
            (b"5\nhello\r\n0\r\n\r\n", Err(ChunkedError::InvalidSize)),
            (b"5\r\rhello", Err(ChunkedError::InvalidSize)),
            (b"5 6\r\n", Err(ChunkedError::InvalidSize)),
            (b"5;a\nb\r\n", Err(ChunkedError::InvalidExtension)),
            (b"5;a\0\r\n", Err(ChunkedError::InvalidExtension)),
            (b"10000000000000000\r\n", Err(ChunkedError::SizeOverflow)),
            // Past the 16 digits the usual framing is read at once: still read whole.
            (
                b"00000000000000002\r\nhi\r\n0\r\n\r\n",
                Ok((28, b"hi", true)),
            ),
            (b"FFFFFFFFFFFFFFFF\r\n", Ok((18, b"", false))),
            (b"1\r\nx\r\r\n", Err(ChunkedError::MissingDataCrlf)),
            (b"1\r\nx\r\n\r\n", Err(ChunkedError::InvalidSize)),
            (b"5\r\nhelloX\r\n", Err(ChunkedError::MissingDataCrlf)),
            (b"5\r\nhello\n0\r\n\r\n", Err(ChunkedError::MissingDataCrlf)),
            (b"0\r\n\n", Err(ChunkedError::InvalidTrailer)),
            (b"0\r\nX-A : 1\r\n\r\n", Err(ChunkedError::InvalidTrailer)),
            (b"0\r\n X-A: 1\r\n\r\n", Err(ChunkedError::InvalidTrailer)),
            (b"0\r\nX-A: 1\n\r\n", Err(ChunkedError::InvalidTrailer)),
            (b"0\r\nX-A: \x01\r\n\r\n", Err(ChunkedError::InvalidTrailer)),
            (b"0\r\nno-colon\r\n\r\n", Err(ChunkedError::InvalidTrailer)),
        ];
        for (input, expected) in cases {
            let got = read(input);
            let expected = expected.map(|(n, data, done)| (n, data.to_vec(), done));
            assert_eq!(got, expected, "{:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn size_lines_and_trailers_are_bounded() {
        let mut long = b"5;".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_SIZE_LINE));
        assert_eq!(read(&long), Err(ChunkedError::SizeLineTooLong));
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..200 {
            trailers.extend_from_slice(b"x-pad: 0123456789\r\n");
        }
        assert_eq!(read(&trailers), Err(ChunkedError::TrailersTooLarge));
    }

    #[test]
    fn trailers_are_noticed() {
        let mut reader = ChunkedReader::new(1024);
        reader.feed(b"0\r\nx-a: 1\r\n\r\n", |_| {}).expect("valid");
        assert!(reader.is_done() && reader.has_trailers());
        assert_eq!(reader.take_trailer_section(), b"x-a: 1\r\n\r\n");
        let mut reader = ChunkedReader::new(1024);
        reader.feed(b"0\r\n\r\n", |_| {}).expect("valid");
        assert!(reader.is_done() && !reader.has_trailers());
    }

    fn encoded() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        let chunk = (
            proptest::collection::vec(any::<u8>(), 1..40),
            proptest::option::of("[a-z]{1,5}(=[a-z0-9]{0,4})?"),
        );
        (
            proptest::collection::vec(chunk, 0..6),
            proptest::option::of("[A-Za-z-]{1,8}: [ -~]{0,10}"),
        )
            .prop_map(|(chunks, trailer)| {
                let mut wire = Vec::new();
                let mut data = Vec::new();
                for (bytes, ext) in chunks {
                    wire.extend_from_slice(format!("{:x}", bytes.len()).as_bytes());
                    if let Some(ext) = ext {
                        wire.push(b';');
                        wire.extend_from_slice(ext.as_bytes());
                    }
                    wire.extend_from_slice(b"\r\n");
                    wire.extend_from_slice(&bytes);
                    wire.extend_from_slice(b"\r\n");
                    data.extend_from_slice(&bytes);
                }
                wire.extend_from_slice(b"0\r\n");
                if let Some(trailer) = trailer {
                    wire.extend_from_slice(trailer.as_bytes());
                    wire.extend_from_slice(b"\r\n");
                }
                wire.extend_from_slice(b"\r\n");
                (wire, data)
            })
    }

    proptest! {
        /// Any split of a body into reads yields the same data and the same end, and
        /// nothing after the end is taken.
        #[test]
        fn any_split_reads_the_same(
            (wire, data) in encoded(),
            cuts in proptest::collection::vec(0usize..400, 0..8),
            tail in proptest::collection::vec(any::<u8>(), 0..10),
        ) {
            let mut input = wire.clone();
            input.extend_from_slice(&tail);
            let got = read_split(&input, &cuts).expect("valid body");
            prop_assert_eq!(got, (wire.len(), data, true));
        }

        /// A body with a few of its bytes changed to framing bytes reads the same whole
        /// (where the usual framing is read at once) as a byte at a time (where it never
        /// is): the same data and end, or the same error.
        #[test]
        fn framing_read_at_once_agrees_with_a_byte_at_a_time(
            (wire, _) in encoded(),
            edits in proptest::collection::vec(
                (0usize..400, proptest::sample::select(b"0aF9\r\n; \tgx".to_vec())),
                0..4,
            ),
        ) {
            let mut input = wire;
            for (at, byte) in edits {
                if let Some(slot) = input.get_mut(at) {
                    *slot = byte;
                }
            }
            let every_byte: Vec<usize> = (0..input.len()).collect();
            prop_assert_eq!(read(&input), read_split(&input, &every_byte));
        }

        /// Arbitrary bytes never panic, and a body said to be done ends within them.
        #[test]
        fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok((consumed, _, done)) = read(&input) {
                prop_assert!(consumed <= input.len());
                prop_assert!(done || consumed == input.len());
            }
        }
    }
}
