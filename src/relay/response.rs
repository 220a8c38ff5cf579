//! An upstream's HTTP/1.1 response, read as its bytes arrive: its head (parsed with
//! `httparse`, and rebuilt for the client with the hop-by-hop edits), then its body,
//! with the reader saying which of the relayed bytes are body data (for the observer)
//! and where the response ends (so the upstream connection can be reused, and the next
//! response is never taken for part of this one).
//!
//! The framing follows RFC 9112 6.3 as hyper's client reads it: no body after a `HEAD`
//! request or in a `204` or `304`; `Transfer-Encoding: chunked` (which wins over a
//! `Content-Length`); a `Content-Length` (repeated only with one value); else the body
//! runs until the upstream closes. Informational heads (`100`, `103`, ...) are skipped,
//! as hyper's client skips them; a `101` is an error (the fast path forwards no upgrade),
//! as are a transfer coding other than `chunked` (which the hyper path refuses with a
//! `502`), an unreadable head and broken chunked framing. An upstream that closes before
//! the end is told apart from one that closes where a close-delimited body ends.

use std::ops::Range;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::chunked::{ChunkedError, ChunkedReader};
use crate::intermediary;

/// What a response is read with.
#[derive(Debug, Clone, Copy)]
pub struct ResponseRules {
    /// The longest head (and trailer section) accepted.
    pub max_header_bytes: usize,
    /// The most fields in a head.
    pub max_headers: usize,
}

/// Why a response cannot be relayed. What the hyper path does in each case (and so what
/// the relay must do; docs/RELIABILITY.md): before the final head, tokentap answers `502`
/// and records `upstream_error`; after it, the stream breaks and is recorded as
/// `upstream_error` with the tokens that arrived measured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    #[error("invalid response head: {0}")]
    Head(&'static str),
    #[error("response head larger than its limit")]
    HeadTooLarge,
    #[error("101 Switching Protocols to a request that asked for no upgrade")]
    UnexpectedSwitch,
    /// Names the first coding other than `chunked` (or, where all are `chunked` but the
    /// framing is still refused, the codings as sent).
    #[error("unsupported transfer coding {0:?} (only chunked can be forwarded)")]
    TransferCoding(String),
    #[error("invalid Content-Length")]
    ContentLength,
    #[error("chunked body: {0}")]
    Chunked(#[from] ChunkedError),
    #[error("upstream closed the connection before the response head")]
    ClosedBeforeHead,
    #[error("upstream closed the connection before the end of the body")]
    ClosedInBody,
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    ContentLength(u64),
    /// The chunked coding.
    Chunked,
    /// Until the upstream closes the connection.
    UntilClose,
}

/// A final response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Where the head is in the input it arrived in.
    pub range: Range<usize>,
    pub status: StatusCode,
    /// Every field as the upstream sent it (for observation).
    pub headers: HeaderMap,
    pub framing: BodyFraming,
    /// Whether the upstream connection may carry another request after this response.
    pub reusable: bool,
    /// The head to send the client: the upstream's status line (as HTTP/1.1) and fields
    /// in order and case, without hop-by-hop fields; the body's own framing fields stay,
    /// as the body is relayed as it came. A `Transfer-Encoding: chunked` goes last, where
    /// hyper's server writes the framing it adds itself.
    pub client_head: Vec<u8>,
    /// Where in `client_head` hyper's server would put the `connection: close` it adds for
    /// a closing client: after the end-to-end fields, before the framing line it writes.
    pub close_at: usize,
}

/// What one call to [`ResponseReader::feed`] found, in order.
#[derive(Debug)]
pub enum Piece {
    /// An informational head at this range (not relayed: hyper's client skips them).
    Interim(Range<usize>),
    /// The final head.
    Head(Box<ResponseHead>),
    /// Body data at this range of the input.
    Data(Range<usize>),
    /// The response is complete.
    End,
}

#[derive(Debug)]
enum State {
    Head,
    Length { remaining: u64 },
    Chunked(ChunkedReader),
    UntilClose,
    Done,
}

