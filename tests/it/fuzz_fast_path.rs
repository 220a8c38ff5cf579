//! The fast path's fuzz checks (`fuzz/src/fast_path.rs`) on a fixed budget in every
//! `cargo test`: arbitrary bytes, and ordinary requests and responses with bytes changed,
//! through the request head reader, the chunked reader and the response reader. The
//! coverage-guided run of the same checks is `scripts/fuzz.sh --target fast_path`. The
//! budget is `TOKENTAP_FUZZ_CASES` cases per property (default 256).

#[path = "../../fuzz/src/fast_path.rs"]
mod checks;

use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("TOKENTAP_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Ordinary inputs to start from: requests with each framing (some pipelined) and
/// responses with each framing.
const SEEDS: [&[u8]; 8] = [
    b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\n{}\r\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, x-a\r\nX-A: 1\r\nTE: trailers\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {}\n\n",
    b"HTTP/1.0 204 No Content\r\nConnection: keep-alive\r\n\r\n",
];

fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(SEEDS.to_vec()),
        proptest::collection::vec(
            (any::<proptest::sample::Index>(), any::<u8>(), 0u8..3),
            0..4,
        ),
        any::<[u8; 2]>(),
    )
        .prop_map(|(seed, edits, prefix)| {
            let mut input = seed.to_vec();
            for (at, byte, how) in edits {
                let at = at.index(input.len().max(1)).min(input.len());
                match how {
                    0 if at < input.len() => input[at] = byte,
                    1 => input.insert(at, byte),
                    _ if at < input.len() => {
                        input.remove(at);
                    }
                    _ => {}
                }
            }
            let mut data = prefix.to_vec();
            data.extend_from_slice(&input);
            data
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        checks::check_fast_path(&data);
    }

    #[test]
    fn mutated_requests_and_responses(data in mutated()) {
        checks::check_fast_path(&data);
    }
}

/// The unmutated seeds pass the checks (and are forwarded or framed, not refused).
#[test]
fn seeds_pass() {
    for seed in SEEDS {
        for selector in 0..4u8 {
            let mut data = vec![selector, 7];
            data.extend_from_slice(seed);
            checks::check_fast_path(&data);
        }
    }
}

/// A head just under `max_header_bytes` whose `Host` grows in the rewrite goes upstream
/// just over the limit; reading it again decides the same (found by the fuzzer in CI).
#[test]
fn head_at_the_limit_grows_with_the_upstream_host() {
    let start = b"GET / HTTP/1.1\r\nHost: a\r\nX: ";
    let mut data = vec![0, 0];
    data.extend_from_slice(start);
    data.resize(2 + 8190 - 4, b'y');
    data.extend_from_slice(b"\r\n\r\n");
    checks::check_fast_path(&data);
}

/// httparse skips empty lines before a request line, so a head can start with `PRI `
/// after them; what goes upstream then starts with it (found by the fuzzer in CI).
#[test]
fn a_pri_request_after_an_empty_line() {
    let mut data = vec![0, 0];
    data.extend_from_slice(b"\r\nPRI / HTTP/1.1\r\nHost: a\r\n\r\n");
    checks::check_fast_path(&data);
}
