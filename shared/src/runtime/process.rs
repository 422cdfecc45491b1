//! What a worker process does around its runner: configuration, telemetry, waiting for the
//! database, migrations and signal handling. Each worker binary's `main` is a call to
//! [`run_worker`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};

use super::{JobHandler, Runner, RunnerConfig};
use crate::clock::system_clock;
use crate::config::{Config, EnvOverrides, load_file};
use crate::db::{ConnectOptions, Db};
use crate::ledger::{ClaimGate, Ledger};
use crate::paths::Paths;
use crate::telemetry::{MetricsServer, TelemetryConfig, TelemetryGuard, report_queue_depth};

/// Command-line options every worker binary accepts.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Identifies this worker in leases and logs (default: host name, process id and a nonce
    /// drawn at start, so a restarted container never reuses its predecessor's id).
    #[arg(long, env = "ZUNO_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Directory holding the database and configuration (default: platform directories).
    #[arg(long, env = "ZUNO_HOME")]
    pub home: Option<PathBuf>,
    /// Configuration file (default: config.json in the configuration directory).
    #[arg(long, env = "ZUNO_CONFIG")]
    pub config: Option<PathBuf>,
    /// Database URL (overrides ZUNO_DATABASE_URL, DATABASE_URL and the file).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Jobs run at once (claims take a whole wake's batch, so twice max_jobs_per_wake keeps
    /// every slot busy).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Jobs claimed per wake (default: learning.post_turn.max_jobs_per_wake).
    #[arg(long)]
    pub max_jobs_per_wake: Option<u32>,
    /// Lease length in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    pub lease_ms: u64,
    /// Heartbeat interval in milliseconds (default: a quarter of the lease); must be shorter
    /// than half the lease.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Start even when the heartbeat is not shorter than half the lease. Only for tests that
    /// need a lease to lapse under a live worker; a fleet must never run like this.
    #[arg(long, hide = true)]
    pub unchecked_heartbeat: bool,
    /// Idle poll interval in milliseconds (default: learning.post_turn.poll_interval_ms).
    #[arg(long)]
    pub poll_interval_ms: Option<u64>,
    /// How long shutdown waits for running jobs before releasing them, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub grace_ms: u64,
    /// Exit once nothing is left to claim (batch drains and tests).
    #[arg(long)]
    pub exit_when_idle: bool,
    /// Claim only jobs bound to one of these scopes (maintenance jobs are bound to their
    /// canonical memory path, e.g. `/src/web/.zuno/RULES.md`), so a host claims only the Memory
    /// it can write. Unset: every job of the worker's kinds.
    #[arg(long = "claim-scope", env = "ZUNO_CLAIM_SCOPES", value_delimiter = ',')]
    pub claim_scopes: Vec<String>,
    /// Serve `GET /metrics` (Prometheus text) and `GET /healthz` on this address, e.g.
    /// `0.0.0.0:9100`, so a scraper can reach every worker of a fleet. Off when absent.
    #[arg(long, env = "ZUNO_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Loaded configuration and the paths it came from.
#[derive(Debug, Clone)]
pub struct Settings {
    pub paths: Paths,
    pub config: Config,
}

impl Settings {
    /// Reads the configuration file and applies environment overrides, after refusing a home or
    /// configuration file another user could have planted ([`Paths::check_trusted`]).
    pub fn load(
        home: Option<&std::path::Path>,
        config_file: Option<&std::path::Path>,
    ) -> anyhow::Result<Settings> {
        let paths = Paths::resolve(home);
        paths.check_trusted(config_file)?;
        let file = config_file.map_or_else(|| paths.config_file(), std::path::Path::to_path_buf);
        let mut config = load_file(&file)?;
        EnvOverrides::from_env().apply(&mut config);
        Ok(Settings { paths, config })
    }

