//! The config file exactly as written. Doc comments on fields are the reference for each
//! key; `deny_unknown_fields` everywhere, so a typo is an error, not a silent default.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::units::{ByteSize, Count, HumanDuration, Number};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of settings such as `upstream` and `listen`"
)]
pub struct RawConfig {
    /// Proxy listener, `ip:port` (port 0 to 65535; 0 takes a free port). Default
    /// `0.0.0.0:8080`.
    pub listen: Option<String>,
    /// Admin listener (`/metrics`, `/healthz`, `/readyz`), `ip:port` like `listen`.
    /// Default `0.0.0.0:9464`.
    pub admin: Option<String>,
    /// The upstream: its settings, or just its URL (`upstream: http://127.0.0.1:8000`).
    #[serde(default, deserialize_with = "url_or_upstream")]
    pub upstream: RawUpstream,
    /// TLS on the proxy listener (both files required).
    pub tls: Option<RawTls>,
    #[serde(default)]
    pub shutdown: RawShutdown,
    #[serde(default)]
    pub proxy: RawProxy,
    #[serde(default)]
    pub ui: RawUi,
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
    /// `RawRoute`). The first route whose `path_prefix` matches wins; a path no route
    /// matches is detected from its shape (`…/chat/completions`, `…/v1/messages`, ...).
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub log: RawLog,
    /// OTLP metrics push (see `RawOtlp`); the `OTEL_*` environment variables fill in
    /// what it leaves out.
    #[serde(default)]
    pub otlp: RawOtlp,
    /// Per-request objectives by name (the `objective` label value: lower-case letters,
    /// digits and `_`, at most 32 characters; at most 8 objectives). Each finished
    /// request is judged once against each (docs/METRICS.md, "Objectives and goodput").
    /// A reload applies them to the requests that start after it.
    #[serde(default)]
    pub objectives: RawObjectives,
}

/// `objectives`: name -> objective.
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub struct RawObjectives(pub BTreeMap<String, RawObjective>);

/// One objective: at least one bound, each a duration above 0.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an objective: a mapping with one or more of `ttft`, `tpot`, `max_gap`, `duration`, and `target` and `overrides`"
)]
pub struct RawObjective {
    /// Time to first token at most this long.
    pub ttft: Option<HumanDuration>,
    /// Time per output token after the first at most this long.
    pub tpot: Option<HumanDuration>,
    /// No gap between two token-bearing events longer than this.
    pub max_gap: Option<HumanDuration>,
    /// From the request head to the end of the response at most this long.
    pub duration: Option<HumanDuration>,
    /// The share of judged requests meant to meet it, above 0 and at most 1: the
    /// attainment alert's threshold. Default 0.95.
    pub target: Option<Number>,
    /// Other bounds for the requests of a model and/or a tenant, as their labels are
    /// counted (after aliases: a value folded into `other` matches `other`). The most
    /// specific override wins (a model and a tenant, then a tenant, then a model), bound
    /// by bound; a bound it leaves out is the objective's. At most 100.
    #[serde(default)]
    pub overrides: Vec<RawObjectiveOverride>,
}

/// Bounds for one model and/or tenant: `{tenant: acme, ttft: 300ms}`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an override: a mapping with `model` and/or `tenant` and one or more bounds"
)]
pub struct RawObjectiveOverride {
    pub model: Option<String>,
    pub tenant: Option<String>,
    pub ttft: Option<HumanDuration>,
    pub tpot: Option<HumanDuration>,
    pub max_gap: Option<HumanDuration>,
    pub duration: Option<HumanDuration>,
}

