//! The checks behind the `fast_path` fuzz target: the HTTP/1.1 fast path's request head
//! reader, its chunked reader and its response reader get untrusted bytes, and each must
//! do more than not panic:
//!
//! - a forwarded request head is unambiguous: its end is the same however the bytes
//!   arrive (every shorter prefix needs more, every longer input is decided the same),
//!   the head sent upstream is exactly one strict HTTP/1.1 head with CRLF line ends and
//!   the same framing, and reading it again decides the same;
//! - a chunked request body reads the same whole and cut into pieces, and never takes a
//!   byte past its end;
//! - a response reads the same whole and cut into pieces (heads, body data, end, error),
//!   and body data never lies past what the reader used;
//! - the relay's response machine, fed the same response whole and cut, tells its watcher
//!   the same head and body data and ends the same way; before a head it writes nothing
//!   for the client, and after an end it is fed nothing more.
//!
//! Input layout: `[selector, split seed, bytes...]`; the selector's low bit picks a small
//! `max_headers` (so the too-many-fields path is fuzzed), its second bit a `HEAD` request
//! for the response reader.

use std::ops::Range;

use tokentap::relay::chunked::{ChunkedError, ChunkedReader};
use tokentap::relay::request_head::{self, Decision, HeadRules, RequestFraming};
use tokentap::relay::response::{
    Piece, ResponseError, ResponseHead, ResponseReader, ResponseRules,
};
use tokentap::relay::response_relay::{ResponseRelay, Step, Upstream, Watcher};

/// Cut points for `len` bytes, from `seed` (sorted, within `0..=len`).
pub fn cuts(len: usize, seed: u8) -> Vec<usize> {
    let mut state = (u32::from(seed) + 1).wrapping_mul(2_654_435_761) | 1;
    let max = 1 + (usize::from(seed) % 23) * 2;
    let mut at = 0;
    let mut out = Vec::new();
    while at < len {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        at = (at + 1 + state as usize % max).min(len);
        out.push(at);
    }
    out
}

pub fn check_fast_path(data: &[u8]) {
    let [selector, seed, input @ ..] = data else {
        return;
    };
    let rules = HeadRules {
        max_header_bytes: 8192,
        max_headers: if selector & 1 == 0 { 100 } else { 3 },
        upstream_host: b"up.example",
        preserve_host: false,
        base_path: "",
    };
    check_request(input, *seed, &rules);
    check_response(input, *seed, selector & 2 != 0);
    check_response_relay(input, *seed, selector & 2 != 0);
}

/// What the relay's machine did with one response: the heads and data its watcher saw,
/// how it ended (`None`: it wants more), and whether it would keep the upstream connection
/// (which depends on the cuts: bytes after the end are seen only in the read that ends it).
#[derive(Debug, Default, PartialEq, Eq)]
struct Relayed {
    heads: Vec<u16>,
    data: Vec<u8>,
    end: Option<String>,
    reuse: bool,
}

impl Watcher for Relayed {
    fn head(&mut self, head: &ResponseHead) {
        self.heads.push(head.status.as_u16());
    }
    fn data(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
    }
}

fn check_response_relay(input: &[u8], seed: u8, head_request: bool) {
    let mut whole = relay_response(input, &[], head_request);
    let split = relay_response(input, &cuts(input.len(), seed), head_request);
    // Stray bytes after the end are seen whole; a cut may hide them from the last read.
    assert!(!whole.reuse || split.reuse, "kept whole, not split");
    whole.reuse = split.reuse;
    assert_eq!(whole, split, "the relay's machine differs whole and split");
}

