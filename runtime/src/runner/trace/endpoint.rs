//! The model endpoint the agent is configured with, when it is not one of the default model
//! hosts: a gateway or proxy in front of the model API, named by `ANTHROPIC_BASE_URL` (Claude
//! Code, `ac7 run --trace`) or by the `base_url` of Codex's model provider. Its host and port
//! are traced like the default model hosts: `https://` exchanges are decrypted, plain `http://`
//! ones are read as the proxy forwards them, and both are decoded as the API the agent speaks
//! there.
//!
//! An endpoint the agent reaches without the proxy — one matched by `NO_PROXY`, which always
//! holds the loopback names — cannot be traced: the runner says so once when the trace host
//! starts.

use ac7_protocol::trace::activity::LlmApi;

/// A model endpoint the agent is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEndpoint {
    /// Where the setting came from, for messages (`ANTHROPIC_BASE_URL`,
    /// `model_providers.<id>.base_url`, …).
    pub source: String,
    /// The URL as configured.
    pub url: String,
    /// Lowercase, without brackets for IPv6.
    pub host: String,
    /// The port (the scheme's default when the URL has none).
    pub port: u16,
    /// `https` (decrypted) or plain `http`.
    pub tls: bool,
    /// The API the agent speaks there.
    pub api: LlmApi,
}

impl ModelEndpoint {
    /// The endpoint at `url`, set by `source`, speaking `api`. `Err` says why it is not one.
    pub fn parse(source: &str, url: &str, api: LlmApi) -> Result<Self, String> {
        let parsed = reqwest::Url::parse(url.trim())
            .map_err(|e| format!("{source}={url} is not a URL ({e})"))?;
        let tls = match parsed.scheme() {
            "https" => true,
            "http" => false,
            other => {
                return Err(format!(
                    "{source}={url}: the scheme {other}:// is neither https nor http"
                ));
            }
        };
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{source}={url} has no host"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let port = parsed
            .port_or_known_default()
            .ok_or_else(|| format!("{source}={url} has no port"))?;
        Ok(Self {
            source: source.to_owned(),
            url: url.trim().to_owned(),
            host,
            port,
            tls,
            api,
        })
    }

    /// The `NO_PROXY` entry (of the comma-separated `no_proxy`) that makes the agent reach this
    /// endpoint directly, not through the proxy; `None` when it goes through the proxy.
    ///
    /// As Node (undici) and reqwest read it: `*` matches every host; an entry matches its host
    /// name and the names under it (a leading `.` or `*.` is dropped), an IP address matches
    /// itself, a `host:port` entry that port only.
    pub fn bypassed_by(&self, no_proxy: &str) -> Option<String> {
        no_proxy
            .split([',', ' '])
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .find(|entry| self.matches(entry))
            .map(str::to_owned)
    }

    fn matches(&self, entry: &str) -> bool {
        if entry == "*" {
            return true;
        }
        let entry = entry.to_ascii_lowercase();
        let (name, port) = split_port(&entry);
        if port.is_some_and(|p| p != self.port) {
            return false;
        }
        let name = name
            .strip_prefix("*.")
            .or_else(|| name.strip_prefix('.'))
            .unwrap_or(name)
            .trim_end_matches('.');
        if name.is_empty() {
            return false;
        }
        self.host == name
            || (self.host.parse::<std::net::IpAddr>().is_err()
                && self
                    .host
                    .strip_suffix(name)
                    .is_some_and(|rest| rest.ends_with('.')))
    }
}

