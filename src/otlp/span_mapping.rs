//! A measured request ([`RequestSummary`]) as one OTLP span, and a batch of them as one
//! `ExportTraceServiceRequest`.
//!
//! The span is tokentap's own: its id is new, its trace the request's `traceparent`'s
//! (else a new one), its parent the span that `traceparent` names. It is a **CLIENT**
//! span: it describes the client's call to the inference engine as tokentap saw it pass
//! (`server.address` is the engine; the GenAI conventions make an inference span CLIENT
//! kind). tokentap forwards `traceparent` unchanged, so an engine that traces its own work
//! makes its SERVER span a child of the caller's span, not of tokentap's; a SERVER span
//! from tokentap would be a second server for the same call in a service graph, and an
//! INTERNAL one would hide that it is a call to another service. As a CLIENT sibling of
//! the engine's span it sits under the caller's span without taking the engine's place.
//!
//! Name `{gen_ai.operation.name} {gen_ai.request.model}` (the operation alone when the
//! request named no model); start at the request head, end at the last byte; status
//! ERROR, with `error.type` the outcome, for every outcome but `completed`. Attributes:
//! the GenAI ones where known, `server.address`/`server.port` of the upstream, the HTTP
//! (or gRPC) status, and tokentap's own figures under `tokentap.*`. Never a header, a
//! prompt or an answer.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span::SpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Span, Status,
};

use super::mapping::{unix_nanos, SCOPE};
use crate::clock::saturating_nanos;
use crate::outcome::Outcome;
use crate::summary::RequestSummary;

/// W3C trace flags: sampled.
const SAMPLED: u32 = 0x01;
/// OTLP span flags: whether the parent is remote is known (bit 8), and it is (bit 9).
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The upstream's host and port, as `server.address` and `server.port`.
#[derive(Clone, Debug)]
pub struct Server {
    pub address: String,
    pub port: u16,
}

/// The span of `request`, which must carry tokentap's span ids (`None` if it does not).
pub fn span(request: &RequestSummary, server: Option<&Server>) -> Option<Span> {
    let own = request.span()?;
    let parent = request.trace().filter(|p| p.trace_id == own.trace_id);
    let model = request.request_model();
    let name = match model {
        Some(model) => format!("{} {model}", request.gen_ai_operation()),
        None => request.gen_ai_operation().to_string(),
    };
    let mut attributes = attributes(request, model, server);
    let status = match request.verdict.outcome {
        Outcome::Completed => None,
        failed => {
            attributes.push(string("error.type", failed.as_str()));
            Some(Status {
                message: String::new(),
                code: StatusCode::Error as i32,
            })
        }
    };
    let start = unix_nanos(request.started);
    let flags = SAMPLED | HAS_IS_REMOTE | if parent.is_some() { IS_REMOTE } else { 0 };
    Some(Span {
        trace_id: own.trace_id.to_vec(),
        span_id: own.span_id.to_vec(),
        trace_state: request.facts.trace_state.clone().unwrap_or_default(),
        parent_span_id: parent.map(|p| p.span_id.to_vec()).unwrap_or_default(),
        flags,
        name,
        kind: SpanKind::Client as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start.saturating_add(saturating_nanos(request.duration)),
        attributes,
        status,
        ..Default::default()
    })
}

/// The span's attributes, but `error.type`: the GenAI ones where known, the upstream's
/// address, the status, and tokentap's own figures.
fn attributes(
    request: &RequestSummary,
    model: Option<&str>,
    server: Option<&Server>,
) -> Vec<KeyValue> {
    let mut attributes = Vec::with_capacity(24);
    let mut text = |key: &'static str, value: &str| attributes.push(string(key, value));
    text("gen_ai.operation.name", request.gen_ai_operation());
    text("gen_ai.provider.name", request.gen_ai_provider());
    if let Some(model) = model {
        text("gen_ai.request.model", model);
    }
    if let Some(model) = &request.response_model {
        text("gen_ai.response.model", model);
    }
    text("tokentap.outcome", request.verdict.outcome.as_str());
    text("tokentap.status_class", request.verdict.status.as_str());
    text("tokentap.tenant", &request.tenant);
    text("tokentap.dialect", request.dialect().as_str());
    text("tokentap.output_tokens.counting", request.counting);
    if let Some(server) = server {
        attributes.push(string("server.address", &server.address));
        attributes.push(int("server.port", i64::from(server.port)));
    }
    push_usage(request, &mut attributes);
    let mut seconds = |key: &'static str, value: Option<Duration>| {
        if let Some(value) = value {
            attributes.push(double(key, value.as_secs_f64()));
        }
    };
    seconds("gen_ai.response.time_to_first_chunk", request.ttft);
    seconds("tokentap.ttfb", request.ttfb);
    seconds("tokentap.itl.p50", request.itl_p50);
    seconds("tokentap.itl.max", request.slowest_itl);
    seconds("tokentap.tpot", request.tpot);
    if let Some(status) = request.http_status {
        attributes.push(int("http.response.status_code", i64::from(status)));
    }
    if let Some(status) = request.grpc_status {
        attributes.push(int("rpc.grpc.status_code", i64::from(status)));
    }
    if let Some(stream) = request.stream() {
        attributes.push(kv("tokentap.stream", any_value::Value::BoolValue(stream)));
    }
    attributes.push(int("tokentap.events", saturate(request.events)));
    attributes
}

