//! Fenced writes for a claimed job: heartbeats, settlement, release and revocation.
//!
//! Each statement is `UPDATE … WHERE id = ? AND lease_token = ? AND state = 'running'`; zero
//! rows affected means the lease is gone, the transaction is rolled back, and the refusal is
//! recorded as a `fenced` event, counted in metrics and logged.

use super::claim::{ClaimGate, GateDecision};
use super::model::{Job, JobKind, JobState, Lease};
use super::row::{JOB_COLUMNS, JobRow};
use super::{Ledger, LedgerError, insert_event, notify_in, now_sql, truncate_detail};
use crate::db::{Db, Tx};

/// What a heartbeat achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The lease now lasts until `expires_at`.
    Extended { expires_at: i64 },
    /// The job's source changed or its policy no longer allows the work; the job was settled
    /// `skipped` in the heartbeat's transaction and the worker must stop without committing.
    SourceRevoked { reason: String },
}

/// Durable retry delay after failed attempt `attempt` (1-based): 10 s, 60 s, 6 min, capped at
/// 30 min.
pub fn retry_backoff_ms(attempt: i64) -> i64 {
    let exponent = u32::try_from(attempt.clamp(1, 8) - 1).unwrap_or(0);
    (10_000_i64 * 6_i64.pow(exponent)).min(30 * 60 * 1000)
}

impl Ledger {
    /// Extends a lease, after rechecking the job's source through `gate` in the same
    /// transaction.
    pub async fn heartbeat(
        &self,
        lease: &Lease,
        lease_ms: i64,
        gate: &dyn ClaimGate,
    ) -> Result<HeartbeatOutcome, LedgerError> {
        let now = self.statement_now();
        let mut tx = self.db.begin().await?;
        let sql = format!(
            "UPDATE learning_job SET lease_expires_at = {now_at} + $3, heartbeat_at = {now_at}, \
               updated_at = {now_at} \
             WHERE id = $1 AND lease_token = $2 AND state = 'running' RETURNING {JOB_COLUMNS}",
            now_at = now_sql(tx.backend(), 4)
        );
        let row: Option<JobRow> = crate::on_tx!(&mut tx, |conn| sqlx::query_as(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(&lease.job_id)
        .bind(&lease.token)
        .bind(lease_ms)
        .bind(now)
        .fetch_optional(conn)
        .await)?;
        let Some(row) = row else {
            tx.rollback().await?;
            self.refuse(lease, "heartbeat").await?;
            return Err(LedgerError::LeaseLost {
                job_id: lease.job_id.clone(),
            });
        };
        let job = Job::try_from(row)?;
        let expires_at = job.lease_expires_at.unwrap_or_default();
        match gate.check(&mut tx, &job).await? {
            // A deferral concerns new work; a running attempt may finish.
            GateDecision::Proceed | GateDecision::ProceedWith(_) | GateDecision::Defer { .. } => {
                tx.commit().await?;
                Ok(HeartbeatOutcome::Extended { expires_at })
            }
            GateDecision::Skip { reason } => {
                let ending = Ending {
                    outcome: Outcome::Terminal(JobState::Skipped),
                    result: Some(&skip_result(&reason)),
                    error: None,
                    retry_delay_ms: None,
                };
                finish_returning(&mut tx, lease, &ending, now).await?;
                insert_event(
                    &mut tx,
                    &lease.job_id,
                    "skipped",
                    Some(&lease.worker_id),
                    &reason,
                    now,
                )
                .await?;
                tx.commit().await?;
                Ok(HeartbeatOutcome::SourceRevoked { reason })
            }
        }
    }

    /// Starts settling a claimed job.
    ///
    /// Nothing is sent yet. A settlement without domain writes is one guarded autocommit
    /// `UPDATE` at the end; the first call to [`Settlement::tx`] opens the transaction and proves
    /// the lease before any domain write (on Postgres that locks the job row until commit, on
    /// SQLite the transaction holds the write lock), so no rescue or claim can interleave. A lost
    /// lease surfaces as [`LedgerError::LeaseLost`] from `tx()` or from the final state change,
    /// and nothing is written.
    pub async fn begin_settlement(&self, lease: &Lease) -> Result<Settlement<'_>, LedgerError> {
        Ok(Settlement {
            ledger: self,
            tx: None,
            lease: lease.clone(),
        })
    }

