//! `observe.tokenizer`: with a tokenizer, the events whose wire format gives no exact
//! count are counted incrementally (still `exact: false`), so that the counts of one
//! response (with the tokens only its end settles, for the last event) add up to what its
//! whole text encodes to; exact counts are left alone; and without one (the default) the
//! decoders do nothing extra.
//!
//! Expected counts are computed here independently of the decoders: the fixture's events
//! are read with `serde_json`, their output texts picked out per dialect, and encoded with
//! `tiktoken-rs` directly.
//!
//! The cost check counts heap allocations per thread (a counting global allocator) and
//! asserts that decoding a long stream with `tokenizer: None` allocates exactly as the
//! plain decoder does (nothing per event); it prints ns/event with and without a
//! tokenizer (`cargo test --test tokenizer -- --nocapture`), but asserts nothing about
//! time.

use crate::common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, Proxy, ScriptedBackend, Step};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;
use tiktoken_rs::CoreBPE;
use tokentap::wire::{
    decoder, DecodeLimits, DecodeOptions, Dialect, Framing, OutputKind, Signal, Tokenizer,
};

// ---- counting allocator: allocations made by the current thread ----

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// ---- expected counts, independently of the decoders ----

fn o200k() -> CoreBPE {
    tiktoken_rs::o200k_base().expect("o200k_base ships in the crate")
}

/// The JSON payloads of a body: SSE `data:` lines, or NDJSON lines.
fn payloads(body: &[u8], framing: Framing) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("utf-8 fixture");
    text.lines()
        .filter_map(|line| match framing {
            Framing::Sse => line.strip_prefix("data:").map(str::trim),
            _ => Some(line.trim()),
        })
        .filter(|data| !data.is_empty() && *data != "[DONE]")
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

fn push_text(value: Option<&Value>, texts: &mut Vec<String>) {
    match value {
        Some(Value::String(s)) => texts.push(s.clone()),
        Some(Value::Array(items)) => {
            for item in items {
                if let Some(s) = item.as_str() {
                    texts.push(s.to_string());
                }
            }
        }
        _ => {}
    }
}

fn push_arguments(value: Option<&Value>, texts: &mut Vec<String>) {
    match value {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => texts.push(s.clone()),
        Some(other) => texts.push(serde_json::to_string(other).unwrap()),
    }
}

/// The output texts of one event, as each dialect's docs define them.
fn event_texts(dialect: Dialect, event: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    match dialect {
        Dialect::Anthropic => {
            if event["type"] == "content_block_delta" {
                for key in ["text", "thinking", "partial_json"] {
                    push_text(event["delta"].get(key), &mut texts);
                }
            }
        }
        Dialect::OpenAiResponses => {
            let kind = event["type"].as_str().unwrap_or("");
            let delta_events = [
                "response.output_text.delta",
                "response.refusal.delta",
                "response.function_call_arguments.delta",
                "response.reasoning_text.delta",
                "response.reasoning_summary_text.delta",
            ];
            if delta_events.contains(&kind) {
                push_text(event.get("delta"), &mut texts);
            }
        }
        Dialect::OpenAiChat => {
            for choice in event["choices"].as_array().into_iter().flatten() {
                let delta = &choice["delta"];
                for key in ["content", "refusal", "reasoning_content", "reasoning"] {
                    push_text(delta.get(key), &mut texts);
                }
                for call in delta["tool_calls"].as_array().into_iter().flatten() {
                    push_text(call["function"].get("name"), &mut texts);
                    push_arguments(call["function"].get("arguments"), &mut texts);
                }
            }
        }
        Dialect::OpenAiCompletions => {
            for choice in event["choices"].as_array().into_iter().flatten() {
                push_text(choice.get("text"), &mut texts);
            }
        }
        Dialect::Ollama => {
            push_text(event.get("response"), &mut texts);
            push_text(event.get("thinking"), &mut texts);
            let message = &event["message"];
            push_text(message.get("content"), &mut texts);
            push_text(message.get("thinking"), &mut texts);
            for call in message["tool_calls"].as_array().into_iter().flatten() {
                push_text(call["function"].get("name"), &mut texts);
                push_arguments(call["function"].get("arguments"), &mut texts);
            }
        }
        Dialect::Triton => push_text(event.get("text_output"), &mut texts),
        Dialect::Gemini => {
            for candidate in event["candidates"].as_array().into_iter().flatten() {
                let parts = candidate["content"]["parts"].as_array();
                for part in parts.into_iter().flatten() {
                    push_text(part.get("text"), &mut texts);
                    if let Some(call) = part.get("functionCall") {
                        push_text(call.get("name"), &mut texts);
                        push_arguments(call.get("args"), &mut texts);
                    }
                }
            }
        }
        Dialect::Tgi => unreachable!("TGI counts are exact"),
        // Protobuf messages, not JSON events; Triton's text is counted in its unit tests.
        Dialect::SglangGrpc | Dialect::VllmGrpc | Dialect::TrtllmGrpc | Dialect::TritonGrpc => {
            unreachable!("gRPC messages carry token ids or tensors, not JSON events")
        }
    }
    texts.retain(|t| !t.is_empty());
    texts
}