fn relay_response(input: &[u8], cuts: &[usize], head_request: bool) -> Relayed {
    let rules = ResponseRules {
        max_header_bytes: 1 << 20,
        max_headers: 100,
    };
    let mut relay = ResponseRelay::new(head_request, rules, true, true);
    let mut seen = Relayed::default();
    let (mut pieces, mut out) = (Vec::new(), Vec::new());
    let mut carry: Vec<u8> = Vec::new();
    let mut start = 0;
    let reads = cuts
        .iter()
        .copied()
        .chain([input.len()])
        .map(Some)
        .chain([None]);
    for read in reads {
        let kind = match read {
            Some(end) => {
                carry.extend_from_slice(&input[start..end]);
                start = end;
                Upstream::Sent
            }
            None => Upstream::Closed,
        };
        let fed = std::mem::take(&mut carry);
        let had_head = relay.has_head();
        out.clear();
        let step = relay.feed(kind, &fed, false, &mut pieces, &mut out, &mut seen);
        if !relay.has_head() {
            assert!(out.is_empty(), "client bytes before a head");
        }
        seen.end = match step {
            Step::More { used } => {
                assert!(used <= fed.len());
                carry = fed[used..].to_vec();
                continue;
            }
            Step::NoHead(fault) => {
                assert!(!had_head, "no head after a head");
                Some(format!("no head: {fault}"))
            }
            Step::Broken(why) => Some(format!("broken: {why}")),
            Step::Ended { reuse_upstream } => {
                seen.reuse = reuse_upstream;
                Some("ended".to_string())
            }
        };
        return seen;
    }
    seen
}

fn check_request(input: &[u8], seed: u8, rules: &HeadRules<'_>) {
    let Decision::Forward(head) = request_head::read(input, rules) else {
        return;
    };
    let len = head.head_len;
    assert!(len <= input.len());
    // The end of the head does not depend on how the bytes arrive.
    for cut in cuts(input.len(), seed) {
        match request_head::read(&input[..cut], rules) {
            Decision::NeedMore => assert!(cut < len, "prefix of {cut} bytes needs more"),
            Decision::Forward(again) => {
                assert!(
                    cut >= len,
                    "a {cut}-byte prefix forwarded before the head's end"
                );
                assert_eq!(again.head_len, len);
                assert_eq!(again.upstream_head, head.upstream_head);
            }
            other => panic!("a prefix was decided differently: {other:?}"),
        }
    }
    // Arriving in pieces, the head is decided the same when its end has arrived.
    let mut reader = request_head::HeadReader::new();
    let mut decided = false;
    for cut in cuts(input.len(), seed) {
        match reader.decide(&input[..cut], rules) {
            Decision::NeedMore => assert!(cut < input.len() || cut < len, "never decided"),
            Decision::Forward(again) => {
                assert!(cut >= len, "forwarded before the head's end");
                assert_eq!(again.upstream_head, head.upstream_head);
                decided = true;
                break;
            }
            other => panic!("decided differently in pieces: {other:?}"),
        }
    }
    assert!(
        decided || input.is_empty(),
        "a forwarded head never decided in pieces"
    );
    // What goes upstream is one strict head, with the same framing.
    let upstream = &head.upstream_head;
    let mut fields = vec![httparse::EMPTY_HEADER; rules.max_headers + 1];
    let mut parsed = httparse::Request::new(&mut fields);
    assert_eq!(
        parsed.parse(upstream),
        Ok(httparse::Status::Complete(upstream.len())),
        "upstream head {:?}",
        String::from_utf8_lossy(upstream)
    );
    assert_eq!(parsed.version, Some(1));
    for (at, &byte) in upstream.iter().enumerate() {
        if byte == b'\n' {
            assert_eq!(
                upstream.get(at.wrapping_sub(1)),
                Some(&b'\r'),
                "bare LF upstream"
            );
        }
    }
    // The limit is on what the client sends: the rewrite may grow the head by the
    // upstream's `Host`, the base path and a space after each colon, so a head just
    // under the limit may go upstream just over it, as on the hyper path.
    let growth = rules.upstream_host.len() + rules.base_path.len() + head.headers.len();
    assert!(
        upstream.len() <= len + growth,
        "the rewrite grew the head by more than the Host, base path and colon spaces"
    );
    let again = HeadRules {
        preserve_host: true,
        max_headers: rules.max_headers + 1,
        max_header_bytes: rules.max_header_bytes.max(upstream.len()),
        ..*rules
    };
    match request_head::read(upstream, &again) {
        Decision::Forward(reread) => {
            assert_eq!(reread.framing, head.framing);
            assert_eq!(reread.head_len, upstream.len());
            assert_eq!(
                &reread.upstream_head, upstream,
                "the rewrite is not idempotent"
            );
        }
        other => panic!("the upstream head reads differently: {other:?}"),
    }
    if head.framing == RequestFraming::Chunked {
        let body = &input[len..];
        let whole = chunked(body, &[]);
        let split = chunked(body, &cuts(body.len(), seed));
        assert_eq!(whole, split, "chunked body read whole and split differ");
        if let (consumed, _, true, None) = whole {
            assert!(consumed <= body.len());
        }
    }
}

