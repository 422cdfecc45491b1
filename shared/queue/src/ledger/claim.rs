//! Claiming: expired-lease rescue, selection, the claim gate and lease hand-out, all in one
//! short transaction.

use async_trait::async_trait;

use super::model::{ClaimedJob, GateFindings, Job, JobKind, JobState, Lease};
use super::row::{JOB_COLUMNS, JobRow};
use super::{Ledger, LedgerError, insert_event, notify_in, now_sql, truncate_detail};
use crate::db::{Backend, StoreError, Tx};

/// What a worker asks for on one wake.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub worker_id: &'a str,
    pub kinds: &'a [JobKind],
    /// At most this many jobs are handed out (`max_jobs_per_wake`, default 2).
    pub limit: usize,
    /// How long the lease lasts without a heartbeat.
    pub lease_ms: i64,
    /// When set, only jobs with no scope or one of these scopes are eligible.
    pub scopes: Option<&'a [String]>,
}

/// The gate's verdict on one candidate job, made inside the claim transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateDecision {
    /// The job may run.
    Proceed,
    /// The job may run, and here is what the gate read about it (see [`GateFindings`]).
    ProceedWith(GateFindings),
    /// The job's source changed, became unavailable, or its policy forbids the work: it settles
    /// `skipped` without consuming an attempt.
    Skip { reason: String },
    /// The job may not run yet (e.g. the daily token cap for automatic work is reached): it
    /// stays queued until `until`, without consuming an attempt.
    Defer { until: i64, reason: String },
}

/// Kind-specific admission checks that must see the same snapshot as the claim itself
/// (claiming, source validation, session policy and attempt admission share one transaction, so
/// none of them can act on a state the others did not see).
#[async_trait]
pub trait ClaimGate: Send + Sync {
    async fn check(&self, tx: &mut Tx, job: &Job) -> Result<GateDecision, StoreError>;
}

/// A gate that lets every job through (for kinds without sources to revalidate).
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowAll;

#[async_trait]
impl ClaimGate for AllowAll {
    async fn check(&self, _tx: &mut Tx, _job: &Job) -> Result<GateDecision, StoreError> {
        Ok(GateDecision::Proceed)
    }
}

/// A job the gate settled as skipped.
#[derive(Debug, Clone)]
pub struct SkippedAtClaim {
    pub job_id: String,
    pub kind: JobKind,
    pub reason: String,
}

/// A job settled `failed` at claim because its row could not be decoded or its gate failed on
/// it: one bad row must not stall every worker of its kind.
#[derive(Debug, Clone)]
pub struct QuarantinedAtClaim {
    pub job_id: String,
    pub kind: JobKind,
    pub reason: String,
}

/// Everything one claim transaction did.
#[derive(Debug, Default)]
pub struct ClaimBatch {
    pub claimed: Vec<ClaimedJob>,
    pub skipped: Vec<SkippedAtClaim>,
    /// Jobs whose lease had expired: returned to the queue, or failed at the attempt ceiling.
    pub rescued: Vec<(String, JobState)>,
    /// Jobs the gate deferred (still queued, attempt not spent).
    pub deferred: usize,
    pub quarantined: Vec<QuarantinedAtClaim>,
    /// When the batch was not full: milliseconds until the next queued job of the requested
    /// kinds becomes due or the next lease expires (by the ledger's clock), so an idle worker
    /// can sleep exactly that long instead of a whole poll interval. `None`: nothing pending.
    pub next_due_in_ms: Option<i64>,
}

/// Upper bound on expired leases rescued per claim transaction.
const RESCUE_BATCH: i64 = 100;

/// Minimum time between two expired-lease scans by one ledger handle.
const RESCUE_INTERVAL_MS: i64 = 1000;

/// One claim transaction's end: done, or stopped by a gate failure on one job (the transaction
/// was rolled back; on Postgres a failed statement poisons the whole transaction).
enum ClaimRound {
    Done(ClaimBatch),
    GateFailed {
        job_id: String,
        kind: JobKind,
        error: StoreError,
    },
}

