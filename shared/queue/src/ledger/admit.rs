//! Idempotent admission.

use serde::Serialize;

use super::model::{Job, NewJob};
use super::row::{JOB_COLUMNS, JobRow};
use super::{Ledger, LedgerError};
use crate::db::{Backend, Tx};

/// The outcome of admitting a job identity.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(tag = "outcome", content = "job", rename_all = "snake_case")]
pub enum Admission {
    /// A new job row was created.
    Queued(Job),
    /// The identity already existed; this is that job, unchanged, whatever its state.
    Existing(Job),
}

impl Admission {
    pub fn job(&self) -> &Job {
        match self {
            Admission::Queued(job) | Admission::Existing(job) => job,
        }
    }

    pub fn into_job(self) -> Job {
        match self {
            Admission::Queued(job) | Admission::Existing(job) => job,
        }
    }

    pub fn is_new(&self) -> bool {
        matches!(self, Admission::Queued(_))
    }

    pub fn outcome(&self) -> &'static str {
        match self {
            Admission::Queued(_) => "queued",
            Admission::Existing(_) => "existing",
        }
    }
}

/// The admission insert; `$1…$17` are bound by [`bind_new_job!`]. A job due at once is due by
/// the ledger's clock (`$13` NULL: the database's on Postgres), like every lease decision.
fn insert_sql(backend: Backend) -> String {
    format!(
        "INSERT INTO learning_job (id, kind, identity_key, project_id, session_id, \
           source_message_id, extractor_version, input_digest, bucket_start, claim_scope, \
           origin, priority, state, run_at, attempts, max_attempts, payload, trace_parent, \
           created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'queued', {run_at}, 0, $14, \
           $15, $16, $17, $17) \
         ON CONFLICT (kind, identity_key) DO NOTHING \
         RETURNING {JOB_COLUMNS}",
        run_at = super::now_sql(backend, 13)
    )
}

/// Binds a new job's values in [`insert_sql`] order.
macro_rules! bind_new_job {
    ($query:expr, $id:expr, $job:expr, $payload:expr, $due_now:expr, $now:expr) => {{
        let identity = &$job.identity;
        $query
            .bind($id)
            .bind(identity.kind.as_str())
            .bind(&identity.key)
            .bind(&identity.project_id)
            .bind(&identity.session_id)
            .bind(&identity.source_message_id)
            .bind(&identity.extractor_version)
            .bind(&identity.input_digest)
            .bind(identity.bucket_start)
            .bind(&$job.claim_scope)
            .bind($job.origin.as_str())
            .bind($job.origin.priority())
            .bind($job.run_at.or($due_now))
            .bind($job.max_attempts)
            .bind($payload)
            .bind(&$job.trace_parent)
            .bind($now)
    }};
}

fn validate(job: &NewJob) -> Result<(), LedgerError> {
    if !(1..=super::MAX_ATTEMPTS).contains(&job.max_attempts) {
        return Err(LedgerError::Invalid(format!(
            "max_attempts must be between 1 and {}, got {}",
            super::MAX_ATTEMPTS,
            job.max_attempts
        )));
    }
    Ok(())
}

const SELECT_EXISTING: &str = "WHERE kind = $1 AND identity_key = $2";

impl Ledger {
    /// Admits a job on its own. See [`Ledger::admit_in`] for the semantics.
    ///
    /// A single autocommit statement (on Postgres it also issues `pg_notify`), so an admission
    /// costs one round trip.
    pub async fn admit(&self, job: NewJob) -> Result<Admission, LedgerError> {
        validate(&job)?;
        let now = self.now_ms();
        let id = crate::ids::new_id("job");
        let payload = job.payload.to_string();
        let sql = match self.db.backend() {
            // Postgres wakes other hosts' workers in the same statement.
            Backend::Postgres => format!(
                "WITH inserted AS ({}) SELECT inserted.*, pg_notify('{}', inserted.kind) AS notified FROM inserted",
                insert_sql(Backend::Postgres),
                crate::ledger::PG_CHANNEL
            ),
            Backend::Sqlite => insert_sql(Backend::Sqlite),
        };
        // SQLite's one writer: this process's writers queue here (none on Postgres).
        let slot = self.db.write_slot().await;
        let inserted: Option<JobRow> = crate::on_db!(self.db, |pool| bind_new_job!(
            sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())),
            &id,
            job,
            &payload,
            self.statement_now(),
            now
        )
        .fetch_optional(pool)
        .await)?;
        drop(slot);
        match inserted {
            Some(row) => {
                self.db.wake_bus().wake();
                crate::ledger::metrics::ledger().admitted(job.identity.kind, "queued");
                Ok(Admission::Queued(Job::try_from(row)?))
            }
            None => {
                let select = format!("SELECT {JOB_COLUMNS} FROM learning_job {SELECT_EXISTING}");
                let existing: JobRow = crate::on_db!(self.db, |pool| sqlx::query_as(
                    sqlx::AssertSqlSafe(select.as_str())
                )
                .bind(job.identity.kind.as_str())
                .bind(&job.identity.key)
                .fetch_one(pool)
                .await)?;
                crate::ledger::metrics::ledger().admitted(job.identity.kind, "existing");
                Ok(Admission::Existing(Job::try_from(existing)?))
            }
        }
    }

    /// Admits many jobs in one transaction (history imports), in order.
    pub async fn admit_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Admission>, LedgerError> {
        let mut tx = self.db.begin().await?;
        let mut admissions = Vec::with_capacity(jobs.len());
        for job in jobs {
            admissions.push(self.admit_in(&mut tx, job).await?);
        }
        tx.commit().await?;
        Ok(admissions)
    }

    /// Admits a job inside the caller's transaction.
    ///
    /// `INSERT … ON CONFLICT (kind, identity_key) DO NOTHING RETURNING` never raises on a
    /// duplicate, so it cannot abort the caller's transaction; when it inserts nothing the
    /// existing row is read back and returned unchanged. Under concurrent admission of one
    /// identity exactly one insert wins (the unique index decides) and every caller sees that
    /// row. Workers are woken after the transaction commits.
    pub async fn admit_in(&self, tx: &mut Tx, job: NewJob) -> Result<Admission, LedgerError> {
        validate(&job)?;
        let now = self.now_ms();
        let id = crate::ids::new_id("job");
        let payload = job.payload.to_string();
        let insert = insert_sql(tx.backend());
        let due_now = self.statement_now();
        let inserted: Option<JobRow> = crate::on_tx!(tx, |conn| bind_new_job!(
            sqlx::query_as(sqlx::AssertSqlSafe(insert.as_str())),
            &id,
            job,
            &payload,
            due_now,
            now
        )
        .fetch_optional(conn)
        .await)?;
        let kind = job.identity.kind;
        if let Some(row) = inserted {
            if tx.backend() == Backend::Postgres {
                crate::on_tx!(tx, |conn| sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(crate::ledger::PG_CHANNEL)
                    .bind(kind.as_str())
                    .execute(conn)
                    .await
                    .map(|done| done.rows_affected()))?;
            }
            tx.wake_after_commit();
            crate::ledger::metrics::ledger().admitted(kind, "queued");
            return Ok(Admission::Queued(Job::try_from(row)?));
        }
        let select = format!("SELECT {JOB_COLUMNS} FROM learning_job {SELECT_EXISTING}");
        let existing: JobRow = crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(
            select.as_str()
        ))
        .bind(kind.as_str())
        .bind(&job.identity.key)
        .fetch_one(conn)
        .await)?;
        crate::ledger::metrics::ledger().admitted(kind, "existing");
        Ok(Admission::Existing(Job::try_from(existing)?))
    }
}
