//! The worker loop: wake, claim, run with heartbeats, settle, and shut down gracefully.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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

impl RunnerConfig {
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
        let mut fast_delay = FAST_POLL_MIN;
        let mut db_error_delay: Option<Duration> = None;
        tracing::info!(worker.id = %config.worker_id, kinds = ?kinds, "worker started");

        loop {
            if shutdown.is_cancelled() {
                break;
            }
            let free = config.concurrency.saturating_sub(running.len());
            let mut claimed_any = false;
            let mut batch_full = false;
            // Claim only when a whole wake's batch fits: one claim transaction then serves
            // `max_jobs_per_wake` jobs instead of one (a commit each on SQLite).
            let batch = config.max_jobs_per_wake.min(config.concurrency).max(1);
            if free >= batch {
                let limit = batch;
                let request = ClaimRequest {
                    worker_id: &config.worker_id,
                    kinds: &kinds,
                    limit,
                    lease_ms: duration_ms(config.lease),
                    scopes: config.scopes.as_deref(),
                };
                match self.ledger.claim(&request, self.gate.as_ref()).await {
                    Ok(batch) => {
                        if db_error_delay.take().is_some() {
                            tracing::info!(worker.id = %config.worker_id, "database reachable again");
                        }
                        claimed_any = !batch.claimed.is_empty() || !batch.skipped.is_empty();
                        // Deferred jobs are not work for now; they do not count as progress.
                        batch_full = batch.claimed.len() + batch.skipped.len() >= limit;
                        for claimed in batch.claimed {
                            let (id, entry) = self.spawn_attempt(&mut running, claimed);
                            in_flight.insert(id, entry);
                        }
                    }
                    Err(error) => {
                        let delay =
                            db_error_delay.map_or(DB_RETRY_MIN, |d| (d * 2).min(DB_RETRY_MAX));
                        if db_error_delay.is_none() {
                            tracing::warn!(worker.id = %config.worker_id, %error,
                                "claim failed; retrying with backoff");
                        }
                        db_error_delay = Some(delay);
                    }
                }
            }
            if config.exit_when_idle
                && !claimed_any
                && running.is_empty()
                && db_error_delay.is_none()
            {
                break;
            }
            let delay = if let Some(delay) = db_error_delay {
                delay
            } else if claimed_any && batch_full && config.concurrency - running.len() >= batch {
                Duration::ZERO
            } else if claimed_any {
                fast_delay = FAST_POLL_MIN;
                if config.fast_poll {
                    fast_delay
                } else {
                    config.poll_interval
                }
            } else if config.fast_poll && fast_delay < FAST_POLL_MAX {
                fast_delay = (fast_delay * 2).min(FAST_POLL_MAX);
                fast_delay
            } else {
                config.poll_interval
            };
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

        // Graceful shutdown: no more claims; give running jobs the grace period.
        if !running.is_empty() {
            tracing::info!(worker.id = %config.worker_id, running = running.len(),
                grace_ms = duration_ms(config.grace), "waiting for running jobs");
            let deadline = tokio::time::sleep(config.grace);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    done = running.join_next_with_id() => match done {
                        Some(done) => Self::finish(&mut report, &mut in_flight, done),
                        None => break,
                    },
                    _ = &mut deadline => {
                        for entry in in_flight.values() {
                            entry.kill.cancel();
                        }
                        while let Some(done) = running.join_next_with_id().await {
                            Self::finish(&mut report, &mut in_flight, done);
                        }
                        break;
                    }
                }
            }
        }
        tracing::info!(worker.id = %config.worker_id, report = ?report, "worker stopped");
        report
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
    ) -> (tokio::task::Id, Running) {
        let handler = Arc::clone(&self.handlers[&claimed.job.kind]);
        let cancel = CancellationToken::new();
        let kill = CancellationToken::new();
        let attempt = Attempt {
            ctx: JobContext::new(self.ledger.clone(), claimed, cancel.clone()),
            handler,
            gate: Arc::clone(&self.gate),
            lease_ms: duration_ms(self.config.lease),
            heartbeat: self.config.heartbeat,
            kill: kill.clone(),
        };
        let span = attempt.span();
        let handle = running.spawn(attempt.run().instrument(span));
        (handle.id(), Running { kill })
    }
}

