//! [`PgConfig`]: where the database is and how to talk to it, from a libpq-style URL.
//!
//! `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE?sslmode=…&sslrootcert=…&connect_timeout=…`
//! (`postgresql://` too). User, password and database are percent-decoded; an IPv6 host is
//! written in brackets. The port defaults to 5432, the user to `postgres`; the database is
//! required. Query parameters other than `sslmode`, `sslrootcert`, `connect_timeout` and
//! `application_name` are refused rather than ignored, so a typo never silently weakens TLS.
//!
//! The password is kept out of every `Debug` and `Display` of the configuration and out of every
//! error: [`PgConfig::redacted`] shows it as `***`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use super::PgError;

/// How TLS is used, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, plain otherwise; the certificate is not verified.
    #[default]
    Prefer,
    /// TLS or nothing; the certificate is not verified (libpq's `require`), unless
    /// `sslrootcert` is given, in which case it is verified as with [`SslMode::VerifyCa`].
    Require,
    /// TLS, and the certificate chains to a trusted root (any host name).
    VerifyCa,
    /// TLS, the certificate chains to a trusted root and names the host.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// The URL spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Connections opened by a pool at most, unless set.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// The server cancels a statement running longer than this, unless set.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Connecting (TCP, TLS, authentication) gives up after this, unless set.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the database is and how to talk to it. Build it with [`PgConfig::parse`].
#[derive(Clone, PartialEq, Eq)]
pub struct PgConfig {
    /// Role name.
    pub user: String,
    password: Option<String>,
    /// Host name or IP address (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Database name.
    pub dbname: String,
    /// TLS use.
    pub sslmode: SslMode,
    /// PEM file of the roots to trust (instead of the web PKI roots).
    pub sslrootcert: Option<PathBuf>,
    /// `application_name` reported to the server (`ac7` unless set).
    pub application_name: String,
    /// Connections a pool opens at most (at least 1).
    pub pool_size: usize,
    /// Server-side `statement_timeout` of every connection.
    pub statement_timeout: Duration,
    /// Limit on connecting, and on waiting for a free pooled connection.
    pub connect_timeout: Duration,
}

fn bad(why: impl Into<String>) -> PgError {
    PgError::BadUrl(why.into())
}

fn decode(part: &str, what: &str) -> Result<String, PgError> {
    percent_decode_str(part)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| bad(format!("the {what} is not UTF-8 once percent-decoded")))
}

impl PgConfig {
    /// Parses a `postgres://` / `postgresql://` URL. The error never contains the password.
    pub fn parse(url: &str) -> Result<PgConfig, PgError> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| bad("it must start with postgres:// or postgresql://"))?;
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        if main.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(bad("a fragment (#…) has no meaning in a database URL"));
        }
        // The user info ends at the last '@' before the path (a password may contain '@' only
        // percent-encoded, but be lenient about where the path starts).
        let (authority, path) = match main.find('/') {
            Some(i) => (&main[..i], &main[i + 1..]),
            None => (main, ""),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => ("postgres".to_owned(), None),
            Some(info) => {
                let (u, p) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = decode(u, "user name")?;
                if user.is_empty() {
                    return Err(bad("the user name is empty"));
                }
                (user, p.map(|p| decode(p, "password")).transpose()?)
            }
        };
        let (host, port) = parse_host_port(hostport)?;
        if path.is_empty() {
            return Err(bad(
                "the database name is missing (postgres://USER@HOST:PORT/DATABASE)",
            ));
        }
        let dbname = decode(path, "database name")?;
        if dbname.contains('/') {
            return Err(bad(format!("\"{dbname}\" is not a database name")));
        }
        let mut config = PgConfig {
            user,
            password,
            host,
            port,
            dbname,
            sslmode: SslMode::default(),
            sslrootcert: None,
            application_name: "ac7".to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        };
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*key {
                "sslmode" => {
                    config.sslmode = SslMode::parse(&value).ok_or_else(|| {
                        bad(format!(
                            "sslmode={value} is not one of disable, prefer, require, verify-ca, verify-full"
                        ))
                    })?;
                }
                "sslrootcert" if !value.is_empty() => {
                    config.sslrootcert = Some(PathBuf::from(&*value));
                }
                "sslrootcert" => return Err(bad("sslrootcert is empty")),
                "connect_timeout" => {
                    let secs: u64 = value.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                        bad(format!(
                            "connect_timeout={value} is not a positive number of seconds"
                        ))
                    })?;
                    config.connect_timeout = Duration::from_secs(secs);
                }
                "application_name" => config.application_name = value.into_owned(),
                other => {
                    return Err(bad(format!(
                        "unknown parameter \"{other}\" (known: sslmode, sslrootcert, connect_timeout, application_name)"
                    )));
                }
            }
        }
        if config.sslmode == SslMode::Disable && config.sslrootcert.is_some() {
            return Err(bad("sslrootcert was given with sslmode=disable"));
        }
        Ok(config)
    }

    /// The password, if the URL has one.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `host:port` (IPv6 in brackets), for messages.
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The same configuration on another database of the server (for tooling and tests that
    /// create databases).
    pub fn with_dbname(&self, dbname: &str) -> PgConfig {
        PgConfig {
            dbname: dbname.to_owned(),
            ..self.clone()
        }
    }

    /// The URL with the password shown as `***`: safe to log and print.
    pub fn redacted(&self) -> String {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let pass = if self.password.is_some() { ":***" } else { "" };
        let mut url = format!(
            "postgres://{}{pass}@{}/{}?sslmode={}",
            enc(&self.user),
            self.addr(),
            enc(&self.dbname),
            self.sslmode.as_str()
        );
        if let Some(root) = &self.sslrootcert {
            url.push_str("&sslrootcert=");
            url.push_str(&enc(&root.to_string_lossy()));
        }
        url
    }

    /// The `tokio_postgres` configuration (the TLS policy beyond on/off is the connector's).
    pub(super) fn client_config(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.user(&self.user)
            .host(&self.host)
            .port(self.port)
            .dbname(&self.dbname)
            .application_name(&self.application_name)
            .connect_timeout(self.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            .options(format!(
                "-c statement_timeout={}",
                self.statement_timeout.as_millis()
            ))
            .ssl_mode(match self.sslmode {
                SslMode::Disable => tokio_postgres::config::SslMode::Disable,
                SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
                SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                    tokio_postgres::config::SslMode::Require
                }
            });
        if let Some(p) = &self.password {
            c.password(p);
        }
        c
    }
}