/// Reads one response to one request.
#[derive(Debug)]
pub struct ResponseReader {
    state: State,
    /// The request was `HEAD`: the response has no body whatever its head says.
    head_request: bool,
    rules: ResponseRules,
    /// A chunked body's trailer section, once it has ended.
    trailer_section: Vec<u8>,
}

impl ResponseReader {
    /// A reader for the response to a request; `head_request` if its method was `HEAD`.
    pub fn new(head_request: bool, rules: ResponseRules) -> ResponseReader {
        ResponseReader {
            state: State::Head,
            head_request,
            rules,
            trailer_section: Vec::new(),
        }
    }

    /// A chunked body's trailer section as it came (field lines, each ending in CRLF, and
    /// the empty line), once the response is complete; empty for any other body.
    pub fn trailer_section(&self) -> &[u8] {
        &self.trailer_section
    }

    /// Whether the response is complete.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Read the next bytes from the upstream. Returns how many of `input` were used:
    /// all of them, except when a head is not complete yet (keep the rest and call again
    /// with more after it) or when the response ended (the rest is not part of it).
    /// What was found is pushed onto `out`, also when an error stops the reading (the
    /// data before a broken chunk is still data).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<Piece>) -> Result<usize, ResponseError> {
        let mut at = 0;
        loop {
            match &mut self.state {
                State::Done => break,
                State::Head => match self.head(input, at, out)? {
                    Some(len) => at = at.saturating_add(len),
                    None => break,
                },
                State::Length { remaining } => {
                    let available = input.len().saturating_sub(at);
                    if available == 0 {
                        break;
                    }
                    let take = usize::try_from(*remaining).map_or(available, |r| r.min(available));
                    let end = at.saturating_add(take);
                    out.push(Piece::Data(at..end));
                    at = end;
                    *remaining = remaining.saturating_sub(take as u64);
                    if *remaining == 0 {
                        self.finish(out);
                    }
                }
                State::Chunked(reader) => {
                    let rest = input.get(at..).unwrap_or_default();
                    if rest.is_empty() {
                        break;
                    }
                    let fed = reader.feed(rest, |range| {
                        if !range.is_empty() {
                            let (start, end) = (range.start, range.end);
                            out.push(Piece::Data(
                                at.saturating_add(start)..at.saturating_add(end),
                            ));
                        }
                    });
                    at = at.saturating_add(fed?);
                    if reader.is_done() {
                        self.trailer_section = reader.take_trailer_section();
                        self.finish(out);
                    } else if at >= input.len() {
                        // The read is used up (the usual end of a read mid-body).
                        break;
                    }
                }
                State::UntilClose => {
                    if at < input.len() {
                        out.push(Piece::Data(at..input.len()));
                    }
                    at = input.len();
                    break;
                }
            }
        }
        Ok(at)
    }

    /// The upstream closed the connection: where that leaves the response.
    pub fn closed(&mut self, out: &mut Vec<Piece>) -> Result<(), ResponseError> {
        match self.state {
            State::Done => Ok(()),
            State::UntilClose => {
                self.finish(out);
                Ok(())
            }
            State::Head => Err(ResponseError::ClosedBeforeHead),
            State::Length { .. } | State::Chunked(_) => Err(ResponseError::ClosedInBody),
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        self.state = State::Done;
        out.push(Piece::End);
    }

    /// Parse a head at `input[at..]`: its length, or `None` if it is not complete yet.
    /// Kept out of [`feed`](Self::feed), which runs once per read while this runs once or
    /// twice per response: inlined, its frame and saved registers cost every read.
    #[inline(never)]
    fn head(
        &mut self,
        input: &[u8],
        at: usize,
        out: &mut Vec<Piece>,
    ) -> Result<Option<usize>, ResponseError> {
        let rest = input.get(at..).unwrap_or_default();
        if rest.is_empty() {
            return Ok(None);
        }
        let mut fields = vec![httparse::EMPTY_HEADER; self.rules.max_headers];
        let mut response = httparse::Response::new(&mut fields);
        let len = match response.parse(rest) {
            Ok(httparse::Status::Partial) if rest.len() >= self.rules.max_header_bytes => {
                return Err(ResponseError::HeadTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::HeadTooLarge),
            Err(err) => return Err(ResponseError::Head(parse_error(err))),
            Ok(httparse::Status::Complete(len)) => len,
        };
        if len > self.rules.max_header_bytes {
            return Err(ResponseError::HeadTooLarge);
        }
        let code = response.code.unwrap_or_default();
        let status = StatusCode::from_u16(code).map_err(|_| ResponseError::Head("status"))?;
        let range = at..at.saturating_add(len);
        match code {
            101 => return Err(ResponseError::UnexpectedSwitch),
            100..=199 => {
                out.push(Piece::Interim(range));
                return Ok(Some(len));
            }
            _ => {}
        }
        let head = self.final_head(&response, status, range)?;
        self.state = match head.framing {
            BodyFraming::Empty => State::Done,
            BodyFraming::ContentLength(0) => State::Done,
            BodyFraming::ContentLength(n) => State::Length { remaining: n },
            BodyFraming::Chunked => State::Chunked(ChunkedReader::new(self.rules.max_header_bytes)),
            BodyFraming::UntilClose => State::UntilClose,
        };
        out.push(Piece::Head(Box::new(head)));
        if matches!(self.state, State::Done) {
            out.push(Piece::End);
        }
        Ok(Some(len))
    }

    fn final_head(
        &self,
        response: &httparse::Response<'_, '_>,
        status: StatusCode,
        range: Range<usize>,
    ) -> Result<ResponseHead, ResponseError> {
        let http11 = response.version == Some(1);
        let fields = HeadFields::read(response)?;
        let framing = self.framing(&fields, status, http11)?;
        let reusable = framing != BodyFraming::UntilClose
            && !fields.close
            && (http11 || fields.keep_alive_token);
        // A length beside `chunked` does not describe the body (RFC 9112 6.3: the coding
        // wins, and an intermediary removes the length); a `204` must not carry one (RFC
        // 9110 8.6), and hyper's server drops a `304`'s too.
        let drop_length = framing == BodyFraming::Chunked || matches!(status.as_u16(), 204 | 304);
        let (client_head, close_at) = client_head(response, status, &fields, drop_length);
        Ok(ResponseHead {
            range,
            status,
            headers: fields.headers,
            framing,
            reusable,
            client_head,
            close_at,
        })
    }

    /// How the body of a response with these fields is delimited.
    fn framing(
        &self,
        fields: &HeadFields<'_>,
        status: StatusCode,
        http11: bool,
    ) -> Result<BodyFraming, ResponseError> {
        if self.head_request || matches!(status.as_u16(), 204 | 304) {
            return Ok(BodyFraming::Empty);
        }
        if fields.codings > 0 {
            if !http11 || fields.codings > 1 || !fields.chunked {
                let headers = &fields.headers;
                let coding = intermediary::foreign_coding(headers).unwrap_or_else(|| {
                    let sent = headers.get_all(http::header::TRANSFER_ENCODING).iter();
                    let sent: Vec<_> = sent
                        .map(|v| String::from_utf8_lossy(v.as_bytes()))
                        .collect();
                    sent.join(", ")
                });
                return Err(ResponseError::TransferCoding(coding));
            }
            return Ok(BodyFraming::Chunked);
        }
        match fields.length {
            None => Ok(BodyFraming::UntilClose),
            Some(None) => Err(ResponseError::ContentLength),
            Some(Some(n)) => Ok(BodyFraming::ContentLength(n)),
        }
    }
}

/// What a final head's fields say about its connection and framing.
struct HeadFields<'a> {
    /// Every field, for observation.
    headers: HeaderMap,
    /// `Connection: close`.
    close: bool,
    /// `Connection: keep-alive` (what an HTTP/1.0 response needs to be kept).
    keep_alive_token: bool,
    /// `Transfer-Encoding` fields, and whether the last was `chunked` alone.
    codings: usize,
    chunked: bool,
    /// `None`: no `Content-Length`; `Some(None)`: lengths that disagree or are invalid.
    length: Option<Option<u64>>,
    /// The names `Connection` lists, in lower case.
    named: Vec<Vec<u8>>,
    /// The name of a `TE` field that lists `trailers`, as the upstream spelt it.
    te_trailers: Option<&'a str>,
}

