//! Configuration: the YAML file's raw shape (`raw.rs`, read by `parse.rs`), validated into
//! [`Config`] (`validate.rs`, with the defaults of `defaults.rs` and the key locations of
//! `locate.rs`).
//!
//! Every error names the key path and the line:column it comes from, unknown keys are
//! errors, and defaults live beside the fields they belong to. Command-line flags are
//! applied on top of the file by [`Overrides`]. Secret values (API-key hashes' tenants are
//! not secret, but nothing from a request ever is stored here) are never echoed.

mod defaults;
mod issue;
mod locate;
mod objectives;
mod otlp;
mod parse;
mod raw;
pub mod units;
mod validate;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::{Authority, Scheme};

use crate::wire::tokenize::{TokenizerError, TokenizerSource};
use crate::wire::Dialect;

pub use crate::metrics::{Buckets, LabelPolicy, Labels, MetricNames, NativeHistograms};
pub use issue::ConfigIssue;
pub use objectives::MAX_OBJECTIVES;
pub use otlp::{Otlp, OtlpCompression, OtlpLink, OtlpProtocol, OtlpTls, OtlpTraces, TlsFile};
pub use raw::RawConfig;

/// The validated configuration tokentap runs with.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub upstream: Upstream,
    pub tls: Option<ListenerTls>,
    pub shutdown: Shutdown,
    pub proxy: ProxySettings,
    /// `ui.enabled`: the live view, on `ui.listen`.
    pub ui: bool,
    /// `ui.listen`: the live view's listener.
    pub ui_listen: SocketAddr,
    pub limits: Limits,
    pub tenants: Vec<TenantSource>,
    pub labels: Labels,
    pub metrics: MetricsConfig,
    pub observe: Observe,
    /// Routes with a configured dialect, in file order (the first match wins).
    pub routes: Vec<Route>,
    pub log: Log,
    /// The OTLP metrics push, when on (`otlp` and the `OTEL_*` environment variables).
    pub otlp: Option<Otlp>,
    /// Per-request objectives (`objectives`), `None` when none is configured.
    pub objectives: Option<crate::summary::objectives::Objectives>,
}

/// Where traffic goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
    /// The URL's path, prepended to every forwarded path ("" for `/`).
    pub base_path: String,
    pub connect_timeout: Duration,
    pub response_head_timeout: Duration,
    pub idle_timeout: Duration,
    /// HTTP/2 only: with prior knowledge to an `http://` upstream, by ALPN (required) to
    /// an `https://` one.
    pub http2: bool,
    pub ca_file: Option<PathBuf>,
    pub host_header: HostHeader,
    /// How long an idle pooled connection is kept (zero keeps none).
    pub pool_idle_timeout: Duration,
    /// Most idle pooled connections to the upstream in the whole process, both
    /// plain-HTTP/1.1 transports together; each worker thread keeps its part of it
    /// ([`crate::idle_pool::thread_cap`]).
    pub pool_max_idle_per_host: usize,
    pub probe_interval: Duration,
}

impl Upstream {
    /// The upstream as a printable URL (it never holds credentials: they are rejected).
    pub fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority, self.base_path)
    }

    /// Whether requests go to it as plain-text HTTP/1.1 (`http://` without `http2`): the
    /// upstream both transports drive their own connections to.
    pub fn is_plain_http1(&self) -> bool {
        self.scheme == Scheme::HTTP && !self.http2
    }
}

/// What `Host` the upstream sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostHeader {
    /// The upstream URL's authority (needed for hosted APIs and TLS).
    Upstream,
    /// The client's own `Host` / `:authority`.
    Preserve,
}

/// TLS on the proxy listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// How the proxy port serves HTTP/1.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxySettings {
    /// `proxy.http1_fast_path`.
    pub http1_fast_path: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Shutdown {
    pub drain_timeout: Duration,
}

/// Bounds on what clients may make tokentap hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_in_flight: usize,
    /// `limits.max_connections`; `None`: derived from the descriptor limit at start.
    pub max_connections: Option<usize>,
    pub header_read_timeout: Duration,
    pub max_headers: usize,
    pub max_header_bytes: usize,
    pub request_body_timeout: Duration,
}

/// One way to name the tenant of a request; the first that matches wins.
#[derive(Clone, Debug)]
pub enum TenantSource {
    /// The value of a request header.
    Header(http::HeaderName),
    /// SHA-256 of the API key (`Authorization: Bearer`, `x-api-key`, `api-key`) to tenant.
    ApiKeys(HashMap<[u8; 32], String>),
}

/// `metrics.exemplars`: which request header's trace context becomes exemplars.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exemplars {
    pub enabled: bool,
    /// Read as a W3C `traceparent` value.
    pub header: http::HeaderName,
}

impl Default for Exemplars {
    /// What an unwritten `metrics.exemplars` means.
    fn default() -> Exemplars {
        Exemplars {
            enabled: true,
            header: http::HeaderName::from_static(defaults::DEFAULT_EXEMPLAR_HEADER),
        }
    }
}

#[derive(Clone, Debug)]
pub struct MetricsConfig {
    pub buckets: Buckets,
    pub native_histograms: NativeHistograms,
    pub exemplars: Exemplars,
    /// An inter-token gap at least this long counts as a stall.
    pub stall_threshold: Duration,
    /// `metrics.names`: the `tokentap_` names, the GenAI semantic conventions', or both.
    pub names: MetricNames,
}

