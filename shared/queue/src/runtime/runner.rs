//! The worker loop: wake, claim, run with heartbeats, settle, and shut down gracefully.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, Retryable};
use futures::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::handler::{JobContext, JobError, JobHandler};
use crate::ledger::{
    AllowAll, ClaimGate, ClaimRequest, ClaimedJob, HeartbeatOutcome, JobKind, JobState, Ledger,
    LedgerError,
};

/// How a runner behaves.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub worker_id: String,
    /// Jobs in flight at once. Claims happen when a whole batch of `max_jobs_per_wake` fits, so
    /// twice that keeps slots busy while the next batch is claimed.
    pub concurrency: usize,
    /// Jobs claimed per wake (`learning.post_turn.max_jobs_per_wake`, default 2).
    pub max_jobs_per_wake: usize,
    pub lease: Duration,
    pub heartbeat: Duration,
    /// Idle polling interval (`learning.post_turn.poll_interval_ms`, default 60 s).
    pub poll_interval: Duration,
    /// Poll quickly (50 ms doubling to 1 s) while work is flowing. Needed where no cross-process
    /// notification exists (SQLite shared by several processes).
    pub fast_poll: bool,
    /// How long shutdown waits for running jobs before releasing their leases.
    pub grace: Duration,
    /// Claim only jobs without a scope or with one of these (e.g. canonical memory paths).
    pub scopes: Option<Vec<String>>,
    /// Stop once a claim finds nothing and no job is running (tests, batch drains).
    pub exit_when_idle: bool,
}

/// A runner configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerConfigError {
    /// Two heartbeats must fit in one lease, or one slow or lost heartbeat lets the lease
    /// expire under a healthy worker.
    #[error(
        "the heartbeat interval ({heartbeat_ms} ms) must be shorter than half the lease \
         ({lease_ms} ms)"
    )]
    HeartbeatTooSlow { heartbeat_ms: u128, lease_ms: u128 },
    #[error("the lease must be longer than zero")]
    EmptyLease,
}

impl RunnerConfig {
    /// Checks what a worker must refuse to start with.
    pub fn validate(&self) -> Result<(), RunnerConfigError> {
        if self.lease.is_zero() {
            return Err(RunnerConfigError::EmptyLease);
        }
        if self.heartbeat.saturating_mul(2) >= self.lease {
            return Err(RunnerConfigError::HeartbeatTooSlow {
                heartbeat_ms: self.heartbeat.as_millis(),
                lease_ms: self.lease.as_millis(),
            });
        }
        Ok(())
    }

    pub fn new(worker_id: impl Into<String>) -> RunnerConfig {
        RunnerConfig {
            worker_id: worker_id.into(),
            concurrency: 4,
            max_jobs_per_wake: 2,
            lease: Duration::from_secs(60),
            heartbeat: Duration::from_secs(15),
            poll_interval: Duration::from_secs(60),
            fast_poll: true,
            grace: Duration::from_secs(30),
            scopes: None,
            exit_when_idle: false,
        }
    }
}

/// What a runner did before it stopped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub completed: u64,
    pub failed: u64,
    pub retried: u64,
    pub skipped: u64,
    pub uncertain: u64,
    pub lease_lost: u64,
    pub released: u64,
    pub abandoned: u64,
}

/// How one attempt ended, from the runner's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptOutcome {
    Settled(JobState),
    LeaseLost,
    Released,
    /// Settlement could not reach the database; the lease will expire and be rescued.
    Abandoned,
}

impl RunReport {
    fn record(&mut self, outcome: AttemptOutcome) {
        match outcome {
            AttemptOutcome::Settled(JobState::Completed) => self.completed += 1,
            AttemptOutcome::Settled(JobState::Failed) => self.failed += 1,
            AttemptOutcome::Settled(JobState::Queued) => self.retried += 1,
            AttemptOutcome::Settled(JobState::Skipped) => self.skipped += 1,
            AttemptOutcome::Settled(JobState::Uncertain) => self.uncertain += 1,
            AttemptOutcome::Settled(JobState::Running) => self.abandoned += 1,
            AttemptOutcome::LeaseLost => self.lease_lost += 1,
            AttemptOutcome::Released => self.released += 1,
            AttemptOutcome::Abandoned => self.abandoned += 1,
        }
    }
}

