//! `objectives`: validated into the judge's own types (`summary::objectives`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::raw::{RawObjective, RawObjectiveOverride, RawObjectives};
use super::units::HumanDuration;
use super::validate::Issues;
use crate::summary::objectives::{Bounds, Objective, Objectives, Override};

/// Objectives a config may name: each costs series per (model, tenant) pair.
pub const MAX_OBJECTIVES: usize = 8;
/// Characters of an objective's name (its label value).
pub const MAX_NAME_CHARS: usize = 32;
/// Overrides of one objective.
pub const MAX_OVERRIDES: usize = 100;
/// The attainment target of an objective that names none.
pub const DEFAULT_TARGET: f64 = 0.95;

impl RawObjectives {
    /// The objectives, or `None` when there are none (they then cost nothing).
    pub(super) fn validate(self, issues: &mut Issues<'_>) -> Option<Objectives> {
        validate(issues, self.0)
    }
}

fn validate(issues: &mut Issues<'_>, raw: BTreeMap<String, RawObjective>) -> Option<Objectives> {
    if raw.len() > MAX_OBJECTIVES {
        issues.push(
            "objectives",
            format!(
                "{} objectives; at most {MAX_OBJECTIVES} (each adds series per model and tenant)",
                raw.len()
            ),
        );
    }
    let objectives: Vec<Objective> = raw
        .into_iter()
        .filter_map(|(name, raw)| objective(issues, name, raw))
        .collect();
    (!objectives.is_empty()).then(|| Arc::from(objectives))
}

fn objective(issues: &mut Issues<'_>, name: String, raw: RawObjective) -> Option<Objective> {
    let path = format!("objectives.{name}");
    let named = is_label_name(&name);
    if !named {
        issues.push(
            &path,
            format!(
                "an objective's name is its label value: lower-case letters, digits and `_`, \
                 starting with a letter, at most {MAX_NAME_CHARS} characters"
            ),
        );
    }
    let bounds = bounds(
        issues,
        &path,
        [raw.ttft, raw.tpot, raw.max_gap, raw.duration],
    );
    let target = raw.target.map_or(DEFAULT_TARGET, |n| n.0);
    if !(target > 0.0 && target <= 1.0) {
        issues.push(
            &format!("{path}.target"),
            format!("{target} is not a share: above 0 and at most 1 (0.95 is 95%)"),
        );
    }
    if raw.overrides.len() > MAX_OVERRIDES {
        issues.push(
            &format!("{path}.overrides"),
            format!("{} overrides; at most {MAX_OVERRIDES}", raw.overrides.len()),
        );
    }
    let mut seen = HashSet::new();
    let mut overrides = Vec::with_capacity(raw.overrides.len());
    for (i, raw) in raw.overrides.into_iter().enumerate() {
        let at = format!("{path}.overrides.{i}");
        if let Some(o) = override_of(issues, &at, raw) {
            if !seen.insert((o.model.clone(), o.tenant.clone())) {
                issues.push(&at, "another override names the same model and tenant");
            }
            overrides.push(o);
        }
    }
    let bounds = bounds.filter(|_| named)?;
    Some(Objective::new(name, bounds, overrides, target))
}

fn override_of(issues: &mut Issues<'_>, at: &str, raw: RawObjectiveOverride) -> Option<Override> {
    if raw.model.is_none() && raw.tenant.is_none() {
        issues.push(at, "an override names a `model`, a `tenant` or both");
        return None;
    }
    let bounds = bounds(issues, at, [raw.ttft, raw.tpot, raw.max_gap, raw.duration])?;
    Some(Override {
        model: raw.model,
        tenant: raw.tenant,
        bounds,
    })
}

/// `ttft`, `tpot`, `max_gap` and `duration` under `path`: at least one, each above 0.
fn bounds(issues: &mut Issues<'_>, path: &str, raw: [Option<HumanDuration>; 4]) -> Option<Bounds> {
    const KEYS: [&str; 4] = ["ttft", "tpot", "max_gap", "duration"];
    if raw.iter().all(Option::is_none) {
        issues.push(
            path,
            "needs at least one bound: `ttft`, `tpot`, `max_gap` or `duration`",
        );
        return None;
    }
    let mut ok = true;
    for (key, value) in KEYS.iter().zip(&raw) {
        if value.is_some_and(|d| d.0.is_zero()) {
            issues.push(&format!("{path}.{key}"), "must be longer than 0");
            ok = false;
        }
    }
    let [ttft, tpot, max_gap, duration] = raw.map(|d| d.map(|d| d.0));
    ok.then_some(Bounds {
        ttft,
        tpot,
        max_gap,
        duration,
    })
}

fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_NAME_CHARS
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
