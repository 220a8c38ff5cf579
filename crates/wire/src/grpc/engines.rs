//! The engines' own decoders: the `Generate` RPC of SGLang's
//! `sglang.grpc.scheduler.SglangScheduler`, vLLM's `vllm.grpc.engine.VllmEngine` and
//! TensorRT-LLM's `trtllm.TrtllmService`, the engine services a router such as the SGLang
//! Model Gateway (`smg`, whose proto the three share in shape) drives. The three protos
//! differ in field numbers and names, not in shape, so one set of rules reads them all
//! ([`Engine`] says whose message it is; [`Generate`] is the state of one response stream).
//!
//! The router sends token ids and gets token ids back: each response message is a
//! `GenerateResponse` holding either a `chunk` (`GenerateStreamChunk`: the token ids
//! generated since the previous chunk) or a `complete` (`GenerateComplete`: the end of one
//! output, with its usage and finish reason). Rules, per message:
//!
//! - A `chunk` with N > 0 `token_ids` is one token-bearing event of
//!   [`OutputKind::Content`] carrying N tokens, exact: the ids are the tokens. Its
//!   `prompt_tokens`, when not 0, is the input count ([`Signal::Usage`], once), and its
//!   `cached_tokens`, when not 0 either, the prompt tokens read from the engine's prefix
//!   cache ([`Signal::TokenDetails`]), so that a cancelled stream has both (a stream
//!   without a cache hit has its 0 from the `complete`).
//! - A `complete` carries no output event: in a streamed call its ids repeat what the
//!   chunks carried (`output_ids` / `output_token_ids` are cumulative), and a call with
//!   `stream: false` answers with a `complete` alone, which like a non-streamed HTTP body
//!   has no inter-token timing. It reports usage: input `prompt_tokens`, output
//!   `completion_tokens` (or, where that is 0, the count of its output ids), summed over
//!   the `complete`s of a request with several outputs (`n > 1`, each with its `index`),
//!   as OpenAI's usage counts every choice. Where its `prompt_tokens` is not 0, its
//!   `cached_tokens` (the prompt tokens read from the prefix cache, as the latest output
//!   states them) and SGLang's `reasoning_tokens` (summed over the outputs, as the output
//!   count is) are [`Signal::TokenDetails`]: proto3 cannot tell a count the engine left
//!   unset from a 0, and a message that states its prompt is taken to state these too, a
//!   0 included (SMG reports them the same way). vLLM and TensorRT-LLM report no
//!   reasoning count. Then [`Signal::Done`].
//! - TensorRT-LLM's `complete` carries `perf_metrics` when the client asked for them
//!   (`return_perf_metrics`; tokentap never asks): instants on the engine's clock, in
//!   seconds. They are [`Signal::EngineTimings`]: queue = `first_scheduled_time -
//!   arrival_time`, prefill = `first_token_time - first_scheduled_time`, the engine's
//!   TTFT = `first_token_time - arrival_time`; an instant left at 0 (unset) or out of
//!   order gives nothing. SGLang's and vLLM's messages report no timings.
//! - A `finish_reason` of `error` (vLLM) or `abort` (the engine aborted the request: SGLang
//!   reports a prompt over the context length this way) is [`Signal::Error`] of
//!   [`ErrorClass::Other`], before [`Signal::Done`].
//! - A message that is not a `GenerateResponse` is [`Signal::Malformed`]; observation goes
//!   on with the next.
//!
//! No message names the model (the router picks a worker, and a worker serves one model):
//! the model comes from the engine's `GetModelInfo` ([`super::model_info`]) or the
//! configuration. Errors other than a finish reason (SGLang and TensorRT-LLM removed their
//! error message from the proto) end the stream with a non-OK `grpc-status` in the
//! trailers, which a body decoder does not see ([`super::status`] reads one).

use prost::Message;

use super::super::engine_timings;
use super::super::error_class::ErrorClass;
use super::super::frame::Handler;
use super::super::types::{EngineTimings, OutputKind, Signal, TokenDetails};
use super::proto::sglang::grpc::scheduler as sglang;
use super::proto::trtllm;
use super::proto::vllm::grpc::engine as vllm;

/// Whose `GenerateResponse` a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    Sglang,
    Vllm,
    Trtllm,
}

