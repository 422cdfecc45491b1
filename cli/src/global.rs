//! The arguments every subcommand takes, and the local database they name.

use std::path::PathBuf;
use std::sync::Arc;

use zuno_shared::runtime::process::Settings;

use crate::error::CliError;
use crate::server::Server;

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
    /// The API this process serves itself: `zuno serve` and the commands run without
    /// `--server`. Not a flag: the `zuno` binary puts it here after parsing (`crate::main`).
    #[arg(skip)]
    pub server: Option<Arc<dyn Server>>,
}

impl GlobalArgs {
    pub fn settings(&self) -> Result<Settings, CliError> {
        let mut settings = Settings::load(self.home.as_deref(), self.config.as_deref())?;
        if let Some(url) = &self.database_url {
            settings.config.database.url = Some(url.clone());
        }
        Ok(settings)
    }

    /// The in-process API; absent only when a library caller parsed the arguments itself.
    pub fn server(&self) -> Result<Arc<dyn Server>, CliError> {
        self.server.clone().ok_or_else(|| {
            CliError::new(
                CliError::FAILURE,
                "this build of zuno has no in-process API: pass --server",
            )
        })
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
