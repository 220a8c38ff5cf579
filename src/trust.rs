//! The certificates tokentap trusts when it is the TLS client: of an `https://` upstream
//! and of an OTLP collector. One rule for both: the webpki roots, the platform's store
//! (private CAs installed on the host), and the CA file the configuration names, which
//! must hold at least one certificate. A collector that asks for a client certificate
//! gets the one the configuration names ([`ClientIdentity`]).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

/// Why a CA file or a client identity could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read CA file {path}: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
    #[error("CA file {path} holds no usable certificate")]
    Empty { path: String },
    #[error("cannot read {path}: {source}")]
    UnreadableIdentity {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path} holds no PEM private key")]
    NoKey { path: String },
    #[error("the client certificate and key do not go together: {0}")]
    Mismatch(rustls::Error),
}

/// A client certificate chain and its private key, read from PEM files.
pub struct ClientIdentity {
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
}

impl ClientIdentity {
    /// The chain in `certificate` and the first private key in `key`.
    pub fn load(certificate: &Path, key: &Path) -> Result<ClientIdentity, TrustError> {
        let open = |path: &Path| {
            File::open(path)
                .map(BufReader::new)
                .map_err(|source| TrustError::UnreadableIdentity {
                    path: path.display().to_string(),
                    source,
                })
        };
        let unreadable = |path: &Path| {
            let path = path.display().to_string();
            move |source| TrustError::UnreadableIdentity { path, source }
        };
        let chain: Vec<_> = rustls_pemfile::certs(&mut open(certificate)?)
            .collect::<Result<_, _>>()
            .map_err(unreadable(certificate))?;
        if chain.is_empty() {
            return Err(TrustError::NoCertificate {
                path: certificate.display().to_string(),
            });
        }
        let key = rustls_pemfile::private_key(&mut open(key)?)
            .map_err(unreadable(key))?
            .ok_or_else(|| TrustError::NoKey {
                path: key.display().to_string(),
            })?;
        Ok(ClientIdentity { chain, key })
    }
}

/// The roots to verify a server against: webpki's, the platform's and `ca_file`'s.
pub fn root_store(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, TrustError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    // Unreadable entries of the platform's store are skipped (rustls-native-certs reports
    // them in its result).
    let native = rustls_native_certs::load_native_certs();
    let _ = roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let shown = path.display().to_string();
        let unreadable = |source| TrustError::Unreadable {
            path: shown.clone(),
            source,
        };
        let file = File::open(path).map_err(unreadable)?;
        let certs: Vec<_> = rustls_pemfile::certs(&mut BufReader::new(file))
            .collect::<Result<_, _>>()
            .map_err(unreadable)?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(TrustError::Empty { path: shown });
        }
    }
    Ok(roots)
}

/// A TLS client configuration (ring, the default protocol versions, no client
/// certificate) that trusts `roots`.
pub fn client_config(roots: rustls::RootCertStore) -> rustls::ClientConfig {
    builder(roots).with_no_client_auth()
}

/// [`client_config`] presenting `identity` to a server that asks for a client certificate.
pub fn client_config_with(
    roots: rustls::RootCertStore,
    identity: ClientIdentity,
) -> Result<rustls::ClientConfig, TrustError> {
    builder(roots)
        .with_client_auth_cert(identity.chain, identity.key)
        .map_err(TrustError::Mismatch)
}

fn builder(
    roots: rustls::RootCertStore,
) -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_exist_and_hold_a_certificate() {
        let dir = std::env::temp_dir().join(format!("tokentap-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        assert!(matches!(
            root_store(Some(&missing)),
            Err(TrustError::Unreadable { .. })
        ));
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = root_store(Some(&empty)).unwrap_err();
        assert!(matches!(err, TrustError::Empty { .. }), "{err}");
        assert!(err.to_string().contains("empty.pem"), "{err}");
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let good = dir.join("good.pem");
        std::fs::write(&good, cert.cert.pem()).unwrap();
        let with = root_store(Some(&good)).unwrap();
        let without = root_store(None).unwrap();
        assert_eq!(with.len(), without.len() + 1);
        std::fs::remove_dir_all(&dir).ok();
    }
}
