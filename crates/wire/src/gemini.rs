//! Google Gemini (`models/{m}:streamGenerateContent`, `:generateContent`, on the Gemini
//! API and Vertex AI): `GenerateContentResponse` chunks, as SSE (`?alt=sse`) or as the
//! elements of one streamed JSON array, and the non-streaming response.
//!
//! Rules, per chunk:
//!
//! - A non-null `error` is [`Signal::Error`], and nothing else is read from it but its
//!   `code` (the HTTP status) and `status` (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`), which
//!   name its cause ([`ErrorClass`](super::ErrorClass)).
//! - The first non-empty `modelVersion` is [`Signal::Model`].
//! - A chunk is token-bearing when some candidate's `content.parts[]` carries output:
//!   `text` ([`OutputKind::Content`], or [`OutputKind::Reasoning`] with `thought: true`),
//!   `functionCall` or `executableCode` ([`OutputKind::ToolCall`]). One chunk is one event;
//!   its kind is the most visible one present.
//! - Tokens in the event: the `logprobsResult.chosenCandidates` entries (one per token,
//!   when the request asked for logprobs), exact; else the growth of the cumulative
//!   `usageMetadata.candidatesTokenCount + thoughtsTokenCount`, which Gemini reports on
//!   every chunk, exact; else estimated from the parts' text, function-call names and
//!   code: their shape (`text_estimate`, at least 1; a structured `args` object
//!   is not read), or with `observe.tokenizer` the tokenizer's count of those and the
//!   arguments.
//! - `usageMetadata` is [`Signal::Usage`]: input `promptTokenCount +
//!   toolUsePromptTokenCount` (cached tokens are part of `promptTokenCount`), output
//!   `candidatesTokenCount + thoughtsTokenCount` (thinking tokens are billed as output);
//!   `cachedContentTokenCount` (the cached part of the input) and `thoughtsTokenCount`
//!   are also [`Signal::TokenDetails`] (cache read, reasoning), whenever a chunk's differ
//!   from what the stream reported before (while the model thinks, its thought count
//!   grows).
//!
//! - Each candidate's `finishReason` (`STOP`, `MAX_TOKENS`, `SAFETY`, ...; on its last
//!   chunk) is [`Signal::FinishReason`] as Gemini spells it, each distinct one once per
//!   chunk, after the chunk's `Output` and before its `Usage`.
//!
//! A non-streaming response yields its model, finish reasons and usage.
//!
//! A blocked prompt (`promptFeedback.blockReason`) or a `finishReason` such as `SAFETY` is
//! not an error: the stream completed, with whatever output it had. A blocked prompt
//! has no candidates, so it names no finish reason.

use serde::Deserialize;

use super::count::{most_visible, Tally};
use super::event_tokens::{count_event, finish_count, text};
use super::frame::Handler;
use super::json::{
    add, Count, ErrorFields, Flag, Fold, Folded, Num, Present, Reason, Reasons, Str, Text,
};
use super::token_stream::TokenStream;
use super::tokenize::Tokenizer;
use super::types::{OutputKind, Signal, TokenDetails};

/// Gemini state for one response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Gemini {
    model_sent: bool,
    tally: Tally,
    /// The cached and thinking counts reported so far (Gemini repeats them on every
    /// chunk).
    details: TokenDetails,
    /// This response's incremental count (`observe.tokenizer`): per-event counts that
    /// add up to the whole text's.
    tokens: Option<TokenStream>,
}

impl Gemini {
    pub(crate) fn new(tokenizer: Option<Tokenizer>) -> Self {
        Gemini {
            tokens: tokenizer.map(|t| t.stream()),
            ..Gemini::default()
        }
    }

