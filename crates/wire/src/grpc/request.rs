//! Reads the model and the `stream` flag from a gRPC request body as it streams upstream,
//! as [`RequestScanner`](super::super::request::RequestScanner) does for JSON bodies.
//!
//! The body is never buffered: after the first message's prefix ([`Prefix`], the framing
//! the responses use), a protobuf field walker steps through the message's top-level
//! fields, skipping every value it does not want without keeping it (a prompt's token ids,
//! an image's pixels), and keeps only the few short ones it does. Memory is a few hundred
//! bytes whatever the request's size. Only the first message is read: a unary or
//! server-streaming call has one, and the first of a bidirectional `ModelStreamInfer`
//! names what the others do.
//!
//! | dialect | model | stream |
//! |---|---|---|
//! | `sglang_grpc` | – (a worker serves one model: see [`super::model_info`]) | `GenerateRequest.stream` (field 17) |
//! | `vllm_grpc` | – | `GenerateRequest.stream` (5) |
//! | `trtllm_grpc` | – | `GenerateRequest.streaming` (6) |
//! | `triton_grpc` | `ModelInferRequest.model_name` (1) | the BOOL input tensor named `stream` (`inputs`, 5, with its value in `contents` or in the matching `raw_input_contents`, 7), as TensorRT-LLM's and vLLM's models take it |
//!
//! A proto3 `bool` that is false is not sent, so a first message read to its end without
//! the flag says `false` for the SMG engines (Triton's `stream` input, when absent, is the
//! model's default: unknown). A model name longer than
//! [`MAX_VALUE`] bytes is reported as too long, not kept.
//! A first message that is compressed, or anything that is not a protobuf message, ends
//! the scan with nothing more learnt.

use prost::Message;

use super::super::request::MAX_VALUE;
use super::super::types::Dialect;
use super::framing::Prefix;
use super::proto::inference::model_infer_request::InferInputTensor;

/// Largest `inputs` entry of a Triton request decoded to look for the `stream` tensor; a
/// larger one carries its data inline and is not the one-element flag.
const MAX_INPUT_BYTES: usize = 4 << 10;

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// What a field of the first message is to the scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// The SMG engines' stream flag (a varint).
    Stream,
    /// Triton's `model_name`.
    Model,
    /// One of Triton's `inputs`.
    Input,
    /// One of Triton's `raw_input_contents`.
    Raw,
}

/// Where the walker is in the first message.
#[derive(Clone, Debug)]
enum Step {
    /// Reading a field's tag.
    Tag(Varint),
    /// Reading a varint value of field `want` (`None`: not wanted).
    Value(Option<Want>, Varint),
    /// Reading the length of a length-delimited field.
    Length(Option<Want>, Varint),
    /// Skipping the rest of a value.
    Skip(u64),
    /// Keeping a wanted length-delimited value of `len` bytes.
    Keep(Want, usize, Vec<u8>),
}

#[derive(Clone, Debug)]
enum State {
    Prefix(Prefix),
    /// In the first message, with `left` of its bytes still to come.
    Message {
        left: u64,
        step: Step,
    },
    /// Nothing more to learn.
    Done,
}

/// Incremental scanner of a gRPC request body for its model and stream flag.
#[derive(Clone, Debug)]
pub struct GrpcRequestScanner {
    dialect: Dialect,
    state: State,
    model: Option<String>,
    model_too_long: bool,
    stream: Option<bool>,
    /// Triton: `inputs` seen so far, the index of the `stream` input whose value is raw,
    /// and `raw_input_contents` seen so far.
    inputs: usize,
    stream_input: Option<usize>,
    raws: usize,
}

impl GrpcRequestScanner {
    /// A scanner for a request of `dialect` (a gRPC dialect; any other learns nothing).
    pub fn new(dialect: Dialect) -> Self {
        GrpcRequestScanner {
            dialect,
            state: if dialect.is_grpc() {
                State::Prefix(Prefix::default())
            } else {
                State::Done
            },
            model: None,
            model_too_long: false,
            stream: None,
            inputs: 0,
            stream_input: None,
            raws: 0,
        }
    }

