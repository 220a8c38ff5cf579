//! The fuzz checks of `fuzz/src/lib.rs`, on a fixed budget of generated inputs, in every
//! `cargo test`: every decoder (each dialect and framing, and compressed bodies) and the
//! request scanner get arbitrary bytes and mutated recorded fixtures; each must decode a
//! body cut into arbitrary frames exactly as it decodes it whole, never panic, and (the
//! scanner) agree with serde_json about `model` and `stream`. The gRPC dialects also get
//! generated message streams (from the engines' own message types), framed, compressed
//! and split at random, whose exact token counts must add up to the ids sent.
//!
//! The coverage-guided version of the same checks is `scripts/fuzz.sh` (cargo-fuzz). The
//! budget here is `TOKENTAP_FUZZ_CASES` cases per property (default 256).

// `check_dialect` serves the per-dialect cargo-fuzz targets only.
#[allow(dead_code)]
#[path = "../../fuzz/src/lib.rs"]
mod checks;

use std::path::Path;

use proptest::prelude::*;
use tokentap::wire::{
    decoder, framing_for, DecodeLimits, DecodeOptions, Dialect, Framing, Signal, TokenDetails,
};

fn cases() -> u32 {
    std::env::var("TOKENTAP_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A recorded fixture: its dialect, framing, content coding (if compressed) and bytes.
#[derive(Clone, Debug)]
struct Fixture {
    name: String,
    dialect: Dialect,
    framing: Framing,
    coding: Option<u8>,
    content_type: u8,
    bytes: Vec<u8>,
}

fn dialect_of(dir: &str, file: &str) -> Option<Dialect> {
    match dir {
        "openai" if file.starts_with("completions") => Some(Dialect::OpenAiCompletions),
        "openai" => Some(Dialect::OpenAiChat),
        "responses" => Some(Dialect::OpenAiResponses),
        other => Dialect::from_name(other),
    }
}

/// Every response fixture under tests/fixtures (goldens and scripts skipped).
fn fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    let root = Path::new("tests/fixtures");
    for dir in std::fs::read_dir(root).expect("tests/fixtures") {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let dir_name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for file in std::fs::read_dir(&dir).unwrap() {
            let path = file.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let Some(dialect) = dialect_of(&dir_name, &name) else {
                continue;
            };
            let mut parts = name.rsplit('.');
            let last = parts.next().unwrap_or("");
            let (ext, coding) = match last {
                "gz" => (parts.next().unwrap_or(""), Some(0u8)),
                "br" => (parts.next().unwrap_or(""), Some(2)),
                "zst" => (parts.next().unwrap_or(""), Some(3)),
                other => (other, None),
            };
            let (content_type, ctype_index) = match ext {
                "sse" => ("text/event-stream", 0u8),
                "json" => ("application/json", 1),
                "ndjson" => ("application/x-ndjson", 2),
                "grpc" => ("application/grpc", 0),
                _ => continue,
            };
            let Some(framing) = framing_for(dialect, content_type) else {
                continue;
            };
            out.push(Fixture {
                name: format!("{dir_name}/{name}"),
                dialect,
                framing,
                coding,
                content_type: ctype_index,
                bytes: std::fs::read(&path).unwrap(),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(out.len() >= 20, "found only {} fixtures", out.len());
    out
}

/// The low bits of a decoder input's first byte for a fixture: its framing, or for a gRPC
/// dialect its `grpc-encoding` (0, identity: the fixtures are sent plain).
fn framing_bits(fixture: &Fixture) -> u8 {
    if fixture.dialect.is_grpc() {
        return 0;
    }
    Framing::ALL
        .iter()
        .position(|f| *f == fixture.framing)
        .unwrap() as u8
}

/// One edit of a byte string.
#[derive(Clone, Debug)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Insertions favour the bytes that matter to the framings.
    let interesting = prop_oneof![
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"data: ".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b"[".to_vec()),
        Just(b",".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"\xff".to_vec()),
        Just(b"\xef\xbb\xbf".to_vec()),
        proptest::collection::vec(any::<u8>(), 1..16),
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Flip(at, b)),
        (any::<usize>(), interesting).prop_map(|(at, b)| Edit::Insert(at, b)),
        (any::<usize>(), 1usize..64).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), 1usize..256).prop_map(|(at, n)| Edit::Duplicate(at, n)),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, edits: &[Edit]) {
    for edit in edits {
        let len = bytes.len().max(1);
        match edit {
            Edit::Flip(at, b) => {
                if !bytes.is_empty() {
                    let i = at % bytes.len();
                    bytes[i] ^= b | 1;
                }
            }
            Edit::Insert(at, b) => {
                let i = at % (bytes.len() + 1);
                bytes.splice(i..i, b.iter().copied());
            }
            Edit::Delete(at, n) => {
                let i = at % len;
                let end = (i + n).min(bytes.len());
                if i < end {
                    bytes.drain(i..end);
                }
            }
            Edit::Duplicate(at, n) => {
                let i = at % len;
                let end = (i + n).min(bytes.len());
                if i < end {
                    let copy = bytes[i..end].to_vec();
                    bytes.splice(end..end, copy);
                }
            }
            Edit::Truncate(at) => bytes.truncate(at % len),
        }
    }
}

/// Every fixture as recorded, under many splits and every limit selector from the
/// default down to 8-byte events: whole and split decoding agree.
#[test]
fn every_fixture_decodes_the_same_however_it_is_split() {
    let mut runs = 0;
    for fixture in fixtures().into_iter().filter(|f| f.coding.is_none()) {
        for seed in (0..=255u8).step_by(7) {
            for limits in [0u8, 1, 3, 6, 9, 12, 17, 40] {
                let mut input = vec![framing_bits(&fixture) | (limits << 2), seed];
                input.extend_from_slice(&fixture.bytes);
                checks::check_decoder(fixture.dialect, &input);
                runs += 1;
            }
        }
    }
    assert!(runs > 1000);
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary bytes, any dialect, framing, limits and split.
    #[test]
    fn decoders_agree_on_arbitrary_bytes(
        select in any::<u8>(),
        seed in any::<u8>(),
        which in any::<u8>(),
        body in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut input = vec![select, seed, which];
        input.extend_from_slice(&body);
        checks::check_any_dialect(&input);
    }

    /// Recorded fixtures with a few random edits (flips, structural bytes inserted,
    /// ranges deleted or duplicated, truncation), any limits and split.
    #[test]
    fn decoders_agree_on_mutated_fixtures(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec(edit(), 1..6),
        limits in 0u8..64,
        seed in any::<u8>(),
        other_framing in any::<bool>(),
        framing in 0u8..4,
    ) {
        let fixtures = plain_fixtures();
        let fixture = pick.get(fixtures);
        let mut bytes = fixture.bytes.clone();
        apply(&mut bytes, &edits);
        // Now and then the wrong framing for the body (for gRPC, another encoding).
        let framing = if other_framing { framing } else { framing_bits(fixture) };
        let mut input = vec![framing | (limits << 2), seed];
        input.extend_from_slice(&bytes);
        checks::check_decoder(fixture.dialect, &input);
    }

    /// Compressed bodies: recorded compressed fixtures (mutated or not), plaintext
    /// fixtures compressed by the harness, and arbitrary bytes as a compressed stream.
    #[test]
    fn compressed_bodies_never_panic_and_agree(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec(edit(), 0..4),
        mode in 0u8..3,
        coding in 0u8..4,
        seed in any::<u8>(),
        noise in proptest::collection::vec(any::<u8>(), 0..1024),
    ) {
        let all = all_fixtures();
        let fixture = pick.get(all);
        let dialect = Dialect::ALL.iter().position(|d| *d == fixture.dialect).unwrap() as u8;
        let (select, mut body) = match (mode, fixture.coding) {
            // The recorded compressed bytes (or a plaintext fixture under a coding).
            (0, Some(c)) => (c, fixture.bytes.clone()),
            (0, None) | (1, _) => (coding | 4, plain_of(fixture)),
            _ => (coding, noise),
        };
        apply(&mut body, &edits);
        let mut input = vec![select | (dialect << 3), seed, fixture.content_type];
        input.extend_from_slice(&body);
        checks::check_compressed(&input);
    }

    /// Response heads with rate-limit fields (well-formed, odd, or overwritten with
    /// arbitrary bytes) into the rate-limit reader.
    #[test]
    fn rate_limits_report_only_what_was_sent(
        status in prop::sample::select(vec![200u16, 429, 503, 404, 502, 504]),
        fields in proptest::collection::vec(
            (
                prop::sample::select(vec![
                    "x-ratelimit-limit-requests", "x-ratelimit-remaining-tokens",
                    "x-ratelimit-remaining-images", "anthropic-ratelimit-input-tokens-limit",
                    "anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-tokens-reset",
                    "retry-after", "retry-after-ms", "x-ratelimit-", "anthropic-ratelimit--",
                ]),
                prop_oneof![
                    any::<u64>().prop_map(|n| n.to_string()),
                    "[ -~]{0,24}",
                    Just("18446744073709551616".to_string()),
                    // Waits as floats (`retry-after-ms`), huge ones included: `1e308`
                    // once panicked the conversion to a `Duration`.
                    any::<f64>().prop_map(|f| f.to_string()),
                    (0u32..400).prop_map(|e| format!("1e{e}")),
                ],
            ),
            0..8,
        ),
        noise in proptest::collection::vec(any::<u8>(), 0..64),
        overwrite in any::<bool>(),
    ) {
        let mut head = format!("HTTP/1.1 {status} X\r\n").into_bytes();
        for (name, value) in &fields {
            head.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if overwrite && !noise.is_empty() {
            let at = head.len() / 2;
            head.splice(at..at.min(head.len()), noise.iter().copied());
        }
        head.extend_from_slice(b"\r\n");
        checks::check_rate_limits(&head);
    }

    /// Arbitrary bytes as a gRPC body, or cut into messages the harness frames and
    /// compresses, for every gRPC dialect and encoding.
    #[test]
    fn grpc_bodies_agree_on_arbitrary_bytes(
        select in any::<u8>(),
        seed in any::<u8>(),
        body in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut input = vec![select, seed];
        input.extend_from_slice(&body);
        checks::check_grpc(&input);
    }

    /// Streams of the SMG engines' own `GenerateResponse`s (chunks, completes and
    /// undecodable messages), compressed or not, split anywhere: one exact output event
    /// per chunk with ids, whose counts add up to the ids sent, one end per complete, and
    /// the cached and reasoning counts the messages state (any `uint32`).
    #[test]
    fn smg_streams_count_every_token_id(
        engine in 0usize..3,
        encoding in prop::sample::select(checks::ENCODINGS.to_vec()),
        messages in proptest::collection::vec(smg_message(), 0..12),
        seed in any::<u8>(),
    ) {
        let dialect = [Dialect::SglangGrpc, Dialect::VllmGrpc, Dialect::TrtllmGrpc][engine];
        let encoded: Vec<Vec<u8>> = messages.iter().map(|m| m.encode(dialect)).collect();
        let body = checks::grpc_body(encoding, encoded.iter().map(Vec::as_slice));
        let signals = decode_grpc(dialect, encoding, &body, seed);
        let sent: u64 = messages.iter().map(SmgMessage::ids).sum();
        let mut counted = 0u64;
        for signal in &signals {
            if let Signal::Output { tokens, exact, .. } = signal {
                prop_assert!(*exact);
                prop_assert!(*tokens > 0);
                counted += u64::from(*tokens);
            }
        }
        prop_assert_eq!(counted, sent);
        let count = |want: &Signal| signals.iter().filter(|s| *s == want).count();
        let completes = messages.iter().filter(|m| matches!(m, SmgMessage::Complete(..))).count();
        let garbage = messages.iter().filter(|m| matches!(m, SmgMessage::Garbage(_))).count();
        prop_assert_eq!(count(&Signal::Done), completes);
        prop_assert_eq!(count(&Signal::Malformed), garbage);
        // The cached and reasoning counts, merged as the clock merges them, are what the
        // messages stated; each report changes something.
        let mut merged = TokenDetails::default();
        for signal in &signals {
            if let Signal::TokenDetails(details) = signal {
                let before = merged;
                merged.merge(**details);
                prop_assert_ne!(merged, before);
            }
        }
        prop_assert_eq!(merged, SmgMessage::details(&messages, dialect));
    }

    /// Streams of Triton's `ModelStreamInferResponse`s: each response with token ids is one
    /// exact event of that many tokens; one with only text, one estimated event.
    #[test]
    fn triton_streams_count_every_output_id(
        encoding in prop::sample::select(checks::ENCODINGS.to_vec()),
        responses in proptest::collection::vec(triton_response(), 0..12),
        seed in any::<u8>(),
    ) {
        let encoded: Vec<Vec<u8>> = responses.iter().map(TritonResponse::encode).collect();
        let body = checks::grpc_body(encoding, encoded.iter().map(Vec::as_slice));
        let signals = decode_grpc(Dialect::TritonGrpc, encoding, &body, seed);
        let outputs: Vec<(u32, bool)> = signals
            .iter()
            .filter_map(|s| match s {
                Signal::Output { tokens, exact, .. } => Some((*tokens, *exact)),
                _ => None,
            })
            .collect();
        let expected: Vec<(u32, bool)> = responses.iter().filter_map(TritonResponse::output).collect();
        prop_assert_eq!(outputs, expected);
    }

    /// Arbitrary bytes into the request scanner.
    #[test]
    fn request_scanner_never_panics_and_is_split_invariant(
        seed in any::<u8>(),
        body in proptest::collection::vec(any::<u8>(), 0..1024),
    ) {
        let mut input = vec![seed];
        input.extend_from_slice(&body);
        checks::check_request_scanner(&input);
    }

    /// Generated JSON request bodies, with `model` and `stream` at the top level, nested,
    /// inside strings, missing, or of the wrong type, compact or pretty: the scanner
    /// agrees with serde_json.
    #[test]
    fn request_scanner_agrees_with_serde_json(
        members in request_body(),
        pretty in any::<bool>(),
        seed in any::<u8>(),
    ) {
        // By hand, so that the members keep the generated order (serde_json's map sorts
        // its keys unless built with `preserve_order`).
        let (open, colon, comma, close) = if pretty {
            ("{\n  ", ": ", ",\n  ", "\n}\n")
        } else {
            ("{", ":", ",", "}")
        };
        let text = format!(
            "{open}{}{close}",
            members
                .iter()
                .map(|(k, v)| format!("{}{colon}{}", serde_json::Value::from(k.as_str()), v))
                .collect::<Vec<_>>()
                .join(comma)
        );
        let mut input = vec![seed];
        input.extend_from_slice(text.as_bytes());
        checks::check_request_scanner(&input);
    }
}

fn all_fixtures() -> &'static [Fixture] {
    static ALL: std::sync::OnceLock<Vec<Fixture>> = std::sync::OnceLock::new();
    ALL.get_or_init(fixtures)
}

fn plain_fixtures() -> &'static [Fixture] {
    static PLAIN: std::sync::OnceLock<Vec<Fixture>> = std::sync::OnceLock::new();
    PLAIN.get_or_init(|| {
        all_fixtures()
            .iter()
            .filter(|f| f.coding.is_none())
            .cloned()
            .collect()
    })
}

