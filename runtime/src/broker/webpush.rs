//! Web Push: browser notifications for the web app's members while no tab of theirs is open.
//!
//! * **Keys.** One VAPID key pair (ECDSA P-256) per team, made the first time a broker starts on
//!   the store and kept there (`push_vapid`, the private key as PKCS#8), so every replica signs
//!   with the same key and browsers' subscriptions stay valid across restarts. Only the public
//!   key ever leaves the broker (`GET /push/vapid-public-key`).
//! * **Subscriptions** (`push_subscriptions`): what a browser's `PushManager.subscribe` gave,
//!   bound to the member who posted it; one row per endpoint (posting it again re-binds it).
//!   Removing a member removes theirs; the push service answering 404 or 410 removes one.
//! * **Delivery** ([`Dispatcher`]): after a `POST /push` commits, the message is queued for the
//!   dispatcher task, which decides who gets a notification, one message after the other in
//!   commit order, and sends at most [`MAX_IN_FLIGHT`] requests at once. Per member of the
//!   message's audience: never the sender; nobody with a web-app stream open (a live stream
//!   signed in with a browser session, on this broker or, with replicas, on any: they see it
//!   in the app); a direct
//!   message always; a message to the team, a channel (its members only) or an objective thread
//!   only at level warning or above, or when its body mentions `@<member>`.
//! * **On the wire.** The payload (JSON, see [`Notification`]) is encrypted for the browser
//!   with the `aes128gcm` content coding of RFC 8188 as RFC 8291 derives its key (ephemeral
//!   ECDH P-256 with the browser's key, HKDF-SHA-256 with its auth secret; one record), and the
//!   request carries `Authorization: vapid t=<JWT>, k=<public key>` (RFC 8292: an ES256 JWT
//!   whose `aud` is the endpoint's origin, `exp` 12 hours ahead, `sub` the operator's contact)
//!   and `TTL: 3600`. A failure other than 404/410 is logged at WARN once per subscription and
//!   kind of failure, and not retried.
//! * **Where it may connect** ([`Network`]). The endpoint is whatever a signed-in member's
//!   browser posted, so by default it must be `https` and the broker connects only to public
//!   addresses: an IP-literal host is checked when the subscription is posted and again when
//!   sending, a host name on every connection through [`PublicResolver`] (a name that resolves
//!   to a private address later is refused then, and redirects are never followed). A push
//!   service inside the operator's own network needs `--push-private-network`.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use ac7_protocol::domain::message::{Audience, LogLevel, Message, Route};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use ring::{aead, agreement, hkdf};
use serde::Serialize;
use tokio::sync::{Semaphore, mpsc};

use super::AppState;
use super::db::StoreError;
use super::store::Conn;
use super::store::value::Row;
use crate::params;

/// The contact a push service is given when the operator named none (`--push-subject`).
pub const DEFAULT_SUBJECT: &str = "mailto:admin@ac7.local";
/// How long a push service keeps an undelivered notification (seconds).
pub const TTL_SECS: u64 = 3600;
/// Push requests in flight at once, over all messages.
pub const MAX_IN_FLIGHT: usize = 20;
/// Longest endpoint URL accepted (characters).
pub const MAX_ENDPOINT: usize = 2048;
/// Longest `p256dh` or `auth` key accepted (characters, base64url).
pub const MAX_KEY: usize = 256;
/// Characters of a message body a notification carries at most.
pub const MAX_BODY_CHARS: usize = 180;
/// Characters of a message title a notification carries at most.
const MAX_TITLE_CHARS: usize = 100;
/// Messages waiting for the dispatcher before new ones are dropped (with a warning).
const QUEUE: usize = 4096;
/// The record size written in the `aes128gcm` header (the one record is smaller).
const RECORD_SIZE: u32 = 4096;
/// How long the JWT is valid (RFC 8292 allows at most 24 hours).
const JWT_LIFETIME_SECS: u64 = 12 * 3600;
/// How long one push request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a subscription or a key could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PushError {
    /// The endpoint is not an http(s) URL with a host.
    #[error("endpoint must be an http or https URL: {0}")]
    Endpoint(String),
    /// The endpoint is plain http while only public push services are allowed.
    #[error(
        "endpoint must be an https URL: {0} (a push service on plain http inside your own \
         network needs `ac7 serve --push-private-network`)"
    )]
    NotHttps(String),
    /// The endpoint's host is a loopback, private, link-local or otherwise non-public address.
    #[error(
        "endpoint {0} is not on a public address (a push service inside your own network needs \
         `ac7 serve --push-private-network`)"
    )]
    NotPublic(String),
    /// `keys.p256dh` is not the base64url of an uncompressed P-256 point.
    #[error("keys.p256dh must be base64url of a 65-byte uncompressed P-256 public key{0}")]
    P256dh(String),
    /// `keys.auth` is not the base64url of 16 bytes.
    #[error("keys.auth must be base64url of 16 bytes{0}")]
    Auth(String),
    /// The stored VAPID key could not be read back.
    #[error("the stored VAPID key is not a P-256 PKCS#8 key")]
    BadStoredKey,
    /// The system's random source or a cipher failed.
    #[error("cryptography failed")]
    Crypto,
}

/// Decodes base64url with or without padding (browsers give it without).
fn b64_decode(s: &str) -> Option<Vec<u8>> {
    B64.decode(s.trim_end_matches('=')).ok()
}

