//! tokentap's integration tests, as one test binary: each former `tests/*.rs` file is a
//! module here, so a change to the library rebuilds and links one test executable instead
//! of thirteen (measured: half the CPU of `cargo test --all-targets --no-run` after a
//! touch of `src/lib.rs`). Run one area with `cargo test --test it <module>::`, e.g.
//! `cargo test --test it proxy::`.

mod common;

mod admin_starvation;
mod bad_input;
mod buffered;
mod cardinality;
mod configs;
mod connection_limit;
mod demo;
mod dialects;
mod docs;
mod engine_timings;
mod exchange_policy;
mod exemplars;
mod fast_path;
mod faults;
mod fuzz_decoders;
mod fuzz_fast_path;
mod gen_ai;
mod grpc;
mod grpc_fixtures;
mod grpc_net;
mod inject_cli;
mod itl;
mod layering;
mod lifecycle;
mod live;
mod native;
mod objectives;
mod otlp;
mod otlp_spans;
mod proxy;
mod recording;
mod reliability;
mod routes;
mod sim;
mod sim_grpc;
mod tenant_families;
mod tls;
mod token_stream;
mod tokenizer;
mod tokens_per_event;
mod usage_details;
mod wire_fixtures;
