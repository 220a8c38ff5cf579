//! The checks behind tokentap's fuzz targets, shared by the cargo-fuzz targets in
//! `fuzz_targets/` (coverage-guided, `scripts/fuzz.sh`) and by `tests/it/fuzz_decoders.rs`
//! (a fixed budget of proptest-generated inputs that runs in `cargo test`).
//!
//! Every check feeds untrusted bytes to a sans-IO part of tokentap that sees network
//! input, and asserts more than "no panic":
//!
//! - decoders ([`check_decoder`]): feeding a body whole and feeding it cut into small,
//!   sometimes empty, frames gives the same signals and the same error (the `Decoder`
//!   contract: signals must not depend on how the body was split). Limits are chosen by
//!   the input too, down to 8-byte events, so the give-up paths are fuzzed as well;
//! - compressed bodies ([`check_compressed`]): no panic whatever the bytes; a body the
//!   whole-feed accepts is accepted when split too and gives the same signals (except
//!   the documented ratio-bomb bound, which counts compressed bytes fed so far, and
//!   corrupt brotli that brotli-decompressor only notices when fed in pieces);
//! - the request scanner ([`check_request_scanner`]): split-invariant, and on every input
//!   that is a JSON object it agrees with serde_json about the top-level `model` (when it
//!   is a string of at most 256 bytes) and `stream` (when a bool), ignoring decoys in
//!   nested objects and strings;
//! - gRPC bodies ([`check_grpc`]): a gRPC dialect's decoder and request scanner give the
//!   same whole and split, and messages compressed by the harness decode to the same
//!   signals as the same messages sent plain.
//!
//! Input layout (first bytes select, the rest is the body):
//! - decoders: `[framing | limits << 2, split seed, body...]`; for a gRPC dialect the
//!   framing is gRPC's and the two bits pick the `grpc-encoding` instead ([`ENCODINGS`]);
//! - any dialect: `[framing | limits << 2, split seed, dialect, body...]`;
//! - compressed: `[coding | compress_here << 2 | dialect << 3, split seed, content type,
//!   body...]`; with `compress_here` the body is compressed by the harness (gzip,
//!   deflate, zstd) so that the inner decoders see fuzzed plaintext; without it the body
//!   is fed as the compressed stream itself;
//! - gRPC: `[dialect | encoding << 2 | messages_here << 4 | limits << 5, split seed,
//!   body...]`: with `messages_here` the harness cuts the body into messages and frames
//!   them (compressed, unless the encoding is `identity`); without it the body is fed as
//!   the framed stream itself.

use std::collections::HashMap;
use std::io::Write;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use tokentap::wire::grpc::framing::frame_with;
use tokentap::wire::grpc::request::GrpcRequestScanner;
use tokentap::wire::request::RequestScanner;
use tokentap::wire::{
    self, DecodeError, DecodeLimits, DecodeOptions, Decoder, Dialect, Framing, Signal,
};

/// Cut `body` into frames of 1 to ~50 bytes (and now and then an empty one), from `seed`.
pub fn frames(body: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = (u32::from(seed) + 1).wrapping_mul(2_654_435_761) | 1;
    let max = 1 + (usize::from(seed) % 17) * 3;
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        if state % 11 == 0 {
            out.push(&rest[..0]);
        }
        let n = (1 + state as usize % max).min(rest.len());
        out.push(&rest[..n]);
        rest = &rest[n..];
    }
    out
}

/// Limits from a selector: 0 is [`DecodeLimits::DEFAULT`]; others go down to 8-byte events and
/// 16-byte bodies.
pub fn limits(selector: u8) -> DecodeLimits {
    if selector == 0 {
        return DecodeLimits::DEFAULT;
    }
    DecodeLimits {
        max_event_bytes: 8usize << (selector % 16),
        max_body_bytes: 16usize << ((selector / 4) % 16),
    }
}

/// What decoding a body gave: the signals, and the error that stopped it, if any.
pub type Decoded = (Vec<Signal>, Option<DecodeError>);

