//! HTTP/1.1 serialisation for the relay: what it writes to the client and upstream
//! itself, byte for byte as hyper's server and client write the same thing (the
//! differential tests in `tests/it/fast_path.rs` compare the two).

use http::header::HeaderName;

use super::response::{BodyFraming, ResponseHead};
use crate::exchange::Answer;

/// The head the client gets, as hyper's server writes it: `connection: close` after the
/// end-to-end fields for a closing client, and `transfer-encoding: chunked` last where the
/// relay chunks a body the upstream delimits by closing (`add_chunked`).
pub fn client_head(head: &ResponseHead, close: bool, add_chunked: bool, out: &mut Vec<u8>) {
    // The head without the empty line that ends it.
    let fields = head
        .client_head
        .strip_suffix(b"\r\n")
        .unwrap_or(&head.client_head);
    let (before, after) = fields
        .split_at_checked(head.close_at)
        .unwrap_or((fields, &[]));
    out.extend_from_slice(before);
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(after);
    if add_chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether the body goes to the client in a chunked coding of the relay's own, as hyper's
/// server writes it: one chunk per piece of data and trailers as it passes them. A
/// chunked upstream body is re-chunked so that its trailers can be passed as hyper
/// passes them, and a body the upstream delimits by closing is chunked so that the client
/// connection stays open.
pub fn rechunked(framing: Option<BodyFraming>) -> bool {
    matches!(
        framing,
        Some(BodyFraming::Chunked | BodyFraming::UntilClose)
    )
}

/// Whether a request's `TE` asks for trailers.
pub fn te_trailers(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::TE)
        .iter()
        .any(|value| super::lists(value.as_bytes(), b"trailers"))
}

