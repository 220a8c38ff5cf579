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
use super::config::{Fault, ModelProfile};
use super::render::Script;

/// Absolute send deadlines of every token of one response.
pub(super) struct Schedule {
    deadlines: Vec<Instant>,
}

impl Schedule {
    pub(super) fn new(
        start: Instant,
        profile: &ModelProfile,
        tokens: u32,
        rng: &mut SmallRng,
    ) -> Schedule {
        let mut jittered = |d: Duration| {
            if profile.jitter > 0.0 {
                d.mul_f64((1.0 + rng.gen_range(-profile.jitter..=profile.jitter)).max(0.0))
            } else {
                d
            }
        };
        let mut at = start + jittered(profile.ttft);
        let mut deadlines = Vec::with_capacity(tokens as usize);
        for i in 0..tokens {
            if i > 0 {
                at += jittered(profile.itl);
            }
            deadlines.push(at);
        }
        Schedule { deadlines }
    }

    pub(super) fn at(&self, i: u32) -> Instant {
        self.deadlines[i as usize]
    }
}

/// Where a stream is in its script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Preamble,
    Token(u32),
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
    /// Events sent so far (the first Gemini array element opens the array).
    sent: u32,
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
        let first = schedule.at(0);
        SimStream {
            open,
            script,
            schedule,
            step: Step::Preamble,
            sent: 0,
            sleep: Box::pin(tokio::time::sleep_until(first)),
            encoder: coding.map(Encoder::new),
        }
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
                    this.step = Step::Token(0);
                    if let Some(bytes) = this.script.preamble() {
                        return this.emit(bytes);
                    }
                }
                Step::Token(i) => {
                    match this.script.fault {
                        Some(Fault::ResetAfter(n)) if i == n => {
                            this.step = Step::End;
                            return Poll::Ready(Some(Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionReset,
                                "simulated reset",
                            ))));
                        }
                        Some(Fault::StallAfter(n)) if i == n => return Poll::Pending,
                        Some(Fault::ErrorAfter(n)) if i == n => {
                            this.step = Step::Trailer;
                            let error = this.script.error(this.sent == 0);
                            return this.emit(error);
                        }
                        Some(Fault::EndAfter(n)) if i == n => {
                            this.step = Step::Trailer;
                            continue;
                        }
                        _ => {}
                    }
                    if i >= this.script.tokens {
                        this.step = Step::Finish;
                        continue;
                    }
                    let deadline = this.schedule.at(i);
                    if this.sleep.deadline() != deadline {
                        this.sleep.as_mut().reset(deadline);
                    }
                    if this.sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.step = Step::Token(i + 1);
                    let bytes = this.script.token(i, this.sent == 0);
                    return this.emit(bytes);
                }
                Step::Finish => {
                    this.step = Step::Usage;
                    if let Some(bytes) = this.script.finish(this.sent == 0) {
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
