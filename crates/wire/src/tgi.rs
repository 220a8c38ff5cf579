//! Hugging Face Text Generation Inference's native API (`POST /generate_stream`,
//! `POST /generate`): SSE with one generated token per event, and the `/generate` JSON.
//!
//! Rules, per event:
//!
//! - A non-null `error` (TGI sends `{"error": "...", "error_type": "generation"}` when
//!   generation fails mid-stream) is [`Signal::Error`], of the class its `error_type`
//!   names ([`ErrorClass`]): TGI's types are `generation`, `overloaded` (its concurrency
//!   limit, "Model is overloaded", a 429 as a whole body), `validation`,
//!   `incomplete_generation` and template and tool errors; it has none for a rate limit.
//! - An event with a `token` object is one generated token: [`Signal::Output`] of one
//!   token, exact, [`OutputKind::Content`]. This holds whatever the token's text: a
//!   byte-fallback token that ends in the middle of a UTF-8 sequence has empty text but
//!   was still generated, and speculative decoding sends each accepted token as its own
//!   event.
//! - Special tokens (`token.special: true`, e.g. the final EOS) are counted by default,
//!   so that the per-event counts add up to `details.generated_tokens`, which counts them
//!   too. With the `skip_special_tokens` decode option (`observe.skip_special_tokens`)
//!   they are not token-bearing events (TTFT and ITL then ignore them; N still comes
//!   from `generated_tokens`).
//! - `details` (on the last event) is [`Signal::Usage`]: output `generated_tokens`, input
//!   `input_length` (TGI >= 2) or `prompt_tokens` where present; then its `finish_reason`
//!   (`length`, `eos_token`, `stop_sequence`) as [`Signal::FinishReason`]; then
//!   [`Signal::Done`]. The `/generate` body's `details` yield the same but `Done`.
//!
//! TGI names no model in its native API; the model label comes from the request or is
//! `unknown`. Its OpenAI-compatible `/v1/chat/completions` is the OpenAI dialect.
//!
//! A non-streaming `/generate` answer reports the router's queue time in its head,
//! `x-queue-time` (whole milliseconds from the request's entry in the batching queue to
//! its start), read with [`queue_time`] as the engine's queue. Its `x-inference-time`
//! covers prefill and decoding together, so it is no prefill, and is not read; a stream
//! has neither (its head is sent before they are known).

use std::time::Duration;

use serde::Deserialize;

use super::error_class::ErrorClass;
use super::frame::Handler;
use super::json::{Count, Flag, Folded, Num, Present, Reason, Str};
use super::types::{OutputKind, Signal};

/// The response-head field in which TGI's `/generate` reports its queue time.
pub const QUEUE_TIME_HEADER: &str = "x-queue-time";

/// The queue time in an `x-queue-time` value: milliseconds, at most
/// `engine_timings::MAX`; anything else is none.
pub fn queue_time(value: &[u8]) -> Option<Duration> {
    let ms: f64 = std::str::from_utf8(value).ok()?.trim().parse().ok()?;
    super::engine_timings::millis(ms)
}

/// TGI state for one response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tgi {
    skip_special: bool,
}

impl Tgi {
    pub(crate) fn new(skip_special: bool) -> Self {
        Tgi { skip_special }
    }
}

impl Handler for Tgi {
    fn event(&mut self, _name: &str, data: &[u8], out: &mut Vec<Signal>) {
        let data = data.trim_ascii();
        if data.is_empty() {
            return;
        }
        let Ok(event) = super::json::parse::<Event>(data) else {
            out.push(Signal::Malformed);
            return;
        };
        if event.error.0 {
            out.push(Signal::Error(error_class(data)));
            return;
        }
        if let Some(token) = event.token {
            if !(self.skip_special && token.special.0) {
                out.push(Signal::Output {
                    tokens: 1,
                    exact: true,
                    kind: OutputKind::Content,
                });
            }
        }
        if let Some(details) = event.details {
            details.signals(out);
            out.push(Signal::Done);
        }
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        let Ok(response) = super::json::parse::<Event>(body) else {
            out.push(Signal::Malformed);
            return;
        };
        if response.error.0 {
            out.push(Signal::Error(error_class(body)));
            return;
        }
        if let Some(details) = response.details {
            details.signals(out);
        }
    }
}

/// What an error event or body names as its cause: its `error_type`.
fn error_class(data: &[u8]) -> ErrorClass {
    super::json::error_class(data, |report: ErrorReport<'_>| {
        ErrorClass::of(None, &[report.error_type.as_str()])
    })
}

/// An error event or body: `{"error": "...", "error_type": "..."}`.
#[derive(Deserialize)]
struct ErrorReport<'a> {
    #[serde(borrow, default)]
    error_type: Str<'a>,
}

/// A stream event or the `/generate` body; only the fields the rules read.
#[derive(Deserialize)]
struct Event {
    token: Option<Token>,
    details: Option<Details>,
    #[serde(default)]
    error: Present,
}

#[derive(Deserialize)]
struct Token {
    #[serde(default)]
    special: Flag,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    generated_tokens: Num,
    #[serde(default)]
    input_length: Num,
    #[serde(default)]
    prompt_tokens: Num,
    /// `/generate` with `decoder_input_details`: one entry per prompt token.
    prefill: Option<Folded<Count>>,
    #[serde(default)]
    finish_reason: Reason,
}

