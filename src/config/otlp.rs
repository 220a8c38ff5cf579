//! The `otlp` section and the OpenTelemetry SDK's environment variables, merged into the
//! one [`Otlp`] setting the exporter runs with (or none: the push is off).
//!
//! The variables are read as the OpenTelemetry specification defines them
//! (`specification/protocol/exporter.md`, `configuration/sdk-environment-variables.md`):
//! an empty value is an unset one; the signal-specific variable
//! (`OTEL_EXPORTER_OTLP_METRICS_*`) wins over the generic one (`OTEL_EXPORTER_OTLP_*`);
//! `http/protobuf` appends `/v1/metrics` to the generic endpoint's path and uses the
//! signal-specific one as written; durations are integer milliseconds; headers and
//! resource attributes are comma-separated `key=value` lists with percent-encoded values;
//! `OTEL_SDK_DISABLED` is true only when it says `true` (any case). Like code configuring
//! an SDK, a key written in the file wins over its variable. Where the specification
//! would log a warning and carry on (a value that does not parse), tokentap refuses to
//! start and names the variable: a push silently sent elsewhere or never is worse.
//!
//! Spans (`otlp.traces`, [`OtlpTraces`]) are opt-in: `otlp.traces.enabled`, else
//! `OTEL_TRACES_EXPORTER` (`otlp` or `none`; unset is off, unlike an SDK's default). They
//! read the same file keys as the metrics push for protocol, headers, compression and
//! timeout, then the `OTEL_EXPORTER_OTLP_TRACES_*` variables, then the generic ones;
//! their URL is `otlp.traces.endpoint`, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
//! derived from `otlp.endpoint`, else the generic endpoint with `v1/traces`. The sampler
//! (`OTEL_TRACES_SAMPLER`, `_ARG`) and the batch processor (`OTEL_BSP_*`) are checked
//! whether or not spans are on.
//!
//! Header values are secrets (API keys): no error and no `Debug` ever shows one.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Uri};

use super::raw::{RawOtlp, RawOtlpTraces};
use super::units::{parse_http_url, shown, HttpUrl, HumanDuration};
use super::validate::Issues;
use crate::summary::spans::Sampler;

/// The gRPC method every metrics export calls.
pub const GRPC_METRICS_PATH: &str =
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
/// What `http/protobuf` appends to `OTEL_EXPORTER_OTLP_ENDPOINT`.
const HTTP_METRICS_PATH: &str = "v1/metrics";
/// The gRPC method every span export calls.
pub const GRPC_TRACES_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const HTTP_TRACES_PATH: &str = "v1/traces";

const fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
const fn default_interval() -> Duration {
    Duration::from_secs(60)
}
const fn default_export_timeout() -> Duration {
    Duration::from_secs(30)
}

/// The environment variables that name a pod's identity (set from the downward API) and
/// the resource attributes they become, below `OTEL_RESOURCE_ATTRIBUTES`.
pub const POD_ATTRIBUTES: [(&str, &str); 4] = [
    ("K8S_POD_NAME", "k8s.pod.name"),
    ("K8S_POD_UID", "k8s.pod.uid"),
    ("K8S_NAMESPACE_NAME", "k8s.namespace.name"),
    ("K8S_NODE_NAME", "k8s.node.name"),
];

/// How exports travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with a protobuf body: `POST` to the endpoint.
    HttpProtobuf,
    /// OTLP/gRPC: the `MetricsService/Export` unary call over HTTP/2.
    Grpc,
}

/// The body's compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpCompression {
    None,
    Gzip,
}

/// The validated OTLP push.
#[derive(Clone, Debug, PartialEq)]
pub struct Otlp {
    /// The full URL requests go to (for gRPC, the collector's authority and the method's
    /// path).
    pub url: Uri,
    pub link: OtlpLink,
    pub interval: Duration,
    /// One export's time with its retries.
    pub export_timeout: Duration,
    /// Resource attributes, sorted by key.
    pub resource: Vec<(String, String)>,
    /// Per-request spans, when on.
    pub traces: Option<OtlpTraces>,
}

/// How one signal's exports travel, but its URL: the file's keys over the signal's
/// variables over the generic ones. Both signals and the transport share it.
#[derive(Clone, PartialEq)]
pub struct OtlpLink {
    pub protocol: OtlpProtocol,
    /// Sent with every export; the values are secrets.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub compression: OtlpCompression,
    /// One export request's timeout.
    pub timeout: Duration,
    /// The files an `https://` collector is verified with and tokentap proves itself by.
    pub tls: OtlpTls,
}

impl fmt::Debug for OtlpLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("OtlpLink")
            .field("protocol", &self.protocol)
            .field("headers", &header_names)
            .field("compression", &self.compression)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

/// The TLS files of an export's connection: a CA file to trust beside the platform's and
/// webpki's roots, and a client certificate and key for a collector that asks for one
/// (both or neither). Each says where it was written, so a file that cannot be read is
/// reported against the key or variable that named it; they are read at start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OtlpTls {
    pub ca_file: Option<TlsFile>,
    pub client_certificate: Option<TlsFile>,
    pub client_key: Option<TlsFile>,
}

/// A file path and the key (`otlp.ca_file`) or `$VARIABLE` it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFile {
    pub path: PathBuf,
    pub from: String,
}

/// The validated span export: where and how spans go, which requests get one, and the
/// batch processor's bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpTraces {
    pub url: Uri,
    pub link: OtlpLink,
    pub sampler: Sampler,
    /// The longest a finished span waits before it is sent.
    pub schedule_delay: Duration,
    /// Spans waiting at most; more are dropped (and counted).
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    /// One export's time with its retries.
    pub export_timeout: Duration,
}

/// Reads a variable as the specification does: empty is unset.
struct Env<'e>(&'e BTreeMap<String, String>);

impl Env<'_> {
    fn get(&self, name: &'static str) -> Option<(&'static str, &str)> {
        self.0
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(|v| (name, v))
    }

    /// The first of `names` that is set.
    fn first(&self, names: &[&'static str]) -> Option<(&'static str, &str)> {
        names.iter().find_map(|name| self.get(name))
    }
}

/// Where an issue about an environment variable is reported: its name, `$`-prefixed so it
/// reads apart from a file key.
fn var(name: &str) -> String {
    format!("${name}")
}

