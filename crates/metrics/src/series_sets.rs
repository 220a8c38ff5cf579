//! Which series a request's labels lead to: its `model` and `tenant` values through the
//! label policies and the pair cap ([`Metrics::stream`]), to the sets of its pair, its
//! model and its GenAI attributes, each created on first use and listed, in label order,
//! once per scrape.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLockReadGuard};

use super::exposition::{Level, Pairs};
use super::gen_ai::GenAiKey;
use super::series::{self, GenAiSeries, SeriesSet, Slot, StreamSeries};
use super::{labels, Labels, Metrics, Sets};

impl Metrics {
    /// The series of one request, resolved through the label policies: the handles its
    /// per-event path observes through, its (model, tenant) pair's set and its model's.
    /// Both exist from here on (TTFB, TTFT, ITL, inter-chunk and stalls series even if
    /// never observed).
    pub fn stream(&self, model: Option<&str>, tenant: Option<&str>) -> StreamSeries {
        let model = self.models.resolve(model);
        let tenant = self.tenants.resolve(tenant);
        self.pair(model, tenant)
    }

    /// The `model` label of a request's model, through the label policy, as
    /// [`Metrics::stream`] resolves it: for a caller that needs the label before the
    /// series (the live view's list of requests in flight). Resolving counts an overflow,
    /// so a label resolved here goes to [`Metrics::stream_of`], not through `stream` again.
    pub fn model_label(&self, model: Option<&str>) -> Arc<str> {
        self.models.resolve(model)
    }

    /// [`Metrics::model_label`] of a `model` too long to be read: `other`, counted in
    /// `tokentap_label_overflow_total{label="model"}`.
    pub fn model_label_too_long(&self) -> Arc<str> {
        self.models.resolve_too_long()
    }

    /// The `tenant` label of a request's tenant, as [`Metrics::model_label`] for models.
    pub fn tenant_label(&self, tenant: Option<&str>) -> Arc<str> {
        self.tenants.resolve(tenant)
    }

    /// [`Metrics::stream`] of labels already resolved ([`Metrics::model_label`],
    /// [`Metrics::tenant_label`]).
    pub fn stream_of(&self, model: Arc<str>, tenant: Arc<str>) -> StreamSeries {
        self.pair(model, tenant)
    }

    /// The sets of a pair of (already resolved) label values, created on first use. The
    /// pair cap bounds the pairs only: a pair past it is (`other`, `other`), while the
    /// per-model families keep the request's model (the model cap bounds those).
    pub(super) fn pair(&self, model: Arc<str>, tenant: Arc<str>) -> StreamSeries {
        {
            let sets = self.read_sets();
            let pair = sets.pairs.get(&*model).and_then(|t| t.get(&*tenant));
            if let (Some(pair), Some(of_model)) = (pair, sets.models.get(&*model)) {
                return StreamSeries {
                    pair: pair.clone(),
                    model: of_model.clone(),
                    gen_ai: None,
                };
            }
        }
        let mut sets = self
            .sets
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Sets { pairs, models, .. } = &mut *sets;
        let of_model = models
            .entry(model.clone())
            .or_insert_with(|| {
                Arc::new(SeriesSet::new(
                    model.clone(),
                    None,
                    &self.bounds,
                    self.tenant_slots,
                ))
            })
            .clone();
        if let Some(pair) = pairs.get(&*model).and_then(|t| t.get(&*tenant)) {
            return StreamSeries {
                pair: pair.clone(),
                model: of_model,
                gen_ai: None,
            };
        }
        let (model, tenant) = if self.pair_cap.admit() {
            (model, tenant)
        } else {
            (Arc::from(labels::OTHER), Arc::from(labels::OTHER))
        };
        let pair = pairs
            .entry(model.clone())
            .or_default()
            .entry(tenant.clone())
            .or_insert_with(|| {
                Arc::new(SeriesSet::new(
                    model,
                    Some(tenant),
                    &self.bounds,
                    self.tenant_slots,
                ))
            })
            .clone();
        StreamSeries {
            pair,
            model: of_model,
            gen_ai: None,
        }
    }

    /// Give `stream` its GenAI sets for requests of `operation` to `provider` (names
    /// from `wire::gen_ai`), when `metrics.names` exposes the GenAI families; `streaming`:
    /// the request asked for a stream (or did not say). The model is the request's
    /// per-model label (the pair cap does not fold it).
    pub fn attach_gen_ai(
        &self,
        stream: &mut StreamSeries,
        operation: &'static str,
        provider: &'static str,
        streaming: bool,
    ) {
        if !self.names.gen_ai() {
            return;
        }
        let key = |token_type| GenAiKey {
            error_type: None,
            operation,
            provider,
            model: stream.model.model.clone(),
            token_type,
        };
        stream.gen_ai = Some(GenAiSeries {
            ok: self.gen_ai_set(key(None), series::OK_SLOTS),
            input: self.gen_ai_set(key(Some("input")), series::TOKEN_SLOTS),
            output: self.gen_ai_set(key(Some("output")), series::TOKEN_SLOTS),
            streaming,
        });
    }

    /// The GenAI set of `key`, created (with the storage of `slots`) on first use.
    pub(super) fn gen_ai_set(&self, key: GenAiKey, slots: &[Slot]) -> Arc<SeriesSet> {
        if let Some(set) = self.read_sets().gen_ai.get(&key) {
            return set.clone();
        }
        let mut sets = self
            .sets
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        sets.gen_ai
            .entry(key.clone())
            .or_insert_with(|| Arc::new(SeriesSet::gen_ai(key, slots, &self.bounds)))
            .clone()
    }

    pub(super) fn read_sets(&self) -> RwLockReadGuard<'_, Sets> {
        self.sets
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every set, in label order, taken under the lock once per scrape; the encoding
    /// then runs without it.
    pub(super) fn pairs(&self) -> Pairs {
        let sets = self.read_sets();
        let mut series = Vec::with_capacity(sets.pairs.values().map(BTreeMap::len).sum());
        let mut models = Vec::with_capacity(sets.pairs.len());
        for tenants in sets.pairs.values() {
            let start = series.len();
            series.extend(tenants.values().cloned());
            models.push(start..series.len());
        }
        let pairs = Level { series, models };
        let one_each = |series: Vec<Arc<SeriesSet>>| {
            let models = (0..series.len()).map(|i| i..i + 1).collect();
            Level { series, models }
        };
        Pairs {
            pairs,
            models: one_each(sets.models.values().cloned().collect()),
            gen_ai: one_each(sets.gen_ai.values().cloned().collect()),
        }
    }

    /// Apply new label policies (config reload). Which families carry `tenant` is fixed
    /// when the families are built: `labels.tenant.families` takes effect at a restart.
    pub fn set_label_policies(&self, labels: &Labels) {
        self.models.set_policy(labels.model.clone());
        self.tenants.set_policy(labels.tenant.clone());
        self.pair_cap.set_max(labels.max_pairs);
    }

    /// Distinct `model` and `tenant` values admitted so far.
    pub fn admitted_labels(&self) -> (usize, usize) {
        (self.models.admitted(), self.tenants.admitted())
    }
}
