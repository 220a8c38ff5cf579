//! Recorded-style response bodies in `tests/fixtures/<dialect>/`, decoded end to end
//! through `tokentap::wire::response_decoder` and compared with golden signal lists, plus
//! the properties the measurement depends on: any split of a body into frames yields the
//! same signals (compressed bodies too), and no input (arbitrary bytes, mutated fixtures,
//! tiny limits) makes any decoder panic.
//!
//! The directory picks the dialect (`responses`, `anthropic`, `gemini`, `ollama`, `tgi`,
//! `triton`, and the gRPC ones by their names, `sglang_grpc`, `vllm_grpc`, `trtllm_grpc`,
//! `triton_grpc`); in `openai/` the name does: `completions_*` is `/v1/completions`,
//! `chat_*` is `/v1/chat/completions`. The extension picks the content-type as a server
//! would send it: `.sse` is `text/event-stream`, `.json` is `application/json`, `.ndjson`
//! is `application/x-ndjson`, `.grpc` is `application/grpc` (messages sent plain; the
//! gRPC fixtures are built from the engines' message types by `grpc_fixtures.rs`, which
//! also compresses their messages); a further `.gz`, `.br` or `.zst` is the `Content-Encoding`
//! (`tests/fixtures/compress.py` makes those from the plain fixture, flushed per event).
//! Each `NAME.EXT[.ENC]` has a `NAME.golden`, one signal per line (`#` comments and blank
//! lines are ignored):
//!
//! ```text
//! model NAME
//! output KIND TOKENS exact|estimated    KIND: content | reasoning | tool_call | refusal
//! usage in=N out=N                       `-` for a count the body did not give
//! details read=N write=N reasoning=N     cache read / cache write (parts of `in`), reasoning (part of `out`)
//! error CLASS                            CLASS: rate_limited | overloaded | other
//! malformed
//! done
//! finish REASON                          as the response spells it
//! fail REASON                            the decoder stopped: DecodeError::reason()
//! ```

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use proptest::collection::vec;
use proptest::prelude::*;
use tokentap::wire::{
    decoder, response_decoder, DecodeLimits, DecodeOptions, Dialect, Framing, OutputKind, Signal,
};

/// One fixture body with the decoder it is meant for and its golden lines.
pub(super) struct Fixture {
    /// `DIR/FILE`, for messages.
    pub(super) name: String,
    pub(super) dialect: Dialect,
    pub(super) content_type: &'static str,
    /// `Content-Encoding`, if compressed.
    encoding: Option<&'static str>,
    pub(super) body: Vec<u8>,
    pub(super) golden: Vec<String>,
}

impl Fixture {
    fn decode<'a>(
        &self,
        limits: DecodeLimits,
        frames: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<String> {
        decode_response(
            self.dialect,
            self.content_type,
            self.encoding,
            limits,
            frames,
        )
    }
}

pub(super) fn fixture_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The dialect of a fixture from its directory (and, for `openai/`, its name).
fn dialect_of(dir: &str, file: &str) -> Dialect {
    match dir {
        "openai" if file.starts_with("completions_") => Dialect::OpenAiCompletions,
        "openai" if file.starts_with("chat_") => Dialect::OpenAiChat,
        "openai" => panic!("openai/{file}: name must start with chat_ or completions_"),
        "responses" => Dialect::OpenAiResponses,
        "anthropic" => Dialect::Anthropic,
        "gemini" => Dialect::Gemini,
        "ollama" => Dialect::Ollama,
        "tgi" => Dialect::Tgi,
        "triton" => Dialect::Triton,
        other => Dialect::from_name(other)
            .filter(|d| d.is_grpc())
            .unwrap_or_else(|| panic!("tests/fixtures/{other}: unknown dialect directory")),
    }
}

