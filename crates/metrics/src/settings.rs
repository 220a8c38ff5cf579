//! The settings the metrics are built with, as plain values: bucket bounds, label
//! policies and native-histogram resolution.
//!
//! They are defined here, beside the code that reads them, so that `metrics` needs
//! nothing from `config`: the config file's `labels` and `metrics` sections are validated
//! into these types (and `config` re-exports them), taking their defaults from the metric
//! contract ([`super::buckets`], [`super::native`], the family table).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::buckets::{
    DURATION_BUCKETS, INTER_CHUNK_BUCKETS, ITL_BUCKETS, LATENCY_BUCKETS, TOKENS_PER_EVENT_BUCKETS,
    TOKENS_PER_SECOND_BUCKETS,
};
use super::native::{schema_for_factor, DEFAULT_FACTOR, DEFAULT_MAX_BUCKETS};

/// Sized for a sidecar: what its engine serves (a few models, LoRA adapters included)
/// times the tenants that call it, with room to spare. Each pair costs 48 series (about
/// 3.8 KB of `/metrics`), so the worst a hostile client can make of the default caps is
/// about 12,000 series (docs/METRICS.md, "Cardinality").
pub const DEFAULT_MAX_PAIRS: usize = 250;
/// `labels.model.max_values`: a model costs 137 series (about 9.7 KB of `/metrics`) with
/// its first pair.
pub const DEFAULT_MODEL_MAX_VALUES: usize = 32;
/// `labels.tenant.max_values`.
pub const DEFAULT_TENANT_MAX_VALUES: usize = 200;
/// `labels.*.max_value_len`.
pub const DEFAULT_MAX_VALUE_LEN: usize = 128;

/// How the `model` and `tenant` labels are bounded (`labels` in the config file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels {
    pub model: LabelPolicy,
    pub tenant: LabelPolicy,
    /// Distinct (model, tenant) pairs kept; a new pair past it becomes (`other`, `other`).
    pub max_pairs: usize,
    /// The families that carry `tenant` (`labels.tenant.families`, names from the metric
    /// table); every other per-pair family is per model. The default is
    /// `Labels::default_tenant_families`, beside the table.
    pub tenant_families: BTreeSet<&'static str>,
}

/// How values of one label are bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelPolicy {
    /// Distinct values kept; later ones become `other`. `None` only by explicit opt-in.
    pub max_values: Option<usize>,
    /// If set, only these values (after aliasing) are kept; all else is `other`.
    pub allow: Option<HashSet<String>>,
    /// Rename values before counting (e.g. dated model snapshots to one name).
    pub aliases: HashMap<String, String>,
    /// Values longer than this become `other`.
    pub max_value_len: usize,
}

impl Default for Labels {
    /// What an unwritten `labels` section means (the config fills in what is written).
    fn default() -> Labels {
        Labels {
            model: LabelPolicy::bounded(DEFAULT_MODEL_MAX_VALUES),
            tenant: LabelPolicy::bounded(DEFAULT_TENANT_MAX_VALUES),
            max_pairs: DEFAULT_MAX_PAIRS,
            tenant_families: Labels::default_tenant_families(),
        }
    }
}

impl LabelPolicy {
    /// At most `max_values` values, no allow list, no aliases, the default length.
    pub fn bounded(max_values: usize) -> LabelPolicy {
        LabelPolicy {
            max_values: Some(max_values),
            allow: None,
            aliases: HashMap::new(),
            max_value_len: DEFAULT_MAX_VALUE_LEN,
        }
    }
}

/// Histogram buckets, per histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    pub time_to_first_byte_seconds: Vec<f64>,
    pub time_to_first_token_seconds: Vec<f64>,
    pub inter_token_latency_seconds: Vec<f64>,
    pub inter_chunk_latency_seconds: Vec<f64>,
    pub time_per_output_token_seconds: Vec<f64>,
    pub output_tokens_per_second: Vec<f64>,
    pub output_tokens_per_event: Vec<f64>,
    pub request_duration_seconds: Vec<f64>,
}

impl Default for Buckets {
    /// What an unwritten `metrics.buckets` means: the contract's bounds
    /// ([`super::buckets`]), on which the dashboards and alert thresholds are drawn.
    fn default() -> Buckets {
        Buckets {
            time_to_first_byte_seconds: LATENCY_BUCKETS.to_vec(),
            time_to_first_token_seconds: LATENCY_BUCKETS.to_vec(),
            inter_token_latency_seconds: ITL_BUCKETS.to_vec(),
            inter_chunk_latency_seconds: INTER_CHUNK_BUCKETS.to_vec(),
            time_per_output_token_seconds: ITL_BUCKETS.to_vec(),
            output_tokens_per_second: TOKENS_PER_SECOND_BUCKETS.to_vec(),
            output_tokens_per_event: TOKENS_PER_EVENT_BUCKETS.to_vec(),
            request_duration_seconds: DURATION_BUCKETS.to_vec(),
        }
    }
}

/// `metrics.native_histograms`: the native buckets kept beside each classic histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct NativeHistograms {
    pub enabled: bool,
    /// Prometheus schema, -4..=8.
    pub schema: i8,
    pub max_buckets: usize,
    /// Classic buckets in the protobuf exposition too.
    pub classic: bool,
}

impl Default for NativeHistograms {
    /// What an unwritten `metrics.native_histograms` means.
    fn default() -> NativeHistograms {
        NativeHistograms {
            enabled: true,
            schema: schema_for_factor(DEFAULT_FACTOR),
            max_buckets: DEFAULT_MAX_BUCKETS,
            classic: true,
        }
    }
}
