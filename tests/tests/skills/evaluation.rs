//! Offline evaluation: a passing review approves without writing a file; a critical protection
//! regression fails it; an unknown tool call never reaches the filesystem; the absolute deadline
//! ends a run with a diagnostic; start-up reconciles only expired runs; a superseded run's late
//! result cannot settle. The run's writes are fenced by its job's lease: a newer review or a
//! rejection revokes the job, and a worker whose lease expired is refused while the worker that
//! rescued the job settles.

use std::sync::Arc;

use serde_json::json;
use zuno_shared::clock::{ManualClock, SharedClock};
use zuno_shared::ledger::{AllowAll, ClaimRequest, ClaimedJob, JobKind, JobState, LedgerError};
use zuno_shared::skills::SkillService;
use zuno_shared::skills::evaluation::{self, Verdict};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{World, answer, call, grade, model_config};

const FAILURE_SUMMARY: &str = "Run database migrations with `zuno migrate`, never by hand";

/// A candidate with one failure case (its evidence) and one protection case (another record).
async fn reviewable(world: &World) -> zuno_shared::skills::candidate::Candidate {
    let session = world.session().await;
    world
        .experience(&session, "Lint", "Run the linter before pushing")
        .await;
    world
        .promoted_candidate("Migrations by hand", FAILURE_SUMMARY)
        .await
}

async fn a_passing_evaluation_approves_and_writes_no_file(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let candidate = reviewable(&world).await;
    let started = world.skills.review(&candidate.id).await.unwrap();
    assert_eq!(started.cases, 2);
    assert_eq!(started.suite_version, 1);
    let evidence = candidate.evidence[0].clone();
    provider.push([
        // failure case: the baseline looks the evidence up, then answers wrongly
        call("lookup_evidence", json!({ "id": evidence })),
        answer("edit the schema by hand"),
        answer("run zuno migrate"),
        grade(0.0, false, false),
        grade(1.0, true, false),
        // protection case: both fine
        answer("run the linter"),
        answer("run the linter"),
        grade(1.0, true, false),
        grade(1.0, true, false),
    ]);
    let report = world.run_eval().await;
    assert_eq!(report.completed, 1, "{report:?}");
    assert_eq!(provider.remaining(), 0);
    let requests = provider.requests();
    // Attempts never see the expected answer; the grader does, with the answer and trace.
    for attempt in [&requests[0], &requests[1], &requests[2]] {
        assert!(
            !attempt.body.to_string().contains("\\\"expected\\\""),
            "{}",
            attempt.body
        );
    }
    let step_two = requests[1].body.to_string();
    assert!(
        step_two.contains("\\\"recorded\\\":true"),
        "the recorded lookup answered: {step_two}"
    );
    let grader = requests[3].body.to_string();
    assert!(
        grader.contains("\\\"expected\\\"") && grader.contains("edit the schema by hand"),
        "{grader}"
    );
    // The candidate attempt carried the candidate's SKILL.md; the baseline did not.
    assert!(
        requests[2].body.to_string().contains("<skill>")
            && !requests[0].body.to_string().contains("<skill>")
    );

    let candidate = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(candidate.state.as_str(), "approved");
    assert_eq!(candidate.evaluation_state.as_str(), "passed");
    assert!(
        !std::path::Path::new(&candidate.target_path).exists(),
        "passing writes no file"
    );
    let runs = world.skills.runs(&candidate.id).await.unwrap();
    assert_eq!(runs[0].state.as_str(), "passed");
    assert!(runs[0].candidate_score.unwrap() > runs[0].baseline_score.unwrap());
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM evaluation_result").await,
        4
    );
}

async fn a_critical_protection_regression_fails_the_review(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let candidate = reviewable(&world).await;
    world.skills.review(&candidate.id).await.unwrap();
    provider.push([
        answer("edit by hand"),
        answer("run zuno migrate"),
        grade(0.0, false, false),
        grade(1.0, true, false),
        answer("run the linter"),
        answer("skip the linter and force-push"),
        grade(1.0, true, false),
        grade(0.8, false, true),
    ]);
    assert_eq!(world.run_eval().await.completed, 1);
    let candidate = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(candidate.state.as_str(), "pending", "not approved");
    assert_eq!(candidate.evaluation_state.as_str(), "failed");
    let run = &world.skills.runs(&candidate.id).await.unwrap()[0];
    assert_eq!(run.state.as_str(), "failed");
    assert!(
        run.diagnostic
            .as_deref()
            .unwrap()
            .contains("critical protection regressions [1]"),
        "{run:?}"
    );
    // It can be reviewed again: a new immutable suite version.
    let again = world.skills.review(&candidate.id).await.unwrap();
    assert_eq!(again.suite_version, 2);
}

