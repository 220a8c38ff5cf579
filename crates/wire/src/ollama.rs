//! Ollama's native API (`POST /api/chat`, `POST /api/generate`): NDJSON lines when
//! streaming (Ollama's default), one JSON object otherwise.
//!
//! Rules, per line:
//!
//! - A non-null `error` is [`Signal::Error`], and nothing else is read from it: Ollama's
//!   error is a plain message, which names no class ([`ErrorClass::Other`]).
//! - The first non-empty `model` is [`Signal::Model`].
//! - A line is token-bearing when it carries output: `message.content` (chat) or
//!   `response` (generate) as [`OutputKind::Content`], `message.tool_calls` (non-empty)
//!   as [`OutputKind::ToolCall`], `message.thinking` / `thinking` as
//!   [`OutputKind::Reasoning`]; one line is one event, of the most visible kind present.
//! - Tokens in the event: the `logprobs` entries (one per token, when requested), exact;
//!   else estimated (Ollama streams about one token per line, but holds back and merges
//!   tokens around stop sequences and split UTF-8) from the line's content, thinking and
//!   tool-call names: their shape (`text_estimate`, at least 1; a structured
//!   `arguments` object is not read), or with `observe.tokenizer` the tokenizer's count
//!   of those and the arguments.
//! - The final line (`done: true`) reports `prompt_eval_count` and `eval_count` as
//!   [`Signal::Usage`] (and `prompt_eval_cached_count`, the prompt tokens read from the
//!   cache, where a newer Ollama reports it, as [`Signal::TokenDetails`]), its durations
//!   (nanoseconds) as [`Signal::EngineTimings`], then
//!   [`Signal::Done`]. `load_duration` is the queue: Ollama measures it from the moment
//!   its handler took the request until a runner with the model loaded was ready (waiting
//!   for the scheduler, and loading the model when it was not resident);
//!   `prompt_eval_duration` is the prefill. `eval_duration` and `total_duration` are not
//!   read: tokentap measures decoding and the whole request itself. Its `done_reason`
//!   (`stop`, `length`, `load`, `unload`) is [`Signal::FinishReason`], before the `Done`.
//!
//! A non-streaming body is one final line: its model, usage, durations and
//! `done_reason`.

use serde::Deserialize;

use super::count::{most_visible, Tally};
use super::engine_timings;
use super::error_class::ErrorClass;
use super::event_tokens::{count_event, finish_count, text};
use super::frame::Handler;
use super::json::{Count, Flag, Fold, Folded, Num, Present, Reason, Str, Text};
use super::token_stream::TokenStream;
use super::tokenize::Tokenizer;
use super::types::{EngineTimings, OutputKind, Signal, TokenDetails};

/// Ollama state for one response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ollama {
    model_sent: bool,
    tally: Tally,
    /// The cached count reported so far.
    details: TokenDetails,
    /// This response's incremental count (`observe.tokenizer`): per-event counts that
    /// add up to the whole text's.
    tokens: Option<TokenStream>,
}

impl Ollama {
    pub(crate) fn new(tokenizer: Option<Tokenizer>) -> Self {
        Ollama {
            tokens: tokenizer.map(|t| t.stream()),
            ..Ollama::default()
        }
    }

    /// Model (once) and usage of a line or body. An error line pushes [`Signal::Error`]
    /// and yields no usage.
    fn common(&mut self, line: &mut Line<'_>, out: &mut Vec<Signal>) -> Option<Signal> {
        if line.error.0 {
            out.push(Signal::Error(ErrorClass::Other));
            return None;
        }
        if !self.model_sent {
            if let Some(model) = std::mem::take(&mut line.model).non_empty() {
                out.push(Signal::Model(model.into_owned()));
                self.model_sent = true;
            }
        }
        let (input, output) = (line.prompt_eval_count.0, line.eval_count.0);
        Some(Signal::Usage {
            input_tokens: input,
            output_tokens: output,
        })
        .filter(|_| input.is_some() || output.is_some())
    }
}

