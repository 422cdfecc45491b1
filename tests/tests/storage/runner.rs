//! The worker runtime around the ledger: draining, retries, panics, shutdown and lease loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use zuno_shared::ledger::{Job, JobIdentity, JobKind, JobOrigin, JobState, NewJob};
use zuno_shared::runtime::{JobContext, JobError, JobHandler, Runner, RunnerConfig};
use zuno_tests::{TestDb, eventually, on_both_backends};

#[derive(Clone, Copy)]
enum Behavior {
    RecordEffect,
    AlwaysRetry,
    Panic,
    WaitForCancel,
    /// Fails the first call with a retry due in one second, then completes.
    RetrySoonThenComplete,
    /// Fails the first two calls on the database, then completes.
    DatabaseBlipsThenComplete,
    /// Never returns, whatever happens (a call stuck on a frozen connection).
    Hang,
}

struct Probe {
    behavior: Behavior,
    calls: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

impl Probe {
    fn new(behavior: Behavior) -> Probe {
        Probe {
            behavior,
            calls: Arc::default(),
            cancelled: Arc::default(),
        }
    }
}

#[async_trait::async_trait]
impl JobHandler for Probe {
    fn kind(&self) -> JobKind {
        JobKind::Maintain
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        match self.behavior {
            Behavior::RecordEffect => {
                let mut settlement = ctx.begin_settlement().await?;
                let worker = ctx.lease().worker_id.clone();
                zuno_shared::on_tx!(settlement.tx().await?, |conn| sqlx::query(
                    "INSERT INTO probe_effect (job_id, worker_id) VALUES ($1, $2)"
                )
                .bind(&ctx.job().id)
                .bind(&worker)
                .execute(conn)
                .await
                .map(|d| d.rows_affected()))
                .map_err(|e| JobError::retryable(e.to_string()))?;
                Ok(settlement
                    .complete(serde_json::json!({"call": call}))
                    .await?)
            }
            Behavior::AlwaysRetry => Err(JobError::Retryable {
                message: format!("attempt {} failed", ctx.lease().attempt),
                retry_at: Some(ctx.ledger.now_ms()),
            }),
            Behavior::Panic => panic!("probe exploded on call {call}"),
            Behavior::RetrySoonThenComplete if call == 1 => Err(JobError::Retryable {
                message: String::from("provider busy"),
                retry_at: Some(ctx.ledger.now_ms() + 1000),
            }),
            Behavior::DatabaseBlipsThenComplete if call <= 2 => {
                Err(zuno_shared::db::StoreError::Database(sqlx::Error::PoolTimedOut).into())
            }
            Behavior::RetrySoonThenComplete | Behavior::DatabaseBlipsThenComplete => Ok(ctx
                .begin_settlement()
                .await?
                .complete(serde_json::json!({"call": call}))
                .await?),
            Behavior::Hang => {
                let _stopped = CountOnDrop(self.cancelled.clone());
                std::future::pending::<()>().await;
                unreachable!("pending never resolves")
            }
            Behavior::WaitForCancel => {
                // The runner stops a handler by dropping its future; the guard observes that.
                let _stopped = CountOnDrop(self.cancelled.clone());
                ctx.cancel.cancelled().await;
                Err(JobError::LeaseLost)
            }
        }
    }
}

struct CountOnDrop(Arc<AtomicUsize>);

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

async fn create_probe_table(db: &TestDb) {
    zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "CREATE TABLE probe_effect (job_id TEXT NOT NULL, worker_id TEXT NOT NULL)"
    )
    .execute(pool)
    .await
    .map(|d| d.rows_affected()))
    .unwrap();
}

fn job(i: usize) -> NewJob {
    NewJob::new(
        JobIdentity::maintain("p", "/m", &format!("job-{i}")),
        JobOrigin::Explicit,
    )
}

fn config(worker: &str) -> RunnerConfig {
    let mut config = RunnerConfig::new(worker);
    config.concurrency = 4;
    config.max_jobs_per_wake = 2;
    config.lease = Duration::from_secs(30);
    config.heartbeat = Duration::from_secs(10);
    config.exit_when_idle = true;
    config
}

async fn a_runner_drains_the_queue_recording_each_effect_once(db: TestDb) {
    create_probe_table(&db).await;
    let ledger = db.ledger();
    ledger
        .admit_batch((0..30).map(job).collect())
        .await
        .unwrap();
    let probe = Arc::new(Probe::new(Behavior::RecordEffect));
    let report = Runner::new(ledger.clone(), config("w1"))
        .register(probe.clone())
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.completed, 30, "{report:?}");
    let (effects, distinct): (i64, i64) = zuno_shared::on_db!(db.db, |pool| sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT job_id) FROM probe_effect"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!((effects, distinct), (30, 30));
    let completed = ledger
        .list(&Default::default())
        .await
        .unwrap()
        .iter()
        .filter(|j| j.state == JobState::Completed)
        .count();
    assert_eq!(completed, 30);
}

