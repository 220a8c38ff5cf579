//! Default histogram bucket bounds, per kind of measurement.
//!
//! They belong to the metric contract (dashboards and alert thresholds are drawn on these
//! bounds), so they live with the metrics; `metrics.buckets` in the config file overrides
//! them per histogram, and the config takes its defaults from here.

/// Time-to-first-byte/token buckets: 10 ms to 60 s, dense below 1 s where interactive
/// TTFTs live, sparse above where long-prompt prefill and queueing show up.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 60.0,
];
/// Inter-token latency / TPOT buckets: 1 ms to 5 s. Decode steps are 5-100 ms on current
/// hardware, so the resolution is finest there; p99 alert thresholds (50-200 ms) fall on
/// bucket bounds.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
];
/// Inter-chunk latency buckets: 1 ms to 30 s. A chunk gap is one decode step or several
/// (engines batch tokens per event), and a stall is a gap of seconds, so the range reaches
/// past the default 5 s stall threshold, with the threshold itself on a bound.
pub const INTER_CHUNK_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];
/// Decode tokens/s buckets: 1 to 2000 tokens/s.
pub const TOKENS_PER_SECOND_BUCKETS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0,
    1000.0, 2000.0,
];
/// Tokens-per-event buckets: 1 to 64 tokens. Every integer up to 6 and then 8, because
/// speculative decoding accepts 1 to `k + 1` tokens a step with `k` (draft tokens) mostly
/// 2 to 7, so the acceptance shape lives there and a bucket per count shows it; 12 and 16
/// for engines that flush every few steps (`stream_interval`), 32 and 64 for coarse
/// batching. The counts are integers, so `le="3"` holds exactly the events of 1 to 3.
pub const TOKENS_PER_EVENT_BUCKETS: &[f64] =
    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0];
/// Request duration buckets: 50 ms to 30 min (agentic streams run long).
pub const DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];
