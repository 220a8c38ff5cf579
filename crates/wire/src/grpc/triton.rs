//! Triton's streaming inference over gRPC, `inference.GRPCInferenceService/ModelStreamInfer`,
//! as TensorRT-LLM (its `tensorrt_llm`, `ensemble` and `tensorrt_llm_bls` models), vLLM's
//! and Python backends stream through it: a decoupled model sends any number of responses
//! to one request.
//!
//! Each response message is a `ModelStreamInferResponse`: an `error_message`, or an
//! `infer_response` (`ModelInferResponse`) with the model's output tensors by name, their
//! data either in `raw_output_contents` (the i-th entry for the i-th output; what Triton
//! sends) or in each tensor's typed `contents`. Rules, per message:
//!
//! - A non-empty `error_message` is [`Signal::Error`]: Triton reports a failure inside a
//!   decoupled model this way, in the stream, with the gRPC status still OK. It is free
//!   text, which names no class ([`ErrorClass::Other`]).
//! - The first non-empty `model_name` is [`Signal::Model`].
//! - An `output_ids` tensor of integers (INT32, as TensorRT-LLM's `tensorrt_llm` model
//!   streams it, or INT64, UINT32, UINT64) with N > 0 elements is one token-bearing event
//!   of [`OutputKind::Content`] carrying N tokens, exact: in streaming mode each response
//!   holds the ids generated since the previous one.
//! - Otherwise a `text_output` tensor (BYTES, as the `ensemble` and BLS models and vLLM's
//!   backend stream it) with a non-empty element is one token-bearing event, estimated:
//!   detokenised text says nothing of how many tokens made it, so the count is the text's
//!   shape ([`estimate_bytes`], at least 1), or with `observe.tokenizer` the tokenizer's
//!   count of its text.
//! - A response whose parameter `triton_final_response` is true is the request's last
//!   ([`Signal::Done`]), sent when the request asked for it
//!   (`triton_enable_empty_final_response`, as `tritonclient` does).
//! - A message that is not a `ModelStreamInferResponse` is [`Signal::Malformed`].
//!
//! Triton reports no usage: N is the sum of the events' counts. One stream may carry
//! several requests (the RPC is bidirectional); they are measured as one.

use prost::Message;

use super::super::error_class::ErrorClass;
use super::super::event_tokens::finish_count;
use super::super::frame::Handler;
use super::super::text_estimate::estimate_bytes;
use super::super::token_stream::TokenStream;
use super::super::tokenize::Tokenizer;
use super::super::types::{OutputKind, Signal};
use super::proto::inference::infer_parameter::ParameterChoice;
use super::proto::inference::model_infer_response::InferOutputTensor;
use super::proto::inference::{ModelInferResponse, ModelStreamInferResponse};

/// The tensor of generated token ids.
const OUTPUT_IDS: &str = "output_ids";
/// The tensor of generated text.
const TEXT_OUTPUT: &str = "text_output";
/// The response parameter that marks a request's last response.
const FINAL_RESPONSE: &str = "triton_final_response";

/// State for one `ModelStreamInfer` response stream.
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamInfer {
    model_sent: bool,
    /// This response's incremental count of `text_output` (`observe.tokenizer`).
    tokens: Option<TokenStream>,
}

impl StreamInfer {
    pub(crate) fn new(tokenizer: Option<Tokenizer>) -> Self {
        StreamInfer {
            tokens: tokenizer.map(|t| t.stream()),
            ..StreamInfer::default()
        }
    }

    /// One message; `streamed` is false for a body read whole, which has no output events.
    fn message(&mut self, message: &[u8], streamed: bool, out: &mut Vec<Signal>) {
        let Ok(message) = ModelStreamInferResponse::decode(message) else {
            out.push(Signal::Malformed);
            return;
        };
        if !message.error_message.is_empty() {
            out.push(Signal::Error(ErrorClass::Other));
            return;
        }
        let Some(response) = message.infer_response else {
            return;
        };
        if !self.model_sent && !response.model_name.is_empty() {
            self.model_sent = true;
            out.push(Signal::Model(response.model_name.clone()));
        }
        if streamed {
            if let Some(output) = self.output(&response) {
                out.push(output);
            }
        }
        let last = response
            .parameters
            .get(FINAL_RESPONSE)
            .is_some_and(|p| matches!(p.parameter_choice, Some(ParameterChoice::BoolParam(true))));
        if last {
            out.push(Signal::Done);
        }
    }

