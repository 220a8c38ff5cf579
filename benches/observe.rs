//! The per-event observe path, in ns per event: a whole simulated response (role chunk,
//! 40 token events, finish, usage, `[DONE]`, one frame each) polled through
//! the hyper transport's `StreamingBody` wrapping an in-memory body, begun through the
//! exchange policy (`Gateway::begin`) exactly as the proxy does: clock read per
//! frame, decoder, `TokenClock`, histogram observations, and the once-per-request record
//! (handles, counters, access-log event).
//!
//! - `passthrough`: a route that is not measured (idle-timeout guard and permit only):
//!   the floor;
//! - `observed`: the full path with the label pair already admitted (steady state);
//! - `observed_900_tenants`: requests rotate over 900 tenants (a bigger label map;
//!   the first round also admits the values).
//!
//! Also `metrics/render_50x200`: the `/metrics` text with 10,000 label pairs in one buffer
//! (`encode_50x200`: the same into an already mapped buffer, the encoder alone), and
//! `stream_50x200`: the same text as the chunks `/metrics` serves, each dropped once
//! pulled (as after its socket write).
//!
//! And `histogram/observe_classic` vs `histogram/observe_classic_native`: one observation
//! on a TTFT histogram without and with its native buckets (`metrics.native_histograms.
//! enabled`), values cycling over the range the buckets cover.
//!
//! And `record_request/untraced` vs `record_request/traced`: one request's record
//! (`Metrics::record_request`: counters, duration, TPOT, tokens/s) without and with a trace
//! context, whose four exemplars (TTFT, ITL, TPOT, duration) are the difference. Plus
//! `metrics/stream_openmetrics_50x200`: `/metrics` as Prometheus asks for it by default.
//!
//! And `interleaved/1000_streams`: the fast path's user-space work per event with 1,000
//! streams open, each fed one event in turn as a worker carrying 1,000 streams sees them:
//! the response reader on the chunked framing, one clock read per piece of data, the
//! observer. Per-stream state is cold at every event there (1,000 streams' state does not
//! fit in a core's L2), which the one-response-at-a-time benches above never see; it is
//! the figure to compare layouts of that state by (`passthrough_1000`: the reader alone).
//!
//! The setup (simulated responses, the configuration, a response begun through the exchange
//! policy) is `common`, shared with the instruction counts of `budget`.
//!
//! Run: `cargo bench --bench observe` (add `-- --quick` for a fast pass).

mod common;

use std::time::Duration;

use common::{
    chunked, config, drain, gateway, metrics, observer, sim_frames, sinks, streamed, CHAT, HEAD,
    RULES,
};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::sync::Arc;
use std::time::Instant;
use tokentap::config::{Config, NativeHistograms};
use tokentap::metrics::exemplar::TraceContext;
use tokentap::metrics::{Metrics, RequestExemplar, RequestFigures};
use tokentap::observe::ResponseObserver;
use tokentap::outcome::Verdict;
use tokentap::relay::response::{Piece, ResponseReader};
use tokentap::summary::Sinks;

