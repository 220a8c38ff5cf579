//! The default of every optional key, one place each, as `const fn`s the validator calls
//! when a key is not written. The field docs in `raw.rs` state the same values for readers.
//! Histogram bucket and native-histogram defaults belong to the metric contract:
//! [`crate::metrics::buckets`], [`crate::metrics::native`] (through
//! [`NativeHistograms::default`](crate::metrics::NativeHistograms)).

use std::time::Duration;

use crate::wire::DecodeLimits;

pub(super) const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
pub(super) const DEFAULT_ADMIN: &str = "0.0.0.0:9464";
pub(super) const DEFAULT_UI_LISTEN: &str = "127.0.0.1:9465";
pub(super) const fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
pub(super) const fn default_response_head_timeout() -> Duration {
    Duration::from_secs(300)
}
pub(super) const fn default_idle_timeout() -> Duration {
    Duration::from_secs(120)
}
pub(super) const fn default_pool_idle_timeout() -> Duration {
    Duration::from_secs(90)
}
pub(super) const fn default_pool_max_idle_per_host() -> usize {
    1024
}
pub(super) const fn default_probe_interval() -> Duration {
    Duration::from_secs(5)
}
pub(super) const fn default_drain_timeout() -> Duration {
    Duration::from_secs(30)
}
pub(super) const fn default_max_in_flight() -> usize {
    20_000
}
pub(super) const fn default_header_read_timeout() -> Duration {
    Duration::from_secs(30)
}
/// The label bounds' defaults are the metric crate's (`metrics::Labels::default`), where
/// their cost in series is stated.
pub(super) use crate::metrics::DEFAULT_MAX_PAIRS;
pub(super) const fn default_request_body_timeout() -> Duration {
    Duration::from_secs(30)
}
pub(super) const fn default_ui_enabled() -> bool {
    true
}

pub(super) const fn default_http1_fast_path() -> bool {
    true
}
pub(super) const fn default_max_headers() -> usize {
    100
}
pub(super) const fn default_max_header_bytes() -> usize {
    64 << 10
}
pub(super) const fn default_model_max_values() -> usize {
    crate::metrics::DEFAULT_MODEL_MAX_VALUES
}
pub(super) const fn default_tenant_max_values() -> usize {
    crate::metrics::DEFAULT_TENANT_MAX_VALUES
}
pub(super) const fn label_max_values_ceiling() -> usize {
    100_000
}
pub(super) const fn default_label_max_value_len() -> usize {
    crate::metrics::DEFAULT_MAX_VALUE_LEN
}
pub(super) const fn default_stall_threshold() -> Duration {
    Duration::from_secs(5)
}
/// The W3C Trace Context header.
pub(super) const DEFAULT_EXEMPLAR_HEADER: &str = "traceparent";
pub(super) const fn default_max_event_bytes() -> usize {
    DecodeLimits::DEFAULT.max_event_bytes
}
pub(super) const fn default_max_body_bytes() -> usize {
    DecodeLimits::DEFAULT.max_body_bytes
}
