//! What the simulator sends, per API dialect: the bytes of every step of a streamed
//! response (preamble, one event per token, finish, usage, end marker, error) and of a
//! whole response, shaped as each real server shapes them.
//!
//! Kept apart from the timing machinery in `stream.rs` so that a dialect is one `match`
//! arm per step here. Every dialect reports the same truth (the model's profile): N output
//! tokens, in token events of one or more tokens each ([`TokenEvent`]), and
//! `prompt_tokens` input tokens, in whichever fields that dialect uses, so the integration
//! tests can check tokentap's figures against it.

use bytes::Bytes;
use serde_json::{json, Value};

use super::config::{Fault, StreamError};

/// The API a request speaks, from its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    Chat,
    Completions,
    Responses,
    Anthropic,
    /// `sse`: `?alt=sse`; otherwise a streamed JSON array.
    Gemini {
        sse: bool,
    },
    /// `chat`: `/api/chat`; otherwise `/api/generate`.
    Ollama {
        chat: bool,
    },
    Tgi,
    Triton,
}

/// One token-bearing event of a response: the `index`-th, carrying tokens
/// `first..first + tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TokenEvent {
    pub(super) index: u32,
    pub(super) first: u32,
    pub(super) tokens: u32,
}

/// Everything needed to produce one response.
pub(super) struct Script {
    pub(super) api: Api,
    pub(super) model: String,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) tokens: u32,
    pub(super) prompt_tokens: u64,
    pub(super) include_usage: bool,
    pub(super) continuous: bool,
    pub(super) role_chunk: bool,
    /// With `--stamp`: when the request arrived (Unix nanoseconds).
    pub(super) stamp: Option<u64>,
    pub(super) fault: Option<Fault>,
    /// Configured timing, for the durations Ollama reports (nanoseconds): the TTFT, the
    /// part of it reported as the wait for the model (`x-sim-queue-ms`, at most the
    /// TTFT), and the ITL.
    pub(super) ttft_ns: u64,
    pub(super) queue_ns: u64,
    pub(super) itl_ns: u64,
    /// Of `prompt_tokens`, those the usage reports as read from the prompt cache
    /// (`x-sim-cached-tokens`).
    pub(super) cached_tokens: u64,
    /// Of the output tokens, those the usage reports as reasoning (`x-sim-reasoning-tokens`).
    pub(super) reasoning_tokens: u64,
}

const WORDS: [&str; 16] = [
    " the",
    " token",
    " streams",
    " fast",
    " and",
    " every",
    " gap",
    " is",
    " measured",
    " by",
    " tokentap",
    " at",
    " the",
    " pod",
    " boundary",
    ".",
];

const FAILURE: &str = "simulated engine failure";

