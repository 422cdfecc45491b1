//! Offline evaluation of Skill candidates (spec 002 "Skill candidates and evaluation").
//!
//! Only an explicit review ([`SkillService::review`]) builds an immutable, versioned suite and
//! starts a run with an absolute deadline and an ownership token. The worker runs a bounded
//! baseline and candidate attempt per case through the [`CassetteDispatcher`], which answers
//! only exact recorded calls; a grader scores each attempt; [`decide`] applies the pass rule.
//! A result settles only while the run's token is still the candidate's review token, so a late
//! result from an old attempt can never settle a newer review.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::candidate::{Candidate, EvaluationState, SkillCandidateState, candidate_in};
use super::{SkillError, SkillService};
use crate::db::{StoreError, Tx};
use crate::ledger::{Admission, JobIdentity, JobOrigin, NewJob};

/// The name of the read-only evidence lookup tool of observation-only suites.
pub const LOOKUP_TOOL: &str = "lookup_evidence";
/// Protection cases per suite: other verified project experience the Skill must not break.
pub const MAX_PROTECTION_CASES: i64 = 3;

/// One recorded tool call: exact name and arguments, and the recorded result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedCall {
    pub name: String,
    pub arguments: Value,
    pub result: String,
}

/// One case of a suite. `expected` is for the grader only; attempts never see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub ordinal: i64,
    /// `failure` (a cited failure the candidate must fix) or `protection`.
    pub kind: String,
    pub weight: f64,
    pub experience_id: Option<String>,
    pub task: String,
    pub calls: Vec<RecordedCall>,
    pub expected: String,
}

/// What a dispatched call returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Dispatch {
    Recorded(String),
    /// No recorded call matches: nothing was executed.
    Unknown,
}

/// Returns only exact recorded calls (name and arguments, compared as JSON values). It holds
/// data only: there is no filesystem, process or network capability to fall back to.
#[derive(Debug, Clone)]
pub struct CassetteDispatcher {
    calls: Vec<RecordedCall>,
}

impl CassetteDispatcher {
    pub fn new(calls: Vec<RecordedCall>) -> CassetteDispatcher {
        CassetteDispatcher { calls }
    }

    /// The tools an attempt may call: each recorded name once.
    pub fn tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.calls.iter().map(|c| c.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    pub fn dispatch(&self, name: &str, arguments: &Value) -> Dispatch {
        self.calls
            .iter()
            .find(|c| c.name == name && &c.arguments == arguments)
            .map_or(Dispatch::Unknown, |c| Dispatch::Recorded(c.result.clone()))
    }
}

/// A grader's verdict on one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grade {
    pub score: f64,
    pub passed: bool,
    #[serde(default)]
    pub critical: bool,
    #[serde(default)]
    pub reason: Option<String>,
}

/// Both attempts of one case, graded.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseOutcome {
    pub kind: String,
    pub weight: f64,
    pub baseline: Grade,
    pub candidate: Grade,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub passed: bool,
    pub baseline_score: f64,
    pub candidate_score: f64,
    /// Failure cases the candidate did not fix (ordinals into the outcomes).
    pub unfixed: Vec<usize>,
    /// Protection cases with a critical regression.
    pub regressions: Vec<usize>,
}

/// The pass rule: every cited failure case is fixed, no protection case has a critical
/// regression (the baseline passed, the candidate failed and the grader marked it critical), and
/// the weighted overall metric does not decrease.
pub fn decide(outcomes: &[CaseOutcome]) -> Verdict {
    let total: f64 = outcomes
        .iter()
        .map(|o| o.weight)
        .sum::<f64>()
        .max(f64::MIN_POSITIVE);
    let weighted = |grade: fn(&CaseOutcome) -> f64| {
        outcomes.iter().map(|o| o.weight * grade(o)).sum::<f64>() / total
    };
    let baseline_score = weighted(|o| o.baseline.score.clamp(0.0, 1.0));
    let candidate_score = weighted(|o| o.candidate.score.clamp(0.0, 1.0));
    let unfixed: Vec<usize> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.kind == "failure" && !o.candidate.passed)
        .map(|(i, _)| i)
        .collect();
    let regressions: Vec<usize> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            o.kind == "protection"
                && o.baseline.passed
                && !o.candidate.passed
                && o.candidate.critical
        })
        .map(|(i, _)| i)
        .collect();
    let has_failure_case = outcomes.iter().any(|o| o.kind == "failure");
    Verdict {
        passed: has_failure_case
            && unfixed.is_empty()
            && regressions.is_empty()
            && candidate_score + 1e-9 >= baseline_score,
        baseline_score,
        candidate_score,
        unfixed,
        regressions,
    }
}

