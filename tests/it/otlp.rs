//! The OTLP push against an in-process collector that speaks OTLP/HTTP: a refusal the
//! specification calls retryable is retried and the counts arrive; shutdown sends the last
//! counts; a collector that never answers holds no request up, and what is lost is counted;
//! over gRPC (h2c), a trailers-only `UNAVAILABLE` is retried and the export arrives.
//! (scripts/ops/e2e-otlp.sh checks both protocols against the OpenTelemetry project's own
//! Python receiver.)

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{client, Proxy, SimHandle};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
use prost::Message;
use tokentap_sim::{ModelProfile, SimConfig};

/// What the collector saw: each request's answer status and the accepted exports.
#[derive(Default)]
struct Seen {
    statuses: Vec<u16>,
    accepted: Vec<ExportMetricsServiceRequest>,
}

/// An OTLP/HTTP collector on a free port that answers the first `refusals` exports 503
/// (`Retry-After: 0`) and accepts the rest.
async fn collector(refusals: usize) -> (SocketAddr, Arc<Mutex<Seen>>) {
    collector_asking(refusals, "0").await
}

/// [`collector`], whose refusals ask for `retry_after`.
async fn collector_asking(
    refusals: usize,
    retry_after: &'static str,
) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shared = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = shared.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    assert_eq!(request.uri().path(), "/v1/metrics");
                    assert_eq!(request.headers()["content-type"], "application/x-protobuf");
                    let body = request
                        .into_body()
                        .collect()
                        .await
                        .expect("body")
                        .to_bytes();
                    let export = ExportMetricsServiceRequest::decode(body).expect("protobuf");
                    let mut seen = seen.lock().unwrap();
                    let status = if seen.statuses.len() < refusals {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        seen.accepted.push(export);
                        StatusCode::OK
                    };
                    seen.statuses.push(status.as_u16());
                    Response::builder()
                        .status(status)
                        .header("retry-after", retry_after)
                        .body(Full::new(Bytes::new()))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, seen)
}

fn sim() -> SimConfig {
    SimConfig {
        models: vec![ModelProfile::new(
            "m",
            Duration::from_millis(5),
            Duration::from_millis(1),
            5,
        )],
        ..SimConfig::default()
    }
}

