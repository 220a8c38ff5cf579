//! The config file exactly as written. Doc comments on fields are the reference for each
//! key; `deny_unknown_fields` everywhere, so a typo is an error, not a silent default.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::units::{ByteSize, HumanDuration};
use super::*;
use crate::wire::{Dialect, Tokenizer};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Proxy listener, `host:port`. Default `0.0.0.0:8080`.
    pub listen: Option<String>,
    /// Admin listener (`/metrics`, `/healthz`, `/readyz`). Default `0.0.0.0:9464`.
    pub admin: Option<String>,
    #[serde(default)]
    pub upstream: RawUpstream,
    /// TLS on the proxy listener (both files required).
    pub tls: Option<RawTls>,
    #[serde(default)]
    pub shutdown: RawShutdown,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub tenants: RawTenants,
    #[serde(default)]
    pub labels: RawLabels,
    #[serde(default)]
    pub metrics: RawMetrics,
    #[serde(default)]
    pub observe: RawObserve,
    /// Routes that set the API dialect of a path instead of detecting it (see
    /// [`RawRoute`]). The first route whose `path_prefix` matches wins; a path no route
    /// matches is detected from its shape (`…/chat/completions`, `…/v1/messages`, ...).
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub log: RawLog,
}

/// One route: `{path_prefix: /my/llm, dialect: anthropic}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// Matches the request path (as the client sent it, before `upstream.url`'s base path
    /// is prepended) when it equals the prefix or continues it with `/`: `/my/llm` matches
    /// `/my/llm` and `/my/llm/chat`, not `/my/llmx`. `/` matches every path.
    pub path_prefix: String,
    /// The dialect of `POST` requests under the prefix: `openai_chat`,
    /// `openai_completions`, `openai_responses`, `anthropic`, `gemini`, `ollama`, `tgi`,
    /// `triton`; other methods are detected as usual. `none`: every request under the
    /// prefix is forwarded unobserved, as a non-LLM path.
    pub dialect: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// `http://host:port` or `https://host[:port][/base-path]`. Required (here or `--upstream`).
    pub url: Option<String>,
    /// TCP (and TLS) connect timeout. Default 5s.
    pub connect_timeout: Option<HumanDuration>,
    /// Time from sending the request to the upstream's response head. Default 300s
    /// (long prompts can take minutes to prefill).
    pub response_head_timeout: Option<HumanDuration>,
    /// Longest silence allowed between two frames of a response body. Default 120s.
    pub idle_timeout: Option<HumanDuration>,
    /// Speak HTTP/2 with prior knowledge (h2c) to an `http://` upstream. Default false.
    /// (`https://` upstreams negotiate HTTP/2 by ALPN regardless.)
    #[serde(default)]
    pub http2: bool,
    /// Extra PEM CA bundle trusted for `https://` upstreams (besides the platform's and
    /// the webpki roots).
    pub ca_file: Option<PathBuf>,
    /// `upstream` (default): send the upstream's authority as `Host`; `preserve`: send the
    /// client's.
    pub host_header: Option<String>,
    /// Idle pooled connections are closed after this long. Default 90s.
    pub pool_idle_timeout: Option<HumanDuration>,
    /// Idle pooled connections kept per upstream. Default 1024.
    pub pool_max_idle_per_host: Option<usize>,
    /// How often `/readyz` re-checks that the upstream accepts connections. Default 5s.
    pub probe_interval: Option<HumanDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShutdown {
    /// On SIGTERM/SIGINT, how long in-flight streams may take to finish. Default 30s.
    pub drain_timeout: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Requests in flight at once; more get 503. Default 20000.
    pub max_in_flight: Option<usize>,
    /// A client must send its whole request head within this. Default 30s.
    pub header_read_timeout: Option<HumanDuration>,
    /// Most request headers accepted. Default 100.
    pub max_headers: Option<usize>,
    /// Largest request head buffered (HTTP/1). Default 64KiB.
    pub max_header_bytes: Option<ByteSize>,
    /// Longest pause allowed between two reads of a request body while more of it is
    /// due; past it the client gets 408 and the request counts as `client_error`.
    /// Default 30s.
    pub request_body_timeout: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenants {
    /// Where the tenant comes from, first match wins. Default `[{header: x-tenant-id}]`.
    pub sources: Option<Vec<RawTenantSource>>,
}

/// One tenant source: exactly one of the keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenantSource {
    /// A request header whose value is the tenant.
    pub header: Option<String>,
    /// Lower-case hex SHA-256 of an API key -> tenant name. The key is read from
    /// `Authorization: Bearer <key>`, `x-api-key` or `api-key`.
    pub api_keys: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLabels {
    #[serde(default)]
    pub model: RawLabelPolicy,
    #[serde(default)]
    pub tenant: RawLabelPolicy,
    /// Distinct (model, tenant) pairs kept, whatever the per-label caps allow; past it a
    /// new pair is counted as (`other`, `other`) and in
    /// `tokentap_label_overflow_total{label="pair"}`. Default 2000; no bound by default
    /// when a label is `unbounded`.
    pub max_pairs: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLabelPolicy {
    /// Distinct values kept before new ones become `other`. Default 1000 for `model`, 1000
    /// for `tenant`; at most 100000 unless `unbounded` is set.
    pub max_values: Option<usize>,
    /// Opt in to unbounded cardinality (ignores `max_values`). Default false.
    #[serde(default)]
    pub unbounded: bool,
    /// Only these values are kept (after aliases); anything else is `other`.
    pub allow: Option<Vec<String>>,
    /// Value renames applied first, e.g. `gpt-4o-2024-08-06: gpt-4o`.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// Values longer than this many bytes become `other`. Default 128.
    pub max_value_len: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// Bucket upper bounds per histogram, strictly increasing.
    #[serde(default)]
    pub buckets: RawBuckets,
    /// An inter-token gap at least this long is counted in `tokentap_stream_stalls_total`.
    /// Default 5s.
    pub stall_threshold: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBuckets {
    pub time_to_first_byte_seconds: Option<Vec<f64>>,
    pub time_to_first_token_seconds: Option<Vec<f64>>,
    pub inter_token_latency_seconds: Option<Vec<f64>>,
    pub time_per_output_token_seconds: Option<Vec<f64>>,
    pub output_tokens_per_second: Option<Vec<f64>>,
    pub request_duration_seconds: Option<Vec<f64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawObserve {
    /// Largest single SSE event the observer buffers; a larger one ends observation of
    /// that stream (the stream itself continues). Default 1MiB.
    pub max_event_bytes: Option<ByteSize>,
    /// Largest non-streaming JSON response buffered to read usage. Default 8MiB.
    pub max_body_bytes: Option<ByteSize>,
    /// TGI: special tokens (`"special": true`, e.g. the final `</s>`) are not
    /// token-bearing events, so they add no ITL sample and no per-event token. Default
    /// false: every event counts, and per-event counts add up to `generated_tokens`.
    #[serde(default)]
    pub skip_special_tokens: bool,
    /// Count the tokens of text deltas with a tokenizer where the stream gives no exact
    /// count (Anthropic, Ollama, Triton, and OpenAI / Responses / Gemini streams without
    /// logprobs or cumulative usage), instead of one per event. Still counted as
    /// `accuracy="estimated"`. Default: off (no cost). Exactly one of `encoding`, `file`.
    pub tokenizer: Option<RawTokenizer>,
}

/// `observe.tokenizer`: exactly one of the keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokenizer {
    /// A built-in tiktoken encoding: `o200k_base` (GPT-4o, GPT-4.1, o-series, gpt-oss) or
    /// `cl100k_base` (GPT-4, GPT-3.5). Shipped inside tokentap; nothing is downloaded.
    pub encoding: Option<String>,
    /// A Hugging Face `tokenizer.json` (e.g. the served model's own), read when the
    /// configuration is loaded. Needs a build with `--features tokenizers`.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// `text` (default) or `json`.
    pub format: Option<String>,
    /// Filter directive, e.g. `info` (default) or `tokentap=debug`.
    pub level: Option<String>,
}

// Defaults, one place each.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
pub const DEFAULT_ADMIN: &str = "0.0.0.0:9464";
const fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
const fn default_response_head_timeout() -> Duration {
    Duration::from_secs(300)
}
const fn default_idle_timeout() -> Duration {
    Duration::from_secs(120)
}
const fn default_pool_idle_timeout() -> Duration {
    Duration::from_secs(90)
}
const fn default_pool_max_idle_per_host() -> usize {
    1024
}
const fn default_probe_interval() -> Duration {
    Duration::from_secs(5)
}
const fn default_drain_timeout() -> Duration {
    Duration::from_secs(30)
}
const fn default_max_in_flight() -> usize {
    20_000
}
const fn default_header_read_timeout() -> Duration {
    Duration::from_secs(30)
}
/// Enough for 50 models x 40 tenants; a million pairs of the per-label caps would make a
/// scrape of hundreds of megabytes.
const DEFAULT_MAX_PAIRS: usize = 2000;
const fn default_request_body_timeout() -> Duration {
    Duration::from_secs(30)
}
const fn default_max_headers() -> usize {
    100
}
const fn default_max_header_bytes() -> usize {
    64 << 10
}
const fn default_label_max_values() -> usize {
    1000
}
const fn label_max_values_ceiling() -> usize {
    100_000
}
const fn default_label_max_value_len() -> usize {
    128
}
const fn default_stall_threshold() -> Duration {
    Duration::from_secs(5)
}
const fn default_max_event_bytes() -> usize {
    1 << 20
}
const fn default_max_body_bytes() -> usize {
    8 << 20
}

/// Time-to-first-byte/token buckets: 10 ms to 60 s, dense below 1 s where interactive
/// TTFTs live, sparse above where long-prompt prefill and queueing show up.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 60.0,
];
/// Inter-token latency / TPOT buckets: 1 ms to 5 s. Decode steps are 5-100 ms on current
/// hardware, so the resolution is finest there; p99 alert thresholds (50-200 ms) fall on
/// bucket bounds.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
];
/// Decode tokens/s buckets: 1 to 2000 tokens/s.
pub const TOKENS_PER_SECOND_BUCKETS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0,
    1000.0, 2000.0,
];
/// Request duration buckets: 50 ms to 30 min (agentic streams run long).
pub const DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// Parse YAML into the raw shape; a failure is one located issue.
pub fn parse(text: &str) -> Result<RawConfig, ConfigIssue> {
    // An empty file means "all defaults".
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    let deserializer = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let location = inner.location().map(|l| (l.line(), l.column()));
        // serde_yaml prefixes some messages with the path and position again; keep the
        // message itself.
        let mut message = inner.to_string();
        if let Some(cut) = message.find(" at line ") {
            message.truncate(cut);
        }
        // ... and sometimes with the path (or its parent) as a prefix.
        if let Some((prefix, rest)) = message.split_once(": ") {
            if path.starts_with(prefix) {
                message = rest.to_string();
            }
        }
        ConfigIssue {
            path,
            location,
            message,
        }
    })
}

