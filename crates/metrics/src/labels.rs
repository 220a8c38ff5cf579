//! Bounded label values. A client controls what `model` and `tenant` it sends, so every
//! value passes a policy before it can become a Prometheus series: aliases, an optional
//! allowlist, a length bound and a cap on distinct values. Past the cap a value becomes
//! `other`; a missing one is `unknown`. Lookups happen once per request, never per token.
//!
//! Characters that change how text is shown without being seen (bidi controls,
//! zero-width characters) are replaced before anything else, so a value cannot pass for
//! another on a dashboard. Per-label caps still allow their product in pairs, so
//! [`PairCap`] bounds the (model, tenant) pairs themselves.

// The recording path: nothing here may panic on what a request brought (clippy.toml).
#![warn(clippy::indexing_slicing)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use prometheus::IntCounter;

use super::settings::LabelPolicy;

/// The value for a label the request did not carry.
pub const UNKNOWN: &str = "unknown";
/// The value for anything the policy does not keep.
pub const OTHER: &str = "other";

/// What an invisible formatting character in a label value becomes.
pub const REPLACEMENT: char = '\u{FFFD}';

/// Bidi embeddings, overrides and isolates (U+202A-202E, U+2066-2069) and zero-width
/// characters and marks (U+200B-200F, U+FEFF): they reorder or hide text when shown.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// `raw` with every invisible formatting character replaced by [`REPLACEMENT`].
fn visible(raw: &str) -> Cow<'_, str> {
    if raw.chars().any(is_invisible_format) {
        Cow::Owned(
            raw.chars()
                .map(|c| {
                    if is_invisible_format(c) {
                        REPLACEMENT
                    } else {
                        c
                    }
                })
                .collect(),
        )
    } else {
        Cow::Borrowed(raw)
    }
}

/// A bound on distinct (model, tenant) pairs. Past it a new pair is folded into
/// (`other`, `other`) and counted as overflow; pairs that exist keep their series.
pub struct PairCap {
    max: AtomicUsize,
    admitted: AtomicUsize,
    overflow: IntCounter,
}

impl PairCap {
    pub fn new(max: usize, overflow: IntCounter) -> PairCap {
        PairCap {
            max: AtomicUsize::new(max),
            admitted: AtomicUsize::new(0),
            overflow,
        }
    }

