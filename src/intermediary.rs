//! The rules an HTTP intermediary must apply to message heads (framing, `Host`), one
//! place for both transports (the hyper path's [`upstream`](crate::proxy::upstream) and
//! the [`relay`](crate::relay)), each rule beside its RFC reason and unit-testable on a
//! bare `HeaderMap`.
//!
//! tokentap forwards bodies frame by frame and lets hyper re-frame them for the next hop
//! (chunked or `Content-Length` on HTTP/1.1, DATA frames on h2). That is only faithful when
//! the headers describe the body hyper forwards: a `Content-Length` next to a
//! `Transfer-Encoding` does not, and a transfer coding other than `chunked` cannot be
//! re-expressed at all once hyper has removed the chunking.

// Values from the network pass here: nothing may panic on them (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Authority;
use http::Version;

/// The largest upstream response head tokentap reads, on every upstream client (the
/// relay's head limit, the read buffer and header list size of hyper's clients): nginx's
/// default is 4-8 KiB.
pub const MAX_UPSTREAM_HEAD_BYTES: usize = 16 << 10;

/// The most fields an upstream HTTP/1.1 response head may have (hyper's client default,
/// set explicitly on every HTTP/1.1 upstream client).
pub const MAX_UPSTREAM_HEAD_FIELDS: usize = 100;

/// The fields that describe one connection rather than the message, removed by a proxy in
/// both directions, each with its reason. Any field a `Connection` header names is one too.
///
/// Two have a rule of their own: a request's `TE: trailers` is forwarded (it asks for
/// trailers end to end, as gRPC clients do), and the relay keeps a `Transfer-Encoding:
/// chunked`, since it writes that body in the chunked coding itself where hyper would add
/// the same field.
pub const HOP_BY_HOP: [(&str, &str); 9] = [
    ("connection", "RFC 9110 7.6.1: this connection's options"),
    (
        "http2-settings",
        "RFC 7540 3.2.1: the settings of an h2c upgrade of this connection",
    ),
    (
        "keep-alive",
        "RFC 9110 7.6.1: a connection option of HTTP/1.0",
    ),
    (
        "proxy-connection",
        "RFC 9110 7.6.1: a non-standard connection option",
    ),
    (
        "proxy-authenticate",
        "RFC 9110 11.7.1: a proxy's challenge to this client",
    ),
    (
        "proxy-authorization",
        "RFC 9110 11.7.2: credentials for this proxy",
    ),
    ("te", "RFC 9110 10.1.4: the codings this connection accepts"),
    (
        "transfer-encoding",
        "RFC 9112 6.1: the framing on this connection",
    ),
    (
        "upgrade",
        "RFC 9110 7.8: a protocol switch of this connection",
    ),
];

/// Whether a field (its name in lower case) is hop-by-hop by [`HOP_BY_HOP`].
pub fn is_hop_by_hop(lower_name: &str) -> bool {
    HOP_BY_HOP.iter().any(|(name, _)| *name == lower_name)
}

