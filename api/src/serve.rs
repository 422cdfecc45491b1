//! `zuno serve`: the HTTP API, and with `--all-in-one` every worker stage in the same process on
//! the same database handle (in-process wake-ups, the embedded default a new user runs).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use zuno_shared::clock::system_clock;
use zuno_shared::db::Db;
use zuno_shared::ledger::{ClaimGate, JobKind, Ledger};
use zuno_shared::runtime::process::{
    Settings, WorkerEnv, allow_all, default_worker_id, init_telemetry, open_database, source_gate,
};
use zuno_shared::runtime::{JobHandler, Runner, RunnerConfig};

use zuno_cli::{CliError, ServeArgs};

use crate::http::guard::is_loopback;
use crate::http::router::router;
use crate::http::state::AppState;

/// How the server authenticates, decided at start.
enum ServerToken {
    /// The operator's `ZUNO_API_TOKEN`.
    Operator(String),
    /// The local token from the data directory (generated on first start).
    Local(String),
    /// `--insecure-no-auth`.
    None,
}

/// The shortest operator token accepted on a non-loopback address: anything shorter can be
/// guessed by whoever reaches the port (the generated local token has 69 characters).
pub const MIN_OPERATOR_TOKEN_CHARS: usize = 32;

/// `ZUNO_API_TOKEN`: absent is fine, blank is a mistake worth stopping for (a token that
/// is only whitespace would otherwise be accepted, or silently turned into "no token").
pub fn operator_token() -> Result<Option<String>, CliError> {
    match std::env::var("ZUNO_API_TOKEN") {
        Ok(value) if value.trim().is_empty() => Err(CliError::new(
            CliError::BAD_INPUT,
            "ZUNO_API_TOKEN is set but blank: set a real token or unset it",
        )),
        Ok(value) => Ok(Some(value.trim().to_owned())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(CliError::new(
            CliError::BAD_INPUT,
            "ZUNO_API_TOKEN is not valid UTF-8",
        )),
    }
}

pub async fn serve(mut settings: Settings, args: ServeArgs) -> Result<(), CliError> {
    let bind = args
        .bind
        .clone()
        .unwrap_or_else(|| settings.config.server.bind.clone());
    settings.config.server.bind.clone_from(&bind);
    let server_token = ServerToken::decide(&bind, args.insecure_no_auth, &settings)?;
    let telemetry = init_telemetry("zuno-api", &settings.config)?;
    // The API admits every kind; its counters are scraped from 0, not from a first admission.
    zuno_shared::telemetry::metrics::ledger().export_from_zero(&JobKind::ALL);
    zuno_shared::runtime::process::secure_home(&settings.paths);
    let shutdown = zuno_shared::runtime::shutdown::on_signal();
    let mut options = settings.connect_options();
    if options.is_postgres() {
        // A server that is down refuses connections; requests answer 503 instead of hanging.
        // (A SQLite file does not refuse: there the pool's wait is only for a free connection.)
        options.acquire_timeout = Db::REQUEST_ACQUIRE_TIMEOUT;
    }
    let db = tokio::select! {
        db = open_database(&options, Duration::from_secs(600)) => db?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let config = Arc::new(settings.config.clone());
    let state = AppState::new(
        config,
        db.clone(),
        system_clock(),
        settings.paths.clone(),
        server_token.secret(),
        Some(telemetry.registry().clone()),
    );
    let listener = tokio::net::TcpListener::bind(&bind).await.map_err(|e| {
        CliError::new(
            CliError::UNAVAILABLE,
            format!("cannot listen on {bind}: {e}"),
        )
    })?;
    let address = listener
        .local_addr()
        .map_err(|e| CliError::new(CliError::FAILURE, e.to_string()))?;

    start_up_repairs(&state).await;
    // Jobs admitted, retried or rescued by other processes (workers, other API hosts) wake the
    // in-process runners and the recall-index drain here, as this process's own admissions do.
    let cross_process = zuno_shared::runtime::wake::start_cross_process_wake(&db, shutdown.clone())
        .await
        .map_err(|e| {
            CliError::new(
                CliError::UNAVAILABLE,
                format!("cannot watch the database for other processes' jobs: {e}"),
            )
        })?;
    let mut background = spawn_background(&state, &db, &settings, &args, &shutdown)?;
    if let Some(watcher) = cross_process {
        background.spawn(async move {
            let _ = watcher.await;
        });
    }
    announce(&address, &args, &db, &server_token, &settings, &state);
    let server_shutdown = shutdown.clone();
    crate::http::transport::serve(listener, router(state), async move {
        server_shutdown.cancelled().await
    })
    .await
    .map_err(|e| CliError::new(CliError::FAILURE, format!("server failed: {e}")))?;
    shutdown.cancel();
    while background.join_next().await.is_some() {}
    db.close().await;
    Ok(())
}

impl ServerToken {
    /// Refuses the combinations that would serve a non-loopback address without a token, or
    /// that leave it unclear whether a token is wanted.
    fn decide(
        bind: &str,
        insecure_no_auth: bool,
        settings: &Settings,
    ) -> Result<ServerToken, CliError> {
        Ok(match (operator_token()?, insecure_no_auth) {
            (Some(_), true) => {
                return Err(CliError::new(
                    CliError::BAD_INPUT,
                    "--insecure-no-auth contradicts ZUNO_API_TOKEN: unset one of them",
                ));
            }
            (Some(token), false)
                if !is_loopback(bind) && token.chars().count() < MIN_OPERATOR_TOKEN_CHARS =>
            {
                return Err(CliError::new(
                    CliError::BAD_INPUT,
                    format!(
                        "refusing to listen on {bind} with a ZUNO_API_TOKEN of {} characters: use at least {MIN_OPERATOR_TOKEN_CHARS} (e.g. `openssl rand -hex 32`) or bind a loopback address",
                        token.chars().count()
                    ),
                ));
            }
            (Some(token), false) => ServerToken::Operator(token),
            (None, _) if !is_loopback(bind) => {
                return Err(CliError::new(
                    CliError::BAD_INPUT,
                    format!(
                        "refusing to listen on {bind} without ZUNO_API_TOKEN: set a token or bind a loopback address"
                    ),
                ));
            }
            (None, true) => ServerToken::None,
            (None, false) => ServerToken::Local(
                zuno_shared::tokens::local::load_or_create(&settings.paths)
                    .map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))?,
            ),
        })
    }

    /// The token requests must bear, if any.
    fn secret(&self) -> Option<&str> {
        match self {
            ServerToken::Operator(token) | ServerToken::Local(token) => Some(token.as_str()),
            ServerToken::None => None,
        }
    }

    /// How the start-up line names the authentication in force.
    fn describe(&self, settings: &Settings) -> String {
        match self {
            ServerToken::Operator(_) => String::from("on: ZUNO_API_TOKEN"),
            ServerToken::Local(_) => format!(
                "on: local token in {}",
                zuno_shared::tokens::local::path(&settings.paths).display()
            ),
            ServerToken::None => String::from("OFF (--insecure-no-auth)"),
        }
    }
}

