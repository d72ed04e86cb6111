//! The `ac7` command line: argument parsing and dispatch to the drivers.

use clap::{Parser, Subcommand};

use crate::broker::cli::{MemberArgs, ServeArgs};
use crate::operator::{HistoryArgs, ObjectivesArgs, OperatorConn, PushArgs};

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
    /// Run the broker.
    Serve(ServeArgs),
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
}

/// Runs the parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    init_tracing();
    match cli.command {
        Command::Serve(args) => crate::broker::cli::serve(args),
        Command::Member(args) => crate::broker::cli::member(args),
        Command::Push(args) => crate::operator::push(args),
        Command::Roster(conn) => crate::operator::roster(conn),
        Command::History(args) => crate::operator::history(args),
        Command::Objectives(args) => crate::operator::objectives(args),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AC7_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