/// A worker: the handlers it runs and the loop that feeds them.
pub struct Runner {
    ledger: Ledger,
    handlers: HashMap<JobKind, Arc<dyn JobHandler>>,
    gate: Arc<dyn ClaimGate>,
    config: RunnerConfig,
}

struct Running {
    kill: CancellationToken,
}

impl Runner {
    pub fn new(ledger: Ledger, config: RunnerConfig) -> Runner {
        Runner {
            ledger,
            handlers: HashMap::new(),
            gate: Arc::new(AllowAll),
            config,
        }
    }

    /// Registers the handler for its kind. A runner claims only registered kinds.
    pub fn register(mut self, handler: Arc<dyn JobHandler>) -> Runner {
        self.handlers.insert(handler.kind(), handler);
        self
    }

    /// The gate that revalidates sources at claim and heartbeat.
    pub fn with_gate(mut self, gate: Arc<dyn ClaimGate>) -> Runner {
        self.gate = gate;
        self
    }

    pub fn kinds(&self) -> Vec<JobKind> {
        let mut kinds: Vec<JobKind> = self.handlers.keys().copied().collect();
        kinds.sort();
        kinds
    }

    /// Runs until `shutdown` is cancelled (or, with `exit_when_idle`, until idle).
    ///
    /// On shutdown it stops claiming, waits up to the grace period for running jobs, then
    /// cancels the rest and releases their leases so another worker can take them at once.
    pub async fn run(self, shutdown: CancellationToken) -> RunReport {
        let kinds = self.kinds();
        let config = &self.config;
        let mut report = RunReport::default();
        let mut wake = self.ledger.db().wake_bus().subscribe();
        let mut running: JoinSet<AttemptOutcome> = JoinSet::new();
        let mut in_flight: HashMap<tokio::task::Id, Running> = HashMap::new();
        let mut backoff = PollBackoff::new(config);
        crate::ledger::metrics::ledger().export_from_zero(&kinds);
        tracing::info!(worker.id = %config.worker_id, kinds = ?kinds, "worker started");

        while !shutdown.is_cancelled() {
            let round = if config.concurrency.saturating_sub(running.len()) >= self.batch() {
                let round = self.claim_round(&kinds, &mut running, &mut in_flight).await;
                backoff.record_claim(&round, &config.worker_id);
                round
            } else {
                ClaimRound::NoRoom
            };
            if config.exit_when_idle
                && !round.progressed()
                && running.is_empty()
                && !backoff.database_down()
            {
                break;
            }
            let batch_fits = config.concurrency - running.len() >= self.batch();
            let delay = backoff.next(&round, batch_fits);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                    Self::finish(&mut report, &mut in_flight, done);
                }
                changed = wake.changed() => {
                    if changed.is_err() {
                        // The bus outlives every Db clone we hold; this cannot happen while we run.
                        tokio::time::sleep(delay).await;
                    }
                }
                _ = tokio::time::sleep(delay) => {}
            }
        }

        self.drain(running, in_flight, &mut report).await;
        tracing::info!(worker.id = %config.worker_id, report = ?report, "worker stopped");
        report
    }

    /// Jobs claimed per pass. A claim happens only when a whole batch fits: one claim
    /// transaction then serves `max_jobs_per_wake` jobs instead of one (a commit each on SQLite).
    fn batch(&self) -> usize {
        self.config
            .max_jobs_per_wake
            .min(self.config.concurrency)
            .max(1)
    }

    /// Claims one batch (bounded by [`db_call_timeout`]) and starts an attempt per claimed job.
    async fn claim_round(
        &self,
        kinds: &[JobKind],
        running: &mut JoinSet<AttemptOutcome>,
        in_flight: &mut HashMap<tokio::task::Id, Running>,
    ) -> ClaimRound {
        let limit = self.batch();
        let request = ClaimRequest {
            worker_id: &self.config.worker_id,
            kinds,
            limit,
            lease_ms: duration_ms(self.config.lease),
            scopes: self.config.scopes.as_deref(),
        };
        let claim_sent = Instant::now();
        let claim = tokio::time::timeout(
            db_call_timeout(self.config.lease),
            self.ledger.claim(&request, self.gate.as_ref()),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out("claim")));
        let batch = match claim {
            Ok(batch) => batch,
            Err(error) => return ClaimRound::Failed(error),
        };
        let round = ClaimRound::Claimed {
            progressed: !batch.claimed.is_empty() || !batch.skipped.is_empty(),
            // Deferred jobs are not work for now; they do not count as progress.
            batch_full: batch.claimed.len() + batch.skipped.len() >= limit,
            // A retry or an expiring lease due before the next poll wakes this worker then;
            // never sooner than the fast-poll floor, so work due now but locked by another
            // claimer is not spun on.
            next_due: batch
                .next_due_in_ms
                .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)).max(FAST_POLL_MIN)),
        };
        for claimed in batch.claimed {
            let (id, entry) = self.spawn_attempt(running, claimed, claim_sent);
            in_flight.insert(id, entry);
        }
        round
    }

    /// Graceful shutdown: no more claims; running jobs get the grace period, then the rest are
    /// cancelled (their leases released) and awaited.
    async fn drain(
        &self,
        mut running: JoinSet<AttemptOutcome>,
        mut in_flight: HashMap<tokio::task::Id, Running>,
        report: &mut RunReport,
    ) {
        if running.is_empty() {
            return;
        }
        tracing::info!(worker.id = %self.config.worker_id, running = running.len(),
            grace_ms = duration_ms(self.config.grace), "waiting for running jobs");
        let deadline = tokio::time::sleep(self.config.grace);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                done = running.join_next_with_id() => match done {
                    Some(done) => Self::finish(report, &mut in_flight, done),
                    None => return,
                },
                _ = &mut deadline => break,
            }
        }
        for entry in in_flight.values() {
            entry.kill.cancel();
        }
        while let Some(done) = running.join_next_with_id().await {
            Self::finish(report, &mut in_flight, done);
        }
    }

    fn finish(
        report: &mut RunReport,
        in_flight: &mut HashMap<tokio::task::Id, Running>,
        done: Result<(tokio::task::Id, AttemptOutcome), tokio::task::JoinError>,
    ) {
        match done {
            Ok((id, outcome)) => {
                in_flight.remove(&id);
                report.record(outcome);
            }
            Err(error) => {
                // Attempt tasks catch handler panics themselves; reaching here means the
                // wrapper itself failed. The lease expires and the job is rescued.
                in_flight.remove(&error.id());
                tracing::error!(%error, "job attempt task failed");
                report.record(AttemptOutcome::Abandoned);
            }
        }
    }

    fn spawn_attempt(
        &self,
        running: &mut JoinSet<AttemptOutcome>,
        claimed: ClaimedJob,
        claim_sent: Instant,
    ) -> (tokio::task::Id, Running) {
        let handler = Arc::clone(&self.handlers[&claimed.job.kind]);
        let cancel = CancellationToken::new();
        let kill = CancellationToken::new();
        let attempt = Attempt {
            ctx: JobContext::claimed_at(self.ledger.clone(), claimed, cancel.clone(), claim_sent),
            handler,
            gate: Arc::clone(&self.gate),
            lease: self.config.lease,
            heartbeat: self.config.heartbeat,
            kill: kill.clone(),
        };
        let span = attempt.span();
        let handle = running.spawn(attempt.run().instrument(span));
        (handle.id(), Running { kill })
    }
}

