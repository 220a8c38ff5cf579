//! The OpenAI Responses API (`POST /v1/responses`): typed SSE events, and the
//! non-streaming `response` object.
//!
//! The Responses API streams one JSON object per SSE event, each with a `type` that the
//! SSE `event:` line repeats, and no `[DONE]`: the stream ends with a terminal
//! `response.*` event. Rules, per event (the JSON `type`, else the SSE event name):
//!
//! | event | signal |
//! |---|---|
//! | `response.output_text.delta` | `Output` Content; tokens = `logprobs` entries (exact) when present, else estimated from the `delta` text |
//! | `response.refusal.delta` | `Output` Refusal |
//! | `response.function_call_arguments.delta`, `response.custom_tool_call_input.delta`, `response.mcp_call_arguments.delta`, `response.code_interpreter_call_code.delta` | `Output` ToolCall |
//! | `response.reasoning_text.delta`, `response.reasoning_summary_text.delta` (and the older `response.reasoning.delta`, `response.reasoning_summary.delta`) | `Output` Reasoning |
//! | any event whose `response` names a `model` | `Model`, once |
//! | `response.completed`, `response.incomplete` | `Usage` (`input_tokens`, `output_tokens`) and `TokenDetails` (`input_tokens_details.cached_tokens`, `output_tokens_details.reasoning_tokens`), `FinishReason`, then `Done` |
//! | `response.failed`, or an `error` event | `Usage` if reported, `FinishReason` (`failed`) and `Error`, `Done` for `response.failed` |
//!
//! An `Error`'s class is what the report names: the `error` event's `code` (or the
//! `error` object some servers put in it), `response.failed`'s `response.error.code`
//! (`rate_limit_exceeded`, `server_is_overloaded`; see [`ErrorClass`]).
//!
//! A delta whose `delta` is empty carries nothing. Without logprobs, a delta's count is
//! estimated from its `delta` text: the text's shape (`text_estimate`, at least
//! 1), or with `observe.tokenizer` the tokenizer's count. `response.incomplete` (the model hit
//! `max_output_tokens` or a content filter) is a completed stream, not an error: the
//! response was delivered as far as it went, and its usage is as exact as a completed one.
//! `input_tokens` includes cached tokens and `output_tokens` includes reasoning tokens, as
//! OpenAI bills them.
//!
//! A terminal event's finish reason is its `response.incomplete_details.reason`
//! (`max_output_tokens`, `content_filter`) when there is one, else its `response.status`
//! (`completed`, `incomplete`, `failed`). A non-streaming body yields its model, usage,
//! the same finish reason once its `status` is final (`completed`, `incomplete`,
//! `failed`, `cancelled`; a background response's `queued` or `in_progress` is none) and
//! the error of a failed one.

use serde::Deserialize;

use super::count::Tally;
use super::error_class::ErrorClass;
use super::event_tokens::{count_event, finish_count, text, SelectTexts};
use super::frame::Handler;
use super::json::{
    Code, Count, ErrorFields, Folded, Num, Object, Present, Str, Text, UsageDetails,
};
use super::token_stream::TokenStream;
use super::tokenize::Tokenizer;
use super::types::{OutputKind, Signal, TokenDetails};

/// Responses API state for one response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Responses {
    model_sent: bool,
    tally: Tally,
    /// The cached and reasoning counts reported so far.
    details: TokenDetails,
    /// This response's incremental count (`observe.tokenizer`): per-event counts that
    /// add up to the whole text's.
    tokens: Option<TokenStream>,
}