/// Every fixture, sorted by directory and name. Panics on a fixture without a golden, a
/// golden without a fixture, or a file whose name does not say how to decode it.
pub(super) fn fixtures() -> Vec<Fixture> {
    let root = fixture_root();
    let mut dirs: Vec<String> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|entry| entry.expect("dir entry"))
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut all = Vec::new();
    for dir in &dirs {
        let path = root.join(dir);
        let mut names: Vec<String> = fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .map(|entry| {
                entry
                    .expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        let stems: Vec<&str> = names
            .iter()
            .filter(|n| !n.ends_with(".golden"))
            .filter_map(|n| n.split_once('.').map(|(stem, _)| stem))
            .collect();
        for name in &names {
            let Some((stem, ext)) = name.split_once('.') else {
                panic!("{dir}/{name}: no extension");
            };
            if ext == "golden" {
                assert!(
                    stems.contains(&stem),
                    "{dir}/{name}: golden without a fixture"
                );
                continue;
            }
            let (framing, encoding) = ext.split_once('.').unwrap_or((ext, ""));
            let content_type = match framing {
                "sse" => "text/event-stream",
                "json" => "application/json",
                "ndjson" => "application/x-ndjson",
                "grpc" => "application/grpc",
                _ => panic!("{dir}/{name}: unknown fixture extension"),
            };
            let encoding = match encoding {
                "" => None,
                "gz" => Some("gzip"),
                "br" => Some("br"),
                "zst" => Some("zstd"),
                _ => panic!("{dir}/{name}: unknown compression extension"),
            };
            let golden_path = path.join(format!("{stem}.golden"));
            let golden = fs::read_to_string(&golden_path).unwrap_or_else(|e| {
                panic!("{dir}/{name}: no golden ({}): {e}", golden_path.display())
            });
            all.push(Fixture {
                name: format!("{dir}/{name}"),
                dialect: dialect_of(dir, name),
                content_type,
                encoding,
                body: fs::read(path.join(name)).expect("read fixture"),
                golden: golden
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned)
                    .collect(),
            });
        }
    }
    assert!(!all.is_empty(), "no fixtures in {}", root.display());
    all
}

fn render(signal: &Signal) -> String {
    let count = |n: &Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    match signal {
        Signal::Output {
            tokens,
            exact,
            kind,
        } => {
            let kind = match kind {
                OutputKind::Content => "content",
                OutputKind::Reasoning => "reasoning",
                OutputKind::ToolCall => "tool_call",
                OutputKind::Refusal => "refusal",
            };
            let exact = if *exact { "exact" } else { "estimated" };
            format!("output {kind} {tokens} {exact}")
        }
        Signal::Usage {
            input_tokens,
            output_tokens,
        } => format!(
            "usage in={} out={}",
            count(input_tokens),
            count(output_tokens)
        ),
        Signal::Model(model) => format!("model {model}"),
        Signal::Error(class) => format!("error {}", class.as_str()),
        Signal::Malformed => "malformed".to_owned(),
        Signal::Done => "done".to_owned(),
        Signal::TrailingTokens(tokens) => format!("trailing {tokens}"),
        Signal::FinishReason(reason) => format!("finish {reason}"),
        Signal::TokenDetails(d) => format!(
            "details read={} write={} reasoning={}",
            count(&d.cache_read_input),
            count(&d.cache_write_input),
            count(&d.reasoning_output)
        ),
        Signal::EngineTimings(t) => {
            let ms = |d: Option<std::time::Duration>| {
                d.map_or_else(
                    || "-".to_owned(),
                    |d| format!("{:.3}ms", d.as_secs_f64() * 1e3),
                )
            };
            format!(
                "engine queue={} prefill={} first_token={}",
                ms(t.queue),
                ms(t.prefill),
                ms(t.first_token)
            )
        }
    }
}

/// Feed `frames` to a fresh decoder, then finish; the rendered signals, ending with
/// `fail REASON` if the decoder stopped.
pub(super) fn run<'a>(
    mut dec: Box<dyn tokentap::wire::Decoder>,
    frames: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<String> {
    let mut signals = Vec::new();
    let mut result = Ok(());
    for frame in frames {
        result = dec.feed(frame, &mut signals);
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        result = dec.finish(&mut signals);
    }
    let mut lines: Vec<String> = signals.iter().map(render).collect();
    if let Err(e) = result {
        lines.push(format!("fail {}", e.reason()));
    }
    lines
}

