//! The `ac7` command line: argument parsing and dispatch to the drivers.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::broker::cli::{PruneArgs, ServeArgs};
use crate::dialects::mcp_bridge::McpBridgeArgs;
use crate::operator::{HistoryArgs, ObjectivesArgs, OperatorConn, PushArgs};
use crate::runner::acp::AcpArgs;
use crate::runner::codex::CodexArgs;
use crate::runner::{ClaudeCodeArgs, RunArgs};

/// `ac7 --version`: the package version and the commit it was built from (`unknown commit`
/// outside a git checkout).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("AC7_COMMIT"), ")");

/// ac7: a team of humans and AI agents working through one broker.
#[derive(Debug, Parser)]
#[command(
    name = "ac7",
    version = VERSION,
    about = "ac7: a team of humans and AI agents working through one broker"
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// `ac7 mcp-bridge --help`'s summary.
pub const BRIDGE_ABOUT: &str = "The MCP server an agent spawns: relays MCP between its stdio and \
     the runner's socket (`AC7_RUNNER_SOCKET`), or hands its stdio to the runner to serve \
     (`AC7_RUNNER_STDIO_HANDOFF=1`). Started for you by `ac7 claude-code` / `ac7 run -- <cmd>`";

/// The `ac7` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The MCP server an agent spawns (see [`BRIDGE_ABOUT`]).
    #[command(about = BRIDGE_ABOUT, after_help = crate::dialects::mcp_bridge::HELP_FOOTER, hide = true)]
    McpBridge(McpBridgeArgs),
    /// Run the broker.
    Serve(ServeArgs),
    /// Run Claude Code as a member of the team (`ac7 claude-code [-- <claude args>]`).
    ClaudeCode(ClaudeCodeArgs),
    /// Run OpenAI Codex as a member of the team, under `codex app-server`.
    Codex(CodexArgs),
    /// Run any agent that speaks the Agent Client Protocol as a member of the team
    /// (`ac7 acp -- <agent command>`, e.g. `gemini --acp`).
    Acp(AcpArgs),
    /// Run any MCP-speaking agent as a member of the team (`ac7 run -- <cmd> [args]`).
    Run(RunArgs),
    /// Administer members: add, list, update, remove, rotate-token — through the running broker
    /// with a token, or offline on the database file (`--db`, the broker stopped).
    Member(crate::operator::admin::MemberArgs),
    /// Show or change the team's name, directive and context.
    Team(crate::operator::admin::TeamArgs),
    /// List, set or delete permission presets (named sets of permissions).
    Presets(crate::operator::admin::PresetsArgs),
    /// List, create and archive channels; list or change a channel's members.
    Channels(crate::operator::admin::ChannelsArgs),
    /// Approve or reject the devices waiting in `ac7 connect` (needs members.manage).
    Enroll(crate::operator::admin::EnrollArgs),
    /// Write a consistent copy of a running broker's database to a new file (needs
    /// members.manage).
    Backup(crate::operator::admin::BackupArgs),
    /// Delete old messages offline, against the database file (`--older-than-days N`).
    Prune(PruneArgs),
    /// Copy a team from its SQLite file into an empty PostgreSQL database, to run it as
    /// `ac7 serve --db postgres://…` replicas (`--from FILE --to URL`; the broker stopped).
    #[command(after_help = crate::broker::migrate_team::HELP_FOOTER)]
    Migrate(crate::broker::migrate_team::MigrateArgs),
    /// Send a message through a running broker.
    Push(PushArgs),
    /// Show the team and who is connected.
    Roster(OperatorConn),
    /// Show message history.
    History(HistoryArgs),
    /// List, view and manage objectives.
    Objectives(ObjectivesArgs),
    /// Show a member's model exchanges, one line each (`--objective`, `--follow`).
    Activity(crate::operator::activity::ActivityArgs),
    /// Tokens used per member and per objective over a time range.
    Usage(crate::operator::activity::UsageArgs),
    /// The bridge side of the Ash protocol: listens on `ASH_BRIDGE_SOCKET` and runs `claude`
    /// per query for the hosts that connect.
    #[command(after_help = crate::dialects::ash_bridge::HELP_FOOTER, hide = true)]
    AshBridge(crate::dialects::ash_bridge::AshBridgeArgs),
    /// Try ac7 in a minute: a throw-away team with a demo agent that answers direct messages
    /// (no API key needed), and the commands to talk to it. Ctrl-C removes it.
    Quickstart(crate::quickstart::QuickstartArgs),
    /// The stand-in agent `ac7 quickstart` runs under `ac7 run`: answers direct messages.
    #[command(hide = true)]
    DemoAgent(crate::quickstart::demo_agent::DemoAgentArgs),
    /// Connect this device to a broker: shows a code for a team admin to approve in the web
    /// app, then stores the token (0600) that every verb uses for that URL.
    Connect(crate::connect::ConnectArgs),
    /// Show who your token is: member, role, team and permissions.
    Whoami(OperatorConn),
    /// Forget the token `ac7 connect` stored for a broker.
    Logout(crate::connect::LogoutArgs),
    /// Print a shell completion script (`ac7 completions bash > ~/.local/share/bash-completion/completions/ac7`).
    Completions(CompletionsArgs),
    /// Print the manual page (roff), or write one page per verb with `--dir`.
    Man(ManArgs),
}

