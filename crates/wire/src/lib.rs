//! Wire formats: turn the observer's copy of a response body into [`Signal`]s.
//!
//! Everything here is sans-IO and clock-free: a [`Decoder`] takes bytes exactly as they
//! came off the upstream connection (in whatever frames they came) and appends what it
//! learnt, in stream order, to a caller-owned `Vec<Signal>`. The body wrapper stamps the
//! instant once per frame and hands the signals to the `TokenClock`; nothing in this
//! module knows about time, sockets or metrics.
//!
//! A decoder never sees the forwarded bytes' fate: the stream is already on its way to
//! the client before a decoder looks at it, so a decoder error only ends observation.
//!
//! # Dialects
//!
//! [`dialect_for`] picks the dialect from the request (method, path, query), and
//! [`dialect_for_grpc`] from a gRPC request's path;
//! [`framing_for`] the framing from the response's content-type; [`response_decoder`]
//! adds the content-encoding. Each dialect has its own module with the exact rules; in
//! short (every route also matches under a base path, e.g. `/openai/v1/chat/completions`):
//!
//! | dialect | routes | framing | token-bearing events | tokens per event | usage (N, input) | error mid-stream |
//! |---|---|---|---|---|---|---|
//! | `openai_chat` | `POST …/chat/completions` | SSE + `[DONE]`; JSON | `delta.content`, `refusal`, `tool_calls`/`function_call`, `reasoning_content`/`reasoning` | `logprobs.content` entries, exact; else growth of a cumulative `usage.completion_tokens` (vLLM/SGLang continuous usage), exact; else the text's, estimated | `usage` (final chunk or every chunk); llama.cpp `timings` | `error` object or event (`error.code`, `.type`; TGI's `error_type`; vLLM's numeric `code`) |
//! | `openai_completions` | `POST …/completions` | SSE + `[DONE]`; JSON | `choices[].text` | `logprobs.tokens` entries, exact; else usage growth, exact; else the text's, estimated | `usage` | `error` object or event (`error.code`, `.type`; TGI's `error_type`; vLLM's numeric `code`) |
//! | `openai_responses` | `POST …/responses`; `GET …/responses/{id}?stream=true` | typed SSE, no `[DONE]`; JSON | `response.output_text.delta`, `.refusal.delta`, `.function_call_arguments.delta` (and custom/MCP/code-interpreter input), `.reasoning_text.delta`, `.reasoning_summary_text.delta` | `logprobs` entries, exact; else the text's, estimated | `usage` of `response.completed` / `.incomplete` / `.failed` | `error` event (`code`), `response.failed` (`error.code`) |
//! | `anthropic` | `POST …/v1/messages`; Vertex `…/publishers/anthropic/models/{m}:streamRawPredict` | typed SSE; JSON | `content_block_delta`: `text_delta`, `thinking_delta`, `input_json_delta` | the text's, estimated | `message_start` input (+ cache reads/writes); `message_delta` cumulative `output_tokens`, last wins | `error` event (`error.type`) |
//! | `gemini` | `POST …/models/{m}:streamGenerateContent` (`?alt=sse`: SSE, else a streamed JSON array), `:generateContent` | SSE; JSON array; JSON | `parts[].text` (`thought: true` is reasoning), `functionCall`, `executableCode` | `logprobsResult.chosenCandidates` entries, exact; else growth of the cumulative `candidatesTokenCount + thoughtsTokenCount`, exact; else the text's, estimated | `usageMetadata` on every chunk | `error` object (`code`, `status`) |
//! | `ollama` | `POST …/api/chat`, `…/api/generate` | NDJSON; JSON | `message.content` / `response`, `message.tool_calls`, `thinking` | `logprobs` entries, exact; else the text's, estimated | final line (`done: true`): `prompt_eval_count`, `eval_count` | `error` field (names nothing) |
//! | `tgi` | `POST …/generate_stream`, `…/generate` | SSE; JSON | every `token` event (special tokens too, unless [`DecodeOptions::skip_special_tokens`]) | 1, exact | last event's `details`: `generated_tokens`, `input_length` | `error` field (`error_type`) |
//! | `triton` | `POST …/v2/models/{m}[/versions/{v}]/generate_stream`, `…/generate` | SSE; JSON | non-empty `text_output` | the text's, estimated | none: N is the sum of the estimates | `error` field, after a 200 (names nothing) |
//! | `sglang_grpc`, `vllm_grpc`, `trtllm_grpc` | gRPC `/sglang.grpc.scheduler.SglangScheduler/Generate`, `/vllm.grpc.engine.VllmEngine/Generate`, `/trtllm.TrtllmService/Generate` | gRPC messages | a `chunk` with token ids | its `token_ids`, exact | the `complete` message: `prompt_tokens`, `completion_tokens` | `finish_reason` `error` / `abort`; else `grpc-status` in the trailers ([`grpc::status`]) |
//! | `triton_grpc` | gRPC `/inference.GRPCInferenceService/ModelStreamInfer` | gRPC messages | an `output_ids` tensor, else a non-empty `text_output` | `output_ids` elements, exact; else the text's, estimated | none | `error_message` (names nothing) |
//!
//! The last column says where a stream reports an error and, in brackets, which of its
//! fields name the cause for [`ErrorClass::of`] (a rate limit, an overload or other).
//!
//! Everywhere: one event is at most one [`Signal::Output`], of the most visible kind it
//! carries (content > refusal > tool call > reasoning); role-only, empty, keep-alive,
//! ping and usage-only events carry none. Reported usage is cumulative and replaces the
//! event count as N. A non-streaming (JSON) body yields the model, usage, finish reasons
//! and errors only: it arrives at once and has no inter-token timing. For the gRPC
//! dialects an event is one message ([`grpc`] has their rules). Responses compressed
//! with `gzip`, `deflate`, `br` or `zstd` are decoded on the observer's copy
//! ([`compress`]).
//!
//! Where a response says why it (or one of its choices) ended, its dialect reports that
//! as [`Signal::FinishReason`], spelt as the response spells it, from the value the
//! event's or body's one parse already holds; a reason that is `null`, empty or not a
//! string is none, and costs nothing else of its event:
//!
//! | dialect | stream | whole JSON body |
//! |---|---|---|
//! | `openai_chat`, `openai_completions` | each choice's distinct `finish_reason` of every chunk | each choice's distinct `finish_reason` |
//! | `openai_responses` | `response.completed` / `.incomplete` / `.failed`: `response.incomplete_details.reason`, else `response.status` | the same, once `status` is final (`completed`, `incomplete`, `failed`, `cancelled`) |
//! | `anthropic` | `message_delta.delta.stop_reason` | `stop_reason` |
//! | `gemini` | each candidate's distinct `finishReason` (`STOP`, `MAX_TOKENS`, `SAFETY` ...) | the same |
//! | `ollama` | the final line's (`done: true`) `done_reason` | `done_reason` |
//! | `tgi` | the last event's `details.finish_reason` | `details.finish_reason` |
//! | `sglang_grpc`, `vllm_grpc`, `trtllm_grpc` | the `complete` message's `finish_reason` | the same: a non-streamed call is its `complete` alone |
//! | `triton`, `triton_grpc` | none: Triton's responses carry no finish reason | none |
//!
//! A span carries the distinct reasons as `gen_ai.response.finish_reasons`.
//!
//! Where a response's usage says how much of its input came from (or went into) a prompt
//! cache, or how much of its output was reasoning, its dialect reports that as
//! [`Signal::TokenDetails`] ([`TokenDetails`]), beside [`Signal::Usage`], whose counts keep
//! their meaning (the cached tokens are part of the input, the reasoning tokens part of
//! the output). A decoder reports them again only when they change (several dialects
//! repeat their usage on every chunk); part by part the latest report wins:
//!
//! | dialect | cache read | cache write | reasoning |
//! |---|---|---|---|
//! | `openai_chat`, `openai_completions` | `usage.prompt_tokens_details.cached_tokens` (OpenAI; vLLM, SGLang, llama.cpp when enabled); llama.cpp `timings.cache_n` | none | `usage.completion_tokens_details.reasoning_tokens`; SGLang's `usage.reasoning_tokens` |
//! | `openai_responses` | `usage.input_tokens_details.cached_tokens` | none | `usage.output_tokens_details.reasoning_tokens` |
//! | `anthropic` | `cache_read_input_tokens` (`message_start`, `message_delta`) | `cache_creation_input_tokens` (same) | none (thinking is part of `output_tokens`) |
//! | `gemini` | `usageMetadata.cachedContentTokenCount` | none | `usageMetadata.thoughtsTokenCount` |
//! | `ollama` | the final line's `prompt_eval_cached_count` (newer Ollama) | none | none |
//! | `sglang_grpc`, `vllm_grpc`, `trtllm_grpc` | `cached_tokens` (a hit in the first chunk with a prompt count; the `complete`) | none | SGLang's `complete.reasoning_tokens`, summed over outputs |
//! | `tgi`, `triton`, `triton_grpc` | none: their responses report none | none | none |
//!
//! Where a response carries the engine's own timings (TensorRT-LLM's `perf_metrics`,
//! Ollama's final durations, Groq's and Cerebras' queue and prompt times, llama.cpp's
//! `timings.prompt_ms`), its dialect reports them as [`Signal::EngineTimings`];
//! `engine_timings` reads their units, and `docs/DIALECTS.md` lists the fields.
//!
//! Where the table says "the text's, estimated", the count is a guess from the event's output
//! text (`text_estimate`: a token per word or symbol, at least 1), or an
//! optional [`Tokenizer`]'s count of it (`observe.tokenizer`, see [`tokenize`]); either is
//! estimated (`exact: false`).
//!
//! # Layout
//!
//! [`types`] is the leaf every other module imports (signals, the decoder trait, limits,
//! dialect and framing names), with [`error_class`], the one rule that says what a
//! stream's error report names as its cause (a rate limit, an overload); [`sse`], [`ndjson`], [`jsonarray`] and `buffer` cut bodies
//! into events, and [`grpc::framing`] gRPC bodies into messages; `frame` turns those into
//! [`Decoder`]s around a dialect's handler; one module per dialect says what an event
//! means (the gRPC ones under [`grpc`], with their generated message types); [`factory`]
//! alone knows them all and builds the decoder for a response; [`route`] maps a request to
//! its dialect ([`grpc::route`] a gRPC one). This module only declares them and re-exports
//! the shared names.

// Values from the network pass here: nothing may panic on them (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

mod buffer;
mod count;
mod engine_timings;
mod event_tokens;
mod frame;
mod json;
#[cfg(test)]
mod testing;
mod text_estimate;

pub mod anthropic;
pub mod compress;
pub mod error_class;
pub mod factory;
pub mod gemini;
pub mod gen_ai;
pub mod grpc;
pub mod jsonarray;
pub mod ndjson;
pub mod ollama;
pub mod openai;
pub mod request;
pub mod responses;
pub mod route;
pub mod sse;
pub mod tgi;
pub mod token_stream;
pub mod tokenize;
pub mod triton;
pub mod types;

pub use error_class::ErrorClass;
pub use factory::{decoder, framing_for, response_decoder, DecodeOptions, Unobservable};
pub use grpc::route::dialect_for_grpc;
pub use route::dialect_for;
pub use tokenize::{TokenCounter, Tokenizer};
pub use types::{
    DecodeError, DecodeLimits, Decoder, Dialect, EngineTimings, Framing, OutputKind, Signal,
    TokenDetails,
};
