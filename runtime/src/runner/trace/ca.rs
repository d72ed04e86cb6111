//! The trace host's certificate authority: one per runner session, in memory, with leaf
//! certificates minted lazily per model API host.
//!
//! - Keys are ECDSA P-256 (SHA-256 signatures): generating one takes well under a millisecond, so
//!   the CA costs nothing at start-up and a leaf nothing at its host's first `CONNECT`; every TLS
//!   client an agent uses (Node, rustls, OpenSSL) accepts them.
//! - The CA (`CN=ac7 trace CA <pid>, O=ac7`, `cA=true pathLen=0`, key usage `keyCertSign,cRLSign`)
//!   is valid from one hour before the session starts (clock skew) to [`CA_LIFE`] after it: a
//!   session is not cut off after a day (the TypeScript runner's are valid for 24 h).
//! - A leaf (`CN=<host>`, SAN = the IP address for an IP literal, else the DNS name, key usage
//!   `digitalSignature`, extended key usage `serverAuth`) is valid for [`LEAF_LIFE`] and is
//!   minted again when less than a day of it is left, never beyond the CA's own end. All leaves
//!   share one key pair, generated with the CA.
//! - Only the CA certificate touches disk ([`CaFile`]): `$TMPDIR/ac7-trace-ca-<pid>-<8 hex>.pem`,
//!   mode 0600, created exclusively, removed when the [`CaFile`] is dropped or closed — on every
//!   exit path of the runner that unwinds (the agent's exit, a start-up failure, a signal the
//!   runner forwards); after a `kill -9`, by the next runner that starts
//!   ([`crate::runner::leftovers`], which reads the pid in the name). Private keys never leave
//!   memory.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

/// How long the CA is valid after the session starts.
pub const CA_LIFE: Duration = Duration::from_secs(400 * 24 * 3600);
/// How long a leaf is valid after it is minted.
pub const LEAF_LIFE: Duration = Duration::from_secs(30 * 24 * 3600);
/// A cached leaf with less than this left is minted again.
const LEAF_RENEW: Duration = Duration::from_secs(24 * 3600);
/// Backdating of every certificate, for clocks slightly behind ours.
const SKEW: Duration = Duration::from_secs(3600);

/// The CA could not be made, or a leaf not minted.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// Key generation or signing failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// The host cannot be a certificate name.
    #[error("cannot mint a certificate for host {0:?}")]
    BadHost(String),
    /// rustls refused the leaf.
    #[error("TLS set-up failed: {0}")]
    Tls(#[from] rustls::Error),
    /// The CA file could not be written.
    #[error("cannot write the trace CA to {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

struct Leaf {
    config: Arc<rustls::ServerConfig>,
    not_after: OffsetDateTime,
}

/// The session's CA and its leaf cache.
pub struct TraceCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    not_after: OffsetDateTime,
    leaf_key: KeyPair,
    serial: Mutex<u64>,
    leaves: Mutex<HashMap<String, Leaf>>,
}

impl std::fmt::Debug for TraceCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceCa")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

fn now() -> OffsetDateTime {
    OffsetDateTime::UNIX_EPOCH + time::Duration::milliseconds(crate::sys::clock::now_ms())
}

