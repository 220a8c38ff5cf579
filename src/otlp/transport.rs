//! One export request to a collector, over OTLP/HTTP (protobuf body) or OTLP/gRPC, and
//! what its answer means: done, worth retrying (and after how long), or refused for good.
//!
//! Both protocols go through hyper-util's client with hyper-rustls (the stack the upstream
//! client already uses; HTTP/1.1 or h2 by ALPN for OTLP/HTTP, h2 only, h2c or TLS, for
//! gRPC). gRPC is one unary call, so tonic would add a second HTTP/2 stack, tower layers
//! and a codegen'd client for what is a `POST` of one length-prefixed message (framed by
//! [`crate::wire::grpc::framing`], the project's own gRPC framing) and a `grpc-status`
//! to read from the trailers. The transport knows nothing of metrics: it sends any prost
//! message to its URL, so a span exporter can reuse it with its own URL.
//!
//! Retryable, per the OTLP specification: connection failures and timeouts, HTTP 429,
//! 502, 503 and 504 (with `Retry-After` in seconds when given, read as at most a day,
//! [`MAX_RETRY_AFTER`](rate_limits::MAX_RETRY_AFTER)), gRPC `CANCELLED`,
//! `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `OUT_OF_RANGE`, `UNAVAILABLE`,
//! `DATA_LOSS`. Anything else is permanent (a resend would be refused the same way).
//! gRPC's `RetryInfo` is not read: it sits in an encoded `google.rpc.Status`, and the
//! exporter's own backoff serves.

// Values from the network pass here: nothing may panic on them (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    not(test),
    warn(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::{OtlpCompression, OtlpLink, OtlpProtocol, OtlpTls, TlsFile};
use crate::observe::rate_limits;
use crate::trust::{self, ClientIdentity, TrustError};
use crate::wire::grpc::framing;

/// The most of a collector's answer read (its partial-success message, an error text).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Why an export did not go through.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Worth sending again, after `after` when the collector said how long.
    #[error("{reason} (retryable)")]
    Retryable {
        reason: String,
        after: Option<Duration>,
    },
    /// The collector refused it; sending it again would be refused the same way.
    #[error("{0}")]
    Permanent(String),
}

/// Why a transport could not be built: a TLS file it was given, and the key or variable
/// that named it.
#[derive(Debug, thiserror::Error)]
#[error("{from}: {source}")]
pub struct TransportError {
    from: String,
    source: TrustError,
}

/// A collector endpoint and how to talk to it.
pub struct Transport {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    url: Uri,
    link: OtlpLink,
}

impl Transport {
    /// A transport that sends to `url` as `link` says (the metrics push's or the span
    /// export's).
    pub fn new(link: &OtlpLink, url: Uri) -> Result<Transport, TransportError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(link.timeout));
        let tls = tls_config(&link.tls)?;
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let grpc = link.protocol == OtlpProtocol::Grpc;
        let connector = if grpc {
            builder.enable_http2().wrap_connector(http)
        } else {
            builder.enable_all_versions().wrap_connector(http)
        };
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(1)
            .http2_only(grpc)
            .build(connector);
        Ok(Transport {
            client,
            url,
            link: link.clone(),
        })
    }

    /// Send one encoded export request (a protobuf message), within the timeout.
    pub async fn send(&self, message: &[u8]) -> Result<(), SendError> {
        match tokio::time::timeout(self.link.timeout, self.exchange(message)).await {
            Ok(result) => result,
            Err(_) => Err(SendError::Retryable {
                reason: format!("no answer within {:?}", self.link.timeout),
                after: None,
            }),
        }
    }

    async fn exchange(&self, message: &[u8]) -> Result<(), SendError> {
        let gzip = self.link.compression == OtlpCompression::Gzip;
        let payload = if gzip {
            gzip_bytes(message)
        } else {
            message.to_vec()
        };
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone());
        for (name, value) in &self.link.headers {
            request = request.header(name, value);
        }
        let body = match self.link.protocol {
            OtlpProtocol::HttpProtobuf => {
                request = request.header(CONTENT_TYPE, "application/x-protobuf");
                if gzip {
                    request = request.header(CONTENT_ENCODING, "gzip");
                }
                payload
            }
            OtlpProtocol::Grpc => {
                request = request
                    .header(CONTENT_TYPE, "application/grpc")
                    .header("te", "trailers");
                if gzip {
                    request = request.header("grpc-encoding", "gzip");
                }
                framing::try_frame_with(gzip, &payload).ok_or_else(|| {
                    SendError::Permanent("the export is over the 4 GiB of a gRPC message".into())
                })?
            }
        };
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| SendError::Permanent(format!("cannot build the request: {e}")))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| SendError::Retryable {
                reason: format!("cannot reach the collector: {}", error_chain(&e)),
                after: None,
            })?;
        let (head, body) = response.into_parts();
        let collected = Limited::new(body, MAX_RESPONSE_BYTES).collect().await;
        match self.link.protocol {
            OtlpProtocol::HttpProtobuf => http_outcome(head.status, &head.headers),
            OtlpProtocol::Grpc => {
                let trailers = collected.ok().and_then(|c| c.trailers().cloned());
                // A trailers-only answer carries the status in its head.
                let status = trailers
                    .as_ref()
                    .and_then(|t| t.get("grpc-status"))
                    .or_else(|| head.headers.get("grpc-status"));
                if head.status != StatusCode::OK {
                    return http_outcome(head.status, &head.headers);
                }
                grpc_outcome(status.and_then(|v| v.to_str().ok()))
            }
        }
    }
}