    /// The database to use: configured URL, else the SQLite file in the data directory.
    pub fn connect_options(&self) -> ConnectOptions {
        let mut options = match &self.config.database.url {
            Some(url) => ConnectOptions::new(url.clone()),
            None => ConnectOptions::sqlite_file(&self.paths.database()),
        };
        options.sqlite_synchronous = self.config.database.sqlite_synchronous;
        options
    }
}

/// Makes every file and directory this process creates private to its user (umask 077) unless
/// created with an explicit mode, as the files written into a worktree are
/// (`managed_file::inherited_mode`). Returns the umask it replaced.
pub fn private_umask() -> u32 {
    #[cfg(unix)]
    {
        use nix::sys::stat::{Mode, umask};
        umask(Mode::from_bits_truncate(0o077)).bits() as u32
    }
    #[cfg(not(unix))]
    {
        0
    }
}

/// The start of a long-running process: takes group and other access away from the home it
/// will use (a home made under a looser umask, or before Zuno kept it private), logging what
/// changed. A failure is logged, not fatal: the ownership check has already passed.
pub fn secure_home(paths: &Paths) {
    match paths.make_private() {
        Ok(changed) if !changed.is_empty() => {
            let changed: Vec<String> = changed.iter().map(|p| p.display().to_string()).collect();
            tracing::info!(?changed, "made Zuno's files private to their owner");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "could not make Zuno's files private"),
    }
}

/// Installs telemetry for a process named `service` and exports the domain counters at zero
/// (the ledger's are exported by each runner for its kinds, and by `zuno serve` for all).
pub fn init_telemetry(service: &str, config: &Config) -> anyhow::Result<TelemetryGuard> {
    let guard = crate::telemetry::init(&TelemetryConfig {
        service_name: service.to_owned(),
        json_logs: config.telemetry.json_logs,
        otlp_endpoint: config.telemetry.otlp_endpoint.clone(),
        metric_interval_ms: None,
    })?;
    crate::telemetry::metrics::export_from_zero();
    Ok(guard)
}

/// Connects and migrates, retrying while the database is unreachable (a worker may start
/// before its database). Schema refusals are not retried.
pub async fn open_database(
    options: &ConnectOptions,
    give_up_after: Duration,
) -> anyhow::Result<Db> {
    if !options.is_postgres()
        && let Some(parent) = std::path::Path::new(crate::paths::sqlite_path(&options.url)).parent()
        && !parent.as_os_str().is_empty()
    {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(parent)
            .with_context(|| format!("cannot create the data directory {}", parent.display()))?;
    }
    let connect = || async { Db::open(options, crate::migrations::schema()).await };
    let db = connect
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_total_delay(Some(give_up_after))
                .without_max_times(),
        )
        .when(|error| {
            matches!(error, crate::db::MigrationError::Store(store) if store.is_connection())
        })
        .notify(|error, delay| {
            tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "database not reachable yet");
        })
        .await?;
    if !options.is_postgres() {
        // SQLite creates the file at 0644 under the usual umask, and the -wal and -shm with the
        // file's mode; every transcript is in there.
        let file = crate::paths::sqlite_path(&options.url);
        for path in [
            file.to_owned(),
            format!("{file}-wal"),
            format!("{file}-shm"),
        ] {
            crate::paths::remove_group_and_other_access(std::path::Path::new(&path))
                .with_context(|| format!("cannot make the database {path} private"))?;
        }
    }
    Ok(db)
}

/// Everything a worker binary needs to build its handlers.
pub struct WorkerEnv {
    pub settings: Settings,
    pub ledger: Ledger,
}