/// The trailer names a response head declares in `Trailer`, as hyper's server reads them.
pub fn declared(headers: &http::HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(http::header::TRAILER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// The end of a re-chunked body: the last chunk, with the trailers of `section` (a
/// trailer section as the upstream sent it) that hyper's server passes: those in
/// `declared` that may be trailers at all, each name's lines together, names in lower case.
pub fn last_chunk(section: &[u8], declared: &[HeaderName], out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n");
    if !declared.is_empty() {
        let mut trailers = http::HeaderMap::new();
        for (name, value) in trailer_fields(section) {
            if declared.contains(&name) && may_be_a_trailer(&name) {
                trailers.append(name, value);
            }
        }
        for (name, value) in &trailers {
            super::push_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// The fields of a trailer section as the upstream sent it (`name: value` lines, which
/// the chunked reader checked), as hyper's client reads them; a line that is no valid
/// field is skipped.
pub fn trailer_fields(
    section: &[u8],
) -> impl Iterator<Item = (HeaderName, http::HeaderValue)> + '_ {
    section.split(|&b| b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = line.split_at_checked(colon)?;
        let name = HeaderName::from_bytes(name).ok()?;
        let value = http::HeaderValue::from_bytes(value.get(1..)?.trim_ascii()).ok()?;
        Some((name, value))
    })
}

/// The fields hyper's server never sends as trailers (RFC 9110 6.5.1).
fn may_be_a_trailer(name: &HeaderName) -> bool {
    use http::header::*;
    ![
        AUTHORIZATION,
        CACHE_CONTROL,
        CONTENT_ENCODING,
        CONTENT_LENGTH,
        CONTENT_RANGE,
        CONTENT_TYPE,
        HOST,
        MAX_FORWARDS,
        SET_COOKIE,
        TRAILER,
        TRANSFER_ENCODING,
        TE,
    ]
    .contains(name)
}

/// `data` as one chunk of the chunked coding, its size in upper-case hex as hyper writes it.
pub fn chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    // Upper-case hex digits, most significant first, without the formatting machinery
    // (this runs once per relayed chunk).
    let len = data.len();
    let hex = |shift: u32| {
        let nibble = len.checked_shr(shift).unwrap_or(0) & 0xf;
        b"0123456789ABCDEF".get(nibble).copied().unwrap_or(b'0')
    };
    // A size line of a fixed length is one small copy; an event's chunk is under 4 KiB.
    if len < 0x10 {
        out.extend_from_slice(&[hex(0), b'\r', b'\n']);
    } else if len < 0x100 {
        out.extend_from_slice(&[hex(4), hex(0), b'\r', b'\n']);
    } else if len < 0x1000 {
        out.extend_from_slice(&[hex(8), hex(4), hex(0), b'\r', b'\n']);
    } else {
        let digits = usize::BITS.saturating_sub(len.leading_zeros()).div_ceil(4);
        for at in (0..digits).rev() {
            out.push(hex(at.saturating_mul(4)));
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// tokentap's own answer (`502`, `503`, `504`, a client's `4xx`), byte for byte what
/// hyper's server writes for [`Answer::response`]: its fields, `connection: close` for a
/// closing client, then the length hyper adds.
pub fn answer(answer: &Answer, close: bool) -> Vec<u8> {
    let response = answer.response::<bytes::Bytes>();
    // The response's status, not the answer's: a gRPC call's answer is a `200`.
    let status = response.status();
    let body = response.body();
    let mut out = Vec::with_capacity(body.len().saturating_add(128));
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or_default().as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in response.headers() {
        super::push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What hyper's HTTP/1.1 server writes for `answer.response()` to a client that sent
    /// `connection: close` when `close`, without its `date` field.
    async fn hyper_writes(answer: &Answer, close: bool) -> Vec<u8> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |_request| {
            let response = answer.response::<http_body_util::Full<bytes::Bytes>>();
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(server), service),
        );
        let connection = if close { "connection: close\r\n" } else { "" };
        let request =
            format!("POST /x HTTP/1.1\r\nhost: x\r\n{connection}content-length: 0\r\n\r\n");
        client.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n =
                tokio::time::timeout(std::time::Duration::from_millis(500), client.read(&mut buf))
                    .await
                    .map_or(0, |r| r.unwrap_or(0));
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if !close && out.windows(4).any(|w| w == b"\r\n\r\n") {
                let head_end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                let head = String::from_utf8_lossy(&out[..head_end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |n| n.trim().parse().unwrap());
                if out.len() >= head_end + length {
                    break;
                }
            }
        }
        let text = String::from_utf8(out).unwrap();
        text.split("\r\n")
            .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
            .collect::<Vec<_>>()
            .join("\r\n")
            .into_bytes()
    }

    /// The relay's answer bytes are hyper's for every kind of answer, a gRPC call's
    /// (status 200, its status in `grpc-status`) included.
    #[tokio::test]
    async fn answers_are_written_as_hyper_writes_them() {
        use http::{HeaderMap, HeaderValue, StatusCode};
        let mut grpc = HeaderMap::new();
        grpc.insert("content-type", HeaderValue::from_static("application/grpc"));
        let plain = HeaderMap::new();
        for (status, headers) in [
            (StatusCode::BAD_GATEWAY, &plain),
            (StatusCode::METHOD_NOT_ALLOWED, &plain),
            (StatusCode::BAD_GATEWAY, &grpc),
            (StatusCode::GATEWAY_TIMEOUT, &grpc),
            (StatusCode::SERVICE_UNAVAILABLE, &grpc),
        ] {
            let answer = Answer::new(status, "cannot connect to upstream").to(headers);
            for close in [false, true] {
                assert_eq!(
                    String::from_utf8_lossy(&answer_bytes(&answer, close)),
                    String::from_utf8_lossy(&hyper_writes(&answer, close).await),
                    "{answer:?}, close: {close}"
                );
            }
        }
    }

    fn answer_bytes(answer: &Answer, close: bool) -> Vec<u8> {
        super::answer(answer, close)
    }

    #[test]
    fn a_chunk_s_size_is_upper_case_hex_as_hyper_writes_it() {
        for len in [
            1usize,
            9,
            10,
            15,
            16,
            255,
            256,
            4095,
            4096,
            8192,
            65_535,
            1 << 20,
            (1 << 20) + 0xABC,
        ] {
            let data = vec![b'x'; len];
            let mut out = Vec::new();
            chunk(&data, &mut out);
            let mut expected = format!("{len:X}\r\n").into_bytes();
            expected.extend_from_slice(&data);
            expected.extend_from_slice(b"\r\n");
            assert_eq!(out, expected, "{len}");
        }
        let mut out = Vec::new();
        chunk(b"", &mut out);
        assert!(
            out.is_empty(),
            "an empty piece is no chunk (it would end the body)"
        );
    }
}
