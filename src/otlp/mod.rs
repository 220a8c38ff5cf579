//! OTLP push: every interval, the series `/metrics` shows, and (opt-in) one span per
//! measured request, sent to an OpenTelemetry collector (`otlp` config, `OTEL_*`
//! environment variables).
//!
//! Off the request path: one task reads [`Metrics::snapshot`](crate::metrics::Metrics::snapshot)
//! on its own timer, maps it (`mapping`) and hands it to the exporter (`exporter`), which
//! sends at most one at a time over a transport (`transport`). Spans: the recorder hands
//! each sampled request to a tap that queues it without waiting; the span exporter
//! (`spans`) batches them, maps them (`span_mapping`) and sends them over a transport of
//! its own. Both exporters retry and count with `delivery`. The proxy never waits on any
//! of it, so a collector that is down or slow costs only the exports it misses.

pub mod delivery;
pub mod exporter;
pub mod mapping;
pub mod span_mapping;
pub mod spans;
pub mod transport;