/// Checks a subscription's keys: the browser's public key (65-byte uncompressed P-256 point, on
/// the curve) and its 16-byte auth secret.
pub fn check_keys(p256dh: &str, auth: &str) -> Result<(Vec<u8>, Vec<u8>), PushError> {
    let point = b64_decode(p256dh).ok_or_else(|| PushError::P256dh(" (not base64url)".into()))?;
    if point.len() != 65 || point[0] != 4 {
        return Err(PushError::P256dh(format!(
            " (got {} bytes{})",
            point.len(),
            if point.first() == Some(&4) || point.is_empty() {
                ""
            } else {
                ", not an uncompressed point"
            }
        )));
    }
    // A point that is not on the curve fails the agreement: find out now, not at delivery.
    let rng = SystemRandom::new();
    let probe = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rng)
        .map_err(|_| PushError::Crypto)?;
    agreement::agree_ephemeral(
        probe,
        &agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, &point),
        |_| (),
    )
    .map_err(|_| PushError::P256dh(" (not a point on the curve)".into()))?;
    let secret = b64_decode(auth).ok_or_else(|| PushError::Auth(" (not base64url)".into()))?;
    if secret.len() != 16 {
        return Err(PushError::Auth(format!(" (got {} bytes)", secret.len())));
    }
    Ok((point, secret))
}

/// Which push endpoints the broker may send to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// `https` to public addresses only (the default).
    Public,
    /// Also plain `http` and loopback, private and link-local addresses
    /// (`--push-private-network`).
    Private,
}

/// Checks an endpoint URL under `network`; returns its origin (`scheme://host[:port]`), the
/// JWT's audience. A host name is only checked by name here (`localhost`); its addresses are
/// checked when the broker connects ([`PublicResolver`]).
pub fn endpoint_origin(endpoint: &str, network: Network) -> Result<String, PushError> {
    let url = reqwest::Url::parse(endpoint)
        .map_err(|e| PushError::Endpoint(format!("{endpoint} ({e})")))?;
    let Some(host) = url.host_str() else {
        return Err(PushError::Endpoint(endpoint.to_owned()));
    };
    if !matches!(url.scheme(), "http" | "https") {
        return Err(PushError::Endpoint(endpoint.to_owned()));
    }
    if network == Network::Public {
        if url.scheme() != "https" {
            return Err(PushError::NotHttps(endpoint.to_owned()));
        }
        // An IPv6 host comes in brackets; a URL's host is already lower case.
        let public = match host.trim_start_matches('[').trim_end_matches(']').parse() {
            Ok(ip) => is_public(ip),
            Err(_) => {
                let name = host.trim_end_matches('.');
                name != "localhost" && !name.ends_with(".localhost")
            }
        };
        if !public {
            return Err(PushError::NotPublic(endpoint.to_owned()));
        }
    }
    Ok(url.origin().ascii_serialization())
}

/// Whether `ip` is a public unicast address: not unspecified, loopback, private (RFC 1918,
/// unique local), shared (100.64/10), link-local, multicast, broadcast, documentation,
/// benchmarking or reserved; IPv4 inside IPv6 (mapped, compatible, NAT64, 6to4) is judged by its
/// IPv4 address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0                                    // "this network"
        || a == 10                              // private
        || a == 127                             // loopback
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 169 && b == 254)               // link-local
        || (a == 172 && (16..32).contains(&b))  // private
        || (a == 192 && b == 0 && c == 0)       // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)       // documentation
        || (a == 192 && b == 88 && c == 99)     // 6to4 relay anycast
        || (a == 192 && b == 168)               // private
        || (a == 198 && (18..20).contains(&b))  // benchmarking
        || (a == 198 && b == 51 && c == 100)    // documentation
        || (a == 203 && b == 0 && c == 113)     // documentation
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    // IPv4-compatible (::a.b.c.d, deprecated), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry
    // an IPv4 address a relay would reach.
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if seg[..6] == [0; 6] && !ip.is_loopback() && !ip.is_unspecified() {
        return is_public_v4(embedded(seg[6], seg[7]));
    }
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded(seg[6], seg[7]));
    }
    if seg[0] == 0x2002 {
        return is_public_v4(embedded(seg[1], seg[2]));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00              // unique local
        || (seg[0] & 0xffc0) == 0xfe80              // link-local
        || (seg[0] & 0xffc0) == 0xfec0              // site-local (deprecated)
        || (seg[0] == 0x2001 && seg[1] == 0x0db8)   // documentation
        || seg[..4] == [0x100, 0, 0, 0]             // discard-only
        || (seg[0] == 0x2001 && seg[1] < 0x200)) // IETF protocol assignments (Teredo, ORCHID…)
}

/// A DNS resolver for the push client that keeps only public addresses ([`is_public`]): the
/// check happens on the address actually connected to, so a name cannot be pointed at the
/// broker's own network between the subscription and the send.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicResolver;

impl reqwest::dns::Resolve for PublicResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> =
                all.iter().copied().filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                let refused: Box<dyn std::error::Error + Send + Sync> = if all.is_empty() {
                    format!("{host} has no address").into()
                } else {
                    format!(
                        "{host} resolves only to non-public addresses ({}); a push service \
                         inside your own network needs `ac7 serve --push-private-network`",
                        all.iter()
                            .map(|a| a.ip().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                    .into()
                };
                return Err(refused);
            }
            let addrs: reqwest::dns::Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

/// The push client: no redirects, a 30 s timeout per request, and under [`Network::Public`] only public
/// addresses.
pub fn http_client(network: Network) -> reqwest::Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none());
    match network {
        Network::Public => builder.dns_resolver(Arc::new(PublicResolver)),
        Network::Private => builder,
    }
    .build()
}

