//! TLS on both sides: a client talks plain HTTP to tokentap B, whose upstream is
//! `https://localhost` served by tokentap A's TLS listener (trusted through `ca_file`),
//! in front of the simulator. Covers listener TLS, HTTPS upstreams with a custom CA and
//! ALPN, and that measurement is the same through two hops.

use crate::common;

use std::time::Duration;

use common::*;
use tokentap_sim::{ModelProfile, SimConfig};

/// A self-signed certificate for `localhost`, written as PEM files into a fresh directory.
pub(crate) struct TestCert {
    dir: std::path::PathBuf,
    pub(crate) cert_file: std::path::PathBuf,
    key_file: std::path::PathBuf,
    pub(crate) certified: rcgen::CertifiedKey,
}

impl TestCert {
    pub(crate) fn new(name: &str) -> TestCert {
        let dir = std::env::temp_dir().join(format!("tokentap-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert_file = dir.join("tls.crt");
        let key_file = dir.join("tls.key");
        std::fs::write(&cert_file, certified.cert.pem()).unwrap();
        std::fs::write(&key_file, certified.key_pair.serialize_pem()).unwrap();
        TestCert {
            dir,
            cert_file,
            key_file,
            certified,
        }
    }
}

impl TestCert {
    /// A client that trusts this certificate and offers only HTTP/1.1 by ALPN.
    fn http1_connector(&self) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.certified.cert.der().clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
    }
}

impl Drop for TestCert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_and_https_upstream_with_custom_ca() {
    let cert = TestCert::new("tls");
    let (cert_file, key_file) = (&cert.cert_file, &cert.key_file);

    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new(
            "m",
            Duration::from_millis(5),
            Duration::from_millis(2),
            20,
        )],
        ..SimConfig::default()
    })
    .await;
    let inner = Proxy::start(
        &sim.url(),
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n",
            cert_file.display(),
            key_file.display()
        ),
    )
    .await;
    let outer = Proxy::start(
        &format!("https://localhost:{}", inner.addr.port()),
        &format!("upstream:\n  ca_file: {}\n", cert_file.display()),
    )
    .await;

    let response = client()
        .request(chat(
            &outer.url("/v1/chat/completions"),
            "m",
            "t",
            true,
            true,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = body_text(response).await;
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    for proxy in [&outer, &inner] {
        let m = proxy
            .wait_metrics("the request", |m| {
                m.sum("tokentap_requests_total", &[]) >= 1.0
            })
            .await;
        assert_eq!(
            m.sum("tokentap_output_tokens_total", &[("model", "m")]),
            20.0
        );
        assert_eq!(
            m.sum("tokentap_requests_total", &[("outcome", "completed")]),
            1.0
        );
    }

    // Without the CA, the outer proxy refuses the upstream's certificate: 502.
    let untrusting = Proxy::start(&format!("https://localhost:{}", inner.addr.port()), "").await;
    let response = client()
        .request(chat(
            &untrusting.url("/v1/chat/completions"),
            "m",
            "t",
            true,
            false,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
}

/// A TLS client of either protocol is served, and one that completes the handshake and
/// then says nothing is closed by `limits.header_read_timeout` (ALPN names the protocol,
/// so nothing waits on a sniff without a deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_http1_clients_are_served_and_silent_ones_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let cert = TestCert::new("tls-silent");
    let (cert_file, key_file) = (&cert.cert_file, &cert.key_file);
    let sim = SimHandle::start(SimConfig::default()).await;
    let proxy = Proxy::start(
        &sim.url(),
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\nlimits:\n  header_read_timeout: 300ms\n",
            cert_file.display(),
            key_file.display()
        ),
    )
    .await;

    let connector = cert.http1_connector();
    let connect = || async {
        let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.expect("TLS handshake")
    };

    // HTTP/1.1 over TLS works.
    let mut tls = connect().await;
    tls.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&response)
    );

    // A silent client is closed after the header read timeout.
    let mut silent = connect().await;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("the silent connection is closed, not held");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// On the TLS listener a connection cannot be handed over after a `101`, so an upgrade is
/// not offered upstream: `Upgrade` is stripped like any hop-by-hop header and the client
/// gets the upstream's ordinary answer on a connection that stays usable, never a `101`
/// followed by a close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_upgrades_are_not_offered_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (head_tx, mut head_rx) = tokio::sync::mpsc::channel::<String>(4);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let head_tx = head_tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = head_tx
                    .send(String::from_utf8_lossy(&head).to_ascii_lowercase())
                    .await;
                let _ = stream
                    .write_all(b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 2\r\n\r\nno")
                    .await;
            });
        }
    });
    let cert = TestCert::new("tls-upgrade");
    let proxy = Proxy::start(
        &format!("http://{upstream}"),
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n",
            cert.cert_file.display(),
            cert.key_file.display()
        ),
    )
    .await;
    let connector = cert.http1_connector();
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
    tls.write_all(
        b"GET /v1/realtime HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
          Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    while !seen.ends_with(b"\r\n\r\nno") {
        let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&chunk[..n]);
    }
    let answer = String::from_utf8_lossy(&seen).to_ascii_lowercase();
    assert!(
        answer.starts_with("http/1.1 426 upgrade required\r\n"),
        "{answer}"
    );
    let upstream_head = head_rx.recv().await.expect("the upstream saw the request");
    assert!(!upstream_head.contains("\r\nupgrade:"), "{upstream_head}");

    // The connection is still an ordinary HTTP/1.1 connection.
    tls.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut rest)).await;
    assert!(
        String::from_utf8_lossy(&rest).starts_with("HTTP/1.1 426"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
}