/// (consumed, data, done, error) of a chunked body fed in pieces (consumed is 0 after an
/// error).
fn chunked(body: &[u8], cuts: &[usize]) -> (usize, Vec<u8>, bool, Option<ChunkedError>) {
    let mut reader = ChunkedReader::new(8192);
    let mut data = Vec::new();
    let mut consumed = 0;
    let mut start = 0;
    for end in cuts.iter().copied().chain([body.len()]) {
        if reader.is_done() {
            break;
        }
        let piece = &body[start..end];
        start = end;
        let mut ranges = Vec::new();
        match reader.feed(piece, |range| ranges.push(range)) {
            Ok(took) => {
                assert!(took <= piece.len());
                push_ranges(&mut data, piece, &ranges, took);
                consumed += took;
            }
            Err(err) => {
                // Where the error stopped the reader is not reported, only the data
                // before it.
                push_ranges(&mut data, piece, &ranges, piece.len());
                return (0, data, false, Some(err));
            }
        }
    }
    (consumed, data, reader.is_done(), None)
}

fn push_ranges(data: &mut Vec<u8>, piece: &[u8], ranges: &[Range<usize>], used: usize) {
    for range in ranges {
        assert!(range.end <= used, "data past what was used");
        data.extend_from_slice(&piece[range.clone()]);
    }
}

/// What reading a response gave: client heads, body data, ended, error.
type Read = (Vec<Vec<u8>>, Vec<u8>, bool, Option<ResponseError>);

fn check_response(input: &[u8], seed: u8, head_request: bool) {
    let whole = response(input, &[], head_request);
    let split = response(input, &cuts(input.len(), seed), head_request);
    assert_eq!(whole, split, "response read whole and split differ");
}

fn response(input: &[u8], cuts: &[usize], head_request: bool) -> Read {
    // Limits above any fuzz input: a head cut short by a limit would end differently
    // depending on where the cuts fall.
    let rules = ResponseRules {
        max_header_bytes: 1 << 20,
        max_headers: 100,
    };
    let mut reader = ResponseReader::new(head_request, rules);
    let mut read: Read = (Vec::new(), Vec::new(), false, None);
    let mut pending = Vec::new();
    let mut start = 0;
    let mut pieces = Vec::new();
    for end in cuts.iter().copied().chain([input.len()]) {
        if reader.is_done() {
            break;
        }
        pending.extend_from_slice(&input[start..end]);
        start = end;
        pieces.clear();
        let fed = reader.feed(&pending, &mut pieces);
        let used = *fed.as_ref().unwrap_or(&pending.len());
        assert!(used <= pending.len());
        collect(&mut read, &pending, &pieces, used);
        match fed {
            Ok(used) => {
                pending.drain(..used);
            }
            Err(err) => {
                read.3 = Some(err);
                return read;
            }
        }
    }
    if !reader.is_done() {
        pieces.clear();
        match reader.closed(&mut pieces) {
            Ok(()) => collect(&mut read, &pending, &pieces, pending.len()),
            Err(err) => read.3 = Some(err),
        }
    }
    read
}

fn collect(read: &mut Read, input: &[u8], pieces: &[Piece], used: usize) {
    for piece in pieces {
        match piece {
            Piece::Interim(range) => assert!(range.end <= used),
            Piece::Head(head) => {
                assert!(head.range.end <= used);
                read.0.push(head.client_head.clone());
            }
            Piece::Data(range) => {
                assert!(range.end <= used, "data past what was used");
                read.1.extend_from_slice(&input[range.clone()]);
            }
            Piece::End => read.2 = true,
        }
    }
}
