//! The one place that decides what injecting tokentap into a pod means: a pod template
//! (`{metadata, spec}`, a Pod or a workload's `spec.template`) in, the injected
//! template out. The CLI writes the result; the webhook sends the JSON Patch between
//! the two (`json_patch::diff`), so both make the same change.
//!
//! The template stays a `serde_json::Value`: fields this version does not know are kept
//! as they are. The Kubernetes types check the spec's shape (a template they cannot
//! read is refused, not half-changed) and build the sidecar container.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, SleepAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::settings::{self, shown, Options, Settings};
use crate::Refusal;

/// The sidecar's container name.
pub const CONTAINER: &str = "tokentap";
/// The volume added for `config-map`.
pub const CONFIG_VOLUME: &str = "tokentap-inject-config";
const CONFIG_DIR: &str = "/etc/tokentap";
/// tokentap's own preStop sleep: the kubelet sleeps (distroless has no shell).
pub const PRESTOP_SECONDS: i64 = 5;
/// Kubernetes' default terminationGracePeriodSeconds.
const DEFAULT_GRACE: i64 = 30;
/// The most shutdown.drain_timeout is given (the shipped config's value).
const MAX_DRAIN: i64 = 30;

/// What an injection did to the traffic, for the Services and routes around the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wiring {
    /// The engine's port number (unchanged; tokentap forwards to it on loopback).
    pub engine_port: u16,
    /// The name the engine's port had, now tokentap's proxy port's name.
    pub engine_port_name: Option<String>,
    /// tokentap's proxy port.
    pub http_port: u16,
    /// The name of tokentap's proxy port.
    pub http_port_name: String,
    /// The name of tokentap's admin port (`metrics` unless the pod already has one).
    pub metrics_port_name: String,
}

/// The result of [`inject`].
#[derive(Debug)]
pub enum Injection {
    /// The injected template (settings replaced when it already was).
    Injected { template: Value, wiring: Wiring },
    /// `tokentap.dev/inject: disabled` on the template: left as it is.
    OptedOut,
}

/// How the engine's port was renamed (the [`settings::ENGINE_PORT_RENAME`] annotation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Rename {
    container: String,
    original: String,
    renamed: String,
}

/// Whether the template carries an injection (the settings-hash annotation).
pub fn is_injected(template: &Value) -> bool {
    annotation(template, settings::SETTINGS_HASH).is_some()
}

/// A label or annotation value on the template.
pub fn annotation<'a>(template: &'a Value, key: &str) -> Option<&'a str> {
    template
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

pub fn label<'a>(template: &'a Value, key: &str) -> Option<&'a str> {
    template
        .pointer("/metadata/labels")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

/// `tokentap.dev/inject: disabled` as a label or an annotation.
pub fn opted_out(template: &Value) -> bool {
    annotation(template, settings::INJECT) == Some("disabled")
        || label(template, settings::INJECT) == Some("disabled")
}

fn string_map(template: &Value, pointer: &str) -> Result<BTreeMap<String, String>, Refusal> {
    match template.pointer(pointer) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| Refusal::Malformed {
            what: format!("{pointer}: {}", shown(&e.to_string())),
        }),
    }
}

