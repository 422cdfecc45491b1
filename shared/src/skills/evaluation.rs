//! Offline evaluation of Skill candidates (spec 002 "Skill candidates and evaluation").
//!
//! Only an explicit review ([`SkillService::review`]) builds an immutable, versioned suite and
//! starts a run with an absolute deadline and admits its `evaluate` job. The worker runs a
//! bounded baseline and candidate attempt per case through the [`CassetteDispatcher`], which
//! answers only exact recorded calls; a grader scores each attempt; [`decide`] applies the pass
//! rule. The job's lease fences every write of the worker: a newer review, a rejection or a
//! start-up expiry revokes the job ([`Ledger::revoke_in`](crate::ledger::Ledger::revoke_in))
//! before it touches the run, so a late result from an old attempt or a superseded review can
//! never settle (ADR 0011).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::candidate::{
    Candidate, CandidateOperation, EvaluationState, SkillCandidateState, SourceKind, candidate_in,
};
use super::store::candidate::{self as candidate_store, EvaluationEnd};
use super::store::evaluation::{self as store, CaseSource, NewRun, NewSuite, RunOutcome};
use super::{SkillError, SkillService};
use crate::db::{StoreError, Tx};

pub use super::store::evaluation::{cases_in, run_in};
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
    pub kind: CaseKind,
    pub weight: f64,
    pub experience_id: Option<String>,
    pub task: String,
    pub calls: Vec<RecordedCall>,
    pub expected: String,
}

crate::states::stored_states! {
    /// What a case checks: a cited failure the candidate must fix, or other verified experience
    /// it must not break.
    pub enum CaseKind in "evaluation_case"."kind" {
        Failure = "failure",
        Protection = "protection",
    }
}

impl CaseKind {
    /// A case's weight in the overall metric: fixing a cited failure counts double.
    pub fn weight(self) -> f64 {
        match self {
            CaseKind::Failure => 2.0,
            CaseKind::Protection => 1.0,
        }
    }
}

crate::states::stored_states! {
    /// Which Skill an attempt ran with: the baseline (the current source) or the candidate.
    pub enum AttemptVariant in "evaluation_result"."variant" {
        Baseline = "baseline",
        Candidate = "candidate",
    }
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
    pub kind: CaseKind,
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
        .filter(|(_, o)| o.kind == CaseKind::Failure && !o.candidate.passed)
        .map(|(i, _)| i)
        .collect();
    let regressions: Vec<usize> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            o.kind == CaseKind::Protection
                && o.baseline.passed
                && !o.candidate.passed
                && o.candidate.critical
        })
        .map(|(i, _)| i)
        .collect();
    let has_failure_case = outcomes.iter().any(|o| o.kind == CaseKind::Failure);
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
    #[sqlx(try_from = "String")]
    pub state: RunState,
    pub deadline_at: i64,
    pub baseline_score: Option<f64>,
    pub candidate_score: Option<f64>,
    pub diagnostic: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