/// A started review.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReviewStarted {
    pub run_id: String,
    pub suite_id: String,
    pub suite_version: i64,
    pub cases: usize,
    pub deadline_at: i64,
    #[schema(value_type = Object)]
    pub job: Value,
}

crate::states::stored_states! {
    /// Where one evaluation run is: running until its verdict, its deadline or a cancellation.
    pub enum RunState in "evaluation_run"."state" {
        Running = "running",
        Passed = "passed",
        Failed = "failed",
        Expired = "expired",
        Cancelled = "cancelled",
    }
}

/// How a run ends without a verdict: its run state, and the evaluation state its candidate
/// keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnding {
    /// Its absolute deadline passed before a result settled.
    Expired,
    /// Its job stopped (lease lost, shutdown, superseded) without a result.
    Cancelled,
}

impl RunEnding {
    pub fn run_state(self) -> RunState {
        match self {
            RunEnding::Expired => RunState::Expired,
            RunEnding::Cancelled => RunState::Cancelled,
        }
    }

    pub fn evaluation_state(self) -> EvaluationState {
        match self {
            RunEnding::Expired => EvaluationState::Expired,
            RunEnding::Cancelled => EvaluationState::Cancelled,
        }
    }
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub id: String,
    pub suite_id: String,
    pub candidate_id: String,
    pub job_id: Option<String>,
    #[serde(skip)]
    pub owner_token: String,
    #[sqlx(try_from = "String")]
    pub state: RunState,
    pub deadline_at: i64,
    pub baseline_score: Option<f64>,
    pub candidate_score: Option<f64>,
    pub diagnostic: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

const RUN_COLUMNS: &str = "id, suite_id, candidate_id, job_id, owner_token, state, deadline_at, baseline_score, \
    candidate_score, diagnostic, started_at, finished_at";

pub async fn run_in(tx: &mut Tx, id: &str) -> Result<Option<Run>, StoreError> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM evaluation_run WHERE id = $1");
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(id)
    .fetch_optional(conn)
    .await)?)
}

/// ordinal, kind, weight, experience, task, calls (JSON), expected.
type CaseRow = (i64, String, f64, Option<String>, String, String, String);

