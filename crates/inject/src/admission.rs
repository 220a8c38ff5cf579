//! The webhook's way in: an `admission.k8s.io/v1` AdmissionReview for a Pod, answered
//! with the JSON Patch from the pod to [`pod::inject`]'s result (the CLI's change, by the
//! same code). The webhook never blocks a pod: one it cannot inject is admitted
//! unchanged with a warning, and the reason is counted. A pod already injected, opted
//! out (`tokentap.dev/inject: disabled`), or not a Pod CREATE, is admitted unchanged.
//! Only a body that is not an AdmissionReview at all (no request uid to answer) is an
//! error, which the server answers with 400.

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube_core::DynamicObject;
use serde_json::Value;

use crate::pod::{self, Injection};
use crate::settings::{shown, Options};

/// The largest AdmissionReview read (the API server's requests are far smaller: a pod
/// is at most ~1.5 MB in etcd).
pub const MAX_BODY: usize = 4 << 20;

/// What happened to one review; each is a value of the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Injected,
    AlreadyInjected,
    OptedOut,
    /// Not a Pod CREATE (or no object): nothing to do.
    Ignored,
    /// Could not be injected: admitted unchanged; the reason is [`crate::Refusal::reason`].
    Refused(&'static str),
    /// A review whose pod could not be read: admitted unchanged.
    Malformed,
}

impl Outcome {
    pub fn result(self) -> &'static str {
        match self {
            Outcome::Injected => "injected",
            Outcome::AlreadyInjected => "already_injected",
            Outcome::OptedOut => "opted_out",
            Outcome::Ignored => "ignored",
            Outcome::Refused(_) => "refused",
            Outcome::Malformed => "malformed",
        }
    }
}

/// The reply to one review body.
#[derive(Debug)]
pub struct Reply {
    /// The AdmissionReview to send back (JSON).
    pub body: Vec<u8>,
    pub outcome: Outcome,
    /// What the warning said, for the log.
    pub message: Option<String>,
}

/// A body that is not an AdmissionReview with a request uid.
#[derive(Debug, thiserror::Error)]
#[error("not an AdmissionReview: {0}")]
pub struct BadReview(String);

/// Answer one AdmissionReview body.
pub fn review(body: &[u8], options: &Options) -> Result<Reply, BadReview> {
    if body.len() > MAX_BODY {
        return Err(BadReview(format!("larger than {MAX_BODY} bytes")));
    }
    let raw: Value = serde_json::from_slice(body).map_err(|e| BadReview(shown(&e.to_string())))?;
    let parsed: Result<AdmissionReview<DynamicObject>, _> = serde_json::from_value(raw.clone());
    let request: AdmissionRequest<DynamicObject> =
        match parsed.map_err(|e| e.to_string()).and_then(|r| {
            let r: Result<AdmissionRequest<DynamicObject>, _> = r.try_into();
            r.map_err(|e| e.to_string())
        }) {
            Ok(r) => r,
            Err(e) => return admit_unreadable(&raw, &e),
        };
    let base = AdmissionResponse::from(&request);
    let unchanged = |outcome: Outcome, message: Option<String>| -> Result<Reply, BadReview> {
        let mut response = base.clone();
        if let Some(m) = &message {
            response.warnings = Some(vec![m.clone()]);
        }
        reply(response, outcome, message)
    };
    let is_pod = request.kind.group.is_empty() && request.kind.kind == "Pod";
    let Some(object) = request.object.as_ref().filter(|_| is_pod) else {
        return unchanged(Outcome::Ignored, None);
    };
    if !matches!(request.operation, Operation::Create) {
        return unchanged(Outcome::Ignored, None);
    }
    // The object as sent (not as DynamicObject writes it back): the patch applies to it.
    let _ = object;
    let Some(pod_json) = raw.pointer("/request/object").cloned() else {
        return unchanged(Outcome::Ignored, None);
    };
    // The pod must read as a Pod before anything is decided about it.
    if let Err(e) = serde_json::from_value::<Pod>(pod_json.clone()) {
        return unchanged(
            Outcome::Malformed,
            Some(warning(&format!("the pod does not read as a Pod: {e}"))),
        );
    }
    if pod::opted_out(&pod_json) {
        return unchanged(Outcome::OptedOut, None);
    }
    if pod::is_injected(&pod_json) {
        return unchanged(Outcome::AlreadyInjected, None);
    }
    let workload = describe(&request, &pod_json);
    match pod::inject(&pod_json, options, &workload) {
        Ok(Injection::Injected { template, .. }) => {
            let patch = json_patch::diff(&pod_json, &template);
            match base.clone().with_patch(patch) {
                Ok(response) => reply(response, Outcome::Injected, None),
                Err(e) => unchanged(Outcome::Malformed, Some(warning(&e.to_string()))),
            }
        }
        Ok(Injection::OptedOut) => unchanged(Outcome::OptedOut, None),
        Err(refusal) => {
            let reason = refusal.reason();
            unchanged(
                Outcome::Refused(reason),
                Some(warning(&refusal.to_string())),
            )
        }
    }
}

