//! The state every route and middleware shares.

use std::sync::Arc;

use zuno_shared::clock::SharedClock;
use zuno_shared::config::Config;
use zuno_shared::db::Db;
use zuno_shared::learning::LearningIngestion;
use zuno_shared::ledger::Ledger;
use zuno_shared::tokens::TokenStore;
use zuno_shared::transcript::TranscriptStore;

use super::auth::Auth;
use super::dashboard::Dashboard;
use super::guard::{HostPolicy, is_loopback};
use super::live_hub::LiveHub;

/// Shared state of every route.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub db: Db,
    pub ledger: Ledger,
    pub transcripts: TranscriptStore,
    pub ingestion: LearningIngestion,
    pub tokens: TokenStore,
    pub memory: zuno_shared::memory::service::MemoryService,
    pub auth: Auth,
    /// The `Host` names this server answers to.
    pub hosts: HostPolicy,
    /// Whether `/metrics` needs the server's token.
    pub metrics_auth: bool,
    /// The live-stream change poller and per-token stream counts.
    pub live: LiveHub,
    /// The one-time dashboard sign-in.
    pub dashboard: Dashboard,
    /// The Prometheus registry rendered at `/metrics` (absent in tests without telemetry).
    pub metrics: Option<prometheus::Registry>,
    /// The server's data and configuration directories (never a worktree).
    pub paths: zuno_shared::paths::Paths,
}

impl AppState {
    /// The state of a router. `server_token` is the server's own token (the operator's
    /// `ZUNO_API_TOKEN` or the generated local token); `None` turns authentication off and makes
    /// every caller the local user, which is right for the CLI's in-process router and for
    /// `--insecure-no-auth` on loopback only. The `Host`, `Origin` and content-type rules apply
    /// either way.
    pub fn new(
        config: Arc<Config>,
        db: Db,
        clock: SharedClock,
        paths: zuno_shared::paths::Paths,
        server_token: Option<&str>,
        metrics: Option<prometheus::Registry>,
    ) -> AppState {
        let ledger = Ledger::new(db.clone(), clock.clone());
        let transcripts = TranscriptStore::new(db.clone(), clock.clone());
        let ingestion = LearningIngestion::new(transcripts.clone(), ledger.clone(), config.clone());
        AppState {
            memory: zuno_shared::memory::service::MemoryService::new(
                db.clone(),
                config.clone(),
                paths.clone(),
                clock.clone(),
            ),
            paths,
            tokens: TokenStore::new(db.clone(), clock.clone()),
            auth: Auth::new(server_token),
            hosts: HostPolicy::new(&config.server.bind, &config.server.allowed_hosts),
            metrics_auth: server_token.is_some()
                && config
                    .server
                    .metrics_auth
                    .unwrap_or_else(|| !is_loopback(&config.server.bind)),
            live: LiveHub::new(db.clone(), config.server.max_streams_per_token),
            dashboard: Dashboard::new(server_token, clock.clone()),
            config,
            db,
            ledger,
            transcripts,
            ingestion,
            metrics,
        }
    }
}
