//! The `ac7` command line: argument parsing and dispatch to the drivers.

use clap::{Parser, Subcommand};

use crate::bridge::McpBridgeArgs;
use crate::broker::cli::{MemberArgs, ServeArgs};
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

/// The `ac7` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The MCP server an agent spawns: relays MCP between its stdio and the runner's socket
    /// (`AC7_RUNNER_SOCKET`). Started for you by `ac7 claude-code` / `ac7 run -- <cmd>`.
    #[command(after_help = crate::bridge::HELP_FOOTER)]
    McpBridge(McpBridgeArgs),
    /// Run the broker.
    Serve(ServeArgs),
    /// Run Claude Code as a member of the team (`ac7 claude-code [-- <claude args>]`).
    ClaudeCode(ClaudeCodeArgs),
    /// Run OpenAI Codex as a member of the team, under `codex app-server`.
    Codex(CodexArgs),
    /// Run any MCP-speaking agent as a member of the team (`ac7 run -- <cmd> [args]`).
    Run(RunArgs),
    /// Administer members offline, against the database file.
    Member(MemberArgs),
    /// Send a message through a running broker.
    Push(PushArgs),
    /// Show the team and who is connected.
    Roster(OperatorConn),
    /// Show message history.
    History(HistoryArgs),
    /// List, view and manage objectives.
    Objectives(ObjectivesArgs),
    /// The bridge side of the Ash protocol: listens on `ASH_BRIDGE_SOCKET` and runs `claude`
    /// per query for the hosts that connect.
    #[command(after_help = crate::ash_bridge::HELP_FOOTER)]
    AshBridge(crate::ash_bridge::AshBridgeArgs),
}

/// Runs the parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match &cli.command {
        // The bridges set up their own logging (their stdout is a protocol).
        Command::McpBridge(_) | Command::AshBridge(_) => {}
        // Runners log at warn, and to a file when the agent owns the terminal.
        Command::ClaudeCode(_) | Command::Run(_) => {
            crate::runner::logs::init(crate::runner::logs::agent_owns_terminal());
        }
        Command::Codex(_) => crate::runner::logs::init(false),
        _ => crate::logging::init("info"),
    }
    match cli.command {
        Command::McpBridge(args) => Ok(crate::bridge::run(args)),
        Command::Serve(args) => crate::broker::cli::serve(args),
        Command::ClaudeCode(args) => Ok(crate::runner::claude_code(args)),
        Command::Run(args) => Ok(crate::runner::run_command(args)),
        Command::Codex(args) => Ok(crate::runner::codex::codex(args)),
        Command::Member(args) => crate::broker::cli::member(args),
        Command::Push(args) => crate::operator::push(args),
        Command::Roster(conn) => crate::operator::roster(conn),
        Command::History(args) => crate::operator::history(args),
        Command::Objectives(args) => crate::operator::objectives(args),
        Command::AshBridge(args) => Ok(crate::ash_bridge::run(args)),
    }
}
