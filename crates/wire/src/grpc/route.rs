//! Which gRPC dialect a request speaks, from its path: a gRPC request's `:path` is
//! `/{package}.{Service}/{Method}`, exactly, so the table matches whole paths. Only the
//! RPCs that stream generated tokens are measured ([`dialect_for_grpc`]); the engines'
//! other RPCs (health, loads, KV events, tokenizer, ...) are not LLM calls and pass
//! through. Their `GetModelInfo` is named apart ([`model_info_rpc`]): it is where the
//! model these engines serve can be read, since their generate requests name none.

use super::super::types::Dialect;

/// The generate RPC of each engine service, by path.
const GENERATE: [(&str, Dialect); 4] = [
    (
        "/sglang.grpc.scheduler.SglangScheduler/Generate",
        Dialect::SglangGrpc,
    ),
    ("/vllm.grpc.engine.VllmEngine/Generate", Dialect::VllmGrpc),
    ("/trtllm.TrtllmService/Generate", Dialect::TrtllmGrpc),
    (
        "/inference.GRPCInferenceService/ModelStreamInfer",
        Dialect::TritonGrpc,
    ),
];

/// The model-information RPC of each engine service whose generate requests name no model.
const MODEL_INFO: [(&str, Dialect); 3] = [
    (
        "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo",
        Dialect::SglangGrpc,
    ),
    (
        "/vllm.grpc.engine.VllmEngine/GetModelInfo",
        Dialect::VllmGrpc,
    ),
    ("/trtllm.TrtllmService/GetModelInfo", Dialect::TrtllmGrpc),
];

/// The dialect of a gRPC request path whose response streams generated tokens, or `None`
/// for any other path. Triton's unary `ModelInfer` is not one: its response is a
/// `ModelInferResponse`, not the stream's `ModelStreamInferResponse`, and it arrives at
/// once.
pub fn dialect_for_grpc(path: &str) -> Option<Dialect> {
    lookup(&GENERATE, path)
}

/// The engine whose `GetModelInfo` RPC `path` is; its response is read by
/// [`model_info_model`](super::model_info::model_info_model).
pub fn model_info_rpc(path: &str) -> Option<Dialect> {
    lookup(&MODEL_INFO, path)
}

fn lookup(table: &[(&str, Dialect)], path: &str) -> Option<Dialect> {
    table.iter().find(|(p, _)| *p == path).map(|(_, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        use Dialect::*;
        let cases: &[(&str, Option<Dialect>, Option<Dialect>)] = &[
            (
                "/sglang.grpc.scheduler.SglangScheduler/Generate",
                Some(SglangGrpc),
                None,
            ),
            (
                "/vllm.grpc.engine.VllmEngine/Generate",
                Some(VllmGrpc),
                None,
            ),
            ("/trtllm.TrtllmService/Generate", Some(TrtllmGrpc), None),
            (
                "/inference.GRPCInferenceService/ModelStreamInfer",
                Some(TritonGrpc),
                None,
            ),
            (
                "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo",
                None,
                Some(SglangGrpc),
            ),
            (
                "/vllm.grpc.engine.VllmEngine/GetModelInfo",
                None,
                Some(VllmGrpc),
            ),
            ("/trtllm.TrtllmService/GetModelInfo", None, Some(TrtllmGrpc)),
            // Not LLM calls: pass through.
            ("/inference.GRPCInferenceService/ModelInfer", None, None),
            ("/inference.GRPCInferenceService/ModelReady", None, None),
            (
                "/sglang.grpc.scheduler.SglangScheduler/HealthCheck",
                None,
                None,
            ),
            ("/vllm.grpc.engine.VllmEngine/Embed", None, None),
            ("/trtllm.TrtllmService/SubscribeKvEvents", None, None),
            ("/grpc.health.v1.Health/Check", None, None),
            ("/mlx.grpc.engine.MlxEngine/Generate", None, None),
            // Exact paths only: gRPC sends no base path and no other spelling.
            (
                "/api/sglang.grpc.scheduler.SglangScheduler/Generate",
                None,
                None,
            ),
            ("/vllm.grpc.engine.VllmEngine/Generate/", None, None),
            ("/vllm.grpc.engine.VllmEngine/generate", None, None),
            ("", None, None),
        ];
        for (path, generate, model_info) in cases {
            assert_eq!(dialect_for_grpc(path), *generate, "{path}");
            assert_eq!(model_info_rpc(path), *model_info, "{path}");
        }
    }
}
