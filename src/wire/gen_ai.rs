//! What the OpenTelemetry GenAI semantic conventions call a request of each dialect: its
//! `gen_ai.operation.name` and `gen_ai.provider.name`. The one mapping every consumer
//! uses (per-request spans; GenAI-named metrics), so a dialect is named the same wherever
//! tokentap speaks GenAI.
//!
//! Well-known values where the convention has one (`chat`, `text_completion`,
//! `generate_content`; `openai`, `anthropic`, `gcp.gemini`); for an engine's own API, the
//! engine's name as a custom provider value (`ollama`, `tgi`, `triton`, `sglang`, `vllm`,
//! `tensorrt_llm`). An OpenAI-compatible API is `openai` whoever serves it: the dialect is
//! what tokentap knows, not the engine behind it.

use super::types::Dialect;

/// `gen_ai.operation.name` of a request of `dialect` to `path`: `chat` for a conversation
/// API, `text_completion` for a prompt-in, text-out one, `generate_content` for Gemini.
pub fn operation(dialect: Dialect, path: &str) -> &'static str {
    match dialect {
        Dialect::OpenAiChat | Dialect::OpenAiResponses | Dialect::Anthropic => "chat",
        Dialect::Gemini => "generate_content",
        Dialect::Ollama if path.trim_end_matches('/').ends_with("/api/chat") => "chat",
        Dialect::OpenAiCompletions
        | Dialect::Ollama
        | Dialect::Tgi
        | Dialect::Triton
        | Dialect::SglangGrpc
        | Dialect::VllmGrpc
        | Dialect::TrtllmGrpc
        | Dialect::TritonGrpc => "text_completion",
    }
}

/// `gen_ai.provider.name` of a request of `dialect`.
pub fn provider(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::OpenAiChat | Dialect::OpenAiCompletions | Dialect::OpenAiResponses => "openai",
        Dialect::Anthropic => "anthropic",
        Dialect::Gemini => "gcp.gemini",
        Dialect::Ollama => "ollama",
        Dialect::Tgi => "tgi",
        Dialect::Triton | Dialect::TritonGrpc => "triton",
        Dialect::SglangGrpc => "sglang",
        Dialect::VllmGrpc => "vllm",
        Dialect::TrtllmGrpc => "tensorrt_llm",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialect_has_its_operation_and_provider() {
        let cases = [
            (
                Dialect::OpenAiChat,
                "/v1/chat/completions",
                "chat",
                "openai",
            ),
            (
                Dialect::OpenAiCompletions,
                "/v1/completions",
                "text_completion",
                "openai",
            ),
            (Dialect::OpenAiResponses, "/v1/responses", "chat", "openai"),
            (Dialect::Anthropic, "/v1/messages", "chat", "anthropic"),
            (
                Dialect::Gemini,
                "/v1beta/models/g:streamGenerateContent",
                "generate_content",
                "gcp.gemini",
            ),
            (Dialect::Ollama, "/api/chat", "chat", "ollama"),
            (Dialect::Ollama, "/ollama/api/chat/", "chat", "ollama"),
            (
                Dialect::Ollama,
                "/api/generate",
                "text_completion",
                "ollama",
            ),
            (Dialect::Tgi, "/generate_stream", "text_completion", "tgi"),
            (
                Dialect::Triton,
                "/v2/models/m/generate_stream",
                "text_completion",
                "triton",
            ),
            (
                Dialect::SglangGrpc,
                "/sglang.grpc.scheduler.SglangScheduler/Generate",
                "text_completion",
                "sglang",
            ),
            (
                Dialect::VllmGrpc,
                "/vllm.grpc.engine.VllmEngine/Generate",
                "text_completion",
                "vllm",
            ),
            (
                Dialect::TrtllmGrpc,
                "/trtllm.TrtllmService/Generate",
                "text_completion",
                "tensorrt_llm",
            ),
            (
                Dialect::TritonGrpc,
                "/inference.GRPCInferenceService/ModelStreamInfer",
                "text_completion",
                "triton",
            ),
        ];
        for (dialect, path, op, prov) in cases {
            assert_eq!(operation(dialect, path), op, "{dialect:?} {path}");
            assert_eq!(provider(dialect), prov, "{dialect:?}");
        }
        for dialect in Dialect::ALL {
            assert!(
                cases.iter().any(|(d, ..)| *d == dialect),
                "{dialect:?} has no case"
            );
        }
    }
}