#[derive(Clone, Debug)]
pub struct Observe {
    pub max_event_bytes: usize,
    pub max_body_bytes: usize,
    /// TGI: special tokens are not token-bearing events.
    pub skip_special_tokens: bool,
    /// Counts text deltas that carry no exact count; `None` (the default) costs nothing.
    /// Only named here: it is loaded after validation, beside the config it runs with.
    pub tokenizer: Option<TokenizerSetting>,
}

/// `observe.tokenizer` once validated: what to load, and where that is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerSetting {
    pub source: TokenizerSource,
    /// The key naming the source (`observe.tokenizer.encoding` or `.file`).
    pub written: Written,
}

impl TokenizerSetting {
    /// A failure to load the tokenizer, reported like a validation issue of its key.
    pub fn load_failed(&self, err: &TokenizerError) -> ConfigError {
        self.written.issue(err.to_string())
    }
}

/// Where a setting is written: kept for what can be checked only after validation (the
/// files a setting names are read then), so that such a failure names the key and line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The file (or `<flags>`) the configuration came from.
    pub origin: String,
    /// Dotted key path.
    pub path: String,
    /// 1-based line and column, when known.
    pub location: Option<(usize, usize)>,
}

impl Written {
    /// An invalid-configuration error about this setting.
    pub fn issue(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.clone(),
            issues: vec![ConfigIssue {
                path: self.path.clone(),
                location: self.location,
                message: message.into(),
            }],
        }
    }
}

/// A path prefix whose requests have a configured dialect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Starts with `/`; no trailing `/` unless it is `/` itself.
    pub path_prefix: String,
    /// The dialect of `POST`s under the prefix; `None` forwards everything unobserved.
    pub dialect: Option<Dialect>,
}

impl Route {
    /// Whether `path` is the prefix or continues it with `/`.
    pub fn matches(&self, path: &str) -> bool {
        self.path_prefix == "/"
            || path
                .strip_prefix(self.path_prefix.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug)]
pub struct Log {
    pub format: LogFormat,
    /// A tracing filter directive, e.g. `info` or `tokentap=debug`.
    pub level: String,
}

/// Why a configuration could not be used. Lists every issue found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", render_issues(.origin, .issues))]
    Invalid {
        origin: String,
        issues: Vec<ConfigIssue>,
    },
}

fn render_issues(origin: &str, issues: &[ConfigIssue]) -> String {
    let mut out = format!("invalid configuration in {origin}:");
    for issue in issues {
        out.push_str("\n  ");
        out.push_str(&format!("{origin}:{issue}"));
    }
    out
}

impl ConfigError {
    /// The individual issues (empty for a read error).
    pub fn issues(&self) -> &[ConfigIssue] {
        match self {
            ConfigError::Invalid { issues, .. } => issues,
            ConfigError::Read { .. } => &[],
        }
    }
}

/// Settings given on the command line or in the environment; they win over the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub upstream: Option<String>,
    pub listen: Option<String>,
    pub admin: Option<String>,
    pub log_format: Option<String>,
    pub log_level: Option<String>,
    /// `--ui`: `ui.enabled`.
    pub ui: Option<bool>,
    /// `--ui-listen`: `ui.listen`.
    pub ui_listen: Option<String>,
    /// The OpenTelemetry SDK's environment variables (`OTEL_*`) and the pod's identity
    /// (`K8S_*`), as `main` read them: what the `otlp` keys leave out.
    pub environment: std::collections::BTreeMap<String, String>,
}

impl Config {
    /// Read and validate a config file.
    pub fn from_file(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_yaml(&text, &path.display().to_string(), overrides)
    }

    /// Validate YAML text; `origin` names it in errors (a file path, or `<flags>`).
    pub fn from_yaml(
        text: &str,
        origin: &str,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut parsed = parse::parse(text);
        let invalid = |issues| ConfigError::Invalid {
            origin: origin.to_string(),
            issues,
        };
        let Some(raw) = parsed.raw.take() else {
            return Err(invalid(parsed.issues));
        };
        // Validate what did read too, so that one run reports everything it can.
        match raw.validate(text, origin, overrides) {
            Ok(config) if parsed.issues.is_empty() => Ok(config),
            Ok(_) => Err(invalid(parsed.issues)),
            Err(found) => {
                let found: Vec<_> = found
                    .into_iter()
                    .filter(|issue| !parsed.is_left_out(&issue.path))
                    .collect();
                parsed.issues.extend(found);
                Err(invalid(parsed.issues))
            }
        }
    }

    /// A configuration from flags alone (no file).
    pub fn from_overrides(overrides: &Overrides) -> Result<Config, ConfigError> {
        Config::from_yaml("{}", "<flags>", overrides)
    }
}

/// Parse an upstream URL: `http://host:port[/base]` or `https://...`, by the rule every
/// configured URL follows ([`units::parse_http_url`]), and no query.
pub fn parse_upstream_url(text: &str) -> Result<(Scheme, Authority, String), String> {
    let url = units::parse_http_url(text)?;
    if url.uri.query().is_some() {
        return Err("the upstream URL must not have a query".to_string());
    }
    let base_path = url.uri.path().trim_end_matches('/').to_string();
    Ok((url.scheme, url.authority, base_path))
}

#[cfg(test)]
mod tests;
