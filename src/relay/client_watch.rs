//! The client's side of a relayed exchange while the upstream works: whether the client
//! left (its connection ended) or sent more (it is still there), seen without reading its
//! bytes. The request side watches it during the upstream connect ([`request_relay`]),
//! the response loop until the response ends ([`connection`]), so a client that leaves
//! is noticed at once, not when tokentap next writes to it.
//!
//! [`request_relay`]: super::request_relay
//! [`connection`]: super::connection

use std::future::Future;
use std::io;
use std::task::Poll;

use tokio::net::TcpStream;

/// What the client did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Its connection ended (closed or reset): it left.
    Left,
    /// It sent more (a pipelined request, the rest of a body): it is still there.
    Sent,
}

/// Resolves when the client does something: its connection ended (a close or a reset:
/// it left, and the upstream is to be freed at once), or it sent more. A client that only
/// shut its write side looks the same as one that closed: both are taken as gone, as
/// nginx and Envoy take them.
///
/// It waits in the socket's reader slot (`poll_read_ready`), not in a readiness future:
/// this is polled once per event while the upstream streams, and the slot costs no
/// registration to undo each time another branch wins.
pub fn activity(client: &TcpStream) -> impl Future<Output = Activity> + '_ {
    std::future::poll_fn(move |cx| poll_activity(client, cx))
}

/// [`activity`] as a poll: `Pending` leaves the task's waker in the socket's reader slot,
/// where it stays until the socket has news (which wakes the task), whether or not this
/// is polled again meanwhile.
pub fn poll_activity(client: &TcpStream, cx: &mut std::task::Context<'_>) -> Poll<Activity> {
    loop {
        if std::task::ready!(client.poll_read_ready(cx)).is_err() {
            return Poll::Ready(Activity::Left);
        }
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
        let peeked = client.try_io(tokio::io::Interest::READABLE, || {
            socket2::SockRef::from(client).peek(&mut byte)
        });
        match peeked {
            Ok(0) => return Poll::Ready(Activity::Left),
            Ok(_) => return Poll::Ready(Activity::Sent),
            // Readiness that was stale is cleared: wait again.
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Poll::Ready(Activity::Left),
        }
    }
}