pub async fn cases_in(tx: &mut Tx, suite_id: &str) -> Result<Vec<Case>, StoreError> {
    let rows: Vec<CaseRow> = crate::on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT ordinal, kind, weight, experience_id, task, calls, expected FROM evaluation_case WHERE suite_id = $1 ORDER BY ordinal")
        .bind(suite_id).fetch_all(conn).await
    })?;
    rows.into_iter()
        .map(
            |(ordinal, kind, weight, experience_id, task, calls, expected)| {
                Ok(Case {
                    ordinal,
                    kind,
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

#[derive(sqlx::FromRow)]
struct CaseSource {
    id: String,
    title: String,
    summary: String,
    resolution: Option<String>,
}

/// Only a pending (or re-reviewed) Skill candidate, not a revocation, has something to evaluate.
fn check_reviewable(candidate: &Candidate) -> Result<(), SkillError> {
    let candidate_id = &candidate.id;
    if candidate.operation != "apply" {
        return Err(SkillError::Conflict(String::from(
            "a revocation is reviewed by applying or rejecting it; it has nothing to evaluate",
        )));
    }
    if !matches!(
        candidate.state,
        SkillCandidateState::Pending | SkillCandidateState::Evaluating
    ) {
        return Err(SkillError::Conflict(format!(
            "skill candidate `{candidate_id}` is `{}`; only pending candidates can be reviewed",
            candidate.state
        )));
    }
    Ok(())
}

/// The suite's cases: one failure case per live verified evidence of the candidate, then up to
/// [`MAX_PROTECTION_CASES`] protection cases from other verified experience of the project.
async fn suite_cases_in(tx: &mut Tx, candidate: &Candidate) -> Result<Vec<Case>, SkillError> {
    let candidate_id = &candidate.id;
    let eligible = super::pattern::ELIGIBLE;
    let sql = format!(
        "SELECT e.id, e.title, e.summary, e.resolution FROM experience_record e JOIN skill_candidate_evidence v \
         ON v.experience_id = e.id WHERE v.candidate_id = $1 AND {eligible} ORDER BY e.created_at, e.id"
    );
    let failures: Vec<CaseSource> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(candidate_id)
            .fetch_all(conn)
            .await)?;
    if failures.is_empty() {
        return Err(SkillError::Conflict(String::from(
            "the candidate has no live verified evidence left to evaluate",
        )));
    }
    let sql = format!(
        "SELECT e.id, e.title, e.summary, e.resolution FROM experience_record e WHERE e.project_id = $1 AND {eligible} \
         AND e.id NOT IN (SELECT experience_id FROM skill_candidate_evidence WHERE candidate_id = $2) \
         ORDER BY e.created_at DESC, e.id DESC LIMIT $3"
    );
    let protections: Vec<CaseSource> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(&candidate.project_id)
            .bind(candidate_id)
            .bind(MAX_PROTECTION_CASES)
            .fetch_all(conn)
            .await)?;
    let mut cases = Vec::new();
    for source in &failures {
        let ordinal = cases.len() as i64;
        cases.push(case_for_in(tx, source, ordinal, "failure", 2.0).await?);
    }
    for source in &protections {
        let ordinal = cases.len() as i64;
        cases.push(case_for_in(tx, source, ordinal, "protection", 1.0).await?);
    }
    Ok(cases)
}

/// Stores the next immutable suite version of the candidate. Returns its id and version.
async fn insert_suite_in(
    tx: &mut Tx,
    candidate: &Candidate,
    cases: &[Case],
    now: i64,
) -> Result<(String, i64), SkillError> {
    let candidate_id = &candidate.id;
    let version: i64 = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT COALESCE(MAX(version), 0) + 1 FROM evaluation_suite WHERE candidate_id = $1"
    )
    .bind(candidate_id)
    .fetch_one(conn)
    .await)?;
    let suite_id = crate::ids::new_id("esuite");
    let digest = crate::text::sha256(
        &serde_json::to_string(&(&candidate.content_digest, cases)).unwrap_or_default(),
    );
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO evaluation_suite (id, candidate_id, version, digest, created_at) VALUES ($1, $2, $3, $4, $5)")
        .bind(&suite_id).bind(candidate_id).bind(version).bind(&digest).bind(now)
        .execute(conn).await.map(|d| d.rows_affected())
    })?;
    for case in cases {
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO evaluation_case (suite_id, ordinal, kind, weight, experience_id, task, calls, expected) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
            .bind(&suite_id).bind(case.ordinal).bind(&case.kind).bind(case.weight)
            .bind(&case.experience_id)
            .bind(&case.task).bind(serde_json::to_string(&case.calls).unwrap_or_default())
            .bind(&case.expected)
            .execute(conn).await.map(|d| d.rows_affected())
        })?;
    }
    Ok((suite_id, version))
}

async fn case_for_in(
    tx: &mut Tx,
    experience: &CaseSource,
    ordinal: i64,
    kind: &str,
    weight: f64,
) -> Result<Case, StoreError> {
    let excerpts: Vec<String> = crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT excerpt FROM experience_evidence WHERE experience_id = $1 AND verified = TRUE ORDER BY ordinal")
        .bind(&experience.id).fetch_all(conn).await
    })?;
    let recorded = if excerpts.is_empty() {
        experience.summary.clone()
    } else {
        excerpts.join("\n")
    };
    Ok(Case {
        ordinal,
        kind: kind.to_owned(),
        weight,
        experience_id: Some(experience.id.clone()),
        task: format!(
            "You are working in this project again, in the situation recorded as evidence `{}` (\"{}\"). \
             Look the evidence up if you need it, then say exactly what you would do.",
            experience.id, experience.title
        ),
        calls: vec![RecordedCall {
            name: String::from(LOOKUP_TOOL),
            arguments: serde_json::json!({ "id": experience.id }),
            result: recorded,
        }],
        expected: experience
            .resolution
            .clone()
            .unwrap_or_else(|| experience.summary.clone()),
    })
}

