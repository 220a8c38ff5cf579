//! Raw values to the validated [`Config`]: every check, every default applied, and every
//! issue collected (with its key path and line) rather than stopping at the first.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use super::defaults::*;
use super::locate::locate;
use super::raw::*;
use super::units::{HumanDuration, Number};
use super::*;
use crate::wire::tokenize::TokenizerSource;
use crate::wire::Dialect;

/// Collects validation issues, locating each key path in the source text.
pub(super) struct Issues<'t> {
    text: &'t str,
    origin: &'t str,
    pub(super) found: Vec<ConfigIssue>,
}

impl Issues<'_> {
    pub(super) fn push(&mut self, path: &str, message: impl Into<String>) {
        self.found.push(ConfigIssue {
            path: path.to_string(),
            location: locate(self.text, path),
            message: message.into(),
        });
    }

    /// [`Issues::push`], located at `within` when `path` itself is not written as a key
    /// (an item of a flow-style list, `[a, b]`; `upstream: <url>` for `upstream.url`).
    fn push_within(&mut self, path: &str, within: &str, message: impl Into<String>) {
        self.found.push(ConfigIssue {
            path: path.to_string(),
            location: locate(self.text, path).or_else(|| locate(self.text, within)),
            message: message.into(),
        });
    }

    /// Where `path` is written, for a check that runs after validation.
    fn written(&self, path: &str) -> Written {
        Written {
            origin: self.origin.to_string(),
            path: path.to_string(),
            location: locate(self.text, path),
        }
    }
}

impl RawConfig {
    /// Check every field and build the [`Config`]; returns all issues at once.
    /// `origin` names the text in errors found later ([`Written`]).
    ///
    /// Sections are checked in the order they are documented, so issues are listed in
    /// that order too.
    pub fn validate(
        self,
        text: &str,
        origin: &str,
        overrides: &Overrides,
    ) -> Result<Config, Vec<ConfigIssue>> {
        let mut issues = Issues {
            text,
            origin,
            found: Vec::new(),
        };
        let listen = socket_addr(
            &mut issues,
            "listen",
            overrides.listen.as_deref().or(self.listen.as_deref()),
            DEFAULT_LISTEN,
        );
        let admin = socket_addr(
            &mut issues,
            "admin",
            overrides.admin.as_deref().or(self.admin.as_deref()),
            DEFAULT_ADMIN,
        );
        let upstream = self
            .upstream
            .validate(&mut issues, overrides.upstream.as_deref());
        let tls = self.tls.map(|t| ListenerTls {
            cert_file: t.cert_file,
            key_file: t.key_file,
        });
        let shutdown = Shutdown {
            drain_timeout: dur(self.shutdown.drain_timeout, default_drain_timeout()),
        };
        let proxy = ProxySettings {
            http1_fast_path: self
                .proxy
                .http1_fast_path
                .unwrap_or(default_http1_fast_path()),
        };
        let ui = overrides
            .ui
            .or(self.ui.enabled)
            .unwrap_or(default_ui_enabled());
        let ui_listen = socket_addr(
            &mut issues,
            "ui.listen",
            overrides.ui_listen.as_deref().or(self.ui.listen.as_deref()),
            DEFAULT_UI_LISTEN,
        );
        let limits = self.limits.validate(&mut issues);
        let tenants = self.tenants.validate(&mut issues);
        let labels = self.labels.validate(&mut issues);
        let metrics = self.metrics.validate(&mut issues);
        let observe = self.observe.validate(&mut issues);
        let routes = routes(&mut issues, self.routes);
        let log = self.log.validate(&mut issues, overrides);
        let otlp = self.otlp.validate(&mut issues, &overrides.environment);
        let objectives = self.objectives.validate(&mut issues);

        match (listen, admin, ui_listen, upstream) {
            (Some(listen), Some(admin), Some(ui_listen), Some(upstream))
                if issues.found.is_empty() =>
            {
                Ok(Config {
                    listen,
                    admin,
                    upstream,
                    tls,
                    shutdown,
                    proxy,
                    ui,
                    ui_listen,
                    limits,
                    tenants,
                    labels,
                    metrics,
                    observe,
                    routes,
                    log,
                    otlp,
                    objectives,
                })
            }
            _ => Err(issues.found),
        }
    }
}