impl<'a> HeadFields<'a> {
    fn read(response: &httparse::Response<'_, 'a>) -> Result<HeadFields<'a>, ResponseError> {
        let mut fields = HeadFields {
            headers: HeaderMap::with_capacity(response.headers.len()),
            close: false,
            keep_alive_token: false,
            codings: 0,
            chunked: false,
            length: None,
            named: Vec::new(),
            te_trailers: None,
        };
        for field in response.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes())
                .map_err(|_| ResponseError::Head("field name"))?;
            let value = HeaderValue::from_bytes(field.value)
                .map_err(|_| ResponseError::Head("field value"))?;
            match name.as_str() {
                "transfer-encoding" => {
                    fields.codings = fields.codings.saturating_add(1);
                    fields.chunked = field.value.eq_ignore_ascii_case(b"chunked");
                }
                "content-length" => {
                    fields.length = Some(same_lengths(fields.length, field.value));
                }
                "connection" => {
                    for token in super::list_elements(field.value) {
                        fields.close |= token.eq_ignore_ascii_case(b"close");
                        fields.keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
                        fields.named.push(token.to_ascii_lowercase());
                    }
                }
                "te" if super::lists(field.value, b"trailers") && fields.te_trailers.is_none() => {
                    fields.te_trailers = Some(field.name);
                }
                _ => {}
            }
            fields.headers.append(name, value);
        }
        Ok(fields)
    }
}