impl SkillService {
    /// `skill-review`: builds the next immutable suite version from the candidate's evidence
    /// (observation-only failure cases with the read-only evidence lookup) and up to three
    /// protection cases from other verified project experience, starts a run with an absolute
    /// deadline (`learning.execution.timeout_ms` from now) and a fresh ownership token, and
    /// admits the evaluation job — all in one transaction. A newer review supersedes a running
    /// one: the old run's token no longer matches, so its result cannot settle.
    pub async fn review(&self, candidate_id: &str) -> Result<ReviewStarted, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = candidate_in(&mut tx, candidate_id).await?.ok_or_else(|| {
            SkillError::NotFound(format!("skill candidate `{candidate_id}` was not found"))
        })?;
        check_reviewable(&candidate)?;
        let cases = suite_cases_in(&mut tx, &candidate).await?;
        let (suite_id, version) = insert_suite_in(&mut tx, &candidate, &cases, now).await?;
        // Supersede a running review.
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "UPDATE evaluation_run SET state = 'cancelled', diagnostic = 'superseded by a newer review', finished_at = $2 \
                 WHERE candidate_id = $1 AND state = 'running'")
            .bind(candidate_id).bind(now).execute(conn).await.map(|d| d.rows_affected())
        })?;
        let run_id = crate::ids::new_id("erun");
        let token = crate::ids::new_lease_token();
        let deadline_at =
            now + i64::try_from(self.config.learning.execution.timeout_ms).unwrap_or(i64::MAX / 4);
        let identity = JobIdentity::evaluate(&candidate.project_id, candidate_id, &suite_id);
        let admission = self
            .ledger
            .admit_in(
                &mut tx,
                NewJob::new(identity, JobOrigin::Manual)
                    .with_payload(serde_json::json!({ "runId": run_id }))
                    .with_trace_parent(crate::telemetry::current_traceparent()),
            )
            .await?;
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "INSERT INTO evaluation_run (id, suite_id, candidate_id, job_id, owner_token, state, deadline_at, started_at) \
                 VALUES ($1, $2, $3, $4, $5, 'running', $6, $7)")
            .bind(&run_id).bind(&suite_id).bind(candidate_id).bind(&admission.job().id).bind(&token)
            .bind(deadline_at).bind(now).execute(conn).await.map(|d| d.rows_affected())
        })?;
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "UPDATE skill_candidate SET state = 'evaluating', evaluation_state = 'running', review_token = $2, \
                   detail = NULL, updated_at = $3 WHERE id = $1")
            .bind(candidate_id).bind(&token).bind(now).execute(conn)
            .await.map(|d| d.rows_affected())
        })?;
        tx.commit().await?;
        Ok(ReviewStarted {
            run_id,
            suite_id,
            suite_version: version,
            cases: cases.len(),
            deadline_at,
            job: admission_json(&admission),
        })
    }

    /// The runs of a candidate, newest first.
    pub async fn runs(&self, candidate_id: &str) -> Result<Vec<Run>, SkillError> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM evaluation_run WHERE candidate_id = $1 ORDER BY started_at DESC, id DESC"
        );
        Ok(crate::on_db!(self.db, |pool| sqlx::query_as(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(candidate_id)
        .fetch_all(pool)
        .await)?)
    }

    /// Ends a run without a verdict with a terminal diagnostic, fenced by its ownership token.
    /// Returns false when the run was no longer this token's.
    pub async fn end_run(
        &self,
        run: &Run,
        ending: RunEnding,
        diagnostic: &str,
    ) -> Result<bool, SkillError> {
        let mut tx = self.db.begin().await?;
        let ended = end_run_in(&mut tx, run, ending, diagnostic, self.now()).await?;
        tx.commit().await?;
        Ok(ended)
    }

    /// Start-up reconciliation of another process: only runs past their deadline are ended
    /// (`expired`); live evaluations are left alone. Returns the expired run ids.
    pub async fn reconcile_expired_evaluations(&self) -> Result<Vec<String>, SkillError> {
        let now = self.now();
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM evaluation_run WHERE state = 'running' AND deadline_at <= $1"
        );
        let runs: Vec<Run> = crate::on_db!(self.db, |pool| sqlx::query_as(sqlx::AssertSqlSafe(
            sql.as_str()
        ))
        .bind(now)
        .fetch_all(pool)
        .await)?;
        let mut expired = Vec::new();
        for run in runs {
            let diagnostic = format!(
                "the evaluation passed its deadline ({}) before a result settled; reconciled at start-up",
                run.deadline_at
            );
            if self.end_run(&run, RunEnding::Expired, &diagnostic).await? {
                expired.push(run.id);
            }
        }
        Ok(expired)
    }
}

