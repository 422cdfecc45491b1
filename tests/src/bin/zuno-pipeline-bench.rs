//! Whole-pipeline throughput on Postgres (docs/benchmarks.md; runs in docs/benchmarks-history.md,
//! "Whole pipeline").
//!
//! `zuno-pipeline-bench run` measures, for each worker-process count W:
//!
//! - **pipeline**: a `zuno serve` API process and W `zuno-worker-extract` processes (release
//!   binaries beside this one) on a fresh Postgres database. Concurrent HTTP clients close N
//!   turns (a user correction, then a completed assistant turn with a tool call: two requests,
//!   the second admits an `extract` job in its transaction); the workers extract each through the
//!   model extractor against an in-process fake provider that answers at once with a valid,
//!   cited experience, and settle it. Timed from the first request to the last settlement.
//! - **baseline**: the same N jobs through the ledger alone: the same clients admit `maintain`
//!   jobs with `Ledger::admit` (one autocommit + NOTIFY each) and W worker processes with the
//!   same process harness (`run_worker`: LISTEN, claims, heartbeats) settle each with a no-op
//!   handler.
//!
//! With `--drain`, every job is admitted first with no worker running, then the W workers are
//! started and the time from their start to the last settlement is measured: the workers'
//! throughput alone, without admission competing for the cores.
//!
//! Rounds alternate baseline and pipeline; medians are reported. CPU time is read from `/proc`
//! for Postgres (the postmaster and its children), the API, the workers and this process (the
//! HTTP clients and the fake provider), beside whole-machine busy time, so the figures say
//! where the cores went, and per job. When the cluster loads `pg_stat_statements` (as
//! `scripts/bench` sets it up), each run also counts the statements its database executed per
//! job, from the first request to the last settlement (this process's own polling excluded),
//! and the pipeline's most frequent statements go to stderr. One JSON line per worker count.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use zuno_shared::clock::system_clock;
use zuno_shared::db::{ConnectOptions, Db, create_scratch_database, drop_scratch_database};
use zuno_shared::ledger::{Job, JobIdentity, JobKind, JobOrigin, Ledger, NewJob};
use zuno_shared::runtime::process::{WorkerArgs, allow_all, run_worker};
use zuno_shared::runtime::{JobContext, JobError, JobHandler};
use zuno_tests::fake_provider::FakeProvider;
use zuno_tests::pnpm::{self, valid_answer};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Runs the benchmark and prints one JSON line per worker count.
    Run {
        /// A Postgres URL whose role may create databases (one fresh database per run).
        #[arg(long, env = "ZUNO_TEST_DATABASE_URL")]
        admin_url: String,
        /// Closed turns (jobs) per run.
        #[arg(long, default_value_t = 1000)]
        jobs: usize,
        /// Alternating baseline/pipeline rounds; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Worker-process counts to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        workers: Vec<usize>,
        /// Concurrent HTTP clients (each its own sessions), and concurrent admitters in the
        /// baseline.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Turns per session before a client opens the next one.
        #[arg(long, default_value_t = 10)]
        turns_per_session: usize,
        /// Where `zuno` and `zuno-worker-extract` are (default: beside this binary).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// The cluster's postmaster.pid, to attribute Postgres CPU (default:
        /// `$ZUNO_TEST_PG_DIR/data/postmaster.pid`, as `scripts/pg-cluster` sets it).
        #[arg(long)]
        pg_pid_file: Option<PathBuf>,
        /// Admit every job before any worker starts, then time the workers draining the queue.
        #[arg(long)]
        drain: bool,
        /// Milliseconds the fake provider takes per call; the baseline's no-op handler waits
        /// as long before settling, so both sides spend the same time waiting per job.
        #[arg(long, default_value_t = 0)]
        provider_delay_ms: u64,
        /// Jobs each worker process runs at once (`--concurrency`; default: the binaries').
        #[arg(long)]
        concurrency: Option<usize>,
        /// Jobs each worker claims per wake (`--max-jobs-per-wake`; default: the binaries').
        #[arg(long)]
        max_jobs_per_wake: Option<u32>,
        /// Every session teaches a lesson of its own (the fake provider cites each session's
        /// correction), instead of all sessions restating one lesson, which makes every
        /// settlement reinforce the same experience row.
        #[arg(long)]
        distinct_lessons: bool,
    },
    /// Turn → settled experience latency, one turn at a time, on SQLite and Postgres, with a
    /// ledger-only baseline (admit → no-op settle) through the same harness in the same run.
    Latency {
        /// A Postgres URL whose role may create databases; without it the Postgres setup is
        /// skipped.
        #[arg(long, env = "ZUNO_TEST_DATABASE_URL")]
        admin_url: Option<String>,
        /// Closed turns (and baseline jobs) per setup.
        #[arg(long, default_value_t = 100)]
        turns: usize,
        /// Idle time before each closing request, drawn uniformly from [min, max] ms so a
        /// worker's poll timer cannot line up with the turns: each turn finds the worker idle.
        #[arg(long, value_delimiter = ',', default_value = "100,700")]
        gap_ms: Vec<u64>,
        /// How often the observer polls the job's state, in ms (the measurement's resolution,
        /// plus one query).
        #[arg(long, default_value_t = 1)]
        poll_ms: u64,
        /// Setups to measure.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "sqlite-all-in-one,sqlite-worker,postgres"
        )]
        setups: Vec<Setup>,
        /// Where `zuno` and `zuno-worker-extract` are (default: beside this binary).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
    },
    /// Internal: a worker process with the real process harness and a no-op `maintain` handler.
    NoopWorker {
        #[command(flatten)]
        worker: WorkerArgs,
        /// Milliseconds each job waits before settling (a stand-in for a provider call).
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
    },
}

/// Where the turn → experience latency is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Setup {
    /// `zuno serve --all-in-one` on its SQLite file: the API and every worker stage in one
    /// process, woken through the in-process bus (the embedded default).
    SqliteAllInOne,
    /// `zuno serve` and a separate `zuno-worker-extract` process on the same SQLite file, woken
    /// by its watcher of SQLite's commit counter (`data_version`).
    SqliteWorker,
    /// `zuno serve` and one `zuno-worker-extract` process on Postgres, woken by NOTIFY.
    Postgres,
}