impl Details {
    /// Usage, when it counts anything, then the finish reason.
    fn signals(self, out: &mut Vec<Signal>) {
        let prefill = self.prefill.map(|p| p.0 .0).filter(|n| *n > 0);
        let input = self.input_length.0.or(self.prompt_tokens.0).or(prefill);
        let output = self.generated_tokens.0;
        if input.is_some() || output.is_some() {
            out.push(Signal::Usage {
                input_tokens: input,
                output_tokens: output,
            });
        }
        out.extend(self.finish_reason.signal());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_time_header_is_milliseconds_and_nothing_else() {
        assert_eq!(queue_time(b"42"), Some(Duration::from_millis(42)));
        assert_eq!(queue_time(b" 0 "), Some(Duration::ZERO));
        assert_eq!(queue_time(b"1.5"), Some(Duration::from_micros(1500)));
        for hostile in [
            &b"-1"[..],
            b"",
            b"NaN",
            b"inf",
            b"12ms",
            b"\xff",
            b"86400001",
            b"1e400",
        ] {
            assert_eq!(queue_time(hostile), None, "{hostile:?}");
        }
    }
    use crate::testing::{body, sse};
    use Signal::{Done, Error};

    const TOKEN: Signal = Signal::Output {
        tokens: 1,
        exact: true,
        kind: OutputKind::Content,
    };

    const STREAM: &[u8] = concat!(
        "data:{\"index\":1,\"token\":{\"id\":415,\"text\":\" The\",\"logprob\":-0.1,\"special\":false},\"generated_text\":null,\"details\":null}\n\n",
        "data:{\"index\":2,\"token\":{\"id\":28705,\"text\":\"\",\"logprob\":-0.4,\"special\":false},\"generated_text\":null,\"details\":null}\n\n",
        ":\n\n",
        "data:{\"index\":3,\"token\":{\"id\":2,\"text\":\"</s>\",\"logprob\":-0.01,\"special\":true},\"generated_text\":\" The\",\"details\":{\"finish_reason\":\"eos_token\",\"generated_tokens\":3,\"seed\":null,\"input_length\":7}}\n\n",
    )
    .as_bytes();

    fn usage() -> Signal {
        Signal::Usage {
            input_tokens: Some(7),
            output_tokens: Some(3),
        }
    }

    fn finish() -> Signal {
        Signal::FinishReason("eos_token".into())
    }

    #[test]
    fn one_exact_token_per_event_special_counted_by_default() {
        assert_eq!(
            sse(Tgi::default(), STREAM),
            vec![TOKEN, TOKEN, TOKEN, usage(), finish(), Done]
        );
        assert_eq!(
            sse(Tgi::new(true), STREAM),
            vec![TOKEN, TOKEN, usage(), finish(), Done]
        );
    }

    #[test]
    fn errors() {
        let e = b"data:{\"error\":\"Request failed during generation: Server error: CUDA out of memory\",\"error_type\":\"generation\"}\n\n";
        assert_eq!(sse(Tgi::default(), e), vec![Error(ErrorClass::Other)]);
        let overloaded = br#"{"error":"Model is overloaded","error_type":"overloaded"}"#;
        let want = vec![Error(ErrorClass::Overloaded)];
        assert_eq!(
            sse(
                Tgi::default(),
                &[b"data:", &overloaded[..], b"\n\n"].concat()
            ),
            want
        );
        assert_eq!(body(Tgi::default(), overloaded), want);
    }

    #[test]
    fn generate_body() {
        let b = br#"{"generated_text":" Deep learning is","details":{"finish_reason":"length","generated_tokens":4,"seed":null,"prefill":[{"id":1,"text":"<s>","logprob":null},{"id":2,"text":"Hi","logprob":-1.0}],"tokens":[]}}"#;
        assert_eq!(
            body(Tgi::default(), b),
            vec![
                Signal::Usage {
                    input_tokens: Some(2),
                    output_tokens: Some(4)
                },
                Signal::FinishReason("length".into())
            ]
        );
        assert_eq!(body(Tgi::default(), br#"{"generated_text":"x"}"#), vec![]);
    }

    /// `details.finish_reason` of the last event and of a `/generate` body; `null`, `""`
    /// or a value that is not a string give none, and the usage beside it still counts.
    #[test]
    fn finish_reasons_are_read_where_the_stream_says_them() {
        let generate = |reason: &str| {
            let b = format!(
                r#"{{"generated_text":" Paris","details":{{"finish_reason":{reason},"generated_tokens":2,"seed":null}}}}"#
            );
            body(Tgi::default(), b.as_bytes())
        };
        let usage = Signal::Usage {
            input_tokens: None,
            output_tokens: Some(2),
        };
        assert_eq!(
            generate(r#""stop_sequence""#),
            vec![usage.clone(), Signal::FinishReason("stop_sequence".into())]
        );
        let last = |reason: &str| {
            let e = format!(
                "data:{{\"index\":2,\"token\":{{\"id\":2,\"text\":\"</s>\",\"special\":true}},\"generated_text\":\" Paris\",\"details\":{{\"finish_reason\":{reason},\"generated_tokens\":2}}}}\n\n"
            );
            sse(Tgi::new(true), e.as_bytes())
        };
        assert_eq!(
            last(r#""length""#),
            vec![usage.clone(), Signal::FinishReason("length".into()), Done]
        );
        for none in ["null", r#""""#, "3", "[]"] {
            assert_eq!(generate(none), vec![usage.clone()], "{none}");
            assert_eq!(last(none), vec![usage.clone(), Done], "{none}");
        }
        // Without `details` (a body asked for without them) there is nothing to read.
        assert_eq!(
            body(
                Tgi::default(),
                br#"{"generated_text":" Paris","details":null}"#
            ),
            vec![]
        );
    }
}