/// Remove hop-by-hop headers, including any named in `Connection`. `TE: trailers` is kept.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    let te_trailers = headers.get_all(header::TE).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
    });
    for name in &named {
        headers.remove(name);
    }
    for (name, _) in HOP_BY_HOP {
        headers.remove(name);
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// A message whose framing tokentap cannot forward faithfully.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported transfer coding {0:?} (only chunked can be forwarded)")]
pub struct UnsupportedTransferCoding(pub String);

/// Check a message head's `Transfer-Encoding` and drop what no longer describes the body.
///
/// - With a `Transfer-Encoding`, any `Content-Length` is removed: the transfer coding
///   delimits the message, and an intermediary must remove the length before forwarding
///   (RFC 9112 6.3, item 3). Kept, it would make hyper cut the body at that length (or
///   break it past the real end) on HTTP/1.1 and send a false `content-length` on h2.
/// - A coding other than `chunked` (`gzip, chunked`, say) is refused: hyper decodes only
///   the chunking, and `Transfer-Encoding` is hop-by-hop (and does not exist on h2), so the
///   next hop would get gzip bytes with nothing saying so. Moving it to `Content-Encoding`
///   would change what the message means to caches and to a client that already asked for
///   a content coding, so tokentap does not guess.
pub fn check_transfer_coding(headers: &mut HeaderMap) -> Result<(), UnsupportedTransferCoding> {
    if !headers.contains_key(header::TRANSFER_ENCODING) {
        return Ok(());
    }
    if let Some(coding) = foreign_coding(headers) {
        return Err(UnsupportedTransferCoding(coding));
    }
    headers.remove(header::CONTENT_LENGTH);
    Ok(())
}

/// The first transfer coding other than `chunked` in a head's `Transfer-Encoding`, in
/// lower case, as [`check_transfer_coding`] names it.
pub fn foreign_coding(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| {
            String::from_utf8_lossy(value.as_bytes())
                .split(',')
                .map(|coding| coding.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .find(|coding| !coding.is_empty() && coding != "chunked")
}

/// The `Host` a request to `authority` carries when the client's is not kept: the
/// authority, without the port when it is HTTP's default (RFC 9110 7.2, 4.2.1).
pub fn host_value(authority: &Authority) -> String {
    match authority.port_u16() {
        Some(port) if port != 80 => format!("{}:{port}", authority.host()),
        _ => authority.host().to_string(),
    }
}

/// Why a request's `Host` cannot be forwarded (each is a `400`, RFC 9112 3.2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("more than one Host header")]
    Duplicate,
    #[error("an HTTP/1.1 request without a Host header")]
    Missing,
    #[error("a Host header that is not a host and port")]
    Invalid,
}

/// Whether a `Host` value is `uri-host [":" port]` (RFC 9110 7.2), or empty (a target
/// without an authority, RFC 9112 3.2).
pub fn valid_host(value: &[u8]) -> bool {
    value.is_empty()
        || (!value.contains(&b'@')
            && std::str::from_utf8(value).is_ok_and(|text| text.parse::<Authority>().is_ok()))
}

/// The request's `Host`, checked, and the one to forward when the client's is kept
/// (`upstream.host_header: preserve`).
///
/// An HTTP/1.1 request has exactly one `Host`, and it is a host and port (RFC 9112 3.2: a
/// server must answer 400 otherwise); h2 carries `:authority` instead, and HTTP/1.0 may
/// omit it. An absolute-form target (`GET http://a.example/v1 HTTP/1.1`) names the host
/// itself, and a server must then ignore `Host` (RFC 9112 3.2.2): its authority replaces
/// it. An h2 request's `:authority` arrives the same way, as the URI's authority.
pub fn preserved_host(
    version: Version,
    headers: &HeaderMap,
    target_authority: Option<&Authority>,
) -> Result<Option<HeaderValue>, HostError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let first = hosts.next().cloned();
    if hosts.next().is_some() {
        return Err(HostError::Duplicate);
    }
    match &first {
        None if version == Version::HTTP_11 => return Err(HostError::Missing),
        Some(value) if !valid_host(value.as_bytes()) => return Err(HostError::Invalid),
        _ => {}
    }
    Ok(target_authority
        .and_then(|authority| HeaderValue::from_str(authority.as_str()).ok())
        .or(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_and_te_trailers_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "keep-alive, x-secret-hop".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert("x-secret-hop", "1".parse().unwrap());
        headers.insert("transfer-encoding", "chunked".parse().unwrap());
        headers.insert("te", "trailers, deflate".parse().unwrap());
        headers.insert("x-end-to-end", "kept".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 2, "{headers:?}");
        assert_eq!(headers["te"], "trailers");
        assert_eq!(headers["x-end-to-end"], "kept");
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    /// Headers in, and whether `Content-Length` stays (or the coding refused).
    type Case = (
        &'static [(&'static str, &'static str)],
        Result<bool, &'static str>,
    );

    #[test]
    fn content_length_beside_chunked_is_removed() {
        let cases: [Case; 6] = [
            (&[("content-length", "10")], Ok(true)),
            (
                &[("content-length", "10"), ("transfer-encoding", "chunked")],
                Ok(false),
            ),
            (
                &[("content-length", "10"), ("transfer-encoding", "Chunked")],
                Ok(false),
            ),
            (&[("transfer-encoding", "gzip, chunked")], Err("gzip")),
            (
                &[
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "x-custom"),
                ],
                Err("x-custom"),
            ),
            (&[("transfer-encoding", "gzip")], Err("gzip")),
        ];
        for (input, expected) in cases {
            let mut map = headers(input);
            let result = check_transfer_coding(&mut map);
            match expected {
                Ok(keeps_length) => {
                    assert_eq!(result, Ok(()), "{input:?}");
                    assert_eq!(
                        map.contains_key(header::CONTENT_LENGTH),
                        keeps_length,
                        "{input:?}"
                    );
                }
                Err(coding) => assert_eq!(
                    result,
                    Err(UnsupportedTransferCoding(coding.into())),
                    "{input:?}"
                ),
            }
        }
    }

    #[test]
    fn an_http11_request_has_one_valid_host() {
        type Case = (
            &'static [(&'static str, &'static str)],
            Version,
            Result<(), HostError>,
        );
        let cases: [Case; 8] = [
            (&[("host", "a.example")], Version::HTTP_11, Ok(())),
            (&[("host", "a.example:8080")], Version::HTTP_11, Ok(())),
            (&[("host", "[::1]:80")], Version::HTTP_11, Ok(())),
            (&[("host", "")], Version::HTTP_11, Ok(())),
            (&[], Version::HTTP_11, Err(HostError::Missing)),
            (&[], Version::HTTP_10, Ok(())),
            (
                &[("host", "a, b")],
                Version::HTTP_11,
                Err(HostError::Invalid),
            ),
            (
                &[("host", "user@a.example")],
                Version::HTTP_11,
                Err(HostError::Invalid),
            ),
        ];
        for (pairs, version, expected) in cases {
            let result = preserved_host(version, &headers(pairs), None).map(|_| ());
            assert_eq!(result, expected, "{pairs:?} {version:?}");
        }
    }

    #[test]
    fn host_is_unique_and_an_absolute_target_wins() {
        let target: Authority = "target.example:8080".parse().unwrap();
        let one = headers(&[("host", "client.example")]);
        let two = headers(&[("host", "a.example"), ("host", "b.example")]);
        let none = HeaderMap::new();
        let preserved_host =
            |headers: &HeaderMap, target| super::preserved_host(Version::HTTP_2, headers, target);
        assert_eq!(
            preserved_host(&one, None),
            Ok(Some(HeaderValue::from_static("client.example")))
        );
        assert_eq!(
            preserved_host(&one, Some(&target)),
            Ok(Some(HeaderValue::from_static("target.example:8080")))
        );
        assert_eq!(
            preserved_host(&none, Some(&target)),
            Ok(Some(HeaderValue::from_static("target.example:8080")))
        );
        assert_eq!(preserved_host(&none, None), Ok(None));
        assert_eq!(preserved_host(&two, None), Err(HostError::Duplicate));
        assert_eq!(
            preserved_host(&two, Some(&target)),
            Err(HostError::Duplicate)
        );
    }
}