/// Per-event token counts the tokenizer should give: one entry per event with output text.
fn expected_counts(dialect: Dialect, framing: Framing, body: &[u8], bpe: &CoreBPE) -> Vec<u32> {
    payloads(body, framing)
        .iter()
        .map(|event| event_texts(dialect, event))
        .filter(|texts| !texts.is_empty())
        .map(|texts| {
            texts
                .iter()
                .map(|t| bpe.encode_ordinary(t).len() as u32)
                .sum()
        })
        .collect()
}

/// The tokens of the response's whole text: every event's output texts, in order, as
/// one text. What the per-event counts of one response add up to.
fn whole_text_count(dialect: Dialect, framing: Framing, body: &[u8], bpe: &CoreBPE) -> u32 {
    let text: String = payloads(body, framing)
        .iter()
        .flat_map(|event| event_texts(dialect, event))
        .collect();
    bpe.encode_ordinary(&text).len() as u32
}

// ---- decoding ----

fn decode(
    dialect: Dialect,
    framing: Framing,
    body: &[u8],
    tokenizer: Option<&Tokenizer>,
) -> Vec<Signal> {
    let mut dec = decoder(
        dialect,
        framing,
        DecodeOptions {
            tokenizer,
            ..DecodeOptions::new(DecodeLimits::DEFAULT)
        },
    );
    let mut out = Vec::new();
    // Awkward frames: the counts must not depend on them.
    for frame in body.chunks(7) {
        dec.feed(frame, &mut out).expect("within limits");
    }
    dec.finish(&mut out).expect("finish");
    out
}

fn outputs(signals: &[Signal]) -> Vec<(u32, bool, OutputKind)> {
    signals
        .iter()
        .filter_map(|s| match s {
            Signal::Output {
                tokens,
                exact,
                kind,
            } => Some((*tokens, *exact, *kind)),
            _ => None,
        })
        .collect()
}

/// The per-event counts, with the tokens only the end settled added to the last event
/// (where the clock puts them).
fn settled_counts(signals: &[Signal]) -> Vec<u32> {
    let mut counts: Vec<u32> = outputs(signals).iter().map(|o| o.0).collect();
    for signal in signals {
        if let (Signal::TrailingTokens(tokens), Some(last)) = (signal, counts.last_mut()) {
            *last += tokens;
        }
    }
    counts
}

/// Everything but the per-event counts: the tokenizer changes nothing else.
fn without_counts(signals: &[Signal]) -> Vec<Signal> {
    signals
        .iter()
        .filter(|s| !matches!(s, Signal::TrailingTokens(_)))
        .map(|s| match s {
            Signal::Output { exact, kind, .. } => Signal::Output {
                tokens: 0,
                exact: *exact,
                kind: *kind,
            },
            other => other.clone(),
        })
        .collect()
}

const BATCHED: &[(&str, Dialect, Framing)] = &[
    (
        "anthropic/stream_text.sse",
        Dialect::Anthropic,
        Framing::Sse,
    ),
    (
        "anthropic/stream_thinking.sse",
        Dialect::Anthropic,
        Framing::Sse,
    ),
    (
        "anthropic/stream_tool_use.sse",
        Dialect::Anthropic,
        Framing::Sse,
    ),
    (
        "responses/stream_text.sse",
        Dialect::OpenAiResponses,
        Framing::Sse,
    ),
    (
        "responses/stream_reasoning_tool_call.sse",
        Dialect::OpenAiResponses,
        Framing::Sse,
    ),
    (
        "openai/chat_openai_include_usage.sse",
        Dialect::OpenAiChat,
        Framing::Sse,
    ),
    (
        "openai/chat_openai_tool_calls.sse",
        Dialect::OpenAiChat,
        Framing::Sse,
    ),
    (
        "openai/chat_deepseek_reasoning.sse",
        Dialect::OpenAiChat,
        Framing::Sse,
    ),
    (
        "openai/completions_openai.sse",
        Dialect::OpenAiCompletions,
        Framing::Sse,
    ),
    (
        "ollama/chat_stream.ndjson",
        Dialect::Ollama,
        Framing::Ndjson,
    ),
    (
        "ollama/chat_tool_calls.ndjson",
        Dialect::Ollama,
        Framing::Ndjson,
    ),
    (
        "ollama/generate_thinking.ndjson",
        Dialect::Ollama,
        Framing::Ndjson,
    ),
    ("triton/generate_stream.sse", Dialect::Triton, Framing::Sse),
];

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("tests/fixtures/{name}")).expect("fixture")
}

