//! The response side of one relayed exchange, sans-IO: what each upstream read means.
//!
//! The relay's I/O loop ([`connection`](super::connection)) reads the upstream and hands
//! each read to [`ResponseRelay::feed`]. The machine finds the pieces in it
//! ([`ResponseReader`]), writes what the client gets into `out` (the head as hyper's server
//! writes it, the body as it came or re-chunked, see [`serialize`](super::serialize)),
//! tells a [`Watcher`] what passed (the head, each piece of body data), and says what comes
//! next ([`Step`]). It reads no socket and no clock.

use std::io;

use http::header::HeaderName;

use super::response::ResponseRules;
use super::response::{BodyFraming, Piece, ResponseError, ResponseHead, ResponseReader};
use super::serialize;
use crate::exchange::UpstreamFault;
use crate::intermediary::UnsupportedTransferCoding;

/// What hyper's client says when the upstream closes before a response head.
const CLOSED_BEFORE_HEAD: &str = "connection closed before message completed";

/// Told what passes to the client, as it passes.
pub trait Watcher {
    /// The final response head.
    fn head(&mut self, head: &ResponseHead);
    /// A piece of body data (a chunk's data, or what a read brought of another body).
    fn data(&mut self, bytes: &[u8]);
}

/// What a read of the upstream brought.
#[derive(Debug)]
pub enum Upstream {
    /// Bytes (at the end of the input, after what was carried from the last read).
    Sent,
    /// The upstream closed the connection.
    Closed,
    /// The read failed.
    Failed(io::Error),
}

/// What comes after one read.
#[derive(Debug)]
pub enum Step {
    /// Read more; `input[used..]` is the start of something incomplete, to carry over.
    More { used: usize },
    /// The upstream failed before a response head; nothing went to the client.
    NoHead(UpstreamFault),
    /// The response broke off after the head; `out` holds what came before the break.
    Broken(String),
    /// The response is complete; `reuse_upstream`: the connection may carry another request.
    Ended { reuse_upstream: bool },
}

/// The state of one response between reads.
#[derive(Debug)]
pub struct ResponseRelay {
    reader: ResponseReader,
    /// Known once the head has passed.
    framing: Option<BodyFraming>,
    reusable: bool,
    keep_client: bool,
    /// hyper's server sends trailers only to a client that asked for them with
    /// `TE: trailers`, and only those the response declares in `Trailer`.
    client_takes_trailers: bool,
    declared_trailers: Vec<HeaderName>,
}

impl ResponseRelay {
    /// The response to a request (a `HEAD` one when `head_request`) whose client keeps
    /// its connection open after it (`keep_client`) and asked for trailers or not.
    pub fn new(
        head_request: bool,
        rules: ResponseRules,
        keep_client: bool,
        client_takes_trailers: bool,
    ) -> ResponseRelay {
        ResponseRelay {
            reader: ResponseReader::new(head_request, rules),
            framing: None,
            reusable: false,
            keep_client,
            client_takes_trailers,
            declared_trailers: Vec::new(),
        }
    }

    /// Whether the response head has passed.
    pub fn has_head(&self) -> bool {
        self.framing.is_some()
    }

    /// Whether the client connection carries on after this response.
    pub fn keeps_client(&self) -> bool {
        self.keep_client
    }

    /// The reader's state, the memory a read's bytes meet first.
    pub fn reader(&self) -> &ResponseReader {
        &self.reader
    }

