//! A connection with bytes put back in front of it: what the fast path read of a
//! connection before deciding to hand it to hyper is read again first, so hyper serves
//! the connection exactly as if it had read every byte itself.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, whose reads return `prefix` first.
pub struct Rewind<T> {
    prefix: Vec<u8>,
    /// How much of `prefix` has been read again.
    replayed: usize,
    inner: T,
}

impl<T> Rewind<T> {
    pub fn new(prefix: Vec<u8>, inner: T) -> Rewind<T> {
        Rewind {
            prefix,
            replayed: 0,
            inner,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.replayed < this.prefix.len() {
            let rest = this.prefix.get(this.replayed..).unwrap_or_default();
            let n = rest.len().min(buf.remaining());
            buf.put_slice(rest.get(..n).unwrap_or_default());
            this.replayed = this.replayed.saturating_add(n);
            if this.replayed == this.prefix.len() {
                this.prefix = Vec::new();
                this.replayed = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn the_prefix_is_read_first_then_the_connection() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut rewound = Rewind::new(b"GET / HTTP/1.1\r\n".to_vec(), near);
        far.write_all(b"Host: a\r\n\r\n").await.expect("write");
        drop(far);
        // Small reads: the prefix may take several.
        let mut read = Vec::new();
        let mut buf = [0u8; 5];
        loop {
            let n = rewound.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            read.extend_from_slice(&buf[..n]);
        }
        assert_eq!(read, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    }

    #[tokio::test]
    async fn writes_go_to_the_connection() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut rewound = Rewind::new(b"unread".to_vec(), near);
        rewound.write_all(b"answer").await.expect("write");
        rewound.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"answer");
    }
}