impl Handler for Ollama {
    fn event(&mut self, _name: &str, data: &[u8], out: &mut Vec<Signal>) {
        let Ok(mut line) = super::json::parse::<Line<'_>>(data) else {
            out.push(Signal::Malformed);
            return;
        };
        if line.error.0 {
            out.push(Signal::Error(ErrorClass::Other));
            return;
        }
        let usage = self.common(&mut line, out);
        let timings = reported_timings(&line);
        if let Some(kind) = line.kind() {
            let shape = line.estimate();
            let entries = line.logprobs.as_ref().map_or(0, |l| l.0 .0);
            let estimate = || count_event(self.tokens.as_mut(), data, line_texts, shape);
            out.push(self.tally.output(kind, entries, None, estimate));
        }
        if let Some(usage) = usage {
            out.push(usage);
            line.details().report(&mut self.details, out);
        }
        out.extend(timings);
        if line.done.0 {
            out.extend(line.done_reason.signal());
            out.push(Signal::Done);
        }
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        let Ok(mut line) = super::json::parse::<Line<'_>>(body) else {
            out.push(Signal::Malformed);
            return;
        };
        if let Some(usage) = self.common(&mut line, out) {
            out.push(usage);
            line.details().report(&mut self.details, out);
        }
        out.extend(reported_timings(&line));
        if !line.error.0 {
            out.extend(line.done_reason.signal());
        }
    }

    fn finish(&mut self, out: &mut Vec<Signal>) {
        finish_count(&mut self.tokens, out);
    }
}

/// The line's `load_duration` (queue) and `prompt_eval_duration` (prefill), when it has
/// either.
fn reported_timings(line: &Line<'_>) -> Option<Signal> {
    let timings = EngineTimings {
        queue: line.load_duration.0.and_then(engine_timings::nanos),
        prefill: line.prompt_eval_duration.0.and_then(engine_timings::nanos),
        first_token: None,
    };
    (!timings.is_empty()).then_some(Signal::EngineTimings(timings))
}

/// The output texts of a line, for the tokenizer.
fn line_texts(line: &serde_json::Value, f: &mut dyn FnMut(&str)) {
    text::of(line.get("response"), f);
    text::of(line.get("thinking"), f);
    if let Some(message) = line.get("message") {
        text::of(message.get("content"), f);
        text::of(message.get("thinking"), f);
        for call in text::each(message.get("tool_calls")) {
            let function = call.get("function");
            text::of(function.and_then(|c| c.get("name")), f);
            text::arguments(function.and_then(|c| c.get("arguments")), f);
        }
    }
}

/// One line (or the whole non-streaming body); only the fields the rules read.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow, default)]
    model: Str<'a>,
    message: Option<Message>,
    #[serde(default)]
    response: Text,
    #[serde(default)]
    thinking: Text,
    logprobs: Option<Folded<Count>>,
    #[serde(default)]
    done: Flag,
    #[serde(default)]
    prompt_eval_count: Num,
    #[serde(default)]
    eval_count: Num,
    /// The part of `prompt_eval_count` read from the cache (newer Ollama).
    #[serde(default)]
    prompt_eval_cached_count: Num,
    #[serde(default)]
    load_duration: Num,
    #[serde(default)]
    prompt_eval_duration: Num,
    #[serde(default)]
    error: Present,
    /// The final line's, or the whole body's.
    #[serde(default)]
    done_reason: Reason,
}

impl Line<'_> {
    /// The cached part of the input, where the final line reports it. Ollama counts
    /// thinking tokens in `eval_count` and reports no part of it separately.
    fn details(&self) -> TokenDetails {
        TokenDetails {
            cache_read_input: self.prompt_eval_cached_count.0,
            ..TokenDetails::default()
        }
    }

    fn kind(&self) -> Option<OutputKind> {
        let (content, tools, thinking) = match &self.message {
            Some(m) => (
                m.content.carries || self.response.carries,
                m.tool_calls.as_ref().is_some_and(|t| t.0.calls > 0),
                m.thinking.carries || self.thinking.carries,
            ),
            None => (self.response.carries, false, self.thinking.carries),
        };
        let content = content.then_some(OutputKind::Content);
        let tools = tools.then_some(OutputKind::ToolCall);
        let thinking = thinking.then_some(OutputKind::Reasoning);
        most_visible(most_visible(content, tools), thinking)
    }

    /// The estimated tokens of the line's output of every kind.
    fn estimate(&self) -> u64 {
        let message = self.message.as_ref().map_or(0, |m| {
            let tools = m.tool_calls.as_ref().map_or(0, |t| t.0.estimate);
            m.content
                .estimate
                .saturating_add(m.thinking.estimate)
                .saturating_add(tools)
        });
        self.response
            .estimate
            .saturating_add(self.thinking.estimate)
            .saturating_add(message)
    }
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Text,
    #[serde(default)]
    thinking: Text,
    tool_calls: Option<Folded<ToolCalls>>,
}

/// `message.tool_calls`: how many, and the estimated tokens of their function names
/// (a structured `arguments` object is not read).
#[derive(Default)]
struct ToolCalls {
    calls: u64,
    estimate: u64,
}

