//! The `zuno` command line.
//!
//! Exit codes: 0 success, 1 unexpected failure, 2 bad input (including usage errors),
//! 3 not found, 4 conflict, 5 server or database unavailable.

mod agent_file;
pub mod claude_memory;
pub mod client;
mod debug;
mod guards;
pub mod hook;
pub mod import;
pub mod install;
mod jobs;
mod json_text;
pub mod learn;
pub mod mcp;
mod projects;
mod tokens;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use zuno_shared::runtime::process::Settings;

/// Durable learning memory for coding agents.
#[derive(Debug, Parser)]
#[command(name = "zuno", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// Directory holding the database and configuration (default: platform directories).
    #[arg(long, global = true, env = "ZUNO_HOME")]
    pub home: Option<PathBuf>,
    /// Configuration file (default: config.json in the configuration directory).
    #[arg(long, global = true, env = "ZUNO_CONFIG")]
    pub config: Option<PathBuf>,
    /// Database URL (overrides ZUNO_DATABASE_URL, DATABASE_URL and the configuration file).
    #[arg(long, global = true)]
    pub database_url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API (with --all-in-one, also every worker, in this process).
    Serve(crate::serve::ServeArgs),
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

/// A failure with the exit code that classifies it.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    pub const FAILURE: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const UNAVAILABLE: u8 = 5;

    pub fn new(code: u8, message: impl Into<String>) -> CliError {
        CliError {
            code,
            message: message.into(),
        }
    }
}

impl From<anyhow::Error> for CliError {
    fn from(error: anyhow::Error) -> CliError {
        if let Some(config) = error.downcast_ref::<zuno_shared::config::ConfigError>() {
            return CliError::new(CliError::BAD_INPUT, config.to_string());
        }
        if let Some(untrusted) = error.downcast_ref::<zuno_shared::ownership::Untrusted>() {
            return CliError::new(CliError::BAD_INPUT, untrusted.to_string());
        }
        if let Some(migration) = error.downcast_ref::<zuno_shared::db::MigrationError>() {
            let code = match migration {
                zuno_shared::db::MigrationError::Store(store) if store.is_connection() => {
                    CliError::UNAVAILABLE
                }
                _ => CliError::FAILURE,
            };
            return CliError::new(code, migration.to_string());
        }
        CliError::new(CliError::FAILURE, format!("{error:#}"))
    }
}

impl From<zuno_shared::ledger::LedgerError> for CliError {
    fn from(error: zuno_shared::ledger::LedgerError) -> CliError {
        use zuno_shared::ledger::LedgerError;
        let code = match &error {
            LedgerError::NotFound(_) => CliError::NOT_FOUND,
            LedgerError::Invalid(_) => CliError::BAD_INPUT,
            LedgerError::LeaseLost { .. } => CliError::CONFLICT,
            LedgerError::Store(store) if store.is_connection() => CliError::UNAVAILABLE,
            LedgerError::Store(_) => CliError::FAILURE,
        };
        CliError::new(code, error.to_string())
    }
}

impl From<zuno_shared::db::StoreError> for CliError {
    fn from(error: zuno_shared::db::StoreError) -> CliError {
        let code = if error.is_connection() {
            CliError::UNAVAILABLE
        } else {
            CliError::FAILURE
        };
        CliError::new(code, error.to_string())
    }
}

impl GlobalArgs {
    pub fn settings(&self) -> Result<Settings, CliError> {
        let mut settings = Settings::load(self.home.as_deref(), self.config.as_deref())?;
        if let Some(url) = &self.database_url {
            settings.config.database.url = Some(url.clone());
        }
        Ok(settings)
    }
}

/// Opens the configured database for a one-shot command (migrating it, like start-up).
pub async fn open_local(settings: &Settings) -> Result<zuno_shared::db::Db, CliError> {
    zuno_shared::runtime::process::open_database(
        &settings.connect_options(),
        std::time::Duration::from_secs(5),
    )
    .await
    .map_err(CliError::from)
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
        Command::Serve(args) => crate::serve::serve(&cli.global, args).await,
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