/// What one pass of the loop got from its claim.
enum ClaimRound {
    /// Fewer free slots than a whole batch: no claim was made.
    NoRoom,
    Claimed {
        progressed: bool,
        batch_full: bool,
        next_due: Option<Duration>,
    },
    Failed(LedgerError),
}

impl ClaimRound {
    fn progressed(&self) -> bool {
        matches!(
            self,
            ClaimRound::Claimed {
                progressed: true,
                ..
            }
        )
    }
}

/// How long the loop waits before its next pass: at once while full batches keep coming, fast
/// polls (50 ms doubling to 1 s) where no notification crosses processes, the idle poll
/// interval otherwise, capped by the next due retry or lease; after a failed claim, a database
/// backoff (100 ms doubling to 5 s) that overrides all of them.
struct PollBackoff {
    fast_poll: bool,
    poll_interval: Duration,
    fast: Duration,
    database: Option<Duration>,
}

impl PollBackoff {
    fn new(config: &RunnerConfig) -> PollBackoff {
        PollBackoff {
            fast_poll: config.fast_poll,
            poll_interval: config.poll_interval,
            fast: FAST_POLL_MIN,
            database: None,
        }
    }

    fn database_down(&self) -> bool {
        self.database.is_some()
    }

    /// Tracks database reachability from a claim's result (logging the first failure and the
    /// recovery, not every retry).
    fn record_claim(&mut self, round: &ClaimRound, worker_id: &str) {
        match round {
            ClaimRound::NoRoom => {}
            ClaimRound::Claimed { .. } => {
                if self.database.take().is_some() {
                    tracing::info!(worker.id = %worker_id, "database reachable again");
                }
            }
            ClaimRound::Failed(error) => {
                if self.database.is_none() {
                    tracing::warn!(worker.id = %worker_id, %error,
                        "claim failed; retrying with backoff");
                }
                self.database = Some(
                    self.database
                        .map_or(DB_RETRY_MIN, |delay| (delay * 2).min(DB_RETRY_MAX)),
                );
            }
        }
    }

