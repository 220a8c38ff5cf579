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
//! Header values are secrets (API keys): no error and no `Debug` ever shows one.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Uri};

use super::raw::RawOtlp;
use super::units::HumanDuration;
use super::validate::Issues;

/// The gRPC method every metrics export calls.
pub const GRPC_METRICS_PATH: &str =
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
/// What `http/protobuf` appends to `OTEL_EXPORTER_OTLP_ENDPOINT`.
const HTTP_METRICS_PATH: &str = "v1/metrics";

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
#[derive(Clone, PartialEq)]
pub struct Otlp {
    pub protocol: OtlpProtocol,
    /// The full URL requests go to (for gRPC, the collector's authority and the method's
    /// path).
    pub url: Uri,
    /// Sent with every export; the values are secrets.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub compression: OtlpCompression,
    /// One export request's timeout.
    pub timeout: Duration,
    pub interval: Duration,
    /// One export's time with its retries.
    pub export_timeout: Duration,
    /// Resource attributes, sorted by key.
    pub resource: Vec<(String, String)>,
}

impl fmt::Debug for Otlp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Otlp")
            .field("protocol", &self.protocol)
            .field("url", &self.url)
            .field("headers", &header_names)
            .field("compression", &self.compression)
            .field("timeout", &self.timeout)
            .field("interval", &self.interval)
            .field("export_timeout", &self.export_timeout)
            .field("resource", &self.resource)
            .finish()
    }
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
        let signal_endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
        let generic_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT");
        let wanted = match self.enabled {
            Some(enabled) => enabled,
            None => {
                file_endpoint.is_some() || signal_endpoint.is_some() || generic_endpoint.is_some()
            }
        };
        let before = issues.found.len();

        let protocol = match self.protocol.as_deref() {
            Some(text) => protocol(text)
                .map_err(|m| issues.push("otlp.protocol", m))
                .ok(),
            None => match env.first(&[
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ]) {
                Some((name, text)) => protocol(text).map_err(|m| issues.push(&var(name), m)).ok(),
                None => Some(OtlpProtocol::HttpProtobuf),
            },
        }
        .unwrap_or(OtlpProtocol::HttpProtobuf);

        let url = if let Some(text) = file_endpoint {
            endpoint(text, protocol, false).map_err(|m| issues.push("otlp.endpoint", m))
        } else if let Some((name, text)) = signal_endpoint {
            endpoint(text, protocol, false).map_err(|m| issues.push(&var(name), m))
        } else if let Some((name, text)) = generic_endpoint {
            endpoint(text, protocol, true).map_err(|m| issues.push(&var(name), m))
        } else {
            let default = match protocol {
                OtlpProtocol::HttpProtobuf => "http://localhost:4318",
                OtlpProtocol::Grpc => "http://localhost:4317",
            };
            endpoint(default, protocol, true).map_err(|_| ())
        }
        .ok();

        let headers = match self.headers {
            Some(map) => file_headers(issues, map),
            None => match env.first(&[
                "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
                "OTEL_EXPORTER_OTLP_HEADERS",
            ]) {
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
            None => match env.first(&[
                "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
                "OTEL_EXPORTER_OTLP_COMPRESSION",
            ]) {
                Some((name, text)) => compression(text)
                    .map_err(|m| issues.push(&var(name), m))
                    .ok(),
                None => None,
            },
        }
        .unwrap_or(OtlpCompression::None);

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

        let mut millis =
            |key: &str, file: Option<HumanDuration>, names: &[&'static str], default: Duration| {
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
            };
        let timeout = millis(
            "otlp.timeout",
            self.timeout,
            &[
                "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ],
            default_timeout(),
        );
        let interval = millis(
            "otlp.interval",
            self.interval,
            &["OTEL_METRIC_EXPORT_INTERVAL"],
            default_interval(),
        );
        let export_timeout = millis(
            "otlp.export_timeout",
            self.export_timeout,
            &["OTEL_METRIC_EXPORT_TIMEOUT"],
            default_export_timeout(),
        );

        let resource = resource(issues, &env, self.resource_attributes);

        // A bad value is an error even while the push is off: turning it on later must
        // not be the moment it surfaces.
        if issues.found.len() > before || disabled || !wanted {
            return None;
        }
        Some(Otlp {
            protocol,
            url: url?,
            headers,
            compression,
            timeout,
            interval,
            export_timeout,
            resource,
        })
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

/// The URL exports go to. `append` is for the generic endpoint: `http/protobuf` appends
/// `v1/metrics` to its path; gRPC takes only its scheme and authority.
fn endpoint(text: &str, protocol: OtlpProtocol, append: bool) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|_| format!("`{}` is not a URL", shown(text)))?;
    let scheme = uri
        .scheme()
        .cloned()
        .ok_or_else(|| format!("`{}` has no scheme (use http:// or https://)", shown(text)))?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(format!(
            "scheme `{scheme}` is not supported (use http or https)"
        ));
    }
    let authority: Authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("`{}` has no host", shown(text)))?;
    if authority.as_str().contains('@') {
        return Err("the endpoint must not contain credentials (use `headers`)".to_string());
    }
    if authority.host().is_empty() {
        return Err(format!("`{}` has no host", shown(text)));
    }
    if authority.port().is_some() && authority.port_u16().is_none_or(|p| p == 0) {
        return Err(format!("`{}` has no valid port (1 to 65535)", shown(text)));
    }
    let path = match protocol {
        OtlpProtocol::Grpc => {
            if !matches!(uri.path(), "" | "/") {
                return Err(format!(
                    "a gRPC endpoint is a scheme and an authority, without a path (`{}`)",
                    uri.path()
                ));
            }
            GRPC_METRICS_PATH.to_string()
        }
        OtlpProtocol::HttpProtobuf if append => {
            let base = uri.path();
            if base.ends_with('/') {
                format!("{base}{HTTP_METRICS_PATH}")
            } else {
                format!("{base}/{HTTP_METRICS_PATH}")
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

/// A value in an error, cut short: enough to recognise, never a wall of text.
fn shown(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(80).collect();
    if chars.next().is_some() {
        format!("{head}...")
    } else {
        head
    }
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
    fn off_without_an_endpoint_and_on_with_the_generic_one_alone() {
        assert_eq!(load("", &[]), Ok(None));
        let otlp = on(
            "",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
        );
        assert_eq!(otlp.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(otlp.url, "http://collector:4318/v1/metrics");
        assert_eq!(otlp.interval, Duration::from_secs(60));
        assert_eq!(otlp.timeout, Duration::from_secs(10));
        assert_eq!(otlp.export_timeout, Duration::from_secs(30));
        assert_eq!(otlp.compression, OtlpCompression::None);
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
        assert_eq!(otlp.protocol, OtlpProtocol::Grpc);
        assert_eq!(otlp.timeout, Duration::from_millis(2500));
        assert_eq!(otlp.interval, Duration::from_secs(5));
        assert_eq!(otlp.export_timeout, Duration::from_secs(7));
        assert_eq!(otlp.compression, OtlpCompression::Gzip);
        assert_eq!(otlp.headers.len(), 2);
        assert_eq!(otlp.headers[0].0, "api-key");
        assert_eq!(otlp.headers[0].1, "a b");
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
        assert_eq!(otlp.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(otlp.interval, Duration::from_secs(2));
        assert_eq!(otlp.timeout, Duration::from_secs(1));
        assert_eq!(otlp.compression, OtlpCompression::None);
        assert_eq!(otlp.headers.len(), 1);
        assert_eq!(otlp.headers[0].0, "k");
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

    #[test]
    fn hostile_values_are_errors_naming_the_variable_or_key() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        // (file, environment, the key or variable named, what the message says)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
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
                &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "$OTEL_EXPORTER_OTLP_PROTOCOL",
                "`http/json` is not supported",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "udp")],
                "$OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
                "not one of",
            ),
            (
                "otlp:\n  protocol: http/json\n",
                &[endpoint],
                "otlp.protocol",
                "not supported",
            ),
            (
                "",
                &[endpoint, ("OTEL_METRIC_EXPORT_INTERVAL", "-5")],
                "$OTEL_METRIC_EXPORT_INTERVAL",
                "milliseconds",
            ),
            (
                "",
                &[endpoint, ("OTEL_METRIC_EXPORT_INTERVAL", "10s")],
                "$OTEL_METRIC_EXPORT_INTERVAL",
                "milliseconds",
            ),
            (
                "",
                &[endpoint, ("OTEL_METRIC_EXPORT_INTERVAL", "0")],
                "$OTEL_METRIC_EXPORT_INTERVAL",
                "more than zero",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "1e3")],
                "$OTEL_EXPORTER_OTLP_TIMEOUT",
                "milliseconds",
            ),
            (
                "",
                &[endpoint, ("OTEL_METRIC_EXPORT_TIMEOUT", "soon")],
                "$OTEL_METRIC_EXPORT_TIMEOUT",
                "milliseconds",
            ),
            (
                "otlp:\n  interval: 0s\n",
                &[endpoint],
                "otlp.interval",
                "more than zero",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "api-key")],
                "$OTEL_EXPORTER_OTLP_HEADERS",
                "item 1 is not `key=value`",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,=2")],
                "$OTEL_EXPORTER_OTLP_HEADERS",
                "item 2 has an empty key",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=1")],
                "$OTEL_EXPORTER_OTLP_HEADERS",
                "not a header name",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "k=secret%zz")],
                "$OTEL_EXPORTER_OTLP_HEADERS",
                "percent-encoded",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "k=line%0Abreak")],
                "$OTEL_EXPORTER_OTLP_HEADERS",
                "not a valid header value",
            ),
            (
                "otlp:\n  headers:\n    \"a b\": x\n",
                &[endpoint],
                "otlp.headers.a b",
                "not a header name",
            ),
            (
                "",
                &[endpoint, ("OTEL_RESOURCE_ATTRIBUTES", "a=1,b")],
                "$OTEL_RESOURCE_ATTRIBUTES",
                "item 2",
            ),
            (
                "",
                &[endpoint, ("OTEL_RESOURCE_ATTRIBUTES", "a=%FF")],
                "$OTEL_RESOURCE_ATTRIBUTES",
                "percent-encoded UTF-8",
            ),
            (
                "",
                &[endpoint, ("OTEL_EXPORTER_OTLP_COMPRESSION", "br")],
                "$OTEL_EXPORTER_OTLP_COMPRESSION",
                "not one of",
            ),
            (
                "",
                &[
                    endpoint,
                    ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
                ],
                "$OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                "cumulative",
            ),
        ];
        for (file, env, path, message) in cases {
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
            &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "k=secret%zz")],
        )
        .unwrap_err();
        assert!(!format!("{issues:?}").contains("secret"), "{issues:?}");
        // A file key is located at its line.
        let issues = load("otlp:\n  protocol: http/json\n", &[]).unwrap_err();
        assert_eq!(issues[0].location.map(|(line, _)| line), Some(3));
    }
}
