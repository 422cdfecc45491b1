//! Read-only views of the ledger.

use serde::Serialize;

use super::model::{Job, JobKind, JobState};
use super::row::{JOB_COLUMNS, JobRow};
use super::{Ledger, LedgerError};
use crate::db::StoreError;

/// Filters for [`Ledger::list`]. Results are newest first.
#[derive(Debug, Clone)]
pub struct JobFilter {
    pub kind: Option<JobKind>,
    pub state: Option<JobState>,
    /// Restrict to these projects (a scoped token's view). `None` = all.
    pub projects: Option<Vec<String>>,
    pub session_id: Option<String>,
    /// Only jobs whose id sorts before this one (pagination cursor).
    pub before_id: Option<String>,
    pub limit: i64,
}

impl Default for JobFilter {
    fn default() -> Self {
        JobFilter {
            kind: None,
            state: None,
            projects: None,
            session_id: None,
            before_id: None,
            limit: 100,
        }
    }
}

/// Number of jobs of one kind in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct QueueCount {
    pub kind: JobKind,
    pub state: JobState,
    pub count: i64,
}

/// One audit event of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobEvent {
    pub job_id: String,
    pub event: String,
    pub worker_id: Option<String>,
    pub detail: Option<String>,
    pub at: i64,
}

/// Whether a job of `job`'s kind and project that was admitted before it (ids are time-ordered)
/// is running. Kinds whose runs of one scope must not overlap (aggregation: a follow-up reads
/// what the run before it leaves) wait for it at the claim gate. Run inside the claim's
/// transaction, it also sees jobs claimed in the same batch.
///
/// On Postgres the running rows are read `FOR SHARE`, so the check and the earlier run's
/// settlement serialize: a settlement in progress is waited for (and its row then no longer
/// counts), and a settlement that starts later waits for this claim to commit its deferral, so
/// the settlement's "make the follow-ups due" statement sees the deferred row. Without the lock
/// a follow-up deferred in the same instant as the settlement stayed deferred the full wait.
pub async fn earlier_run_in(tx: &mut crate::db::Tx, job: &Job) -> Result<bool, StoreError> {
    let lock = match tx.backend() {
        crate::db::Backend::Postgres => " FOR SHARE",
        crate::db::Backend::Sqlite => "",
    };
    let sql = format!(
        "SELECT id FROM learning_job WHERE kind = $1 AND state = 'running' \
           AND COALESCE(project_id, '') = COALESCE($2, '') AND id < $3{lock}"
    );
    let running: Vec<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(sqlx::AssertSqlSafe(
        sql.as_str()
    ))
    .bind(job.kind.as_str())
    .bind(job.project_id.as_deref())
    .bind(&job.id)
    .fetch_all(conn)
    .await)?;
    Ok(!running.is_empty())
}

/// Whether any other job of `job`'s kind and project is running, whenever it was admitted: for
/// kinds where no two runs of one project may overlap in any order (maintenance, one writer per
/// Memory document). Run inside the claim's (or heartbeat's) transaction.
///
/// Two claims in concurrent Postgres transactions would each miss the other's `running` row
/// (neither has committed), so on Postgres the check first takes a transaction-scoped advisory
/// lock of the kind and project: a second claim waits there until the first commits, then sees
/// its run. The running rows are read without a row lock, so a heartbeat (which holds its own
/// job's row while it asks the gate) and a claim cannot wait for each other. On SQLite the claim
/// transaction already holds the write lock.
pub async fn another_run_in(tx: &mut crate::db::Tx, job: &Job) -> Result<bool, StoreError> {
    lock_runs_in(tx, job.kind, job.project_id.as_deref()).await?;
    let running: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT id FROM learning_job WHERE kind = $1 AND state = 'running' \
           AND COALESCE(project_id, '') = COALESCE($2, '') AND id <> $3 LIMIT 1"
    )
    .bind(job.kind.as_str())
    .bind(job.project_id.as_deref())
    .bind(&job.id)
    .fetch_optional(conn)
    .await)?;
    Ok(running.is_some())
}

/// On Postgres, the transaction-scoped advisory lock of a kind and project that claims
/// ([`another_run_in`]) and settlements of [`JobKind::runs_alone_in_any_order`] kinds take: a
/// settlement waits for a claim deciding beside it to commit its deferral, so the settlement's
/// "make the waiting jobs due" statement sees it. A settlement takes it right after proving its
/// lease, before any domain write, so a claim holding it never waits for a row the settlement
/// holds. Nothing on SQLite (one writer at a time).
pub(crate) async fn lock_runs_in(
    tx: &mut crate::db::Tx,
    kind: JobKind,
    project_id: Option<&str>,
) -> Result<(), StoreError> {
    if tx.backend() != crate::db::Backend::Postgres {
        return Ok(());
    }
    let key = format!(
        "zuno:one-run:{}:{}",
        kind.as_str(),
        project_id.unwrap_or_default()
    );
    crate::on_tx!(tx, |conn| sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
    )
    .bind(&key)
    .execute(conn)
    .await
    .map(|_| ()))?;
    Ok(())
}

