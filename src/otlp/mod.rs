//! OTLP metrics push: every interval, the series `/metrics` shows, sent to an
//! OpenTelemetry collector (`otlp` config, `OTEL_*` environment variables).
//!
//! Off the request path: one task reads [`Metrics::snapshot`](crate::metrics::Metrics::snapshot)
//! on its own timer, maps it (`mapping`) and hands it to the exporter (`exporter`), which
//! sends at most one at a time over a transport (`transport`). The proxy never waits on
//! any of it, so a collector that is down or slow costs only the exports it misses.

pub mod exporter;
pub mod mapping;
pub mod transport;