#[test]
fn batched_deltas_count_as_their_encoded_length() {
    let tokenizer = Tokenizer::encoding("o200k_base").expect("o200k");
    let bpe = o200k();
    let mut several = false;
    for &(name, dialect, framing) in BATCHED {
        let body = fixture(name);
        let plain = decode(dialect, framing, &body, None);
        let tokenized = decode(dialect, framing, &body, Some(&tokenizer));
        // Without a tokenizer the counts are estimated from each event's text (a word
        // or symbol a token), close to the tokenizer's on these English fixtures.
        assert!(
            outputs(&plain)
                .iter()
                .all(|&(k, exact, _)| k >= 1 && !exact),
            "{name}: {plain:?}"
        );
        let guessed: u32 = outputs(&plain).iter().map(|o| o.0).sum();
        let counted: u32 = outputs(&tokenized).iter().map(|o| o.0).sum();
        assert!(
            guessed * 2 >= counted && guessed <= counted * 2,
            "{name}: text estimate {guessed} vs o200k {counted}"
        );
        // One count per event with text, adding up to the whole text's count (not to
        // the sum of each delta counted alone).
        let events = expected_counts(dialect, framing, &body, &bpe).len();
        let got = settled_counts(&tokenized);
        assert_eq!(got.len(), events, "{name}");
        assert_eq!(
            got.iter().sum::<u32>(),
            whole_text_count(dialect, framing, &body, &bpe),
            "{name}: {got:?}"
        );
        assert!(
            outputs(&tokenized).iter().all(|o| !o.1),
            "{name}: a tokenizer count is an estimate"
        );
        assert_eq!(
            without_counts(&tokenized),
            without_counts(&plain),
            "{name}: only the counts change"
        );
        several |= got.iter().any(|&k| k > 1);
    }
    assert!(several, "some deltas hold several tokens");
}

#[test]
fn cl100k_counts_differ_where_the_encodings_do() {
    let cl100k = Tokenizer::encoding("cl100k_base").expect("cl100k");
    let bpe = tiktoken_rs::cl100k_base().expect("cl100k");
    let body = fixture("ollama/chat_stream.ndjson");
    let got = settled_counts(&decode(
        Dialect::Ollama,
        Framing::Ndjson,
        &body,
        Some(&cl100k),
    ));
    assert_eq!(
        got.iter().sum::<u32>(),
        whole_text_count(Dialect::Ollama, Framing::Ndjson, &body, &bpe)
    );
}

#[test]
fn exact_counts_are_never_recounted() {
    let tokenizer = Tokenizer::encoding("o200k_base").expect("o200k");
    for (name, dialect, framing) in [
        ("gemini/stream_sse.sse", Dialect::Gemini, Framing::Sse),
        (
            "gemini/stream_function_call.json",
            Dialect::Gemini,
            Framing::JsonArray,
        ),
        (
            "openai/chat_openai_logprobs.sse",
            Dialect::OpenAiChat,
            Framing::Sse,
        ),
        (
            "openai/chat_vllm_continuous_usage.sse",
            Dialect::OpenAiChat,
            Framing::Sse,
        ),
        (
            "openai/completions_vllm_logprobs.sse",
            Dialect::OpenAiCompletions,
            Framing::Sse,
        ),
        ("tgi/generate_stream.sse", Dialect::Tgi, Framing::Sse),
    ] {
        let body = fixture(name);
        assert_eq!(
            decode(dialect, framing, &body, Some(&tokenizer)),
            decode(dialect, framing, &body, None),
            "{name}"
        );
    }
}

