//! `TokenClock`: the "Measurement semantics" of docs/ARCHITECTURE.md, and nothing else.
//!
//! The clock is fed instants and token events by the transports (each reads the monotonic
//! clock once per piece of body data: hyper's body wrapper per frame, the relay per piece
//! a read brought) and turns them into TTFB, TTFT, inter-token latency (ITL),
//! inter-chunk gaps, TPOT, decode tokens/s and duration. It does no I/O and never reads
//! the time itself, so every rule here is tested on synthetic timelines with exact
//! expected values.
//!
//! For one request, with `t_req` the instant the request head was received:
//! - TTFB = `t_head - t_req`, TTFT = `t_1 - t_req` (first token-bearing event);
//! - every later event `i` closes the gap `g_i = t_i - t_(i-1)`: one inter-chunk
//!   observation, live ([`Stamp::Next`]);
//! - N (output tokens) = the final reported usage if any, else `sum k_i`;
//! - TPOT = `(t_E - t_1) / (N - k_1)` and decode tokens/s its inverse, only when
//!   `N - k_1 >= 1` and the stream had at least two token-bearing events (with one event
//!   `t_E - t_1` is zero and a rate would be meaningless).
//!
//! # ITL: per token whenever N is known
//!
//! Over a request the ITL histogram's sum is `t_E - t_1` and its count the tokens after
//! the first event. How a gap becomes ITL observations depends on how its `k_i` is known:
//!
//! - **Exact** counts (logprobs entries, continuous usage, TGI, Gemini): the gap is
//!   observed live, `k_i` times with value `g_i / k_i`.
//! - **Estimated** counts (the delta's words and symbols, or a tokenizer's count): the gap is
//!   buffered with its estimate and observed when the request ends ([`TokenClock::timings`]).
//!   If the stream reported N by then, the buffered gaps share exactly
//!   `N - k_1 - (tokens observed live)` observations whose sum is their total span: each
//!   gap's integer share is in proportion to its estimate (largest remainder, so the
//!   shares add up exactly). Without a reported N (cancelled, usage not requested, a
//!   format without usage) each gap is observed with its estimate.
//! - A gap whose count (estimate or share) is 0 is merged into the next gap, a trailing
//!   one into the previous: its time is part of the next token's latency, and the sum
//!   stays the span.
//! - A mixed stream keeps its exact gaps live and apportions the rest over what N leaves
//!   after them. If N leaves nothing for the buffered gaps (a usage report smaller than the
//!   exact counts already seen), they are observed with their estimates.
//!
//! The buffer is bounded: at most [`MAX_BUFFERED_GAPS`] gaps of 8 bytes each (32 KiB at
//! most; a 1,000-token stream buffers at most 999 gaps, 8 KiB). A gap is kept in whole
//! microseconds, rounded so that the running total stays within half a microsecond of the
//! true one, so the apportioned observations still add up to `t_E - t_1` to 0.5 µs
//! however many gaps there are. Past the bound the
//! remaining estimated gaps are observed live with their estimates, and apportioning
//! covers the buffered ones only.
//!
//! The first event carries at least one token (`k_1 >= 1`: it is token-bearing); a later
//! estimated event may carry 0 (a tokenizer that has not yet settled its text).

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

use std::time::{Duration, Instant};

use crate::wire::{OutputKind, TokenDetails};

/// Most estimated gaps a request buffers for apportioning at its end (see the module docs).
pub const MAX_BUFFERED_GAPS: usize = 4096;

/// Room for the first buffered gaps, taken at once: growing a `Vec` from nothing past a
/// few dozen gaps reallocates five times, and each reallocation costs more than the
/// 512 bytes it saves a short stream.
const FIRST_BUFFERED_GAPS: usize = 64;

/// `count` ITL observations of `per_token` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItlShare {
    pub per_token: Duration,
    pub count: u64,
}

/// What one token-bearing event means for the histograms, live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stamp {
    /// The first token-bearing event: its latency from the request is the TTFT.
    First { ttft: Duration },
    /// A later event: `gap` is one inter-chunk observation; `itl` the ITL observations to
    /// make now (`None`: the gap is buffered until the request ends).
    Next {
        gap: Duration,
        itl: Option<ItlShare>,
    },
}

