//! Triton's `GRPCInferenceService/ModelStreamInfer`: what its request messages ask and
//! what its responses say (the bidirectional call itself is served by the parent module:
//! each request message as it arrives becomes a [`Generation`] of its own).

use std::collections::HashMap;

use prost::Message;
use tokentap_wire::grpc::proto::inference::infer_parameter::ParameterChoice;
use tokentap_wire::grpc::proto::inference::model_infer_response::InferOutputTensor;
use tokentap_wire::grpc::proto::inference::{
    InferParameter, ModelInferRequest, ModelInferResponse, ModelStreamInferResponse,
};

use super::{count, Ask, Generation};

/// A `ModelInferRequest`: its `model_name`, INT32 or INT64 `max_tokens` input, BOOL
/// `stream` input (default true) and `triton_enable_empty_final_response` parameter.
pub(super) fn ask(message: &[u8]) -> Option<Ask> {
    let r = ModelInferRequest::decode(message).ok()?;
    let input = |name: &str| {
        r.inputs
            .iter()
            .enumerate()
            .find(|(_, t)| t.name == name)
            .map(|(i, t)| (t, r.raw_input_contents.get(i)))
    };
    let max_tokens = input("max_tokens").and_then(|(t, raw)| match raw {
        Some(raw) if t.datatype == "INT64" => raw
            .first_chunk::<8>()
            .map(|b| u32::try_from(i64::from_le_bytes(*b).max(0)).unwrap_or(u32::MAX)),
        Some(raw) => raw
            .first_chunk::<4>()
            .map(|b| u32::try_from(i32::from_le_bytes(*b).max(0)).unwrap_or(0)),
        None => t.contents.as_ref().and_then(|c| {
            c.int_contents
                .first()
                .map(|v| u32::try_from(*v).unwrap_or(0))
                .or_else(|| {
                    c.int64_contents
                        .first()
                        .map(|v| u32::try_from(*v).unwrap_or(0))
                })
        }),
    });
    let stream = input("stream").is_none_or(|(t, raw)| match raw {
        Some(raw) => raw.first().is_some_and(|b| *b != 0),
        None => t
            .contents
            .as_ref()
            .and_then(|c| c.bool_contents.first().copied())
            .unwrap_or(true),
    });
    let empty_final = r
        .parameters
        .get("triton_enable_empty_final_response")
        .is_some_and(|p| matches!(p.parameter_choice, Some(ParameterChoice::BoolParam(true))));
    Some(Ask {
        request_id: r.id,
        prompt_tokens: 0,
        max_tokens: max_tokens.filter(|m| *m > 0),
        stream,
        model: (!r.model_name.is_empty()).then_some(r.model_name),
        empty_final,
        perf_metrics: false,
    })
}

/// A response of `generation` carrying `ids` (none: the empty final response).
pub(super) fn response(generation: &Generation, ids: &[u32], last: bool) -> Vec<u8> {
    let mut parameters = HashMap::new();
    parameters.insert(
        "triton_final_response".to_string(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(last)),
        },
    );
    let (outputs, raw) = if ids.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        let text: String = ids.iter().map(|id| format!(" t{id}")).collect();
        let mut text_raw = count(text.len()).to_le_bytes().to_vec();
        text_raw.extend_from_slice(text.as_bytes());
        let ids_raw: Vec<u8> = ids
            .iter()
            .flat_map(|id| i32::try_from(*id).unwrap_or(0).to_le_bytes())
            .collect();
        (
            vec![
                InferOutputTensor {
                    name: "output_ids".into(),
                    datatype: "INT32".into(),
                    shape: vec![1, i64::from(count(ids.len()))],
                    ..Default::default()
                },
                InferOutputTensor {
                    name: "text_output".into(),
                    datatype: "BYTES".into(),
                    shape: vec![1],
                    ..Default::default()
                },
            ],
            vec![ids_raw, text_raw],
        )
    };
    ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(ModelInferResponse {
            model_name: generation.model.clone(),
            model_version: "1".into(),
            id: generation.ask.request_id.clone(),
            parameters,
            outputs,
            raw_output_contents: raw,
        }),
    }
    .encode_to_vec()
}

/// A response that reports an error in the stream (`error_message`), as Triton does.
pub(super) fn error(message: String) -> Vec<u8> {
    ModelStreamInferResponse {
        error_message: message,
        infer_response: None,
    }
    .encode_to_vec()
}
