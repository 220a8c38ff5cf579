//! Observer-side decompression of `Content-Encoding: gzip | deflate | br | zstd` bodies.
//!
//! A compressed response is forwarded exactly as it came: the client asked for the
//! encoding and decompresses it itself. Only the observer's copy is inflated, here, by
//! [`Decompressing`], a [`Decoder`] that wraps the dialect's decoder and feeds it the
//! decompressed bytes as they become available. It is push-based and keeps no output:
//! every inflated piece goes straight to the inner decoder, so an event is decoded (and
//! stamped) in the same frame as the compressed bytes that complete it, and the signals
//! do not depend on how the compressed body was split.
//!
//! Bounded: the inflated bytes pass through one fixed 8 KiB buffer; the inner decoder's own
//! limits bound what it buffers; zstd's window is capped at 8 MiB (RFC 9659 asks HTTP
//! decoders to support no more), brotli's is at most 16 MiB by its format, gzip's 32 KiB.
//! And a body may not inflate to more than [`MAX_RATIO`] times its compressed size (plus
//! 1 MiB), so a small compressed body cannot make the observer chew through gigabytes.
//! (That bound counts the compressed bytes fed so far, so exactly where a bomb is stopped
//! can depend on the frames; no real stream comes near it. Where a corrupt body is
//! noticed can depend on them too. Valid bodies decode the same however they are split.)

use flate2::{Decompress, FlushDecompress, Status};
use zstd::stream::raw::{DParameter, Decoder as ZstdDecoder, Operation};

use brotli_decompressor::{BrotliDecompressStream, BrotliResult, BrotliState, StandardAlloc};

use super::types::{DecodeError, Decoder, Signal};

/// A body may inflate to at most this many times its compressed size (plus
/// 1 MiB). Deflate's own maximum is about 1032; real event streams inflate
/// 5 to 50 times.
pub const MAX_RATIO: u64 = 1024;
/// Inflated bytes allowed beyond the ratio, so that a small body is never cut off.
pub const RATIO_ALLOWANCE: u64 = 1 << 20;

/// The bomb bound, for every compressed body tokentap inflates (HTTP bodies here, gRPC
/// messages in `grpc::framing`): an error once `produced` inflated bytes pass
/// [`MAX_RATIO`] times the `consumed` compressed ones plus [`RATIO_ALLOWANCE`].
pub(crate) fn check_ratio(consumed: u64, produced: u64) -> Result<(), DecodeError> {
    let budget = consumed
        .saturating_mul(MAX_RATIO)
        .saturating_add(RATIO_ALLOWANCE);
    if produced > budget {
        return Err(DecodeError::InflateRatio { ratio: MAX_RATIO });
    }
    Ok(())
}
/// The inflate buffer.
const BUFFER: usize = 8 << 10;
/// zstd's window cap: 2^23 = 8 MiB.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// A content coding tokentap can decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// `gzip` / `x-gzip` (RFC 1952; several members are decoded in turn).
    Gzip,
    /// `deflate`: zlib-wrapped (RFC 1950) as the spec says, or raw deflate as some servers
    /// send it, told apart by the first two bytes.
    Deflate,
    /// `br` (RFC 7932).
    Brotli,
    /// `zstd` (RFC 8878).
    Zstd,
}

/// A `Content-Encoding` tokentap cannot decode (unknown, or several codings stacked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unsupported content-encoding")]
pub struct UnsupportedEncoding;

impl Coding {
    /// The coding of a `Content-Encoding` value: `Ok(None)` for none (`identity` or
    /// empty), `Err` for one tokentap cannot decode.
    pub fn parse(value: &[u8]) -> Result<Option<Coding>, UnsupportedEncoding> {
        let mut found = None;
        for token in value.split(|&b| b == b',') {
            let token = token.trim_ascii();
            let coding = if token.is_empty() || token.eq_ignore_ascii_case(b"identity") {
                continue;
            } else if token.eq_ignore_ascii_case(b"gzip") || token.eq_ignore_ascii_case(b"x-gzip") {
                Coding::Gzip
            } else if token.eq_ignore_ascii_case(b"deflate") {
                Coding::Deflate
            } else if token.eq_ignore_ascii_case(b"br") {
                Coding::Brotli
            } else if token.eq_ignore_ascii_case(b"zstd") {
                Coding::Zstd
            } else {
                return Err(UnsupportedEncoding);
            };
            if found.replace(coding).is_some() {
                return Err(UnsupportedEncoding); // stacked codings
            }
        }
        Ok(found)
    }