    /// Take what a read brought: `input` is what was carried from the last read followed
    /// by the new bytes. `shutting_down`: the server is draining, so the client connection
    /// closes after this response. `pieces` is scratch space.
    pub fn feed(
        &mut self,
        read: Upstream,
        input: &[u8],
        shutting_down: bool,
        pieces: &mut Vec<Piece>,
        out: &mut Vec<u8>,
        watcher: &mut impl Watcher,
    ) -> Step {
        pieces.clear();
        let fed = match read {
            Upstream::Failed(err) => Err(Broken::Io(err)),
            Upstream::Closed => self
                .reader
                .closed(pieces)
                .map(|()| input.len())
                .map_err(Broken::Response),
            Upstream::Sent => self.reader.feed(input, pieces).map_err(Broken::Response),
        };
        // A break mid-body ends the response once what came before it is relayed: hyper's
        // client yields that data (and a head that came with it) before the error, and
        // hyper's server then cuts the client's response.
        let (used, broken) = match fed {
            Ok(used) => (used, None),
            Err(broken) => {
                let head_now = pieces.iter().any(|piece| matches!(piece, Piece::Head(_)));
                if !head_now && !self.has_head() {
                    return Step::NoHead(broken.before_head());
                }
                (input.len(), Some(broken))
            }
        };
        let ended = self.relay_pieces(
            input,
            used,
            broken.is_some(),
            shutting_down,
            pieces,
            out,
            watcher,
        );
        if let Some(broken) = broken {
            return Step::Broken(broken.to_string());
        }
        if ended {
            let leftover = input.len() > used;
            let reuse_upstream =
                self.reusable && !leftover && self.framing != Some(BodyFraming::UntilClose);
            return Step::Ended { reuse_upstream };
        }
        Step::More { used }
    }

    /// Write what the client gets for `pieces` of `input[..used]`; whether the body ended.
    #[allow(clippy::too_many_arguments)]
    fn relay_pieces(
        &mut self,
        input: &[u8],
        used: usize,
        broken: bool,
        shutting_down: bool,
        pieces: &mut Vec<Piece>,
        out: &mut Vec<u8>,
        watcher: &mut impl Watcher,
    ) -> bool {
        let mut relay_from = 0;
        let mut ended = false;
        for piece in pieces.drain(..) {
            match piece {
                Piece::Interim(range) => relay_from = range.end,
                Piece::Head(head) => {
                    relay_from = head.range.end;
                    self.head(&head, shutting_down, out);
                    watcher.head(&head);
                }
                Piece::Data(range) => {
                    watcher.data(&input[range.clone()]);
                    if serialize::rechunked(self.framing) {
                        serialize::chunk(&input[range], out);
                    }
                }
                Piece::End => ended = true,
            }
        }
        let rechunked = serialize::rechunked(self.framing);
        match self.framing {
            None => {}
            Some(_) if rechunked && ended => {
                serialize::last_chunk(self.reader.trailer_section(), &self.declared_trailers, out);
            }
            Some(_) if rechunked || broken => {}
            Some(_) => out.extend_from_slice(&input[relay_from..used]),
        }
        ended
    }

    /// The final head passed: write the client's head and learn the body's framing.
    fn head(&mut self, head: &ResponseHead, shutting_down: bool, out: &mut Vec<u8>) {
        self.keep_client &= !shutting_down;
        let add_chunked = head.framing == BodyFraming::UntilClose;
        serialize::client_head(head, !self.keep_client, add_chunked, out);
        if head.framing == BodyFraming::Chunked && self.client_takes_trailers {
            self.declared_trailers = serialize::declared(&head.headers);
        }
        self.reusable = head.reusable;
        self.framing = Some(head.framing);
    }
}

/// Why an upstream response broke off.
#[derive(Debug, thiserror::Error)]
enum Broken {
    #[error(transparent)]
    Io(io::Error),
    #[error(transparent)]
    Response(ResponseError),
}

impl Broken {
    /// The fault of a response that broke before its head, worded as the hyper path's.
    fn before_head(self) -> UpstreamFault {
        match self {
            Broken::Response(ResponseError::ClosedBeforeHead) => {
                UpstreamFault::Request(CLOSED_BEFORE_HEAD.to_string())
            }
            Broken::Response(ResponseError::UnexpectedSwitch) => UpstreamFault::UnsolicitedSwitch,
            Broken::Response(ResponseError::TransferCoding(coding)) => {
                UpstreamFault::Framing(UnsupportedTransferCoding(coding))
            }
            Broken::Response(err) => UpstreamFault::Request(err.to_string()),
            Broken::Io(err) => UpstreamFault::Request(err.to_string()),
        }
    }
}