/// Feed `frames` the way the body wrapper does: stop at the first error (the decoder is
/// not fed again, nor finished), else finish at the end.
pub fn decode<'a>(
    mut decoder: Box<dyn Decoder>,
    frames: impl IntoIterator<Item = &'a [u8]>,
) -> Decoded {
    let mut out = Vec::new();
    for frame in frames {
        if let Err(err) = decoder.feed(frame, &mut out) {
            return (out, Some(err));
        }
    }
    let err = decoder.finish(&mut out).err();
    (out, err)
}

/// The four framings of the HTTP dialects (the gRPC dialects have their own).
fn framing(selector: u8) -> Framing {
    const HTTP: [Framing; 4] = [
        Framing::Sse,
        Framing::Json,
        Framing::Ndjson,
        Framing::JsonArray,
    ];
    HTTP[usize::from(selector) % HTTP.len()]
}

/// The `grpc-encoding`s a gRPC input picks from.
pub const ENCODINGS: [&str; 4] = ["identity", "gzip", "deflate", "zstd"];

/// The gRPC dialects, in [`Dialect::ALL`]'s order.
pub fn grpc_dialects() -> Vec<Dialect> {
    Dialect::ALL.into_iter().filter(|d| d.is_grpc()).collect()
}

/// Decode `body` whole and split; both must give the same signals and error.
pub fn check_decoder(dialect: Dialect, data: &[u8]) {
    let [select, seed, body @ ..] = data else {
        return;
    };
    let (framing, encoding) = if dialect.is_grpc() {
        (Framing::Grpc, Some(ENCODINGS[usize::from(select & 3)]))
    } else {
        (framing(select & 3), None)
    };
    let limits = limits(select >> 2);
    let options = DecodeOptions {
        skip_special_tokens: seed & 0x80 != 0,
        grpc_encoding: encoding.map(str::as_bytes),
        ..DecodeOptions::new(limits)
    };
    let make = || wire::decoder(dialect, framing, options);
    let whole = decode(make(), [body]);
    let split = decode(make(), frames(body, *seed));
    assert_eq!(
        whole, split,
        "{dialect} {framing:?} {limits:?}: whole and split decoding differ"
    );
}

/// [`check_decoder`] for the dialect named `name` ([`Dialect::as_str`]).
pub fn check_dialect(name: &str, data: &[u8]) {
    let dialect = Dialect::from_name(name).unwrap_or_else(|| panic!("no dialect {name:?}"));
    check_decoder(dialect, data);
}

/// [`check_decoder`] for any dialect, chosen by the third byte (so dialects added later
/// are fuzzed without a new target).
pub fn check_any_dialect(data: &[u8]) {
    let [select, seed, which, body @ ..] = data else {
        return;
    };
    let dialect = Dialect::ALL[usize::from(*which) % Dialect::ALL.len()];
    let mut input = vec![*select, *seed];
    input.extend_from_slice(body);
    check_decoder(dialect, &input);
}

const CODINGS: [&str; 4] = ["gzip", "deflate", "br", "zstd"];
const CONTENT_TYPES: [&str; 4] = [
    "text/event-stream",
    "application/json",
    "application/x-ndjson",
    "application/json; charset=utf-8",
];

/// Compress `plain` with a coding the harness can produce (brotli it cannot: `None`).
pub fn compress(coding: &str, plain: &[u8]) -> Option<Vec<u8>> {
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(plain).ok()?;
            e.finish().ok()
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(plain).ok()?;
            e.finish().ok()
        }
        "zstd" => zstd::bulk::compress(plain, 1).ok(),
        _ => None,
    }
}

