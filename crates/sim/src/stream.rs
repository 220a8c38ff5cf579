//! The body of a streamed simulated response: a timer-driven state machine that sends a
//! [`Script`]'s events at a [`Schedule`]'s absolute deadlines (no task per stream, no
//! drift), compressed as it goes when the request asked for it, and injects the fault the
//! request asked for at its token.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use rand::rngs::SmallRng;
use rand::Rng;
use tokio::time::{Instant, Sleep};

use super::compress::{Coding, Encoder};
use super::config::{Fault, ModelProfile, TokensPerEvent};
use super::render::{Script, TokenEvent};

/// When each token-bearing event of one response is due and which tokens it carries,
/// drawn as the stream goes: no per-token state, so a 1,000-token stream costs what a
/// short one does. The first event is due at the (jittered) TTFT; an event of `k` tokens
/// is due `k` (jittered) inter-token latencies after the previous one.
pub(super) struct Schedule {
    rng: SmallRng,
    itl: Duration,
    jitter: f64,
    per_event: TokensPerEvent,
    hold_before_end: Duration,
    total: u32,
    /// A token count no event straddles (where a fault strikes).
    cut: Option<u32>,
    /// The next event, or the last one sent once `finished`.
    next: TokenEvent,
    /// The next event's deadline, or the last one's once `finished`.
    deadline: Instant,
    finished: bool,
}

impl Schedule {
    pub(super) fn new(
        start: Instant,
        profile: &ModelProfile,
        per_event: TokensPerEvent,
        total: u32,
        cut: Option<u32>,
        rng: SmallRng,
    ) -> Schedule {
        let mut schedule = Schedule {
            rng,
            itl: profile.itl,
            jitter: profile.jitter,
            per_event,
            hold_before_end: profile.hold_before_end,
            total,
            cut,
            next: TokenEvent {
                index: 0,
                first: 0,
                tokens: 0,
            },
            deadline: start,
            finished: false,
        };
        schedule.deadline = start + schedule.jittered(profile.ttft);
        schedule.next.tokens = schedule.draw(0);
        schedule
    }

    fn jittered(&mut self, d: Duration) -> Duration {
        if self.jitter > 0.0 {
            let factor = (1.0 + self.rng.gen_range(-self.jitter..=self.jitter)).max(0.0);
            Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
        } else {
            d
        }
    }

    /// The size of the event that starts at token `first`.
    fn draw(&mut self, first: u32) -> u32 {
        let mut left = self.total - first;
        if let Some(cut) = self.cut.filter(|cut| *cut > first) {
            left = left.min(cut - first);
        }
        self.per_event.draw(&mut self.rng, left)
    }

    /// Tokens in the events sent so far.
    pub(super) fn sent(&self) -> u32 {
        if self.finished {
            self.total
        } else {
            self.next.first
        }
    }

    /// The next event and its deadline, until every token is sent.
    pub(super) fn next(&self) -> Option<(TokenEvent, Instant)> {
        (!self.finished).then_some((self.next, self.deadline))
    }

    /// The next event was sent.
    pub(super) fn advance(&mut self) {
        let first = self.next.first + self.next.tokens;
        if first >= self.total {
            self.finished = true;
            return;
        }
        let tokens = self.draw(first);
        let gap = self.jittered(self.itl * tokens);
        self.deadline += gap;
        self.next = TokenEvent {
            index: self.next.index + 1,
            first,
            tokens,
        };
    }

    /// The next event's deadline, or the last one's once every token is sent.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// When the stream may end: the last event's deadline plus the hold before the end.
    pub(super) fn end_deadline(&self) -> Instant {
        self.deadline + self.hold_before_end
    }

    /// When the last token is due (for a whole response).
    pub(super) fn last_deadline(mut self) -> Instant {
        while self.next().is_some() {
            self.advance();
        }
        self.deadline
    }
}

/// Where a stream is in its script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Preamble,
    /// Token-bearing events, as the [`Schedule`] has them.
    Tokens,
    /// The profile's hold between the last token and the finish.
    Hold,
    Finish,
    Usage,
    Done,
    /// The compressed stream's trailer, if compressing.
    Trailer,
    End,
}

/// A timer-driven streamed body following a [`Script`].
pub(super) struct SimStream {
    script: Script,
    schedule: Schedule,
    step: Step,
    /// Frames sent so far (the first Gemini array element opens the array).
    sent: u32,
    /// Token-bearing events sent so far.
    token_events: u32,
    sleep: Pin<Box<Sleep>>,
    encoder: Option<Encoder>,
    open: Arc<AtomicU64>,
}

