//! The gRPC dialects (SGLang, vLLM, TensorRT-LLM, Triton): framed bodies as they come, or
//! messages the harness frames and compresses; whole and split decoding and request
//! scanning agree, and compression changes no signal.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tokentap_fuzz::check_grpc(data));
