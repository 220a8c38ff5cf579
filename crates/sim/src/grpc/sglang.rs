//! SGLang's `SglangScheduler` service: what its messages say (the call itself is served
//! by the parent module, the same for every engine).

use prost::Message;
use tokentap_wire::grpc::proto::sglang::grpc::scheduler as sglang;

use super::{count, Ask};

pub(super) fn health() -> Vec<u8> {
    sglang::HealthCheckResponse {
        healthy: true,
        message: "ok".into(),
    }
    .encode_to_vec()
}

pub(super) fn model_info(model: &str) -> Vec<u8> {
    sglang::GetModelInfoResponse {
        model_path: model.into(),
        served_model_name: model.into(),
        tokenizer_path: model.into(),
        is_generation: true,
        max_context_length: 32768,
        vocab_size: 32000,
        ..Default::default()
    }
    .encode_to_vec()
}

/// A `GenerateRequest`: its prompt's token ids and `max_new_tokens`.
pub(super) fn ask(message: &[u8]) -> Option<Ask> {
    let r = sglang::GenerateRequest::decode(message).ok()?;
    let prompt = r.tokenized.as_ref().map_or(0, |t| count(t.input_ids.len()));
    let max = r.sampling_params.as_ref().and_then(|s| s.max_new_tokens);
    Some(Ask::new(r.request_id, prompt, max, r.stream))
}

/// A `chunk` of `ids`, `done` tokens generated so far.
pub(super) fn chunk(ask: &Ask, ids: Vec<u32>, done: u32) -> Vec<u8> {
    sglang::GenerateResponse {
        request_id: ask.request_id.clone(),
        response: Some(sglang::generate_response::Response::Chunk(
            sglang::GenerateStreamChunk {
                token_ids: ids,
                prompt_tokens: ask.prompt_tokens,
                completion_tokens: done,
                ..Default::default()
            },
        )),
    }
    .encode_to_vec()
}

/// The `complete` after `tokens` tokens (`ids`).
pub(super) fn complete(ask: &Ask, ids: Vec<u32>, tokens: u32, finish_reason: &str) -> Vec<u8> {
    sglang::GenerateResponse {
        request_id: ask.request_id.clone(),
        response: Some(sglang::generate_response::Response::Complete(
            sglang::GenerateComplete {
                output_ids: ids,
                finish_reason: finish_reason.into(),
                prompt_tokens: ask.prompt_tokens,
                completion_tokens: tokens,
                ..Default::default()
            },
        )),
    }
    .encode_to_vec()
}
