//! NVIDIA Triton's generate extension (`POST /v2/models/{m}[/versions/{v}]/generate_stream`
//! and `/generate`), as served for TensorRT-LLM, vLLM and Python backends.
//!
//! Each SSE event is one inference response as JSON: the model's output tensors by name
//! plus `model_name` and `model_version`. Rules, per event:
//!
//! - A non-null `error` is [`Signal::Error`]. Triton reports a failure inside a
//!   decoupled model as such an event after the 200 head, so this is how a mid-stream
//!   failure is seen. The error is a plain message, which names no class
//!   ([`ErrorClass::Other`]).
//! - The first non-empty `model_name` is [`Signal::Model`].
//! - A non-empty `text_output` (a string, or an array of strings) is one token-bearing
//!   event of [`OutputKind::Content`], its count estimated from the text: the generate
//!   extension reports no token counts (TensorRT-LLM streams one decode step per
//!   response, but a step can hold several tokens with speculative decoding or when
//!   detokenisation holds text back). The estimate is the text's shape
//!   (`text_estimate`, at least 1), or with `observe.tokenizer` the tokenizer's
//!   count of the `text_output`.
//!
//! Triton has no usage block and no end marker: N is the sum of the events' estimates.

use serde::Deserialize;

use super::error_class::ErrorClass;
use super::event_tokens::{count_event, finish_count, text, SelectTexts};
use super::frame::Handler;
use super::json::{Present, Str, Text};
use super::token_stream::TokenStream;
use super::tokenize::Tokenizer;
use super::types::{OutputKind, Signal};

/// Triton state for one response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Triton {
    model_sent: bool,
    /// This response's incremental count (`observe.tokenizer`): per-event counts that
    /// add up to the whole text's.
    tokens: Option<TokenStream>,
}

impl Triton {
    pub(crate) fn new(tokenizer: Option<Tokenizer>) -> Self {
        Triton {
            tokens: tokenizer.map(|t| t.stream()),
            ..Triton::default()
        }
    }

    /// The response's `text_output`, once its model and error are read.
    fn read(&mut self, data: &[u8], out: &mut Vec<Signal>) -> Option<Text> {
        let Ok(response) = super::json::parse::<Response<'_>>(data) else {
            out.push(Signal::Malformed);
            return None;
        };
        if response.error.0 {
            out.push(Signal::Error(ErrorClass::Other));
            return None;
        }
        if !self.model_sent {
            if let Some(model) = response.model_name.non_empty() {
                out.push(Signal::Model(model.into_owned()));
                self.model_sent = true;
            }
        }
        Some(response.text_output)
    }
}

impl Handler for Triton {
    fn event(&mut self, _name: &str, data: &[u8], out: &mut Vec<Signal>) {
        let data = data.trim_ascii();
        if data.is_empty() {
            return;
        }
        if let Some(text) = self.read(data, out).filter(|t| t.carries) {
            let select: SelectTexts = |response, f| text::of(response.get("text_output"), f);
            let tokens = count_event(self.tokens.as_mut(), data, select, text.estimate);
            out.push(Signal::Output {
                tokens: tokens.map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX)),
                exact: false,
                kind: OutputKind::Content,
            });
        }
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        self.read(body, out);
    }

    fn finish(&mut self, out: &mut Vec<Signal>) {
        finish_count(&mut self.tokens, out);
    }
}

/// One inference response; only the fields the rules read.
#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow, default)]
    model_name: Str<'a>,
    #[serde(default)]
    text_output: Text,
    #[serde(default)]
    error: Present,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{body, sse};
    use Signal::{Error, Model};

    const TOKEN: Signal = Signal::Output {
        tokens: 1,
        exact: false,
        kind: OutputKind::Content,
    };

    #[test]
    fn stream_with_error_after_200() {
        let s = concat!(
            "data: {\"model_name\":\"ensemble\",\"model_version\":\"1\",\"sequence_end\":false,\"sequence_id\":0,\"sequence_start\":false,\"text_output\":\" Deep\"}\n\n",
            "data: {\"model_name\":\"ensemble\",\"model_version\":\"1\",\"text_output\":\"\"}\n\n",
            "data: {\"model_name\":\"ensemble\",\"model_version\":\"1\",\"text_output\":[\" learning\"]}\n\n",
            "data: {\"error\":\"in ensemble 'ensemble', Executor failed process requestId 3 due to the following error: Encountered an error in forwardAsync function\"}\n\n",
        );
        assert_eq!(
            sse(Triton::default(), s.as_bytes()),
            vec![
                Model("ensemble".into()),
                TOKEN,
                TOKEN,
                Error(ErrorClass::Other)
            ]
        );
    }

    #[test]
    fn generate_body() {
        let b = br#"{"model_name":"llama","model_version":"1","text_output":"What is ML? Machine learning is"}"#;
        assert_eq!(body(Triton::default(), b), vec![Model("llama".into())]);
        assert_eq!(
            body(
                Triton::default(),
                br#"{"error":"Request for unknown model"}"#
            ),
            vec![Error(ErrorClass::Other)]
        );
    }
}
