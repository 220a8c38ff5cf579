//! Anthropic Messages (`POST /v1/messages`): typed SSE events, and the non-streaming
//! `message` object.
//!
//! Rules, per event (the JSON `type`, else the SSE event name):
//!
//! | event | signal |
//! |---|---|
//! | `message_start` | `Model` (`message.model`); `Usage` with input tokens only |
//! | `content_block_delta` with `text_delta` | `Output` Content, estimated from its text |
//! | `content_block_delta` with `thinking_delta` | `Output` Reasoning |
//! | `content_block_delta` with `input_json_delta` | `Output` ToolCall |
//! | `message_delta` | `FinishReason` (`delta.stop_reason`); `Usage`: the cumulative `output_tokens` (and input tokens if repeated) |
//! | `message_stop` | `Done` |
//! | `error` | `Error`, of the class its `error.type` names (`rate_limit_error`, `overloaded_error`) |
//! | `ping`, `content_block_start`/`_stop`, `signature_delta`, `citations_delta` | nothing |
//!
//! Empty deltas (the first `input_json_delta` is often `""`) carry nothing. Anthropic
//! batches several tokens into one delta and reports no per-event count, so every delta's
//! count is estimated from its `text` / `thinking` / `partial_json`: the text's shape
//! (`text_estimate`, at least 1), or with `observe.tokenizer` the tokenizer's
//! count; the final `message_delta` usage then corrects N.
//!
//! Usage: `message_delta.usage.output_tokens` is cumulative, so it is reported as is (the
//! latest report wins, never summed). The `output_tokens` in `message_start` is a
//! placeholder (usually 1) and is not reported: a stream cut before `message_delta` falls
//! back to counting its events. Input tokens are `input_tokens +
//! cache_creation_input_tokens + cache_read_input_tokens`: Anthropic's `input_tokens`
//! excludes the prompt tokens read from or written to the cache, and tokentap reports the
//! whole prompt, as OpenAI's `prompt_tokens` does. The two cache counts are also reported
//! as they are, as [`Signal::TokenDetails`] (cache read, cache write), from
//! `message_start` and again from `message_delta` where it repeats them: part by part
//! the later report wins, as for the other counts.
//!
//! A non-streaming `message` yields its `model`, `stop_reason` and `usage`.

use serde::Deserialize;

use super::count::{most_visible, Tally};
use super::error_class::ErrorClass;
use super::event_tokens::{count_event, finish_count, text};
use super::frame::Handler;
use super::json::{add, ErrorFields, Num, Present, Reason, Str, Text};
use super::token_stream::TokenStream;
use super::tokenize::Tokenizer;
use super::types::{OutputKind, Signal, TokenDetails};

/// Anthropic Messages state for one response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Anthropic {
    model_sent: bool,
    tally: Tally,
    /// The cache reads and writes reported so far (`message_delta` may repeat
    /// `message_start`'s).
    details: TokenDetails,
    /// This response's incremental count (`observe.tokenizer`): per-event counts that
    /// add up to the whole text's.
    tokens: Option<TokenStream>,
}

impl Anthropic {
    pub(crate) fn new(tokenizer: Option<Tokenizer>) -> Self {
        Anthropic {
            tokens: tokenizer.map(|t| t.stream()),
            ..Anthropic::default()
        }
    }

    fn model(&mut self, model: Str<'_>, out: &mut Vec<Signal>) {
        if !self.model_sent {
            if let Some(model) = model.non_empty() {
                out.push(Signal::Model(model.into_owned()));
                self.model_sent = true;
            }
        }
    }
}

