//! Whether a response arrived in one burst: a buffering hop between tokentap and the engine
//! (nginx with `proxy_buffering on`, a gateway that collects the body, an engine with
//! streaming off behind a shim) turns a stream into one write, and its inter-token gaps
//! then measure the hop's copy, not the engine's decoding.
//!
//! The rule (docs/METRICS.md, "Buffered responses"): a response is buffered when it has at
//! least [`DECIDING_GAPS`] gaps between token-bearing events and every one of them, to its
//! end, is shorter than [`TOGETHER`] (or the first [`MAX_HELD`] are). An engine that
//! streams spends a decode step on each event, so its gaps are milliseconds; events copied
//! out of one buffer arrive microseconds apart. A burst at the start followed by paced
//! events (an engine's event loop that stalled, then caught up) is a stream.
//!
//! While every gap so far is that short, the gaps' ITL and inter-chunk observations are
//! held here (the first [`DECIDING_GAPS`] in place, then up to [`MAX_HELD`] in a vector);
//! the first longer gap releases them in order and the stream is observed live from then
//! on, so a stream that streams is delayed by nothing. A buffered response's gaps are never
//! observed: its ITL, inter-chunk gaps and TPOT would pass for fast decoding. A response
//! with fewer gaps is too short to tell, and its held gaps are observed at its end.
//!
//! Per event this costs one comparison while undecided and one branch after.

use std::time::Duration;

use crate::clock::ItlShare;

/// Two token-bearing events this close arrived together (one read, or one burst of reads).
pub const TOGETHER: Duration = Duration::from_millis(1);
/// The fewest gaps a buffered response has: a shorter one is too short to tell.
pub const DECIDING_GAPS: usize = 8;
/// Gaps held at most: this many in a row, all shorter than [`TOGETHER`], are a burst
/// whatever follows (an engine's stall long enough to catch up this many events is a
/// second or more).
pub const MAX_HELD: usize = 256;

/// One gap's observations: the inter-chunk gap and its ITL share, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub gap: Duration,
    pub itl: Option<ItlShare>,
}

/// A held gap, in nanoseconds: every held gap is under [`TOGETHER`], so each part fits.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    gap_ns: u32,
    per_token_ns: u32,
    /// 0: no ITL share.
    count: u32,
}

impl Held {
    /// `None` when a part does not fit (an ITL share of more tokens than a `u32`): such a
    /// gap decides the stream is not a burst rather than be held.
    fn of(gap: Gap) -> Option<Held> {
        let nanos = |d: Duration| u32::try_from(d.as_nanos()).ok();
        let (per_token_ns, count) = match gap.itl {
            Some(share) => (nanos(share.per_token)?, u32::try_from(share.count).ok()?),
            None => (0, 0),
        };
        Some(Held {
            gap_ns: nanos(gap.gap)?,
            per_token_ns,
            count,
        })
    }

    fn gap(self) -> Gap {
        Gap {
            gap: Duration::from_nanos(u64::from(self.gap_ns)),
            itl: (self.count > 0).then(|| ItlShare {
                per_token: Duration::from_nanos(u64::from(self.per_token_ns)),
                count: u64::from(self.count),
            }),
        }
    }
}

/// The detector of one response.
#[derive(Clone, Debug, Default)]
pub struct Burst(State);

/// Where the detector stands.
#[derive(Clone, Debug)]
enum State {
    /// Every gap so far (`len` of them, held) was shorter than [`TOGETHER`].
    Undecided {
        held: [Held; DECIDING_GAPS],
        len: u8,
    },
    /// More than [`DECIDING_GAPS`] gaps, every one shorter than [`TOGETHER`], all held: a
    /// burst, unless a longer gap comes before the end.
    Suspect(Vec<Held>),
    /// A gap was long enough: the response streams, observed live.
    Streaming,
    /// Every gap to the end, or the first [`MAX_HELD`], came together.
    Buffered,
}

impl Default for State {
    fn default() -> State {
        State::Undecided {
            held: [Held::default(); DECIDING_GAPS],
            len: 0,
        }
    }
}