/// Only a pending (or re-reviewed) Skill candidate, not a revocation, has something to evaluate.
fn check_reviewable(candidate: &Candidate) -> Result<(), SkillError> {
    let candidate_id = &candidate.id;
    if candidate.operation != CandidateOperation::Apply {
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
    let failures = store::failure_sources_in(tx, &candidate.id).await?;
    if failures.is_empty() {
        return Err(SkillError::Conflict(String::from(
            "the candidate has no live verified evidence left to evaluate",
        )));
    }
    let protections = store::protection_sources_in(
        tx,
        &candidate.project_id,
        &candidate.id,
        MAX_PROTECTION_CASES,
    )
    .await?;
    let sources = failures
        .iter()
        .map(|source| (source, CaseKind::Failure))
        .chain(
            protections
                .iter()
                .map(|source| (source, CaseKind::Protection)),
        );
    let mut cases = Vec::new();
    for (source, kind) in sources {
        let ordinal = cases.len() as i64;
        cases.push(case_for_in(tx, source, ordinal, kind).await?);
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
    let digest = crate::text::sha256(
        &serde_json::to_string(&(&candidate.content_digest, cases)).unwrap_or_default(),
    );
    let suite = NewSuite {
        candidate_id: &candidate.id,
        digest: &digest,
        cases,
    };
    Ok(store::insert_suite_in(tx, &suite, now).await?)
}

async fn case_for_in(
    tx: &mut Tx,
    experience: &CaseSource,
    ordinal: i64,
    kind: CaseKind,
) -> Result<Case, StoreError> {
    let excerpts = store::verified_excerpts_in(tx, &experience.id).await?;
    let recorded = if excerpts.is_empty() {
        experience.summary.clone()
    } else {
        excerpts.join("\n")
    };
    Ok(Case {
        ordinal,
        kind,
        weight: kind.weight(),
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
    /// deadline (`learning.execution.timeout_ms` from now) and admits the evaluation job — all in
    /// one transaction. A newer review supersedes a running one: the old run's job is revoked,
    /// so its worker's result cannot settle.
    pub async fn review(&self, candidate_id: &str) -> Result<ReviewStarted, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = candidate_in(&mut tx, candidate_id).await?.ok_or_else(|| {
            SkillError::NotFound(format!("skill candidate `{candidate_id}` was not found"))
        })?;
        check_reviewable(&candidate)?;
        let cases = suite_cases_in(&mut tx, &candidate).await?;
        let (suite_id, version) = insert_suite_in(&mut tx, &candidate, &cases, now).await?;
        self.cancel_review_in(&mut tx, candidate_id, "superseded by a newer review", now)
            .await?;
        let run_id = crate::ids::new_id("erun");
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
        let job_id = &admission.job().id;
        let run = NewRun {
            id: &run_id,
            suite_id: &suite_id,
            candidate_id,
            job_id,
            deadline_at,
        };
        store::insert_run_in(&mut tx, &run, now).await?;
        candidate_store::start_evaluation_in(&mut tx, candidate_id, job_id, now).await?;
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
        Ok(store::runs_of_candidate(&self.db, candidate_id).await?)
    }

    /// Ends the candidate's running review owner-side: revokes its evaluate jobs first (a
    /// worker's settlement locks the job row before the runs, so the same order cannot
    /// deadlock), then cancels the runs with `diagnostic`.
    pub(crate) async fn cancel_review_in(
        &self,
        tx: &mut Tx,
        candidate_id: &str,
        diagnostic: &str,
        now: i64,
    ) -> Result<(), SkillError> {
        for job_id in store::running_jobs_in(tx, candidate_id).await? {
            self.ledger.revoke_in(tx, &job_id, diagnostic).await?;
        }
        store::cancel_running_in(tx, candidate_id, diagnostic, now).await?;
        Ok(())
    }

    /// Ends a run without a verdict, owner-side, with a terminal diagnostic: revokes its job
    /// first, so a worker still on it cannot settle. Returns false when the run had ended.
    pub async fn end_run(
        &self,
        run: &Run,
        ending: RunEnding,
        diagnostic: &str,
    ) -> Result<bool, SkillError> {
        let mut tx = self.db.begin().await?;
        if let Some(job_id) = &run.job_id {
            self.ledger.revoke_in(&mut tx, job_id, diagnostic).await?;
        }
        let ended = end_run_in(&mut tx, run, ending, diagnostic, self.now()).await?;
        tx.commit().await?;
        Ok(ended)
    }

    /// Start-up reconciliation of another process: only runs past their deadline are ended
    /// (`expired`); live evaluations are left alone. Returns the expired run ids.
    pub async fn reconcile_expired_evaluations(&self) -> Result<Vec<String>, SkillError> {
        let runs = store::overdue_runs(&self.db, self.now()).await?;
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

/// Ends `run` without a verdict in the caller's transaction: a worker's fenced transaction, or
/// an owner's that revoked the run's job ([`SkillService::end_run`]).
pub async fn end_run_in(
    tx: &mut Tx,
    run: &Run,
    ending: RunEnding,
    diagnostic: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let outcome = RunOutcome {
        state: ending.run_state(),
        baseline_score: None,
        candidate_score: None,
        diagnostic,
    };
    let ended = store::finish_run_in(tx, run, &outcome, now).await?;
    if ended {
        let end = EvaluationEnd {
            state: SkillCandidateState::Pending,
            evaluation_state: ending.evaluation_state(),
            detail: diagnostic,
        };
        candidate_store::end_evaluation_in(tx, &run.candidate_id, end, now).await?;
    }
    Ok(ended)
}

/// One graded attempt, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub case_ordinal: i64,
    pub variant: AttemptVariant,
    pub answer: String,
    pub trace: Value,
    pub grade: Grade,
}

/// Settles a run's verdict in the caller's transaction, fenced by the run's job lease: results,
/// scores, the run's state and the candidate's (`approved` on a pass, back to `pending` with
/// `failed` otherwise). A newer review, a rejection or an expiry revokes the job first, so the
/// fence refuses a stale verdict before this runs; `false` (nothing written) when the run had
/// ended all the same. Passing writes no file.
pub async fn settle_verdict_in(
    tx: &mut Tx,
    run: &Run,
    attempts: &[AttemptRecord],
    verdict: &Verdict,
    now: i64,
) -> Result<bool, StoreError> {
    let (run_state, candidate_state, evaluation_state) = if verdict.passed {
        let approved = SkillCandidateState::Approved;
        (RunState::Passed, approved, EvaluationState::Passed)
    } else {
        let pending = SkillCandidateState::Pending;
        (RunState::Failed, pending, EvaluationState::Failed)
    };
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
    let outcome = RunOutcome {
        state: run_state,
        baseline_score: Some(verdict.baseline_score),
        candidate_score: Some(verdict.candidate_score),
        diagnostic: &diagnostic,
    };
    if !store::finish_run_in(tx, run, &outcome, now).await? {
        return Ok(false);
    }
    for attempt in attempts {
        store::insert_result_in(tx, &run.id, attempt).await?;
    }
    let end = EvaluationEnd {
        state: candidate_state,
        evaluation_state,
        detail: &diagnostic,
    };
    candidate_store::end_evaluation_in(tx, &run.candidate_id, end, now).await?;
    Ok(true)
}

/// The candidate's current content and the baseline Skill an attempt starts from: the current
/// source file for a writable source, nothing otherwise.
pub fn baseline_skill(candidate: &Candidate) -> Option<String> {
    if candidate.companion || candidate.source_kind == SourceKind::Absent {
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

    fn outcome(kind: CaseKind, baseline: Grade, candidate: Grade) -> CaseOutcome {
        CaseOutcome {
            kind,
            weight: kind.weight(),
            baseline,
            candidate,
        }
    }

    #[test]
    fn a_fixed_failure_without_regression_passes() {
        let verdict = decide(&[
            outcome(
                CaseKind::Failure,
                grade(0.0, false, false),
                grade(1.0, true, false),
            ),
            outcome(
                CaseKind::Protection,
                grade(1.0, true, false),
                grade(1.0, true, false),
            ),
        ]);
        assert!(verdict.passed, "{verdict:?}");
    }

    #[test]
    fn a_critical_protection_regression_fails_even_with_a_better_metric() {
        let verdict = decide(&[
            outcome(
                CaseKind::Failure,
                grade(0.0, false, false),
                grade(1.0, true, false),
            ),
            outcome(
                CaseKind::Protection,
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
            CaseKind::Failure,
            grade(0.0, false, false),
            grade(0.4, false, false),
        )]);
        assert_eq!(unfixed.unfixed, vec![0]);
        let lower = decide(&[
            outcome(
                CaseKind::Failure,
                grade(0.5, false, false),
                grade(0.6, true, false),
            ),
            outcome(
                CaseKind::Protection,
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