impl Handler for Anthropic {
    fn event(&mut self, name: &str, data: &[u8], out: &mut Vec<Signal>) {
        let event: Event<'_> = match super::json::typed_event(name, data) {
            None => return,
            Some(Ok(event)) => event,
            Some(Err(signal)) => return out.push(signal),
        };
        let kind = event.kind.0.as_deref().unwrap_or(name);
        match kind {
            "error" => out.push(Signal::Error(error_class(data))),
            _ if name == "error" || event.error.0 => out.push(Signal::Error(error_class(data))),
            "message_start" => {
                if let Some(message) = event.message {
                    self.model(message.model, out);
                    if let Some(usage) = message.usage {
                        if let Some(input) = usage.input() {
                            out.push(Signal::Usage {
                                input_tokens: Some(input),
                                output_tokens: None,
                            });
                        }
                        usage.details().report(&mut self.details, out);
                    }
                }
            }
            "content_block_delta" => {
                let delta = event.delta.unwrap_or_default();
                if let Some(kind) = delta.kind() {
                    let shape = delta.estimate();
                    let estimate = || count_event(self.tokens.as_mut(), data, delta_texts, shape);
                    out.push(self.tally.output(kind, 0, None, estimate));
                }
            }
            "message_delta" => {
                if let Some(reason) = event.delta.and_then(|d| d.stop_reason.signal()) {
                    out.push(reason);
                }
                if let Some(usage) = event.usage {
                    usage.signals(&mut self.details, out);
                }
            }
            "message_stop" => out.push(Signal::Done),
            _ => {}
        }
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        let Ok(message) = super::json::parse::<Body<'_>>(body) else {
            out.push(Signal::Malformed);
            return;
        };
        if message.kind.0.as_deref() == Some("error") || message.error.0 {
            out.push(Signal::Error(error_class(body)));
            return;
        }
        self.model(message.model, out);
        out.extend(message.stop_reason.signal());
        if let Some(usage) = message.usage {
            usage.signals(&mut self.details, out);
        }
    }

    fn finish(&mut self, out: &mut Vec<Signal>) {
        finish_count(&mut self.tokens, out);
    }
}

/// What an error event or body names as its cause: its `error` object's `type`.
fn error_class(data: &[u8]) -> ErrorClass {
    super::json::error_class(data, |report: ErrorReport<'_>| report.error.class())
}

/// The texts of a `content_block_delta`, for the tokenizer.
fn delta_texts(event: &serde_json::Value, f: &mut dyn FnMut(&str)) {
    let delta = event.get("delta");
    for key in ["text", "thinking", "partial_json"] {
        text::of(delta.and_then(|d| d.get(key)), f);
    }
}

/// One streamed event; only the fields the rules read.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Str<'a>,
    // Boxed: a stream has one of each (`message_start`, `message_delta`), and inline they
    // would make every event's value, moved as it is returned, twice as large.
    #[serde(borrow)]
    message: Option<Box<Message<'a>>>,
    delta: Option<Delta>,
    usage: Option<Box<Usage>>,
    #[serde(default)]
    error: Present,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    model: Str<'a>,
    usage: Option<Usage>,
}

/// A `content_block_delta`'s delta (or a `message_delta`'s, which has none of these).
/// The delta's `type` is implied by which field it carries.
#[derive(Default, Deserialize)]
struct Delta {
    #[serde(default)]
    text: Text,
    #[serde(default)]
    thinking: Text,
    #[serde(default)]
    partial_json: Text,
    /// A `message_delta`'s.
    #[serde(default)]
    stop_reason: Reason,
}

impl Delta {
    fn kind(&self) -> Option<OutputKind> {
        let text = self.text.carries.then_some(OutputKind::Content);
        let tool = self.partial_json.carries.then_some(OutputKind::ToolCall);
        let thinking = self.thinking.carries.then_some(OutputKind::Reasoning);
        most_visible(most_visible(text, tool), thinking)
    }

    fn estimate(&self) -> u64 {
        [self.text, self.thinking, self.partial_json]
            .iter()
            .fold(0, |sum, t| sum.saturating_add(t.estimate))
    }
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Num,
    #[serde(default)]
    cache_creation_input_tokens: Num,
    #[serde(default)]
    cache_read_input_tokens: Num,
    #[serde(default)]
    output_tokens: Num,
}

