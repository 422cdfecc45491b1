//! Evaluation suites, their cases, runs and graded results.

use crate::db::{Db, StoreError, Tx};
use crate::skills::evaluation::{AttemptRecord, Case, CaseKind, Run, RunState};

const RUN_COLUMNS: &str = "id, suite_id, candidate_id, job_id, state, deadline_at, \
    baseline_score, candidate_score, diagnostic, started_at, finished_at";

pub async fn run_in(tx: &mut Tx, id: &str) -> Result<Option<Run>, StoreError> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM evaluation_run WHERE id = $1");
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(id)
    .fetch_optional(conn)
    .await)?)
}

/// The runs of a candidate, newest first.
pub async fn runs_of_candidate(db: &Db, candidate_id: &str) -> Result<Vec<Run>, StoreError> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM evaluation_run WHERE candidate_id = $1 \
         ORDER BY started_at DESC, id DESC"
    );
    Ok(crate::on_db!(db, |pool| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(candidate_id)
    .fetch_all(pool)
    .await)?)
}

/// Running runs whose deadline is at or before `now`.
pub async fn overdue_runs(db: &Db, now: i64) -> Result<Vec<Run>, StoreError> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM evaluation_run WHERE state = 'running' AND deadline_at <= $1"
    );
    Ok(crate::on_db!(db, |pool| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(now)
    .fetch_all(pool)
    .await)?)
}

/// ordinal, kind, weight, experience, task, calls (JSON), expected.
type CaseRow = (i64, String, f64, Option<String>, String, String, String);

pub async fn cases_in(tx: &mut Tx, suite_id: &str) -> Result<Vec<Case>, StoreError> {
    let rows: Vec<CaseRow> = crate::on_tx!(tx, |conn| sqlx::query_as(
        "SELECT ordinal, kind, weight, experience_id, task, calls, expected \
         FROM evaluation_case WHERE suite_id = $1 ORDER BY ordinal"
    )
    .bind(suite_id)
    .fetch_all(conn)
    .await)?;
    rows.into_iter()
        .map(
            |(ordinal, kind, weight, experience_id, task, calls, expected)| {
                Ok(Case {
                    ordinal,
                    kind: CaseKind::try_from(kind)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    weight,
                    experience_id,
                    task,
                    calls: serde_json::from_str(&calls)
                        .map_err(|e| StoreError::Corrupt(format!("evaluation case calls: {e}")))?,
                    expected,
                })
            },
        )
        .collect()
}

/// An experience a case is built from.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CaseSource {
    pub id: String,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
}

/// The candidate's live verified evidence, oldest first: its failure cases.
pub async fn failure_sources_in(
    tx: &mut Tx,
    candidate_id: &str,
) -> Result<Vec<CaseSource>, StoreError> {
    const SQL: &str = concat!(
        "SELECT e.id, e.title, e.summary, e.resolution FROM experience_record e \
         JOIN skill_candidate_evidence v ON v.experience_id = e.id WHERE v.candidate_id = $1 AND ",
        crate::learning::experience::store::evidence_experience!("e"),
        " ORDER BY e.created_at, e.id"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(SQL)
        .bind(candidate_id)
        .fetch_all(conn)
        .await)?)
}

/// Up to `limit` of the project's other verified experiences, newest first: protection cases.
pub async fn protection_sources_in(
    tx: &mut Tx,
    project_id: &str,
    candidate_id: &str,
    limit: i64,
) -> Result<Vec<CaseSource>, StoreError> {
    const SQL: &str = concat!(
        "SELECT e.id, e.title, e.summary, e.resolution FROM experience_record e \
         WHERE e.project_id = $1 AND ",
        crate::learning::experience::store::evidence_experience!("e"),
        " AND e.id NOT IN (SELECT experience_id FROM skill_candidate_evidence \
           WHERE candidate_id = $2) ORDER BY e.created_at DESC, e.id DESC LIMIT $3"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(SQL)
        .bind(project_id)
        .bind(candidate_id)
        .bind(limit)
        .fetch_all(conn)
        .await)?)
}

/// The verified evidence excerpts of an experience, in order.
pub async fn verified_excerpts_in(
    tx: &mut Tx,
    experience_id: &str,
) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT excerpt FROM experience_evidence WHERE experience_id = $1 AND verified = TRUE \
         ORDER BY ordinal"
    )
    .bind(experience_id)
    .fetch_all(conn)
    .await)?)
}

/// An immutable suite version to store.
#[derive(Debug, Clone, Copy)]
pub struct NewSuite<'a> {
    pub candidate_id: &'a str,
    pub digest: &'a str,
    pub cases: &'a [Case],
}

