//! OpenAI-style responses: streamed `/v1/chat/completions` and `/v1/completions` chunks,
//! and the non-streaming JSON body of either.
//!
//! This is the format most inference servers speak (OpenAI, vLLM, SGLang, llama.cpp
//! server, TGI's OpenAI API), so it is where tokentap's measurement semantics meet real
//! bytes: which chunks are token-bearing events, how many tokens each one carries and
//! whether that count is exact, the model name and the reported usage.
//!
//! Rules, per SSE event:
//!
//! - `data: [DONE]` is [`Signal::Done`]; empty data is ignored; data that is not a JSON
//!   object of the expected shape is [`Signal::Malformed`] (observation goes on).
//! - An `error` event, a non-null top-level `error` (OpenAI / vLLM objects, TGI strings)
//!   or `"object": "error"` is [`Signal::Error`], and nothing else is read from it but
//!   what names its cause: `error.code`, `error.type`, `error.status`, TGI's `error_type`,
//!   and the top-level `code` and `type` of an `"object": "error"` (see [`ErrorClass`]).
//! - The first non-empty `model` is [`Signal::Model`], once per stream.
//! - A chunk is token-bearing when any choice carries output: `delta.content` (chat) or
//!   `text` (completions) as [`OutputKind::Content`], `delta.refusal`, tool-call or legacy
//!   `function_call` names / arguments, `delta.reasoning_content` / `delta.reasoning`.
//!   Empty strings, `null`, role-only, `finish_reason`-only and usage-only (`choices: []`)
//!   chunks are not. One chunk is one event, so at most one [`Signal::Output`]; its kind
//!   is the most visible one present: Content > Refusal > ToolCall > Reasoning.
//! - Tokens in the event: the number of logprobs entries (chat `logprobs.content`,
//!   completions `logprobs.tokens`, summed over choices), exact; else the growth of a
//!   cumulative `usage.completion_tokens` (vLLM / SGLang `continuous_usage_stats`) since
//!   the previous usage, or since zero for the first event, exact; else estimated from
//!   the chunk's output text (content, refusal, reasoning, tool-call names and arguments):
//!   its shape (`text_estimate`, at least 1), or with `observe.tokenizer` the
//!   tokenizer's count.
//! - `usage` (or, without it, llama.cpp `timings`) is [`Signal::Usage`], after the
//!   chunk's `Output`. A `usage: null` or one without counts is no signal. A usage with
//!   counts is followed by its cached and reasoning counts, [`Signal::TokenDetails`],
//!   where they change: `prompt_tokens_details.cached_tokens` (else llama.cpp's
//!   `timings.cache_n`), `completion_tokens_details.reasoning_tokens` (else SGLang's
//!   top-level `usage.reasoning_tokens`). A details object that is not an object is
//!   none, and costs nothing else of the chunk.
//! - The engine's own timings, where a server reports them, are
//!   [`Signal::EngineTimings`], after the usage: Groq's `queue_time` and `prompt_time`
//!   (seconds; in `usage` of a whole body, in `x_groq.usage` of a stream's last chunk),
//!   Cerebras' `time_info.queue_time` and `time_info.prompt_time` (seconds), and
//!   llama.cpp's `timings.prompt_ms` (the prefill, milliseconds; it reports no queue).
//!
//! How a body is cut into chunks is `frame`'s, as for every dialect: the `OpenAi` handler
//! only says what one chunk, or one whole body, means. A non-streaming body yields the
//! `model`, each choice's distinct `finish_reason`, `usage` (or llama.cpp `timings`) and
//! `error`, and no [`Signal::Output`].
//!
//! Parsing uses borrowed serde structs that read only what the rules need and fold
//! arrays as they go (no `serde_json::Value`, no `Vec` per chunk); leaf fields accept any
//! JSON type so one odd field does not cost a whole event.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use super::count::{visibility, Tally};
use super::engine_timings::Float;
use super::error_class::ErrorClass;
use super::event_tokens::{count_event, finish_count, text, SelectTexts};
use super::frame::Handler;
use super::json::{
    Code, Count, ErrorFields, Fold, Folded, Num, Object, Reason, Reasons, Str, Text, UsageDetails,
};
use super::token_stream::TokenStream;
use super::tokenize::Tokenizer;
use super::types::{Dialect, EngineTimings, OutputKind, Signal, TokenDetails};

/// OpenAI-style state for one response, in any framing: [`Handler::event`] reads one
/// chunk (an SSE event, an NDJSON line or a JSON-array element), [`Handler::body`] a
/// whole non-streaming body.
#[derive(Clone, Debug)]
pub(crate) struct OpenAi {
    /// `/v1/completions` (reads `choices[].text`); chat (`choices[].delta`) otherwise.
    completions: bool,
    model_sent: bool,
    tally: Tally,
    /// The cached and reasoning counts reported so far (vLLM's continuous usage repeats
    /// them on every chunk).
    details: TokenDetails,
    /// Counts a chunk's text when nothing exact does (`observe.tokenizer`).
    /// This response's incremental count (`observe.tokenizer`): per-event counts that
    /// add up to the whole text's.
    tokens: Option<TokenStream>,
}

impl OpenAi {
    pub(crate) fn new(dialect: Dialect, tokenizer: Option<Tokenizer>) -> Self {
        OpenAi {
            completions: dialect == Dialect::OpenAiCompletions,
            model_sent: false,
            tally: Tally::default(),
            details: TokenDetails::default(),
            tokens: tokenizer.map(|t| t.stream()),
        }
    }

    /// Read one parsed chunk, in place (a chunk is too large to move cheaply; this runs on
    /// every event).
    fn on_chunk(&mut self, chunk: &mut Chunk<'_>, data: &[u8], out: &mut Vec<Signal>) {
        if is_error(chunk.error, &chunk.object) {
            out.push(Signal::Error(error_class(data)));
            return;
        }
        if !self.model_sent {
            if let Some(model) = std::mem::take(&mut chunk.model).non_empty() {
                out.push(Signal::Model(model.into_owned()));
                self.model_sent = true;
            }
        }
        let engine = reported_timings(
            chunk.usage.as_ref(),
            chunk.timings.as_deref(),
            chunk.x_groq.as_deref(),
            chunk.time_info.as_deref(),
        );
        let usage = reported_usage(chunk.usage.as_ref(), chunk.timings.as_deref());
        let reported_output = usage.and_then(|(_, output)| output);
        let choices = std::mem::take(&mut chunk.choices);
        let (kind, logprobs, select): (_, _, SelectTexts) = if self.completions {
            (
                choices.text.then_some(OutputKind::Content),
                choices.token_logprobs,
                completion_texts,
            )
        } else {
            (choices.delta_kind, choices.content_logprobs, chat_texts)
        };
        match kind {
            Some(kind) => {
                let shape = choices.estimate;
                let estimate = || count_event(self.tokens.as_mut(), data, select, shape);
                out.push(self.tally.output(kind, logprobs, reported_output, estimate));
            }
            None => self.tally.report(reported_output),
        }
        choices.finish_reasons.signals(out);
        if let Some((input_tokens, output_tokens)) = usage {
            out.push(Signal::Usage {
                input_tokens,
                output_tokens,
            });
            reported_details(chunk.usage.as_ref(), chunk.timings.as_deref())
                .report(&mut self.details, out);
        }
        if let Some(engine) = engine {
            out.push(engine);
        }
    }
}

