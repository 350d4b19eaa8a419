//! TLS for `https://` targets (rustls, the `ring` provider).
//!
//! FaaSProfiler sends to its endpoints with certificate verification off
//! (`verify=False`: OpenWhisk's default deployment has a self-signed
//! certificate), and so does this runner unless it is given the CA to check
//! against (`--tls-ca FILE`, PEM); it says so in a warning either way. The
//! connection is encrypted in both cases; without a CA it is not
//! authenticated, which is what a load generator pointed at one's own
//! endpoint usually wants and what the warning is for.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use std::path::Path;
use std::sync::Arc;

/// The client configuration: verifying against the certificates in `ca`
/// (PEM) if given, else accepting any certificate.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let config = match ca {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("--tls-ca {}: {e}", path.display()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("--tls-ca {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!("--tls-ca {}: no PEM certificate in it", path.display()));
            }
            for c in certs {
                roots.add(c).map_err(|e| format!("--tls-ca {}: {e}", path.display()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The name a certificate is checked against: a DNS name or an IP address.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?} is not a server name for TLS: {e}"))
}

/// Accepts every certificate (FaaSProfiler's `verify=False`), but still
/// checks that the handshake is signed by the key in the certificate sent,
/// so the connection is a real TLS session with whoever answered.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
