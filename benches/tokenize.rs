//! Cost per text delta of counting tokens with `observe.tokenizer`: the incremental
//! [`TokenStream`](tokentap::wire::token_stream::TokenStream) (push every delta, finish at
//! the end) against counting each delta alone with `Tokenizer::count` (what the decoders
//! did before it), for both built-in encodings.
//!
//! The stream is realistic: a few hundred deltas of one to three words each, every word
//! with its trailing space, as many servers flush them. Throughput is in deltas, so
//! criterion's time per iteration divided by the delta count is the cost per event.
//! Run: `cargo bench --bench tokenize`.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokentap::wire::Tokenizer;

const PROSE: &str = "Streaming responses arrive one small piece at a time, and the proxy \
    stamps each piece as it passes. It's the gap between pieces that a reader feels: when \
    the model stalls, the words stop, and nobody cares how fast the first one came. A \
    tokenizer turns the text back into tokens, so that a delta of three words counts as \
    the four or five tokens the model spent on it. Numbers such as 1,234.56 or 2026-12-01 \
    split into short runs of digits; code like `fn main() { println!(\"hi\"); }` splits \
    at every bracket. We'll see whether the counts add up: they should, exactly, for the \
    built-in encodings, whatever the server's flushing did to the words.";

/// The deltas: the prose's words, repeated to `words` words, in groups of 1, 2, 3, 1, ...
fn deltas(words: usize) -> Vec<String> {
    let mut all = PROSE.split(' ').cycle().take(words);
    let mut out = Vec::new();
    let mut group = 0;
    loop {
        let size = group % 3 + 1;
        let mut delta = String::new();
        for _ in 0..size {
            match all.next() {
                Some(word) => {
                    delta.push_str(word);
                    delta.push(' ');
                }
                None => break,
            }
        }
        if delta.is_empty() {
            return out;
        }
        out.push(delta);
        group += 1;
    }
}

fn per_event(c: &mut Criterion) {
    let deltas = deltas(600);
    let mut group = c.benchmark_group("tokenize");
    group.throughput(Throughput::Elements(deltas.len() as u64));
    for name in ["o200k_base", "cl100k_base"] {
        let tokenizer = Tokenizer::encoding(name).expect("built-in encoding");
        group.bench_with_input(
            BenchmarkId::new("per_delta_count", name),
            &deltas,
            |b, deltas| {
                b.iter(|| {
                    deltas
                        .iter()
                        .map(|delta| tokenizer.count(black_box(delta)))
                        .sum::<u64>()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("token_stream", name),
            &deltas,
            |b, deltas| {
                b.iter(|| {
                    let mut stream = tokenizer.stream();
                    let settled: u64 = deltas
                        .iter()
                        .map(|delta| u64::from(stream.push(black_box(delta))))
                        .sum();
                    settled + u64::from(stream.finish())
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, per_event);
criterion_main!(benches);