    /// The wait after `round`; `batch_fits` says whether a whole batch could be claimed now.
    fn next(&mut self, round: &ClaimRound, batch_fits: bool) -> Duration {
        if let Some(delay) = self.database {
            return delay;
        }
        let (progressed, batch_full, next_due) = match round {
            ClaimRound::Claimed {
                progressed,
                batch_full,
                next_due,
            } => (*progressed, *batch_full, *next_due),
            ClaimRound::NoRoom | ClaimRound::Failed(_) => (false, false, None),
        };
        let delay = if progressed && batch_full && batch_fits {
            Duration::ZERO
        } else if progressed {
            self.fast = FAST_POLL_MIN;
            if self.fast_poll {
                self.fast
            } else {
                self.poll_interval
            }
        } else if self.fast_poll && self.fast < FAST_POLL_MAX {
            self.fast = (self.fast * 2).min(FAST_POLL_MAX);
            self.fast
        } else {
            self.poll_interval
        };
        next_due.map_or(delay, |due| delay.min(due))
    }
}

const FAST_POLL_MIN: Duration = Duration::from_millis(50);
const FAST_POLL_MAX: Duration = Duration::from_secs(1);
const DB_RETRY_MIN: Duration = Duration::from_millis(100);
const DB_RETRY_MAX: Duration = Duration::from_secs(5);

/// How often a database failure that is not transient (a statement the database refused for
/// another reason than being unreachable or busy) re-runs the handler within its attempt before
/// the attempt is spent. Transient failures are re-run until the lease's deadline instead.
const STATEMENT_RERUNS: usize = 3;

/// Longest a single ledger call may take before the runner gives up on it: a frozen connection
/// must not hold an attempt (or the claim loop) forever.
fn db_call_timeout(lease: Duration) -> Duration {
    (lease / 2).clamp(Duration::from_millis(100), Duration::from_secs(30))
}

/// A ledger call that outlived [`db_call_timeout`]: an unresponsive connection, reported like
/// any other lost connection.
fn timed_out(call: &str) -> LedgerError {
    LedgerError::Store(crate::db::StoreError::Database(sqlx::Error::Io(
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the database did not answer the {call} in time"),
        ),
    )))
}

/// Backoff for database calls the runner repeats: short, jittered, bounded by `total`.
fn db_backoff(total: Duration) -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .with_total_delay(Some(total))
        .without_max_times()
}

fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// One claimed attempt: the handler raced against its heartbeats and the shutdown kill switch.
struct Attempt {
    ctx: JobContext,
    handler: Arc<dyn JobHandler>,
    gate: Arc<dyn ClaimGate>,
    lease: Duration,
    heartbeat: Duration,
    kill: CancellationToken,
}

/// Why the heartbeat loop stopped.
enum HeartbeatEnd {
    LeaseLost,
    SourceRevoked(String),
    /// No heartbeat (or settlement) got through for a whole lease: the database is unreachable
    /// or the connection froze. The lease has expired by now; the attempt ends.
    Unreachable,
}

