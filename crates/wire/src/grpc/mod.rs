//! The engines' gRPC streams: what a gRPC request path is ([`route`]), how a body is cut
//! into messages ([`framing`]), what the messages mean (`engines` for the SGLang, vLLM and
//! TensorRT-LLM generate RPCs, `triton` for Triton's `ModelStreamInfer`), what a
//! request names ([`request`]), the model an engine reports serving ([`model_info`]) and
//! what a call's `grpc-status` says ([`status`]); [`proto`] holds the message types,
//! generated at build time from the vendored `.proto` files.
//!
//! Each dialect's rules are in its module's docs and in `docs/DIALECTS.md`. Every part is
//! sans-IO: bytes in, signals or values out.

pub(crate) mod engines;
pub mod framing;
pub mod model_info;
pub mod proto;
pub mod request;
pub mod route;
pub mod status;
pub(crate) mod triton;
