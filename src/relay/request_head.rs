//! A client's HTTP/1.1 request head, read with `httparse`, and the fast path's decision
//! about it: forward it (with the hop-by-hop edits the hyper path makes and its body
//! framing known for certain), reject it the way hyper's server does, or hand it, with
//! every byte read so far, to hyper.
//!
//! The rule is that the fast path forwards only what it fully understands. Everything
//! that hyper treats specially or that two parsers could read two ways is handed off, so
//! hyper's path answers it: HTTP/1.0, `CONNECT`, upgrades and the h2c preface, `Expect`, a
//! `Transfer-Encoding` other than one `chunked`, `Content-Length` beside
//! `Transfer-Encoding`, more than one `Content-Length`, a missing, repeated or invalid
//! `Host`, a target that is not origin-form, bare LF line ends, control bytes, and heads
//! longer than the limit. What `httparse` itself refuses (obs-fold, whitespace before a
//! colon, invalid bytes) is rejected with the status and bytes hyper sends for it, at the
//! moment hyper would notice ([`HeadReader`]): in the first read (at most 24 bytes: what
//! hyper-util's protocol sniff hands hyper first), or once the head's end has arrived
//! (hyper parses a partial head again only then).
//!
//! The head sent upstream is rebuilt from the parsed one, `name: value` per field in the
//! client's order and case: nothing a lenient parser might read differently (extra
//! whitespace, line ends) reaches the upstream.

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};

use crate::intermediary;

/// The HTTP/2 connection preface starts like this: such a connection is h2c.
const H2_PREFACE_START: &[u8] = b"PRI ";
/// The most hyper-util's protocol sniff reads (the h2 preface's length) before hyper
/// parses those bytes on their own.
const SNIFF_LEN: usize = 24;
/// hyper's longest request target; longer ones get its `414`.
const MAX_TARGET_LEN: usize = u16::MAX as usize - 1;

/// What a request head is checked against and rewritten with.
#[derive(Debug, Clone, Copy)]
pub struct HeadRules<'a> {
    /// `limits.max_header_bytes`: a longer head is handed off.
    pub max_header_bytes: usize,
    /// `limits.max_headers`: more fields are rejected as hyper does (431).
    pub max_headers: usize,
    /// The `Host` that replaces the client's unless `preserve_host`.
    pub upstream_host: &'a [u8],
    /// `upstream.host_header: preserve`.
    pub preserve_host: bool,
    /// `upstream.url`'s path, put in front of the client's target.
    pub base_path: &'a str,
}

/// What to do with the bytes read so far from a client connection.
#[derive(Debug)]
pub enum Decision {
    /// The head is not complete yet: read more.
    NeedMore,
    /// Forward this request.
    Forward(Box<ForwardHead>),
    /// Answer with this status and close, as hyper's server does for this head.
    Reject(StatusCode),
    /// Give the connection, with the bytes read so far, to hyper.
    HandOff(HandOff),
}

/// Why a request goes to hyper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOff {
    /// The h2c connection preface.
    H2Preface,
    /// The method `PRI`, which only the h2 preface uses (RFC 9113 3.4). httparse skips
    /// empty lines before a request line, so such a head need not start with `PRI `, but
    /// the head sent upstream would, and the upstream may take it for a preface.
    PriMethod,
    /// The head (or what has arrived of it) is longer than `limits.max_header_bytes`.
    HeadTooLarge,
    /// HTTP/1.0: other keep-alive and framing rules.
    NotHttp11,
    /// `CONNECT`.
    Connect,
    /// `Upgrade`, or `Connection: upgrade`.
    Upgrade,
    /// `Expect`.
    Expect,
    /// A `Transfer-Encoding` other than exactly one `chunked`.
    TransferCoding,
    /// Both `Content-Length` and `Transfer-Encoding`.
    LengthAndCoding,
    /// More than one `Content-Length`, or one that is not a plain number.
    ContentLength,
    /// No `Host`, more than one, or one that is not a host and port.
    Host,
    /// A target other than origin-form (`/path`), or one too long or unparsable.
    Target,
    /// A line ending in a bare LF.
    BareLf,
    /// A control byte in the head.
    ControlByte,
    /// A method, field name or value the `http` types do not take.
    Unparsable,
    /// `Connection` names a field that frames or routes the request.
    ConnectionNamesFraming,
}

