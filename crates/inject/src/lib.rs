//! `tokentap inject`: adding the tokentap sidecar to Kubernetes workloads.
//!
//! - [`pod`] decides what injection means for one pod template: the one place, used by
//!   both ways in.
//! - [`manifests`] is the CLI's way: manifests in (multi-document YAML or JSON, `List`s),
//!   the same manifests out with every workload injected and the Services, routes and
//!   InferencePools in the input moved to tokentap's port.
//! - [`admission`] is the webhook's way: an `admission.k8s.io/v1` AdmissionReview in,
//!   the JSON Patch between the pod and [`pod::inject`]'s result out.
//!
//! The Kubernetes API types (`k8s-openapi`, `kube-core`'s admission types) live here and
//! nowhere in the proxy, so its request path never depends on them. Everything read is
//! hostile: no panic, no unbounded work, every value shown in a message escaped.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod admission;
pub mod manifests;
pub mod pod;
pub mod settings;

pub use settings::Options;
/// The versions of the types this crate answers with, for callers and tests.
pub use {json_patch, k8s_openapi};

/// Why a pod template was not injected. Each has a bounded reason (a metric label).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{workload}: container `{container}` declares no TCP port: set the engine's port with --engine-port or the annotation tokentap.dev/engine-port")]
    NoEnginePort { workload: String, container: String },
    #[error("{workload}: container `{container}` declares several ports ({ports}): say which one is the engine's with --engine-port or the annotation tokentap.dev/engine-port")]
    AmbiguousEnginePort {
        workload: String,
        container: String,
        ports: String,
    },
    #[error("{workload}: cannot tell the engine container: {detail}")]
    NoEngine { workload: String, detail: String },
    #[error("{workload}: {detail}")]
    PortCollision { workload: String, detail: String },
    #[error("{workload}: terminationGracePeriodSeconds {grace} leaves no time for tokentap's preStop and drain: raise it to at least {needed}")]
    GraceTooShort {
        workload: String,
        grace: i64,
        needed: i64,
    },
    #[error("{workload}: a container named `tokentap` is already there and was not injected (no tokentap.dev/settings-hash annotation): remove it, or leave this workload out")]
    AlreadyHasTokentap { workload: String },
    #[error("{workload}{}annotation or flag {key}: {reason}", if workload.is_empty() { "" } else { ": " })]
    Annotation {
        workload: String,
        key: String,
        reason: String,
    },
    #[error("{workload}: hostNetwork pods are not injected: tokentap's ports would be the node's")]
    HostNetwork { workload: String },
    #[error("{what}")]
    Malformed { what: String },
}

impl Refusal {
    /// A bounded name for the metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoEnginePort { .. } => "no_engine_port",
            Refusal::AmbiguousEnginePort { .. } => "ambiguous_engine_port",
            Refusal::NoEngine { .. } => "no_engine_container",
            Refusal::PortCollision { .. } => "port_collision",
            Refusal::GraceTooShort { .. } => "grace_too_short",
            Refusal::AlreadyHasTokentap { .. } => "tokentap_present",
            Refusal::Annotation { .. } => "invalid_setting",
            Refusal::HostNetwork { .. } => "host_network",
            Refusal::Malformed { .. } => "malformed",
        }
    }

    /// Name the workload in a settings error.
    pub fn at(self, at: &str) -> Refusal {
        match self {
            Refusal::Annotation { key, reason, .. } => Refusal::Annotation {
                workload: at.to_string(),
                key,
                reason,
            },
            other => other,
        }
    }
}
