//! The runner's trace host: a loopback proxy that decrypts the agent's model
//! API traffic with a per-session CA, turns each exchange into an activity event, and leaves
//! everything else alone.
//!
//! - [`ca`]: the session CA and its per-host leaves; the CA file on disk (0600, removed on exit);
//! - [`proxy`]: the proxy (MITM for model hosts, raw tunnel for the rest, plain `http://`
//!   forwarding, a per-session secret);
//! - [`endpoint`]: the model endpoint the agent is configured with (a gateway named by
//!   `ANTHROPIC_BASE_URL` or Codex's provider `base_url`), traced like the model hosts;
//! - [`env`](mod@env): what the agent's command gets in its environment.
//!
//! Which runners trace: `ac7 claude-code` and `ac7 codex` by default (`--no-trace` turns it off);
//! `ac7 run -- <cmd>` only with `--trace` (an arbitrary command may not honour, or may break on,
//! a proxy; it gets the Node variables). A trace host that fails to start is one warning, and the
//! agent runs untraced, with no environment changes.
//!
//! `--unsafe-tls` stops the proxy from verifying the model hosts' certificates (for a TLS-
//! inspecting corporate proxy in front of them whose CA is not at hand — prefer `AC7_CA_CERT`);
//! the runner prints a boxed warning. The agent's own TLS checks are unchanged.

pub mod ca;
pub mod endpoint;
pub mod env;
pub mod proxy;

use std::path::PathBuf;
use std::sync::Arc;

pub use endpoint::ModelEndpoint;
pub use env::{AgentEnv, AgentKind};
pub use proxy::{TraceProxy, TraceSink};

use ca::{CaFile, TraceCa};

use super::activity::ActivityHandle;
use ac7_protocol::trace::activity::ActivityEvent;

/// The proxy's findings go to the activity pipeline: each request sent counts as an LLM call in
/// flight under its connection id (the busy flag), each finished exchange ends one and is uploaded.
impl TraceSink for ActivityHandle {
    fn request_sent(&self, conn: u64) {
        self.llm_started(conn);
    }

    fn exchange(&self, conn: u64, event: ActivityEvent) {
        self.llm_finished(conn);
        self.record(event);
    }
}

/// The tracing flags of `ac7 claude-code` and `ac7 codex`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TraceArgs {
    /// Do not trace the agent's model API calls (no proxy, no CA, no environment changes).
    #[arg(long)]
    pub no_trace: bool,
    /// Do not verify the model API hosts' TLS certificates in the trace proxy. Unsafe: anyone
    /// on the network path can read and change the agent's model traffic.
    #[arg(long)]
    pub unsafe_tls: bool,
}

/// A running trace host: the proxy and the CA file. Its findings go to the runner's activity
/// pipeline, which must be shut down after [`TraceHost::close`].
#[derive(Debug)]
pub struct TraceHost {
    proxy: Option<TraceProxy>,
    ca_file: CaFile,
    bundle: Option<CaFile>,
    env: AgentEnv,
}

/// What the runner says about a model endpoint the agent reaches without the proxy.
fn bypass_warning(endpoint: &ModelEndpoint, no_proxy_entry: &str) -> String {
    format!(
        "the model endpoint {} ({}) is reached without the trace proxy (NO_PROXY has {no_proxy_entry}{}): its exchanges cannot be traced, and the member is not shown busy while it waits for them",
        endpoint.url,
        endpoint.source,
        if ["localhost", "127.0.0.1", "::1"].contains(&no_proxy_entry) {
            ", which the runner always adds for loopback"
        } else {
            ""
        }
    )
}

fn temp_dir() -> PathBuf {
    std::env::temp_dir()
}