impl Attempt {
    fn span(&self) -> tracing::Span {
        let job = &self.ctx.claimed.job;
        let span = tracing::info_span!("job",
            otel.name = %format!("job {}", job.kind),
            job.id = %job.id,
            job.kind = %job.kind,
            job.attempt = self.ctx.claimed.lease.attempt,
            worker.id = %self.ctx.claimed.lease.worker_id,
        );
        crate::trace_context::continue_trace(&span, job.trace_parent.as_deref());
        span
    }

    async fn run(self) -> AttemptOutcome {
        let started = Instant::now();
        let kind = self.ctx.claimed.job.kind;
        let mut release_when_reachable = false;
        // The block owns the handler's future: leaving it drops (cancels) the handler before a
        // release that may wait for the database.
        let outcome = {
            let handler_run = AssertUnwindSafe(self.run_handler()).catch_unwind();
            tokio::pin!(handler_run);
            let heartbeats = self.heartbeat_loop();
            tokio::pin!(heartbeats);
            let mut killed = false;
            loop {
                tokio::select! {
                    result = &mut handler_run => {
                        break match result {
                            Ok(Ok(job)) => AttemptOutcome::Settled(job.state),
                            Ok(Err(error)) => self.settle_error(error).await,
                            Err(panic) => {
                                let message = panic_message(&panic);
                                self.settle_error(JobError::retryable(format!("handler panicked: {message}"))).await
                            }
                        };
                    }
                    end = &mut heartbeats => {
                        self.ctx.cancel.cancel();
                        break match end {
                            HeartbeatEnd::LeaseLost => {
                                tracing::warn!("lease lost during the job; its result will not commit");
                                AttemptOutcome::LeaseLost
                            }
                            HeartbeatEnd::SourceRevoked(reason) => {
                                tracing::info!(%reason, "source revoked during the job; settled skipped");
                                AttemptOutcome::Settled(JobState::Skipped)
                            }
                            HeartbeatEnd::Unreachable => {
                                tracing::error!(lease_ms = duration_ms(self.lease),
                                    "no heartbeat reached the database for a whole lease; attempt aborted");
                                release_when_reachable = true;
                                AttemptOutcome::Abandoned
                            }
                        };
                    }
                    _ = self.kill.cancelled(), if !killed => {
                        killed = true;
                        if self.ctx.is_settling() {
                            // Settlement is one short transaction: let it finish rather than
                            // abandon a result that is about to commit.
                            continue;
                        }
                        self.ctx.cancel.cancel();
                        break self.release_after_abort().await;
                    }
                }
            }
        };
        let outcome = if release_when_reachable {
            self.release_when_reachable().await
        } else {
            outcome
        };
        let label = match outcome {
            AttemptOutcome::Settled(state) => match state {
                JobState::Completed => "completed",
                JobState::Failed => "failed",
                JobState::Queued => "retried",
                JobState::Skipped => "skipped",
                JobState::Uncertain => "uncertain",
                JobState::Running => "abandoned",
            },
            AttemptOutcome::LeaseLost => "lease_lost",
            AttemptOutcome::Released => "released",
            AttemptOutcome::Abandoned => "abandoned",
        };
        crate::ledger::metrics::ledger().job_duration(kind, label, started.elapsed());
        outcome
    }