/// How the per-event token counts of a request were known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counting {
    /// No token-bearing event.
    None,
    /// Every count was given by the wire format.
    Exact,
    /// Estimated counts apportioned from the reported N (some may be exact).
    Apportioned,
    /// Estimated counts without a reported N to correct them (some may be exact).
    Estimated,
}

impl Counting {
    pub const fn as_str(self) -> &'static str {
        match self {
            Counting::None => "none",
            Counting::Exact => "exact",
            Counting::Apportioned => "apportioned",
            Counting::Estimated => "estimated",
        }
    }
}

/// A buffered estimated gap: 8 bytes. `micros` saturates past 71 minutes and `estimate`
/// past 65,535 tokens (an idle timeout or the event bound ends a stream long before).
#[derive(Clone, Copy, Debug)]
struct BufferedGap {
    micros: u32,
    estimate: u16,
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
    /// ITL observations already made live: exact counts, and estimates past the buffer.
    live_itl_tokens: u64,
    /// Part of `live_itl_tokens` that were estimates (observed past the buffer's bound).
    live_estimated_tokens: u64,
    buffered: Vec<BufferedGap>,
    /// The buffered gaps' true total and the total of their stored microseconds, which
    /// each new gap's rounding keeps within half a microsecond of each other.
    buffered_nanos: u64,
    buffered_micros: u64,
    /// Whether the last event's gap is the last one in `buffered`.
    last_buffered: bool,
    slowest_gap: Option<Duration>,
    usage_input: Option<u64>,
    usage_output: Option<u64>,
    /// The cached and reasoning parts of the reported usage, merged.
    details: TokenDetails,
}