    /// A transaction for writes made on behalf of a claimed job before it settles (for example
    /// the exact input, persisted before a provider request). Like settlement it proves the
    /// lease first; the caller commits it.
    pub async fn fenced_tx(&self, lease: &Lease) -> Result<Tx, LedgerError> {
        let now = self.statement_now();
        let mut tx = self.db.begin().await?;
        let sql = proof_sql(tx.backend());
        let proven = crate::on_tx!(&mut tx, |conn| sqlx::query(sqlx::AssertSqlSafe(
            sql.as_str()
        ))
        .bind(&lease.job_id)
        .bind(&lease.token)
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
        if proven != 1 {
            tx.rollback().await?;
            self.refuse(lease, "write").await?;
            return Err(LedgerError::LeaseLost {
                job_id: lease.job_id.clone(),
            });
        }
        Ok(tx)
    }

    /// Returns a claimed job to the queue (graceful shutdown past the grace period) and wakes
    /// other workers for it. Returns the job as released, or `None` when the lease was already
    /// lost.
    ///
    /// The first [`MAX_RETURNED_RELEASES`] releases of a job give its attempt back; later ones
    /// spend it, so a job that always outlives the grace period runs at most
    /// `max_attempts + MAX_RETURNED_RELEASES` times and then settles `failed` saying why.
    pub async fn release(&self, lease: &Lease) -> Result<Option<Job>, LedgerError> {
        let now = self.statement_now();
        let mut tx = self.db.begin().await?;
        let sql = format!(
            "UPDATE learning_job SET \
               state = CASE WHEN releases < $3 OR attempts < max_attempts THEN 'queued' \
                            ELSE 'failed' END, \
               attempts = CASE WHEN releases < $3 THEN attempts - 1 ELSE attempts END, \
               releases = CASE WHEN releases < $3 THEN releases + 1 ELSE releases END, \
               last_error = CASE WHEN releases < $3 THEN last_error ELSE $4 END, \
               finished_at = CASE WHEN releases < $3 OR attempts < max_attempts THEN NULL \
                                  ELSE {now_at} END, \
               lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
               heartbeat_at = NULL, run_at = {now_at}, updated_at = {now_at} \
             WHERE id = $1 AND lease_token = $2 AND state = 'running' RETURNING {JOB_COLUMNS}",
            now_at = now_sql(tx.backend(), 5)
        );
        let spent = format!(
            "attempt {} did not finish within the shutdown grace period and the job was already \
             released {MAX_RETURNED_RELEASES} time(s); the attempt counts",
            lease.attempt
        );
        let row: Option<JobRow> = crate::on_tx!(&mut tx, |conn| sqlx::query_as(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(&lease.job_id)
        .bind(&lease.token)
        .bind(MAX_RETURNED_RELEASES)
        .bind(&spent)
        .bind(now)
        .fetch_optional(conn)
        .await)?;
        let Some(row) = row else {
            tx.rollback().await?;
            // Another worker took the job over: the release is a stale write like any other.
            self.refuse(lease, "release").await?;
            return Ok(None);
        };
        let job = Job::try_from(row)?;
        let detail = if job.attempts < lease.attempt {
            String::from("released on shutdown; attempt not spent")
        } else {
            spent
        };
        insert_event(
            &mut tx,
            &lease.job_id,
            "released",
            Some(&lease.worker_id),
            &detail,
            now,
        )
        .await?;
        if job.state == JobState::Queued {
            notify_in(&mut tx, "released").await?;
        }
        tx.commit().await?;
        crate::ledger::metrics::ledger().released(job.kind, job.state.as_str());
        Ok(Some(job))
    }

    /// Revokes queued or running extraction jobs for one source message, except `keep_job_id`,
    /// inside the caller's transaction (a new explicit input supersedes older ones). A running
    /// worker's lease stops matching, so its later writes are refused. Each job gets a `revoked`
    /// event and `zuno_jobs_revoked` counts it.
    pub async fn revoke_source_jobs_in(
        &self,
        tx: &mut Tx,
        session_id: &str,
        source_message_id: &str,
        keep_job_id: &str,
        reason: &str,
    ) -> Result<Vec<String>, LedgerError> {
        let now = self.statement_now();
        let sql = format!(
            "UPDATE learning_job SET {} \
             WHERE kind = 'extract' AND session_id = $1 AND source_message_id = $2 \
               AND id <> $3 AND state IN ('queued', 'running') \
             RETURNING id",
            revoked_set(tx.backend(), 4, 5)
        );
        let result = skip_result(reason);
        let revoked: Vec<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(session_id)
        .bind(source_message_id)
        .bind(keep_job_id)
        .bind(&result)
        .bind(now)
        .fetch_all(conn)
        .await)?;
        for job_id in &revoked {
            insert_event(tx, job_id, "revoked", None, reason, now).await?;
            crate::ledger::metrics::ledger().revoked(JobKind::Extract);
        }
        Ok(revoked)
    }

    /// Records a refused write. The metric counts only refusals the audit table holds, so the
    /// two always agree.
    async fn refuse(&self, lease: &Lease, what: &str) -> Result<(), LedgerError> {
        tracing::warn!(job.id = %lease.job_id, job.kind = %lease.kind, worker.id = %lease.worker_id,
            attempt = lease.attempt, "{what} refused: the lease was lost; nothing was committed");
        self.record_event(
            &lease.job_id,
            "fenced",
            Some(&lease.worker_id),
            &format!("{what} refused for attempt {}", lease.attempt),
        )
        .await?;
        crate::ledger::metrics::ledger().fenced(lease.kind, what);
        Ok(())
    }
}

/// How many graceful releases of one job give its attempt back.
pub const MAX_RETURNED_RELEASES: i64 = 1;

/// The first statement of a fenced transaction: proves the lease (and locks the row on
/// Postgres). `$1` job, `$2` token, `$3` now.
fn proof_sql(backend: crate::db::Backend) -> String {
    format!(
        "UPDATE learning_job SET updated_at = {} \
         WHERE id = $1 AND lease_token = $2 AND state = 'running'",
        now_sql(backend, 3)
    )
}

/// The assignments that revoke a queued or running job: `skipped` with the result in
/// placeholder `$result`, its lease cleared (the holder's next fenced write is refused), finished
/// at the time in placeholder `$now` (the database's clock on Postgres).
pub(super) fn revoked_set(backend: crate::db::Backend, result: usize, now: usize) -> String {
    format!(
        "state = 'skipped', result = ${result}, lease_token = NULL, lease_owner = NULL, \
         lease_expires_at = NULL, finished_at = {now_at}, updated_at = {now_at}",
        now_at = now_sql(backend, now)
    )
}

pub(super) fn skip_result(reason: &str) -> String {
    serde_json::json!({ "skipped": reason }).to_string()
}

/// A claimed job's settlement: its results and terminal state commit together or not at all.
/// Dropping it without settling rolls back any domain writes.
pub struct Settlement<'l> {
    ledger: &'l Ledger,
    tx: Option<Tx>,
    lease: Lease,
}

