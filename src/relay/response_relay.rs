//! The response side of one relayed exchange, sans-IO: what each upstream read means.
//!
//! The relay's I/O loop ([`connection`](super::connection)) reads the upstream and hands
//! each read to [`ResponseRelay::feed`]. The machine finds the pieces in it
//! ([`ResponseReader`]), writes what the client gets into `out` (the head as hyper's server
//! writes it, the body as it came or re-chunked, see [`serialize`]),
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
    /// A chunked body's trailer section, as the upstream sent it, when the body ended
    /// with one (whether the client takes it or not): a gRPC call's status is there.
    fn trailers(&mut self, _section: &[u8]) {}
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
        // By reference, and cleared after: a drain's bookkeeping costs more than the loop.
        for piece in pieces.iter() {
            match piece {
                Piece::Interim(range) => relay_from = range.end,
                Piece::Head(head) => {
                    relay_from = head.range.end;
                    self.head(head, shutting_down, out);
                    watcher.head(head);
                }
                Piece::Data(range) => {
                    // The reader's ranges are of this input (the same bounds check as
                    // indexing, without the panic).
                    let data = input.get(range.clone()).unwrap_or_default();
                    watcher.data(data);
                    if serialize::rechunked(self.framing) {
                        serialize::chunk(data, out);
                    }
                }
                Piece::End => ended = true,
            }
        }
        pieces.clear();
        if ended && self.framing == Some(BodyFraming::Chunked) {
            let section = self.reader.trailer_section();
            // Field lines have a colon; the empty line that ends the body has none.
            if section.contains(&b':') {
                watcher.trailers(section);
            }
        }
        let rechunked = serialize::rechunked(self.framing);
        match self.framing {
            None => {}
            Some(_) if rechunked && ended => {
                serialize::last_chunk(self.reader.trailer_section(), &self.declared_trailers, out);
            }
            Some(_) if rechunked || broken => {}
            Some(_) => out.extend_from_slice(input.get(relay_from..used).unwrap_or_default()),
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

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: ResponseRules = ResponseRules {
        max_header_bytes: 16 << 10,
        max_headers: 100,
    };

    /// What the watcher was told, in order.
    #[derive(Default)]
    struct Seen(Vec<String>);

    impl Watcher for Seen {
        fn head(&mut self, head: &ResponseHead) {
            self.0.push(format!("head {}", head.status.as_u16()));
        }
        fn data(&mut self, bytes: &[u8]) {
            self.0
                .push(format!("data {}", String::from_utf8_lossy(bytes)));
        }
        fn trailers(&mut self, section: &[u8]) {
            self.0
                .push(format!("trailers {}", String::from_utf8_lossy(section)));
        }
    }

    /// One response's reads (`None`: the upstream closed) through a fresh machine, each
    /// read after what the last one left: the client's bytes, the watcher's calls, the
    /// last step.
    struct Case {
        name: &'static str,
        head_request: bool,
        keep_client: bool,
        takes_trailers: bool,
        shutting_down: bool,
        reads: &'static [Option<&'static str>],
        client: &'static str,
        seen: &'static [&'static str],
        step: &'static str,
    }

    const fn case(
        name: &'static str,
        reads: &'static [Option<&'static str>],
        client: &'static str,
        seen: &'static [&'static str],
        step: &'static str,
    ) -> Case {
        Case {
            name,
            head_request: false,
            keep_client: true,
            takes_trailers: false,
            shutting_down: false,
            reads,
            client,
            seen,
            step,
        }
    }

    fn run(case: &Case) -> (String, Vec<String>, String) {
        let mut relay = ResponseRelay::new(
            case.head_request,
            RULES,
            case.keep_client,
            case.takes_trailers,
        );
        let (mut pieces, mut out, mut seen) = (Vec::new(), Vec::new(), Seen::default());
        let mut carry: Vec<u8> = Vec::new();
        let mut last = String::new();
        for read in case.reads {
            let kind = match read {
                Some(bytes) => {
                    carry.extend_from_slice(bytes.as_bytes());
                    Upstream::Sent
                }
                None => Upstream::Closed,
            };
            let input = std::mem::take(&mut carry);
            let step = relay.feed(
                kind,
                &input,
                case.shutting_down,
                &mut pieces,
                &mut out,
                &mut seen,
            );
            last = match step {
                Step::More { used } => {
                    carry = input[used..].to_vec();
                    format!("more, carry {}", carry.len())
                }
                Step::NoHead(fault) => format!("no head: {fault}"),
                Step::Broken(why) => format!("broken: {why}"),
                Step::Ended { reuse_upstream } => format!("ended, reuse {reuse_upstream}"),
            };
        }
        (String::from_utf8_lossy(&out).into_owned(), seen.0, last)
    }

    /// Responses read by the relay, each with what the client, the observer and the
    /// next step must get.
    const RESPONSES: &[Case] = &[
        case(
            "a Content-Length body, relayed as it came",
            &[Some(
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello",
            )],
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello",
            &["head 200", "data hello"],
            "ended, reuse true",
        ),
        case(
            "a head split across reads is carried",
            &[
                Some("HTTP/1.1 200 OK\r\nContent-Le"),
                Some("ngth: 2\r\n\r\nhi"),
            ],
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
            &["head 200", "data hi"],
            "ended, reuse true",
        ),
        case(
            "a chunked body is re-chunked, one chunk per piece of data",
            &[
                Some("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nd"),
                Some("e\r\n0\r\n\r\n"),
            ],
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
             3\r\nabc\r\n1\r\nd\r\n1\r\ne\r\n0\r\n\r\n",
            &["head 200", "data abc", "data d", "data e"],
            "ended, reuse true",
        ),
        case(
            "a body delimited by the upstream's close is chunked for the client",
            &[Some("HTTP/1.1 200 OK\r\n\r\nsome"), None],
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nsome\r\n0\r\n\r\n",
            &["head 200", "data some"],
            "ended, reuse false",
        ),
        case(
            "bytes after a whole response: the connection is not reused",
            &[Some("HTTP/1.1 204 No Content\r\n\r\nstray")],
            "HTTP/1.1 204 No Content\r\n\r\n",
            &["head 204"],
            "ended, reuse false",
        ),
        case(
            "an interim 100 is not relayed",
            &[Some(
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            )],
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            &["head 200"],
            "ended, reuse true",
        ),
        case(
            "closed before a head",
            &[Some("HTTP/1.1 200"), None],
            "",
            &[],
            "no head: upstream request failed: connection closed before message completed",
        ),
        case(
            "an unsolicited 101",
            &[Some(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
            )],
            "",
            &[],
            "no head: upstream answered 101 Switching Protocols to a request that asked \
             for no upgrade",
        ),
        case(
            "a transfer coding other than chunked, named",
            &[Some(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            )],
            "",
            &[],
            "no head: upstream response: unsupported transfer coding \"gzip\" \
             (only chunked can be forwarded)",
        ),
        case(
            "a break mid-body relays what came before it",
            &[Some(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nzz\r\n",
            )],
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n",
            &["head 200", "data a"],
            "broken: chunked body: invalid chunk size",
        ),
        case(
            "the upstream closes mid-body",
            &[
                Some("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"),
                None,
            ],
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc",
            &["head 200", "data abc"],
            "broken: upstream closed the connection before the end of the body",
        ),
        case(
            "a body still coming",
            &[Some("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc")],
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc",
            &["head 200", "data abc"],
            "more, carry 0",
        ),
        Case {
            keep_client: false,
            ..case(
                "a closing client's head says so, after the fields the upstream sent",
                &[Some(
                    "HTTP/1.1 200 OK\r\nX-A: b\r\nContent-Length: 0\r\n\r\n",
                )],
                "HTTP/1.1 200 OK\r\nX-A: b\r\nContent-Length: 0\r\nconnection: close\r\n\r\n",
                &["head 200"],
                "ended, reuse true",
            )
        },
        Case {
            shutting_down: true,
            ..case(
                "a head that passes while the server drains closes the client",
                &[Some("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")],
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nconnection: close\r\n\r\n",
                &["head 200"],
                "ended, reuse true",
            )
        },
        Case {
            head_request: true,
            ..case(
                "the response to HEAD has no body whatever its length says",
                &[Some("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n")],
                "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n",
                &["head 200"],
                "ended, reuse true",
            )
        },
        Case {
            takes_trailers: true,
            ..case(
                "declared trailers reach a client that asked for them",
                &[Some(
                    "HTTP/1.1 200 OK\r\nTrailer: x-t\r\nTransfer-Encoding: chunked\r\n\r\n\
                     1\r\na\r\n0\r\nx-t: 1\r\nx-u: 2\r\n\r\n",
                )],
                "HTTP/1.1 200 OK\r\nTrailer: x-t\r\nTransfer-Encoding: chunked\r\n\r\n\
                 1\r\na\r\n0\r\nx-t: 1\r\n\r\n",
                &["head 200", "data a", "trailers x-t: 1\r\nx-u: 2\r\n\r\n"],
                "ended, reuse true",
            )
        },
        case(
            "trailers are dropped for a client that did not ask",
            &[Some(
                "HTTP/1.1 200 OK\r\nTrailer: x-t\r\nTransfer-Encoding: chunked\r\n\r\n\
                 1\r\na\r\n0\r\nx-t: 1\r\n\r\n",
            )],
            "HTTP/1.1 200 OK\r\nTrailer: x-t\r\nTransfer-Encoding: chunked\r\n\r\n\
             1\r\na\r\n0\r\n\r\n",
            // The observer reads them all the same (a gRPC call's status is there).
            &["head 200", "data a", "trailers x-t: 1\r\n\r\n"],
            "ended, reuse true",
        ),
    ];

    #[test]
    fn each_read_gives_the_client_bytes_the_observer_calls_and_the_next_step() {
        let mut failures = Vec::new();
        for case in RESPONSES {
            let (client, seen, step) = run(case);
            if client != case.client || seen != case.seen || step != case.step {
                failures.push(format!(
                    "{}:\n  client {client:?}\n  seen {seen:?}\n  step {step:?}",
                    case.name
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