impl Responses {
    pub(crate) fn new(tokenizer: Option<Tokenizer>) -> Self {
        Responses {
            tokens: tokenizer.map(|t| t.stream()),
            ..Responses::default()
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

/// The output kind of a delta event type.
fn delta_kind(kind: &str) -> Option<OutputKind> {
    Some(match kind {
        "response.output_text.delta" => OutputKind::Content,
        "response.refusal.delta" => OutputKind::Refusal,
        "response.function_call_arguments.delta"
        | "response.custom_tool_call_input.delta"
        | "response.mcp_call_arguments.delta"
        | "response.code_interpreter_call_code.delta" => OutputKind::ToolCall,
        "response.reasoning_text.delta"
        | "response.reasoning_summary_text.delta"
        | "response.reasoning.delta"
        | "response.reasoning_summary.delta" => OutputKind::Reasoning,
        _ => return None,
    })
}

impl Handler for Responses {
    fn event(&mut self, name: &str, data: &[u8], out: &mut Vec<Signal>) {
        let event: Event<'_> = match super::json::typed_event(name, data) {
            None => return,
            Some(Ok(event)) => event,
            Some(Err(signal)) => return out.push(signal),
        };
        let kind = event.kind.0.as_deref().unwrap_or(name);
        if let Some(response) = event.response {
            self.model(response.model, out);
            let failed =
                kind == "response.failed" || response.status.0.as_deref() == Some("failed");
            if let Some(usage) = response.usage.filter(|_| is_terminal(kind) || failed) {
                usage.signals(&mut self.details, out);
            }
            if is_terminal(kind) {
                out.extend(finish_reason(
                    &response.status,
                    response.incomplete_details.as_ref(),
                ));
            }
            if failed {
                out.push(Signal::Error(error_class(data)));
            }
            if is_terminal(kind) {
                out.push(Signal::Done);
            }
            return;
        }
        if kind == "error" || name == "error" {
            out.push(Signal::Error(error_class(data)));
            return;
        }
        if let Some(output) = delta_kind(kind) {
            if event.delta.carries {
                let entries = event.logprobs.map_or(0, |l| l.0 .0);
                let shape = event.delta.estimate;
                let estimate = || {
                    let select: SelectTexts = |event, f| text::of(event.get("delta"), f);
                    count_event(self.tokens.as_mut(), data, select, shape)
                };
                out.push(self.tally.output(output, entries, None, estimate));
            }
        }
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        let Ok(response) = super::json::parse::<Response<'_>>(body) else {
            out.push(Signal::Malformed);
            return;
        };
        if response.error.0 && response.status.0.is_none() {
            // An error object rather than a response.
            out.push(Signal::Error(error_class(body)));
            return;
        }
        self.model(response.model, out);
        if let Some(usage) = response.usage {
            usage.signals(&mut self.details, out);
        }
        if is_final(response.status.as_str()) {
            out.extend(finish_reason(
                &response.status,
                response.incomplete_details.as_ref(),
            ));
        }
        if response.status.0.as_deref() == Some("failed") {
            out.push(Signal::Error(error_class(body)));
        }
    }

    fn finish(&mut self, out: &mut Vec<Signal>) {
        finish_count(&mut self.tokens, out);
    }
}

/// What an `error` event, a `response.failed` event or a failed or error body names as
/// its cause.
fn error_class(data: &[u8]) -> ErrorClass {
    super::json::error_class(data, |report: ErrorReport<'_>| {
        let failed = report.response.map(|r| r.error).unwrap_or_default();
        let number = (report.code.number)
            .or(report.error.code())
            .or(failed.code());
        let [a, b, c] = report.error.names();
        let [d, e, f] = failed.names();
        ErrorClass::of(number, &[report.code.name.as_str(), a, b, c, d, e, f])
    })
}

/// The events that end a response stream.
fn is_terminal(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    )
}

/// The statuses of a response that has ended; a background response's body may still be
/// `queued` or `in_progress`, which is no reason it ended.
fn is_final(status: &str) -> bool {
    matches!(status, "completed" | "incomplete" | "failed" | "cancelled")
}

/// One streamed event; only the fields the rules read.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Str<'a>,
    #[serde(default)]
    delta: Text,
    logprobs: Option<Folded<Count>>,
    // Boxed: only the few lifecycle events carry it, and inline it would make every
    // delta's value, moved as it is returned, several times larger.
    #[serde(borrow)]
    response: Option<Box<Response<'a>>>,
}

/// A `response` object (streamed inside `response.*` events, or the whole body).
#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow, default)]
    model: Str<'a>,
    #[serde(borrow, default)]
    status: Str<'a>,
    #[serde(borrow)]
    incomplete_details: Option<IncompleteDetails<'a>>,
    usage: Option<Usage>,
    #[serde(default)]
    error: Present,
}

/// Why a response ended: the incomplete reason (`max_output_tokens`, `content_filter`)
/// when there is one, else the status.
fn finish_reason(status: &Str<'_>, details: Option<&IncompleteDetails<'_>>) -> Option<Signal> {
    let reason = details.map_or("", |d| d.reason.as_str());
    let reason = if reason.is_empty() {
        status.as_str()
    } else {
        reason
    };
    (!reason.is_empty()).then(|| Signal::FinishReason(reason.to_owned()))
}

