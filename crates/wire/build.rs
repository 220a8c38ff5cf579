//! Generates `grpc::proto`: the Rust types of the engines' gRPC messages, from the
//! `.proto` files vendored under `proto/` (`proto/README.md` says where each comes from).
//!
//! protox compiles the files in Rust, so a build needs no `protoc`; prost-build writes the
//! types from protox's descriptors (`Config::compile_fds`, which runs no compiler). Only
//! the messages in [`KEEP`] and what they refer to are generated: the vendored files
//! define every RPC of each engine (health, loads, KV events, LoRA, ...), and generating
//! all of them would triple the code compiled for nothing. No service code is generated.

use std::collections::{BTreeSet, HashMap};

use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet};

/// The files compiled, relative to their include directory.
const FILES: [&str; 4] = [
    "sglang_scheduler.proto",
    "vllm_engine.proto",
    "trtllm_service.proto",
    "grpc_service.proto",
];
const INCLUDES: [&str; 2] = ["proto/smg", "proto/triton"];

/// The messages generated (with every message and enum they refer to): each generate
/// RPC's request and response, each engine's model information (a request to these
/// engines names no model) and health answer (the simulator serves both), and Triton's
/// streamed inference request and response.
const KEEP: [&str; 14] = [
    ".sglang.grpc.scheduler.GenerateRequest",
    ".sglang.grpc.scheduler.GenerateResponse",
    ".sglang.grpc.scheduler.GetModelInfoResponse",
    ".sglang.grpc.scheduler.HealthCheckResponse",
    ".vllm.grpc.engine.GenerateRequest",
    ".vllm.grpc.engine.GenerateResponse",
    ".vllm.grpc.engine.GetModelInfoResponse",
    ".vllm.grpc.engine.HealthCheckResponse",
    ".trtllm.GenerateRequest",
    ".trtllm.GenerateResponse",
    ".trtllm.GetModelInfoResponse",
    ".trtllm.HealthCheckResponse",
    ".inference.ModelInferRequest",
    ".inference.ModelStreamInferResponse",
];

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let mut fds = protox::compile(FILES, INCLUDES).unwrap_or_else(|e| panic!("proto/: {e}"));
    prune(&mut fds);
    prost_build::Config::new()
        .include_file("grpc_proto.rs")
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the gRPC types: {e}"));
}

/// Keep only the top-level messages and enums reachable from [`KEEP`], drop services and
/// the well-known types' own files (prost-build maps those to `prost_types`).
fn prune(fds: &mut FileDescriptorSet) {
    // Every top-level message by its full name, with the names its fields refer to.
    let mut refers: HashMap<String, Vec<String>> = HashMap::new();
    for file in &fds.file {
        for message in &file.message_type {
            let name = format!(".{}.{}", file.package(), message.name());
            let mut names = Vec::new();
            referred(message, &mut names);
            refers.insert(name, names);
        }
    }
    let top_level = |name: &str| -> Option<String> {
        let mut prefix = name;
        loop {
            if refers.contains_key(prefix) {
                return Some(prefix.to_owned());
            }
            prefix = &prefix[..prefix.rfind('.')?];
        }
    };
    let mut keep: BTreeSet<String> = BTreeSet::new();
    let mut todo: Vec<String> = KEEP.iter().map(|s| s.to_string()).collect();
    while let Some(name) = todo.pop() {
        let name = top_level(&name).unwrap_or(name);
        if keep.insert(name.clone()) {
            todo.extend(refers.get(&name).into_iter().flatten().cloned());
        }
    }
    for name in KEEP {
        assert!(
            refers.contains_key(name),
            "build.rs KEEP: no message {name}"
        );
    }
    fds.file.retain(|f| f.package() != "google.protobuf");
    for file in &mut fds.file {
        let package = format!(".{}.", file.package());
        let kept = |name: &str| keep.contains(&format!("{package}{name}"));
        file.message_type.retain(|m| kept(m.name()));
        file.enum_type.retain(|e| kept(e.name()));
        file.service.clear();
        // Source locations index the lists just pruned; without them prost-build writes
        // no doc comments, which is all they were for.
        file.source_code_info = None;
    }
    fds.file
        .retain(|f| !f.message_type.is_empty() || !f.enum_type.is_empty());
}

/// The type names a message's fields (and its nested messages' fields) refer to.
fn referred(message: &DescriptorProto, names: &mut Vec<String>) {
    for field in &message.field {
        if matches!(field.r#type(), Type::Message | Type::Enum) {
            names.push(field.type_name().to_owned());
        }
    }
    for nested in &message.nested_type {
        referred(nested, names);
    }
}
