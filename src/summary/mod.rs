//! One measured request's end as one typed value, [`RequestSummary`], and the sinks it
//! goes to.
//!
//! The recorder builds the summary once, when the request ends, and hands it to
//! [`Sinks::finished`]: the metric families, the access log, the live view and the
//! request's span each take from it what they want. A new per-request fact is one field
//! here, set by the recorder, plus the sinks that want it (docs/ARCHITECTURE.md, "Adding a
//! per-request fact").
//!
//! [`Sinks`] is also where a request is listed from its head while the live view is on
//! ([`Sinks::in_flight`]) and where its span is decided ([`Sinks::spans`]): what the
//! transports reach through the exchange policy to observe a request, apart from the
//! metric store.

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(clippy::indexing_slicing)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

pub mod access_log;
mod facts;
mod families;
pub mod objectives;
mod request;
pub mod spans;
mod taps;

use std::sync::Arc;

pub use facts::RequestFacts;
pub use request::RequestSummary;
use spans::Spans;
pub use taps::{Sink, TapId, Taps};

use crate::metrics::in_flight::LiveStreams;
use crate::metrics::{Metrics, StreamSeries};
use crate::outcome::Verdict;
use objectives::Objectives;

/// Where measured requests go. At its end, a request's summary goes to each of these, in
/// this order ([`finished`](Self::finished)):
///
/// 1. the metric families (`metrics`), always, with the request's judgement against
///    each objective in force when it began;
/// 2. the access log (`tokentap::access`), always (the log filter decides what is
///    written);
/// 3. the taps (the live view's finished requests), while any is registered;
/// 4. the request's span, when it has one ([`spans`](Self::spans)).
pub struct Sinks {
    metrics: Arc<Metrics>,
    taps: Taps,
    /// Which requests get a span, and the exporter their summaries go to.
    pub spans: Spans,
    /// The requests in flight one by one, listed from their heads while the live view
    /// is on.
    pub in_flight: Arc<LiveStreams>,
}

impl Sinks {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Sinks> {
        Arc::new(Sinks {
            metrics,
            taps: Taps::default(),
            spans: Spans::default(),
            in_flight: Arc::default(),
        })
    }

    /// The metric families: the sink every request is counted in, and the label policy
    /// its series are resolved by.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The sinks registered while their owner runs (the live view).
    pub fn taps(&self) -> &Taps {
        &self.taps
    }

    /// Count a request tokentap answered itself before any exchange, with `verdict`, in
    /// `series`: the metric families only (the access log line and the span, which know
    /// its head, are the caller's).
    pub fn refused(
        &self,
        series: &StreamSeries,
        verdict: Verdict,
        objectives: Option<&Objectives>,
    ) {
        families::refused(&self.metrics, series, verdict, objectives);
    }

    /// Hand the summary of a request that ended, counted in `series`, to every sink.
    pub fn finished(&self, summary: RequestSummary, series: &StreamSeries) {
        families::record(&self.metrics, series, &summary);
        access_log::request(&summary);
        if self.taps.any() {
            self.taps.finished(&summary);
        }
        if summary.facts.span.is_some() {
            self.spans.finished(&summary);
        }
    }
}
