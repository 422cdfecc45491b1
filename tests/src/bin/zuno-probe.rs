//! A test helper process: admits jobs or runs a worker whose handler records an observable
//! effect, so multi-process tests can check "exactly once" from the database.
//!
//! It connects without migrating (tests migrate first and add a `probe_effect` table, which
//! the real binaries' schema check would rightly refuse).

use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use zuno_shared::clock::system_clock;
use zuno_shared::db::{ConnectOptions, Db};
use zuno_shared::ledger::{
    AllowAll, Job, JobIdentity, JobKind, JobOrigin, Ledger, NewJob, bucket_start,
};
use zuno_shared::runtime::{JobContext, JobError, JobHandler, Runner, RunnerConfig};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    database_url: String,
    /// How long a SQLite statement waits for another connection's write lock.
    #[arg(long)]
    busy_timeout_ms: Option<u64>,
    #[command(subcommand)]
    command: Probe,
}

#[derive(Subcommand)]
enum Probe {
    /// Admit one maintain identity `count` times concurrently; print the outcome.
    Admit {
        #[arg(long)]
        key: String,
        #[arg(long)]
        count: usize,
    },
    /// Admit the periodic aggregation job for the bucket containing `now_ms`.
    AdmitBucket {
        #[arg(long)]
        project: String,
        #[arg(long)]
        period_ms: i64,
        #[arg(long)]
        now_ms: i64,
    },
    /// Run a worker for `maintain` jobs that records each job's effect.
    Work {
        /// Default: drawn like every worker binary's (`zuno-probe@<host>:<pid>:<nonce>`, a new
        /// nonce per process start).
        #[arg(long)]
        worker_id: Option<String>,
        #[arg(long, default_value_t = 30_000)]
        lease_ms: u64,
        #[arg(long, default_value_t = 10_000)]
        heartbeat_ms: u64,
        #[arg(long, default_value_t = 2)]
        concurrency: usize,
        #[arg(long, default_value_t = 2)]
        max_jobs_per_wake: usize,
        /// Time spent "working" before settling.
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
        /// Idle poll interval (the runner's fallback when nothing wakes it).
        #[arg(long, default_value_t = 200)]
        poll_ms: u64,
        /// No fast polling after progress: only a wake-up or the idle poll starts a claim.
        #[arg(long)]
        no_fast_poll: bool,
        #[arg(long)]
        exit_when_idle: bool,
        /// How long shutdown waits for running jobs before releasing them.
        #[arg(long, default_value_t = 5_000)]
        grace_ms: u64,
        /// Serve `GET /metrics` (the ledger counters) on this address, with logs on stderr.
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
    },
}

struct EffectHandler {
    hold: Duration,
}

#[async_trait::async_trait]
impl JobHandler for EffectHandler {
    fn kind(&self) -> JobKind {
        JobKind::Maintain
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        if !self.hold.is_zero() {
            tokio::time::sleep(self.hold).await;
        }
        let mut settlement = ctx.begin_settlement().await?;
        let worker = ctx.lease().worker_id.clone();
        let attempt = ctx.lease().attempt;
        zuno_shared::on_tx!(settlement.tx().await?, |conn| sqlx::query(
            "INSERT INTO probe_effect (job_id, worker_id, attempt) VALUES ($1, $2, $3)"
        )
        .bind(&ctx.job().id)
        .bind(&worker)
        .bind(attempt)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(settlement
            .complete(serde_json::json!({ "worker": worker }))
            .await?)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut options = ConnectOptions::new(args.database_url);
    options.max_connections = 4;
    if let Some(ms) = args.busy_timeout_ms {
        options.busy_timeout = Duration::from_millis(ms);
    }
    let db = Db::connect(&options, zuno_shared::migrations::schema()).await?;
    let ledger = Ledger::new(db.clone(), system_clock());
    match args.command {
        Probe::Admit { key, count } => {
            let barrier = Arc::new(tokio::sync::Barrier::new(count));
            let mut tasks = Vec::new();
            for _ in 0..count {
                let ledger = ledger.clone();
                let key = key.clone();
                let barrier = barrier.clone();
                tasks.push(tokio::spawn(async move {
                    barrier.wait().await;
                    let job = NewJob::new(
                        JobIdentity::maintain("probe", "/probe", &key),
                        JobOrigin::Explicit,
                    );
                    ledger.admit(job).await
                }));
            }
            let mut queued = 0;
            let mut ids = std::collections::BTreeSet::new();
            for task in tasks {
                let admission = task.await??;
                queued += usize::from(admission.is_new());
                ids.insert(admission.job().id.clone());
            }
            println!("{}", serde_json::json!({ "queued": queued, "ids": ids }));
        }
        Probe::AdmitBucket {
            project,
            period_ms,
            now_ms,
        } => {
            let identity = JobIdentity::aggregate_project(
                &project,
                bucket_start(now_ms, period_ms),
                0,
                "evidence",
            );
            let admission = ledger
                .admit(NewJob::new(identity, JobOrigin::Periodic))
                .await?;
            println!(
                "{}",
                serde_json::json!({ "outcome": admission.outcome(), "id": admission.job().id })
            );
        }
        Probe::Work {
            worker_id,
            lease_ms,
            heartbeat_ms,
            concurrency,
            max_jobs_per_wake,
            hold_ms,
            poll_ms,
            no_fast_poll,
            exit_when_idle,
            grace_ms,
            metrics_addr,
        } => {
            let shutdown = zuno_shared::runtime::shutdown::on_signal();
            // Telemetry only where a test reads the metrics: its global meter would otherwise
            // outlive nothing useful, and the other tests read this process's stdout only.
            let telemetry = match metrics_addr {
                Some(_) => Some(zuno_shared::runtime::process::init_telemetry(
                    "zuno-probe",
                    &zuno_shared::config::Config::default(),
                )?),
                None => None,
            };
            let metrics = match (metrics_addr, &telemetry) {
                (Some(address), Some(telemetry)) => Some(
                    zuno_shared::telemetry::MetricsServer::start(
                        address,
                        telemetry.registry().clone(),
                        shutdown.clone(),
                    )
                    .await?,
                ),
                _ => None,
            };
            let worker_id = worker_id
                .unwrap_or_else(|| zuno_shared::runtime::process::default_worker_id("zuno-probe"));
            let mut config = RunnerConfig::new(worker_id);
            config.lease = Duration::from_millis(lease_ms);
            config.heartbeat = Duration::from_millis(heartbeat_ms);
            config.concurrency = concurrency;
            config.max_jobs_per_wake = max_jobs_per_wake;
            config.poll_interval = Duration::from_millis(poll_ms);
            config.fast_poll = !no_fast_poll;
            config.exit_when_idle = exit_when_idle;
            config.grace = Duration::from_millis(grace_ms);
            let listener =
                zuno_shared::runtime::wake::start_cross_process_wake(&db, shutdown.clone()).await?;
            let report = Runner::new(ledger, config)
                .with_gate(Arc::new(AllowAll))
                .register(Arc::new(EffectHandler {
                    hold: Duration::from_millis(hold_ms),
                }))
                .run(shutdown.clone())
                .await;
            shutdown.cancel();
            if let Some(listener) = listener {
                listener.await?;
            }
            if let Some(metrics) = metrics {
                metrics.abort();
            }
            println!(
                "{}",
                serde_json::json!({
                    "completed": report.completed, "failed": report.failed, "retried": report.retried,
                    "leaseLost": report.lease_lost, "released": report.released, "abandoned": report.abandoned,
                })
            );
        }
    }
    db.close().await;
    Ok(())
}