async fn one_request(proxy: &Proxy) {
    let response = client()
        .request(common::chat(
            &proxy.url("/v1/chat/completions"),
            "m",
            "t",
            true,
            true,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    common::body_bytes(response).await;
}

/// `tokentap_requests_total` summed over an export's points.
fn requests(export: &ExportMetricsServiceRequest) -> f64 {
    export.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .filter(|m| m.name == "tokentap_requests_total")
        .filter_map(|m| match &m.data {
            Some(Data::Sum(sum)) => Some(sum.data_points.iter().map(|p| match p.value {
                Some(Value::AsDouble(v)) => v,
                _ => 0.0,
            })),
            _ => None,
        })
        .flatten()
        .sum()
}

#[tokio::test]
async fn a_retryable_refusal_is_retried_and_shutdown_sends_the_last_counts() {
    let (collector, seen) = collector(2).await;
    let sim = SimHandle::start(sim()).await;
    let yaml = format!(
        "otlp:\n  endpoint: http://{collector}/v1/metrics\n  interval: 200ms\n  export_timeout: 5s\n"
    );
    let mut proxy = Proxy::start(&sim.url(), &yaml).await;
    one_request(&proxy).await;
    let metrics = common::wait_for_metrics(proxy.admin, "a successful export", |m| {
        m.sum(
            "tokentap_otlp_exports_total",
            &[("signal", "metrics"), ("result", "success")],
        ) >= 1.0
    })
    .await;
    assert_eq!(
        metrics.sum("tokentap_otlp_exports_total", &[("result", "failed")]),
        0.0,
        "a 503 is retried, not a failure"
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(&seen.statuses[..3], [503, 503, 200]);
        assert_eq!(requests(&seen.accepted[0]), 1.0);
    }

    // A request after the last export, then shutdown: the final export carries it.
    one_request(&proxy).await;
    let before = seen.lock().unwrap().accepted.len();
    proxy.shutdown();
    proxy.task.take().unwrap().await.unwrap().unwrap();
    let seen = seen.lock().unwrap();
    assert!(seen.accepted.len() > before, "no export at shutdown");
    assert_eq!(requests(seen.accepted.last().unwrap()), 2.0);
}

/// A collector that asks for `Retry-After: 18446744073709551615` (once a panic in
/// `Instant + wait` that stopped the exporter for good): that export fails, as one that
/// cannot be retried within `export_timeout`, and the next ones go out.
#[tokio::test]
async fn a_hostile_retry_after_fails_one_export_and_the_next_ones_go_out() {
    let (collector, seen) = collector_asking(1, "18446744073709551615").await;
    let sim = SimHandle::start(sim()).await;
    let yaml = format!(
        "otlp:\n  endpoint: http://{collector}/v1/metrics\n  interval: 100ms\n  export_timeout: 5s\n"
    );
    let proxy = Proxy::start(&sim.url(), &yaml).await;
    one_request(&proxy).await;
    let metrics = common::wait_for_metrics(proxy.admin, "exports after the refusal", |m| {
        m.sum("tokentap_otlp_exports_total", &[("result", "success")]) >= 2.0
    })
    .await;
    assert_eq!(
        metrics.sum(
            "tokentap_otlp_exports_total",
            &[("signal", "metrics"), ("result", "failed")]
        ),
        1.0
    );
    let seen = seen.lock().unwrap();
    assert_eq!(&seen.statuses[..3], [503, 200, 200]);
    assert_eq!(requests(seen.accepted.last().unwrap()), 1.0);
}

#[tokio::test]
async fn a_collector_that_never_answers_costs_no_request_and_the_loss_is_counted() {
    // Bound and never accepting: connections complete in the kernel's backlog, requests
    // are sent, and no answer ever comes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = silent.local_addr().unwrap();
    let sim = SimHandle::start(sim()).await;
    let yaml = format!(
        "otlp:\n  endpoint: http://{gone}/v1/metrics\n  interval: 50ms\n  timeout: 100ms\n  export_timeout: 300ms\n"
    );
    let proxy = Proxy::start(&sim.url(), &yaml).await;
    for _ in 0..10 {
        one_request(&proxy).await;
    }
    let metrics = common::wait_for_metrics(proxy.admin, "a failed and a dropped export", |m| {
        m.sum("tokentap_otlp_exports_total", &[("result", "failed")]) >= 1.0
            && m.sum(
                "tokentap_otlp_exports_dropped_total",
                &[("reason", "replaced")],
            ) >= 1.0
    })
    .await;
    assert_eq!(
        metrics.sum("tokentap_requests_total", &[("outcome", "completed")]),
        10.0
    );
    assert_eq!(
        metrics.sum("tokentap_otlp_exports_total", &[("result", "success")]),
        0.0
    );
    drop(silent);
}

/// An OTLP/gRPC collector (h2c) whose first call ends trailers-only with `UNAVAILABLE`
/// and whose later calls succeed; it keeps each call's `grpc-status` and export.
async fn grpc_collector() -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shared = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = shared.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    assert_eq!(
                        request.uri().path(),
                        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
                    );
                    assert_eq!(request.headers()["content-type"], "application/grpc");
                    assert_eq!(request.headers()["te"], "trailers");
                    let body = request
                        .into_body()
                        .collect()
                        .await
                        .expect("body")
                        .to_bytes();
                    assert_eq!(body[0], 0, "not compressed");
                    let length = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
                    assert_eq!(body.len(), 5 + length, "one length-prefixed message");
                    let export = ExportMetricsServiceRequest::decode(&body[5..]).expect("protobuf");
                    let mut seen = seen.lock().unwrap();
                    let first = seen.statuses.is_empty();
                    let response = Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc");
                    let frames: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> =
                        if first {
                            seen.statuses.push(14);
                            return response
                                .header("grpc-status", "14")
                                .body(http_body_util::Either::Left(Full::new(Bytes::new())));
                        } else {
                            seen.statuses.push(0);
                            seen.accepted.push(export);
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", "0".parse().unwrap());
                            vec![
                                Ok(http_body::Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
                                Ok(http_body::Frame::trailers(trailers)),
                            ]
                        };
                    response.body(http_body_util::Either::Right(
                        http_body_util::StreamBody::new(futures_util::stream::iter(frames)),
                    ))
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn over_grpc_unavailable_is_retried_and_the_export_arrives() {
    let (collector, seen) = grpc_collector().await;
    let sim = SimHandle::start(sim()).await;
    let yaml = format!(
        "otlp:\n  endpoint: http://{collector}\n  protocol: grpc\n  interval: 200ms\n  export_timeout: 5s\n"
    );
    let proxy = Proxy::start(&sim.url(), &yaml).await;
    one_request(&proxy).await;
    let metrics = common::wait_for_metrics(proxy.admin, "a successful gRPC export", |m| {
        m.sum("tokentap_otlp_exports_total", &[("result", "success")]) >= 1.0
    })
    .await;
    assert_eq!(
        metrics.sum("tokentap_otlp_exports_total", &[("result", "failed")]),
        0.0,
        "UNAVAILABLE is retried, not a failure"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(&seen.statuses[..2], [14, 0]);
    assert_eq!(requests(&seen.accepted[0]), 1.0);
}

/// A private CA, a collector certificate it signed for `localhost`, and a client
/// certificate it signed, each written as PEM under `dir`.
struct Pki {
    dir: std::path::PathBuf,
    server_config: Arc<rustls::ServerConfig>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let dir = std::env::temp_dir().join(format!("tokentap-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let signed = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &ca, &ca_key)
                .unwrap();
            (cert, key)
        };
        let (server, server_key) = signed(vec!["localhost".into()]);
        let (client, client_key) = signed(vec!["tokentap".into()]);
        for (file, pem) in [
            ("ca.pem", ca.pem()),
            ("client.pem", client.pem()),
            ("client-key.pem", client_key.serialize_pem()),
        ] {
            std::fs::write(dir.join(file), pem).unwrap();
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .build()
        .unwrap();
        let server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![server.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
            )
            .unwrap();
        Pki {
            dir,
            server_config: Arc::new(server_config),
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// An OTLP/HTTP collector over TLS that asks every client for a certificate its CA signed,
/// and counts the exports it accepts.
async fn tls_collector(pki: &Pki) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config.clone());
    let shared = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, seen) = (acceptor.clone(), shared.clone());
            tokio::spawn(async move {
                // A client without a trusted certificate fails here.
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |request: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let export = ExportMetricsServiceRequest::decode(body).expect("protobuf");
                        let mut seen = seen.lock().unwrap();
                        seen.accepted.push(export);
                        seen.statuses.push(200);
                        Response::builder().body(Full::new(Bytes::new()))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// Shut `proxy` down and wait until it has stopped (its last export sent or given up).
async fn stop(mut proxy: Proxy) {
    proxy.shutdown();
    proxy.task.take().unwrap().await.unwrap().unwrap();
}

/// A config's flags for a test on loopback, with `environment` as the variables.
fn overrides(upstream: &str, environment: Vec<(&str, String)>) -> tokentap::config::Overrides {
    tokentap::config::Overrides {
        upstream: Some(upstream.to_string()),
        listen: Some("127.0.0.1:0".into()),
        admin: Some("127.0.0.1:0".into()),
        ui_listen: Some("127.0.0.1:0".into()),
        environment: environment
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ..Default::default()
    }
}

/// The OpenTelemetry variables name the CA and the client's files: an export succeeds.
async fn exports_with_the_variables_files(upstream: &str, endpoint: &str, pki: &Pki) {
    let env = vec![
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint.to_string()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "100".into()),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.path("ca.pem")),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            pki.path("client.pem"),
        ),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", pki.path("client-key.pem")),
    ];
    let config =
        tokentap::config::Config::from_yaml("{}", "test", &overrides(upstream, env)).unwrap();
    let server = tokentap::server::Server::bind(config).await.expect("bind");
    let admin = server.admin_addr();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|s| *s).await;
    }));
    common::wait_for_metrics(admin, "an export with the variables' files", |m| {
        m.sum("tokentap_otlp_exports_total", &[("result", "success")]) >= 1.0
    })
    .await;
    let _ = stop.send(true);
    task.await.unwrap().unwrap();
}

/// A file that cannot be used is named by the key or variable that named it, at start.
async fn unusable_files_are_named_at_start(upstream: &str, base: &str, pki: &Pki, port: u16) {
    for (key, yaml_or_env) in [
        (
            "otlp.ca_file",
            Ok(format!("{base}  ca_file: {}\n", pki.path("missing.pem"))),
        ),
        (
            "otlp.client_key",
            Ok(format!(
                "{base}  client_certificate: {}\n  client_key: {}\n",
                pki.path("client.pem"),
                pki.path("ca.pem")
            )),
        ),
        (
            "otlp.client_certificate",
            Ok(format!(
                "{base}  client_certificate: {}\n  client_key: {}\n",
                pki.path("client-key.pem"),
                pki.path("client-key.pem")
            )),
        ),
        (
            "$OTEL_EXPORTER_OTLP_CERTIFICATE",
            Err(("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.path("client-key.pem"))),
        ),
    ] {
        let config = match yaml_or_env {
            Ok(yaml) => {
                tokentap::config::Config::from_yaml(&yaml, "test", &overrides(upstream, vec![]))
            }
            Err((name, value)) => tokentap::config::Config::from_yaml(
                "{}",
                "test",
                &overrides(
                    upstream,
                    vec![
                        (
                            "OTEL_EXPORTER_OTLP_ENDPOINT",
                            format!("https://localhost:{port}"),
                        ),
                        (name, value),
                    ],
                ),
            ),
        }
        .expect("valid config: the files are read at start");
        let err = match tokentap::server::Server::bind(config).await {
            Ok(_) => panic!("{key}: started"),
            Err(err) => err.to_string(),
        };
        assert!(err.contains(key), "{key}: {err}");
    }
}

/// A collector behind TLS with a private CA and mutual TLS: with `otlp.ca_file` and the
/// client certificate and key the exports arrive; without the CA, or without the client
/// certificate, each export fails (counted, no request held up); the same files from the
/// OpenTelemetry variables work as the keys do; a file that cannot be used stops the start
/// with the key or variable that named it.
#[tokio::test]
async fn a_tls_collector_is_verified_by_the_configured_ca_and_given_the_client_certificate() {
    let pki = Pki::new("otlp-tls");
    let (collector, seen) = tls_collector(&pki).await;
    let sim = SimHandle::start(sim()).await;
    let endpoint = format!("https://localhost:{}/v1/metrics", collector.port());
    let base = format!(
        "otlp:\n  endpoint: {endpoint}\n  interval: 100ms\n  timeout: 1s\n  export_timeout: 1s\n"
    );
    let keys = format!(
        "  ca_file: {}\n  client_certificate: {}\n  client_key: {}\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client-key.pem")
    );
    let proxy = Proxy::start(&sim.url(), &format!("{base}{keys}")).await;
    one_request(&proxy).await;
    common::wait_for_metrics(proxy.admin, "an export over mutual TLS", |m| {
        m.sum("tokentap_otlp_exports_total", &[("result", "success")]) >= 1.0
    })
    .await;
    assert!(!seen.lock().unwrap().accepted.is_empty());
    stop(proxy).await;

    let without_ca = format!(
        "{base}  client_certificate: {}\n  client_key: {}\n",
        pki.path("client.pem"),
        pki.path("client-key.pem")
    );
    let without_client = format!("{base}  ca_file: {}\n", pki.path("ca.pem"));
    for (what, yaml) in [
        ("no CA", without_ca),
        ("no client certificate", without_client),
    ] {
        let accepted = seen.lock().unwrap().accepted.len();
        let proxy = Proxy::start(&sim.url(), &yaml).await;
        one_request(&proxy).await;
        let m = common::wait_for_metrics(proxy.admin, what, |m| {
            m.sum("tokentap_otlp_exports_total", &[("result", "failed")]) >= 1.0
        })
        .await;
        assert_eq!(
            m.sum("tokentap_otlp_exports_total", &[("result", "success")]),
            0.0,
            "{what}"
        );
        assert_eq!(m.sum("tokentap_requests_total", &[]), 1.0, "{what}");
        assert_eq!(seen.lock().unwrap().accepted.len(), accepted, "{what}");
        stop(proxy).await;
    }

    // The OpenTelemetry variables name the same files.
    exports_with_the_variables_files(&sim.url(), &endpoint, &pki).await;
    // A file that cannot be used is named by what named it, at start.
    unusable_files_are_named_at_start(&sim.url(), &base, &pki, collector.port()).await;
}

/// The push and the live view start with the server: a reload that changes `otlp` or
/// `ui` is accepted with the restart warning naming them; one that changes neither (or
/// goes back to what runs) carries none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_otlp_or_ui_warns_that_it_takes_a_restart() {
    use tokentap::server::Server;
    let config = common::config_without_traffic;
    let push = "otlp:\n  endpoint: http://127.0.0.1:9/v1/metrics\n  interval: 1h\n";
    let server = Server::bind(config(push)).await.expect("bind");
    let reloader = server.reloader();
    let unchanged = reloader
        .reload(config(&format!("{push}log:\n  level: debug\n")))
        .expect("reload");
    assert_eq!(unchanged, None);
    for changed in [
        push.replace("1h", "30s"),
        String::from("{}"),
        format!("{push}ui:\n  enabled: false\n"),
    ] {
        let warning = reloader
            .reload(config(&changed))
            .expect("reload")
            .unwrap_or_else(|| panic!("no restart warning for {changed:?}"));
        assert!(
            warning.contains("otlp") && warning.contains("ui"),
            "{warning}"
        );
        // Back to the running settings for the next case.
        assert_eq!(reloader.reload(config(push)).expect("reload"), None);
    }
}
