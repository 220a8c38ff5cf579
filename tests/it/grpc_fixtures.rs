//! The gRPC fixtures in `tests/fixtures/{sglang,vllm,trtllm,triton}_grpc/`: response
//! streams as the engines send them, built here from the engines' own message types (the
//! ones `crates/wire/build.rs` generates from `crates/wire/proto/`) and framed. The files
//! are what `wire_fixtures` decodes against their goldens (and the fuzz targets seed
//! from); this module checks that each file is still exactly what its builder encodes, so
//! the fixtures follow the vendored protos, and that compressing any of their messages
//! (`grpc-encoding` gzip, deflate or zstd) and splitting the body anywhere changes no
//! signal.
//!
//! After changing a builder, write the files with
//! `TOKENTAP_WRITE_GRPC_FIXTURES=1 cargo test --test it grpc_fixtures::` and review the
//! goldens.

use std::collections::HashMap;

use proptest::prelude::*;
use prost::Message;
use tokentap::wire::grpc::framing::{frame, frame_with, MessageEncoding, MessageReader};
use tokentap::wire::grpc::proto::inference::infer_parameter::ParameterChoice;
use tokentap::wire::grpc::proto::inference::model_infer_response::InferOutputTensor;
use tokentap::wire::grpc::proto::inference::{
    InferParameter, ModelInferResponse, ModelStreamInferResponse,
};
use tokentap::wire::grpc::proto::sglang::grpc::scheduler as sglang;
use tokentap::wire::grpc::proto::trtllm;
use tokentap::wire::grpc::proto::vllm::grpc::engine as vllm;
use tokentap::wire::{decoder, DecodeLimits, DecodeOptions, Framing};

use super::wire_fixtures::{fixture_root, fixtures, frame_sizes, run, split};

/// Every gRPC fixture: its path under `tests/fixtures` and its body.
fn built() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("sglang_grpc/generate_stream.grpc", sglang_stream()),
        ("sglang_grpc/generate.grpc", sglang_unary()),
        ("vllm_grpc/generate_stream.grpc", vllm_stream("length")),
        ("vllm_grpc/generate_stream_error.grpc", vllm_stream("error")),
        ("trtllm_grpc/generate_stream.grpc", trtllm_stream(None)),
        (
            "trtllm_grpc/generate_stream_perf_metrics.grpc",
            trtllm_stream(Some(trtllm::PerfMetrics {
                arrival_time: 1_764_770_000.125,
                first_scheduled_time: 1_764_770_000.187_5,
                first_token_time: 1_764_770_000.312_5,
                last_token_time: 1_764_770_000.5,
                ..Default::default()
            })),
        ),
        ("triton_grpc/model_stream_infer.grpc", triton_text()),
        ("triton_grpc/model_stream_infer_ids.grpc", triton_ids()),
        ("triton_grpc/model_stream_infer_error.grpc", triton_error()),
    ]
}

fn sglang_message(response: sglang::generate_response::Response) -> Vec<u8> {
    frame(
        &sglang::GenerateResponse {
            request_id: "a1b2c3".into(),
            response: Some(response),
        }
        .encode_to_vec(),
    )
}

/// A streamed SGLang call as SMG sees it: chunks of new ids with cumulative counts (one
/// empty; the first four ids are the model's reasoning), then the complete with every id
/// and the usage.
fn sglang_stream() -> Vec<u8> {
    use sglang::generate_response::Response;
    let chunk = |ids: &[u32], completion: u32, reasoning: u32| {
        sglang_message(Response::Chunk(sglang::GenerateStreamChunk {
            token_ids: ids.to_vec(),
            prompt_tokens: 12,
            completion_tokens: completion,
            cached_tokens: 8,
            reasoning_tokens: reasoning,
            ..Default::default()
        }))
    };
    [
        chunk(&[791, 4320, 315], 3, 3),
        chunk(&[5780], 4, 4),
        chunk(&[], 4, 4),
        chunk(&[374, 264], 6, 4),
        chunk(&[1296, 13, 578, 128009], 10, 4),
        sglang_message(Response::Complete(sglang::GenerateComplete {
            output_ids: vec![791, 4320, 315, 5780, 374, 264, 1296, 13, 578, 128009],
            finish_reason: "stop".into(),
            prompt_tokens: 12,
            completion_tokens: 10,
            cached_tokens: 8,
            reasoning_tokens: 4,
            matched_stop: Some(sglang::generate_complete::MatchedStop::MatchedTokenId(
                128009,
            )),
            ..Default::default()
        })),
    ]
    .concat()
}

