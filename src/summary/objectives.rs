//! Per-request objectives (`objectives` in the config): each finished request is judged
//! once against each objective, met or missed, as a whole, the way a tenant's contract is
//! written ("95% of chat requests start within 500 ms and stream at 20 tokens/s").
//!
//! The measures follow DistServe's goodput and the benchmark tools that report it (vLLM's
//! and SGLang's `--goodput`, AIPerf, guidellm): TTFT, and TPOT as
//! `(duration - TTFT) / (output tokens - 1)` (tokentap's `tokentap_time_per_output_token_seconds`,
//! which AIPerf calls the request's inter-token latency). tokentap adds the largest gap
//! between token-bearing events (a stall that a mean hides) and the whole duration.
//! docs/METRICS.md ("Objectives and goodput") gives the rules and where the tools differ.

use std::sync::Arc;
use std::time::Duration;

use crate::outcome::Outcome;

/// The bounds of an objective: a request meets it when each bound that is set holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    /// Time to first token.
    pub ttft: Option<Duration>,
    /// Time per output token after the first.
    pub tpot: Option<Duration>,
    /// The largest gap between two token-bearing events.
    pub max_gap: Option<Duration>,
    /// From the request head to the end of the response.
    pub duration: Option<Duration>,
}

impl Bounds {
    /// These bounds with each one `other` sets replaced.
    fn overridden_by(self, other: Bounds) -> Bounds {
        Bounds {
            ttft: other.ttft.or(self.ttft),
            tpot: other.tpot.or(self.tpot),
            max_gap: other.max_gap.or(self.max_gap),
            duration: other.duration.or(self.duration),
        }
    }
}

/// Bounds for the requests of one `model` and/or `tenant` label value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    pub model: Option<String>,
    pub tenant: Option<String>,
    pub bounds: Bounds,
}

impl Override {
    fn applies(&self, model: &str, tenant: &str) -> bool {
        self.model.as_deref().is_none_or(|m| m == model)
            && self.tenant.as_deref().is_none_or(|t| t == tenant)
    }

    /// The more specific wins: a model and a tenant, then a tenant, then a model.
    fn rank(&self) -> u8 {
        match (&self.model, &self.tenant) {
            (Some(_), Some(_)) => 3,
            (None, Some(_)) => 2,
            (Some(_), None) => 1,
            (None, None) => 0,
        }
    }
}

/// One named objective.
#[derive(Clone, Debug, PartialEq)]
pub struct Objective {
    /// The `objective` label value.
    pub name: String,
    pub bounds: Bounds,
    /// Overrides by label value, most specific first.
    pub overrides: Vec<Override>,
    /// The share of judged requests meant to meet it: `tokentap_objective_target`, which
    /// the attainment alert compares against.
    pub target: f64,
}

impl Objective {
    pub fn new(name: String, bounds: Bounds, mut overrides: Vec<Override>, target: f64) -> Self {
        overrides.sort_by_key(|o| std::cmp::Reverse(o.rank()));
        Objective {
            name,
            bounds,
            overrides,
            target,
        }
    }

    /// The bounds for a request counted under `model` and `tenant`.
    pub fn bounds_for(&self, model: &str, tenant: &str) -> Bounds {
        match self.overrides.iter().find(|o| o.applies(model, tenant)) {
            Some(o) => self.bounds.overridden_by(o.bounds),
            None => self.bounds,
        }
    }

    /// Whether a request counted under `model` and `tenant` that ended as `outcome`
    /// with `measures` met this objective; `None` when it is not judged.
    pub fn judge(
        &self,
        model: &str,
        tenant: &str,
        outcome: Outcome,
        measures: &Measures,
    ) -> Option<bool> {
        judge(self.bounds_for(model, tenant), outcome, measures)
    }
}

/// The objectives in force, in name order.
pub type Objectives = Arc<[Objective]>;

/// Each objective's name and target: what `tokentap_objective_target` exports.
pub fn targets(objectives: Option<&Objectives>) -> impl Iterator<Item = (&str, f64)> {
    objectives
        .into_iter()
        .flat_map(|o| o.iter())
        .map(|o| (o.name.as_str(), o.target))
}

/// What a request's judgement reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measures {
    pub duration: Duration,
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub slowest_gap: Option<Duration>,
}