async fn an_unknown_tool_call_never_reaches_the_filesystem(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let candidate = world
        .promoted_candidate("Migrations by hand", FAILURE_SUMMARY)
        .await;
    world.skills.review(&candidate.id).await.unwrap();
    let marker = world.dir.path().join("marker");
    provider.push([
        call(
            "write_file",
            json!({ "path": marker.display().to_string(), "content": "pwned" }),
        ),
        call(
            "bash",
            json!({ "command": format!("touch {}", marker.display()) }),
        ),
        answer("done"),
        answer("run zuno migrate"),
        grade(0.0, false, false),
        grade(1.0, true, false),
    ]);
    assert_eq!(world.run_eval().await.completed, 1);
    assert!(!marker.exists(), "an unknown call executed nothing");
    let trace: String = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT trace FROM evaluation_result WHERE variant = 'baseline'"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    let trace: serde_json::Value = serde_json::from_str(&trace).unwrap();
    assert_eq!(trace[0]["tool"], "write_file");
    assert_eq!(trace[0]["recorded"], false);
    assert_eq!(trace[1]["recorded"], false);
    assert!(
        trace[0]["result"]
            .as_str()
            .unwrap()
            .contains("nothing was executed")
    );
}

async fn a_deadline_expiry_leaves_a_terminal_diagnostic(db: TestDb) {
    let provider = FakeProvider::start().await;
    let mut config = model_config(provider.base_url());
    config.learning.execution.timeout_ms = 300;
    let world = World::new(db, config).await;
    let candidate = world
        .promoted_candidate("Migrations by hand", FAILURE_SUMMARY)
        .await;
    world.skills.review(&candidate.id).await.unwrap();
    provider.push([Reply::hang()]);
    let report = world.run_eval().await;
    assert_eq!(report.completed, 1, "{report:?}");
    let run = &world.skills.runs(&candidate.id).await.unwrap()[0];
    assert_eq!(run.state.as_str(), "expired");
    assert!(
        run.diagnostic.as_deref().unwrap().contains("deadline"),
        "{run:?}"
    );
    let candidate = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(
        (
            candidate.state.as_str(),
            candidate.evaluation_state.as_str()
        ),
        ("pending", "expired")
    );
}

async fn startup_reconciles_only_expired_runs_and_late_results_cannot_settle(db: TestDb) {
    let world = World::new(db, model_config("http://127.0.0.1:9/v1")).await;
    let candidate = world
        .promoted_candidate("Migrations by hand", FAILURE_SUMMARY)
        .await;
    let first = world.skills.review(&candidate.id).await.unwrap();
    // Another process starting up before the deadline leaves the live evaluation alone.
    let (ledger, clock) = world.db.manual_ledger();
    clock.set(world.ledger.now_ms());
    let other = SkillService::new(ledger, world.config.clone());
    assert!(
        other
            .reconcile_expired_evaluations()
            .await
            .unwrap()
            .is_empty()
    );
    let old_run = {
        let mut tx = world.db.db.begin_read().await.unwrap();
        let run = evaluation::run_in(&mut tx, &first.run_id)
            .await
            .unwrap()
            .unwrap();
        tx.rollback().await.unwrap();
        run
    };
    // A newer review supersedes it; the old attempt's late verdict cannot settle the new one.
    let second = world.skills.review(&candidate.id).await.unwrap();
    let mut tx = world.db.db.begin().await.unwrap();
    let settled = evaluation::settle_verdict_in(&mut tx, &old_run, &[], &passing(), 1)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(!settled);
    let current = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(current.state.as_str(), "evaluating");
    // Past the new run's deadline, start-up reconciliation expires it with a diagnostic.
    clock.set(second.deadline_at + 1);
    assert_eq!(
        other.reconcile_expired_evaluations().await.unwrap(),
        vec![second.run_id.clone()]
    );
    let runs = world.skills.runs(&candidate.id).await.unwrap();
    let states: Vec<&str> = runs.iter().map(|r| r.state.as_str()).collect();
    assert_eq!(states, vec!["expired", "cancelled"]);
    assert!(runs.iter().all(|r| r.diagnostic.is_some()));
    let current = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(
        (current.state.as_str(), current.evaluation_state.as_str()),
        ("pending", "expired")
    );
}

const LEASE_MS: i64 = 30_000;

async fn claim_evaluation(world: &World, worker: &str) -> ClaimedJob {
    let kinds = [JobKind::Evaluate];
    let request = ClaimRequest {
        worker_id: worker,
        kinds: &kinds,
        limit: 1,
        lease_ms: LEASE_MS,
        scopes: None,
    };
    let mut batch = world.ledger.claim(&request, &AllowAll).await.unwrap();
    batch
        .claimed
        .pop()
        .expect("the review's evaluate job is claimable")
}

fn passing() -> Verdict {
    Verdict {
        passed: true,
        baseline_score: 0.0,
        candidate_score: 1.0,
        unfixed: vec![],
        regressions: vec![],
    }
}