impl Ledger {
    /// Rescues expired leases, then hands out up to `limit` due jobs of the requested kinds.
    ///
    /// One transaction: on Postgres the due rows are locked with `FOR UPDATE SKIP LOCKED`, so
    /// concurrent claimers take disjoint rows; on SQLite the transaction began with
    /// `BEGIN IMMEDIATE` and holds the only write lock. One `UPDATE … RETURNING` gives each job a
    /// fresh random lease token, a deadline and `attempts + 1` — the increment happens at claim,
    /// so a worker that crashes mid-job still spends the attempt, and the schema's
    /// `CHECK (attempts <= max_attempts)` makes a fourth attempt impossible whatever the code
    /// does. The gate then sees each claimed job in the same transaction; a job it skips is
    /// settled `skipped` with its attempt given back before anything commits.
    ///
    /// A row that cannot be decoded, or on which the gate fails with anything but a lost
    /// connection or a deadlock, is settled `failed` with the reason and the claim goes on with
    /// the rest.
    /// Times come from the database on Postgres (see [`Ledger::uses_database_clock`]).
    pub async fn claim(
        &self,
        request: &ClaimRequest<'_>,
        gate: &dyn ClaimGate,
    ) -> Result<ClaimBatch, LedgerError> {
        if request.kinds.is_empty() || request.limit == 0 {
            return Ok(ClaimBatch::default());
        }
        let started = std::time::Instant::now();
        // Expired leases are rare and a second's delay in noticing one is immaterial next to any
        // lease length, so each handle scans for them at most once per second (by its own
        // clock: only the interval matters here, not agreement with other hosts).
        let local_now = self.now_ms();
        let last = self.last_rescue.load(std::sync::atomic::Ordering::Relaxed);
        let rescue_due = local_now.saturating_sub(last) >= RESCUE_INTERVAL_MS;
        let mut quarantined = Vec::new();
        let mut batch = loop {
            match self.claim_round(request, gate, rescue_due).await? {
                ClaimRound::Done(batch) => break batch,
                ClaimRound::GateFailed {
                    job_id,
                    kind,
                    error,
                } => {
                    let reason = format!("the claim gate failed on this job: {error}");
                    self.quarantine(&job_id, &reason).await?;
                    quarantined.push(QuarantinedAtClaim {
                        job_id,
                        kind,
                        reason,
                    });
                    // Each round removes one bad job from the queue; a batch's worth is enough
                    // for one wake, the rest wait for the next claim.
                    if quarantined.len() >= request.limit {
                        break ClaimBatch::default();
                    }
                }
            }
        };
        batch.quarantined.splice(0..0, quarantined);
        if rescue_due {
            self.last_rescue
                .store(local_now, std::sync::atomic::Ordering::Relaxed);
        }

        let metrics = crate::ledger::metrics::ledger();
        metrics.claim_latency(started.elapsed());
        for claimed in &batch.claimed {
            metrics.claimed(claimed.job.kind, claimed.lease.attempt);
        }
        for skipped in &batch.skipped {
            metrics.skipped_at_claim(skipped.kind);
            tracing::info!(job.id = %skipped.job_id, job.kind = %skipped.kind,
                reason = %skipped.reason, "job skipped at claim; no attempt spent");
        }
        for poisoned in &batch.quarantined {
            metrics.quarantined(poisoned.kind);
            tracing::error!(job.id = %poisoned.job_id, job.kind = %poisoned.kind,
                reason = %poisoned.reason, "job failed at claim; the claim goes on without it");
        }
        for (job_id, state) in &batch.rescued {
            metrics.lease_expired();
            tracing::warn!(job.id = %job_id, job.state = %state,
                "lease expired without settlement; job rescued");
        }
        Ok(batch)
    }

    async fn claim_round(
        &self,
        request: &ClaimRequest<'_>,
        gate: &dyn ClaimGate,
        rescue_due: bool,
    ) -> Result<ClaimRound, LedgerError> {
        let now = self.statement_now();
        let mut tx = self.db.begin().await?;
        let mut batch = ClaimBatch::default();
        if rescue_due {
            batch.rescued = rescue_expired(&mut tx, now).await?;
        }

        let claimed = leased_jobs(&mut tx, request, now, &mut batch.quarantined).await?;
        for job in claimed {
            let decision = match gate.check(&mut tx, &job).await {
                Ok(decision) => decision,
                // A lost connection, or a deadlock with another transaction: the job did
                // nothing wrong; the claim fails as a whole and the worker tries again.
                Err(error) if error.is_connection() || error.is_contention() => {
                    return Err(error.into());
                }
                Err(error) => {
                    // The statement may have aborted the transaction (Postgres); start over
                    // without this job.
                    let _ = tx.rollback().await;
                    return Ok(ClaimRound::GateFailed {
                        job_id: job.id,
                        kind: job.kind,
                        error,
                    });
                }
            };
            apply_decision(&mut tx, request, job, decision, now, &mut batch).await?;
        }
        if batch.claimed.len() + batch.skipped.len() < request.limit {
            batch.next_due_in_ms = next_due_in_ms(&mut tx, request, now).await?;
        }
        tx.commit().await?;
        Ok(ClaimRound::Done(batch))
    }

