//! Request inspection: which API a request speaks (so whether it is measured at all),
//! which tenant sent it and which trace it belongs to, from the request head alone (the model comes from the body,
//! scanned as it streams upstream). It lives in `observe` because it decides what is
//! measured; the proxy only routes bytes.
//!
//! Nothing read here is stored raw: the tenant passes the label policy before it becomes
//! a label, API keys are only ever hashed, and a trace context is kept only as the two
//! ids of a valid W3C `traceparent` (never any other header text, which could be a
//! secret or unbounded). The one exception is `tracestate`, which the W3C meant to be
//! carried from a parent to its children: a request with a span (opt-in, sampled) and a
//! valid parent keeps it when it is valid by the spec's grammar, which bounds it, and its
//! span carries it as OpenTelemetry SDKs do.

use http::{HeaderMap, HeaderName, Method};
use sha2::{Digest, Sha256};

use crate::config::{Route, TenantSource};
use crate::metrics::exemplar::TraceContext;
use crate::wire::{self, Dialect};

/// The dialect of a request. The first route whose prefix matches the path decides:
/// `dialect: none` forwards the request unobserved whatever its method; a dialect applies
/// to `POST`s of its kind (a gRPC dialect to gRPC calls, any other to the rest), and other
/// methods, or calls of the other kind, are detected from the path as without the route
/// (which finds only the Responses API's `GET …/responses/{id}?stream=true`). A path no
/// route matches is detected by [`wire::dialect_for`], or for a gRPC call (see [`is_grpc`])
/// by [`wire::dialect_for_grpc`]: only the engines' generate RPCs are measured, every other
/// gRPC method (health, model info, Triton's unary `ModelInfer`) passes through.
pub fn routed_dialect(
    routes: &[Route],
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Dialect> {
    let grpc = is_grpc(headers);
    let detected = || {
        if grpc {
            // gRPC calls are `POST`s; anything else is not a call this table knows.
            (method == Method::POST)
                .then(|| wire::dialect_for_grpc(path))
                .flatten()
        } else {
            wire::dialect_for(method, path, query)
        }
    };
    match routes.iter().find(|route| route.matches(path)) {
        Some(route) => {
            let forced = route.dialect?;
            if method == Method::POST && forced.is_grpc() == grpc {
                Some(forced)
            } else {
                detected()
            }
        }
        None => detected(),
    }
}

/// Whether a request is a gRPC call whose messages tokentap can read: `content-type`
/// `application/grpc` or `application/grpc+proto` (parameters allowed, any case). gRPC-Web
/// and other codecs (`+json`) are not.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/grpc")
        || essence.eq_ignore_ascii_case("application/grpc+proto")
}

/// The tenant from the first configured source that yields one.
pub fn tenant_for(headers: &HeaderMap, sources: &[TenantSource]) -> Option<String> {
    sources.iter().find_map(|source| match source {
        TenantSource::Header(name) => headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string),
        TenantSource::ApiKeys(by_hash) => {
            let key = api_key(headers)?;
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            by_hash.get(&digest).cloned()
        }
    })
}

/// The trace context of a request whose `header` holds a valid W3C `traceparent` value
/// (see [`parse_traceparent`]); `None` for a missing, repeated or malformed one.
pub fn trace_context(headers: &HeaderMap, header: &HeaderName) -> Option<TraceContext> {
    trace_parent(headers, header).map(|(trace, _)| trace)
}

/// [`trace_context`] with the parent's sampled flag (bit 0 of the `traceparent`'s flags),
/// which parent-based span sampling follows.
pub fn trace_parent(headers: &HeaderMap, header: &HeaderName) -> Option<(TraceContext, bool)> {
    let mut values = headers.get_all(header).iter();
    let value = values.next()?;
    if values.next().is_some() {
        // `traceparent` is a single value, not a list: two of them name no one trace.
        return None;
    }
    parse_traceparent_flags(value.as_bytes()).map(|(trace, flags)| (trace, flags & 1 == 1))
}