fn sse(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

fn data(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

impl Script {
    pub(super) fn word(i: u32) -> &'static str {
        WORDS[i as usize % WORDS.len()]
    }

    fn text(&self) -> String {
        (0..self.tokens).map(Self::word).collect()
    }

    /// The content-type of a streamed response.
    pub(super) fn stream_content_type(&self) -> &'static str {
        match self.api {
            Api::Ollama { .. } => "application/x-ndjson",
            Api::Gemini { sse: false } => "application/json; charset=UTF-8",
            _ => "text/event-stream",
        }
    }

    /// A Gemini JSON-array element: `[` before the first, `,\r\n` before the others.
    fn element(first: bool, value: &Value) -> String {
        let lead = if first { "[" } else { ",\r\n" };
        format!("{lead}{value}")
    }

    fn gemini(&self, value: &Value, first: bool) -> Bytes {
        match self.api {
            Api::Gemini { sse: false } => Bytes::from(Self::element(first, value)),
            _ => Bytes::from(format!("data: {value}\r\n\r\n")),
        }
    }

    fn openai_usage(&self, completion: u64) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        });
        // The breakdowns only when asked for, as the OpenAI-compatible engines send them.
        if self.cached_tokens > 0 {
            usage["prompt_tokens_details"] = json!({"cached_tokens": self.cached_tokens});
        }
        if self.reasoning_tokens > 0 {
            let reasoning = self.reasoning_tokens.min(completion);
            usage["completion_tokens_details"] = json!({"reasoning_tokens": reasoning});
        }
        usage
    }

    fn continuous_usage(&self, completion: u64) -> Option<Value> {
        self.continuous.then(|| self.openai_usage(completion))
    }

    /// One OpenAI `data:` chunk. `choice` is `None` for a usage-only chunk.
    fn chunk(&self, choice: Option<Value>, usage: Option<Value>) -> Bytes {
        let object = match self.api {
            Api::Completions => "text_completion",
            _ => "chat.completion.chunk",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choice.map_or_else(Vec::new, |c| vec![c]),
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        if let Some(received) = self.stamp {
            chunk["sim_received_unix_ns"] = received.into();
            chunk["sim_sent_unix_ns"] = super::config::unix_ns().into();
        }
        data(&chunk)
    }

    fn responses_object(&self, status: &str, usage: Option<u64>) -> Value {
        let output = if status == "in_progress" {
            json!([])
        } else {
            json!([self.responses_message("completed")])
        };
        json!({
            "id": format!("resp_{}", self.id), "object": "response", "created_at": self.created,
            "status": status, "error": null, "incomplete_details": null, "model": self.model,
            "output": output,
            "usage": usage.map(|n| json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": n,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens.min(n)},
                "total_tokens": self.prompt_tokens + n,
            })),
        })
    }

    fn responses_message(&self, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "output_text", "annotations": [], "logprobs": [], "text": self.text()}])
        };
        json!({"id": format!("msg_{}", self.id), "type": "message", "status": status, "content": content, "role": "assistant"})
    }

    fn anthropic_usage(&self, output: u64) -> Value {
        // Anthropic's `input_tokens` are the ones not read from the cache.
        json!({
            "input_tokens": self.prompt_tokens.saturating_sub(self.cached_tokens),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached_tokens, "output_tokens": output,
        })
    }

    fn gemini_usage(&self, candidates: Option<u64>) -> Value {
        let mut usage = json!({"promptTokenCount": self.prompt_tokens});
        if self.cached_tokens > 0 {
            usage["cachedContentTokenCount"] = self.cached_tokens.into();
        }
        if let Some(n) = candidates {
            usage["candidatesTokenCount"] = n.into();
        }
        usage["totalTokenCount"] = (self.prompt_tokens + candidates.unwrap_or(0)).into();
        usage
    }

    fn gemini_chunk(&self, text: &str, candidates: u64, finish: bool) -> Value {
        let mut candidate =
            json!({"content": {"parts": [{"text": text}], "role": "model"}, "index": 0});
        if finish {
            candidate["finishReason"] = "MAX_TOKENS".into();
        }
        json!({
            "candidates": [candidate],
            "usageMetadata": self.gemini_usage(Some(candidates)),
            "modelVersion": self.model,
            "responseId": self.id,
        })
    }

    /// RFC 3339 time `offset_ns` after `created`, as Ollama writes `created_at`.
    fn created_at(&self, offset_ns: u64) -> String {
        let secs = self.created + offset_ns / 1_000_000_000;
        let nanos = offset_ns % 1_000_000_000;
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }

    fn ollama_line(&self, i: u32, text: &str, done: bool) -> Value {
        let offset = self.ttft_ns + u64::from(i) * self.itl_ns;
        let mut line = json!({"model": self.model, "created_at": self.created_at(offset)});
        match self.api {
            Api::Ollama { chat: true } => {
                line["message"] = json!({"role": "assistant", "content": text});
            }
            _ => line["response"] = text.into(),
        }
        line["done"] = done.into();
        if done {
            let eval = u64::from(self.tokens.saturating_sub(1)) * self.itl_ns;
            line["done_reason"] = "length".into();
            line["total_duration"] = (self.ttft_ns + eval).into();
            line["load_duration"] = self.queue_ns.into();
            line["prompt_eval_count"] = self.prompt_tokens.into();
            line["prompt_eval_duration"] = self.ttft_ns.saturating_sub(self.queue_ns).into();
            line["eval_count"] = self.tokens.into();
            line["eval_duration"] = eval.into();
        }
        line
    }

    /// Sent right after the head, before the first token (`None`: nothing).
    pub(super) fn preamble(&self) -> Option<Bytes> {
        match self.api {
            Api::Chat if self.role_chunk => {
                let choice = json!({
                    "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null
                });
                Some(self.chunk(Some(choice), self.continuous_usage(0)))
            }
            Api::Responses => {
                let created = self.responses_object("in_progress", None);
                let mut out = Vec::new();
                for (seq, (kind, body)) in [
                    ("response.created", json!({"response": created})),
                    ("response.in_progress", json!({"response": created})),
                    (
                        "response.output_item.added",
                        json!({"output_index": 0, "item": self.responses_message("in_progress")}),
                    ),
                    (
                        "response.content_part.added",
                        json!({"item_id": format!("msg_{}", self.id), "output_index": 0, "content_index": 0,
                               "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}}),
                    ),
                ]
                .into_iter()
                .enumerate()
                {
                    let mut event = json!({"type": kind, "sequence_number": seq});
                    merge(&mut event, body);
                    out.extend_from_slice(&sse(kind, &event));
                }
                Some(Bytes::from(out))
            }
            Api::Anthropic => {
                let start = json!({"type": "message_start", "message": {
                    "id": format!("msg_{}", self.id), "type": "message", "role": "assistant",
                    "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": self.anthropic_usage(1),
                }});
                let block = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
                let mut out = Vec::new();
                out.extend_from_slice(&sse("message_start", &start));
                out.extend_from_slice(&sse("content_block_start", &block));
                out.extend_from_slice(b"event: ping\ndata: {\"type\": \"ping\"}\n\n");
                Some(Bytes::from(out))
            }
            _ => None,
        }
    }

    /// The token-bearing event `event` (`first`: nothing was sent before it).
    pub(super) fn token(&self, event: TokenEvent, first: bool) -> Bytes {
        let text: String = (event.first..event.first + event.tokens)
            .map(Self::word)
            .collect();
        let word = text.as_str();
        let i = event.first;
        let n = u64::from(event.first + event.tokens);
        match self.api {
            Api::Chat => self.chunk(
                Some(json!({"index": 0, "delta": {"content": word}, "logprobs": null, "finish_reason": null})),
                self.continuous_usage(n),
            ),
            Api::Completions => self.chunk(
                Some(json!({"index": 0, "text": word, "logprobs": null, "finish_reason": null})),
                self.continuous_usage(n),
            ),
            Api::Responses => sse(
                "response.output_text.delta",
                &json!({"type": "response.output_text.delta", "sequence_number": 4 + event.index,
                        "item_id": format!("msg_{}", self.id), "output_index": 0, "content_index": 0,
                        "delta": word, "logprobs": []}),
            ),
            Api::Anthropic => sse(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}),
            ),
            Api::Gemini { .. } => self.gemini(&self.gemini_chunk(word, n, false), first),
            Api::Ollama { .. } => Bytes::from(format!(
                "{}\n",
                self.ollama_line(i + event.tokens - 1, word, false)
            )),
            Api::Tgi => {
                let last = n == u64::from(self.tokens);
                let event = json!({
                    "index": n,
                    "token": {"id": 1000 + i, "text": word, "logprob": -0.25, "special": false},
                    "generated_text": if last { Value::from(self.text()) } else { Value::Null },
                    "details": if last {
                        json!({"finish_reason": "length", "generated_tokens": self.tokens, "seed": null, "input_length": self.prompt_tokens})
                    } else {
                        Value::Null
                    },
                });
                Bytes::from(format!("data:{event}\n\n"))
            }
            Api::Triton => data(&json!({
                "model_name": self.model, "model_version": "1", "sequence_end": false,
                "sequence_id": 0, "sequence_start": false, "text_output": word,
            })),
        }
    }

    /// Sent after the last token (`first`: nothing was sent; `events`: token-bearing
    /// events sent).
    pub(super) fn finish(&self, first: bool, events: u32) -> Option<Bytes> {
        let tokens = u64::from(self.tokens);
        match self.api {
            Api::Chat => Some(self.chunk(
                Some(json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"})),
                self.continuous_usage(tokens),
            )),
            Api::Completions => Some(self.chunk(
                Some(json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "length"})),
                self.continuous_usage(tokens),
            )),
            Api::Responses => {
                let item_id = format!("msg_{}", self.id);
                let text = self.text();
                let part =
                    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
                let seq = 4 + events;
                let mut out = Vec::new();
                for (k, (kind, body)) in [
                    (
                        "response.output_text.done",
                        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
                    ),
                    (
                        "response.output_item.done",
                        json!({"output_index": 0, "item": self.responses_message("completed")}),
                    ),
                    (
                        "response.completed",
                        json!({"response": self.responses_object("completed", Some(tokens))}),
                    ),
                ]
                .into_iter()
                .enumerate()
                {
                    let mut event = json!({"type": kind, "sequence_number": seq + k as u32});
                    merge(&mut event, body);
                    out.extend_from_slice(&sse(kind, &event));
                }
                Some(Bytes::from(out))
            }
            Api::Anthropic => {
                let mut out = Vec::new();
                out.extend_from_slice(&sse(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                ));
                out.extend_from_slice(&sse(
                    "message_delta",
                    &json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                            "usage": {"output_tokens": tokens}}),
                ));
                out.extend_from_slice(&sse("message_stop", &json!({"type": "message_stop"})));
                Some(Bytes::from(out))
            }
            Api::Gemini { sse } => {
                let last = self.gemini(&self.gemini_chunk("", tokens, true), first);
                if sse {
                    Some(last)
                } else {
                    Some(Bytes::from([&last[..], b"\r\n]"].concat()))
                }
            }
            Api::Ollama { .. } => Some(Bytes::from(format!(
                "{}\n",
                self.ollama_line(self.tokens, "", true)
            ))),
            Api::Tgi | Api::Triton => None,
        }
    }

    /// The final usage-only chunk (OpenAI `stream_options.include_usage`).
    pub(super) fn usage(&self) -> Option<Bytes> {
        let usage = self.openai_usage(u64::from(self.tokens));
        match self.api {
            Api::Chat | Api::Completions if self.include_usage => {
                Some(self.chunk(None, Some(usage)))
            }
            _ => None,
        }
    }

    /// The end marker.
    pub(super) fn done(&self) -> Option<Bytes> {
        match self.api {
            Api::Chat | Api::Completions => Some(Bytes::from_static(b"data: [DONE]\n\n")),
            _ => None,
        }
    }

    /// The dialect's mid-stream error report of `kind`, ending the stream (`events`:
    /// token-bearing events sent before it). A rate limit and an overload take each
    /// dialect's real shape; TGI has no rate-limit error (its concurrency limit, sent
    /// with a 429, is its `overloaded`), and Ollama and Triton report either as a plain
    /// message, as they do.
    pub(super) fn error(&self, kind: StreamError, first: bool, events: u32) -> Bytes {
        match self.api {
            Api::Chat | Api::Completions => data(&json!({"error": match kind {
                StreamError::Failure => json!({"message": FAILURE, "type": "server_error", "code": 500}),
                StreamError::RateLimit => json!({
                    "message": format!("Rate limit reached for {} in organization org-sim on tokens per min (TPM). Please try again in 1s.", self.model),
                    "type": "tokens", "param": null, "code": "rate_limit_exceeded",
                }),
                StreamError::Overload => json!({
                    "message": "The server is overloaded or not ready yet.",
                    "type": "service_unavailable_error", "param": null, "code": "server_is_overloaded",
                }),
            }})),
            Api::Responses => {
                let (code, message) = match kind {
                    StreamError::Failure => ("server_error", FAILURE),
                    StreamError::RateLimit => (
                        "rate_limit_exceeded",
                        "Rate limit reached on tokens per min (TPM). Please try again in 1s.",
                    ),
                    StreamError::Overload => (
                        "server_is_overloaded",
                        "Selected model is at capacity. Please try a different model.",
                    ),
                };
                let mut response = self.responses_object("failed", None);
                response["error"] = json!({"code": code, "message": message});
                sse(
                    "response.failed",
                    &json!({"type": "response.failed", "sequence_number": 4 + events, "response": response}),
                )
            }
            Api::Anthropic => {
                let (kind, message) = match kind {
                    StreamError::Failure => ("api_error", FAILURE),
                    StreamError::RateLimit => (
                        "rate_limit_error",
                        "Number of request tokens has exceeded your per-minute rate limit",
                    ),
                    StreamError::Overload => ("overloaded_error", "Overloaded"),
                };
                sse(
                    "error",
                    &json!({"type": "error", "error": {"type": kind, "message": message}}),
                )
            }
            Api::Gemini { sse } => {
                let (code, message, status) = match kind {
                    StreamError::Failure => (500, FAILURE, "INTERNAL"),
                    StreamError::RateLimit => (
                        429,
                        "Resource has been exhausted (e.g. check quota).",
                        "RESOURCE_EXHAUSTED",
                    ),
                    StreamError::Overload => (
                        503,
                        "The model is overloaded. Please try again later.",
                        "UNAVAILABLE",
                    ),
                };
                let error = json!({"error": {"code": code, "message": message, "status": status}});
                let event = self.gemini(&error, first);
                if sse {
                    event
                } else {
                    Bytes::from([&event[..], b"\r\n]"].concat())
                }
            }
            Api::Ollama { .. } => {
                let message = match kind {
                    StreamError::Failure => FAILURE,
                    StreamError::RateLimit | StreamError::Overload => {
                        "server busy, please try again.  maximum pending requests exceeded"
                    }
                };
                Bytes::from(format!("{}\n", json!({"error": message})))
            }
            Api::Tgi => {
                let (error, error_type) = match kind {
                    StreamError::Failure => (
                        format!("Request failed during generation: {FAILURE}"),
                        "generation",
                    ),
                    StreamError::RateLimit | StreamError::Overload => {
                        ("Model is overloaded".to_string(), "overloaded")
                    }
                };
                Bytes::from(format!(
                    "data:{}\n\n",
                    json!({"error": error, "error_type": error_type})
                ))
            }
            Api::Triton => data(&json!({"error": match kind {
                StreamError::Failure => FAILURE,
                StreamError::RateLimit | StreamError::Overload => "Exceeds maximum queue size",
            }})),
        }
    }

    /// A whole (non-streamed) response.
    pub(super) fn whole_response(&self) -> String {
        let text = self.text();
        let tokens = u64::from(self.tokens);
        match self.api {
            Api::Chat | Api::Completions => {
                let (object, choice) = if self.api == Api::Chat {
                    (
                        "chat.completion",
                        json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "length"}),
                    )
                } else {
                    (
                        "text_completion",
                        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}),
                    )
                };
                json!({
                    "id": self.id, "object": object, "created": self.created, "model": self.model,
                    "choices": [choice], "usage": self.openai_usage(tokens),
                })
            }
            Api::Responses => self.responses_object("completed", Some(tokens)),
            Api::Anthropic => json!({
                "id": format!("msg_{}", self.id), "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": text}], "stop_reason": "max_tokens", "stop_sequence": null,
                "usage": self.anthropic_usage(tokens),
            }),
            Api::Gemini { .. } => self.gemini_chunk(&text, tokens, true),
            Api::Ollama { .. } => self.ollama_line(self.tokens, &text, true),
            Api::Tgi => json!({
                "generated_text": text,
                "details": {"finish_reason": "length", "generated_tokens": tokens, "seed": null, "prefill": [], "tokens": []},
            }),
            Api::Triton => json!({"model_name": self.model, "model_version": "1", "text_output": text}),
        }
        .to_string()
    }
}

