//! TensorRT-LLM's `TrtllmService`: what its messages say, with `perf_metrics` from the
//! request's timing (the call itself is served by the parent module, the same for every
//! engine). Its health and model information answers are also what a call to Triton's
//! service for them gets.

use prost::Message;
use tokentap_wire::grpc::proto::trtllm;
use tokio::time::Instant;

use super::{count, Ask, Generation};

pub(super) fn health() -> Vec<u8> {
    trtllm::HealthCheckResponse {
        status: "OK".into(),
    }
    .encode_to_vec()
}

pub(super) fn model_info(model: &str) -> Vec<u8> {
    trtllm::GetModelInfoResponse {
        model_id: model.into(),
        max_input_len: 32768,
        max_seq_len: 32768,
        vocab_size: 32000,
        ..Default::default()
    }
    .encode_to_vec()
}

/// A `GenerateRequest`: its prompt's token ids, `max_tokens` (0: none), `streaming` and
/// `output_config.return_perf_metrics`.
pub(super) fn ask(message: &[u8]) -> Option<Ask> {
    let r = trtllm::GenerateRequest::decode(message).ok()?;
    let prompt = r
        .tokenized
        .as_ref()
        .map_or(0, |t| count(t.input_token_ids.len()));
    let max = (r.max_tokens > 0).then_some(r.max_tokens);
    let perf_metrics = r
        .output_config
        .as_ref()
        .is_some_and(|c| c.return_perf_metrics);
    Some(Ask {
        perf_metrics,
        ..Ask::new(r.request_id, prompt, max, r.streaming)
    })
}

/// A `chunk` of `ids`, `done` tokens generated so far.
pub(super) fn chunk(ask: &Ask, ids: Vec<u32>, done: u32) -> Vec<u8> {
    trtllm::GenerateResponse {
        request_id: ask.request_id.clone(),
        response: Some(trtllm::generate_response::Response::Chunk(
            trtllm::GenerateStreamChunk {
                token_ids: ids,
                prompt_tokens: ask.prompt_tokens,
                completion_tokens: done,
                ..Default::default()
            },
        )),
    }
    .encode_to_vec()
}

/// The `complete` of `generation` after `tokens` tokens (`ids`), with `perf_metrics`
/// when the request asked for them.
pub(super) fn complete(
    generation: &Generation,
    ids: Vec<u32>,
    tokens: u32,
    finish_reason: &str,
) -> Vec<u8> {
    let ask = &generation.ask;
    trtllm::GenerateResponse {
        request_id: ask.request_id.clone(),
        response: Some(trtllm::generate_response::Response::Complete(
            trtllm::GenerateComplete {
                output_token_ids: ids,
                finish_reason: finish_reason.into(),
                prompt_tokens: ask.prompt_tokens,
                completion_tokens: tokens,
                perf_metrics: ask.perf_metrics.then(|| perf_metrics(generation)),
                ..Default::default()
            },
        )),
    }
    .encode_to_vec()
}

/// TensorRT-LLM's `perf_metrics`: the request's instants on the wall clock, in seconds,
/// as the engine reports them.
fn perf_metrics(g: &Generation) -> trtllm::PerfMetrics {
    let at = |instant: Instant| g.arrival + (instant - g.start).as_secs_f64();
    trtllm::PerfMetrics {
        arrival_time: g.arrival,
        first_scheduled_time: at(g.scheduled),
        first_token_time: at(g.first_token),
        last_token_time: at(g.schedule.deadline()),
        ..Default::default()
    }
}