/// The team's VAPID key pair.
pub struct Vapid {
    key: EcdsaKeyPair,
    /// The public key, base64url of the uncompressed point (what browsers subscribe with).
    pub public_b64: String,
    subject: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for Vapid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vapid")
            .field("public", &self.public_b64)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Vapid {
    /// The key pair from its PKCS#8 document, signing for `subject`.
    pub fn from_pkcs8(pkcs8: &[u8], subject: &str) -> Result<Vapid, PushError> {
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng)
            .map_err(|_| PushError::BadStoredKey)?;
        let public_b64 = B64.encode(key.public_key().as_ref());
        Ok(Vapid {
            key,
            public_b64,
            subject: subject.to_owned(),
            rng,
        })
    }

    /// `vapid t=<JWT>, k=<public key>` for a request to `origin`, valid until `now_secs` + 12 h.
    pub fn authorization(&self, origin: &str, now_secs: u64) -> Result<String, PushError> {
        let header = B64.encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let claims = serde_json::json!({
            "aud": origin,
            "exp": now_secs + JWT_LIFETIME_SECS,
            "sub": self.subject,
        });
        let claims = B64.encode(claims.to_string());
        let signing_input = format!("{header}.{claims}");
        let sig = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| PushError::Crypto)?;
        Ok(format!(
            "vapid t={signing_input}.{}, k={}",
            B64.encode(sig.as_ref()),
            self.public_b64
        ))
    }
}

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn hkdf_expand(prk: &hkdf::Prk, info: &[&[u8]], out: &mut [u8]) -> Result<(), PushError> {
    prk.expand(info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| PushError::Crypto)
}

/// Encrypts `plaintext` for a browser (RFC 8291 with the `aes128gcm` coding of RFC 8188, one
/// record): `salt(16) || rs(4) || idlen(1) || server public key(65) || ciphertext+tag`.
pub fn encrypt(plaintext: &[u8], ua_public: &[u8], auth: &[u8]) -> Result<Vec<u8>, PushError> {
    let rng = SystemRandom::new();
    let ephemeral = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rng)
        .map_err(|_| PushError::Crypto)?;
    let as_public = ephemeral
        .compute_public_key()
        .map_err(|_| PushError::Crypto)?;
    let as_public = as_public.as_ref().to_vec();
    let ecdh = agreement::agree_ephemeral(
        ephemeral,
        &agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, ua_public),
        <[u8]>::to_vec,
    )
    .map_err(|_| PushError::P256dh(" (not a point on the curve)".into()))?;
    // IKM = HKDF(salt = auth, ikm = ECDH, info = "WebPush: info\0" || ua_public || as_public).
    let prk_key = hkdf::Salt::new(hkdf::HKDF_SHA256, auth).extract(&ecdh);
    let mut ikm = [0u8; 32];
    hkdf_expand(
        &prk_key,
        &[b"WebPush: info\0", ua_public, &as_public],
        &mut ikm,
    )?;
    let mut salt = [0u8; 16];
    rng.fill(&mut salt).map_err(|_| PushError::Crypto)?;
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(&ikm);
    let mut cek = [0u8; 16];
    hkdf_expand(&prk, &[b"Content-Encoding: aes128gcm\0"], &mut cek)?;
    let mut nonce = [0u8; 12];
    hkdf_expand(&prk, &[b"Content-Encoding: nonce\0"], &mut nonce)?;
    let key = aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::AES_128_GCM, &cek).map_err(|_| PushError::Crypto)?,
    );
    // The last (and only) record: the content, then the delimiter 0x02.
    let mut record = Vec::with_capacity(plaintext.len() + 1 + 16);
    record.extend_from_slice(plaintext);
    record.push(2);
    key.seal_in_place_append_tag(
        aead::Nonce::assume_unique_for_key(nonce),
        aead::Aad::empty(),
        &mut record,
    )
    .map_err(|_| PushError::Crypto)?;
    let mut out = Vec::with_capacity(16 + 4 + 1 + 65 + record.len());
    out.extend_from_slice(&salt);
    out.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    out.push(65);
    out.extend_from_slice(&as_public);
    out.extend_from_slice(&record);
    Ok(out)
}

// ---- the store ----

/// The team's VAPID key (PKCS#8), made and stored on first use. Replicas starting at once
/// agree: the first insert wins, the others read it back.
pub fn vapid_ensure(c: &Conn<'_>, now: i64) -> Result<Vec<u8>, StoreError> {
    if let Some(k) = vapid_get(c)? {
        return Ok(k);
    }
    let rng = SystemRandom::new();
    let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
        .map_err(|_| StoreError::Corrupt("cannot generate the VAPID key".into()))?;
    c.execute(
        "INSERT INTO push_vapid (id, private_pkcs8, created_at) VALUES (1, ?1, ?2)
         ON CONFLICT (id) DO NOTHING",
        params![doc.as_ref().to_vec(), now],
    )?;
    vapid_get(c)?.ok_or_else(|| StoreError::Corrupt("the VAPID key row vanished".into()))
}

