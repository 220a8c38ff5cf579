//! The fuzz checks of fuzz/src/inject.rs on a fixed budget of generated inputs, in every
//! `cargo test` (scripts/fuzz.sh runs the coverage-guided `inject_admission` target):
//! hostile AdmissionReviews and manifests never panic, and what is answered is sound.

#[path = "../../../fuzz/src/inject.rs"]
mod inject;

use proptest::prelude::*;
use serde_json::{json, Value};

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "engine", "image": "e:1",
            "ports": [{"name": "http", "containerPort": 8000}]}]}})
}

/// Pods with hostile values where injection looks: ports, names, annotations, grace.
fn hostile_pod() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        Just(String::new()),
        "[a-z0-9-]{1,20}",
        "\\PC{0,40}",
        Just("\u{1b}[2J".to_string()),
        Just("tokentap".to_string()),
    ];
    let number = prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(65536)),
        Just(json!(8080)),
        Just(json!(9465)),
        Just(json!(1.5)),
        Just(json!("8000")),
        Just(json!(i64::MAX)),
        (1u16..).prop_map(|p| json!(p))
    ];
    (
        text.clone(),
        text.clone(),
        number.clone(),
        number,
        text,
        any::<u8>(),
    )
        .prop_map(|(name, pname, port, grace, ann, pick)| {
            let mut p = pod();
            p["spec"]["containers"][0]["name"] = json!(name);
            p["spec"]["containers"][0]["ports"][0]["name"] = json!(pname);
            p["spec"]["containers"][0]["ports"][0]["containerPort"] = port.clone();
            p["spec"]["terminationGracePeriodSeconds"] = grace;
            let key = [
                "tokentap.dev/engine-port",
                "tokentap.dev/image",
                "tokentap.dev/settings-hash",
                "tokentap.dev/engine-port-rename",
                "tokentap.dev/http-port",
                "tokentap.dev/inject",
                "tokentap.dev/cpu-limit",
                "tokentap.dev/config-map",
            ][usize::from(pick % 8)];
            p["metadata"]["annotations"] = json!({key: ann});
            if pick & 0x80 != 0 {
                p["spec"]["initContainers"] =
                    json!([{"name": "tokentap", "image": "x", "restartPolicy": "Always"}]);
            }
            if pick & 0x40 != 0 {
                p["spec"]["containers"][0]["ports"] =
                    json!([{"containerPort": port}, {"containerPort": 8001}]);
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn hostile_pods_in_reviews(p in hostile_pod()) {
        inject::check_review(&inject::review_of(p));
    }

    #[test]
    fn arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        inject::check_inject(&data);
    }

    #[test]
    fn hostile_pods_as_manifests(p in hostile_pod()) {
        inject::check_manifests(&serde_json::to_string(&p).unwrap());
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [p, {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s"}, "spec": {"selector": {"app": "x"}, "ports": [{"port": 80, "targetPort": "http"}]}}]});
        inject::check_manifests(&serde_yaml::to_string(&list).unwrap());
    }
}

#[test]
fn huge_and_deep_inputs() {
    inject::check_review(&vec![b'['; 100_000]);
    inject::check_review(&vec![b' '; tokentap_inject::admission::MAX_BODY + 1]);
    inject::check_manifests(&"[".repeat(10_000));
    inject::check_manifests(&format!("a: &a [{}]\nb: *a\n", "x, ".repeat(1000)));
    // A patch target missing: an object without spec, or with spec a string.
    inject::check_review(&inject::review_of(json!({"metadata": {}})));
    inject::check_review(&inject::review_of(
        json!({"metadata": {"annotations": "x"}, "spec": "s"}),
    ));
}