    /// Stable lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }
}

/// A decoder fed the decompressed bytes of a compressed body.
pub struct Decompressing {
    codec: Codec,
    inner: Box<dyn Decoder>,
    buf: Box<[u8]>,
    consumed: u64,
    produced: u64,
    /// The compressed stream ended; anything after it is ignored.
    ended: bool,
}

impl Decompressing {
    /// Wrap `inner`, which decodes the body once decompressed.
    pub fn new(coding: Coding, inner: Box<dyn Decoder>) -> Result<Self, DecodeError> {
        Ok(Decompressing {
            codec: Codec::new(coding)?,
            inner,
            buf: vec![0; BUFFER].into_boxed_slice(),
            consumed: 0,
            produced: 0,
            ended: false,
        })
    }

    /// Inflate `input` (possibly empty, to drain), passing the output on.
    fn pump(&mut self, mut input: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        while !self.ended {
            let step = self.codec.run(input, &mut self.buf)?;
            input = input.get(step.read..).unwrap_or_default();
            if step.written > 0 {
                self.produced = self.produced.saturating_add(step.written as u64);
                check_ratio(self.consumed, self.produced)?;
                let written = self.buf.get(..step.written).unwrap_or_default();
                self.inner.feed(written, out)?;
            }
            self.ended = step.ended;
            let progress = step.read > 0 || step.written > 0;
            let output_full = step.written == self.buf.len();
            if !progress || (input.is_empty() && !output_full) {
                break;
            }
        }
        Ok(())
    }
}

impl Decoder for Decompressing {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        self.consumed = self.consumed.saturating_add(bytes.len() as u64);
        self.pump(bytes, out)
    }

    /// Drains what the codec may still hold, then finishes the inner decoder. A body cut
    /// off mid-stream is not an error here: the inner decoder reports what it lost.
    fn finish(&mut self, out: &mut Vec<Signal>) -> Result<(), DecodeError> {
        self.pump(&[], out)?;
        self.inner.finish(out)
    }
}

/// What one codec step did.
struct Step {
    read: usize,
    written: usize,
    /// The compressed stream is complete; what follows it is not part of it.
    ended: bool,
}

enum Codec {
    Gzip(Box<Gzip>),
    Deflate(Box<Deflate>),
    Brotli(Box<BrotliState<StandardAlloc, StandardAlloc, StandardAlloc>>),
    Zstd(Box<ZstdDecoder<'static>>),
}

impl Codec {
    fn new(coding: Coding) -> Result<Codec, DecodeError> {
        Ok(match coding {
            Coding::Gzip => Codec::Gzip(Box::new(Gzip::new())),
            Coding::Deflate => Codec::Deflate(Box::new(Deflate::Sniffing(None))),
            Coding::Brotli => Codec::Brotli(Box::new(BrotliState::new(
                StandardAlloc::default(),
                StandardAlloc::default(),
                StandardAlloc::default(),
            ))),
            Coding::Zstd => {
                let mut decoder = ZstdDecoder::new().map_err(|_| DecodeError::Compression)?;
                decoder
                    .set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))
                    .map_err(|_| DecodeError::Compression)?;
                Codec::Zstd(Box::new(decoder))
            }
        })
    }

    fn run(&mut self, input: &[u8], output: &mut [u8]) -> Result<Step, DecodeError> {
        match self {
            Codec::Gzip(gzip) => gzip.run(input, output),
            Codec::Deflate(deflate) => deflate.run(input, output),
            Codec::Brotli(state) => {
                let (mut avail_in, mut in_off) = (input.len(), 0);
                let (mut avail_out, mut out_off, mut total) = (output.len(), 0, 0);
                let result = BrotliDecompressStream(
                    &mut avail_in,
                    &mut in_off,
                    input,
                    &mut avail_out,
                    &mut out_off,
                    output,
                    &mut total,
                    state,
                );
                match result {
                    BrotliResult::ResultFailure => Err(DecodeError::Compression),
                    other => Ok(Step {
                        read: in_off,
                        written: out_off,
                        ended: matches!(other, BrotliResult::ResultSuccess),
                    }),
                }
            }
            Codec::Zstd(decoder) => {
                let status = decoder
                    .run_on_buffers(input, output)
                    .map_err(|_| DecodeError::Compression)?;
                Ok(Step {
                    read: status.bytes_read,
                    written: status.bytes_written,
                    ended: false, // another frame may follow
                })
            }
        }
    }
}