    /// Model and error of a chunk or body (`data`); `false` if it was an error.
    fn head(&mut self, chunk: &mut Chunk<'_>, data: &[u8], out: &mut Vec<Signal>) -> bool {
        if chunk.error.0 {
            let class =
                super::json::error_class(data, |report: ErrorReport<'_>| report.error.class());
            out.push(Signal::Error(class));
            return false;
        }
        if !self.model_sent {
            if let Some(model) = std::mem::take(&mut chunk.model).non_empty() {
                out.push(Signal::Model(model.into_owned()));
                self.model_sent = true;
            }
        }
        true
    }
}

impl Handler for Gemini {
    fn event(&mut self, _name: &str, data: &[u8], out: &mut Vec<Signal>) {
        let data = data.trim_ascii();
        if data.is_empty() {
            return;
        }
        let Ok(mut chunk) = super::json::parse::<Chunk<'_>>(data) else {
            out.push(Signal::Malformed);
            return;
        };
        if !self.head(&mut chunk, data, out) {
            return;
        }
        let usage = chunk.usage.map(|u| (u.counts(), u.details()));
        let now = usage.and_then(|((_, output), _)| output);
        let candidates = chunk.candidates.map(|c| c.0).unwrap_or_default();
        match candidates.kind {
            Some(kind) => {
                let shape = candidates.estimate;
                let estimate = || count_event(self.tokens.as_mut(), data, chunk_texts, shape);
                out.push(self.tally.output(kind, candidates.logprobs, now, estimate));
            }
            None => self.tally.report(now),
        }
        candidates.reasons.signals(out);
        if let Some(((input, output), details)) = usage {
            if input.is_some() || output.is_some() {
                out.push(Signal::Usage {
                    input_tokens: input,
                    output_tokens: output,
                });
            }
            details.report(&mut self.details, out);
        }
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        let Ok(mut chunk) = super::json::parse::<Chunk<'_>>(body) else {
            out.push(Signal::Malformed);
            return;
        };
        if !self.head(&mut chunk, body, out) {
            return;
        }
        if let Some(candidates) = chunk.candidates {
            candidates.0.reasons.signals(out);
        }
        if let Some(usage) = chunk.usage {
            let (input, output) = usage.counts();
            if input.is_some() || output.is_some() {
                out.push(Signal::Usage {
                    input_tokens: input,
                    output_tokens: output,
                });
            }
            usage.details().report(&mut self.details, out);
        }
    }

    fn finish(&mut self, out: &mut Vec<Signal>) {
        finish_count(&mut self.tokens, out);
    }
}

/// The output texts of a chunk's parts, for the tokenizer.
fn chunk_texts(chunk: &serde_json::Value, f: &mut dyn FnMut(&str)) {
    for candidate in text::each(chunk.get("candidates")) {
        let parts = candidate.get("content").and_then(|c| c.get("parts"));
        for part in text::each(parts) {
            text::of(part.get("text"), f);
            let call = part
                .get("functionCall")
                .or_else(|| part.get("function_call"));
            if let Some(call) = call {
                text::of(call.get("name"), f);
                text::arguments(call.get("args"), f);
            }
            let code = part
                .get("executableCode")
                .or_else(|| part.get("executable_code"));
            text::of(code.and_then(|c| c.get("code")), f);
        }
    }
}

/// One `GenerateContentResponse`; only the fields the rules read.
#[derive(Deserialize)]
struct Chunk<'a> {
    candidates: Option<Folded<Candidates>>,
    #[serde(rename = "usageMetadata", alias = "usage_metadata")]
    usage: Option<UsageMetadata>,
    #[serde(rename = "modelVersion", alias = "model_version", borrow, default)]
    model: Str<'a>,
    #[serde(default)]
    error: Present,
}

/// An error chunk or body: `{"error": {"code": 429, "message": ..., "status": ...}}`.
#[derive(Deserialize)]
struct ErrorReport<'a> {
    #[serde(borrow, default)]
    error: ErrorFields<'a>,
}

#[derive(Deserialize)]
struct Candidate {
    content: Option<Content>,
    #[serde(rename = "logprobsResult", alias = "logprobs_result")]
    logprobs: Option<LogprobsResult>,
    /// On a candidate's last chunk only.
    #[serde(rename = "finishReason", alias = "finish_reason", default)]
    finish_reason: Reason,
}

#[derive(Deserialize)]
struct Content {
    parts: Option<Folded<Parts>>,
}