fn vapid_get(c: &Conn<'_>) -> Result<Option<Vec<u8>>, StoreError> {
    c.query_row(
        "SELECT private_pkcs8 FROM push_vapid WHERE id = 1",
        params![],
        |r| r.get::<Vec<u8>>(0),
    )
}

/// A stored subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// Its id.
    pub id: i64,
    /// The member it notifies.
    pub member: String,
    /// The push service URL.
    pub endpoint: String,
    /// The browser's public key (base64url).
    pub p256dh: String,
    /// The browser's auth secret (base64url).
    pub auth: String,
    /// When it was first stored (epoch ms).
    pub created_at: i64,
}

const SUB_COLS: &str = "id, member_name, endpoint, p256dh, auth, created_at";

fn sub_of(r: &Row) -> Result<Subscription, StoreError> {
    Ok(Subscription {
        id: r.get(0)?,
        member: r.get(1)?,
        endpoint: r.get(2)?,
        p256dh: r.get(3)?,
        auth: r.get(4)?,
        created_at: r.get(5)?,
    })
}

/// Stores a subscription for `member`, or re-binds the row of the same endpoint to `member`
/// with the new keys (its id and creation time stay).
pub fn subscription_upsert(
    c: &Conn<'_>,
    member: &str,
    endpoint: &str,
    p256dh: &str,
    auth: &str,
    now: i64,
) -> Result<Subscription, StoreError> {
    c.query_row(
        &format!(
            "INSERT INTO push_subscriptions (member_name, endpoint, p256dh, auth, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (endpoint) DO UPDATE SET member_name = excluded.member_name,
                 p256dh = excluded.p256dh, auth = excluded.auth
             RETURNING {SUB_COLS}"
        ),
        params![member, endpoint, p256dh, auth, now],
        sub_of,
    )?
    .ok_or_else(|| StoreError::Corrupt("upsert returned no row".into()))
}

/// Deletes subscription `id` if `member` holds it; whether it did.
pub fn subscription_delete(c: &Conn<'_>, member: &str, id: i64) -> Result<bool, StoreError> {
    Ok(c.execute(
        "DELETE FROM push_subscriptions WHERE id = ?1 AND member_name = ?2",
        params![id, member],
    )? == 1)
}

/// Deletes the subscription of `endpoint` with id `id` (the push service said it is gone).
pub fn subscription_gone(c: &Conn<'_>, id: i64, endpoint: &str) -> Result<bool, StoreError> {
    Ok(c.execute(
        "DELETE FROM push_subscriptions WHERE id = ?1 AND endpoint = ?2",
        params![id, endpoint],
    )? == 1)
}

/// Deletes every subscription of `member` (the member is removed).
pub fn subscriptions_delete_member(c: &Conn<'_>, member: &str) -> Result<usize, StoreError> {
    c.execute(
        "DELETE FROM push_subscriptions WHERE member_name = ?1",
        params![member],
    )
}

/// The members holding at least one subscription.
pub fn subscribed_members(c: &Conn<'_>) -> Result<HashSet<String>, StoreError> {
    Ok(c.query(
        "SELECT DISTINCT member_name FROM push_subscriptions",
        params![],
        |r| r.get::<String>(0),
    )?
    .into_iter()
    .collect())
}

/// Every subscription, oldest first.
pub fn subscriptions_all(c: &Conn<'_>) -> Result<Vec<Subscription>, StoreError> {
    c.query(
        &format!("SELECT {SUB_COLS} FROM push_subscriptions ORDER BY id"),
        params![],
        sub_of,
    )
}

/// The subscriptions of `member`, oldest first.
pub fn subscriptions_of(c: &Conn<'_>, member: &str) -> Result<Vec<Subscription>, StoreError> {
    c.query(
        &format!("SELECT {SUB_COLS} FROM push_subscriptions WHERE member_name = ?1 ORDER BY id"),
        params![member],
        sub_of,
    )
}

// ---- who is notified, and with what ----

/// What a notification carries (the JSON the service worker shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// `<from> → #team`, `<from> → #<channel>`, `<from>` or `<from> — <title>` for a DM.
    pub title: String,
    /// The message body, cut to [`MAX_BODY_CHARS`] characters.
    pub body: String,
    /// Replaces an earlier notification of the same thread: `ac7:team`, `ac7:dm:<from>`,
    /// `ac7:chan:<id>`, `ac7:obj:<id>`.
    pub tag: String,
    /// Where a click leads in the web app.
    pub url: String,
    /// `high` (warning and above: stays until dismissed) or `normal`.
    pub severity: &'static str,
    /// The message's id.
    pub message_id: String,
}

/// Whether `body` mentions `@name` (case-insensitive, the whole name: not inside a longer
/// name or an e-mail address; a sentence's full stop after it still counts).
pub fn mentions(body: &str, name: &str) -> bool {
    let is_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let lower = body.to_ascii_lowercase();
    let want = name.to_ascii_lowercase();
    let mut from = 0;
    while let Some(at) = lower[from..].find('@') {
        let at = from + at;
        from = at + 1;
        if at > 0 && lower[..at].chars().next_back().is_some_and(is_name) {
            continue;
        }
        let rest = &lower[at + 1..];
        if !rest.starts_with(&want) {
            continue;
        }
        let after = &rest[want.len()..];
        let mut chars = after.chars();
        match chars.next() {
            None => return true,
            Some(c) if !is_name(c) => return true,
            // `@bob.` at the end of a sentence: the dot is punctuation.
            Some('.') if chars.next().is_none_or(|c| !is_name(c)) => return true,
            _ => {}
        }
    }
    false
}