impl RawLimits {
    fn validate(self, issues: &mut Issues<'_>) -> Limits {
        let limits = Limits {
            max_in_flight: self.max_in_flight.map_or(default_max_in_flight(), |n| n.0),
            max_connections: self.max_connections.map(|n| n.0),
            header_read_timeout: dur(self.header_read_timeout, default_header_read_timeout()),
            max_headers: self.max_headers.map_or(default_max_headers(), |n| n.0),
            max_header_bytes: self
                .max_header_bytes
                .map_or(default_max_header_bytes(), |b| b.0),
            request_body_timeout: dur(self.request_body_timeout, default_request_body_timeout()),
        };
        if limits.max_in_flight == 0 {
            issues.push("limits.max_in_flight", "must be at least 1");
        }
        if limits.max_connections == Some(0) {
            issues.push("limits.max_connections", "must be at least 1");
        }
        if limits.request_body_timeout.is_zero() {
            issues.push("limits.request_body_timeout", "must be longer than 0s");
        }
        if limits.max_header_bytes < 8192 {
            // hyper's floor for its read buffer.
            issues.push("limits.max_header_bytes", "must be at least 8KiB");
        }
        limits
    }
}

impl RawLabels {
    fn validate(mut self, issues: &mut Issues<'_>) -> Labels {
        if self.model.families.is_some() {
            issues.push(
                "labels.model.families",
                "every per-request family carries `model`; list the families that also \
                 carry `tenant` in `labels.tenant.families`",
            );
        }
        let tenant_families = tenant_families(issues, self.tenant.families.take());
        let model = self
            .model
            .validate(issues, "labels.model", default_model_max_values());
        let tenant = self
            .tenant
            .validate(issues, "labels.tenant", default_tenant_max_values());
        // A label opted in to `unbounded` keeps every value: no default pair cap undoes that.
        let unbounded = model.max_values.is_none() || tenant.max_values.is_none();
        let default_max_pairs = if unbounded {
            usize::MAX
        } else {
            DEFAULT_MAX_PAIRS
        };
        let labels = Labels {
            max_pairs: self.max_pairs.map_or(default_max_pairs, |n| n.0),
            model,
            tenant,
            tenant_families,
        };
        if labels.max_pairs == 0 {
            issues.push("labels.max_pairs", "must be at least 1");
        }
        labels
    }
}

impl RawMetrics {
    fn validate(self, issues: &mut Issues<'_>) -> MetricsConfig {
        let buckets = self.buckets.validate(issues);
        let native_histograms = native_histograms(issues, self.native_histograms);
        let exemplars = exemplars(issues, self.exemplars);
        MetricsConfig {
            buckets,
            native_histograms,
            exemplars,
            stall_threshold: dur(self.stall_threshold, default_stall_threshold()),
            names: metric_names(issues, self.names.as_deref()),
        }
    }
}

fn metric_names(issues: &mut Issues<'_>, raw: Option<&str>) -> MetricNames {
    let Some(raw) = raw else {
        return MetricNames::default();
    };
    MetricNames::ALL
        .into_iter()
        .find(|n| n.as_str() == raw)
        .unwrap_or_else(|| {
            let known: Vec<&str> = MetricNames::ALL.iter().map(|n| n.as_str()).collect();
            issues.push(
                "metrics.names",
                format!("`{raw}` is not one of {}", known.join(", ")),
            );
            MetricNames::default()
        })
}

impl RawBuckets {
    fn validate(self, issues: &mut Issues<'_>) -> Buckets {
        let defaults = Buckets::default();
        Buckets {
            time_to_first_byte_seconds: buckets(
                issues,
                "metrics.buckets.time_to_first_byte_seconds",
                self.time_to_first_byte_seconds,
                &defaults.time_to_first_byte_seconds,
            ),
            time_to_first_token_seconds: buckets(
                issues,
                "metrics.buckets.time_to_first_token_seconds",
                self.time_to_first_token_seconds,
                &defaults.time_to_first_token_seconds,
            ),
            inter_token_latency_seconds: buckets(
                issues,
                "metrics.buckets.inter_token_latency_seconds",
                self.inter_token_latency_seconds,
                &defaults.inter_token_latency_seconds,
            ),
            inter_chunk_latency_seconds: buckets(
                issues,
                "metrics.buckets.inter_chunk_latency_seconds",
                self.inter_chunk_latency_seconds,
                &defaults.inter_chunk_latency_seconds,
            ),
            time_per_output_token_seconds: buckets(
                issues,
                "metrics.buckets.time_per_output_token_seconds",
                self.time_per_output_token_seconds,
                &defaults.time_per_output_token_seconds,
            ),
            output_tokens_per_second: buckets(
                issues,
                "metrics.buckets.output_tokens_per_second",
                self.output_tokens_per_second,
                &defaults.output_tokens_per_second,
            ),
            output_tokens_per_event: buckets(
                issues,
                "metrics.buckets.output_tokens_per_event",
                self.output_tokens_per_event,
                &defaults.output_tokens_per_event,
            ),
            request_duration_seconds: buckets(
                issues,
                "metrics.buckets.request_duration_seconds",
                self.request_duration_seconds,
                &defaults.request_duration_seconds,
            ),
        }
    }
}