/// The GenAI usage attributes: tokens in and out, the cached parts of the input, and the
/// finish reasons.
fn push_usage(request: &RequestSummary, attributes: &mut Vec<KeyValue>) {
    if let Some(tokens) = request.input_tokens {
        attributes.push(int("gen_ai.usage.input_tokens", saturate(tokens)));
    }
    // The conventions' (experimental) names for the cached parts of the input; they have
    // none for reasoning output, so it is not invented here.
    let details = &request.token_details;
    if let Some(tokens) = details.cache_read_input {
        attributes.push(int(
            "gen_ai.usage.cache_read.input_tokens",
            saturate(tokens),
        ));
    }
    if let Some(tokens) = details.cache_write_input {
        attributes.push(int(
            "gen_ai.usage.cache_creation.input_tokens",
            saturate(tokens),
        ));
    }
    if request.output_tokens > 0 || request.counting != "none" {
        attributes.push(int(
            "gen_ai.usage.output_tokens",
            saturate(request.output_tokens),
        ));
    }
    if !request.finish_reasons.is_empty() {
        let values = request
            .finish_reasons
            .iter()
            .map(|reason| AnyValue {
                value: Some(any_value::Value::StringValue(reason.clone())),
            })
            .collect();
        attributes.push(kv(
            "gen_ai.response.finish_reasons",
            any_value::Value::ArrayValue(ArrayValue { values }),
        ));
    }
}

/// `spans` as one export request from `resource`.
pub fn export_request(
    spans: Vec<Span>,
    resource: &[(String, String)],
) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource.iter().map(|(k, v)| string(k, v)).collect(),
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: SCOPE.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.to_string()))
}

fn int(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

fn double(key: &str, value: f64) -> KeyValue {
    kv(key, any_value::Value::DoubleValue(value))
}

fn saturate(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exemplar::TraceContext;
    use crate::outcome::{StatusClass, Verdict};
    use crate::summary::RequestFacts;
    use crate::wire::Dialect;
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

    fn request() -> RequestSummary {
        let mut facts = RequestFacts::new(
            http::Method::POST,
            "/v1/messages".into(),
            Dialect::Anthropic,
            None,
        );
        let _ = facts.model.set("claude".into());
        let _ = facts.stream.set(true);
        facts.span = Some(TraceContext {
            trace_id: [1; 16],
            span_id: [2; 8],
        });
        let mut request = RequestSummary::unmeasured(
            Arc::new(facts),
            Arc::from("m"),
            Arc::from("t"),
            Verdict::new(Outcome::Completed, StatusClass::Success),
        );
        request.http_status = Some(200);
        request.started = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        request.duration = Duration::from_millis(1500);
        request.ttfb = Some(Duration::from_millis(5));
        request.ttft = Some(Duration::from_millis(250));
        request.slowest_itl = Some(Duration::from_millis(40));
        request.events = 10;
        request.output_tokens = 12;
        request.input_tokens = Some(30);
        request.counting = "apportioned";
        request.itl_p50 = Some(Duration::from_millis(20));
        request.finish_reasons = vec!["end_turn".into()];
        request
    }

    fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn a_root_span_with_its_times_and_attributes() {
        let server = Server {
            address: "engine".into(),
            port: 8000,
        };
        let span = span(&request(), Some(&server)).expect("a span");
        assert_eq!(span.name, "chat claude");
        assert_eq!(span.kind, SpanKind::Client as i32);
        assert!(span.parent_span_id.is_empty());
        assert_eq!(
            span.flags,
            SAMPLED | HAS_IS_REMOTE,
            "a root: no remote parent"
        );
        assert_eq!(span.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(span.end_time_unix_nano, 1_700_000_001_500_000_000);
        assert_eq!(span.status, None);
        let string = |key| match attribute(&span, key) {
            Some(any_value::Value::StringValue(v)) => v.clone(),
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(string("gen_ai.provider.name"), "anthropic");
        assert_eq!(string("server.address"), "engine");
        assert!(attribute(&span, "gen_ai.response.model").is_none());
        assert_eq!(
            attribute(&span, "gen_ai.usage.input_tokens"),
            Some(&any_value::Value::IntValue(30))
        );
        assert_eq!(
            attribute(&span, "tokentap.itl.p50"),
            Some(&any_value::Value::DoubleValue(0.02))
        );
        assert!(attribute(&span, "error.type").is_none());
    }

    #[test]
    fn a_child_of_its_traceparent_and_an_error_when_it_failed() {
        let mut failed = request();
        let facts = Arc::get_mut(&mut failed.facts).expect("not shared");
        facts.trace = Some(TraceContext {
            trace_id: [1; 16],
            span_id: [9; 8],
        });
        facts.model = Default::default();
        facts.trace_state = Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into());
        failed.verdict = Verdict::new(
            Outcome::Timeout,
            StatusClass::tokentap(http::StatusCode::GATEWAY_TIMEOUT),
        );
        failed.http_status = None;
        let span = span(&failed, None).expect("a span");
        assert_eq!(span.parent_span_id, vec![9; 8]);
        assert_eq!(span.trace_state, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
        assert_eq!(span.flags, SAMPLED | HAS_IS_REMOTE | IS_REMOTE);
        assert_eq!(span.name, "chat", "no model named: the operation alone");
        assert_eq!(span.status.as_ref().unwrap().code, StatusCode::Error as i32);
        assert_eq!(
            attribute(&span, "error.type"),
            Some(&any_value::Value::StringValue("timeout".into()))
        );
        assert!(attribute(&span, "server.address").is_none());
        // A request without a span of its own gives none.
        let mut unsampled = request();
        Arc::get_mut(&mut unsampled.facts).expect("not shared").span = None;
        assert!(super::span(&unsampled, None).is_none());
    }
}