/// What one `GenerateResponse` says, whichever engine sent it.
enum Step {
    Chunk {
        tokens: usize,
        prompt_tokens: u32,
        cached_tokens: u32,
    },
    Complete {
        prompt_tokens: u32,
        completion_tokens: u32,
        cached_tokens: u32,
        /// SGLang's; the other engines' messages have none.
        reasoning_tokens: Option<u32>,
        output_ids: usize,
        finish_reason: String,
        /// What the engine reported of its own timing (TensorRT-LLM only).
        timings: EngineTimings,
    },
    /// Neither (an empty message, or a `response` this proto does not know).
    Nothing,
}

impl Engine {
    fn read(self, message: &[u8]) -> Result<Step, prost::DecodeError> {
        Ok(match self {
            Engine::Sglang => {
                use sglang::generate_response::Response;
                match sglang::GenerateResponse::decode(message)?.response {
                    Some(Response::Chunk(c)) => Step::Chunk {
                        tokens: c.token_ids.len(),
                        prompt_tokens: c.prompt_tokens,
                        cached_tokens: c.cached_tokens,
                    },
                    Some(Response::Complete(c)) => Step::Complete {
                        prompt_tokens: c.prompt_tokens,
                        completion_tokens: c.completion_tokens,
                        cached_tokens: c.cached_tokens,
                        reasoning_tokens: Some(c.reasoning_tokens),
                        output_ids: c.output_ids.len(),
                        finish_reason: c.finish_reason,
                        timings: EngineTimings::default(),
                    },
                    None => Step::Nothing,
                }
            }
            Engine::Vllm => {
                use vllm::generate_response::Response;
                match vllm::GenerateResponse::decode(message)?.response {
                    Some(Response::Chunk(c)) => Step::Chunk {
                        tokens: c.token_ids.len(),
                        prompt_tokens: c.prompt_tokens,
                        cached_tokens: c.cached_tokens,
                    },
                    Some(Response::Complete(c)) => Step::Complete {
                        prompt_tokens: c.prompt_tokens,
                        completion_tokens: c.completion_tokens,
                        cached_tokens: c.cached_tokens,
                        reasoning_tokens: None,
                        output_ids: c.output_ids.len(),
                        finish_reason: c.finish_reason,
                        timings: EngineTimings::default(),
                    },
                    None => Step::Nothing,
                }
            }
            Engine::Trtllm => {
                use trtllm::generate_response::Response;
                match trtllm::GenerateResponse::decode(message)?.response {
                    Some(Response::Chunk(c)) => Step::Chunk {
                        tokens: c.token_ids.len(),
                        prompt_tokens: c.prompt_tokens,
                        cached_tokens: c.cached_tokens,
                    },
                    Some(Response::Complete(c)) => Step::Complete {
                        prompt_tokens: c.prompt_tokens,
                        completion_tokens: c.completion_tokens,
                        cached_tokens: c.cached_tokens,
                        reasoning_tokens: None,
                        output_ids: c.output_token_ids.len(),
                        finish_reason: c.finish_reason,
                        timings: c.perf_metrics.map_or_else(EngineTimings::default, |p| {
                            engine_timings::from_instants(
                                p.arrival_time,
                                p.first_scheduled_time,
                                p.first_token_time,
                            )
                        }),
                    },
                    None => Step::Nothing,
                }
            }
        })
    }
}

/// State for one `Generate` response stream.
#[derive(Clone, Debug)]
pub(crate) struct Generate {
    engine: Engine,
    /// The input count was reported (from a chunk).
    input_sent: bool,
    /// Output tokens of the `complete`s so far (one per output when `n > 1`).
    completed: u64,
    /// Reasoning tokens of the `complete`s so far (SGLang).
    reasoning: u64,
    /// The cached and reasoning counts reported so far.
    details: TokenDetails,
}

impl Generate {
    pub(crate) fn new(engine: Engine) -> Self {
        Generate {
            engine,
            input_sent: false,
            completed: 0,
            reasoning: 0,
            details: TokenDetails::default(),
        }
    }