/// Everything the clock measured for a finished request.
#[derive(Clone, Debug, PartialEq)]
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
    /// Output tokens whose per-event count the wire format gave.
    pub exact_event_tokens: u64,
    /// Output tokens whose count was apportioned from the reported N.
    pub apportioned_event_tokens: u64,
    /// Output tokens counted by an estimate nothing corrected.
    pub estimated_event_tokens: u64,
    /// How the per-event counts were known, in one word.
    pub counting: Counting,
    pub input_tokens: Option<u64>,
    /// The cached and reasoning parts of the reported usage (of `input_tokens` and
    /// `output_tokens`), each as the latest report gave it.
    pub details: TokenDetails,
    /// Token-weighted mean ITL: `(t_E - t_1) / (ITL observations)`.
    pub mean_itl: Option<Duration>,
    /// The longest gap between consecutive token-bearing events.
    pub slowest_gap: Option<Duration>,
    /// The ITL observations left to make at the end (the buffered gaps); with those made
    /// live, the request's ITL count is `N - k_1` whenever N was reported.
    pub deferred_itl: Vec<ItlShare>,
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
            live_itl_tokens: 0,
            live_estimated_tokens: 0,
            buffered: Vec::new(),
            buffered_nanos: 0,
            buffered_micros: 0,
            last_buffered: false,
            slowest_gap: None,
            usage_input: None,
            usage_output: None,
            details: TokenDetails::default(),
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

    /// Whether a visible (non-reasoning) token has come: [`ttft_content`](Self::ttft_content)
    /// without the subtraction, for the per-event check.
    pub fn has_content(&self) -> bool {
        self.first_visible.is_some()
    }

    /// Time to the first visible (non-reasoning) token, once there was one.
    pub fn ttft_content(&self) -> Option<Duration> {
        self.first_visible
            .map(|t| t.saturating_duration_since(self.t_req))
    }

    /// Add the slots the next buffered gaps go to (heap memory outside the clock), as
    /// many as a list serves events ([`crate::prefetch::REFRESH_EVERY`]).
    pub fn hot_lines(&self, lines: &mut crate::prefetch::Lines) {
        let (len, capacity) = (self.buffered.len(), self.buffered.capacity());
        let next = self.buffered.as_ptr().wrapping_add(len);
        lines.span(
            next,
            capacity
                .saturating_sub(len)
                .min(crate::prefetch::REFRESH_EVERY),
        );
    }

    /// A token-bearing event completed at `at`, carrying `tokens` (`k_i`). An exact 0 is
    /// read as 1; an estimate may be 0 (module docs).
    pub fn output(&mut self, at: Instant, tokens: u32, exact: bool, kind: OutputKind) -> Stamp {
        let tokens = if exact { tokens.max(1) } else { tokens };
        self.last_buffered = false;
        self.events = self.events.saturating_add(1);
        self.counted_tokens = self.counted_tokens.saturating_add(u64::from(tokens));
        if exact {
            self.exact_tokens = self.exact_tokens.saturating_add(u64::from(tokens));
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
                if self.slowest_gap.is_none_or(|slowest| gap > slowest) {
                    self.slowest_gap = Some(gap);
                }
                let itl = if exact || self.buffered.len() >= MAX_BUFFERED_GAPS {
                    self.live_itl(gap, tokens, exact)
                } else {
                    self.buffered_nanos = self.buffered_nanos.saturating_add(saturating_nanos(gap));
                    let total_micros = self.buffered_nanos.saturating_add(500) / 1000;
                    let micros = total_micros.saturating_sub(self.buffered_micros);
                    self.buffered_micros = total_micros;
                    if self.buffered.capacity() == 0 {
                        self.buffered.reserve(FIRST_BUFFERED_GAPS);
                    }
                    self.buffered.push(BufferedGap {
                        micros: u32::try_from(micros).unwrap_or(u32::MAX),
                        estimate: u16::try_from(tokens).unwrap_or(u16::MAX),
                    });
                    self.last_buffered = true;
                    None
                };
                Stamp::Next { gap, itl }
            }
        };
        self.last = Some(at);
        stamp
    }

    /// An ITL observation made as the event arrives. An estimate of 0 past the buffer has
    /// no later gap to merge into that is known now, so it counts as 1.
    fn live_itl(&mut self, gap: Duration, tokens: u32, exact: bool) -> Option<ItlShare> {
        let count = u64::from(tokens.max(1));
        self.live_itl_tokens = self.live_itl_tokens.saturating_add(count);
        if !exact {
            self.live_estimated_tokens = self.live_estimated_tokens.saturating_add(count);
        }
        Some(ItlShare {
            per_token: div_duration(gap, count),
            count,
        })
    }

    /// Estimated tokens of the last event known only at the end of the body (a
    /// tokenizer's pending text): added to that event's count.
    pub fn trailing_tokens(&mut self, tokens: u32) {
        if self.last.is_none() {
            return;
        }
        self.counted_tokens = self.counted_tokens.saturating_add(u64::from(tokens));
        if self.last_buffered {
            if let Some(gap) = self.buffered.last_mut() {
                gap.estimate = gap
                    .estimate
                    .saturating_add(u16::try_from(tokens).unwrap_or(u16::MAX));
            }
        } else if self.events == 1 {
            if let Some((_, k1)) = self.first.as_mut() {
                *k1 = k1.saturating_add(tokens);
            }
        }
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

    /// The stream reported the cached and reasoning parts of its usage. Cumulative, as
    /// usage is: part by part, the latest report wins.
    pub fn token_details(&mut self, details: TokenDetails) {
        self.details.merge(details);
    }

    /// The response ended (in any way) at `at`.
    pub fn timings(&self, at: Instant) -> Timings {
        let output_tokens = self.usage_output.unwrap_or(self.counted_tokens);
        let ttft = self
            .first
            .map(|(t1, _)| t1.saturating_duration_since(self.t_req));
        // `k_1 >= 1` in the arithmetic: the first event is token-bearing, whatever a
        // tokenizer settled of its text yet.
        let k1 = self.first.map_or(0, |(_, k1)| u64::from(k1.max(1)));

        // The buffered gaps' share of N, if N was reported and leaves them something.
        let apportioned_target = self
            .usage_output
            .map(|n| n.saturating_sub(k1.saturating_add(self.live_itl_tokens)))
            .filter(|target| *target >= 1 && !self.buffered.is_empty());
        let estimated: u64 = self.buffered.iter().map(|g| u64::from(g.estimate)).sum();
        let deferred_itl = apportion(
            &self.buffered,
            apportioned_target.unwrap_or(estimated),
            estimated,
        );
        // A reported N corrects the estimates unless it left nothing to the buffered gaps.
        let n_corrects_estimates = self.usage_output.is_some()
            && (self.buffered.is_empty() || apportioned_target.is_some());
        let itl_count = deferred_itl
            .iter()
            .fold(self.live_itl_tokens, |n, s| n.saturating_add(s.count));

        let estimated_counts = self.counted_tokens > self.exact_tokens;
        let (counting, apportioned, estimated) = match (self.events, estimated_counts) {
            (0, _) => (Counting::None, 0, 0),
            (_, false) => (Counting::Exact, 0, 0),
            (_, true) if n_corrects_estimates => {
                let apportioned = output_tokens
                    .saturating_sub(self.exact_tokens.saturating_add(self.live_estimated_tokens));
                (
                    Counting::Apportioned,
                    apportioned,
                    self.live_estimated_tokens,
                )
            }
            (_, true) => (
                Counting::Estimated,
                0,
                self.counted_tokens.saturating_sub(self.exact_tokens),
            ),
        };

        let mut mean_itl = None;
        let mut decode = None;
        if let (Some((t1, _)), Some(t_e)) = (self.first, self.last) {
            let span = t_e.saturating_duration_since(t1);
            if self.events >= 2 && itl_count >= 1 {
                mean_itl = Some(div_duration(span, itl_count));
            }
            let decode_tokens = output_tokens.saturating_sub(k1);
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
            apportioned_event_tokens: apportioned,
            estimated_event_tokens: estimated,
            counting,
            input_tokens: self.usage_input,
            details: self.details,
            mean_itl,
            slowest_gap: self.slowest_gap,
            deferred_itl,
            decode,
        }
    }
}

