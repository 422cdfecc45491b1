//! The Zuno HTTP API: the routes, `zuno serve` and its all-in-one embedded mode. The `zuno`
//! command line (package `zuno-cli`) never depends on this crate; the `zuno` binary here hands
//! it [`Api`], through which `zuno serve` and every command without `--server` reach the routes.

pub mod http;
pub mod serve;

use std::sync::Arc;

use zuno_cli::{CliError, ServeArgs, Server};
use zuno_shared::config::Config;
use zuno_shared::db::Db;
use zuno_shared::paths::Paths;
use zuno_shared::runtime::process::Settings;

/// This crate's API, as the command line uses it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Api;

#[async_trait::async_trait]
impl Server for Api {
    fn local_router(&self, config: Arc<Config>, db: Db, paths: Paths) -> axum::Router {
        let clock = zuno_shared::clock::system_clock();
        http::router(http::AppState::new(config, db, clock, paths, None, None))
    }

    async fn serve(&self, settings: Settings, args: ServeArgs) -> Result<(), CliError> {
        serve::serve(settings, args).await
    }
}