#[derive(Deserialize)]
struct Part {
    #[serde(default)]
    text: Text,
    #[serde(default)]
    thought: Flag,
    #[serde(rename = "functionCall", alias = "function_call")]
    function_call: Option<FunctionCall>,
    #[serde(rename = "executableCode", alias = "executable_code")]
    executable_code: Option<ExecutableCode>,
}

/// A `functionCall` part: its `name` is read for the estimate, its `args` object is not.
#[derive(Deserialize)]
struct FunctionCall {
    #[serde(default)]
    name: Text,
}

#[derive(Deserialize)]
struct ExecutableCode {
    #[serde(default)]
    code: Text,
}

impl Part {
    fn estimate(&self) -> u64 {
        let name = self.function_call.as_ref().map_or(0, |c| c.name.estimate);
        let code = self.executable_code.as_ref().map_or(0, |c| c.code.estimate);
        self.text.estimate.saturating_add(name).saturating_add(code)
    }

    fn kind(&self) -> Option<OutputKind> {
        let text = self.text.carries.then_some(if self.thought.0 {
            OutputKind::Reasoning
        } else {
            OutputKind::Content
        });
        let tool = (self.function_call.is_some() || self.executable_code.is_some())
            .then_some(OutputKind::ToolCall);
        most_visible(text, tool)
    }
}

#[derive(Deserialize)]
struct LogprobsResult {
    #[serde(rename = "chosenCandidates", alias = "chosen_candidates")]
    chosen: Option<Folded<Count>>,
}

#[derive(Deserialize)]
struct UsageMetadata {
    #[serde(rename = "promptTokenCount", alias = "prompt_token_count", default)]
    prompt: Num,
    #[serde(
        rename = "toolUsePromptTokenCount",
        alias = "tool_use_prompt_token_count",
        default
    )]
    tool_use_prompt: Num,
    #[serde(
        rename = "candidatesTokenCount",
        alias = "candidates_token_count",
        default
    )]
    candidates: Num,
    #[serde(rename = "thoughtsTokenCount", alias = "thoughts_token_count", default)]
    thoughts: Num,
    #[serde(
        rename = "cachedContentTokenCount",
        alias = "cached_content_token_count",
        default
    )]
    cached: Num,
}

impl UsageMetadata {
    /// `(input, output)`.
    fn counts(&self) -> (Option<u64>, Option<u64>) {
        (
            add(self.prompt.0, self.tool_use_prompt.0),
            add(self.candidates.0, self.thoughts.0),
        )
    }

    /// The cached part of the input (of `promptTokenCount`) and the thinking part of the
    /// output.
    fn details(&self) -> TokenDetails {
        TokenDetails {
            cache_read_input: self.cached.0,
            cache_write_input: None,
            reasoning_output: self.thoughts.0,
        }
    }
}

/// What the candidates of one chunk carried.
#[derive(Default)]
struct Candidates {
    kind: Option<OutputKind>,
    /// The estimated tokens of every part's output.
    estimate: u64,
    /// `logprobsResult.chosenCandidates` entries, summed over candidates.
    logprobs: u64,
    /// The candidates' distinct `finishReason`s.
    reasons: Reasons,
}

impl Fold for Candidates {
    type Item = Candidate;

    fn add(&mut self, candidate: Candidate) {
        if let Some(parts) = candidate.content.and_then(|c| c.parts) {
            self.kind = most_visible(self.kind, parts.0.kind);
            self.estimate = self.estimate.saturating_add(parts.0.estimate);
        }
        if let Some(chosen) = candidate.logprobs.and_then(|l| l.chosen) {
            self.logprobs = self.logprobs.saturating_add(chosen.0 .0);
        }
        self.reasons.add(candidate.finish_reason);
    }
}

/// The most visible output kind among parts, and their estimated tokens.
#[derive(Default)]
struct Parts {
    kind: Option<OutputKind>,
    estimate: u64,
}

impl Fold for Parts {
    type Item = Part;