impl Handler for OpenAi {
    fn event(&mut self, name: &str, data: &[u8], out: &mut Vec<Signal>) {
        if name == "error" {
            out.push(Signal::Error(error_class(data)));
            return;
        }
        let data = data.trim_ascii();
        if data.is_empty() {
            return;
        }
        if data == b"[DONE]" {
            out.push(Signal::Done);
            return;
        }
        let mut chunk = Chunk {
            model_wanted: !self.model_sent,
            ..Chunk::default()
        };
        match super::json::parse_into(data, &mut chunk) {
            Ok(()) => self.on_chunk(&mut chunk, data, out),
            Err(_) => out.push(Signal::Malformed),
        }
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        read_body(body, &mut self.details, out);
    }

    fn finish(&mut self, out: &mut Vec<Signal>) {
        finish_count(&mut self.tokens, out);
    }
}

/// The output texts of a chat chunk's choices, for the tokenizer.
fn chat_texts(chunk: &serde_json::Value, f: &mut dyn FnMut(&str)) {
    for choice in text::each(chunk.get("choices")) {
        let Some(delta) = choice.get("delta") else {
            continue;
        };
        for key in ["content", "refusal", "reasoning_content", "reasoning"] {
            text::of(delta.get(key), f);
        }
        let calls = text::each(delta.get("tool_calls")).filter_map(|c| c.get("function"));
        for function in calls.chain(delta.get("function_call")) {
            text::of(function.get("name"), f);
            text::arguments(function.get("arguments"), f);
        }
    }
}

/// The texts of a completions chunk's choices, for the tokenizer.
fn completion_texts(chunk: &serde_json::Value, f: &mut dyn FnMut(&str)) {
    for choice in text::each(chunk.get("choices")) {
        text::of(choice.get("text"), f);
    }
}

/// Model, finish reasons, usage and error of a whole non-streaming body.
fn read_body(body: &[u8], details: &mut TokenDetails, out: &mut Vec<Signal>) {
    let parsed = match super::json::parse::<Body<'_>>(body) {
        Ok(parsed) => parsed,
        Err(_) => {
            out.push(Signal::Malformed);
            return;
        }
    };
    if is_error(parsed.error.is_some(), &parsed.object) {
        out.push(Signal::Error(error_class(body)));
        return;
    }
    if let Some(model) = parsed.model.non_empty() {
        out.push(Signal::Model(model.into_owned()));
    }
    if let Some(choices) = parsed.choices {
        choices.0 .0.signals(out);
    }
    let engine = reported_timings(
        parsed.usage.as_ref(),
        parsed.timings.as_ref(),
        parsed.x_groq.as_ref(),
        parsed.time_info.as_ref(),
    );
    if let Some((input_tokens, output_tokens)) =
        reported_usage(parsed.usage.as_ref(), parsed.timings.as_ref())
    {
        out.push(Signal::Usage {
            input_tokens,
            output_tokens,
        });
        reported_details(parsed.usage.as_ref(), parsed.timings.as_ref()).report(details, out);
    }
    if let Some(engine) = engine {
        out.push(engine);
    }
}

/// Whether a chunk or body is an error report.
fn is_error(error: bool, object: &Str<'_>) -> bool {
    error || object.0.as_deref() == Some("error")
}

/// What an error chunk or body names as its cause, read only once it is known to be one.
fn error_class(data: &[u8]) -> ErrorClass {
    super::json::error_class(data, |report: ErrorReport<'_>| {
        let [code, kind, status] = report.error.names();
        let number = report.error.code().or(report.code.number);
        let names = [
            code,
            kind,
            status,
            report.error_type.as_str(),
            report.code.name.as_str(),
            report.kind.as_str(),
        ];
        ErrorClass::of(number, &names)
    })
}

/// `(input, output)` tokens from `usage`, or from llama.cpp `timings` when there is no
/// usage; `None` when neither gives a count. `timings.prompt_n` counts only evaluated
/// prompt tokens, so the cached ones (`cache_n`) are added back.
fn reported_usage(
    usage: Option<&Usage>,
    timings: Option<&Timings>,
) -> Option<(Option<u64>, Option<u64>)> {
    let counted =
        |&(input, output): &(Option<u64>, Option<u64>)| input.is_some() || output.is_some();
    usage
        .map(|u| (u.prompt_tokens.0, u.completion_tokens.0))
        .filter(counted)
        .or_else(|| {
            timings
                .map(|t| {
                    let input = t
                        .prompt_n
                        .0
                        .map(|p| p.saturating_add(t.cache_n.0.unwrap_or(0)));
                    (input, t.predicted_n.0)
                })
                .filter(counted)
        })
}

/// The cached and reasoning parts of a usage that gave counts: `prompt_tokens_details.
/// cached_tokens` (OpenAI; vLLM with `--enable-prompt-tokens-details`, SGLang with
/// `--enable-cache-report`, llama.cpp), else llama.cpp's `timings.cache_n` (the prompt
/// tokens it reused from its cache); `completion_tokens_details.reasoning_tokens`
/// (OpenAI), else SGLang's `reasoning_tokens` at the top of `usage`.
fn reported_details(usage: Option<&Usage>, timings: Option<&Timings>) -> TokenDetails {
    TokenDetails {
        cache_read_input: usage
            .and_then(|u| UsageDetails::cached(&u.prompt_tokens_details))
            .or_else(|| timings.and_then(|t| t.cache_n.0)),
        cache_write_input: None,
        reasoning_output: usage.and_then(|u| {
            UsageDetails::reasoning(&u.completion_tokens_details).or(u.reasoning_tokens.0)
        }),
    }
}

/// The engine's queue and prefill as the chunk or body reports them: Groq's `usage` or
/// `x_groq.usage`, else Cerebras' `time_info` (seconds); a prefill from llama.cpp's
/// `timings.prompt_ms` where no hosted report gives one. Inlined for the chunk that
/// reports none (every chunk but a stream's last); the reading is out of line.
#[inline]
fn reported_timings(
    usage: Option<&Usage>,
    timings: Option<&Timings>,
    x_groq: Option<&XGroq>,
    time_info: Option<&Usage>,
) -> Option<Signal> {
    let groq = x_groq.and_then(|x| x.usage.as_ref());
    let cerebras = time_info;
    if usage.is_none() && groq.is_none() && cerebras.is_none() && timings.is_none() {
        return None;
    }
    read_timings(usage, timings, groq, cerebras)
}

