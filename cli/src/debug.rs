use clap::Subcommand;

use crate::error::CliError;
use crate::global::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum DebugCommand {
    /// Print the database, configuration, global memory and project rules paths, each marked
    /// `(absent)` until it exists.
    Paths {
        /// The project worktree (default: the current directory).
        #[arg(long)]
        worktree: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(global: &GlobalArgs, command: DebugCommand) -> Result<(), CliError> {
    match command {
        DebugCommand::Paths { worktree, json } => {
            let settings = global.settings()?;
            let worktree = match worktree {
                Some(path) => path,
                None => std::env::current_dir().map_err(|e| {
                    CliError::new(
                        CliError::FAILURE,
                        format!("cannot read the current directory: {e}"),
                    )
                })?,
            };
            let report = settings
                .paths
                .report(&worktree, settings.config.database.url.as_deref());
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                );
            } else {
                for entry in &report {
                    println!("{}", entry.render());
                }
            }
            Ok(())
        }
    }
}