    /// The model found so far.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Whether the model is a string too long to keep: present, so not "missing", but with
    /// no value a label could use.
    pub fn model_too_long(&self) -> bool {
        self.model_too_long
    }

    /// The stream flag found so far.
    pub fn stream(&self) -> Option<bool> {
        self.stream
    }

    /// Whether there is nothing more to learn from the rest of the body.
    pub fn is_done(&self) -> bool {
        let model_known =
            self.dialect != Dialect::TritonGrpc || self.model.is_some() || self.model_too_long;
        matches!(self.state, State::Done) || (model_known && self.stream.is_some())
    }

    /// Scan the next bytes of the body.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.is_done() {
            match &mut self.state {
                State::Done => return,
                State::Prefix(prefix) => {
                    let (header, n) = prefix.read(bytes);
                    bytes = bytes.get(n..).unwrap_or_default();
                    match header {
                        Ok(None) => {}
                        Ok(Some(h)) if !h.compressed => {
                            self.state = State::Message {
                                left: u64::from(h.len),
                                step: Step::Tag(Varint::default()),
                            };
                            self.end_if_read();
                        }
                        Ok(Some(_)) | Err(_) => self.state = State::Done,
                    }
                }
                State::Message { left, .. } => {
                    let left = *left;
                    let n = self.step_bytes(bytes, left);
                    bytes = bytes.get(n..).unwrap_or_default();
                }
            }
        }
    }

    /// Walk the message over up to `left` of `bytes`; the bytes taken.
    fn step_bytes(&mut self, bytes: &[u8], left: u64) -> usize {
        let avail = usize::try_from(left).unwrap_or(usize::MAX);
        let bytes = bytes.get(..avail).unwrap_or(bytes);
        let State::Message { step, .. } = &mut self.state else {
            return 0;
        };
        let taken = match step {
            Step::Skip(n) => {
                let take = usize::try_from(*n).unwrap_or(usize::MAX).min(bytes.len());
                *n = n.saturating_sub(take as u64);
                if *n == 0 {
                    *step = Step::Tag(Varint::default());
                }
                take
            }
            Step::Keep(want, len, buf) => {
                let take = len.saturating_sub(buf.len()).min(bytes.len());
                buf.extend_from_slice(bytes.get(..take).unwrap_or_default());
                if buf.len() == *len {
                    let (want, value) = (*want, std::mem::take(buf));
                    *step = Step::Tag(Varint::default());
                    self.kept(want, &value);
                }
                take
            }
            Step::Tag(v) | Step::Value(_, v) | Step::Length(_, v) => {
                let Some(&byte) = bytes.first() else {
                    return 0;
                };
                match v.push(byte) {
                    None => {}
                    Some(None) => self.state = State::Done,
                    Some(Some(value)) => self.varint(value),
                }
                1
            }
        };
        if let State::Message { left, .. } = &mut self.state {
            *left = left.saturating_sub(taken as u64);
        }
        self.end_if_read();
        taken
    }

    /// A complete varint: a tag, a value or a length, by the step it ends.
    fn varint(&mut self, value: u64) {
        let State::Message { left, step } = &mut self.state else {
            return;
        };
        let next = match step {
            Step::Tag(_) => {
                let field = value >> 3;
                let wire = (value & 7) as u8;
                let want = self.want(field, wire);
                match wire {
                    VARINT => Step::Value(want, Varint::default()),
                    FIXED64 => Step::Skip(8),
                    LEN => Step::Length(want, Varint::default()),
                    FIXED32 => Step::Skip(4),
                    // Groups (3, 4) are gone from proto3; 6 and 7 do not exist.
                    _ => {
                        self.state = State::Done;
                        return;
                    }
                }
            }
            Step::Value(want, _) => {
                if *want == Some(Want::Stream) && self.stream.is_none() {
                    self.stream = Some(value != 0);
                }
                Step::Tag(Varint::default())
            }
            Step::Length(want, _) => {
                // Taken after this byte is counted; the value must fit what is left.
                if value > left.saturating_sub(1) {
                    self.state = State::Done;
                    return;
                }
                let len = usize::try_from(value).unwrap_or(usize::MAX);
                match want.and_then(|w| self.keep(w, len)) {
                    Some(w) => Step::Keep(w, len, Vec::with_capacity(len)),
                    None if value == 0 => Step::Tag(Varint::default()),
                    None => Step::Skip(value),
                }
            }
            Step::Skip(_) | Step::Keep(..) => return,
        };
        if let State::Message { step, .. } = &mut self.state {
            *step = next;
        }
    }

    /// What field `field` of wire type `wire` is to this dialect's scan.
    fn want(&self, field: u64, wire: u8) -> Option<Want> {
        let want = match (self.dialect, field, wire) {
            (Dialect::SglangGrpc, 17, VARINT)
            | (Dialect::VllmGrpc, 5, VARINT)
            | (Dialect::TrtllmGrpc, 6, VARINT) => Want::Stream,
            (Dialect::TritonGrpc, 1, LEN) => Want::Model,
            (Dialect::TritonGrpc, 5, LEN) => Want::Input,
            (Dialect::TritonGrpc, 7, LEN) => Want::Raw,
            _ => return None,
        };
        Some(want)
    }

    /// Whether to keep a wanted value of `len` bytes; counts the entries of Triton's
    /// repeated fields that are not kept.
    fn keep(&mut self, want: Want, len: usize) -> Option<Want> {
        match want {
            Want::Model if self.model.is_some() || self.model_too_long || len == 0 => None,
            Want::Model if len > MAX_VALUE => {
                self.model_too_long = true;
                None
            }
            Want::Input if len == 0 || len > MAX_INPUT_BYTES => {
                self.inputs = self.inputs.saturating_add(1);
                None
            }
            Want::Raw => {
                let index = self.raws;
                self.raws = self.raws.saturating_add(1);
                (self.stream.is_none() && Some(index) == self.stream_input && len > 0)
                    .then_some(Want::Raw)
            }
            Want::Model | Want::Input | Want::Stream => Some(want),
        }
    }

    /// A wanted value, whole.
    fn kept(&mut self, want: Want, value: &[u8]) {
        match want {
            Want::Model => {
                if let Ok(model) = std::str::from_utf8(value) {
                    if !model.is_empty() {
                        self.model = Some(model.to_owned());
                    }
                }
            }
            Want::Input => {
                let index = self.inputs;
                self.inputs = self.inputs.saturating_add(1);
                let Ok(input) = InferInputTensor::decode(value) else {
                    return;
                };
                if input.name != "stream" || input.datatype != "BOOL" {
                    return;
                }
                match input
                    .contents
                    .and_then(|c| c.bool_contents.first().copied())
                {
                    Some(flag) => self.stream = Some(flag),
                    None => self.stream_input = Some(index),
                }
            }
            Want::Raw => self.stream = value.first().map(|&b| b != 0),
            Want::Stream => {}
        }
    }

    /// At the end of the first message: what its silence says, and nothing more to read.
    fn end_if_read(&mut self) {
        let State::Message { left: 0, step } = &self.state else {
            return;
        };
        let clean = matches!(step, Step::Tag(v) if v.is_empty());
        if clean && self.stream.is_none() && self.dialect != Dialect::TritonGrpc {
            self.stream = Some(false);
        }
        self.state = State::Done;
    }
}