/// Cuts `s` to at most `max` characters (on a character boundary), marking a cut with `…`.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some(_) => {
            let keep: String = s.chars().take(max.saturating_sub(1)).collect();
            format!("{keep}…")
        }
    }
}

/// Warning and above.
fn urgent(level: LogLevel) -> bool {
    matches!(
        level,
        LogLevel::Warning | LogLevel::Error | LogLevel::Critical
    )
}

/// Whether `member` gets a notification for `msg` (routed as `route`), by the rules in the
/// module docs (the live-stream check aside).
pub fn wants(member: &str, msg: &Message, route: &Route) -> bool {
    if msg.from.as_deref() == Some(member) {
        return false;
    }
    match route {
        Route::Direct { to } => to == member,
        Route::General | Route::Channel(_) | Route::Objective(_) => {
            urgent(msg.level) || mentions(&msg.body, member)
        }
        Route::Unroutable => false,
    }
}

/// The notification of `msg`; `channel_slug` is the slug of a channel route's channel.
pub fn notification(msg: &Message, route: &Route, channel_slug: Option<&str>) -> Notification {
    let from = msg.from.as_deref().unwrap_or("ac7");
    let (title, tag, url) = match route {
        Route::Direct { .. } => (
            match msg.title.as_deref().filter(|t| !t.is_empty()) {
                Some(t) => format!("{from} — {}", cut(t, MAX_TITLE_CHARS)),
                None => from.to_owned(),
            },
            format!("ac7:dm:{from}"),
            format!("/dm/{}", path_segment(from)),
        ),
        Route::Channel(id) => {
            let slug = channel_slug.unwrap_or(id);
            (
                format!("{from} → #{slug}"),
                format!("ac7:chan:{id}"),
                format!("/c/{}", path_segment(slug)),
            )
        }
        Route::Objective(id) => (
            format!("{from} → objective {id}"),
            format!("ac7:obj:{id}"),
            format!("/objectives/{}", path_segment(id)),
        ),
        Route::General | Route::Unroutable => (
            format!("{from} → #team"),
            "ac7:team".to_owned(),
            "/".to_owned(),
        ),
    };
    Notification {
        title,
        body: cut(&msg.body, MAX_BODY_CHARS),
        tag,
        url,
        severity: if urgent(msg.level) { "high" } else { "normal" },
        message_id: msg.id.clone(),
    }
}

fn path_segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

// ---- the dispatcher ----

/// A committed message to consider.
#[derive(Debug)]
struct Job {
    msg: Message,
    route: Route,
    audience: Audience,
}

impl Job {
    /// Whether the message is for `member` and would notify them (the live-stream check
    /// aside): in its audience, and wanted by the rules of [`wants`].
    fn notifies(&self, member: &str) -> bool {
        self.audience.includes(member) && wants(member, &self.msg, &self.route)
    }
}

/// The sending side of the dispatcher, kept in the broker's state.
#[derive(Debug)]
pub struct Dispatcher {
    tx: mpsc::Sender<Job>,
    vapid: Arc<Vapid>,
    network: Network,
    /// `(subscription id, failure kind)` already logged at WARN.
    warned: Arc<Mutex<HashSet<(i64, String)>>>,
    /// Who held a subscription when last read: most messages notify nobody, and this lets
    /// them pass without reading the store.
    subscribers: Mutex<Subscribers>,
}

/// How long the list of members holding a subscription is trusted before it is read again.
/// Subscriptions stored through this broker count at once; one stored through another replica
/// may be missed for this long. A member who lost theirs (unsubscribed, removed) is only a
/// reason to read the subscriptions themselves, which are always read fresh.
const SUBSCRIBERS_FOR: Duration = Duration::from_secs(2);

/// The members holding a subscription, as read at `read_at`.
#[derive(Debug, Default)]
struct Subscribers {
    read_at: Option<Instant>,
    names: Arc<HashSet<String>>,
}

impl Dispatcher {
    /// The team's public key (base64url, uncompressed point).
    pub fn public_key(&self) -> &str {
        &self.vapid.public_b64
    }

    /// Which endpoints this broker may send to.
    pub fn network(&self) -> Network {
        self.network
    }

    /// Queues a committed message for notifications (never waits: a full queue drops it with a
    /// warning, the message itself is stored and delivered as usual).
    pub fn message(&self, msg: Message, route: Route, audience: Audience) {
        let job = Job {
            msg,
            route,
            audience,
        };
        if self.nobody_subscribed_for(&job, Instant::now()) {
            return;
        }
        if let Err(e) = self.tx.try_send(job) {
            tracing::warn!(error = %e, "web push queue full: a message goes without notifications");
        }
    }