impl Setup {
    fn as_str(self) -> &'static str {
        match self {
            Setup::SqliteAllInOne => "sqlite-all-in-one",
            Setup::SqliteWorker => "sqlite-worker",
            Setup::Postgres => "postgres",
        }
    }
}

/// Settles each job through the fenced settlement, like zuno-bench's ledger worker, after
/// `hold` (zero: at once).
struct Noop {
    hold: Duration,
}

#[async_trait::async_trait]
impl JobHandler for Noop {
    fn kind(&self) -> JobKind {
        JobKind::Maintain
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        if !self.hold.is_zero() {
            tokio::time::sleep(self.hold).await;
        }
        Ok(ctx
            .begin_settlement()
            .await?
            .complete(serde_json::json!({}))
            .await?)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Bench::NoopWorker { worker, hold_ms } => {
            run_worker("zuno-bench-noop", worker, allow_all, move |_| {
                Ok(vec![Arc::new(Noop {
                    hold: Duration::from_millis(hold_ms),
                }) as Arc<dyn JobHandler>])
            })
            .await
        }
        Bench::Latency {
            admin_url,
            turns,
            gap_ms,
            poll_ms,
            setups,
            bin_dir,
        } => {
            let bin_dir = match bin_dir {
                Some(dir) => dir,
                None => std::env::current_exe()?
                    .parent()
                    .context("binary directory")?
                    .to_path_buf(),
            };
            let gap = match gap_ms.as_slice() {
                [fixed] => (*fixed, *fixed),
                [min, max] if min <= max => (*min, *max),
                _ => anyhow::bail!("--gap-ms takes one value or min,max"),
            };
            latency::run(latency::Options {
                admin_url,
                turns: turns.max(1),
                gap,
                poll: Duration::from_millis(poll_ms.max(1)),
                setups,
                bin_dir,
            })
            .await
        }
        Bench::Run {
            admin_url,
            jobs,
            rounds,
            workers,
            clients,
            turns_per_session,
            bin_dir,
            pg_pid_file,
            drain,
            provider_delay_ms,
            concurrency,
            max_jobs_per_wake,
            distinct_lessons,
        } => {
            let bin_dir = match bin_dir {
                Some(dir) => dir,
                None => std::env::current_exe()?
                    .parent()
                    .context("binary directory")?
                    .to_path_buf(),
            };
            let pg_pid_file = pg_pid_file.or_else(|| {
                std::env::var_os("ZUNO_TEST_PG_DIR")
                    .map(|dir| Path::new(&dir).join("data/postmaster.pid"))
            });
            let bench = PipelineBench {
                admin_url,
                jobs,
                clients: clients.max(1),
                turns_per_session: turns_per_session.max(1),
                bin_dir,
                postmaster: pg_pid_file.as_deref().and_then(postmaster_pid),
                serial: std::sync::atomic::AtomicUsize::new(0),
                drain,
                provider_delay: Duration::from_millis(provider_delay_ms),
                concurrency,
                max_jobs_per_wake,
                distinct_lessons,
            };
            eprintln!(
                "{} jobs, {} rounds, workers {workers:?}, {} mode, {}, provider delay {provider_delay_ms} ms, \
                 concurrency {}, max jobs per wake {}; Postgres CPU {}",
                jobs,
                rounds,
                if drain { "drain" } else { "concurrent" },
                if distinct_lessons {
                    "a lesson per session"
                } else {
                    "one lesson restated"
                },
                concurrency.map_or_else(|| String::from("default"), |c| c.to_string()),
                max_jobs_per_wake.map_or_else(|| String::from("default"), |c| c.to_string()),
                if bench.postmaster.is_some() {
                    "attributed"
                } else {
                    "not attributed (no postmaster.pid)"
                }
            );
            let mut results: HashMap<usize, Vec<(RunResult, RunResult)>> = HashMap::new();
            for round in 0..rounds {
                for &count in &workers {
                    let baseline = bench.baseline(count).await?;
                    let pipeline = bench.pipeline(count).await?;
                    eprintln!(
                        "round {} workers {count}: pipeline {:.0} jobs/s ({}), baseline {:.0} jobs/s ({})",
                        round + 1,
                        pipeline.rate(),
                        pipeline.cpu.describe(),
                        baseline.rate(),
                        baseline.cpu.describe(),
                    );
                    results.entry(count).or_default().push((pipeline, baseline));
                }
            }
            for count in workers {
                report(
                    if drain { "drain" } else { "concurrent" },
                    count,
                    jobs,
                    &results[&count],
                );
            }
            Ok(())
        }
    }
}

struct PipelineBench {
    admin_url: String,
    jobs: usize,
    clients: usize,
    turns_per_session: usize,
    bin_dir: PathBuf,
    postmaster: Option<u32>,
    serial: std::sync::atomic::AtomicUsize,
    drain: bool,
    provider_delay: Duration,
    concurrency: Option<usize>,
    max_jobs_per_wake: Option<u32>,
    distinct_lessons: bool,
}

/// One timed run.
#[derive(Debug, Clone)]
struct RunResult {
    jobs: usize,
    /// From the first request (admission) to the last settlement.
    elapsed: Duration,
    /// From the first request to the last admission.
    admission: Duration,
    /// CPU time over the run, in cores (CPU-seconds per wall second).
    cpu: Cpu,
    /// Statements per job, when the cluster loads `pg_stat_statements`.
    statements: Option<Statements>,
}