impl TraceHost {
    /// Generates the CA, writes its file, starts the proxy; exchanges go to `activity`. The
    /// model `endpoints` the agent is configured with are traced too, except those it reaches
    /// without the proxy (matched by `NO_PROXY`), each of which is one warning on stderr.
    pub async fn start(
        kind: AgentKind,
        unsafe_tls: bool,
        activity: ActivityHandle,
        endpoints: Vec<ModelEndpoint>,
    ) -> Result<Self, String> {
        let upstream_override = match std::env::var(proxy::UPSTREAM_ENV) {
            Ok(text) => proxy::parse_upstream_override(&text)?,
            Err(_) => Default::default(),
        };
        let agent_ca = env::agent_ca(kind);
        let upstream_tls = proxy::upstream_tls(unsafe_tls, agent_ca.as_deref())?;
        let ca = Arc::new(TraceCa::generate().map_err(|e| e.to_string())?);
        let dir = temp_dir();
        let ca_file = ca.write_pem(&dir).map_err(|e| e.to_string())?;
        // What the agent trusts besides its roots: the session CA, after the CA it was given.
        let mut pem = match kind {
            AgentKind::Node => Vec::new(),
            AgentKind::Codex => env::system_bundle().unwrap_or_default(),
        };
        if let Some(agent_ca) = &agent_ca {
            if !pem.is_empty() && !pem.ends_with(b"\n") {
                pem.push(b'\n');
            }
            pem.extend_from_slice(agent_ca);
        }
        let bundle = if pem.is_empty() {
            None
        } else {
            if !pem.ends_with(b"\n") {
                pem.push(b'\n');
            }
            pem.extend_from_slice(ca.pem().as_bytes());
            Some(
                CaFile::create(&dir, super::leftovers::BUNDLE_PREFIX, &pem)
                    .map_err(|e| e.to_string())?,
            )
        };
        let no_proxy = env::agent_no_proxy();
        let endpoints = endpoints
            .into_iter()
            .filter(|e| match e.bypassed_by(&no_proxy) {
                None => true,
                Some(entry) => {
                    eprintln!("ac7: warning: {}", bypass_warning(e, &entry));
                    false
                }
            })
            .collect();
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| format!("no randomness: {e}"))?;
        let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let proxy = TraceProxy::start(
            proxy::ProxyConfig {
                ca,
                upstream_tls,
                upstream_override,
                endpoints,
                secret,
                limits: proxy::ProxyLimits::default(),
            },
            Arc::new(activity),
        )
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
        let trusted = bundle.as_ref().unwrap_or(&ca_file).path().to_owned();
        let env = env::agent_env(kind, &proxy.url(), &trusted);
        if unsafe_tls {
            eprintln!(
                "ac7: ┌──────────────────────────────────────────────────────────────────┐\n\
                 ac7: │ UNSAFE-TLS MODE: the trace proxy does not verify the certificates │\n\
                 ac7: │ of the model API hosts. Anyone on the network path can read and   │\n\
                 ac7: │ change the agent's model traffic. Prefer AC7_CA_CERT=<your CA>.   │\n\
                 ac7: └──────────────────────────────────────────────────────────────────┘"
            );
        }
        Ok(Self {
            proxy: Some(proxy),
            ca_file,
            bundle,
            env,
        })
    }

    /// [`TraceHost::start`], or `None` after one warning on stderr.
    pub async fn start_or_warn(
        kind: AgentKind,
        unsafe_tls: bool,
        activity: ActivityHandle,
        endpoints: Vec<ModelEndpoint>,
    ) -> Option<Self> {
        match Self::start(kind, unsafe_tls, activity, endpoints).await {
            Ok(host) => Some(host),
            Err(e) => {
                eprintln!(
                    "ac7: warning: the trace host failed to start ({e}); the agent runs untraced"
                );
                None
            }
        }
    }

    /// The agent's environment delta.
    pub fn env(&self) -> &AgentEnv {
        &self.env
    }

    /// The CA certificate file.
    pub fn ca_path(&self) -> &std::path::Path {
        self.ca_file.path()
    }

    /// Stops the proxy (unfinished exchanges are reported request-only, before the pipeline
    /// drains) and removes the files.
    pub async fn close(mut self) {
        if let Some(proxy) = self.proxy.take() {
            proxy.close().await;
        }
        self.ca_file.close();
        if let Some(bundle) = &mut self.bundle {
            bundle.close();
        }
    }
}