    /// The members holding a subscription: as last read by `read` if that was less than
    /// [`SUBSCRIBERS_FOR`] before `now` and nothing was stored since, else read again.
    fn subscribers(
        &self,
        now: Instant,
        read: impl FnOnce() -> Result<HashSet<String>, StoreError>,
    ) -> Result<Arc<HashSet<String>>, StoreError> {
        // Read under the lock, so a subscription committed during the read (whose
        // `subscription_stored` waits for the lock) still clears what the read returns.
        let mut s = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = s.read_at
            && now.saturating_duration_since(at) < SUBSCRIBERS_FOR
        {
            return Ok(Arc::clone(&s.names));
        }
        s.names = Arc::new(read()?);
        s.read_at = Some(now);
        Ok(Arc::clone(&s.names))
    }

    /// Whether the list of members holding a subscription, still fresh at `now`, has nobody
    /// `job` would notify: then the dispatcher need not even look at it. A stale list answers
    /// `false` (the dispatcher reads it again).
    fn nobody_subscribed_for(&self, job: &Job, now: Instant) -> bool {
        let s = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match s.read_at {
            Some(at) if now.saturating_duration_since(at) < SUBSCRIBERS_FOR => {
                !s.names.iter().any(|m| job.notifies(m))
            }
            _ => false,
        }
    }

    /// A subscription was just committed: the next message reads who holds one again.
    fn subscription_stored(&self) {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .read_at = None;
    }
}

/// Makes the dispatcher with the team's key (`pkcs8`) and its receiving end, for [`spawn`].
pub fn dispatcher(
    pkcs8: &[u8],
    subject: &str,
    network: Network,
) -> Result<(Dispatcher, Queue), PushError> {
    let vapid = Arc::new(Vapid::from_pkcs8(pkcs8, subject)?);
    let (tx, rx) = mpsc::channel(QUEUE);
    Ok((
        Dispatcher {
            tx,
            vapid,
            network,
            warned: Arc::default(),
            subscribers: Mutex::default(),
        },
        Queue(rx),
    ))
}

/// The dispatcher's receiving end.
#[derive(Debug)]
pub struct Queue(mpsc::Receiver<Job>);

/// Starts the dispatcher task; it ends with the broker.
pub fn spawn(queue: Queue, state: Weak<AppState>, network: Network) {
    let Queue(mut rx) = queue;
    tokio::spawn(async move {
        let http = match http_client(network) {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(error = %e, "web push disabled: cannot build its HTTP client");
                return;
            }
        };
        let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        while let Some(job) = rx.recv().await {
            let Some(state) = state.upgrade() else { return };
            let sends = match targets(&state, &job) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, message = %job.msg.id, "web push: cannot read subscriptions");
                    continue;
                }
            };
            for (sub, body) in sends {
                let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let http = http.clone();
                let weak = Arc::downgrade(&state);
                tokio::spawn(async move {
                    send(&http, &weak, &sub, &body).await;
                    drop(permit);
                });
            }
        }
    });
}

/// The subscriptions `job` notifies, each with its JSON payload.
fn targets(state: &AppState, job: &Job) -> Result<Vec<(Subscription, Vec<u8>)>, StoreError> {
    // Most messages notify nobody (no subscriber among those it is for, or they have the app
    // open): that is decided without a read.
    let subscribers = state.push.subscribers(Instant::now(), || {
        state.store.view_small(subscribed_members)
    })?;
    // Someone with the web app open (here, or on another replica: read below) sees the
    // message there.
    let candidate = |member: &str| job.notifies(member) && state.hub.browser_count(member) == 0;
    if !subscribers.iter().any(|m| candidate(m)) {
        return Ok(Vec::new());
    }
    // Then one read: every subscription (a row per browser, few), kept for the members the
    // message notifies; with replicas, who has the app open on another one. Subscriptions of
    // removed members are gone with them.
    let (subs, slug) = state.store.view(|c| -> Result<_, StoreError> {
        let open_elsewhere = match &state.replica {
            Some(me) => super::replica::browsers_elsewhere(c, me, super::now_ms())?,
            None => HashSet::new(),
        };
        let subs: Vec<Subscription> = subscriptions_all(c)?
            .into_iter()
            .filter(|s| candidate(&s.member) && !open_elsewhere.contains(&s.member))
            .collect();
        let slug = match &job.route {
            Route::Channel(id) if !subs.is_empty() => {
                super::channels::by_id(c, id)?.map(|ch| ch.slug)
            }
            _ => None,
        };
        Ok((subs, slug))
    })?;
    let payload = serde_json::to_vec(&notification(&job.msg, &job.route, slug.as_deref()))?;
    Ok(subs.into_iter().map(|s| (s, payload.clone())).collect())
}