/// The same engine answering `stream: false`: one complete.
fn sglang_unary() -> Vec<u8> {
    sglang_message(sglang::generate_response::Response::Complete(
        sglang::GenerateComplete {
            output_ids: vec![40, 1097, 264, 4221],
            finish_reason: "length".into(),
            prompt_tokens: 7,
            completion_tokens: 4,
            ..Default::default()
        },
    ))
}

fn vllm_message(response: vllm::generate_response::Response) -> Vec<u8> {
    frame(
        &vllm::GenerateResponse {
            response: Some(response),
        }
        .encode_to_vec(),
    )
}

/// vLLM streaming two outputs (`n: 2`) interleaved, ending with `finish`; 16 of the 20
/// prompt tokens were a prefix-cache hit.
fn vllm_stream(finish: &str) -> Vec<u8> {
    use vllm::generate_response::Response;
    let chunk = |ids: &[u32], index: u32| {
        vllm_message(Response::Chunk(vllm::GenerateStreamChunk {
            token_ids: ids.to_vec(),
            prompt_tokens: 20,
            cached_tokens: 16,
            index,
            ..Default::default()
        }))
    };
    let complete = |ids: &[u32], index: u32| {
        vllm_message(Response::Complete(vllm::GenerateComplete {
            output_ids: ids.to_vec(),
            finish_reason: finish.into(),
            prompt_tokens: 20,
            completion_tokens: ids.len() as u32,
            cached_tokens: 16,
            index,
            ..Default::default()
        }))
    };
    [
        chunk(&[9906], 0),
        chunk(&[13347, 11], 1),
        chunk(&[11, 1917], 0),
        chunk(&[1917], 1),
        complete(&[9906, 11, 1917], 0),
        complete(&[13347, 11, 1917], 1),
    ]
    .concat()
}

/// TensorRT-LLM with speculative decoding: each step accepts 1 to 4 tokens. With `perf`,
/// the complete carries the `perf_metrics` a client that set `return_perf_metrics` gets.
fn trtllm_stream(perf: Option<trtllm::PerfMetrics>) -> Vec<u8> {
    use trtllm::generate_response::Response;
    let message = |response| {
        frame(
            &trtllm::GenerateResponse {
                request_id: "trt-7".into(),
                response: Some(response),
            }
            .encode_to_vec(),
        )
    };
    let chunk = |ids: &[u32]| {
        message(Response::Chunk(trtllm::GenerateStreamChunk {
            token_ids: ids.to_vec(),
            prompt_tokens: 30,
            ..Default::default()
        }))
    };
    let all: Vec<u32> = (1000..1010).collect();
    [
        chunk(&all[..1]),
        chunk(&all[1..5]),
        chunk(&all[5..7]),
        chunk(&all[7..10]),
        message(Response::Complete(trtllm::GenerateComplete {
            output_token_ids: all.clone(),
            finish_reason: "stop".into(),
            prompt_tokens: 30,
            completion_tokens: 10,
            spec_accepted_tokens: 6,
            spec_draft_tokens: 12,
            perf_metrics: perf,
            ..Default::default()
        })),
    ]
    .concat()
}

fn triton_message(response: ModelInferResponse) -> Vec<u8> {
    frame(
        &ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(response),
        }
        .encode_to_vec(),
    )
}

fn final_response() -> HashMap<String, InferParameter> {
    HashMap::from([(
        "triton_final_response".to_string(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(true)),
        },
    )])
}

fn bytes_tensor(elements: &[&str]) -> (InferOutputTensor, Vec<u8>) {
    let tensor = InferOutputTensor {
        name: "text_output".into(),
        datatype: "BYTES".into(),
        shape: vec![1, elements.len() as i64],
        ..Default::default()
    };
    let raw = elements
        .iter()
        .flat_map(|e| [&(e.len() as u32).to_le_bytes()[..], e.as_bytes()].concat())
        .collect();
    (tensor, raw)
}

/// The TensorRT-LLM `ensemble` model streaming text, with the empty final response
/// `tritonclient` asks for.
fn triton_text() -> Vec<u8> {
    let text = |piece: &str, last: bool| {
        let (tensor, raw) = bytes_tensor(&[piece]);
        triton_message(ModelInferResponse {
            model_name: "ensemble".into(),
            model_version: "1".into(),
            id: "42".into(),
            parameters: if last {
                final_response()
            } else {
                HashMap::new()
            },
            outputs: vec![tensor],
            raw_output_contents: vec![raw],
        })
    };
    [
        text(" Machine", false),
        text(" learning", false),
        text("", false),
        text(" is a", false),
        text(" field", false),
        text("", true),
    ]
    .concat()
}

