//! Recorded-style response bodies in `tests/fixtures/openai/`, decoded end to end through
//! `tokentap::wire::decoder` and compared with golden signal lists, plus the properties the
//! measurement depends on: any split of a body into frames yields the same signals, and no
//! input (arbitrary bytes, mutated fixtures, tiny limits) makes a decoder panic.
//!
//! Fixture names pick the decoder: `completions_*` is `/v1/completions`, `chat_*` is
//! `/v1/chat/completions`; `.sse` is a stream, `.json` a non-streaming body. Each
//! `NAME.sse` / `NAME.json` has a `NAME.golden`, one signal per line (`#` comments and
//! blank lines are ignored):
//!
//! ```text
//! model NAME
//! output KIND TOKENS exact|estimated    KIND: content | reasoning | tool_call | refusal
//! usage in=N out=N                       `-` for a count the body did not give
//! error
//! malformed
//! done
//! fail REASON                            the decoder stopped: DecodeError::reason()
//! ```

use std::fs;
use std::path::PathBuf;

use proptest::collection::vec;
use proptest::prelude::*;
use tokentap::wire::{decoder, DecodeLimits, Dialect, Framing, OutputKind, Signal};

/// One fixture body with the decoder it is meant for and its golden lines.
struct Fixture {
    name: String,
    dialect: Dialect,
    framing: Framing,
    body: Vec<u8>,
    golden: Vec<String>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openai")
}

/// Every fixture in the directory, sorted by name. Panics on a fixture without a golden,
/// a golden without a fixture, or a file whose name does not say how to decode it.
fn fixtures() -> Vec<Fixture> {
    let dir = fixture_dir();
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    let mut all = Vec::new();
    for name in &names {
        let Some((stem, ext)) = name.rsplit_once('.') else {
            panic!("{name}: no extension");
        };
        let framing = match ext {
            "sse" => Framing::Sse,
            "json" => Framing::Json,
            "golden" => {
                let has_body = [".sse", ".json"]
                    .iter()
                    .any(|ext| names.contains(&format!("{stem}{ext}")));
                assert!(has_body, "{name}: golden without a fixture");
                continue;
            }
            _ => panic!("{name}: unknown fixture extension"),
        };
        let dialect = if stem.starts_with("completions_") {
            Dialect::OpenAiCompletions
        } else if stem.starts_with("chat_") {
            Dialect::OpenAiChat
        } else {
            panic!("{name}: name must start with chat_ or completions_");
        };
        let golden_path = dir.join(format!("{stem}.golden"));
        let golden = fs::read_to_string(&golden_path)
            .unwrap_or_else(|e| panic!("{name}: no golden ({}): {e}", golden_path.display()));
        all.push(Fixture {
            name: name.clone(),
            dialect,
            framing,
            body: fs::read(dir.join(name)).expect("read fixture"),
            golden: golden
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect(),
        });
    }
    assert!(!all.is_empty(), "no fixtures in {}", dir.display());
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
        Signal::Error => "error".to_owned(),
        Signal::Malformed => "malformed".to_owned(),
        Signal::Done => "done".to_owned(),
    }
}

/// Feed `frames` to a fresh decoder, then finish; the rendered signals, ending with
/// `fail REASON` if the decoder stopped.
fn decode<'a>(
    dialect: Dialect,
    framing: Framing,
    limits: DecodeLimits,
    frames: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<String> {
    let mut dec = decoder(dialect, framing, limits);
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

/// Cut `body` into frames of the given sizes (cycled); `true` adds an empty frame after.
fn split<'a>(body: &'a [u8], sizes: &[(usize, bool)]) -> Vec<&'a [u8]> {
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

fn frame_sizes() -> impl Strategy<Value = Vec<(usize, bool)>> {
    vec((1usize..=64, proptest::bool::weighted(0.1)), 1..32)
}

fn limits() -> impl Strategy<Value = DecodeLimits> {
    prop_oneof![
        Just(DecodeLimits::default()),
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
        let got = decode(
            fx.dialect,
            fx.framing,
            DecodeLimits::default(),
            [&fx.body[..]],
        );
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
fn every_fixture_byte_by_byte_and_at_every_single_cut() {
    for fx in fixtures() {
        let limits = DecodeLimits::default();
        let bytes = decode(fx.dialect, fx.framing, limits, fx.body.chunks(1));
        assert_eq!(bytes, fx.golden, "{}: one byte per frame", fx.name);
        for cut in 0..=fx.body.len() {
            let (a, b) = fx.body.split_at(cut);
            let got = decode(fx.dialect, fx.framing, limits, [a, b]);
            assert_eq!(got, fx.golden, "{}: cut at {cut}", fx.name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_split_of_a_fixture_gives_its_golden(index in any::<prop::sample::Index>(), sizes in frame_sizes()) {
        let all = fixtures();
        let fx = &all[index.index(all.len())];
        let got = decode(fx.dialect, fx.framing, DecodeLimits::default(), split(&fx.body, &sizes));
        prop_assert_eq!(&got, &fx.golden, "{}", fx.name);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_ignore_splits(
        body in sse_soup(),
        sizes in frame_sizes(),
        limits in limits(),
    ) {
        for framing in [Framing::Sse, Framing::Json] {
            for dialect in [Dialect::OpenAiChat, Dialect::OpenAiCompletions] {
                let whole = decode(dialect, framing, limits, [&body[..]]);
                let cut = decode(dialect, framing, limits, split(&body, &sizes));
                prop_assert_eq!(whole, cut);
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
        for framing in [Framing::Sse, Framing::Json] {
            let whole = decode(fx.dialect, framing, limits, [&body[..]]);
            let cut = decode(fx.dialect, framing, limits, split(&body, &sizes));
            prop_assert_eq!(whole, cut, "{}", fx.name);
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