/// Inject tokentap into a pod template. `workload` names it in messages
/// (`Deployment ns/name`).
pub fn inject(template: &Value, options: &Options, workload: &str) -> Result<Injection, Refusal> {
    let template = uninject(template)?;
    if opted_out(&template) {
        return Ok(Injection::OptedOut);
    }
    let annotations = string_map(&template, "/metadata/annotations")?;
    let settings = Settings::resolve(&annotations, options).map_err(|e| e.at(workload))?;
    let spec_value = template.get("spec").cloned().unwrap_or(Value::Null);
    let spec: PodSpec = serde_json::from_value(spec_value).map_err(|e| Refusal::Malformed {
        what: format!("{workload}: the pod spec: {}", shown(&e.to_string())),
    })?;
    if spec.host_network == Some(true) {
        return Err(Refusal::HostNetwork {
            workload: workload.to_string(),
        });
    }
    let containers = &spec.containers;
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    if containers.iter().any(|c| c.name == CONTAINER) || inits.iter().any(|c| c.name == CONTAINER) {
        return Err(Refusal::AlreadyHasTokentap {
            workload: workload.to_string(),
        });
    }
    // Restartable init containers (native sidecars, like llm-d's routing proxy) serve
    // too: the engine port may be theirs.
    let sidecars: Vec<&Container> = inits
        .iter()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .collect();
    let serving: Vec<&Container> = containers.iter().chain(sidecars.iter().copied()).collect();

    let (engine, engine_port) =
        find_engine(&serving, containers, &settings, &annotations, workload)?;
    let engine_name = engine.map(|c| c.name.clone());
    let declared = engine.and_then(|c| {
        c.ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.container_port == i32::from(engine_port))
    });
    let original_name = declared.and_then(|p| p.name.clone());

    let all: Vec<&Container> = containers.iter().chain(inits.iter()).collect();
    let mut names = pod_port_names(&all, &settings, engine_port, workload)?;
    let (rename, http_name, metrics_name) = tokentap_port_names(
        &mut names,
        original_name.as_ref(),
        engine_name.as_ref(),
        workload,
    )?;
    let drain = drain_seconds(&spec, workload)?;

    if settings.config_map.is_some()
        && spec
            .volumes
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|v| v.name == CONFIG_VOLUME)
    {
        return Err(Refusal::Malformed {
            what: format!("{workload}: a volume is already named {CONFIG_VOLUME}"),
        });
    }

    let hash = settings.hash(engine_port, drain);
    let sidecar = sidecar(&settings, engine_port, &http_name, &metrics_name, drain);

    let out = write_injection(template, &settings, hash, rename.as_ref(), &sidecar);
    Ok(Injection::Injected {
        template: out,
        wiring: Wiring {
            engine_port,
            engine_port_name: original_name,
            http_port: settings.http_port,
            http_port_name: http_name,
            metrics_port_name: metrics_name,
        },
    })
}

/// Every port name in the pod, after checking that tokentap's ports are free: none is
/// the engine's port or a port of another container.
fn pod_port_names(
    all: &[&Container],
    settings: &Settings,
    engine_port: u16,
    workload: &str,
) -> Result<BTreeSet<String>, Refusal> {
    let mut numbers = BTreeMap::new();
    let mut names = BTreeSet::new();
    for c in all {
        for p in c.ports.as_deref().unwrap_or_default() {
            numbers.insert(p.container_port, c.name.clone());
            if let Some(n) = &p.name {
                names.insert(n.clone());
            }
        }
    }
    for (port, what) in [
        (settings.http_port, "tokentap's proxy port"),
        (settings.metrics_port, "tokentap's admin port"),
        (settings.ui_port, "tokentap's live view (loopback)"),
    ] {
        if port == engine_port {
            return Err(Refusal::PortCollision {
                workload: workload.to_string(),
                detail: format!(
                    "{what} {port} is the engine's port: set {} / {} (--http-port, --metrics-port)",
                    settings::HTTP_PORT,
                    settings::METRICS_PORT
                ),
            });
        }
        if let Some(owner) = numbers.get(&i32::from(port)) {
            return Err(Refusal::PortCollision {
                workload: workload.to_string(),
                detail: format!(
                    "{what} {port} is already a port of container `{}`: set {} / {} (--http-port, --metrics-port)",
                    shown(owner),
                    settings::HTTP_PORT,
                    settings::METRICS_PORT
                ),
            });
        }
    }

    Ok(names)
}

