//! What the runners and the operator verbs share to talk to a broker: the default URL and its
//! check ([`DEFAULT_URL`], [`broker_url`]), the HTTP client ([`BrokerClient`], which fails over
//! between replicas), the token watch that notices a revoked token ([`token_watch`]), and which
//! token a verb uses, with the store `ac7 connect` writes ([`tokens`]).
//!
//! Nothing here is a verb: `ac7 connect`, the runners and the operator verbs are built on it,
//! and it depends on none of them.

pub mod broker;
pub(crate) mod plain;
pub mod token_watch;
pub mod tokens;

pub use broker::{BriefingError, BrokerClient, TransportError};

/// The broker every verb talks to when neither `--url` nor `AC7_URL` says otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8717";

/// Checks a broker URL (`--url` / `AC7_URL`): absolute, `http` or `https`, with a host.
pub fn broker_url(s: &str) -> Result<String, String> {
    let fail = |why: &str| {
        Err(format!(
            "invalid broker URL '{s}': {why}; expected http://HOST:PORT such as {DEFAULT_URL}"
        ))
    };
    if !s.contains("://") {
        return fail(&format!("no scheme (did you mean http://{s}?)"));
    }
    match reqwest::Url::parse(s) {
        Err(err) => fail(&err.to_string()),
        Ok(url) if !matches!(url.scheme(), "http" | "https") => fail(&format!(
            "the scheme must be http or https, not {}",
            url.scheme()
        )),
        Ok(url) if url.host_str().is_none_or(str::is_empty) => fail("no host"),
        Ok(_) => Ok(s.to_owned()),
    }
}

/// A request to the broker at `base` that got no answer: a certificate this client refused
/// is named as such (and `AC7_CA_CERT`, see [`crate::sys::tls_client::certificate_problem`]),
/// anything else asks whether the broker runs.
pub fn cannot_reach(base: &str, error: reqwest::Error) -> anyhow::Error {
    match crate::sys::tls_client::certificate_problem(&error) {
        Some(problem) => anyhow::anyhow!("cannot connect to the broker at {base}: {problem}"),
        None => anyhow::Error::new(error).context(format!(
            "cannot reach the broker at {base} (is `ac7 serve` running?)"
        )),
    }
}