/// One route: `{path_prefix: /my/llm, dialect: anthropic}`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a route: a mapping with `path_prefix` and `dialect`"
)]
pub struct RawRoute {
    /// Matches the request path (as the client sent it, before `upstream.url`'s base path
    /// is prepended) when it equals the prefix or continues it with `/`: `/my/llm` matches
    /// `/my/llm` and `/my/llm/chat`, not `/my/llmx`. `/` matches every path.
    pub path_prefix: String,
    /// The dialect of `POST` requests under the prefix: `openai_chat`,
    /// `openai_completions`, `openai_responses`, `anthropic`, `gemini`, `ollama`, `tgi`,
    /// `triton`, `sglang_grpc`, `vllm_grpc`, `trtllm_grpc`, `triton_grpc` (gRPC calls are
    /// `POST`s too); other methods are detected as usual. `none`: every request under the
    /// prefix is forwarded unobserved, as a non-LLM path.
    pub dialect: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a URL, or a mapping with `url`")]
pub struct RawUpstream {
    /// `http://host:port` or `https://host[:port][/base-path]`; a port is 1 to 65535
    /// (left out: 80 for `http`, 443 for `https`). Required (here or `--upstream`).
    pub url: Option<String>,
    /// TCP (and TLS) connect timeout. Default 5s.
    pub connect_timeout: Option<HumanDuration>,
    /// Time from receiving the client's request head (`t_req`) to the upstream's
    /// response head, connecting and sending the request and its body included; past it
    /// tokentap answers 504 (`timeout`). Default 300s (long prompts can take minutes to
    /// prefill).
    pub response_head_timeout: Option<HumanDuration>,
    /// How long the upstream may send nothing while tokentap waits for it in a response
    /// body; past it the stream is ended (`timeout`). The clock runs only while tokentap
    /// waits to read from the upstream (`exchange::idle`): time spent writing to a client
    /// that reads slowly is not the upstream's. Default 120s.
    pub idle_timeout: Option<HumanDuration>,
    /// Speak only HTTP/2 to the upstream: with prior knowledge (h2c) to an `http://` one;
    /// to an `https://` one, offer only `h2` by ALPN and refuse a server that does not
    /// choose it (a `502`). Default false: `https://` then offers h2 and HTTP/1.1 and the
    /// server chooses. A gRPC engine needs HTTP/2 end to end.
    #[serde(default)]
    pub http2: bool,
    /// Extra PEM CA bundle trusted for `https://` upstreams (besides the platform's and
    /// the webpki roots).
    pub ca_file: Option<PathBuf>,
    /// `upstream` (default): send the upstream's authority as `Host`; `preserve`: send the
    /// client's.
    pub host_header: Option<String>,
    /// Idle pooled connections are closed after this long (`0s` keeps none). Default 90s.
    pub pool_idle_timeout: Option<HumanDuration>,
    /// Most idle keep-alive connections to the upstream in the whole process. To a plain
    /// `http://` HTTP/1.1 upstream the relay's and hyper's connections count together,
    /// and each worker thread keeps its part: the cap split evenly over the workers, the
    /// first `max % workers` keeping one more (a worker past the cap keeps none). To an
    /// HTTPS or h2c upstream it is the bound of hyper-util's pool. Default 1024.
    pub pool_max_idle_per_host: Option<Count>,
    /// How often `/readyz` re-checks that the upstream accepts connections. Default 5s.
    pub probe_interval: Option<HumanDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `cert_file` and `key_file`"
)]
pub struct RawTls {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// The live view, on its own listener.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `enabled` and `listen`"
)]
pub struct RawUi {
    /// Serve the live view: the page `/ui` (also at `/`), the JSON snapshot
    /// `/api/live/snapshot` and the server-sent events `/api/live/stream` on `ui.listen`,
    /// read-only, with a ring of the last ten minutes per model kept in memory (at most
    /// about 7.5 MiB). `false`: nothing listens there and no ticker, ring or request tap
    /// runs. Read at start. Default true.
    pub enabled: Option<bool>,
    /// The live view's listener, `ip:port` like `listen`. It shows model and tenant names
    /// and trace ids, so by default only the pod itself reaches it: `kubectl port-forward`
    /// brings it to an operator's machine. The admin port answers its paths with a 404
    /// that says where it is. Read at start. Default `127.0.0.1:9465`.
    pub listen: Option<String>,
}