/// The model a whole gRPC request body of `dialect` names, if any: [`GrpcRequestScanner`]
/// fed the body at once.
pub fn request_model(dialect: Dialect, body: &[u8]) -> Option<String> {
    let mut scanner = GrpcRequestScanner::new(dialect);
    scanner.feed(body);
    scanner.model
}

/// A protobuf varint being read (at most 10 bytes).
#[derive(Clone, Copy, Debug, Default)]
struct Varint {
    value: u64,
    bytes: u32,
}

impl Varint {
    /// Add a byte: `None` while more follow, then the value, or `Some(None)` for a varint
    /// longer than 10 bytes.
    fn push(&mut self, byte: u8) -> Option<Option<u64>> {
        if self.bytes >= 10 {
            return Some(None);
        }
        // At most 10 bytes: the shift stays under 64.
        let shift = self.bytes.saturating_mul(7);
        self.value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
        self.bytes = self.bytes.saturating_add(1);
        if byte & 0x80 != 0 {
            return None;
        }
        let value = self.value;
        *self = Varint::default();
        Some(Some(value))
    }

    fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::framing::{frame, frame_with};
    use crate::grpc::proto::inference::{InferTensorContents, ModelInferRequest};
    use crate::grpc::proto::sglang::grpc::scheduler as sglang;
    use crate::grpc::proto::trtllm;
    use crate::grpc::proto::vllm::grpc::engine as vllm;