impl Usage {
    /// The whole prompt: uncached input plus cache writes and reads. `None` without
    /// `input_tokens` (cache counts alone are not a prompt size).
    fn input(&self) -> Option<u64> {
        let input = self.input_tokens.0?;
        let cached = add(
            self.cache_creation_input_tokens.0,
            self.cache_read_input_tokens.0,
        );
        Some(input.saturating_add(cached.unwrap_or(0)))
    }

    /// The cache reads and writes, as reported (parts of [`Usage::input`]); Anthropic
    /// reports no separate count of thinking tokens (they are part of `output_tokens`).
    fn details(&self) -> TokenDetails {
        TokenDetails {
            cache_read_input: self.cache_read_input_tokens.0,
            cache_write_input: self.cache_creation_input_tokens.0,
            reasoning_output: None,
        }
    }

    /// `Usage` when it gives a count, then the cache counts where they say something new.
    fn signals(&self, sent: &mut TokenDetails, out: &mut Vec<Signal>) {
        let input = self.input();
        let output = self.output_tokens.0;
        if input.is_some() || output.is_some() {
            out.push(Signal::Usage {
                input_tokens: input,
                output_tokens: output,
            });
        }
        self.details().report(sent, out);
    }
}

/// An error event or body, `{"type": "error", "error": {"type": ..., "message": ...}}`.
#[derive(Deserialize)]
struct ErrorReport<'a> {
    #[serde(borrow, default)]
    error: ErrorFields<'a>,
}