const FAST_POLL_MIN: Duration = Duration::from_millis(50);
const FAST_POLL_MAX: Duration = Duration::from_secs(1);
const DB_RETRY_MIN: Duration = Duration::from_millis(100);
const DB_RETRY_MAX: Duration = Duration::from_secs(5);

fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// One claimed attempt: the handler raced against its heartbeats and the shutdown kill switch.
struct Attempt {
    ctx: JobContext,
    handler: Arc<dyn JobHandler>,
    gate: Arc<dyn ClaimGate>,
    lease_ms: i64,
    heartbeat: Duration,
    kill: CancellationToken,
}

/// Why the heartbeat loop stopped.
enum HeartbeatEnd {
    LeaseLost,
    SourceRevoked(String),
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
        crate::telemetry::continue_trace(&span, job.trace_parent.as_deref());
        span
    }

    async fn run(self) -> AttemptOutcome {
        let started = Instant::now();
        let kind = self.ctx.claimed.job.kind;
        let handler_run = AssertUnwindSafe(self.handler.run(self.ctx.clone())).catch_unwind();
        tokio::pin!(handler_run);
        let heartbeats = self.heartbeat_loop();
        tokio::pin!(heartbeats);
        let mut killed = false;
        let outcome = loop {
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
                    break match self.ctx.ledger.release(&self.ctx.claimed.lease).await {
                        Ok(true) => {
                            tracing::info!("grace period over; lease released for another worker");
                            AttemptOutcome::Released
                        }
                        Ok(false) => AttemptOutcome::LeaseLost,
                        Err(error) => {
                            tracing::warn!(%error, "cannot release the lease; it will expire");
                            AttemptOutcome::Abandoned
                        }
                    };
                }
            }
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
        crate::telemetry::metrics::ledger().job_duration(kind, label, started.elapsed());
        outcome
    }

    async fn heartbeat_loop(&self) -> HeartbeatEnd {
        let lease = &self.ctx.claimed.lease;
        loop {
            tokio::time::sleep(self.heartbeat).await;
            let _exclusive = self.ctx.lease_guard.lock.lock().await;
            if self.ctx.lease_guard.settling.load(Ordering::SeqCst) {
                // Settlement owns the lease from here; stop heartbeating for good.
                drop(_exclusive);
                std::future::pending::<()>().await;
            }
            match self
                .ctx
                .ledger
                .heartbeat(lease, self.lease_ms, self.gate.as_ref())
                .await
            {
                Ok(HeartbeatOutcome::Extended { .. }) => {}
                Ok(HeartbeatOutcome::SourceRevoked { reason }) => {
                    return HeartbeatEnd::SourceRevoked(reason);
                }
                Err(LedgerError::LeaseLost { .. }) => return HeartbeatEnd::LeaseLost,
                Err(error) => {
                    // The lease stays ours until it expires; fencing keeps a late settlement
                    // safe if it does expire meanwhile.
                    tracing::warn!(%error, "heartbeat failed; will retry");
                }
            }
        }
    }

    async fn settle_error(&self, error: JobError) -> AttemptOutcome {
        let (verb, message) = match &error {
            JobError::LeaseLost => return AttemptOutcome::LeaseLost,
            JobError::Retryable { message, .. } => ("retry", message.clone()),
            JobError::Permanent { message, .. } => ("fail", message.clone()),
            JobError::SourceChanged(reason) => ("skip", reason.clone()),
        };
        let settlement = match self.ctx.begin_settlement().await {
            Ok(settlement) => settlement,
            Err(LedgerError::LeaseLost { .. }) => return AttemptOutcome::LeaseLost,
            Err(settle_error) => {
                tracing::error!(error = %message, %settle_error,
                    "job failed and the failure could not be recorded; the lease will expire");
                return AttemptOutcome::Abandoned;
            }
        };
        let settled = match error {
            JobError::Retryable { message, retry_at } => settlement.retry(&message, retry_at).await,
            JobError::Permanent { message, result } => settlement.fail(&message, result).await,
            JobError::SourceChanged(reason) => settlement.skip(&reason).await,
            JobError::LeaseLost => unreachable!("handled above"),
        };
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
                tracing::error!(error = %message, %settle_error, "cannot record the job's failure");
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