/// The plaintext of a fixture (the recorded plain twin of a compressed one).
fn plain_of(fixture: &Fixture) -> Vec<u8> {
    if fixture.coding.is_none() {
        return fixture.bytes.clone();
    }
    let stem = fixture.name.rsplit_once('.').map_or("", |(s, _)| s);
    plain_fixtures()
        .iter()
        .find(|f| f.name == stem)
        .map_or_else(Vec::new, |f| f.bytes.clone())
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        tricky_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..4)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("model".to_string()),
        Just("stream".to_string()),
        Just("messages".to_string()),
        Just("content".to_string()),
        "[a-z_]{1,20}",
    ]
}

fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ._/-]{0,40}",
        Just("\"model\": \"decoy\"".to_string()),
        Just("{\"stream\": true}".to_string()),
        Just("back\\slash \"quote\" \n newline \t tab".to_string()),
        Just("é € 日本 🦀".to_string()),
        "[a-z]{250,260}",
        any::<String>(),
    ]
}

/// A request body's members, in order: the top-level `model` and `stream` may be
/// anything (or missing), among other members that may hold decoys.
fn request_body() -> impl Strategy<Value = Vec<(String, serde_json::Value)>> {
    use serde_json::Value;
    let model = prop_oneof![
        3 => tricky_string().prop_map(|s| Some(Value::String(s))),
        1 => json_value().prop_map(Some),
        1 => Just(None),
    ];
    let stream = prop_oneof![
        3 => any::<bool>().prop_map(|b| Some(Value::Bool(b))),
        1 => json_value().prop_map(Some),
        1 => Just(None),
    ];
    (
        proptest::collection::vec((key(), json_value()), 0..5),
        model,
        stream,
        0usize..6,
        0usize..6,
    )
        .prop_map(|(members, model, stream, model_at, stream_at)| {
            let mut members: Vec<(String, Value)> = members
                .into_iter()
                .filter(|(k, _)| k != "model" && k != "stream")
                .collect();
            if let Some(model) = model {
                let at = model_at.min(members.len());
                members.insert(at, ("model".to_string(), model));
            }
            if let Some(stream) = stream {
                let at = stream_at.min(members.len());
                members.insert(at, ("stream".to_string(), stream));
            }
            members
        })
}