/// Split `target` ITL observations over `gaps` in proportion to their estimates
/// (largest remainder, earlier gaps first on ties), merging every gap whose estimate or
/// share is 0 into the next one (a trailing one into the previous), so that the counts
/// add up to `target` and the values to the gaps' total time (to the nanosecond per
/// share). With `target` the sum of the estimates, each gap gets its estimate.
/// `estimated` is the sum of the gaps' estimates.
fn apportion(gaps: &[BufferedGap], target: u64, estimated: u64) -> Vec<ItlShare> {
    if gaps.is_empty() || target == 0 {
        return Vec::new();
    }
    if target == estimated {
        // Each gap's share is its estimate: the usual case (no reported N, or one the
        // estimates agree with), read off the gaps in one pass.
        return as_estimated(gaps);
    }
    let weighted = weights(gaps);
    let total: u128 = weighted.iter().map(|(_, w)| u128::from(*w)).sum();
    if u128::from(target) == total {
        // Each gap's share is its estimate, with no remainders to hand out: the usual
        // case (a reported N the estimates agree with), without the arithmetic.
        return weighted.into_iter().map(share_of).collect();
    }
    by_largest_remainder(&weighted, total, target)
}

/// Each gap's estimate as its share: what [`weights`] and [`share_of`] give, in one pass
/// and without the intermediate vector (a request's end does this once per buffered gap).
fn as_estimated(gaps: &[BufferedGap]) -> Vec<ItlShare> {
    let mut shares = Vec::with_capacity(gaps.len());
    // The last entry with a weight, kept back until it is known whether weight-0 gaps
    // after it add their time to it.
    let mut pending: Option<(u64, u64)> = None;
    let mut carried = 0u64;
    for gap in gaps {
        let nanos = u64::from(gap.micros) * 1000;
        if gap.estimate == 0 {
            carried = carried.saturating_add(nanos);
            continue;
        }
        if let Some(entry) =
            pending.replace((nanos.saturating_add(carried), u64::from(gap.estimate)))
        {
            shares.push(share_of(entry));
        }
        carried = 0;
    }
    shares.push(share_of(match pending {
        Some((nanos, weight)) => (nanos.saturating_add(carried), weight),
        None => (carried, 1),
    }));
    shares
}

/// Each gap's `(nanos, estimate)`, weight-0 gaps merged (see [`merge_empty`]).
fn weights(gaps: &[BufferedGap]) -> Vec<(u64, u64)> {
    merge_empty(
        gaps.iter()
            .map(|g| (u64::from(g.micros) * 1000, u64::from(g.estimate))),
    )
}

/// The shares of `target` over `weighted` (no weight 0, `total` their sum) by largest
/// remainder, earlier entries first on ties; shares of 0 merged as in [`apportion`].
fn by_largest_remainder(weighted: &[(u64, u64)], total: u128, target: u64) -> Vec<ItlShare> {
    let mut shares: Vec<(u64, u64)> = Vec::with_capacity(weighted.len());
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(weighted.len());
    let mut given = 0u64;
    for (index, (nanos, weight)) in weighted.iter().enumerate() {
        // u64 x u64 fits a u128; `total` is the sum of weights that are not 0.
        let exact = u128::from(target).saturating_mul(u128::from(*weight));
        let share = u64::try_from(exact.checked_div(total).unwrap_or(0)).unwrap_or(u64::MAX);
        given = given.saturating_add(share);
        shares.push((*nanos, share));
        remainders.push((exact.checked_rem(total).unwrap_or(0), index));
    }
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let left = usize::try_from(target.saturating_sub(given)).unwrap_or(usize::MAX);
    for (_, index) in remainders.into_iter().take(left) {
        if let Some(share) = shares.get_mut(index) {
            share.1 = share.1.saturating_add(1);
        }
    }
    merge_empty(shares.into_iter())
        .into_iter()
        .map(share_of)
        .collect()
}

