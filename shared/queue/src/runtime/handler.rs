//! What a job kind implements.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::ledger::{ClaimedJob, Job, JobKind, Lease, Ledger, LedgerError, Settlement};

/// Everything a handler gets for one claimed attempt.
#[derive(Clone)]
pub struct JobContext {
    pub ledger: Ledger,
    pub claimed: ClaimedJob,
    /// Cancelled when the lease is lost, the source is revoked, or shutdown's grace period ends.
    /// Long-running handlers should stop at their next await point.
    pub cancel: CancellationToken,
    pub(crate) lease_guard: Arc<LeaseGuard>,
}

/// Orders heartbeats before settlement for one attempt: once settlement begins no heartbeat
/// starts, and a heartbeat already in flight finishes first. Without it a heartbeat queued
/// behind our own settlement would find the job settled and report a false lease loss.
pub(crate) struct LeaseGuard {
    pub(crate) lock: tokio::sync::Mutex<()>,
    pub(crate) settling: AtomicBool,
    /// When the lease was last extended (the claim, then each heartbeat that got through),
    /// taken before the call was sent: the database started the lease no earlier, so this
    /// side's deadline never falls after the database's.
    extended_at: Mutex<Instant>,
}

impl LeaseGuard {
    fn new(extended_at: Instant) -> LeaseGuard {
        LeaseGuard {
            lock: tokio::sync::Mutex::new(()),
            settling: AtomicBool::new(false),
            extended_at: Mutex::new(extended_at),
        }
    }

    /// Records a lease extension sent at `sent`.
    pub(crate) fn extended(&self, sent: Instant) {
        let mut at = self.extended_at.lock().unwrap_or_else(|e| e.into_inner());
        *at = (*at).max(sent);
    }

    /// When a lease of `lease` ends unless a heartbeat extends it, on this process's monotonic
    /// clock.
    pub(crate) fn deadline(&self, lease: Duration) -> Instant {
        *self.extended_at.lock().unwrap_or_else(|e| e.into_inner()) + lease
    }
}

impl JobContext {
    pub fn new(ledger: Ledger, claimed: ClaimedJob, cancel: CancellationToken) -> JobContext {
        JobContext::claimed_at(ledger, claimed, cancel, Instant::now())
    }

    /// A context whose lease began no earlier than `claim_sent` (when the claim was sent).
    pub(crate) fn claimed_at(
        ledger: Ledger,
        claimed: ClaimedJob,
        cancel: CancellationToken,
        claim_sent: Instant,
    ) -> JobContext {
        JobContext {
            ledger,
            claimed,
            cancel,
            lease_guard: Arc::new(LeaseGuard::new(claim_sent)),
        }
    }

    pub fn job(&self) -> &Job {
        &self.claimed.job
    }

    pub fn lease(&self) -> &Lease {
        &self.claimed.lease
    }

    /// What the claim gate read about this job in the claim transaction, when it is a `T`.
    pub fn gate_findings<T: std::any::Any>(&self) -> Option<&T> {
        self.claimed.findings.as_ref()?.get()
    }

    /// Opens the fenced settlement transaction for this attempt (stopping heartbeats first).
    /// Every result of the job must be written through it.
    pub async fn begin_settlement(&self) -> Result<Settlement<'_>, LedgerError> {
        {
            let _exclusive = self.lease_guard.lock.lock().await;
            self.lease_guard.settling.store(true, Ordering::SeqCst);
        }
        self.ledger.begin_settlement(&self.claimed.lease).await
    }

    /// A lease-proven transaction for writes made before settlement (see
    /// [`Ledger::fenced_tx`](crate::ledger::Ledger::fenced_tx)).
    pub async fn fenced_tx(&self) -> Result<crate::db::Tx, LedgerError> {
        self.ledger.fenced_tx(&self.claimed.lease).await
    }

    pub(crate) fn is_settling(&self) -> bool {
        self.lease_guard.settling.load(Ordering::SeqCst)
    }
}

/// How an attempt failed. Matched exhaustively by the runner.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// May succeed later (network, rate limit, temporary provider error). The job returns to the
    /// queue until its third attempt, then fails keeping this message.
    #[error("{message}")]
    Retryable {
        message: String,
        /// When to retry (e.g. a provider's `Retry-After`); `None` = the ledger's backoff.
        retry_at: Option<i64>,
    },
    /// Will never succeed (bad input, authentication, unknown model): fails at once.
    #[error("{message}")]
    Permanent {
        message: String,
        result: Option<serde_json::Value>,
    },
    /// The source changed or the work is no longer allowed: settles `skipped`.
    #[error("source no longer current: {0}")]
    SourceChanged(String),
    /// The lease was lost; nothing was committed and nothing more may be written.
    #[error("lease lost")]
    LeaseLost,
    /// A database statement failed. The runner runs the job again within the same attempt and
    /// lease: a `transient` failure (the database unreachable, restarting or busy) until the
    /// lease's deadline, so an outage shorter than the lease spends no attempt; any other a few
    /// times. Then it is retried like [`JobError::Retryable`]. `message` is the store's own
    /// text ("database error: …").
    #[error("{message}")]
    Database { message: String, transient: bool },
}

impl JobError {
    pub fn retryable(message: impl Into<String>) -> JobError {
        JobError::Retryable {
            message: message.into(),
            retry_at: None,
        }
    }

    pub fn permanent(message: impl Into<String>) -> JobError {
        JobError::Permanent {
            message: message.into(),
            result: None,
        }
    }
}

impl From<LedgerError> for JobError {
    fn from(error: LedgerError) -> JobError {
        match error {
            LedgerError::LeaseLost { .. } => JobError::LeaseLost,
            LedgerError::Store(store) => store.into(),
            LedgerError::NotFound(id) => JobError::permanent(format!("job {id} vanished")),
            LedgerError::Invalid(message) => JobError::permanent(message),
        }
    }
}

/// A storage failure inside a handler: the database may be back in a moment. A constraint
/// refusal or corrupt data will not heal by running again at once, so it spends the attempt.
impl From<crate::db::StoreError> for JobError {
    fn from(error: crate::db::StoreError) -> JobError {
        match &error {
            crate::db::StoreError::Database(_) if error.constraint_violation().is_none() => {
                JobError::Database {
                    transient: error.is_connection() || error.is_contention(),
                    message: error.to_string(),
                }
            }
            _ => JobError::retryable(error.to_string()),
        }
    }
}

impl From<sqlx::Error> for JobError {
    fn from(error: sqlx::Error) -> JobError {
        crate::db::StoreError::from(error).into()
    }
}

/// The work of one job kind. `run` must settle the job through
/// [`Ledger::begin_settlement`](crate::ledger::Ledger::begin_settlement) so its results commit
/// in the same transaction as the lease check, and returns the settled job.
#[async_trait]
pub trait JobHandler: Send + Sync + 'static {
    fn kind(&self) -> JobKind;

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError>;
}