fn bench_observe(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let frames = sim_frames();
    let events = frames.len() as u64;
    let config = config();
    let sinks = sinks(&config);
    let idle = Duration::from_secs(120);

    let gateway = gateway(&config, &sinks);
    let mut group = c.benchmark_group("observe");
    group.throughput(Throughput::Elements(events));
    group.bench_function("passthrough", |b| {
        b.iter_batched(
            || streamed(&gateway, "/v1/models", "", None, &frames, idle),
            |body| black_box(drain(&rt, body)),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("observed", |b| {
        b.iter_batched(
            || {
                let tenant = Some("tenant-a".to_string());
                streamed(&gateway, CHAT, "sim-model", tenant, &frames, idle)
            },
            |body| black_box(drain(&rt, body)),
            BatchSize::SmallInput,
        )
    });
    // The same with the live view on (`ui.enabled`, the default): its registry of streams
    // in flight and its request tap on every request; nobody watching.
    let live_sinks = self::sinks(&config);
    let live = {
        let _runtime = rt.enter();
        tokentap::live::Live::start(
            live_sinks.clone(),
            &tokentap::supervise::Supervisor::new(live_sinks.metrics().clone(), Default::default()),
        )
    };
    let live_gateway = self::gateway(&config, &live_sinks);
    group.bench_function("observed_live_view", |b| {
        b.iter_batched(
            || {
                let tenant = Some("tenant-a".to_string());
                streamed(&live_gateway, CHAT, "sim-model", tenant, &frames, idle)
            },
            |body| black_box(drain(&rt, body)),
            BatchSize::SmallInput,
        )
    });
    drop(live);
    let mut n = 0u64;
    group.bench_function("observed_900_tenants", |b| {
        b.iter_batched(
            || {
                n += 1;
                let tenant = Some(format!("t{}", n % 900));
                streamed(&gateway, CHAT, "sim-model", tenant, &frames, idle)
            },
            |body| black_box(drain(&rt, body)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// `/metrics` with 50 models x 200 tenants (10,000 label pairs, every family populated
/// through the real observe path): the whole render (the text a scrape gets), and
/// `snapshot()` (the typed copy of the same series, which the demo's summary reads).
fn bench_render(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let frames = sim_frames();
    let config = config();
    let sinks = sinks(&config);
    let metrics = sinks.metrics();
    let idle = Duration::from_secs(120);
    let gateway = gateway(&config, &sinks);
    for m in 0..50 {
        for t in 0..200 {
            let model = format!("model-{m}");
            let tenant = Some(format!("tenant-{t}"));
            drain(&rt, streamed(&gateway, CHAT, &model, tenant, &frames, idle));
        }
    }
    let bytes = metrics.render().len();
    eprintln!("render_50x200: {bytes} bytes");
    let mut group = c.benchmark_group("metrics");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("render_50x200", |b| {
        b.iter(|| black_box(metrics.render().len()))
    });
    // The encoder alone: the same text into a buffer whose pages are already mapped. A
    // scrape gets a fresh buffer (`render`), and faulting its ~150 MB in is a large part
    // of its time on small machines.
    let mut reused = Vec::with_capacity(bytes * 2);
    group.bench_function("encode_50x200", |b| {
        b.iter(|| {
            reused.clear();
            metrics.render_into(&mut reused);
            black_box(reused.len())
        })
    });
    group.bench_function("stream_50x200", |b| {
        b.iter(|| black_box(metrics.exposition().map(|chunk| chunk.len()).sum::<usize>()))
    });
    group.bench_function("stream_openmetrics_50x200", |b| {
        b.iter(|| {
            black_box(
                metrics
                    .openmetrics_exposition()
                    .map(|chunk| chunk.len())
                    .sum::<usize>(),
            )
        })
    });
    group.bench_function("snapshot_50x200", |b| {
        b.iter(|| black_box(metrics.snapshot().families.len()))
    });
    group.finish();
}

/// One histogram observation, classic buckets only and classic + native (schema 3).
fn bench_histogram_observe(c: &mut Criterion) {
    let config = config();
    let values: Vec<f64> = (0..1024).map(|i| 0.005 * 1.01f64.powi(i % 700)).collect();
    let mut group = c.benchmark_group("histogram");
    for (name, enabled) in [("observe_classic", false), ("observe_classic_native", true)] {
        let native = NativeHistograms {
            enabled,
            classic: true,
            ..config.metrics.native_histograms.clone()
        };
        let metrics = Metrics::with_native(&config.metrics.buckets, &native, &config.labels);
        let pair = metrics.stream(Some("m"), Some("t"));
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) & 1023;
                pair.ttft().observe(black_box(values[i]));
            })
        });
    }
    group.finish();
}

/// One request's record, without and with the exemplars of a trace context.
fn bench_record_request(c: &mut Criterion) {
    let config = config();
    let metrics = metrics(&config);
    let pair = metrics.stream(Some("m"), Some("t"));
    let untraced = RequestFigures {
        duration: Duration::from_millis(1500),
        output_tokens: 40,
        input_tokens: Some(12),
        apportioned_event_tokens: 40,
        tpot: Some(Duration::from_millis(21)),
        tokens_per_second: Some(47.0),
        ..RequestFigures::default()
    };
    let traced = RequestFigures {
        exemplar: Some(RequestExemplar {
            trace: TraceContext {
                trace_id: [0x4b; 16],
                span_id: [0x07; 8],
            },
            at: std::time::SystemTime::now(),
            ttft: Some(Duration::from_millis(120)),
            slowest_itl: Some(Duration::from_millis(35)),
        }),
        ..untraced
    };
    let mut group = c.benchmark_group("record_request");
    for (name, figures) in [("untraced", untraced), ("traced", traced)] {
        group.bench_function(name, |b| {
            b.iter(|| metrics.record_request(&pair, Verdict::COMPLETED, black_box(figures)))
        });
    }
    group.finish();
}

/// A stream past its response head: the fast path's reader, and the observer unless
/// the stream is passed through.
type Open = (ResponseReader, Option<ResponseObserver>);

fn open_streams(
    config: &Arc<Config>,
    sinks: &Arc<Sinks>,
    streams: usize,
    observed: bool,
) -> Vec<Open> {
    (0..streams)
        .map(|_| {
            let mut reader = ResponseReader::new(false, RULES);
            let mut pieces = Vec::new();
            reader.feed(HEAD, &mut pieces).expect("a valid head");
            let observer = observed
                .then(|| observer(config, sinks, "sim-model", Some("tenant-a".to_string())));
            (reader, observer)
        })
        .collect()
}

/// Feed every open stream its events, one event of each stream in turn, to the end.
fn interleaved(open: &mut [Open], events: &[Vec<u8>]) -> usize {
    let mut pieces = Vec::new();
    let mut relayed = 0;
    for event in events {
        for (reader, observer) in open.iter_mut() {
            pieces.clear();
            relayed += reader.feed(event, &mut pieces).expect("valid chunks");
            for piece in pieces.drain(..) {
                match (piece, observer.as_mut()) {
                    (Piece::Data(range), Some(observer)) => {
                        observer.data(Instant::now(), &event[range])
                    }
                    (Piece::End, Some(observer)) => observer.end(Instant::now()),
                    _ => {}
                }
            }
        }
    }
    relayed
}

fn bench_interleaved(c: &mut Criterion) {
    let config = config();
    let sinks = sinks(&config);
    let mut events: Vec<Vec<u8>> = sim_frames().iter().map(|f| chunked(f)).collect();
    events.push(b"0\r\n\r\n".to_vec());
    const STREAMS: usize = 1000;
    let mut group = c.benchmark_group("interleaved");
    group.throughput(Throughput::Elements((events.len() * STREAMS) as u64));
    group.sample_size(20);
    for (name, observed) in [("passthrough_1000", false), ("1000_streams", true)] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || open_streams(&config, &sinks, STREAMS, observed),
                |mut open| {
                    black_box(interleaved(&mut open, &events));
                    open
                },
                BatchSize::PerIteration,
            )
        });
    }
    // Two workers at once, as tokentap runs on a 2-core machine: each its own 1,000
    // streams, the metrics shared. The time is one worker's, so it compares with the
    // single worker's above; what is added is the two cores writing the same series.
    group.bench_function("1000_streams_2_workers", |b| {
        b.iter_custom(|iterations| {
            let start = std::sync::Barrier::new(2);
            let workers: Vec<Duration> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..2)
                    .map(|_| {
                        scope.spawn(|| {
                            let mut spent = Duration::ZERO;
                            for _ in 0..iterations {
                                let mut open = open_streams(&config, &sinks, STREAMS, true);
                                start.wait();
                                let began = Instant::now();
                                black_box(interleaved(&mut open, &events));
                                spent += began.elapsed();
                            }
                            spent
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("worker"))
                    .collect()
            });
            workers.iter().sum::<Duration>() / 2
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    bench_interleaved,
    bench_observe,
    bench_render,
    bench_histogram_observe,
    bench_record_request
);
criterion_main!(benches);