    fn add(&mut self, part: Part) {
        self.kind = most_visible(self.kind, part.kind());
        self.estimate = self.estimate.saturating_add(part.estimate());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{array, body, sse};
    use crate::ErrorClass;
    use Signal::{Error, Malformed, Model};

    fn out(tokens: u32, exact: bool, kind: OutputKind) -> Signal {
        Signal::Output {
            tokens,
            exact,
            kind,
        }
    }

    fn usage(i: Option<u64>, o: Option<u64>) -> Signal {
        Signal::Usage {
            input_tokens: i,
            output_tokens: o,
        }
    }

    fn chunk(parts: &str, usage: &str) -> String {
        format!(
            r#"{{"candidates": [{{"content": {{"parts": [{parts}],"role": "model"}},"index": 0}}],"usageMetadata": {{{usage}}},"modelVersion": "gemini-2.5-flash"}}"#
        )
    }

    #[test]
    fn cumulative_usage_gives_exact_counts() {
        let chunks = [
            chunk(
                r#"{"text": "The"}"#,
                r#""promptTokenCount": 8,"candidatesTokenCount": 1,"totalTokenCount": 9"#,
            ),
            chunk(
                r#"{"text": " quick brown"}"#,
                r#""promptTokenCount": 8,"candidatesTokenCount": 3"#,
            ),
            chunk(r#"{"text": "!"}"#, r#""promptTokenCount": 8"#),
        ];
        let s: String = chunks
            .iter()
            .map(|c| format!("data: {c}\r\n\r\n"))
            .collect();
        let want = vec![
            Model("gemini-2.5-flash".into()),
            out(1, true, OutputKind::Content),
            usage(Some(8), Some(1)),
            out(2, true, OutputKind::Content),
            usage(Some(8), Some(3)),
            out(1, false, OutputKind::Content),
            usage(Some(8), None),
        ];
        assert_eq!(sse(Gemini::default(), s.as_bytes()), want);
        // The same chunks as a streamed JSON array.
        let a = format!("[{}]", chunks.join(",\r\n"));
        assert_eq!(array(Gemini::default(), a.as_bytes()), want);
    }

    fn details(cached: Option<u64>, thoughts: Option<u64>) -> Signal {
        Signal::TokenDetails(Box::new(TokenDetails {
            cache_read_input: cached,
            cache_write_input: None,
            reasoning_output: thoughts,
        }))
    }

    #[test]
    fn cached_and_thought_tokens_are_parts_of_usage() {
        // Input and output as before (thoughts are output, cached tokens part of the
        // prompt); the details once per change, although every chunk repeats them.
        let chunks = [
            chunk(
                r#"{"text": "**Plan**", "thought": true}"#,
                r#""promptTokenCount": 4120,"cachedContentTokenCount": 4096,"thoughtsTokenCount": 40"#,
            ),
            chunk(
                r#"{"text": "The"}"#,
                r#""promptTokenCount": 4120,"cachedContentTokenCount": 4096,"candidatesTokenCount": 1,"thoughtsTokenCount": 52"#,
            ),
            chunk(
                r#"{"text": " end."}"#,
                r#""promptTokenCount": 4120,"cachedContentTokenCount": 4096,"candidatesTokenCount": 3,"thoughtsTokenCount": 52"#,
            ),
        ];
        let s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        assert_eq!(
            sse(Gemini::default(), s.as_bytes()),
            vec![
                Model("gemini-2.5-flash".into()),
                out(40, true, OutputKind::Reasoning),
                usage(Some(4120), Some(40)),
                details(Some(4096), Some(40)),
                out(13, true, OutputKind::Content),
                usage(Some(4120), Some(53)),
                details(Some(4096), Some(52)),
                out(2, true, OutputKind::Content),
                usage(Some(4120), Some(55)),
            ]
        );
        let whole = br#"{"candidates":[],"usageMetadata":{"promptTokenCount":9,"cachedContentTokenCount":0,"candidatesTokenCount":2,"thoughtsTokenCount":0}}"#;
        assert_eq!(
            body(Gemini::default(), whole),
            vec![usage(Some(9), Some(2)), details(Some(0), Some(0))]
        );
        // Hostile counts: no count, no panic, the rest of the usage read as before.
        for odd in [
            r#""cachedContentTokenCount": -5,"thoughtsTokenCount": null"#,
            r#""cachedContentTokenCount": "4096","thoughtsTokenCount": 2.5"#,
            r#""cachedContentTokenCount": 1e300,"thoughtsTokenCount": [3]"#,
            r#""cachedContentTokenCount": {"n": 1},"thoughtsTokenCount": false"#,
            r#""cachedContentTokenCount": 184467440737095516160"#,
        ] {
            let c = chunk(
                r#"{"text": "x"}"#,
                &format!(r#""promptTokenCount": 7,"candidatesTokenCount": 1,{odd}"#),
            );
            assert_eq!(
                sse(Gemini::default(), format!("data: {c}\n\n").as_bytes()),
                vec![
                    Model("gemini-2.5-flash".into()),
                    out(1, true, OutputKind::Content),
                    usage(Some(7), Some(1)),
                ],
                "{odd}"
            );
        }
    }

    #[test]
    fn thoughts_tools_and_logprobs() {
        let thought = chunk(
            r#"{"text": "**Planning**", "thought": true}"#,
            r#""promptTokenCount": 4,"thoughtsTokenCount": 6"#,
        );
        let call = chunk(
            r#"{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}"#,
            r#""promptTokenCount": 4,"candidatesTokenCount": 5,"thoughtsTokenCount": 6"#,
        );
        let both = chunk(
            r#"{"text": "hm", "thought": true}, {"text": "Hi"}"#,
            r#""promptTokenCount": 4"#,
        );
        let lp = r#"{"candidates":[{"content":{"parts":[{"text":"a b"}]},"logprobsResult":{"topCandidates":[],"chosenCandidates":[{"token":"a","logProbability":-0.1},{"token":" b","logProbability":-0.2}]}}]}"#;
        let s: String = [thought, call, both, lp.to_owned()]
            .iter()
            .map(|c| format!("data: {c}\n\n"))
            .collect();
        assert_eq!(
            sse(Gemini::default(), s.as_bytes()),
            vec![
                Model("gemini-2.5-flash".into()),
                out(6, true, OutputKind::Reasoning),
                usage(Some(4), Some(6)),
                details(None, Some(6)),
                out(5, true, OutputKind::ToolCall),
                usage(Some(4), Some(11)),
                // "hm" and "Hi": two words, estimated from the text.
                out(2, false, OutputKind::Content),
                usage(Some(4), None),
                out(2, true, OutputKind::Content),
            ]
        );
    }

    #[test]
    fn errors_and_blocked_prompts() {
        let err = r#"{"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}"#;
        let overloaded = vec![Error(ErrorClass::Overloaded)];
        assert_eq!(
            sse(Gemini::default(), format!("data: {err}\n\n").as_bytes()),
            overloaded
        );
        assert_eq!(
            array(Gemini::default(), format!("[{err}]").as_bytes()),
            overloaded
        );
        assert_eq!(body(Gemini::default(), err.as_bytes()), overloaded);
        let limited = r#"{"error": {"code": 429, "message": "You exceeded your current quota, please check your plan and billing details.", "status": "RESOURCE_EXHAUSTED"}}"#;
        let rate_limited = vec![Error(ErrorClass::RateLimited)];
        assert_eq!(
            sse(Gemini::default(), format!("data: {limited}\n\n").as_bytes()),
            rate_limited
        );
        assert_eq!(
            array(Gemini::default(), format!("[{limited}]").as_bytes()),
            rate_limited
        );
        assert_eq!(body(Gemini::default(), limited.as_bytes()), rate_limited);
        let internal = r#"{"error": {"code": 500, "message": "An internal error has occurred.", "status": "INTERNAL"}}"#;
        assert_eq!(
            sse(
                Gemini::default(),
                format!("data: {internal}\n\n").as_bytes()
            ),
            vec![Error(ErrorClass::Other)]
        );
        let blocked = r#"{"promptFeedback": {"blockReason": "SAFETY"},"usageMetadata": {"promptTokenCount": 7,"totalTokenCount": 7}}"#;
        assert_eq!(
            sse(Gemini::default(), format!("data: {blocked}\n\n").as_bytes()),
            vec![usage(Some(7), None)]
        );
        assert_eq!(sse(Gemini::default(), b"data: [1]\n\n"), vec![Malformed]);
    }

    #[test]
    fn whole_responses() {
        let b = r#"{"candidates":[{"content":{"parts":[{"text":"Hi there"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"thoughtsTokenCount":2,"totalTokenCount":10},"modelVersion":"gemini-2.0-flash"}"#;
        let want = vec![
            Model("gemini-2.0-flash".into()),
            Signal::FinishReason("STOP".into()),
            usage(Some(5), Some(5)),
            details(None, Some(2)),
        ];
        assert_eq!(body(Gemini::default(), b.as_bytes()), want);
        // Through the array framing, a top-level object is a whole body too.
        assert_eq!(array(Gemini::default(), b.as_bytes()), want);
    }

    /// Each candidate's `finishReason`, as Gemini spells it, in a stream (SSE or a JSON
    /// array) and in a whole body; absent, `null`, `""` or a value that is not a string
    /// give none, and the rest of the chunk is still read.
    #[test]
    fn finish_reasons_are_read_where_the_stream_says_them() {
        let last = r#"{"candidates": [{"content": {"parts": [{"text": " sky."}],"role": "model"},"finishReason": "MAX_TOKENS","index": 0}],"usageMetadata": {"promptTokenCount": 8,"candidatesTokenCount": 4,"totalTokenCount": 12},"modelVersion": "gemini-2.5-flash","responseId": "abc"}"#;
        let first = chunk(
            r#"{"text": "The"}"#,
            r#""promptTokenCount": 8,"candidatesTokenCount": 1"#,
        );
        let want = vec![
            Model("gemini-2.5-flash".into()),
            out(1, true, OutputKind::Content),
            usage(Some(8), Some(1)),
            out(3, true, OutputKind::Content),
            Signal::FinishReason("MAX_TOKENS".into()),
            usage(Some(8), Some(4)),
        ];
        let s = format!("data: {first}\r\n\r\ndata: {last}\r\n\r\n");
        assert_eq!(sse(Gemini::default(), s.as_bytes()), want);
        assert_eq!(
            array(
                Gemini::default(),
                format!("[{first},\r\n{last}]").as_bytes()
            ),
            want
        );
        // Several candidates: each distinct reason once.
        let many = r#"{"candidates":[{"content":{"parts":[{"text":"a"}]},"finishReason":"STOP","index":0},{"finishReason":"SAFETY","index":1,"safetyRatings":[{"category":"HARM_CATEGORY_HARASSMENT","probability":"MEDIUM"}]},{"content":{"parts":[{"text":"b"}]},"finishReason":"STOP","index":2}],"modelVersion":"gemini-2.0-flash"}"#;
        let reasons = vec![
            Model("gemini-2.0-flash".into()),
            Signal::FinishReason("STOP".into()),
            Signal::FinishReason("SAFETY".into()),
        ];
        assert_eq!(body(Gemini::default(), many.as_bytes()), reasons);
        // In snake case too, as the other fields' aliases are.
        let snake = r#"{"candidates":[{"finish_reason":"RECITATION"}],"usage_metadata":{"prompt_token_count":3}}"#;
        assert_eq!(
            body(Gemini::default(), snake.as_bytes()),
            vec![
                Signal::FinishReason("RECITATION".into()),
                usage(Some(3), None)
            ]
        );
        for none in [r#""""#, "null", "1", r#"["STOP"]"#] {
            let c = format!(
                r#"{{"candidates":[{{"content":{{"parts":[{{"text":"a"}}]}},"finishReason":{none}}}],"usageMetadata":{{"promptTokenCount":2}}}}"#
            );
            assert_eq!(
                sse(Gemini::default(), format!("data: {c}\n\n").as_bytes()),
                vec![out(1, false, OutputKind::Content), usage(Some(2), None)],
                "{none}"
            );
            assert_eq!(
                body(Gemini::default(), c.as_bytes()),
                vec![usage(Some(2), None)],
                "{none}"
            );
        }
    }
}