/// A compressed body through `response_decoder`: never a panic; if the whole body is
/// accepted, the split one is too (or stopped by the ratio bound) with the same signals.
pub fn check_compressed(data: &[u8]) {
    let [select, seed, ctype, body @ ..] = data else {
        return;
    };
    let coding = CODINGS[usize::from(select & 3)];
    let dialect = Dialect::ALL[usize::from(select >> 3) % Dialect::ALL.len()];
    let content_type = if dialect.is_grpc() {
        // A gRPC body under an HTTP content coding (gRPC itself compresses per message).
        "application/grpc"
    } else {
        CONTENT_TYPES[usize::from(*ctype) % CONTENT_TYPES.len()]
    };
    let compressed;
    let body = if select & 4 != 0 {
        match compress(coding, body) {
            Some(c) => {
                compressed = c;
                &compressed[..]
            }
            None => body,
        }
    } else {
        body
    };
    let make = || {
        wire::response_decoder(
            dialect,
            content_type,
            Some(coding.as_bytes()),
            DecodeOptions::new(DecodeLimits::DEFAULT),
        )
        .expect("every coding and content type here is supported")
    };
    let whole = decode(make(), [body]);
    let split = decode(make(), frames(body, *seed));
    if whole.1.is_none() {
        match &split.1 {
            None => assert_eq!(whole, split, "{dialect} {coding}: whole and split differ"),
            Some(DecodeError::InflateRatio { .. }) => {}
            // brotli-decompressor's one-shot path accepts some corrupt streams that its
            // streaming path (and the reference decoder) rejects: seen with a flipped
            // bit in a meta-block length. Only observation is affected.
            Some(DecodeError::Compression) if coding == "br" => {}
            Some(other) => panic!("{dialect} {coding}: accepted whole, split fails: {other}"),
        }
    }
}

/// Compress one gRPC message under a `grpc-encoding` ([`ENCODINGS`]); `None` for
/// `identity`.
pub fn compress_message(encoding: &str, message: &[u8]) -> Option<Vec<u8>> {
    match encoding {
        "identity" => None,
        // gRPC's `deflate` is zlib-wrapped, as the HTTP coding's compressor here writes it.
        other => compress(other, message),
    }
}

/// Frame `messages` as a gRPC body, each compressed under `encoding` unless it is
/// `identity`.
pub fn grpc_body<'a>(encoding: &str, messages: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    messages
        .into_iter()
        .flat_map(|m| match compress_message(encoding, m) {
            Some(c) => frame_with(true, &c),
            None => frame_with(false, m),
        })
        .collect()
}

fn scan_grpc<'a>(
    dialect: Dialect,
    frames: impl IntoIterator<Item = &'a [u8]>,
) -> (Option<String>, bool, Option<bool>, bool) {
    let mut scanner = GrpcRequestScanner::new(dialect);
    for frame in frames {
        scanner.feed(frame);
    }
    (
        scanner.model().map(str::to_string),
        scanner.model_too_long(),
        scanner.stream(),
        scanner.is_done(),
    )
}

/// A gRPC body (layout in the module docs): the response decoder and the request
/// scanner give the same whole and split; and where the harness framed the messages
/// compressed, they decode to what the same messages give sent plain (unless a bound
/// stopped either: a compressed message's size differs from its plaintext's).
pub fn check_grpc(data: &[u8]) {
    let [select, seed, body @ ..] = data else {
        return;
    };
    let dialects = grpc_dialects();
    let dialect = dialects[usize::from(select & 3) % dialects.len()];
    let encoding = ENCODINGS[usize::from((select >> 2) & 3)];
    let limits = limits((select >> 5) & 7);
    let messages: Vec<&[u8]> = frames(body, *seed).into_iter().collect();
    let framed;
    let body = if select & 0x10 != 0 {
        framed = grpc_body(encoding, messages.iter().copied());
        &framed[..]
    } else {
        body
    };
    let options = DecodeOptions {
        grpc_encoding: Some(encoding.as_bytes()),
        ..DecodeOptions::new(limits)
    };
    let make = || wire::decoder(dialect, Framing::Grpc, options);
    let whole = decode(make(), [body]);
    let split = decode(make(), frames(body, seed.wrapping_add(1)));
    assert_eq!(
        whole, split,
        "{dialect} {encoding} {limits:?}: whole and split differ"
    );
    if select & 0x10 != 0 && encoding != "identity" {
        let plain = grpc_body("identity", messages.iter().copied());
        let plain = decode(wire::decoder(dialect, Framing::Grpc, options), [&plain[..]]);
        if whole.1.is_none() && plain.1.is_none() {
            assert_eq!(
                whole.0, plain.0,
                "{dialect} {encoding}: compressed and plain differ"
            );
        }
    }
    let scanned = scan_grpc(dialect, [body]);
    assert_eq!(
        scan_grpc(dialect, frames(body, *seed)),
        scanned,
        "{dialect}: whole and split request scans differ"
    );
}

/// The top-level members of a JSON object, in order, duplicates kept.
struct Members(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, serde_json::Value>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Object)
    }
}

