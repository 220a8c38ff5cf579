//! The model an engine serves, from its `GetModelInfo` answer: the SMG engines' generate
//! requests and responses name no model (a router sends each worker requests for the one
//! model it serves), so this answer, which the router asks for when it registers a worker,
//! is where an observer of that connection can learn it.
//!
//! | dialect | field |
//! |---|---|
//! | `sglang_grpc` | `served_model_name`, else `model_path` |
//! | `vllm_grpc` | `served_model_name`, else `model_path` |
//! | `trtllm_grpc` | `model_id` |
//!
//! Triton's requests name their model (`ModelInferRequest.model_name`), so it has none here.

use prost::Message;

use super::super::types::Dialect;
use super::proto::sglang::grpc::scheduler as sglang;
use super::proto::trtllm;
use super::proto::vllm::grpc::engine as vllm;

/// The model named by one `GetModelInfoResponse` message (unframed) of `dialect`'s engine;
/// `None` for a message that is not one, names none, or a dialect without such an RPC.
pub fn model_info_model(dialect: Dialect, message: &[u8]) -> Option<String> {
    let (served, path) = match dialect {
        Dialect::SglangGrpc => {
            let info = sglang::GetModelInfoResponse::decode(message).ok()?;
            (info.served_model_name, info.model_path)
        }
        Dialect::VllmGrpc => {
            let info = vllm::GetModelInfoResponse::decode(message).ok()?;
            (info.served_model_name, info.model_path)
        }
        Dialect::TrtllmGrpc => {
            let info = trtllm::GetModelInfoResponse::decode(message).ok()?;
            (info.model_id, String::new())
        }
        _ => return None,
    };
    [served, path].into_iter().find(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_names_its_model() {
        let sglang = sglang::GetModelInfoResponse {
            model_path: "/models/llama".into(),
            served_model_name: "llama-3.1-8b".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let vllm_path_only = vllm::GetModelInfoResponse {
            model_path: "Qwen/Qwen3-8B".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let trtllm = trtllm::GetModelInfoResponse {
            model_id: "mistral".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let cases: [(Dialect, &[u8], Option<&str>); 6] = [
            (Dialect::SglangGrpc, &sglang, Some("llama-3.1-8b")),
            (Dialect::VllmGrpc, &vllm_path_only, Some("Qwen/Qwen3-8B")),
            (Dialect::TrtllmGrpc, &trtllm, Some("mistral")),
            (Dialect::TrtllmGrpc, b"", None),
            (Dialect::SglangGrpc, b"\xff", None),
            (Dialect::TritonGrpc, &sglang, None),
        ];
        for (dialect, message, want) in cases {
            assert_eq!(
                model_info_model(dialect, message).as_deref(),
                want,
                "{dialect}"
            );
        }
    }
}