/// A whole non-streaming body: a `message` or an `error`.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Str<'a>,
    #[serde(borrow, default)]
    model: Str<'a>,
    #[serde(default)]
    stop_reason: Reason,
    usage: Option<Usage>,
    #[serde(default)]
    error: Present,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{body, sse};
    use Signal::{Done, Error, Model};

    fn out(kind: OutputKind) -> Signal {
        Signal::Output {
            tokens: 1,
            exact: false,
            kind,
        }
    }

    fn usage(i: Option<u64>, o: Option<u64>) -> Signal {
        Signal::Usage {
            input_tokens: i,
            output_tokens: o,
        }
    }

    fn ev(kind: &str, rest: &str) -> String {
        let sep = if rest.is_empty() { "" } else { "," };
        format!("event: {kind}\ndata: {{\"type\":\"{kind}\"{sep}{rest}}}\n\n")
    }

    #[test]
    fn a_whole_stream() {
        let s = [
            ev("message_start", r#""message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}"#),
            ev("content_block_start", r#""index":0,"content_block":{"type":"text","text":""}"#),
            ev("ping", ""),
            ev("content_block_delta", r#""index":0,"delta":{"type":"text_delta","text":"Hello"}"#),
            ev("content_block_delta", r#""index":0,"delta":{"type":"text_delta","text":"!"}"#),
            ev("content_block_stop", r#""index":0"#),
            ev("message_delta", r#""delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":12}"#),
            ev("message_stop", ""),
        ]
        .concat();
        assert_eq!(
            sse(Anthropic::default(), s.as_bytes()),
            vec![
                Model("claude-sonnet-4-20250514".into()),
                usage(Some(40), None),
                details(Some(5), Some(10)),
                out(OutputKind::Content),
                out(OutputKind::Content),
                Signal::FinishReason("end_turn".into()),
                usage(None, Some(12)),
                Done
            ]
        );
    }

    #[test]
    fn thinking_tool_use_and_empty_deltas() {
        let s = [
            ev("content_block_delta", r#""index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}"#),
            ev("content_block_delta", r#""index":0,"delta":{"type":"signature_delta","signature":"EqQB"}"#),
            ev("content_block_delta", r#""index":1,"delta":{"type":"input_json_delta","partial_json":""}"#),
            ev("content_block_delta", r#""index":1,"delta":{"type":"input_json_delta","partial_json":"{\"loc"}"#),
            ev("content_block_delta", r#""index":2,"delta":{"type":"citations_delta","citation":{"type":"char_location"}}"#),
        ]
        .concat();
        assert_eq!(
            sse(Anthropic::default(), s.as_bytes()),
            vec![
                // "Let me": two words; `{"loc`: two symbols and a word.
                Signal::Output {
                    tokens: 2,
                    exact: false,
                    kind: OutputKind::Reasoning
                },
                Signal::Output {
                    tokens: 3,
                    exact: false,
                    kind: OutputKind::ToolCall
                }
            ]
        );
    }

    #[test]
    fn cumulative_usage_is_reported_not_summed() {
        let s = [
            ev("message_delta", r#""usage":{"output_tokens":5}"#),
            ev(
                "message_delta",
                r#""usage":{"input_tokens":7,"cache_read_input_tokens":3,"output_tokens":9}"#,
            ),
        ]
        .concat();
        assert_eq!(
            sse(Anthropic::default(), s.as_bytes()),
            vec![
                usage(None, Some(5)),
                usage(Some(10), Some(9)),
                details(Some(3), None)
            ]
        );
    }

    fn details(read: Option<u64>, write: Option<u64>) -> Signal {
        Signal::TokenDetails(Box::new(TokenDetails {
            cache_read_input: read,
            cache_write_input: write,
            reasoning_output: None,
        }))
    }

    #[test]
    fn cache_reads_and_writes_are_parts_of_the_input() {
        let start = |usage: &str| {
            ev(
                "message_start",
                &format!(r#""message":{{"model":"claude-sonnet-4-5","usage":{usage}}}"#),
            )
        };
        // The input is the whole prompt, as before; the cache counts are its parts. A
        // message_delta repeating them reports nothing new; one that changes a count
        // reports it (the later report wins).
        let s = [
            start(
                r#"{"input_tokens":14,"cache_creation_input_tokens":312,"cache_read_input_tokens":2048,"output_tokens":1}"#,
            ),
            ev(
                "message_delta",
                r#""usage":{"input_tokens":14,"cache_creation_input_tokens":312,"cache_read_input_tokens":2048,"output_tokens":15}"#,
            ),
            ev(
                "message_delta",
                r#""usage":{"cache_read_input_tokens":2060,"output_tokens":16}"#,
            ),
        ]
        .concat();
        assert_eq!(
            sse(Anthropic::default(), s.as_bytes()),
            vec![
                Model("claude-sonnet-4-5".into()),
                usage(Some(2374), None),
                details(Some(2048), Some(312)),
                usage(Some(2374), Some(15)),
                usage(None, Some(16)),
                details(Some(2060), None),
            ]
        );
        // Cache counts without input_tokens are no prompt size, but are still counts.
        let s = start(r#"{"cache_read_input_tokens":5}"#);
        assert_eq!(
            sse(Anthropic::default(), s.as_bytes()),
            vec![Model("claude-sonnet-4-5".into()), details(Some(5), None)]
        );
        // A whole message.
        let b = br#"{"type":"message","model":"claude-haiku-4-5","stop_reason":"end_turn","usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":1024,"output_tokens":8}}"#;
        assert_eq!(
            body(Anthropic::default(), b),
            vec![
                Model("claude-haiku-4-5".into()),
                Signal::FinishReason("end_turn".into()),
                usage(Some(1027), Some(8)),
                details(Some(1024), Some(0)),
            ]
        );
        // Hostile counts: none of them is a count, none panics, the input is unchanged.
        for odd in [
            r#""cache_read_input_tokens":-1,"cache_creation_input_tokens":null"#,
            r#""cache_read_input_tokens":"2048","cache_creation_input_tokens":1.5"#,
            r#""cache_read_input_tokens":1e300,"cache_creation_input_tokens":[]"#,
            r#""cache_read_input_tokens":{},"cache_creation_input_tokens":true"#,
            r#""cache_read_input_tokens":184467440737095516160"#,
        ] {
            let s = start(&format!(r#"{{"input_tokens":14,{odd}}}"#));
            assert_eq!(
                sse(Anthropic::default(), s.as_bytes()),
                vec![Model("claude-sonnet-4-5".into()), usage(Some(14), None)],
                "{odd}"
            );
        }
        let huge = start(
            r#"{"input_tokens":18446744073709551615,"cache_read_input_tokens":18446744073709551615}"#,
        );
        assert_eq!(
            sse(Anthropic::default(), huge.as_bytes()),
            vec![
                Model("claude-sonnet-4-5".into()),
                usage(Some(u64::MAX), None),
                details(Some(u64::MAX), None)
            ],
            "the sum saturates"
        );
    }

    #[test]
    fn errors() {
        let e = ev(
            "error",
            r#""error":{"type":"overloaded_error","message":"Overloaded"}"#,
        );
        assert_eq!(
            sse(Anthropic::default(), e.as_bytes()),
            vec![Error(ErrorClass::Overloaded)]
        );
        let e = ev(
            "error",
            r#""error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}"#,
        );
        assert_eq!(
            sse(Anthropic::default(), e.as_bytes()),
            vec![Error(ErrorClass::RateLimited)]
        );
        assert_eq!(
            sse(Anthropic::default(), b"event: error\ndata: <html>\n\n"),
            vec![Error(ErrorClass::Other)]
        );
        let err_body =
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"x"}}"#;
        assert_eq!(
            body(Anthropic::default(), err_body),
            vec![Error(ErrorClass::Other)]
        );
        let overloaded = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#;
        assert_eq!(
            body(Anthropic::default(), overloaded),
            vec![Error(ErrorClass::Overloaded)]
        );
        let rate_limit = br#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 50 requests per minute."}}"#;
        assert_eq!(
            body(Anthropic::default(), rate_limit),
            vec![Error(ErrorClass::RateLimited)]
        );
    }

    #[test]
    fn json_body() {
        let b = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-3-5-haiku-20241022","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":6}}"#;
        assert_eq!(
            body(Anthropic::default(), b),
            vec![
                Model("claude-3-5-haiku-20241022".into()),
                Signal::FinishReason("end_turn".into()),
                usage(Some(12), Some(6)),
                details(Some(0), Some(0))
            ]
        );
    }

    /// `message_delta.delta.stop_reason` of a stream and `stop_reason` of a whole
    /// message, as Anthropic spells them; `null`, `""` or a value that is not a string
    /// give none, and the rest of the event or body is still read.
    #[test]
    fn finish_reasons_are_read_where_the_stream_says_them() {
        let delta = |reason: &str| {
            let e = ev(
                "message_delta",
                &format!(
                    r#""delta":{{"stop_reason":{reason},"stop_sequence":null}},"usage":{{"output_tokens":3}}"#
                ),
            );
            sse(Anthropic::default(), e.as_bytes())
        };
        assert_eq!(
            delta(r#""max_tokens""#),
            vec![
                Signal::FinishReason("max_tokens".into()),
                usage(None, Some(3))
            ]
        );
        for none in ["null", r#""""#, "7", r#"{"type":"end_turn"}"#] {
            assert_eq!(delta(none), vec![usage(None, Some(3))], "{none}");
        }
        let tool_use = br#"{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"location":"Paris"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":384,"output_tokens":57}}"#;
        assert_eq!(
            body(Anthropic::default(), tool_use),
            vec![
                Model("claude-sonnet-4-20250514".into()),
                Signal::FinishReason("tool_use".into()),
                usage(Some(384), Some(57))
            ]
        );
        for none in ["null", r#""""#, "false"] {
            let b = format!(
                r#"{{"type":"message","model":"m","stop_reason":{none},"usage":{{"input_tokens":1,"output_tokens":2}}}}"#
            );
            assert_eq!(
                body(Anthropic::default(), b.as_bytes()),
                vec![Model("m".into()), usage(Some(1), Some(2))],
                "{none}"
            );
        }
        let absent = br#"{"type":"message","model":"m"}"#;
        assert_eq!(body(Anthropic::default(), absent), vec![Model("m".into())]);
    }
}