/// Sends one notification; a subscription the push service says is gone is deleted.
async fn send(http: &reqwest::Client, state: &Weak<AppState>, sub: &Subscription, payload: &[u8]) {
    let Some(st) = state.upgrade() else { return };
    let push = &st.push;
    let warned = Arc::clone(&push.warned);
    let warn_once = |kind: String, detail: String| {
        let first = warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((sub.id, kind.clone()));
        if first {
            tracing::warn!(subscription = sub.id, member = %sub.member, endpoint = %sub.endpoint, kind, detail, "web push failed");
        }
    };
    let request = (|| -> Result<(String, Vec<u8>), PushError> {
        let origin = endpoint_origin(&sub.endpoint, push.network)?;
        let (point, secret) = check_keys(&sub.p256dh, &sub.auth)?;
        let now = crate::sys::clock::now_secs();
        Ok((
            push.vapid.authorization(&origin, now)?,
            encrypt(payload, &point, &secret)?,
        ))
    })();
    let (authorization, body) = match request {
        Ok(r) => r,
        Err(e) => return warn_once("request".into(), e.to_string()),
    };
    drop(st);
    let sent = http
        .post(&sub.endpoint)
        .header("authorization", authorization)
        .header("ttl", TTL_SECS.to_string())
        .header("content-encoding", "aes128gcm")
        .header("content-type", "application/octet-stream")
        .header(
            "urgency",
            if payload_is_high(payload) {
                "high"
            } else {
                "normal"
            },
        )
        .body(body)
        .send()
        .await;
    match sent {
        Ok(r) if r.status().is_success() => {}
        Ok(r) if matches!(r.status().as_u16(), 404 | 410) => {
            let Some(st) = state.upgrade() else { return };
            match st.store.tx(|c| subscription_gone(c, sub.id, &sub.endpoint)) {
                Ok(_) => {
                    tracing::info!(subscription = sub.id, member = %sub.member, status = r.status().as_u16(), "web push subscription gone: deleted")
                }
                Err(e) => warn_once("delete".into(), e.to_string()),
            }
        }
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            warn_once(format!("http {status}"), cut(&text, 200));
        }
        Err(e) => warn_once(
            if e.is_timeout() { "timeout" } else { "connect" }.into(),
            e.to_string(),
        ),
    }
}

fn payload_is_high(payload: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(payload).is_ok_and(|v| v["severity"] == "high")
}

/// Why a browser's push subscription request was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubscriptionError {
    /// The endpoint or the keys are not acceptable.
    #[error(transparent)]
    Refused(PushError),
    /// The member has no subscription with this id.
    #[error("no such subscription: {0}")]
    NotFound(i64),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Stores `member`'s browser subscription (or re-binds one of the same endpoint to them)
/// once its endpoint (on an address the broker may reach) and keys check out.
pub fn subscribe_browser(
    state: &AppState,
    member: &str,
    endpoint: &str,
    p256dh: &str,
    auth: &str,
    now: i64,
) -> Result<Subscription, SubscriptionError> {
    endpoint_origin(endpoint, state.push.network()).map_err(SubscriptionError::Refused)?;
    check_keys(p256dh, auth).map_err(SubscriptionError::Refused)?;
    let sub = state
        .store
        .tx(|c| subscription_upsert(c, member, endpoint, p256dh, auth, now))?;
    state.push.subscription_stored();
    Ok(sub)
}

