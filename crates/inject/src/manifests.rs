//! The CLI's way in: manifests in, the same manifests out with tokentap injected (or
//! removed). Multi-document YAML or JSON and `List`s; Deployment, StatefulSet,
//! DaemonSet, ReplicaSet, Job, CronJob and Pod are injected, every other kind passes
//! through as data. Services in the input that reach an engine's port (by number or by
//! name) are moved to tokentap's port, InferencePools likewise; what cannot be changed
//! here (a Service outside the input, a headless Service's direct dialers, a route to a
//! Service that is not in the input) is named in a note, with the `kubectl patch` to
//! run where there is one.
//!
//! Injection first removes any earlier injection, so running it twice gives the same
//! output and running it with new settings replaces them. `--uninject` restores the
//! input as data. Key order is the input's (new keys in Kubernetes' usual order);
//! comments are not kept (the YAML library drops them).

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::pod::{self, Injection, Wiring};
use crate::settings::{self, shown, Options};
use crate::Refusal;

/// The largest input read.
pub const MAX_INPUT: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Inject,
    Uninject,
}

/// The result of [`run`]: the manifests and what the user must know or do.
#[derive(Debug, Default)]
pub struct Report {
    pub output: String,
    /// Warnings and the commands to run for what is outside the input.
    pub notes: Vec<String>,
    /// The workloads injected (or uninjected).
    pub changed: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the input is larger than {MAX_INPUT} bytes")]
    TooLarge,
    #[error("document {index}: {message}")]
    Parse { index: usize, message: String },
    #[error("not injected, nothing written:\n  {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Refused(Vec<Refusal>),
}

/// Where an object is: a document, or an item of a `List` document.
#[derive(Clone, Copy)]
struct Slot {
    doc: usize,
    item: Option<usize>,
}

struct Injected {
    workload: String,
    namespace: Option<String>,
    labels: BTreeMap<String, String>,
    wiring: Wiring,
    served: bool,
}

/// Inject (or remove) tokentap in every workload of `text`.
pub fn run(text: &str, options: &Options, mode: Mode) -> Result<Report, Error> {
    if text.len() > MAX_INPUT {
        return Err(Error::TooLarge);
    }
    let json_out = text.trim_start().starts_with(['{', '[']);
    let (originals, mut docs) = parse_documents(text)?;
    let slots = slots_of(&docs);

    let mut report = Report::default();
    // Whatever injection did to Services and pools before is undone first.
    for slot in &slots {
        if let Some(obj) = at(&mut docs, *slot) {
            if is_service(obj) || is_inference_pool(obj) {
                restore_targets(obj);
            }
        }
    }

    let mut injected = change_workloads(&mut docs, &slots, options, mode, &mut report)?;
    if mode == Mode::Inject {
        rewire(&mut docs, &slots, &mut injected, &mut report.notes);
    }
    report.output = write_documents(&docs, &originals, json_out)?;
    Ok(report)
}

/// Every document of `text` that is not empty, as read (to keep its key order) and as
/// JSON (to change).
fn parse_documents(text: &str) -> Result<(Vec<serde_yaml::Value>, Vec<Value>), Error> {
    let mut originals = Vec::new();
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let parse = |message: String| Error::Parse {
            index: index.saturating_add(1),
            message: shown_long(&message),
        };
        let y = serde_yaml::Value::deserialize(de).map_err(|e| parse(e.to_string()))?;
        if y.is_null() {
            continue;
        }
        let j = serde_json::to_value(&y).map_err(|e| parse(e.to_string()))?;
        originals.push(y);
        docs.push(j);
    }

    Ok((originals, docs))
}

/// Where every object is: each document, or each item of a `List` document.
fn slots_of(docs: &[Value]) -> Vec<Slot> {
    let mut slots = Vec::new();
    for (doc, v) in docs.iter().enumerate() {
        let is_list = kind(v).is_some_and(|k| k.ends_with("List"));
        match v.get("items").and_then(Value::as_array) {
            Some(items) if is_list => {
                slots.extend((0..items.len()).map(|i| Slot { doc, item: Some(i) }))
            }
            _ => slots.push(Slot { doc, item: None }),
        }
    }

    slots
}