/// The port names after injection: the engine's port name moves to tokentap (its port
/// is renamed, [`Rename`]), tokentap's proxy and admin ports take free names. `names`
/// gains the names taken.
fn tokentap_port_names(
    names: &mut BTreeSet<String>,
    original_name: Option<&String>,
    engine_name: Option<&String>,
    workload: &str,
) -> Result<(Option<Rename>, String, String), Refusal> {
    let rename = match (original_name, engine_name) {
        (Some(original), Some(container)) => {
            let renamed = ["engine", "engine-port", "tt-engine"]
                .into_iter()
                .find(|n| !names.contains(*n) && n != original)
                .ok_or_else(|| Refusal::PortCollision {
                    workload: workload.to_string(),
                    detail: "no free name for the engine's port".to_string(),
                })?;
            names.insert(renamed.to_string());
            Some(Rename {
                container: container.clone(),
                original: original.clone(),
                renamed: renamed.to_string(),
            })
        }
        _ => None,
    };
    let http_name = match original_name {
        Some(n) => n.clone(),
        None => free_name(names, &["http", "tokentap", "tt-http"], workload)?,
    };
    names.insert(http_name.clone());
    let metrics_name = free_name(
        names,
        &["metrics", "tt-metrics", "tokentap-admin"],
        workload,
    )?;

    Ok((rename, http_name, metrics_name))
}

/// tokentap's drain, in seconds: inside the pod's grace period, after the engine's
/// preStop and tokentap's own.
fn drain_seconds(spec: &PodSpec, workload: &str) -> Result<u32, Refusal> {
    let containers = &spec.containers;
    // Shutdown: the engine's preStop, then tokentap's preStop and drain, inside the grace.
    let grace = spec
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_GRACE);
    let engine_sleep = containers
        .iter()
        .filter_map(|c| c.lifecycle.as_ref()?.pre_stop.as_ref()?.sleep.as_ref())
        .map(|s| s.seconds.max(0))
        .max()
        .unwrap_or(0);
    let available = grace
        .saturating_sub(engine_sleep)
        .saturating_sub(PRESTOP_SECONDS);
    if available < 2 {
        return Err(Refusal::GraceTooShort {
            workload: workload.to_string(),
            grace,
            needed: engine_sleep
                .saturating_add(PRESTOP_SECONDS)
                .saturating_add(2),
        });
    }
    // Half of what is left for tokentap's drain (the engine drains through it first),
    // at most the shipped 30 s.
    let drain = (available / 2).clamp(1, MAX_DRAIN);
    Ok(u32::try_from(drain).unwrap_or(30))
}