impl RawObserve {
    fn validate(self, issues: &mut Issues<'_>) -> Observe {
        let observe = Observe {
            max_event_bytes: self
                .max_event_bytes
                .map_or(default_max_event_bytes(), |b| b.0),
            max_body_bytes: self
                .max_body_bytes
                .map_or(default_max_body_bytes(), |b| b.0),
            skip_special_tokens: self.skip_special_tokens,
            tokenizer: self.tokenizer.and_then(|t| t.validate(issues)),
        };
        if observe.max_event_bytes < 1024 {
            issues.push("observe.max_event_bytes", "must be at least 1KiB");
        }
        observe
    }
}

fn dur(value: Option<HumanDuration>, default: Duration) -> Duration {
    value.map_or(default, |d| d.0)
}

fn socket_addr(
    issues: &mut Issues<'_>,
    path: &str,
    value: Option<&str>,
    default: &str,
) -> Option<SocketAddr> {
    let text = value.unwrap_or(default);
    match text.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            issues.push(
                path,
                format!("`{text}` is not a socket address (use host:port, e.g. 0.0.0.0:8080)"),
            );
            None
        }
    }
}

fn buckets(
    issues: &mut Issues<'_>,
    path: &str,
    value: Option<Vec<Number>>,
    default: &[f64],
) -> Vec<f64> {
    let Some(bounds) = value else {
        return default.to_vec();
    };
    let bounds: Vec<f64> = bounds.into_iter().map(|n| n.0).collect();
    if bounds.is_empty() {
        issues.push(path, "needs at least one bucket bound");
    } else if bounds.iter().any(|b| !b.is_finite() || *b <= 0.0) {
        issues.push(path, "bucket bounds must be positive finite numbers");
    } else if bounds.windows(2).any(|w| w[0] >= w[1]) {
        issues.push(path, "bucket bounds must be strictly increasing");
    }
    bounds
}

/// `labels.tenant.families`: names of the metric table's per-request families, each once.
fn tenant_families(issues: &mut Issues<'_>, raw: Option<Vec<String>>) -> BTreeSet<&'static str> {
    const KEY: &str = "labels.tenant.families";
    let Some(names) = raw else {
        return Labels::default_tenant_families();
    };
    let mut families = BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        let path = format!("{KEY}.{i}");
        match crate::metrics::tenant_capable().find(|f| f == name) {
            Some(family) if !families.insert(family) => {
                issues.push_within(&path, KEY, format!("`{name}` is listed twice"));
            }
            Some(_) => {}
            None => {
                let capable: Vec<String> = crate::metrics::tenant_capable()
                    .map(|f| format!("`{f}`"))
                    .collect();
                let why = if crate::metrics::process_wide().any(|f| f == name) {
                    "is a family of the whole process (no `model` label): it can never \
                     carry `tenant`"
                } else {
                    "is not a tokentap metric family"
                };
                issues.push_within(
                    &path,
                    KEY,
                    format!("`{name}` {why}; one of {}", capable.join(", ")),
                );
            }
        }
    }
    families
}

fn native_histograms(issues: &mut Issues<'_>, raw: RawNativeHistograms) -> NativeHistograms {
    use crate::metrics::native::{schema_for_factor, MAX_SCHEMA, MIN_SCHEMA};
    let defaults = NativeHistograms::default();
    let schema = match (raw.factor, raw.schema) {
        (Some(_), Some(_)) => {
            issues.push(
                "metrics.native_histograms.schema",
                "set `factor` or `schema`, not both",
            );
            defaults.schema
        }
        (Some(Number(factor)), None) => {
            if factor.is_finite() && factor > 1.0 {
                schema_for_factor(factor)
            } else {
                issues.push(
                    "metrics.native_histograms.factor",
                    "must be a finite number greater than 1",
                );
                defaults.schema
            }
        }
        (None, Some(schema)) => match i8::try_from(schema) {
            Ok(schema) if (MIN_SCHEMA..=MAX_SCHEMA).contains(&schema) => schema,
            _ => {
                issues.push(
                    "metrics.native_histograms.schema",
                    format!("must be from {MIN_SCHEMA} to {MAX_SCHEMA}"),
                );
                defaults.schema
            }
        },
        (None, None) => defaults.schema,
    };
    let max_buckets = raw.max_buckets.map_or(defaults.max_buckets, |n| n.0);
    if max_buckets == 0 {
        issues.push(
            "metrics.native_histograms.max_buckets",
            "must be at least 1",
        );
    }
    let native = NativeHistograms {
        enabled: raw.enabled.unwrap_or(defaults.enabled),
        schema,
        max_buckets: max_buckets.max(1),
        classic: raw.classic.unwrap_or(defaults.classic),
    };
    if !native.enabled && !native.classic {
        issues.push(
            "metrics.native_histograms.classic",
            "cannot be false while native histograms are disabled (histograms would have no buckets)",
        );
    }
    native
}

