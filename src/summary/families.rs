//! The metric families' sink: what a finished request adds to its series (the request
//! counters and per-request histograms, the GenAI sets, the engine's timings, the
//! upstream's rate limits and the decoder's errors).

use std::time::{Duration, SystemTime};

use super::objectives::{Measures, Objectives};
use super::request::RequestSummary;
use crate::metrics::{EngineFigures, Metrics, RequestExemplar, RequestFigures, StreamSeries};
use crate::outcome::Verdict;
use crate::wire::EngineTimings;

/// Record `summary` in `series` (the series it was counted under).
pub(super) fn record(metrics: &Metrics, series: &StreamSeries, summary: &RequestSummary) {
    let figures = RequestFigures {
        duration: summary.duration,
        output_tokens: summary.output_tokens,
        input_tokens: summary.input_tokens,
        exact_event_tokens: summary.exact_event_tokens,
        apportioned_event_tokens: summary.apportioned_event_tokens,
        estimated_event_tokens: summary.estimated_event_tokens,
        tpot: summary.tpot,
        tokens_per_second: summary.tokens_per_second,
        exemplar: summary.facts.exemplar.map(|trace| RequestExemplar {
            trace,
            at: SystemTime::now(),
            ttft: summary.ttft,
            slowest_itl: summary.slowest_itl,
        }),
    };
    metrics.record_gen_ai(series, summary.verdict, summary.ttft, &figures);
    metrics.record_request(series, summary.verdict, figures);
    if !summary.engine.is_empty() {
        metrics.record_engine_timings(series, engine_figures(&summary.engine, summary.ttft));
    }
    if let Some(limits) = &summary.rate_limits {
        limits.record(metrics, series);
    }
    metrics.decode_errors(summary.facts.dialect.as_str(), summary.malformed);
    if summary.buffered {
        metrics.count_buffered(series);
    }
    if !summary.token_details.is_empty() {
        let details = &summary.token_details;
        for (kind, tokens) in [
            ("cache_read_input", details.cache_read_input),
            ("cache_write_input", details.cache_write_input),
            ("reasoning_output", details.reasoning_output),
        ] {
            if let Some(tokens) = tokens {
                metrics.count_usage_detail(series, kind, tokens);
            }
        }
    }
    judge(
        metrics,
        series,
        summary.objectives.as_ref(),
        summary.verdict,
        &summary.measures(),
        summary.output_tokens,
    );
}

/// Count a request tokentap answered itself before any exchange (an overload refusal, a
/// head it could not read), with `verdict`, in `series`, and judge it against each
/// objective in force: it has no figures, so it is judged by its outcome alone.
pub(super) fn refused(
    metrics: &Metrics,
    series: &StreamSeries,
    verdict: Verdict,
    objectives: Option<&Objectives>,
) {
    metrics.count_request(series, verdict);
    judge(
        metrics,
        series,
        objectives,
        verdict,
        &Measures::default(),
        0,
    );
}

/// Judge a request counted in `series` against each objective, and count it met or
/// missed with its `output_tokens`.
fn judge(
    metrics: &Metrics,
    series: &StreamSeries,
    objectives: Option<&Objectives>,
    verdict: Verdict,
    measures: &Measures,
    output_tokens: u64,
) {
    for objective in objectives.iter().flat_map(|o| o.iter()) {
        let (model, tenant) = (series.model(), series.tenant());
        if let Some(met) = objective.judge(model, tenant, verdict.outcome, measures) {
            metrics.count_objective(series, &objective.name, met, output_tokens);
        }
    }
}

/// What [`Metrics::record_engine_timings`] records of the engine's report, with `ttft`
/// tokentap's own: the time outside the engine is `ttft` minus the engine's TTFT
/// ([`EngineTimings::time_to_first_token`]), 0 where the engine's is the longer (its
/// clock or its definition differs from tokentap's by more than the network took).
fn engine_figures(engine: &EngineTimings, ttft: Option<Duration>) -> EngineFigures {
    EngineFigures {
        queue: engine.queue,
        prefill: engine.prefill,
        ttft_outside_engine: ttft
            .zip(engine.time_to_first_token())
            .map(|(ttft, inside)| ttft.saturating_sub(inside)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_time_outside_the_engine_follows_the_rule() {
        let t = |queue: Option<u64>, prefill: Option<u64>, first: Option<u64>| EngineTimings {
            queue: queue.map(ms),
            prefill: prefill.map(ms),
            first_token: first.map(ms),
        };
        let outside = |engine: EngineTimings, ttft: Option<u64>| {
            engine_figures(&engine, ttft.map(ms)).ttft_outside_engine
        };
        // The reported first token wins over queue + prefill.
        assert_eq!(
            outside(t(Some(10), Some(20), Some(100)), Some(130)),
            Some(ms(30))
        );
        assert_eq!(
            outside(t(Some(10), Some(20), None), Some(130)),
            Some(ms(100))
        );
        // A prefill alone is no engine TTFT; no TTFT (not streamed) gives nothing.
        assert_eq!(outside(t(None, Some(20), None), Some(130)), None);
        assert_eq!(outside(t(Some(10), Some(20), None), None), None);
        // The engine's longer than tokentap's: 0, not a negative figure.
        assert_eq!(
            outside(t(None, None, Some(200)), Some(130)),
            Some(Duration::ZERO)
        );
    }
}