#[test]
fn gemini_without_usage_counts_text_and_function_calls() {
    // No usageMetadata and no logprobs: nothing exact, so the tokenizer counts.
    let body = concat!(
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Let me think about the weather in Paris.\",\"thought\":true}],\"role\":\"model\"}}],\"modelVersion\":\"gemini-2.5-flash\"}\r\n\r\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\",\"unit\":\"celsius\"}}}],\"role\":\"model\"}}]}\r\n\r\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"It is sunny and 21 degrees.\"}],\"role\":\"model\"},\"finishReason\":\"STOP\"}]}\r\n\r\n",
    );
    let tokenizer = Tokenizer::encoding("o200k_base").expect("o200k");
    let bpe = o200k();
    let signals = decode(
        Dialect::Gemini,
        Framing::Sse,
        body.as_bytes(),
        Some(&tokenizer),
    );
    let got: Vec<(bool, OutputKind)> = outputs(&signals)
        .iter()
        .map(|&(_, exact, kind)| (exact, kind))
        .collect();
    assert_eq!(
        got,
        vec![
            (false, OutputKind::Reasoning),
            (false, OutputKind::ToolCall),
            (false, OutputKind::Content),
        ]
    );
    let counts = settled_counts(&signals);
    assert!(counts.iter().all(|&k| k > 0), "{counts:?}");
    assert_eq!(
        counts.iter().sum::<u32>(),
        whole_text_count(Dialect::Gemini, Framing::Sse, body.as_bytes(), &bpe)
    );
}

/// A long Anthropic stream: `message_start`, then `events` text deltas of a few words.
fn long_stream(events: usize) -> Vec<u8> {
    let mut body = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4-20250514\",\"usage\":{\"input_tokens\":21,\"output_tokens\":1}}}\n\n",
    );
    let words = [
        " the quick brown",
        " fox jumps",
        " over the lazy dog,",
        " again and again.",
    ];
    for i in 0..events {
        body.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"");
        body.push_str(words[i % words.len()]);
        body.push_str("\"}}\n\n");
    }
    body.into_bytes()
}

/// Decode `body` in 4 KiB frames with a warmed-up decoder; returns (allocations made
/// while feeding after the first frame, time, output tokens).
fn run(make: impl Fn() -> Box<dyn tokentap::wire::Decoder>, body: &[u8]) -> (u64, Duration, u64) {
    let mut dec = make();
    let mut out = Vec::with_capacity(1024);
    let mut frames = body.chunks(4096);
    // The first frame grows the buffers and sends the model once.
    dec.feed(frames.next().expect("a frame"), &mut out)
        .expect("feed");
    out.clear();
    let mut tokens = 0u64;
    let before = allocations();
    let started = Instant::now();
    for frame in frames {
        dec.feed(frame, &mut out).expect("feed");
        for signal in out.drain(..) {
            if let Signal::Output { tokens: k, .. } = signal {
                tokens += u64::from(k);
            }
        }
    }
    (allocations() - before, started.elapsed(), tokens)
}