impl Drop for SimStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SimStream {
    pub(super) fn new(
        script: Script,
        schedule: Schedule,
        coding: Option<Coding>,
        open: Arc<AtomicU64>,
    ) -> SimStream {
        open.fetch_add(1, Ordering::Relaxed);
        let first = schedule
            .next()
            .map_or_else(Instant::now, |(_, deadline)| deadline);
        SimStream {
            open,
            script,
            schedule,
            step: Step::Preamble,
            sent: 0,
            token_events: 0,
            sleep: Box::pin(tokio::time::sleep_until(first)),
            encoder: coding.map(Encoder::new),
        }
    }

    /// Ready once `deadline` has passed (the timer is re-armed only when it changes).
    fn wait_until(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        self.sleep.as_mut().poll(cx)
    }

    /// A data frame, compressed if the stream is.
    fn emit(&mut self, bytes: Bytes) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.sent += 1;
        let bytes = match self.encoder.as_mut() {
            Some(encoder) => encoder.frame(&bytes),
            None => bytes,
        };
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

impl Body for SimStream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        loop {
            match this.step {
                Step::Preamble => {
                    this.step = Step::Tokens;
                    if let Some(bytes) = this.script.preamble() {
                        return this.emit(bytes);
                    }
                }
                Step::Tokens => {
                    let sent = this.schedule.sent();
                    match this.script.fault {
                        Some(Fault::ResetAfter(n)) if sent == n => {
                            this.step = Step::End;
                            return Poll::Ready(Some(Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionReset,
                                "simulated reset",
                            ))));
                        }
                        Some(Fault::StallAfter(n)) if sent == n => return Poll::Pending,
                        Some(Fault::ErrorAfter(n, kind)) if sent == n => {
                            this.step = Step::Trailer;
                            let first = this.sent == 0;
                            let error = this.script.error(kind, first, this.token_events);
                            return this.emit(error);
                        }
                        Some(Fault::EndAfter(n)) if sent == n => {
                            this.step = Step::Trailer;
                            continue;
                        }
                        _ => {}
                    }
                    let Some((event, deadline)) = this.schedule.next() else {
                        this.step = Step::Hold;
                        continue;
                    };
                    if this.wait_until(deadline, cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.schedule.advance();
                    this.token_events += 1;
                    let bytes = this.script.token(event, this.sent == 0);
                    return this.emit(bytes);
                }
                Step::Hold => {
                    if this
                        .wait_until(this.schedule.end_deadline(), cx)
                        .is_pending()
                    {
                        return Poll::Pending;
                    }
                    this.step = Step::Finish;
                }
                Step::Finish => {
                    this.step = Step::Usage;
                    if let Some(bytes) = this.script.finish(this.sent == 0, this.token_events) {
                        return this.emit(bytes);
                    }
                }
                Step::Usage => {
                    this.step = Step::Done;
                    if let Some(bytes) = this.script.usage() {
                        return this.emit(bytes);
                    }
                }
                Step::Done => {
                    this.step = Step::Trailer;
                    if let Some(bytes) = this.script.done() {
                        return this.emit(bytes);
                    }
                }
                Step::Trailer => {
                    this.step = Step::End;
                    if let Some(encoder) = this.encoder.as_mut() {
                        let tail = encoder.finish();
                        if !tail.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(tail))));
                        }
                    }
                }
                Step::End => return Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::Api;
    use http_body_util::BodyExt;
    use rand::SeedableRng;
    use serde_json::Value;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn script(api: Api, tokens: u32, continuous: bool, fault: Option<Fault>) -> Script {
        Script {
            api,
            model: "m".into(),
            id: "sim-1".into(),
            created: 0,
            tokens,
            prompt_tokens: 3,
            include_usage: true,
            continuous,
            role_chunk: true,
            stamp: None,
            fault,
            ttft_ns: 0,
            queue_ns: 0,
            itl_ns: 0,
            cached_tokens: 0,
            reasoning_tokens: 0,
        }
    }

    fn schedule(
        profile: &ModelProfile,
        per_event: TokensPerEvent,
        cut: Option<u32>,
    ) -> (Instant, Schedule) {
        let start = Instant::now();
        let rng = SmallRng::seed_from_u64(7);
        let schedule = Schedule::new(start, profile, per_event, profile.tokens, cut, rng);
        (start, schedule)
    }

    /// Every event of a schedule: `(tokens, gap before it)`.
    fn events(mut schedule: Schedule, start: Instant) -> Vec<(u32, Duration)> {
        let mut out = Vec::new();
        let mut previous = start;
        let mut sent = 0;
        while let Some((event, deadline)) = schedule.next() {
            assert_eq!(event.first, sent, "events follow each other");
            assert_eq!(event.index as usize, out.len());
            sent += event.tokens;
            out.push((event.tokens, deadline - previous));
            previous = deadline;
            schedule.advance();
        }
        assert_eq!(schedule.sent(), sent);
        out
    }

    #[test]
    fn an_event_of_k_tokens_comes_k_inter_token_latencies_after_the_last() {
        let profile = ModelProfile::new("m", ms(100), ms(10), 10);
        let per_event = TokensPerEvent::range(3, 3).unwrap();
        let (start, s) = schedule(&profile, per_event, None);
        assert_eq!(
            events(s, start),
            vec![(3, ms(100)), (3, ms(30)), (3, ms(30)), (1, ms(10))],
            "the last event carries what is left"
        );
        // One token per event: the old schedule, a deadline per token.
        let (start, s) = schedule(&profile, TokensPerEvent::ONE, None);
        let one = events(s, start);
        assert_eq!(one.len(), 10);
        assert!(one[1..].iter().all(|e| *e == (1, ms(10))));
    }

    #[test]
    fn no_event_straddles_a_fault_and_the_hold_comes_after_the_last_event() {
        let profile = ModelProfile {
            hold_before_end: ms(500),
            ..ModelProfile::new("m", ms(100), ms(10), 10)
        };
        let per_event = TokensPerEvent::range(3, 3).unwrap();
        let (start, s) = schedule(&profile, per_event, Some(7));
        let counts: Vec<u32> = events(s, start).iter().map(|e| e.0).collect();
        assert_eq!(counts, vec![3, 3, 1, 3]);

        let (start, s) = schedule(&profile, per_event, None);
        assert_eq!(
            s.last_deadline(),
            start + ms(100 + 70),
            "(N - k_1) inter-token latencies"
        );
        let (start, mut s) = schedule(&profile, per_event, None);
        while s.next().is_some() {
            s.advance();
        }
        assert_eq!(s.end_deadline(), start + ms(100 + 70 + 500));
    }

    #[test]
    fn tokens_per_event_parse_as_n_or_min_max() {
        assert_eq!("1".parse(), Ok(TokensPerEvent::ONE));
        assert_eq!("1-5".parse(), Ok(TokensPerEvent::range(1, 5).unwrap()));
        assert_eq!(" 2 - 2 ".parse(), Ok(TokensPerEvent::range(2, 2).unwrap()));
        for bad in ["0", "5-1", "0-3", "x", "1-", ""] {
            assert!(bad.parse::<TokensPerEvent>().is_err(), "{bad}");
        }
        assert_eq!(TokensPerEvent::range(1, 5).unwrap().to_string(), "1-5");
        assert_eq!(TokensPerEvent::ONE.to_string(), "1");
    }

    /// The `data:` JSON values of an SSE body.
    async fn sse_values(stream: SimStream) -> Vec<Value> {
        let body = stream.collect().await.expect("sim body").to_bytes();
        let text = String::from_utf8(body.to_vec()).expect("utf-8");
        text.split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).expect("chunk JSON"))
            .collect()
    }

    /// Streams a chat response of `tokens` in events of `per_event` and returns each
    /// content chunk's token count (its text is consecutive words of the script, one
    /// token each) and the final usage's `completion_tokens`.
    async fn chat_stream(
        tokens: u32,
        per_event: TokensPerEvent,
        continuous: bool,
    ) -> (Vec<u32>, u64) {
        let profile = ModelProfile::new("m", Duration::ZERO, Duration::ZERO, tokens);
        let (_, schedule) = schedule(&profile, per_event, None);
        let stream = SimStream::new(
            script(Api::Chat, tokens, continuous, None),
            schedule,
            None,
            Arc::new(AtomicU64::new(0)),
        );
        let mut counts = Vec::new();
        let mut usage = None;
        let mut next_word = 0u32;
        for chunk in sse_values(stream).await {
            if let Some(n) = chunk.pointer("/usage/completion_tokens") {
                usage = n.as_u64();
            }
            let Some(text) = chunk
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
            else {
                continue;
            };
            if text.is_empty() {
                continue;
            }
            let mut rest = text;
            let mut count = 0;
            while !rest.is_empty() {
                rest = rest
                    .strip_prefix(Script::word(next_word))
                    .unwrap_or_else(|| panic!("chunk {text:?}: word {next_word} expected"));
                next_word += 1;
                count += 1;
            }
            if continuous {
                assert_eq!(
                    usage,
                    Some(u64::from(next_word)),
                    "cumulative usage per chunk"
                );
            }
            counts.push(count);
        }
        (counts, usage.expect("a usage report"))
    }

    /// Every dialect's mid-stream error faults, served by a [`SimStream`] and read back by
    /// tokentap's own decoder, name the class the fault stands for: the simulator's shapes
    /// and the decoders' reading of them cannot drift apart.
    #[tokio::test]
    async fn error_faults_decode_to_their_class_in_every_dialect() {
        use crate::StreamError;
        use tokentap_wire::{
            self as wire, DecodeLimits, DecodeOptions, Dialect, ErrorClass, Signal,
        };

        let apis = [
            (Api::Chat, Dialect::OpenAiChat),
            (Api::Completions, Dialect::OpenAiCompletions),
            (Api::Responses, Dialect::OpenAiResponses),
            (Api::Anthropic, Dialect::Anthropic),
            (Api::Gemini { sse: true }, Dialect::Gemini),
            (Api::Gemini { sse: false }, Dialect::Gemini),
            (Api::Ollama { chat: true }, Dialect::Ollama),
            (Api::Ollama { chat: false }, Dialect::Ollama),
            (Api::Tgi, Dialect::Tgi),
            (Api::Triton, Dialect::Triton),
        ];
        for (api, dialect) in apis {
            for kind in [
                StreamError::Failure,
                StreamError::RateLimit,
                StreamError::Overload,
            ] {
                let want = match (kind, api) {
                    (StreamError::Failure, _) | (_, Api::Ollama { .. } | Api::Triton) => {
                        ErrorClass::Other
                    }
                    // TGI has no rate-limit error: it sends its overload.
                    (StreamError::Overload, _) | (StreamError::RateLimit, Api::Tgi) => {
                        ErrorClass::Overloaded
                    }
                    (StreamError::RateLimit, _) => ErrorClass::RateLimited,
                };
                let fault = Some(Fault::ErrorAfter(2, kind));
                let script = script(api, 5, false, fault);
                let content_type = script.stream_content_type();
                let profile = ModelProfile::new("m", Duration::ZERO, Duration::ZERO, 5);
                let (_, schedule) = schedule(&profile, TokensPerEvent::ONE, Some(2));
                let stream = SimStream::new(script, schedule, None, Arc::new(AtomicU64::new(0)));
                let body = stream.collect().await.expect("sim body").to_bytes();

                let framing = wire::framing_for(dialect, content_type).expect("a framing");
                let options = DecodeOptions::new(DecodeLimits::DEFAULT);
                let mut decoder = wire::decoder(dialect, framing, options);
                let mut signals = Vec::new();
                decoder.feed(&body, &mut signals).expect("decodes");
                decoder.finish(&mut signals).expect("finishes");
                let outputs = signals
                    .iter()
                    .filter(|s| matches!(s, Signal::Output { .. }))
                    .count();
                let errors: Vec<_> = signals
                    .iter()
                    .filter_map(|s| match s {
                        Signal::Error(class) => Some(*class),
                        _ => None,
                    })
                    .collect();
                let text = String::from_utf8_lossy(&body);
                assert_eq!(errors, vec![want], "{api:?} {kind:?}:\n{text}");
                assert_eq!(outputs, 2, "{api:?} {kind:?}: the tokens before the error");
                assert!(
                    !signals.contains(&Signal::Malformed),
                    "{api:?} {kind:?}:\n{text}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_batched_stream_reports_the_tokens_it_sent() {
        let per_event = TokensPerEvent::range(1, 5).unwrap();
        let (counts, usage) = chat_stream(200, per_event, false).await;
        assert_eq!(counts.iter().map(|k| u64::from(*k)).sum::<u64>(), usage);
        assert_eq!(usage, 200);
        let (last, events) = counts.split_last().unwrap();
        assert!(events.iter().all(|k| (1..=5).contains(k)), "{counts:?}");
        assert!((1..=5).contains(last));
        assert!(counts.iter().any(|k| *k > 1), "{counts:?}");
        assert!(counts.len() < 200);

        let (counts, usage) = chat_stream(200, per_event, true).await;
        assert_eq!(counts.iter().map(|k| u64::from(*k)).sum::<u64>(), usage);

        let (counts, usage) = chat_stream(40, TokensPerEvent::ONE, false).await;
        assert_eq!(
            (counts, usage),
            (vec![1; 40], 40),
            "the default: a token per event"
        );
    }
}
