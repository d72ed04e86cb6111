//! `ac7 codex`: Codex as a team member, driven through `codex app-server`.
//!
//! The runner core (briefing, IPC socket and tools, objectives tracker, live stream) is the same as
//! for `ac7 claude-code`; what differs:
//! - the bridge is registered in an ephemeral `CODEX_HOME`
//!   (`$XDG_CACHE_HOME/ac7/codex/ac7-codex-<pid>-<12 hex>` or `~/.cache/ac7/codex/…`, never
//!   under `$TMPDIR`, where codex refuses to install helpers; 0700), with a 0600 `config.toml`
//!   (`[mcp_servers.ac7]` = this executable + `mcp-bridge`, tool approval `approve`,
//!   `AC7_RUNNER_SOCKET` in its env) and `auth.json` linked from the user's Codex home when
//!   present; the directory is removed on every exit path, and after a `kill -9` by the next
//!   runner that starts ([`super::leftovers`]);
//! - the user's Codex home is `$CODEX_HOME` if set, else `~/.codex`. Its `config.toml` (model,
//!   `model_provider`, `[model_providers.*]`, profiles, other MCP servers — everything) is merged
//!   into the ephemeral one; ours wins for `mcp_servers.ac7` only. `--profile NAME` layers the
//!   user's `NAME.config.toml` over it first, as `codex --profile` does (tables merge key by key,
//!   other values replace); `codex app-server` itself refuses `--profile` (and codex 0.169 no
//!   longer reads `[profiles.*]`), so the runner does the layering. A user file that is not valid
//!   TOML stops the start (exit 2, naming the file) before anything is created. `-c key=value`
//!   (repeatable) goes to `codex app-server` as is, and wins over both files;
//! - the briefing prose goes in as `developerInstructions` of `thread/start`;
//! - events become `<channel>` texts delivered as `turn/start` (idle, or `systemError` after a
//!   failed turn) or `turn/steer` (active) by [`CodexClient`]; when codex refuses an event, or a
//!   turn carrying it fails, its sender gets a DM from this member saying which messages and why;
//!   a failed turn is also recorded as a `turn_failed` activity event;
//! - app-server runs in a process group of its own and dies with the runner, even of `kill -9`
//!   ([`super::lifecycle`]); the runner keeps the terminal;
//! - SIGINT/SIGTERM end the session: the active turn is interrupted, app-server's stdin is
//!   closed and the signal goes to its process group, which gets SIGKILL if it has not ended
//!   within `--kill-grace` (default 10 s); the runner exits 130 / 143. Any other end closes
//!   stdin and waits as long before SIGKILL;
//! - a revoked token ([`super::revocation`]) is a turn telling codex, one line on stderr, then the
//!   same teardown with SIGTERM, and exit [`super::revocation::EXIT_REVOKED`].
//!
//! `--doctor` starts the same set-up, checks that Codex starts the `ac7` MCP server, lists its
//! tools and can call `roster` through it, prints a report and exits 0 (all good) or 1.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ac7_protocol::dialect::codex::{
    BUNDLE_WINDOW, CodexClient, CodexConfig, CodexEvent, CodexOutput, CodexRequestError,
};
use ac7_protocol::session::runner::BridgePolicy;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::turns::{Closing, End, TurnLoop, finish, read_some, turn_failed};
use super::{RunnerOpts, StartError, doctor, locate_binary, start_core, start_failed};
use crate::dialects::mcp_bridge::{RUNNER_SOCKET_ENV, STDIO_HANDOFF_ENV};
use crate::sys::clock::sleep_until;

/// `ac7 codex`.
#[derive(Debug, Clone, clap::Args)]
pub struct CodexArgs {
    /// Runner options.
    #[command(flatten)]
    pub opts: RunnerOpts,
    /// The Codex thread's working directory (default: the current directory).
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// The model for the thread.
    #[arg(long)]
    pub model: Option<String>,
    /// A Codex config override, passed to codex as is (repeatable), e.g. `-c model="o3"`.
    #[arg(short = 'c', long = "config", value_name = "KEY=VALUE", value_parser = parse_override)]
    pub config: Vec<String>,
    /// A Codex profile: `NAME.config.toml` in your Codex home, layered over its `config.toml`.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Check the set-up (Codex starts the ac7 MCP server, lists its tools, runs `roster`) and exit.
    #[arg(long)]
    pub doctor: bool,
    /// Tracing of Codex's model API calls.
    #[command(flatten)]
    pub tracing: super::trace::TraceArgs,
    /// Milliseconds events are gathered into one turn after the first (default 200). Hidden:
    /// for tests that need a burst of pushes in one delivery on a loaded machine.
    #[arg(long, hide = true, value_name = "MS")]
    pub bundle_window_ms: Option<u64>,
}