/// Decode with the decoder for a dialect and framing (no content-encoding).
fn decode<'a>(
    dialect: Dialect,
    framing: Framing,
    limits: DecodeLimits,
    frames: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<String> {
    run(
        decoder(dialect, framing, DecodeOptions::new(limits)),
        frames,
    )
}

/// Decode as the proxy does: framing from the content-type, decompression from the
/// content-encoding.
fn decode_response<'a>(
    dialect: Dialect,
    content_type: &str,
    encoding: Option<&str>,
    limits: DecodeLimits,
    frames: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<String> {
    let dec = response_decoder(
        dialect,
        content_type,
        encoding.map(str::as_bytes),
        DecodeOptions::new(limits),
    )
    .expect("every fixture is observable");
    run(dec, frames)
}

/// Cut `body` into frames of the given sizes (cycled); `true` adds an empty frame after.
pub(super) fn split<'a>(body: &'a [u8], sizes: &[(usize, bool)]) -> Vec<&'a [u8]> {
    let mut frames = Vec::new();
    let mut rest = body;
    for &(size, then_empty) in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (frame, tail) = rest.split_at(size.clamp(1, rest.len()));
        frames.push(frame);
        if then_empty {
            frames.push(&[][..]);
        }
        rest = tail;
    }
    frames
}

pub(super) fn frame_sizes() -> impl Strategy<Value = Vec<(usize, bool)>> {
    vec((1usize..=64, proptest::bool::weighted(0.1)), 1..32)
}

fn limits() -> impl Strategy<Value = DecodeLimits> {
    prop_oneof![
        Just(DecodeLimits::DEFAULT),
        (1usize..512, 1usize..2048).prop_map(|(e, b)| DecodeLimits {
            max_event_bytes: e,
            max_body_bytes: b,
        }),
    ]
}

