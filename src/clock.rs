//! `TokenClock`: the measurement semantics of DESIGN.md, and nothing else.
//!
//! The clock is fed instants and token events by the body observer (the one place that
//! reads the monotonic clock) and turns them into TTFB, TTFT, per-gap inter-token latency,
//! TPOT, decode tokens/s and duration. It does no I/O and never reads the time itself, so
//! every rule here is tested on synthetic timelines with exact expected values.
//!
//! For one request, with `t_req` the instant the request head was received:
//! - TTFB = `t_head - t_req`, TTFT = `t_1 - t_req` (first token-bearing event);
//! - for each later event `i` carrying `k_i` tokens, the gap `g_i = t_i - t_(i-1)` is
//!   observed `k_i` times with value `g_i / k_i` (token-weighted ITL);
//! - N (output tokens) = the final reported usage if any, else `sum k_i`;
//! - TPOT = `(t_E - t_1) / (N - k_1)` and decode tokens/s its inverse, only when
//!   `N - k_1 >= 1` and the stream had at least two token-bearing events (with one event
//!   `t_E - t_1` is zero and a rate would be meaningless).

use std::time::{Duration, Instant};

use crate::wire::OutputKind;

/// What one token-bearing event means for the ITL histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stamp {
    /// The first token-bearing event: its latency from the request is the TTFT.
    First { ttft: Duration },
    /// A later event: observe `per_token` into ITL `tokens` times. `gap` is the raw gap.
    Next {
        gap: Duration,
        per_token: Duration,
        tokens: u32,
    },
}

/// Timeline state of one request.
#[derive(Clone, Debug)]
pub struct TokenClock {
    t_req: Instant,
    t_head: Option<Instant>,
    /// `(t_1, k_1)`.
    first: Option<(Instant, u32)>,
    /// First event with visible (non-reasoning) output.
    first_visible: Option<Instant>,
    /// `t_(i-1)` for the next gap, then `t_E`.
    last: Option<Instant>,
    events: u64,
    /// `sum k_i`.
    counted_tokens: u64,
    /// Part of `counted_tokens` whose per-event count the wire format gave exactly.
    exact_tokens: u64,
    usage_input: Option<u64>,
    usage_output: Option<u64>,
}

/// Everything the clock measured for a finished request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timings {
    pub ttfb: Option<Duration>,
    pub ttft: Option<Duration>,
    /// Time to the first visible (non-reasoning) token.
    pub ttft_content: Option<Duration>,
    pub duration: Duration,
    /// Token-bearing events seen (`E`).
    pub events: u64,
    /// `N`: reported usage if any, else the sum of per-event counts.
    pub output_tokens: u64,
    /// Whether `output_tokens` came from the stream's own usage report.
    pub output_tokens_reported: bool,
    /// Per-event counts that were exact (`<= sum k_i`).
    pub exact_event_tokens: u64,
    /// Per-event counts that were the one-per-event estimate.
    pub estimated_event_tokens: u64,
    pub input_tokens: Option<u64>,
    /// Token-weighted mean ITL: `(t_E - t_1) / sum_{i>=2} k_i`.
    pub mean_itl: Option<Duration>,
    pub decode: Option<Decode>,
}

/// Decode-phase figures, present only when they are defined (see module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decode {
    /// Time per output token after the first event.
    pub tpot: Duration,
    /// Output tokens per second after the first event.
    pub tokens_per_second: f64,
}

impl TokenClock {
    /// Start the clock at the instant the request head was received.
    pub fn new(t_req: Instant) -> Self {
        TokenClock {
            t_req,
            t_head: None,
            first: None,
            first_visible: None,
            last: None,
            events: 0,
            counted_tokens: 0,
            exact_tokens: 0,
            usage_input: None,
            usage_output: None,
        }
    }

    /// The upstream response head arrived; returns the TTFB. Only the first call counts.
    pub fn response_head(&mut self, at: Instant) -> Duration {
        let t_head = *self.t_head.get_or_insert(at);
        t_head.saturating_duration_since(self.t_req)
    }

    /// The TTFB, once the response head has arrived.
    pub fn ttfb(&self) -> Option<Duration> {
        self.t_head.map(|t| t.saturating_duration_since(self.t_req))
    }

    /// Time to the first visible (non-reasoning) token, once there was one.
    pub fn ttft_content(&self) -> Option<Duration> {
        self.first_visible
            .map(|t| t.saturating_duration_since(self.t_req))
    }