/// `ac7 completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// `ac7 man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write `ac7.1` and one `ac7-<verb>.1` per verb into this folder (created if missing)
    /// instead of printing `ac7.1`.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<std::path::PathBuf>,
}

/// [`command`] without its hidden verbs (internal helpers no user types), for the generators,
/// which would otherwise list them.
fn public_command() -> clap::Command {
    let full = command();
    let mut public = clap::Command::new("ac7")
        .version(VERSION)
        .about(full.get_about().cloned().unwrap_or_default())
        .subcommand_required(true);
    for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
        public = public.subcommand(sub.clone());
    }
    public
}

fn completions(args: CompletionsArgs) -> anyhow::Result<i32> {
    let mut cmd = public_command();
    clap_complete::generate(args.shell, &mut cmd, "ac7", &mut std::io::stdout());
    Ok(0)
}

#[allow(clippy::print_stdout)] // the pages written are the verb's output
fn man(args: ManArgs) -> anyhow::Result<i32> {
    use anyhow::Context;
    let cmd = public_command();
    let Some(dir) = args.dir else {
        clap_mangen::Man::new(cmd).render(&mut std::io::stdout().lock())?;
        return Ok(0);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut pages = vec![("ac7.1".to_owned(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        let name = format!("ac7-{}", sub.get_name());
        let page = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("ac7 {}", sub.get_name()));
        pages.push((format!("{name}.1"), page));
    }
    for (file, page) in pages {
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        let path = dir.join(&file);
        crate::sys::fsutil::write_atomic(&path, &out)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(0)
}

/// Verbs that relay an agent's traffic (the runners and the bridges), whose allocator keeps the
/// heap pages it frees ([`crate::sys::keep_heap_for_relaying`]).
fn relays(command: &Command) -> bool {
    matches!(
        command,
        Command::McpBridge(_)
            | Command::AshBridge(_)
            | Command::ClaudeCode(_)
            | Command::Run(_)
            | Command::Codex(_)
            | Command::Acp(_)
    )
}

/// Verbs whose output is for a reader or a pipe: a closed pipe (`ac7 history --json | head`)
/// ends them quietly, as it does `cat`, instead of a panic on the failed write.
fn quiet_on_broken_pipe(command: &Command) -> bool {
    matches!(
        command,
        Command::Push(_)
            | Command::Roster(_)
            | Command::History(_)
            | Command::Objectives(_)
            | Command::Activity(_)
            | Command::Usage(_)
            | Command::Whoami(_)
            | Command::Member(_)
            | Command::Team(_)
            | Command::Presets(_)
            | Command::Channels(_)
            | Command::Enroll(_)
            | Command::Backup(_)
            | Command::Completions(_)
            | Command::Man(_)
    )
}

/// The `ac7` command tree as clap sees it, with the values of environment variables hidden
/// from `--help` everywhere (`[env: AC7_URL]`, not the current value — a token must never show,
/// and a URL read from the environment is not help text).
pub fn command() -> clap::Command {
    fn hide_env_values(cmd: clap::Command) -> clap::Command {
        let cmd = cmd.mut_args(|arg| arg.hide_env_values(true));
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|sub| sub.get_name().to_owned())
            .collect();
        names
            .into_iter()
            .fold(cmd, |cmd, name| cmd.mut_subcommand(name, hide_env_values))
    }
    let cmd = hide_env_values(Cli::command()).after_long_help(ENVIRONMENT);
    let grouped = grouped_verbs();
    cmd.help_template(format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{grouped}\nOptions:\n{{options}}{{after-help}}"
    ))
}

/// The environment variables `ac7` reads, at the end of `ac7 --help`.
const ENVIRONMENT: &str = "Environment:
  AC7_URL, AC7_TOKEN     the broker and your token, for every verb that talks to one
  AC7_CA_CERT            a PEM file of certificates to trust besides the public roots (a
                         broker with a private CA or a self-signed certificate)
  AC7_AUTH_FILE          where `ac7 connect` keeps tokens (default
                         $XDG_CONFIG_HOME/ac7/auth.json, else ~/.config/ac7/auth.json)
  AC7_DB, AC7_HOST, AC7_PORT, AC7_CONFIG
                         `ac7 serve`'s database, address, port and config file
  AC7_LOG                the log filter: error, warn, info, debug or trace
  AC7_BACKFILL, AC7_KILL_GRACE
                         runner settings (`ac7 run --help`)
  CLAUDE_PATH, CODEX_PATH
                         the agents' programs, when they are not on PATH
  CLAUDE_CONFIG_DIR, CODEX_HOME
                         the agents' own settings, which the runners read
  ANTHROPIC_BASE_URL, OPENAI_BASE_URL
                         the model API a traced agent uses (default: the vendor's)
  SSL_CERT_FILE          the system CA bundle the trace host hands the agent
  XDG_STATE_HOME         the runners' log files ($XDG_STATE_HOME/ac7, else ~/.local/state/ac7)
  XDG_CACHE_HOME         `ac7 codex`'s temporary homes (else ~/.cache/ac7/codex)
  AC7_RUNNER_SOCKET, AC7_RUNNER_STDIO_HANDOFF, AC7_CALL_TOOL_SOCKET, ASH_BRIDGE_SOCKET,
  ASH_WORKSPACE_DIR, ASH_PERMISSION_MODE
                         set by a runner for the bridge it starts
  AC7_RECONNECT_BASE_MS, AC7_CALL_TOOL_TIMEOUT_MS, AC7_TRACE_UPSTREAM
                         for the tests: faster reconnects, shorter tool calls, a stand-in
                         model API";

/// The verbs as `ac7 --help` lists them: by what they are for, the first steps first.
const VERB_GROUPS: &[(&str, &[(&str, &str)])] = &[
    (
        "Getting started",
        &[
            (
                "quickstart",
                "try ac7 in a minute: a throw-away team with a demo agent",
            ),
            (
                "serve",
                "run the broker (SQLite file, or PostgreSQL replicas)",
            ),
            (
                "connect",
                "connect this device to a broker (an admin approves it)",
            ),
        ],
    ),
    (
        "Agents",
        &[
            ("claude-code", "run Claude Code as a member of the team"),
            ("codex", "run OpenAI Codex as a member of the team"),
            (
                "acp",
                "run an ACP agent as a member (`ac7 acp -- gemini --acp`)",
            ),
            (
                "run",
                "run any MCP-speaking agent as a member (`ac7 run -- <cmd>`)",
            ),
        ],
    ),
    (
        "Team",
        &[
            (
                "push",
                "send a message: --to a member, --broadcast, or --channel",
            ),
            ("roster", "the team, who is connected, who is busy"),
            ("history", "message history"),
            ("objectives", "list, view and manage objectives"),
            ("channels", "list, create, archive channels; their members"),
            ("activity", "a member's model exchanges"),
            ("usage", "tokens used per member and per objective"),
            ("whoami", "who your token is"),
            ("logout", "forget the token `ac7 connect` stored"),
        ],
    ),
    (
        "Admin",
        &[
            ("member", "add, list, update, remove members; rotate tokens"),
            ("enroll", "approve or reject devices running `ac7 connect`"),
            ("team", "show or change the team's name, directive, context"),
            ("presets", "list, set, delete permission presets"),
            ("backup", "copy the running broker's database to a file"),
            ("prune", "delete old messages (offline)"),
            ("migrate", "copy a SQLite team into PostgreSQL"),
        ],
    ),
    (
        "Shell",
        &[
            ("completions", "print a shell completion script"),
            ("man", "print or write the manual pages"),
        ],
    ),
];

fn grouped_verbs() -> String {
    let width = VERB_GROUPS
        .iter()
        .flat_map(|(_, verbs)| verbs.iter().map(|(name, _)| name.len()))
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (group, verbs) in VERB_GROUPS {
        text.push_str(&format!("{group}:\n"));
        for (name, what) in *verbs {
            text.push_str(&format!("  {name:width$}  {what}\n"));
        }
    }
    text.push_str(&format!(
        "\n`ac7 <command> --help` says more. The bridges agents start ({}) are not listed.\n",
        "mcp-bridge, ash-bridge"
    ));
    text
}

/// `ac7 mcp-bridge` alone, as in [`command`]: the bridge parses only its own arguments.
pub fn bridge_command() -> clap::Command {
    use clap::Args;
    McpBridgeArgs::augment_args(clap::Command::new("mcp-bridge"))
        .bin_name("ac7 mcp-bridge")
        .about(BRIDGE_ABOUT)
        .after_help(crate::dialects::mcp_bridge::HELP_FOOTER)
        .mut_args(|arg| arg.hide_env_values(true))
}

/// Parses the process's arguments (exits with clap's message and code 2 on a usage error).
///
/// `ac7 mcp-bridge` starts once per agent session and lives as long as the agent: it builds only
/// its own part of the command line, so it does not page in the code that builds every other
/// verb's (about 3 MB of resident memory).
pub fn parse() -> Cli {
    let mut argv = std::env::args_os();
    if argv.nth(1).is_some_and(|verb| verb == "mcp-bridge") {
        // What runners write (`args: ["mcp-bridge"]`): nothing to parse at all.
        if argv.next().is_none()
            && std::env::var_os(crate::dialects::call_tool_bridge::CALL_TOOL_SOCKET_ENV).is_none()
        {
            return Cli {
                command: Command::McpBridge(McpBridgeArgs::default()),
            };
        }
        let matches = bridge_command().get_matches_from(std::env::args_os().skip(1));
        let args = McpBridgeArgs::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
        return Cli {
            command: Command::McpBridge(args),
        };
    }
    // `ac7 help --help` (or `-h`): the help of `help` is the top-level help.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() == 3 && args[1] == "help" && (args[2] == "--help" || args[2] == "-h") {
        command().print_help().ok();
        std::process::exit(0);
    }
    let mut matches = command().get_matches();
    // `ac7 serve --config FILE`: the file's values join the command line where it set none.
    if let Some(("serve", serve)) = matches.subcommand() {
        let cmd = command();
        let serve_cmd = cmd.find_subcommand("serve").cloned().unwrap_or_default();
        match crate::broker::serve_config::with_file_values(&serve_cmd, serve, &args) {
            Ok(None) => {}
            Ok(Some(argv)) => matches = command().get_matches_from(argv),
            Err(e) => {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("ac7: {e}");
                }
                std::process::exit(2);
            }
        }
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit())
}