#[test]
fn every_fixture_matches_its_golden() {
    let mut failures = Vec::new();
    for fx in fixtures() {
        let got = fx.decode(DecodeLimits::DEFAULT, [&fx.body[..]]);
        if got != fx.golden {
            failures.push(format!(
                "{}:\n  want: {:#?}\n  got:  {:#?}",
                fx.name, fx.golden, got
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_dialect_and_framing_has_fixtures() {
    let all = fixtures();
    for dialect in Dialect::ALL {
        if dialect.is_grpc() {
            // gRPC has one framing; a call without streaming is a stream of one message.
            assert!(
                all.iter()
                    .any(|fx| fx.dialect == dialect && fx.content_type == "application/grpc"),
                "{dialect}: no gRPC fixture"
            );
            continue;
        }
        assert!(
            all.iter()
                .any(|fx| fx.dialect == dialect && fx.content_type != "application/json"),
            "{dialect}: no streamed fixture"
        );
        assert!(
            all.iter()
                .any(|fx| fx.dialect == dialect && fx.content_type == "application/json"),
            "{dialect}: no JSON fixture"
        );
    }
    for encoding in ["gzip", "br", "zstd"] {
        assert!(
            all.iter().any(|fx| fx.encoding == Some(encoding)),
            "no {encoding} fixture"
        );
    }
}

#[test]
fn every_fixture_byte_by_byte_and_at_every_single_cut() {
    for fx in fixtures() {
        let limits = DecodeLimits::DEFAULT;
        let bytes = fx.decode(limits, fx.body.chunks(1));
        assert_eq!(bytes, fx.golden, "{}: one byte per frame", fx.name);
        for cut in 0..=fx.body.len() {
            let (a, b) = fx.body.split_at(cut);
            let got = fx.decode(limits, [a, b]);
            assert_eq!(got, fx.golden, "{}: cut at {cut}", fx.name);
        }
    }
}

/// What a decoded fixture says of its usage in the end, merged as the clock merges it
/// (field by field, the latest report wins): input, output, cache read, cache write,
/// reasoning.
fn final_usage(lines: &[String]) -> [Option<u64>; 5] {
    let mut merged = [None; 5];
    for line in lines {
        let (slots, rest) = if let Some(rest) = line.strip_prefix("usage ") {
            (0..2, rest)
        } else if let Some(rest) = line.strip_prefix("details ") {
            (2..5, rest)
        } else {
            continue;
        };
        for (slot, part) in slots.zip(rest.split(' ')) {
            let value = part.split_once('=').map_or("-", |(_, v)| v);
            if let Ok(n) = value.parse() {
                merged[slot] = Some(n);
            }
        }
    }
    merged
}

/// The JSON documents of a fixture body: SSE `data`, NDJSON lines, or the whole body.
fn documents(fx: &Fixture) -> Vec<serde_json::Value> {
    let text = String::from_utf8(fx.body.clone()).expect("a plain fixture");
    let parse = |s: &str| serde_json::from_str(s.trim()).ok();
    match fx.content_type {
        "text/event-stream" => text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(parse)
            .collect(),
        "application/x-ndjson" => text.lines().filter_map(parse).collect(),
        _ => parse(&text).into_iter().collect(),
    }
}

/// What a usage fixture's last usage must decode to, from that payload (read with the
/// `n` it is given): [in, out, cache read, cache write, reasoning].
type ExpectUsage =
    fn(&serde_json::Value, &dyn Fn(&serde_json::Value, &str) -> u64) -> [Option<u64>; 5];

/// The usage fixtures with cached and reasoning counts: the fixture, the pointer that
/// finds its last usage, and what it must decode to.
const USAGE_FIXTURES: &[(&str, &str, ExpectUsage)] = &[
    (
        "openai/chat_openai_cached_reasoning.sse",
        "/usage/prompt_tokens",
        |u, n| {
            [
                Some(n(u, "/usage/prompt_tokens")),
                Some(n(u, "/usage/completion_tokens")),
                Some(n(u, "/usage/prompt_tokens_details/cached_tokens")),
                None,
                Some(n(u, "/usage/completion_tokens_details/reasoning_tokens")),
            ]
        },
    ),
    (
        "openai/chat_sglang_cache_report.sse",
        "/usage/prompt_tokens",
        |u, n| {
            [
                Some(n(u, "/usage/prompt_tokens")),
                Some(n(u, "/usage/completion_tokens")),
                Some(n(u, "/usage/prompt_tokens_details/cached_tokens")),
                None,
                Some(n(u, "/usage/reasoning_tokens")),
            ]
        },
    ),
    (
        "openai/chat_vllm_prefix_cache_nonstream.json",
        "/usage/prompt_tokens",
        |u, n| {
            [
                Some(n(u, "/usage/prompt_tokens")),
                Some(n(u, "/usage/completion_tokens")),
                Some(n(u, "/usage/prompt_tokens_details/cached_tokens")),
                None,
                None,
            ]
        },
    ),
    (
        "responses/stream_cached_reasoning.sse",
        "/response/usage/input_tokens",
        |u, n| {
            [
                Some(n(u, "/response/usage/input_tokens")),
                Some(n(u, "/response/usage/output_tokens")),
                Some(n(u, "/response/usage/input_tokens_details/cached_tokens")),
                None,
                Some(n(
                    u,
                    "/response/usage/output_tokens_details/reasoning_tokens",
                )),
            ]
        },
    ),
    (
        "anthropic/stream_prompt_cache.sse",
        "/usage/output_tokens",
        |u, n| {
            [
                Some(
                    n(u, "/usage/input_tokens")
                        + n(u, "/usage/cache_creation_input_tokens")
                        + n(u, "/usage/cache_read_input_tokens"),
                ),
                Some(n(u, "/usage/output_tokens")),
                Some(n(u, "/usage/cache_read_input_tokens")),
                Some(n(u, "/usage/cache_creation_input_tokens")),
                None,
            ]
        },
    ),
    (
        "gemini/stream_cached_thinking.sse",
        "/usageMetadata/promptTokenCount",
        |u, n| {
            [
                Some(n(u, "/usageMetadata/promptTokenCount")),
                Some(
                    n(u, "/usageMetadata/candidatesTokenCount")
                        + n(u, "/usageMetadata/thoughtsTokenCount"),
                ),
                Some(n(u, "/usageMetadata/cachedContentTokenCount")),
                None,
                Some(n(u, "/usageMetadata/thoughtsTokenCount")),
            ]
        },
    ),
    (
        "ollama/chat_prompt_cache.ndjson",
        "/prompt_eval_count",
        |u, n| {
            [
                Some(n(u, "/prompt_eval_count")),
                Some(n(u, "/eval_count")),
                Some(n(u, "/prompt_eval_cached_count")),
                None,
                None,
            ]
        },
    ),
];

/// The usage fixtures that carry cached and reasoning counts: the decoder reports exactly
/// the counts the payload states (read here with serde_json, apart from the decoders),
/// and input and output keep their meaning: Anthropic's input is its three input counts
/// added up, Gemini's output its candidates' and thoughts' counts added up, the others'
/// the payload's own input and output counts.
#[test]
fn cached_and_reasoning_counts_are_what_the_payload_states() {
    let n = |v: &serde_json::Value, path: &str| {
        v.pointer(path)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("{path} in {v}"))
    };
    let all = fixtures();
    for &(name, has, expect) in USAGE_FIXTURES {
        let fx = all
            .iter()
            .find(|fx| fx.name == name)
            .unwrap_or_else(|| panic!("no fixture {name}"));
        let last = documents(fx)
            .into_iter()
            .rfind(|d| d.pointer(has).is_some())
            .unwrap_or_else(|| panic!("{name}: no {has}"));
        let want = expect(&last, &n);
        let got = final_usage(&fx.decode(DecodeLimits::DEFAULT, [&fx.body[..]]));
        assert_eq!(
            got, want,
            "{name}: [in, out, cache read, cache write, reasoning]"
        );
    }
}

/// Compress `body` as a streaming server would: `pieces` flushes, then the end.
fn compress(encoding: &str, body: &[u8], pieces: &[(usize, bool)]) -> Vec<u8> {
    let frames = split(body, pieces);
    match encoding {
        "gzip" => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            for frame in frames {
                enc.write_all(frame).expect("compress");
                enc.flush().expect("flush");
            }
            enc.finish().expect("finish")
        }
        "deflate" => {
            let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            for frame in frames {
                enc.write_all(frame).expect("compress");
                enc.flush().expect("flush");
            }
            enc.finish().expect("finish")
        }
        "zstd" => {
            let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).expect("encoder");
            for frame in frames {
                enc.write_all(frame).expect("compress");
                enc.flush().expect("flush");
            }
            enc.finish().expect("finish")
        }
        other => panic!("no compressor for {other}"),
    }
}

fn plain_fixtures() -> Vec<Fixture> {
    fixtures()
        .into_iter()
        .filter(|fx| fx.encoding.is_none())
        .collect()
}

fn encoding() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("gzip"), Just("deflate"), Just("zstd")]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_split_of_a_fixture_gives_its_golden(index in any::<prop::sample::Index>(), sizes in frame_sizes()) {
        let all = fixtures();
        let fx = &all[index.index(all.len())];
        let got = fx.decode(DecodeLimits::DEFAULT, split(&fx.body, &sizes));
        prop_assert_eq!(&got, &fx.golden, "{}", fx.name);
    }

    #[test]
    fn any_compression_of_a_fixture_split_anywhere_gives_its_golden(
        index in any::<prop::sample::Index>(),
        flushes in frame_sizes(),
        sizes in frame_sizes(),
        encoding in encoding(),
    ) {
        let all = plain_fixtures();
        let fx = &all[index.index(all.len())];
        let compressed = compress(encoding, &fx.body, &flushes);
        let got = decode_response(
            fx.dialect,
            fx.content_type,
            Some(encoding),
            DecodeLimits::DEFAULT,
            split(&compressed, &sizes),
        );
        prop_assert_eq!(&got, &fx.golden, "{} ({})", fx.name, encoding);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_ignore_splits(
        body in sse_soup(),
        sizes in frame_sizes(),
        limits in limits(),
    ) {
        for framing in Framing::ALL {
            for dialect in Dialect::ALL {
                let whole = decode(dialect, framing, limits, [&body[..]]);
                let cut = decode(dialect, framing, limits, split(&body, &sizes));
                prop_assert_eq!(whole, cut, "{} {:?}", dialect, framing);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_compressed_never_panic_and_ignore_splits(
        body in sse_soup(),
        flushes in frame_sizes(),
        sizes in frame_sizes(),
        limits in limits(),
        encoding in encoding(),
    ) {
        let compressed = compress(encoding, &body, &flushes);
        for (dialect, content_type) in [
            (Dialect::OpenAiChat, "text/event-stream"),
            (Dialect::Anthropic, "text/event-stream"),
            (Dialect::Ollama, "application/x-ndjson"),
            (Dialect::Gemini, "application/json"),
            (Dialect::Tgi, "application/json"),
        ] {
            let whole = decode_response(dialect, content_type, Some(encoding), limits, [&compressed[..]]);
            let cut = decode_response(dialect, content_type, Some(encoding), limits, split(&compressed, &sizes));
            prop_assert_eq!(whole, cut, "{} {}", dialect, encoding);
        }
    }

    #[test]
    fn arbitrary_bytes_into_a_decompressor_never_panic(
        body in vec(any::<u8>(), 0..512),
        sizes in frame_sizes(),
        encoding in prop_oneof![Just("gzip"), Just("deflate"), Just("br"), Just("zstd")],
        prefix in prop_oneof![
            Just(&b""[..]),
            Just(&b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"[..]),
            Just(&b"\x28\xb5\x2f\xfd"[..]),
            Just(&b"\x78\x9c"[..]),
        ],
    ) {
        let body = [prefix, &body[..]].concat();
        for dialect in Dialect::ALL {
            let framings: &[&str] = if dialect.is_grpc() {
                &["application/grpc"]
            } else {
                &["text/event-stream", "application/json", "application/x-ndjson"]
            };
            for framing in framings {
                decode_response(dialect, framing, Some(encoding), DecodeLimits::DEFAULT, split(&body, &sizes));
            }
        }
    }

    #[test]
    fn mutated_fixtures_never_panic_and_ignore_splits(
        index in any::<prop::sample::Index>(),
        mutations in vec(mutation(), 1..8),
        sizes in frame_sizes(),
        limits in limits(),
    ) {
        let all = fixtures();
        let fx = &all[index.index(all.len())];
        let mut body = fx.body.clone();
        for m in &mutations {
            m.apply(&mut body);
        }
        if fx.encoding.is_some() {
            // A corrupt compressed body only has to be survived: where the inflater
            // notices corruption can depend on the split.
            fx.decode(limits, split(&body, &sizes));
        } else {
            for framing in Framing::ALL {
                let whole = decode(fx.dialect, framing, limits, [&body[..]]);
                let cut = decode(fx.dialect, framing, limits, split(&body, &sizes));
                prop_assert_eq!(whole, cut, "{} {:?}", fx.name, framing);
            }
        }
    }
}

/// Bytes that look enough like SSE carrying OpenAI chunks to reach the deep code paths,
/// mixed with noise.
fn sse_soup() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(&b"data: "[..]),
        Just(&b"data:"[..]),
        Just(&b"data"[..]),
        Just(&b"\n"[..]),
        Just(&b"\n\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"\r\n"[..]),
        Just(&b": keep-alive"[..]),
        Just(&b"event: error"[..]),
        Just(&b"id: 7"[..]),
        Just(&b"retry: 100"[..]),
        Just(&b"\xEF\xBB\xBF"[..]),
        Just(&b"[DONE]"[..]),
        Just(&br#"{"model":"m","choices":[{"delta":{"content":"x"},"logprobs":{"content":[{}]}}]}"#[..]),
        Just(&br#"{"choices":[{"delta":{"reasoning":"r","tool_calls":[{"function":{"arguments":"{"}}]}}]}"#[..]),
        Just(&br#"{"choices":[{"text":"t","logprobs":{"tokens":["a","b"]}}]}"#[..]),
        Just(&br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}"#[..]),
        Just(&br#"{"timings":{"prompt_n":1,"cache_n":2,"predicted_n":3}}"#[..]),
        Just(&br#"{"error":{"message":"x"}}"#[..]),
        Just(&b"event: content_block_delta"[..]),
        Just(&b"event: response.output_text.delta"[..]),
        Just(&br#"{"type":"response.output_text.delta","delta":"x","logprobs":[{},{}]}"#[..]),
        Just(&br#"{"type":"response.completed","response":{"model":"m","usage":{"input_tokens":1,"output_tokens":2}}}"#[..]),
        Just(&br#"{"type":"message_start","message":{"model":"c","usage":{"input_tokens":3,"cache_read_input_tokens":4}}}"#[..]),
        Just(&br#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"t"}}"#[..]),
        Just(&br#"{"type":"message_delta","usage":{"output_tokens":7}}"#[..]),
        Just(&br#"{"candidates":[{"content":{"parts":[{"text":"g","thought":true},{"functionCall":{}}]}}],"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":5}}"#[..]),
        Just(&br#"{"model":"o","message":{"content":"c","thinking":"t","tool_calls":[{}]},"done":true,"eval_count":3}"#[..]),
        Just(&br#"{"token":{"id":1,"text":"x","special":true},"details":{"generated_tokens":2,"input_length":1}}"#[..]),
        Just(&br#"{"model_name":"e","text_output":"x"}"#[..]),
        Just(&b"["[..]),
        Just(&b"]"[..]),
        Just(&b","[..]),
    ]
    .prop_map(<[u8]>::to_vec);
    let noise = prop_oneof![
        "[{}\\[\\]\":,.0-9a-z \\\\-]{0,12}".prop_map(String::into_bytes),
        vec(any::<u8>(), 0..12),
    ];
    vec(prop_oneof![3 => piece, 1 => noise], 0..64).prop_map(|pieces| pieces.concat())
}

/// One edit to a fixture body; positions wrap around the body length.
#[derive(Clone, Debug)]
enum Mutation {
    Set(usize, u8),
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    Duplicate(usize, usize),
}

impl Mutation {
    fn apply(&self, body: &mut Vec<u8>) {
        let len = body.len();
        let at = |pos: usize| if len == 0 { 0 } else { pos % len };
        match self {
            Mutation::Set(pos, byte) => {
                let i = at(*pos);
                if let Some(b) = body.get_mut(i) {
                    *b = *byte;
                }
            }
            Mutation::Delete(pos, len) => {
                let i = at(*pos);
                let end = (i + len).min(body.len());
                body.drain(i..end);
            }
            Mutation::Insert(pos, bytes) => {
                let i = at(*pos);
                body.splice(i..i, bytes.iter().copied());
            }
            Mutation::Duplicate(pos, len) => {
                let i = at(*pos);
                let end = (i + len).min(body.len());
                let copy = body[i..end].to_vec();
                body.splice(end..end, copy);
            }
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let special = prop_oneof![
        Just(b'\n'),
        Just(b'\r'),
        Just(b':'),
        Just(b'"'),
        Just(b'{'),
        Just(b'}'),
        Just(b'\\'),
        Just(0xEF),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<usize>(), special).prop_map(|(p, b)| Mutation::Set(p, b)),
        (any::<usize>(), 0usize..64).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (any::<usize>(), vec(any::<u8>(), 0..16)).prop_map(|(p, v)| Mutation::Insert(p, v)),
        (any::<usize>(), 0usize..256).prop_map(|(p, n)| Mutation::Duplicate(p, n)),
    ]
}