/// Decode a gRPC body whole and split (from `seed`): the same signals, and no error.
fn decode_grpc(dialect: Dialect, encoding: &str, body: &[u8], seed: u8) -> Vec<Signal> {
    let options = DecodeOptions {
        grpc_encoding: Some(encoding.as_bytes()),
        ..DecodeOptions::new(DecodeLimits::DEFAULT)
    };
    let make = || decoder(dialect, Framing::Grpc, options);
    let whole = checks::decode(make(), [body]);
    let split = checks::decode(make(), checks::frames(body, seed));
    assert_eq!(whole, split, "{dialect} {encoding}: whole and split differ");
    assert_eq!(whole.1, None, "{dialect} {encoding}");
    whole.0
}

/// One message of an SMG engine's `Generate` stream.
#[derive(Clone, Debug)]
enum SmgMessage {
    /// Ids, prompt tokens, cached tokens.
    Chunk(Vec<u32>, u32, u32),
    /// Prompt, completion, cached and (SGLang) reasoning tokens, finish reason.
    Complete(u32, u32, u32, u32, &'static str),
    /// Bytes that are no protobuf message: a varint that never ends.
    Garbage(Vec<u8>),
}

impl SmgMessage {
    fn ids(&self) -> u64 {
        match self {
            SmgMessage::Chunk(ids, ..) => ids.len() as u64,
            _ => 0,
        }
    }