/// The whole `main` of a worker binary: its command line is [`WorkerArgs`] under the binary's
/// name and description, so every worker reads the same flags and environment variables.
pub async fn worker_main(
    name: &'static str,
    about: &'static str,
    gate: impl FnOnce(&WorkerEnv) -> Arc<dyn ClaimGate>,
    handlers: impl FnOnce(&WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>>,
) -> anyhow::Result<()> {
    use clap::{Args as _, FromArgMatches as _};
    private_umask();
    let command = clap::Command::new(name)
        .about(about)
        .version(env!("CARGO_PKG_VERSION"));
    let matches = WorkerArgs::augment_args(command).get_matches();
    let args = WorkerArgs::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    run_worker(name, args, gate, handlers).await
}

/// Runs a worker process until SIGTERM/SIGINT (or until idle with `--exit-when-idle`).
pub async fn run_worker<G, F>(
    service: &str,
    args: WorkerArgs,
    gate: G,
    handlers: F,
) -> anyhow::Result<()>
where
    G: FnOnce(&WorkerEnv) -> Arc<dyn ClaimGate>,
    F: FnOnce(&WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>>,
{
    let mut settings = Settings::load(args.home.as_deref(), args.config.as_deref())?;
    if let Some(url) = &args.database_url {
        settings.config.database.url = Some(url.clone());
    }
    let telemetry = init_telemetry(service, &settings.config)?;
    secure_home(&settings.paths);
    let shutdown = super::shutdown::on_signal();
    // Bound before waiting for the database: a worker stuck on an unreachable database is
    // alive, and its metrics say so.
    let metrics_server = match args.metrics_addr {
        Some(address) => Some(
            MetricsServer::start(address, telemetry.registry().clone(), shutdown.clone())
                .await
                .with_context(|| format!("cannot serve metrics on {address}"))?,
        ),
        None => None,
    };
    let options = settings.connect_options();
    let db = tokio::select! {
        db = open_database(&options, Duration::from_secs(600)) => db?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let ledger = Ledger::new(db.clone(), system_clock());
    let env = WorkerEnv { settings, ledger };
    let handlers = handlers(&env)?;
    backfill_embeddings(&env, &handlers).await;
    let gate = gate(&env);
    let config = runner_config(&args, &env.settings.config, default_worker_id(service));
    if !args.unchecked_heartbeat {
        config.validate().context("invalid worker configuration")?;
    }
    let listener = super::wake::start_cross_process_wake(&db, shutdown.clone())
        .await
        .context("cannot watch for other processes' jobs (LISTEN, or the SQLite commit counter)")?;
    let mut runner = Runner::new(env.ledger.clone(), config).with_gate(gate);
    for handler in handlers {
        runner = runner.register(handler);
    }
    // Queue depth is database-wide; a worker publishes it only when its metrics go somewhere.
    let publishes_metrics =
        metrics_server.is_some() || env.settings.config.telemetry.otlp_endpoint.is_some();
    let mut background = tokio::task::JoinSet::new();
    if let Some(listener) = listener {
        background.spawn(async move {
            let _ = listener.await;
        });
    }
    if publishes_metrics {
        background.spawn(report_queue_depth(env.ledger.clone(), shutdown.clone()));
    }
    // The worker that stores experiences also drains what else left the recall index behind.
    if runner.kinds().contains(&crate::ledger::JobKind::Extract) {
        background.spawn(crate::learning::recall::index::drain(
            db.clone(),
            shutdown.clone(),
            None,
        ));
    }
    let report = runner.run(shutdown.clone()).await;
    shutdown.cancel();
    while background.join_next().await.is_some() {}
    if let Some(server) = metrics_server {
        server.abort();
    }
    db.close().await;
    tracing::info!(?report, "worker exited");
    Ok(())
}

/// A worker that embeds experiences first queues those without a vector of the configured model
/// (stored before the layer was configured, or while no worker ran); idempotent.
async fn backfill_embeddings(env: &WorkerEnv, handlers: &[Arc<dyn JobHandler>]) {
    if !handlers
        .iter()
        .any(|handler| handler.kind() == crate::ledger::JobKind::Embed)
    {
        return;
    }
    match crate::learning::recall::semantic::backfill(&env.ledger, &env.settings.config, None).await
    {
        Ok(report) if report.configured => {
            tracing::info!(?report, "start-up embedding backfill finished")
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "start-up embedding backfill failed"),
    }
}

/// The runner configuration a worker's flags and configuration file describe.
pub fn runner_config(args: &WorkerArgs, config: &Config, default_id: String) -> RunnerConfig {
    let lease = Duration::from_millis(args.lease_ms.max(1));
    let mut runner = RunnerConfig::new(args.worker_id.clone().unwrap_or(default_id));
    runner.concurrency = args.concurrency.max(1);
    runner.max_jobs_per_wake = args
        .max_jobs_per_wake
        .unwrap_or(config.learning.post_turn.max_jobs_per_wake)
        .max(1) as usize;
    runner.lease = lease;
    runner.heartbeat = args
        .heartbeat_ms
        .map_or(lease / 4, Duration::from_millis)
        .max(Duration::from_millis(1));
    runner.poll_interval = Duration::from_millis(
        args.poll_interval_ms
            .unwrap_or(config.learning.post_turn.poll_interval_ms)
            .max(1),
    );
    runner.grace = Duration::from_millis(args.grace_ms);
    runner.exit_when_idle = args.exit_when_idle;
    if !args.claim_scopes.is_empty() {
        runner.scopes = Some(args.claim_scopes.clone());
    }
    runner
}

/// The source gate: for extraction, source snapshots, session policy and forgotten sources; for
/// maintenance, the bound canonical memory path; for every automatic model call (extraction,
/// maintenance, mining), the daily token cap's reservation.
pub fn source_gate(env: &WorkerEnv) -> Arc<dyn ClaimGate> {
    Arc::new(crate::learning::SourceGate::new(
        Arc::new(env.settings.config.clone()),
        env.ledger.clock().clone(),
    ))
}

/// A gate that lets every job through (stages without sources to revalidate).
pub fn allow_all(_env: &WorkerEnv) -> Arc<dyn ClaimGate> {
    Arc::new(crate::ledger::AllowAll)
}

/// `<service>@<host>:<pid>:<nonce>`. The nonce is drawn once per process start: in a container
/// the host name survives a restart and the pid is always 1, and a worker id that outlives its
/// process would make audit events and lease owners of two processes indistinguishable.
pub fn default_worker_id(service: &str) -> String {
    static NONCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let nonce = NONCE.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..8].to_owned());
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| String::from("localhost"));
    format!("{service}@{host}:{}:{nonce}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_worker_ids_carry_host_pid_and_a_start_nonce() {
        let id = default_worker_id("zuno-worker-extract");
        let (service, rest) = id.split_once('@').unwrap();
        assert_eq!(service, "zuno-worker-extract");
        let parts: Vec<&str> = rest.rsplitn(3, ':').collect();
        assert_eq!(parts.len(), 3, "{id}");
        let (nonce, pid) = (parts[0], parts[1]);
        assert_eq!(pid, std::process::id().to_string());
        assert_eq!(nonce.len(), 8);
        assert!(nonce.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_eq!(
            default_worker_id("zuno-worker-mine")
                .split_once('@')
                .unwrap()
                .1,
            rest,
            "one nonce per process start"
        );
    }

    #[test]
    fn a_worker_refuses_a_heartbeat_slower_than_half_its_lease() {
        let args = WorkerArgs {
            worker_id: None,
            home: None,
            config: None,
            database_url: None,
            concurrency: 4,
            max_jobs_per_wake: None,
            lease_ms: 60_000,
            heartbeat_ms: Some(40_000),
            unchecked_heartbeat: false,
            poll_interval_ms: None,
            grace_ms: 30_000,
            exit_when_idle: false,
            claim_scopes: Vec::new(),
            metrics_addr: None,
        };
        let config = runner_config(&args, &Config::default(), String::from("w"));
        assert!(matches!(
            config.validate(),
            Err(crate::runtime::RunnerConfigError::HeartbeatTooSlow { .. })
        ));
    }
}