/// The template with tokentap in it (changed as JSON, keeping what the types do not
/// know): the settings' hash and the port rename in its annotations, the engine's port
/// renamed, the sidecar among its init containers and the ConfigMap's volume.
fn write_injection(
    template: Value,
    settings: &Settings,
    hash: String,
    rename: Option<&Rename>,
    sidecar: &Container,
) -> Value {
    // Now change the template (as JSON, keeping what the types do not know).
    let mut out = template;
    let root = object(&mut out);
    let meta = object(
        root.entry("metadata")
            .or_insert_with(|| Value::Object(Map::new())),
    );
    let ann = object(
        meta.entry("annotations")
            .or_insert_with(|| Value::Object(Map::new())),
    );
    ann.insert(settings::SETTINGS_HASH.to_string(), Value::String(hash));
    if let Some(r) = rename {
        ann.insert(
            settings::ENGINE_PORT_RENAME.to_string(),
            Value::String(serde_json::to_string(r).unwrap_or_default()),
        );
    }
    let spec_obj = object(
        root.entry("spec")
            .or_insert_with(|| Value::Object(Map::new())),
    );
    if let Some(r) = rename {
        rename_port(spec_obj, &r.container, &r.original, &r.renamed);
    }
    let inits = spec_obj
        .entry("initContainers")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !inits.is_array() {
        *inits = Value::Array(Vec::new());
    }
    if let Value::Array(list) = inits {
        list.push(serde_json::to_value(sidecar).unwrap_or(Value::Null));
    }
    if let Some(cm) = &settings.config_map {
        let volume = Volume {
            name: CONFIG_VOLUME.to_string(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let volumes = spec_obj
            .entry("volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = volumes {
            list.push(serde_json::to_value(&volume).unwrap_or(Value::Null));
        }
    }
    out
}

fn free_name(
    taken: &BTreeSet<String>,
    candidates: &[&str],
    workload: &str,
) -> Result<String, Refusal> {
    candidates
        .iter()
        .find(|n| !taken.contains(**n))
        .map(|n| (*n).to_string())
        .ok_or_else(|| Refusal::PortCollision {
            workload: workload.to_string(),
            detail: format!("the port names {} are all taken", candidates.join(", ")),
        })
}

/// The engine container (when one declares the port) and the engine port.
fn find_engine<'a>(
    serving: &[&'a Container],
    containers: &'a [Container],
    settings: &Settings,
    annotations: &BTreeMap<String, String>,
    workload: &str,
) -> Result<(Option<&'a Container>, u16), Refusal> {
    let named = settings.engine_container.as_deref().or_else(|| {
        annotations
            .get("kubectl.kubernetes.io/default-container")
            .map(String::as_str)
    });
    if let Some(port) = settings.engine_port {
        let owner = serving.iter().copied().find(|c| {
            c.ports
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|p| p.container_port == i32::from(port))
        });
        return Ok((owner, port));
    }
    let engine = match named {
        Some(name) => serving
            .iter()
            .copied()
            .find(|c| c.name == name)
            .ok_or_else(|| Refusal::NoEngine {
                workload: workload.to_string(),
                detail: format!("no container named `{}`", shown(name)),
            })?,
        None => match containers {
            [one] => one,
            [] => {
                return Err(Refusal::NoEngine {
                    workload: workload.to_string(),
                    detail: "the pod has no containers".to_string(),
                })
            }
            many => {
                return Err(Refusal::NoEngine {
                    workload: workload.to_string(),
                    detail: format!(
                        "{} containers ({}): name the engine with {} or --engine-container",
                        many.len(),
                        many.iter()
                            .map(|c| shown(&c.name))
                            .collect::<Vec<_>>()
                            .join(", "),
                        settings::ENGINE_CONTAINER
                    ),
                })
            }
        },
    };
    let ports: Vec<&ContainerPort> = engine
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .collect();
    match ports.as_slice() {
        [one] => {
            let port = u16::try_from(one.container_port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| Refusal::Malformed {
                    what: format!("{workload}: container port {}", one.container_port),
                })?;
            Ok((Some(engine), port))
        }
        [] => Err(Refusal::NoEnginePort {
            workload: workload.to_string(),
            container: shown(&engine.name),
        }),
        many => Err(Refusal::AmbiguousEnginePort {
            workload: workload.to_string(),
            container: shown(&engine.name),
            ports: many
                .iter()
                .map(|p| match &p.name {
                    Some(n) => format!("{} ({})", p.container_port, shown(n)),
                    None => p.container_port.to_string(),
                })
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The native sidecar, with everything the shipped `deploy/` sidecar overlay has.
fn sidecar(
    s: &Settings,
    engine_port: u16,
    http_name: &str,
    metrics_name: &str,
    drain: u32,
) -> Container {
    let field = |name: &str, path: &str| EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let probe = |path: &str, period: i32, timeout: Option<i32>, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String(metrics_name.to_string()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: timeout,
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let quantities = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.to_string())),
            ("memory".to_string(), Quantity(memory.to_string())),
        ])
    };
    Container {
        name: CONTAINER.to_string(),
        image: Some(s.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        restart_policy: Some("Always".to_string()),
        args: Some(sidecar_args(s, engine_port, drain)),
        env: Some(vec![
            field("K8S_POD_NAME", "metadata.name"),
            field("K8S_POD_UID", "metadata.uid"),
            field("K8S_NAMESPACE_NAME", "metadata.namespace"),
            field("K8S_NODE_NAME", "spec.nodeName"),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some(http_name.to_string()),
                container_port: i32::from(s.http_port),
                protocol: Some("TCP".to_string()),
                ..Default::default()
            },
            ContainerPort {
                name: Some(metrics_name.to_string()),
                container_port: i32::from(s.metrics_port),
                protocol: Some("TCP".to_string()),
                ..Default::default()
            },
        ]),
        // /healthz, not /readyz: the engine starts only after this probe passes.
        startup_probe: Some(probe("/healthz", 1, None, 30)),
        liveness_probe: Some(probe("/healthz", 10, Some(2), 3)),
        readiness_probe: Some(probe("/readyz", 5, Some(2), 2)),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: PRESTOP_SECONDS,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&s.cpu_request, &s.memory_request)),
            limits: Some(quantities(&s.cpu_limit, &s.memory_limit)),
            ..Default::default()
        }),
        security_context: Some(restricted_security_context()),
        volume_mounts: s.config_map.as_ref().map(|_| {
            vec![VolumeMount {
                name: CONFIG_VOLUME.to_string(),
                mount_path: CONFIG_DIR.to_string(),
                read_only: Some(true),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

/// tokentap's command line in the sidecar.
fn sidecar_args(s: &Settings, engine_port: u16, drain: u32) -> Vec<String> {
    let mut args = vec![];
    if s.config_map.is_some() {
        args.push("--config".to_string());
        args.push(format!("{CONFIG_DIR}/tokentap.yaml"));
    }
    args.extend([
        format!("--upstream=http://127.0.0.1:{engine_port}"),
        format!("--listen=0.0.0.0:{}", s.http_port),
        format!("--admin=0.0.0.0:{}", s.metrics_port),
        format!("--ui-listen={}:{}", settings::UI_HOST, s.ui_port),
    ]);
    if let Some(header) = &s.tenant_header {
        args.push(format!("--tenant-header={header}"));
    }
    if s.config_map.is_none() {
        // With a ConfigMap these come from it (its drain_timeout must fit the grace).
        args.push("--log-format=json".to_string());
        args.push(format!("--drain-timeout={drain}s"));
    }
    args
}

/// The sidecar's security context: Kubernetes' `restricted` Pod Security Standard.
fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The object inside a value, made one if it is not.
fn object(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m,
        // Unreachable: made an object just above.
        _ => unreachable_map(),
    }
}

#[allow(clippy::panic)]
fn unreachable_map() -> ! {
    panic!("a value made an object is an object")
}

/// Rename a container's port, and its own probes' and lifecycle handlers' references to
/// it (the kubelet resolves a named probe port within the container).
fn rename_port(spec: &mut Map<String, Value>, container: &str, from: &str, to: &str) {
    for list in ["containers", "initContainers"] {
        let Some(Value::Array(cs)) = spec.get_mut(list) else {
            continue;
        };
        for c in cs.iter_mut() {
            if c.get("name").and_then(Value::as_str) != Some(container) {
                continue;
            }
            if let Some(Value::Array(ports)) = c.get_mut("ports") {
                for p in ports.iter_mut() {
                    if p.get("name").and_then(Value::as_str) == Some(from) {
                        if let Some(m) = p.as_object_mut() {
                            m.insert("name".to_string(), Value::String(to.to_string()));
                        }
                    }
                }
            }
            for handler in [
                "/livenessProbe",
                "/readinessProbe",
                "/startupProbe",
                "/lifecycle/preStop",
                "/lifecycle/postStart",
            ] {
                for action in ["httpGet", "tcpSocket"] {
                    let pointer = format!("{handler}/{action}/port");
                    if let Some(port) = c.pointer_mut(&pointer) {
                        if port.as_str() == Some(from) {
                            *port = Value::String(to.to_string());
                        }
                    }
                }
            }
        }
    }
}

/// Remove an injection: the sidecar, its volume, the engine port's name and the
/// annotations injection wrote. A template without the settings-hash annotation is
/// returned as it is.
pub fn uninject(template: &Value) -> Result<Value, Refusal> {
    if !is_injected(template) {
        return Ok(template.clone());
    }
    let mut out = template.clone();
    let rename: Option<Rename> = match annotation(&out, settings::ENGINE_PORT_RENAME) {
        Some(text) => Some(serde_json::from_str(text).map_err(|_| Refusal::Malformed {
            what: format!(
                "annotation {} is not what injection wrote",
                settings::ENGINE_PORT_RENAME
            ),
        })?),
        None => None,
    };
    let root = object(&mut out);
    if let Some(Value::Object(meta)) = root.get_mut("metadata") {
        if let Some(Value::Object(ann)) = meta.get_mut("annotations") {
            ann.remove(settings::SETTINGS_HASH);
            ann.remove(settings::ENGINE_PORT_RENAME);
            if ann.is_empty() {
                meta.remove("annotations");
            }
        }
        if meta.is_empty() {
            root.remove("metadata");
        }
    }
    if let Some(Value::Object(spec)) = root.get_mut("spec") {
        if let Some(r) = &rename {
            rename_port(spec, &r.container, &r.renamed, &r.original);
        }
        remove_named(spec, "initContainers", CONTAINER);
        remove_named(spec, "volumes", CONFIG_VOLUME);
    }
    Ok(out)
}

fn remove_named(spec: &mut Map<String, Value>, list: &str, name: &str) {
    let Some(Value::Array(items)) = spec.get_mut(list) else {
        return;
    };
    items.retain(|i| i.get("name").and_then(Value::as_str) != Some(name));
    if items.is_empty() {
        spec.remove(list);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options() -> Options {
        Options {
            image: "tokentap:0.1.0".into(),
            ..Options::default()
        }
    }

    fn template(spec: Value) -> Value {
        json!({"metadata": {"labels": {"app": "x"}}, "spec": spec})
    }

    fn engine(ports: Value) -> Value {
        json!({"name": "engine", "image": "e:1", "ports": ports})
    }

    #[test]
    fn refusals_name_the_workload_and_their_reason() {
        let cases = [
            (
                json!({"hostNetwork": true, "containers": [engine(json!([{"containerPort": 8000}]))]}),
                "host_network",
            ),
            (json!({"containers": [engine(json!([]))]}), "no_engine_port"),
            (
                json!({"containers": [engine(json!([{"containerPort": 8080}]))]}),
                "port_collision",
            ),
            (
                json!({"containers": [engine(json!([{"containerPort": 8000}])),
                {"name": "side", "image": "s:1", "ports": [{"containerPort": 9464}]}]}),
                "no_engine_container",
            ),
            (
                json!({"terminationGracePeriodSeconds": 6, "containers": [engine(json!([{"containerPort": 8000}]))]}),
                "grace_too_short",
            ),
            (
                json!({"containers": [engine(json!([{"containerPort": 8000}])), {"name": "tokentap", "image": "t"}]}),
                "tokentap_present",
            ),
            (json!({"containers": "engine"}), "malformed"),
        ];
        for (spec, reason) in cases {
            let err = inject(&template(spec.clone()), &options(), "Deployment ns/x").unwrap_err();
            assert_eq!(err.reason(), reason, "{spec}");
            if reason != "malformed" {
                assert!(err.to_string().contains("Deployment ns/x"), "{err}");
            }
        }
    }

    #[test]
    fn drain_fits_the_grace_period() {
        let spec = |grace: i64, sleep: i64| {
            let mut e = engine(json!([{"containerPort": 8000}]));
            e["lifecycle"] = json!({"preStop": {"sleep": {"seconds": sleep}}});
            template(json!({"terminationGracePeriodSeconds": grace, "containers": [e]}))
        };
        for (grace, sleep, drain) in [
            (120, 10, 30),
            (30, 0, 12),
            (20, 0, 7),
            (9, 0, 2),
            (120, 100, 7),
        ] {
            let Injection::Injected { template, .. } =
                inject(&spec(grace, sleep), &options(), "x").unwrap()
            else {
                panic!("not injected");
            };
            let args = template
                .pointer("/spec/initContainers/0/args")
                .unwrap()
                .to_string();
            assert!(
                args.contains(&format!("--drain-timeout={drain}s")),
                "{grace} {sleep}: {args}"
            );
            assert!(sleep + PRESTOP_SECONDS + drain < grace);
        }
    }
}