/// An error and its causes on one line, `outer: cause: cause`, each cause once: a cause whose
/// text the line already holds (an error that prints its source in its own message) is not
/// repeated.
pub fn error_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Before a runner starts: [`crate::connect::offer_connect`], its failure said on one line.
#[allow(clippy::print_stderr)]
fn offer_connect(opts: &crate::runner::RunnerOpts) {
    if let Err(e) = crate::connect::offer_connect(opts.token.as_deref(), &opts.url) {
        eprintln!("ac7: {}", error_text(&e));
    }
}

/// Runs the parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match &cli.command {
        // The bridges (and the demo agent) set up their own logging (their stdout is a protocol).
        Command::McpBridge(_) | Command::AshBridge(_) | Command::DemoAgent(_) => {}
        // Its own output is the point; the broker's info lines would bury it.
        Command::Quickstart(_) => crate::logging::init(crate::logging::DEFAULT_LEVEL),
        // Runners log at warn, and to a file when the agent owns the terminal.
        Command::ClaudeCode(_) | Command::Run(_) => {
            crate::runner::logs::init(crate::runner::logs::agent_owns_terminal());
        }
        Command::Codex(_) | Command::Acp(_) => crate::runner::logs::init(false),
        _ => crate::logging::init("info"),
    }
    if relays(&cli.command) {
        crate::sys::keep_heap_for_relaying();
    }
    if quiet_on_broken_pipe(&cli.command) {
        // SAFETY: SIG_DFL installs no handler; it only restores the default disposition. Socket
        // writes (std, tokio) pass MSG_NOSIGNAL and are unaffected.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::McpBridge(args) => Ok(crate::dialects::mcp_bridge::run(args)),
        Command::Serve(args) => crate::broker::cli::serve(args),
        Command::ClaudeCode(args) => {
            if !args.doctor {
                offer_connect(&args.opts);
            }
            Ok(crate::runner::claude_code(args))
        }
        Command::Run(args) => {
            offer_connect(&args.opts);
            Ok(crate::runner::run_command(args))
        }
        Command::Codex(args) => {
            offer_connect(&args.opts);
            Ok(crate::runner::codex::codex(args))
        }
        Command::Acp(args) => {
            if !args.doctor {
                offer_connect(&args.opts);
            }
            Ok(crate::runner::acp::acp(args))
        }
        Command::Member(args) => crate::operator::admin::member(args),
        Command::Team(args) => crate::operator::admin::team(args),
        Command::Presets(args) => crate::operator::admin::presets(args),
        Command::Channels(args) => crate::operator::admin::channels(args),
        Command::Enroll(args) => crate::operator::admin::enroll(args),
        Command::Backup(args) => crate::operator::admin::backup(args),
        Command::Prune(args) => crate::broker::cli::prune(args),
        Command::Migrate(args) => Ok(crate::broker::migrate_team::run(args)),
        Command::Push(args) => crate::operator::push(args),
        Command::Roster(conn) => crate::operator::roster(conn),
        Command::History(args) => crate::operator::history(args),
        Command::Objectives(args) => crate::operator::objectives(args),
        Command::Activity(args) => crate::operator::activity::activity(args),
        Command::Usage(args) => crate::operator::activity::usage(args),
        Command::AshBridge(args) => Ok(crate::dialects::ash_bridge::run(args)),
        Command::Quickstart(args) => crate::quickstart::quickstart(args),
        Command::DemoAgent(args) => Ok(crate::quickstart::demo_agent::run(args)),
        Command::Connect(args) => crate::connect::connect(args),
        Command::Whoami(conn) => crate::operator::whoami(conn),
        Command::Logout(args) => crate::connect::logout(args),
        Command::Completions(args) => completions(args),
        Command::Man(args) => man(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::FromArgMatches;

    #[test]
    fn error_text_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot use the data directory /x: {source}")]
        struct Dir {
            source: std::io::Error,
        }
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let err = anyhow::Error::new(Dir { source: io }).context("starting");
        assert_eq!(
            super::error_text(&err),
            "starting: cannot use the data directory /x: entity not found"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::error_text(&plain), "outer: inner");
    }

    /// Every argument of every verb, all the way down, says what it is for in `--help`, and no
    /// help shows an environment variable's value.
    #[test]
    fn every_argument_has_help_and_hides_env_values() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} <{id}>: no help text"));
                }
                if arg.get_env().is_some() && !arg.is_hide_env_values_set() {
                    missing.push(format!("{path} <{id}>: shows its environment value"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(format!("{path} {}: no about text", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut cmd = super::command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "ac7", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// The bridge's own parser takes exactly the arguments the full command line gives it.
    #[test]
    fn bridge_fast_path_matches_the_full_tree() {
        let ids = |cmd: &clap::Command| {
            let mut v: Vec<(String, Option<String>, bool)> = cmd
                .get_arguments()
                .map(|a| {
                    (
                        a.get_id().to_string(),
                        a.get_env().map(|e| e.to_string_lossy().into_owned()),
                        a.is_hide_env_values_set(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let mut full = super::command();
        full.build();
        let mut fast = super::bridge_command();
        fast.build();
        let in_full = full.find_subcommand("mcp-bridge").expect("mcp-bridge");
        assert_eq!(ids(in_full), ids(&fast));
        assert_eq!(
            in_full.get_about().map(ToString::to_string),
            fast.get_about().map(ToString::to_string)
        );
        let args = [
            "mcp-bridge",
            "--dialect",
            "call-tool",
            "--schema-file",
            "s.json",
        ];
        let via_full = super::Cli::from_arg_matches(
            &super::command().get_matches_from(std::iter::once("ac7").chain(args)),
        )
        .expect("full");
        let via_fast =
            super::McpBridgeArgs::from_arg_matches(&super::bridge_command().get_matches_from(args))
                .expect("fast");
        let super::Command::McpBridge(via_full) = via_full.command else {
            panic!("not mcp-bridge")
        };
        assert_eq!(format!("{via_full:?}"), format!("{via_fast:?}"));
        // A bare `ac7 mcp-bridge` (no flags, no AC7_CALL_TOOL_SOCKET) is the default.
        let bare =
            super::Cli::from_arg_matches(&super::command().get_matches_from(["ac7", "mcp-bridge"]))
                .expect("bare");
        let super::Command::McpBridge(bare) = bare.command else {
            panic!("not mcp-bridge")
        };
        assert_eq!(
            format!("{bare:?}"),
            format!("{:?}", super::McpBridgeArgs::default())
        );
    }

    /// Every verb a user types is in exactly one group of `ac7 --help`, and every grouped
    /// name is a verb; the hidden ones are not listed.
    #[test]
    fn top_level_help_groups_every_visible_verb_once() {
        let cmd = super::command();
        let grouped: Vec<&str> = super::VERB_GROUPS
            .iter()
            .flat_map(|(_, verbs)| verbs.iter().map(|(name, _)| *name))
            .collect();
        let mut visible: Vec<&str> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(clap::Command::get_name)
            .collect();
        let mut sorted = grouped.clone();
        sorted.sort_unstable();
        visible.sort_unstable();
        assert_eq!(sorted, visible);
        let mut cmd = super::command();
        let help = cmd.render_help().to_string();
        assert!(help.starts_with("ac7: a team of humans"), "{help}");
        assert!(help.contains("Getting started:\n  quickstart "), "{help}");
        assert!(!help.contains("\n  mcp-bridge "), "{help}");
        assert!(help.contains("-V, --version"), "{help}");
    }

    /// Every help text of the command tree (hidden verbs too), long form, with after-help.
    fn all_help() -> String {
        fn walk(cmd: &mut clap::Command, text: &mut String) {
            text.push_str(&cmd.render_long_help().to_string());
            let names: Vec<String> = cmd
                .get_subcommands()
                .map(|s| s.get_name().to_owned())
                .collect();
            for name in names {
                if let Some(sub) = cmd.find_subcommand_mut(&name) {
                    walk(sub, text);
                }
            }
        }
        let mut cmd = super::command();
        cmd.build();
        let mut text = String::new();
        walk(&mut cmd, &mut text);
        text
    }

    /// Every environment variable the binary reads is named in some `--help`: the ones of its
    /// own (`AC7_…`, and the agents' locations) wherever the source names them, and every
    /// other variable read by name, except the few every Unix program reads.
    #[test]
    fn every_environment_variable_read_is_in_some_help() {
        // Read by every program of its kind; naming them in help would say nothing.
        const GENERAL: &[&str] = &["HOME", "PATH", "TMPDIR", "NO_PROXY"];
        // Not read at run time: the commit `--version` names, fixed at build time.
        const BUILD_TIME: &[&str] = &["AC7_COMMIT"];
        fn sources(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            for entry in std::fs::read_dir(dir).expect("read src").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).expect("read a source file");
                    out.push((path.display().to_string(), text));
                }
            }
        }
        fn quoted_names(text: &str, out: &mut std::collections::BTreeSet<String>) {
            let bytes = text.as_bytes();
            let mut i = 0;
            while let Some(at) = text[i..].find('"') {
                let start = i + at + 1;
                let end = start
                    + bytes[start..]
                        .iter()
                        .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || **b == b'_')
                        .count();
                let name = &text[start..end];
                let own = ["AC7_", "ASH_", "CLAUDE_PATH", "CODEX_PATH"]
                    .iter()
                    .any(|p| name.starts_with(p));
                let read = text[..i + at].ends_with("var(") || text[..i + at].ends_with("var_os(");
                if end > start && bytes.get(end) == Some(&b'"') && (own || read) {
                    out.insert(name.to_owned());
                }
                i = end.max(start);
            }
        }
        let mut files = Vec::new();
        sources(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let mut names = std::collections::BTreeSet::new();
        for (_, text) in &files {
            quoted_names(text, &mut names);
        }
        assert!(
            names.contains("AC7_URL") && names.contains("XDG_CONFIG_HOME"),
            "{names:?}"
        );
        let help = all_help();
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !GENERAL.contains(&n.as_str()) && !BUILD_TIME.contains(&n.as_str()))
            .filter(|n| !help.contains(n.as_str()))
            .collect();
        assert!(missing.is_empty(), "in no --help: {missing:?}");
    }

    /// `--help` names the environment variable without its value, even when it is set.
    #[test]
    fn help_names_env_variables_without_values() {
        let mut cmd = super::command();
        let push = cmd.find_subcommand_mut("push").expect("push");
        let help = push.render_long_help().to_string();
        assert!(help.contains("[env: AC7_URL]"), "{help}");
        assert!(!help.contains("AC7_URL="), "{help}");
    }
}