/// Inject (or uninject) every workload's pod template in place, naming the workloads
/// changed in `report`; the workloads injected, or every refusal when any is refused
/// (then nothing is written).
fn change_workloads(
    docs: &mut [Value],
    slots: &[Slot],
    options: &Options,
    mode: Mode,
    report: &mut Report,
) -> Result<Vec<Injected>, Error> {
    let mut refused = Vec::new();
    let mut injected = Vec::new();
    for slot in slots {
        let Some(obj) = at(docs, *slot) else {
            continue;
        };
        let Some(pointer) = template_pointer(obj) else {
            continue;
        };
        let workload = describe(obj);
        let namespace = namespace(obj);
        let Some(template) = obj.pointer(pointer).cloned() else {
            refused.push(Refusal::Malformed {
                what: format!("{workload}: no pod template"),
            });
            continue;
        };
        let result = match mode {
            Mode::Uninject => pod::uninject(&template).map(|t| (t, None)),
            Mode::Inject => pod::inject(&template, options, &workload).map(|i| match i {
                Injection::Injected { template, wiring } => (template, Some(wiring)),
                Injection::OptedOut => (template.clone(), None),
            }),
        };
        match result {
            Ok((new, wiring)) => {
                if new != template {
                    report.changed.push(workload.clone());
                }
                let labels = labels_of(&new);
                if let Some(slot) = obj.pointer_mut(pointer) {
                    *slot = new;
                } else if pointer.is_empty() {
                    *obj = new;
                }
                if let Some(wiring) = wiring {
                    injected.push(Injected {
                        workload,
                        namespace,
                        labels,
                        wiring,
                        served: false,
                    });
                }
            }
            Err(e) => refused.push(e),
        }
    }
    if !refused.is_empty() {
        return Err(Error::Refused(refused));
    }
    Ok(injected)
}

/// Move the Services and InferencePools in the input that reach an injected engine to
/// tokentap's port, and note what must be done outside the input: routes to Services
/// that are not in it, workloads no Service serves, and a renamed metrics port.
fn rewire(docs: &mut [Value], slots: &[Slot], injected: &mut [Injected], notes: &mut Vec<String>) {
    let mut services = HashMap::new();
    for slot in slots {
        let Some(obj) = at(docs, *slot) else {
            continue;
        };
        if is_service(obj) {
            services.insert(
                (namespace(obj), name(obj).unwrap_or_default().to_string()),
                (),
            );
            rewire_service(obj, injected, notes);
        } else if is_inference_pool(obj) {
            rewire_pool(obj, injected, notes);
        }
    }
    for slot in slots {
        if let Some(obj) = at(docs, *slot) {
            check_routes(obj, &services, injected, notes);
        }
    }
    for i in injected.iter().filter(|i| !i.served) {
        notes.push(outside_service_note(i));
    }
    for i in injected
        .iter()
        .filter(|i| i.wiring.metrics_port_name != "metrics")
    {
        notes.push(format!(
            "note: {}: the pod already has a port named `metrics`, so tokentap's admin port is `{}`: a PodMonitor that scrapes port `metrics` (deploy/kubernetes/overlays/sidecar) must name `{}` for these pods",
            i.workload,
            shown(&i.wiring.metrics_port_name),
            shown(&i.wiring.metrics_port_name)
        ));
    }
}

/// The documents written back, in the input's format (JSON or YAML) and key order.
fn write_documents(
    docs: &[Value],
    originals: &[serde_yaml::Value],
    json_out: bool,
) -> Result<String, Error> {
    let mut out = String::new();
    for (index, doc) in docs.iter().enumerate() {
        let y = ordered(doc, originals.get(index));
        if json_out {
            let text = serde_json::to_string_pretty(&y).map_err(|e| Error::Parse {
                index: index.saturating_add(1),
                message: e.to_string(),
            })?;
            out.push_str(&text);
            out.push('\n');
        } else {
            if index > 0 {
                out.push_str("---\n");
            }
            let text = serde_yaml::to_string(&y).map_err(|e| Error::Parse {
                index: index.saturating_add(1),
                message: e.to_string(),
            })?;
            out.push_str(&text);
        }
    }
    Ok(out)
}

fn shown_long(v: &str) -> String {
    v.chars().take(300).flat_map(char::escape_debug).collect()
}

fn at(docs: &mut [Value], slot: Slot) -> Option<&mut Value> {
    let doc = docs.get_mut(slot.doc)?;
    match slot.item {
        None => Some(doc),
        Some(i) => doc.get_mut("items")?.get_mut(i),
    }
}

fn kind(v: &Value) -> Option<&str> {
    v.get("kind").and_then(Value::as_str)
}