/// [`SkillService::end_run`] in the caller's transaction.
pub async fn end_run_in(
    tx: &mut Tx,
    run: &Run,
    ending: RunEnding,
    diagnostic: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let ended = crate::on_tx!(tx, |conn| sqlx::query(
        "UPDATE evaluation_run SET state = $3, diagnostic = $4, finished_at = $5 \
             WHERE id = $1 AND owner_token = $2 AND state = 'running'"
    )
    .bind(&run.id)
    .bind(&run.owner_token)
    .bind(ending.run_state().as_str())
    .bind(diagnostic)
    .bind(now)
    .execute(conn)
    .await
    .map(|d| d.rows_affected()))?;
    if ended == 1 {
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "UPDATE skill_candidate SET state = 'pending', evaluation_state = $3, review_token = NULL, detail = $4, updated_at = $5 \
                 WHERE id = $1 AND review_token = $2 AND state = 'evaluating'")
            .bind(&run.candidate_id).bind(&run.owner_token).bind(ending.evaluation_state().as_str())
            .bind(diagnostic).bind(now)
            .execute(conn).await.map(|d| d.rows_affected())
        })?;
    }
    Ok(ended == 1)
}

/// One graded attempt, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub case_ordinal: i64,
    pub variant: &'static str,
    pub answer: String,
    pub trace: Value,
    pub grade: Grade,
}

/// Settles a run's verdict in the caller's (fenced) transaction: results, scores, the run's
/// state and the candidate's (`approved` on a pass, back to `pending` with `failed` otherwise).
/// Nothing is written and `false` returned when the run's token is no longer the candidate's
/// review token (a newer review, a rejection, an expiry). Passing writes no file.
pub async fn settle_verdict_in(
    tx: &mut Tx,
    run: &Run,
    attempts: &[AttemptRecord],
    verdict: &Verdict,
    now: i64,
) -> Result<bool, StoreError> {
    let state = if verdict.passed { "passed" } else { "failed" };
    let diagnostic = if verdict.passed {
        String::from(
            "every cited failure is fixed, no protection case regressed critically, and the weighted metric did not decrease",
        )
    } else {
        format!(
            "not approved: unfixed failure cases {:?}, critical protection regressions {:?}, weighted metric {:.3} (baseline {:.3})",
            verdict.unfixed, verdict.regressions, verdict.candidate_score, verdict.baseline_score
        )
    };
    let owned = crate::on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE evaluation_run SET state = $3, baseline_score = $4, candidate_score = $5, diagnostic = $6, finished_at = $7 \
             WHERE id = $1 AND owner_token = $2 AND state = 'running' \
               AND EXISTS (SELECT 1 FROM skill_candidate c WHERE c.id = evaluation_run.candidate_id \
                           AND c.review_token = $2 AND c.state = 'evaluating')")
        .bind(&run.id).bind(&run.owner_token).bind(state).bind(verdict.baseline_score)
        .bind(verdict.candidate_score)
        .bind(&diagnostic).bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    if owned != 1 {
        return Ok(false);
    }
    for attempt in attempts {
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO evaluation_result (run_id, case_ordinal, variant, answer, trace, score, passed, critical, reason) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(&run.id).bind(attempt.case_ordinal).bind(attempt.variant).bind(&attempt.answer)
            .bind(attempt.trace.to_string()).bind(attempt.grade.score.clamp(0.0, 1.0))
            .bind(attempt.grade.passed)
            .bind(attempt.grade.critical).bind(&attempt.grade.reason)
            .execute(conn).await.map(|d| d.rows_affected())
        })?;
    }
    let (candidate_state, evaluation_state) = if verdict.passed {
        (SkillCandidateState::Approved, EvaluationState::Passed)
    } else {
        (SkillCandidateState::Pending, EvaluationState::Failed)
    };
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE skill_candidate SET state = $3, evaluation_state = $4, review_token = NULL, detail = $5, updated_at = $6 \
             WHERE id = $1 AND review_token = $2 AND state = 'evaluating'")
        .bind(&run.candidate_id).bind(&run.owner_token).bind(candidate_state.as_str())
        .bind(evaluation_state.as_str())
        .bind(&diagnostic).bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    Ok(true)
}