    /// The first chunk with a prompt count: the input count, and the cached count when it
    /// is a hit. Once a stream, so kept out of the per-chunk path.
    #[cold]
    #[inline(never)]
    fn input(&mut self, prompt_tokens: u32, cached_tokens: u32, out: &mut Vec<Signal>) {
        self.input_sent = true;
        out.push(Signal::Usage {
            input_tokens: Some(u64::from(prompt_tokens)),
            output_tokens: None,
        });
        if cached_tokens > 0 {
            TokenDetails {
                cache_read_input: Some(u64::from(cached_tokens)),
                ..TokenDetails::default()
            }
            .report(&mut self.details, out);
        }
    }

    /// A `complete`'s cached and (SGLang) reasoning counts: the reasoning summed over the
    /// outputs; both reported where the message states its prompt, since proto3 cannot
    /// tell a count left unset from a 0.
    #[inline(never)]
    fn complete_details(
        &mut self,
        prompt_tokens: u32,
        cached_tokens: u32,
        reasoning_tokens: Option<u32>,
        out: &mut Vec<Signal>,
    ) {
        if let Some(reasoning) = reasoning_tokens {
            self.reasoning = self.reasoning.saturating_add(u64::from(reasoning));
        }
        if prompt_tokens > 0 {
            TokenDetails {
                cache_read_input: Some(u64::from(cached_tokens)),
                cache_write_input: None,
                reasoning_output: reasoning_tokens.map(|_| self.reasoning),
            }
            .report(&mut self.details, out);
        }
    }

    /// One message; `streamed` is false for a body read whole, which has no output events.
    fn message(&mut self, message: &[u8], streamed: bool, out: &mut Vec<Signal>) {
        let Ok(step) = self.engine.read(message) else {
            out.push(Signal::Malformed);
            return;
        };
        match step {
            Step::Chunk {
                tokens,
                prompt_tokens,
                cached_tokens,
            } => {
                if streamed && tokens > 0 {
                    out.push(Signal::Output {
                        tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
                        exact: true,
                        kind: OutputKind::Content,
                    });
                }
                if prompt_tokens > 0 && !self.input_sent {
                    self.input(prompt_tokens, cached_tokens, out);
                }
            }
            Step::Complete {
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                reasoning_tokens,
                output_ids,
                finish_reason,
                timings,
            } => {
                let output = if completion_tokens > 0 {
                    u64::from(completion_tokens)
                } else {
                    output_ids as u64
                };
                self.completed = self.completed.saturating_add(output);
                let input_tokens = (prompt_tokens > 0).then_some(u64::from(prompt_tokens));
                let output_tokens = (self.completed > 0).then_some(self.completed);
                if input_tokens.is_some() || output_tokens.is_some() {
                    out.push(Signal::Usage {
                        input_tokens,
                        output_tokens,
                    });
                }
                self.complete_details(prompt_tokens, cached_tokens, reasoning_tokens, out);
                if finish_reason.eq_ignore_ascii_case("error")
                    || finish_reason.eq_ignore_ascii_case("abort")
                {
                    out.push(Signal::Error(ErrorClass::Other));
                }
                if !finish_reason.is_empty() {
                    out.push(Signal::FinishReason(finish_reason));
                }
                if !timings.is_empty() {
                    out.push(Signal::EngineTimings(timings));
                }
                out.push(Signal::Done);
            }
            Step::Nothing => {}
        }
    }
}

impl Handler for Generate {
    fn event(&mut self, _name: &str, data: &[u8], out: &mut Vec<Signal>) {
        self.message(data, true, out);
    }