/// Add `extra`'s fields to the object `value` (after the ones it has).
fn merge(value: &mut Value, extra: Value) {
    if let (Some(target), Value::Object(fields)) = (value.as_object_mut(), extra) {
        target.extend(fields);
    }
}

/// The RFC 3339 UTC time of `unix_secs`, to the second (`2024-01-01T00:00:00Z`).
pub(super) fn rfc3339(unix_secs: u64) -> String {
    let (days, rem) = (unix_secs / 86_400, unix_secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}Z")
}

/// Year, month, day of the proleptic Gregorian calendar for days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_TOKEN: TokenEvent = TokenEvent {
        index: 0,
        first: 0,
        tokens: 1,
    };

    /// `--stamp` chunks carry the request's arrival and their own send time, from which the
    /// benchmark reads the simulator's own TTFT.
    #[test]
    fn stamped_chunks_carry_arrival_and_send_times() {
        let received = crate::unix_ns();
        let script = Script {
            api: Api::Chat,
            model: "m".into(),
            id: "sim-1".into(),
            created: 0,
            tokens: 2,
            prompt_tokens: 1,
            include_usage: false,
            continuous: false,
            role_chunk: false,
            stamp: Some(received),
            fault: None,
            ttft_ns: 0,
            queue_ns: 0,
            itl_ns: 0,
            cached_tokens: 0,
            reasoning_tokens: 0,
        };
        let chunk = script.token(ONE_TOKEN, true);
        let text = std::str::from_utf8(&chunk).unwrap();
        let json: Value =
            serde_json::from_str(text.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(
            json["sim_received_unix_ns"].as_u64(),
            Some(received),
            "{text}"
        );
        let sent = json["sim_sent_unix_ns"].as_u64().unwrap();
        assert!(sent >= received, "{text}");

        let unstamped = Script {
            stamp: None,
            ..script
        };
        let text = String::from_utf8(unstamped.token(ONE_TOKEN, true).to_vec()).unwrap();
        assert!(!text.contains("sim_"), "{text}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_254_861), "2024-03-01T01:01:01Z");
    }
}
