//! The CLI over the fixture set (tests/fixtures/*.yaml): each output against its
//! committed expectation (`NAME.out.yaml` + `NAME.notes.txt`, or `NAME.err.txt` for a
//! refusal), injecting twice gives the same output, `--uninject` gives the input back as
//! data, and the webhook's patch applied to each pod template gives the CLI's template.
//! `INJECT_BLESS=1 cargo test -p tokentap-inject` rewrites the expectations (review the
//! diff). scripts/ops/check-inject.sh validates the outputs against the Kubernetes
//! schemas with kubernetes-validate --strict.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value};
use tokentap_inject::admission::{self, Outcome};
use tokentap_inject::manifests::{self, Mode};
use tokentap_inject::Options;

fn options() -> Options {
    Options {
        image: "tokentap:0.1.0".to_string(),
        ..Options::default()
    }
}

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.ends_with(".yaml") && !n.ends_with(".out.yaml")
        })
        .collect();
    v.sort();
    assert!(v.len() >= 10, "fixtures missing: {v:?}");
    v
}

fn expect(path: &Path, actual: &str) {
    if std::env::var_os("INJECT_BLESS").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(path)
        .unwrap_or_else(|_| panic!("{} missing: run with INJECT_BLESS=1", path.display()));
    assert_eq!(want, actual, "{} differs", path.display());
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .map(|v| serde_json::to_value(v).unwrap())
        .collect()
}

#[test]
fn every_fixture_against_its_expectation() {
    for input in fixtures() {
        let text = std::fs::read_to_string(&input).unwrap();
        let stem = input.with_extension("");
        let out_path = stem.with_extension("out.yaml");
        let err_path = stem.with_extension("err.txt");
        let notes_path = stem.with_extension("notes.txt");
        match manifests::run(&text, &options(), Mode::Inject) {
            Err(e) => {
                assert!(!out_path.exists(), "{} refused: {e}", input.display());
                expect(&err_path, &format!("{e}\n"));
            }
            Ok(report) => {
                assert!(!err_path.exists(), "{} injected", input.display());
                assert!(
                    !report.changed.is_empty(),
                    "{}: nothing injected",
                    input.display()
                );
                expect(&out_path, &report.output);
                expect(&notes_path, &format!("{}\n", report.notes.join("\n")));

                // Injecting again changes nothing.
                let again = manifests::run(&report.output, &options(), Mode::Inject).unwrap();
                assert_eq!(
                    again.output,
                    report.output,
                    "{}: not idempotent",
                    input.display()
                );

                // New settings replace the old ones.
                let mut newer = options();
                newer.image = "tokentap:0.2.0".to_string();
                let upgraded = manifests::run(&report.output, &newer, Mode::Inject).unwrap();
                let fresh = manifests::run(&text, &newer, Mode::Inject).unwrap();
                assert_eq!(
                    upgraded.output,
                    fresh.output,
                    "{}: re-inject",
                    input.display()
                );
                assert!(!upgraded.output.contains("tokentap:0.1.0"));

                // --uninject restores the input as data (comments are not kept).
                let back = manifests::run(&report.output, &options(), Mode::Uninject).unwrap();
                assert_eq!(
                    docs(&back.output),
                    docs(&text),
                    "{}: round trip",
                    input.display()
                );
            }
        }
    }
}

/// The pod templates of a fixture's workloads, as Pods (what the webhook is sent).
fn pods(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut objects = Vec::new();
    for d in docs(text) {
        match d.get("items").and_then(Value::as_array) {
            Some(items) => objects.extend(items.iter().cloned()),
            None => objects.push(d),
        }
    }
    for o in objects {
        let template = match o["kind"].as_str().unwrap() {
            "Pod" => Some(o.clone()),
            "CronJob" => o.pointer("/spec/jobTemplate/spec/template").cloned(),
            "Deployment" | "StatefulSet" | "Job" => o.pointer("/spec/template").cloned(),
            _ => None,
        };
        if let Some(mut t) = template {
            t["apiVersion"] = json!("v1");
            t["kind"] = json!("Pod");
            if let Some(ns) = o.pointer("/metadata/namespace") {
                t["metadata"]["namespace"] = ns.clone();
            }
            out.push(t);
        }
    }
    out
}

fn review_of(pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default"),
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "uid": "u", "groups": ["system:serviceaccounts"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))
    .unwrap()
}

