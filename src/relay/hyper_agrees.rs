//! The request head reader against hyper's own server, configured as tokentap's is: for
//! every head (sent in one write) the fast path does not hand off, hyper accepts it (and parses the same
//! method, target and fields) exactly when the fast path forwards it, answers exactly
//! what the fast path's rejection is when it rejects it, and waits for more exactly when
//! the fast path does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::request_head::tests::{check, table, RULES};
use super::request_head::{rejection, Decision, HeadReader, HeadRules};
use crate::config::{Config, Overrides};

/// What hyper's server did with one connection's bytes.
#[derive(Debug)]
enum HyperSaw {
    /// It called the service with this head.
    Accepted(Method, Uri, HeaderMap),
    /// It answered by itself with these bytes.
    Answered(Vec<u8>),
    /// It closed without answering.
    Closed,
}

fn config() -> Config {
    config_for(&RULES)
}

/// tokentap's configuration with the limits of `rules`.
fn config_for(rules: &HeadRules<'_>) -> Config {
    let yaml = format!(
        "upstream: http://127.0.0.1:1\nlimits:\n  max_headers: {}\n  max_header_bytes: {}\n",
        rules.max_headers, rules.max_header_bytes
    );
    Config::from_yaml(&yaml, "test.yaml", &Overrides::default()).expect("valid config")
}

/// Send `input` to a hyper server built as tokentap builds its own, then half-close.
async fn through_hyper(config: &Config, input: &[u8]) -> HyperSaw {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let builder = crate::server::connection_builder(config);
    let seen: Arc<Mutex<Option<(Method, Uri, HeaderMap)>>> = Arc::default();
    let service_seen = seen.clone();
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let (parts, _) = request.into_parts();
            *service_seen.lock().expect("lock") = Some((parts.method, parts.uri, parts.headers));
            async { Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new()))) }
        });
        let _ = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .await;
    });
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client.write_all(input).await.expect("write");
    client.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer));
    // A reset after the answer still leaves the answer.
    let _ = read.await.expect("hyper answers or closes in time");
    server.abort();
    if let Some((method, uri, headers)) = seen.lock().expect("lock").take() {
        return HyperSaw::Accepted(method, uri, headers);
    }
    if answer.is_empty() {
        HyperSaw::Closed
    } else {
        HyperSaw::Answered(answer)
    }
}

/// The fast path's decision on `input` agrees with what hyper did.
fn agrees(input: &[u8], saw: &HyperSaw) -> Result<(), String> {
    agrees_under(input, saw, &RULES)
}

