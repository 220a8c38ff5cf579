//! What the OpenTelemetry GenAI semantic conventions call a request of each dialect: its
//! `gen_ai.operation.name` and `gen_ai.provider.name`. The GenAI metric names on
//! `/metrics` and the per-request spans both label requests so, from this one table.
//!
//! The convention's well-known values are used where one applies: `chat`,
//! `text_completion` and `generate_content` for operations; `openai`, `anthropic` and
//! `gcp.gen_ai` for providers (the provider names the API's format, which is what the
//! convention's attribute discriminates; an OpenAI-compatible engine is `openai`). The
//! Gemini dialect serves both Google endpoints, AI Studio's (`gcp.gemini`) and Vertex AI's
//! (`gcp.vertex_ai`), so it is the convention's value for either, `gcp.gen_ai`. The
//! engines' own APIs have no well-known provider, so they take the engine's name as the
//! custom value the convention allows: `ollama`, `tgi`, `triton`, `sglang`, `vllm`,
//! `tensorrt_llm`. Their generate calls take a prompt, not messages: `text_completion`.

use super::types::Dialect;

/// `gen_ai.operation.name` of a request of `dialect` to `path` (Ollama's two APIs share
/// a dialect: `/api/chat` is `chat`, `/api/generate` a `text_completion`).
pub fn operation_name(dialect: Dialect, path: &str) -> &'static str {
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
pub const fn provider_name(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::OpenAiChat | Dialect::OpenAiCompletions | Dialect::OpenAiResponses => "openai",
        Dialect::Anthropic => "anthropic",
        Dialect::Gemini => "gcp.gen_ai",
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
        let table = [
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
                "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
                "generate_content",
                "gcp.gen_ai",
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
                "/v2/models/ensemble/generate_stream",
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
        for (dialect, path, operation, provider) in table {
            assert_eq!(
                operation_name(dialect, path),
                operation,
                "{dialect:?} {path}"
            );
            assert_eq!(provider_name(dialect), provider, "{dialect:?}");
        }
        let covered: std::collections::BTreeSet<&str> =
            table.iter().map(|(d, ..)| d.as_str()).collect();
        assert_eq!(
            covered.len(),
            Dialect::ALL.len(),
            "every dialect is in the table"
        );
    }
}
