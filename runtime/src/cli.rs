//! The `ac7` command line: argument parsing and dispatch to the drivers.

use clap::{Parser, Subcommand};

use crate::bridge::McpBridgeArgs;

/// ac7: a team of humans and AI agents working through one broker.
#[derive(Debug, Parser)]
#[command(name = "ac7", version, about)]
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
    /// The bridge side of the Ash protocol: listens on `ASH_BRIDGE_SOCKET` and runs `claude`
    /// per query for the hosts that connect.
    #[command(after_help = crate::ash_bridge::HELP_FOOTER)]
    AshBridge(crate::ash_bridge::AshBridgeArgs),
}

/// Runs the parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::McpBridge(args) => Ok(crate::bridge::run(args)),
        Command::AshBridge(args) => Ok(crate::ash_bridge::run(args)),
    }
}