    /// A token-bearing event completed at `at`, carrying `tokens` (`k_i`, 0 is read as 1).
    pub fn output(&mut self, at: Instant, tokens: u32, exact: bool, kind: OutputKind) -> Stamp {
        let tokens = tokens.max(1);
        self.events += 1;
        self.counted_tokens += u64::from(tokens);
        if exact {
            self.exact_tokens += u64::from(tokens);
        }
        if kind.is_visible() && self.first_visible.is_none() {
            self.first_visible = Some(at);
        }
        let stamp = match self.last {
            None => {
                self.first = Some((at, tokens));
                Stamp::First {
                    ttft: at.saturating_duration_since(self.t_req),
                }
            }
            Some(previous) => {
                let gap = at.saturating_duration_since(previous);
                Stamp::Next {
                    gap,
                    per_token: gap / tokens,
                    tokens,
                }
            }
        };
        self.last = Some(at);
        stamp
    }

    /// The stream reported usage. Values are cumulative: the latest report wins.
    pub fn usage(&mut self, input_tokens: Option<u64>, output_tokens: Option<u64>) {
        if input_tokens.is_some() {
            self.usage_input = input_tokens;
        }
        if output_tokens.is_some() {
            self.usage_output = output_tokens;
        }
    }

    /// The response ended (in any way) at `at`.
    pub fn finish(&self, at: Instant) -> Timings {
        let output_tokens = self.usage_output.unwrap_or(self.counted_tokens);
        let ttft = self
            .first
            .map(|(t1, _)| t1.saturating_duration_since(self.t_req));
        let mut mean_itl = None;
        let mut decode = None;
        if let (Some((t1, k1)), Some(t_e)) = (self.first, self.last) {
            let span = t_e.saturating_duration_since(t1);
            let counted_after_first = self.counted_tokens - u64::from(k1);
            if self.events >= 2 && counted_after_first >= 1 {
                mean_itl = Some(div_duration(span, counted_after_first));
            }
            let decode_tokens = output_tokens.saturating_sub(u64::from(k1));
            if self.events >= 2 && decode_tokens >= 1 && !span.is_zero() {
                decode = Some(Decode {
                    tpot: div_duration(span, decode_tokens),
                    tokens_per_second: decode_tokens as f64 / span.as_secs_f64(),
                });
            }
        }
        Timings {
            ttfb: self.ttfb(),
            ttft,
            ttft_content: self.ttft_content(),
            duration: at.saturating_duration_since(self.t_req),
            events: self.events,
            output_tokens,
            output_tokens_reported: self.usage_output.is_some(),
            exact_event_tokens: self.exact_tokens,
            estimated_event_tokens: self.counted_tokens - self.exact_tokens,
            input_tokens: self.usage_input,
            mean_itl,
            decode,
        }
    }
}