    /// Settles a job `failed` outside any claim (its claim transaction was rolled back).
    async fn quarantine(&self, job_id: &str, reason: &str) -> Result<(), LedgerError> {
        let mut tx = self.db.begin().await?;
        quarantine_in(&mut tx, job_id, reason, self.statement_now()).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Leases the due jobs and decodes them, in the order the gate is to see them. A row that
/// cannot be decoded is settled `failed` in the same transaction (and listed in
/// `quarantined`), so one bad row cannot stall every worker of its kind.
async fn leased_jobs(
    tx: &mut Tx,
    request: &ClaimRequest<'_>,
    now: Option<i64>,
    quarantined: &mut Vec<QuarantinedAtClaim>,
) -> Result<Vec<Job>, LedgerError> {
    let mut claimed = Vec::new();
    for row in claim_rows(tx, request, now).await? {
        let job_id = row.id().to_owned();
        let kind = JobKind::parse(row.kind_text()).unwrap_or(request.kinds[0]);
        match Job::try_from(row) {
            Ok(job) => claimed.push(job),
            Err(error) => {
                let reason = format!("the job's row cannot be read: {error}");
                quarantine_in(tx, &job_id, &reason, now).await?;
                quarantined.push(QuarantinedAtClaim {
                    job_id,
                    kind,
                    reason,
                });
            }
        }
    }
    // `RETURNING` gives no order: the gate sees the jobs in queue order.
    claimed.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.run_at.cmp(&b.run_at))
            .then(a.id.cmp(&b.id))
    });
    Ok(claimed)
}

/// Carries out the gate's verdict on one leased job inside the claim transaction.
async fn apply_decision(
    tx: &mut Tx,
    request: &ClaimRequest<'_>,
    job: Job,
    decision: GateDecision,
    now: Option<i64>,
    batch: &mut ClaimBatch,
) -> Result<(), LedgerError> {
    match decision {
        GateDecision::Proceed => {
            let lease = lease_of(&job, request.worker_id)?;
            batch.claimed.push(ClaimedJob {
                job,
                lease,
                findings: None,
            });
        }
        GateDecision::ProceedWith(findings) => {
            let lease = lease_of(&job, request.worker_id)?;
            batch.claimed.push(ClaimedJob {
                job,
                lease,
                findings: Some(findings),
            });
        }
        GateDecision::Defer { until, reason } => {
            defer_in(tx, &job.id, until, now).await?;
            tracing::info!(job.id = %job.id, %reason, until, "job deferred at claim; no attempt spent");
            batch.deferred += 1;
        }
        GateDecision::Skip { reason } => {
            skip_in(tx, &job.id, &reason, request.worker_id, now).await?;
            batch.skipped.push(SkippedAtClaim {
                job_id: job.id,
                kind: job.kind,
                reason,
            });
        }
    }
    Ok(())
}

/// The lease the claim statement just wrote on `job`.
fn lease_of(job: &Job, worker_id: &str) -> Result<Lease, StoreError> {
    let token = job
        .lease_token
        .clone()
        .ok_or_else(|| StoreError::Corrupt(format!("claimed job {} has no lease token", job.id)))?;
    let expires_at = job
        .lease_expires_at
        .ok_or_else(|| StoreError::Corrupt(format!("claimed job {} has no deadline", job.id)))?;
    Ok(Lease {
        job_id: job.id.clone(),
        kind: job.kind,
        token,
        worker_id: worker_id.to_owned(),
        attempt: job.attempts,
        expires_at,
    })
}