#[inline(never)]
fn read_timings(
    usage: Option<&Usage>,
    timings: Option<&Timings>,
    groq: Option<&Usage>,
    cerebras: Option<&Usage>,
) -> Option<Signal> {
    let first = |of: fn(&Usage) -> &Float| {
        [usage, groq, cerebras]
            .into_iter()
            .flatten()
            .find_map(|u| of(u).seconds())
    };
    let engine = EngineTimings {
        queue: first(|u| &u.queue_time),
        prefill: first(|u| &u.prompt_time).or_else(|| timings.and_then(|t| t.prompt_ms.millis())),
        first_token: None,
    };
    (!engine.is_empty()).then_some(Signal::EngineTimings(engine))
}

// ---- wire structs: only the fields the rules read; unknown fields are skipped ----

/// Groq's `x_groq`, whose `usage` has `queue_time` and `prompt_time` in a stream's last
/// chunk. (Cerebras' `time_info` has the same two names, and is read as a [`Usage`].)
#[derive(Deserialize)]
struct XGroq {
    usage: Option<Usage>,
}

/// One streamed chunk: the fields the rules read, filled in place as serde walks the
/// object (its [`Visitor`]), so that no value of the whole chunk is built and moved on
/// each event. Unknown fields are skipped; a known one twice is an error, as serde's
/// derive has it.
#[derive(Default)]
struct Chunk<'a> {
    /// Whether `model` is read (until the stream named its model); skipped otherwise.
    model_wanted: bool,
    model: Str<'a>,
    object: Str<'a>,
    /// Some non-null `error`.
    error: bool,
    choices: Choices,
    usage: Option<Usage>,
    // Boxed: these are in a few servers' last chunks only.
    timings: Option<Box<Timings>>,
    x_groq: Option<Box<XGroq>>,
    time_info: Option<Box<Usage>>,
}

/// A key of a [`Chunk`].
#[derive(Clone, Copy)]
enum ChunkField {
    Model,
    Object,
    Error,
    Choices,
    Usage,
    Timings,
    XGroq,
    TimeInfo,
    Other,
}

impl ChunkField {
    /// The field's name, and its bit in the set of fields seen.
    fn name_and_bit(self) -> Option<(&'static str, u8)> {
        Some(match self {
            ChunkField::Model => ("model", 1),
            ChunkField::Object => ("object", 2),
            ChunkField::Error => ("error", 4),
            ChunkField::Choices => ("choices", 8),
            ChunkField::Usage => ("usage", 16),
            ChunkField::Timings => ("timings", 32),
            ChunkField::XGroq => ("x_groq", 64),
            ChunkField::TimeInfo => ("time_info", 128),
            ChunkField::Other => return None,
        })
    }
}

impl<'de> Deserialize<'de> for ChunkField {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = ChunkField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, name: &str) -> Result<ChunkField, E> {
                Ok(match name {
                    "model" => ChunkField::Model,
                    "object" => ChunkField::Object,
                    "error" => ChunkField::Error,
                    "choices" => ChunkField::Choices,
                    "usage" => ChunkField::Usage,
                    "timings" => ChunkField::Timings,
                    "x_groq" => ChunkField::XGroq,
                    "time_info" => ChunkField::TimeInfo,
                    _ => ChunkField::Other,
                })
            }
        }
        de.deserialize_identifier(FieldVisitor)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for &mut Chunk<'a> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a chunk object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = 0u8;
        while let Some(field) = map.next_key::<ChunkField>()? {
            if let Some((name, bit)) = field.name_and_bit() {
                if seen & bit != 0 {
                    return Err(de::Error::duplicate_field(name));
                }
                seen |= bit;
            }
            match field {
                ChunkField::Model if self.model_wanted => self.model = map.next_value()?,
                ChunkField::Model => {
                    map.next_value::<IgnoredAny>()?;
                }
                ChunkField::Object => self.object = map.next_value()?,
                ChunkField::Error => {
                    self.error = map.next_value::<Option<IgnoredAny>>()?.is_some();
                }
                ChunkField::Choices => {
                    let choices = map.next_value::<Option<Folded<Choices>>>()?;
                    self.choices = choices.map(|c| c.0).unwrap_or_default();
                }
                ChunkField::Usage => self.usage = map.next_value()?,
                ChunkField::Timings => self.timings = map.next_value()?,
                ChunkField::XGroq => self.x_groq = map.next_value()?,
                ChunkField::TimeInfo => self.time_info = map.next_value()?,
                ChunkField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// What names an error's cause: the `error` object (OpenAI, vLLM), TGI's `error_type`
/// beside an `error` string, or the `code` and `type` of an `"object": "error"` body.
#[derive(Deserialize)]
struct ErrorReport<'a> {
    #[serde(borrow, default)]
    error: ErrorFields<'a>,
    #[serde(borrow, default)]
    error_type: Str<'a>,
    #[serde(borrow, default)]
    code: Code<'a>,
    #[serde(rename = "type", borrow, default)]
    kind: Str<'a>,
}

/// A whole non-streaming response; of its `choices` only the `finish_reason`s are read.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    model: Str<'a>,
    choices: Option<Folded<BodyChoices>>,
    #[serde(borrow, default)]
    object: Str<'a>,
    error: Option<IgnoredAny>,
    usage: Option<Usage>,
    timings: Option<Timings>,
    x_groq: Option<XGroq>,
    time_info: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Num,
    #[serde(default)]
    completion_tokens: Num,
    /// `cached_tokens`: the prompt tokens read from the cache.
    #[serde(default)]
    prompt_tokens_details: Object<UsageDetails>,
    /// `reasoning_tokens`: the completion tokens spent reasoning.
    #[serde(default)]
    completion_tokens_details: Object<UsageDetails>,
    /// SGLang's reasoning count, at the top of `usage`.
    #[serde(default)]
    reasoning_tokens: Num,
    /// Groq, Cerebras: seconds queued.
    #[serde(default)]
    queue_time: Float,
    /// Groq, Cerebras: seconds spent on the prompt.
    #[serde(default)]
    prompt_time: Float,
}

/// llama.cpp server's per-response (or per-token) timings.
#[derive(Deserialize)]
struct Timings {
    #[serde(default)]
    prompt_n: Num,
    #[serde(default)]
    cache_n: Num,
    #[serde(default)]
    predicted_n: Num,
    #[serde(default)]
    prompt_ms: Float,
}

#[derive(Deserialize)]
struct Choice {
    delta: Option<DeltaOutput>,
    #[serde(default)]
    text: Text,
    logprobs: Option<Logprobs>,
    /// `null` until the choice's last chunk.
    #[serde(default)]
    finish_reason: Reason,
}

/// What a [`Delta`] carries, all a [`Choice`] keeps of it: read through `Delta` and
/// summed at once, so a choice stays small as serde moves it.
#[derive(Clone, Copy, Deserialize)]
#[serde(from = "Delta")]
struct DeltaOutput {
    kind: Option<OutputKind>,
    estimate: u64,
}

impl From<Delta> for DeltaOutput {
    fn from(delta: Delta) -> DeltaOutput {
        DeltaOutput {
            kind: delta.kind(),
            estimate: delta.estimate(),
        }
    }
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Text,
    #[serde(default)]
    refusal: Text,
    tool_calls: Option<Folded<AnyToolCall>>,
    function_call: Option<FunctionCall>,
    #[serde(default)]
    reasoning_content: Text,
    #[serde(default)]
    reasoning: Text,
}