    /// Runs the handler, re-running it within this attempt when it failed on the database: a
    /// database outage shorter than the lease must not spend one of the job's three attempts.
    /// Each re-run starts from scratch (nothing of a failed run committed) and the lease stays
    /// ours meanwhile, extended by the heartbeats once the database answers again. Re-runs stop
    /// at the lease's deadline as this side knows it; a run that starts before it and commits
    /// after it is still fenced by the lease token (a rescuer's claim changed it).
    async fn run_handler(&self) -> Result<crate::ledger::Job, JobError> {
        let mut backoff = db_backoff(self.lease).build();
        let started = Instant::now();
        let (mut reruns, mut statement_reruns) = (0, 0);
        loop {
            let error = match self.handler.run(self.ctx.clone()).await {
                Err(error @ JobError::Database { .. }) => error,
                Ok(job) if reruns > 0 => {
                    tracing::info!(
                        reruns,
                        waited_ms = duration_ms(started.elapsed()),
                        "the database answered again; the job ran within its attempt"
                    );
                    return Ok(job);
                }
                other => return other,
            };
            // The failed run's settlement is gone: heartbeats may extend the lease meanwhile.
            self.ctx.lease_guard.settling.store(false, Ordering::SeqCst);
            let transient = matches!(
                error,
                JobError::Database {
                    transient: true,
                    ..
                }
            );
            statement_reruns += usize::from(!transient);
            let Some(delay) = backoff.next() else {
                return Err(error);
            };
            let before_deadline =
                Instant::now() + delay < self.ctx.lease_guard.deadline(self.lease);
            if !before_deadline
                || statement_reruns > STATEMENT_RERUNS
                || self.ctx.cancel.is_cancelled()
            {
                return Err(error);
            }
            reruns += 1;
            crate::ledger::metrics::ledger().attempt_db_retry(self.ctx.claimed.job.kind);
            if reruns == 1 {
                tracing::warn!(%error, transient,
                    "database error inside the attempt; running the job again within its lease");
            } else {
                tracing::debug!(%error, rerun = reruns, retry_in_ms = duration_ms(delay),
                    "database error inside the attempt; running the job again");
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.ctx.cancel.cancelled() => return Err(error),
            }
        }
    }

    /// After the database was unreachable for a whole lease the lease has expired for everyone
    /// else: the release is the stale attempt's last word, refused and audited as `fenced` if
    /// another worker took the job over meanwhile. It is repeated while the database stays
    /// unreachable (bounded, and never past shutdown), so the attempt's end reaches the audit
    /// trail once the connection heals.
    async fn release_when_reachable(&self) -> AttemptOutcome {
        let patience = (self.lease * 10).clamp(Duration::from_secs(30), Duration::from_secs(600));
        let started = Instant::now();
        loop {
            let outcome = self.release_after_abort().await;
            if !matches!(outcome, AttemptOutcome::Abandoned) || started.elapsed() >= patience {
                return outcome;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = self.kill.cancelled() => return outcome,
            }
        }
    }