/// How long `--doctor` waits for each step.
const DOCTOR_STEP: Duration = doctor::STEP;

fn parse_override(value: &str) -> Result<String, String> {
    match value.split_once('=') {
        Some((key, _)) if !key.trim().is_empty() => Ok(value.to_owned()),
        _ => Err(format!(
            "expected KEY=VALUE (a dotted Codex config key, a TOML value), got `{value}`"
        )),
    }
}

/// Runs `ac7 codex`; returns the exit code.
pub fn codex(args: CodexArgs) -> i32 {
    let codex = match locate_codex() {
        Ok(path) => path,
        Err(e) => return start_failed(&e),
    };
    let user = match UserCodex::load(args.profile.as_deref()) {
        Ok(user) => user,
        Err(e) => return start_failed(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return start_failed(&StartError::System(format!("cannot start: {e}"))),
    };
    runtime.block_on(run(args, codex, user))
}

fn locate_codex() -> Result<PathBuf, StartError> {
    locate_binary(
        "CODEX_PATH",
        "codex",
        "codex is not on PATH: install the OpenAI Codex CLI (npm i -g @openai/codex), or set CODEX_PATH",
    )
}

/// The ephemeral `CODEX_HOME`; removed when dropped.
struct CodexHome {
    dir: PathBuf,
}

impl Drop for CodexHome {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            eprintln!(
                "ac7 codex: warning: could not remove {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// `config.toml` registering the bridge.
pub fn config_toml(exe: &Path, socket: &Path) -> String {
    format!(
        "# Written by ac7 codex; this whole CODEX_HOME is removed when the runner exits.\n\n\
         [mcp_servers.ac7]\n\
         command = {}\n\
         args = [\"mcp-bridge\"]\n\
         enabled = true\n\
         default_tools_approval_mode = \"approve\"\n\n\
         [mcp_servers.ac7.env]\n\
         {RUNNER_SOCKET_ENV} = {}\n\
         {STDIO_HANDOFF_ENV} = \"1\"\n",
        toml_string(&exe.to_string_lossy()),
        toml_string(&socket.to_string_lossy())
    )
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The user's own Codex set-up, read before anything is created.
#[derive(Debug, Default)]
struct UserCodex {
    /// `$CODEX_HOME`, else `~/.codex`.
    home: Option<PathBuf>,
    /// Its `config.toml`, parsed.
    config: Option<toml_edit::DocumentMut>,
    /// The `--profile` layer, parsed.
    profile: Option<toml_edit::DocumentMut>,
}

impl UserCodex {
    fn load(profile: Option<&str>) -> Result<Self, StartError> {
        let home = match std::env::var_os("CODEX_HOME").filter(|v| !v.is_empty()) {
            Some(home) => Some(PathBuf::from(home)),
            None => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".codex")),
        };
        let Some(home) = home else {
            return match profile {
                Some(name) => Err(StartError::Setup(format!(
                    "--profile {name}: neither CODEX_HOME nor HOME is set, so there is no Codex home to read it from"
                ))),
                None => Ok(Self::default()),
            };
        };
        let config = read_toml(&home.join("config.toml"))?;
        let profile = match profile {
            Some(name) => {
                if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                    return Err(StartError::Setup(format!(
                        "--profile {name:?}: a profile is a plain name (codex reads NAME.config.toml in your Codex home)"
                    )));
                }
                let path = home.join(format!("{name}.config.toml"));
                Some(read_toml(&path)?.ok_or_else(|| {
                    StartError::Setup(format!(
                        "--profile {name}: {} does not exist (codex profiles are NAME.config.toml files in your Codex home)",
                        path.display()
                    ))
                })?)
            }
            None => None,
        };
        Ok(Self {
            home: Some(home),
            config,
            profile,
        })
    }
}

/// A user's TOML file, parsed; `None` when it does not exist.
fn read_toml(path: &Path) -> Result<Option<toml_edit::DocumentMut>, StartError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(StartError::Setup(format!(
                "cannot read your Codex config {}: {e}",
                path.display()
            )));
        }
    };
    text.parse::<toml_edit::DocumentMut>()
        .map(Some)
        .map_err(|e| {
            StartError::Setup(format!(
                "your Codex config {} is not valid TOML (fix it, or point CODEX_HOME elsewhere):\n{e}",
                path.display()
            ))
        })
}

