//! What every request the simulator serves shares, HTTP and gRPC alike: its settings,
//! counters and rate limit, and the body type of its responses. A module of its own so
//! that the gRPC handlers (`grpc.rs`) and the HTTP ones (`mod.rs`) both use it without
//! importing each other.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::config::SimConfig;
use super::ratelimit::Limiter;

pub(super) struct SimState {
    pub(super) config: SimConfig,
    pub(super) requests: AtomicU64,
    pub(super) open_streams: Arc<AtomicU64>,
    /// The rate limit's buckets, when [`SimConfig::rate_limit`] sets one.
    pub(super) limiter: Option<Mutex<Limiter>>,
}

/// The body of every simulated response.
pub(super) type SimBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;
