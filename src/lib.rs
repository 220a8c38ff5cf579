//! tokentap: a transparent sidecar proxy that measures how fast LLMs stream.
//!
//! It forwards every byte between a client and an inference server unchanged, watches
//! streamed responses as they pass, stamps each token-bearing event, and exports
//! Prometheus histograms of time-to-first-token, inter-token latency and tokens/s per
//! model and tenant. docs/ARCHITECTURE.md has the data flow ("Data flow of one request")
//! and the exact semantics ("Measurement semantics").
//!
//! Module map, in the order a request meets them:
//! - [`server`]: listeners (HTTP/1.1 + h2c, optional TLS), `limits.max_connections`,
//!   graceful drain;
//! - [`proxy`]: the hyper transport: hyper's service, the upstream client, the body
//!   wrappers;
//! - [`relay`]: the HTTP/1.1 fast path: tokentap reads heads itself and relays bytes;
//! - [`intermediary`]: the head rules both transports apply (hop-by-hop fields, framing,
//!   `Host`, upstream head limits);
//! - [`idle_pool`]: the keep-alive upstream connections of both plain-HTTP/1.1
//!   transports (the relay's and hyper's), per worker thread, under one cap;
//! - [`worker_slot`]: which of the server's workers a thread is (a leaf the pools read);
//! - [`exchange`]: the request policy both transports call: admission, the configuration
//!   in force, tokentap's answers, the idle timeout;
//! - [`outcome`]: how a request ended, and every rule that decides it: the outcome and
//!   status labels and the verdict on HTTP and gRPC responses (the metrics crate's,
//!   re-exported), the answers and outcomes of failures and how a body's end is counted
//!   (`outcome::answer`, here);
//! - [`observe`]: the one entry point into observation, called by the exchange policy:
//!   what is measured, the request scan, the response observer, the outcome recorded once;
//! - [`wire`]: sans-IO decoders from bytes to token signals;
//! - [`clock`]: the measurement semantics (no I/O, no clock reads);
//! - [`metrics`]: the metric families and bounded labels (crates/metrics);
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`, and the live view's endpoints;
//! - [`live`]: the live view: a ring of the last minutes per model, the page and its API;
//! - [`otlp`]: the same series pushed to an OpenTelemetry collector, off the request path;
//! - [`supervise`]: background tasks restarted when they fail, counted and in `/readyz`;
//! - [`reload`]: a new configuration put in force while serving (SIGHUP): what it
//!   rebuilds, what only a restart applies;
//! - [`config`]: the YAML file and flags, validated with located errors;
//! - [`demo`]: the demo's summary of tokentap's own figures (the demo itself, and the
//!   simulated backend it runs, crates/sim, belong to the binary: no library module
//!   depends on the simulator);
//! - [`top`]: `tokentap top`, the live view in a terminal (a client of the admin port).

pub mod admin;
pub mod clock;
pub mod config;
pub mod demo;
pub mod exchange;
pub mod idle_pool;
pub mod intermediary;
pub mod live;
pub mod log_fields;
pub mod observe;
pub mod otlp;
pub mod outcome;
pub mod prefetch;
pub mod proxy;
pub mod relay;
pub mod reload;
pub mod server;
pub mod summary;
pub mod supervise;
pub mod top;
pub mod trust;
pub mod worker_slot;

#[cfg(test)]
mod doc_table;
#[cfg(test)]
mod metrics_contract;

/// The sans-IO decoders: a crate of their own (crates/wire), so that the compiler keeps
/// them from importing anything of the proxy; `crate::wire::...` paths read as before.
pub use tokentap_wire as wire;

/// The metric store and its renderers: a crate of their own (crates/metrics), so that the
/// compiler keeps them from importing anything of the proxy; `crate::metrics::...` paths
/// read as before.
pub use tokentap_metrics as metrics;

pub use config::Config;
pub use server::{ServeError, Server};