async fn retryable_failures_stop_at_the_third_attempt(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger.admit(job(0)).await.unwrap().into_job().id;
    let probe = Arc::new(Probe::new(Behavior::AlwaysRetry));
    let report = Runner::new(ledger.clone(), config("w1"))
        .register(probe.clone())
        .run(CancellationToken::new())
        .await;
    assert_eq!(probe.calls.load(Ordering::SeqCst), 3);
    assert_eq!((report.retried, report.failed), (2, 1));
    let job = ledger.get(&id).await.unwrap();
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.attempts, 3);
    assert_eq!(job.last_error.as_deref(), Some("attempt 3 failed"));
}

async fn a_panicking_handler_is_recorded_as_a_failed_attempt(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger.admit(job(0)).await.unwrap().into_job().id;
    // Retries wait for their backoff; one runner pass records exactly one failed attempt.
    let probe = Arc::new(Probe::new(Behavior::Panic));
    Runner::new(ledger.clone(), config("w1"))
        .register(probe.clone())
        .run(CancellationToken::new())
        .await;
    let job = ledger.get(&id).await.unwrap();
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.attempts, 1);
    assert!(
        job.last_error
            .unwrap()
            .contains("handler panicked: probe exploded on call 1")
    );
}

async fn shutdown_releases_running_work_after_the_grace_period(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger.admit(job(0)).await.unwrap().into_job().id;
    let probe = Arc::new(Probe::new(Behavior::WaitForCancel));
    let mut cfg = config("w1");
    cfg.exit_when_idle = false;
    cfg.grace = Duration::ZERO;
    let shutdown = CancellationToken::new();
    let runner = tokio::spawn(
        Runner::new(ledger.clone(), cfg)
            .register(probe.clone())
            .run(shutdown.clone()),
    );
    eventually("job running", Duration::from_secs(10), || {
        let ledger = ledger.clone();
        let id = id.clone();
        async move { (ledger.get(&id).await.unwrap().state == JobState::Running).then_some(()) }
    })
    .await;
    shutdown.cancel();
    let report = runner.await.unwrap();
    assert_eq!(report.released, 1);
    let job = ledger.get(&id).await.unwrap();
    assert_eq!(job.state, JobState::Queued, "released for another worker");
    assert_eq!(
        job.attempts, 0,
        "a first graceful release does not spend the attempt"
    );
    assert_eq!(ledger.event_count("released").await.unwrap(), 1);
}

async fn losing_the_lease_mid_job_cancels_the_handler(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger.admit(job(0)).await.unwrap().into_job().id;
    let probe = Arc::new(Probe::new(Behavior::WaitForCancel));
    let mut cfg = config("w1");
    cfg.exit_when_idle = false;
    cfg.heartbeat = Duration::from_millis(50);
    let shutdown = CancellationToken::new();
    let runner = tokio::spawn(
        Runner::new(ledger.clone(), cfg)
            .register(probe.clone())
            .run(shutdown.clone()),
    );
    eventually("job running", Duration::from_secs(10), || {
        let ledger = ledger.clone();
        let id = id.clone();
        async move { (ledger.get(&id).await.unwrap().state == JobState::Running).then_some(()) }
    })
    .await;
    // Another worker takes the job over (its lease is forced to have expired). A heartbeat
    // landing between the two statements extends the lease again, so repeat until it works.
    let thief = db.ledger();
    eventually("another worker takes the job over", Duration::from_secs(10), || {
        let (db, thief, id) = (&db, &thief, &id);
        async move {
            zuno_shared::on_db!(db.db, |pool| sqlx::query(
                    "UPDATE learning_job SET lease_expires_at = 0 WHERE id = $1 AND state = 'running'")
                .bind(id).execute(pool).await.map(|d| d.rows_affected())).unwrap();
            let kinds = [JobKind::Maintain];
            let batch = thief
                .claim(
                    &zuno_shared::ledger::ClaimRequest {
                        worker_id: "w2",
                        kinds: &kinds,
                        limit: 1,
                        lease_ms: 60_000,
                        scopes: None,
                    },
                    &zuno_shared::ledger::AllowAll,
                )
                .await
                .unwrap();
            (batch.claimed.len() == 1).then_some(())
        }
    })
    .await;
    eventually("handler stopped", Duration::from_secs(10), || {
        let cancelled = probe.cancelled.load(Ordering::SeqCst);
        async move { (cancelled == 1).then_some(()) }
    })
    .await;
    shutdown.cancel();
    let report = runner.await.unwrap();
    assert_eq!(report.lease_lost, 1);
    assert!(
        ledger.event_count("fenced").await.unwrap() >= 1,
        "the refused heartbeat is recorded"
    );
    assert_eq!(
        ledger.get(&id).await.unwrap().lease_owner.as_deref(),
        Some("w2")
    );
}