/// `name:port`, `[v6]:port`, `[v6]`, `v6` or `name` → (name without brackets, port).
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((v6, tail)) => (v6, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (rest, None),
        };
    }
    match entry.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => match port.parse() {
            Ok(port) => (name, Some(port)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

/// The endpoint Claude Code (and a Node agent under `ac7 run --trace`) sends its model calls
/// to: `ANTHROPIC_BASE_URL` when set to anything but the default host. `Err` when it is set but
/// is no endpoint.
pub fn anthropic(base_url: Option<&str>) -> Result<Option<ModelEndpoint>, String> {
    let Some(url) = base_url.map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let endpoint = ModelEndpoint::parse("ANTHROPIC_BASE_URL", url, LlmApi::AnthropicMessages)?;
    // The default hosts are traced already, over either scheme.
    Ok((!super::proxy::is_model_host(&endpoint.host)).then_some(endpoint))
}

/// The endpoints of a Node agent (Claude Code, `ac7 run --trace`): [`anthropic`] of the
/// runner's `ANTHROPIC_BASE_URL`, which the agent inherits, and of each `ANTHROPIC_BASE_URL` in
/// the `env` of Claude Code's `settings` (Claude Code puts those into its environment over the
/// inherited one). Each that is no endpoint is one warning on stderr.
pub(crate) fn node_endpoints(
    settings: &crate::runner::claude_settings::ClaudeSettings,
) -> Vec<ModelEndpoint> {
    let inherited = std::env::var("ANTHROPIC_BASE_URL").ok();
    let mut endpoints: Vec<ModelEndpoint> =
        or_warn(anthropic(inherited.as_deref()).map(|e| e.into_iter().collect()));
    for (path, url) in settings.env_values("ANTHROPIC_BASE_URL") {
        let found = anthropic(Some(&url)).map(|e| {
            e.map(|mut e| {
                e.source = format!("ANTHROPIC_BASE_URL in {}", path.display());
                e
            })
            .into_iter()
            .collect()
        });
        for endpoint in or_warn(found) {
            if !endpoints
                .iter()
                .any(|e| e.host == endpoint.host && e.port == endpoint.port)
            {
                endpoints.push(endpoint);
            }
        }
    }
    endpoints
}

/// The endpoints, or none after one warning on stderr saying why.
pub fn or_warn(endpoints: Result<Vec<ModelEndpoint>, String>) -> Vec<ModelEndpoint> {
    endpoints.unwrap_or_else(|e| {
        eprintln!("ac7: warning: {e}; the agent's calls to it cannot be traced");
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &str) -> ModelEndpoint {
        ModelEndpoint::parse("ANTHROPIC_BASE_URL", url, LlmApi::AnthropicMessages).unwrap()
    }

    #[test]
    fn urls_give_host_port_and_scheme() {
        let e = endpoint("https://Gateway.Example.com/anthropic");
        assert_eq!(
            (e.host.as_str(), e.port, e.tls),
            ("gateway.example.com", 443, true)
        );
        let e = endpoint("http://10.0.0.5:8080");
        assert_eq!((e.host.as_str(), e.port, e.tls), ("10.0.0.5", 8080, false));
        let e = endpoint("https://[::1]:8443/v1");
        assert_eq!((e.host.as_str(), e.port), ("::1", 8443));
        for bad in ["gateway:8080", "ftp://gateway/", "not a url", "https://"] {
            assert!(
                ModelEndpoint::parse("X", bad, LlmApi::AnthropicMessages).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn no_proxy_entries_decide_what_bypasses_the_proxy() {
        let loopback = "localhost,127.0.0.1,::1";
        assert_eq!(
            endpoint("http://127.0.0.1:4000").bypassed_by(loopback),
            Some("127.0.0.1".into())
        );
        assert_eq!(
            endpoint("http://localhost:4000").bypassed_by(loopback),
            Some("localhost".into())
        );
        assert_eq!(
            endpoint("https://[::1]:4000").bypassed_by(loopback),
            Some("::1".into())
        );
        assert_eq!(
            endpoint("http://127.0.0.2:4000").bypassed_by(loopback),
            None
        );
        assert_eq!(
            endpoint("https://gw.corp.example").bypassed_by(loopback),
            None
        );
        let corp = "corp.example, *.internal,.lan,other:8080";
        assert_eq!(
            endpoint("https://gw.corp.example").bypassed_by(corp),
            Some("corp.example".into())
        );
        assert_eq!(endpoint("https://notcorp.example").bypassed_by(corp), None);
        assert_eq!(
            endpoint("https://llm.internal").bypassed_by(corp),
            Some("*.internal".into())
        );
        assert_eq!(
            endpoint("http://box.lan:80").bypassed_by(corp),
            Some(".lan".into())
        );
        assert_eq!(endpoint("http://other:8081").bypassed_by(corp), None);
        assert_eq!(
            endpoint("http://other:8080").bypassed_by(corp),
            Some("other:8080".into())
        );
        assert_eq!(
            endpoint("https://anything").bypassed_by("*"),
            Some("*".into())
        );
    }

    #[test]
    fn only_a_base_url_off_the_default_hosts_is_an_endpoint() {
        assert_eq!(anthropic(None), Ok(None));
        assert_eq!(anthropic(Some(" ")), Ok(None));
        assert_eq!(anthropic(Some("https://api.anthropic.com")), Ok(None));
        let gw = anthropic(Some("https://gw.example:8443/x"))
            .unwrap()
            .unwrap();
        assert_eq!((gw.host.as_str(), gw.port), ("gw.example", 8443));
        assert_eq!(anthropic(Some("http://api.anthropic.com")), Ok(None));
        assert!(anthropic(Some("gw.example")).is_err());
    }
}
