//! gRPC's message framing, sans-IO: a body is a sequence of length-prefixed messages, each
//! a 1-byte compressed flag, a 4-byte big-endian length and that many bytes of message
//! ([the gRPC over HTTP/2 spec](https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md),
//! "Length-Prefixed-Message").
//!
//! [`MessageReader`] is fed the body's DATA in whatever slices it came (a message split
//! across frames, several messages in one frame, a 0-length message) and hands each
//! complete message to a callback, so the messages, and so the signals, do not depend on
//! the split. It is bounded: a message longer than the limit (`observe.max_event_bytes`)
//! stops observation as soon as its prefix says so, before any of it is buffered, and only
//! a message split across frames is copied.
//!
//! A message flagged compressed is inflated whole, under the response's `grpc-encoding`
//! ([`MessageEncoding`]: `gzip`, `deflate` or `zstd`), into a buffer bounded by the same
//! limit, and all of a body's messages together may not inflate to more than
//! `compress::MAX_RATIO` times their compressed size (plus `compress::RATIO_ALLOWANCE`), as
//! [`compress`](super::super::compress) bounds a compressed HTTP body. Whatever cannot be
//! read stops observation, never the stream, and never panics:
//!
//! | input | result |
//! |---|---|
//! | a message longer than the limit (compressed, or once inflated) | [`DecodeError::EventTooLarge`] |
//! | a compressed flag other than 0 or 1 | [`DecodeError::MessageFraming`] |
//! | a compressed message with no `grpc-encoding`, `identity`, or one tokentap cannot decode | [`DecodeError::MessageEncoding`] |
//! | a compressed message that does not inflate (garbage, or empty) | [`DecodeError::Compression`] |
//! | messages inflating past the ratio | [`DecodeError::InflateRatio`] |
//! | a body that ends inside a prefix or a message | [`MessageReader::finish`] says so |
//!
//! The request side reads the same prefixes ([`Prefix`]) without buffering the message.

use std::io::Read;

use super::super::compress::check_ratio;
use super::super::types::DecodeError;

/// The length of a message's prefix: the compressed flag and the 4-byte length.
pub const PREFIX_LEN: usize = 5;

/// zstd's window cap, as for HTTP bodies (`compress.rs`): 2^23 = 8 MiB.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// How the messages flagged compressed are compressed: a `grpc-encoding` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageEncoding {
    /// No `grpc-encoding`, or `identity`: no message may be flagged compressed.
    Identity,
    /// `gzip` (RFC 1952).
    Gzip,
    /// `deflate`: zlib-wrapped (RFC 1950), as gRPC's implementations write it.
    Deflate,
    /// `zstd` (RFC 8878).
    Zstd,
    /// Any other value (`snappy`, say): messages flagged compressed cannot be read, but
    /// those sent uncompressed still can.
    Unsupported,
}

impl MessageEncoding {
    /// The encoding a `grpc-encoding` header's value (`None` when absent) names.
    pub fn parse(value: Option<&[u8]>) -> MessageEncoding {
        let Some(value) = value else {
            return MessageEncoding::Identity;
        };
        let value = value.trim_ascii();
        let is = |name: &[u8]| value.eq_ignore_ascii_case(name);
        if value.is_empty() || is(b"identity") {
            MessageEncoding::Identity
        } else if is(b"gzip") {
            MessageEncoding::Gzip
        } else if is(b"deflate") {
            MessageEncoding::Deflate
        } else if is(b"zstd") {
            MessageEncoding::Zstd
        } else {
            MessageEncoding::Unsupported
        }
    }
}

/// A message's prefix, once read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The compressed flag was 1.
    pub compressed: bool,
    /// The message's length in bytes, as sent.
    pub len: u32,
}

/// Reads one message prefix from bytes in any split.
#[derive(Clone, Copy, Debug, Default)]
pub struct Prefix {
    got: usize,
    bytes: [u8; PREFIX_LEN],
}

