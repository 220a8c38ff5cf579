//! How many tokens one token-bearing event carried, and whether that count is exact.
//!
//! docs/ARCHITECTURE.md ("Measurement semantics"): `k_i` is exact where the format says so,
//! otherwise estimated from the text. Dialects have two exact sources besides
//! one-token-per-event formats: a per-token list in the event (logprobs entries, Gemini's chosen candidates),
//! and a cumulative output count reported on every event (vLLM/SGLang continuous usage,
//! Gemini's `usageMetadata`), whose growth since the previous report is the event's count.
//! [`Tally`] applies those rules the same way for every dialect. Without either, the
//! estimate is the event text's shape ([`super::text_estimate`], at least 1), or what the
//! text settled in the response's incremental tokenizer count ([`super::token_stream`];
//! possibly 0, the rest counted at the end for the last event).

use super::types::{OutputKind, Signal};

/// Per-stream state for turning cumulative output reports into per-event counts.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// The last cumulative output count reported, if any.
    reported: Option<u64>,
    /// Whether a token-bearing event was seen.
    started: bool,
}

impl Tally {
    /// The [`Signal::Output`] for a token-bearing event of `kind` that listed `entries`
    /// tokens (0 when the format lists none) and reported a cumulative output count of
    /// `now` (including this event's tokens). Records `now` as the latest report.
    ///
    /// `entries > 0` is exact. Else the growth of `now` over the previous report is exact;
    /// before the first token-bearing event nothing was generated, so zero is a known
    /// baseline there (a later event needs an earlier report). Else `estimate()` (the
    /// configured tokenizer's count of the event's text or its text-shape guess, called
    /// only here), else one; either is estimated.
    pub(crate) fn output(
        &mut self,
        kind: OutputKind,
        entries: u64,
        now: Option<u64>,
        estimate: impl FnOnce() -> Option<u64>,
    ) -> Signal {
        let baseline = self.reported.or((!self.started).then_some(0));
        let (tokens, exact) = if entries > 0 {
            (entries, true)
        } else {
            match (now, baseline) {
                (Some(now), Some(before)) if now > before => (now.saturating_sub(before), true),
                _ => (estimate().unwrap_or(1), false),
            }
        };
        self.started = true;
        self.report(now);
        Signal::Output {
            tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            exact,
            kind,
        }
    }

    /// An event without output reported a cumulative output count of `now`.
    pub(crate) fn report(&mut self, now: Option<u64>) {
        if now.is_some() {
            self.reported = now;
        }
    }
}

/// Rank for picking one kind per event: Content > Refusal > ToolCall > Reasoning.
pub(crate) const fn visibility(kind: OutputKind) -> u8 {
    match kind {
        OutputKind::Content => 3,
        OutputKind::Refusal => 2,
        OutputKind::ToolCall => 1,
        OutputKind::Reasoning => 0,
    }
}

/// The more visible of two kinds (one event gives one [`Signal::Output`]).
pub(crate) fn most_visible(a: Option<OutputKind>, b: Option<OutputKind>) -> Option<OutputKind> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if visibility(b) > visibility(a) { b } else { a }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OutputKind::Content;

    fn out(tokens: u32, exact: bool) -> Signal {
        Signal::Output {
            tokens,
            exact,
            kind: Content,
        }
    }

    #[test]
    fn entries_then_growth_then_estimate() {
        let mut t = Tally::default();
        assert_eq!(t.output(Content, 0, Some(3), || None), out(3, true)); // from zero
        assert_eq!(t.output(Content, 2, Some(9), || None), out(2, true)); // entries win
        assert_eq!(t.output(Content, 0, Some(9), || None), out(1, false)); // no growth
        assert_eq!(t.output(Content, 0, None, || None), out(1, false));
        assert_eq!(t.output(Content, 0, Some(12), || None), out(3, true)); // since last report
    }

    #[test]
    fn estimate_only_replaces_the_one_token_guess() {
        let mut t = Tally::default();
        let mut calls = 0;
        let mut guess = || {
            calls += 1;
            Some(4)
        };
        assert_eq!(t.output(Content, 0, None, &mut guess), out(4, false));
        assert_eq!(t.output(Content, 2, None, &mut guess), out(2, true));
        assert_eq!(t.output(Content, 0, None, || None), out(1, false));
        let mut t = Tally::default();
        assert_eq!(t.output(Content, 0, Some(3), &mut guess), out(3, true));
        assert_eq!(
            calls, 1,
            "the estimate is asked for only when nothing exact exists"
        );
    }

    #[test]
    fn unknown_baseline_after_the_first_event() {
        let mut t = Tally::default();
        assert_eq!(t.output(Content, 0, None, || None), out(1, false));
        assert_eq!(t.output(Content, 0, Some(7), || None), out(1, false));
        // A report without output sets the baseline for the next event.
        let mut t = Tally::default();
        t.report(Some(4));
        assert_eq!(t.output(Content, 0, Some(6), || None), out(2, true));
    }

    #[test]
    fn kinds() {
        use OutputKind::*;
        assert_eq!(
            most_visible(Some(Reasoning), Some(ToolCall)),
            Some(ToolCall)
        );
        assert_eq!(most_visible(Some(Content), Some(Refusal)), Some(Content));
        assert_eq!(most_visible(None, Some(Reasoning)), Some(Reasoning));
        assert_eq!(most_visible(None, None), None);
    }
}