fn scan<'a>(frames: impl IntoIterator<Item = &'a [u8]>) -> (Option<String>, Option<bool>) {
    let mut scanner = RequestScanner::new();
    for frame in frames {
        scanner.feed(frame);
    }
    (scanner.model().map(str::to_string), scanner.stream())
}

/// The request scanner: split-invariant, and on a JSON object it finds what serde_json
/// finds. Inputs with `\u` or `\/` escapes are only checked for split-invariance (the
/// scanner matches key names on their raw bytes, so `"mod\u0065l"` is not `model` to it;
/// no client writes keys that way). Where a key appears twice the scanner keeps the first
/// value (serde_json and Python keep the last); that case is left out of the comparison.
pub fn check_request_scanner(data: &[u8]) {
    let [seed, body @ ..] = data else {
        return;
    };
    let whole = scan([body]);
    let split = scan(frames(body, *seed));
    assert_eq!(whole, split, "whole and split scans differ");

    let escaped = body.windows(2).any(|w| w == b"\\u" || w == b"\\/");
    let Ok(Members(members)) = serde_json::from_slice::<Members>(body) else {
        return;
    };
    if escaped {
        return;
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (key, _) in &members {
        *seen.entry(key.as_str()).or_default() += 1;
    }
    let value = |key: &str| members.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    if seen.get("model").copied().unwrap_or(0) <= 1 {
        let expected = value("model")
            .and_then(|v| v.as_str())
            .filter(|s| serde_json::to_string(s).map_or(0, |j| j.len()) - 2 <= 256)
            .map(str::to_string);
        assert_eq!(whole.0, expected, "model");
    }
    if seen.get("stream").copied().unwrap_or(0) <= 1 {
        let expected = value("stream").and_then(|v| v.as_bool());
        assert_eq!(whole.1, expected, "stream");
    }
}

/// A response head from the network (`data`, parsed by httparse as hyper and the relay
/// parse it) into [`RateLimits::read`]: never a panic, and every value it reports is the
/// decimal value of a field whose name reports that resource's limit or remainder (OpenAI's
/// or Anthropic's form); `Retry-After` only on a `429` or `503`. Then the values are used
/// as the proxy uses them, where a hostile one once panicked: recorded into the gauges
/// ([`RateLimits::record`], as the recorder does; read back within range), the wait added
/// to an `Instant` and a `SystemTime` and made a deadline. The same head, as a collector's
/// answer, goes through the OTLP exporters' reading ([`http_outcome`]) and retry decision
/// ([`time_left`]) with the same checks.
///
/// [`RateLimits::read`]: tokentap::observe::rate_limits::RateLimits::read
/// [`RateLimits::record`]: tokentap::observe::rate_limits::RateLimits::record
/// [`http_outcome`]: tokentap::otlp::transport::http_outcome
/// [`time_left`]: tokentap::otlp::delivery::time_left
pub fn check_rate_limits(data: &[u8]) {
    use tokentap::observe::rate_limits::{RateLimits, Resource, MAX_RETRY_AFTER};
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut head = httparse::Response::new(&mut fields);
    if head.parse(data).is_err() {
        return;
    }
    let Some(status) = head.code.and_then(|c| http::StatusCode::from_u16(c).ok()) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    for field in head.headers.iter() {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(field.name.as_bytes()),
            http::HeaderValue::from_bytes(field.value),
        ) {
            headers.append(name, value);
        }
    }
    check_collector_answer(status, &headers);
    let now = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
    let Some(limits) = RateLimits::read(status, &headers, || now) else {
        return;
    };
    let sent = |names: [String; 2], n: u64| {
        names.iter().any(|name| {
            headers
                .get_all(name.as_str())
                .iter()
                .any(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) == Some(n))
        })
    };
    for (resource, quota) in Resource::ALL.iter().zip(limits.quotas) {
        let header = resource.as_str().replace('_', "-");
        for (field, value) in [("limit", quota.limit), ("remaining", quota.remaining)] {
            if let Some(n) = value {
                let names = [
                    format!("x-ratelimit-{field}-{header}"),
                    format!("anthropic-ratelimit-{header}-{field}"),
                ];
                assert!(sent(names, n), "{resource:?} {field} {n} was not sent");
            }
        }
    }
    if let Some(wait) = limits.retry_after {
        assert!(
            matches!(status.as_u16(), 429 | 503),
            "Retry-After read on {status}"
        );
        assert!(wait <= MAX_RETRY_AFTER, "a wait past the cap: {wait:?}");
        used_as_a_wait(wait);
    }

    // Recorded as the recorder records them, then read back: every gauge in range.
    let metrics = rate_limit_metrics();
    let stream = metrics.stream(Some("m"), Some("t"));
    limits.record(metrics, &stream);
    let text = String::from_utf8(metrics.render()).expect("the exposition is text");
    for line in text.lines().filter(|l| l.starts_with("tokentap_upstream_")) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().expect("a gauge value is a number");
        let most = if series.starts_with("tokentap_upstream_retry_after_seconds") {
            MAX_RETRY_AFTER.as_secs_f64()
        } else if series.starts_with("tokentap_upstream_rate_limit_") {
            i64::MAX as f64
        } else {
            continue;
        };
        assert!(
            value.is_finite() && (0.0..=most).contains(&value),
            "{series} = {value}"
        );
    }
    if let Some(wait) = limits.retry_after {
        let shown = format!(
            "tokentap_upstream_retry_after_seconds{{model=\"m\"}} {}\n",
            wait.as_secs_f64()
        );
        assert!(text.contains(&shown), "{shown} not in\n{text}");
    }
}