/// The variables one signal reads, signal-specific first.
struct SignalVars {
    endpoint: &'static str,
    protocol: [&'static str; 2],
    headers: [&'static str; 2],
    compression: [&'static str; 2],
    timeout: [&'static str; 2],
    certificate: [&'static str; 2],
    client_certificate: [&'static str; 2],
    client_key: [&'static str; 2],
    /// What `http/protobuf` appends to the generic endpoint's path.
    http_path: &'static str,
    /// The gRPC method.
    grpc_path: &'static str,
}

const METRICS: SignalVars = SignalVars {
    endpoint: "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    protocol: [
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ],
    headers: [
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ],
    compression: [
        "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ],
    timeout: [
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ],
    certificate: [
        "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ],
    client_certificate: [
        "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    ],
    client_key: [
        "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    ],
    http_path: HTTP_METRICS_PATH,
    grpc_path: GRPC_METRICS_PATH,
};

const TRACES: SignalVars = SignalVars {
    endpoint: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    protocol: [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ],
    headers: [
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ],
    compression: [
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ],
    timeout: [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ],
    certificate: [
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ],
    client_certificate: [
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    ],
    client_key: [
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    ],
    http_path: HTTP_TRACES_PATH,
    grpc_path: GRPC_TRACES_PATH,
};

/// The file's keys an [`OtlpLink`] is made of (shared by both signals).
#[derive(Clone)]
struct FileLink {
    protocol: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    compression: Option<String>,
    timeout: Option<HumanDuration>,
    ca_file: Option<PathBuf>,
    client_certificate: Option<PathBuf>,
    client_key: Option<PathBuf>,
}

/// A duration from the file's `key` or the first of the variables `names` set, in whole
/// milliseconds; zero is refused.
fn millis(
    issues: &mut Issues<'_>,
    env: &Env<'_>,
    key: &str,
    file: Option<HumanDuration>,
    names: &[&'static str],
    default: Duration,
) -> Duration {
    let value = match file {
        Some(d) => Some((key.to_string(), d.0)),
        None => env
            .first(names)
            .and_then(|(name, text)| match milliseconds(text) {
                Ok(d) => Some((var(name), d)),
                Err(m) => {
                    issues.push(&var(name), m);
                    None
                }
            }),
    };
    match value {
        Some((path, d)) if d.is_zero() => {
            issues.push(&path, "must be more than zero");
            default
        }
        Some((_, d)) => d,
        None => default,
    }
}

impl FileLink {
    fn resolve(self, issues: &mut Issues<'_>, env: &Env<'_>, vars: &SignalVars) -> OtlpLink {
        let protocol = match self.protocol.as_deref() {
            Some(text) => protocol(text)
                .map_err(|m| issues.push("otlp.protocol", m))
                .ok(),
            None => match env.first(&vars.protocol) {
                Some((name, text)) => protocol(text).map_err(|m| issues.push(&var(name), m)).ok(),
                None => Some(OtlpProtocol::HttpProtobuf),
            },
        }
        .unwrap_or(OtlpProtocol::HttpProtobuf);

        let headers = match self.headers {
            Some(map) => file_headers(issues, map),
            None => match env.first(&vars.headers) {
                Some((name, text)) => env_headers(text).unwrap_or_else(|m| {
                    issues.push(&var(name), m);
                    Vec::new()
                }),
                None => Vec::new(),
            },
        };

        let compression = match self.compression.as_deref() {
            Some(text) => compression(text)
                .map_err(|m| issues.push("otlp.compression", m))
                .ok(),
            None => match env.first(&vars.compression) {
                Some((name, text)) => compression(text)
                    .map_err(|m| issues.push(&var(name), m))
                    .ok(),
                None => None,
            },
        }
        .unwrap_or(OtlpCompression::None);

        let timeout = millis(
            issues,
            env,
            "otlp.timeout",
            self.timeout,
            &vars.timeout,
            default_timeout(),
        );
        let file = |key: &'static str, path: Option<PathBuf>| {
            path.map(|path| TlsFile {
                path,
                from: key.to_string(),
            })
        };
        let tls_file = |key: &'static str, path: Option<PathBuf>, names: &[&'static str]| {
            file(key, path).or_else(|| {
                env.first(names).map(|(name, text)| TlsFile {
                    path: PathBuf::from(text),
                    from: var(name),
                })
            })
        };
        let tls = OtlpTls {
            ca_file: tls_file("otlp.ca_file", self.ca_file, &vars.certificate),
            client_certificate: tls_file(
                "otlp.client_certificate",
                self.client_certificate,
                &vars.client_certificate,
            ),
            client_key: tls_file("otlp.client_key", self.client_key, &vars.client_key),
        };
        match (&tls.client_certificate, &tls.client_key) {
            (Some(certificate), None) => issues.push(
                &certificate.from,
                "a client certificate needs its key (otlp.client_key or \
                 $OTEL_EXPORTER_OTLP_CLIENT_KEY)",
            ),
            (None, Some(key)) => issues.push(
                &key.from,
                "a client key needs its certificate (otlp.client_certificate or \
                 $OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE)",
            ),
            _ => {}
        }
        OtlpLink {
            protocol,
            headers,
            compression,
            timeout,
            tls,
        }
    }
}

impl RawOtlp {
    pub(super) fn validate(
        self,
        issues: &mut Issues<'_>,
        environment: &BTreeMap<String, String>,
    ) -> Option<Otlp> {
        let env = Env(environment);
        let disabled = env
            .get("OTEL_SDK_DISABLED")
            .is_some_and(|(_, v)| v.eq_ignore_ascii_case("true"));
        let file_endpoint = self.endpoint.as_deref();
        let signal_endpoint = env.get(METRICS.endpoint);
        let generic_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT");
        let before = issues.found.len();
        let traces_wanted = traces_wanted(issues, &env, self.traces.as_ref());
        let wanted = match self.enabled {
            Some(enabled) => enabled,
            None => {
                file_endpoint.is_some()
                    || signal_endpoint.is_some()
                    || generic_endpoint.is_some()
                    || traces_wanted
            }
        };

        let file_link = FileLink {
            protocol: self.protocol,
            headers: self.headers,
            compression: self.compression,
            timeout: self.timeout,
            ca_file: self.ca_file,
            client_certificate: self.client_certificate,
            client_key: self.client_key,
        };
        let link = file_link.clone().resolve(issues, &env, &METRICS);
        let url = if let Some(text) = file_endpoint {
            endpoint(text, link.protocol, &METRICS, false)
                .map_err(|m| issues.push("otlp.endpoint", m))
        } else if let Some((name, text)) = signal_endpoint {
            endpoint(text, link.protocol, &METRICS, false).map_err(|m| issues.push(&var(name), m))
        } else if let Some((name, text)) = generic_endpoint {
            endpoint(text, link.protocol, &METRICS, true).map_err(|m| issues.push(&var(name), m))
        } else {
            endpoint(default_base(link.protocol), link.protocol, &METRICS, true).map_err(|_| ())
        }
        .ok();

        if let Some((name, text)) = env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") {
            if !text.eq_ignore_ascii_case("cumulative") {
                issues.push(
                    &var(name),
                    format!(
                        "`{text}` is not supported: tokentap exports cumulative temporality only"
                    ),
                );
            }
        }

        let interval = millis(
            issues,
            &env,
            "otlp.interval",
            self.interval,
            &["OTEL_METRIC_EXPORT_INTERVAL"],
            default_interval(),
        );
        let export_timeout = millis(
            issues,
            &env,
            "otlp.export_timeout",
            self.export_timeout,
            &["OTEL_METRIC_EXPORT_TIMEOUT"],
            default_export_timeout(),
        );

        let resource = resource(issues, &env, self.resource_attributes);

        let traces = traces(
            issues,
            &env,
            self.traces.unwrap_or_default(),
            file_link,
            file_endpoint,
            traces_wanted,
        );
        // The keys and variables both signals read are checked twice: say each once.
        let mut seen = Vec::new();
        let mut at = before;
        while at < issues.found.len() {
            if seen.contains(&issues.found[at]) {
                issues.found.remove(at);
            } else {
                seen.push(issues.found[at].clone());
                at += 1;
            }
        }

        // A bad value is an error even while the push is off: turning it on later must
        // not be the moment it surfaces.
        if issues.found.len() > before || disabled || !wanted {
            return None;
        }
        Some(Otlp {
            url: url?,
            link,
            interval,
            export_timeout,
            resource,
            traces: if traces_wanted { traces } else { None },
        })
    }
}

fn default_base(protocol: OtlpProtocol) -> &'static str {
    match protocol {
        OtlpProtocol::HttpProtobuf => "http://localhost:4318",
        OtlpProtocol::Grpc => "http://localhost:4317",
    }
}

/// Whether spans are asked for: `otlp.traces.enabled`, else `OTEL_TRACES_EXPORTER`
/// (`otlp` on, `none` off; unset is off, since spans are opt-in here where the SDK's
/// default would be `otlp`).
fn traces_wanted(issues: &mut Issues<'_>, env: &Env<'_>, file: Option<&RawOtlpTraces>) -> bool {
    if let Some(enabled) = file.and_then(|t| t.enabled) {
        return enabled;
    }
    match env.get("OTEL_TRACES_EXPORTER") {
        None => false,
        Some((_, "otlp")) => true,
        Some((_, "none")) => false,
        Some((name, other)) => {
            issues.push(
                &var(name),
                format!(
                    "`{}` is not supported: tokentap exports spans over OTLP only (`otlp` or `none`)",
                    shown(other)
                ),
            );
            false
        }
    }
}

/// The span export's settings. Read (and checked) whether or not spans are on.
fn traces(
    issues: &mut Issues<'_>,
    env: &Env<'_>,
    raw: RawOtlpTraces,
    file_link: FileLink,
    file_endpoint: Option<&str>,
    wanted: bool,
) -> Option<OtlpTraces> {
    let before = issues.found.len();
    let link = file_link.resolve(issues, env, &TRACES);
    let url = if let Some(text) = raw.endpoint.as_deref() {
        endpoint(text, link.protocol, &TRACES, false)
            .map_err(|m| issues.push("otlp.traces.endpoint", m))
    } else if let Some((name, text)) = env.get(TRACES.endpoint) {
        endpoint(text, link.protocol, &TRACES, false).map_err(|m| issues.push(&var(name), m))
    } else if let Some(text) = file_endpoint {
        // The metrics URL's collector: gRPC's authority; over HTTP its path with the
        // signal's last part swapped, when it has the usual one.
        match link.protocol {
            OtlpProtocol::Grpc => endpoint(text, link.protocol, &TRACES, false),
            OtlpProtocol::HttpProtobuf => match text.trim_end_matches('/').strip_suffix(HTTP_METRICS_PATH) {
                Some(base) => endpoint(base, link.protocol, &TRACES, true),
                None => Err(
                    "set `otlp.traces.endpoint` (or $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): `otlp.endpoint` does not end in `/v1/metrics`, so the traces URL cannot be derived from it".to_string(),
                ),
            },
        }
        // Only spans need it: with them off, a metrics URL of another shape is fine.
        .map_err(|m| {
            if wanted {
                issues.push("otlp.endpoint", m)
            }
        })
    } else if let Some((name, text)) = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") {
        endpoint(text, link.protocol, &TRACES, true).map_err(|m| issues.push(&var(name), m))
    } else {
        endpoint(default_base(link.protocol), link.protocol, &TRACES, true).map_err(|_| ())
    }
    .ok();

    let sampler = sampler(
        issues,
        env,
        raw.sampler.as_deref(),
        raw.sampler_ratio.map(|n| n.0),
    );
    let schedule_delay = millis(
        issues,
        env,
        "otlp.traces.schedule_delay",
        raw.schedule_delay,
        &["OTEL_BSP_SCHEDULE_DELAY"],
        Duration::from_secs(5),
    );
    let export_timeout = millis(
        issues,
        env,
        "otlp.traces.export_timeout",
        raw.export_timeout,
        &["OTEL_BSP_EXPORT_TIMEOUT"],
        default_export_timeout(),
    );
    let max_queue_size = count(
        issues,
        env,
        "otlp.traces.max_queue_size",
        raw.max_queue_size.map(|c| c.0),
        "OTEL_BSP_MAX_QUEUE_SIZE",
        2048,
    );
    let max_export_batch_size = count(
        issues,
        env,
        "otlp.traces.max_export_batch_size",
        raw.max_export_batch_size.map(|c| c.0),
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        512,
    );
    if max_export_batch_size > max_queue_size {
        let path = if raw.max_export_batch_size.is_some() {
            "otlp.traces.max_export_batch_size".to_string()
        } else {
            var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
        };
        issues.push(
            &path,
            format!("{max_export_batch_size} is more than the queue's {max_queue_size} spans"),
        );
    }
    if issues.found.len() > before {
        return None;
    }
    Some(OtlpTraces {
        url: url?,
        link,
        sampler,
        schedule_delay,
        max_queue_size,
        max_export_batch_size,
        export_timeout,
    })
}

/// The most spans a queue may hold: enough for any batch processor, and a typo of a few
/// zeros does not reserve gigabytes.
const MAX_QUEUE: usize = 1 << 20;

/// A count of spans from the file's `key` or the variable `name`: 1 to [`MAX_QUEUE`].
fn count(
    issues: &mut Issues<'_>,
    env: &Env<'_>,
    key: &str,
    file: Option<usize>,
    name: &'static str,
    default: usize,
) -> usize {
    let (path, value) = match file {
        Some(n) => (key.to_string(), n),
        None => match env.get(name) {
            Some((name, text)) => match text.parse::<usize>() {
                Ok(n) => (var(name), n),
                Err(_) => {
                    issues.push(
                        &var(name),
                        format!("`{}` is not a whole number", shown(text)),
                    );
                    return default;
                }
            },
            None => return default,
        },
    };
    if !(1..=MAX_QUEUE).contains(&value) {
        issues.push(&path, format!("{value} is not from 1 to {MAX_QUEUE}"));
        return default;
    }
    value
}

/// The sampler: the file's `sampler` and `sampler_ratio` over `OTEL_TRACES_SAMPLER` and
/// `OTEL_TRACES_SAMPLER_ARG` (read only for a ratio sampler, as the specification says).
fn sampler(
    issues: &mut Issues<'_>,
    env: &Env<'_>,
    file: Option<&str>,
    file_ratio: Option<f64>,
) -> Sampler {
    let (path, name) = match (file, file_ratio) {
        (Some(name), _) => ("otlp.traces.sampler".to_string(), name),
        (None, Some(_)) => (String::new(), "parentbased_traceidratio"),
        (None, None) => match env.get("OTEL_TRACES_SAMPLER") {
            Some((variable, name)) => (var(variable), name),
            None => (String::new(), "parentbased_always_on"),
        },
    };
    let (parent_based, fixed) = match name {
        "always_on" => (false, Some(1.0)),
        "always_off" => (false, Some(0.0)),
        "traceidratio" => (false, None),
        "parentbased_always_on" => (true, Some(1.0)),
        "parentbased_always_off" => (true, Some(0.0)),
        "parentbased_traceidratio" => (true, None),
        other => {
            issues.push(
                &path,
                format!(
                    "`{}` is not one of `parentbased_always_on`, `parentbased_always_off`, `parentbased_traceidratio`, `always_on`, `always_off`, `traceidratio`",
                    shown(other)
                ),
            );
            return Sampler {
                parent_based: true,
                ratio: 1.0,
            };
        }
    };
    let ratio = match fixed {
        Some(ratio) => {
            if file_ratio.is_some() {
                issues.push(
                    "otlp.traces.sampler_ratio",
                    format!("applies to a ratio sampler only, not `{name}`"),
                );
            }
            ratio
        }
        None => {
            let (path, ratio) = match file_ratio {
                Some(r) => ("otlp.traces.sampler_ratio".to_string(), Some(r)),
                None => match env.get("OTEL_TRACES_SAMPLER_ARG") {
                    Some((variable, text)) => {
                        (var(variable), text.parse::<f64>().ok().or(Some(f64::NAN)))
                    }
                    None => (String::new(), None),
                },
            };
            match ratio {
                None => 1.0,
                Some(r) if (0.0..=1.0).contains(&r) => r,
                Some(_) => {
                    issues.push(&path, "must be a number from 0 to 1");
                    1.0
                }
            }
        }
    };
    Sampler {
        parent_based,
        ratio,
    }
}

fn protocol(text: &str) -> Result<OtlpProtocol, String> {
    match text {
        "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
        "grpc" => Ok(OtlpProtocol::Grpc),
        "http/json" => Err("`http/json` is not supported: use `http/protobuf` or `grpc`".into()),
        other => Err(format!("`{other}` is not one of `http/protobuf`, `grpc`")),
    }
}

fn compression(text: &str) -> Result<OtlpCompression, String> {
    match text {
        "gzip" => Ok(OtlpCompression::Gzip),
        "none" => Ok(OtlpCompression::None),
        other => Err(format!("`{other}` is not one of `gzip`, `none`")),
    }
}

/// A duration in integer milliseconds, as the specification writes them.
fn milliseconds(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("`{text}` is not a whole number of milliseconds"))
}

/// The URL `signal`'s exports go to. `append` is for the generic endpoint:
/// `http/protobuf` appends `v1/metrics` (`v1/traces`) to its path; gRPC takes only its
/// scheme and authority.
fn endpoint(
    text: &str,
    protocol: OtlpProtocol,
    signal: &SignalVars,
    append: bool,
) -> Result<Uri, String> {
    let HttpUrl {
        scheme,
        authority,
        uri,
    } = parse_http_url(text)?;
    let path = match protocol {
        OtlpProtocol::Grpc => {
            if !matches!(uri.path(), "" | "/") {
                return Err(format!(
                    "a gRPC endpoint is a scheme and an authority, without a path (`{}`)",
                    uri.path()
                ));
            }
            signal.grpc_path.to_string()
        }
        OtlpProtocol::HttpProtobuf if append => {
            let base = uri.path();
            let path = signal.http_path;
            if base.ends_with('/') {
                format!("{base}{path}")
            } else {
                format!("{base}/{path}")
            }
        }
        OtlpProtocol::HttpProtobuf => uri
            .path_and_query()
            .map_or("/".to_string(), |p| p.as_str().to_string()),
    };
    let path: PathAndQuery = path
        .parse()
        .map_err(|_| format!("`{}` has an invalid path", shown(text)))?;
    Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|e| format!("`{}` is not a URL: {e}", shown(text)))
}

fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("`{}` is not a header name", shown(name.trim())))?;
    // Never echo a value: it may be a key.
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of header `{name}` is not a valid header value"))?;
    Ok((name, value))
}

fn file_headers(
    issues: &mut Issues<'_>,
    map: BTreeMap<String, String>,
) -> Vec<(HeaderName, HeaderValue)> {
    map.iter()
        .filter_map(|(name, value)| {
            header(name, value)
                .map_err(|m| issues.push(&format!("otlp.headers.{name}"), m))
                .ok()
        })
        .collect()
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `name=value,name2=value2`, values percent-encoded.
fn env_headers(text: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    pairs(text)?
        .into_iter()
        .map(|(name, value)| header(&name, &value))
        .collect()
}

/// A comma-separated `key=value` list (W3C Baggage's shape, as the specification reads
/// headers and resource attributes), each value percent-decoded. Errors say which item,
/// never what it holds.
fn pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .enumerate()
        .filter(|(_, item)| !item.trim().is_empty())
        .map(|(i, item)| {
            let n = i + 1;
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("item {n} is not `key=value`"))?;
            let key = key.trim();
            if key.is_empty() {
                return Err(format!("item {n} has an empty key"));
            }
            let value = percent_decode(value.trim()).ok_or_else(|| {
                format!(
                    "the value of item {n} (`{}`) is not valid percent-encoded UTF-8",
                    shown(key)
                )
            })?;
            Ok((key.to_string(), value))
        })
        .collect()
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The resource, lowest precedence first: `service.name=tokentap` and `service.version`,
/// the pod's `K8S_*` variables, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`, then the
/// file's `otlp.resource_attributes`.
fn resource(
    issues: &mut Issues<'_>,
    env: &Env<'_>,
    file: Option<BTreeMap<String, String>>,
) -> Vec<(String, String)> {
    let mut attributes = BTreeMap::new();
    attributes.insert("service.name".to_string(), "tokentap".to_string());
    attributes.insert(
        "service.version".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    for (variable, key) in POD_ATTRIBUTES {
        if let Some((_, value)) = env.get(variable) {
            attributes.insert(key.to_string(), value.to_string());
        }
    }
    if let Some((name, text)) = env.get("OTEL_RESOURCE_ATTRIBUTES") {
        match pairs(text) {
            Ok(pairs) => attributes.extend(pairs),
            Err(m) => issues.push(&var(name), m),
        }
    }
    if let Some((_, name)) = env.get("OTEL_SERVICE_NAME") {
        attributes.insert("service.name".to_string(), name.to_string());
    }
    for (key, value) in file.into_iter().flatten() {
        if key.trim().is_empty() {
            issues.push("otlp.resource_attributes", "an attribute key is empty");
        } else {
            attributes.insert(key, value);
        }
    }
    attributes.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::super::{Config, ConfigIssue, Overrides};
    use super::*;

    const UPSTREAM: &str = "upstream: http://127.0.0.1:8000\n";

    fn load(file: &str, env: &[(&str, &str)]) -> Result<Option<Otlp>, Vec<ConfigIssue>> {
        let overrides = Overrides {
            environment: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Overrides::default()
        };
        Config::from_yaml(&format!("{UPSTREAM}{file}"), "t.yaml", &overrides)
            .map(|c| c.otlp)
            .map_err(|e| e.issues().to_vec())
    }

    fn on(file: &str, env: &[(&str, &str)]) -> Otlp {
        load(file, env)
            .unwrap_or_else(|e| panic!("{e:?}"))
            .expect("push on")
    }

    #[test]
    fn debug_names_headers_but_never_shows_their_values() {
        let otlp = on(
            "otlp:\n  headers:\n    api-key: file-secret\n  traces:\n    enabled: true\n",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "t-key=env-secret"),
            ],
        );
        let shown = format!("{otlp:?}");
        assert!(shown.contains("api-key"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn off_without_an_endpoint_and_on_with_the_generic_one_alone() {
        assert_eq!(load("", &[]), Ok(None));
        let otlp = on(
            "",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
        );
        assert_eq!(otlp.link.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(otlp.url, "http://collector:4318/v1/metrics");
        assert_eq!(otlp.interval, Duration::from_secs(60));
        assert_eq!(otlp.link.timeout, Duration::from_secs(10));
        assert_eq!(otlp.export_timeout, Duration::from_secs(30));
        assert_eq!(otlp.link.compression, OtlpCompression::None);
        assert!(otlp
            .resource
            .contains(&("service.name".into(), "tokentap".into())));
        assert!(otlp
            .resource
            .contains(&("service.version".into(), env!("CARGO_PKG_VERSION").into())));
    }

    #[test]
    fn endpoints_follow_the_specification() {
        let url = |file: &str, env: &[(&str, &str)]| on(file, env).url.to_string();
        // The generic endpoint's path gets `v1/metrics` appended, slash or not.
        assert_eq!(
            url(
                "",
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318/base/")]
            ),
            "https://c:4318/base/v1/metrics"
        );
        // The signal-specific one is used as written, and wins over the generic one.
        assert_eq!(
            url(
                "",
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4318"),
                    ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://c:9/custom")
                ]
            ),
            "http://c:9/custom"
        );
        // The file wins over both.
        assert_eq!(
            url(
                "otlp:\n  endpoint: http://file:1/m\n",
                &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://c:9/custom")]
            ),
            "http://file:1/m"
        );
        // gRPC calls the service's method on the endpoint's authority.
        assert_eq!(
            url(
                "",
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
                ]
            ),
            format!("http://c:4317{GRPC_METRICS_PATH}")
        );
        // `enabled: true` alone: the default endpoint.
        assert_eq!(
            url("otlp:\n  enabled: true\n", &[]),
            "http://localhost:4318/v1/metrics"
        );
        // An empty variable is an unset one.
        assert_eq!(load("", &[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]), Ok(None));
    }

    #[test]
    fn signal_specific_variables_win_and_the_file_wins_over_them() {
        let otlp = on(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
                ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "2500"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
                ("OTEL_METRIC_EXPORT_TIMEOUT", "7000"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=generic"),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
                    "api-key=a%20b, x-other = 2",
                ),
            ],
        );
        assert_eq!(otlp.link.protocol, OtlpProtocol::Grpc);
        assert_eq!(otlp.link.timeout, Duration::from_millis(2500));
        assert_eq!(otlp.interval, Duration::from_secs(5));
        assert_eq!(otlp.export_timeout, Duration::from_secs(7));
        assert_eq!(otlp.link.compression, OtlpCompression::Gzip);
        assert_eq!(otlp.link.headers.len(), 2);
        assert_eq!(otlp.link.headers[0].0, "api-key");
        assert_eq!(otlp.link.headers[0].1, "a b");
        assert!(
            !format!("{otlp:?}").contains("a b"),
            "header values are never shown"
        );

        let file = "otlp:\n  protocol: http/protobuf\n  interval: 2s\n  timeout: 1s\n  compression: none\n  headers:\n    k: v\n";
        let otlp = on(
            file,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "9000"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=generic"),
            ],
        );
        assert_eq!(otlp.link.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(otlp.interval, Duration::from_secs(2));
        assert_eq!(otlp.link.timeout, Duration::from_secs(1));
        assert_eq!(otlp.link.compression, OtlpCompression::None);
        assert_eq!(otlp.link.headers.len(), 1);
        assert_eq!(otlp.link.headers[0].0, "k");
    }

    #[test]
    fn disabled_by_the_sdk_switch_or_the_file() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        assert_eq!(
            load("", &[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]),
            Ok(None)
        );
        assert_eq!(
            load("otlp:\n  enabled: true\n", &[("OTEL_SDK_DISABLED", "true")]),
            Ok(None)
        );
        // Anything but `true` is false, as the specification says.
        assert!(on("", &[endpoint, ("OTEL_SDK_DISABLED", "yes")]).interval > Duration::ZERO);
        assert_eq!(load("otlp:\n  enabled: false\n", &[endpoint]), Ok(None));
    }

    #[test]
    fn resource_attributes_layer_in_order() {
        let otlp = on(
            "otlp:\n  resource_attributes:\n    deployment.environment.name: prod\n    team: file\n",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("K8S_POD_NAME", "tokentap-abc"),
                ("K8S_NAMESPACE_NAME", "llm"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs,team=env,k8s.namespace.name=ns%2F2"),
                ("OTEL_SERVICE_NAME", "sidecar"),
            ],
        );
        let get = |key: &str| {
            otlp.resource
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("service.name"), Some("sidecar"));
        assert_eq!(get("k8s.pod.name"), Some("tokentap-abc"));
        assert_eq!(get("k8s.namespace.name"), Some("ns/2"));
        assert_eq!(get("team"), Some("file"));
        assert_eq!(get("deployment.environment.name"), Some("prod"));
    }

    /// An endpoint that is valid, for the cases whose fault is elsewhere.
    const ENDPOINT: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");

    /// Hostile values: the file, the environment, the key or variable the error names,
    /// and what its message says.
    type HostileCase = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
    );