fn api_version(v: &Value) -> &str {
    v.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

fn name(v: &Value) -> Option<&str> {
    v.pointer("/metadata/name").and_then(Value::as_str)
}

fn namespace(v: &Value) -> Option<String> {
    v.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn describe(v: &Value) -> String {
    let kind = kind(v).map(shown).unwrap_or_default();
    let name = name(v)
        .map(shown)
        .unwrap_or_else(|| "(unnamed)".to_string());
    match namespace(v) {
        Some(ns) => format!("{kind} {}/{name}", shown(&ns)),
        None => format!("{kind} {name}"),
    }
}

/// Where a workload keeps its pod template ("" for a Pod itself).
fn template_pointer(v: &Value) -> Option<&'static str> {
    match (api_version(v), kind(v)?) {
        ("apps/v1", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet") => {
            Some("/spec/template")
        }
        ("batch/v1", "Job") => Some("/spec/template"),
        ("batch/v1", "CronJob") => Some("/spec/jobTemplate/spec/template"),
        ("v1", "Pod") => Some(""),
        _ => None,
    }
}

fn is_service(v: &Value) -> bool {
    api_version(v) == "v1" && kind(v) == Some("Service")
}

fn is_inference_pool(v: &Value) -> bool {
    kind(v) == Some("InferencePool")
        && (api_version(v).starts_with("inference.networking.k8s.io/")
            || api_version(v).starts_with("inference.networking.x-k8s.io/"))
}

fn labels_of(template: &Value) -> BTreeMap<String, String> {
    template
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default()
}

fn same_namespace(a: &Option<String>, b: &Option<String>) -> bool {
    a.is_none() || b.is_none() || a == b
}

/// A non-empty equality selector that the labels satisfy.
fn selects(selector: Option<&Value>, labels: &BTreeMap<String, String>) -> bool {
    let Some(Value::Object(sel)) = selector else {
        return false;
    };
    !sel.is_empty()
        && sel.iter().all(|(k, v)| {
            v.as_str()
                .is_some_and(|v| labels.get(k).map(String::as_str) == Some(v))
        })
}

/// Record what a field was before injection changed it, in the object's
/// [`settings::ORIGINAL_TARGET_PORTS`] annotation (JSON pointer -> value, null when the
/// field was absent).
fn record_original(obj: &mut Value, pointer: &str, original: Option<&Value>) {
    let mut recorded: Map<String, Value> = obj
        .pointer(&format!(
            "/metadata/annotations/{}",
            settings::ORIGINAL_TARGET_PORTS.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    recorded
        .entry(pointer.to_string())
        .or_insert_with(|| original.cloned().unwrap_or(Value::Null));
    let text = Value::Object(recorded).to_string();
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let ann = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(ann) = ann.as_object_mut() {
        ann.insert(
            settings::ORIGINAL_TARGET_PORTS.to_string(),
            Value::String(text),
        );
    }
}

/// Undo [`record_original`]'s changes.
fn restore_targets(obj: &mut Value) {
    let key = format!(
        "/metadata/annotations/{}",
        settings::ORIGINAL_TARGET_PORTS.replace('/', "~1")
    );
    let Some(recorded) = obj
        .pointer(&key)
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str::<Map<String, Value>>(t).ok())
    else {
        return;
    };
    for (pointer, original) in recorded {
        // Only the fields injection changes; an edited annotation cannot reach others.
        if !(pointer.starts_with("/spec/ports/") && pointer.ends_with("/targetPort")
            || pointer.starts_with("/spec/targetPort"))
        {
            continue;
        }
        if original.is_null() {
            if let Some((parent, field)) = pointer.rsplit_once('/') {
                if let Some(Value::Object(p)) = obj.pointer_mut(parent) {
                    p.remove(field);
                }
            }
        } else if let Some(slot) = obj.pointer_mut(&pointer) {
            *slot = original;
        }
    }
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        if let Some(Value::Object(ann)) = meta.get_mut("annotations") {
            ann.remove(settings::ORIGINAL_TARGET_PORTS);
            if ann.is_empty() {
                meta.remove("annotations");
            }
        }
    }
}

fn rewire_service(svc: &mut Value, injected: &mut [Injected], notes: &mut Vec<String>) {
    let ns = namespace(svc);
    let what = describe(svc);
    let headless = svc.pointer("/spec/clusterIP").and_then(Value::as_str) == Some("None");
    let selector = svc.pointer("/spec/selector").cloned();
    let ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for i in injected.iter_mut() {
        if !same_namespace(&ns, &i.namespace) || !selects(selector.as_ref(), &i.labels) {
            continue;
        }
        for (index, port) in ports.iter().enumerate() {
            let target = port.get("targetPort").or_else(|| port.get("port"));
            let reaches = match target {
                Some(Value::Number(n)) => n.as_u64() == Some(u64::from(i.wiring.engine_port)),
                Some(Value::String(s)) => i.wiring.engine_port_name.as_deref() == Some(s),
                _ => false,
            };
            if !reaches {
                continue;
            }
            let pointer = format!("/spec/ports/{index}/targetPort");
            record_original(svc, &pointer, port.get("targetPort"));
            if let Some(Value::Object(p)) = svc.pointer_mut(&format!("/spec/ports/{index}")) {
                // A number: not every component resolves named ports of init containers.
                p.insert("targetPort".to_string(), Value::from(i.wiring.http_port));
            }
            i.served = true;
            if headless {
                notes.push(format!(
                    "warning: {what} is headless: clients that resolve pod addresses and dial port {} themselves bypass tokentap; have them dial {}",
                    i.wiring.engine_port, i.wiring.http_port
                ));
            }
        }
    }
}

fn rewire_pool(pool: &mut Value, injected: &[Injected], notes: &mut Vec<String>) {
    let ns = namespace(pool);
    let what = describe(pool);
    // v1: spec.selector.matchLabels + spec.targetPorts[].number; v1alpha2:
    // spec.selector (a map) + spec.targetPortNumber.
    let selector = pool
        .pointer("/spec/selector/matchLabels")
        .or_else(|| pool.pointer("/spec/selector"))
        .cloned();
    let mut fields: Vec<String> = pool
        .pointer("/spec/targetPorts")
        .and_then(Value::as_array)
        .map(|a| {
            (0..a.len())
                .map(|i| format!("/spec/targetPorts/{i}/number"))
                .collect()
        })
        .unwrap_or_default();
    if pool.pointer("/spec/targetPortNumber").is_some() {
        fields.push("/spec/targetPortNumber".to_string());
    }
    let matching: Vec<&Injected> = injected
        .iter()
        .filter(|i| same_namespace(&ns, &i.namespace) && selects(selector.as_ref(), &i.labels))
        .collect();
    for field in fields {
        let Some(port) = pool.pointer(&field).and_then(Value::as_u64) else {
            continue;
        };
        let hits: Vec<&&Injected> = matching
            .iter()
            .filter(|i| u64::from(i.wiring.engine_port) == port)
            .collect();
        let targets: Vec<u16> = hits.iter().map(|i| i.wiring.http_port).collect();
        match targets.as_slice() {
            [] => {}
            [first, rest @ ..] if rest.iter().all(|t| t == first) => {
                let original = pool.pointer(&field).cloned();
                record_original(pool, &field, original.as_ref());
                if let Some(slot) = pool.pointer_mut(&field) {
                    *slot = Value::from(*first);
                }
            }
            _ => notes.push(format!(
                "warning: {what} selects pods whose tokentap ports differ; not changed: point its target port at tokentap's port yourself"
            )),
        }
    }
}

/// Ingress and HTTPRoute backends: a route to a Service in the input reaches tokentap
/// once that Service is moved; a route by number to a Service outside the input is named.
fn check_routes(
    obj: &Value,
    services: &HashMap<(Option<String>, String), ()>,
    injected: &[Injected],
    notes: &mut Vec<String>,
) {
    let ns = namespace(obj);
    let mut backends: Vec<(String, u64)> = Vec::new();
    match kind(obj) {
        Some("Ingress") if api_version(obj).starts_with("networking.k8s.io/") => {
            let mut push = |b: Option<&Value>| {
                if let Some(s) = b.and_then(|b| b.get("service")) {
                    if let (Some(n), Some(p)) = (
                        s.get("name").and_then(Value::as_str),
                        s.pointer("/port/number").and_then(Value::as_u64),
                    ) {
                        backends.push((n.to_string(), p));
                    }
                }
            };
            push(obj.pointer("/spec/defaultBackend"));
            for rule in obj
                .pointer("/spec/rules")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for path in rule
                    .pointer("/http/paths")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    push(path.get("backend"));
                }
            }
        }
        Some("HTTPRoute" | "GRPCRoute")
            if api_version(obj).starts_with("gateway.networking.k8s.io/") =>
        {
            for rule in obj
                .pointer("/spec/rules")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for b in rule
                    .get("backendRefs")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let is_service =
                        b.get("kind").and_then(Value::as_str).unwrap_or("Service") == "Service";
                    if let (true, Some(n), Some(p)) = (
                        is_service,
                        b.get("name").and_then(Value::as_str),
                        b.get("port").and_then(Value::as_u64),
                    ) {
                        backends.push((n.to_string(), p));
                    }
                }
            }
        }
        _ => return,
    }
    for (service, port) in backends {
        if services.contains_key(&(ns.clone(), service.clone())) {
            continue;
        }
        if injected
            .iter()
            .any(|i| same_namespace(&ns, &i.namespace) && u64::from(i.wiring.engine_port) == port)
        {
            notes.push(format!(
                "warning: {} sends to Service `{}` port {port}, which is not in the input: if that Service targets an injected engine's port, move it to tokentap's port (kubectl patch, as below)",
                describe(obj),
                shown(&service)
            ));
        }
    }
}

