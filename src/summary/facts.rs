//! [`RequestFacts`]: who a measured request is, known from its head at once and from its
//! body as the request scan reads it; shared by the recorder and the request's summary.

use std::sync::OnceLock;

use crate::metrics::exemplar::TraceContext;
use crate::wire::Dialect;

/// What is known about one measured request: who it is (from its head, at once) and what
/// its body said (published by the request scan as soon as it is read). Labels and the
/// access log come from here.
#[derive(Debug)]
pub struct RequestFacts {
    pub method: http::Method,
    /// The path without its query (a query can hold keys).
    pub path: String,
    pub dialect: Dialect,
    pub tenant: Option<String>,
    /// The request's valid W3C trace context, when exemplars or spans are on and it
    /// carried one.
    pub trace: Option<TraceContext>,
    /// tokentap's own span for the request, when spans are on and it was sampled: the
    /// parent's trace id (or a new one) and a new span id.
    pub span: Option<TraceContext>,
    /// The parent's valid W3C `tracestate`, for a request with a span and a parent: the
    /// span carries it.
    pub trace_state: Option<String>,
    /// What the request's exemplars name, when exemplars are on: its span, else the trace
    /// context it carried.
    pub exemplar: Option<TraceContext>,
    pub model: OnceLock<String>,
    /// Set when the body's `model` was too long for the request scanner to read.
    pub model_too_long: OnceLock<()>,
    pub stream: OnceLock<bool>,
    /// The model the upstream's engine said it serves (`GetModelInfo`), for a gRPC
    /// dialect whose requests name none: the label when neither request nor response
    /// names one.
    pub served_model: Option<String>,
}

impl RequestFacts {
    /// Facts from the head; the body's are filled in as the scan finds them.
    pub fn new(
        method: http::Method,
        path: String,
        dialect: Dialect,
        tenant: Option<String>,
    ) -> RequestFacts {
        RequestFacts {
            method,
            path,
            dialect,
            tenant,
            trace: None,
            span: None,
            trace_state: None,
            exemplar: None,
            model: OnceLock::new(),
            model_too_long: OnceLock::new(),
            stream: OnceLock::new(),
            served_model: None,
        }
    }
}