/// `count` ITL observations that share `nanos` of time.
fn share_of((nanos, count): (u64, u64)) -> ItlShare {
    ItlShare {
        // A share's count is never 0 (merged away); 0 would read as 1.
        per_token: Duration::from_nanos(nanos.checked_div(count).unwrap_or(nanos)),
        count,
    }
}

/// `(nanos, weight)` runs with every weight-0 entry's time added to the next entry with
/// a weight (trailing ones to the previous). Never empty for a non-empty input: if no
/// entry has a weight, their time becomes one entry of weight 1.
fn merge_empty(entries: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(entries.size_hint().0.max(1));
    let mut carried = 0u64;
    for (nanos, weight) in entries {
        if weight == 0 {
            carried = carried.saturating_add(nanos);
        } else {
            merged.push((nanos.saturating_add(carried), weight));
            carried = 0;
        }
    }
    match merged.last_mut() {
        Some(last) => last.0 = last.0.saturating_add(carried),
        None => merged.push((carried, 1)),
    }
    merged
}

/// `d` in nanoseconds, `u64::MAX` from 584 years on: how the clock, the ITL sketch, the
/// live view and both OTLP exports turn a duration into a count.
pub fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `d / n` for a `u64` divisor, exact to the nanosecond.
fn div_duration(d: Duration, n: u64) -> Duration {
    let nanos = d
        .as_nanos()
        .checked_div(u128::from(n.max(1)))
        .unwrap_or_default();
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_duration_is_counted_in_nanoseconds_exactly_and_saturates_past_u64() {
        assert_eq!(saturating_nanos(Duration::ZERO), 0);
        assert_eq!(saturating_nanos(Duration::new(3, 7)), 3_000_000_007);
        let most = Duration::from_nanos(u64::MAX);
        assert_eq!(saturating_nanos(most), u64::MAX);
        assert_eq!(saturating_nanos(most + Duration::from_nanos(1)), u64::MAX);
        assert_eq!(saturating_nanos(Duration::MAX), u64::MAX);
    }

    fn share(per_token_ms: u64, count: u64) -> ItlShare {
        ItlShare {
            per_token: ms(per_token_ms),
            count,
        }
    }

    /// A clock with a first event of `k_1` tokens at 100 ms and then, for each
    /// `(gap_ms, tokens, exact)`, an event that much later.
    fn timeline(k1: u32, events: &[(u64, u32, bool)]) -> (TokenClock, Instant, Instant) {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        let mut at = t0 + ms(100);
        clock.output(at, k1, false, OutputKind::Content);
        for (gap, tokens, exact) in events {
            at += ms(*gap);
            clock.output(at, *tokens, *exact, OutputKind::Content);
        }
        (clock, t0, at)
    }

    /// The request's ITL observations: `(count, sum)`.
    fn itl_of(t: &Timings, live: &[ItlShare]) -> (u64, Duration) {
        live.iter()
            .chain(&t.deferred_itl)
            .fold((0, Duration::ZERO), |(n, sum), s| {
                (
                    n + s.count,
                    sum + s.per_token * u32::try_from(s.count).unwrap(),
                )
            })
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
            // Estimated counts: the gap is buffered until the end.
            assert_eq!(
                stamp,
                Stamp::Next {
                    gap: ms(20),
                    itl: None
                }
            );
        }
        let t = clock.timings(t0 + ms(150 + 20 * 39 + 3));
        assert_eq!(t.ttfb, Some(ms(5)));
        assert_eq!(t.ttft, Some(ms(150)));
        assert_eq!(t.ttft_content, Some(ms(150)));
        assert_eq!(t.duration, ms(933));
        assert_eq!(t.events, 40);
        assert_eq!(t.output_tokens, 40);
        assert!(!t.output_tokens_reported);
        assert_eq!(t.mean_itl, Some(ms(20)));
        // No usage reported: each gap observed with its estimate.
        assert_eq!(t.counting, Counting::Estimated);
        assert_eq!(t.estimated_event_tokens, 40);
        assert_eq!(t.deferred_itl, vec![share(20, 1); 39]);
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
                itl: Some(share(10, 3))
            }
        );
        let t = clock.timings(t0 + ms(130));
        assert_eq!(t.output_tokens, 5);
        assert_eq!(t.exact_event_tokens, 5);
        assert_eq!(t.estimated_event_tokens, 0);
        assert_eq!(t.counting, Counting::Exact);
        assert!(t.deferred_itl.is_empty(), "exact gaps are observed live");
        // ITL sum over the request is t_E - t_1 = 30 ms, count = 3 tokens after the first event.
        assert_eq!(t.mean_itl, Some(ms(10)));
        // TPOT = (t_E - t_1) / (N - k_1) = 30 ms / 3.
        assert_eq!(t.decode.map(|d| d.tpot), Some(ms(10)));
    }

    #[test]
    fn reported_usage_corrects_n_and_apportions_itl() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0 + ms(100), 1, false, OutputKind::Content);
        clock.output(t0 + ms(140), 1, false, OutputKind::Content);
        clock.output(t0 + ms(180), 1, false, OutputKind::Content);
        clock.usage(Some(12), Some(9));
        let t = clock.timings(t0 + ms(200));
        assert_eq!(t.output_tokens, 9);
        assert!(t.output_tokens_reported);
        assert_eq!(t.input_tokens, Some(12));
        // 80 ms over N - k_1 = 8 tokens, two gaps of one estimated token each: 4 + 4.
        assert_eq!(t.mean_itl, Some(ms(10)));
        assert_eq!(t.deferred_itl, vec![share(10, 4), share(10, 4)]);
        assert_eq!(t.counting, Counting::Apportioned);
        assert_eq!(t.apportioned_event_tokens, 9);
        assert_eq!(t.estimated_event_tokens, 0);
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
        let t = clock.timings(t0);
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
        let t = clock.timings(t0 + ms(95));
        assert_eq!(t.ttft, Some(ms(50)));
        assert_eq!(t.ttft_content, Some(ms(90)));
    }

    #[test]
    fn token_details_are_kept_part_by_part_beside_usage() {
        let (mut clock, _, end) = timeline(1, &[(10, 1, false)]);
        assert_eq!(clock.timings(end).details, TokenDetails::default());
        clock.usage(Some(100), None);
        clock.token_details(TokenDetails {
            cache_read_input: Some(64),
            cache_write_input: Some(8),
            reasoning_output: None,
        });
        clock.usage(None, Some(2));
        clock.token_details(TokenDetails {
            cache_read_input: Some(80),
            reasoning_output: Some(1),
            ..TokenDetails::default()
        });
        let t = clock.timings(end);
        assert_eq!(
            t.details,
            TokenDetails {
                cache_read_input: Some(80),
                cache_write_input: Some(8),
                reasoning_output: Some(1),
            }
        );
        assert_eq!((t.input_tokens, t.output_tokens), (Some(100), 2));
    }

    #[test]
    fn single_event_has_no_decode_rate_even_with_usage() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0 + ms(100), 1, false, OutputKind::Content);
        clock.usage(None, Some(40));
        let t = clock.timings(t0 + ms(100));
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
        let t = clock.timings(t0 + ms(10));
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
                itl: None
            }
        );
        clock.output(at, 1, false, OutputKind::Content);
        let t = clock.timings(at);
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

    #[test]
    fn buffered_gaps_share_n_minus_k1_in_proportion_to_their_estimates() {
        let (mut clock, _, end) = timeline(1, &[(30, 1, false), (10, 1, false), (60, 2, false)]);
        clock.usage(None, Some(9));
        let t = clock.timings(end);
        // Estimates 1, 1, 2 of 8 = N - k_1: shares 2, 2, 4.
        assert_eq!(
            t.deferred_itl,
            vec![share(15, 2), share(5, 2), share(15, 4)]
        );
        assert_eq!(itl_of(&t, &[]), (8, ms(100)));
        assert_eq!(t.mean_itl, Some(Duration::from_micros(12_500)));
        assert_eq!(t.slowest_gap, Some(ms(60)));
        assert_eq!(t.apportioned_event_tokens, 9);
    }

    #[test]
    fn shares_are_integers_by_largest_remainder_that_add_up() {
        let (mut clock, _, end) = timeline(1, &[(30, 1, false), (30, 1, false), (30, 1, false)]);
        clock.usage(None, Some(6));
        let t = clock.timings(end);
        // 5 over three equal estimates: 5/3 each, the two spare tokens to the first two.
        assert_eq!(
            t.deferred_itl,
            vec![share(15, 2), share(15, 2), share(30, 1)]
        );
        assert_eq!(itl_of(&t, &[]), (5, ms(90)));
    }

    #[test]
    fn a_zero_token_gap_merges_into_the_next_and_a_trailing_one_into_the_previous() {
        let events = [(10, 0, false), (20, 2, false), (20, 0, false)];
        let (clock, _, end) = timeline(1, &events);
        let t = clock.timings(end);
        // No N: the estimates, with the zero gaps' time in the gap that got tokens.
        assert_eq!(t.deferred_itl, vec![share(25, 2)]);
        assert_eq!(t.counting, Counting::Estimated);
        assert_eq!(t.estimated_event_tokens, 3);

        let (mut clock, _, end) = timeline(1, &events);
        clock.usage(None, Some(5));
        let t = clock.timings(end);
        assert_eq!(
            t.deferred_itl,
            vec![ItlShare {
                per_token: Duration::from_micros(12_500),
                count: 4
            }]
        );
    }

    proptest::proptest! {
        /// With N the sum of the estimates, the shortcut gives each gap its estimate, as
        /// the largest-remainder arithmetic would.
        #[test]
        fn shares_equal_to_the_estimates_agree_with_the_arithmetic(
            gaps in proptest::collection::vec((0u32..5_000_000, 0u16..4), 1..60),
        ) {
            let gaps: Vec<BufferedGap> = gaps
                .into_iter()
                .map(|(micros, estimate)| BufferedGap { micros, estimate })
                .collect();
            let weighted = weights(&gaps);
            let total: u64 = weighted.iter().map(|(_, w)| w).sum();
            let estimated: u64 = gaps.iter().map(|g| u64::from(g.estimate)).sum();
            let shortcut = apportion(&gaps, total, estimated);
            proptest::prop_assert_eq!(
                &shortcut,
                &by_largest_remainder(&weighted, u128::from(total), total)
            );
            proptest::prop_assert_eq!(shortcut.iter().map(|s| s.count).sum::<u64>(), total);
        }
    }

    #[test]
    fn a_gap_whose_share_rounds_to_zero_merges_into_the_next() {
        let (mut clock, _, end) = timeline(1, &[(5, 1, false), (5, 1, false), (50, 10, false)]);
        clock.usage(None, Some(3));
        let t = clock.timings(end);
        // 2 over estimates 1, 1, 10: shares 0, 0, 2 (the remainder goes to the largest).
        assert_eq!(t.deferred_itl, vec![share(30, 2)]);
        assert_eq!(itl_of(&t, &[]), (2, ms(60)));
    }

    #[test]
    fn a_mixed_stream_keeps_exact_gaps_live_and_apportions_the_rest() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0 + ms(100), 2, true, OutputKind::Content);
        let live = clock.output(t0 + ms(130), 3, true, OutputKind::Content);
        assert_eq!(
            live,
            Stamp::Next {
                gap: ms(30),
                itl: Some(share(10, 3))
            }
        );
        clock.output(t0 + ms(160), 1, false, OutputKind::Content);
        clock.output(t0 + ms(220), 1, false, OutputKind::Content);
        clock.usage(None, Some(11));
        let t = clock.timings(t0 + ms(220));
        // 11 - 2 - 3 = 6 tokens over the two buffered gaps.
        assert_eq!(t.deferred_itl, vec![share(10, 3), share(20, 3)]);
        assert_eq!(itl_of(&t, &[share(10, 3)]), (9, ms(120)));
        assert_eq!(t.counting, Counting::Apportioned);
        assert_eq!(t.exact_event_tokens, 5);
        assert_eq!(t.apportioned_event_tokens, 6);
        assert_eq!(t.estimated_event_tokens, 0);
    }

    #[test]
    fn a_usage_report_that_leaves_nothing_keeps_the_estimates() {
        let (mut clock, _, end) = timeline(1, &[(10, 1, false), (10, 1, false)]);
        clock.usage(None, Some(1));
        let t = clock.timings(end);
        assert_eq!(t.deferred_itl, vec![share(10, 1), share(10, 1)]);
        assert_eq!(t.counting, Counting::Estimated);
        assert_eq!(t.output_tokens, 1);
    }

    #[test]
    fn past_the_buffer_estimated_gaps_are_observed_live() {
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        clock.output(t0, 1, false, OutputKind::Content);
        let mut at = t0;
        for _ in 0..MAX_BUFFERED_GAPS {
            at += ms(1);
            let stamp = clock.output(at, 1, false, OutputKind::Content);
            assert!(matches!(stamp, Stamp::Next { itl: None, .. }));
        }
        at += ms(4);
        assert_eq!(
            clock.output(at, 2, false, OutputKind::Content),
            Stamp::Next {
                gap: ms(4),
                itl: Some(share(2, 2))
            }
        );
        let n = 1 + 2 * MAX_BUFFERED_GAPS as u64 + 2;
        clock.usage(None, Some(n));
        let t = clock.timings(at);
        // The buffered gaps share what the live ones left: 2 per gap.
        assert_eq!(t.deferred_itl.len(), MAX_BUFFERED_GAPS);
        assert!(t.deferred_itl.iter().all(|s| *s
            == ItlShare {
                per_token: Duration::from_micros(500),
                count: 2
            }));
        assert_eq!(t.estimated_event_tokens, 2);
        assert_eq!(t.apportioned_event_tokens, n - 2);
        assert_eq!(
            std::mem::size_of::<BufferedGap>(),
            8,
            "the documented bound"
        );
    }

    #[test]
    fn buffered_gaps_in_microseconds_still_add_up_to_the_decode_span() {
        // 999 gaps of 1,234.567 µs: each is stored in whole microseconds, rounded so that
        // the running total never drifts, so the apportioned values add up to the span.
        let t0 = Instant::now();
        let mut clock = TokenClock::new(t0);
        let gap = Duration::from_nanos(1_234_567);
        let mut at = t0 + ms(100);
        clock.output(at, 1, false, OutputKind::Content);
        for _ in 0..999 {
            at += gap;
            clock.output(at, 1, false, OutputKind::Content);
        }
        clock.usage(None, Some(1000));
        let t = clock.timings(at);
        let counted: u64 = t.deferred_itl.iter().map(|s| s.count).sum();
        assert_eq!(counted, 999);
        let sum: u128 = t
            .deferred_itl
            .iter()
            .map(|s| s.per_token.as_nanos() * u128::from(s.count))
            .sum();
        let span = (gap * 999).as_nanos();
        assert!(sum.abs_diff(span) <= 500, "sum {sum} ns, span {span} ns");
    }

    #[test]
    fn a_huge_reported_n_costs_nothing_per_token() {
        let (mut clock, _, end) = timeline(1, &[(1000, 1, false)]);
        clock.usage(None, Some(1 << 40));
        let t = clock.timings(end);
        assert_eq!(t.deferred_itl.len(), 1);
        assert_eq!(t.deferred_itl[0].count, (1 << 40) - 1);
    }

    #[test]
    fn trailing_tokens_belong_to_the_last_event_and_a_first_zero_is_one_token() {
        // A tokenizer settled nothing of the first delta, 0 of the second (merged into
        // the third), and 2 more of the last text only at the end.
        let (mut clock, _, end) = timeline(0, &[(10, 0, false), (30, 2, false)]);
        clock.trailing_tokens(2);
        let t = clock.timings(end);
        assert_eq!(t.estimated_event_tokens, 4, "the counts as settled");
        assert_eq!(t.deferred_itl, vec![share(10, 4)]);
        // With N, k_1 counts as 1: N - 1 observations.
        let (mut clock, _, end) = timeline(0, &[(10, 0, false), (30, 2, false)]);
        clock.trailing_tokens(2);
        clock.usage(None, Some(5));
        let t = clock.timings(end);
        assert_eq!(t.deferred_itl, vec![share(10, 4)]);
        assert_eq!(t.decode.map(|d| d.tpot), Some(ms(10)));
        // After a single event they are the first event's.
        let (mut clock, _, end) = timeline(1, &[]);
        clock.trailing_tokens(3);
        assert_eq!(clock.timings(end).estimated_event_tokens, 4);
    }
}