fn outside_service_note(i: &Injected) -> String {
    let ns = i
        .namespace
        .as_deref()
        .map(|n| format!(" -n {}", shown(n)))
        .unwrap_or_default();
    let by_name = match &i.wiring.engine_port_name {
        Some(n) => format!(
            " A Service that targets the port by name (`{}`) already reaches tokentap.",
            shown(n)
        ),
        None => String::new(),
    };
    format!(
        "note: {}: no Service in the input selects its pods.{by_name} A Service outside the input that targets port {} must be moved to tokentap's port {}:\n  kubectl{ns} patch service SERVICE --type=json -p '[{{\"op\":\"replace\",\"path\":\"/spec/ports/INDEX/targetPort\",\"value\":{}}}]'",
        i.workload, i.wiring.engine_port, i.wiring.http_port, i.wiring.http_port
    )
}

/// Keys new to the output come in this order (then alphabetically), as people write
/// Kubernetes objects.
const KEY_ORDER: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "labels",
    "annotations",
    "spec",
    "image",
    "imagePullPolicy",
    "restartPolicy",
    "command",
    "args",
    "env",
    "envFrom",
    "valueFrom",
    "fieldRef",
    "fieldPath",
    "ports",
    "containerPort",
    "protocol",
    "startupProbe",
    "livenessProbe",
    "readinessProbe",
    "httpGet",
    "path",
    "port",
    "periodSeconds",
    "timeoutSeconds",
    "failureThreshold",
    "lifecycle",
    "preStop",
    "sleep",
    "seconds",
    "resources",
    "requests",
    "limits",
    "securityContext",
    "volumeMounts",
    "mountPath",
    "readOnly",
];