/// How the request body that follows the head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    ContentLength(u64),
    /// The chunked coding (read with [`ChunkedReader`](super::chunked::ChunkedReader)).
    Chunked,
}

/// A request head the fast path forwards.
#[derive(Debug)]
pub struct ForwardHead {
    /// Bytes of the client's input the head took; the body (or the next request) follows.
    pub head_len: usize,
    pub method: Method,
    /// The target as the client sent it (for routes and the access log).
    pub uri: Uri,
    /// Every field as the client sent it (for observation).
    pub headers: HeaderMap,
    pub framing: RequestFraming,
    /// `false` when the client said `Connection: close`.
    pub keep_alive: bool,
    /// The head to send upstream.
    pub upstream_head: Vec<u8>,
}

/// Reads one connection's request head as it arrives, parsing when hyper's server would:
/// the bytes of the first read (at most 24, what hyper-util's protocol sniff reads) on
/// their own, then again only once a head end (`\r\n\r\n`, `\n\n`, `\n\r\n`) has
/// arrived, as hyper's quick scan decides. So an invalid byte past the first read is
/// answered when the head ends, as hyper answers it, and a head sent a byte at a time
/// costs a scan of each new byte, not a parse of the whole head each time.
#[derive(Debug, Default)]
pub struct HeadReader {
    /// How much of the input had been looked at by the last call (`None` before the first).
    checked: Option<usize>,
    /// The first call parses all of its input, not just what a protocol sniff reads.
    whole_first: bool,
}

impl HeadReader {
    /// The reader of a connection's first head.
    pub fn new() -> HeadReader {
        HeadReader::default()
    }

    /// The reader of a later head on a kept-alive connection: hyper's server parses
    /// whatever it has buffered of it (there is no protocol sniff any more), then again
    /// once a head end arrives.
    pub fn next_on_connection() -> HeadReader {
        HeadReader {
            checked: None,
            whole_first: true,
        }
    }

    /// Decide on `input`, every byte read from the connection so far (the previous call's
    /// input and what the last read added).
    pub fn decide(&mut self, input: &[u8], rules: &HeadRules<'_>) -> Decision {
        let checked = match self.checked {
            Some(checked) => checked,
            None => {
                let first = if self.whole_first {
                    input
                } else {
                    input.get(..SNIFF_LEN).unwrap_or(input)
                };
                match read(first, rules) {
                    Decision::NeedMore => first.len(),
                    decided => return decided,
                }
            }
        };
        self.checked = Some(input.len());
        if input.len() <= checked {
            return Decision::NeedMore;
        }
        if has_head_end(input.get(checked.saturating_sub(3)..).unwrap_or_default()) {
            return read(input, rules);
        }
        if input.len() >= rules.max_header_bytes {
            // hyper's server would have stopped reading at its buffer limit.
            return Decision::HandOff(HandOff::HeadTooLarge);
        }
        Decision::NeedMore
    }
}

/// Read the request head at the start of `input`, all of it at once (see [`HeadReader`]
/// for a head that arrives in pieces).
pub fn read(input: &[u8], rules: &HeadRules<'_>) -> Decision {
    if input.starts_with(H2_PREFACE_START) {
        return Decision::HandOff(HandOff::H2Preface);
    }
    let mut fields = vec![httparse::EMPTY_HEADER; rules.max_headers];
    let mut request = httparse::Request::new(&mut fields);
    let head_len = match request.parse(input) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) | Err(_) if input.len() >= rules.max_header_bytes => {
            // hyper's server would have stopped reading at its buffer limit.
            return Decision::HandOff(HandOff::HeadTooLarge);
        }
        Ok(httparse::Status::Partial) => return Decision::NeedMore,
        Err(httparse::Error::TooManyHeaders) => {
            return Decision::Reject(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        }
        Err(_) => return Decision::Reject(StatusCode::BAD_REQUEST),
    };
    if head_len > rules.max_header_bytes {
        return Decision::HandOff(HandOff::HeadTooLarge);
    }
    // httparse's length is of `input`'s own head.
    let head = input.get(..head_len).unwrap_or(input);
    match forward(&request, head, rules) {
        Ok(mut head) => {
            head.head_len = head_len;
            Decision::Forward(head)
        }
        Err(reason) => Decision::HandOff(reason),
    }
}