#[test]
fn default_off_costs_nothing_per_event() {
    const EVENTS: usize = 20_000;
    let body = long_stream(EVENTS);
    let options = DecodeOptions::new(DecodeLimits::DEFAULT);
    let plain = || decoder(Dialect::Anthropic, Framing::Sse, options);
    let off = || {
        let options = DecodeOptions {
            tokenizer: None,
            ..options
        };
        decoder(Dialect::Anthropic, Framing::Sse, options)
    };
    let tokenizer = Tokenizer::encoding("o200k_base").expect("o200k");
    let on = || {
        let options = DecodeOptions {
            tokenizer: Some(&tokenizer),
            ..options
        };
        decoder(Dialect::Anthropic, Framing::Sse, options)
    };
    // Warm up (lazy statics, page faults), then measure.
    run(plain, &body);
    run(off, &body);
    run(on, &body);
    let (plain_allocs, plain_time, plain_tokens) = run(plain, &body);
    let (off_allocs, off_time, off_tokens) = run(off, &body);
    let (on_allocs, on_time, on_tokens) = run(on, &body);

    let per_event = |d: Duration| d.as_nanos() as f64 / EVENTS as f64;
    println!(
        "anthropic text deltas, {EVENTS} events:\n  \
         plain decoder       {:>8.0} ns/event, {plain_allocs} allocations, {plain_tokens} tokens\n  \
         tokenizer: None     {:>8.0} ns/event, {off_allocs} allocations, {off_tokens} tokens\n  \
         tokenizer: o200k    {:>8.0} ns/event, {on_allocs} allocations, {on_tokens} tokens",
        per_event(plain_time),
        per_event(off_time),
        per_event(on_time),
    );
    // `None` is the plain decoder: the same allocations (a buffer growing once or twice,
    // none per event) and the same text-shape estimate.
    assert_eq!(
        off_allocs, plain_allocs,
        "tokenizer: None must not allocate"
    );
    assert!(
        off_allocs < 8,
        "{off_allocs} allocations for {EVENTS} events"
    );
    assert_eq!(off_tokens, plain_tokens);
    assert!(
        off_tokens > 3 * (EVENTS as u64 - 100),
        "3.5 words or symbols per event after the first frame: {off_tokens}"
    );
    // With a tokenizer every delta is counted at a cost; on this English text the
    // estimate from words and symbols is within a quarter of it.
    assert!(
        on_tokens * 4 >= off_tokens * 3 && on_tokens * 3 <= off_tokens * 4,
        "{on_tokens} vs {off_tokens}"
    );
    assert!(on_allocs > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_tokenizer_counts_through_the_proxy() {
    let body = fixture("anthropic/stream_text.sse");
    let mut script = vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec(),
    )];
    for piece in body.chunks(50) {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(piece);
        chunk.extend_from_slice(b"\r\n");
        script.push(Step::Write(chunk));
        script.push(Step::Sleep(Duration::from_millis(2)));
    }
    script.push(Step::Write(b"0\r\n\r\n".to_vec()));
    let backend = ScriptedBackend::start(script).await;
    let proxy = Proxy::start(
        &backend.url(),
        "observe:\n  tokenizer:\n    encoding: o200k_base\n",
    )
    .await;
    let request = Request::post(proxy.url("/v1/messages"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"claude-sonnet-4-20250514","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"Hello"}]}"#,
        )))
        .expect("request");
    let response = client().request(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(common::body_text(response).await.as_bytes(), body);

    let counts = expected_counts(Dialect::Anthropic, Framing::Sse, &body, &o200k());
    let total: u32 = counts.iter().sum();
    let m = proxy
        .wait_metrics("the stream", |m| {
            m.sum("tokentap_requests_total", &[]) >= 1.0
        })
        .await;
    // The tokenizer's counts are the estimates the reported N is apportioned by.
    assert!(total > 0);
    assert_eq!(
        m.sum(
            "tokentap_event_tokens_total",
            &[("accuracy", "apportioned")]
        ),
        16.0,
        "{}",
        m.text
    );
    // ITL is observed once per token after the first event: N - k_1.
    assert_eq!(
        m.sum("tokentap_inter_token_latency_seconds_count", &[]),
        f64::from(16 - counts[0].max(1))
    );
    // N is still the stream's own usage.
    assert_eq!(m.sum("tokentap_output_tokens_total", &[]), 16.0);
}

/// A tiny word-level `tokenizer.json`: every word and every run of punctuation is one
/// token (unknown ones map to `[UNK]`).
#[cfg(feature = "tokenizers")]
const WORD_LEVEL: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null,
  "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2}, "unk_token": "[UNK]"}
}"#;

#[cfg(feature = "tokenizers")]
#[test]
fn a_tokenizer_json_file_counts_like_the_tokenizers_crate() {
    let path = std::env::temp_dir().join(format!("tokentap-words-{}.json", std::process::id()));
    std::fs::write(&path, WORD_LEVEL).expect("temp file");
    let tokenizer = Tokenizer::from_file(&path).expect("loads");
    let reference = tokenizers::Tokenizer::from_file(&path).expect("reference");
    let _ = std::fs::remove_file(&path);
    assert_eq!(tokenizer.count("hello world, again"), 4);
    let body = fixture("anthropic/stream_text.sse");
    let got: Vec<u32> = outputs(&decode(
        Dialect::Anthropic,
        Framing::Sse,
        &body,
        Some(&tokenizer),
    ))
    .iter()
    .map(|o| o.0)
    .collect();
    let expected: Vec<u32> = payloads(&body, Framing::Sse)
        .iter()
        .map(|e| event_texts(Dialect::Anthropic, e))
        .filter(|texts| !texts.is_empty())
        .map(|texts| {
            texts
                .iter()
                .map(|t| reference.encode(t.as_str(), false).unwrap().len() as u32)
                .sum()
        })
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        got,
        [1, 9, 4, 3],
        "Hello | ! It ' s nice to meet you . | How can I help | you today ?"
    );
}