impl Delta {
    /// The most visible kind of output this delta carries.
    fn kind(&self) -> Option<OutputKind> {
        let tool = self.tool_calls.as_ref().is_some_and(|t| t.0.carries)
            || self
                .function_call
                .as_ref()
                .is_some_and(FunctionCall::carries);
        if self.content.carries {
            Some(OutputKind::Content)
        } else if self.refusal.carries {
            Some(OutputKind::Refusal)
        } else if tool {
            Some(OutputKind::ToolCall)
        } else if self.reasoning_content.carries || self.reasoning.carries {
            Some(OutputKind::Reasoning)
        } else {
            None
        }
    }

    /// The estimated tokens of all the output this delta carries, of every kind.
    fn estimate(&self) -> u64 {
        let tools = self.tool_calls.as_ref().map_or(0, |t| t.0.estimate);
        let function = self
            .function_call
            .as_ref()
            .map_or(0, FunctionCall::estimate);
        [
            self.content.estimate,
            self.refusal.estimate,
            self.reasoning_content.estimate,
            self.reasoning.estimate,
            tools,
            function,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }
}

#[derive(Deserialize)]
struct ToolCall {
    function: Option<FunctionCall>,
}

#[derive(Deserialize)]
struct FunctionCall {
    #[serde(default)]
    name: Text,
    #[serde(default)]
    arguments: Text,
}

impl FunctionCall {
    fn carries(&self) -> bool {
        self.name.carries || self.arguments.carries
    }

    fn estimate(&self) -> u64 {
        self.name.estimate.saturating_add(self.arguments.estimate)
    }
}

#[derive(Deserialize)]
struct Logprobs {
    /// Chat: one entry per token.
    content: Option<Folded<Count>>,
    /// Completions: one entry per token.
    tokens: Option<Folded<Count>>,
}

/// What the `choices` of one chunk carried, summed over choices.
#[derive(Default)]
struct Choices {
    /// The most visible output in any choice's `delta` (chat).
    delta_kind: Option<OutputKind>,
    /// Some choice had non-empty `text` (completions).
    text: bool,
    /// The estimated tokens of the output text of every choice: `delta` (chat) or
    /// `text` (completions).
    estimate: u64,
    /// Entries in `logprobs.content` (chat).
    content_logprobs: u64,
    /// Entries in `logprobs.tokens` (completions).
    token_logprobs: u64,
    /// The distinct `finish_reason`s of the chunk's choices (several when `n` > 1 and
    /// they end in one chunk).
    finish_reasons: Reasons,
}

impl Fold for Choices {
    type Item = Choice;

    #[inline]
    fn add(&mut self, choice: Choice) {
        if let Some(kind) = choice.delta.and_then(|d| d.kind) {
            if self
                .delta_kind
                .is_none_or(|k| visibility(kind) > visibility(k))
            {
                self.delta_kind = Some(kind);
            }
        }
        self.text |= choice.text.carries;
        self.finish_reasons.add(choice.finish_reason);
        let estimate = match choice.delta {
            Some(delta) => delta.estimate,
            None => choice.text.estimate,
        };
        self.estimate = self.estimate.saturating_add(estimate);
        if let Some(lp) = choice.logprobs {
            let len = |c: Option<Folded<Count>>| c.map_or(0, |c| c.0 .0);
            self.content_logprobs = self.content_logprobs.saturating_add(len(lp.content));
            self.token_logprobs = self.token_logprobs.saturating_add(len(lp.tokens));
        }
    }
}

/// A whole body's choice: only why it ended.
#[derive(Deserialize)]
struct BodyChoice {
    #[serde(default)]
    finish_reason: Reason,
}

/// The distinct `finish_reason`s of a whole body's choices (one per choice with `n` > 1).
#[derive(Default)]
struct BodyChoices(Reasons);

impl Fold for BodyChoices {
    type Item = BodyChoice;

    fn add(&mut self, choice: BodyChoice) {
        self.0.add(choice.finish_reason);
    }
}

/// Whether some tool call in the array carries a function name or arguments, and the
/// estimated tokens of them all.
#[derive(Default)]
struct AnyToolCall {
    carries: bool,
    estimate: u64,
}

impl Fold for AnyToolCall {
    type Item = ToolCall;