fn key_rank(k: &str) -> (usize, &str) {
    (
        KEY_ORDER
            .iter()
            .position(|x| *x == k)
            .unwrap_or(KEY_ORDER.len()),
        k,
    )
}

/// `new` as YAML, with the key order of `old` where it has the key.
fn ordered(new: &Value, old: Option<&serde_yaml::Value>) -> serde_yaml::Value {
    match new {
        Value::Object(map) => {
            // The input's keys in the input's order; a new key goes before the first
            // of them that Kubernetes' usual order puts after it (metadata before spec).
            let mut entries: Vec<(String, serde_yaml::Value)> = Vec::new();
            if let Some(serde_yaml::Value::Mapping(om)) = old {
                for (k, ov) in om {
                    if let Some((k, nv)) = k.as_str().and_then(|k| map.get_key_value(k)) {
                        entries.push((k.clone(), ordered(nv, Some(ov))));
                    }
                }
            }
            let taken: std::collections::HashSet<String> =
                entries.iter().map(|(k, _)| k.clone()).collect();
            let mut rest: Vec<(&String, &Value)> =
                map.iter().filter(|(k, _)| !taken.contains(*k)).collect();
            rest.sort_by(|a, b| key_rank(a.0).cmp(&key_rank(b.0)));
            for (k, v) in rest {
                let rank = key_rank(k).0;
                let at = entries
                    .iter()
                    .position(|(e, _)| rank < KEY_ORDER.len() && key_rank(e).0 > rank)
                    .unwrap_or(entries.len());
                entries.insert(at, (k.clone(), ordered(v, None)));
            }
            let mut out = serde_yaml::Mapping::new();
            for (k, v) in entries {
                out.insert(serde_yaml::Value::String(k), v);
            }
            serde_yaml::Value::Mapping(out)
        }
        Value::Array(items) => {
            let old_items = match old {
                Some(serde_yaml::Value::Sequence(s)) => s.as_slice(),
                _ => &[],
            };
            let by_name: HashMap<&str, &serde_yaml::Value> = old_items
                .iter()
                .filter_map(|o| Some((o.get("name")?.as_str()?, o)))
                .collect();
            serde_yaml::Value::Sequence(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, nv)| {
                        let o = match nv.get("name").and_then(Value::as_str) {
                            Some(n) => by_name.get(n).copied(),
                            None => old_items.get(i),
                        };
                        ordered(nv, o)
                    })
                    .collect(),
            )
        }
        scalar => match old {
            Some(o) if serde_json::to_value(o).ok().as_ref() == Some(scalar) => o.clone(),
            _ => serde_yaml::to_value(scalar).unwrap_or(serde_yaml::Value::Null),
        },
    }
}
