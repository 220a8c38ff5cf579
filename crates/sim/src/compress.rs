//! The content codings the simulator sends (gzip, zstd) and a streaming compressor that
//! flushes after every frame, as streaming servers do, so that each event can be decoded
//! on arrival.

use std::io::Write;

use bytes::Bytes;
use http::HeaderValue;

/// A content coding the simulator can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Coding {
    Gzip,
    Zstd,
}

impl Coding {
    pub(super) fn header(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Coding::Gzip => "gzip",
            Coding::Zstd => "zstd",
        })
    }
}

/// A streaming compressor: each frame is flushed, so it can be decoded on arrival.
pub(super) enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    pub(super) fn new(coding: Coding) -> Encoder {
        match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::fast(),
            )),
            Coding::Zstd => match zstd::stream::write::Encoder::new(Vec::new(), 1) {
                Ok(encoder) => Encoder::Zstd(encoder),
                // Cannot happen short of allocation failure; gzip needs no context.
                Err(_) => Encoder::new(Coding::Gzip),
            },
        }
    }

    /// Compress and flush one frame. Writing into a `Vec` cannot fail.
    pub(super) fn frame(&mut self, bytes: &[u8]) -> Bytes {
        let out = match self {
            Encoder::Gzip(e) => {
                let _ = e.write_all(bytes).and_then(|()| e.flush());
                std::mem::take(e.get_mut())
            }
            Encoder::Zstd(e) => {
                let _ = e.write_all(bytes).and_then(|()| e.flush());
                std::mem::take(e.get_mut())
            }
        };
        Bytes::from(out)
    }

    /// The end of the compressed stream.
    pub(super) fn finish(&mut self) -> Bytes {
        let out = match self {
            Encoder::Gzip(e) => {
                let _ = e.try_finish();
                std::mem::take(e.get_mut())
            }
            Encoder::Zstd(e) => {
                let _ = e.do_finish();
                std::mem::take(e.get_mut())
            }
        };
        Bytes::from(out)
    }
}