/// One inflate call on a raw deflate stream.
fn inflate(
    inflater: &mut Decompress,
    input: &[u8],
    output: &mut [u8],
) -> Result<Step, DecodeError> {
    let (in_before, out_before) = (inflater.total_in(), inflater.total_out());
    let status = inflater
        .decompress(input, output, FlushDecompress::None)
        .map_err(|_| DecodeError::Compression)?;
    let delta = |after: u64, before: u64| {
        usize::try_from(after.saturating_sub(before)).unwrap_or(usize::MAX)
    };
    Ok(Step {
        read: delta(inflater.total_in(), in_before),
        written: delta(inflater.total_out(), out_before),
        ended: status == Status::StreamEnd,
    })
}

/// HTTP `deflate`: zlib or raw, decided by the first two bytes.
enum Deflate {
    /// Before the first two bytes; the first one, if it came alone.
    Sniffing(Option<u8>),
    /// `held`: a sniffed first byte not yet given to the inflater (it came alone in its
    /// frame, and a zlib header is only taken whole).
    Inflating {
        inflater: Decompress,
        held: Option<u8>,
    },
}

impl Deflate {
    fn run(&mut self, input: &[u8], output: &mut [u8]) -> Result<Step, DecodeError> {
        if let Deflate::Sniffing(first) = *self {
            let (cmf, flg, held) = match (first, input) {
                (Some(cmf), [flg, ..]) => (cmf, *flg, Some(cmf)),
                (None, [cmf, flg, ..]) => (*cmf, *flg, None),
                (None, [cmf]) => {
                    *self = Deflate::Sniffing(Some(*cmf));
                    return Ok(Step {
                        read: 1,
                        written: 0,
                        ended: false,
                    });
                }
                (_, []) => {
                    return Ok(Step {
                        read: 0,
                        written: 0,
                        ended: false,
                    })
                }
            };
            // RFC 1950: CM = 8 and the header checksum holds.
            let zlib = cmf & 0x0f == 8 && (u16::from(cmf) << 8 | u16::from(flg)) % 31 == 0;
            *self = Deflate::Inflating {
                inflater: Decompress::new(zlib),
                held,
            };
        }
        let Deflate::Inflating { inflater, held } = self else {
            return Err(DecodeError::Compression); // unreachable: sniffing ended above
        };
        let Some(byte) = *held else {
            return inflate(inflater, input, output);
        };
        // Give the held byte together with what follows it.
        let mut joined = [0u8; 256];
        let n = input.len().min(joined.len().saturating_sub(1));
        joined[0] = byte;
        for (to, from) in joined.iter_mut().skip(1).zip(input) {
            *to = *from;
        }
        let step = inflate(inflater, joined.get(..=n).unwrap_or(&joined), output)?;
        if step.read == 0 {
            return Ok(step);
        }
        *held = None;
        Ok(Step {
            read: step.read.saturating_sub(1),
            ..step
        })
    }
}

/// Gzip members (RFC 1952): header, raw deflate, 8-byte trailer; then maybe another member.
struct Gzip {
    stage: GzStage,
    inflater: Decompress,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GzStage {
    /// The fixed 10-byte header; `flags` read at byte 3.
    Fixed {
        got: u8,
        flags: u8,
    },
    /// FEXTRA's 2-byte length.
    ExtraLen {
        got: u8,
        len: u16,
        flags: u8,
    },
    /// FEXTRA's data.
    Extra {
        left: u16,
        flags: u8,
    },
    /// FNAME, zero-terminated.
    Name {
        flags: u8,
    },
    /// FCOMMENT, zero-terminated.
    Comment {
        flags: u8,
    },
    /// FHCRC.
    HeaderCrc {
        left: u8,
    },
    Body,
    /// CRC32 and ISIZE (not checked: the client checks its own copy).
    Trailer {
        left: u8,
    },
    /// Between members: another one starts with its magic byte, anything else ends.
    Between,
}

const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;

impl Gzip {
    fn new() -> Gzip {
        Gzip {
            stage: GzStage::Fixed { got: 0, flags: 0 },
            inflater: Decompress::new(false),
        }
    }