/// Puts `top` over `base` as codex layers a profile: tables merge key by key, anything else
/// replaces. `inline` says whether `base` sits inside an inline table (where tables must be
/// written inline too).
fn layer(base: &mut toml_edit::Item, top: &toml_edit::Item, inline: bool) {
    let fit = |item: toml_edit::Item, inline: bool| {
        if inline {
            item.into_value()
                .map_or_else(|item| item, toml_edit::Item::Value)
        } else {
            item
        }
    };
    let base_inline = inline || base.is_inline_table();
    match (base.as_table_like_mut(), top.as_table_like()) {
        (Some(base), Some(top)) => {
            for (key, item) in top.iter() {
                match base.get_mut(key) {
                    Some(existing) => layer(existing, item, base_inline),
                    None => {
                        base.insert(key, fit(item.clone(), base_inline));
                    }
                }
            }
        }
        _ => *base = fit(top.clone(), inline),
    }
}

/// The user's `config.toml` (with the `--profile` layer over it) and our `[mcp_servers.ac7]` in
/// place of theirs (if any); every other key, table, comment and MCP server of theirs is kept.
fn merge_config(
    user: Option<&toml_edit::DocumentMut>,
    profile: Option<&toml_edit::DocumentMut>,
    exe: &Path,
    socket: &Path,
) -> Result<String, StartError> {
    let ours = config_toml(exe, socket);
    if user.is_none() && profile.is_none() {
        return Ok(ours);
    }
    let ours_doc: toml_edit::DocumentMut = ours.parse().expect("config_toml writes valid TOML");
    let entry = ours_doc["mcp_servers"]["ac7"].clone();
    let mut doc = user.cloned().unwrap_or_default();
    if let Some(profile) = profile {
        layer(doc.as_item_mut(), profile.as_item(), false);
    }
    let servers = doc.entry("mcp_servers").or_insert_with(toml_edit::table);
    if let Some(inline) = servers.as_inline_table().cloned() {
        *servers = toml_edit::Item::Table(inline.into_table());
    }
    let Some(servers) = servers.as_table_mut() else {
        return Err(StartError::Setup(
            "mcp_servers in your Codex config is not a table: cannot add the ac7 server to it"
                .into(),
        ));
    };
    servers.set_implicit(true);
    servers.set_dotted(false);
    servers.remove("ac7");
    servers.insert("ac7", entry);
    let header = ours.split("\n\n").next().unwrap_or_default();
    let merged = format!(
        "{header}\n# Merged with your Codex config.toml; ac7 owns [mcp_servers.ac7].\n\n{doc}"
    );
    // Whatever the user's layout, what we write must parse and hold our entry.
    let check: toml_edit::DocumentMut = merged.parse().map_err(|e| {
        StartError::Bug(format!(
            "cannot merge your Codex config with ours (please report this): {e}"
        ))
    })?;
    if check["mcp_servers"]["ac7"].to_string() != ours_doc["mcp_servers"]["ac7"].to_string() {
        return Err(StartError::Bug(
            "cannot merge your Codex config with ours: [mcp_servers.ac7] did not survive (please report this)".into(),
        ));
    }
    Ok(merged)
}

/// The model endpoint Codex sends its model calls to, when it is not a default model host: the
/// `base_url` of the model provider in effect (`model_provider`, default `openai`) in the
/// user's config with the `--profile` layer and the `-c` overrides over it; for the built-in
/// `openai` provider without one, `openai_base_url`, else `$OPENAI_BASE_URL`. `Err` names a
/// `base_url` that is not an endpoint.
fn model_endpoints(
    user: &UserCodex,
    overrides: &[String],
    openai_base_url_env: Option<&str>,
) -> Result<Vec<super::trace::ModelEndpoint>, String> {
    use ac7_protocol::trace::activity::LlmApi;
    let mut doc = user.config.clone().unwrap_or_default();
    if let Some(profile) = &user.profile {
        layer(doc.as_item_mut(), profile.as_item(), false);
    }
    for value in overrides {
        let Some((key, raw)) = value.split_once('=') else {
            continue;
        };
        // As codex reads `-c`: a TOML value, else the text as a string.
        let layer_doc = format!("{} = {}", key.trim(), raw.trim())
            .parse::<toml_edit::DocumentMut>()
            .or_else(|_| format!("{} = {}", key.trim(), toml_string(raw.trim())).parse());
        if let Ok(over) = layer_doc {
            layer(doc.as_item_mut(), over.as_item(), false);
        }
    }
    let provider = doc
        .get("model_provider")
        .and_then(|v| v.as_str())
        .unwrap_or("openai")
        .to_owned();
    let configured = doc
        .get("model_providers")
        .and_then(|p| p.get(&provider))
        .and_then(|p| p.get("base_url"))
        .and_then(|v| v.as_str())
        .map(|url| {
            (
                format!("model_providers.{provider}.base_url"),
                url.to_owned(),
            )
        });
    let base_url = configured.or_else(|| {
        (provider == "openai").then_some(()).and_then(|()| {
            doc.get("openai_base_url")
                .and_then(|v| v.as_str())
                .map(|url| ("openai_base_url".to_owned(), url.to_owned()))
                .or_else(|| {
                    openai_base_url_env
                        .filter(|u| !u.trim().is_empty())
                        .map(|url| ("OPENAI_BASE_URL".to_owned(), url.to_owned()))
                })
        })
    });
    let Some((source, url)) = base_url else {
        return Ok(Vec::new());
    };
    let endpoint = super::trace::ModelEndpoint::parse(&source, &url, LlmApi::OpenaiResponses)?;
    // The default hosts are traced already, over either scheme.
    Ok(if super::trace::proxy::is_model_host(&endpoint.host) {
        Vec::new()
    } else {
        vec![endpoint]
    })
}