/// `{"reason": ...}` of an incomplete response; `null` otherwise.
#[derive(Deserialize)]
struct IncompleteDetails<'a> {
    #[serde(borrow, default)]
    reason: Str<'a>,
}

/// An error report: an `error` event (`code` at the top), a body with an `error` object,
/// or a `response.failed` event (the `response`'s `error`).
#[derive(Deserialize)]
struct ErrorReport<'a> {
    #[serde(borrow, default)]
    code: Code<'a>,
    #[serde(borrow, default)]
    error: ErrorFields<'a>,
    #[serde(borrow)]
    response: Option<FailedResponse<'a>>,
}

#[derive(Deserialize)]
struct FailedResponse<'a> {
    #[serde(borrow, default)]
    error: ErrorFields<'a>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Num,
    #[serde(default)]
    output_tokens: Num,
    /// `cached_tokens`: the input tokens read from the cache.
    #[serde(default)]
    input_tokens_details: Object<UsageDetails>,
    /// `reasoning_tokens`: the output tokens spent reasoning.
    #[serde(default)]
    output_tokens_details: Object<UsageDetails>,
}

impl Usage {
    /// `Usage`, then the cached and reasoning counts where they say something new.
    fn signals(self, sent: &mut TokenDetails, out: &mut Vec<Signal>) {
        out.push(Signal::Usage {
            input_tokens: self.input_tokens.0,
            output_tokens: self.output_tokens.0,
        });
        TokenDetails {
            cache_read_input: UsageDetails::cached(&self.input_tokens_details),
            cache_write_input: None,
            reasoning_output: UsageDetails::reasoning(&self.output_tokens_details),
        }
        .report(sent, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{body, sse};
    use Signal::{Done, Error, Malformed, Model};

    fn out(tokens: u32, exact: bool, kind: OutputKind) -> Signal {
        Signal::Output {
            tokens,
            exact,
            kind,
        }
    }

    fn usage(i: u64, o: u64) -> Signal {
        Signal::Usage {
            input_tokens: Some(i),
            output_tokens: Some(o),
        }
    }

    fn finish(reason: &str) -> Signal {
        Signal::FinishReason(reason.into())
    }

    fn typed(kind: &str, rest: &str) -> String {
        format!("event: {kind}\ndata: {{\"type\":\"{kind}\",{rest}}}\n\n")
    }

    #[test]
    fn deltas_and_kinds() {
        use OutputKind::*;
        let cases = [
            ("response.output_text.delta", Content),
            ("response.refusal.delta", Refusal),
            ("response.function_call_arguments.delta", ToolCall),
            ("response.reasoning_summary_text.delta", Reasoning),
            ("response.reasoning_text.delta", Reasoning),
        ];
        for (kind, want) in cases {
            let s = typed(kind, r#""item_id":"x","output_index":0,"delta":"Hi""#);
            assert_eq!(
                sse(Responses::default(), s.as_bytes()),
                vec![out(1, false, want)]
            );
            let empty = typed(kind, r#""delta":"""#);
            assert_eq!(sse(Responses::default(), empty.as_bytes()), vec![]);
        }
    }

    #[test]
    fn logprobs_entries_are_exact() {
        let s = typed(
            "response.output_text.delta",
            r#""delta":" big world","logprobs":[{"token":" big","logprob":-0.1},{"token":" world","logprob":-0.2}]"#,
        );
        assert_eq!(
            sse(Responses::default(), s.as_bytes()),
            vec![out(2, true, OutputKind::Content)]
        );
    }

    #[test]
    fn lifecycle_model_usage_and_ends() {
        let mut s = typed(
            "response.created",
            r#""response":{"id":"r","status":"in_progress","model":"gpt-4o","usage":null}"#,
        );
        s += &typed(
            "response.in_progress",
            r#""response":{"status":"in_progress","model":"gpt-4o"}"#,
        );
        s += &typed("response.output_text.delta", r#""delta":"a""#);
        s += &typed(
            "response.completed",
            r#""response":{"status":"completed","model":"gpt-4o","usage":{"input_tokens":9,"output_tokens":3,"total_tokens":12}}"#,
        );
        assert_eq!(
            sse(Responses::default(), s.as_bytes()),
            vec![
                Model("gpt-4o".into()),
                out(1, false, OutputKind::Content),
                usage(9, 3),
                finish("completed"),
                Done
            ]
        );
        let incomplete = typed(
            "response.incomplete",
            r#""response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":1,"output_tokens":2}}"#,
        );
        assert_eq!(
            sse(Responses::default(), incomplete.as_bytes()),
            vec![usage(1, 2), finish("max_output_tokens"), Done]
        );
    }

    fn details(cache_read: Option<u64>, reasoning: Option<u64>) -> Signal {
        Signal::TokenDetails(Box::new(TokenDetails {
            cache_read_input: cache_read,
            cache_write_input: None,
            reasoning_output: reasoning,
        }))
    }

    #[test]
    fn cached_and_reasoning_tokens_are_parts_of_usage() {
        let completed = |usage: &str| {
            typed(
                "response.completed",
                &format!(r#""response":{{"status":"completed","usage":{usage}}}"#),
            )
        };
        let s = completed(
            r#"{"input_tokens":3012,"input_tokens_details":{"cached_tokens":2944},"output_tokens":261,"output_tokens_details":{"reasoning_tokens":256},"total_tokens":3273}"#,
        );
        assert_eq!(
            sse(Responses::default(), s.as_bytes()),
            vec![
                usage(3012, 261),
                details(Some(2944), Some(256)),
                finish("completed"),
                Done
            ]
        );
        let whole = br#"{"object":"response","status":"completed","model":"o4-mini","usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":1}}}"#;
        assert_eq!(
            body(Responses::default(), whole),
            vec![
                Model("o4-mini".into()),
                usage(5, 2),
                details(Some(0), Some(1)),
                finish("completed")
            ]
        );
        // Hostile details: no count, no panic, the usage itself still read.
        for odd in [
            r#""input_tokens_details":null,"output_tokens_details":7"#,
            r#""input_tokens_details":"x","output_tokens_details":[1]"#,
            r#""input_tokens_details":{"cached_tokens":-3},"output_tokens_details":{"reasoning_tokens":0.5}"#,
            r#""input_tokens_details":{"cached_tokens":"3"},"output_tokens_details":{"reasoning_tokens":null}"#,
            r#""input_tokens_details":{"cached_tokens":1e300},"output_tokens_details":{"reasoning_tokens":{}}"#,
        ] {
            let s = completed(&format!(r#"{{"input_tokens":4,"output_tokens":2,{odd}}}"#));
            assert_eq!(
                sse(Responses::default(), s.as_bytes()),
                vec![usage(4, 2), finish("completed"), Done],
                "{odd}"
            );
        }
    }

    #[test]
    fn failures() {
        let failed = typed(
            "response.failed",
            r#""response":{"status":"failed","error":{"code":"server_error","message":"x"},"usage":null}"#,
        );
        let other = Error(ErrorClass::Other);
        assert_eq!(
            sse(Responses::default(), failed.as_bytes()),
            vec![finish("failed"), other.clone(), Done]
        );
        let error = typed("error", r#""code":"ERR","message":"boom","param":null"#);
        assert_eq!(
            sse(Responses::default(), error.as_bytes()),
            vec![other.clone()]
        );
        assert_eq!(
            sse(Responses::default(), b"event: error\ndata: not json\n\n"),
            vec![other]
        );
        let rate_limit = typed(
            "error",
            r#""sequence_number":1,"code":"rate_limit_exceeded","message":"Rate limit reached for gpt-4.1 on tokens per min (TPM).","param":null"#,
        );
        assert_eq!(
            sse(Responses::default(), rate_limit.as_bytes()),
            vec![Error(ErrorClass::RateLimited)]
        );
        let overloaded = typed(
            "response.failed",
            r#""response":{"status":"failed","error":{"code":"server_is_overloaded","message":"Selected model is at capacity. Please try a different model."},"usage":{"input_tokens":4,"output_tokens":1}}"#,
        );
        assert_eq!(
            sse(Responses::default(), overloaded.as_bytes()),
            vec![
                usage(4, 1),
                finish("failed"),
                Error(ErrorClass::Overloaded),
                Done
            ]
        );
        let failed_rate_limit = typed(
            "response.failed",
            r#""response":{"status":"failed","error":{"code":"rate_limit_exceeded","message":"x"}}"#,
        );
        assert_eq!(
            sse(Responses::default(), failed_rate_limit.as_bytes()),
            vec![finish("failed"), Error(ErrorClass::RateLimited), Done]
        );
        assert_eq!(
            sse(
                Responses::default(),
                b"event: response.output_text.delta\ndata: {\n\n"
            ),
            vec![Malformed]
        );
    }

    #[test]
    fn json_bodies() {
        let ok = br#"{"id":"resp_1","object":"response","status":"completed","model":"gpt-4o-mini","output":[],"usage":{"input_tokens":5,"output_tokens":7}}"#;
        assert_eq!(
            body(Responses::default(), ok),
            vec![
                Model("gpt-4o-mini".into()),
                usage(5, 7),
                finish("completed")
            ]
        );
        let err = br#"{"error":{"message":"bad","type":"invalid_request_error"}}"#;
        assert_eq!(
            body(Responses::default(), err),
            vec![Error(ErrorClass::Other)]
        );
        let failed = br#"{"status":"failed","model":"m","error":{"code":"server_error"}}"#;
        assert_eq!(
            body(Responses::default(), failed),
            vec![
                Model("m".into()),
                finish("failed"),
                Error(ErrorClass::Other)
            ]
        );
        let limited = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        assert_eq!(
            body(Responses::default(), limited),
            vec![Error(ErrorClass::RateLimited)]
        );
        let overloaded =
            br#"{"status":"failed","model":"m","error":{"code":"server_is_overloaded"}}"#;
        assert_eq!(
            body(Responses::default(), overloaded),
            vec![
                Model("m".into()),
                finish("failed"),
                Error(ErrorClass::Overloaded)
            ]
        );
    }

    /// A terminal event's, or a final body's, `incomplete_details.reason` when there is
    /// one, else its `status`; the lifecycle events before the end name none.
    #[test]
    fn finish_reasons_are_read_where_the_stream_says_them() {
        let mut s = typed(
            "response.created",
            r#""sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","incomplete_details":null,"model":"gpt-4.1","output":[],"usage":null}"#,
        );
        s += &typed(
            "response.in_progress",
            r#""sequence_number":1,"response":{"id":"resp_1","status":"in_progress","incomplete_details":null,"model":"gpt-4.1"}"#,
        );
        s += &typed(
            "response.output_text.delta",
            r#""sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi""#,
        );
        s += &typed(
            "response.incomplete",
            r#""sequence_number":3,"response":{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"content_filter"},"model":"gpt-4.1","usage":{"input_tokens":11,"output_tokens":1,"total_tokens":12}}"#,
        );
        assert_eq!(
            sse(Responses::default(), s.as_bytes()),
            vec![
                Model("gpt-4.1".into()),
                out(1, false, OutputKind::Content),
                usage(11, 1),
                finish("content_filter"),
                Done
            ]
        );
        // No incomplete reason (absent, null, empty, not a string): the status.
        for details in [
            "",
            r#""incomplete_details":null,"#,
            r#""incomplete_details":{"reason":null},"#,
            r#""incomplete_details":{"reason":""},"#,
            r#""incomplete_details":{"reason":7},"#,
        ] {
            let e = typed(
                "response.incomplete",
                &format!(r#""response":{{{details}"status":"incomplete"}}"#),
            );
            assert_eq!(
                sse(Responses::default(), e.as_bytes()),
                vec![finish("incomplete"), Done],
                "{details}"
            );
        }
        // Neither: nothing but the end.
        for status in ["", r#""status":null,"#, r#""status":"","#] {
            let e = typed(
                "response.completed",
                &format!(r#""response":{{{status}"model":"m"}}"#),
            );
            assert_eq!(
                sse(Responses::default(), e.as_bytes()),
                vec![Model("m".into()), Done],
                "{status}"
            );
        }
        let incomplete = br#"{"id":"resp_2","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"model":"o4-mini","output":[],"usage":{"input_tokens":20,"output_tokens":16}}"#;
        assert_eq!(
            body(Responses::default(), incomplete),
            vec![
                Model("o4-mini".into()),
                usage(20, 16),
                finish("max_output_tokens")
            ]
        );
        let cancelled = br#"{"id":"resp_3","object":"response","status":"cancelled","model":"o3","background":true}"#;
        assert_eq!(
            body(Responses::default(), cancelled),
            vec![Model("o3".into()), finish("cancelled")]
        );
        // A background response not yet ended names no reason.
        for status in ["queued", "in_progress"] {
            let b = format!(
                r#"{{"id":"resp_4","object":"response","status":"{status}","model":"o3","background":true}}"#
            );
            assert_eq!(
                body(Responses::default(), b.as_bytes()),
                vec![Model("o3".into())],
                "{status}"
            );
        }
    }
}
