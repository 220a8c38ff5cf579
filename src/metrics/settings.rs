//! The settings the metrics are built with, as plain values: bucket bounds, label
//! policies and native-histogram resolution.
//!
//! They are defined here, beside the code that reads them, so that `metrics` needs
//! nothing from `config`: the config file's `labels` and `metrics` sections are validated
//! into these types (and `config` re-exports them), taking their defaults from the metric
//! contract ([`super::buckets`], [`super::native`], the family table).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::native::{schema_for_factor, DEFAULT_FACTOR, DEFAULT_MAX_BUCKETS};

/// How the `model` and `tenant` labels are bounded (`labels` in the config file).
#[derive(Clone, Debug)]
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
