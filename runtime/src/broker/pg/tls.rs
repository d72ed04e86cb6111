//! TLS to PostgreSQL through rustls (ring), with libpq's `sslmode` meanings: `prefer` and
//! `require` encrypt without verifying the certificate, `verify-ca` checks the chain against the
//! roots (`sslrootcert`, else the web PKI roots), `verify-full` also checks the host name.
//! `require` with `sslrootcert` verifies the chain, as libpq does.
//!
//! No channel binding: SCRAM signs in without `-PLUS`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use super::config::{PgConfig, SslMode};
use crate::sys::tls_client::{self, AnyCertificate};

/// Makes a TLS connector per connection (the `MakeTlsConnect` of `tokio_postgres`).
#[derive(Clone)]
pub struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MakeRustls")
    }
}

impl MakeRustls {
    /// The TLS policy of `config`; fails when `sslrootcert` cannot be read or holds no
    /// certificate.
    pub fn new(config: &PgConfig) -> Result<MakeRustls, String> {
        let (provider, builder) = tls_client::client_config();
        let verify = match config.sslmode {
            SslMode::Disable | SslMode::Prefer => None,
            SslMode::Require if config.sslrootcert.is_none() => None,
            SslMode::Require | SslMode::VerifyCa => Some(false),
            SslMode::VerifyFull => Some(true),
        };
        let verifier: Arc<dyn ServerCertVerifier> = match verify {
            None => Arc::new(AnyCertificate(provider)),
            Some(check_name) => {
                let roots = match &config.sslrootcert {
                    Some(path) => {
                        let pem = std::fs::read(path).map_err(|e| {
                            format!("cannot read sslrootcert {}: {e}", path.display())
                        })?;
                        let mut roots = rustls::RootCertStore::empty();
                        if tls_client::add_pem(&mut roots, &pem) == 0 {
                            return Err(format!(
                                "sslrootcert {} holds no usable certificate",
                                path.display()
                            ));
                        }
                        roots
                    }
                    None => tls_client::web_pki_roots(),
                };
                let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| e.to_string())?;
                Arc::new(WebPki { inner, check_name })
            }
        };
        let tls = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(MakeRustls {
            config: Arc::new(tls),
        })
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(RustlsConnect {
            name,
            connector: tokio_rustls::TlsConnector::from(Arc::clone(&self.config)),
        })
    }
}

/// One connection's TLS handshake.
pub struct RustlsConnect {
    name: ServerName<'static>,
    connector: tokio_rustls::TlsConnector,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = self.connector.connect(self.name, stream).await?;
            Ok(RustlsStream(Box::new(tls)))
        })
    }
}

/// A TLS stream to the server.
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

/// The web PKI check, optionally without the host name (`verify-ca`).
#[derive(Debug)]
struct WebPki {
    inner: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for WebPki {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
