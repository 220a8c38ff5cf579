//! Decoder throughput (bytes/s): the SSE framing alone, then each dialect's full decoder
//! (framing + JSON + token rules) on the recorded fixtures, each fed three ways:
//! - `whole`: the body in one frame (many events per frame),
//! - `per_event`: one frame per event (what a streaming server usually sends),
//! - `split61`: 61-byte frames, so most events are cut across frames.
//!
//! Every iteration decodes one whole response with a fresh decoder, as a real stream would.
//! Run: `cargo bench --bench decode` (add `-- --quick` for a fast pass).

use std::path::{Path, PathBuf};

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokentap::wire::sse::SseDecoder;
use tokentap::wire::{decoder, DecodeLimits, DecodeOptions, Dialect, Framing, Signal};

/// A response exactly like `tokentap sim` sends: role chunk, `tokens` content chunks, the
/// finish chunk, a usage chunk and `[DONE]`, one `data:` event each.
fn sim_stream(tokens: usize) -> Vec<u8> {
    let words = [
        " the", " token", " streams", " fast", " and", " every", " gap", " is",
    ];
    let head = r#"{"id":"sim-1","object":"chat.completion.chunk","created":1764000000,"model":"sim-model","choices":"#;
    let mut out = String::new();
    out.push_str(&format!(
        "data: {head}[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    ));
    for i in 0..tokens {
        out.push_str(&format!(
            "data: {head}[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
            words[i % words.len()]
        ));
    }
    out.push_str(&format!(
        "data: {head}[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"length\"}}]}}\n\n"
    ));
    out.push_str(&format!(
        "data: {head}[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\n",
        tokens + 12
    ));
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

/// Cut a body into frames: one per event (SSE blank line / NDJSON line), or fixed sizes.
fn frames(body: &[u8], how: &str) -> Vec<Vec<u8>> {
    match how {
        "whole" => vec![body.to_vec()],
        "per_event" => {
            let mut out = Vec::new();
            let mut start = 0;
            let mut i = 0;
            while i < body.len() {
                let end = if body[i..].starts_with(b"\n\n") {
                    Some(i + 2)
                } else if body[i..].starts_with(b"\r\n\r\n") {
                    Some(i + 4)
                } else {
                    None
                };
                if let Some(end) = end {
                    out.push(body[start..end].to_vec());
                    start = end;
                    i = end;
                } else {
                    i += 1;
                }
            }
            if start < body.len() {
                // NDJSON / JSON bodies: one frame per line.
                let rest = &body[start..];
                if out.is_empty() {
                    return rest
                        .split_inclusive(|b| *b == b'\n')
                        .map(<[u8]>::to_vec)
                        .collect();
                }
                out.push(rest.to_vec());
            }
            out
        }
        "split61" => body.chunks(61).map(<[u8]>::to_vec).collect(),
        other => panic!("unknown framing {other}"),
    }
}

const HOW: [&str; 3] = ["whole", "per_event", "split61"];

fn bench_sse(c: &mut Criterion) {
    let body = sim_stream(40);
    let mut group = c.benchmark_group("sse");
    group.throughput(Throughput::Bytes(body.len() as u64));
    for how in HOW {
        let frames = frames(&body, how);
        group.bench_with_input(
            BenchmarkId::new("sim_40_tokens", how),
            &frames,
            |b, frames| {
                b.iter(|| {
                    let mut sse = SseDecoder::new(1 << 20);
                    let mut events = 0usize;
                    for frame in frames {
                        sse.feed(frame, &mut |e| events += e.data.len())
                            .expect("within limits");
                    }
                    black_box(events)
                })
            },
        );
    }
    group.finish();
}

fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Streamed fixtures worth timing: (name, dialect, framing, file).
fn cases() -> Vec<(String, Dialect, Framing, Vec<u8>)> {
    let mut out = vec![(
        "openai_chat/sim_40_tokens".to_string(),
        Dialect::OpenAiChat,
        Framing::Sse,
        sim_stream(40),
    )];
    let files = [
        (
            "openai",
            "chat_openai_include_usage.sse",
            Dialect::OpenAiChat,
            Framing::Sse,
        ),
        (
            "openai",
            "chat_openai_logprobs.sse",
            Dialect::OpenAiChat,
            Framing::Sse,
        ),
        (
            "openai",
            "chat_vllm_continuous_usage.sse",
            Dialect::OpenAiChat,
            Framing::Sse,
        ),
        (
            "openai",
            "completions_openai.sse",
            Dialect::OpenAiCompletions,
            Framing::Sse,
        ),
        (
            "responses",
            "stream_text.sse",
            Dialect::OpenAiResponses,
            Framing::Sse,
        ),
        (
            "anthropic",
            "stream_text.sse",
            Dialect::Anthropic,
            Framing::Sse,
        ),
        ("gemini", "stream_sse.sse", Dialect::Gemini, Framing::Sse),
        (
            "gemini",
            "stream_array.json",
            Dialect::Gemini,
            Framing::JsonArray,
        ),
        (
            "ollama",
            "chat_stream.ndjson",
            Dialect::Ollama,
            Framing::Ndjson,
        ),
        ("tgi", "generate_stream.sse", Dialect::Tgi, Framing::Sse),
        (
            "triton",
            "generate_stream.sse",
            Dialect::Triton,
            Framing::Sse,
        ),
        (
            "sglang_grpc",
            "generate_stream.grpc",
            Dialect::SglangGrpc,
            Framing::Grpc,
        ),
        (
            "vllm_grpc",
            "generate_stream.grpc",
            Dialect::VllmGrpc,
            Framing::Grpc,
        ),
        (
            "trtllm_grpc",
            "generate_stream.grpc",
            Dialect::TrtllmGrpc,
            Framing::Grpc,
        ),
        (
            "triton_grpc",
            "model_stream_infer.grpc",
            Dialect::TritonGrpc,
            Framing::Grpc,
        ),
    ];
    for (dir, file, dialect, framing) in files {
        let path = fixture_root().join(dir).join(file);
        // Fixtures come and go with the dialects; time those that are there.
        if let Ok(bytes) = std::fs::read(&path) {
            out.push((
                format!("{}/{}", dialect.as_str(), file),
                dialect,
                framing,
                bytes,
            ));
        }
    }
    out
}

fn bench_dialects(c: &mut Criterion) {
    let mut group = c.benchmark_group("dialect");
    for (name, dialect, framing, body) in cases() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        for how in HOW {
            let frames = frames(&body, how);
            group.bench_with_input(BenchmarkId::new(&name, how), &frames, |b, frames| {
                let mut signals: Vec<Signal> = Vec::with_capacity(16);
                b.iter(|| {
                    let options = DecodeOptions::new(DecodeLimits::DEFAULT);
                    let mut dec = decoder(dialect, framing, options);
                    let mut n = 0usize;
                    for frame in frames {
                        signals.clear();
                        dec.feed(frame, &mut signals).expect("within limits");
                        n += signals.len();
                    }
                    signals.clear();
                    let _ = dec.finish(&mut signals);
                    black_box(n + signals.len())
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_sse, bench_dialects);
criterion_main!(benches);
