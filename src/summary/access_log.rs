//! The access log (`tokentap::access`): one line per request, measured or not, written
//! through `tracing` so the log filter and format decide what is kept and how.

use std::time::Duration;

use http::StatusCode;

use super::request::RequestSummary;
use crate::outcome::Verdict;
use crate::wire::Dialect;

/// The line of a measured request.
pub(super) fn request(summary: &RequestSummary) {
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    let facts = &summary.facts;
    tracing::info!(
        target: "tokentap::access",
        method = %facts.method,
        path = %facts.path,
        dialect = facts.dialect.as_str(),
        model = %summary.model,
        tenant = %summary.tenant,
        status = summary.http_status,
        grpc_status = summary.grpc_status,
        status_class = summary.verdict.status.as_str(),
        outcome = summary.verdict.outcome.as_str(),
        stream = summary.stream(),
        ttfb_ms = ms(summary.ttfb),
        ttft_ms = ms(summary.ttft),
        mean_itl_ms = ms(summary.mean_itl),
        duration_ms = summary.duration.as_secs_f64() * 1e3,
        output_tokens = summary.output_tokens,
        input_tokens = summary.input_tokens,
        cache_read_input_tokens = summary.token_details.cache_read_input,
        cache_write_input_tokens = summary.token_details.cache_write_input,
        reasoning_output_tokens = summary.token_details.reasoning_output,
        events = summary.events,
        counting = summary.counting,
        buffered = summary.buffered,
        slowest_gap_ms = ms(summary.slowest_gap),
        engine_queue_ms = ms(summary.engine.queue),
        engine_prefill_ms = ms(summary.engine.prefill),
        engine_ttft_ms = ms(summary.engine.time_to_first_token()),
        "request"
    );
}

/// The line of a request tokentap answered itself before any exchange: counted, with
/// the labels it was counted under, but not measured. `method` and `path` are `None` for
/// a head that could not be read.
pub fn refused(
    method: Option<&str>,
    path: Option<&str>,
    dialect: Option<Dialect>,
    (model, tenant): (&str, &str),
    status: StatusCode,
    verdict: Verdict,
) {
    tracing::info!(
        target: "tokentap::access",
        method,
        path,
        dialect = dialect.map(Dialect::as_str),
        model = %model,
        tenant = %tenant,
        status = status.as_u16(),
        status_class = verdict.status.as_str(),
        outcome = verdict.outcome.as_str(),
        "request"
    );
}

/// The line of a request on a route that is not measured: its response head's status
/// and, when the upstream gave it, the time to that head.
pub fn passthrough(method: &http::Method, path: &str, status: StatusCode, ttfb: Option<Duration>) {
    tracing::info!(
        target: "tokentap::access",
        method = %method,
        path = %path,
        status = status.as_u16(),
        ttfb_ms = ttfb.map(|ttfb| ttfb.as_secs_f64() * 1e3),
        "passthrough"
    );
}