impl RunResult {
    fn rate(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU milliseconds per job of something that used `cores` over the run.
    fn per_job_ms(&self, cores: f64) -> f64 {
        cores * self.elapsed.as_secs_f64() * 1000.0 / self.jobs as f64
    }
}

/// `pg_stat_statements` counters of one database: calls and execution time per (statement,
/// top level).
type StatementCalls = HashMap<(String, bool), (i64, f64)>;

/// The counters of database `name`; `None` when the cluster does not load the extension.
async fn statement_calls(admin_url: &str, name: &str) -> Option<StatementCalls> {
    let admin = sqlx::PgPool::connect(admin_url).await.ok()?;
    let rows: Vec<(String, bool, i64, f64)> = sqlx::query_as(
        "SELECT s.query, s.toplevel, s.calls, s.total_exec_time \
         FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1",
    )
    .bind(name)
    .fetch_all(&admin)
    .await
    .ok()?;
    admin.close().await;
    let mut calls = StatementCalls::new();
    for (query, top_level, count, ms) in rows {
        let entry = calls.entry((query, top_level)).or_default();
        entry.0 += count;
        entry.1 += ms;
    }
    Some(calls)
}

/// Statements a run's database executed per job.
#[derive(Debug, Clone)]
struct Statements {
    /// Every statement, those run inside functions and triggers included (`track = all`).
    all: f64,
    /// Statements sent by a client: round trips.
    top_level: f64,
    /// Per statement: calls and execution milliseconds per job, most frequent first.
    by_statement: Vec<(String, f64, f64)>,
}

impl Statements {
    /// This process's own polling for the last settlement, not the system's work.
    const OWN: &'static str = "SELECT COUNT(*) FROM learning_job WHERE kind = $1";

    fn between(
        before: Option<StatementCalls>,
        after: Option<StatementCalls>,
        jobs: usize,
    ) -> Option<Statements> {
        let (before, after) = (before?, after?);
        let jobs = jobs.max(1) as f64;
        let mut statements = Statements {
            all: 0.0,
            top_level: 0.0,
            by_statement: Vec::new(),
        };
        for ((query, top_level), (calls, ms)) in after {
            let (calls_before, ms_before) = before
                .get(&(query.clone(), top_level))
                .copied()
                .unwrap_or_default();
            let calls = (calls - calls_before) as f64 / jobs;
            if calls <= 0.0 || query.starts_with(Self::OWN) {
                continue;
            }
            statements.all += calls;
            if top_level {
                statements.top_level += calls;
            }
            let text = if top_level {
                query
            } else {
                format!("(nested) {query}")
            };
            statements
                .by_statement
                .push((text, calls, (ms - ms_before) / jobs));
        }
        statements.by_statement.sort_by(|a, b| b.1.total_cmp(&a.1));
        Some(statements)
    }