    type Found = (Option<String>, bool, Option<bool>);

    fn scan<'a>(dialect: Dialect, frames: impl IntoIterator<Item = &'a [u8]>) -> Found {
        let mut scanner = GrpcRequestScanner::new(dialect);
        for frame in frames {
            scanner.feed(frame);
        }
        (
            scanner.model().map(str::to_owned),
            scanner.model_too_long(),
            scanner.stream(),
        )
    }

    /// What the body gives whole, after checking that byte by byte and every two-way
    /// split give the same.
    fn scan_all_splits(dialect: Dialect, body: &[u8]) -> Found {
        let whole = scan(dialect, [body]);
        assert_eq!(scan(dialect, body.chunks(1)), whole, "byte by byte");
        for cut in (0..=body.len()).step_by(1 + body.len() / 200) {
            let (a, b) = body.split_at(cut);
            assert_eq!(scan(dialect, [a, b]), whole, "cut at {cut}");
        }
        whole
    }

    fn sglang(stream: bool, input_ids: usize) -> Vec<u8> {
        frame(
            &sglang::GenerateRequest {
                request_id: "r".into(),
                tokenized: Some(sglang::TokenizedInput {
                    original_text: "hello".into(),
                    input_ids: (0..input_ids as u32).collect(),
                }),
                sampling_params: Some(sglang::SamplingParams {
                    temperature: 0.7,
                    max_new_tokens: Some(64),
                    ..Default::default()
                }),
                stream,
                ..Default::default()
            }
            .encode_to_vec(),
        )
    }

    fn triton(model: &str, stream_input: Option<(bool, bool)>) -> Vec<u8> {
        let tensor = |name: &str, datatype: &str| InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: vec![1, 1],
            ..Default::default()
        };
        let mut inputs = vec![tensor("text_input", "BYTES"), tensor("max_tokens", "INT32")];
        let mut raw = vec![
            [&5u32.to_le_bytes()[..], b"hello"].concat(),
            64i32.to_le_bytes().to_vec(),
        ];
        if let Some((flag, typed)) = stream_input {
            if typed {
                inputs.push(InferInputTensor {
                    contents: Some(InferTensorContents {
                        bool_contents: vec![flag],
                        ..Default::default()
                    }),
                    ..tensor("stream", "BOOL")
                });
                raw.clear();
                inputs[0].contents = Some(InferTensorContents {
                    bytes_contents: vec![b"hello".to_vec()],
                    ..Default::default()
                });
                inputs[1].contents = Some(InferTensorContents {
                    int_contents: vec![64],
                    ..Default::default()
                });
            } else {
                inputs.push(tensor("stream", "BOOL"));
                raw.push(vec![u8::from(flag)]);
            }
        }
        frame(
            &ModelInferRequest {
                model_name: model.into(),
                model_version: String::new(),
                id: "1".into(),
                inputs,
                raw_input_contents: raw,
                ..Default::default()
            }
            .encode_to_vec(),
        )
    }

    #[test]
    fn the_smg_engines_stream_flag_after_a_long_prompt() {
        let long = sglang(true, 100_000);
        assert!(long.len() > 200_000);
        let mut scanner = GrpcRequestScanner::new(Dialect::SglangGrpc);
        scanner.feed(&long);
        assert!(scanner.is_done());
        assert_eq!(
            scan_all_splits(Dialect::SglangGrpc, &long),
            (None, false, Some(true))
        );
        // A false flag is not sent: the message's end says it.
        assert_eq!(
            scan_all_splits(Dialect::SglangGrpc, &sglang(false, 10)),
            (None, false, Some(false))
        );
        let vllm = frame(
            &vllm::GenerateRequest {
                request_id: "v".into(),
                input: Some(vllm::generate_request::Input::Text("hi".into())),
                stream: true,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(
            scan_all_splits(Dialect::VllmGrpc, &vllm),
            (None, false, Some(true))
        );
        let trtllm = frame(
            &trtllm::GenerateRequest {
                request_id: "t".into(),
                max_tokens: 16,
                streaming: true,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(
            scan_all_splits(Dialect::TrtllmGrpc, &trtllm),
            (None, false, Some(true))
        );
    }

    #[test]
    fn tritons_model_and_stream_input() {
        let m = |s: &str| Some(s.to_owned());
        let cases: [(Vec<u8>, Found); 5] = [
            (
                triton("ensemble", Some((true, false))),
                (m("ensemble"), false, Some(true)),
            ),
            (
                triton("ensemble", Some((false, false))),
                (m("ensemble"), false, Some(false)),
            ),
            (
                triton("tensorrt_llm_bls", Some((true, true))),
                (m("tensorrt_llm_bls"), false, Some(true)),
            ),
            (triton("vllm_model", None), (m("vllm_model"), false, None)),
            (
                triton(&"m".repeat(MAX_VALUE + 1), Some((true, false))),
                (None, true, Some(true)),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(scan_all_splits(Dialect::TritonGrpc, &body), want);
        }
        assert_eq!(
            request_model(Dialect::TritonGrpc, &triton("ensemble", None)).as_deref(),
            Some("ensemble")
        );
    }

    #[test]
    fn only_the_first_message_and_only_what_can_be_read() {
        let first = triton("first", None);
        let second = triton("second", Some((true, false)));
        assert_eq!(
            scan_all_splits(Dialect::TritonGrpc, &[first.clone(), second].concat()),
            (Some("first".into()), false, None)
        );
        let compressed = frame_with(true, &[0x1f, 0x8b, 8, 0]);
        let nothing: Found = (None, false, None);
        let cases: [(Dialect, Vec<u8>); 7] = [
            (Dialect::TritonGrpc, compressed),
            // Flag 2, a tag of wire type 7, a length past the message, an 11-byte varint.
            (Dialect::TritonGrpc, [&[2u8][..], &first].concat()),
            (Dialect::SglangGrpc, frame(&[0x0f])),
            (Dialect::TritonGrpc, frame(&[0x0a, 0x09, b'm'])),
            (
                Dialect::SglangGrpc,
                frame(&[
                    0x88, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                ]),
            ),
            // A message cut off: its end never came, so no `false` either.
            (Dialect::SglangGrpc, sglang(false, 10)[..20].to_vec()),
            (Dialect::OpenAiChat, sglang(true, 1)),
        ];
        for (dialect, body) in cases {
            assert_eq!(
                scan_all_splits(dialect, &body),
                nothing,
                "{dialect} {body:?}"
            );
        }
    }
}