    fn add(&mut self, call: ToolCall) {
        if let Some(function) = &call.function {
            self.carries |= function.carries();
            self.estimate = self.estimate.saturating_add(function.estimate());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::frame::{JsonBody, SseStream};
    use crate::types::{DecodeError, DecodeLimits, Decoder};
    use Signal::{Done, Error, Malformed, Model, Output};

    const CHAT: Dialect = Dialect::OpenAiChat;
    const COMPLETIONS: Dialect = Dialect::OpenAiCompletions;

    fn out(tokens: u32, exact: bool, kind: OutputKind) -> Signal {
        Output {
            tokens,
            exact,
            kind,
        }
    }

    fn content(tokens: u32, exact: bool) -> Signal {
        out(tokens, exact, OutputKind::Content)
    }

    fn usage(input: Option<u64>, output: Option<u64>) -> Signal {
        Signal::Usage {
            input_tokens: input,
            output_tokens: output,
        }
    }

    /// Decode `events` (each one SSE `data` payload) as one stream.
    fn stream(dialect: Dialect, events: &[&str]) -> Vec<Signal> {
        let mut body = String::new();
        for event in events {
            body.push_str("data: ");
            body.push_str(event);
            body.push_str("\n\n");
        }
        raw_stream(dialect, body.as_bytes())
    }

    fn raw_stream(dialect: Dialect, body: &[u8]) -> Vec<Signal> {
        let mut dec = SseStream::new(OpenAi::new(dialect, None), DecodeLimits::DEFAULT);
        let mut signals = Vec::new();
        dec.feed(body, &mut signals).expect("within limits");
        dec.finish(&mut signals).expect("finish");
        signals
    }

    /// The signals of one chat chunk whose only choice has `delta`.
    fn delta(delta: &str) -> Vec<Signal> {
        stream(
            CHAT,
            &[&format!(
                r#"{{"choices":[{{"index":0,"delta":{delta},"finish_reason":null}}]}}"#
            )],
        )
    }

    fn json(body: &str, limits: DecodeLimits) -> Result<Vec<Signal>, DecodeError> {
        let mut dec = JsonBody::new(OpenAi::new(CHAT, None), limits);
        let mut signals = Vec::new();
        dec.feed(body.as_bytes(), &mut signals)?;
        dec.finish(&mut signals)?;
        Ok(signals)
    }

    #[test]
    fn done_marker() {
        assert_eq!(stream(CHAT, &["[DONE]"]), vec![Done]);
        assert_eq!(raw_stream(CHAT, b"data:[DONE]\r\n\r\n"), vec![Done]);
    }

    #[test]
    fn malformed_event_is_skipped_and_decoding_goes_on() {
        let signals = stream(
            CHAT,
            &[
                r#"{"choices":[{"delta":{"content":"a"#,
                "not json",
                r#"{"choices":[{"delta":{"content":"b"}}]}"#,
            ],
        );
        assert_eq!(signals, vec![Malformed, Malformed, content(1, false)]);
        // Valid JSON of the wrong shape cannot be understood either.
        assert_eq!(
            stream(CHAT, &["42", r#"{"choices":"x"}"#]),
            vec![Malformed, Malformed]
        );
    }

    #[test]
    fn empty_data_is_ignored() {
        assert_eq!(raw_stream(CHAT, b"data:\n\ndata:  \n\n: ping\n\n"), vec![]);
    }

    #[test]
    fn unterminated_final_event_is_reported_not_decoded() {
        let signals = raw_stream(
            CHAT,
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n",
        );
        assert_eq!(signals, vec![Malformed]);
    }

    #[test]
    fn error_objects() {
        let vllm = r#"{"error": {"object": "error", "message": "boom", "type": "BadRequestError", "param": null, "code": 400}}"#;
        let openai =
            r#"{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}"#;
        let tgi = r#"{"error":"Request failed during generation: Server error: CUDA OOM","error_type":"generation"}"#;
        let legacy_vllm =
            r#"{"object":"error","message":"boom","type":"BadRequestError","code":400}"#;
        let other = Error(ErrorClass::Other);
        for e in [vllm, openai, tgi, legacy_vllm] {
            assert_eq!(stream(CHAT, &[e]), vec![other.clone()], "{e}");
        }
        // An `error` SSE event is an error whatever its data says.
        assert_eq!(raw_stream(CHAT, b"event: error\ndata: {}\n\n"), vec![other]);
        let rate_limit = r#"{"error":{"message":"Rate limit reached for gpt-4o","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
        let overloaded = r#"{"error":{"message":"Service is not ready to receive requests.","type":"ServiceUnavailableError","param":null,"code":503}}"#;
        let tgi_overloaded = r#"{"error":"Model is overloaded","error_type":"overloaded"}"#;
        assert_eq!(
            stream(COMPLETIONS, &[rate_limit]),
            vec![Error(ErrorClass::RateLimited)]
        );
        for e in [overloaded, tgi_overloaded] {
            assert_eq!(
                stream(CHAT, &[e]),
                vec![Error(ErrorClass::Overloaded)],
                "{e}"
            );
        }
        assert_eq!(
            raw_stream(
                CHAT,
                format!("event: error\ndata: {rate_limit}\n\n").as_bytes()
            ),
            vec![Error(ErrorClass::RateLimited)]
        );
        // `"error": null` is no error.
        assert_eq!(
            stream(
                CHAT,
                &[r#"{"error":null,"choices":[{"delta":{"content":"a"}}]}"#]
            ),
            vec![content(1, false)]
        );
    }

    #[test]
    fn model_once_per_stream() {
        let signals = stream(
            CHAT,
            &[
                r#"{"model":"","choices":[]}"#,
                r#"{"model":"gpt\u002d4o","choices":[{"delta":{"role":"assistant","content":""}}]}"#,
                r#"{"model":"gpt-4o","choices":[{"delta":{"content":"Hi"}}]}"#,
                r#"{"model":"other","choices":[]}"#,
            ],
        );
        assert_eq!(signals, vec![Model("gpt-4o".into()), content(1, false)]);
    }

    #[test]
    fn token_bearing_deltas_and_their_kinds() {
        use OutputKind::*;
        // The count is estimated from the text: a word or symbol a token, at least one.
        let cases: &[(&str, OutputKind, u32)] = &[
            (r#"{"content":"Hello"}"#, Content, 1),
            (r#"{"role":"assistant","content":" "}"#, Content, 1),
            (r#"{"content":"a \"quoted\"\nline"}"#, Content, 5),
            (r#"{"content":[{"type":"text","text":"hi"}]}"#, Content, 1),
            (r#"{"reasoning_content":"Let me think"}"#, Reasoning, 3),
            (r#"{"content":null,"reasoning":"hmm"}"#, Reasoning, 1),
            (
                r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]}"#,
                ToolCall,
                3,
            ),
            (
                r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
                ToolCall,
                3, // get, _, weather
            ),
            (r#"{"function_call":{"arguments":"{}"}}"#, ToolCall, 2),
            (r#"{"refusal":"I can't help with that."}"#, Refusal, 8),
        ];
        for (d, kind, tokens) in cases {
            assert_eq!(delta(d), vec![out(*tokens, false, *kind)], "{d}");
        }
    }

    #[test]
    fn deltas_without_output() {
        for d in [
            r#"{"role":"assistant"}"#,
            r#"{"role":"assistant","content":"","refusal":null}"#,
            r#"{"content":null,"reasoning_content":""}"#,
            r#"{}"#,
            r#"null"#,
            r#"{"tool_calls":[{"index":0,"function":{"arguments":""}}]}"#,
            r#"{"tool_calls":[{"index":0,"type":"function"}]}"#,
            r#"{"tool_calls":[]}"#,
            r#"{"function_call":{"name":"","arguments":""}}"#,
            r#"{"content":[]}"#,
            r#"{"content":42}"#,
        ] {
            assert_eq!(delta(d), vec![], "{d}");
        }
        // finish_reason-only and usage-only chunks: no output, the reason alone.
        let signals = stream(
            CHAT,
            &[
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                r#"{"choices":[],"usage":null}"#,
            ],
        );
        assert_eq!(signals, vec![Signal::FinishReason("stop".into())]);
    }

    #[test]
    fn one_output_per_chunk_most_visible_kind_wins() {
        use OutputKind::*;
        assert_eq!(
            delta(r#"{"reasoning_content":"r","content":"c"}"#),
            vec![out(2, false, Content)],
            "one event, of the most visible kind, with the words of both"
        );
        assert_eq!(
            delta(r#"{"refusal":"no","tool_calls":[{"function":{"name":"f"}}]}"#),
            vec![out(2, false, Refusal)]
        );
        assert_eq!(
            delta(r#"{"reasoning":"r","tool_calls":[{"function":{"name":"f"}}]}"#),
            vec![out(2, false, ToolCall)]
        );
        // Across choices too.
        let signals = stream(
            CHAT,
            &[
                r#"{"choices":[{"index":0,"delta":{"reasoning":"r"}},{"index":1,"delta":{"content":"c"}},{"index":2,"delta":{"refusal":"x"}}]}"#,
            ],
        );
        assert_eq!(
            signals,
            vec![out(3, false, Content)],
            "a word in each choice"
        );
    }

    /// The reasons choices ended, from the values the chunk's parse holds: each distinct
    /// one of a chunk's choices, in order; `null`, `""` or a value that is not a string
    /// give none.
    #[test]
    fn finish_reasons_are_read_where_the_stream_says_them() {
        let reasons = |events: &[&str]| -> Vec<String> {
            stream(CHAT, events)
                .into_iter()
                .filter_map(|s| match s {
                    Signal::FinishReason(r) => Some(r),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            reasons(&[
                r#"{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}"#,
                r#"{"choices":[{"delta":{},"finish_reason":""},{"delta":{},"finish_reason":"tool_calls"},{"delta":{},"finish_reason":"stop"},{"delta":{},"finish_reason":"stop"}]}"#,
            ]),
            ["tool_calls", "stop"]
        );
        assert_eq!(
            reasons(&[r#"{"choices":[{"delta":{"content":"a"}}]}"#]),
            Vec::<String>::new()
        );
        // Not a string: no reason, and the rest of the chunk still counts.
        assert_eq!(
            stream(
                CHAT,
                &[r#"{"choices":[{"delta":{"content":"a"},"finish_reason":7}]}"#]
            ),
            vec![content(1, false)]
        );
    }

    /// A whole body names a reason per choice; each distinct one is reported, in order,
    /// for chat and completions alike.
    #[test]
    fn finish_reasons_of_a_whole_body() {
        let body = |dialect: Dialect, body: &str| {
            let mut dec = JsonBody::new(OpenAi::new(dialect, None), DecodeLimits::DEFAULT);
            let mut signals = Vec::new();
            dec.feed(body.as_bytes(), &mut signals)
                .expect("within limits");
            dec.finish(&mut signals).expect("finish");
            signals
        };
        let tool_call = r#"{"id":"chatcmpl-BcQ8","object":"chat.completion","created":1748496646,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"call_q","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Shanghai\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":91,"completion_tokens":14,"total_tokens":105}}"#;
        assert_eq!(
            body(CHAT, tool_call),
            vec![
                Model("gpt-4o-2024-08-06".into()),
                Signal::FinishReason("tool_calls".into()),
                usage(Some(91), Some(14))
            ]
        );
        let n3 = r#"{"object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop"},{"index":1,"message":{"role":"assistant","content":"b c"},"finish_reason":"length"},{"index":2,"message":{"role":"assistant","content":"d"},"finish_reason":"stop"}]}"#;
        assert_eq!(
            body(CHAT, n3),
            vec![
                Model("m".into()),
                Signal::FinishReason("stop".into()),
                Signal::FinishReason("length".into())
            ]
        );
        let completion = r#"{"id":"cmpl-1","object":"text_completion","model":"gpt-3.5-turbo-instruct","choices":[{"text":"\n\nThis is","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        assert_eq!(
            body(COMPLETIONS, completion),
            vec![
                Model("gpt-3.5-turbo-instruct".into()),
                Signal::FinishReason("length".into()),
                usage(Some(5), Some(7))
            ]
        );
        // Absent, null, empty or not a string: no reason, and the rest still read.
        for choice in [
            r#"{"index":0,"message":{"content":"a"}}"#,
            r#"{"index":0,"finish_reason":null}"#,
            r#"{"index":0,"finish_reason":""}"#,
            r#"{"index":0,"finish_reason":7}"#,
            r#"{"index":0,"finish_reason":{"type":"stop"}}"#,
        ] {
            let b =
                format!(r#"{{"model":"m","choices":[{choice}],"usage":{{"prompt_tokens":1}}}}"#);
            assert_eq!(
                body(CHAT, &b),
                vec![Model("m".into()), usage(Some(1), None)],
                "{choice}"
            );
        }
    }

    #[test]
    fn completions_text() {
        let signals = stream(
            COMPLETIONS,
            &[
                r#"{"choices":[{"text":"Once","index":0,"logprobs":null,"finish_reason":null}],"model":"gpt-3.5-turbo-instruct"}"#,
                r#"{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],"model":"gpt-3.5-turbo-instruct"}"#,
            ],
        );
        assert_eq!(
            signals,
            vec![
                Model("gpt-3.5-turbo-instruct".into()),
                content(1, false),
                Signal::FinishReason("length".into())
            ]
        );
        // Each dialect reads its own field.
        assert_eq!(
            stream(COMPLETIONS, &[r#"{"choices":[{"delta":{"content":"a"}}]}"#]),
            vec![]
        );
        assert_eq!(stream(CHAT, &[r#"{"choices":[{"text":"a"}]}"#]), vec![]);
    }

    #[test]
    fn logprobs_count_exactly() {
        let chat = stream(
            CHAT,
            &[
                r#"{"choices":[{"delta":{"content":"Hello"},"logprobs":{"content":[{"token":"Hello","logprob":-0.1,"bytes":[72],"top_logprobs":[]}],"refusal":null}}]}"#,
                r#"{"choices":[{"delta":{"content":" big world"},"logprobs":{"content":[{"token":" big"},{"token":" world"}]}}]}"#,
                // Summed over choices.
                r#"{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{}]}},{"index":1,"delta":{"content":"b c"},"logprobs":{"content":[{},{}]}}]}"#,
                // An empty logprobs array gives no count.
                r#"{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[]}}]}"#,
            ],
        );
        assert_eq!(
            chat,
            vec![
                content(1, true),
                content(2, true),
                content(3, true),
                content(1, false)
            ]
        );
        let completions = stream(
            COMPLETIONS,
            &[
                r#"{"choices":[{"text":" a b","logprobs":{"tokens":[" a"," b"],"token_logprobs":[-0.1,-0.2],"top_logprobs":null,"text_offset":[0,2]}}]}"#,
            ],
        );
        assert_eq!(completions, vec![content(2, true)]);
    }

    #[test]
    fn continuous_usage_gives_exact_deltas() {
        let signals = stream(
            CHAT,
            &[
                r#"{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9}}"#,
                r#"{"choices":[{"delta":{"content":"A"}}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#,
                r#"{"choices":[{"delta":{"content":" quick brown fox"}}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#,
                r#"{"choices":[{"delta":{"content":"!"}}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#,
                r#"{"choices":[{"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}"#,
            ],
        );
        let u = |n| usage(Some(9), Some(n));
        assert_eq!(
            signals,
            vec![
                u(0),
                content(1, true),
                u(1),
                content(3, true),
                u(4),
                content(1, false),
                u(4),
                Signal::FinishReason("stop".into()),
                u(5)
            ]
        );
    }

    #[test]
    fn first_event_counts_usage_from_zero_later_ones_need_a_previous_report() {
        // Usage only on the first token-bearing chunk: growth from zero is exact.
        let first = stream(
            CHAT,
            &[
                r#"{"choices":[{"delta":{"content":"ab"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
            ],
        );
        assert_eq!(first, vec![content(2, true), usage(Some(3), Some(2))]);
        // Usage only at the end on a content chunk: unknown baseline, so the estimate.
        let last = stream(
            CHAT,
            &[
                r#"{"choices":[{"delta":{"content":"a"}}],"usage":null}"#,
                r#"{"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#,
            ],
        );
        assert_eq!(
            last,
            vec![
                content(1, false),
                content(1, false),
                usage(Some(3), Some(7))
            ]
        );
    }

    #[test]
    fn logprobs_beat_usage_delta() {
        let signals = stream(
            CHAT,
            &[
                r#"{"choices":[{"delta":{"content":"ab"},"logprobs":{"content":[{}]}}],"usage":{"completion_tokens":5}}"#,
            ],
        );
        assert_eq!(signals, vec![content(1, true), usage(None, Some(5))]);
    }

    #[test]
    fn usage_reports() {
        let signals = stream(
            CHAT,
            &[
                r#"{"choices":[],"usage":null}"#,
                r#"{"choices":[],"usage":{}}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":null,"completion_tokens":null}}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":null}}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":12.0,"completion_tokens":40,"total_tokens":52,"completion_tokens_details":{"reasoning_tokens":0}}}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":"7"}}"#,
            ],
        );
        assert_eq!(
            signals,
            vec![
                usage(Some(12), None),
                usage(Some(12), Some(40)),
                details(None, Some(0))
            ]
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
        // OpenAI's usage chunk: prompt and completion counts as they are, their parts
        // after them.
        let openai = r#"{"choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":201,"total_tokens":2207,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":192,"audio_tokens":0}}}"#;
        assert_eq!(
            stream(CHAT, &[openai]),
            vec![usage(Some(2006), Some(201)), details(Some(1920), Some(192))]
        );
        // SGLang: its reasoning count at the top of usage; the details object's wins.
        let sglang = r#"{"choices":[],"usage":{"prompt_tokens":1043,"completion_tokens":17,"prompt_tokens_details":{"cached_tokens":1024},"reasoning_tokens":9}}"#;
        assert_eq!(
            stream(CHAT, &[sglang]),
            vec![usage(Some(1043), Some(17)), details(Some(1024), Some(9))]
        );
        let both = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"completion_tokens_details":{"reasoning_tokens":3},"reasoning_tokens":2}}"#;
        assert_eq!(
            stream(CHAT, &[both]),
            vec![usage(Some(5), Some(4)), details(None, Some(3))]
        );
        // Completions and a whole body read the same usage.
        assert_eq!(
            stream(COMPLETIONS, &[openai]),
            vec![usage(Some(2006), Some(201)), details(Some(1920), Some(192))]
        );
        let body = r#"{"object":"chat.completion","model":"m","choices":[],"usage":{"prompt_tokens":531,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":512}}}"#;
        assert_eq!(
            json(body, DecodeLimits::DEFAULT),
            Ok(vec![
                Model("m".into()),
                usage(Some(531), Some(8)),
                details(Some(512), None)
            ])
        );
        // vLLM's continuous usage repeats the details on every chunk: reported once, and
        // again only when they change.
        let chunk = |completion: u32, cached: u32| {
            format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"x"}}}}],"usage":{{"prompt_tokens":40,"completion_tokens":{completion},"prompt_tokens_details":{{"cached_tokens":{cached}}}}}}}"#
            )
        };
        let (a, b, c) = (chunk(1, 32), chunk(2, 32), chunk(3, 16));
        assert_eq!(
            stream(CHAT, &[&a, &b, &c]),
            vec![
                content(1, true),
                usage(Some(40), Some(1)),
                details(Some(32), None),
                content(1, true),
                usage(Some(40), Some(2)),
                content(1, true),
                usage(Some(40), Some(3)),
                details(Some(16), None),
            ]
        );
        // Details without counts are no usage, and so no details either.
        let bare = r#"{"choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":3}}}"#;
        assert_eq!(stream(CHAT, &[bare]), vec![]);
    }

    /// Out of range, negative, fractional, string, null, nested and huge details: never a
    /// panic, never a count that is not one, and the rest of the chunk is read.
    #[test]
    fn hostile_usage_details_give_no_counts() {
        let cases: [(&str, Option<Signal>); 14] = [
            (r#""prompt_tokens_details":null"#, None),
            (r#""prompt_tokens_details":7"#, None),
            (r#""prompt_tokens_details":"cached""#, None),
            (r#""prompt_tokens_details":[{"cached_tokens":1}]"#, None),
            (r#""prompt_tokens_details":{}"#, None),
            (r#""prompt_tokens_details":{"cached_tokens":-1}"#, None),
            (r#""prompt_tokens_details":{"cached_tokens":1.5}"#, None),
            (r#""prompt_tokens_details":{"cached_tokens":"4"}"#, None),
            (r#""prompt_tokens_details":{"cached_tokens":null}"#, None),
            (r#""prompt_tokens_details":{"cached_tokens":1e300}"#, None),
            (
                r#""completion_tokens_details":{"reasoning_tokens":184467440737095516160}"#,
                None,
            ),
            (
                r#""reasoning_tokens":{"n":3},"completion_tokens_details":true"#,
                None,
            ),
            (
                r#""prompt_tokens_details":{"cached_tokens":18446744073709551615}"#,
                Some(details(Some(u64::MAX), None)),
            ),
            (
                r#""prompt_tokens_details":{"cached_tokens":2.0},"reasoning_tokens":0"#,
                Some(details(Some(2), Some(0))),
            ),
        ];
        for (fields, expected) in cases {
            let chunk = format!(
                r#"{{"model":"m","choices":[],"usage":{{"prompt_tokens":9,"completion_tokens":3,{fields}}}}}"#
            );
            let mut want = vec![Model("m".into()), usage(Some(9), Some(3))];
            want.extend(expected);
            assert_eq!(stream(CHAT, &[&chunk]), want, "{fields}");
        }
    }

    #[test]
    fn llama_cpp_timings_stand_in_for_usage() {
        let timings = r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"timings":{"cache_n":4,"prompt_n":6,"prompt_ms":12.5,"predicted_n":30,"predicted_ms":301.2}}"#;
        assert_eq!(
            stream(CHAT, &[timings]),
            vec![
                Signal::FinishReason("stop".into()),
                usage(Some(10), Some(30)),
                details(Some(4), None),
                engine(None, Some(Duration::from_micros(12_500)))
            ]
        );
        let both = r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":31},"timings":{"prompt_n":6,"predicted_n":30}}"#;
        assert_eq!(stream(CHAT, &[both]), vec![usage(Some(10), Some(31))]);
        // A usage's cached count wins over llama.cpp's `cache_n`.
        let cached = r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":31,"prompt_tokens_details":{"cached_tokens":4}},"timings":{"prompt_n":6,"cache_n":5,"predicted_n":30}}"#;
        assert_eq!(
            stream(CHAT, &[cached]),
            vec![usage(Some(10), Some(31)), details(Some(4), None)]
        );
    }

    fn engine(queue: Option<Duration>, prefill: Option<Duration>) -> Signal {
        Signal::EngineTimings(EngineTimings {
            queue,
            prefill,
            first_token: None,
        })
    }

    #[test]
    fn hosted_apis_report_queue_and_prompt_time() {
        let ms = Duration::from_millis;
        // Groq's last stream chunk (shape from a recorded Groq stream).
        let groq_last = r#"{"id":"chatcmpl-e7f8","object":"chat.completion.chunk","created":1729171479,"model":"gemma2-9b-it","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"x_groq":{"id":"req_01","usage":{"queue_time":0.061,"prompt_tokens":18,"prompt_time":0.002,"completion_tokens":439,"completion_time":0.798,"total_tokens":457,"total_time":0.8}}}"#;
        let groq_first = r#"{"id":"chatcmpl-e7f8","object":"chat.completion.chunk","model":"gemma2-9b-it","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"x_groq":{"id":"req_01"}}"#;
        assert_eq!(
            stream(CHAT, &[groq_first, groq_last]),
            vec![
                Model("gemma2-9b-it".into()),
                Signal::FinishReason("stop".into()),
                engine(Some(ms(61)), Some(ms(2)))
            ]
        );
        // Groq's whole body: the times are in `usage`.
        let groq_body = r#"{"object":"chat.completion","model":"llama-3.1-8b-instant","choices":[],"usage":{"queue_time":0.265,"prompt_tokens":41,"prompt_time":0.012,"completion_tokens":27,"completion_time":0.055,"total_tokens":68,"total_time":0.067},"x_groq":{"id":"req_01"}}"#;
        assert_eq!(
            json(groq_body, DecodeLimits::DEFAULT),
            Ok(vec![
                Model("llama-3.1-8b-instant".into()),
                usage(Some(41), Some(27)),
                engine(Some(ms(265)), Some(ms(12)))
            ])
        );
        // Cerebras: `time_info`, in a whole body and a stream's usage chunk.
        let cerebras = r#"{"model":"gpt-oss-120b","object":"chat.completion","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":10},"time_info":{"queue_time":0.25,"prompt_time":0.5,"completion_time":0.0056,"total_time":0.0222,"created":1723733419}}"#;
        assert_eq!(
            json(cerebras, DecodeLimits::DEFAULT),
            Ok(vec![
                Model("gpt-oss-120b".into()),
                usage(Some(12), Some(10)),
                engine(Some(ms(250)), Some(ms(500)))
            ])
        );
        let cerebras_chunk = r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2},"time_info":{"queue_time":0.001,"prompt_time":0.006}}"#;
        assert_eq!(
            stream(CHAT, &[cerebras_chunk]),
            vec![usage(Some(10), Some(2)), engine(Some(ms(1)), Some(ms(6)))]
        );
    }

    /// Missing, null, zero, negative, non-finite-looking and huge values: never a panic,
    /// never a figure that is not a plausible duration; the rest of the chunk is read.
    #[test]
    fn hostile_engine_timings_give_no_figures() {
        let cases = [
            (r#""x_groq":{"usage":{}}"#, None),
            (r#""x_groq":{"usage":null}"#, None),
            (r#""x_groq":null,"time_info":null"#, None),
            (
                r#""x_groq":{"usage":{"queue_time":0,"prompt_time":0}}"#,
                Some(engine(Some(Duration::ZERO), Some(Duration::ZERO))),
            ),
            (
                r#""x_groq":{"usage":{"queue_time":-0.5,"prompt_time":-1}}"#,
                None,
            ),
            (
                r#""time_info":{"queue_time":"NaN","prompt_time":"inf"}"#,
                None,
            ),
            (
                r#""time_info":{"queue_time":1.7e308,"prompt_time":1e300}"#,
                None,
            ),
            (
                r#""time_info":{"queue_time":86401,"prompt_time":[1]}"#,
                None,
            ),
            (r#""timings":{"prompt_ms":-3.0}"#, None),
            (r#""timings":{"prompt_ms":1e12}"#, None),
        ];
        for (fields, expected) in cases {
            let chunk = format!(r#"{{"model":"m","choices":[],{fields}}}"#);
            let mut want = vec![Model("m".into())];
            want.extend(expected);
            assert_eq!(stream(CHAT, &[&chunk]), want, "{fields}");
        }
        // Not an object where one is expected: the chunk is malformed, as with `usage`.
        let odd = r#"{"model":"m","choices":[],"time_info":7}"#;
        assert_eq!(stream(CHAT, &[odd]), vec![Malformed]);
    }

    #[test]
    fn json_body_model_and_usage() {
        let body = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}"#;
        assert_eq!(
            json(body, DecodeLimits::DEFAULT),
            Ok(vec![
                Model("gpt-4o-mini".into()),
                Signal::FinishReason("stop".into()),
                usage(Some(19), Some(10))
            ])
        );
        let llama = r#"{"model":"m.gguf","choices":[],"timings":{"prompt_n":5,"predicted_n":8}}"#;
        assert_eq!(
            json(llama, DecodeLimits::DEFAULT),
            Ok(vec![Model("m.gguf".into()), usage(Some(5), Some(8))])
        );
    }

    #[test]
    fn json_body_error_and_malformed() {
        let err = r#"{"error":{"message":"Invalid model","type":"invalid_request_error","param":"model","code":"model_not_found"}}"#;
        assert_eq!(
            json(err, DecodeLimits::DEFAULT),
            Ok(vec![Error(ErrorClass::Other)])
        );
        let quota = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        assert_eq!(
            json(quota, DecodeLimits::DEFAULT),
            Ok(vec![Error(ErrorClass::RateLimited)])
        );
        let overloaded = r#"{"error":{"message":"The server is overloaded or not ready yet.","type":"service_unavailable_error","param":null,"code":"server_is_overloaded"}}"#;
        assert_eq!(
            json(overloaded, DecodeLimits::DEFAULT),
            Ok(vec![Error(ErrorClass::Overloaded)])
        );
        assert_eq!(
            json("{\"model\":", DecodeLimits::DEFAULT),
            Ok(vec![Malformed])
        );
        assert_eq!(json("", DecodeLimits::DEFAULT), Ok(vec![Malformed]));
    }

    #[test]
    fn json_body_is_bounded() {
        let body = r#"{"model":"m","usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
        let exact = DecodeLimits {
            max_body_bytes: body.len(),
            ..DecodeLimits::DEFAULT
        };
        assert_eq!(
            json(body, exact),
            Ok(vec![Model("m".into()), usage(Some(1), Some(2))])
        );
        let short = DecodeLimits {
            max_body_bytes: body.len() - 1,
            ..DecodeLimits::DEFAULT
        };
        assert_eq!(
            json(body, short),
            Err(DecodeError::BodyTooLarge {
                limit: body.len() - 1
            })
        );
        // The buffer never grows past the limit, whatever the frames.
        let mut dec = JsonBody::new(OpenAi::new(CHAT, None), exact);
        for byte in body.as_bytes().chunks(1) {
            dec.feed(byte, &mut Vec::new()).expect("within limit");
            assert!(dec.body.capacity() <= body.len());
        }
    }

    #[test]
    fn stream_event_bound() {
        let limits = DecodeLimits {
            max_event_bytes: 32,
            ..DecodeLimits::DEFAULT
        };
        let mut dec = SseStream::new(OpenAi::new(CHAT, None), limits);
        let big = format!("data: {}\n\n", "x".repeat(64));
        assert_eq!(
            dec.feed(big.as_bytes(), &mut Vec::new()),
            Err(DecodeError::EventTooLarge { limit: 32 })
        );
    }
}
