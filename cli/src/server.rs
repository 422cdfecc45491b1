//! The API as the command line sees it: the one thing it needs from the server crate, which
//! depends on this crate and not the other way round. The `zuno` binary (package `zuno-api`)
//! passes its implementation to [`crate::main`]; `zuno serve` runs it and every command without
//! `--server` calls its router in this process, so both paths run exactly the route code.

use std::sync::Arc;

use zuno_shared::config::Config;
use zuno_shared::db::Db;
use zuno_shared::paths::Paths;
use zuno_shared::runtime::process::Settings;

use crate::error::CliError;

/// `zuno serve`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Also run every worker stage in this process.
    #[arg(long)]
    pub all_in_one: bool,
    /// Address to listen on (default: server.bind, overridden by ZUNO_BIND).
    #[arg(long)]
    pub bind: Option<String>,
    /// Jobs each in-process worker runs at once (all-in-one mode).
    #[arg(long, default_value_t = 4)]
    pub worker_concurrency: usize,
    /// Serve without any token (loopback addresses only): every local process and every web page
    /// the user visits can then use the API. The `Host`, `Origin` and JSON content-type checks
    /// still apply.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

/// The HTTP API, provided by the server crate.
#[async_trait::async_trait]
pub trait Server: std::fmt::Debug + Send + Sync {
    /// The complete router over `db` without a server token: the caller is the local user's own
    /// process (the `Host`, `Origin` and content-type rules still apply).
    fn local_router(&self, config: Arc<Config>, db: Db, paths: Paths) -> axum::Router;

    /// Serves the API until a shutdown signal (`zuno serve`).
    async fn serve(&self, settings: Settings, args: ServeArgs) -> Result<(), CliError>;
}
