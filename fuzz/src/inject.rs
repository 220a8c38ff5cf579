//! Hostile input for `tokentap inject` (crates/inject): AdmissionReview bodies as the
//! webhook reads them, and manifests as the CLI reads them. The first byte picks:
//!   0 the rest is an AdmissionReview body as it is;
//!   1 the rest is the object (JSON) of an otherwise well-formed Pod CREATE review;
//!   2 the rest is manifests text for `tokentap inject`.
//! Nothing may panic. A review that parses gets an answer that admits the pod; a patch
//! comes only with `injected`, applies to the object sent with the JSON Patch library,
//! gives a Pod, and that pod is then left alone. The CLI's output parses as YAML and
//! injecting it again changes nothing.
//! Used by the `inject_admission` fuzz target and, on a fixed budget, by
//! crates/inject/tests/hostile.rs (both include this file by path).

use base64::Engine as _;
use serde_json::{json, Value};
use tokentap_inject::admission::{self, Outcome};
use tokentap_inject::manifests::{self, Mode};
use tokentap_inject::{json_patch, k8s_openapi, Options};

pub fn options() -> Options {
    Options {
        image: "tokentap:0.1.0".to_string(),
        ..Options::default()
    }
}

pub fn review_of(object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "fuzz",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "fuzz"},
            "object": object,
        }
    }))
    .unwrap_or_default()
}

pub fn check_inject(data: &[u8]) {
    let (mode, rest) = match data.split_first() {
        Some((m, rest)) => (*m % 3, rest),
        None => (0, data),
    };
    match mode {
        1 => {
            if let Ok(object) = serde_json::from_slice::<Value>(rest) {
                check_review(&review_of(object));
            }
        }
        2 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                check_manifests(text);
            }
        }
        _ => check_review(rest),
    }
}

pub fn check_review(body: &[u8]) {
    let Ok(reply) = admission::review(body, &options()) else {
        return;
    };
    let answer: Value = serde_json::from_slice(&reply.body).expect("the answer is JSON");
    let response = &answer["response"];
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(response["allowed"], true, "the webhook never refuses a pod");
    let Some(patch) = response.get("patch") else {
        assert_ne!(reply.outcome, Outcome::Injected);
        return;
    };
    assert_eq!(reply.outcome, Outcome::Injected);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().expect("the patch is a base64 string"))
        .expect("base64");
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("a JSON Patch");
    let request: Value = serde_json::from_slice(body).expect("a review that was answered parses");
    let mut pod = request["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).expect("the patch applies to the object sent");
    serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(pod.clone())
        .expect("the patched object is a Pod");
    let again = admission::review(&review_of(pod), &options()).expect("a review");
    assert_eq!(again.outcome, Outcome::AlreadyInjected);
}

pub fn check_manifests(text: &str) {
    let Ok(report) = manifests::run(text, &options(), Mode::Inject) else {
        return;
    };
    for doc in serde_yaml::Deserializer::from_str(&report.output) {
        use serde::Deserialize as _;
        serde_yaml::Value::deserialize(doc).expect("the output is YAML");
    }
    let again =
        manifests::run(&report.output, &options(), Mode::Inject).expect("the output injects again");
    assert_eq!(
        again.output, report.output,
        "injecting twice changes nothing"
    );
    let _ = manifests::run(&report.output, &options(), Mode::Uninject);
}
