//! The `zuno` command line.
//!
//! Exit codes: 0 success, 1 unexpected failure, 2 bad input (including usage errors),
//! 3 not found, 4 conflict, 5 server or database unavailable.

mod agent_file;
pub mod claude_memory;
pub mod client;
mod debug;
pub mod error;
pub mod eval;
pub mod global;
mod guards;
pub mod hook;
pub mod import;
pub mod install;
mod jobs;
mod json_text;
pub mod learn;
mod local_project;
pub mod mcp;
mod projects;
pub mod server;
mod tokens;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

pub use error::CliError;
pub use global::GlobalArgs;
pub use server::{ServeArgs, Server};

/// Durable learning memory for coding agents.
#[derive(Debug, Parser)]
#[command(name = "zuno", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API (with --all-in-one, also every worker, in this process).
    Serve(server::ServeArgs),
    /// Apply pending database migrations (or, with --check, only verify).
    Migrate {
        #[arg(long)]
        check: bool,
    },
    /// Diagnostics.
    Debug {
        #[command(subcommand)]
        command: debug::DebugCommand,
    },
    /// Inspect the job ledger.
    Jobs {
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
    /// Projects and their worktrees: list, unbind, rebind (move), delete.
    Projects(projects::ProjectsArgs),
    /// Manage API tokens scoped to projects.
    Tokens {
        #[command(subcommand)]
        command: tokens::TokensCommand,
    },
    /// Import agent transcripts (Claude Code, Codex, Aider) through the ingestion path, or
    /// Claude Code's own memory files into resident Memory.
    Import {
        #[command(subcommand)]
        command: import::ImportCommand,
    },
    /// Agent hook client (reads the hook JSON on stdin, answers on stdout, never blocks).
    Hook(hook::HookArgs),
    /// Learning commands (`zuno learn help` lists every action).
    Learn {
        #[command(flatten)]
        common: learn::Common,
        #[command(subcommand)]
        action: learn::LearnAction,
    },
    /// Admit a manual extraction of a session's latest turn or whole session.
    Reflect(learn::ReflectArgs),
    /// Resident Memory: read, inspect, review candidates, remove, undo.
    Memory {
        #[command(flatten)]
        common: learn::Common,
        #[command(subcommand)]
        action: learn::MemoryAction,
    },
    /// A session's memory policy (use of memories, learning generation).
    Memories(learn::MemoriesArgs),
    /// Guards compiled from checkable lessons: list, test a command, approve, reject, disable,
    /// enable.
    Guards {
        #[command(flatten)]
        common: learn::Common,
        #[command(subcommand)]
        action: guards::GuardsAction,
    },
    /// Stdio MCP server: experience_search, memory_read, memory_update (--read-only: reads).
    Mcp(mcp::McpArgs),
    /// Wire an agent to Zuno (hooks and MCP server); shows the diff, applies with --yes.
    Install {
        #[command(subcommand)]
        command: install::InstallCommand,
    },
}

/// Runs the command line with `server` as the in-process API; the process's exit code.
pub fn main(server: Arc<dyn Server>) -> ExitCode {
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() {
                CliError::BAD_INPUT
            } else {
                0
            };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    cli.global.server = Some(server);
    // Everything Zuno keeps is private to its user; `install` writes the user's agent settings
    // and repository files, which keep the user's own umask.
    if !matches!(cli.command, Command::Install { .. }) {
        zuno_shared::runtime::process::private_umask();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("zuno: cannot start the async runtime: {error}");
            return ExitCode::from(CliError::FAILURE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("zuno: {}", error.message);
            ExitCode::from(error.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(args) => {
            let settings = cli.global.settings()?;
            cli.global.server()?.serve(settings, args).await
        }
        Command::Migrate { check } => migrate(&cli.global, check).await,
        Command::Debug { command } => debug::run(&cli.global, command).await,
        Command::Jobs { command } => jobs::run(&cli.global, command).await,
        Command::Projects(args) => projects::run(&cli.global, args).await,
        Command::Tokens { command } => tokens::run(&cli.global, command).await,
        Command::Import { command } => import::run(&cli.global, command).await,
        Command::Hook(args) => hook::run(&cli.global, args).await,
        Command::Install { command } => install::run(&cli.global, command).await,
        Command::Mcp(args) => mcp::run(&cli.global, args).await,
        Command::Learn { common, action } => learn::learn(&cli.global, common, action).await,
        Command::Reflect(args) => learn::reflect(&cli.global, args).await,
        Command::Memory { common, action } => learn::memory(&cli.global, common, action).await,
        Command::Memories(args) => learn::memories(&cli.global, args).await,
        Command::Guards { common, action } => guards::run(&cli.global, common, action).await,
    }
}

async fn migrate(global: &GlobalArgs, check: bool) -> Result<(), CliError> {
    let settings = global.settings()?;
    let options = settings.connect_options();
    let db = zuno_shared::db::Db::connect(&options, zuno_shared::migrations::schema()).await?;
    if check {
        let state = db.check_schema().await.map_err(anyhow::Error::from)?;
        println!(
            "schema verified: version {}, fingerprint {}, {} pending",
            state.current_version,
            state.fingerprint,
            state.pending.len()
        );
        if !state.pending.is_empty() {
            return Err(CliError::new(
                CliError::CONFLICT,
                format!("pending migrations: {:?}", state.pending),
            ));
        }
        return Ok(());
    }
    let report = db.migrate().await.map_err(anyhow::Error::from)?;
    if report.applied_now.is_empty() {
        println!(
            "database is up to date (version {})",
            report.current_version
        );
    } else {
        println!(
            "applied migrations {:?}; now at version {}",
            report.applied_now, report.current_version
        );
    }
    Ok(())
}
