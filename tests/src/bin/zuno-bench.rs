//! Ledger throughput beside a raw-SQL baseline on the same database in the same run.
//!
//! `zuno-bench admit` times admissions (one transaction each) through the ledger and through a
//! bare `INSERT … ON CONFLICT DO NOTHING`. `zuno-bench drain --workers N` times N worker
//! processes claiming and settling jobs through the ledger runtime, then N processes running the
//! minimal claim (`UPDATE … LIMIT k RETURNING`) and fenced complete statements. Each prints one
//! JSON line with jobs/s and the ledger/baseline ratio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use zuno_shared::clock::system_clock;
use zuno_shared::db::{Backend, ConnectOptions, Db, SqliteSynchronous};
use zuno_shared::ledger::{AllowAll, Job, JobIdentity, JobKind, JobOrigin, Ledger, NewJob};
use zuno_shared::runtime::{JobContext, JobError, JobHandler, Runner, RunnerConfig};

#[derive(Parser)]
struct Args {
    /// Database URL; default: a new SQLite file in a temporary directory.
    #[arg(long)]
    database_url: Option<String>,
    /// SQLite `synchronous` (full or normal).
    #[arg(long, default_value = "full")]
    synchronous: String,
    /// Alternating baseline/ledger rounds; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[command(subcommand)]
    command: Bench,
}