    /// Gives the lease back after the attempt was stopped (grace period over, or the database
    /// unreachable for a whole lease).
    async fn release_after_abort(&self) -> AttemptOutcome {
        let release = tokio::time::timeout(
            db_call_timeout(self.lease),
            self.ctx.ledger.release(&self.ctx.claimed.lease),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out("release")));
        match release {
            Ok(Some(job)) if job.state == JobState::Failed => {
                tracing::warn!(
                    error = job.last_error.as_deref().unwrap_or_default(),
                    "lease released; the job has no attempt left and failed"
                );
                AttemptOutcome::Released
            }
            Ok(Some(job)) => {
                tracing::info!(
                    attempts = job.attempts,
                    "attempt stopped; lease released for another worker"
                );
                AttemptOutcome::Released
            }
            Ok(None) => AttemptOutcome::LeaseLost,
            Err(error) => {
                tracing::warn!(%error, "cannot release the lease; it will expire");
                AttemptOutcome::Abandoned
            }
        }
    }

    /// Extends the lease every heartbeat interval; after a failed heartbeat, again with a short
    /// backoff (so the lease is extended as soon as the database answers). The attempt ends
    /// when the lease is lost, the source revoked, or when heartbeats kept failing (or
    /// settlement kept hanging) past the lease's deadline, measured on this process's monotonic
    /// clock whatever the database's clock says: by then the lease has expired for everyone else.
    async fn heartbeat_loop(&self) -> HeartbeatEnd {
        let guard = &self.ctx.lease_guard;
        // Set while heartbeats fail: only then (or during settlement) is the deadline watched,
        // so a worker that was frozen (paused, suspended) past its lease still reaches the
        // database, which refuses and audits its stale heartbeat.
        let mut failing: Option<backon::ExponentialBackoff> = None;
        // Settlement, once seen in progress, gets one whole lease from then to finish.
        let mut settling_since: Option<Instant> = None;
        loop {
            let deadline = settling_since
                .map_or_else(|| guard.deadline(self.lease), |since| since + self.lease);
            let watched = failing.is_some() || settling_since.is_some();
            let mut wait = match failing.as_mut() {
                Some(retry) => retry
                    .next()
                    .map_or(self.heartbeat, |d| d.min(self.heartbeat)),
                None => self.heartbeat,
            };
            if watched {
                wait = wait.min(deadline.saturating_duration_since(Instant::now()));
            }
            tokio::time::sleep(wait).await;
            if watched && Instant::now() >= deadline {
                return HeartbeatEnd::Unreachable;
            }
            let _exclusive = guard.lock.lock().await;
            if guard.settling.load(Ordering::SeqCst) {
                settling_since.get_or_insert_with(Instant::now);
                continue;
            }
            // Settlement gave the lease back when a database error re-runs the job.
            settling_since = None;
            // Only a watched deadline shortens the call (see `failing`).
            let call_timeout = match failing {
                Some(_) => deadline
                    .saturating_duration_since(Instant::now())
                    .min(db_call_timeout(self.lease)),
                None => db_call_timeout(self.lease),
            };
            match self.beat(call_timeout).await {
                Ok(HeartbeatOutcome::Extended { .. }) => {
                    if failing.take().is_some() {
                        tracing::info!("heartbeat reached the database again; lease extended");
                    }
                }
                Ok(HeartbeatOutcome::SourceRevoked { reason }) => {
                    return HeartbeatEnd::SourceRevoked(reason);
                }
                Err(LedgerError::LeaseLost { .. }) => return HeartbeatEnd::LeaseLost,
                Err(error) => {
                    // The lease stays ours until it expires; fencing keeps a late settlement
                    // safe if it does expire meanwhile.
                    if failing.is_none() {
                        tracing::warn!(%error, "heartbeat failed; retrying until the lease ends");
                        failing = Some(db_backoff(self.lease).build());
                    } else {
                        tracing::debug!(%error, "heartbeat failed again");
                    }
                }
            }
        }
    }

    /// One heartbeat, bounded by `call_timeout`; a success records the extension from when the
    /// heartbeat was sent.
    async fn beat(&self, call_timeout: Duration) -> Result<HeartbeatOutcome, LedgerError> {
        let sent = Instant::now();
        let beat = tokio::time::timeout(
            call_timeout,
            self.ctx.ledger.heartbeat(
                &self.ctx.claimed.lease,
                duration_ms(self.lease),
                self.gate.as_ref(),
            ),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out("heartbeat")));
        if matches!(beat, Ok(HeartbeatOutcome::Extended { .. })) {
            self.ctx.lease_guard.extended(sent);
        }
        beat
    }

    /// Records a failed attempt. A settlement the database refuses for any reason but a lost
    /// lease is retried with backoff until the lease's deadline; only then is it given up (the
    /// lease expires and the job is rescued).
    async fn settle_error(&self, error: JobError) -> AttemptOutcome {
        let (verb, message) = match &error {
            JobError::LeaseLost => return AttemptOutcome::LeaseLost,
            JobError::Retryable { message, .. } => ("retry", message.clone()),
            JobError::Database { message, .. } => ("retry", message.clone()),
            JobError::Permanent { message, .. } => ("fail", message.clone()),
            JobError::SourceChanged(reason) => ("skip", reason.clone()),
        };
        let settle = || async {
            let call = async {
                let settlement = self.ctx.begin_settlement().await?;
                match &error {
                    JobError::Retryable { message, retry_at } => {
                        settlement.retry(message, *retry_at).await
                    }
                    JobError::Database { .. } => settlement.retry(&message, None).await,
                    JobError::Permanent { message, result } => {
                        settlement.fail(message, result.clone()).await
                    }
                    JobError::SourceChanged(reason) => settlement.skip(reason).await,
                    JobError::LeaseLost => unreachable!("handled above"),
                }
            };
            tokio::time::timeout(db_call_timeout(self.lease), call)
                .await
                .unwrap_or_else(|_| Err(timed_out("settlement")))
        };
        let settled = settle
            .retry(db_backoff(
                self.ctx
                    .lease_guard
                    .deadline(self.lease)
                    .saturating_duration_since(Instant::now()),
            ))
            .when(|error| !matches!(error, LedgerError::LeaseLost { .. }))
            .notify(|settle_error, delay| {
                tracing::warn!(%settle_error, retry_in_ms = delay.as_millis() as u64,
                    "cannot record the attempt's outcome yet; retrying");
            })
            .await;
        match settled {
            Ok(job) => {
                match job.state {
                    JobState::Failed => {
                        tracing::error!(error = %message, attempts = job.attempts, "job failed")
                    }
                    JobState::Queued => tracing::warn!(error = %message, attempts = job.attempts,
                        retry_at = job.run_at, "job attempt failed; will retry"),
                    _ => tracing::info!(action = verb, detail = %message, "job settled"),
                }
                AttemptOutcome::Settled(job.state)
            }
            Err(LedgerError::LeaseLost { .. }) => AttemptOutcome::LeaseLost,
            Err(settle_error) => {
                tracing::error!(error = %message, %settle_error,
                    "cannot record the job's failure; the lease will expire");
                AttemptOutcome::Abandoned
            }
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        String::from("unknown panic payload")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_must_fit_twice_in_the_lease() {
        let mut config = RunnerConfig::new("w");
        assert_eq!(
            config.validate(),
            Ok(()),
            "the defaults (60 s lease, 15 s heartbeat)"
        );
        config.heartbeat = Duration::from_secs(30);
        assert_eq!(
            config.validate(),
            Err(RunnerConfigError::HeartbeatTooSlow {
                heartbeat_ms: 30_000,
                lease_ms: 60_000
            })
        );
        config.heartbeat = Duration::from_millis(29_999);
        assert_eq!(config.validate(), Ok(()));
        config.lease = Duration::ZERO;
        assert_eq!(config.validate(), Err(RunnerConfigError::EmptyLease));
    }

    fn claimed(progressed: bool, batch_full: bool, next_due: Option<Duration>) -> ClaimRound {
        ClaimRound::Claimed {
            progressed,
            batch_full,
            next_due,
        }
    }

    fn failed() -> ClaimRound {
        ClaimRound::Failed(timed_out("claim"))
    }

    fn backoff(fast_poll: bool) -> PollBackoff {
        let mut config = RunnerConfig::new("w");
        config.fast_poll = fast_poll;
        config.poll_interval = Duration::from_secs(60);
        PollBackoff::new(&config)
    }

    #[test]
    fn full_batches_are_claimed_again_at_once_and_partial_ones_poll() {
        let mut polls = backoff(false);
        assert_eq!(polls.next(&claimed(true, true, None), true), Duration::ZERO);
        assert_eq!(
            polls.next(&claimed(true, true, None), false),
            Duration::from_secs(60),
            "no room for another batch: wait for a wake-up or a finished job"
        );
        assert_eq!(
            polls.next(&claimed(true, false, None), true),
            Duration::from_secs(60)
        );
        assert_eq!(
            polls.next(
                &claimed(false, false, Some(Duration::from_millis(700))),
                true
            ),
            Duration::from_millis(700),
            "a retry due before the poll wakes the worker then"
        );
    }

    #[test]
    fn fast_polls_double_to_one_second_and_restart_after_progress() {
        let mut polls = backoff(true);
        let idle = claimed(false, false, None);
        let waits: Vec<u128> = (0..6)
            .map(|_| polls.next(&idle, true).as_millis())
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 60_000]);
        assert_eq!(
            polls.next(&claimed(true, false, None), true),
            Duration::from_millis(50)
        );
        assert_eq!(polls.next(&idle, true), Duration::from_millis(100));
    }

    #[test]
    fn a_failed_claim_backs_off_to_five_seconds_and_recovers_on_success() {
        let mut polls = backoff(true);
        let mut waits = Vec::new();
        for _ in 0..8 {
            polls.record_claim(&failed(), "w");
            waits.push(polls.next(&failed(), true).as_millis());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert!(polls.database_down());
        polls.record_claim(&ClaimRound::NoRoom, "w");
        assert!(
            polls.database_down(),
            "a pass without a claim says nothing about the database"
        );
        let due_soon = claimed(true, true, Some(Duration::from_millis(60)));
        polls.record_claim(&due_soon, "w");
        assert!(!polls.database_down());
        assert_eq!(polls.next(&due_soon, true), Duration::ZERO);
    }
}