fn describe(request: &AdmissionRequest<DynamicObject>, pod: &Value) -> String {
    let ns = request.namespace.as_deref().unwrap_or("");
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| {
            pod.pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .map(|g| format!("{g}*"))
        })
        .unwrap_or_else(|| "(unnamed)".to_string());
    format!("Pod {}/{}", shown(ns), shown(&name))
}

/// A warning as the API server passes it on: one line, printable, bounded.
fn warning(text: &str) -> String {
    let mut w: String = format!("tokentap not injected: {text}")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(400)
        .collect();
    w.truncate(w.trim_end().len());
    w
}

fn reply(
    response: AdmissionResponse,
    outcome: Outcome,
    message: Option<String>,
) -> Result<Reply, BadReview> {
    use base64::Engine as _;
    let mut review =
        serde_json::to_value(response.into_review()).map_err(|e| BadReview(e.to_string()))?;
    // kube-core writes the patch as an array of numbers; the API's `[]byte` is a base64
    // string, the form every webhook sends.
    if let Some(patch) = review.pointer_mut("/response/patch") {
        let bytes: Vec<u8> = serde_json::from_value(patch.clone()).unwrap_or_default();
        *patch = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    let body = serde_json::to_vec(&review).map_err(|e| BadReview(e.to_string()))?;
    Ok(Reply {
        body,
        outcome,
        message,
    })
}

/// A review that does not parse: admitted unchanged when it has a request uid to answer.
fn admit_unreadable(raw: &Value, error: &str) -> Result<Reply, BadReview> {
    let uid = raw
        .pointer("/request/uid")
        .and_then(Value::as_str)
        .map(str::to_string)
        .filter(|u| !u.is_empty() && u.len() <= 128);
    let Some(uid) = uid else {
        return Err(BadReview(shown(error)));
    };
    let mut response = AdmissionResponse::invalid("");
    response.uid = uid;
    response.allowed = true;
    response.result = Default::default();
    let message = warning(&format!("the review does not parse: {error}"));
    response.warnings = Some(vec![message.clone()]);
    reply(response, Outcome::Malformed, Some(message))
}

/// Counts of reviews by outcome and of refusals by reason, for the webhook's `/metrics`.
#[derive(Default)]
pub struct Stats {
    results: [AtomicU64; 6],
    reasons: [AtomicU64; REASONS.len()],
    bad: AtomicU64,
}

const RESULTS: [&str; 6] = [
    "injected",
    "already_injected",
    "opted_out",
    "ignored",
    "refused",
    "malformed",
];
const REASONS: [&str; 9] = [
    "no_engine_port",
    "ambiguous_engine_port",
    "no_engine_container",
    "port_collision",
    "grace_too_short",
    "tokentap_present",
    "invalid_setting",
    "host_network",
    "malformed",
];

impl Stats {
    pub fn record(&self, outcome: Outcome) {
        let bump = |list: &[&str], counters: &[AtomicU64], name: &str| {
            if let Some(c) = list
                .iter()
                .position(|r| *r == name)
                .and_then(|i| counters.get(i))
            {
                c.fetch_add(1, Ordering::Relaxed);
            }
        };
        bump(&RESULTS, &self.results, outcome.result());
        if let Outcome::Refused(reason) = outcome {
            bump(&REASONS, &self.reasons, reason);
        }
    }

    /// A body that was not an AdmissionReview (answered 400).
    pub fn record_bad(&self) {
        self.bad.fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# HELP tokentap_inject_reviews_total AdmissionReviews answered, by result.\n\
             # TYPE tokentap_inject_reviews_total counter\n",
        );
        for (name, c) in RESULTS.iter().zip(&self.results) {
            out.push_str(&format!(
                "tokentap_inject_reviews_total{{result=\"{name}\"}} {}\n",
                c.load(Ordering::Relaxed)
            ));
        }
        out.push_str(
            "# HELP tokentap_inject_refused_total Pods admitted without tokentap, by reason.\n\
             # TYPE tokentap_inject_refused_total counter\n",
        );
        for (name, c) in REASONS.iter().zip(&self.reasons) {
            out.push_str(&format!(
                "tokentap_inject_refused_total{{reason=\"{name}\"}} {}\n",
                c.load(Ordering::Relaxed)
            ));
        }
        out.push_str(&format!(
            "# HELP tokentap_inject_bad_requests_total Bodies that were not an AdmissionReview (answered 400).\n\
             # TYPE tokentap_inject_bad_requests_total counter\n\
             tokentap_inject_bad_requests_total {}\n",
            self.bad.load(Ordering::Relaxed)
        ));
        out
    }
}