impl Burst {
    /// The next event's `gap`: calls `observe` with each gap to observe now, in order (the
    /// held ones first when this gap decides the stream streams).
    // Once per token event, from `Recorder::apply`. Inlined always: which of the crate's
    // codegen units a function lands in moves as modules are added, and when the split of
    // `metrics` moved it, this was left out of line: ~25 instructions more per event
    // (scripts/budget.sh, issue 34).
    #[inline(always)]
    pub fn see(&mut self, gap: Gap, mut observe: impl FnMut(Gap)) {
        let together = gap.gap < TOGETHER;
        match &mut self.0 {
            State::Streaming => observe(gap),
            State::Buffered => {}
            State::Undecided { held, len } => {
                let h = Held::of(gap).filter(|_| together);
                match (h, held.get_mut(usize::from(*len))) {
                    (Some(h), Some(slot)) => {
                        *slot = h;
                        *len = len.saturating_add(1);
                    }
                    (Some(h), None) => {
                        let mut all = Vec::with_capacity(2 * DECIDING_GAPS);
                        all.extend_from_slice(held);
                        all.push(h);
                        self.0 = State::Suspect(all);
                    }
                    (None, _) => {
                        release(held.iter().take(usize::from(*len)), &mut observe);
                        observe(gap);
                        self.0 = State::Streaming;
                    }
                }
            }
            State::Suspect(held) => match Held::of(gap).filter(|_| together) {
                Some(_) if held.len() >= MAX_HELD => self.0 = State::Buffered,
                Some(h) => held.push(h),
                None => {
                    release(held.iter(), &mut observe);
                    observe(gap);
                    self.0 = State::Streaming;
                }
            },
        }
    }

    /// The response ended: whether it was buffered. A response too short to tell has its
    /// held gaps observed now.
    pub fn end(&mut self, mut observe: impl FnMut(Gap)) -> bool {
        let buffered = match &self.0 {
            State::Buffered | State::Suspect(_) => true,
            State::Streaming => false,
            State::Undecided { len, .. } if usize::from(*len) >= DECIDING_GAPS => true,
            State::Undecided { held, len } => {
                release(held.iter().take(usize::from(*len)), &mut observe);
                false
            }
        };
        self.0 = if buffered {
            State::Buffered
        } else {
            State::Streaming
        };
        buffered
    }
}

fn release<'a>(held: impl Iterator<Item = &'a Held>, observe: &mut impl FnMut(Gap)) {
    for h in held {
        observe(h.gap());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gap(micros: u64) -> Gap {
        Gap {
            gap: Duration::from_micros(micros),
            itl: Some(ItlShare {
                per_token: Duration::from_micros(micros),
                count: 1,
            }),
        }
    }

    /// Feeds `gaps` (microseconds), returns what was observed and whether it ended buffered.
    fn run(gaps: &[u64]) -> (Vec<u64>, bool) {
        let mut burst = Burst::default();
        let mut seen = Vec::new();
        for &g in gaps {
            burst.see(gap(g), |o| seen.push(o.gap.as_micros() as u64));
        }
        let buffered = burst.end(|o| seen.push(o.gap.as_micros() as u64));
        (seen, buffered)
    }

    #[test]
    fn a_response_whose_gaps_are_all_together_is_a_burst_and_none_is_observed() {
        let (seen, buffered) = run(&[10, 0, 5, 999, 0, 0, 1, 2]);
        assert!(buffered);
        assert!(seen.is_empty(), "{seen:?}");
        let (seen, buffered) = run(&[3; 100]);
        assert!(buffered);
        assert!(seen.is_empty(), "{seen:?}");
    }

    #[test]
    fn a_burst_at_the_start_then_paced_events_is_a_stream_observed_in_order() {
        let mut gaps = vec![0; 20];
        gaps.extend([4_000, 4_000]);
        let (seen, buffered) = run(&gaps);
        assert!(!buffered);
        assert_eq!(seen, gaps);
    }

    #[test]
    fn so_many_gaps_together_are_a_burst_whatever_follows() {
        let mut gaps = vec![0; MAX_HELD + 1];
        gaps.push(50_000);
        let (seen, buffered) = run(&gaps);
        assert!(buffered);
        assert!(seen.is_empty());
    }

    #[test]
    fn a_longer_gap_releases_the_held_ones_in_order_and_streams_from_then_on() {
        let (seen, buffered) = run(&[10, 0, 1_000, 3, 4]);
        assert!(!buffered);
        assert_eq!(seen, [10, 0, 1_000, 3, 4]);
        // A stream whose first gap is a decode step is observed live from the start.
        let mut burst = Burst::default();
        let mut seen = Vec::new();
        burst.see(gap(2_000), |o| seen.push(o.gap));
        assert_eq!(seen.len(), 1, "observed at once, not held");
    }

    #[test]
    fn a_response_too_short_to_tell_is_observed_at_its_end() {
        let (seen, buffered) = run(&[0, 0, 0, 0, 0, 0, 0]);
        assert!(!buffered);
        assert_eq!(seen, [0; 7]);
        assert_eq!(run(&[]), (vec![], false));
    }

    #[test]
    fn a_share_too_large_to_hold_decides_streaming() {
        let mut burst = Burst::default();
        let mut seen = 0;
        let huge = Gap {
            gap: Duration::from_micros(1),
            itl: Some(ItlShare {
                per_token: Duration::from_nanos(1),
                count: u64::MAX,
            }),
        };
        burst.see(gap(1), |_| seen += 1);
        burst.see(huge, |_| seen += 1);
        assert_eq!(seen, 2);
        assert!(matches!(burst.0, State::Streaming));
    }
}
