//! A finished request on its series: its figures, plain values ([`RequestFigures`],
//! [`EngineFigures`], and a traced one's [`RequestExemplar`](super::RequestExemplar)),
//! recorded once per request on the series its labels resolved to, and on its GenAI sets.

use std::time::Duration;

use super::exemplar::Exemplar;
use super::gen_ai::GenAiKey;
use super::series::{self, Histogram, StreamSeries};
use super::{EngineFigures, Metrics, RequestFigures};
use crate::outcome::{Outcome, Verdict};

impl Metrics {
    /// Count a request tokentap answered itself before it was measured (refused at
    /// admission, or a head it could not read): the counter only, no figures.
    pub fn count_request(&self, stream: &StreamSeries, verdict: Verdict) {
        stream.requests(verdict).inc();
    }

    /// Record the per-request figures of a finished request on its series (exactly once
    /// per request).
    pub fn record_request(&self, stream: &StreamSeries, verdict: Verdict, figures: RequestFigures) {
        stream.requests(verdict).inc();
        stream.duration().observe(figures.duration.as_secs_f64());
        if figures.output_tokens > 0 {
            stream.output_tokens().inc_by(figures.output_tokens);
        }
        if let Some(input) = figures.input_tokens.filter(|n| *n > 0) {
            stream.input_tokens().inc_by(input);
        }
        // Indexed like `series::ACCURACY`.
        for (counter, count) in stream.event_tokens().iter().zip([
            figures.apportioned_event_tokens,
            figures.estimated_event_tokens,
            figures.exact_event_tokens,
        ]) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        if let Some(tpot) = figures.tpot {
            stream.tpot().observe(tpot.as_secs_f64());
        }
        if let Some(tokens_per_second) = figures.tokens_per_second {
            stream.tokens_per_second().observe(tokens_per_second);
        }
        if let Some(exemplar) = figures.exemplar {
            let of =
                |value: Duration| Exemplar::new(exemplar.trace, value.as_secs_f64(), exemplar.at);
            stream.duration().exemplar(of(figures.duration));
            if let Some(ttft) = exemplar.ttft {
                stream.ttft().exemplar(of(ttft));
            }
            if let Some(itl) = exemplar.slowest_itl {
                stream.itl().exemplar(of(itl));
            }
            if let Some(tpot) = figures.tpot {
                stream.tpot().exemplar(of(tpot));
            }
        }
    }

    /// Record what the engine reported of a finished request's time, each figure only
    /// where it was reported (once per request, with [`Metrics::record_request`]).
    pub fn record_engine_timings(&self, stream: &StreamSeries, figures: EngineFigures) {
        if let Some(queue) = figures.queue {
            stream.engine_queue().observe(queue.as_secs_f64());
        }
        if let Some(prefill) = figures.prefill {
            stream.engine_prefill().observe(prefill.as_secs_f64());
        }
        if let Some(outside) = figures.ttft_outside_engine {
            stream.ttft_outside_engine().observe(outside.as_secs_f64());
        }
    }

    /// Record a finished request's GenAI figures, once, with [`Metrics::record_request`]
    /// (nothing unless [`Metrics::attach_gen_ai`] gave `stream` its sets): TTFT and TPOT
    /// of a successful request, the duration under the request's `error.type` (none when
    /// it completed), and the tokens counted.
    pub fn record_gen_ai(
        &self,
        stream: &StreamSeries,
        verdict: Verdict,
        ttft: Option<Duration>,
        figures: &RequestFigures,
    ) {
        let Some(gen_ai) = &stream.gen_ai else {
            return;
        };
        let exemplar = |value: Duration| {
            figures
                .exemplar
                .map(|e| Exemplar::new(e.trace, value.as_secs_f64(), e.at))
        };
        let observe = |histogram: Option<&Histogram>, value: Duration| {
            if let Some(histogram) = histogram {
                histogram.observe(value.as_secs_f64());
                if let Some(exemplar) = exemplar(value) {
                    histogram.exemplar(exemplar);
                }
            }
        };
        let completed = verdict.outcome == Outcome::Completed;
        if completed {
            if let Some(ttft) = ttft {
                observe(gen_ai.ok.ttft.as_deref(), ttft);
            }
            if let Some(tpot) = figures.tpot {
                observe(gen_ai.ok.tpot.as_deref(), tpot);
            }
            observe(gen_ai.ok.duration.as_deref(), figures.duration);
        } else if let Some(ok) = gen_ai.ok.gen_ai.clone() {
            // (A GenAI set always has its key.)
            let key = GenAiKey {
                error_type: Some(verdict.outcome.as_str()),
                ..ok
            };
            let failed = self.gen_ai_set(key, series::ERROR_SLOTS);
            observe(failed.duration.as_deref(), figures.duration);
        }
        if let (Some(input), Some(usage)) = (figures.input_tokens, &gen_ai.input.token_usage) {
            usage.observe(input as f64);
        }
        if figures.output_tokens > 0 {
            if let Some(usage) = &gen_ai.output.token_usage {
                usage.observe(figures.output_tokens as f64);
            }
        }
    }
}