/// The head the client gets and where `connection: close` goes in it: the status line as
/// HTTP/1.1, then the upstream's fields in order and case without the hop-by-hop ones
/// (and without the length when `drop_length`), `TE: trailers` kept, and the
/// `Transfer-Encoding: chunked` last, where hyper's server writes the framing it adds.
fn client_head(
    response: &httparse::Response<'_, '_>,
    status: StatusCode,
    fields: &HeadFields<'_>,
    drop_length: bool,
) -> (Vec<u8>, usize) {
    let mut framing_field = None;
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    let reason = response.reason.unwrap_or_default();
    let reason = if reason.is_empty() {
        status.canonical_reason().unwrap_or_default()
    } else {
        reason
    };
    head.extend_from_slice(reason.as_bytes());
    head.extend_from_slice(b"\r\n");
    for field in response.headers.iter() {
        let lower = field.name.to_ascii_lowercase();
        // `Transfer-Encoding` frames the relayed body: it is placed below.
        if (intermediary::is_hop_by_hop(&lower) && lower != "transfer-encoding")
            || (drop_length && lower == "content-length")
            || fields.named.iter().any(|n| n == lower.as_bytes())
        {
            continue;
        }
        if lower == "transfer-encoding" {
            // The one `chunked` (any other coding was refused): it goes last.
            framing_field = Some(field);
            continue;
        }
        super::push_field(&mut head, field.name.as_bytes(), field.value);
    }
    if let Some(name) = fields.te_trailers {
        super::push_field(&mut head, name.as_bytes(), b"trailers");
    }
    let close_at = head.len();
    if let Some(field) = framing_field {
        super::push_field(&mut head, field.name.as_bytes(), field.value);
    }
    head.extend_from_slice(b"\r\n");
    (head, close_at)
}

/// Fold one more `Content-Length` value (a comma list allowed, as hyper's client allows
/// it) into what was seen: `Some(n)` while every value is the same plain number.
fn same_lengths(seen: Option<Option<u64>>, value: &[u8]) -> Option<u64> {
    let mut length = match seen {
        Some(None) => return None,
        Some(Some(n)) => Some(n),
        None => None,
    };
    for part in super::list_elements(value) {
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u64 = std::str::from_utf8(part).ok()?.parse().ok()?;
        if length.is_some_and(|seen| seen != n) {
            return None;
        }
        length = Some(n);
    }
    length
}