/// The answer to a rejected head, byte for byte what hyper's server sends (it then
/// closes the connection).
pub fn rejection(status: StatusCode) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or_default()
    )
    .into_bytes()
}

/// The checks and rewrite of a complete, parsed head.
fn forward(
    request: &httparse::Request<'_, '_>,
    head: &[u8],
    rules: &HeadRules<'_>,
) -> Result<Box<ForwardHead>, HandOff> {
    if request.version != Some(1) {
        return Err(HandOff::NotHttp11);
    }
    check_line_ends(head)?;
    let method = request.method.unwrap_or_default();
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| HandOff::Unparsable)?;
    if method == Method::CONNECT {
        return Err(HandOff::Connect);
    }
    if method.as_str() == "PRI" {
        return Err(HandOff::PriMethod);
    }
    let target = request.path.unwrap_or_default();
    // A fragment is not part of a request target (RFC 9112 3.2); hyper drops it too.
    let target = target.split_once('#').map_or(target, |(before, _)| before);
    if !target.starts_with('/') || target.len() > MAX_TARGET_LEN {
        return Err(HandOff::Target);
    }
    let uri = Uri::try_from(target).map_err(|_| HandOff::Target)?;
    let fields = RequestFields::read(request)?;
    let framing = fields.framing()?;
    if fields.hosts != 1 {
        return Err(HandOff::Host);
    }
    if fields.named.iter().any(|name| {
        matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "host"
        )
    }) {
        return Err(HandOff::ConnectionNamesFraming);
    }
    let upstream_head = upstream_head(request, &method, target, &fields, head.len(), rules);
    Ok(Box::new(ForwardHead {
        head_len: 0,
        method,
        uri,
        headers: fields.headers,
        framing,
        keep_alive: fields.keep_alive,
        upstream_head,
    }))
}

/// What a request head's fields say about its framing, `Host` and connection.
struct RequestFields<'a> {
    /// Every field, for observation.
    headers: HeaderMap,
    content_length: Option<u64>,
    lengths: usize,
    /// `Transfer-Encoding` fields, and whether the last was `chunked` alone.
    codings: usize,
    chunked: bool,
    hosts: usize,
    /// No `Connection: close`.
    keep_alive: bool,
    /// The name of a `TE` field that lists `trailers`, as the client spelt it.
    te_trailers: Option<&'a str>,
    /// The names `Connection` lists.
    named: Vec<HeaderName>,
}