/// The gauges the rate-limit check records into: one set for every input (the gauges hold
/// the latest values, which each input reads back right after setting them).
fn rate_limit_metrics() -> &'static tokentap::metrics::Metrics {
    static METRICS: std::sync::OnceLock<std::sync::Arc<tokentap::metrics::Metrics>> =
        std::sync::OnceLock::new();
    METRICS.get_or_init(|| {
        let config = tokentap::Config::from_overrides(&tokentap::config::Overrides {
            upstream: Some("http://127.0.0.1:9".to_string()),
            ..Default::default()
        })
        .expect("a flag-only config is valid");
        tokentap::metrics::Metrics::new(&config.metrics.buckets, &config.labels)
    })
}

/// A wait from the network used as the proxy and the exporters use one: added to the
/// clocks (checked: within the cap it always fits), made a deadline, and weighed against
/// an export timeout.
fn used_as_a_wait(wait: std::time::Duration) {
    let now = std::time::Instant::now();
    assert!(now.checked_add(wait).is_some(), "Instant + {wait:?}");
    let wall = std::time::SystemTime::now();
    assert!(wall.checked_add(wait).is_some(), "SystemTime + {wait:?}");
    let tokio_now = tokio::time::Instant::from_std(now);
    let deadline = tokentap::exchange::idle::deadline(tokio_now, wait);
    assert_eq!(deadline.duration_since(tokio_now), wait);
    for (elapsed, timeout) in [
        (
            std::time::Duration::ZERO,
            std::time::Duration::from_secs(10),
        ),
        (std::time::Duration::MAX, std::time::Duration::MAX),
        (wait, wait),
    ] {
        let left = tokentap::otlp::delivery::time_left(elapsed, wait, timeout);
        assert_eq!(left, wait < timeout.saturating_sub(elapsed));
    }
}

/// The head as a collector's answer to an OTLP/HTTP export: a retryable refusal's wait is
/// the delay-seconds `Retry-After` it sent, capped, and usable as a wait.
fn check_collector_answer(status: http::StatusCode, headers: &http::HeaderMap) {
    use tokentap::observe::rate_limits::MAX_RETRY_AFTER;
    use tokentap::otlp::transport::{http_outcome, SendError};
    match http_outcome(status, headers) {
        Ok(()) => assert!(status.is_success(), "{status} taken for a success"),
        Err(SendError::Permanent(_)) => {}
        Err(SendError::Retryable { after, .. }) => {
            assert!(matches!(status.as_u16(), 429 | 502 | 503 | 504), "{status}");
            let sent = headers
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let expected = sent.map(|s| std::time::Duration::from_secs(s).min(MAX_RETRY_AFTER));
            assert_eq!(after, expected, "Retry-After {sent:?}");
            if let Some(wait) = after {
                used_as_a_wait(wait);
            }
        }
    }
}