/// What an OTLP/HTTP answer means.
pub fn http_outcome(status: StatusCode, headers: &http::HeaderMap) -> Result<(), SendError> {
    if status.is_success() {
        return Ok(());
    }
    let reason = format!("the collector answered {status}");
    match status.as_u16() {
        429 | 502 | 503 | 504 => Err(SendError::Retryable {
            reason,
            after: headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(rate_limits::delay_seconds),
        }),
        _ => Err(SendError::Permanent(reason)),
    }
}

/// What a `grpc-status` means (none at all: the call ended without one, a broken answer).
pub(crate) fn grpc_outcome(status: Option<&str>) -> Result<(), SendError> {
    let Some(code) = status.and_then(|s| s.trim().parse::<u32>().ok()) else {
        return Err(SendError::Retryable {
            reason: "the collector's answer has no grpc-status".to_string(),
            after: None,
        });
    };
    match code {
        0 => Ok(()),
        1 | 4 | 8 | 10 | 11 | 14 | 15 => Err(SendError::Retryable {
            reason: format!("the collector answered grpc-status {code}"),
            after: None,
        }),
        _ => Err(SendError::Permanent(format!(
            "the collector answered grpc-status {code}"
        ))),
    }
}

fn gzip_bytes(message: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(message);
    encoder.finish().unwrap_or_default()
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The TLS client configuration of `files`: the trust store with their CA file, and their
/// client identity when they name one.
fn tls_config(files: &OtlpTls) -> Result<rustls::ClientConfig, TransportError> {
    let named = |file: &TlsFile| {
        let from = file.from.clone();
        move |source| TransportError { from, source }
    };
    let roots = match &files.ca_file {
        Some(file) => trust::root_store(Some(&file.path)).map_err(named(file))?,
        // Without a CA file nothing is read that could fail.
        None => trust::root_store(None).map_err(|source| TransportError {
            from: "the platform trust store".to_string(),
            source,
        })?,
    };
    match (&files.client_certificate, &files.client_key) {
        (Some(certificate), Some(key)) => {
            let identity = ClientIdentity::load(&certificate.path, &key.path).map_err(|err| {
                // Named by the file at fault: the key's, or else the certificate's.
                let at_key = match &err {
                    TrustError::NoKey { .. } => true,
                    TrustError::UnreadableIdentity { path, .. } => {
                        *path == key.path.display().to_string()
                    }
                    _ => false,
                };
                named(if at_key { key } else { certificate })(err)
            })?;
            trust::client_config_with(roots, identity).map_err(named(certificate))
        }
        // The configuration refuses one without the other.
        _ => Ok(trust::client_config(roots)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn http_answers_are_classified_as_the_specification_says() {
        let mut headers = http::HeaderMap::new();
        assert!(http_outcome(StatusCode::OK, &headers).is_ok());
        assert!(matches!(
            http_outcome(StatusCode::BAD_REQUEST, &headers),
            Err(SendError::Permanent(_))
        ));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        for status in [429, 502, 503, 504] {
            match http_outcome(StatusCode::from_u16(status).unwrap(), &headers) {
                Err(SendError::Retryable { after, .. }) => {
                    assert_eq!(after, Some(Duration::from_secs(7)), "{status}")
                }
                other => panic!("{status}: {other:?}"),
            }
        }
        assert!(matches!(
            http_outcome(StatusCode::INTERNAL_SERVER_ERROR, &headers),
            Err(SendError::Permanent(_))
        ));
    }

    #[test]
    fn grpc_statuses_are_classified_as_the_specification_says() {
        assert!(grpc_outcome(Some("0")).is_ok());
        for code in ["1", "4", "8", "10", "11", "14", "15"] {
            assert!(
                matches!(grpc_outcome(Some(code)), Err(SendError::Retryable { .. })),
                "{code}"
            );
        }
        for code in ["2", "3", "7", "12", "13", "16"] {
            assert!(
                matches!(grpc_outcome(Some(code)), Err(SendError::Permanent(_))),
                "{code}"
            );
        }
        assert!(matches!(
            grpc_outcome(None),
            Err(SendError::Retryable { .. })
        ));
    }
}