/// Puts right what a previous run (or no run) left undone. Each is logged, and none of their
/// failures keeps the API from serving.
async fn start_up_repairs(state: &AppState) {
    // Start-up reconciliation of resident Memory: historical applying/undoing candidates are
    // classified (never replayed) and missing projections restored from their revision.
    match state.memory.reconcile().await {
        Ok(report) => tracing::info!(?report, "memory reconciliation finished"),
        Err(error) => tracing::warn!(%error, "memory reconciliation failed"),
    }
    // Start-up catch-up: admit recent completed turns that missed admission (e.g. written while
    // no server ran). Failures here must not keep the API from serving.
    match state.ingestion.catch_up().await {
        Ok(outcomes) => {
            let admitted = outcomes
                .iter()
                .filter(|o| o.admission.as_ref().is_some_and(|a| a.is_new()))
                .count();
            tracing::info!(
                checked = outcomes.len(),
                admitted,
                "start-up catch-up finished"
            );
        }
        Err(error) => tracing::warn!(%error, "start-up catch-up failed"),
    }
    // With an embeddings provider configured, experiences stored before it (or while no worker
    // embedded them) are queued for embedding; idempotent, nothing without a provider.
    match zuno_shared::learning::recall::semantic::backfill(&state.ledger, &state.config, None)
        .await
    {
        Ok(report) if report.configured => {
            tracing::info!(?report, "start-up embedding backfill finished")
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "start-up embedding backfill failed"),
    }
}

