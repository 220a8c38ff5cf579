//! vLLM's `VllmEngine` service: what its messages say (the call itself is served by the
//! parent module, the same for every engine).

use prost::Message;
use tokentap_wire::grpc::proto::vllm::grpc::engine as vllm;

use super::{count, Ask};

pub(super) fn health() -> Vec<u8> {
    vllm::HealthCheckResponse {
        healthy: true,
        message: "ok".into(),
    }
    .encode_to_vec()
}

pub(super) fn model_info(model: &str) -> Vec<u8> {
    vllm::GetModelInfoResponse {
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

/// A `GenerateRequest`: its prompt's token ids (a text prompt: a token per 4 bytes) and
/// `max_tokens`.
pub(super) fn ask(message: &[u8]) -> Option<Ask> {
    use vllm::generate_request::Input;
    let r = vllm::GenerateRequest::decode(message).ok()?;
    let prompt = match &r.input {
        Some(Input::Tokenized(t)) => count(t.input_ids.len()),
        Some(Input::Text(text)) => count(text.len() / 4).max(1),
        None => 0,
    };
    let max = r.sampling_params.as_ref().and_then(|s| s.max_tokens);
    Some(Ask::new(r.request_id, prompt, max, r.stream))
}

/// A `chunk` of `ids`, `done` tokens generated so far.
pub(super) fn chunk(ask: &Ask, ids: Vec<u32>, done: u32) -> Vec<u8> {
    vllm::GenerateResponse {
        response: Some(vllm::generate_response::Response::Chunk(
            vllm::GenerateStreamChunk {
                token_ids: ids,
                prompt_tokens: ask.prompt_tokens,
                completion_tokens: done,
                ..Default::default()
            },
        )),
    }
    .encode_to_vec()
}

/// The `complete` after `tokens` tokens (`ids`); `finish_reason: "error"` is how vLLM
/// reports a failure.
pub(super) fn complete(ask: &Ask, ids: Vec<u32>, tokens: u32, finish_reason: &str) -> Vec<u8> {
    vllm::GenerateResponse {
        response: Some(vllm::generate_response::Response::Complete(
            vllm::GenerateComplete {
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