    fn print_top(&self, side: &str, count: usize) {
        eprintln!(
            "{side}: {:.1} statements per job ({:.1} sent by clients); the most frequent, calls and ms per job:",
            self.all, self.top_level
        );
        for (query, calls, ms) in self.by_statement.iter().take(count) {
            let query: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
            let short: String = query.chars().take(150).collect();
            eprintln!("  {calls:6.2} {ms:7.3}  {short}");
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Cpu {
    postgres: Option<f64>,
    api: f64,
    workers: f64,
    bench: f64,
    machine: f64,
}

impl Cpu {
    /// CPU of the run's own processes.
    fn own(&self) -> f64 {
        self.postgres.unwrap_or(0.0) + self.api + self.workers + self.bench
    }

    /// Busy cores not explained by the run's own processes: other load on the machine (or
    /// Postgres, when its CPU is not attributed). A noisy round shows here.
    fn other(&self) -> f64 {
        (self.machine - self.own()).max(0.0)
    }

    fn describe(&self) -> String {
        format!(
            "cores: postgres {} api {:.2} workers {:.2} bench {:.2} other {:.2} of machine {:.2}",
            self.postgres
                .map_or_else(|| String::from("?"), |cores| format!("{cores:.2}")),
            self.api,
            self.workers,
            self.bench,
            self.other(),
            self.machine
        )
    }
}

impl PipelineBench {
    /// A fresh database for one run, dropped by [`PipelineBench::drop_database`].
    async fn create_database(&self) -> anyhow::Result<(String, String)> {
        let serial = self
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("zuno_pipeline_{}_{serial}", std::process::id());
        let url = create_scratch_database(&self.admin_url, &name).await?;
        Ok((url, name))
    }

    async fn drop_database(&self, name: &str) -> anyhow::Result<()> {
        Ok(drop_scratch_database(&self.admin_url, name).await?)
    }

    /// Per-client shares of the jobs.
    fn shares(&self) -> Vec<usize> {
        (0..self.clients)
            .map(|i| self.jobs / self.clients + usize::from(i < self.jobs % self.clients))
            .filter(|&share| share > 0)
            .collect()
    }

    async fn pipeline(&self, worker_count: usize) -> anyhow::Result<RunResult> {
        let (url, name) = self.create_database().await?;
        let home = tempfile::tempdir()?;
        let fake = if self.distinct_lessons {
            // Each answer cites the correction of the session it extracts.
            FakeProvider::start_auto("127.0.0.1:0").await?
        } else {
            let fake = FakeProvider::start().await;
            fake.push((0..self.jobs).map(|_| valid_answer()));
            fake
        };
        fake.set_delay(self.provider_delay);
        let config = json!({
            "providers": { "fake": { "api": "openai_chat", "base_url": fake.base_url() } },
            "learning": { "extractor_model": "fake/fake-model" },
        });
        std::fs::write(home.path().join("config.json"), config.to_string())?;

        let mut api = self.command("zuno", home.path(), &url);
        api.args(["serve", "--bind", "127.0.0.1:0", "--insecure-no-auth"]);
        let (mut api, address) = spawn_api(api, &home.path().join("api.log")).await?;
        let spawn_workers = || -> anyhow::Result<Vec<Child>> {
            (0..worker_count)
                .map(|i| {
                    let mut worker = self.command("zuno-worker-extract", home.path(), &url);
                    worker.args(["--worker-id", &format!("bench-extract-{i}")]);
                    worker.args(self.worker_flags());
                    spawn_worker(&mut worker, &home.path().join(format!("worker-{i}.log")))
                })
                .collect()
        };
        let mut workers = Vec::new();
        if !self.drain {
            workers = spawn_workers()?;
            wait_started(home.path(), worker_count).await?;
        }
        let db = Db::connect(
            &ConnectOptions::new(url.clone()),
            zuno_shared::migrations::schema(),
        )
        .await?;
        let http = reqwest::Client::new();
        let base = format!("http://{address}");
        post(
            &http,
            &base,
            "/api/projects",
            json!({"id": "bench", "name": "bench"}),
        )
        .await?;

        let statements_before = statement_calls(&self.admin_url, &name).await;
        let mut before = self.snapshot(&Pids {
            api: api.id(),
            workers: workers.iter().filter_map(Child::id).collect(),
        });
        let mut started = Instant::now();
        let mut clients = tokio::task::JoinSet::new();
        for (client, share) in self.shares().into_iter().enumerate() {
            let http = http.clone();
            let base = base.clone();
            let turns = Turns {
                per_session: self.turns_per_session,
                distinct_lessons: self.distinct_lessons.then_some(client),
            };
            clients.spawn(async move { close_turns(&http, &base, share, turns).await });
        }
        while let Some(done) = clients.join_next().await {
            done??;
        }
        let admission = started.elapsed();
        if self.drain {
            // Timed from the workers' spawn: their start-up (connect, schema check) is in it.
            before = self.snapshot(&Pids {
                api: api.id(),
                workers: Vec::new(),
            });
            started = Instant::now();
            workers = spawn_workers()?;
        }
        wait_settled(&db, "extract", self.jobs).await?;
        let elapsed = started.elapsed();
        let after = self.snapshot(&Pids {
            api: api.id(),
            workers: workers.iter().filter_map(Child::id).collect(),
        });
        let statements = Statements::between(
            statements_before,
            statement_calls(&self.admin_url, &name).await,
            self.jobs,
        );
        if let Some(statements) = &statements {
            statements.print_top("pipeline", 15);
        }
        verify_completed(&db, "extract", self.jobs).await?;
        let experiences: i64 = zuno_shared::on_db!(&db, |pool| sqlx::query_scalar(
            "SELECT COUNT(*) FROM experience_record"
        )
        .fetch_one(pool)
        .await)?;
        // Identical corrections merge into one experience (its evidence grows); every job
        // completed, which `verify_completed` checked.
        anyhow::ensure!(experiences > 0, "no experience stored");
        db.close().await;

        for worker in &mut workers {
            stop(worker).await;
        }
        stop(&mut api).await;
        self.drop_database(&name).await?;
        Ok(RunResult {
            jobs: self.jobs,
            elapsed,
            admission,
            cpu: cpu(&before, &after, elapsed),
            statements,
        })
    }

    async fn baseline(&self, worker_count: usize) -> anyhow::Result<RunResult> {
        let (url, name) = self.create_database().await?;
        let home = tempfile::tempdir()?;
        std::fs::write(home.path().join("config.json"), "{}")?;
        let mut options = ConnectOptions::new(url.clone());
        options.max_connections = u32::try_from(self.clients + 2).unwrap_or(u32::MAX);
        // Migrates, like the API process does in the pipeline run.
        let db = Db::open(&options, zuno_shared::migrations::schema()).await?;
        let ledger = Ledger::new(db.clone(), system_clock());
        let exe = std::env::current_exe()?;
        let spawn_workers = || -> anyhow::Result<Vec<Child>> {
            (0..worker_count)
                .map(|i| {
                    let mut worker = Command::new(&exe);
                    clean_env(&mut worker, home.path(), Some(&url));
                    worker.args(["noop-worker", "--worker-id", &format!("bench-noop-{i}")]);
                    worker.args(self.worker_flags());
                    worker.args(["--hold-ms", &self.provider_delay.as_millis().to_string()]);
                    spawn_worker(&mut worker, &home.path().join(format!("worker-{i}.log")))
                })
                .collect()
        };
        let mut workers = Vec::new();
        if !self.drain {
            workers = spawn_workers()?;
            wait_started(home.path(), worker_count).await?;
        }

        let statements_before = statement_calls(&self.admin_url, &name).await;
        let mut before = self.snapshot(&Pids {
            api: None,
            workers: workers.iter().filter_map(Child::id).collect(),
        });
        let mut started = Instant::now();
        let mut clients = tokio::task::JoinSet::new();
        let mut next = 0;
        for share in self.shares() {
            let ledger = ledger.clone();
            let range = next..next + share;
            next += share;
            clients.spawn(async move {
                for i in range {
                    ledger
                        .admit(NewJob::new(
                            JobIdentity::maintain("bench", "/bench", &i.to_string()),
                            JobOrigin::Explicit,
                        ))
                        .await?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = clients.join_next().await {
            done??;
        }
        let admission = started.elapsed();
        if self.drain {
            before = self.snapshot(&Pids {
                api: None,
                workers: Vec::new(),
            });
            started = Instant::now();
            workers = spawn_workers()?;
        }
        wait_settled(&db, "maintain", self.jobs).await?;
        let elapsed = started.elapsed();
        let after = self.snapshot(&Pids {
            api: None,
            workers: workers.iter().filter_map(Child::id).collect(),
        });
        let statements = Statements::between(
            statements_before,
            statement_calls(&self.admin_url, &name).await,
            self.jobs,
        );
        verify_completed(&db, "maintain", self.jobs).await?;
        db.close().await;
        for worker in &mut workers {
            stop(worker).await;
        }
        self.drop_database(&name).await?;
        Ok(RunResult {
            jobs: self.jobs,
            elapsed,
            admission,
            cpu: cpu(&before, &after, elapsed),
            statements,
        })
    }

    /// The worker flags this run sets (none: the binaries' defaults).
    fn worker_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if let Some(concurrency) = self.concurrency {
            flags.extend([String::from("--concurrency"), concurrency.to_string()]);
        }
        if let Some(per_wake) = self.max_jobs_per_wake {
            flags.extend([String::from("--max-jobs-per-wake"), per_wake.to_string()]);
        }
        flags
    }

    fn command(&self, binary: &str, home: &Path, url: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(binary));
        clean_env(&mut command, home, Some(url));
        command
    }
}

/// A private home (its config.json), the run's database (`None`: the home's SQLite file), the
/// default log level, and none of the caller's Zuno environment.
fn clean_env(command: &mut Command, home: &Path, url: Option<&str>) {
    for variable in [
        "ZUNO_DATABASE_URL",
        "ZUNO_BIND",
        "ZUNO_API_TOKEN",
        "ZUNO_CONFIG",
        "ZUNO_METRICS_ADDR",
        "ZUNO_LOG",
        "ZUNO_LOG_FORMAT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "DATABASE_URL",
    ] {
        command.env_remove(variable);
    }
    command.env("ZUNO_HOME", home).kill_on_drop(true);
    if let Some(url) = url {
        command.env("DATABASE_URL", url);
    }
}

impl PipelineBench {
    fn snapshot(&self, pids: &Pids) -> Snapshot {
        let postgres = self.postmaster.map(|postmaster| {
            let mut ticks = HashMap::new();
            for pid in postgres_pids(postmaster) {
                if let Some(t) = process_ticks(pid) {
                    ticks.insert(pid, t);
                }
            }
            ticks
        });
        Snapshot {
            postgres,
            api: pids.api.and_then(process_ticks).unwrap_or(0),
            workers: pids
                .workers
                .iter()
                .filter_map(|&pid| process_ticks(pid))
                .sum(),
            bench: process_ticks(std::process::id()).unwrap_or(0),
            machine_busy: machine_busy_ticks(),
        }
    }
}

struct Pids {
    api: Option<u32>,
    workers: Vec<u32>,
}

/// CPU ticks (USER_HZ) at one instant.
struct Snapshot {
    /// Per process: backends come and go, so they are matched by pid.
    postgres: Option<HashMap<u32, u64>>,
    api: u64,
    workers: u64,
    bench: u64,
    machine_busy: u64,
}

/// `/proc` reports CPU time in USER_HZ, which Linux fixes at 100 per second for user space.
const USER_HZ: f64 = 100.0;

fn cpu(before: &Snapshot, after: &Snapshot, elapsed: Duration) -> Cpu {
    let cores = |ticks: u64| ticks as f64 / USER_HZ / elapsed.as_secs_f64();
    let postgres = match (&before.postgres, &after.postgres) {
        (Some(before), Some(after)) => Some(cores(
            after
                .iter()
                .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
                .sum(),
        )),
        _ => None,
    };
    Cpu {
        postgres,
        api: cores(after.api.saturating_sub(before.api)),
        workers: cores(after.workers.saturating_sub(before.workers)),
        bench: cores(after.bench.saturating_sub(before.bench)),
        machine: cores(after.machine_busy.saturating_sub(before.machine_busy)),
    }
}

/// utime + stime of a process.
fn process_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The postmaster and its children (backends, writers, autovacuum): this cluster only, not
/// other clusters on the machine.
fn postgres_pids(postmaster: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid == postmaster || parent_pid(pid) == Some(postmaster))
        .collect()
}

fn postmaster_pid(pid_file: &Path) -> Option<u32> {
    std::fs::read_to_string(pid_file)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Busy ticks of the whole machine (everything but idle and iowait), summed over CPUs.
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0;
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    fields.iter().take(8).sum::<u64>()
        - fields.get(3).copied().unwrap_or(0)
        - fields.get(4).copied().unwrap_or(0)
}

/// What one client's sessions say.
#[derive(Clone, Copy)]
struct Turns {
    per_session: usize,
    /// `Some(client)`: each session corrects the agent with a rule of its own (named by the
    /// client and the session's number); `None`: every session restates the pnpm correction.
    distinct_lessons: Option<usize>,
}

impl Turns {
    fn user_turn(&self, session_number: usize) -> Value {
        match self.distinct_lessons {
            None => pnpm::user_turn(),
            Some(client) => json!({"role": "user", "parts": [{"type": "text", "text": format!(
                "No, don't call build-{client}-{session_number} here; run check-{client}-{session_number} first. \
                 It keeps the lockfile consistent."
            )}]}),
        }
    }
}

/// One client: sessions of `turns.per_session` closed turns until `count` are admitted.
async fn close_turns(
    http: &reqwest::Client,
    base: &str,
    count: usize,
    turns: Turns,
) -> anyhow::Result<()> {
    let assistant = pnpm::assistant_turn();
    let mut admitted = 0;
    let mut session_number = 0;
    while admitted < count {
        let session = post(http, base, "/api/projects/bench/sessions", json!({})).await?;
        let session = session["id"].as_str().context("session id")?.to_owned();
        let path = format!("/api/session/{session}/messages");
        let user = turns.user_turn(session_number);
        session_number += 1;
        for _ in 0..turns.per_session.min(count - admitted) {
            post(http, base, &path, user.clone()).await?;
            let outcome = post(http, base, &path, assistant.clone()).await?;
            anyhow::ensure!(
                outcome["admission"]["outcome"] == "queued",
                "turn not admitted: {outcome}"
            );
            admitted += 1;
        }
    }
    Ok(())
}

async fn post(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let response = http
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await?;
    anyhow::ensure!(status.is_success(), "POST {path}: {status} {body}");
    Ok(body)
}

/// Polls until `jobs` jobs of `kind` reached a terminal state.
async fn wait_settled(db: &Db, kind: &str, jobs: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let settled: i64 = zuno_shared::on_db!(db, |pool| sqlx::query_scalar(
            "SELECT COUNT(*) FROM learning_job WHERE kind = $1 \
             AND state IN ('completed', 'failed', 'skipped', 'uncertain')"
        )
        .bind(kind)
        .fetch_one(pool)
        .await)?;
        if settled as usize >= jobs {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {settled} of {jobs} jobs settled in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn verify_completed(db: &Db, kind: &str, jobs: usize) -> anyhow::Result<()> {
    let states: Vec<(String, i64)> = zuno_shared::on_db!(db, |pool| sqlx::query_as(
        "SELECT state, COUNT(*) FROM learning_job WHERE kind = $1 GROUP BY state"
    )
    .bind(kind)
    .fetch_all(pool)
    .await)?;
    anyhow::ensure!(
        states == [(String::from("completed"), jobs as i64)],
        "expected {jobs} completed {kind} jobs, found {states:?}"
    );
    Ok(())
}

async fn spawn_api(mut command: Command, log: &Path) -> anyhow::Result<(Child, String)> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log)?))
        .spawn()
        .context("spawn zuno serve")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .context("zuno serve did not start in time")??
        .with_context(|| {
            format!(
                "zuno serve exited: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })?;
    let address = line
        .strip_prefix("zuno listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("unexpected start-up line: {line}"))?
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, address))
}

/// Waits until each of `count` workers logged that it started (`worker-{i}.log` in `dir`).
async fn wait_started(dir: &Path, count: usize) -> anyhow::Result<()> {
    for i in 0..count {
        wait_for_log(&dir.join(format!("worker-{i}.log")), "worker started").await?;
    }
    Ok(())
}

fn spawn_worker(command: &mut Command, log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::File::create(log)?;
    Ok(command
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .spawn()?)
}

/// Waits until a process logged `needle` (a worker logs "worker started" once it listens and
/// is about to claim).
async fn wait_for_log(log: &Path, needle: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} never logged `{needle}`:\n{text}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGTERM, then a bounded wait (kill on drop covers a process that does not exit).
async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// Medians over rounds of one worker count: rates, admission-only rate, and CPU in cores.
fn report(mode: &str, workers: usize, jobs: usize, rounds: &[(RunResult, RunResult)]) {
    let side = |pick: fn(&(RunResult, RunResult)) -> &RunResult| {
        let runs: Vec<&RunResult> = rounds.iter().map(pick).collect();
        let rates: Vec<f64> = runs.iter().map(|r| r.rate()).collect();
        let med = |values: Vec<f64>| round2(median(values));
        let admission: Vec<f64> = runs
            .iter()
            .map(|r| r.jobs as f64 / r.admission.as_secs_f64())
            .collect();
        let postgres_cores = runs
            .iter()
            .map(|r| r.cpu.postgres)
            .collect::<Option<Vec<f64>>>()
            .map(med);
        let postgres_ms = runs
            .iter()
            .map(|r| r.cpu.postgres.map(|c| r.per_job_ms(c)))
            .collect::<Option<Vec<f64>>>()
            .map(med);
        let statements = runs
            .iter()
            .map(|r| r.statements.as_ref().map(|s| (s.all, s.top_level)))
            .collect::<Option<Vec<(f64, f64)>>>()
            .map(|v| {
                json!({
                    "all": med(v.iter().map(|s| s.0).collect()),
                    "topLevel": med(v.iter().map(|s| s.1).collect()),
                })
            });
        json!({
            "jobsPerSec": median(rates.clone()).round(),
            "roundsJobsPerSec": rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
            "admissionPerSec": median(admission).round(),
            "cpuCores": {
                "postgres": postgres_cores,
                "api": med(runs.iter().map(|r| r.cpu.api).collect()),
                "workers": med(runs.iter().map(|r| r.cpu.workers).collect()),
                "benchProcess": med(runs.iter().map(|r| r.cpu.bench).collect()),
                "machine": med(runs.iter().map(|r| r.cpu.machine).collect()),
                "other": med(runs.iter().map(|r| r.cpu.other()).collect()),
            },
            // CPU milliseconds per job: cores × elapsed / jobs.
            "cpuMsPerJob": {
                "postgres": postgres_ms,
                "api": med(runs.iter().map(|r| r.per_job_ms(r.cpu.api)).collect()),
                "workers": med(runs.iter().map(|r| r.per_job_ms(r.cpu.workers)).collect()),
                "benchProcess": med(runs.iter().map(|r| r.per_job_ms(r.cpu.bench)).collect()),
            },
            "statementsPerJob": statements,
        })
    };
    let ratio = median(rounds.iter().map(|(p, b)| p.rate() / b.rate()).collect());
    println!(
        "{}",
        json!({
            "mode": mode,
            "workers": workers,
            "jobs": jobs,
            "rounds": rounds.len(),
            "pipeline": side(|r| &r.0),
            "baseline": side(|r| &r.1),
            "pipelineOverBaseline": round2(ratio),
        })
    );
}

/// `zuno-pipeline-bench latency`: turn → settled experience, one turn at a time.
///
/// Each turn: a user correction, then an idle gap (the worker has nothing to do and waits for
/// a wake-up or its next poll), then the closing assistant message, which admits the `extract`
/// job in its transaction. The clock starts just before the closing request is sent and stops
/// when an observer connection in this process sees the job settled: it reads the job's state
/// by primary key every `poll` (the experience commits in the settlement's transaction, so a
/// settled job's experience is visible). The baseline admits a `maintain` job with
/// `Ledger::admit` instead and a no-op handler settles it, through the same harness (the same
/// in-process runner setup as `--all-in-one`, or the same worker process harness).
mod latency {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use anyhow::Context;
    use serde_json::json;
    use tokio::process::{Child, Command};
    use tokio_util::sync::CancellationToken;
    use zuno_shared::clock::system_clock;
    use zuno_shared::db::{ConnectOptions, Db, create_scratch_database, drop_scratch_database};
    use zuno_shared::ledger::{JobIdentity, JobOrigin, Ledger, NewJob};
    use zuno_shared::runtime::{JobHandler, Runner, RunnerConfig};
    use zuno_tests::fake_provider::{FakeProvider, RequestKind};

    use super::{Noop, Setup};

    pub struct Options {
        pub admin_url: Option<String>,
        pub turns: usize,
        pub gap: (u64, u64),
        pub poll: Duration,
        pub setups: Vec<Setup>,
        pub bin_dir: PathBuf,
    }

    /// Turns closed before the timed ones (connections, caches and the first claim warmed up).
    const WARM_UP: usize = 3;

    pub async fn run(options: Options) -> anyhow::Result<()> {
        eprintln!(
            "latency: {} turns per setup, gap {}–{} ms, observer poll {} ms, setups {:?}",
            options.turns,
            options.gap.0,
            options.gap.1,
            options.poll.as_millis(),
            options.setups
        );
        for &setup in &options.setups {
            if setup == Setup::Postgres && options.admin_url.is_none() {
                eprintln!("postgres: skipped (no --admin-url / ZUNO_TEST_DATABASE_URL)");
                continue;
            }
            let baseline = baseline(&options, setup).await?;
            eprintln!("{} baseline: {}", setup.as_str(), baseline.describe());
            let pipeline = pipeline(&options, setup).await?;
            eprintln!("{} pipeline: {}", setup.as_str(), pipeline.describe());
            println!(
                "{}",
                json!({
                    "setup": setup.as_str(),
                    "turns": options.turns,
                    "gapMs": [options.gap.0, options.gap.1],
                    "observerPollMs": options.poll.as_millis() as u64,
                    "pipeline": pipeline.json(),
                    "baseline": baseline.json(),
                })
            );
        }
        Ok(())
    }

    /// One setup's samples: from the closing request (or admission) to the settled job, and
    /// to the request's response alone.
    struct Samples {
        settled: Vec<Duration>,
        request: Vec<Duration>,
        observer: ObserverStats,
        /// Experience rows at the end (pipeline only).
        experiences: i64,
    }

    #[derive(Default, Clone, Copy)]
    struct ObserverStats {
        queries: u64,
        busy: Duration,
    }

    fn ms(duration: Duration) -> f64 {
        (duration.as_secs_f64() * 10_000.0).round() / 10.0
    }

    /// Nearest-rank percentile.
    fn percentile(sorted: &[Duration], q: f64) -> Duration {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    impl Samples {
        fn sorted(values: &[Duration]) -> Vec<Duration> {
            let mut sorted = values.to_vec();
            sorted.sort();
            sorted
        }

        fn json(&self) -> serde_json::Value {
            let settled = Samples::sorted(&self.settled);
            let request = Samples::sorted(&self.request);
            let mean = settled.iter().sum::<Duration>() / settled.len().max(1) as u32;
            json!({
                "settledMs": {
                    "p50": ms(percentile(&settled, 0.50)),
                    "p90": ms(percentile(&settled, 0.90)),
                    "p99": ms(percentile(&settled, 0.99)),
                    "max": ms(settled[settled.len() - 1]),
                    "mean": ms(mean),
                },
                "requestMs": {
                    "p50": ms(percentile(&request, 0.50)),
                    "p99": ms(percentile(&request, 0.99)),
                },
                "observerQueryMeanMs": ms(self.observer.busy / self.observer.queries.max(1) as u32),
                "experiences": self.experiences,
            })
        }

        fn describe(&self) -> String {
            let settled = Samples::sorted(&self.settled);
            let request = Samples::sorted(&self.request);
            format!(
                "settled p50 {:.1} ms p90 {:.1} p99 {:.1} max {:.1}; request p50 {:.1} ms; \
                 observer query {:.2} ms",
                ms(percentile(&settled, 0.5)),
                ms(percentile(&settled, 0.9)),
                ms(percentile(&settled, 0.99)),
                ms(settled[settled.len() - 1]),
                ms(percentile(&request, 0.5)),
                ms(self.observer.busy / self.observer.queries.max(1) as u32),
            )
        }
    }

    /// Reads one job's state by primary key until it is terminal.
    struct Observer {
        db: Db,
        poll: Duration,
        stats: ObserverStats,
    }

    impl Observer {
        /// When the job was first seen settled (the end of the query that saw it), and its state.
        async fn settled(&mut self, job_id: &str) -> anyhow::Result<(Instant, String)> {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let started = Instant::now();
                let state: Option<String> = zuno_shared::on_db!(&self.db, |pool| {
                    sqlx::query_scalar("SELECT state FROM learning_job WHERE id = $1")
                        .bind(job_id)
                        .fetch_optional(pool)
                        .await
                })?;
                let seen = Instant::now();
                self.stats.queries += 1;
                self.stats.busy += seen - started;
                if let Some(state) = state
                    && matches!(
                        state.as_str(),
                        "completed" | "failed" | "skipped" | "uncertain"
                    )
                {
                    return Ok((seen, state));
                }
                anyhow::ensure!(seen < deadline, "job {job_id} did not settle within 60 s");
                tokio::time::sleep(self.poll).await;
            }
        }
    }

    fn gap(options: &Options) -> Duration {
        let (min, max) = options.gap;
        let span = u128::from(max - min) + 1;
        let draw = uuid::Uuid::new_v4().as_u128() % span;
        Duration::from_millis(min + u64::try_from(draw).unwrap_or(0))
    }

    async fn create_database(admin_url: &str) -> anyhow::Result<(String, String)> {
        let name = format!(
            "zuno_latency_{}_{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let url = create_scratch_database(admin_url, &name).await?;
        Ok((url, name))
    }

    async fn drop_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
        Ok(drop_scratch_database(admin_url, name).await?)
    }

    /// The setup's database: a fresh Postgres database, or the home's SQLite file.
    struct Database {
        /// `Some` on Postgres: the URL processes get; `None`: the home's SQLite default.
        url: Option<String>,
        observe: ConnectOptions,
        name: Option<String>,
    }

    async fn database(options: &Options, setup: Setup, home: &Path) -> anyhow::Result<Database> {
        Ok(match setup {
            Setup::Postgres => {
                let admin = options.admin_url.as_deref().context("admin URL")?;
                let (url, name) = create_database(admin).await?;
                Database {
                    observe: ConnectOptions::new(url.clone()),
                    url: Some(url),
                    name: Some(name),
                }
            }
            Setup::SqliteAllInOne | Setup::SqliteWorker => Database {
                url: None,
                observe: ConnectOptions::sqlite_file(
                    &zuno_shared::paths::Paths::resolve(Some(home)).database(),
                ),
                name: None,
            },
        })
    }

    async fn pipeline(options: &Options, setup: Setup) -> anyhow::Result<Samples> {
        let home = tempfile::tempdir()?;
        let database = database(options, setup, home.path()).await?;
        let fake = FakeProvider::start_auto("127.0.0.1:0").await?;
        // Extraction answers as in the throughput bench; every other request (maintenance and
        // mining, which all-in-one also runs) gets the fake's answer of its own kind.
        fake.push_for(
            RequestKind::Extraction,
            (0..options.turns + WARM_UP).map(|_| super::valid_answer()),
        );
        let config = json!({
            "providers": { "fake": { "api": "openai_chat", "base_url": fake.base_url() } },
            "learning": { "extractor_model": "fake/fake-model" },
        });
        std::fs::write(home.path().join("config.json"), config.to_string())?;

        let mut api = Command::new(options.bin_dir.join("zuno"));
        super::clean_env(&mut api, home.path(), database.url.as_deref());
        api.args(["serve", "--bind", "127.0.0.1:0", "--insecure-no-auth"]);
        if setup == Setup::SqliteAllInOne {
            api.arg("--all-in-one");
        }
        let api_log = home.path().join("api.log");
        let (mut api, address) = super::spawn_api(api, &api_log).await?;
        let mut worker: Option<Child> = None;
        if setup == Setup::SqliteAllInOne {
            super::wait_for_log(&api_log, "worker started").await?;
        } else {
            let mut command = Command::new(options.bin_dir.join("zuno-worker-extract"));
            super::clean_env(&mut command, home.path(), database.url.as_deref());
            command.args(["--worker-id", "bench-extract-0"]);
            let log = home.path().join("worker-0.log");
            worker = Some(super::spawn_worker(&mut command, &log)?);
            super::wait_for_log(&log, "worker started").await?;
        }
        let mut observer = Observer {
            db: Db::connect(&database.observe, zuno_shared::migrations::schema()).await?,
            poll: options.poll,
            stats: ObserverStats::default(),
        };
        let http = reqwest::Client::new();
        let base = format!("http://{address}");
        super::post(
            &http,
            &base,
            "/api/projects",
            json!({"id": "bench", "name": "bench"}),
        )
        .await?;
        let user = json!({"role": "user", "parts": [{"type": "text",
            "text": "No, don't use npm here; use pnpm. It keeps the lockfile consistent."}]});
        let assistant = json!({"role": "assistant", "status": "completed", "parts": [
            {"type": "tool_call", "toolName": "bash", "callId": "c1",
             "arguments": {"command": "pnpm install"}, "result": "Done in 2.1s", "status": "completed"},
            {"type": "text", "text": "Installed with pnpm."}]});
        let mut samples = Samples {
            settled: Vec::new(),
            request: Vec::new(),
            observer: ObserverStats::default(),
            experiences: 0,
        };
        let mut path = String::new();
        for turn in 0..options.turns + WARM_UP {
            if turn % 10 == 0 {
                let session =
                    super::post(&http, &base, "/api/projects/bench/sessions", json!({})).await?;
                let session = session["id"].as_str().context("session id")?;
                path = format!("/api/session/{session}/messages");
            }
            super::post(&http, &base, &path, user.clone()).await?;
            tokio::time::sleep(gap(options)).await;
            let started = Instant::now();
            let outcome = super::post(&http, &base, &path, assistant.clone()).await?;
            let responded = started.elapsed();
            anyhow::ensure!(
                outcome["admission"]["outcome"] == "queued",
                "turn not admitted: {outcome}"
            );
            let job_id = outcome["admission"]["job"]["id"]
                .as_str()
                .context("admitted job id")?;
            let (seen, state) = observer.settled(job_id).await?;
            anyhow::ensure!(state == "completed", "job {job_id} settled {state}");
            if turn >= WARM_UP {
                samples.settled.push(seen - started);
                samples.request.push(responded);
            }
        }
        samples.observer = observer.stats;
        let experiences: i64 = zuno_shared::on_db!(&observer.db, |pool| sqlx::query_scalar(
            "SELECT COUNT(*) FROM experience_record"
        )
        .fetch_one(pool)
        .await)?;
        // Identical corrections may merge into one experience (its evidence grows), so only
        // their presence is checked; each job completed above.
        anyhow::ensure!(experiences > 0, "no experience stored");
        samples.experiences = experiences;
        observer.db.close().await;
        if let Some(worker) = &mut worker {
            super::stop(worker).await;
        }
        super::stop(&mut api).await;
        if let (Some(admin), Some(name)) = (&options.admin_url, &database.name) {
            drop_database(admin, name).await?;
        }
        Ok(samples)
    }

    async fn baseline(options: &Options, setup: Setup) -> anyhow::Result<Samples> {
        let home = tempfile::tempdir()?;
        std::fs::write(home.path().join("config.json"), "{}")?;
        let database = database(options, setup, home.path()).await?;
        // Migrates, as the API process does in the pipeline run.
        let db = Db::open(&database.observe, zuno_shared::migrations::schema()).await?;
        let ledger = Ledger::new(db.clone(), system_clock());
        let shutdown = CancellationToken::new();
        let mut worker: Option<Child> = None;
        let mut in_process = None;
        if setup == Setup::SqliteAllInOne {
            // What `zuno serve --all-in-one` builds per stage: a runner on the server's own
            // database handle, woken by the in-process bus.
            let mut config = RunnerConfig::new("bench-noop-in-process");
            config.concurrency = 4;
            config.max_jobs_per_wake = 2;
            config.poll_interval = Duration::from_secs(60);
            let runner = Runner::new(ledger.clone(), config)
                .register(Arc::new(Noop {
                    hold: Duration::ZERO,
                }) as Arc<dyn JobHandler>);
            let stop = shutdown.clone();
            in_process = Some(tokio::spawn(async move { runner.run(stop).await }));
        } else {
            let mut command = Command::new(std::env::current_exe()?);
            super::clean_env(&mut command, home.path(), database.url.as_deref());
            command.args(["noop-worker", "--worker-id", "bench-noop-0"]);
            let log = home.path().join("worker-0.log");
            worker = Some(super::spawn_worker(&mut command, &log)?);
            super::wait_for_log(&log, "worker started").await?;
        }
        let mut observer = Observer {
            db: db.clone(),
            poll: options.poll,
            stats: ObserverStats::default(),
        };
        let mut samples = Samples {
            settled: Vec::new(),
            request: Vec::new(),
            observer: ObserverStats::default(),
            experiences: 0,
        };
        for n in 0..options.turns + WARM_UP {
            tokio::time::sleep(gap(options)).await;
            let started = Instant::now();
            let admission = ledger
                .admit(NewJob::new(
                    JobIdentity::maintain("bench", "/bench", &n.to_string()),
                    JobOrigin::Explicit,
                ))
                .await?;
            let responded = started.elapsed();
            let job_id = admission.job().id.clone();
            let (seen, state) = observer.settled(&job_id).await?;
            anyhow::ensure!(state == "completed", "job {job_id} settled {state}");
            if n >= WARM_UP {
                samples.settled.push(seen - started);
                samples.request.push(responded);
            }
        }
        samples.observer = observer.stats;
        shutdown.cancel();
        if let Some(runner) = in_process {
            runner.await?;
        }
        if let Some(worker) = &mut worker {
            super::stop(worker).await;
        }
        db.close().await;
        if let (Some(admin), Some(name)) = (&options.admin_url, &database.name) {
            drop_database(admin, name).await?;
        }
        Ok(samples)
    }
}