/// Where the temporary Codex homes go: `$XDG_CACHE_HOME/ac7/codex`, else `~/.cache/ac7/codex`.
pub(crate) fn homes_dir() -> Option<PathBuf> {
    let cache = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(cache) => PathBuf::from(cache),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(cache.join("ac7/codex"))
}

fn create_home(exe: &Path, socket: &Path, user: &UserCodex) -> Result<CodexHome, StartError> {
    let merged = merge_config(user.config.as_ref(), user.profile.as_ref(), exe, socket)?;
    let parent = homes_dir().ok_or_else(|| {
        StartError::Setup(
            "neither XDG_CACHE_HOME nor HOME is set: nowhere to put CODEX_HOME".into(),
        )
    })?;
    std::fs::create_dir_all(&parent)
        .map_err(|e| StartError::System(format!("cannot create {}: {e}", parent.display())))?;
    let mut nonce = [0u8; super::leftovers::HOME_NONCE_HEX / 2];
    getrandom::fill(&mut nonce)
        .map_err(|e| StartError::System(format!("no randomness for CODEX_HOME: {e}")))?;
    let name: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    // The pid in the name tells the next runner whether this one is still running.
    let dir = parent.join(format!(
        "{}-{}-{name}",
        super::leftovers::CODEX_HOME_PREFIX,
        std::process::id()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| StartError::System(format!("cannot create {}: {e}", dir.display())))?;
    let home = CodexHome { dir };
    let config = home.dir.join("config.toml");
    crate::sys::fsutil::write_atomic(&config, merged.as_bytes())
        .map_err(|e| StartError::System(format!("cannot write {}: {e}", config.display())))?;
    if let Some(user_home) = &user.home {
        let auth = user_home.join("auth.json");
        if auth.is_file() {
            if let Err(e) = std::os::unix::fs::symlink(&auth, home.dir.join("auth.json")) {
                eprintln!("ac7 codex: warning: could not link auth.json: {e}");
            }
        } else {
            eprintln!(
                "ac7 codex: no {}: run `codex login` first so codex can reach OpenAI (not needed for a model provider with its own key in config.toml)",
                auth.display()
            );
        }
    }
    Ok(home)
}

async fn run(args: CodexArgs, codex: PathBuf, user: UserCodex) -> i32 {
    if args.doctor {
        doctor::say("codex", &format!("codex found at {}", codex.display()));
        match doctor::version(&codex).await {
            Ok(v) => doctor::say("codex", &format!("codex version {v}")),
            Err(e) => return i32::from(!doctor::failed("codex", &e)),
        }
    }
    // Codex runs more than one instance of an MCP server (one per thread, more for status
    // listing): every bridge stays attached.
    let core = match start_core(&args.opts, BridgePolicy::AllowMany, !args.doctor, None).await {
        Ok(core) => core,
        Err(e) => return start_failed(&e),
    };
    let (exe, socket) = match core.bridge_command() {
        Ok(c) => c,
        Err(e) => return core.abandon("codex-home-failed", &e).await,
    };
    let home = match create_home(&exe, &socket, &user) {
        Ok(home) => home,
        Err(e) => return core.abandon("codex-home-failed", &e).await,
    };
    let cwd = match args.cwd.clone().map_or_else(std::env::current_dir, Ok) {
        Ok(cwd) => cwd,
        Err(e) => return start_failed(&StartError::System(format!("no working directory: {e}"))),
    };
    let trace = if args.tracing.no_trace || args.doctor {
        None
    } else {
        let openai_base_url = std::env::var("OPENAI_BASE_URL").ok();
        let endpoints = super::trace::endpoint::or_warn(model_endpoints(
            &user,
            &args.config,
            openai_base_url.as_deref(),
        ));
        core.start_trace(
            super::trace::AgentKind::Codex,
            args.tracing.unsafe_tls,
            endpoints,
        )
        .await
    };
    let mut command = tokio::process::Command::new(&codex);
    if let Some(trace) = &trace {
        trace.env().apply(&mut command);
    }
    command.arg("app-server");
    for value in &args.config {
        command.args(["-c", value]);
    }
    command.env("CODEX_HOME", &home.dir).current_dir(&cwd);
    // Codex's own bridges (it may start several) are those in its process tree.
    let (mut child, agent) = match super::turns::spawn_agent(&mut command, args.doctor, &core) {
        Ok(started) => started,
        Err(e) => {
            let e = StartError::System(format!("cannot start {} app-server: {e}", codex.display()));
            return core.abandon("codex-spawn-failed", &e).await;
        }
    };
    super::turns::banner(&core, "codex", &format!("cwd {}", cwd.display()));
    let b = &core.briefing;

    // Live events: rendered here, delivered by the client machine.
    let (notices_tx, mut events, stop_stream) = super::turns::live_events(&core, args.opts.stream);

    let mut client = CodexClient::new(
        CodexConfig {
            client_name: "ac7".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            cwd: cwd.to_string_lossy().into_owned(),
            developer_instructions: b.instructions.clone(),
            model: args.model.clone(),
            bundle_window: args
                .bundle_window_ms
                .map_or(BUNDLE_WINDOW, Duration::from_millis),
        },
        Instant::now().into_std(),
    );
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut doctor = args.doctor.then(Doctor::default);
    let mut lp = match TurnLoop::start(&core) {
        Ok(lp) => lp,
        Err(e) => return start_failed(&e),
    };
    let end = 'session: loop {
        // Act on everything the machine wants, then wait for the next input.
        while let Some(output) = client.poll_output() {
            match output {
                CodexOutput::Transmit(line) => {
                    if let Some(pipe) = stdin.as_mut()
                        && let Err(e) = pipe.write_all(&line).await
                    {
                        break 'session End::Failed(format!("writing to codex failed: {e}"));
                    }
                }
                CodexOutput::Ready { thread_id } => {
                    tracing::info!(thread_id, "codex thread started");
                    match &mut doctor {
                        Some(d) => d.ready(&mut client, &thread_id),
                        None => eprintln!(
                            "ac7 codex: agent connected — Ctrl-C to stop. Direct it with `ac7 push --to {} --body …`",
                            core.briefing.name
                        ),
                    }
                }
                CodexOutput::Failed(reason) => break 'session End::Failed(reason),
                CodexOutput::CloseStdin => stdin = None,
                CodexOutput::Response { id, outcome } => {
                    if let Some(d) = &mut doctor
                        && let Some(ok) = d.response(&mut client, id, outcome)
                    {
                        break 'session End::Doctor(ok);
                    }
                }
                CodexOutput::Undelivered(undelivered) => {
                    lp.undelivered(&core, "codex", undelivered)
                }
                CodexOutput::TurnFailed(failure) => {
                    turn_failed(lp.activity.as_ref(), "codex", failure)
                }
                CodexOutput::Event(event) => log_event(&event),
                other => tracing::warn!(?other, "codex: an output this version does not handle"),
            }
        }
        let deadline = client.poll_timeout().map(Instant::from_std);
        let doctor_deadline = doctor.as_ref().map(|d| d.deadline);
        tokio::select! {
            read = read_some(&mut stdout, &mut lp.buf) => match read {
                Some(n) => client.handle_bytes(&lp.buf[..n], Instant::now().into_std()),
                None => break End::AgentExited,
            },
            Some(text) = events.recv() => client.notify(text, Instant::now().into_std()),
            () = sleep_until(deadline) => client.handle_timeout(Instant::now().into_std()),
            () = sleep_until(doctor_deadline) => break End::Doctor(doctor.as_mut().is_some_and(|d| d.timed_out())),
            n = lp.signals.recv() => break End::Signal(n),
            () = super::lifecycle::token_revoked(lp.token.as_mut()), if lp.revoked_end.is_none() => {
                lp.revoked(&core, &notices_tx);
            }
            () = sleep_until(lp.revoked_end) => break End::Revoked,
        }
    };

    // Teardown: flush what can be delivered, interrupt the turn, close codex's stdin, wait.
    client.shutdown(Instant::now().into_std());
    while let Some(output) = client.poll_output() {
        match output {
            CodexOutput::Transmit(line) => {
                if let Some(pipe) = stdin.as_mut() {
                    let _ = pipe.write_all(&line).await;
                }
            }
            CodexOutput::Undelivered(undelivered) => lp.undelivered(&core, "codex", undelivered),
            CodexOutput::TurnFailed(failure) => turn_failed(lp.activity.as_ref(), "codex", failure),
            CodexOutput::Event(event) => log_event(&event),
            _ => {}
        }
    }
    drop(stdin);
    let code = finish(
        end,
        &mut child,
        &agent,
        Closing {
            command: "codex",
            agent: "codex",
            kill_grace: args.opts.kill_grace,
            notices: lp.notices,
            stop_stream,
            trace,
            activity: core.activity,
            server: core.server,
        },
    )
    .await;
    drop(home);
    code
}

