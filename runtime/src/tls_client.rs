//! What HTTPS clients of the broker trust: the public web PKI roots built into
//! reqwest (rustls), plus the certificates in the PEM file named by
//! `AC7_CA_CERT`, for a broker with a private CA or a self-signed certificate.

use std::path::PathBuf;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

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