    /// The stage after the optional header field(s) before the ones in `flags` are done.
    fn after(flags: u8) -> GzStage {
        if flags & FEXTRA != 0 {
            GzStage::ExtraLen {
                got: 0,
                len: 0,
                flags,
            }
        } else if flags & FNAME != 0 {
            GzStage::Name { flags }
        } else if flags & FCOMMENT != 0 {
            GzStage::Comment { flags }
        } else if flags & FHCRC != 0 {
            GzStage::HeaderCrc { left: 2 }
        } else {
            GzStage::Body
        }
    }

    fn run(&mut self, input: &[u8], output: &mut [u8]) -> Result<Step, DecodeError> {
        if self.stage == GzStage::Body {
            let step = inflate(&mut self.inflater, input, output)?;
            if step.ended {
                self.stage = GzStage::Trailer { left: 8 };
            }
            return Ok(Step {
                ended: false,
                ..step
            });
        }
        let mut read = 0;
        for &byte in input {
            if self.stage == GzStage::Body {
                break;
            }
            if self.stage == GzStage::Between && byte != 0x1f {
                return Ok(Step {
                    read,
                    written: 0,
                    ended: true,
                });
            }
            read = read.saturating_add(1);
            self.stage = match self.stage {
                GzStage::Between => GzStage::Fixed { got: 1, flags: 0 },
                GzStage::Fixed { got, flags } => {
                    let ok = match got {
                        0 => byte == 0x1f,
                        1 => byte == 0x8b,
                        2 => byte == 8, // CM = deflate
                        _ => true,
                    };
                    if !ok {
                        return Err(DecodeError::Compression);
                    }
                    let flags = if got == 3 { byte & 0x1f } else { flags };
                    if got == 9 {
                        self.inflater.reset(false);
                        Gzip::after(flags)
                    } else {
                        GzStage::Fixed {
                            got: got.saturating_add(1),
                            flags,
                        }
                    }
                }
                GzStage::ExtraLen { got, len, flags } => {
                    let shift = u32::from(got).saturating_mul(8);
                    let len = len | u16::from(byte).checked_shl(shift).unwrap_or(0);
                    match (got, len) {
                        (0, _) => GzStage::ExtraLen { got: 1, len, flags },
                        (_, 0) => Gzip::after(flags & !FEXTRA),
                        (_, left) => GzStage::Extra { left, flags },
                    }
                }
                GzStage::Extra { left, flags } => match left.saturating_sub(1) {
                    0 => Gzip::after(flags & !FEXTRA),
                    left => GzStage::Extra { left, flags },
                },
                GzStage::Name { flags } if byte == 0 => Gzip::after(flags & !(FEXTRA | FNAME)),
                GzStage::Comment { flags } if byte == 0 => {
                    Gzip::after(flags & !(FEXTRA | FNAME | FCOMMENT))
                }
                stage @ (GzStage::Name { .. } | GzStage::Comment { .. }) => stage,
                GzStage::HeaderCrc { left: 1 } => GzStage::Body,
                GzStage::HeaderCrc { left } => GzStage::HeaderCrc {
                    left: left.saturating_sub(1),
                },
                GzStage::Trailer { left: 1 } => GzStage::Between,
                GzStage::Trailer { left } => GzStage::Trailer {
                    left: left.saturating_sub(1),
                },
                GzStage::Body => GzStage::Body,
            };
        }
        Ok(Step {
            read,
            written: 0,
            ended: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::frame::SseStream;
    use crate::openai::OpenAi;
    use crate::types::{DecodeLimits, Dialect, OutputKind};

    const EVENT: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    const HI: Signal = Signal::Output {
        tokens: 1,
        exact: false,
        kind: OutputKind::Content,
    };

    fn chat() -> Box<dyn Decoder> {
        Box::new(SseStream::new(
            OpenAi::new(Dialect::OpenAiChat, None),
            DecodeLimits::DEFAULT,
        ))
    }

    /// Gzip with a sync flush after each event, as a streaming server compresses.
    fn gzip_events(events: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut pieces = Vec::new();
        for event in events {
            enc.write_all(event).expect("compress");
            enc.flush().expect("flush");
            pieces.push(std::mem::take(enc.get_mut()));
        }
        let tail = enc.finish().expect("finish");
        pieces.last_mut().expect("one event").extend(tail);
        pieces
    }

    #[test]
    fn parse_content_encoding() {
        assert_eq!(Coding::parse(b"gzip"), Ok(Some(Coding::Gzip)));
        assert_eq!(Coding::parse(b" X-GZIP "), Ok(Some(Coding::Gzip)));
        assert_eq!(Coding::parse(b"br"), Ok(Some(Coding::Brotli)));
        assert_eq!(Coding::parse(b"zstd, identity"), Ok(Some(Coding::Zstd)));
        assert_eq!(Coding::parse(b"deflate"), Ok(Some(Coding::Deflate)));
        assert_eq!(Coding::parse(b"identity"), Ok(None));
        assert_eq!(Coding::parse(b""), Ok(None));
        assert_eq!(Coding::parse(b"gzip, br"), Err(UnsupportedEncoding));
        assert_eq!(Coding::parse(b"compress"), Err(UnsupportedEncoding));
    }

    #[test]
    fn each_event_is_decoded_in_the_frame_that_completes_it() {
        let pieces = gzip_events(&[EVENT, EVENT, EVENT]);
        let mut dec = Decompressing::new(Coding::Gzip, chat()).expect("codec");
        for piece in &pieces {
            let mut out = Vec::new();
            dec.feed(piece, &mut out).expect("feed");
            assert_eq!(out, vec![HI]);
        }
        let mut out = Vec::new();
        dec.finish(&mut out).expect("finish");
        assert_eq!(out, vec![]);
    }

    #[test]
    fn zstd_and_zlib_and_raw_deflate_flush_per_event_too() {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).expect("encoder");
        let mut dec = Decompressing::new(Coding::Zstd, chat()).expect("codec");
        for _ in 0..3 {
            enc.write_all(EVENT).expect("compress");
            enc.flush().expect("flush");
            let mut out = Vec::new();
            dec.feed(&std::mem::take(enc.get_mut()), &mut out)
                .expect("feed");
            assert_eq!(out, vec![HI]);
        }
        for zlib in [true, false] {
            let mut dec = Decompressing::new(Coding::Deflate, chat()).expect("codec");
            let compressed = if zlib {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(EVENT).expect("compress");
                e.finish().expect("finish")
            } else {
                let mut e =
                    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(EVENT).expect("compress");
                e.finish().expect("finish")
            };
            let mut out = Vec::new();
            for byte in compressed.chunks(1) {
                dec.feed(byte, &mut out).expect("feed");
            }
            dec.finish(&mut out).expect("finish");
            assert_eq!(out, vec![HI], "zlib: {zlib}");
        }
    }

    #[test]
    fn gzip_header_fields_and_multiple_members() {
        let mut member = flate2::GzBuilder::new()
            .filename("events.sse")
            .comment("a comment")
            .extra(vec![1, 2, 3])
            .write(Vec::new(), flate2::Compression::fast());
        member.write_all(EVENT).expect("compress");
        let member = member.finish().expect("finish");
        let body = [&member[..], &member[..]].concat();
        let mut dec = Decompressing::new(Coding::Gzip, chat()).expect("codec");
        let mut out = Vec::new();
        for byte in body.chunks(1) {
            dec.feed(byte, &mut out).expect("feed");
        }
        dec.finish(&mut out).expect("finish");
        assert_eq!(out, vec![HI, HI]);
        // Trailing bytes that do not start a member are ignored.
        let padded = [&member[..], b"\0\0\0junk"].concat();
        let mut dec = Decompressing::new(Coding::Gzip, chat()).expect("codec");
        let mut out = Vec::new();
        dec.feed(&padded, &mut out).expect("feed");
        assert_eq!(out, vec![HI]);
    }

    #[test]
    fn corrupt_input_stops_observation() {
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd] {
            let mut dec = Decompressing::new(coding, chat()).expect("codec");
            let got = dec.feed(
                b"\x1f\x8b\x07this is not compressed at all",
                &mut Vec::new(),
            );
            assert_eq!(got, Err(DecodeError::Compression), "{coding:?}");
        }
    }

    #[test]
    fn inflate_ratio_is_bounded() {
        // 64 MiB of newlines (nothing for the SSE decoder to keep) compress to a few KiB.
        let newlines = vec![b'\n'; 64 << 20];
        let bomb = zstd::encode_all(&newlines[..], 19).expect("compress");
        assert!(bomb.len() < 64 << 10);
        let mut dec = Decompressing::new(Coding::Zstd, chat()).expect("codec");
        let got = dec.feed(&bomb, &mut Vec::new());
        assert_eq!(got, Err(DecodeError::InflateRatio { ratio: MAX_RATIO }));
    }
}