    /// The output event one response is, if it carries output.
    fn output(&mut self, response: &ModelInferResponse) -> Option<Signal> {
        if let Some(ids) = tensor(response, OUTPUT_IDS).and_then(|(t, raw)| token_ids(t, raw)) {
            return (ids > 0).then(|| Signal::Output {
                tokens: u32::try_from(ids).unwrap_or(u32::MAX),
                exact: true,
                kind: OutputKind::Content,
            });
        }
        let (text, raw) = tensor(response, TEXT_OUTPUT)?;
        let mut any = false;
        let mut counted = 0u32;
        let tokens = &mut self.tokens;
        each_bytes(text, raw, &mut |element: &[u8]| {
            if !element.is_empty() {
                any = true;
                let count = match tokens.as_mut() {
                    Some(tokens) => tokens.push_bytes(element),
                    None => u32::try_from(estimate_bytes(element)).unwrap_or(u32::MAX),
                };
                counted = counted.saturating_add(count);
            }
        });
        any.then(|| Signal::Output {
            tokens: if self.tokens.is_some() {
                counted
            } else {
                counted.max(1)
            },
            exact: false,
            kind: OutputKind::Content,
        })
    }
}

impl Handler for StreamInfer {
    fn event(&mut self, _name: &str, data: &[u8], out: &mut Vec<Signal>) {
        self.message(data, true, out);
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        self.message(body, false, out);
    }

    fn finish(&mut self, out: &mut Vec<Signal>) {
        finish_count(&mut self.tokens, out);
    }
}

/// The output tensor named `name`, with its raw bytes if the response sent them raw.
fn tensor<'a>(
    response: &'a ModelInferResponse,
    name: &str,
) -> Option<(&'a InferOutputTensor, Option<&'a [u8]>)> {
    let (index, tensor) = response
        .outputs
        .iter()
        .enumerate()
        .find(|(_, t)| t.name == name)?;
    let raw = response.raw_output_contents.get(index).map(Vec::as_slice);
    Some((tensor, raw))
}

/// How many token ids an integer tensor holds; `None` if it is not an integer tensor.
fn token_ids(tensor: &InferOutputTensor, raw: Option<&[u8]>) -> Option<usize> {
    let width = match tensor.datatype.as_str() {
        "INT32" | "UINT32" => 4,
        "INT64" | "UINT64" => 8,
        _ => return None,
    };
    if let Some(raw) = raw {
        return raw.len().checked_div(width);
    }
    let contents = tensor.contents.as_ref()?;
    Some(
        contents
            .int_contents
            .len()
            .saturating_add(contents.int64_contents.len())
            .saturating_add(contents.uint_contents.len())
            .saturating_add(contents.uint64_contents.len()),
    )
}