/// How the proxy port serves HTTP/1.1.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `http1_fast_path`")]
pub struct RawProxy {
    /// Serve plain (not TLS) HTTP/1.1 connections with tokentap's own relay instead of
    /// hyper (the HTTP/1.1 fast path, issue 15): requests with no body, a `Content-Length`
    /// or a chunked body to a plain-HTTP/1.1 upstream are forwarded on per-worker
    /// keep-alive connections and their responses relayed as they arrive; a head that
    /// `httparse` refuses is answered with hyper's `400`/`431` bytes; at the first other
    /// request (`Expect`, upgrade, HTTP/1.0, h2c, an HTTPS or h2c upstream)
    /// the connection is handed to hyper with the bytes read so far. Applies to
    /// connections accepted after a reload. Default true.
    pub http1_fast_path: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `drain_timeout`")]
pub struct RawShutdown {
    /// On SIGTERM/SIGINT, how long in-flight streams may take to finish. Default 30s.
    pub drain_timeout: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of limits such as `max_in_flight`"
)]
pub struct RawLimits {
    /// Requests in flight at once; more get 503. Default 20000.
    pub max_in_flight: Option<Count>,
    /// Client connections open at once on the proxy port (idle keep-alive ones
    /// included). At the limit tokentap stops accepting until one closes: new clients
    /// wait in the kernel's listen backlog rather than being accepted and closed, and the
    /// admin port (`/metrics`, `/healthz`, `/readyz`), which has its own descriptors, keeps
    /// answering. The backlog holds 1024 clients (or `net.core.somaxconn`, if less); past
    /// it the kernel drops a new client's SYN, which the client sends again 1s, 3s, ...
    /// later. Each time the limit is reached counts in
    /// `tokentap_client_connection_limit_reached_total`; the open connections are
    /// `tokentap_client_connections`, the limit in force
    /// `tokentap_client_connections_limit`. Default: what the process's file descriptor
    /// limit (the soft `RLIMIT_NOFILE`, `ulimit -n`) allows, at most 65536: half of what is
    /// left after a reserve of 48, plus 4 per worker thread, plus 32 for the admin port and
    /// the live view (each client connection may hold an upstream connection too), e.g. 468 at
    /// `ulimit -n 1024` with 2 workers. A value above what the descriptor limit allows is
    /// lowered to that, with a warning at start naming both. A connection upgraded by a
    /// `101` (WebSocket) counts until it is handed to its tunnel, not while tunnelled. Read
    /// at startup.
    pub max_connections: Option<Count>,
    /// A client must send its whole request head within this. Default 30s.
    pub header_read_timeout: Option<HumanDuration>,
    /// Most request headers accepted. Default 100.
    pub max_headers: Option<Count>,
    /// Largest request head buffered (HTTP/1). Default 64KiB.
    pub max_header_bytes: Option<ByteSize>,
    /// Longest pause allowed between two reads of a request body while more of it is
    /// due; past it the client gets 408 and the request counts as `client_error`.
    /// Default 30s.
    pub request_body_timeout: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `sources`")]
pub struct RawTenants {
    /// Where the tenant comes from, first match wins. Default `[{header: x-tenant-id}]`.
    pub sources: Option<Vec<RawTenantSource>>,
}

/// One tenant source: exactly one of the keys.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a tenant source: a mapping with one of `header`, `api_keys`"
)]
pub struct RawTenantSource {
    /// A request header whose value is the tenant.
    pub header: Option<String>,
    /// Lower-case hex SHA-256 of an API key -> tenant name. The key is read from
    /// `Authorization: Bearer <key>`, `x-api-key` or `api-key`.
    pub api_keys: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `model` and `tenant`")]
pub struct RawLabels {
    #[serde(default)]
    pub model: RawLabelPolicy,
    #[serde(default)]
    pub tenant: RawLabelPolicy,
    /// Distinct (model, tenant) pairs kept, whatever the per-label caps allow; past it a
    /// new pair is counted as (`other`, `other`) and in
    /// `tokentap_label_overflow_total{label="pair"}`. Default 250; no bound by default
    /// when a label is `unbounded`.
    pub max_pairs: Option<Count>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of label bounds such as `max_values`"
)]
pub struct RawLabelPolicy {
    /// Distinct values kept before new ones become `other`. Default 32 for `model`, 200
    /// for `tenant`; at most 100000 unless `unbounded` is set.
    pub max_values: Option<Count>,
    /// Opt in to unbounded cardinality (ignores `max_values`). Default false.
    #[serde(default)]
    pub unbounded: bool,
    /// Only these values are kept (after aliases); anything else is `other`.
    pub allow: Option<Vec<String>>,
    /// Value renames applied first, e.g. `gpt-4o-2024-08-06: gpt-4o`.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// Values longer than this many bytes become `other`. Default 128.
    pub max_value_len: Option<Count>,
    /// `labels.tenant` only: the metric families that carry `tenant` (one series per
    /// (model, tenant) pair); every other per-request family is per model (only `model`,
    /// no `tenant` label), which keeps a scrape of many tenants small. Default:
    /// `tokentap_requests_total`, `tokentap_output_tokens_total`,
    /// `tokentap_input_tokens_total`, `tokentap_event_tokens_total`,
    /// `tokentap_time_to_first_token_seconds` and `tokentap_inter_token_latency_seconds`
    /// (what per-tenant SLOs and the dashboard's per-tenant panels read). Any of those and
    /// of `tokentap_time_to_first_byte_seconds`,
    /// `tokentap_time_to_first_content_token_seconds`,
    /// `tokentap_inter_chunk_latency_seconds`, `tokentap_time_per_output_token_seconds`,
    /// `tokentap_output_tokens_per_second`, `tokentap_output_tokens_per_event`,
    /// `tokentap_request_duration_seconds` and
    /// `tokentap_stream_stalls_total` may be listed; `[]` puts every family per model.
    /// Read at startup: a reload that changes it keeps the running set and warns that it
    /// takes effect after a restart.
    pub families: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `buckets`, `stall_threshold`, `native_histograms`, `exemplars` and `names`"
)]
pub struct RawMetrics {
    /// Bucket upper bounds per histogram, strictly increasing.
    #[serde(default)]
    pub buckets: RawBuckets,
    /// Native (sparse exponential) histograms, served in the Prometheus protobuf format to
    /// scrapers that ask for it.
    #[serde(default)]
    pub native_histograms: RawNativeHistograms,
    /// Trace exemplars: a request's W3C trace context on its TTFT, ITL, TPOT and duration
    /// histograms, served in the OpenMetrics text and protobuf formats.
    #[serde(default)]
    pub exemplars: RawExemplars,
    /// An inter-token gap at least this long is counted in `tokentap_stream_stalls_total`.
    /// Default 5s.
    pub stall_threshold: Option<HumanDuration>,
    /// The names `/metrics` exposes the latency histograms and token counts by: `tokentap`
    /// (the default), `gen_ai` (the OpenTelemetry GenAI semantic conventions' instead) or
    /// `both`. Takes effect after a restart.
    pub names: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `enabled`, `factor` or `schema`, `max_buckets` and `classic`"
)]
pub struct RawNativeHistograms {
    /// Keep native buckets beside every classic histogram (about 1 KiB per histogram at
    /// schema 3, 7 KiB per label pair). Default true. When false, the protobuf format
    /// carries the classic buckets only.
    pub enabled: Option<bool>,
    /// The growth factor from one bucket's bound to the next, greater than 1: the finest
    /// Prometheus schema whose factor `2^(2^-schema)` is at most this is used. Default
    /// 1.1 (schema 3, factor 1.09, at most ~4.3% relative error on a quantile). Set this
    /// or `schema`, not both.
    pub factor: Option<Number>,
    /// The Prometheus schema itself, -4 (factor 65536) to 8 (factor 1.0027).
    pub schema: Option<i64>,
    /// The most populated buckets one histogram exposes: past it the resolution is halved
    /// (schema - 1, adjacent buckets merged) until it fits, as Prometheus does. Default 160.
    pub max_buckets: Option<Count>,
    /// Also expose the classic buckets in the protobuf format, so one scrape serves a
    /// Prometheus with or without native histograms. Default true.
    pub classic: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `enabled` and `header`"
)]
pub struct RawExemplars {
    /// Read each measured request's trace context and keep it as an exemplar: at most one
    /// per histogram per request, on TTFT (its value), ITL (its slowest per-token value),
    /// TPOT and duration, with the labels `trace_id` and `span_id`. Only a valid W3C
    /// `traceparent` value becomes an exemplar (version `00`: exactly
    /// `00-<32 lower-case hex trace id>-<16 lower-case hex span id>-<2 hex flags>`, ids not
    /// all zero; a later version is read by its first four fields as the W3C spec says);
    /// anything else gives none, and the request is never modified. Exemplars are shown
    /// in the OpenMetrics text and protobuf formats, never in the Prometheus text one.
    /// Storage is taken per histogram on its first exemplar (48 bytes per classic bucket
    /// and per native slot: about 4.7 KiB per label pair with the default buckets).
    /// Default true.
    pub enabled: Option<bool>,
    /// The request header holding the `traceparent`-formatted trace context. Default
    /// `traceparent`.
    pub header: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping from a histogram's name to its bucket bounds"
)]
pub struct RawBuckets {
    pub time_to_first_byte_seconds: Option<Vec<Number>>,
    pub time_to_first_token_seconds: Option<Vec<Number>>,
    pub inter_token_latency_seconds: Option<Vec<Number>>,
    pub inter_chunk_latency_seconds: Option<Vec<Number>>,
    pub time_per_output_token_seconds: Option<Vec<Number>>,
    pub output_tokens_per_second: Option<Vec<Number>>,
    pub output_tokens_per_event: Option<Vec<Number>>,
    pub request_duration_seconds: Option<Vec<Number>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of observation settings such as `max_event_bytes`"
)]
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
    /// logprobs or cumulative usage), instead of its words and symbols. Still counted as
    /// `accuracy="estimated"`. Default: off (no cost). Exactly one of `encoding`, `file`.
    pub tokenizer: Option<RawTokenizer>,
}