impl<'a> RequestFields<'a> {
    /// Read the fields; what the relay leaves to hyper (upgrades, `Expect`, an invalid
    /// `Host`, unparsable names or values) hands the request off at once.
    fn read(request: &httparse::Request<'_, 'a>) -> Result<RequestFields<'a>, HandOff> {
        let mut fields = RequestFields {
            headers: HeaderMap::with_capacity(request.headers.len()),
            content_length: None,
            lengths: 0,
            codings: 0,
            chunked: false,
            hosts: 0,
            keep_alive: true,
            te_trailers: None,
            named: Vec::new(),
        };
        for field in request.headers.iter() {
            let name =
                HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| HandOff::Unparsable)?;
            let value = HeaderValue::from_bytes(field.value).map_err(|_| HandOff::Unparsable)?;
            match name.as_str() {
                "transfer-encoding" => {
                    fields.codings = fields.codings.saturating_add(1);
                    fields.chunked = field.value.eq_ignore_ascii_case(b"chunked");
                }
                "content-length" => {
                    fields.lengths = fields.lengths.saturating_add(1);
                    fields.content_length = plain_number(field.value);
                }
                "connection" => fields.connection(field.value)?,
                "upgrade" => return Err(HandOff::Upgrade),
                "expect" => return Err(HandOff::Expect),
                "host" => {
                    fields.hosts = fields.hosts.saturating_add(1);
                    // hyper's path answers an invalid one (400).
                    if !intermediary::valid_host(field.value) {
                        return Err(HandOff::Host);
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

    /// A `Connection` field's tokens.
    fn connection(&mut self, value: &[u8]) -> Result<(), HandOff> {
        for token in super::list_elements(value) {
            if token.eq_ignore_ascii_case(b"close") {
                self.keep_alive = false;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                return Err(HandOff::Upgrade);
            }
            if let Ok(listed) = HeaderName::from_bytes(token) {
                self.named.push(listed);
            }
        }
        Ok(())
    }

    /// The body's framing, when the relay reads it for certain.
    fn framing(&self) -> Result<RequestFraming, HandOff> {
        Ok(match (self.lengths, self.codings) {
            (0, 0) => RequestFraming::Empty,
            (_, 1..) if self.lengths > 0 => return Err(HandOff::LengthAndCoding),
            (1, 0) => {
                RequestFraming::ContentLength(self.content_length.ok_or(HandOff::ContentLength)?)
            }
            (_, 0) => return Err(HandOff::ContentLength),
            (_, 1) if self.chunked => RequestFraming::Chunked,
            (_, _) => return Err(HandOff::TransferCoding),
        })
    }
}

/// The head that goes upstream: the base path before the target, the client's fields in
/// order and case without the hop-by-hop ones, `Host` the upstream's unless preserved,
/// `TE: trailers` kept.
fn upstream_head(
    request: &httparse::Request<'_, '_>,
    method: &Method,
    target: &str,
    fields: &RequestFields<'_>,
    head_len: usize,
    rules: &HeadRules<'_>,
) -> Vec<u8> {
    let mut upstream_head = Vec::with_capacity(
        head_len
            .saturating_add(rules.base_path.len())
            .saturating_add(32),
    );
    upstream_head.extend_from_slice(method.as_str().as_bytes());
    upstream_head.push(b' ');
    upstream_head.extend_from_slice(rules.base_path.as_bytes());
    upstream_head.extend_from_slice(target.as_bytes());
    upstream_head.extend_from_slice(b" HTTP/1.1\r\n");
    for field in request.headers.iter() {
        let lower = field.name.to_ascii_lowercase();
        // A chunked body goes up re-chunked by the relay, under the client's field.
        let relay_frames_it = lower == "transfer-encoding";
        if (intermediary::is_hop_by_hop(&lower) && !relay_frames_it)
            || fields.named.iter().any(|name| name.as_str() == lower)
        {
            continue;
        }
        let value = if lower == "host" && !rules.preserve_host {
            rules.upstream_host
        } else {
            field.value
        };
        super::push_field(&mut upstream_head, field.name.as_bytes(), value);
    }
    if let Some(name) = fields.te_trailers {
        super::push_field(&mut upstream_head, name.as_bytes(), b"trailers");
    }
    upstream_head.extend_from_slice(b"\r\n");
    upstream_head
}

/// Whether `input` holds what hyper's quick scan takes for the end of a head (CRLFCRLF,
/// LFLF or LFCRLF), after which it parses the head again.
fn has_head_end(input: &[u8]) -> bool {
    input.windows(2).any(|w| w == b"\n\n") || input.windows(3).any(|w| w == b"\n\r\n")
}

/// Every line ends in CRLF, and nothing else in the head is a control byte.
fn check_line_ends(head: &[u8]) -> Result<(), HandOff> {
    let mut previous = None;
    for (at, &byte) in head.iter().enumerate() {
        match byte {
            b'\n' if previous != Some(b'\r') => return Err(HandOff::BareLf),
            b'\r' if head.get(at.saturating_add(1)) != Some(&b'\n') => return Err(HandOff::BareLf),
            b'\r' | b'\n' | b'\t' => {}
            0..=0x1f | 0x7f => return Err(HandOff::ControlByte),
            _ => {}
        }
        previous = Some(byte);
    }
    Ok(())
}

/// A `Content-Length` value: ASCII digits only, fitting in 64 bits.
fn plain_number(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const RULES: HeadRules<'static> = HeadRules {
        max_header_bytes: 8192,
        max_headers: 100,
        upstream_host: b"up.example:8000",
        preserve_host: false,
        base_path: "",
    };

    /// What the table expects of one head.
    pub(crate) enum Expect {
        /// Forwarded with this framing, these bytes upstream and this keep-alive.
        Forward(RequestFraming, &'static str, bool),
        Reject(u16),
        ToHyper(HandOff),
        NeedMore,
    }

    /// Each hostile (and each ordinary) head, and what the fast path does with it.
    const HEADS: &[(&str, Expect)] = {
        use Expect::*;
        use RequestFraming::*;
        &[
            (
                "GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n",
                Forward(Empty, "GET /v1/models HTTP/1.1\r\nHost: up.example:8000\r\n\r\n", true),
            ),
            (
                "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHOST: a\r\nContent-Length: 12\r\nX-Case: Kept\r\n\r\n",
                Forward(
                    ContentLength(12),
                    "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHOST: up.example:8000\r\nContent-Length: 12\r\nX-Case: Kept\r\n\r\n",
                    true,
                ),
            ),
            (
                "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                Forward(
                    Chunked,
                    "POST /x HTTP/1.1\r\nHost: up.example:8000\r\nTransfer-Encoding: chunked\r\n\r\n",
                    true,
                ),
            ),
            (
                "POST /x HTTP/1.1\r\nHost: a\r\ntransfer-encoding: CHUNKED\r\n\r\n",
                Forward(
                    Chunked,
                    "POST /x HTTP/1.1\r\nHost: up.example:8000\r\ntransfer-encoding: CHUNKED\r\n\r\n",
                    true,
                ),
            ),
            (
                // Hop-by-hop fields go, and those `Connection` names; `TE: trailers` stays.
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: close, X-Hop\r\nKeep-Alive: 5\r\nX-Hop: 1\r\nProxy-Authorization: s\r\nProxy-Connection: k\r\nTE: trailers, gzip\r\nX-End:  padded \t\r\n\r\n",
                Forward(
                    Empty,
                    "GET / HTTP/1.1\r\nHost: up.example:8000\r\nX-End: padded\r\nTE: trailers\r\n\r\n",
                    false,
                ),
            ),
            (
                "GET / HTTP/1.1\r\nHost:a\r\nX-Empty:\r\nX-Obs: caf\u{e9}\r\n\r\n",
                Forward(
                    Empty,
                    "GET / HTTP/1.1\r\nHost: up.example:8000\r\nX-Empty: \r\nX-Obs: caf\u{e9}\r\n\r\n",
                    true,
                ),
            ),
            (
                "\r\nGET / HTTP/1.1\r\nHost: a\r\nTE: gzip\r\n\r\n",
                Forward(Empty, "GET / HTTP/1.1\r\nHost: up.example:8000\r\n\r\n", true),
            ),
            ("GET / HTTP/1.1\r\nHost: a\r\n", NeedMore),
            ("GET / HTTP/1.1\r\nHost: a\r\n\r", NeedMore),
            ("GE", NeedMore),
            ("", NeedMore),
            // What httparse refuses, answered with hyper's status.
            ("GET / HTTP/1.1\r\nHost: a\r\nX-Fold: a\r\n b\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.1\r\nHost : a\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.1\r\nHost: a\r\nX\tY: 1\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.1\r\n: empty\r\n\r\n", Reject(400)),
            ("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", Reject(400)),
            ("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", Reject(400)),
            ("GET / HTTP/1.2\r\nHost: a\r\n\r\n", Reject(400)),
            ("GET / HTTP/2.0\r\nHost: a\r\n\r\n", Reject(400)),
            ("G(T / HTTP/1.1\r\nHost: a\r\n\r\n", Reject(400)),
            ("GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", Reject(400)),
            // hyper sees an error in its first 24 bytes at once, a later one only when
            // the head has ended.
            ("G(T / HTTP/1.1\r\n", Reject(400)),
            ("GET /v1/chat HTTP/1.1\r\nX-D: a\x01b\r\n", NeedMore),
            ("GET /v1/chat HTTP/1.1\r\nX-D: a\x01b\r\n\n", Reject(400)),
            // Anything else unusual goes to hyper.
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", ToHyper(HandOff::H2Preface)),
            ("\r\nPRI / HTTP/1.1\r\nHost: a\r\n\r\n", ToHyper(HandOff::PriMethod)),
            ("GET / HTTP/1.0\r\nHost: a\r\n\r\n", ToHyper(HandOff::NotHttp11)),
            ("CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", ToHyper(HandOff::Connect)),
            ("CONNECT / HTTP/1.1\r\nHost: a\r\n\r\n", ToHyper(HandOff::Connect)),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
                ToHyper(HandOff::Upgrade),
            ),
            ("GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\n\r\n", ToHyper(HandOff::Upgrade)),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nHTTP2-Settings: AA\r\n\r\n",
                ToHyper(HandOff::Upgrade),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
                ToHyper(HandOff::Expect),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                ToHyper(HandOff::LengthAndCoding),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
                ToHyper(HandOff::LengthAndCoding),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
                ToHyper(HandOff::TransferCoding),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                ToHyper(HandOff::TransferCoding),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
                ToHyper(HandOff::TransferCoding),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                ToHyper(HandOff::TransferCoding),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
                ToHyper(HandOff::TransferCoding),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                ToHyper(HandOff::ContentLength),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                ToHyper(HandOff::ContentLength),
            ),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", ToHyper(HandOff::ContentLength)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", ToHyper(HandOff::ContentLength)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", ToHyper(HandOff::ContentLength)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", ToHyper(HandOff::ContentLength)),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
                ToHyper(HandOff::ContentLength),
            ),
            ("GET / HTTP/1.1\r\n\r\n", ToHyper(HandOff::Host)),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", ToHyper(HandOff::Host)),
            ("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", ToHyper(HandOff::Target)),
            ("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", ToHyper(HandOff::Target)),
            ("GET / HTTP/1.1\nHost: a\r\n\r\n", ToHyper(HandOff::BareLf)),
            ("GET / HTTP/1.1\r\nHost: a\n\r\n", ToHyper(HandOff::BareLf)),
            ("GET / HTTP/1.1\r\nHost: a\r\n\n", ToHyper(HandOff::BareLf)),
            ("\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", ToHyper(HandOff::BareLf)),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: content-length\r\nContent-Length: 0\r\n\r\n",
                ToHyper(HandOff::ConnectionNamesFraming),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: host\r\n\r\n",
                ToHyper(HandOff::ConnectionNamesFraming),
            ),
        ]
    };

    /// [`HEADS`], for the tests here and in `hyper_agrees`.
    pub(crate) fn table() -> &'static [(&'static str, Expect)] {
        HEADS
    }

    pub(crate) fn check(input: &[u8], expected: &Expect) {
        let shown = String::from_utf8_lossy(input);
        match (HeadReader::new().decide(input, &RULES), expected) {
            (Decision::Forward(head), Expect::Forward(framing, upstream, keep_alive)) => {
                assert_eq!(head.framing, *framing, "{shown:?}");
                assert_eq!(
                    String::from_utf8_lossy(&head.upstream_head),
                    *upstream,
                    "{shown:?}"
                );
                assert_eq!(head.keep_alive, *keep_alive, "{shown:?}");
                assert_eq!(head.head_len, input.len(), "{shown:?}");
            }
            (Decision::Reject(status), Expect::Reject(code)) => {
                assert_eq!(status.as_u16(), *code, "{shown:?}")
            }
            (Decision::HandOff(reason), Expect::ToHyper(expected)) => {
                assert_eq!(reason, *expected, "{shown:?}")
            }
            (Decision::NeedMore, Expect::NeedMore) => {}
            (decision, _) => panic!("{shown:?}: unexpected {decision:?}"),
        }
    }

    #[test]
    fn each_head_is_decided_as_the_table_says() {
        for (input, expected) in table() {
            check(input.as_bytes(), expected);
        }
    }

    /// Fed a byte at a time, a head is parsed only when its end arrives, and is decided
    /// as when it came in one read; an error in the first byte is answered at once, a later
    /// one at the head's end (as hyper, whose first parse is of its first read).
    #[test]
    fn a_head_arriving_a_byte_at_a_time_is_decided_at_its_end() {
        let by_bytes = |input: &[u8]| {
            let mut reader = HeadReader::new();
            (1..=input.len())
                .map(|end| reader.decide(&input[..end], &RULES))
                .collect::<Vec<_>>()
        };
        let valid = b"POST /v1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n";
        let decisions = by_bytes(valid);
        let (last, before) = decisions.split_last().expect("decisions");
        assert!(
            before.iter().all(|d| matches!(d, Decision::NeedMore)),
            "{before:?}"
        );
        let (Decision::Forward(split), Decision::Forward(whole)) =
            (last, HeadReader::new().decide(valid, &RULES))
        else {
            panic!("not forwarded: {last:?}");
        };
        assert_eq!(split.upstream_head, whole.upstream_head);

        let late_error = b"GET /v1 HTTP/1.1\r\nX: a\x01b\r\n\r\n";
        let decisions = by_bytes(late_error);
        let (last, before) = decisions.split_last().expect("decisions");
        assert!(
            before.iter().all(|d| matches!(d, Decision::NeedMore)),
            "{before:?}"
        );
        assert!(
            matches!(last, Decision::Reject(StatusCode::BAD_REQUEST)),
            "{last:?}"
        );

        let first_byte = by_bytes(b"(GET / HTTP/1.1\r\n");
        assert!(matches!(
            first_byte[0],
            Decision::Reject(StatusCode::BAD_REQUEST)
        ));
    }

    #[test]
    fn the_body_and_the_next_request_are_left_alone() {
        let input =
            b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.1\r\n";
        let Decision::Forward(head) = read(input, &RULES) else {
            panic!("not forwarded");
        };
        assert_eq!(&input[head.head_len..head.head_len + 2], b"hi");
        assert_eq!(head.uri, "/a");
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.headers["host"], "a");
    }

    #[test]
    fn limits_and_rewrite_rules_apply() {
        let preserve = HeadRules {
            preserve_host: true,
            base_path: "/base",
            ..RULES
        };
        let Decision::Forward(head) =
            read(b"GET /v1?q HTTP/1.1\r\nhost: client\r\n\r\n", &preserve)
        else {
            panic!("not forwarded");
        };
        assert_eq!(
            head.upstream_head,
            b"GET /base/v1?q HTTP/1.1\r\nhost: client\r\n\r\n"
        );

        let few = HeadRules {
            max_headers: 2,
            ..RULES
        };
        let three = b"GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n";
        assert!(matches!(
            read(three, &few),
            Decision::Reject(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        ));

        let mut long = b"GET / HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
        long.extend(std::iter::repeat_n(b'x', RULES.max_header_bytes));
        assert!(matches!(
            read(&long, &RULES),
            Decision::HandOff(HandOff::HeadTooLarge)
        ));
        long.extend_from_slice(b"\r\n\r\n");
        assert!(matches!(
            read(&long, &RULES),
            Decision::HandOff(HandOff::HeadTooLarge)
        ));
    }
}
