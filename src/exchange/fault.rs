//! Why an exchange ended before the client got a response head, and whose fault it was.
//!
//! Both transports report their failures as an [`ExchangeError`], and how a body that had
//! begun ended as a [`BodyEnd`]. What a failure answers (its status) and how each is
//! counted (its outcome) is decided once, with every other outcome rule, in
//! [`crate::outcome::answer`].

use std::fmt::Display;
use std::time::Duration;

use crate::intermediary::{HostError, UnsupportedTransferCoding};

/// A failed exchange, before any response head reached the client.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error(transparent)]
    Upstream(#[from] UpstreamFault),
    #[error(transparent)]
    Client(#[from] ClientFault),
}

/// The upstream (or the way to it) failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamFault {
    #[error("cannot connect to upstream: {0}")]
    Connect(String),
    #[error("upstream response head not received within {0:?}")]
    HeadTimeout(Duration),
    #[error("upstream request failed: {0}")]
    Request(String),
    #[error("upstream response: {0}")]
    Framing(UnsupportedTransferCoding),
    /// RFC 9110 15.2.2: a server must not switch to a protocol the client did not ask for.
    #[error("upstream answered 101 Switching Protocols to a request that asked for no upgrade")]
    UnsolicitedSwitch,
    /// tokentap itself failed (panicked) while forwarding, before the response head
    /// ([`boundary`](super::boundary)). The panic's message is logged, never answered: it
    /// may hold values of the request.
    #[error("internal error while forwarding")]
    Internal(String),
}

/// The client's request cannot be forwarded, or the client left. Also what a request body
/// that failed on its way up left behind for its exchange (the hyper transport's
/// `BodyWatch`), so it is cloned and compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientFault {
    #[error("malformed request body: {0}")]
    MalformedBody(String),
    #[error("request body stalled: nothing arrived for {0:?}")]
    BodyTimeout(Duration),
    #[error("client went away before its response head")]
    Gone,
    #[error("invalid request: {0}")]
    InvalidHost(HostError),
    #[error("request: {0}")]
    RequestCoding(UnsupportedTransferCoding),
    #[error("CONNECT is not supported by this reverse proxy")]
    ConnectMethod,
}

/// How a response body that had begun reaching the client ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// The whole body was handed to the client.
    Clean,
    /// The upstream sent nothing for `upstream.idle_timeout` while tokentap waited.
    UpstreamIdle,
    /// The upstream connection broke, or its framing did, before the end.
    UpstreamBroken,
    /// The client went away before the end.
    ClientGone,
}

impl BodyEnd {
    /// The upstream broke the body off (`why`): logged here, with one text for both
    /// transports, and the end to record.
    pub fn upstream_broken(why: impl Display) -> BodyEnd {
        tracing::warn!(error = %why, "upstream stream failed mid-body");
        BodyEnd::UpstreamBroken
    }

    /// The upstream sent nothing for `timeout` while tokentap waited: logged here, with one
    /// text for both transports, and the end to record.
    pub fn upstream_idle(timeout: Duration) -> BodyEnd {
        tracing::warn!(?timeout, "upstream stream idle; aborting it");
        BodyEnd::UpstreamIdle
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a `warn!` wrote while `f` ran.
    fn logged(f: impl FnOnce() -> BodyEnd) -> (BodyEnd, String) {
        #[derive(Clone, Default)]
        struct Log(Arc<Mutex<Vec<u8>>>);
        impl Write for Log {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let log = Log::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let end = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        (end, text)
    }

    /// Both transports end a broken or idle body through these, so they log the same line
    /// and record the same end.
    #[test]
    fn a_body_the_upstream_ends_is_logged_once_the_same_way() {
        let (end, text) = logged(|| BodyEnd::upstream_broken("connection reset"));
        assert_eq!(end, BodyEnd::UpstreamBroken);
        assert!(text.contains("WARN"), "{text}");
        assert!(
            text.contains("upstream stream failed mid-body error=connection reset"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
        let (end, text) = logged(|| BodyEnd::upstream_idle(Duration::from_millis(300)));
        assert_eq!(end, BodyEnd::UpstreamIdle);
        assert!(
            text.contains("upstream stream idle; aborting it timeout=300ms"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
    }
}