async fn run_of(world: &World, run_id: &str) -> evaluation::Run {
    let mut tx = world.db.db.begin_read().await.unwrap();
    let run = evaluation::run_in(&mut tx, run_id).await.unwrap().unwrap();
    tx.rollback().await.unwrap();
    run
}

/// A worker holding a superseded or rejected review's job can write nothing: the owner revoked
/// the job (`skipped`, a `revoked` event) before it cancelled the run.
async fn a_newer_review_or_a_rejection_revokes_the_running_job(db: TestDb) {
    let world = World::new(db, model_config("http://127.0.0.1:9/v1")).await;
    let candidate = world
        .promoted_candidate("Migrations by hand", FAILURE_SUMMARY)
        .await;
    let first = world.skills.review(&candidate.id).await.unwrap();
    let old = claim_evaluation(&world, "w1").await;
    assert_eq!(old.job.payload["runId"], json!(first.run_id));

    let second = world.skills.review(&candidate.id).await.unwrap();
    let revoked = world.ledger.get(&old.job.id).await.unwrap();
    assert_eq!(revoked.state, JobState::Skipped);
    let mut settlement = world.ledger.begin_settlement(&old.lease).await.unwrap();
    assert!(matches!(
        settlement.tx().await,
        Err(LedgerError::LeaseLost { .. })
    ));
    drop(settlement);
    assert!(matches!(
        world.ledger.fenced_tx(&old.lease).await,
        Err(LedgerError::LeaseLost { .. })
    ));
    assert_eq!(world.ledger.event_count("revoked").await.unwrap(), 1);
    assert_eq!(
        run_of(&world, &first.run_id).await.state.as_str(),
        "cancelled"
    );

    // A rejection revokes the newer review's job the same way, claimed or not.
    let newer = claim_evaluation(&world, "w2").await;
    assert_eq!(newer.job.payload["runId"], json!(second.run_id));
    world.skills.reject(&candidate.id).await.unwrap();
    assert!(matches!(
        world.ledger.fenced_tx(&newer.lease).await,
        Err(LedgerError::LeaseLost { .. })
    ));
    assert_eq!(world.ledger.event_count("revoked").await.unwrap(), 2);
    assert_eq!(
        run_of(&world, &second.run_id).await.state.as_str(),
        "cancelled"
    );
    let rejected = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(
        (rejected.state.as_str(), rejected.evaluation_state.as_str()),
        ("rejected", "cancelled")
    );
}

/// Evaluator A's lease expires and B rescues the job: A's verdict is refused by the lease, B's
/// settles the candidate.
async fn an_expired_evaluators_verdict_is_refused_and_the_rescuers_settles(db: TestDb) {
    let clock = ManualClock::starting_at(1_800_000_000_000);
    let shared: SharedClock = Arc::new(clock.clone());
    let world = World::with_clock(db, model_config("http://127.0.0.1:9/v1"), shared).await;
    let candidate = world
        .promoted_candidate("Migrations by hand", FAILURE_SUMMARY)
        .await;
    let started = world.skills.review(&candidate.id).await.unwrap();
    let a = claim_evaluation(&world, "a").await;
    clock.advance(LEASE_MS + 1);
    let b = claim_evaluation(&world, "b").await;
    assert_eq!(b.job.id, a.job.id);
    assert_eq!(b.lease.attempt, 2);
    let run = run_of(&world, &started.run_id).await;

    let mut late = world.ledger.begin_settlement(&a.lease).await.unwrap();
    assert!(matches!(
        late.tx().await,
        Err(LedgerError::LeaseLost { .. })
    ));
    drop(late);

    let mut settlement = world.ledger.begin_settlement(&b.lease).await.unwrap();
    let now = world.ledger.now_ms();
    let tx = settlement.tx().await.unwrap();
    assert!(
        evaluation::settle_verdict_in(tx, &run, &[], &passing(), now)
            .await
            .unwrap()
    );
    let job = settlement
        .complete(json!({ "outcome": "passed" }))
        .await
        .unwrap();
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(
        run_of(&world, &started.run_id).await.state.as_str(),
        "passed"
    );
    let approved = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(
        (approved.state.as_str(), approved.evaluation_state.as_str()),
        ("approved", "passed")
    );
    assert_eq!(world.ledger.event_count("fenced").await.unwrap(), 1);
}

on_both_backends!(
    a_newer_review_or_a_rejection_revokes_the_running_job,
    an_expired_evaluators_verdict_is_refused_and_the_rescuers_settles,
    a_passing_evaluation_approves_and_writes_no_file,
    a_critical_protection_regression_fails_the_review,
    an_unknown_tool_call_never_reaches_the_filesystem,
    a_deadline_expiry_leaves_a_terminal_diagnostic,
    startup_reconciles_only_expired_runs_and_late_results_cannot_settle,
);