    /// Change the bound (on config reload); pairs admitted so far stay.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Whether one more pair may be created; counts it, or the overflow. The caller
    /// holds the lock under which pairs are created, so admissions never race.
    pub fn admit(&self) -> bool {
        if self.admitted.load(Ordering::Relaxed) >= self.max.load(Ordering::Relaxed) {
            self.overflow.inc();
            return false;
        }
        self.admitted.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// The admitted values of one label.
pub struct LabelSet {
    policy: RwLock<Arc<LabelPolicy>>,
    admitted: RwLock<HashMap<Box<str>, Arc<str>>>,
    unknown: Arc<str>,
    other: Arc<str>,
    overflow: IntCounter,
}

impl LabelSet {
    /// `overflow` counts values folded into `other` by the cap, allowlist or length bound.
    pub fn new(policy: LabelPolicy, overflow: IntCounter) -> Self {
        LabelSet {
            policy: RwLock::new(Arc::new(policy)),
            admitted: RwLock::new(HashMap::new()),
            unknown: Arc::from(UNKNOWN),
            other: Arc::from(OTHER),
            overflow,
        }
    }

    /// Replace the policy (on config reload). Values admitted so far stay admitted: their
    /// series exist already, and dropping them would only reset counters.
    pub fn set_policy(&self, policy: LabelPolicy) {
        *self
            .policy
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(policy);
    }

    /// The label value to use for `raw`.
    pub fn resolve(&self, raw: Option<&str>) -> Arc<str> {
        let raw = match raw.map(str::trim) {
            None | Some("") => return self.unknown.clone(),
            Some(v) => visible(v),
        };
        let raw = raw.as_ref();
        let policy = self
            .policy
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let value = policy.aliases.get(raw).map_or(raw, String::as_str);
        if let Some(found) = self.read().get(value) {
            return found.clone();
        }
        if value.len() > policy.max_value_len
            || value.chars().any(char::is_control)
            || policy
                .allow
                .as_ref()
                .is_some_and(|allow| !allow.contains(value))
        {
            self.overflow.inc();
            return self.other.clone();
        }
        let mut admitted = self
            .admitted
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = admitted.get(value) {
            return found.clone();
        }
        if policy.max_values.is_some_and(|max| admitted.len() >= max) {
            self.overflow.inc();
            return self.other.clone();
        }
        let interned: Arc<str> = Arc::from(value);
        admitted.insert(Box::from(value), interned.clone());
        interned
    }

    /// The label value for a value the request carried but that was too long to be read
    /// at all (the request scanner's bound): `other`, counted as overflow like any value
    /// over the length bound.
    pub fn resolve_too_long(&self) -> Arc<str> {
        self.overflow.inc();
        self.other.clone()
    }

    /// How many distinct values have been admitted.
    pub fn admitted(&self) -> usize {
        self.read().len()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Box<str>, Arc<str>>> {
        self.admitted
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn policy(max: Option<usize>) -> LabelPolicy {
        LabelPolicy {
            max_values: max,
            allow: None,
            aliases: HashMap::new(),
            max_value_len: 16,
        }
    }

    fn counter() -> IntCounter {
        IntCounter::new("overflow", "test").expect("valid counter")
    }

    #[test]
    fn missing_and_empty_are_unknown() {
        let set = LabelSet::new(policy(Some(2)), counter());
        assert_eq!(&*set.resolve(None), UNKNOWN);
        assert_eq!(&*set.resolve(Some("  ")), UNKNOWN);
        assert_eq!(set.admitted(), 0);
    }

    #[test]
    fn a_value_too_long_to_read_is_other_and_counted() {
        let overflow = counter();
        let set = LabelSet::new(policy(None), overflow.clone());
        assert_eq!(&*set.resolve_too_long(), OTHER);
        assert_eq!(overflow.get(), 1);
        assert_eq!(set.admitted(), 0);
    }

    #[test]
    fn cap_folds_new_values_into_other_and_counts_them() {
        let overflow = counter();
        let set = LabelSet::new(policy(Some(2)), overflow.clone());
        assert_eq!(&*set.resolve(Some("a")), "a");
        assert_eq!(&*set.resolve(Some("b")), "b");
        assert_eq!(&*set.resolve(Some("c")), OTHER);
        assert_eq!(&*set.resolve(Some("a")), "a", "admitted values stay");
        assert_eq!(&*set.resolve(Some("d")), OTHER);
        assert_eq!(set.admitted(), 2);
        assert_eq!(overflow.get(), 2);
    }

    #[test]
    fn aliases_apply_before_the_cap() {
        let mut p = policy(Some(1));
        p.aliases
            .insert("gpt-4o-2024-08-06".into(), "gpt-4o".into());
        let set = LabelSet::new(p, counter());
        assert_eq!(&*set.resolve(Some("gpt-4o-2024-08-06")), "gpt-4o");
        assert_eq!(&*set.resolve(Some("gpt-4o")), "gpt-4o");
        assert_eq!(set.admitted(), 1);
    }

    #[test]
    fn allowlist_and_length_bound() {
        let mut p = policy(None);
        p.allow = Some(HashSet::from(["llama".to_string()]));
        let set = LabelSet::new(p, counter());
        assert_eq!(&*set.resolve(Some("llama")), "llama");
        assert_eq!(&*set.resolve(Some("mistral")), OTHER);
        let set = LabelSet::new(policy(None), counter());
        assert_eq!(&*set.resolve(Some("a-very-long-model-name")), OTHER);
        assert_eq!(&*set.resolve(Some("bad\nvalue")), OTHER);
    }

    #[test]
    fn bidi_controls_and_zero_width_characters_are_replaced() {
        let mut p = policy(None);
        p.max_value_len = 64;
        let set = LabelSet::new(p, counter());
        let cases = [
            ("gpt\u{202E}4o", "gpt\u{FFFD}4o"),
            ("a\u{2066}b\u{2069}", "a\u{FFFD}b\u{FFFD}"),
            ("\u{200B}team", "\u{FFFD}team"),
            ("te\u{200D}am\u{FEFF}", "te\u{FFFD}am\u{FFFD}"),
            ("left\u{200E}right\u{200F}", "left\u{FFFD}right\u{FFFD}"),
            ("ordinary-ünïcode", "ordinary-ünïcode"),
        ];
        for (raw, shown) in cases {
            assert_eq!(&*set.resolve(Some(raw)), shown, "{raw:?}");
        }
    }

    #[test]
    fn the_pair_cap_admits_up_to_its_bound_and_counts_the_rest() {
        let overflow = counter();
        let cap = PairCap::new(2, overflow.clone());
        assert!(cap.admit());
        assert!(cap.admit());
        assert!(!cap.admit());
        assert!(!cap.admit());
        assert_eq!(overflow.get(), 2);
        cap.set_max(3);
        assert!(cap.admit());
        assert!(!cap.admit());
        assert_eq!(overflow.get(), 3);
    }

    #[test]
    fn unbounded_keeps_everything() {
        let set = LabelSet::new(policy(None), counter());
        for i in 0..5000 {
            set.resolve(Some(&format!("t{i}")));
        }
        assert_eq!(set.admitted(), 5000);
    }
}