/// Length of a version-`00` `traceparent`: `00-` + 32 + `-` + 16 + `-` + 2.
const TRACEPARENT_LEN: usize = 55;

/// A W3C Trace Context `traceparent` value's trace and span (parent) ids, as the spec
/// (Trace Context Level 1, section 3.2) reads them:
/// - `version-trace_id-parent_id-flags`, every field lower-case hex (upper case is
///   invalid), version 2 digits, trace id 32, parent id 16, flags 2;
/// - version `ff` is invalid; version `00` is exactly 55 bytes;
/// - a later version is read by its first four fields: at least 55 bytes, and byte 55 (if
///   any) must be `-` (what follows belongs to that version and is ignored);
/// - an all-zero trace id or parent id is invalid.
pub fn parse_traceparent(value: &[u8]) -> Option<TraceContext> {
    parse_traceparent_flags(value).map(|(trace, _)| trace)
}

/// [`parse_traceparent`], with the flags byte.
pub fn parse_traceparent_flags(value: &[u8]) -> Option<(TraceContext, u8)> {
    // The fixed part as an array: every index below is checked by the compiler.
    let (fixed, more) = value.split_first_chunk::<TRACEPARENT_LEN>()?;
    let [version] = lower_hex::<1>(&fixed[0..2])?;
    match version {
        0xff => return None,
        0 if !more.is_empty() => return None,
        _ if more.first().is_some_and(|&b| b != b'-') => return None,
        _ => {}
    }
    if fixed[2] != b'-' || fixed[35] != b'-' || fixed[52] != b'-' {
        return None;
    }
    let trace_id = lower_hex::<16>(&fixed[3..35])?;
    let span_id = lower_hex::<8>(&fixed[36..52])?;
    let [flags] = lower_hex::<1>(&fixed[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some((TraceContext { trace_id, span_id }, flags))
}

/// The most list members a `tracestate` holds (Trace Context Level 1, 3.3.1.1).
const TRACESTATE_MAX_MEMBERS: usize = 32;

/// A request's W3C `tracestate`, its fields joined as one list with `,`, when every
/// member is valid (see `valid_tracestate_member`), no key repeats and there are at
/// most 32; `None` otherwise (the spec lets a vendor that cannot parse it drop it, and a
/// part of it would be another vendor's state cut short) or when there is none.
pub fn trace_state(headers: &HeaderMap) -> Option<String> {
    let mut members: Vec<&[u8]> = Vec::new();
    for value in headers.get_all("tracestate") {
        for member in value.as_bytes().split(|&b| b == b',') {
            let member = member.trim_ascii();
            if member.is_empty() {
                continue;
            }
            if members.len() == TRACESTATE_MAX_MEMBERS
                || !valid_tracestate_member(member)
                || members
                    .iter()
                    .any(|m| tracestate_key(m) == tracestate_key(member))
            {
                return None;
            }
            members.push(member);
        }
    }
    if members.is_empty() {
        return None;
    }
    // Every byte was checked to be printable ASCII.
    let joined = members.join(&b","[..]);
    String::from_utf8(joined).ok()
}

/// A `tracestate` list member's key: what comes before its first `=`.
fn tracestate_key(member: &[u8]) -> &[u8] {
    member.split(|&b| b == b'=').next().unwrap_or(member)
}

/// One `tracestate` list member, `key=value`, as the spec's grammar says:
/// - key: a lower-case letter then up to 255 of `a-z 0-9 _ - * /`; or a multi-tenant
///   `tenant@system`, the tenant a letter or digit then up to 240 of those, the system a
///   letter then up to 13;
/// - value: 1 to 256 printable ASCII characters but `,` and `=`, spaces allowed except at
///   the end.
fn valid_tracestate_member(member: &[u8]) -> bool {
    let mut halves = member.splitn(2, |&b| b == b'=');
    let (Some(key), Some(value)) = (halves.next(), halves.next()) else {
        return false;
    };
    let rest = |part: &[u8], most: usize| {
        part.len() <= most
            && part.iter().all(|&b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || matches!(b, b'_' | b'-' | b'*' | b'/')
            })
    };
    let mut parts = key.splitn(2, |&b| b == b'@');
    let key_ok = match (parts.next().and_then(<[u8]>::split_first), parts.next()) {
        (Some((b, key)), None) => b.is_ascii_lowercase() && rest(key, 255),
        (Some((t, tenant)), Some(system)) => {
            (t.is_ascii_lowercase() || t.is_ascii_digit())
                && rest(tenant, 240)
                && matches!(system.split_first(), Some((s, system))
                    if s.is_ascii_lowercase() && rest(system, 13))
        }
        (None, _) => false,
    };
    let value_ok = (1..=256).contains(&value.len())
        && value
            .iter()
            .all(|&b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && value.last() != Some(&b' ');
    key_ok && value_ok
}

/// `2 * N` lower-case hex digits as `N` bytes.
fn lower_hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    let nibble = |c: u8| match c {
        b'0'..=b'9' | b'a'..=b'f' => char::from(c).to_digit(16).map(|d| d as u8),
        _ => None,
    };
    if digits.len() != N.saturating_mul(2) {
        return None;
    }
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let &[high, low] = pair else {
            return None;
        };
        *byte = (nibble(high)? << 4) | nibble(low)?;
    }
    Some(out)
}

