//! The environment the agent gets when it is traced (unlike the TypeScript runner, Codex
//! does not get `SSL_CERT_FILE`).
//!
//! | Variable | claude-code (and `ac7 run --trace`) | codex |
//! |---|---|---|
//! | `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` | the proxy URL, with its secret | same |
//! | `NO_PROXY` | `$NO_PROXY` (or `$no_proxy`) + `localhost,127.0.0.1,::1` | same |
//! | `NODE_USE_ENV_PROXY` | `1` | — |
//! | `NODE_EXTRA_CA_CERTS` | the CA file (Node *adds* it to its roots); when the runner was given one, a bundle: that file + the CA | — |
//! | `CODEX_CA_CERTIFICATE` | — | a bundle: the system roots (+ the runner's `CODEX_CA_CERTIFICATE`) + the CA |
//! | `NODE_TLS_REJECT_UNAUTHORIZED` | not set (`--unsafe-tls` acts in the proxy) | not set |
//!
//! Lowercase `https_proxy`, `http_proxy`, `all_proxy` are removed, so a tool that prefers them
//! cannot bypass the proxy with a stale value. `SSL_CERT_FILE` is never set: it would replace
//! the trust store of every command the agent runs. `CODEX_CA_CERTIFICATE` replaces Codex's own
//! roots, hence the bundle, which keeps the system's. The runner's own environment is untouched:
//! this is a delta applied to the agent's command only.

use std::path::Path;

/// The variables the agent's command gets, and those it loses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentEnv {
    /// Set (overriding inherited values).
    pub set: Vec<(String, String)>,
    /// Removed.
    pub remove: Vec<String>,
}

impl AgentEnv {
    /// Applies the delta to a command.
    pub fn apply(&self, command: &mut tokio::process::Command) {
        for name in &self.remove {
            command.env_remove(name);
        }
        for (name, value) in &self.set {
            command.env(name, value);
        }
    }
}

/// Which agent the environment is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    /// Claude Code, or any Node program (`ac7 run --trace`).
    Node,
    /// Codex.
    Codex,
}

fn no_proxy(inherited: Option<String>) -> String {
    let mut list: Vec<String> = inherited
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    for local in ["localhost", "127.0.0.1", "::1"] {
        if !list.iter().any(|s| s == local) {
            list.push(local.to_owned());
        }
    }
    list.join(",")
}

/// The `NO_PROXY` the agent gets: `$NO_PROXY` (or `$no_proxy`) + the loopback names.
pub fn agent_no_proxy() -> String {
    let inherited = std::env::var("NO_PROXY")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| std::env::var("no_proxy").ok());
    no_proxy(inherited)
}

/// The delta for `kind`: `proxy_url` with its credentials, `ca` the file the agent trusts
/// (the CA for Node, the bundle for Codex).
pub fn agent_env(kind: AgentKind, proxy_url: &str, ca: &Path) -> AgentEnv {
    let mut set: Vec<(String, String)> = ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"]
        .iter()
        .map(|name| ((*name).to_owned(), proxy_url.to_owned()))
        .collect();
    set.push(("NO_PROXY".into(), agent_no_proxy()));
    let ca = ca.to_string_lossy().into_owned();
    let remove: Vec<String> = ["https_proxy", "http_proxy", "all_proxy", "no_proxy"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    match kind {
        AgentKind::Node => {
            set.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
            set.push(("NODE_EXTRA_CA_CERTS".into(), ca));
        }
        AgentKind::Codex => {
            set.push(("CODEX_CA_CERTIFICATE".into(), ca));
        }
    }
    AgentEnv { set, remove }
}

/// The variable naming the CA file an agent of `kind` trusts besides (Node) or instead of
/// (Codex) its roots.
pub fn agent_ca_var(kind: AgentKind) -> &'static str {
    match kind {
        AgentKind::Node => "NODE_EXTRA_CA_CERTS",
        AgentKind::Codex => "CODEX_CA_CERTIFICATE",
    }
}

/// The PEM of the CA file the agent was given in [`agent_ca_var`] (the runner's environment,
/// which the agent inherits), if any. The trace host keeps it in what the agent trusts, and the
/// proxy trusts it for the agent's upstreams. A file that cannot be read is one warning.
pub fn agent_ca(kind: AgentKind) -> Option<Vec<u8>> {
    let var = agent_ca_var(kind);
    let path = std::env::var_os(var).filter(|p| !p.is_empty())?;
    match std::fs::read(&path) {
        Ok(pem) if !pem.is_empty() => Some(pem),
        Ok(_) => None,
        Err(e) => {
            eprintln!(
                "ac7: warning: {var}={} cannot be read ({e}); the agent is traced without it",
                Path::new(&path).display()
            );
            None
        }
    }
}

/// The system's CA bundle: `$SSL_CERT_FILE`, else the first of the usual places that exists.
pub fn system_bundle() -> Option<Vec<u8>> {
    let env = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty());
    let candidates = env.into_iter().map(std::path::PathBuf::from).chain(
        [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/ca-bundle.pem",
            "/etc/ssl/cert.pem",
        ]
        .iter()
        .map(std::path::PathBuf::from),
    );
    candidates
        .filter_map(|p| std::fs::read(p).ok())
        .find(|pem| !pem.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_keeps_the_users_entries_and_adds_loopback() {
        assert_eq!(no_proxy(None), "localhost,127.0.0.1,::1");
        assert_eq!(
            no_proxy(Some("corp.example, localhost".into())),
            "corp.example,localhost,127.0.0.1,::1"
        );
    }

    #[test]
    fn codex_never_gets_a_replacement_trust_store_for_its_commands() {
        let env = agent_env(
            AgentKind::Codex,
            "http://ac7:s@127.0.0.1:1",
            Path::new("/b.pem"),
        );
        let names: Vec<&str> = env.set.iter().map(|(n, _)| n.as_str()).collect();
        assert!(!names.contains(&"SSL_CERT_FILE"), "{names:?}");
        assert!(
            !names.contains(&"NODE_TLS_REJECT_UNAUTHORIZED"),
            "{names:?}"
        );
        assert!(names.contains(&"CODEX_CA_CERTIFICATE"));
        assert!(names.contains(&"HTTPS_PROXY") && names.contains(&"ALL_PROXY"));
        let node = agent_env(
            AgentKind::Node,
            "http://ac7:s@127.0.0.1:1",
            Path::new("/c.pem"),
        );
        assert!(
            node.set
                .contains(&("NODE_USE_ENV_PROXY".into(), "1".into()))
        );
        assert!(
            node.set
                .contains(&("NODE_EXTRA_CA_CERTS".into(), "/c.pem".into()))
        );
        assert!(!node.set.iter().any(|(n, _)| n == "SSL_CERT_FILE"));
    }
}