fn agrees_under(input: &[u8], saw: &HyperSaw, rules: &HeadRules<'_>) -> Result<(), String> {
    let shown = String::from_utf8_lossy(input);
    match (HeadReader::new().decide(input, rules), saw) {
        (Decision::HandOff(_), _) => Ok(()),
        (Decision::Forward(head), HyperSaw::Accepted(method, uri, headers)) => {
            if (&head.method, &head.uri, &head.headers) == (method, uri, headers) {
                Ok(())
            } else {
                Err(format!(
                    "{shown:?}: parsed {head:?}, hyper {method} {uri} {headers:?}"
                ))
            }
        }
        (Decision::Reject(status), HyperSaw::Answered(bytes)) if *bytes == rejection(status) => {
            Ok(())
        }
        (Decision::NeedMore, HyperSaw::Closed) => Ok(()),
        (decision, HyperSaw::Answered(bytes)) => Err(format!(
            "{shown:?}: fast path {decision:?}, hyper answered {:?}",
            String::from_utf8_lossy(bytes)
        )),
        (decision, saw) => Err(format!("{shown:?}: fast path {decision:?}, hyper {saw:?}")),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn every_table_row_agrees_with_hyper() {
    let config = config();
    let runtime = runtime();
    let mut disagreements = Vec::new();
    for (input, expected) in table() {
        check(input.as_bytes(), expected);
        let saw = runtime.block_on(through_hyper(&config, input.as_bytes()));
        if let Err(err) = agrees(input.as_bytes(), &saw) {
            disagreements.push(err);
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

/// Too many fields: hyper's `431`, at the same count.
#[test]
fn too_many_fields_agree_with_hyper() {
    let rules = HeadRules {
        max_headers: 3,
        ..RULES
    };
    let config = config_for(&rules);
    let runtime = runtime();
    let mut seen_431 = false;
    for fields in 1..6 {
        let mut input = b"GET /v1/models HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 1..fields {
            input.extend_from_slice(format!("X-{i}: {i}\r\n").as_bytes());
        }
        input.extend_from_slice(b"\r\n");
        seen_431 |= matches!(HeadReader::new().decide(&input, &rules), Decision::Reject(status) if status.as_u16() == 431);
        let saw = runtime.block_on(through_hyper(&config, &input));
        if let Err(err) = agrees_under(&input, &saw, &rules) {
            panic!("{err}");
        }
    }
    assert!(seen_431, "no head had too many fields");
}

/// Pieces of request heads, ordinary and hostile, that the generator strings together.
fn head() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        Just("GET"),
        Just("POST"),
        Just("HEAD"),
        Just("CONNECT"),
        Just("G(T"),
        Just("get"),
        Just(""),
    ];
    let target = prop_oneof![
        Just("/"),
        Just("/v1/chat/completions?x=1"),
        Just("*"),
        Just("http://a/b"),
        Just("/a b"),
        Just("/%zz"),
        Just("/\u{e9}"),
        Just("//x"),
    ];
    let version = prop_oneof![
        Just("HTTP/1.1"),
        Just("HTTP/1.0"),
        Just("HTTP/2.0"),
        Just("HTTP/1.2"),
        Just("http/1.1"),
    ];
    let field = prop_oneof![
        Just("Host: a"),
        Just("host:b"),
        Just("Content-Length: 3"),
        Just("Content-Length: 03"),
        Just("Content-Length: 3, 3"),
        Just("Content-Length: x"),
        Just("Transfer-Encoding: chunked"),
        Just("Transfer-Encoding: identity"),
        Just("Transfer-Encoding: gzip, chunked"),
        Just("Connection: close"),
        Just("Connection: keep-alive, x-a"),
        Just("Connection: upgrade"),
        Just("Upgrade: websocket"),
        Just("Expect: 100-continue"),
        Just("TE: trailers"),
        Just("X-A: 1"),
        Just("X-A : 1"),
        Just(" X-Fold: 1"),
        Just("X-B:\t tab \t"),
        Just("X-C: caf\u{e9}"),
        Just("X-D: a\u{1}b"),
        Just("X-E: a\u{0}b"),
        Just("X-F: a\u{7f}b"),
        Just(": v"),
        Just("X-G"),
        Just("Proxy-Authorization: s"),
    ];
    let end = prop_oneof![4 => Just("\r\n"), 1 => Just("\n"), 1 => Just("\r")];
    (
        method,
        target,
        version,
        end.clone(),
        proptest::collection::vec((field, end.clone()), 0..6),
        end,
        any::<bool>(),
        0usize..4,
    )
        .prop_map(
            |(method, target, version, line_end, fields, last_end, leading, cut)| {
                let mut head = Vec::new();
                if leading {
                    head.extend_from_slice(b"\r\n");
                }
                head.extend_from_slice(format!("{method} {target} {version}{line_end}").as_bytes());
                for (field, end) in fields {
                    head.extend_from_slice(field.as_bytes());
                    head.extend_from_slice(end.as_bytes());
                }
                head.extend_from_slice(last_end.as_bytes());
                // Sometimes the connection ends before the head does.
                head.truncate(head.len().saturating_sub(cut));
                head
            },
        )
}

/// A table head with one byte replaced, inserted or removed.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let rows: Vec<Vec<u8>> = table()
        .iter()
        .map(|(input, _)| input.as_bytes().to_vec())
        .filter(|input| !input.is_empty())
        .collect();
    (
        proptest::sample::select(rows),
        any::<proptest::sample::Index>(),
        any::<u8>(),
        0u8..3,
    )
        .prop_map(|(mut input, at, byte, how)| {
            let at = at.index(input.len());
            match how {
                0 => input[at] = byte,
                1 => input.insert(at, byte),
                _ => {
                    input.remove(at);
                }
            }
            input
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Table heads with one byte changed: wherever the fast path decides, hyper agrees.
    #[test]
    fn mutated_heads_agree_with_hyper(input in mutated()) {
        let saw = runtime().block_on(through_hyper(&config(), &input));
        if let Err(err) = agrees(&input, &saw) {
            return Err(TestCaseError::fail(err));
        }
    }

    /// Generated heads: wherever the fast path decides, hyper does the same.
    #[test]
    fn generated_heads_agree_with_hyper(input in head()) {
        let saw = runtime().block_on(through_hyper(&config(), &input));
        if let Err(err) = agrees(&input, &saw) {
            return Err(TestCaseError::fail(err));
        }
    }
}

/// The relay forwards a request head with the same fields removed as the hyper path: every
/// hop-by-hop field of the one table, what `Connection` names, and all of `TE` but
/// `trailers`.
#[test]
fn both_transports_remove_the_same_hop_by_hop_fields() {
    let mut input = String::from("POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n");
    for (name, _) in crate::intermediary::HOP_BY_HOP {
        match name {
            // These make the relay hand the request to hyper (or frame its body).
            "upgrade" | "transfer-encoding" => {}
            "connection" => input.push_str("Connection: keep-alive, x-named\r\n"),
            "te" => input.push_str("TE: trailers, deflate\r\n"),
            _ => input.push_str(&format!("{name}: 1\r\n")),
        }
    }
    input.push_str("X-Named: 1\r\nX-End-To-End: kept\r\n\r\n");
    let Decision::Forward(head) = HeadReader::new().decide(input.as_bytes(), &RULES) else {
        panic!("the relay takes {input:?}");
    };
    let mut expected = head.headers.clone();
    crate::intermediary::strip_hop_by_hop(&mut expected);
    let forwarded = String::from_utf8_lossy(&head.upstream_head).to_ascii_lowercase();
    let mut names: Vec<String> = forwarded
        .lines()
        .skip(1)
        .filter_map(|line| line.split_once(':').map(|(name, _)| name.to_string()))
        .collect();
    names.sort();
    let mut kept: Vec<String> = expected.keys().map(|name| name.to_string()).collect();
    kept.sort();
    kept.dedup();
    assert_eq!(names, kept, "{forwarded}");
    assert!(forwarded.contains("te: trailers\r\n"), "{forwarded}");
}