fn log_event(event: &CodexEvent) {
    match event {
        CodexEvent::Dropped { events, reason } => {
            tracing::warn!(events, reason, "events not delivered to codex")
        }
        CodexEvent::CodexError(error) => tracing::warn!(error, "codex reported an error"),
        CodexEvent::Unparseable { len } => tracing::warn!(len, "unreadable line from codex"),
        other => tracing::debug!(?other, "codex"),
    }
}

/// `--doctor`: the checks, one request at a time.
struct Doctor {
    deadline: Instant,
    thread: String,
    step: Step,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    WaitingForThread,
    Listing(u64),
    Calling(u64),
}

impl Default for Doctor {
    fn default() -> Self {
        Self {
            deadline: Instant::now() + DOCTOR_STEP,
            thread: String::new(),
            step: Step::WaitingForThread,
        }
    }
}

impl Doctor {
    fn ready(&mut self, client: &mut CodexClient, thread_id: &str) {
        doctor::say(
            "codex",
            &format!("codex app-server started thread {thread_id}"),
        );
        self.thread = thread_id.to_owned();
        self.list(client);
    }

    fn list(&mut self, client: &mut CodexClient) {
        self.step = Step::Listing(client.request(
            "mcpServerStatus/list",
            &json!({}),
            Instant::now().into_std(),
        ));
    }

