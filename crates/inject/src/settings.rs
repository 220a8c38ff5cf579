//! What the sidecar is configured with, and where each value comes from: a pod-template
//! annotation wins over the command's flags (or the webhook's), which win over the
//! defaults. The annotation is the workload's own, more specific choice; the flags are
//! the defaults for everything one command (or one webhook) injects. Every annotation
//! value is hostile: checked here before it reaches a container spec.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Refusal;

/// Annotation and label prefix.
pub const PREFIX: &str = "tokentap.dev/";
/// Label or annotation: `enabled` opts a pod in (the webhook's selectors use the label),
/// `disabled` opts it out of the CLI and the webhook alike.
pub const INJECT: &str = "tokentap.dev/inject";
/// The engine's port number (otherwise the engine container's single declared port).
pub const ENGINE_PORT: &str = "tokentap.dev/engine-port";
/// The engine container's name, when the pod has several containers.
pub const ENGINE_CONTAINER: &str = "tokentap.dev/engine-container";
/// The tokentap image.
pub const IMAGE: &str = "tokentap.dev/image";
/// An existing ConfigMap with a `tokentap.yaml` key, mounted and passed with `--config`.
pub const CONFIG_MAP: &str = "tokentap.dev/config-map";
/// tokentap's proxy port (default 8080) and admin port (default 9464).
pub const HTTP_PORT: &str = "tokentap.dev/http-port";
pub const METRICS_PORT: &str = "tokentap.dev/metrics-port";
/// The live view's loopback port (default 9465; never a container port).
pub const UI_PORT: &str = "tokentap.dev/ui-port";
/// The request header that names the tenant (`--tenant-header`).
pub const TENANT_HEADER: &str = "tokentap.dev/tenant-header";
/// Resources of the sidecar.
pub const CPU_REQUEST: &str = "tokentap.dev/cpu-request";
pub const CPU_LIMIT: &str = "tokentap.dev/cpu-limit";
pub const MEMORY_REQUEST: &str = "tokentap.dev/memory-request";
pub const MEMORY_LIMIT: &str = "tokentap.dev/memory-limit";

/// Written by injection: the settings hash (a change rolls the pods, and tells an
/// injected template from a hand-written one).
pub const SETTINGS_HASH: &str = "tokentap.dev/settings-hash";
/// Written by injection: how the engine's port was renamed, for `--uninject`.
pub const ENGINE_PORT_RENAME: &str = "tokentap.dev/engine-port-rename";
/// Written by injection on a Service or InferencePool: the target ports it had.
pub const ORIGINAL_TARGET_PORTS: &str = "tokentap.dev/original-target-ports";

/// The live view listens on the pod's loopback only, never on a container port.
pub const UI_HOST: &str = "127.0.0.1";
pub const DEFAULT_UI_PORT: u16 = 9465;

/// Defaults for every pod one command or one webhook injects (its flags).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The image when no annotation names one; required (the CLI passes its own
    /// version's).
    pub image: String,
    pub engine_port: Option<u16>,
    pub engine_container: Option<String>,
    pub config_map: Option<String>,
    pub http_port: Option<u16>,
    pub metrics_port: Option<u16>,
    pub ui_port: Option<u16>,
    pub tenant_header: Option<String>,
    pub cpu_request: Option<String>,
    pub cpu_limit: Option<String>,
    pub memory_request: Option<String>,
    pub memory_limit: Option<String>,
}

/// One pod's resolved settings; hashed into [`SETTINGS_HASH`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Settings {
    pub image: String,
    pub engine_port: Option<u16>,
    pub engine_container: Option<String>,
    pub config_map: Option<String>,
    pub http_port: u16,
    pub metrics_port: u16,
    pub ui_port: u16,
    pub tenant_header: Option<String>,
    pub cpu_request: String,
    pub cpu_limit: String,
    pub memory_request: String,
    pub memory_limit: String,
}