/// The candidate's current content and the baseline Skill an attempt starts from: the current
/// source file for a writable source, nothing otherwise.
pub fn baseline_skill(candidate: &Candidate) -> Option<String> {
    if candidate.companion || candidate.source_kind == "absent" {
        return None;
    }
    std::fs::read_to_string(&candidate.source_path).ok()
}

fn admission_json(admission: &Admission) -> Value {
    serde_json::json!({
        "outcome": admission.outcome(),
        "id": admission.job().id,
        "state": admission.job().state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grade(score: f64, passed: bool, critical: bool) -> Grade {
        Grade {
            score,
            passed,
            critical,
            reason: None,
        }
    }

    fn outcome(kind: &str, baseline: Grade, candidate: Grade) -> CaseOutcome {
        CaseOutcome {
            kind: kind.into(),
            weight: if kind == "failure" { 2.0 } else { 1.0 },
            baseline,
            candidate,
        }
    }

    #[test]
    fn a_fixed_failure_without_regression_passes() {
        let verdict = decide(&[
            outcome("failure", grade(0.0, false, false), grade(1.0, true, false)),
            outcome(
                "protection",
                grade(1.0, true, false),
                grade(1.0, true, false),
            ),
        ]);
        assert!(verdict.passed, "{verdict:?}");
    }

    #[test]
    fn a_critical_protection_regression_fails_even_with_a_better_metric() {
        let verdict = decide(&[
            outcome("failure", grade(0.0, false, false), grade(1.0, true, false)),
            outcome(
                "protection",
                grade(1.0, true, false),
                grade(0.9, false, true),
            ),
        ]);
        assert!(!verdict.passed);
        assert_eq!(verdict.regressions, vec![1]);
        assert!(verdict.candidate_score > verdict.baseline_score);
    }

    #[test]
    fn an_unfixed_failure_or_a_lower_metric_fails() {
        let unfixed = decide(&[outcome(
            "failure",
            grade(0.0, false, false),
            grade(0.4, false, false),
        )]);
        assert_eq!(unfixed.unfixed, vec![0]);
        let lower = decide(&[
            outcome("failure", grade(0.5, false, false), grade(0.6, true, false)),
            outcome(
                "protection",
                grade(1.0, true, false),
                grade(0.0, false, false),
            ),
        ]);
        assert!(!lower.passed && lower.regressions.is_empty());
    }

    #[test]
    fn the_dispatcher_answers_only_exact_recorded_calls() {
        let dispatcher = CassetteDispatcher::new(vec![RecordedCall {
            name: "lookup_evidence".into(),
            arguments: serde_json::json!({"id": "exp_1"}),
            result: "recorded".into(),
        }]);
        assert_eq!(
            dispatcher.dispatch("lookup_evidence", &serde_json::json!({"id": "exp_1"})),
            Dispatch::Recorded("recorded".into())
        );
        assert_eq!(
            dispatcher.dispatch("lookup_evidence", &serde_json::json!({"id": "exp_2"})),
            Dispatch::Unknown
        );
        assert_eq!(
            dispatcher.dispatch("bash", &serde_json::json!({"cmd": "rm -rf /"})),
            Dispatch::Unknown
        );
    }
}
