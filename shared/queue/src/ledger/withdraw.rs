//! Owner-side operations that take jobs out of the queue before or instead of running them:
//! skipping queued jobs, revoking one queued or running job, pruning a forgotten session's or
//! project's jobs, and reading the runs of an interval bucket to reuse one. Each runs inside the
//! caller's transaction (the owner's own writes commit with it), records one audit event per
//! job and counts a metric, so the audit table and the counters agree with what happened to the
//! rows.

use super::model::{Job, JobKind, JobOrigin};
use super::row::{JOB_COLUMNS, JobRow};
use super::{Admission, Ledger, LedgerError, insert_event, now_sql};
use crate::db::Tx;

/// Which jobs an owner-side operation applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobScope<'a> {
    /// Jobs of one session.
    Session(&'a str),
    /// Jobs of one project.
    Project(&'a str),
}

impl JobScope<'_> {
    fn column(self) -> &'static str {
        match self {
            JobScope::Session(_) => "session_id",
            JobScope::Project(_) => "project_id",
        }
    }

    fn id(&self) -> &str {
        match self {
            JobScope::Session(id) | JobScope::Project(id) => id,
        }
    }
}

/// What [`Ledger::skip_queued_in`] selects: queued jobs of one kind and scope admitted for one
/// of `origins` (e.g. only automatic work, leaving what a person asked for).
#[derive(Debug, Clone, Copy)]
pub struct QueuedJobs<'a> {
    pub kind: JobKind,
    pub scope: JobScope<'a>,
    pub origins: &'a [JobOrigin],
}

impl Ledger {
    /// Skips the queued jobs `selection` names inside the caller's transaction and returns their
    /// ids. Running jobs are left to settle: their worker holds a lease and its result stays
    /// valid. Each skipped job gets a `skipped` event with `reason`, and `zuno_jobs_skipped`
    /// counts it by kind.
    pub async fn skip_queued_in(
        &self,
        tx: &mut Tx,
        selection: QueuedJobs<'_>,
        reason: &str,
    ) -> Result<Vec<String>, LedgerError> {
        if selection.origins.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.statement_now();
        // `$1` now, `$2` result, `$3` kind, `$4` scope id, then one placeholder per origin.
        let origins: Vec<String> = (0..selection.origins.len())
            .map(|index| format!("${}", index + 5))
            .collect();
        let sql = format!(
            "UPDATE learning_job SET state = 'skipped', result = $2, finished_at = {now_at}, \
               updated_at = {now_at} \
             WHERE kind = $3 AND {column} = $4 AND state = 'queued' AND origin IN ({origins}) \
             RETURNING id",
            now_at = now_sql(tx.backend(), 1),
            column = selection.scope.column(),
            origins = origins.join(", "),
        );
        let result = serde_json::json!({ "skipped": reason }).to_string();
        let skipped: Vec<String> = crate::on_tx!(tx, |conn| {
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(now)
                .bind(&result)
                .bind(selection.kind.as_str())
                .bind(selection.scope.id());
            for origin in selection.origins {
                query = query.bind(origin.as_str());
            }
            query.fetch_all(conn).await
        })?;
        for job_id in &skipped {
            insert_event(tx, job_id, "skipped", None, reason, now).await?;
            super::metrics::ledger().skipped(selection.kind);
        }
        Ok(skipped)
    }

    /// Revokes job `job_id` inside the caller's transaction when it is queued or running (its
    /// owner superseded or withdrew the work) and returns whether it did. The job settles
    /// `skipped` with `reason`; a running worker's lease stops matching, so its heartbeat fails
    /// and its settlement or any fenced write is refused. It gets a `revoked` event and
    /// `zuno_jobs_revoked` counts it. Take it before writing rows the job's settlement also
    /// writes: a settlement locks the job row first, so the same order cannot deadlock.
    pub async fn revoke_in(
        &self,
        tx: &mut Tx,
        job_id: &str,
        reason: &str,
    ) -> Result<bool, LedgerError> {
        let now = self.statement_now();
        let sql = format!(
            "UPDATE learning_job SET {} \
             WHERE id = $1 AND state IN ('queued', 'running') RETURNING kind",
            super::settle::revoked_set(tx.backend(), 2, 3)
        );
        let result = super::settle::skip_result(reason);
        let kind: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(job_id)
        .bind(&result)
        .bind(now)
        .fetch_optional(conn)
        .await)?;
        let Some(kind) = kind else {
            return Ok(false);
        };
        let kind = JobKind::parse(&kind).ok_or_else(|| {
            crate::db::StoreError::Corrupt(format!("job {job_id} has unknown kind {kind}"))
        })?;
        insert_event(tx, job_id, "revoked", None, reason, now).await?;
        super::metrics::ledger().revoked(kind);
        Ok(true)
    }

    /// Deletes every job of `scope`, whatever its state, inside the caller's transaction (the
    /// owner forgets a session or a project) and returns how many went. Rows that reference a
    /// job go with it as the schema says (cascade or set null). A worker still running one of
    /// them finds no row at its next heartbeat or settlement and is refused as fenced. Each job
    /// leaves a `pruned` event (the event table has no foreign key, so the audit outlives the
    /// row) and `zuno_jobs_pruned` counts it by kind.
    pub async fn prune_in(
        &self,
        tx: &mut Tx,
        scope: JobScope<'_>,
        reason: &str,
    ) -> Result<u64, LedgerError> {
        let sql = format!(
            "DELETE FROM learning_job WHERE {} = $1 RETURNING id, kind",
            scope.column()
        );
        let pruned: Vec<(String, String)> =
            crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(scope.id())
                .fetch_all(conn)
                .await)?;
        let now = self.statement_now();
        for (job_id, kind) in &pruned {
            insert_event(tx, job_id, "pruned", None, reason, now).await?;
            let kind = JobKind::parse(kind).ok_or_else(|| {
                crate::db::StoreError::Corrupt(format!("job {job_id} has unknown kind {kind}"))
            })?;
            super::metrics::ledger().pruned(kind);
        }
        Ok(pruned.len() as u64)
    }

    /// The runs of `kind` for `project_id` in the interval bucket starting at `bucket_start`,
    /// oldest first, read inside `tx` (an owner deciding whether a bucket's run can be reused).
    pub async fn bucket_runs_in(
        &self,
        tx: &mut Tx,
        kind: JobKind,
        project_id: &str,
        bucket_start: i64,
    ) -> Result<Vec<Job>, LedgerError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM learning_job \
             WHERE kind = $1 AND project_id = $2 AND bucket_start = $3 ORDER BY id"
        );
        let rows: Vec<JobRow> =
            crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(kind.as_str())
                .bind(project_id)
                .bind(bucket_start)
                .fetch_all(conn)
                .await)?;
        rows.into_iter()
            .map(|row| Job::try_from(row).map_err(LedgerError::from))
            .collect()
    }

    /// Answers an admission with a job already in the ledger (the owner found one that serves,
    /// e.g. a queued run of the same bucket): counted by `zuno_jobs_admitted` as `existing`, like
    /// an identity [`Ledger::admit_in`] finds admitted.
    pub fn admitted_existing(&self, job: Job) -> Admission {
        super::metrics::ledger().admitted(job.kind, "existing");
        Admission::Existing(job)
    }
}
