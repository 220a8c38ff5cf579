//! The worker's own buffers for what one upstream read brings, what the response reader
//! found in it and what the relay sends on for it.
//!
//! A streamed response brings an event or so per read, and the relay writes what it
//! relays for it to the client at once in the common case. With a receive buffer and an
//! output buffer per stream, each event lands in a cold corner of 2 x 8 KiB per stream
//! (16 MB at 1,000 streams); with the worker's own pair, every event uses the same few
//! cache lines whatever the number of streams, and a held stream keeps no buffer at all.
//!
//! The buffers are moved out while in use and moved back after, never borrowed across an
//! `await`: a stream that has to wait (for a slow client, or for the rest of a head)
//! keeps its own copy of the bytes in question, and the others meanwhile take fresh
//! buffers.

use std::cell::Cell;
use std::io;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::response::Piece;

/// How much is read from either side at a time.
pub const READ_CHUNK: usize = 8192;

thread_local! {
    // One thread-local for the three: each access to one costs a check of its state.
    static BUFFERS: Cell<Buffers> = const {
        Cell::new(Buffers {
            received: Vec::new(),
            pieces: Vec::new(),
            out: Vec::new(),
        })
    };
}

/// A receive buffer, the pieces read from it and an output buffer, all empty when taken.
#[derive(Debug, Default)]
pub struct Buffers {
    pub received: Vec<u8>,
    pub pieces: Vec<Piece>,
    pub out: Vec<u8>,
}

/// The worker's buffers (fresh ones if another stream has them).
pub fn take() -> Buffers {
    let mut buffers = BUFFERS.take();
    buffers.received.clear();
    buffers.pieces.clear();
    buffers.out.clear();
    buffers
}

/// Hand the buffers back for the next read on this worker.
pub fn give_back(buffers: Buffers) {
    BUFFERS.set(buffers);
}

/// Read what `stream` has into `input`: the count, `0` at its end.
pub async fn read_more(stream: &mut TcpStream, input: &mut Vec<u8>) -> io::Result<usize> {
    if input.capacity().saturating_sub(input.len()) < READ_CHUNK / 2 {
        input.reserve(READ_CHUNK);
    }
    stream.read_buf(input).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffers_come_back_empty_with_their_room_and_a_second_taker_gets_fresh_ones() {
        let mut first = take();
        first.received.extend_from_slice(b"event");
        first.pieces.push(Piece::End);
        first.out.reserve(4096);
        let room = first.out.capacity();
        // While the first holder waits, a second stream takes buffers of its own.
        let second = take();
        assert_eq!(second.received.capacity(), 0);
        give_back(second);
        give_back(first);
        let again = take();
        assert!(again.received.is_empty() && again.pieces.is_empty() && again.out.is_empty());
        assert_eq!(again.out.capacity(), room);
    }
}