impl Settings {
    /// Resolve from the pod template's annotations and the command's options.
    pub fn resolve(
        annotations: &BTreeMap<String, String>,
        options: &Options,
    ) -> Result<Settings, Refusal> {
        let get = |key: &str| annotations.get(key).map(String::as_str);
        let text = |key: &str, flag: &Option<String>, default: &str| -> String {
            get(key)
                .map(str::to_string)
                .or_else(|| flag.clone())
                .unwrap_or_else(|| default.to_string())
        };
        let port = |key: &str, flag: Option<u16>| -> Result<Option<u16>, Refusal> {
            match get(key) {
                Some(v) => parse_port(v).map(Some).ok_or_else(|| Refusal::Annotation {
                    workload: String::new(),
                    key: key.to_string(),
                    reason: format!("`{}` is not a port number (1-65535)", shown(v)),
                }),
                None => Ok(flag),
            }
        };
        let settings = Settings {
            image: text(IMAGE, &Some(options.image.clone()), ""),
            engine_port: port(ENGINE_PORT, options.engine_port)?,
            engine_container: get(ENGINE_CONTAINER)
                .map(str::to_string)
                .or_else(|| options.engine_container.clone()),
            config_map: get(CONFIG_MAP)
                .map(str::to_string)
                .or_else(|| options.config_map.clone()),
            http_port: port(HTTP_PORT, options.http_port)?.unwrap_or(8080),
            metrics_port: port(METRICS_PORT, options.metrics_port)?.unwrap_or(9464),
            ui_port: port(UI_PORT, options.ui_port)?.unwrap_or(DEFAULT_UI_PORT),
            tenant_header: get(TENANT_HEADER)
                .map(str::to_string)
                .or_else(|| options.tenant_header.clone()),
            cpu_request: text(CPU_REQUEST, &options.cpu_request, "100m"),
            cpu_limit: text(CPU_LIMIT, &options.cpu_limit, "1"),
            memory_request: text(MEMORY_REQUEST, &options.memory_request, "64Mi"),
            memory_limit: text(MEMORY_LIMIT, &options.memory_limit, "256Mi"),
        };
        settings.check()?;
        Ok(settings)
    }

    fn check(&self) -> Result<(), Refusal> {
        let bad = |key: &str, reason: String| {
            Err(Refusal::Annotation {
                workload: String::new(),
                key: key.to_string(),
                reason,
            })
        };
        if !is_image(&self.image) {
            return bad(
                IMAGE,
                format!("`{}` is not an image reference", shown(&self.image)),
            );
        }
        if let Some(name) = &self.engine_container {
            if !is_dns_label(name) {
                return bad(
                    ENGINE_CONTAINER,
                    format!("`{}` is not a container name", shown(name)),
                );
            }
        }
        if let Some(name) = &self.tenant_header {
            if !is_header_name(name) {
                return bad(
                    TENANT_HEADER,
                    format!("`{}` is not a header name", shown(name)),
                );
            }
        }
        if let Some(name) = &self.config_map {
            if !is_dns_subdomain(name) {
                return bad(
                    CONFIG_MAP,
                    format!("`{}` is not a ConfigMap name", shown(name)),
                );
            }
        }
        for (key, value) in [
            (CPU_REQUEST, &self.cpu_request),
            (CPU_LIMIT, &self.cpu_limit),
            (MEMORY_REQUEST, &self.memory_request),
            (MEMORY_LIMIT, &self.memory_limit),
        ] {
            if !is_quantity(value) {
                return bad(
                    key,
                    format!("`{}` is not a resource quantity", shown(value)),
                );
            }
        }
        if self.http_port == self.metrics_port {
            return bad(
                METRICS_PORT,
                format!("the admin port equals the proxy port {}", self.http_port),
            );
        }
        if self.ui_port == self.http_port || self.ui_port == self.metrics_port {
            return bad(
                UI_PORT,
                format!("the live view's port {} is a container port", self.ui_port),
            );
        }
        Ok(())
    }