/// Returns a just-claimed job to the queue until `until`, giving its attempt back.
async fn defer_in(
    tx: &mut Tx,
    job_id: &str,
    until: i64,
    now: Option<i64>,
) -> Result<(), LedgerError> {
    let sql = format!(
        "UPDATE learning_job SET state = 'queued', attempts = attempts - 1, \
           lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
           heartbeat_at = NULL, run_at = $2, updated_at = {} \
         WHERE id = $1 AND state = 'running'",
        now_sql(tx.backend(), 3)
    );
    crate::on_tx!(tx, |conn| sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(job_id)
        .bind(until)
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

/// Settles a just-claimed job `skipped` and records why.
async fn skip_in(
    tx: &mut Tx,
    job_id: &str,
    reason: &str,
    worker_id: &str,
    now: Option<i64>,
) -> Result<(), LedgerError> {
    // Undo the claim inside the same transaction: nothing outside it ever saw the job running,
    // and the attempt is given back.
    let result = serde_json::json!({ "skipped": reason }).to_string();
    let sql = format!(
        "UPDATE learning_job SET state = 'skipped', attempts = attempts - 1, \
           lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, \
           heartbeat_at = NULL, result = $2, finished_at = {now_at}, \
           updated_at = {now_at} \
         WHERE id = $1 AND state = 'running'",
        now_at = now_sql(tx.backend(), 3)
    );
    crate::on_tx!(tx, |conn| sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(job_id)
        .bind(&result)
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    insert_event(tx, job_id, "skipped", Some(worker_id), reason, now).await?;
    Ok(())
}

/// Fails a queued or just-claimed job that cannot be worked on, keeping the reason.
async fn quarantine_in(
    tx: &mut Tx,
    job_id: &str,
    reason: &str,
    now: Option<i64>,
) -> Result<(), LedgerError> {
    let sql = format!(
        "UPDATE learning_job SET state = 'failed', last_error = $2, lease_token = NULL, \
           lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL, \
           finished_at = {now_at}, updated_at = {now_at} \
         WHERE id = $1 AND state IN ('queued', 'running')",
        now_at = now_sql(tx.backend(), 3)
    );
    crate::on_tx!(tx, |conn| sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(job_id)
        .bind(truncate_detail(reason))
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

/// Milliseconds until the next queued job of the request's kinds is due or the next lease (of
/// any kind) expires; negative when one is already due but was locked by another claimer.
async fn next_due_in_ms(
    tx: &mut Tx,
    request: &ClaimRequest<'_>,
    now: Option<i64>,
) -> Result<Option<i64>, LedgerError> {
    let mut next = 2;
    let kinds = placeholders(&mut next, request.kinds.len());
    let scope_filter = scope_filter(&mut next, request.scopes);
    let sql = format!(
        "SELECT MIN(due) - {now_at} FROM ( \
           SELECT MIN(run_at) AS due FROM learning_job \
           WHERE state = 'queued' AND attempts < max_attempts AND kind IN ({kinds}){scope_filter} \
           UNION ALL \
           SELECT MIN(lease_expires_at) AS due FROM learning_job WHERE state = 'running' \
         ) AS upcoming",
        now_at = now_sql(tx.backend(), 1)
    );
    let due: Option<i64> = crate::on_tx!(tx, |conn| {
        let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str())).bind(now);
        for kind in request.kinds {
            query = query.bind(kind.as_str());
        }
        for scope in request.scopes.unwrap_or_default() {
            query = query.bind(scope.as_str());
        }
        query.fetch_one(conn).await
    })?;
    Ok(due)
}

fn scope_filter(next: &mut usize, scopes: Option<&[String]>) -> String {
    match scopes {
        Some(scopes) if !scopes.is_empty() => format!(
            " AND (claim_scope IS NULL OR claim_scope IN ({}))",
            placeholders(next, scopes.len())
        ),
        Some(_) => String::from(" AND claim_scope IS NULL"),
        None => String::new(),
    }
}

/// Hands out leases on up to `limit` due jobs in one statement: each row gets `attempts + 1`
/// and a fresh random 128-bit token generated by the database.
async fn claim_rows(
    tx: &mut Tx,
    request: &ClaimRequest<'_>,
    now: Option<i64>,
) -> Result<Vec<JobRow>, LedgerError> {
    // Placeholders: $1 = now, $2 = limit, $3 = owner, $4 = lease length, then kinds, then scopes.
    let mut next = 5;
    let kinds = placeholders(&mut next, request.kinds.len());
    let scope_filter = scope_filter(&mut next, request.scopes);
    let now_at = now_sql(tx.backend(), 1);
    let due = format!(
        "SELECT id FROM learning_job \
         WHERE state = 'queued' AND run_at <= {now_at} AND attempts < max_attempts \
           AND kind IN ({kinds}){scope_filter} \
         ORDER BY priority DESC, run_at, id LIMIT $2"
    );
    let lease = format!(
        "SET state = 'running', attempts = attempts + 1, lease_owner = $3, \
         lease_expires_at = {now_at} + $4, heartbeat_at = {now_at}, updated_at = {now_at}"
    );
    let sql = match tx.backend() {
        // The CTE is materialized so the LIMIT binds before the update (a merged subquery could
        // update more rows than asked for).
        Backend::Postgres => format!(
            "WITH picked AS MATERIALIZED ({due} FOR UPDATE SKIP LOCKED) \
             UPDATE learning_job {lease}, lease_token = replace(gen_random_uuid()::text, '-', '') \
             WHERE id IN (SELECT id FROM picked) RETURNING {JOB_COLUMNS}"
        ),
        Backend::Sqlite => format!(
            "UPDATE learning_job {lease}, lease_token = lower(hex(randomblob(16))) \
             WHERE id IN ({due}) RETURNING {JOB_COLUMNS}"
        ),
    };
    let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
    let rows: Vec<JobRow> = crate::on_tx!(tx, |conn| {
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(now)
            .bind(limit)
            .bind(request.worker_id)
            .bind(request.lease_ms);
        for kind in request.kinds {
            query = query.bind(kind.as_str());
        }
        for scope in request.scopes.unwrap_or_default() {
            query = query.bind(scope.as_str());
        }
        query.fetch_all(conn).await
    })?;
    Ok(rows)
}

/// Returns expired leases to the queue, or fails them when their attempts are spent, and wakes
/// waiting workers for the requeued ones.
///
/// Because the attempt was counted at claim, a job whose worker keeps dying still reaches the
/// ceiling and settles `failed` instead of being retried forever.
async fn rescue_expired(
    tx: &mut Tx,
    now: Option<i64>,
) -> Result<Vec<(String, JobState)>, LedgerError> {
    let lock = match tx.backend() {
        Backend::Postgres => " FOR UPDATE SKIP LOCKED",
        Backend::Sqlite => "",
    };
    let select = format!(
        "SELECT id, lease_owner, attempts, max_attempts FROM learning_job \
         WHERE state = 'running' AND lease_expires_at < {} \
         ORDER BY lease_expires_at LIMIT $2{lock}",
        now_sql(tx.backend(), 1)
    );
    let expired: Vec<(String, Option<String>, i64, i64)> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(
            select.as_str()
        ))
        .bind(now)
        .bind(RESCUE_BATCH)
        .fetch_all(conn)
        .await)?;
    let mut rescued = Vec::with_capacity(expired.len());
    let update = format!(
        "UPDATE learning_job SET state = $2, last_error = $3, lease_token = NULL, \
           lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL, \
           run_at = {now_at}, updated_at = {now_at}, \
           finished_at = CASE WHEN $2 = 'failed' THEN {now_at} ELSE NULL END \
         WHERE id = $1 AND state = 'running'",
        now_at = now_sql(tx.backend(), 4)
    );
    for (job_id, owner, attempts, max_attempts) in expired {
        let exhausted = attempts >= max_attempts;
        let (state, error) = if exhausted {
            (
                JobState::Failed,
                format!(
                    "lease held by worker `{}` expired on the final attempt ({attempts} of \
                     {max_attempts})",
                    owner.as_deref().unwrap_or("?")
                ),
            )
        } else {
            (
                JobState::Queued,
                format!(
                    "lease held by worker `{}` expired on attempt {attempts} of {max_attempts}",
                    owner.as_deref().unwrap_or("?")
                ),
            )
        };
        crate::on_tx!(tx, |conn| sqlx::query(sqlx::AssertSqlSafe(update.as_str()))
            .bind(&job_id)
            .bind(state.as_str())
            .bind(&error)
            .bind(now)
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
        insert_event(tx, &job_id, "lease_expired", owner.as_deref(), &error, now).await?;
        rescued.push((job_id, state));
    }
    if rescued.iter().any(|(_, state)| *state == JobState::Queued) {
        notify_in(tx, "rescued").await?;
    }
    Ok(rescued)
}

fn placeholders(next: &mut usize, count: usize) -> String {
    let list: Vec<String> = (0..count).map(|i| format!("${}", *next + i)).collect();
    *next += count;
    list.join(", ")
}