/// `observe.tokenizer`: exactly one of the keys.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with one of `encoding`, `file`"
)]
pub struct RawTokenizer {
    /// A built-in tiktoken encoding: `o200k_base` (GPT-4o, GPT-4.1, o-series, gpt-oss) or
    /// `cl100k_base` (GPT-4, GPT-3.5). Shipped inside tokentap; nothing is downloaded.
    pub encoding: Option<String>,
    /// A Hugging Face `tokenizer.json` (e.g. the served model's own), read at startup and
    /// on each reload, once the rest of the configuration is valid. Needs a build with
    /// `--features tokenizers`.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `format` and `level`")]
pub struct RawLog {
    /// `text` (default) or `json`.
    pub format: Option<String>,
    /// Filter directive, e.g. `info` (default) or `tokentap=debug`.
    pub level: Option<String>,
}

/// `upstream` as a URL string (the `--upstream` shorthand) or as its mapping of settings.
/// OTLP metrics push: every `interval`, the series `/metrics` shows, sent to an
/// OpenTelemetry collector. Each key wins over the OpenTelemetry environment variable
/// named beside it; a key left out falls back to that variable, then to the default.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `enabled`, `endpoint`, `protocol`, `headers`, `compression`, `timeout`, `interval`, `export_timeout`, `resource_attributes`, `ca_file`, `client_certificate`, `client_key` and `traces`"
)]
pub struct RawOtlp {
    /// `false` turns the push off whatever the environment says; `true` turns it on, to the
    /// default endpoint if none is given. Left out: on when an endpoint is given (here,
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`), unless
    /// `OTEL_SDK_DISABLED` is `true`.
    pub enabled: Option<bool>,
    /// The collector's metrics URL, used as written (`http://collector:4318/v1/metrics`
    /// for `http/protobuf`, `http://collector:4317` for `grpc`; `https://` for TLS). Over
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, then `OTEL_EXPORTER_OTLP_ENDPOINT` (to which
    /// `http/protobuf` appends `/v1/metrics`). Default `http://localhost:4318/v1/metrics`
    /// (`http://localhost:4317` for `grpc`).
    pub endpoint: Option<String>,
    /// `http/protobuf` or `grpc`. Over `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` (spans:
    /// `_TRACES_PROTOCOL`), then `OTEL_EXPORTER_OTLP_PROTOCOL`. Default `http/protobuf`.
    pub protocol: Option<String>,
    /// Request headers sent with every export (e.g. an API key); never logged. Over
    /// `OTEL_EXPORTER_OTLP_METRICS_HEADERS` (spans: `_TRACES_HEADERS`), then
    /// `OTEL_EXPORTER_OTLP_HEADERS`.
    pub headers: Option<BTreeMap<String, String>>,
    /// `gzip` or `none`. Over `OTEL_EXPORTER_OTLP_METRICS_COMPRESSION` (spans:
    /// `_TRACES_COMPRESSION`), then `OTEL_EXPORTER_OTLP_COMPRESSION`. Default `none`.
    pub compression: Option<String>,
    /// How long one export request may take. Over `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT`
    /// (spans: `_TRACES_TIMEOUT`), then `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds).
    /// Default 10s.
    pub timeout: Option<HumanDuration>,
    /// Time between exports. Over `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds). Default
    /// 60s.
    pub interval: Option<HumanDuration>,
    /// How long one export may take with its retries. Over `OTEL_METRIC_EXPORT_TIMEOUT`
    /// (milliseconds). Default 30s.
    pub export_timeout: Option<HumanDuration>,
    /// Resource attributes, over those of `OTEL_RESOURCE_ATTRIBUTES` and
    /// `OTEL_SERVICE_NAME` (`service.name` defaults to `tokentap`).
    pub resource_attributes: Option<BTreeMap<String, String>>,
    /// A PEM file of CA certificates to trust beside the platform's and webpki's, for an
    /// `https://` collector signed by a private CA. Over
    /// `OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE` (spans: `_TRACES_CERTIFICATE`), then
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    pub ca_file: Option<PathBuf>,
    /// A PEM certificate chain and its private key, presented to a collector that asks for
    /// a client certificate (mutual TLS); both or neither. Over
    /// `OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE` / `_CLIENT_KEY` (spans: `_TRACES_`),
    /// then `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` / `_CLIENT_KEY`.
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Per-request spans (see [`RawOtlpTraces`]), sent with the push's protocol, headers,
    /// compression and timeout (`OTEL_EXPORTER_OTLP_TRACES_*` over the generic variables
    /// where the file leaves them out).
    pub traces: Option<RawOtlpTraces>,
}

/// `otlp.traces`: one span per measured request, exported over OTLP. Off unless turned on
/// here or by `OTEL_TRACES_EXPORTER=otlp`.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `enabled`, `endpoint`, `sampler`, `sampler_ratio`, `schedule_delay`, `max_queue_size`, `max_export_batch_size` and `export_timeout`"
)]
pub struct RawOtlpTraces {
    /// `true` turns spans on (and with them the OTLP push), `false` off whatever
    /// `OTEL_TRACES_EXPORTER` says. Left out: on when `OTEL_TRACES_EXPORTER` is `otlp`.
    pub enabled: Option<bool>,
    /// The collector's traces URL, used as written. Over
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (as written), then `otlp.endpoint` (gRPC: its
    /// authority; `http/protobuf`: its path with `/v1/metrics` made `/v1/traces`), then
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (`http/protobuf` appends `/v1/traces`). Default
    /// `http://localhost:4318/v1/traces` (`http://localhost:4317` for `grpc`).
    pub endpoint: Option<String>,
    /// `parentbased_always_on` (the default), `parentbased_always_off`,
    /// `parentbased_traceidratio`, `always_on`, `always_off` or `traceidratio`. Over
    /// `OTEL_TRACES_SAMPLER`.
    pub sampler: Option<String>,
    /// The ratio of a `traceidratio` sampler, 0 to 1 (given alone, the sampler is
    /// `parentbased_traceidratio`). Over `OTEL_TRACES_SAMPLER_ARG`. Default 1.
    pub sampler_ratio: Option<Number>,
    /// The longest a finished span waits before it is sent. Over `OTEL_BSP_SCHEDULE_DELAY`
    /// (milliseconds). Default 5s.
    pub schedule_delay: Option<HumanDuration>,
    /// Spans waiting to be sent at most; more are dropped and counted. Over
    /// `OTEL_BSP_MAX_QUEUE_SIZE`. Default 2048.
    pub max_queue_size: Option<Count>,
    /// Spans per export at most (no more than `max_queue_size`). Over
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`. Default 512.
    pub max_export_batch_size: Option<Count>,
    /// How long one export may take with its retries. Over `OTEL_BSP_EXPORT_TIMEOUT`
    /// (milliseconds). Default 30s.
    pub export_timeout: Option<HumanDuration>,
}

fn url_or_upstream<'de, D: Deserializer<'de>>(deserializer: D) -> Result<RawUpstream, D::Error> {
    struct UrlOrUpstream;
    impl<'de> Visitor<'de> for UrlOrUpstream {
        type Value = RawUpstream;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a URL, or a mapping with `url`")
        }
        fn visit_str<E: de::Error>(self, url: &str) -> Result<RawUpstream, E> {
            Ok(RawUpstream {
                url: Some(url.to_string()),
                ..RawUpstream::default()
            })
        }
        fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<RawUpstream, M::Error> {
            RawUpstream::deserialize(MapAccessDeserializer::new(map))
        }
        /// `upstream:` with nothing after it: all defaults, as when the key is left out.
        fn visit_unit<E: de::Error>(self) -> Result<RawUpstream, E> {
            Ok(RawUpstream::default())
        }
    }
    deserializer.deserialize_any(UrlOrUpstream)
}