/// Deletes `member`'s subscription `id`.
pub fn unsubscribe_browser(
    store: &super::db::Store,
    member: &str,
    id: i64,
) -> Result<(), SubscriptionError> {
    if store.tx(|c| subscription_delete(c, member, id))? {
        Ok(())
    } else {
        Err(SubscriptionError::NotFound(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    #[test]
    fn only_public_unicast_addresses_are_public() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.15.0.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip} is public");
        }
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "2002:7f00:1::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "100::1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} is not public");
        }
    }

    #[test]
    fn endpoints_must_be_https_on_public_hosts_unless_the_network_is_private() {
        for endpoint in ["http://push.example/x", "http://8.8.8.8/x"] {
            assert!(
                matches!(
                    endpoint_origin(endpoint, Network::Public),
                    Err(PushError::NotHttps(_))
                ),
                "{endpoint}"
            );
        }
        // Every spelling the URL parser turns into a loopback or private address.
        for endpoint in [
            "https://127.0.0.1/x",
            "https://[::1]:8443/x",
            "https://10.0.0.1/x",
            "https://169.254.169.254/latest/meta-data",
            "https://0x7f.1/x",
            "https://2130706433/x",
            "https://[::ffff:7f00:1]/x",
            "https://localhost/x",
            "https://LOCALHOST./x",
            "https://push.localhost/x",
        ] {
            assert!(
                matches!(
                    endpoint_origin(endpoint, Network::Public),
                    Err(PushError::NotPublic(_))
                ),
                "{endpoint}"
            );
            assert!(
                endpoint_origin(endpoint, Network::Private).is_ok(),
                "{endpoint}"
            );
        }
        assert_eq!(
            endpoint_origin("http://127.0.0.1:9/push/1", Network::Private).unwrap(),
            "http://127.0.0.1:9"
        );
        assert_eq!(
            endpoint_origin("https://fcm.googleapis.com/fcm/send/abc", Network::Public).unwrap(),
            "https://fcm.googleapis.com"
        );
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_of_non_public_addresses() {
        use reqwest::dns::Resolve;
        let err = PublicResolver
            .resolve("localhost".parse().unwrap())
            .await
            .err()
            .expect("localhost is refused");
        assert!(err.to_string().contains("non-public"), "{err}");
        assert!(err.to_string().contains("127.0.0.1"), "{err}");
        // An IP literal given as a name goes through the same filter.
        assert!(
            PublicResolver
                .resolve("10.0.0.1".parse().unwrap())
                .await
                .is_err()
        );
    }

    fn msg(from: &str, to: Option<&str>, body: &str, level: LogLevel) -> Message {
        Message {
            id: "m1".into(),
            ts: 1,
            to: to.map(str::to_owned),
            from: Some(from.into()),
            title: None,
            body: body.into(),
            level,
            data: Map::new(),
            attachments: vec![],
        }
    }

    #[test]
    fn mentions_are_whole_names() {
        assert!(mentions("hey @Bob, look", "bob"));
        assert!(mentions("@bob", "bob"));
        assert!(mentions("ping @bob.", "bob"));
        assert!(!mentions("ping @bobby", "bob"));
        assert!(!mentions("ping @bob.x", "bob"));
        assert!(!mentions("mail bob@bob.com", "bob"));
        assert!(!mentions("bob", "bob"));
        assert!(mentions("@a.b and more", "a.b"));
        assert!(mentions("é @bob", "bob"));
    }

    #[test]
    fn who_is_notified() {
        let dm = msg("ann", Some("bob"), "hi", LogLevel::Info);
        let route = Route::Direct { to: "bob".into() };
        assert!(wants("bob", &dm, &route));
        assert!(!wants("ann", &dm, &route));
        let team = msg("ann", None, "hi", LogLevel::Info);
        assert!(!wants("bob", &team, &Route::General));
        let warn = msg("ann", None, "hi", LogLevel::Warning);
        assert!(wants("bob", &warn, &Route::General));
        assert!(!wants("ann", &warn, &Route::General));
        let mention = msg("ann", None, "hi @bob", LogLevel::Info);
        assert!(wants("bob", &mention, &Route::Channel("c1".into())));
        assert!(!wants("carl", &mention, &Route::Channel("c1".into())));
    }

    #[test]
    fn bodies_are_cut_on_a_char_boundary() {
        let long = "é".repeat(300);
        let n = notification(
            &msg("ann", None, &long, LogLevel::Critical),
            &Route::General,
            None,
        );
        assert_eq!(n.body.chars().count(), MAX_BODY_CHARS);
        assert!(n.body.ends_with('…'));
        assert_eq!(
            (n.severity, n.tag.as_str(), n.url.as_str()),
            ("high", "ac7:team", "/")
        );
        assert_eq!(n.title, "ann → #team");
    }

    #[test]
    fn keys_are_checked() {
        let rng = SystemRandom::new();
        let k = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rng).unwrap();
        let public = B64.encode(k.compute_public_key().unwrap().as_ref());
        let auth = B64.encode([7u8; 16]);
        assert!(check_keys(&public, &auth).is_ok());
        assert!(matches!(check_keys("!!", &auth), Err(PushError::P256dh(_))));
        assert!(matches!(
            check_keys(&B64.encode([4u8; 65]), &auth),
            Err(PushError::P256dh(_))
        ));
        assert!(matches!(
            check_keys(&public, &B64.encode([1u8; 15])),
            Err(PushError::Auth(_))
        ));
        assert!(endpoint_origin("ftp://x/y", Network::Private).is_err());
        assert_eq!(
            endpoint_origin("https://push.example:8443/a/b?c", Network::Public).unwrap(),
            "https://push.example:8443"
        );
    }
    #[test]
    fn who_holds_a_subscription_is_read_again_when_stale_or_after_a_subscription() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let (d, _queue) = dispatcher(pkcs8.as_ref(), DEFAULT_SUBJECT, Network::Public).unwrap();
        let reads = std::cell::Cell::new(0);
        let read = |names: &[&str]| {
            reads.set(reads.get() + 1);
            Ok(names.iter().map(|n| (*n).to_owned()).collect())
        };
        let t0 = Instant::now();
        let dm = |from: &str, to: &str| Job {
            msg: msg(from, Some(to), "hi", LogLevel::Info),
            route: Route::Direct { to: to.to_owned() },
            audience: Audience::Only([to.to_owned()].into()),
        };
        let to_bob = dm("ann", "bob");
        // Nothing read yet: the dispatcher has to look.
        assert!(!d.nobody_subscribed_for(&to_bob, t0));
        let first = d.subscribers(t0, || read(&["ann"])).unwrap();
        assert!(first.contains("ann"));
        // Only ann holds one, and ann sent it: nobody to notify, no job queued.
        assert!(d.nobody_subscribed_for(&to_bob, t0));
        assert!(!d.nobody_subscribed_for(&dm("bob", "ann"), t0));
        let stale = t0 + SUBSCRIBERS_FOR;
        assert!(!d.nobody_subscribed_for(&to_bob, stale));
        // Within the window the last read answers.
        let again = d
            .subscribers(t0 + SUBSCRIBERS_FOR / 2, || read(&["bob"]))
            .unwrap();
        assert_eq!((reads.get(), again.contains("ann")), (1, true));
        // A subscription stored here counts at once.
        d.subscription_stored();
        let after = d
            .subscribers(t0 + SUBSCRIBERS_FOR / 2, || read(&["ann", "bob"]))
            .unwrap();
        assert_eq!((reads.get(), after.len()), (2, 2));
        // Past the window (one stored through another replica) it is read again.
        let later = d
            .subscribers(t0 + SUBSCRIBERS_FOR * 2, || read(&["cy"]))
            .unwrap();
        assert_eq!((reads.get(), later.contains("cy")), (3, true));
        // A failed read is an error, and the next message tries again.
        d.subscription_stored();
        let failed = d.subscribers(t0 + SUBSCRIBERS_FOR * 2, || {
            Err(StoreError::Corrupt("x".into()))
        });
        assert!(failed.is_err());
        let retried = d
            .subscribers(t0 + SUBSCRIBERS_FOR * 2, || read(&["dee"]))
            .unwrap();
        assert!(retried.contains("dee"));
    }
}