    /// The hash of everything that shapes the sidecar (and the scheme's version), as
    /// 16 hex digits: a change of any setting changes the pod template, so a rollout
    /// follows it.
    pub fn hash(&self, engine_port: u16, drain_seconds: u32) -> String {
        #[derive(Serialize)]
        struct Hashed<'a> {
            scheme: u32,
            settings: &'a Settings,
            engine_port: u16,
            drain_seconds: u32,
        }
        let bytes = serde_json::to_vec(&Hashed {
            scheme: 1,
            settings: self,
            engine_port,
            drain_seconds,
        })
        .unwrap_or_default();
        let digest = Sha256::digest(&bytes);
        hex::encode(digest.get(..8).unwrap_or_default())
    }
}

fn parse_port(v: &str) -> Option<u16> {
    if v.is_empty() || v.len() > 5 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u16>().ok().filter(|p| *p > 0)
}

/// A value from outside, fit to appear in a message: at most 64 characters, control
/// characters escaped.
pub fn shown(v: &str) -> String {
    let mut out: String = v.chars().take(64).flat_map(char::escape_debug).collect();
    if v.chars().count() > 64 {
        out.push_str("...");
    }
    out
}

fn is_image(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 512
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@+".contains(&b))
}

/// An HTTP header name as tokentap matches it: a lower-case token.
fn is_header_name(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// RFC 1123 label (container names, port names are stricter and checked where made).
pub fn is_dns_label(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-')
}

fn is_dns_subdomain(v: &str) -> bool {
    v.len() <= 253 && v.split('.').all(is_dns_label)
}

/// A Kubernetes quantity as people write them for CPU and memory: a decimal number and
/// an optional suffix.
fn is_quantity(v: &str) -> bool {
    const SUFFIXES: [&str; 14] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    if v.is_empty() || v.len() > 32 {
        return false;
    }
    let digits_end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, suffix) = v.split_at(digits_end);
    !number.is_empty()
        && number.bytes().filter(|b| *b == b'.').count() <= 1
        && number != "."
        && SUFFIXES.contains(&suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            image: "tokentap:0.1.0".into(),
            ..Options::default()
        }
    }

    #[test]
    fn annotations_win_over_flags_and_are_checked() {
        let mut a = BTreeMap::new();
        a.insert(IMAGE.to_string(), "r.example/tokentap:0.2.0".to_string());
        let mut o = options();
        o.cpu_limit = Some("2".into());
        let s = Settings::resolve(&a, &o).unwrap();
        assert_eq!(s.image, "r.example/tokentap:0.2.0");
        assert_eq!(s.cpu_limit, "2");
        assert_eq!(s.http_port, 8080);

        for (key, value) in [
            (IMAGE, "a b"),
            (ENGINE_PORT, "0"),
            (ENGINE_PORT, "70000"),
            (ENGINE_PORT, "+80"),
            (CPU_REQUEST, "1e3x"),
            (MEMORY_LIMIT, "\u{1b}[2J"),
            (CONFIG_MAP, "Not_A_Name"),
            (HTTP_PORT, "9464"),
            (HTTP_PORT, "9465"),
            (UI_PORT, "8080"),
            (TENANT_HEADER, "X Tenant"),
        ] {
            let mut a = BTreeMap::new();
            a.insert(key.to_string(), value.to_string());
            let err = Settings::resolve(&a, &options()).unwrap_err();
            assert_eq!(err.reason(), "invalid_setting", "{key}={value}");
            assert!(!err.to_string().contains('\u{1b}'));
        }
    }

    #[test]
    fn hash_follows_every_setting() {
        let s = Settings::resolve(&BTreeMap::new(), &options()).unwrap();
        let mut t = s.clone();
        t.image = "tokentap:0.2.0".into();
        assert_eq!(s.hash(8000, 30), s.hash(8000, 30));
        assert_ne!(s.hash(8000, 30), t.hash(8000, 30));
        assert_ne!(s.hash(8000, 30), s.hash(8001, 30));
        assert_eq!(s.hash(8000, 30).len(), 16);
    }
}