/// Stores the candidate's next suite version with its cases; returns its id and version.
pub async fn insert_suite_in(
    tx: &mut Tx,
    suite: &NewSuite<'_>,
    now: i64,
) -> Result<(String, i64), StoreError> {
    let version: i64 = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT COALESCE(MAX(version), 0) + 1 FROM evaluation_suite WHERE candidate_id = $1"
    )
    .bind(suite.candidate_id)
    .fetch_one(conn)
    .await)?;
    let suite_id = crate::ids::new_id("esuite");
    crate::db::execute_in(
        tx,
        "INSERT INTO evaluation_suite (id, candidate_id, version, digest, created_at) \
         VALUES ($1, $2, $3, $4, $5)",
        &[
            (&suite_id).into(),
            suite.candidate_id.into(),
            version.into(),
            suite.digest.into(),
            now.into(),
        ],
    )
    .await?;
    for case in suite.cases {
        let calls = serde_json::to_string(&case.calls).unwrap_or_default();
        crate::db::execute_in(
            tx,
            "INSERT INTO evaluation_case \
               (suite_id, ordinal, kind, weight, experience_id, task, calls, expected) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                (&suite_id).into(),
                case.ordinal.into(),
                case.kind.as_str().into(),
                case.weight.into(),
                (&case.experience_id).into(),
                (&case.task).into(),
                (&calls).into(),
                (&case.expected).into(),
            ],
        )
        .await?;
    }
    Ok((suite_id, version))
}

/// The evaluate jobs of the candidate's running runs (a run whose job was pruned has none).
pub async fn running_jobs_in(tx: &mut Tx, candidate_id: &str) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT job_id FROM evaluation_run \
         WHERE candidate_id = $1 AND state = 'running' AND job_id IS NOT NULL"
    )
    .bind(candidate_id)
    .fetch_all(conn)
    .await)?)
}

/// Cancels the candidate's running runs with `diagnostic`.
pub async fn cancel_running_in(
    tx: &mut Tx,
    candidate_id: &str,
    diagnostic: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE evaluation_run SET state = 'cancelled', diagnostic = $2, finished_at = $3 \
         WHERE candidate_id = $1 AND state = 'running'",
        &[candidate_id.into(), diagnostic.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// A run to start. Its job's lease fences every write of the run's worker; the
/// `owner_token` column (NOT NULL since migration 0004) holds the job's id.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    pub id: &'a str,
    pub suite_id: &'a str,
    pub candidate_id: &'a str,
    pub job_id: &'a str,
    pub deadline_at: i64,
}

pub async fn insert_run_in(tx: &mut Tx, run: &NewRun<'_>, now: i64) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO evaluation_run \
           (id, suite_id, candidate_id, job_id, owner_token, state, deadline_at, started_at) \
         VALUES ($1, $2, $3, $4, $4, 'running', $5, $6)",
        &[
            run.id.into(),
            run.suite_id.into(),
            run.candidate_id.into(),
            run.job_id.into(),
            run.deadline_at.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// How a running run ends: its state, scores when graded, and the diagnostic.
#[derive(Debug, Clone, Copy)]
pub struct RunOutcome<'a> {
    pub state: RunState,
    pub baseline_score: Option<f64>,
    pub candidate_score: Option<f64>,
    pub diagnostic: &'a str,
}

/// Ends `run` if it is still running; `false` when it was not. The caller proves its right to:
/// a worker through its job's lease (a newer review, a rejection or an expiry revokes the job
/// first), the owner by revoking the job in the same transaction.
pub async fn finish_run_in(
    tx: &mut Tx,
    run: &Run,
    outcome: &RunOutcome<'_>,
    now: i64,
) -> Result<bool, StoreError> {
    let finished = crate::on_tx!(tx, |conn| sqlx::query(
        "UPDATE evaluation_run SET state = $2, baseline_score = $3, candidate_score = $4, \
           diagnostic = $5, finished_at = $6 \
         WHERE id = $1 AND state = 'running'"
    )
    .bind(&run.id)
    .bind(outcome.state.as_str())
    .bind(outcome.baseline_score)
    .bind(outcome.candidate_score)
    .bind(outcome.diagnostic)
    .bind(now)
    .execute(conn)
    .await
    .map(|done| done.rows_affected()))?;
    Ok(finished == 1)
}

/// Stores one graded attempt of `run_id`.
pub async fn insert_result_in(
    tx: &mut Tx,
    run_id: &str,
    attempt: &AttemptRecord,
) -> Result<(), StoreError> {
    let trace = attempt.trace.to_string();
    crate::db::execute_in(
        tx,
        "INSERT INTO evaluation_result \
           (run_id, case_ordinal, variant, answer, trace, score, passed, critical, reason) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            run_id.into(),
            attempt.case_ordinal.into(),
            attempt.variant.as_str().into(),
            (&attempt.answer).into(),
            (&trace).into(),
            attempt.grade.score.clamp(0.0, 1.0).into(),
            attempt.grade.passed.into(),
            attempt.grade.critical.into(),
            (&attempt.grade.reason).into(),
        ],
    )
    .await?;
    Ok(())
}