fn response(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(v["response"]["allowed"], true, "{v}");
    v["response"].clone()
}

#[test]
fn webhook_patch_gives_the_cli_template() {
    let mut checked = 0;
    for input in fixtures() {
        let text = std::fs::read_to_string(&input).unwrap();
        let cli = manifests::run(&text, &options(), Mode::Inject);
        for (pod, cli_pod) in pods(&text).iter().zip(
            cli.as_ref()
                .map(|r| pods(&r.output))
                .unwrap_or_default()
                .into_iter()
                .map(Some)
                .chain(std::iter::repeat(None)),
        ) {
            let reply = admission::review(&review_of(pod), &options()).unwrap();
            let resp = response(&reply.body);
            match cli_pod {
                Some(cli_pod) => {
                    assert_eq!(reply.outcome, Outcome::Injected, "{}", input.display());
                    assert_eq!(resp["patchType"], "JSONPatch");
                    let patch_bytes = base64_decode(resp["patch"].as_str().unwrap());
                    let patch: json_patch::Patch = serde_json::from_slice(&patch_bytes).unwrap();
                    let mut patched = pod.clone();
                    json_patch::patch(&mut patched, &patch).unwrap();
                    assert_eq!(patched, cli_pod, "{}", input.display());
                    checked += 1;

                    // The injected pod again: left alone.
                    let again = admission::review(&review_of(&patched), &options()).unwrap();
                    assert_eq!(again.outcome, Outcome::AlreadyInjected);
                    assert!(response(&again.body).get("patch").is_none());
                }
                None => {
                    assert!(
                        matches!(reply.outcome, Outcome::Refused(_)),
                        "{}",
                        input.display()
                    );
                    assert!(resp.get("patch").is_none());
                    assert!(resp["warnings"][0]
                        .as_str()
                        .unwrap_or_else(|| panic!("{resp}"))
                        .contains("not injected"));
                }
            }
        }
    }
    assert!(checked >= 10, "{checked}");
}

#[test]
fn webhook_admits_opted_out_and_malformed_unchanged() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm.yaml"),
    )
    .unwrap();
    let pod = pods(&text).remove(0);

    let mut opted_out = pod.clone();
    opted_out["metadata"]["annotations"] = json!({"tokentap.dev/inject": "disabled"});
    let reply = admission::review(&review_of(&opted_out), &options()).unwrap();
    assert_eq!(reply.outcome, Outcome::OptedOut);
    assert!(response(&reply.body).get("patch").is_none());

    // A pod that does not read as a Pod (containers is a string).
    let mut malformed = pod.clone();
    malformed["spec"]["containers"] = json!("vllm");
    let reply = admission::review(&review_of(&malformed), &options()).unwrap();
    assert_eq!(reply.outcome, Outcome::Malformed);
    assert!(response(&reply.body).get("patch").is_none());

    // A review whose request does not parse, but has a uid: admitted with a warning.
    let mut broken: Value = serde_json::from_slice(&review_of(&pod)).unwrap();
    broken["request"]["operation"] = json!(42);
    let reply = admission::review(&serde_json::to_vec(&broken).unwrap(), &options()).unwrap();
    assert_eq!(reply.outcome, Outcome::Malformed);
    let resp = response(&reply.body);
    assert!(resp.get("patch").is_none());
    assert!(resp["warnings"][0]
        .as_str()
        .unwrap()
        .contains("does not parse"));

    // Not a review at all: an error (the server answers 400).
    assert!(admission::review(b"{\"kind\":", &options()).is_err());
    assert!(admission::review(b"[]", &options()).is_err());

    // Not a Pod: ignored.
    let mut review: Value = serde_json::from_slice(&review_of(&pod)).unwrap();
    review["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    let reply = admission::review(&serde_json::to_vec(&review).unwrap(), &options()).unwrap();
    assert_eq!(reply.outcome, Outcome::Ignored);

    let stats = admission::Stats::default();
    stats.record(Outcome::Refused("no_engine_port"));
    stats.record(Outcome::Injected);
    let text = stats.render();
    assert!(text.contains("tokentap_inject_reviews_total{result=\"refused\"} 1"));
    assert!(text.contains("tokentap_inject_refused_total{reason=\"no_engine_port\"} 1"));
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut buf = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).unwrap() as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    out
}