/// The rule (docs/METRICS.md, "Objectives and goodput"):
///
/// - a completed request meets the objective when every bound holds; a bound on a measure
///   the request does not have (TPOT of a one-token answer, TTFT of an empty one) holds,
///   as in vLLM's benchmark;
/// - a request the client cancelled is a miss when a bound was already broken when it
///   left (it waited past the TTFT bound with no token, say), and is not judged
///   otherwise: leaving says nothing of the service;
/// - the client's own error is not judged: the service was not asked;
/// - every other end (an upstream error or refusal, a timeout, tokentap's overload
///   refusal) is a miss.
pub fn judge(bounds: Bounds, outcome: Outcome, measures: &Measures) -> Option<bool> {
    let over = |bound: Option<Duration>, value: Option<Duration>| {
        bound.zip(value).is_some_and(|(bound, value)| value > bound)
    };
    let broken = over(bounds.ttft, measures.ttft)
        || over(bounds.tpot, measures.tpot)
        || over(bounds.max_gap, measures.slowest_gap)
        || over(bounds.duration, Some(measures.duration));
    match outcome {
        Outcome::Completed => Some(!broken),
        Outcome::Cancelled => {
            // Waiting with no token yet: the TTFT bound is broken once the wait passes it.
            let waited_out = measures.ttft.is_none() && over(bounds.ttft, Some(measures.duration));
            (broken || waited_out).then_some(false)
        }
        Outcome::ClientError => None,
        Outcome::UpstreamError
        | Outcome::UpstreamRefused
        | Outcome::Timeout
        | Outcome::Overloaded => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn measures(duration: u64, ttft: Option<u64>, tpot: Option<u64>, gap: Option<u64>) -> Measures {
        Measures {
            duration: ms(duration),
            ttft: ttft.map(ms),
            tpot: tpot.map(ms),
            slowest_gap: gap.map(ms),
        }
    }

    const CHAT: Bounds = Bounds {
        ttft: Some(Duration::from_millis(500)),
        tpot: Some(Duration::from_millis(50)),
        max_gap: None,
        duration: None,
    };

    #[test]
    fn a_completed_request_meets_it_when_every_bound_holds() {
        let judged = |m: Measures| judge(CHAT, Outcome::Completed, &m);
        assert_eq!(
            judged(measures(900, Some(500), Some(50), Some(80))),
            Some(true),
            "bounds are inclusive"
        );
        assert_eq!(
            judged(measures(900, Some(501), Some(10), None)),
            Some(false)
        );
        assert_eq!(
            judged(measures(900, Some(100), Some(51), None)),
            Some(false)
        );
        // A one-token answer has no TPOT, an empty one no TTFT: those bounds hold.
        assert_eq!(judged(measures(900, Some(100), None, None)), Some(true));
        assert_eq!(judged(measures(900, None, None, None)), Some(true));
        let gap = Bounds {
            max_gap: Some(ms(200)),
            duration: Some(ms(1000)),
            ..Bounds::default()
        };
        assert_eq!(
            judge(
                gap,
                Outcome::Completed,
                &measures(900, Some(1), None, Some(201))
            ),
            Some(false)
        );
        assert_eq!(
            judge(
                gap,
                Outcome::Completed,
                &measures(1001, Some(1), None, Some(10))
            ),
            Some(false)
        );
        assert_eq!(
            judge(
                gap,
                Outcome::Completed,
                &measures(1000, Some(1), None, Some(200))
            ),
            Some(true)
        );
    }

    #[test]
    fn a_cancel_is_a_miss_only_once_a_bound_was_broken() {
        let judged = |m: Measures| judge(CHAT, Outcome::Cancelled, &m);
        assert_eq!(
            judged(measures(300, None, None, None)),
            None,
            "left early: not judged"
        );
        assert_eq!(
            judged(measures(501, None, None, None)),
            Some(false),
            "waited past the TTFT bound"
        );
        assert_eq!(judged(measures(2000, Some(600), None, None)), Some(false));
        assert_eq!(judged(measures(2000, Some(100), Some(20), None)), None);
        assert_eq!(
            judged(measures(2000, Some(100), Some(60), None)),
            Some(false)
        );
    }

    #[test]
    fn failures_are_misses_and_the_clients_own_error_is_not_judged() {
        let fast = measures(10, Some(1), Some(1), None);
        for outcome in Outcome::ALL {
            let expected = match outcome {
                Outcome::Completed => Some(true),
                Outcome::Cancelled | Outcome::ClientError => None,
                _ => Some(false),
            };
            assert_eq!(judge(CHAT, outcome, &fast), expected, "{outcome:?}");
        }
    }

    #[test]
    fn the_most_specific_override_wins_bound_by_bound() {
        let o = |model: Option<&str>, tenant: Option<&str>, ttft: u64| Override {
            model: model.map(Into::into),
            tenant: tenant.map(Into::into),
            bounds: Bounds {
                ttft: Some(ms(ttft)),
                ..Bounds::default()
            },
        };
        let objective = Objective::new(
            "chat".into(),
            CHAT,
            vec![
                o(Some("m"), None, 800),
                o(None, Some("acme"), 300),
                o(Some("m"), Some("acme"), 200),
            ],
            0.95,
        );
        assert_eq!(objective.bounds_for("x", "y"), CHAT);
        assert_eq!(objective.bounds_for("m", "y").ttft, Some(ms(800)));
        assert_eq!(objective.bounds_for("x", "acme").ttft, Some(ms(300)));
        let both = objective.bounds_for("m", "acme");
        assert_eq!(both.ttft, Some(ms(200)));
        assert_eq!(
            both.tpot, CHAT.tpot,
            "a bound the override leaves is the objective's"
        );
    }
}