impl Ledger {
    /// The job with this identity, if admitted, read inside `tx`.
    pub async fn find_in(
        &self,
        tx: &mut crate::db::Tx,
        identity: &super::JobIdentity,
    ) -> Result<Option<Job>, LedgerError> {
        let sql =
            format!("SELECT {JOB_COLUMNS} FROM learning_job WHERE kind = $1 AND identity_key = $2");
        let row: Option<JobRow> =
            crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(identity.kind.as_str())
                .bind(&identity.key)
                .fetch_optional(conn)
                .await)?;
        Ok(row.map(Job::try_from).transpose()?)
    }

    /// A job by id, read inside `tx`.
    pub async fn get_in(&self, tx: &mut crate::db::Tx, job_id: &str) -> Result<Job, LedgerError> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM learning_job WHERE id = $1");
        let row: Option<JobRow> =
            crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(job_id)
                .fetch_optional(conn)
                .await)?;
        match row {
            Some(row) => Ok(Job::try_from(row)?),
            None => Err(LedgerError::NotFound(job_id.to_owned())),
        }
    }

    pub async fn get(&self, job_id: &str) -> Result<Job, LedgerError> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM learning_job WHERE id = $1");
        let row: Option<JobRow> = crate::on_db!(self.db(), |pool| sqlx::query_as(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(job_id)
        .fetch_optional(pool)
        .await)?;
        match row {
            Some(row) => Ok(Job::try_from(row)?),
            None => Err(LedgerError::NotFound(job_id.to_owned())),
        }
    }

    pub async fn list(&self, filter: &JobFilter) -> Result<Vec<Job>, LedgerError> {
        let mut clauses = Vec::new();
        let mut next = 1;
        let mut arg = |clauses: &mut Vec<String>, template: &str| {
            clauses.push(template.replace('?', &format!("${next}")));
            next += 1;
        };
        if filter.kind.is_some() {
            arg(&mut clauses, "kind = ?");
        }
        if filter.state.is_some() {
            arg(&mut clauses, "state = ?");
        }
        if filter.session_id.is_some() {
            arg(&mut clauses, "session_id = ?");
        }
        if filter.before_id.is_some() {
            arg(&mut clauses, "id < ?");
        }
        if let Some(projects) = &filter.projects {
            if projects.is_empty() {
                return Ok(Vec::new());
            }
            let list: Vec<String> = (0..projects.len())
                .map(|i| format!("${}", next + i))
                .collect();
            next += projects.len();
            clauses.push(format!("project_id IN ({})", list.join(", ")));
        }
        let where_clause = if clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", clauses.join(" AND "))
        };
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM learning_job{where_clause} ORDER BY id DESC LIMIT ${next}"
        );
        let limit = filter.limit.clamp(1, 1000);
        let rows: Vec<JobRow> = crate::on_db!(self.db(), |pool| {
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()));
            if let Some(kind) = filter.kind {
                query = query.bind(kind.as_str());
            }
            if let Some(state) = filter.state {
                query = query.bind(state.as_str());
            }
            if let Some(session) = &filter.session_id {
                query = query.bind(session.as_str());
            }
            if let Some(before) = &filter.before_id {
                query = query.bind(before.as_str());
            }
            for project in filter.projects.iter().flatten() {
                query = query.bind(project.as_str());
            }
            query.bind(limit).fetch_all(pool).await
        })?;
        rows.into_iter()
            .map(|row| Job::try_from(row).map_err(LedgerError::from))
            .collect()
    }

    /// Jobs per kind and state (queue depth).
    pub async fn counts(&self) -> Result<Vec<QueueCount>, LedgerError> {
        let sql = "SELECT kind, state, COUNT(*) FROM learning_job GROUP BY kind, state ORDER BY kind, state";
        let rows: Vec<(String, String, i64)> =
            crate::on_db!(self.db(), |pool| sqlx::query_as(sql).fetch_all(pool).await)?;
        rows.into_iter()
            .map(|(kind, state, count)| {
                Ok(QueueCount {
                    kind: JobKind::parse(&kind).ok_or_else(|| {
                        crate::db::StoreError::Corrupt(format!("job kind `{kind}`"))
                    })?,
                    state: JobState::parse(&state).ok_or_else(|| {
                        crate::db::StoreError::Corrupt(format!("job state `{state}`"))
                    })?,
                    count,
                })
            })
            .collect()
    }

    /// The audit events of one job, oldest first.
    pub async fn events(&self, job_id: &str) -> Result<Vec<JobEvent>, LedgerError> {
        let sql = "SELECT job_id, event, worker_id, detail, at FROM learning_job_event \
                   WHERE job_id = $1 ORDER BY at, id";
        let rows: Vec<JobEvent> = crate::on_db!(self.db(), |pool| sqlx::query_as(sql)
            .bind(job_id)
            .fetch_all(pool)
            .await)?;
        Ok(rows)
    }

    /// How many refusals of each event kind were recorded (fenced, lease_expired, …).
    pub async fn event_count(&self, event: &str) -> Result<i64, LedgerError> {
        let sql = "SELECT COUNT(*) FROM learning_job_event WHERE event = $1";
        let count: i64 = crate::on_db!(self.db(), |pool| sqlx::query_scalar(sql)
            .bind(event)
            .fetch_one(pool)
            .await)?;
        Ok(count)
    }
}