/// A retry due in a second is run about a second later by a worker whose idle poll is a minute:
/// the idle claim told it when the retry is due.
async fn a_retry_due_soon_runs_without_waiting_for_the_idle_poll(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger.admit(job(0)).await.unwrap().into_job().id;
    let probe = Arc::new(Probe::new(Behavior::RetrySoonThenComplete));
    let mut cfg = config("w1");
    cfg.exit_when_idle = false;
    cfg.fast_poll = false;
    cfg.poll_interval = Duration::from_secs(60);
    let shutdown = CancellationToken::new();
    let runner = tokio::spawn(
        Runner::new(ledger.clone(), cfg)
            .register(probe.clone())
            .run(shutdown.clone()),
    );
    // Well below the 60 s poll; the retry is due after 1 s.
    eventually("the retried job completes", Duration::from_secs(15), || {
        let ledger = ledger.clone();
        let id = id.clone();
        async move { (ledger.get(&id).await.unwrap().state == JobState::Completed).then_some(()) }
    })
    .await;
    shutdown.cancel();
    let report = runner.await.unwrap();
    assert_eq!((report.retried, report.completed), (1, 1), "{report:?}");
    assert_eq!(ledger.get(&id).await.unwrap().attempts, 2);
}

/// Database errors inside an attempt re-run the job within the same attempt instead of spending
/// the job's attempts: two blips, then success, on attempt 1.
async fn database_errors_inside_an_attempt_do_not_spend_it(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger.admit(job(0)).await.unwrap().into_job().id;
    let probe = Arc::new(Probe::new(Behavior::DatabaseBlipsThenComplete));
    let report = Runner::new(ledger.clone(), config("w1"))
        .register(probe.clone())
        .run(CancellationToken::new())
        .await;
    assert_eq!(probe.calls.load(Ordering::SeqCst), 3);
    assert_eq!((report.completed, report.retried), (1, 0), "{report:?}");
    let job = ledger.get(&id).await.unwrap();
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.attempts, 1);
}

/// A job stuck on a database that stops answering (here: its table locked by another
/// connection) ends once no heartbeat got through for a whole lease; nothing hangs forever.
async fn an_attempt_cut_off_from_the_database_ends(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger.admit(job(0)).await.unwrap().into_job().id;
    let probe = Arc::new(Probe::new(Behavior::Hang));
    let mut cfg = config("w1");
    cfg.exit_when_idle = false;
    cfg.lease = Duration::from_millis(1500);
    cfg.heartbeat = Duration::from_millis(300);
    // The rescued second attempt hangs too; shutdown needn't wait long for it.
    cfg.grace = Duration::from_secs(1);
    let shutdown = CancellationToken::new();
    let runner = tokio::spawn(
        Runner::new(ledger.clone(), cfg)
            .register(probe.clone())
            .run(shutdown.clone()),
    );
    eventually("job running", Duration::from_secs(10), || {
        let ledger = ledger.clone();
        let id = id.clone();
        async move { (ledger.get(&id).await.unwrap().state == JobState::Running).then_some(()) }
    })
    .await;
    let blocker_db = db.reopen().await;
    let mut blocker = blocker_db.begin().await.unwrap();
    if db.backend == zuno_shared::db::Backend::Postgres {
        zuno_shared::on_tx!(&mut blocker, |conn| sqlx::query(
            "LOCK TABLE learning_job IN ACCESS EXCLUSIVE MODE"
        )
        .execute(conn)
        .await
        .map(|d| d.rows_affected()))
        .unwrap();
    }
    // (SQLite: the open write transaction holds the database's only write lock.)
    eventually(
        "the stuck attempt is stopped",
        Duration::from_secs(20),
        || {
            let stopped = probe.cancelled.load(Ordering::SeqCst);
            async move { (stopped == 1).then_some(()) }
        },
    )
    .await;
    // The database heals: the stopped attempt's release, repeated meanwhile, now gets through:
    // it gives the job back, or, when a claim rescued the expired lease first (the runner
    // itself may), it is refused and audited as fenced.
    blocker.rollback().await.unwrap();
    eventually("the job is given back", Duration::from_secs(20), || {
        let ledger = ledger.clone();
        let id = id.clone();
        async move {
            let events = ledger.events(&id).await.unwrap();
            events
                .iter()
                .any(|event| {
                    event.event == "released"
                        || (event.event == "fenced"
                            && event
                                .detail
                                .as_deref()
                                .is_some_and(|detail| detail.starts_with("release refused")))
                })
                .then_some(())
        }
    })
    .await;
    shutdown.cancel();
    let report = runner.await.unwrap();
    assert_eq!(report.completed, 0, "{report:?}");
}

on_both_backends!(
    a_retry_due_soon_runs_without_waiting_for_the_idle_poll,
    database_errors_inside_an_attempt_do_not_spend_it,
    an_attempt_cut_off_from_the_database_ends,
    a_runner_drains_the_queue_recording_each_effect_once,
    retryable_failures_stop_at_the_third_attempt,
    a_panicking_handler_is_recorded_as_a_failed_attempt,
    shutdown_releases_running_work_after_the_grace_period,
    losing_the_lease_mid_job_cancels_the_handler,
);