impl Prefix {
    /// Take what the prefix still needs from the front of `bytes`: the header once it is
    /// complete (and the prefix is ready for the next one), with the bytes taken.
    pub fn read(&mut self, bytes: &[u8]) -> (Result<Option<Header>, DecodeError>, usize) {
        let wanted = self.bytes.get_mut(self.got..).unwrap_or_default();
        let n = wanted.len().min(bytes.len());
        for (to, from) in wanted.iter_mut().zip(bytes) {
            *to = *from;
        }
        self.got = self.got.saturating_add(n);
        if self.got > 0 && self.bytes[0] > 1 {
            // Known from the first byte, whatever follows.
            self.got = 0;
            return (Err(DecodeError::MessageFraming), n);
        }
        if self.got < PREFIX_LEN {
            return (Ok(None), n);
        }
        self.got = 0;
        let [flag, a, b, c, d] = self.bytes;
        let header = Header {
            compressed: flag == 1,
            len: u32::from_be_bytes([a, b, c, d]),
        };
        (Ok(Some(header)), n)
    }

    /// Whether part of a prefix has been read.
    pub fn is_partial(&self) -> bool {
        self.got > 0
    }
}

/// Cuts a gRPC body into its messages (inflated where they were compressed).
#[derive(Debug)]
pub struct MessageReader {
    max: usize,
    encoding: MessageEncoding,
    prefix: Prefix,
    /// The message being read, when it did not arrive in one slice.
    body: Option<Partial>,
    /// Where compressed messages are inflated; reused.
    inflated: Vec<u8>,
    /// Compressed message bytes so far, and what they inflated to: the ratio bound.
    consumed: u64,
    produced: u64,
}

#[derive(Debug)]
struct Partial {
    compressed: bool,
    len: usize,
    buf: Vec<u8>,
}

impl MessageReader {
    /// A reader of messages of at most `max_message_bytes` (sent, and inflated), of a
    /// response whose `grpc-encoding` is `encoding`.
    pub fn new(max_message_bytes: usize, encoding: MessageEncoding) -> Self {
        MessageReader {
            max: max_message_bytes,
            encoding,
            prefix: Prefix::default(),
            body: None,
            inflated: Vec::new(),
            consumed: 0,
            produced: 0,
        }
    }

