//! The `ac7` command line: argument parsing and dispatch to the drivers.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::broker::cli::{MemberArgs, PruneArgs, ServeArgs};
use crate::dialects::mcp_bridge::McpBridgeArgs;
use crate::operator::{HistoryArgs, ObjectivesArgs, OperatorConn, PushArgs};
use crate::runner::codex::CodexArgs;
use crate::runner::{ClaudeCodeArgs, RunArgs};

/// ac7: a team of humans and AI agents working through one broker.
#[derive(Debug, Parser)]
#[command(
    name = "ac7",
    version,
    about = "ac7: a team of humans and AI agents working through one broker"
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// `ac7 mcp-bridge --help`'s summary.
pub const BRIDGE_ABOUT: &str = "The MCP server an agent spawns: relays MCP between its stdio and \
     the runner's socket (`AC7_RUNNER_SOCKET`). Started for you by `ac7 claude-code` / `ac7 run -- <cmd>`";

/// The `ac7` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The MCP server an agent spawns (see [`BRIDGE_ABOUT`]).
    #[command(about = BRIDGE_ABOUT, after_help = crate::dialects::mcp_bridge::HELP_FOOTER)]
    McpBridge(McpBridgeArgs),
    /// Run the broker.
    Serve(ServeArgs),
    /// Run Claude Code as a member of the team (`ac7 claude-code [-- <claude args>]`).
    ClaudeCode(ClaudeCodeArgs),
    /// Run OpenAI Codex as a member of the team, under `codex app-server`.
    Codex(CodexArgs),
    /// Run any MCP-speaking agent as a member of the team (`ac7 run -- <cmd> [args]`).
    Run(RunArgs),
    /// Administer members: offline against the database file (the broker stopped);
    /// `rotate-token --token T` also through a running broker.
    Member(MemberArgs),
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
    Activity(crate::operator_activity::ActivityArgs),
    /// Tokens used per member and per objective over a time range.
    Usage(crate::operator_activity::UsageArgs),
    /// The bridge side of the Ash protocol: listens on `ASH_BRIDGE_SOCKET` and runs `claude`
    /// per query for the hosts that connect.
    #[command(after_help = crate::dialects::ash_bridge::HELP_FOOTER)]
    AshBridge(crate::dialects::ash_bridge::AshBridgeArgs),
    /// Try ac7 in a minute: a throw-away team with a demo agent that answers direct messages
    /// (no API key needed), and the commands to talk to it. Ctrl-C removes it.
    Quickstart(crate::quickstart::QuickstartArgs),
    /// The stand-in agent `ac7 quickstart` runs under `ac7 run`: answers direct messages.
    #[command(hide = true)]
    DemoAgent(crate::demo_agent::DemoAgentArgs),
    /// Connect this device to a broker: shows a code for a team admin to approve in the web
    /// app, then stores the token (0600) that every verb uses for that URL.
    Connect(crate::connect::ConnectArgs),
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
    hide_env_values(Cli::command())
}

/// Checks a broker URL (`--url` / `AC7_URL`): absolute, `http` or `https`, with a host.
pub fn broker_url(s: &str) -> Result<String, String> {
    let fail = |why: &str| {
        Err(format!(
            "invalid broker URL '{s}': {why}; expected http://HOST:PORT such as {}",
            crate::runner::DEFAULT_URL
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
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit())
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
        Command::Codex(_) => crate::runner::logs::init(false),
        _ => crate::logging::init("info"),
    }
    match cli.command {
        Command::McpBridge(args) => Ok(crate::dialects::mcp_bridge::run(args)),
        Command::Serve(args) => crate::broker::cli::serve(args),
        Command::ClaudeCode(args) => Ok(crate::runner::claude_code(args)),
        Command::Run(args) => Ok(crate::runner::run_command(args)),
        Command::Codex(args) => Ok(crate::runner::codex::codex(args)),
        Command::Member(args) => crate::broker::cli::member(args),
        Command::Prune(args) => crate::broker::cli::prune(args),
        Command::Migrate(args) => Ok(crate::broker::migrate_team::run(args)),
        Command::Push(args) => crate::operator::push(args),
        Command::Roster(conn) => crate::operator::roster(conn),
        Command::History(args) => crate::operator::history(args),
        Command::Objectives(args) => crate::operator::objectives(args),
        Command::Activity(args) => crate::operator_activity::activity(args),
        Command::Usage(args) => crate::operator_activity::usage(args),
        Command::AshBridge(args) => Ok(crate::dialects::ash_bridge::run(args)),
        Command::Quickstart(args) => crate::quickstart::quickstart(args),
        Command::DemoAgent(args) => Ok(crate::demo_agent::run(args)),
        Command::Connect(args) => crate::connect::connect(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::FromArgMatches;

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