    /// Handles an answer; `Some(ok)` when the checks are over.
    fn response(
        &mut self,
        client: &mut CodexClient,
        id: u64,
        outcome: Result<Value, CodexRequestError>,
    ) -> Option<bool> {
        match (self.step, outcome) {
            (Step::Listing(want), Ok(result)) if want == id => {
                let server = result["data"]
                    .as_array()
                    .and_then(|d| d.iter().find(|s| s["name"] == "ac7"));
                let tools = server
                    .and_then(|s| s["tools"].as_object())
                    .map_or(0, serde_json::Map::len);
                if tools == 0 {
                    // Not started yet: ask again.
                    self.list(client);
                    return None;
                }
                doctor::say(
                    "codex",
                    &format!("the ac7 MCP server is running with {tools} tools"),
                );
                let params = json!({"threadId": self.thread, "server": "ac7", "tool": "roster", "arguments": {}});
                self.step = Step::Calling(client.request(
                    "mcpServer/tool/call",
                    &params,
                    Instant::now().into_std(),
                ));
                None
            }
            (Step::Calling(want), Ok(result)) if want == id => {
                let text = result["content"][0]["text"].as_str().unwrap_or_default();
                let ok = result["isError"] != true && text.contains("roster");
                doctor::say(
                    "codex",
                    &format!("roster through codex: {}", if ok { "ok" } else { "FAILED" }),
                );
                eprintln!("{text}");
                Some(ok)
            }
            (_, Err(error)) => Some(doctor::failed("codex", &error.to_string())),
            _ => None,
        }
    }