    const HOSTILE_VALUES: &[HostileCase] = &[
        (
            "",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")],
            "$OTEL_EXPORTER_OTLP_ENDPOINT",
            "not a URL",
        ),
        (
            "",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c:21")],
            "$OTEL_EXPORTER_OTLP_ENDPOINT",
            "not supported",
        ),
        (
            "",
            &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "c:4318")],
            "$OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "scheme",
        ),
        (
            "",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://u:p@c:4318")],
            "$OTEL_EXPORTER_OTLP_ENDPOINT",
            "credentials",
        ),
        (
            "",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:0")],
            "$OTEL_EXPORTER_OTLP_ENDPOINT",
            "port",
        ),
        (
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317/x"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            "$OTEL_EXPORTER_OTLP_ENDPOINT",
            "without a path",
        ),
        ("otlp:\n  endpoint: nope\n", &[], "otlp.endpoint", "scheme"),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
            "$OTEL_EXPORTER_OTLP_PROTOCOL",
            "`http/json` is not supported",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "udp")],
            "$OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "not one of",
        ),
        (
            "otlp:\n  protocol: http/json\n",
            &[ENDPOINT],
            "otlp.protocol",
            "not supported",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_METRIC_EXPORT_INTERVAL", "-5")],
            "$OTEL_METRIC_EXPORT_INTERVAL",
            "milliseconds",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_METRIC_EXPORT_INTERVAL", "10s")],
            "$OTEL_METRIC_EXPORT_INTERVAL",
            "milliseconds",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_METRIC_EXPORT_INTERVAL", "0")],
            "$OTEL_METRIC_EXPORT_INTERVAL",
            "more than zero",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_TIMEOUT", "1e3")],
            "$OTEL_EXPORTER_OTLP_TIMEOUT",
            "milliseconds",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_METRIC_EXPORT_TIMEOUT", "soon")],
            "$OTEL_METRIC_EXPORT_TIMEOUT",
            "milliseconds",
        ),
        (
            "otlp:\n  interval: 0s\n",
            &[ENDPOINT],
            "otlp.interval",
            "more than zero",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_HEADERS", "api-key")],
            "$OTEL_EXPORTER_OTLP_HEADERS",
            "item 1 is not `key=value`",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,=2")],
            "$OTEL_EXPORTER_OTLP_HEADERS",
            "item 2 has an empty key",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=1")],
            "$OTEL_EXPORTER_OTLP_HEADERS",
            "not a header name",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_HEADERS", "k=secret%zz")],
            "$OTEL_EXPORTER_OTLP_HEADERS",
            "percent-encoded",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_HEADERS", "k=line%0Abreak")],
            "$OTEL_EXPORTER_OTLP_HEADERS",
            "not a valid header value",
        ),
        (
            "otlp:\n  headers:\n    \"a b\": x\n",
            &[ENDPOINT],
            "otlp.headers.a b",
            "not a header name",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_RESOURCE_ATTRIBUTES", "a=1,b")],
            "$OTEL_RESOURCE_ATTRIBUTES",
            "item 2",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_RESOURCE_ATTRIBUTES", "a=%FF")],
            "$OTEL_RESOURCE_ATTRIBUTES",
            "percent-encoded UTF-8",
        ),
        (
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_COMPRESSION", "br")],
            "$OTEL_EXPORTER_OTLP_COMPRESSION",
            "not one of",
        ),
        (
            "",
            &[
                ENDPOINT,
                ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
            ],
            "$OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            "cumulative",
        ),
    ];

    #[test]
    fn hostile_values_are_errors_naming_the_variable_or_key() {
        for (file, env, path, message) in HOSTILE_VALUES {
            let issues = load(file, env).expect_err(&format!("{file:?} {env:?} must fail"));
            assert!(
                issues
                    .iter()
                    .any(|i| i.path == *path && i.message.contains(message)),
                "{file:?} {env:?}: expected `{path}`: ...{message}..., got {issues:?}"
            );
        }
        // A secret header value is never echoed.
        let issues = load(
            "",
            &[ENDPOINT, ("OTEL_EXPORTER_OTLP_HEADERS", "k=secret%zz")],
        )
        .unwrap_err();
        assert!(!format!("{issues:?}").contains("secret"), "{issues:?}");
        // A file key is located at its line.
        let issues = load("otlp:\n  protocol: http/json\n", &[]).unwrap_err();
        assert_eq!(issues[0].location.map(|(line, _)| line), Some(3));
    }

    fn traces(file: &str, env: &[(&str, &str)]) -> Option<OtlpTraces> {
        load(file, env)
            .unwrap_or_else(|e| panic!("{file:?} {env:?}: {e:?}"))
            .and_then(|otlp| otlp.traces)
    }

    /// TLS files: the file's keys over the signal's variables over the generic ones, each
    /// remembering what named it; a client certificate needs its key and the reverse.
    #[test]
    fn tls_files_follow_the_precedence_and_come_in_pairs() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318");
        let traces_on = ("OTEL_TRACES_EXPORTER", "otlp");
        let file = |tls: &Option<TlsFile>| tls.as_ref().map(|f| (f.path.clone(), f.from.clone()));
        let otlp = on(
            "",
            &[
                endpoint,
                traces_on,
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/generic/ca.pem"),
                ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces/ca.pem"),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem"),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem"),
            ],
        );
        assert_eq!(
            file(&otlp.link.tls.ca_file),
            Some((
                "/generic/ca.pem".into(),
                "$OTEL_EXPORTER_OTLP_CERTIFICATE".into()
            ))
        );
        let traces = otlp.traces.expect("spans on");
        assert_eq!(
            file(&traces.link.tls.ca_file),
            Some((
                "/traces/ca.pem".into(),
                "$OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE".into()
            ))
        );
        assert_eq!(
            file(&traces.link.tls.client_key),
            Some(("/k.pem".into(), "$OTEL_EXPORTER_OTLP_CLIENT_KEY".into()))
        );
        let otlp = on(
            "otlp:\n  ca_file: /file/ca.pem\n",
            &[
                endpoint,
                ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "/metrics/ca.pem"),
            ],
        );
        assert_eq!(
            file(&otlp.link.tls.ca_file),
            Some(("/file/ca.pem".into(), "otlp.ca_file".into()))
        );
        assert_eq!(otlp.link.tls.client_certificate, None);

        for (text, env, path) in [
            (
                "otlp:\n  client_certificate: /c.pem\n",
                vec![endpoint],
                "otlp.client_certificate",
            ),
            (
                "",
                vec![endpoint, ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem")],
                "$OTEL_EXPORTER_OTLP_CLIENT_KEY",
            ),
        ] {
            let issues = load(text, &env).expect_err("one without the other");
            assert_eq!(issues.len(), 1, "{issues:?}");
            assert_eq!(issues[0].path, path);
        }
    }

    /// Spans are opt-in: an endpoint alone pushes metrics only; `OTEL_TRACES_EXPORTER`
    /// or `otlp.traces.enabled` turns them on (and the push with them), the file winning.
    #[test]
    fn spans_are_opt_in_and_the_file_wins() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        assert!(traces("", &[endpoint]).is_none());
        assert!(traces("", &[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).is_none());
        let on = traces("", &[endpoint, ("OTEL_TRACES_EXPORTER", "otlp")]).expect("on");
        assert_eq!(on.url, "http://c:4318/v1/traces");
        assert_eq!(
            on.sampler,
            Sampler {
                parent_based: true,
                ratio: 1.0
            }
        );
        assert_eq!(on.schedule_delay, Duration::from_secs(5));
        assert_eq!(on.max_queue_size, 2048);
        assert_eq!(on.max_export_batch_size, 512);
        assert_eq!(on.export_timeout, Duration::from_secs(30));
        assert!(traces(
            "otlp:\n  traces:\n    enabled: false\n",
            &[endpoint, ("OTEL_TRACES_EXPORTER", "otlp")]
        )
        .is_none());
        // `enabled: true` alone turns the push on, to the default collector.
        let alone = traces("otlp:\n  traces:\n    enabled: true\n", &[]).expect("on");
        assert_eq!(alone.url, "http://localhost:4318/v1/traces");
        // The whole push off: no spans either.
        assert!(traces(
            "otlp:\n  enabled: false\n  traces:\n    enabled: true\n",
            &[]
        )
        .is_none());
        assert!(traces(
            "otlp:\n  traces:\n    enabled: true\n",
            &[("OTEL_SDK_DISABLED", "true")]
        )
        .is_none());
    }

    /// The variable that turns spans on (`otlp` is the only exporter).
    const TRACES_ON: (&str, &str) = ("OTEL_TRACES_EXPORTER", "otlp");

    /// Spans settings: the file, the environment, then the traces URL, whether the
    /// sampler is parent-based, and its ratio.
    type TracesCase = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
        bool,
        f64,
    );

    const TRACES_SETTINGS: &[TracesCase] = &[
        // The generic endpoint gets `v1/traces`; the signal's one is used as written.
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318/base/"),
            ],
            "https://c:4318/base/v1/traces",
            true,
            1.0,
        ),
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/spans"),
            ],
            "http://t:9/spans",
            true,
            1.0,
        ),
        // The file's metrics URL: its `/v1/metrics` becomes `/v1/traces`.
        (
            "otlp:\n  endpoint: http://f:4318/x/v1/metrics\n",
            &[TRACES_ON, ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")],
            "http://f:4318/x/v1/traces",
            true,
            1.0,
        ),
        // The file's traces key wins over everything.
        (
            "otlp:\n  traces:\n    endpoint: http://ft:1/t\n",
            &[
                TRACES_ON,
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/spans"),
            ],
            "http://ft:1/t",
            true,
            1.0,
        ),
        // gRPC: the collector's authority and TraceService's method.
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            "http://c:4317/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            true,
            1.0,
        ),
        (
            "otlp:\n  protocol: grpc\n  endpoint: http://g:4317\n",
            &[TRACES_ON],
            "http://g:4317/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            true,
            1.0,
        ),
        // Samplers.
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ],
            "http://localhost:4318/v1/traces",
            false,
            0.25,
        ),
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ],
            "http://localhost:4318/v1/traces",
            true,
            1.0,
        ),
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_TRACES_SAMPLER", "always_off"),
                ("OTEL_TRACES_SAMPLER_ARG", "junk"),
            ],
            "http://localhost:4318/v1/traces",
            false,
            0.0,
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_TRACES_SAMPLER", "parentbased_always_off")],
            "http://localhost:4318/v1/traces",
            true,
            0.0,
        ),
        (
            "otlp:\n  traces:\n    sampler_ratio: 0.1\n",
            &[TRACES_ON, ("OTEL_TRACES_SAMPLER", "always_on")],
            "http://localhost:4318/v1/traces",
            true,
            0.1,
        ),
        (
            "otlp:\n  traces:\n    sampler: always_on\n",
            &[TRACES_ON, ("OTEL_TRACES_SAMPLER", "always_off")],
            "http://localhost:4318/v1/traces",
            false,
            1.0,
        ),
    ];

    #[test]
    fn traces_settings_follow_the_specification() {
        let on = TRACES_ON;
        for (file, env, url, parent_based, ratio) in TRACES_SETTINGS {
            let t = traces(file, env).unwrap_or_else(|| panic!("{file:?} {env:?}: off"));
            assert_eq!(t.url.to_string(), *url, "{file:?} {env:?}");
            assert_eq!(
                t.sampler,
                Sampler {
                    parent_based: *parent_based,
                    ratio: *ratio
                },
                "{file:?} {env:?}"
            );
        }
        // The signal's variables win over the generic ones; the file's keys over both.
        let t = traces(
            "",
            &[
                on,
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
                ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip"),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=t%20k"),
                ("OTEL_BSP_SCHEDULE_DELAY", "200"),
                ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10"),
                ("OTEL_BSP_EXPORT_TIMEOUT", "4000"),
            ],
        )
        .unwrap();
        assert_eq!(t.link.protocol, OtlpProtocol::Grpc);
        assert_eq!(t.link.timeout, Duration::from_millis(2500));
        assert_eq!(t.link.compression, OtlpCompression::Gzip);
        assert_eq!(t.link.headers[0].1, "t k");
        assert!(
            !format!("{t:?}").contains("t k"),
            "header values are never shown"
        );
        assert_eq!(t.schedule_delay, Duration::from_millis(200));
        assert_eq!((t.max_queue_size, t.max_export_batch_size), (100, 10));
        assert_eq!(t.export_timeout, Duration::from_secs(4));
        let t = traces(
            "otlp:\n  compression: none\n  traces:\n    schedule_delay: 1s\n    max_queue_size: 8\n    max_export_batch_size: 8\n",
            &[
                on,
                ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip"),
                ("OTEL_BSP_SCHEDULE_DELAY", "200"),
                ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ],
        )
        .unwrap();
        assert_eq!(t.link.compression, OtlpCompression::None);
        assert_eq!(t.schedule_delay, Duration::from_secs(1));
        assert_eq!((t.max_queue_size, t.max_export_batch_size), (8, 8));
    }

    const BAD_TRACES_VALUES: &[HostileCase] = &[
        (
            "",
            &[("OTEL_TRACES_EXPORTER", "zipkin")],
            "$OTEL_TRACES_EXPORTER",
            "OTLP only",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_TRACES_SAMPLER", "jaeger_remote")],
            "$OTEL_TRACES_SAMPLER",
            "not one of",
        ),
        (
            "otlp:\n  traces:\n    sampler: sometimes\n",
            &[],
            "otlp.traces.sampler",
            "not one of",
        ),
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ],
            "$OTEL_TRACES_SAMPLER_ARG",
            "from 0 to 1",
        ),
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "half"),
            ],
            "$OTEL_TRACES_SAMPLER_ARG",
            "from 0 to 1",
        ),
        (
            "otlp:\n  traces:\n    sampler_ratio: -0.1\n",
            &[],
            "otlp.traces.sampler_ratio",
            "from 0 to 1",
        ),
        (
            "otlp:\n  traces:\n    sampler: always_on\n    sampler_ratio: 0.5\n",
            &[],
            "otlp.traces.sampler_ratio",
            "ratio sampler only",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "nope")],
            "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "scheme",
        ),
        (
            "otlp:\n  traces:\n    endpoint: ftp://x:1\n",
            &[],
            "otlp.traces.endpoint",
            "not supported",
        ),
        (
            "otlp:\n  endpoint: http://c:4318/custom\n",
            &[TRACES_ON],
            "otlp.endpoint",
            "otlp.traces.endpoint",
        ),
        (
            "",
            &[
                TRACES_ON,
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ],
            "$OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "not supported",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "k")],
            "$OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "key=value",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "5s")],
            "$OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "milliseconds",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_BSP_SCHEDULE_DELAY", "0")],
            "$OTEL_BSP_SCHEDULE_DELAY",
            "more than zero",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_BSP_EXPORT_TIMEOUT", "x")],
            "$OTEL_BSP_EXPORT_TIMEOUT",
            "milliseconds",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_BSP_MAX_QUEUE_SIZE", "0")],
            "$OTEL_BSP_MAX_QUEUE_SIZE",
            "from 1 to",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_BSP_MAX_QUEUE_SIZE", "-1")],
            "$OTEL_BSP_MAX_QUEUE_SIZE",
            "whole number",
        ),
        (
            "",
            &[TRACES_ON, ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096")],
            "$OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "more than the queue",
        ),
        (
            "otlp:\n  traces:\n    max_queue_size: 100000000\n",
            &[],
            "otlp.traces.max_queue_size",
            "from 1 to",
        ),
        (
            "otlp:\n  traces:\n    colour: red\n",
            &[],
            "otlp.traces",
            "unknown field",
        ),
    ];

    #[test]
    fn bad_traces_values_are_errors_naming_the_variable_or_key() {
        let on = TRACES_ON;
        for (file, env, path, message) in BAD_TRACES_VALUES {
            let issues = load(file, env).expect_err(&format!("{file:?} {env:?} must fail"));
            assert!(
                issues
                    .iter()
                    .any(|i| i.path.starts_with(*path) && i.message.contains(message)),
                "{file:?} {env:?}: expected `{path}`: ...{message}..., got {issues:?}"
            );
        }
        // A value both signals read is reported once.
        let issues = load("", &[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")]).unwrap_err();
        assert_eq!(issues.len(), 1, "{issues:?}");
        // Bad spans settings stop startup even while spans are off.
        assert!(load("", &[("OTEL_BSP_MAX_QUEUE_SIZE", "0")]).is_err());
    }
}