#[derive(Subcommand)]
enum Bench {
    Admit {
        #[arg(long, default_value_t = 3000)]
        jobs: usize,
    },
    Drain {
        #[arg(long, default_value_t = 3000)]
        jobs: usize,
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Jobs in flight per worker process.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Jobs claimed per wake (the ledger's max_jobs_per_wake; the baseline claims as many).
        #[arg(long, default_value_t = 2)]
        per_wake: usize,
    },
    /// Internal: one ledger worker process.
    LedgerWorker {
        #[arg(long)]
        concurrency: usize,
        #[arg(long)]
        per_wake: usize,
    },
    /// Internal: one raw-SQL worker process.
    RawWorker {
        #[arg(long)]
        concurrency: usize,
        #[arg(long)]
        per_wake: usize,
    },
}

struct Noop;

#[async_trait::async_trait]
impl JobHandler for Noop {
    fn kind(&self) -> JobKind {
        JobKind::Maintain
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        Ok(ctx
            .begin_settlement()
            .await?
            .complete(serde_json::json!({}))
            .await?)
    }
}

fn options(url: &str, synchronous: &str) -> ConnectOptions {
    let mut options = ConnectOptions::new(url);
    options.sqlite_synchronous = if synchronous == "normal" {
        SqliteSynchronous::Normal
    } else {
        SqliteSynchronous::Full
    };
    options.max_connections = 8;
    options
}

fn job(prefix: &str, i: usize) -> NewJob {
    NewJob::new(
        JobIdentity::maintain("bench", "/bench", &format!("{prefix}-{i}")),
        JobOrigin::Explicit,
    )
}

async fn reset(db: &Db) -> anyhow::Result<()> {
    zuno_shared::on_db!(db, |pool| sqlx::query("DELETE FROM learning_job_event")
        .execute(pool)
        .await
        .map(|d| d.rows_affected()))?;
    zuno_shared::on_db!(db, |pool| sqlx::query("DELETE FROM learning_job")
        .execute(pool)
        .await
        .map(|d| d.rows_affected()))?;
    Ok(())
}

async fn raw_insert(db: &Db, i: usize, prefix: &str) -> anyhow::Result<()> {
    let sql = "INSERT INTO learning_job (id, kind, identity_key, origin, priority, state, run_at, created_at, updated_at) \
               VALUES ($1, 'maintain', $2, 'explicit', 150, 'queued', $3, $3, $3) ON CONFLICT (kind, identity_key) DO NOTHING";
    let now = zuno_shared::clock::now_ms();
    zuno_shared::on_db!(db, |pool| sqlx::query(sql)
        .bind(zuno_shared::ids::new_id("job"))
        .bind(format!("{prefix}-{i}"))
        .bind(now)
        .execute(pool)
        .await
        .map(|d| d.rows_affected()))?;
    Ok(())
}

async fn wait_children(children: Vec<tokio::process::Child>) -> anyhow::Result<()> {
    for child in children {
        let output = child.wait_with_output().await?;
        anyhow::ensure!(
            output.status.success(),
            "worker failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

fn spawn(url: &str, synchronous: &str, args: &[String]) -> anyhow::Result<tokio::process::Child> {
    Ok(tokio::process::Command::new(std::env::current_exe()?)
        .args(["--database-url", url, "--synchronous", synchronous])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let temp = tempfile::tempdir()?;
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", temp.path().join("bench.db").display()));
    let db = Db::open(
        &options(&url, &args.synchronous),
        zuno_shared::migrations::schema(),
    )
    .await?;
    let backend = db.backend();
    let ledger = Ledger::new(db.clone(), system_clock());
    match args.command {
        Bench::Admit { jobs } => {
            let mut rounds = Vec::new();
            for _ in 0..args.rounds {
                reset(&db).await?;
                let started = Instant::now();
                for i in 0..jobs {
                    raw_insert(&db, i, "raw").await?;
                }
                let raw = jobs as f64 / started.elapsed().as_secs_f64();
                reset(&db).await?;
                let started = Instant::now();
                for i in 0..jobs {
                    ledger.admit(job("ledger", i)).await?;
                }
                rounds.push((jobs as f64 / started.elapsed().as_secs_f64(), raw));
            }
            report(backend, &args.synchronous, "admit", 1, jobs, &rounds);
        }
        Bench::Drain {
            jobs,
            workers,
            concurrency,
            per_wake,
        } => {
            let mut rounds = Vec::new();
            for _ in 0..args.rounds {
                // Baseline first, then the ledger, on the same database.
                reset(&db).await?;
                for chunk in (0..jobs).collect::<Vec<_>>().chunks(500) {
                    let batch = chunk.iter().map(|&i| job("raw", i)).collect();
                    ledger.admit_batch(batch).await?;
                }
                let started = Instant::now();
                let children = (0..workers)
                    .map(|_| {
                        spawn(
                            &url,
                            &args.synchronous,
                            &[
                                "raw-worker".into(),
                                "--concurrency".into(),
                                concurrency.to_string(),
                                "--per-wake".into(),
                                per_wake.to_string(),
                            ],
                        )
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                wait_children(children).await?;
                let raw = jobs as f64 / started.elapsed().as_secs_f64();
                verify_all_completed(&db, jobs).await?;

                reset(&db).await?;
                for chunk in (0..jobs).collect::<Vec<_>>().chunks(500) {
                    let batch = chunk.iter().map(|&i| job("ledger", i)).collect();
                    ledger.admit_batch(batch).await?;
                }
                let started = Instant::now();
                let children = (0..workers)
                    .map(|_| {
                        spawn(
                            &url,
                            &args.synchronous,
                            &[
                                "ledger-worker".into(),
                                "--concurrency".into(),
                                concurrency.to_string(),
                                "--per-wake".into(),
                                per_wake.to_string(),
                            ],
                        )
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                wait_children(children).await?;
                let ledger_rate = jobs as f64 / started.elapsed().as_secs_f64();
                verify_all_completed(&db, jobs).await?;
                rounds.push((ledger_rate, raw));
            }
            report(
                backend,
                &args.synchronous,
                "claim+settle",
                workers,
                jobs,
                &rounds,
            );
        }
        Bench::LedgerWorker {
            concurrency,
            per_wake,
        } => {
            let mut config = RunnerConfig::new(format!("bench-{}", std::process::id()));
            config.concurrency = concurrency;
            config.max_jobs_per_wake = per_wake;
            config.exit_when_idle = true;
            config.heartbeat = Duration::from_secs(30);
            Runner::new(ledger, config)
                .with_gate(Arc::new(AllowAll))
                .register(Arc::new(Noop))
                .run(tokio_util::sync::CancellationToken::new())
                .await;
        }
        Bench::RawWorker {
            concurrency,
            per_wake,
        } => {
            // As many jobs in flight as a ledger worker: concurrency / per_wake claim loops.
            let loops = (concurrency / per_wake.max(1)).max(1);
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..loops {
                let db = db.clone();
                tasks.spawn(async move { raw_worker(&db, per_wake).await });
            }
            while let Some(done) = tasks.join_next().await {
                done??;
            }
        }
    }
    db.close().await;
    Ok(())
}

/// The minimal statements: claim k due rows with fresh tokens in one statement, then complete
/// each with a token-guarded update. Several loops run per process, like a worker's slots.
async fn raw_worker(db: &Db, per_wake: usize) -> anyhow::Result<()> {
    let claim = match db.backend() {
        Backend::Postgres => {
            "WITH picked AS (SELECT id FROM learning_job WHERE kind = 'maintain' AND state = 'queued' AND run_at <= $1 \
               ORDER BY priority DESC, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE learning_job j SET state = 'running', attempts = attempts + 1, \
               lease_token = md5(random()::text || j.id), lease_expires_at = $1 + 30000, updated_at = $1 \
             FROM picked WHERE j.id = picked.id RETURNING j.id, j.lease_token"
        }
        Backend::Sqlite => {
            "UPDATE learning_job SET state = 'running', attempts = attempts + 1, \
               lease_token = lower(hex(randomblob(16))), lease_expires_at = $1 + 30000, updated_at = $1 \
             WHERE id IN (SELECT id FROM learning_job WHERE kind = 'maintain' AND state = 'queued' AND run_at <= $1 \
               ORDER BY priority DESC, run_at, id LIMIT $2) RETURNING id, lease_token"
        }
    };
    let complete = "UPDATE learning_job SET state = 'completed', result = '{}', lease_token = NULL, \
                      lease_expires_at = NULL, finished_at = $3, updated_at = $3 \
                    WHERE id = $1 AND lease_token = $2 AND state = 'running'";
    loop {
        let now = zuno_shared::clock::now_ms();
        let claimed: Vec<(String, String)> = zuno_shared::on_db!(db, |pool| sqlx::query_as(claim)
            .bind(now)
            .bind(per_wake as i64)
            .fetch_all(pool)
            .await)?;
        if claimed.is_empty() {
            return Ok(());
        }
        for (id, token) in claimed {
            let done = zuno_shared::on_db!(db, |pool| sqlx::query(complete)
                .bind(&id)
                .bind(&token)
                .bind(zuno_shared::clock::now_ms())
                .execute(pool)
                .await
                .map(|d| d.rows_affected()))?;
            anyhow::ensure!(done == 1, "baseline lost job {id}");
        }
    }
}

async fn verify_all_completed(db: &Db, jobs: usize) -> anyhow::Result<()> {
    let done: i64 = zuno_shared::on_db!(db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM learning_job WHERE state = 'completed'"
    )
    .fetch_one(pool)
    .await)?;
    anyhow::ensure!(done == jobs as i64, "only {done} of {jobs} jobs completed");
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Prints medians over rounds of (ledger, baseline) rates and of their per-round ratio.
fn report(
    backend: Backend,
    synchronous: &str,
    scenario: &str,
    workers: usize,
    jobs: usize,
    rounds: &[(f64, f64)],
) {
    let ledger = median(rounds.iter().map(|r| r.0).collect());
    let raw = median(rounds.iter().map(|r| r.1).collect());
    let ratio = median(rounds.iter().map(|r| r.0 / r.1).collect());
    println!(
        "{}",
        serde_json::json!({
            "backend": backend.as_str(),
            "sqliteSynchronous": if backend == Backend::Sqlite { synchronous } else { "-" },
            "scenario": scenario,
            "workers": workers,
            "jobs": jobs,
            "ledgerPerSec": ledger.round(),
            "baselinePerSec": raw.round(),
            "rounds": rounds.len(),
            "ratio": (ratio * 100.0).round() / 100.0,
        })
    );
}