    /// Read the next bytes of the body, calling `on_message` with each message they
    /// complete, in order. After an `Err` the reader is not fed again.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        on_message: &mut dyn FnMut(&[u8]),
    ) -> Result<(), DecodeError> {
        while !bytes.is_empty() {
            if let Some(partial) = self.body.as_mut() {
                let n = partial
                    .len
                    .saturating_sub(partial.buf.len())
                    .min(bytes.len());
                let (taken, rest) = bytes.split_at_checked(n).unwrap_or((bytes, &[]));
                partial.buf.extend_from_slice(taken);
                bytes = rest;
                if partial.buf.len() == partial.len {
                    let Partial {
                        compressed, buf, ..
                    } = self.body.take().unwrap_or_else(Partial::empty);
                    self.deliver(compressed, &buf, on_message)?;
                }
                continue;
            }
            let (header, n) = self.prefix.read(bytes);
            bytes = bytes.get(n..).unwrap_or_default();
            let Some(header) = header? else {
                continue;
            };
            let len = self.check(header)?;
            if bytes.len() >= len {
                // The whole message is here: no copy.
                let (message, rest) = bytes.split_at(len);
                bytes = rest;
                self.deliver(header.compressed, message, on_message)?;
            } else {
                self.body = Some(Partial {
                    compressed: header.compressed,
                    len,
                    buf: Vec::with_capacity(len.min(64 << 10)),
                });
            }
        }
        Ok(())
    }

    /// The body ended: whether it ended inside a prefix or a message (that message is
    /// lost; the caller reports it).
    pub fn finish(&self) -> bool {
        self.prefix.is_partial() || self.body.is_some()
    }

    /// The message's length, if a message with this prefix can be read at all.
    fn check(&self, header: Header) -> Result<usize, DecodeError> {
        let len = usize::try_from(header.len).unwrap_or(usize::MAX);
        if len > self.max {
            return Err(DecodeError::EventTooLarge { limit: self.max });
        }
        if header.compressed
            && matches!(
                self.encoding,
                MessageEncoding::Identity | MessageEncoding::Unsupported
            )
        {
            return Err(DecodeError::MessageEncoding);
        }
        Ok(len)
    }

    fn deliver(
        &mut self,
        compressed: bool,
        message: &[u8],
        on_message: &mut dyn FnMut(&[u8]),
    ) -> Result<(), DecodeError> {
        if !compressed {
            on_message(message);
            return Ok(());
        }
        self.inflate(message)?;
        on_message(&self.inflated);
        Ok(())
    }

    /// Inflate one compressed message into `self.inflated`, within the bounds.
    fn inflate(&mut self, message: &[u8]) -> Result<(), DecodeError> {
        if message.is_empty() {
            // No encoding's stream is empty.
            return Err(DecodeError::Compression);
        }
        self.inflated.clear();
        // One byte past the bound tells a message at the bound from one beyond it.
        let cap = u64::try_from(self.max)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let read = match self.encoding {
            MessageEncoding::Gzip => flate2::bufread::GzDecoder::new(message)
                .take(cap)
                .read_to_end(&mut self.inflated),
            MessageEncoding::Deflate => flate2::bufread::ZlibDecoder::new(message)
                .take(cap)
                .read_to_end(&mut self.inflated),
            MessageEncoding::Zstd => {
                let mut decoder = zstd::stream::read::Decoder::with_buffer(message)
                    .map_err(|_| DecodeError::Compression)?;
                decoder
                    .window_log_max(ZSTD_WINDOW_LOG_MAX)
                    .map_err(|_| DecodeError::Compression)?;
                decoder.take(cap).read_to_end(&mut self.inflated)
            }
            // `check` refused these before the message was read.
            MessageEncoding::Identity | MessageEncoding::Unsupported => {
                return Err(DecodeError::MessageEncoding)
            }
        };
        read.map_err(|_| DecodeError::Compression)?;
        if self.inflated.len() > self.max {
            return Err(DecodeError::EventTooLarge { limit: self.max });
        }
        self.consumed = self.consumed.saturating_add(message.len() as u64);
        self.produced = self.produced.saturating_add(self.inflated.len() as u64);
        check_ratio(self.consumed, self.produced)
    }
}

impl Partial {
    fn empty() -> Partial {
        Partial {
            compressed: false,
            len: 0,
            buf: Vec::new(),
        }
    }
}

/// Frame `message` as gRPC sends it, uncompressed: for tests and the simulator.
pub fn frame(message: &[u8]) -> Vec<u8> {
    frame_with(false, message)
}

/// Frame `message` with the given compressed flag (the caller compressed it), for a
/// message made here, small by construction (the simulator's, tests'); one whose size
/// depends on what came from outside goes through [`try_frame_with`].
#[allow(
    clippy::expect_used,
    reason = "for messages tokentap makes itself, far under the 4 GiB a prefix can say"
)]
pub fn frame_with(compressed: bool, message: &[u8]) -> Vec<u8> {
    try_frame_with(compressed, message).expect("a gRPC message is under 4 GiB")
}