    fn body(&mut self, body: &[u8], out: &mut Vec<Signal>) {
        self.message(body, false, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::framing::frame;
    use crate::testing::grpc;
    use Signal::{Done, Error, Malformed, Usage};

    fn tokens(n: u32) -> Signal {
        Signal::Output {
            tokens: n,
            exact: true,
            kind: OutputKind::Content,
        }
    }

    fn usage(input: Option<u64>, output: Option<u64>) -> Signal {
        Usage {
            input_tokens: input,
            output_tokens: output,
        }
    }

    fn sglang_chunk(ids: &[u32], prompt: u32, completion: u32) -> Vec<u8> {
        use sglang::generate_response::Response;
        frame(
            &sglang::GenerateResponse {
                request_id: "r1".into(),
                response: Some(Response::Chunk(sglang::GenerateStreamChunk {
                    token_ids: ids.to_vec(),
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    ..Default::default()
                })),
            }
            .encode_to_vec(),
        )
    }

    fn sglang_complete(ids: &[u32], prompt: u32, completion: u32, finish: &str) -> Vec<u8> {
        use sglang::generate_response::Response;
        frame(
            &sglang::GenerateResponse {
                request_id: "r1".into(),
                response: Some(Response::Complete(sglang::GenerateComplete {
                    output_ids: ids.to_vec(),
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    finish_reason: finish.into(),
                    ..Default::default()
                })),
            }
            .encode_to_vec(),
        )
    }

    #[test]
    fn sglang_stream() {
        let body = [
            sglang_chunk(&[101, 102, 103], 12, 3),
            sglang_chunk(&[], 12, 3),
            sglang_chunk(&[104], 12, 4),
            sglang_chunk(&[105, 106], 12, 6),
            sglang_complete(&[101, 102, 103, 104, 105, 106], 12, 6, "stop"),
        ]
        .concat();
        assert_eq!(
            grpc(Generate::new(Engine::Sglang), &body),
            vec![
                tokens(3),
                usage(Some(12), None),
                tokens(1),
                tokens(2),
                usage(Some(12), Some(6)),
                // The complete states its cache hits and SGLang's reasoning count (0s).
                details(0, Some(0)),
                Signal::FinishReason("stop".into()),
                Done,
            ]
        );
    }

    #[test]
    fn a_call_without_streaming_is_one_complete_with_no_output_event() {
        let body = sglang_complete(&[1, 2, 3, 4], 7, 4, "length");
        assert_eq!(
            grpc(Generate::new(Engine::Sglang), &body),
            vec![
                usage(Some(7), Some(4)),
                details(0, Some(0)),
                Signal::FinishReason("length".into()),
                Done
            ]
        );
    }

    #[test]
    fn several_outputs_add_up_and_zeroes_are_not_counts() {
        let body = [
            sglang_chunk(&[1], 0, 0),
            sglang_complete(&[1, 2], 5, 2, "stop"),
            // No completion count: its ids are the count.
            sglang_complete(&[3, 4, 5], 5, 0, "stop"),
            // Nothing at all: no usage.
            sglang_complete(&[], 0, 0, "stop"),
        ]
        .concat();
        assert_eq!(
            grpc(Generate::new(Engine::Sglang), &body),
            vec![
                tokens(1),
                usage(Some(5), Some(2)),
                details(0, Some(0)),
                Signal::FinishReason("stop".into()),
                Done,
                usage(Some(5), Some(5)),
                Signal::FinishReason("stop".into()),
                Done,
                usage(None, Some(5)),
                Signal::FinishReason("stop".into()),
                Done,
            ]
        );
    }

    #[test]
    fn vllm_and_trtllm_read_their_own_fields() {
        let vllm_body = [
            frame(
                &vllm::GenerateResponse {
                    response: Some(vllm::generate_response::Response::Chunk(
                        vllm::GenerateStreamChunk {
                            token_ids: vec![9, 9],
                            prompt_tokens: 4,
                            ..Default::default()
                        },
                    )),
                }
                .encode_to_vec(),
            ),
            frame(
                &vllm::GenerateResponse {
                    response: Some(vllm::generate_response::Response::Complete(
                        vllm::GenerateComplete {
                            output_ids: vec![9, 9],
                            finish_reason: "error".into(),
                            prompt_tokens: 4,
                            completion_tokens: 2,
                            ..Default::default()
                        },
                    )),
                }
                .encode_to_vec(),
            ),
        ]
        .concat();
        assert_eq!(
            grpc(Generate::new(Engine::Vllm), &vllm_body),
            vec![
                tokens(2),
                usage(Some(4), None),
                usage(Some(4), Some(2)),
                details(0, None),
                Error(ErrorClass::Other),
                Signal::FinishReason("error".into()),
                Done,
            ]
        );
        let trtllm_body = [
            frame(
                &trtllm::GenerateResponse {
                    request_id: "t".into(),
                    response: Some(trtllm::generate_response::Response::Chunk(
                        trtllm::GenerateStreamChunk {
                            token_ids: vec![1, 2, 3, 4],
                            prompt_tokens: 8,
                            ..Default::default()
                        },
                    )),
                }
                .encode_to_vec(),
            ),
            frame(
                &trtllm::GenerateResponse {
                    request_id: "t".into(),
                    response: Some(trtllm::generate_response::Response::Complete(
                        trtllm::GenerateComplete {
                            output_token_ids: vec![1, 2, 3, 4],
                            finish_reason: "length".into(),
                            ..Default::default()
                        },
                    )),
                }
                .encode_to_vec(),
            ),
        ]
        .concat();
        assert_eq!(
            grpc(Generate::new(Engine::Trtllm), &trtllm_body),
            vec![
                tokens(4),
                usage(Some(8), None),
                usage(None, Some(4)),
                Signal::FinishReason("length".into()),
                Done
            ]
        );
    }

    fn trtllm_complete(perf: Option<trtllm::PerfMetrics>) -> Vec<u8> {
        frame(
            &trtllm::GenerateResponse {
                request_id: "t".into(),
                response: Some(trtllm::generate_response::Response::Complete(
                    trtllm::GenerateComplete {
                        output_token_ids: vec![1, 2],
                        finish_reason: "stop".into(),
                        completion_tokens: 2,
                        perf_metrics: perf,
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
        )
    }

    fn perf(arrival: f64, scheduled: f64, first: f64) -> Option<trtllm::PerfMetrics> {
        Some(trtllm::PerfMetrics {
            arrival_time: arrival,
            first_scheduled_time: scheduled,
            first_token_time: first,
            last_token_time: first + 1.0,
            ..Default::default()
        })
    }

    #[test]
    fn trtllm_perf_metrics_are_engine_timings() {
        let signals = grpc(
            Generate::new(Engine::Trtllm),
            &trtllm_complete(perf(1_700_000_000.0, 1_700_000_000.25, 1_700_000_000.5)),
        );
        let [Usage { .. }, Signal::FinishReason(_), Signal::EngineTimings(t), Done] =
            signals.as_slice()
        else {
            panic!("{signals:?}");
        };
        let ms = |d: Option<std::time::Duration>| d.map(|d| (d.as_secs_f64() * 1e3).round());
        assert_eq!(
            (ms(t.queue), ms(t.prefill), ms(t.first_token)),
            (Some(250.0), Some(250.0), Some(500.0))
        );
    }

    /// Missing, zero, negative, non-finite and huge instants: never a panic, never a
    /// figure that is not a plausible duration.
    #[test]
    fn hostile_perf_metrics_give_no_figures() {
        let cases = [
            (None, None),
            (perf(0.0, 0.0, 0.0), None),
            (perf(5.0, 4.0, 3.0), None),
            (perf(-1.0, -0.5, -0.25), None),
            (perf(f64::NAN, f64::NAN, f64::NAN), None),
            (perf(f64::NEG_INFINITY, 0.0, f64::INFINITY), None),
            (perf(1.0, 1e300, 1e300), None),
            (perf(f64::MIN_POSITIVE, f64::MAX, f64::MAX), None),
        ];
        for (perf, queue_ms) in cases {
            let signals = grpc(Generate::new(Engine::Trtllm), &trtllm_complete(perf));
            let timings = signals.iter().find_map(|s| match s {
                Signal::EngineTimings(t) => Some(*t),
                _ => None,
            });
            assert_eq!(
                timings.and_then(|t| t.queue).map(|d| d.as_millis()),
                queue_ms,
                "{perf:?}: {signals:?}"
            );
            if let Some(t) = timings {
                for d in [t.queue, t.prefill, t.first_token].into_iter().flatten() {
                    assert!(d <= engine_timings::MAX, "{perf:?}: {t:?}");
                }
            }
        }
    }

    fn details(cached: u64, reasoning: Option<u64>) -> Signal {
        Signal::TokenDetails(Box::new(TokenDetails {
            cache_read_input: Some(cached),
            cache_write_input: None,
            reasoning_output: reasoning,
        }))
    }

    #[test]
    fn cached_and_reasoning_tokens_from_the_first_counted_chunk_and_each_complete() {
        use sglang::generate_response::Response;
        let message = |response| {
            frame(
                &sglang::GenerateResponse {
                    request_id: "r1".into(),
                    response: Some(response),
                }
                .encode_to_vec(),
            )
        };
        let chunk = |ids: &[u32], prompt: u32, cached: u32, reasoning: u32| {
            message(Response::Chunk(sglang::GenerateStreamChunk {
                token_ids: ids.to_vec(),
                prompt_tokens: prompt,
                cached_tokens: cached,
                reasoning_tokens: reasoning,
                ..Default::default()
            }))
        };
        let complete = |prompt: u32, cached: u32, reasoning: u32, index: u32| {
            message(Response::Complete(sglang::GenerateComplete {
                prompt_tokens: prompt,
                completion_tokens: 5,
                cached_tokens: cached,
                reasoning_tokens: reasoning,
                finish_reason: "stop".into(),
                index,
                ..Default::default()
            }))
        };
        // The cached count with the input, from the first chunk that has one (the chunks'
        // growing reasoning counts are not read: the complete sums them once); then each
        // complete's, SGLang's reasoning summed over the outputs (n = 2).
        let body = [
            chunk(&[1], 0, 0, 0),
            chunk(&[2], 40, 32, 1),
            chunk(&[3], 40, 32, 2),
            complete(40, 32, 3, 0),
            complete(40, 32, 2, 1),
        ]
        .concat();
        assert_eq!(
            grpc(Generate::new(Engine::Sglang), &body),
            vec![
                tokens(1),
                tokens(1),
                usage(Some(40), None),
                details(32, None),
                tokens(1),
                usage(Some(40), Some(5)),
                details(32, Some(3)),
                Signal::FinishReason("stop".into()),
                Done,
                usage(Some(40), Some(10)),
                details(32, Some(5)),
                Signal::FinishReason("stop".into()),
                Done,
            ]
        );
        // A complete that states no prompt states no cache either (proto3's 0).
        let body = complete(0, 0, 0, 0);
        assert_eq!(
            grpc(Generate::new(Engine::Sglang), &body),
            vec![
                usage(None, Some(5)),
                Signal::FinishReason("stop".into()),
                Done
            ]
        );
        // A stated prompt with no cache hit is a 0, and so is SGLang's reasoning.
        let body = complete(7, 0, 0, 0);
        assert_eq!(
            grpc(Generate::new(Engine::Sglang), &body),
            vec![
                usage(Some(7), Some(5)),
                details(0, Some(0)),
                Signal::FinishReason("stop".into()),
                Done
            ]
        );
    }

    /// vLLM and TensorRT-LLM: the cached count, no reasoning count; the largest a uint32
    /// holds is read as it is.
    #[test]
    fn cached_tokens_of_vllm_and_trtllm_without_a_reasoning_count() {
        let vllm_body = frame(
            &vllm::GenerateResponse {
                response: Some(vllm::generate_response::Response::Complete(
                    vllm::GenerateComplete {
                        prompt_tokens: u32::MAX,
                        completion_tokens: 1,
                        cached_tokens: u32::MAX,
                        finish_reason: "length".into(),
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
        );
        assert_eq!(
            grpc(Generate::new(Engine::Vllm), &vllm_body),
            vec![
                usage(Some(u64::from(u32::MAX)), Some(1)),
                details(u64::from(u32::MAX), None),
                Signal::FinishReason("length".into()),
                Done
            ]
        );
        let trtllm_body = frame(
            &trtllm::GenerateResponse {
                request_id: "t".into(),
                response: Some(trtllm::generate_response::Response::Chunk(
                    trtllm::GenerateStreamChunk {
                        token_ids: vec![9, 9],
                        prompt_tokens: 30,
                        cached_tokens: 24,
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec(),
        );
        assert_eq!(
            grpc(Generate::new(Engine::Trtllm), &trtllm_body),
            vec![tokens(2), usage(Some(30), None), details(24, None)]
        );
    }

    #[test]
    fn abort_is_an_error_and_garbage_is_malformed() {
        let body = [frame(b"\xff\xff\xff"), sglang_complete(&[], 3, 0, "abort")].concat();
        assert_eq!(
            grpc(Generate::new(Engine::Sglang), &body),
            vec![
                Malformed,
                usage(Some(3), None),
                details(0, Some(0)),
                Error(ErrorClass::Other),
                Signal::FinishReason("abort".into()),
                Done
            ]
        );
    }
}