impl Settlement<'_> {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn kind(&self) -> JobKind {
        self.lease.kind
    }

    /// The transaction for the job's domain writes, opened (and the lease proven) on first use.
    pub async fn tx(&mut self) -> Result<&mut Tx, LedgerError> {
        if self.tx.is_none() {
            let now = self.ledger.statement_now();
            let mut tx = self.ledger.db.begin().await?;
            let sql = proof_sql(tx.backend());
            let proven = crate::on_tx!(&mut tx, |conn| sqlx::query(sqlx::AssertSqlSafe(
                sql.as_str()
            ))
            .bind(&self.lease.job_id)
            .bind(&self.lease.token)
            .bind(now)
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
            if proven != 1 {
                tx.rollback().await?;
                self.ledger.refuse(&self.lease, "settlement").await?;
                return Err(LedgerError::LeaseLost {
                    job_id: self.lease.job_id.clone(),
                });
            }
            // Only Postgres takes the kind's advisory lock (SQLite's write lock is already held).
            if self.lease.kind.runs_alone_in_any_order()
                && tx.backend() == crate::db::Backend::Postgres
            {
                let project_id: Option<String> = crate::on_tx!(&mut tx, |conn| {
                    sqlx::query_scalar("SELECT project_id FROM learning_job WHERE id = $1")
                        .bind(&self.lease.job_id)
                        .fetch_one(conn)
                        .await
                })?;
                super::query::lock_runs_in(&mut tx, self.lease.kind, project_id.as_deref()).await?;
            }
            self.tx = Some(tx);
        }
        Ok(self.tx.as_mut().expect("opened above"))
    }

    /// Settles `completed` with `result`, committing the domain writes with it.
    pub async fn complete(self, result: serde_json::Value) -> Result<Job, LedgerError> {
        self.finish(
            Outcome::Terminal(JobState::Completed),
            Some(result.to_string()),
            None,
            None,
        )
        .await
    }

    /// Settles `skipped` (the source changed or the work is no longer wanted).
    pub async fn skip(mut self, reason: &str) -> Result<Job, LedgerError> {
        let now = self.ledger.statement_now();
        let worker = self.lease.worker_id.clone();
        let job_id = self.lease.job_id.clone();
        insert_event(
            self.tx().await?,
            &job_id,
            "skipped",
            Some(&worker),
            reason,
            now,
        )
        .await?;
        self.finish(
            Outcome::Terminal(JobState::Skipped),
            Some(skip_result(reason)),
            None,
            None,
        )
        .await
    }

    /// Records a failed attempt that may succeed later: back to `queued` after a delay, or
    /// `failed` (keeping the error) when this was the last attempt.
    pub async fn retry(self, error: &str, retry_at: Option<i64>) -> Result<Job, LedgerError> {
        if self.lease.attempt >= super::MAX_ATTEMPTS {
            return self.fail(error, None).await;
        }
        // A requested retry time is this host's; only the delay it implies travels, so the
        // ledger's clock (the database's on Postgres) decides when the job is due.
        let delay = match retry_at {
            Some(at) => at.saturating_sub(self.ledger.now_ms()).max(0),
            None => retry_backoff_ms(self.lease.attempt),
        };
        self.finish(Outcome::Retry, None, Some(error), Some(delay))
            .await
    }

    /// Settles `failed` at once (a permanent failure), keeping the error and optional result.
    pub async fn fail(
        self,
        error: &str,
        result: Option<serde_json::Value>,
    ) -> Result<Job, LedgerError> {
        self.finish(
            Outcome::Terminal(JobState::Failed),
            result.map(|r| r.to_string()),
            Some(error),
            None,
        )
        .await
    }

    /// Settles `uncertain`: the job's effect can neither be proven done nor undone.
    pub async fn uncertain(self, detail: &str) -> Result<Job, LedgerError> {
        self.finish(
            Outcome::Terminal(JobState::Uncertain),
            None,
            Some(detail),
            None,
        )
        .await
    }

    /// `outcome` is a terminal state or another attempt (queued again after `retry_delay_ms`
    /// unless the row's own attempt count has reached its ceiling, which the statement decides).
    /// A retry wakes waiting workers, which then sleep until it is due. Runs in a `settle` span, a
    /// child of the job's span, so the settlement shows in the admitting request's trace.
    #[tracing::instrument(name = "settle", skip_all,
        fields(job.id = %self.lease.job_id, job.kind = %self.lease.kind, settle.state = %outcome))]
    async fn finish(
        mut self,
        outcome: Outcome,
        result: Option<String>,
        error: Option<&str>,
        retry_delay_ms: Option<i64>,
    ) -> Result<Job, LedgerError> {
        let now = self.ledger.statement_now();
        let ending = Ending {
            outcome,
            result: result.as_deref(),
            error,
            retry_delay_ms,
        };
        // Alone, the held-back successors are released after the settlement commits.
        let (job, successors_may_wait) = match self.tx.as_mut() {
            Some(tx) => (
                finish_in_caller_tx(tx, &self.lease, &ending, now).await?,
                false,
            ),
            None => match finish_alone(&self.ledger.db, &self.lease, &ending, now).await? {
                Some(finished) => (Some(finished.job), finished.successors_may_wait),
                None => (None, false),
            },
        };
        let Some(job) = job else {
            if let Some(tx) = self.tx.take() {
                tx.rollback().await?;
            }
            self.ledger.refuse(&self.lease, "settlement").await?;
            return Err(LedgerError::LeaseLost {
                job_id: self.lease.job_id.clone(),
            });
        };
        match self.tx.take() {
            Some(tx) => tx.commit().await?,
            None => {
                if job.state == JobState::Queued {
                    self.ledger.db.wake_bus().wake();
                }
                if successors_may_wait {
                    let mut tx = self.ledger.db.begin().await?;
                    successors_due_in(&mut tx, &job, now).await?;
                    tx.commit().await?;
                }
            }
        }
        crate::ledger::metrics::ledger().settled(job.kind, job.state.as_str());
        Ok(job)
    }
}