fn parse_error(err: httparse::Error) -> &'static str {
    match err {
        httparse::Error::HeaderName => "field name",
        httparse::Error::HeaderValue => "field value",
        httparse::Error::NewLine => "line end",
        httparse::Error::Status => "status",
        httparse::Error::Token => "token",
        httparse::Error::TooManyHeaders => "too many fields",
        httparse::Error::Version => "version",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::chunked::is_token;
    use super::*;
    use proptest::prelude::*;

    fn is_field_name(name: &[u8]) -> bool {
        !name.is_empty() && name.iter().all(|&b| is_token(b))
    }

    pub(crate) const RULES: ResponseRules = ResponseRules {
        max_header_bytes: 8192,
        max_headers: 100,
    };

    /// A whole response read in pieces cut at `cuts`, then closed if `close`:
    /// (client heads, body data, ended, error).
    pub(crate) fn read_split(
        head_request: bool,
        input: &[u8],
        cuts: &[usize],
        close: bool,
    ) -> (Vec<Vec<u8>>, Vec<u8>, bool, Option<ResponseError>) {
        let mut reader = ResponseReader::new(head_request, RULES);
        let mut heads = Vec::new();
        let mut data = Vec::new();
        let mut ended = false;
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(input.len())).collect();
        bounds.sort_unstable();
        bounds.push(input.len());
        // Bytes received but not yet used (an incomplete head).
        let mut pending: Vec<u8> = Vec::new();
        let mut start = 0;
        let mut pieces = Vec::new();
        for end in bounds {
            if reader.is_done() {
                break;
            }
            pending.extend_from_slice(&input[start..end]);
            start = end;
            pieces.clear();
            match reader.feed(&pending, &mut pieces) {
                Ok(used) => {
                    collect(&pending, &pieces, &mut heads, &mut data, &mut ended);
                    pending.drain(..used);
                }
                Err(err) => {
                    collect(&pending, &pieces, &mut heads, &mut data, &mut ended);
                    return (heads, data, ended, Some(err));
                }
            }
        }
        if close && !reader.is_done() {
            pieces.clear();
            if let Err(err) = reader.closed(&mut pieces) {
                return (heads, data, ended, Some(err));
            }
            collect(&pending, &pieces, &mut heads, &mut data, &mut ended);
        }
        (heads, data, ended, None)
    }

    fn collect(
        input: &[u8],
        pieces: &[Piece],
        heads: &mut Vec<Vec<u8>>,
        data: &mut Vec<u8>,
        ended: &mut bool,
    ) {
        for piece in pieces {
            match piece {
                Piece::Interim(_) => {}
                Piece::Head(head) => heads.push(head.client_head.clone()),
                Piece::Data(range) => data.extend_from_slice(&input[range.clone()]),
                Piece::End => *ended = true,
            }
        }
    }

    fn whole(
        head_request: bool,
        input: &str,
    ) -> (Vec<String>, String, bool, Option<ResponseError>) {
        let (heads, data, ended, err) = read_split(head_request, input.as_bytes(), &[], true);
        (
            heads
                .into_iter()
                .map(|h| String::from_utf8_lossy(&h).into_owned())
                .collect(),
            String::from_utf8_lossy(&data).into_owned(),
            ended,
            err,
        )
    }

    /// A response and how it is framed: whether it answers a HEAD request, the bytes
    /// from upstream, then the heads and data given on, whether it ended, and the error.
    type FramingRow = (
        bool,
        &'static str,
        &'static [&'static str],
        &'static str,
        bool,
        Option<ResponseError>,
    );

    const FRAMING: &[FramingRow] = &[
        (
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Case: Kept\r\n\r\nhello",
            &["HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Case: Kept\r\n\r\n"],
            "hello",
            true,
            None,
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\n",
            &["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"],
            "hello!",
            true,
            None,
        ),
        (
            // The framing field goes last, where hyper's server writes its own.
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-After: 1\r\n\r\n0\r\n\r\n",
            &["HTTP/1.1 200 OK\r\nX-After: 1\r\nTransfer-Encoding: chunked\r\n\r\n"],
            "",
            true,
            None,
        ),
        (
            // The coding wins over a length, which is removed.
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
            &["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"],
            "hi",
            true,
            None,
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: x\n\n",
            &["HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"],
            "data: x\n\n",
            true,
            None,
        ),
        (
            false,
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
            &["HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"],
            "",
            true,
            None,
        ),
        (
            true,
            "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n",
            &["HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"],
            "",
            true,
            None,
        ),
        (
            false,
            // A `204` carries no length (RFC 9110 8.6): it does not reach the client.
            "HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
            &["HTTP/1.1 204 No Content\r\n\r\n"],
            "",
            true,
            None,
        ),
        (
            false,
            "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            &["HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"],
            "",
            true,
            None,
        ),
        (
            // Hop-by-hop fields go (and what `Connection` names); an odd reason stays,
            // an empty one becomes the canonical one, HTTP/1.0 is answered as 1.1.
            false,
            "HTTP/1.0 200 Fine\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: 5\r\nX-Hop: 1\r\nUpgrade: x\r\nContent-Length: 0\r\n\r\n",
            &["HTTP/1.1 200 Fine\r\nContent-Length: 0\r\n\r\n"],
            "",
            true,
            None,
        ),
        (
            false,
            "HTTP/1.1 404 \r\nContent-Length: 1, 1\r\nContent-Length: 1\r\n\r\nx",
            &["HTTP/1.1 404 Not Found\r\nContent-Length: 1, 1\r\nContent-Length: 1\r\n\r\n"],
            "x",
            true,
            None,
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",
            &["HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"],
            "hello",
            false,
            Some(ResponseError::ClosedInBody),
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            &["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"],
            "hel",
            false,
            Some(ResponseError::ClosedInBody),
        ),
        (false, "HTTP/1.1 200 OK\r\nContent-Le", &[], "", false, Some(ResponseError::ClosedBeforeHead)),
        (false, "", &[], "", false, Some(ResponseError::ClosedBeforeHead)),
        (
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nz\r\n",
            &["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"],
            "",
            false,
            Some(ResponseError::Chunked(ChunkedError::InvalidSize)),
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            &[],
            "",
            false,
            Some(ResponseError::ContentLength),
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            &[],
            "",
            false,
            Some(ResponseError::ContentLength),
        ),
        (
            false,
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
            &[],
            "",
            false,
            Some(ResponseError::UnexpectedSwitch),
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nX-Fold: a\r\n b\r\n\r\n",
            &[],
            "",
            false,
            Some(ResponseError::Head("field name")),
        ),
        (
            false,
            "HTTP/1.1 200 OK\r\nX-A : 1\r\n\r\n",
            &[],
            "",
            false,
            Some(ResponseError::Head("field name")),
        ),
    ];

    #[test]
    fn each_response_is_framed_as_the_table_says() {
        for (head_request, input, heads, data, ended, err) in FRAMING {
            let got = whole(*head_request, input);
            let expected = (
                heads.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
                data.to_string(),
                *ended,
                err.clone(),
            );
            assert_eq!(got, expected, "{input:?}");
        }
    }

    /// A transfer coding other than `chunked` is refused, and named (outside [`FRAMING`]:
    /// the error holds a `String`, which a const cannot).
    #[test]
    fn a_coding_other_than_chunked_is_refused_by_name() {
        for input in [
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        ] {
            let refused = ResponseError::TransferCoding("gzip".into());
            let expected = (Vec::new(), String::new(), false, Some(refused));
            assert_eq!(whole(false, input), expected, "{input:?}");
        }
    }

    #[test]
    fn reuse_and_the_next_response_are_decided() {
        let mut reader = ResponseReader::new(false, RULES);
        let mut pieces = Vec::new();
        let input = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\n";
        let used = reader.feed(input, &mut pieces).expect("valid");
        assert_eq!(&input[used..], b"HTTP/1.1 200 OK\r\n");
        let Some(Piece::Head(head)) = pieces.first() else {
            panic!("no head: {pieces:?}");
        };
        assert!(head.reusable);
        assert_eq!(head.headers["content-length"], "2");
        for (input, reusable) in [
            (
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                false,
            ),
            ("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false),
            (
                "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                true,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false),
        ] {
            let mut reader = ResponseReader::new(false, RULES);
            let mut pieces = Vec::new();
            reader.feed(input.as_bytes(), &mut pieces).expect("valid");
            let Some(Piece::Head(head)) = pieces.first() else {
                panic!("no head: {pieces:?}");
            };
            assert_eq!(head.reusable, reusable, "{input:?}");
        }
    }

    #[test]
    fn heads_are_bounded() {
        let mut long = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        long.extend(std::iter::repeat_n(b'x', RULES.max_header_bytes));
        let (_, _, _, err) = read_split(false, &long, &[], false);
        assert_eq!(err, Some(ResponseError::HeadTooLarge));
    }

    /// A response with some framing, and the body data it carries.
    fn response() -> impl Strategy<Value = (bool, Vec<u8>, Vec<u8>, bool)> {
        let body = proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..30), 0..5);
        let name = "[A-Za-z][A-Za-z0-9-]{0,8}".prop_filter("a field name", |n| {
            is_field_name(n.as_bytes())
                && !matches!(
                    n.to_ascii_lowercase().as_str(),
                    "content-length" | "transfer-encoding" | "connection" | "te"
                )
        });
        (
            0u8..3,
            body,
            proptest::collection::vec((name, "[ -~]{0,12}"), 0..4),
            any::<bool>(),
        )
            .prop_map(|(framing, chunks, fields, interim)| {
                let data: Vec<u8> = chunks.concat();
                let mut wire = Vec::new();
                if interim {
                    wire.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
                for (name, value) in fields {
                    wire.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                match framing {
                    0 => {
                        wire.extend_from_slice(
                            format!("Content-Length: {}\r\n\r\n", data.len()).as_bytes(),
                        );
                        wire.extend_from_slice(&data);
                    }
                    1 => {
                        wire.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                        for chunk in &chunks {
                            wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                            wire.extend_from_slice(chunk);
                            wire.extend_from_slice(b"\r\n");
                        }
                        wire.extend_from_slice(b"0\r\n\r\n");
                    }
                    _ => {
                        wire.extend_from_slice(b"\r\n");
                        wire.extend_from_slice(&data);
                    }
                }
                (false, wire, data, framing == 2)
            })
    }

    proptest! {
        /// Any split of a response into reads yields the same head, the same body data
        /// and the same end.
        #[test]
        fn any_split_reads_the_same(
            (head_request, wire, data, until_close) in response(),
            cuts in proptest::collection::vec(0usize..600, 0..10),
        ) {
            let whole = read_split(head_request, &wire, &[], until_close);
            prop_assert_eq!(&whole.1, &data);
            prop_assert!(whole.2);
            prop_assert_eq!(&whole.3, &None);
            let split = read_split(head_request, &wire, &cuts, until_close);
            prop_assert_eq!(split, whole);
        }

        /// Arbitrary bytes never panic, and nothing past a response's end is used.
        #[test]
        fn arbitrary_bytes_never_panic(
            input in proptest::collection::vec(any::<u8>(), 0..300),
            head_request in any::<bool>(),
        ) {
            let mut reader = ResponseReader::new(head_request, RULES);
            let mut pieces = Vec::new();
            if let Ok(used) = reader.feed(&input, &mut pieces) {
                prop_assert!(used <= input.len());
                for piece in &pieces {
                    if let Piece::Data(range) = piece {
                        prop_assert!(range.end <= used);
                    }
                }
            }
        }
    }
}
