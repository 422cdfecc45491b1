//! The durable job ledger: idempotent admission, leased claims with fencing tokens, heartbeats,
//! a database-enforced three-attempt ceiling, interval buckets and restart recovery.
//!
//! Every operation is one short transaction. Work runs outside any transaction; every later
//! write for a claimed job presents its lease token and is refused once the token is stale.
//! See docs/adr/0002-job-ledger-design.md for the design and the patterns it borrows.

mod admit;
mod claim;
pub mod metrics;
mod model;
mod query;
mod row;
mod settle;
mod withdraw;

use crate::clock::SharedClock;
use crate::db::{Backend, Db, StoreError, Tx};

pub use admit::Admission;
pub use claim::{
    AllowAll, ClaimBatch, ClaimGate, ClaimRequest, GateDecision, QuarantinedAtClaim, SkippedAtClaim,
};
pub use model::{
    ClaimedJob, GateFindings, Job, JobIdentity, JobKind, JobOrigin, JobState, Lease, MAX_ATTEMPTS,
    NewJob, UnknownJobState, bucket_start,
};
pub use query::{JobEvent, JobFilter, QueueCount, another_run_in, earlier_run_in};
pub use settle::{HeartbeatOutcome, MAX_RETURNED_RELEASES, Settlement, retry_backoff_ms};
pub use withdraw::{JobScope, QueuedJobs};

/// The Postgres notification channel the ledger publishes on when a job becomes claimable
/// (admitted, retried, released or rescued); workers `LISTEN` on it (`runtime::wake`).
pub const PG_CHANNEL: &str = "zuno_jobs";

/// Errors from ledger operations.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("job `{0}` was not found")]
    NotFound(String),
    /// The lease token no longer matches: the job expired and was claimed elsewhere, was
    /// revoked, or was already settled. Nothing was written.
    #[error("the lease on job `{job_id}` was lost; nothing was committed")]
    LeaseLost { job_id: String },
    #[error("invalid job: {0}")]
    Invalid(String),
}

impl From<sqlx::Error> for LedgerError {
    fn from(error: sqlx::Error) -> Self {
        LedgerError::Store(StoreError::Database(error))
    }
}

/// Handle to the ledger. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    db: Db,
    clock: SharedClock,
    /// Lease decisions use the database's clock (Postgres with a real clock): every host of a
    /// fleet then agrees on when a lease expires, whatever its own clock says.
    database_clock: bool,
    /// When this handle last scanned for expired leases (see [`Ledger::claim`]).
    last_rescue: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl Ledger {
    pub fn new(db: Db, clock: SharedClock) -> Ledger {
        let database_clock = db.backend() == Backend::Postgres && !clock.is_simulated();
        Ledger {
            db,
            clock,
            database_clock,
            last_rescue: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN)),
        }
    }

    /// Whether claims, heartbeats, rescues and settlements read the time from the database
    /// (Postgres) rather than from this process's clock (SQLite, or a simulated clock).
    pub fn uses_database_clock(&self) -> bool {
        self.database_clock
    }

    /// The time bound into lease statements as their `now` parameter: `None` lets the database
    /// fill in its own clock (see [`now_sql`]).
    pub(crate) fn statement_now(&self) -> Option<i64> {
        (!self.database_clock).then(|| self.clock.now_ms())
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Appends an audit event for a job in its own transaction (used for refusals, which by
    /// definition happen after the refused transaction rolled back).
    pub(crate) async fn record_event(
        &self,
        job_id: &str,
        event: &str,
        worker_id: Option<&str>,
        detail: &str,
    ) -> Result<(), LedgerError> {
        let mut tx = self.db.begin().await?;
        insert_event(
            &mut tx,
            job_id,
            event,
            worker_id,
            detail,
            self.statement_now(),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

pub(crate) async fn insert_event(
    tx: &mut Tx,
    job_id: &str,
    event: &str,
    worker_id: Option<&str>,
    detail: &str,
    now: Option<i64>,
) -> Result<(), StoreError> {
    let sql = format!(
        "INSERT INTO learning_job_event (id, job_id, event, worker_id, detail, at) \
         VALUES ($1, $2, $3, $4, $5, {})",
        now_sql(tx.backend(), 6)
    );
    crate::on_tx!(tx, |conn| sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(crate::ids::new_id("jev"))
        .bind(job_id)
        .bind(event)
        .bind(worker_id)
        .bind(truncate_detail(detail))
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

/// Wakes waiting workers once `tx` commits: co-located ones through the wake bus and, on
/// Postgres, every other process through `NOTIFY` (delivered only on commit). Used whenever work
/// becomes claimable now or at a known time: admission, retry scheduling, release and rescue.
pub(crate) async fn notify_in(tx: &mut Tx, reason: &str) -> Result<(), StoreError> {
    if tx.backend() == Backend::Postgres {
        crate::on_tx!(tx, |conn| sqlx::query("SELECT pg_notify($1, $2)")
            .bind(crate::ledger::PG_CHANNEL)
            .bind(reason)
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
    }
    tx.wake_after_commit();
    Ok(())
}

/// The statement's time in Unix milliseconds: parameter `$param` when bound (the local or a
/// simulated clock), else the database's own clock. Only Postgres is ever left to its clock;
/// SQLite serves one host and always gets the local time, so there it is the parameter alone.
pub(crate) fn now_sql(backend: Backend, param: usize) -> String {
    match backend {
        Backend::Postgres => format!(
            "COALESCE(${param}, CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT))"
        ),
        Backend::Sqlite => format!("${param}"),
    }
}

/// Bounds stored diagnostics so a runaway error text cannot bloat the ledger.
pub(crate) fn truncate_detail(detail: &str) -> String {
    const LIMIT: usize = 2000;
    if detail.len() <= LIMIT {
        return detail.to_owned();
    }
    let mut end = LIMIT;
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &detail[..end])
}