/// Collects validation issues, locating each key path in the source text.
struct Issues<'t> {
    text: &'t str,
    found: Vec<ConfigIssue>,
}

impl Issues<'_> {
    fn push(&mut self, path: &str, message: impl Into<String>) {
        self.found.push(ConfigIssue {
            path: path.to_string(),
            location: locate(self.text, path),
            message: message.into(),
        });
    }
}

impl RawConfig {
    /// Check every field and build the [`Config`]; returns all issues at once.
    pub fn validate(self, text: &str, overrides: &Overrides) -> Result<Config, Vec<ConfigIssue>> {
        let mut issues = Issues {
            text,
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
        let limits = Limits {
            max_in_flight: self.limits.max_in_flight.unwrap_or(default_max_in_flight()),
            header_read_timeout: dur(
                self.limits.header_read_timeout,
                default_header_read_timeout(),
            ),
            max_headers: self.limits.max_headers.unwrap_or(default_max_headers()),
            max_header_bytes: self
                .limits
                .max_header_bytes
                .map_or(default_max_header_bytes(), |b| b.0),
            request_body_timeout: dur(
                self.limits.request_body_timeout,
                default_request_body_timeout(),
            ),
        };
        if limits.max_in_flight == 0 {
            issues.push("limits.max_in_flight", "must be at least 1");
        }
        if limits.request_body_timeout.is_zero() {
            issues.push("limits.request_body_timeout", "must be longer than 0s");
        }
        if limits.max_header_bytes < 8192 {
            // hyper's floor for its read buffer.
            issues.push("limits.max_header_bytes", "must be at least 8KiB");
        }
        let tenants = self.tenants.validate(&mut issues);
        let model = self.labels.model.validate(&mut issues, "labels.model");
        let tenant = self.labels.tenant.validate(&mut issues, "labels.tenant");
        // A label opted in to `unbounded` keeps every value: no default pair cap undoes that.
        let unbounded = model.max_values.is_none() || tenant.max_values.is_none();
        let labels = Labels {
            max_pairs: self.labels.max_pairs.unwrap_or(if unbounded {
                usize::MAX
            } else {
                DEFAULT_MAX_PAIRS
            }),
            model,
            tenant,
        };
        if labels.max_pairs == 0 {
            issues.push("labels.max_pairs", "must be at least 1");
        }
        let b = self.metrics.buckets;
        let buckets = Buckets {
            time_to_first_byte_seconds: buckets(
                &mut issues,
                "metrics.buckets.time_to_first_byte_seconds",
                b.time_to_first_byte_seconds,
                LATENCY_BUCKETS,
            ),
            time_to_first_token_seconds: buckets(
                &mut issues,
                "metrics.buckets.time_to_first_token_seconds",
                b.time_to_first_token_seconds,
                LATENCY_BUCKETS,
            ),
            inter_token_latency_seconds: buckets(
                &mut issues,
                "metrics.buckets.inter_token_latency_seconds",
                b.inter_token_latency_seconds,
                ITL_BUCKETS,
            ),
            time_per_output_token_seconds: buckets(
                &mut issues,
                "metrics.buckets.time_per_output_token_seconds",
                b.time_per_output_token_seconds,
                ITL_BUCKETS,
            ),
            output_tokens_per_second: buckets(
                &mut issues,
                "metrics.buckets.output_tokens_per_second",
                b.output_tokens_per_second,
                TOKENS_PER_SECOND_BUCKETS,
            ),
            request_duration_seconds: buckets(
                &mut issues,
                "metrics.buckets.request_duration_seconds",
                b.request_duration_seconds,
                DURATION_BUCKETS,
            ),
        };
        let metrics = MetricsConfig {
            buckets,
            stall_threshold: dur(self.metrics.stall_threshold, default_stall_threshold()),
        };
        let observe = Observe {
            max_event_bytes: self
                .observe
                .max_event_bytes
                .map_or(default_max_event_bytes(), |b| b.0),
            max_body_bytes: self
                .observe
                .max_body_bytes
                .map_or(default_max_body_bytes(), |b| b.0),
            skip_special_tokens: self.observe.skip_special_tokens,
            tokenizer: self.observe.tokenizer.and_then(|t| t.validate(&mut issues)),
        };
        if observe.max_event_bytes < 1024 {
            issues.push("observe.max_event_bytes", "must be at least 1KiB");
        }
        let routes = routes(&mut issues, self.routes);
        let log = self.log.validate(&mut issues, overrides);

        match (listen, admin, upstream) {
            (Some(listen), Some(admin), Some(upstream)) if issues.found.is_empty() => Ok(Config {
                listen,
                admin,
                upstream,
                tls,
                shutdown,
                limits,
                tenants,
                labels,
                metrics,
                observe,
                routes,
                log,
            }),
            _ => Err(issues.found),
        }
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
    value: Option<Vec<f64>>,
    default: &[f64],
) -> Vec<f64> {
    let Some(bounds) = value else {
        return default.to_vec();
    };
    if bounds.is_empty() {
        issues.push(path, "needs at least one bucket bound");
    } else if bounds.iter().any(|b| !b.is_finite() || *b <= 0.0) {
        issues.push(path, "bucket bounds must be positive finite numbers");
    } else if bounds.windows(2).any(|w| w[0] >= w[1]) {
        issues.push(path, "bucket bounds must be strictly increasing");
    }
    bounds
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
                issues.push("upstream.url", message);
                return None;
            }
        };
        if self.http2 && scheme == http::uri::Scheme::HTTPS {
            issues.push(
                "upstream.http2",
                "only for http:// upstreams (https:// negotiates HTTP/2 by ALPN)",
            );
        }
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
                .unwrap_or(default_pool_max_idle_per_host()),
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
    fn validate(self, issues: &mut Issues<'_>) -> Option<Tokenizer> {
        let loaded = match (self.encoding, self.file) {
            (Some(name), None) => Tokenizer::encoding(&name).map_err(|e| ("encoding", e)),
            (None, Some(file)) => Tokenizer::from_file(&file).map_err(|e| ("file", e)),
            _ => {
                issues.push(
                    "observe.tokenizer",
                    "needs exactly one of `encoding`, `file`",
                );
                return None;
            }
        };
        match loaded {
            Ok(tokenizer) => Some(tokenizer),
            Err((key, err)) => {
                issues.push(&format!("observe.tokenizer.{key}"), err.to_string());
                None
            }
        }
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
    fn validate(self, issues: &mut Issues<'_>, path: &str) -> LabelPolicy {
        let max_values = if self.unbounded {
            None
        } else {
            let max = self.max_values.unwrap_or(default_label_max_values());
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
            max_value_len: self.max_value_len.unwrap_or(default_label_max_value_len()),
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

/// Find the line:column of a dotted key path in YAML text (block style), for issues found
/// after parsing. Numeric segments index block sequences (`- `); a key written on an
/// item's own line (`- path_prefix: /x`) is found there. Best effort: `None` when the key
/// is not written in the file (a default, a flag, or flow style like `{url: ...}`).
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let nodes = yaml_nodes(text);
    let mut next = 0usize;
    let mut parent_indent: isize = -1;
    let mut parent_is_item = false;
    let mut found = None;
    for segment in path.split('.') {
        found = None;
        let index = segment.parse::<usize>().ok();
        // Direct children of the parent: the first node deeper than it sets the level.
        let mut child_indent = None;
        let mut seen = 0usize;
        while let Some(node) = nodes.get(next) {
            next += 1;
            let indent = node.indent as isize;
            // A sequence may sit at its parent key's own indent (`key:\n- item`).
            let item_of_parent = node.key.is_none() && indent == parent_indent && !parent_is_item;
            if indent <= parent_indent && !item_of_parent {
                return None;
            }
            let level = *child_indent.get_or_insert(node.indent);
            if node.indent != level {
                continue;
            }
            let hit = match (index, node.key) {
                (Some(index), None) => {
                    seen += 1;
                    seen == index + 1
                }
                (None, Some(key)) => key == segment,
                _ => false,
            };
            if hit {
                found = Some((node.line, node.indent + 1));
                parent_indent = indent;
                parent_is_item = node.key.is_none();
                break;
            }
        }
        found?;
    }
    found
}

/// One block-style YAML node start: a `key:` or a sequence item's `-`.
struct YamlNode<'t> {
    /// 1-based line.
    line: usize,
    /// 0-based column where the node starts.
    indent: usize,
    /// The key, or `None` for a sequence item.
    key: Option<&'t str>,
}

/// The nodes of `text` in order; `- key: v` is an item followed by a key on the same line.
fn yaml_nodes(text: &str) -> Vec<YamlNode<'_>> {
    let mut nodes = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut indent = indent_of(line);
        let mut rest = &line[indent..];
        if is_blank(rest) {
            continue;
        }
        while rest == "-" || rest.starts_with("- ") {
            nodes.push(YamlNode {
                line: n + 1,
                indent,
                key: None,
            });
            let after = rest[1..].trim_start_matches(' ');
            indent += rest.len() - after.len();
            rest = after;
        }
        if rest.is_empty() {
            continue;
        }
        // `key: value` or `key:` (a colon inside a value, as in a URL, is no key).
        let key = rest
            .find(':')
            .filter(|&colon| matches!(rest.as_bytes().get(colon + 1), None | Some(b' ')))
            .map(|colon| rest[..colon].trim().trim_matches(['"', '\'']));
        nodes.push(YamlNode {
            line: n + 1,
            indent,
            // A plain scalar line (a continuation, a flow item) is a node with a key no
            // segment matches.
            key: Some(key.unwrap_or("")),
        });
    }
    nodes
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_blank(trimmed: &str) -> bool {
    trimmed.is_empty() || trimmed.starts_with('#')
}