impl TraceCa {
    /// A new CA, valid from an hour ago for [`CA_LIFE`].
    pub fn generate() -> Result<Self, CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let start = now();
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(
            DnType::CommonName,
            format!("ac7 trace CA {}", std::process::id()),
        );
        name.push(DnType::OrganizationName, "ac7");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = start - SKEW;
        params.not_after = start + CA_LIFE;
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            not_after: params.not_after,
            issuer: Issuer::new(params, key),
            leaf_key,
            serial: Mutex::new(1),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The TLS server configuration presenting `host`'s leaf (ALPN `http/1.1` only), minted on
    /// first use and cached.
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, CaError> {
        let host = host.to_ascii_lowercase();
        let at = now();
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leaf) = leaves.get(&host)
            && leaf.not_after - at > LEAF_RENEW
        {
            return Ok(leaf.config.clone());
        }
        let leaf = self.mint(&host, at)?;
        let config = leaf.config.clone();
        leaves.insert(host, leaf);
        Ok(config)
    }

    fn mint(&self, host: &str, at: OffsetDateTime) -> Result<Leaf, CaError> {
        let san = match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) if rustls::pki_types::DnsName::try_from(host).is_err() => {
                return Err(CaError::BadHost(host.to_owned()));
            }
            Err(_) => SanType::DnsName(
                host.to_owned()
                    .try_into()
                    .map_err(|_| CaError::BadHost(host.to_owned()))?,
            ),
        };
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host);
        name.push(DnType::OrganizationName, "ac7 trace");
        params.distinguished_name = name;
        params.subject_alt_names = vec![san];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = at - SKEW;
        params.not_after = (at + LEAF_LIFE).min(self.not_after);
        params.serial_number = Some(self.next_serial());
        let cert = params.signed_by(&self.leaf_key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![CertificateDer::from(cert.der().to_vec())], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Leaf {
            config: Arc::new(config),
            not_after: params.not_after,
        })
    }

    fn next_serial(&self) -> SerialNumber {
        let mut serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        *serial += 1;
        let mut bytes = random_serial().to_bytes();
        bytes.extend_from_slice(&serial.to_be_bytes());
        SerialNumber::from_slice(&bytes)
    }

    /// Writes the CA certificate to a fresh 0600 file in `dir` (normally `$TMPDIR`).
    pub fn write_pem(&self, dir: &Path) -> Result<CaFile, CaError> {
        CaFile::create(
            dir,
            crate::runner::leftovers::CA_PREFIX,
            self.pem.as_bytes(),
        )
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

fn random_hex() -> String {
    let mut bytes = [0u8; 4];
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file the runner wrote for the agent, removed when this is dropped (or [`CaFile::close`]d).
#[derive(Debug)]
pub struct CaFile {
    path: Option<PathBuf>,
}

impl CaFile {
    /// Writes `<dir>/<prefix>-<pid>-<8 hex>.pem`, mode 0600, never replacing a file.
    pub fn create(dir: &Path, prefix: &str, contents: &[u8]) -> Result<Self, CaError> {
        let path = dir.join(format!(
            "{prefix}-{}-{}.pem",
            std::process::id(),
            random_hex()
        ));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            file.write_all(contents)?;
            file.sync_all()
        };
        if let Err(source) = write() {
            let _ = std::fs::remove_file(&path);
            return Err(CaError::Write { path, source });
        }
        Ok(Self { path: Some(path) })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    /// Removes the file now (idempotent; a file already gone is fine).
    pub fn close(&mut self) {
        if let Some(path) = self.path.take()
            && let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("runner: cannot remove {}: {e}", path.display());
        }
    }
}

impl Drop for CaFile {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_file_is_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ca = TraceCa::generate().unwrap();
        let file = ca.write_pem(dir.path()).unwrap();
        let path = file.path().to_owned();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(&format!("ac7-trace-ca-{}-", std::process::id())),
            "{name}"
        );
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        drop(file);
        assert!(!path.exists());
    }

    #[test]
    fn leaves_are_cached_per_host_and_outlive_a_day() {
        let ca = TraceCa::generate().unwrap();
        // A month at least, not a day, for the CA and each leaf: a long session's certificates
        // must not expire mid-session.
        let month = Duration::from_secs(30 * 24 * 3600 - 60);
        assert!(ca.not_after - now() > month);
        let a = ca.server_config("API.anthropic.com").unwrap();
        let b = ca.server_config("api.anthropic.com").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = ca.server_config("127.0.0.1").unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(ca.server_config("bad host name!").is_err());
        let leaves = ca.leaves.lock().unwrap();
        let leaf = &leaves["api.anthropic.com"];
        assert!(leaf.not_after - now() > month);
    }
}