/// The API key a client presented: `Authorization: Bearer`, `x-api-key` (Anthropic) or
/// `api-key` (Azure OpenAI).
fn api_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(auth) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let mut parts = auth.splitn(2, ' ');
        if let (Some(scheme), Some(token)) = (parts.next(), parts.next()) {
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() {
                return Some(token.trim());
            }
        }
    }
    ["x-api-key", "api-key"]
        .iter()
        .find_map(|name| headers.get(*name).and_then(|v| v.to_str().ok()))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn dialect_from_path() {
        // Without routes, the path decides (`wire::dialect_for`, no query).
        let dialect_for = |method: &Method, path: &str| {
            routed_dialect(&[], method, path, None, &HeaderMap::new())
        };
        let post = Method::POST;
        assert_eq!(
            dialect_for(&post, "/v1/chat/completions"),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(
            dialect_for(&post, "/v1/completions"),
            Some(Dialect::OpenAiCompletions)
        );
        assert_eq!(
            dialect_for(&post, "/openai/deployments/gpt/chat/completions/"),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(dialect_for(&Method::GET, "/v1/chat/completions"), None);
        assert_eq!(dialect_for(&post, "/v1/models"), None);
        assert_eq!(dialect_for(&post, "/v1/embeddings"), None);
    }

    #[test]
    fn routes_decide_before_path_detection() {
        use crate::config::Route;
        let routes = [
            Route {
                path_prefix: "/my/llm".into(),
                dialect: Some(Dialect::Anthropic),
            },
            Route {
                path_prefix: "/private".into(),
                dialect: None,
            },
        ];
        let post = Method::POST;
        let get = Method::GET;
        let at = |method: &Method, path: &str, query: Option<&str>| {
            routed_dialect(&routes, method, path, query, &HeaderMap::new())
        };
        // Forced, whatever the path looks like.
        assert_eq!(at(&post, "/my/llm", None), Some(Dialect::Anthropic));
        assert_eq!(
            at(&post, "/my/llm/v1/chat/completions", None),
            Some(Dialect::Anthropic)
        );
        // Other methods under a forced prefix: detected as usual.
        assert_eq!(at(&get, "/my/llm/v1/models", None), None);
        assert_eq!(
            at(&get, "/my/llm/v1/responses/r1", Some("stream=true")),
            Some(Dialect::OpenAiResponses)
        );
        // `none`: never observed, even an LLM-shaped path.
        assert_eq!(at(&post, "/private/v1/chat/completions", None), None);
        assert_eq!(
            at(&get, "/private/v1/responses/r1", Some("stream=true")),
            None
        );
        // Not a segment boundary, or no route: path detection.
        assert_eq!(
            at(&post, "/my/llmx/v1/chat/completions", None),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(at(&post, "/api/chat", None), Some(Dialect::Ollama));
        assert_eq!(at(&post, "/my/llmx", None), None);
    }

    #[test]
    fn grpc_calls_are_routed_by_their_exact_method() {
        use crate::config::Route;
        let grpc = |content_type: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
            headers
        };
        let (g, gp, json, none) = (
            grpc("application/grpc"),
            grpc("Application/gRPC+proto; charset=x"),
            grpc("application/json"),
            HeaderMap::new(),
        );
        let post = Method::POST;
        const GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
        let at = |routes: &[Route], headers: &HeaderMap, path: &str| {
            routed_dialect(routes, &post, path, None, headers)
        };
        assert_eq!(at(&[], &g, GENERATE), Some(Dialect::SglangGrpc));
        assert_eq!(at(&[], &gp, GENERATE), Some(Dialect::SglangGrpc));
        assert_eq!(
            at(&[], &g, "/inference.GRPCInferenceService/ModelStreamInfer"),
            Some(Dialect::TritonGrpc)
        );
        // Not a generate RPC, not gRPC, or a codec tokentap cannot read: passthrough.
        for (headers, path) in [
            (&g, "/grpc.health.v1.Health/Check"),
            (&g, "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo"),
            (&g, "/inference.GRPCInferenceService/ModelInfer"),
            (&g, "/v1/chat/completions"),
            (&json, GENERATE),
            (&none, GENERATE),
            (&grpc("application/grpc-web"), GENERATE),
            (&grpc("application/grpc+json"), GENERATE),
        ] {
            assert_eq!(at(&[], headers, path), None, "{path} {headers:?}");
        }
        assert_eq!(
            routed_dialect(&[], &Method::GET, GENERATE, None, &g),
            None,
            "gRPC calls are POSTs"
        );
        // Routes: `none` wins; a gRPC dialect applies to gRPC calls only, an HTTP one to
        // the rest.
        let routes = [
            Route {
                path_prefix: "/private.Service".into(),
                dialect: None,
            },
            Route {
                path_prefix: "/my.Engine/Generate".into(),
                dialect: Some(Dialect::VllmGrpc),
            },
            Route {
                path_prefix: "/".into(),
                dialect: Some(Dialect::OpenAiChat),
            },
        ];
        assert_eq!(at(&routes, &g, "/private.Service/Generate"), None);
        assert_eq!(
            at(&routes, &g, "/my.Engine/Generate"),
            Some(Dialect::VllmGrpc)
        );
        assert_eq!(at(&routes, &json, "/my.Engine/Generate"), None);
        assert_eq!(at(&routes, &g, GENERATE), Some(Dialect::SglangGrpc));
        assert_eq!(at(&routes, &g, "/grpc.health.v1.Health/Check"), None);
        assert_eq!(at(&routes, &json, "/anything"), Some(Dialect::OpenAiChat));
    }

    /// A `tracestate` is kept, its fields joined, only when all of it is valid.
    #[test]
    fn tracestate_hostile_cases() {
        let state = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append("tracestate", value.parse().unwrap());
            }
            trace_state(&headers)
        };
        let kept = |values: &[&str], expected: &str| {
            assert_eq!(state(values).as_deref(), Some(expected), "{values:?}");
        };
        kept(&["rojo=00f067aa0ba902b7"], "rojo=00f067aa0ba902b7");
        kept(
            &["rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"],
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
        );
        // Fields are one list; optional whitespace and empty members go.
        kept(&["a=1 ,\t, b=2", "c=3"], "a=1,b=2,c=3");
        kept(&["k= v v "], "k= v v");
        kept(
            &["fw529a3039@dt=FW4;0;0;1f;1"],
            "fw529a3039@dt=FW4;0;0;1f;1",
        );
        kept(&["0x@a-b=v", "k*/_-=x y"], "0x@a-b=v,k*/_-=x y");
        let key255 = format!("a{}", "b".repeat(255));
        let value256 = "v".repeat(256);
        let long = format!("{key255}={value256}");
        kept(&[&long], &long);
        let many: Vec<String> = (0..32).map(|i| format!("k{i}=v")).collect();
        kept(&[&many.join(",")], &many.join(","));

        let hostile: Vec<String> = vec![
            String::new(),
            ",,".into(),
            "novalue".into(),
            "k=".into(),
            "=v".into(),
            "K=v".into(),
            "1k=v".into(),
            "k=a=b".into(),
            "k=v,k=w".into(),
            "k=v\u{7f}".into(),
            "@sys=v".into(),
            "t@=v".into(),
            "t@1sys=v".into(),
            format!("t@{}=v", "s".repeat(15)),
            format!("{}@s=v", "t".repeat(242)),
            format!("a{}=v", "b".repeat(256)),
            format!("k={}", "v".repeat(257)),
            (0..33)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(","),
            "good=1,bad key=2".into(),
        ];
        for value in &hostile {
            let Ok(header) = http::HeaderValue::from_str(value) else {
                continue;
            };
            let mut headers = HeaderMap::new();
            headers.insert("tracestate", header);
            assert_eq!(trace_state(&headers), None, "{value:?}");
        }
        // A bad member in a second field drops the whole list.
        assert_eq!(state(&["a=1", "B=2"]), None);
    }

    /// Every way a `traceparent` can be wrong gives no trace context; the valid ones give
    /// exactly their ids.
    #[test]
    fn traceparent_hostile_cases() {
        const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        const SPAN: &str = "00f067aa0ba902b7";
        let valid = format!("00-{TRACE}-{SPAN}-01");
        let expected = TraceContext {
            trace_id: hex::decode(TRACE).unwrap().try_into().unwrap(),
            span_id: hex::decode(SPAN).unwrap().try_into().unwrap(),
        };
        for good in [
            valid.clone(),
            format!("00-{TRACE}-{SPAN}-00"),
            format!("00-{TRACE}-{SPAN}-ff"),
            // A later version: its first four fields, anything after a dash ignored.
            format!("01-{TRACE}-{SPAN}-01"),
            format!("cc-{TRACE}-{SPAN}-01-what-the-future-holds"),
            format!("fe-{TRACE}-{SPAN}-09-"),
        ] {
            assert_eq!(parse_traceparent(good.as_bytes()), Some(expected), "{good}");
        }
        // The flags byte as written; bit 0 is the sampled flag.
        for (flags, byte) in [("00", 0), ("01", 1), ("09", 9), ("ff", 255)] {
            let value = format!("00-{TRACE}-{SPAN}-{flags}");
            assert_eq!(
                parse_traceparent_flags(value.as_bytes()),
                Some((expected, byte))
            );
        }
        let upper = |s: &str| s.to_ascii_uppercase();
        let hostile = [
            String::new(),
            "00".into(),
            valid[..54].to_string(),
            format!("{valid}-"),
            format!("{valid} "),
            format!(" {valid}"),
            format!("{valid},{valid}"),
            format!("00-{}-{SPAN}-01", upper(TRACE)),
            format!("00-{TRACE}-{}-01", upper(SPAN)),
            format!("00-{TRACE}-{SPAN}-0A"),
            format!("0A-{TRACE}-{SPAN}-01"),
            format!("ff-{TRACE}-{SPAN}-01"),
            format!("01-{TRACE}-{SPAN}-01x"),
            format!("00-{}-{SPAN}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("00_{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}_{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}_01"),
            format!("00-{}g-{SPAN}-01", &TRACE[..31]),
            format!("00-{TRACE}-{}+-01", &SPAN[..15]),
            format!("00-{TRACE}-{SPAN}-+1"),
            format!("00-{TRACE}0-{}-01", &SPAN[..15]),
            format!("0-0{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-1"),
            "00-0x1f2f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            "\u{e9}".repeat(55),
            "-".repeat(55),
            format!("00-{TRACE}-{SPAN}-01").replace('a', "\u{e1}"),
        ];
        for bad in &hostile {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
        // Bytes that are no text at all.
        let mut binary = valid.clone().into_bytes();
        binary[10] = 0xff;
        assert_eq!(parse_traceparent(&binary), None);
        assert_eq!(parse_traceparent(&[0u8; 55]), None);
    }

    /// What an accepted value says back: its ids, in the places the spec puts them.
    fn ids_round_trip(value: &[u8], trace: TraceContext) -> bool {
        value[3..35] == *trace.trace_id_hex().as_bytes()
            && value[36..52] == *trace.span_id_hex().as_bytes()
    }

    proptest::proptest! {
        /// Any bytes: no panic, and whatever is accepted holds exactly the ids returned.
        #[test]
        fn any_bytes_parse_without_panic(value in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            if let Some(trace) = parse_traceparent(&value) {
                proptest::prop_assert!(ids_round_trip(&value, trace));
            }
        }

        /// A valid value with one byte changed: accepted only if still a valid value.
        #[test]
        fn one_changed_byte_is_caught(at in 0usize..55, byte in proptest::num::u8::ANY) {
            let mut value = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec();
            value[at] = byte;
            let lower_hex = byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte);
            let still_valid = match at {
                2 | 35 | 52 => byte == b'-',
                0 | 1 => lower_hex && value[..2] != *b"ff",
                _ => lower_hex,
            };
            let parsed = parse_traceparent(&value);
            proptest::prop_assert_eq!(parsed.is_some(), still_valid, "{:?}", String::from_utf8_lossy(&value));
            if let Some(trace) = parsed {
                proptest::prop_assert!(ids_round_trip(&value, trace));
            }
        }
    }

    #[test]
    fn trace_context_from_the_configured_header_once() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traceparent = HeaderName::from_static("traceparent");
        let mut headers = HeaderMap::new();
        assert_eq!(trace_context(&headers, &traceparent), None);
        headers.insert("x-trace", valid.parse().unwrap());
        assert_eq!(trace_context(&headers, &traceparent), None);
        let custom = HeaderName::from_static("x-trace");
        assert!(trace_context(&headers, &custom).is_some());
        headers.insert("traceparent", valid.parse().unwrap());
        assert_eq!(
            trace_context(&headers, &traceparent).map(|t| t.span_id_hex()),
            Some("00f067aa0ba902b7".to_string())
        );
        headers.append("traceparent", valid.parse().unwrap());
        assert_eq!(trace_context(&headers, &traceparent), None, "two values");
    }

    #[test]
    fn tenant_from_header_then_api_key() {
        let key = "sk-secret-123";
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let sources = vec![
            TenantSource::Header(http::HeaderName::from_static("x-tenant-id")),
            TenantSource::ApiKeys(HashMap::from([(digest, "team-a".to_string())])),
        ];
        let mut headers = HeaderMap::new();
        headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
        assert_eq!(tenant_for(&headers, &sources), Some("team-a".into()));
        headers.insert("x-tenant-id", "explicit".parse().unwrap());
        assert_eq!(tenant_for(&headers, &sources), Some("explicit".into()));

        let mut other = HeaderMap::new();
        other.insert("x-api-key", "sk-unknown".parse().unwrap());
        assert_eq!(tenant_for(&other, &sources), None);
        other.insert("x-api-key", key.parse().unwrap());
        assert_eq!(tenant_for(&other, &sources), Some("team-a".into()));
    }
}