/// The settlement inside the handler's transaction: the row, the retry wake-up and the
/// one-at-a-time successors commit together with the handler's writes. `None` when the lease
/// was lost.
async fn finish_in_caller_tx(
    tx: &mut Tx,
    lease: &Lease,
    ending: &Ending<'_>,
    now: Option<i64>,
) -> Result<Option<Job>, LedgerError> {
    let Some(finished) = finish_returning(tx, lease, ending, now).await? else {
        return Ok(None);
    };
    if finished.job.state == JobState::Queued {
        notify_in(tx, "retry").await?;
    }
    if finished.successors_may_wait {
        successors_due_in(tx, &finished.job, now).await?;
    }
    Ok(Some(finished.job))
}

/// The settlement as one statement of its own (the handler wrote nothing transactional); a
/// retry notifies other Postgres hosts at once. `None` when the lease was lost.
async fn finish_alone(
    db: &Db,
    lease: &Lease,
    ending: &Ending<'_>,
    now: Option<i64>,
) -> Result<Option<Finished>, LedgerError> {
    let _slot = db.write_slot().await;
    let sql = finish_sql(db.backend(), lease.kind);
    let row: Option<FinishedRow> = crate::on_db!(db, |pool| bind_finish!(
        sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())),
        lease,
        ending,
        now
    )
    .fetch_optional(pool)
    .await)?;
    let finished = row.map(Finished::try_from).transpose()?;
    if let Some(pool) = db.as_postgres()
        && finished
            .as_ref()
            .is_some_and(|finished| finished.job.state == JobState::Queued)
    {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(crate::ledger::PG_CHANNEL)
            .bind("retry")
            .execute(pool)
            .await?;
    }
    Ok(finished)
}