fn exemplars(issues: &mut Issues<'_>, raw: RawExemplars) -> Exemplars {
    let defaults = Exemplars::default();
    let header = match raw.header {
        None => defaults.header,
        Some(name) => http::HeaderName::try_from(name.as_str()).unwrap_or_else(|_| {
            issues.push(
                "metrics.exemplars.header",
                format!("`{name}` is not a valid header name"),
            );
            defaults.header
        }),
    };
    Exemplars {
        enabled: raw.enabled.unwrap_or(defaults.enabled),
        header,
    }
}

impl RawUpstream {
    fn validate(self, issues: &mut Issues<'_>, flag: Option<&str>) -> Option<Upstream> {
        let Some(url) = flag.or(self.url.as_deref()) else {
            issues.push(
                "upstream.url",
                "missing: set `upstream.url` or pass --upstream (TOKENTAP_UPSTREAM)",
            );
            return None;
        };
        let (scheme, authority, base_path) = match parse_upstream_url(url) {
            Ok(parts) => parts,
            Err(message) => {
                // `upstream: <url>` has no `url` key to point at: point at `upstream`.
                issues.push_within("upstream.url", "upstream", message);
                return None;
            }
        };
        let host_header = match self.host_header.as_deref() {
            None | Some("upstream") => HostHeader::Upstream,
            Some("preserve") => HostHeader::Preserve,
            Some(other) => {
                issues.push(
                    "upstream.host_header",
                    format!("`{other}` is not one of `upstream`, `preserve`"),
                );
                HostHeader::Upstream
            }
        };
        let upstream = Upstream {
            scheme,
            authority,
            base_path,
            connect_timeout: dur(self.connect_timeout, default_connect_timeout()),
            response_head_timeout: dur(self.response_head_timeout, default_response_head_timeout()),
            idle_timeout: dur(self.idle_timeout, default_idle_timeout()),
            http2: self.http2,
            ca_file: self.ca_file,
            host_header,
            pool_idle_timeout: dur(self.pool_idle_timeout, default_pool_idle_timeout()),
            pool_max_idle_per_host: self
                .pool_max_idle_per_host
                .map_or(default_pool_max_idle_per_host(), |n| n.0),
            probe_interval: dur(self.probe_interval, default_probe_interval()),
        };
        for (key, value) in [
            ("upstream.connect_timeout", upstream.connect_timeout),
            (
                "upstream.response_head_timeout",
                upstream.response_head_timeout,
            ),
            ("upstream.idle_timeout", upstream.idle_timeout),
            ("upstream.probe_interval", upstream.probe_interval),
        ] {
            if value.is_zero() {
                issues.push(key, "must be longer than 0");
            }
        }
        Some(upstream)
    }
}

/// Validate `routes`, in order: a prefix is a path (no query), a dialect is a known name
/// or `none`, and no route is hidden behind an earlier one that matches all its paths.
fn routes(issues: &mut Issues<'_>, raw: Vec<RawRoute>) -> Vec<Route> {
    let mut out: Vec<Route> = Vec::with_capacity(raw.len());
    // Each kept route's index in the file, for messages.
    let mut written_at = Vec::with_capacity(raw.len());
    for (i, route) in raw.into_iter().enumerate() {
        let path = format!("routes.{i}");
        let prefix = route.path_prefix.trim();
        let mut valid = true;
        if !prefix.starts_with('/') || prefix.contains(['?', '#']) || prefix.contains("//") {
            issues.push(
                &format!("{path}.path_prefix"),
                format!("`{prefix}` is not a path prefix (starts with `/`, no query)"),
            );
            valid = false;
        }
        let dialect = match route.dialect.as_str() {
            "none" => None,
            name => match Dialect::from_name(name) {
                Some(dialect) => Some(dialect),
                None => {
                    let names: Vec<String> =
                        Dialect::ALL.iter().map(|d| format!("`{d}`")).collect();
                    issues.push(
                        &format!("{path}.dialect"),
                        format!("`{name}` is not one of {}, `none`", names.join(", ")),
                    );
                    valid = false;
                    None
                }
            },
        };
        if !valid {
            continue;
        }
        let prefix = match prefix.trim_end_matches('/') {
            "" => "/",
            trimmed => trimmed,
        };
        let route = Route {
            path_prefix: prefix.to_string(),
            dialect,
        };
        if let Some(j) = out.iter().position(|earlier| earlier.matches(prefix)) {
            issues.push(
                &format!("{path}.path_prefix"),
                format!(
                    "never used: `routes.{}` (`{}`) comes first and matches every path \
                     this one does",
                    written_at[j], out[j].path_prefix
                ),
            );
            continue;
        }
        out.push(route);
        written_at.push(i);
    }
    out
}