/// [`frame_with`], or `None` for a message of 4 GiB or more (a length prefix cannot say it).
pub fn try_frame_with(compressed: bool, message: &[u8]) -> Option<Vec<u8>> {
    let len = u32::try_from(message.len()).ok()?;
    let mut out = Vec::with_capacity(PREFIX_LEN.saturating_add(message.len()));
    out.push(u8::from(compressed));
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::compress::MAX_RATIO;

    const LIMIT: usize = 1 << 10;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).expect("compress");
        e.finish().expect("finish")
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).expect("compress");
        e.finish().expect("finish")
    }

    /// The messages `frames` yield, and the error that stopped the reader, if any; and
    /// whether the body was cut off.
    fn read(
        encoding: MessageEncoding,
        max: usize,
        frames: &[&[u8]],
    ) -> (Vec<Vec<u8>>, Option<DecodeError>, bool) {
        let mut reader = MessageReader::new(max, encoding);
        let mut messages = Vec::new();
        for frame in frames {
            if let Err(e) = reader.feed(frame, &mut |m| messages.push(m.to_vec())) {
                return (messages, Some(e), false);
            }
        }
        (messages, None, reader.finish())
    }

    /// Every split of `body` into two, and byte by byte, gives what it gives whole.
    fn read_all_splits(
        encoding: MessageEncoding,
        max: usize,
        body: &[u8],
    ) -> (Vec<Vec<u8>>, Option<DecodeError>, bool) {
        let whole = read(encoding, max, &[body]);
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(read(encoding, max, &bytes), whole, "byte by byte");
        for cut in 0..=body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(read(encoding, max, &[a, &[], b]), whole, "cut at {cut}");
        }
        whole
    }

    #[test]
    fn messages_in_any_split() {
        let body = [frame(b"one"), frame(b""), frame(b"three"), frame(&[7; 300])].concat();
        let (messages, err, cut) = read_all_splits(MessageEncoding::Identity, LIMIT, &body);
        assert_eq!(
            messages,
            vec![b"one".to_vec(), vec![], b"three".to_vec(), vec![7; 300]]
        );
        assert_eq!((err, cut), (None, false));
    }

    #[test]
    fn compressed_messages_are_inflated_by_their_encoding() {
        let zstd = zstd::bulk::compress(b"zstd message", 3).expect("zstd");
        let cases: [(MessageEncoding, Vec<u8>); 3] = [
            (MessageEncoding::Gzip, gzip(b"zstd message")),
            (MessageEncoding::Deflate, zlib(b"zstd message")),
            (MessageEncoding::Zstd, zstd),
        ];
        for (encoding, compressed) in cases {
            // Compression is per message: an uncompressed one may come between.
            let body = [
                frame_with(true, &compressed),
                frame(b"plain"),
                frame_with(true, &compressed),
            ]
            .concat();
            let (messages, err, _) = read_all_splits(encoding, LIMIT, &body);
            assert_eq!(err, None, "{encoding:?}");
            assert_eq!(
                messages,
                vec![
                    b"zstd message".to_vec(),
                    b"plain".to_vec(),
                    b"zstd message".to_vec()
                ],
                "{encoding:?}"
            );
        }
    }

    #[test]
    fn encodings_from_the_header() {
        let cases: [(Option<&[u8]>, MessageEncoding); 8] = [
            (None, MessageEncoding::Identity),
            (Some(b""), MessageEncoding::Identity),
            (Some(b"identity"), MessageEncoding::Identity),
            (Some(b"gzip"), MessageEncoding::Gzip),
            (Some(b" GZIP "), MessageEncoding::Gzip),
            (Some(b"deflate"), MessageEncoding::Deflate),
            (Some(b"zstd"), MessageEncoding::Zstd),
            (Some(b"snappy"), MessageEncoding::Unsupported),
        ];
        for (value, want) in cases {
            assert_eq!(MessageEncoding::parse(value), want, "{value:?}");
        }
    }

    /// A hostile body, what the reader must make of it in every split: its name, the
    /// call's message encoding, the body, then the messages read, the error and whether
    /// the body ended cut off.
    type Hostile = (
        &'static str,
        MessageEncoding,
        Vec<u8>,
        usize,
        Option<DecodeError>,
        bool,
    );

    fn check_hostile(cases: Vec<Hostile>) {
        for (name, encoding, body, messages, err, cut) in cases {
            let got = read_all_splits(encoding, LIMIT, &body);
            assert_eq!((got.0.len(), got.1, got.2), (messages, err, cut), "{name}");
        }
    }

    /// Hostile framing: prefixes and messages cut short, lengths at and past the limit,
    /// flags that are not 0 or 1.
    #[test]
    fn hostile_framing() {
        use DecodeError::{EventTooLarge, MessageFraming};
        use MessageEncoding::Identity;
        let ok = frame(b"ok");
        check_hostile(vec![
            (
                "a truncated prefix",
                Identity,
                [&ok[..], &[0, 0, 0]].concat(),
                1,
                None,
                true,
            ),
            (
                "a truncated message",
                Identity,
                [&ok[..], &frame(b"lost")[..7]].concat(),
                1,
                None,
                true,
            ),
            (
                "length 2^32-1",
                Identity,
                [&ok[..], &[0, 0xff, 0xff, 0xff, 0xff]].concat(),
                1,
                Some(EventTooLarge { limit: LIMIT }),
                false,
            ),
            (
                "one byte over the limit",
                Identity,
                [ok.clone(), frame(&[0; LIMIT + 1])].concat(),
                1,
                Some(EventTooLarge { limit: LIMIT }),
                false,
            ),
            (
                "exactly the limit",
                Identity,
                frame(&[0; LIMIT]),
                1,
                None,
                false,
            ),
            (
                "flag 2",
                Identity,
                [&ok[..], &[2, 0, 0, 0, 0]].concat(),
                1,
                Some(MessageFraming),
                false,
            ),
            (
                "flag 0xff",
                Identity,
                [&ok[..], &[0xff]].concat(),
                1,
                Some(MessageFraming),
                false,
            ),
        ]);
    }

    /// Hostile compression: a compressed message without a known encoding, broken or
    /// empty gzip, a message that inflates past the limit.
    #[test]
    fn hostile_compression() {
        use DecodeError::{Compression, EventTooLarge, MessageEncoding as Encoding};
        use MessageEncoding::{Gzip, Identity, Unsupported};
        let ok = frame(b"ok");
        let big = gzip(&vec![b'a'; 4 * LIMIT]);
        assert!(big.len() < LIMIT);
        check_hostile(vec![
            (
                "compressed flag, no encoding",
                Identity,
                [ok.clone(), frame_with(true, &gzip(b"x"))].concat(),
                1,
                Some(Encoding),
                false,
            ),
            (
                "compressed flag, unknown encoding",
                Unsupported,
                [ok.clone(), frame_with(true, &gzip(b"x"))].concat(),
                1,
                Some(Encoding),
                false,
            ),
            (
                "unknown encoding, nothing compressed",
                Unsupported,
                [ok.clone(), ok.clone()].concat(),
                2,
                None,
                false,
            ),
            (
                "garbage gzip",
                Gzip,
                [ok.clone(), frame_with(true, b"\x1f\x8b\x08garbage")].concat(),
                1,
                Some(Compression),
                false,
            ),
            (
                "a gzip stream cut short",
                Gzip,
                frame_with(true, &gzip(b"hello")[..12]),
                0,
                Some(Compression),
                false,
            ),
            (
                "an empty compressed message",
                Gzip,
                frame_with(true, b""),
                0,
                Some(Compression),
                false,
            ),
            (
                "inflating past the limit",
                Gzip,
                [ok.clone(), frame_with(true, &big)].concat(),
                1,
                Some(EventTooLarge { limit: LIMIT }),
                false,
            ),
        ]);
    }

    #[test]
    fn the_inflate_ratio_is_bounded() {
        // Messages that each inflate far more than the ratio, under a limit that lets each
        // one through: after the allowance, the ratio stops them.
        let limit = 1 << 20;
        let one = zstd::bulk::compress(&vec![b'a'; limit], 19).expect("zstd");
        assert!(limit as u64 / one.len() as u64 > 4 * MAX_RATIO);
        let body: Vec<u8> = (0..64).flat_map(|_| frame_with(true, &one)).collect();
        let (messages, err, _) = read(MessageEncoding::Zstd, limit, &[&body]);
        assert_eq!(err, Some(DecodeError::InflateRatio { ratio: MAX_RATIO }));
        assert!((1..64).contains(&messages.len()), "{}", messages.len());
    }

    #[test]
    fn an_oversize_message_is_refused_before_it_is_buffered() {
        let mut reader = MessageReader::new(LIMIT, MessageEncoding::Identity);
        let prefix = [0, 0, 0x10, 0, 0]; // 1 MiB announced
        assert_eq!(
            reader.feed(&prefix, &mut |_| {}),
            Err(DecodeError::EventTooLarge { limit: LIMIT })
        );
        assert!(reader.body.is_none());
    }
}