/// A settled run of a one-at-a-time kind ([`JobKind::runs_one_at_a_time`]) lets the jobs of its
/// kind and project admitted after it, deferred at the claim gate while it ran, be claimed at
/// once (and wakes workers) instead of at their next look.
async fn successors_due_in(tx: &mut Tx, job: &Job, now: Option<i64>) -> Result<(), LedgerError> {
    if !job.kind.runs_one_at_a_time() || !job.state.is_terminal() {
        return Ok(());
    }
    let any_order = job.kind.runs_alone_in_any_order();
    if any_order {
        super::query::lock_runs_in(tx, job.kind, job.project_id.as_deref()).await?;
    }
    let now_expr = now_sql(tx.backend(), 4);
    let held_back = held_back_by(
        "learning_job",
        &RunColumns {
            kind: "$1",
            project_id: "$2",
            id: "$3",
            now_at: &now_expr,
            any_order: "$5",
        },
    );
    let sql = format!("UPDATE learning_job SET run_at = {now_expr} WHERE {held_back}");
    let moved = crate::on_tx!(tx, |conn| sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(job.kind.as_str())
        .bind(job.project_id.as_deref())
        .bind(&job.id)
        .bind(now)
        .bind(any_order)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    if moved > 0 {
        notify_in(tx, "successor").await?;
    }
    Ok(())
}

/// The settled run a held-back job waited for, as SQL expressions (columns or placeholders).
struct RunColumns<'a> {
    kind: &'a str,
    project_id: &'a str,
    id: &'a str,
    now_at: &'a str,
    /// Whether the run's kind waits for any run of its project, not only an earlier one.
    any_order: &'a str,
}

/// The condition on `waiting` (a `learning_job` row) of a job the settled run held back:
/// deferred at the claim gate while it ran. Jobs admitted after the run waited for it; of a
/// kind that waits for any run, so did the earlier ones that never ran (one with attempts spent
/// may be in its retry backoff). Written once for the settlement's look and the update.
fn held_back_by(waiting: &str, run: &RunColumns<'_>) -> String {
    format!(
        "{waiting}.kind = {kind} AND {waiting}.state = 'queued' \
           AND COALESCE({waiting}.project_id, '') = COALESCE({project_id}, '') \
           AND {waiting}.run_at > {now_at} \
           AND ({waiting}.id > {id} OR ({any_order} AND {waiting}.attempts = 0))",
        kind = run.kind,
        project_id = run.project_id,
        id = run.id,
        now_at = run.now_at,
        any_order = run.any_order,
    )
}