impl RawTokenizer {
    /// Check the source only: a file is read when the tokenizer is loaded, after validation.
    fn validate(self, issues: &mut Issues<'_>) -> Option<TokenizerSetting> {
        let (key, source) = match (self.encoding, self.file) {
            (Some(name), None) => match TokenizerSource::encoding(&name) {
                Ok(source) => ("encoding", source),
                Err(err) => {
                    issues.push("observe.tokenizer.encoding", err.to_string());
                    return None;
                }
            },
            (None, Some(file)) => ("file", TokenizerSource::File(file)),
            _ => {
                issues.push(
                    "observe.tokenizer",
                    "needs exactly one of `encoding`, `file`",
                );
                return None;
            }
        };
        Some(TokenizerSetting {
            source,
            written: issues.written(&format!("observe.tokenizer.{key}")),
        })
    }
}

impl RawTenants {
    fn validate(self, issues: &mut Issues<'_>) -> Vec<TenantSource> {
        let Some(sources) = self.sources else {
            return vec![TenantSource::Header(http::HeaderName::from_static(
                "x-tenant-id",
            ))];
        };
        let mut out = Vec::with_capacity(sources.len());
        for (i, source) in sources.into_iter().enumerate() {
            let path = format!("tenants.sources.{i}");
            match (source.header, source.api_keys) {
                (Some(name), None) => match http::HeaderName::try_from(name.as_str()) {
                    Ok(name) => out.push(TenantSource::Header(name)),
                    Err(_) => issues.push(
                        &format!("{path}.header"),
                        format!("`{name}` is not a valid header name"),
                    ),
                },
                (None, Some(keys)) => {
                    let mut map = HashMap::with_capacity(keys.len());
                    for (hash, tenant) in keys {
                        let mut digest = [0u8; 32];
                        // Report the position only: a hash is not a secret, but a
                        // mistakenly pasted raw key would be.
                        if hash.len() != 64 || hex::decode_to_slice(&hash, &mut digest).is_err() {
                            issues.push(
                                &format!("{path}.api_keys"),
                                "keys must be 64 hex digits: the SHA-256 of the API key, \
                                 never the key itself (`printf %s \"$KEY\" | sha256sum`)",
                            );
                            continue;
                        }
                        map.insert(digest, tenant);
                    }
                    out.push(TenantSource::ApiKeys(map));
                }
                _ => issues.push(&path, "needs exactly one of `header`, `api_keys`"),
            }
        }
        out
    }
}

impl RawLabelPolicy {
    fn validate(self, issues: &mut Issues<'_>, path: &str, default_max: usize) -> LabelPolicy {
        let max_values = if self.unbounded {
            None
        } else {
            let max = self.max_values.map_or(default_max, |n| n.0);
            if max == 0 {
                issues.push(&format!("{path}.max_values"), "must be at least 1");
            } else if max > label_max_values_ceiling() {
                issues.push(
                    &format!("{path}.max_values"),
                    format!(
                        "{max} exceeds {}; set `unbounded: true` to opt in to unbounded series",
                        label_max_values_ceiling()
                    ),
                );
            }
            Some(max)
        };
        LabelPolicy {
            max_values,
            allow: self.allow.map(|v| v.into_iter().collect::<HashSet<_>>()),
            aliases: self.aliases.into_iter().collect(),
            max_value_len: self
                .max_value_len
                .map_or(default_label_max_value_len(), |n| n.0),
        }
    }
}

impl RawLog {
    fn validate(self, issues: &mut Issues<'_>, overrides: &Overrides) -> Log {
        let format = match overrides.log_format.as_deref().or(self.format.as_deref()) {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                issues.push(
                    "log.format",
                    format!("`{other}` is not one of `text`, `json`"),
                );
                LogFormat::Text
            }
        };
        let level = overrides
            .log_level
            .clone()
            .or(self.level)
            .unwrap_or_else(|| "info".to_string());
        if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
            issues.push("log.level", format!("`{level}` is not a log filter"));
        }
        Log { format, level }
    }
}