impl Fold for ToolCalls {
    type Item = ToolCall;

    fn add(&mut self, call: ToolCall) {
        self.calls = self.calls.saturating_add(1);
        let name = call.function.map_or(0, |f| f.name.estimate);
        self.estimate = self.estimate.saturating_add(name);
    }
}

#[derive(Deserialize)]
struct ToolCall {
    function: Option<Function>,
}

#[derive(Deserialize)]
struct Function {
    #[serde(default)]
    name: Text,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{body, ndjson};
    use Signal::{Done, Error, Malformed, Model};

    fn out(tokens: u32, exact: bool, kind: OutputKind) -> Signal {
        Signal::Output {
            tokens,
            exact,
            kind,
        }
    }

    #[test]
    fn chat_stream() {
        let s = concat!(
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.1Z","message":{"role":"assistant","content":"The"},"done":false}"#,
            "\n",
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.2Z","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}"#,
            "\n",
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.3Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},"done":false}"#,
            "\n",
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.4Z","message":{"role":"assistant","content":" sky"},"logprobs":[{"token":" sky","logprob":-0.2}],"done":false}"#,
            "\n",
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.5Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"total_duration":4883583458,"prompt_eval_count":26,"eval_count":282}"#,
            "\n",
        );
        assert_eq!(
            ndjson(Ollama::default(), s.as_bytes()),
            vec![
                Model("llama3.2".into()),
                out(1, false, OutputKind::Content),
                out(1, false, OutputKind::Reasoning),
                // The name `f`: without a tokenizer a structured argument object is not
                // read as text, so the estimate is the name's word.
                out(1, false, OutputKind::ToolCall),
                out(1, true, OutputKind::Content),
                Signal::Usage {
                    input_tokens: Some(26),
                    output_tokens: Some(282)
                },
                Signal::FinishReason("stop".into()),
                Done
            ]
        );
    }

    #[test]
    fn the_final_line_reports_its_cached_prompt_tokens() {
        let done = |cached: &str| {
            format!(
                "{}\n",
                format_args!(
                    r#"{{"model":"m","message":{{"role":"assistant","content":""}},"done":true,"prompt_eval_count":1210,{cached}"eval_count":6}}"#
                )
            )
        };
        let usage = Signal::Usage {
            input_tokens: Some(1210),
            output_tokens: Some(6),
        };
        let cached = Signal::TokenDetails(Box::new(TokenDetails {
            cache_read_input: Some(1152),
            ..TokenDetails::default()
        }));
        assert_eq!(
            ndjson(
                Ollama::default(),
                done(r#""prompt_eval_cached_count":1152,"#).as_bytes()
            ),
            vec![Model("m".into()), usage.clone(), cached.clone(), Done]
        );
        let whole = done(r#""prompt_eval_cached_count":1152,"#);
        assert_eq!(
            body(Ollama::default(), whole.trim_end().as_bytes()),
            vec![Model("m".into()), usage.clone(), cached]
        );
        // An Ollama without the field, and hostile values: the usage alone.
        for odd in [
            "",
            r#""prompt_eval_cached_count":-1,"#,
            r#""prompt_eval_cached_count":"1152","#,
            r#""prompt_eval_cached_count":null,"#,
            r#""prompt_eval_cached_count":1.5,"#,
            r#""prompt_eval_cached_count":1e300,"#,
            r#""prompt_eval_cached_count":[1],"#,
        ] {
            assert_eq!(
                ndjson(Ollama::default(), done(odd).as_bytes()),
                vec![Model("m".into()), usage.clone(), Done],
                "{odd}"
            );
        }
    }

    fn timings(queue_ns: Option<u64>, prefill_ns: Option<u64>) -> Signal {
        Signal::EngineTimings(EngineTimings {
            queue: queue_ns.map(std::time::Duration::from_nanos),
            prefill: prefill_ns.map(std::time::Duration::from_nanos),
            first_token: None,
        })
    }

    #[test]
    fn the_final_line_durations_are_engine_timings() {
        let done = |durations: &str| {
            format!(
                r#"{{"model":"m","message":{{"role":"assistant","content":""}},"done":true,"total_duration":4883583458,{durations}"eval_count":3,"eval_duration":60000000}}"#
            )
        };
        let stream = |durations: &str| {
            ndjson(
                Ollama::default(),
                format!("{}\n", done(durations)).as_bytes(),
            )
        };
        let usage = Signal::Usage {
            input_tokens: None,
            output_tokens: Some(3),
        };
        assert_eq!(
            stream(
                r#""load_duration":20000000,"prompt_eval_count":26,"prompt_eval_duration":130000000,"#
            ),
            vec![
                Model("m".into()),
                Signal::Usage {
                    input_tokens: Some(26),
                    output_tokens: Some(3)
                },
                timings(Some(20_000_000), Some(130_000_000)),
                Done
            ]
        );
        // Zero is a figure (a model already loaded); each field on its own.
        assert_eq!(
            stream(r#""load_duration":0,"#),
            vec![
                Model("m".into()),
                usage.clone(),
                timings(Some(0), None),
                Done
            ]
        );
        // Hostile values: negative, fractional, strings, null, past a day, past u64.
        for hostile in [
            r#""load_duration":-5,"prompt_eval_duration":-1,"#,
            r#""load_duration":1.5,"prompt_eval_duration":"130","#,
            r#""load_duration":null,"prompt_eval_duration":{"ns":1},"#,
            r#""load_duration":86400000000001,"prompt_eval_duration":1e300,"#,
            r#""load_duration":18446744073709551616,"prompt_eval_duration":[1],"#,
        ] {
            assert_eq!(
                stream(hostile),
                vec![Model("m".into()), usage.clone(), Done],
                "{hostile}"
            );
        }
        // A whole (non-streamed) body reports them too.
        let whole = done(r#""load_duration":1000,"prompt_eval_duration":2000,"#);
        assert_eq!(
            body(Ollama::default(), whole.as_bytes()),
            vec![Model("m".into()), usage, timings(Some(1000), Some(2000))]
        );
    }

    #[test]
    fn generate_stream_and_errors() {
        let s = concat!(
            r#"{"model":"qwen3","response":"","thinking":"Let","done":false}"#,
            "\n",
            r#"{"model":"qwen3","response":"Hi","done":false}"#,
            "\n",
            r#"{"error":"an error was encountered while running the model: unexpected EOF"}"#,
            "\n",
            "not json\n",
        );
        assert_eq!(
            ndjson(Ollama::default(), s.as_bytes()),
            vec![
                Model("qwen3".into()),
                out(1, false, OutputKind::Reasoning),
                out(1, false, OutputKind::Content),
                Error(ErrorClass::Other),
                Malformed
            ]
        );
    }

    #[test]
    fn whole_response() {
        let b = br#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"Hello!"},"done_reason":"stop","done":true,"prompt_eval_count":10,"eval_count":3}"#;
        assert_eq!(
            body(Ollama::default(), b),
            vec![
                Model("llama3.2".into()),
                Signal::Usage {
                    input_tokens: Some(10),
                    output_tokens: Some(3)
                },
                Signal::FinishReason("stop".into())
            ]
        );
        assert_eq!(
            body(Ollama::default(), br#"{"error":"model 'x' not found"}"#),
            vec![Error(ErrorClass::Other)]
        );
    }

    /// `done_reason` of the final line and of a whole body; `null`, `""` or a value that
    /// is not a string give none, and the rest of the line is still read.
    #[test]
    fn finish_reasons_are_read_where_the_stream_says_them() {
        let last = |reason: &str| {
            format!(
                r#"{{"model":"qwen3","created_at":"2025-06-01T10:00:00Z","response":"","done":true,"done_reason":{reason},"context":[1,2],"eval_count":128}}"#
            )
        };
        let usage = Signal::Usage {
            input_tokens: None,
            output_tokens: Some(128),
        };
        let stream = |line: String| ndjson(Ollama::default(), format!("{line}\n").as_bytes());
        assert_eq!(
            stream(last(r#""length""#)),
            vec![
                Model("qwen3".into()),
                usage.clone(),
                Signal::FinishReason("length".into()),
                Done
            ]
        );
        assert_eq!(
            body(Ollama::default(), last(r#""length""#).as_bytes()),
            vec![
                Model("qwen3".into()),
                usage.clone(),
                Signal::FinishReason("length".into())
            ]
        );
        for none in ["null", r#""""#, "1", r#"{"reason":"stop"}"#] {
            assert_eq!(
                stream(last(none)),
                vec![Model("qwen3".into()), usage.clone(), Done],
                "{none}"
            );
            assert_eq!(
                body(Ollama::default(), last(none).as_bytes()),
                vec![Model("qwen3".into()), usage.clone()],
                "{none}"
            );
        }
        // Only the final line's counts: a line not yet done names no reason.
        let early = r#"{"model":"qwen3","response":"","done":false,"done_reason":"stop"}"#;
        assert_eq!(stream(early.into()), vec![Model("qwen3".into())]);
    }
}
