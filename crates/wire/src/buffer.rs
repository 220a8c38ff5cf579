//! [`BodyBuffer`]: a bounded, growing copy of a body (or of one document inside it), for
//! the framings that must see a whole JSON document before reading it.

use super::types::DecodeError;

/// A body buffer that never grows past its limit, whatever the frames.
#[derive(Debug)]
pub(crate) struct BodyBuffer {
    limit: usize,
    body: Vec<u8>,
}

impl BodyBuffer {
    pub(crate) fn new(limit: usize) -> Self {
        BodyBuffer {
            limit,
            body: Vec::new(),
        }
    }

    /// Append `bytes`, or fail if the body would pass the limit.
    pub(crate) fn extend(&mut self, bytes: &[u8]) -> Result<(), DecodeError> {
        let needed = self.body.len().saturating_add(bytes.len());
        if needed > self.limit {
            return Err(DecodeError::BodyTooLarge { limit: self.limit });
        }
        if needed > self.body.capacity() {
            // Grow geometrically, but never past the limit.
            let target = needed
                .max(self.body.capacity().saturating_mul(2))
                .min(self.limit);
            self.body
                .reserve_exact(target.saturating_sub(self.body.len()));
        }
        self.body.extend_from_slice(bytes);
        Ok(())
    }

    /// The body so far, leaving the buffer empty.
    pub(crate) fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }

    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.body.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_buffer_is_bounded_whatever_the_frames() {
        let body = b"0123456789abcdef";
        let mut buf = BodyBuffer::new(body.len());
        for byte in body.chunks(1) {
            buf.extend(byte).expect("within limit");
            assert!(buf.capacity() <= body.len());
        }
        assert_eq!(
            buf.extend(b"x"),
            Err(DecodeError::BodyTooLarge { limit: body.len() })
        );
        assert_eq!(buf.take(), body);
    }
}