/// Each element of a BYTES tensor: from the raw bytes (each element a 4-byte
/// little-endian length and that many bytes; a length past the end stops the walk), else
/// from `contents`.
fn each_bytes(tensor: &InferOutputTensor, raw: Option<&[u8]>, f: &mut dyn FnMut(&[u8])) {
    if tensor.datatype != "BYTES" {
        return;
    }
    if let Some(mut raw) = raw {
        while let Some((len, rest)) = raw.split_first_chunk::<4>() {
            let len = usize::try_from(u32::from_le_bytes(*len)).unwrap_or(usize::MAX);
            let Some((element, rest)) = rest.split_at_checked(len) else {
                return;
            };
            f(element);
            raw = rest;
        }
        return;
    }
    for element in tensor.contents.iter().flat_map(|c| &c.bytes_contents) {
        f(element);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::grpc::framing::frame;
    use crate::grpc::proto::inference::{InferParameter, InferTensorContents};
    use crate::testing::grpc;
    use Signal::{Done, Error, Malformed, Model};

    const TEXT: Signal = Signal::Output {
        tokens: 1,
        exact: false,
        kind: OutputKind::Content,
    };

    /// A text event of `n` estimated tokens.
    fn words(n: u32) -> Signal {
        Signal::Output {
            tokens: n,
            exact: false,
            kind: OutputKind::Content,
        }
    }

    fn ids(n: u32) -> Signal {
        Signal::Output {
            tokens: n,
            exact: true,
            kind: OutputKind::Content,
        }
    }

    /// A BYTES tensor's raw form.
    fn raw_bytes(elements: &[&str]) -> Vec<u8> {
        elements
            .iter()
            .flat_map(|e| {
                let mut out = (e.len() as u32).to_le_bytes().to_vec();
                out.extend_from_slice(e.as_bytes());
                out
            })
            .collect()
    }

    fn output(name: &str, datatype: &str, shape: &[i64]) -> InferOutputTensor {
        InferOutputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            ..Default::default()
        }
    }

    fn message(response: ModelInferResponse) -> Vec<u8> {
        frame(
            &ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(response),
            }
            .encode_to_vec(),
        )
    }

    fn text(model: &str, elements: &[&str], last: bool) -> Vec<u8> {
        let mut parameters = HashMap::new();
        if last {
            parameters.insert(
                FINAL_RESPONSE.to_string(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::BoolParam(true)),
                },
            );
        }
        message(ModelInferResponse {
            model_name: model.into(),
            model_version: "1".into(),
            id: "req-1".into(),
            parameters,
            outputs: vec![output(TEXT_OUTPUT, "BYTES", &[1, elements.len() as i64])],
            raw_output_contents: vec![raw_bytes(elements)],
        })
    }

    #[test]
    fn ensemble_text_stream_with_its_final_response() {
        let body = [
            text("ensemble", &[" Deep"], false),
            text("ensemble", &[""], false),
            text("ensemble", &[" learning", " is"], false),
            text("ensemble", &[], true),
        ]
        .concat();
        assert_eq!(
            grpc(StreamInfer::default(), &body),
            vec![Model("ensemble".into()), TEXT, words(2), Done],
            "\" learning\" and \" is\" are two words, so two tokens estimated"
        );
    }

    #[test]
    fn token_ids_are_exact_raw_or_typed() {
        let raw = message(ModelInferResponse {
            model_name: "tensorrt_llm".into(),
            outputs: vec![
                output(TEXT_OUTPUT, "BYTES", &[1, 1]),
                output(OUTPUT_IDS, "INT32", &[1, 1, 3]),
            ],
            raw_output_contents: vec![
                raw_bytes(&["abc"]),
                [1i32, 2, 3].iter().flat_map(|i| i.to_le_bytes()).collect(),
            ],
            ..Default::default()
        });
        let typed = message(ModelInferResponse {
            outputs: vec![InferOutputTensor {
                contents: Some(InferTensorContents {
                    int64_contents: vec![4, 5],
                    ..Default::default()
                }),
                ..output(OUTPUT_IDS, "INT64", &[1, 1, 2])
            }],
            ..Default::default()
        });
        let empty = message(ModelInferResponse {
            outputs: vec![output(OUTPUT_IDS, "INT32", &[1, 1, 0])],
            raw_output_contents: vec![vec![]],
            ..Default::default()
        });
        let body = [raw, typed, empty].concat();
        assert_eq!(
            grpc(StreamInfer::default(), &body),
            vec![Model("tensorrt_llm".into()), ids(3), ids(2)]
        );
    }

    #[test]
    fn typed_text_and_a_float_output_ids_tensor() {
        // An `output_ids` that is not integers says nothing of tokens: the text decides.
        let body = message(ModelInferResponse {
            outputs: vec![
                output(OUTPUT_IDS, "FP32", &[1]),
                InferOutputTensor {
                    contents: Some(InferTensorContents {
                        bytes_contents: vec![b"hi".to_vec()],
                        ..Default::default()
                    }),
                    ..output(TEXT_OUTPUT, "BYTES", &[1])
                },
            ],
            raw_output_contents: vec![vec![0; 4]],
            ..Default::default()
        });
        assert_eq!(grpc(StreamInfer::default(), &body), vec![TEXT]);
    }

    #[test]
    fn a_tokenizer_counts_the_text_as_one_text() {
        use std::sync::Arc;

        use crate::tokenize::TokenCounter;
        let words = Tokenizer::new(
            "words",
            Arc::new(|t: &str| t.split_whitespace().count()) as Arc<dyn TokenCounter>,
        );
        // "one two" settles 1 ("two" may go on); " three fo" settles 2; "ur" ends "four",
        // which only the end settles. Token ids, where sent, are counted, not tokenized.
        let body = [
            text("m", &["one two"], false),
            text("m", &[" three fo", ""], false),
            text("m", &["ur"], true),
            message(ModelInferResponse {
                outputs: vec![output(OUTPUT_IDS, "INT32", &[1, 1, 1])],
                raw_output_contents: vec![7i32.to_le_bytes().to_vec()],
                ..Default::default()
            }),
        ]
        .concat();
        let estimated = |n| Signal::Output {
            tokens: n,
            exact: false,
            kind: OutputKind::Content,
        };
        assert_eq!(
            grpc(StreamInfer::new(Some(words)), &body),
            vec![
                Model("m".into()),
                estimated(1),
                estimated(2),
                estimated(0),
                Done,
                ids(1),
                Signal::TrailingTokens(1),
            ]
        );
    }

    #[test]
    fn errors_and_garbage() {
        let error = frame(
            &ModelStreamInferResponse {
                error_message: "in ensemble 'ensemble', Executor failed process requestId 3".into(),
                infer_response: None,
            }
            .encode_to_vec(),
        );
        // A BYTES element whose length runs past the end: what came before it counts.
        let truncated = message(ModelInferResponse {
            outputs: vec![output(TEXT_OUTPUT, "BYTES", &[2])],
            raw_output_contents: vec![[raw_bytes(&["ok"]), vec![9, 0, 0, 0, b'x']].concat()],
            ..Default::default()
        });
        let body = [frame(&[0x0a, 0x05, b'a']), truncated, error].concat();
        assert_eq!(
            grpc(StreamInfer::default(), &body),
            vec![Malformed, TEXT, Error(ErrorClass::Other)]
        );
    }
}