/// `d / n` for a `u64` divisor, exact to the nanosecond.
fn div_duration(d: Duration, n: u64) -> Duration {
    let nanos = d.as_nanos() / u128::from(n.max(1));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A timeline like the integration test's backend: head at 5 ms, first token at 150 ms,
    /// then one token every 20 ms, 40 tokens in all.
    #[test]
    fn steady_stream_gives_exact_ttft_itl_tpot() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        assert_eq!(clock.response_head(t0 + ms(5)), ms(5));
        assert_eq!(
            clock.output(t0 + ms(150), 1, false, OutputKind::Content),
            Stamp::First { ttft: ms(150) }
        );
        for i in 1..40u64 {
            let stamp = clock.output(t0 + ms(150 + 20 * i), 1, false, OutputKind::Content);
            assert_eq!(
                stamp,
                Stamp::Next {
                    gap: ms(20),
                    per_token: ms(20),
                    tokens: 1
                }
            );
        }
        let t = clock.finish(t0 + ms(150 + 20 * 39 + 3));
        assert_eq!(t.ttfb, Some(ms(5)));
        assert_eq!(t.ttft, Some(ms(150)));
        assert_eq!(t.ttft_content, Some(ms(150)));
        assert_eq!(t.duration, ms(933));
        assert_eq!(t.events, 40);
        assert_eq!(t.output_tokens, 40);
        assert!(!t.output_tokens_reported);
        assert_eq!(t.mean_itl, Some(ms(20)));
        let decode = t.decode.expect("decode defined");
        assert_eq!(decode.tpot, ms(20));
        assert!((decode.tokens_per_second - 50.0).abs() < 1e-9);
    }

    #[test]
    fn multi_token_event_splits_its_gap() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0 + ms(100), 2, true, OutputKind::Content);
        let stamp = clock.output(t0 + ms(130), 3, true, OutputKind::Content);
        assert_eq!(
            stamp,
            Stamp::Next {
                gap: ms(30),
                per_token: ms(10),
                tokens: 3
            }
        );
        let t = clock.finish(t0 + ms(130));
        assert_eq!(t.output_tokens, 5);
        assert_eq!(t.exact_event_tokens, 5);
        assert_eq!(t.estimated_event_tokens, 0);
        // ITL sum over the request is t_E - t_1 = 30 ms, count = 3 tokens after the first event.
        assert_eq!(t.mean_itl, Some(ms(10)));
        // TPOT = (t_E - t_1) / (N - k_1) = 30 ms / 3.
        assert_eq!(t.decode.map(|d| d.tpot), Some(ms(10)));
    }

    #[test]
    fn reported_usage_corrects_n_but_not_itl() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0 + ms(100), 1, false, OutputKind::Content);
        clock.output(t0 + ms(140), 1, false, OutputKind::Content);
        clock.output(t0 + ms(180), 1, false, OutputKind::Content);
        clock.usage(Some(12), Some(9));
        let t = clock.finish(t0 + ms(200));
        assert_eq!(t.output_tokens, 9);
        assert!(t.output_tokens_reported);
        assert_eq!(t.input_tokens, Some(12));
        assert_eq!(t.mean_itl, Some(ms(40)));
        // TPOT = 80 ms / (9 - 1)
        assert_eq!(t.decode.map(|d| d.tpot), Some(ms(10)));
        assert_eq!(t.decode.map(|d| d.tokens_per_second), Some(100.0));
    }

    #[test]
    fn later_usage_replaces_earlier_field_by_field() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.usage(Some(7), Some(1));
        clock.usage(None, Some(5));
        let t = clock.finish(t0);
        assert_eq!(t.input_tokens, Some(7));
        assert_eq!(t.output_tokens, 5);
    }

    #[test]
    fn reasoning_first_delays_content_ttft_only() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0 + ms(50), 1, false, OutputKind::Reasoning);
        clock.output(t0 + ms(60), 1, false, OutputKind::Reasoning);
        clock.output(t0 + ms(90), 1, false, OutputKind::Content);
        let t = clock.finish(t0 + ms(95));
        assert_eq!(t.ttft, Some(ms(50)));
        assert_eq!(t.ttft_content, Some(ms(90)));
    }

    #[test]
    fn single_event_has_no_decode_rate_even_with_usage() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0 + ms(100), 1, false, OutputKind::Content);
        clock.usage(None, Some(40));
        let t = clock.finish(t0 + ms(100));
        assert_eq!(t.ttft, Some(ms(100)));
        assert_eq!(t.output_tokens, 40);
        assert_eq!(t.mean_itl, None);
        assert_eq!(t.decode, None);
    }

    #[test]
    fn no_tokens_means_no_ttft() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.response_head(t0 + ms(3));
        let t = clock.finish(t0 + ms(10));
        assert_eq!(t.ttfb, Some(ms(3)));
        assert_eq!(t.ttft, None);
        assert_eq!(t.output_tokens, 0);
        assert_eq!(t.duration, ms(10));
    }

    #[test]
    fn frame_with_several_events_gives_zero_gaps() {
        // Three events decoded from one frame share one instant: two zero gaps.
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        let at = t0 + ms(70);
        clock.output(at, 1, false, OutputKind::Content);
        assert_eq!(
            clock.output(at, 1, false, OutputKind::Content),
            Stamp::Next {
                gap: Duration::ZERO,
                per_token: Duration::ZERO,
                tokens: 1
            }
        );
        clock.output(at, 1, false, OutputKind::Content);
        let t = clock.finish(at);
        assert_eq!(t.mean_itl, Some(Duration::ZERO));
        // Zero span: a decode rate would be infinite, so it is not defined.
        assert_eq!(t.decode, None);
    }

    #[test]
    fn only_first_response_head_counts() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.response_head(t0 + ms(4));
        assert_eq!(clock.response_head(t0 + ms(9)), ms(4));
    }
}
