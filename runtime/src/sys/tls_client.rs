//! What HTTPS clients of the broker trust: the public web PKI roots built into
//! reqwest (rustls), plus the certificates in the PEM file named by
//! `AC7_CA_CERT`, for a broker with a private CA or a self-signed certificate.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The environment variable naming extra trusted certificates (PEM, one or more).
pub const CA_ENV: &str = "AC7_CA_CERT";

/// Why the extra certificates could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The file could not be read.
    #[error("cannot read {CA_ENV}={}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no usable certificate.
    #[error("{CA_ENV}={} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
}

/// A reqwest client builder that also trusts the certificates of `AC7_CA_CERT`.
pub fn builder() -> Result<reqwest::ClientBuilder, CaError> {
    let mut builder = reqwest::Client::builder();
    for cert in extra_roots()? {
        builder = builder.add_root_certificate(cert);
    }
    Ok(builder)
}

fn extra_roots() -> Result<Vec<reqwest::Certificate>, CaError> {
    extra_root_ders()?
        .iter()
        .map(|der| reqwest::Certificate::from_der(der))
        .collect::<Result<_, _>>()
        .map_err(|_| CaError::NoCertificate {
            path: std::env::var_os(CA_ENV).unwrap_or_default().into(),
        })
}

/// What a WebSocket to the broker trusts (`wss://`): the same as the HTTPS client, the web PKI
/// roots and `AC7_CA_CERT`.
pub fn ws_connector() -> Result<tokio_tungstenite::Connector, CaError> {
    let mut roots = web_pki_roots();
    roots.add_parsable_certificates(extra_root_ders()?);
    let (_, builder) = client_config();
    let config = builder.with_root_certificates(roots).with_no_client_auth();
    Ok(tokio_tungstenite::Connector::Rustls(Arc::new(config)))
}

/// Every TLS client here (the broker's WebSocket, PostgreSQL, the trace proxy's upstream):
/// rustls on ring with its safe default protocol versions, and the provider, for verifiers.
pub fn client_config() -> (
    Arc<CryptoProvider>,
    rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>,
) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    (provider, builder)
}

/// The public web PKI roots built into the binary.
pub fn web_pki_roots() -> rustls::RootCertStore {
    rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// Adds the certificates of `pem` (PEM, one or more; other blocks skipped) to `roots`; how
/// many it took.
pub fn add_pem(roots: &mut rustls::RootCertStore, pem: &[u8]) -> usize {
    roots
        .add_parsable_certificates(CertificateDer::pem_slice_iter(pem).filter_map(Result::ok))
        .0
}

/// Accepts any server certificate, still checking the handshake's signatures with the
/// provider's algorithms: encryption without authentication (`--unsafe-tls`, PostgreSQL's
/// `sslmode=prefer|require`).
#[derive(Debug)]
pub struct AnyCertificate(pub Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
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
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Opens a WebSocket to the broker, trusting what [`ws_connector`] trusts.
pub async fn connect_ws(
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    let connector = ws_connector().map_err(|e| {
        tokio_tungstenite::tungstenite::Error::Io(std::io::Error::other(e.to_string()))
    })?;
    tokio_tungstenite::connect_async_tls_with_config(request, None, false, Some(connector)).await
}

/// The certificates of `AC7_CA_CERT` (none when it is unset), DER.
pub fn extra_root_ders() -> Result<Vec<CertificateDer<'static>>, CaError> {
    let Some(path) = std::env::var_os(CA_ENV).filter(|p| !p.is_empty()) else {
        return Ok(Vec::new());
    };
    let path = PathBuf::from(path);
    let pem = std::fs::read(&path).map_err(|source| CaError::Read {
        path: path.clone(),
        source,
    })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(CaError::NoCertificate { path });
    }
    Ok(certs)
}

/// What to tell the user when `error` (a client error, with its chain of causes) is a TLS
/// certificate this client refused; `None` for any other failure.
///
/// Names the problem and what to do: for a certificate it does not trust, `AC7_CA_CERT`
/// (unset: point it at the broker's certificate or its CA; set: that file does not hold
/// the issuer); for a certificate that does not name the URL's host, the host to use.
pub fn certificate_problem(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(error);
    let refused = loop {
        let e = cause?;
        let found = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::InvalidCertificate(cert)) = found {
            break cert;
        }
        // An io::Error's `source` skips the error it wraps: step into that one instead.
        cause = match e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    };
    let what = rustls::Error::InvalidCertificate(refused.clone()).to_string();
    if matches!(
        refused,
        rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. }
    ) {
        return Some(format!(
            "the broker's TLS certificate does not name the host in the URL ({what}): use a host name the certificate lists (trusting it with {CA_ENV} does not change that)"
        ));
    }
    Some(match std::env::var_os(CA_ENV).filter(|p| !p.is_empty()) {
        None => format!(
            "the broker's TLS certificate is not trusted ({what}): for a self-signed certificate or a private CA, set {CA_ENV} to its PEM file"
        ),
        Some(path) => format!(
            "the broker's TLS certificate is not trusted ({what}), even with {CA_ENV}={}: that file must hold the broker's certificate or the CA that issued it",
            PathBuf::from(path).display()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_problems_are_found_in_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Outer(#[source] std::io::Error);
        let io = std::io::Error::other(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        let text = certificate_problem(&Outer(io)).unwrap();
        assert!(text.contains("not trusted"), "{text}");
        assert!(text.contains("UnknownIssuer"), "{text}");
        assert!(text.contains(CA_ENV), "{text}");
        let name = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        assert!(
            certificate_problem(&name)
                .unwrap()
                .contains("does not name the host")
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(certificate_problem(&Outer(refused)), None);
        let other = rustls::Error::HandshakeNotComplete;
        assert_eq!(certificate_problem(&other), None);
    }
}