/// The tasks that run beside the server until `shutdown`: with `--all-in-one`, the workers too.
fn spawn_background(
    state: &AppState,
    db: &Db,
    settings: &Settings,
    args: &ServeArgs,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<tokio::task::JoinSet<()>, CliError> {
    let mut background = tokio::task::JoinSet::new();
    background.spawn(zuno_shared::telemetry::report_queue_depth(
        state.ledger.clone(),
        shutdown.clone(),
    ));
    // The server answers `context`; keeping the recall index caught up here spares its callers
    // scoring pending records from their text.
    background.spawn(zuno_shared::learning::recall::index::drain(
        db.clone(),
        shutdown.clone(),
        None,
    ));
    if args.all_in_one {
        for runner in all_in_one_runners(settings, db, args.worker_concurrency)? {
            let shutdown = shutdown.clone();
            background.spawn(async move {
                runner.run(shutdown).await;
            });
        }
    }
    Ok(background)
}

/// Stdout's first line is one a supervisor or test can wait for; a server without
/// authentication says so on stderr too, where a person watching will see it.
fn announce(
    address: &SocketAddr,
    args: &ServeArgs,
    db: &Db,
    server_token: &ServerToken,
    settings: &Settings,
    state: &AppState,
) {
    println!(
        "zuno listening on http://{address} ({} database{}, auth {})",
        db.backend().as_str(),
        if args.all_in_one {
            ", all workers in-process"
        } else {
            ""
        },
        server_token.describe(settings),
    );
    match server_token {
        ServerToken::Local(_) => {
            if let Some(code) = state.dashboard.new_code() {
                println!("dashboard (one-time sign-in link): http://{address}/ui#code={code}");
            }
        }
        ServerToken::None => {
            tracing::warn!(
                %address,
                "authentication is OFF (--insecure-no-auth): any local process can read and change everything"
            );
            eprintln!(
                "zuno: WARNING: authentication is off (--insecure-no-auth); any local process can read and change everything"
            );
        }
        ServerToken::Operator(_) => {}
    }
    tracing::info!(%address, all_in_one = args.all_in_one, "server started");
}

/// One runner per worker stage, sharing the server's database handle.
fn all_in_one_runners(
    settings: &Settings,
    db: &Db,
    concurrency: usize,
) -> Result<Vec<Runner>, CliError> {
    let ledger = Ledger::new(db.clone(), system_clock());
    let env = WorkerEnv {
        settings: settings.clone(),
        ledger: ledger.clone(),
    };
    type Build = fn(&WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>>;
    type Gate = fn(&WorkerEnv) -> Arc<dyn ClaimGate>;
    let stages: [(&str, Build, Gate); 4] = [
        ("extract", zuno_worker_extract::handlers, source_gate),
        ("maintain", zuno_worker_maintain::handlers, source_gate),
        ("mine", zuno_worker_mine::handlers, source_gate),
        ("eval", zuno_worker_eval::handlers, allow_all),
    ];
    let post_turn = &settings.config.learning.post_turn;
    let mut runners = Vec::new();
    for (stage, build, gate) in stages {
        let mut config = RunnerConfig::new(default_worker_id(&format!("zuno-{stage}")));
        config.concurrency = concurrency.max(1);
        config.max_jobs_per_wake = post_turn.max_jobs_per_wake.max(1) as usize;
        config.poll_interval = Duration::from_millis(post_turn.poll_interval_ms.max(1));
        let mut runner = Runner::new(ledger.clone(), config).with_gate(gate(&env));
        for handler in build(&env)? {
            runner = runner.register(handler);
        }
        runners.push(runner);
    }
    Ok(runners)
}