fn parse_host_port(hostport: &str) -> Result<(String, u16), PgError> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 host is missing its closing ']'"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| bad(format!("unexpected \"{p}\" after the IPv6 host")))?,
            ),
        };
        (h.to_owned(), port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (hostport.to_owned(), None),
        }
    };
    if host.is_empty() {
        return Err(bad(
            "the host is missing (postgres://USER@HOST:PORT/DATABASE); Unix sockets are not supported",
        ));
    }
    if hostport.contains(',') {
        return Err(bad("several hosts in one URL are not supported"));
    }
    let port = match port {
        None => 5432,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad(format!("port \"{p}\" is not a number from 1 to 65535")))?,
    };
    Ok((host, port))
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &self.redacted())
            .field("application_name", &self.application_name)
            .field("pool_size", &self.pool_size)
            .field("statement_timeout", &self.statement_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl fmt::Display for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_parses() {
        let c = PgConfig::parse(
            "postgresql://ac7%40x:s%2Fecr%40t@db.example.com:6543/ac7_team?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=7&application_name=r1",
        )
        .unwrap();
        assert_eq!(c.user, "ac7@x");
        assert_eq!(c.password(), Some("s/ecr@t"));
        assert_eq!(c.host, "db.example.com");
        assert_eq!(c.port, 6543);
        assert_eq!(c.dbname, "ac7_team");
        assert_eq!(c.sslmode, SslMode::VerifyFull);
        assert_eq!(c.sslrootcert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(c.connect_timeout, Duration::from_secs(7));
        assert_eq!(c.application_name, "r1");
        assert_eq!(c.pool_size, DEFAULT_POOL_SIZE);
        assert_eq!(c.statement_timeout, DEFAULT_STATEMENT_TIMEOUT);
    }

    #[test]
    fn defaults_and_ipv6() {
        let c = PgConfig::parse("postgres://127.0.0.1/ac7").unwrap();
        assert_eq!(
            (c.user.as_str(), c.port, c.sslmode, c.password()),
            ("postgres", 5432, SslMode::Prefer, None)
        );
        assert_eq!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        let c = PgConfig::parse("postgres://u@[::1]:5433/d?sslmode=disable").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("::1", 5433));
        assert_eq!(c.addr(), "[::1]:5433");
        assert_eq!(c.sslmode, SslMode::Disable);
        let c = PgConfig::parse("postgres://u:@h/d").unwrap();
        assert_eq!(c.password(), Some(""));
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (url, why) in [
            ("mysql://u@h/d", "must start with postgres://"),
            ("postgres://u@h", "database name is missing"),
            ("postgres://u@h/", "database name is missing"),
            ("postgres://u@/d", "host is missing"),
            ("postgres://@h/d", "user name is empty"),
            ("postgres://u@h:0/d", "port \"0\""),
            ("postgres://u@h:99999/d", "port \"99999\""),
            ("postgres://u@h:x/d", "port \"x\""),
            ("postgres://u@[::1/d", "closing ']'"),
            ("postgres://u@h1,h2/d", "several hosts"),
            (
                "postgres://u@h/d?sslmode=allow",
                "sslmode=allow is not one of",
            ),
            (
                "postgres://u@h/d?ssl_mode=require",
                "unknown parameter \"ssl_mode\"",
            ),
            ("postgres://u@h/d?connect_timeout=0", "connect_timeout=0"),
            ("postgres://u@h/d?sslrootcert=", "sslrootcert is empty"),
            (
                "postgres://u@h/d?sslmode=disable&sslrootcert=/ca.pem",
                "with sslmode=disable",
            ),
            ("postgres://u@h/a/b", "is not a database name"),
            ("postgres://u@h/d#x", "fragment"),
            ("postgres://u@h/%FF", "not UTF-8"),
        ] {
            let e = PgConfig::parse(url).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, PgError::BadUrl(_)), "{url}: {e:?}");
            assert!(msg.contains(why), "{url}: {msg}");
            assert!(!msg.contains('\n'), "{url}: one line: {msg}");
        }
    }

    #[test]
    fn the_password_never_shows() {
        let secret = "hunter2-very-secret";
        let c = PgConfig::parse(&format!("postgres://ac7:{secret}@h:1/d?sslmode=require")).unwrap();
        for shown in [format!("{c:?}"), c.to_string(), c.redacted()] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert_eq!(c.redacted(), "postgres://ac7:***@h:1/d?sslmode=require");
        for url in [
            format!("postgres://ac7:{secret}@h:bad/d"),
            format!("postgres://ac7:{secret}@h/d?sslmode=nope"),
            format!("postgres://ac7:{secret}@h/d?x=1"),
            format!("postgres://ac7:{secret}@h"),
            format!("postgres://ac7:{secret}%FF@h/d"),
            format!("pg://ac7:{secret}@h/d"),
        ] {
            let e = PgConfig::parse(&url).unwrap_err();
            assert!(!e.to_string().contains(secret), "{e}");
            assert!(!format!("{e:?}").contains(secret), "{e:?}");
        }
    }
}