/// Whether the settlement statement should look for held-back successors, as a column.
///
/// On SQLite every write holds the database's one write lock, so a deferral either committed
/// before the settlement (and the look sees it) or comes after it (and the gate no longer sees
/// the run): the look is exact and a settlement with nothing held back costs no further
/// statement. On Postgres a concurrent claim's deferral may not be visible yet; the update runs
/// under the kind's advisory lock and decides for itself.
fn successors_look(backend: crate::db::Backend, kind: JobKind, now_at: &str) -> String {
    if !kind.runs_one_at_a_time() {
        return String::from("FALSE");
    }
    if backend == crate::db::Backend::Postgres {
        return String::from("TRUE");
    }
    let run = RunColumns {
        kind: "learning_job.kind",
        project_id: "learning_job.project_id",
        id: "learning_job.id",
        now_at,
        any_order: if kind.runs_alone_in_any_order() {
            "TRUE"
        } else {
            "FALSE"
        },
    };
    format!(
        "EXISTS (SELECT 1 FROM learning_job AS waiting WHERE {})",
        held_back_by("waiting", &run)
    )
}

/// How an attempt ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Terminal(JobState),
    /// Another attempt, or `failed` when the row's attempts are spent.
    Retry,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Terminal(state) => f.write_str(state.as_str()),
            Outcome::Retry => f.write_str("retry"),
        }
    }
}

/// The guarded final state change. `$3` is the terminal state, NULL for another attempt, `$6`
/// the retry delay, `$7` now (NULL: the database's clock). Returns the job and
/// `successors_may_wait` ([`successors_look`]).
fn finish_sql(backend: crate::db::Backend, kind: JobKind) -> String {
    let now_at = now_sql(backend, 7);
    format!(
        "UPDATE learning_job SET \
           state = CASE WHEN $3 IS NOT NULL THEN $3 \
                        WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END, \
           result = COALESCE($4, result), last_error = COALESCE($5, last_error), \
           lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL, \
           run_at = CASE WHEN $3 IS NULL THEN {now_at} + COALESCE($6, 0) ELSE run_at END, \
           finished_at = CASE WHEN $3 IS NULL AND attempts < max_attempts THEN NULL \
                              ELSE {now_at} END, \
           updated_at = {now_at} \
         WHERE id = $1 AND lease_token = $2 AND state = 'running' \
         RETURNING {JOB_COLUMNS}, {successors} AS successors_may_wait",
        successors = successors_look(backend, kind, &now_at),
    )
}

/// A settled job and whether a job it held back may be waiting.
struct Finished {
    job: Job,
    successors_may_wait: bool,
}

#[derive(sqlx::FromRow)]
struct FinishedRow {
    #[sqlx(flatten)]
    job: JobRow,
    successors_may_wait: bool,
}

impl TryFrom<FinishedRow> for Finished {
    type Error = crate::db::StoreError;

    fn try_from(row: FinishedRow) -> Result<Finished, Self::Error> {
        Ok(Finished {
            job: Job::try_from(row.job)?,
            successors_may_wait: row.successors_may_wait,
        })
    }
}

/// How a settlement ends an attempt: its outcome and what it records.
struct Ending<'a> {
    outcome: Outcome,
    result: Option<&'a str>,
    error: Option<&'a str>,
    /// A retry's delay (`None`: due at once).
    retry_delay_ms: Option<i64>,
}

macro_rules! bind_finish {
    ($query:expr, $lease:expr, $ending:expr, $now:expr) => {
        $query
            .bind(&$lease.job_id)
            .bind(&$lease.token)
            .bind(match $ending.outcome {
                Outcome::Terminal(state) => Some(state.as_str()),
                Outcome::Retry => None,
            })
            .bind($ending.result)
            .bind($ending.error.map(truncate_detail))
            .bind($ending.retry_delay_ms)
            .bind($now)
    };
}
use bind_finish;

/// The settlement statement in `tx`; `None` when the lease was lost.
async fn finish_returning(
    tx: &mut Tx,
    lease: &Lease,
    ending: &Ending<'_>,
    now: Option<i64>,
) -> Result<Option<Finished>, LedgerError> {
    let sql = finish_sql(tx.backend(), lease.kind);
    let row: Option<FinishedRow> = crate::on_tx!(tx, |conn| bind_finish!(
        sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())),
        lease,
        ending,
        now
    )
    .fetch_optional(conn)
    .await)?;
    row.map(Finished::try_from)
        .transpose()
        .map_err(LedgerError::from)
}

#[cfg(test)]
mod tests {
    use super::retry_backoff_ms;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(retry_backoff_ms(1), 10_000);
        assert_eq!(retry_backoff_ms(2), 60_000);
        assert_eq!(retry_backoff_ms(3), 360_000);
        assert_eq!(retry_backoff_ms(50), 30 * 60 * 1000);
    }
}