    fn timed_out(&self) -> bool {
        doctor::failed(
            "codex",
            &format!("no answer from codex at step {:?}", self.step),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_toml_registers_the_bridge_with_escaped_strings() {
        let toml = config_toml(
            Path::new("/opt/a \"b\"/ac7"),
            Path::new("/tmp/.ac7-runner-1.sock"),
        );
        assert!(toml.contains("[mcp_servers.ac7]\ncommand = \"/opt/a \\\"b\\\"/ac7\"\nargs = [\"mcp-bridge\"]\nenabled = true\ndefault_tools_approval_mode = \"approve\"\n"));
        assert!(
            toml.contains(
                "[mcp_servers.ac7.env]\nAC7_RUNNER_SOCKET = \"/tmp/.ac7-runner-1.sock\"\n"
            )
        );
        assert_eq!(toml_string("a\\b\n\u{1}"), "\"a\\\\b\\n\\u0001\"");
    }

    fn doc(text: &str) -> toml_edit::DocumentMut {
        text.parse().unwrap()
    }

    fn merged(user: Option<&str>, profile: Option<&str>) -> Result<toml_edit::DocumentMut, String> {
        merge_config(
            user.map(doc).as_ref(),
            profile.map(doc).as_ref(),
            Path::new("/opt/ac7"),
            Path::new("/tmp/s.sock"),
        )
        .map(|text| doc(&text))
        .map_err(|e| e.to_string())
    }

    fn assert_ours(merged: &toml_edit::DocumentMut) {
        let ac7 = &merged["mcp_servers"]["ac7"];
        assert_eq!(ac7["command"].as_str(), Some("/opt/ac7"));
        assert_eq!(ac7["default_tools_approval_mode"].as_str(), Some("approve"));
        assert_eq!(
            ac7["env"]["AC7_RUNNER_SOCKET"].as_str(),
            Some("/tmp/s.sock")
        );
        assert!(ac7.get("url").is_none(), "nothing of theirs in our entry");
    }

    #[test]
    fn the_users_config_is_merged_and_ours_wins_for_mcp_servers_ac7_only() {
        let user = r#"# my codex
model = "gpt-local"
model_provider = "lab"

[model_providers.lab]
name = "Lab"
base_url = "http://127.0.0.1:9/v1"
wire_api = "responses"

[mcp_servers.docs]
command = "docs-server"

[mcp_servers.ac7]
url = "http://elsewhere"
command = "old-ac7"
"#;
        let m = merged(Some(user), None).unwrap();
        assert_ours(&m);
        assert_eq!(m["model"].as_str(), Some("gpt-local"));
        assert_eq!(m["model_provider"].as_str(), Some("lab"));
        assert_eq!(
            m["model_providers"]["lab"]["wire_api"].as_str(),
            Some("responses")
        );
        assert_eq!(
            m["mcp_servers"]["docs"]["command"].as_str(),
            Some("docs-server")
        );
        assert!(m.to_string().contains("# my codex"), "comments are kept");

        // Inline and dotted layouts of mcp_servers.
        let m = merged(Some(r#"mcp_servers = { docs = { command = "d" } }"#), None).unwrap();
        assert_ours(&m);
        assert_eq!(m["mcp_servers"]["docs"]["command"].as_str(), Some("d"));
        let m = merged(
            Some("mcp_servers.docs.command = \"d\"\nmcp_servers.ac7.command = \"x\"\n"),
            None,
        )
        .unwrap();
        assert_ours(&m);
        assert_eq!(m["mcp_servers"]["docs"]["command"].as_str(), Some("d"));

        let e = merged(Some("mcp_servers = 3\n"), None).unwrap_err();
        assert!(
            e.contains("mcp_servers in your Codex config is not a table"),
            "{e}"
        );
        // No user config: ours alone.
        assert_eq!(
            merge_config(None, None, Path::new("/opt/ac7"), Path::new("/tmp/s.sock")).unwrap(),
            config_toml(Path::new("/opt/ac7"), Path::new("/tmp/s.sock"))
        );
    }

    #[test]
    fn a_profile_layers_over_the_users_config_key_by_key() {
        let user = r#"
model = "base"
[model_providers.lab]
name = "Lab"
base_url = "http://a/v1"
env_key = "LAB_KEY"
[sandbox_workspace_write]
writable_roots = ["/a", "/b"]
"#;
        let profile = r#"
model = "fast"
model_providers.lab.base_url = "http://b/v1"
sandbox_workspace_write = { writable_roots = ["/c"], network_access = true }
[mcp_servers.ac7]
command = "theirs"
"#;
        let m = merged(Some(user), Some(profile)).unwrap();
        assert_ours(&m);
        assert_eq!(m["model"].as_str(), Some("fast"));
        assert_eq!(m["model_providers"]["lab"]["name"].as_str(), Some("Lab"));
        assert_eq!(
            m["model_providers"]["lab"]["base_url"].as_str(),
            Some("http://b/v1")
        );
        assert_eq!(
            m["model_providers"]["lab"]["env_key"].as_str(),
            Some("LAB_KEY")
        );
        let roots = m["sandbox_workspace_write"]["writable_roots"]
            .as_array()
            .unwrap();
        assert_eq!(roots.len(), 1, "arrays replace");
        assert_eq!(
            m["sandbox_workspace_write"]["network_access"].as_bool(),
            Some(true)
        );
        // Into an inline table of the user's, a profile's table goes inline.
        let m = merged(
            Some("tools = { web = { on = false } }\n"),
            Some("[tools.web]\non = true\n[tools.shell]\non = true\n"),
        )
        .unwrap();
        assert_eq!(m["tools"]["web"]["on"].as_bool(), Some(true));
        assert_eq!(m["tools"]["shell"]["on"].as_bool(), Some(true));
        // A profile alone (no config.toml).
        let m = merged(None, Some("model = \"p\"\n")).unwrap();
        assert_eq!(m["model"].as_str(), Some("p"));
        assert_ours(&m);
    }

    #[test]
    fn a_user_config_that_does_not_parse_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "model = \"unterminated\n").unwrap();
        let e = read_toml(&path).unwrap_err();
        assert!(matches!(e, StartError::Setup(_)), "the user's file: {e:?}");
        let e = e.to_string();
        assert!(
            e.starts_with(&format!(
                "your Codex config {} is not valid TOML",
                path.display()
            )),
            "{e}"
        );
        assert!(
            read_toml(&dir.path().join("missing.toml"))
                .unwrap()
                .is_none()
        );
        assert!(parse_override("model=\"o3\"").is_ok());
        assert!(parse_override("model").is_err());
        assert!(parse_override("=x").is_err());
    }

    /// (source, host, port, tls) of the endpoints found.
    fn endpoints(
        config: Option<&str>,
        profile: Option<&str>,
        overrides: &[&str],
        env: Option<&str>,
    ) -> Result<Vec<(String, String, u16, bool)>, String> {
        let user = UserCodex {
            home: None,
            config: config.map(doc),
            profile: profile.map(doc),
        };
        let overrides: Vec<String> = overrides.iter().map(|o| (*o).to_owned()).collect();
        Ok(model_endpoints(&user, &overrides, env)?
            .into_iter()
            .map(|e| (e.source, e.host, e.port, e.tls))
            .collect())
    }

    #[test]
    fn the_model_endpoint_is_the_base_url_of_the_provider_in_effect() {
        let lab = r#"
model_provider = "lab"
[model_providers.lab]
base_url = "https://gw.example:8443/v1"
[model_providers.other]
base_url = "http://10.1.2.3:9000/v1"
"#;
        let source = |id: &str| format!("model_providers.{id}.base_url");
        assert_eq!(
            endpoints(Some(lab), None, &[], None),
            Ok(vec![(source("lab"), "gw.example".into(), 8443, true)])
        );
        // -c picks another provider (a TOML value, or bare text as a string).
        for pick in ["model_provider=\"other\"", "model_provider=other"] {
            assert_eq!(
                endpoints(Some(lab), None, &[pick], None),
                Ok(vec![(source("other"), "10.1.2.3".into(), 9000, false)]),
                "{pick}"
            );
        }
        // A profile and -c change the base URL; -c wins.
        let profile = "model_providers.lab.base_url = \"https://p.example/v1\"";
        assert_eq!(
            endpoints(Some(lab), Some(profile), &[], None),
            Ok(vec![(source("lab"), "p.example".into(), 443, true)])
        );
        assert_eq!(
            endpoints(
                Some(lab),
                Some(profile),
                &["model_providers.lab.base_url=\"https://c.example:9/v1\""],
                None
            ),
            Ok(vec![(source("lab"), "c.example".into(), 9, true)])
        );
        // The built-in openai provider: openai_base_url, else $OPENAI_BASE_URL; the default
        // hosts are traced anyway.
        let env = Some("https://relay.corp:4443/v1");
        assert_eq!(
            endpoints(None, None, &[], env),
            Ok(vec![(
                "OPENAI_BASE_URL".into(),
                "relay.corp".into(),
                4443,
                true
            )])
        );
        assert_eq!(
            endpoints(
                Some("openai_base_url = \"http://gw.lan/v1\""),
                None,
                &[],
                env
            ),
            Ok(vec![("openai_base_url".into(), "gw.lan".into(), 80, false)])
        );
        assert_eq!(endpoints(None, None, &[], None), Ok(vec![]));
        assert_eq!(
            endpoints(None, None, &[], Some("https://api.openai.com/v1")),
            Ok(vec![])
        );
        // A provider without a base_url (codex's own default) has none here either.
        assert_eq!(
            endpoints(Some("model_provider = \"x\""), None, &[], env),
            Ok(vec![])
        );
        let bad = endpoints(
            Some("model_provider = \"x\"\n[model_providers.x]\nbase_url = \"nope\""),
            None,
            &[],
            None,
        )
        .unwrap_err();
        assert!(bad.starts_with("model_providers.x.base_url=nope"), "{bad}");
    }
}