/// The `tensorrt_llm` model itself: `output_ids` (INT32) and `sequence_length` per step.
fn triton_ids() -> Vec<u8> {
    let step = |ids: &[i32], last: bool| {
        let ids_tensor = InferOutputTensor {
            name: "output_ids".into(),
            datatype: "INT32".into(),
            shape: vec![1, 1, ids.len() as i64],
            ..Default::default()
        };
        let length = InferOutputTensor {
            name: "sequence_length".into(),
            datatype: "INT32".into(),
            shape: vec![1, 1],
            ..Default::default()
        };
        triton_message(ModelInferResponse {
            model_name: "tensorrt_llm".into(),
            model_version: "1".into(),
            id: "7".into(),
            parameters: if last {
                final_response()
            } else {
                HashMap::new()
            },
            outputs: vec![ids_tensor, length],
            raw_output_contents: vec![
                ids.iter().flat_map(|i| i.to_le_bytes()).collect(),
                (ids.len() as i32).to_le_bytes().to_vec(),
            ],
        })
    };
    [
        step(&[22557], false),
        step(&[11, 1917], false),
        step(&[0; 0], false),
        step(&[13, 358, 1097], false),
        step(&[2], true),
    ]
    .concat()
}

/// A BLS model failing mid-stream: an error message after two responses.
fn triton_error() -> Vec<u8> {
    let text = |piece: &str| {
        let (tensor, raw) = bytes_tensor(&[piece]);
        triton_message(ModelInferResponse {
            model_name: "tensorrt_llm_bls".into(),
            model_version: "1".into(),
            outputs: vec![tensor],
            raw_output_contents: vec![raw],
            ..Default::default()
        })
    };
    [
        text(" Deep"),
        text(" learning"),
        frame(
            &ModelStreamInferResponse {
                error_message: "Executor failed process requestId 3 due to the following \
                                error: Encountered an error in forwardAsync function"
                    .into(),
                infer_response: None,
            }
            .encode_to_vec(),
        ),
    ]
    .concat()
}

#[test]
fn the_grpc_fixtures_are_the_engines_messages() {
    let write = std::env::var_os("TOKENTAP_WRITE_GRPC_FIXTURES").is_some();
    for (path, body) in built() {
        let file = fixture_root().join(path);
        if write {
            std::fs::create_dir_all(file.parent().expect("a directory")).expect("mkdir");
            std::fs::write(&file, &body).expect("write fixture");
        }
        let on_disk = std::fs::read(&file).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(on_disk == body, "{path}: not what its builder encodes");
    }
    // And nothing in those directories that no builder makes.
    let fixtures = fixtures();
    let grpc: Vec<&str> = fixtures
        .iter()
        .filter(|f| f.dialect.is_grpc())
        .map(|f| f.name.as_str())
        .collect();
    let paths: Vec<&str> = built().into_iter().map(|(p, _)| p).collect();
    for name in grpc {
        assert!(paths.contains(&name), "{name}: no builder");
    }
}

/// A fixture's messages, as framed in the file.
fn messages(body: &[u8]) -> Vec<Vec<u8>> {
    let mut reader = MessageReader::new(usize::MAX, MessageEncoding::Identity);
    let mut out = Vec::new();
    reader
        .feed(body, &mut |m| out.push(m.to_vec()))
        .expect("a fixture frames");
    assert!(!reader.finish());
    out
}

fn compress(encoding: &str, message: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match encoding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(message).expect("compress");
            e.finish().expect("finish")
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(message).expect("compress");
            e.finish().expect("finish")
        }
        _ => zstd::bulk::compress(message, 3).expect("zstd"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_message_compression_of_a_grpc_fixture_gives_its_golden(
        index in any::<prop::sample::Index>(),
        mask in any::<u64>(),
        encoding in prop::sample::select(vec!["gzip", "deflate", "zstd"]),
        sizes in frame_sizes(),
    ) {
        let all: Vec<_> = fixtures().into_iter().filter(|f| f.dialect.is_grpc()).collect();
        let fx = &all[index.index(all.len())];
        let body: Vec<u8> = messages(&fx.body)
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                if mask >> (i % 64) & 1 == 1 {
                    frame_with(true, &compress(encoding, m))
                } else {
                    frame(m)
                }
            })
            .collect();
        let options = DecodeOptions {
            grpc_encoding: Some(encoding.as_bytes()),
            ..DecodeOptions::new(DecodeLimits::DEFAULT)
        };
        let got = run(decoder(fx.dialect, Framing::Grpc, options), split(&body, &sizes));
        prop_assert_eq!(&got, &fx.golden, "{} ({})", fx.name, encoding);
    }
}