    /// The cached and reasoning counts a stream of these messages states, as the decoder
    /// documents them: the cached count of the first chunk with a prompt count (when not
    /// 0) and of every complete with one (the latest wins); SGLang's reasoning summed over the
    /// completes, as of the last complete with a prompt count.
    fn details(messages: &[SmgMessage], dialect: Dialect) -> TokenDetails {
        let mut details = TokenDetails::default();
        let (mut input_seen, mut reasoning) = (false, 0u64);
        for message in messages {
            match message {
                SmgMessage::Chunk(_, prompt, cached) if *prompt > 0 && !input_seen => {
                    input_seen = true;
                    if *cached > 0 {
                        details.cache_read_input = Some(u64::from(*cached));
                    }
                }
                SmgMessage::Complete(prompt, _, cached, r, _) => {
                    reasoning += u64::from(*r);
                    if *prompt > 0 {
                        details.cache_read_input = Some(u64::from(*cached));
                        if dialect == Dialect::SglangGrpc {
                            details.reasoning_output = Some(reasoning);
                        }
                    }
                }
                _ => {}
            }
        }
        details
    }

    fn encode(&self, dialect: Dialect) -> Vec<u8> {
        use prost::Message;
        use tokentap::wire::grpc::proto::sglang::grpc::scheduler as sglang;
        use tokentap::wire::grpc::proto::trtllm;
        use tokentap::wire::grpc::proto::vllm::grpc::engine as vllm;
        let (ids, prompt, completion, cached, reasoning, finish) = match self {
            SmgMessage::Garbage(bytes) => return bytes.clone(),
            SmgMessage::Chunk(ids, prompt, cached) => {
                (Some(ids.clone()), *prompt, 0, *cached, 0, "")
            }
            SmgMessage::Complete(prompt, completion, cached, reasoning, finish) => {
                (None, *prompt, *completion, *cached, *reasoning, *finish)
            }
        };
        match (dialect, ids) {
            (Dialect::SglangGrpc, Some(token_ids)) => sglang::GenerateResponse {
                request_id: "r".into(),
                response: Some(sglang::generate_response::Response::Chunk(
                    sglang::GenerateStreamChunk {
                        token_ids,
                        prompt_tokens: prompt,
                        cached_tokens: cached,
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
            (Dialect::SglangGrpc, None) => sglang::GenerateResponse {
                request_id: "r".into(),
                response: Some(sglang::generate_response::Response::Complete(
                    sglang::GenerateComplete {
                        prompt_tokens: prompt,
                        completion_tokens: completion,
                        cached_tokens: cached,
                        reasoning_tokens: reasoning,
                        finish_reason: finish.into(),
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
            (Dialect::VllmGrpc, Some(token_ids)) => vllm::GenerateResponse {
                response: Some(vllm::generate_response::Response::Chunk(
                    vllm::GenerateStreamChunk {
                        token_ids,
                        prompt_tokens: prompt,
                        cached_tokens: cached,
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
            (Dialect::VllmGrpc, None) => vllm::GenerateResponse {
                response: Some(vllm::generate_response::Response::Complete(
                    vllm::GenerateComplete {
                        prompt_tokens: prompt,
                        completion_tokens: completion,
                        cached_tokens: cached,
                        finish_reason: finish.into(),
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
            (_, Some(token_ids)) => trtllm::GenerateResponse {
                request_id: "t".into(),
                response: Some(trtllm::generate_response::Response::Chunk(
                    trtllm::GenerateStreamChunk {
                        token_ids,
                        prompt_tokens: prompt,
                        cached_tokens: cached,
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
            (_, None) => trtllm::GenerateResponse {
                request_id: "t".into(),
                response: Some(trtllm::generate_response::Response::Complete(
                    trtllm::GenerateComplete {
                        prompt_tokens: prompt,
                        completion_tokens: completion,
                        cached_tokens: cached,
                        finish_reason: finish.into(),
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
        }
    }
}

fn smg_message() -> impl Strategy<Value = SmgMessage> {
    prop_oneof![
        4 => (proptest::collection::vec(any::<u32>(), 0..8), 0u32..64, any::<u32>())
            .prop_map(|(ids, prompt, cached)| SmgMessage::Chunk(ids, prompt, cached)),
        1 => (
            0u32..64,
            0u32..64,
            any::<u32>(),
            any::<u32>(),
            prop::sample::select(vec!["stop", "length", "abort", "error"]),
        )
            .prop_map(|(p, c, cached, r, f)| SmgMessage::Complete(p, c, cached, r, f)),
        1 => proptest::collection::vec(0x80u8..=0xff, 1..12).prop_map(SmgMessage::Garbage),
    ]
}

/// One message of Triton's `ModelStreamInfer` stream.
#[derive(Clone, Debug)]
struct TritonResponse {
    error: bool,
    /// `output_ids` as INT32 (raw or typed), if sent.
    ids: Option<(Vec<i32>, bool)>,
    text: Vec<String>,
}

impl TritonResponse {
    /// The output event it should give: (tokens, exact).
    fn output(&self) -> Option<(u32, bool)> {
        if self.error {
            return None;
        }
        match &self.ids {
            Some((ids, _)) => (!ids.is_empty()).then_some((ids.len() as u32, true)),
            // Text is estimated: a token per word (the texts are `[a-z ]`), at least 1.
            None => self.text.iter().any(|t| !t.is_empty()).then(|| {
                let words = self.text.iter().map(|t| t.split_whitespace().count());
                (words.sum::<usize>().max(1) as u32, false)
            }),
        }
    }

    fn encode(&self) -> Vec<u8> {
        use prost::Message;
        use tokentap::wire::grpc::proto::inference::model_infer_response::InferOutputTensor;
        use tokentap::wire::grpc::proto::inference::{
            InferTensorContents, ModelInferResponse, ModelStreamInferResponse,
        };
        if self.error {
            return ModelStreamInferResponse {
                error_message: "failed".into(),
                infer_response: None,
            }
            .encode_to_vec();
        }
        let mut outputs = vec![InferOutputTensor {
            name: "text_output".into(),
            datatype: "BYTES".into(),
            shape: vec![self.text.len() as i64],
            ..Default::default()
        }];
        let mut raw = vec![self
            .text
            .iter()
            .flat_map(|t| [&(t.len() as u32).to_le_bytes()[..], t.as_bytes()].concat())
            .collect::<Vec<u8>>()];
        if let Some((ids, typed)) = &self.ids {
            if *typed {
                // Typed contents for every output, then: no raw bytes at all.
                raw.clear();
                outputs[0].contents = Some(InferTensorContents {
                    bytes_contents: self.text.iter().map(|t| t.as_bytes().to_vec()).collect(),
                    ..Default::default()
                });
                outputs.push(InferOutputTensor {
                    name: "output_ids".into(),
                    datatype: "INT32".into(),
                    shape: vec![1, 1, ids.len() as i64],
                    contents: Some(InferTensorContents {
                        int_contents: ids.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            } else {
                outputs.push(InferOutputTensor {
                    name: "output_ids".into(),
                    datatype: "INT32".into(),
                    shape: vec![1, 1, ids.len() as i64],
                    ..Default::default()
                });
                raw.push(ids.iter().flat_map(|i| i.to_le_bytes()).collect());
            }
        }
        ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(ModelInferResponse {
                model_name: "ensemble".into(),
                outputs,
                raw_output_contents: raw,
                ..Default::default()
            }),
        }
        .encode_to_vec()
    }
}

fn triton_response() -> impl Strategy<Value = TritonResponse> {
    (
        proptest::bool::weighted(0.1),
        proptest::option::of((proptest::collection::vec(any::<i32>(), 0..6), any::<bool>())),
        proptest::collection::vec("[a-z ]{0,4}", 0..3),
    )
        .prop_map(|(error, ids, text)| TritonResponse { error, ids, text })
}
