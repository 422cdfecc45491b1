//! The job ledger's invariants, each proven on both backends.

use std::collections::HashSet;
use std::sync::Arc;

use zuno_shared::db::Tx;
use zuno_shared::ledger::{
    AllowAll, ClaimGate, ClaimRequest, GateDecision, GateFindings, HeartbeatOutcome, Job,
    JobIdentity, JobKind, JobOrigin, JobState, Ledger, LedgerError, MAX_ATTEMPTS,
    MAX_RETURNED_RELEASES, NewJob, bucket_start,
};
use zuno_tests::{TestDb, on_both_backends};

const LEASE_MS: i64 = 10_000;

fn maintain_job(key: &str) -> NewJob {
    NewJob::new(
        JobIdentity::maintain("proj", "/mem/path", key),
        JobOrigin::Explicit,
    )
}

fn request<'a>(worker: &'a str, kinds: &'a [JobKind], limit: usize) -> ClaimRequest<'a> {
    ClaimRequest {
        worker_id: worker,
        kinds,
        limit,
        lease_ms: LEASE_MS,
        scopes: None,
    }
}

async fn claim_one(ledger: &Ledger, worker: &str) -> Option<zuno_shared::ledger::ClaimedJob> {
    let kinds = [JobKind::Maintain];
    ledger
        .claim(&request(worker, &kinds, 1), &AllowAll)
        .await
        .unwrap()
        .claimed
        .pop()
}

async fn row_count(db: &TestDb) -> i64 {
    zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM learning_job"
    )
    .fetch_one(pool)
    .await)
    .unwrap()
}

async fn admission_is_idempotent_whatever_the_state(db: TestDb) {
    let ledger = db.ledger();
    let first = ledger.admit(maintain_job("a")).await.unwrap();
    assert_eq!(first.outcome(), "queued");
    let again = ledger.admit(maintain_job("a")).await.unwrap();
    assert_eq!(again.outcome(), "existing");
    assert_eq!(again.job().id, first.job().id);

    let claimed = claim_one(&ledger, "w1").await.unwrap();
    let while_running = ledger.admit(maintain_job("a")).await.unwrap();
    assert_eq!(while_running.outcome(), "existing");
    assert_eq!(while_running.job().state, JobState::Running);
    assert_eq!(
        while_running.job().attempts,
        1,
        "admission never resets attempts"
    );

    let settlement = ledger.begin_settlement(&claimed.lease).await.unwrap();
    settlement
        .complete(serde_json::json!({"done": true}))
        .await
        .unwrap();
    let after = ledger.admit(maintain_job("a")).await.unwrap();
    assert_eq!(after.outcome(), "existing");
    assert_eq!(after.job().state, JobState::Completed);
    assert_eq!(row_count(&db).await, 1);
}

async fn concurrent_admissions_of_one_identity_leave_one_row(db: TestDb) {
    // Separate pools behave like separate processes contending on the same database.
    let mut ledgers = Vec::new();
    for _ in 0..4 {
        ledgers.push(Ledger::new(
            db.reopen().await,
            zuno_shared::clock::system_clock(),
        ));
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let ledger = ledgers[i % 4].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            ledger.admit(maintain_job("contended")).await.unwrap()
        }));
    }
    let mut ids = HashSet::new();
    let mut queued = 0;
    for task in tasks {
        let admission = task.await.unwrap();
        if admission.is_new() {
            queued += 1;
        }
        ids.insert(admission.job().id.clone());
    }
    assert_eq!(queued, 1, "exactly one admission creates the job");
    assert_eq!(ids.len(), 1, "every caller sees the same job");
    assert_eq!(row_count(&db).await, 1);
}

async fn claim_hands_out_at_most_the_wake_limit_with_fresh_leases(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    for i in 0..5 {
        ledger.admit(maintain_job(&format!("j{i}"))).await.unwrap();
    }
    let kinds = [JobKind::Maintain];
    let batch = ledger
        .claim(&request("w1", &kinds, 2), &AllowAll)
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 2);
    let tokens: HashSet<_> = batch
        .claimed
        .iter()
        .map(|c| c.lease.token.clone())
        .collect();
    assert_eq!(tokens.len(), 2, "each claim gets its own token");
    for claimed in &batch.claimed {
        assert_eq!(claimed.lease.attempt, 1);
        assert_eq!(claimed.job.attempts, 1);
        assert_eq!(claimed.lease.expires_at, clock.now() + LEASE_MS);
        assert_eq!(claimed.job.lease_expires_at, Some(claimed.lease.expires_at));
        assert_eq!(claimed.job.state, JobState::Running);
        assert!(claimed.lease.token.len() >= 32);
    }
}

async fn concurrent_claimers_never_share_a_job(db: TestDb) {
    let ledger = db.ledger();
    let jobs: Vec<NewJob> = (0..60).map(|i| maintain_job(&format!("c{i}"))).collect();
    ledger.admit_batch(jobs).await.unwrap();
    let mut tasks = Vec::new();
    for worker in 0..6 {
        let ledger = Ledger::new(db.reopen().await, zuno_shared::clock::system_clock());
        tasks.push(tokio::spawn(async move {
            let kinds = [JobKind::Maintain];
            let name = format!("w{worker}");
            let mut mine = Vec::new();
            loop {
                let batch = ledger
                    .claim(&request(&name, &kinds, 2), &AllowAll)
                    .await
                    .unwrap();
                if batch.claimed.is_empty() {
                    break mine;
                }
                mine.extend(batch.claimed.into_iter().map(|c| c.job.id));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 60, "every job claimed once");
    assert_eq!(unique.len(), 60, "no job claimed twice");
}

async fn heartbeats_extend_the_lease(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    ledger.admit(maintain_job("hb")).await.unwrap();
    let claimed = claim_one(&ledger, "w1").await.unwrap();
    clock.advance(LEASE_MS - 1000);
    let outcome = ledger
        .heartbeat(&claimed.lease, LEASE_MS, &AllowAll)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        HeartbeatOutcome::Extended {
            expires_at: clock.now() + LEASE_MS
        }
    );
    // Past the original deadline but inside the extended one: nobody else may take it.
    clock.advance(2000);
    assert!(claim_one(&ledger, "w2").await.is_none());
    let job = ledger.get(&claimed.job.id).await.unwrap();
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.lease_owner.as_deref(), Some("w1"));
}

async fn an_expired_lease_is_reclaimed_and_the_old_holder_is_fenced(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    ledger.admit(maintain_job("exp")).await.unwrap();
    let first = claim_one(&ledger, "w1").await.unwrap();
    clock.advance(LEASE_MS + 1);
    let second = claim_one(&ledger, "w2")
        .await
        .expect("expired job is claimable again");
    assert_eq!(second.job.id, first.job.id);
    assert_eq!(second.lease.attempt, 2);
    assert_ne!(second.lease.token, first.lease.token);

    // The first worker can neither heartbeat nor settle.
    let heartbeat = ledger.heartbeat(&first.lease, LEASE_MS, &AllowAll).await;
    assert!(matches!(heartbeat, Err(LedgerError::LeaseLost { .. })));
    let settle = ledger
        .begin_settlement(&first.lease)
        .await
        .unwrap()
        .complete(serde_json::json!({}))
        .await;
    assert!(matches!(settle, Err(LedgerError::LeaseLost { .. })));
    assert_eq!(
        ledger.event_count("fenced").await.unwrap(),
        2,
        "each refusal is recorded"
    );
    assert_eq!(ledger.event_count("lease_expired").await.unwrap(), 1);

    let settlement = ledger.begin_settlement(&second.lease).await.unwrap();
    let job = settlement.complete(serde_json::json!({})).await.unwrap();
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.attempts, 2);
}

async fn settlement_writes_commit_with_the_state_or_not_at_all(db: TestDb) {
    let ledger = db.ledger();
    ledger.admit(maintain_job("atomic")).await.unwrap();
    let claimed = claim_one(&ledger, "w1").await.unwrap();

    // Domain write, then the settlement is dropped: both roll back.
    {
        let mut settlement = ledger.begin_settlement(&claimed.lease).await.unwrap();
        insert_project(settlement.tx().await.unwrap(), "rolled-back").await;
    }
    assert!(!project_exists(&db, "rolled-back").await);
    assert_eq!(
        ledger.get(&claimed.job.id).await.unwrap().state,
        JobState::Running
    );

    let mut settlement = ledger.begin_settlement(&claimed.lease).await.unwrap();
    insert_project(settlement.tx().await.unwrap(), "committed").await;
    settlement
        .complete(serde_json::json!({"n": 1}))
        .await
        .unwrap();
    assert!(project_exists(&db, "committed").await);
    let job = ledger.get(&claimed.job.id).await.unwrap();
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.result, Some(serde_json::json!({"n": 1})));
    assert!(job.lease_owner.is_none());

    // Settling twice is refused: the token was consumed by the first settlement.
    assert!(matches!(
        ledger
            .begin_settlement(&claimed.lease)
            .await
            .unwrap()
            .complete(serde_json::json!({}))
            .await,
        Err(LedgerError::LeaseLost { .. })
    ));
}

async fn insert_project(tx: &mut Tx, id: &str) {
    zuno_shared::on_tx!(tx, |conn| sqlx::query(
        "INSERT INTO project (id, name, created_at) VALUES ($1, $1, 0)"
    )
    .bind(id)
    .execute(conn)
    .await
    .map(|d| d.rows_affected()))
    .unwrap();
}

async fn project_exists(db: &TestDb, id: &str) -> bool {
    let found: Option<i64> = zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
        "SELECT CAST(1 AS BIGINT) FROM project WHERE id = $1"
    )
    .bind(id)
    .fetch_optional(pool)
    .await)
    .unwrap();
    found.is_some()
}

async fn attempts_are_capped_at_three_by_the_schema(db: TestDb) {
    let ledger = db.ledger();
    let job = ledger.admit(maintain_job("cap")).await.unwrap().into_job();
    let over = zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "UPDATE learning_job SET attempts = 4 WHERE id = $1"
    )
    .bind(&job.id)
    .execute(pool)
    .await
    .map(|d| d.rows_affected()));
    assert!(
        over.is_err(),
        "a fourth attempt violates the CHECK constraint"
    );
    let raised = zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "UPDATE learning_job SET max_attempts = 5 WHERE id = $1"
    )
    .bind(&job.id)
    .execute(pool)
    .await
    .map(|d| d.rows_affected()));
    assert!(
        raised.is_err(),
        "the ceiling itself cannot be raised above three"
    );
    let mut bad = maintain_job("cap-4");
    bad.max_attempts = 4;
    assert!(matches!(
        ledger.admit(bad).await,
        Err(LedgerError::Invalid(_))
    ));
}

async fn a_job_failing_three_times_settles_failed_with_its_last_error(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    let id = ledger
        .admit(maintain_job("retry"))
        .await
        .unwrap()
        .into_job()
        .id;
    for attempt in 1..=3 {
        let claimed = claim_one(&ledger, "w1").await.expect("claimable");
        assert_eq!(claimed.lease.attempt, attempt);
        let settlement = ledger.begin_settlement(&claimed.lease).await.unwrap();
        let job = settlement
            .retry(&format!("boom {attempt}"), None)
            .await
            .unwrap();
        if attempt < 3 {
            assert_eq!(job.state, JobState::Queued);
            assert!(job.run_at > clock.now(), "retry waits for its backoff");
            assert!(
                claim_one(&ledger, "w1").await.is_none(),
                "not due before the backoff"
            );
            clock.set(job.run_at);
        } else {
            assert_eq!(job.state, JobState::Failed);
            assert_eq!(job.last_error.as_deref(), Some("boom 3"));
        }
    }
    clock.advance(24 * 3600 * 1000);
    assert!(
        claim_one(&ledger, "w1").await.is_none(),
        "a failed job is never claimed again"
    );
    assert_eq!(ledger.get(&id).await.unwrap().attempts, 3);
}

async fn a_worker_that_keeps_dying_still_reaches_the_ceiling(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    let id = ledger
        .admit(maintain_job("poison"))
        .await
        .unwrap()
        .into_job()
        .id;
    for _ in 0..3 {
        claim_one(&ledger, "crashing").await.expect("claimable");
        clock.advance(LEASE_MS + 1); // the worker died without settling
    }
    // The next claim rescues the expired third attempt into `failed`.
    assert!(claim_one(&ledger, "w2").await.is_none());
    let job = ledger.get(&id).await.unwrap();
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.attempts, 3);
    assert!(job.last_error.unwrap().contains("final attempt"));
}

async fn a_permanent_failure_fails_at_once(db: TestDb) {
    let ledger = db.ledger();
    ledger.admit(maintain_job("perm")).await.unwrap();
    let claimed = claim_one(&ledger, "w1").await.unwrap();
    let settlement = ledger.begin_settlement(&claimed.lease).await.unwrap();
    let job = settlement.fail("401 unauthorized", None).await.unwrap();
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.attempts, 1);
}

struct SkipEverything;

#[async_trait::async_trait]
impl ClaimGate for SkipEverything {
    async fn check(
        &self,
        _tx: &mut Tx,
        _job: &Job,
    ) -> Result<GateDecision, zuno_shared::db::StoreError> {
        Ok(GateDecision::Skip {
            reason: "source changed".into(),
        })
    }
}

async fn a_gate_skip_settles_skipped_without_spending_an_attempt(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger
        .admit(maintain_job("gate"))
        .await
        .unwrap()
        .into_job()
        .id;
    let kinds = [JobKind::Maintain];
    let batch = ledger
        .claim(&request("w1", &kinds, 2), &SkipEverything)
        .await
        .unwrap();
    assert!(batch.claimed.is_empty());
    assert_eq!(batch.skipped.len(), 1);
    let job = ledger.get(&id).await.unwrap();
    assert_eq!(job.state, JobState::Skipped);
    assert_eq!(job.attempts, 0);
    assert_eq!(
        job.result,
        Some(serde_json::json!({"skipped": "source changed"}))
    );
}

/// A gate that hands each job's handler what it read: the job's identity key, as it saw it.
struct ReadsTheIdentity;

#[async_trait::async_trait]
impl ClaimGate for ReadsTheIdentity {
    async fn check(
        &self,
        _tx: &mut Tx,
        job: &Job,
    ) -> Result<GateDecision, zuno_shared::db::StoreError> {
        Ok(GateDecision::ProceedWith(GateFindings::new(
            job.identity_key.clone(),
        )))
    }
}

async fn a_gate_hands_what_it_read_to_the_claimed_job(db: TestDb) {
    let ledger = db.ledger();
    for key in ["f1", "f2"] {
        ledger.admit(maintain_job(key)).await.unwrap();
    }
    let kinds = [JobKind::Maintain];
    let batch = ledger
        .claim(&request("w1", &kinds, 2), &ReadsTheIdentity)
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 2);
    for claimed in &batch.claimed {
        let findings = claimed.findings.as_ref().expect("the gate's findings");
        assert_eq!(findings.get::<String>(), Some(&claimed.job.identity_key));
        assert_eq!(findings.get::<i64>(), None, "findings of another type");
        assert_eq!(claimed.job.state, JobState::Running);
        assert_eq!(claimed.lease.attempt, 1);
    }
    // A gate that only says "proceed" hands nothing on.
    ledger.admit(maintain_job("f3")).await.unwrap();
    let plain = claim_one(&ledger, "w2").await.expect("claimable");
    assert!(plain.findings.is_none());
}

async fn closed_turns_are_claimed_before_legacy_backlog(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    for i in 0..3 {
        let job = NewJob::new(
            JobIdentity::maintain("p", "/m", &format!("legacy{i}")),
            JobOrigin::Legacy,
        );
        ledger.admit(job).await.unwrap();
    }
    clock.advance(1000);
    let fresh = NewJob::new(
        JobIdentity::maintain("p", "/m", "fresh"),
        JobOrigin::ClosedTurn,
    );
    let fresh_id = ledger.admit(fresh).await.unwrap().into_job().id;
    let first = claim_one(&ledger, "w").await.unwrap();
    assert_eq!(
        first.job.id, fresh_id,
        "newer closed-turn work beats older legacy work"
    );
    assert_eq!(first.job.origin, JobOrigin::ClosedTurn);
    let second = claim_one(&ledger, "w").await.unwrap();
    assert_eq!(
        second.job.identity_key,
        JobIdentity::maintain("p", "/m", "legacy0").key,
        "legacy in age order"
    );
}

async fn one_interval_bucket_creates_one_job_across_hosts(db: TestDb) {
    const DAY: i64 = 86_400_000;
    let base = 1_800_000_000_000 - 1_800_000_000_000 % DAY;
    let mut tasks = Vec::new();
    for host in 0..12 {
        let ledger = Ledger::new(db.reopen().await, zuno_shared::clock::system_clock());
        // Each host checks at a different moment inside the same bucket.
        let now = base + host * 3_600_000 + 17;
        tasks.push(tokio::spawn(async move {
            let bucket = bucket_start(now, DAY);
            let job = NewJob::new(
                JobIdentity::aggregate_project("proj", bucket, 0, "evidence-v1"),
                JobOrigin::Periodic,
            );
            ledger.admit(job).await.unwrap()
        }));
    }
    let mut created = 0;
    for task in tasks {
        if task.await.unwrap().is_new() {
            created += 1;
        }
    }
    assert_eq!(created, 1);
    let next_bucket = NewJob::new(
        JobIdentity::aggregate_project("proj", bucket_start(base + DAY, DAY), 0, "evidence-v1"),
        JobOrigin::Periodic,
    );
    assert!(
        db.ledger().admit(next_bucket).await.unwrap().is_new(),
        "the next bucket is new work"
    );
    assert_eq!(row_count(&db).await, 2);
}

async fn a_release_returns_the_attempt_only_once(db: TestDb) {
    let ledger = db.ledger();
    ledger.admit(maintain_job("rel")).await.unwrap();
    let claimed = claim_one(&ledger, "w1").await.unwrap();
    let released = ledger.release(&claimed.lease).await.unwrap().unwrap();
    assert_eq!(released.state, JobState::Queued);
    assert_eq!(
        released.attempts, 0,
        "the first release gives the attempt back"
    );
    let again = claim_one(&ledger, "w2").await.unwrap();
    assert_eq!(again.lease.attempt, 1);
    assert!(
        ledger.release(&claimed.lease).await.unwrap().is_none(),
        "a stale lease cannot release"
    );
    let second = ledger.release(&again.lease).await.unwrap().unwrap();
    assert_eq!(second.state, JobState::Queued);
    assert_eq!(second.attempts, 1, "a second release spends the attempt");
}

/// A job that always outlives the shutdown grace period is released on every run. Releases
/// return the attempt once; after that each one spends it, so the job stops after
/// `max_attempts + 1` runs and says why.
async fn a_job_released_again_and_again_stops_and_fails(db: TestDb) {
    let ledger = db.ledger();
    let id = ledger
        .admit(maintain_job("always-outlives-grace"))
        .await
        .unwrap()
        .into_job()
        .id;
    let mut runs = 0;
    while let Some(claimed) = claim_one(&ledger, "w").await {
        runs += 1;
        assert!(runs <= 10, "released jobs must not run forever");
        ledger.release(&claimed.lease).await.unwrap().unwrap();
    }
    assert_eq!(runs, MAX_ATTEMPTS + MAX_RETURNED_RELEASES);
    let job = ledger.get(&id).await.unwrap();
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.attempts, MAX_ATTEMPTS);
    assert!(
        job.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("grace period"),
        "{job:?}"
    );
    assert!(job.finished_at.is_some());
    let releases = ledger
        .events(&id)
        .await
        .unwrap()
        .into_iter()
        .filter(|event| event.event == "released")
        .count();
    assert_eq!(releases as i64, runs);
}

async fn an_unreadable_row_fails_alone_and_the_claim_goes_on(db: TestDb) {
    let ledger = db.ledger();
    let mut ids = Vec::new();
    for key in ["good-1", "bad", "good-2"] {
        ids.push(ledger.admit(maintain_job(key)).await.unwrap().into_job().id);
    }
    zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "UPDATE learning_job SET payload = '{not json' WHERE id = $1"
    )
    .bind(&ids[1])
    .execute(pool)
    .await
    .map(|d| d.rows_affected()))
    .unwrap();
    let kinds = [JobKind::Maintain];
    let batch = ledger
        .claim(&request("w1", &kinds, 3), &AllowAll)
        .await
        .expect("one bad row does not fail the claim");
    let mut claimed: Vec<_> = batch.claimed.iter().map(|c| c.job.id.clone()).collect();
    claimed.sort();
    let mut good = vec![ids[0].clone(), ids[2].clone()];
    good.sort();
    assert_eq!(claimed, good);
    assert_eq!(batch.quarantined.len(), 1);
    assert_eq!(batch.quarantined[0].job_id, ids[1]);
    let bad = ledger.get(&ids[1]).await;
    // The row stays unreadable; its state is what matters.
    let (state, error): (String, Option<String>) =
        zuno_shared::on_db!(db.db, |pool| sqlx::query_as(
            "SELECT state, last_error FROM learning_job WHERE id = $1"
        )
        .bind(&ids[1])
        .fetch_one(pool)
        .await)
        .unwrap();
    assert!(bad.is_err());
    assert_eq!(state, "failed");
    assert!(error.unwrap().contains("cannot be read"));
    assert!(
        claim_one(&ledger, "w1").await.is_none(),
        "nothing left to claim"
    );
}

/// A gate that asks the database to parse each job's input digest as JSON: a corrupted digest
/// makes the gate's statement fail (which, on Postgres, aborts the claim transaction).
struct ParsesDigestInTheDatabase;

#[async_trait::async_trait]
impl ClaimGate for ParsesDigestInTheDatabase {
    async fn check(
        &self,
        tx: &mut Tx,
        job: &Job,
    ) -> Result<GateDecision, zuno_shared::db::StoreError> {
        let sql = match tx.backend() {
            zuno_shared::db::Backend::Postgres => {
                "SELECT CAST(CAST(input_digest AS jsonb) ->> 'n' AS BIGINT) FROM learning_job WHERE id = $1"
            }
            zuno_shared::db::Backend::Sqlite => {
                "SELECT CAST(json_extract(input_digest, '$.n') AS INTEGER) FROM learning_job WHERE id = $1"
            }
        };
        let _: Option<i64> = zuno_shared::on_tx!(tx, |conn| sqlx::query_scalar(sql)
            .bind(&job.id)
            .fetch_one(conn)
            .await)?;
        Ok(GateDecision::Proceed)
    }
}

async fn a_gate_failing_on_one_job_fails_that_job_and_the_claim_goes_on(db: TestDb) {
    let ledger = db.ledger();
    let mut ids = Vec::new();
    for n in 1..=3 {
        let key = format!("{{\"n\":{n}}}");
        ids.push(
            ledger
                .admit(maintain_job(&key))
                .await
                .unwrap()
                .into_job()
                .id,
        );
    }
    zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "UPDATE learning_job SET input_digest = 'corrupted' WHERE id = $1"
    )
    .bind(&ids[1])
    .execute(pool)
    .await
    .map(|d| d.rows_affected()))
    .unwrap();
    let kinds = [JobKind::Maintain];
    let batch = ledger
        .claim(&request("w1", &kinds, 3), &ParsesDigestInTheDatabase)
        .await
        .expect("a gate failure on one job does not fail the claim");
    let mut claimed: Vec<_> = batch.claimed.iter().map(|c| c.job.id.clone()).collect();
    claimed.sort();
    let mut good = vec![ids[0].clone(), ids[2].clone()];
    good.sort();
    assert_eq!(claimed, good, "{batch:?}");
    assert_eq!(batch.quarantined.len(), 1);
    let bad = ledger.get(&ids[1]).await.unwrap();
    assert_eq!(bad.state, JobState::Failed);
    assert_eq!(bad.attempts, 0);
    assert!(
        bad.last_error.unwrap().contains("claim gate failed"),
        "the reason is kept"
    );
    for claimed in batch.claimed {
        assert_eq!(
            ledger.get(&claimed.job.id).await.unwrap().state,
            JobState::Running
        );
    }
}

/// Retry scheduling, release and rescue wake waiting workers of other processes (Postgres
/// `NOTIFY`, received by a listener on a separate pool) and of this one (the wake bus).
async fn retries_releases_and_rescues_wake_waiting_workers(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    let (waiting, listener) = match db.backend {
        zuno_shared::db::Backend::Postgres => {
            let other = db.reopen().await;
            let listener = zuno_shared::runtime::wake::start_pg_listener(
                &other,
                tokio_util::sync::CancellationToken::new(),
            )
            .await
            .unwrap();
            (other, listener)
        }
        zuno_shared::db::Backend::Sqlite => (db.db.clone(), None),
    };
    let mut wake = waiting.wake_bus().subscribe();
    wake.borrow_and_update();
    // One transaction, one notification: once it has arrived the bus is quiet.
    ledger
        .admit_batch(["retry", "release", "rescue"].map(maintain_job).to_vec())
        .await
        .unwrap();
    expect_wake(&mut wake, "an admission").await;
    let first = claim_one(&ledger, "w").await.unwrap();
    ledger
        .begin_settlement(&first.lease)
        .await
        .unwrap()
        .retry("try again", None)
        .await
        .unwrap();
    expect_wake(&mut wake, "a retry").await;

    let second = claim_one(&ledger, "w").await.unwrap();
    ledger.release(&second.lease).await.unwrap().unwrap();
    expect_wake(&mut wake, "a release").await;

    claim_one(&ledger, "w").await.unwrap();
    claim_one(&ledger, "w").await.unwrap();
    assert!(!wake.has_changed().unwrap(), "claims wake nobody");
    clock.advance(LEASE_MS + 2000);
    let kinds = [JobKind::Extract];
    let batch = ledger
        .claim(&request("other-kind", &kinds, 1), &AllowAll)
        .await
        .unwrap();
    assert_eq!(batch.rescued.len(), 2, "{batch:?}");
    expect_wake(&mut wake, "a rescue").await;
    drop(listener);
}

/// SQLite has no NOTIFY: a handle with the commit watcher (another pool on the same file, which
/// SQLite cannot tell from another process) is woken by an admission and by a retry made through
/// a different handle, and a claim that finds nothing commits no change, so idle workers do not
/// wake each other.
#[tokio::test]
async fn sqlite_commits_of_another_process_wake_the_watching_handle() {
    let db = TestDb::sqlite().await;
    let watching = db.reopen().await;
    let cancel = tokio_util::sync::CancellationToken::new();
    let watcher = zuno_shared::runtime::wake::start_sqlite_watcher(&watching, cancel.clone())
        .await
        .unwrap()
        .expect("a SQLite handle is watched");
    let mut wake = watching.wake_bus().subscribe();
    wake.borrow_and_update();
    let (ledger, _clock) = db.manual_ledger();
    ledger.admit(maintain_job("watched")).await.unwrap();
    expect_wake(&mut wake, "an admission by another handle").await;

    let claimed = claim_one(&ledger, "w").await.unwrap();
    wake.borrow_and_update();
    ledger
        .begin_settlement(&claimed.lease)
        .await
        .unwrap()
        .retry("try again", None)
        .await
        .unwrap();
    expect_wake(&mut wake, "a retry by another handle").await;

    // The counter is per connection: read it twice on one.
    let mut observer = watching.as_sqlite().unwrap().acquire().await.unwrap();
    let version_query = "PRAGMA data_version";
    let before: i64 = sqlx::query_scalar(version_query)
        .fetch_one(&mut *observer)
        .await
        .unwrap();
    let kinds = [JobKind::Extract];
    let empty = ledger
        .claim(&request("idle", &kinds, 2), &AllowAll)
        .await
        .unwrap();
    assert!(empty.claimed.is_empty());
    let after: i64 = sqlx::query_scalar(version_query)
        .fetch_one(&mut *observer)
        .await
        .unwrap();
    assert_eq!(after, before, "an empty claim commits no change");
    cancel.cancel();
    watcher.await.unwrap();
}

async fn expect_wake(wake: &mut tokio::sync::watch::Receiver<u64>, what: &str) {
    tokio::time::timeout(std::time::Duration::from_secs(10), wake.changed())
        .await
        .unwrap_or_else(|_| panic!("no wake-up after {what}"))
        .unwrap();
    wake.borrow_and_update();
}

/// An idle claim says when the next job is due, so a worker sleeps until then, not a poll.
async fn an_idle_claim_reports_when_the_next_job_is_due(db: TestDb) {
    let (ledger, clock) = db.manual_ledger();
    let kinds = [JobKind::Maintain];
    let empty = ledger
        .claim(&request("w", &kinds, 2), &AllowAll)
        .await
        .unwrap();
    assert_eq!(empty.next_due_in_ms, None, "nothing pending");
    ledger
        .admit(maintain_job("later").due_at(clock.now() + 7_000))
        .await
        .unwrap();
    let batch = ledger
        .claim(&request("w", &kinds, 2), &AllowAll)
        .await
        .unwrap();
    assert!(batch.claimed.is_empty());
    assert_eq!(batch.next_due_in_ms, Some(7_000));
}

async fn revoking_a_source_fences_its_running_job(db: TestDb) {
    let ledger = db.ledger();
    let old = NewJob::new(
        JobIdentity::extract("p", "s1", "m1", "v1", Some("digest-a")),
        JobOrigin::Manual,
    );
    ledger.admit(old).await.unwrap();
    let kinds = [JobKind::Extract];
    let claimed = ledger
        .claim(&request("w1", &kinds, 1), &AllowAll)
        .await
        .unwrap()
        .claimed
        .pop()
        .unwrap();
    let mut tx = ledger.db().begin().await.unwrap();
    let new = NewJob::new(
        JobIdentity::extract("p", "s1", "m1", "v1", Some("digest-b")),
        JobOrigin::Manual,
    );
    let newer = ledger.admit_in(&mut tx, new).await.unwrap().into_job();
    let revoked = ledger
        .revoke_source_jobs_in(&mut tx, "s1", "m1", &newer.id, "superseded")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(revoked, vec![claimed.job.id.clone()]);
    assert!(matches!(
        ledger
            .begin_settlement(&claimed.lease)
            .await
            .unwrap()
            .complete(serde_json::json!({}))
            .await,
        Err(LedgerError::LeaseLost { .. })
    ));
    assert_eq!(
        ledger.get(&claimed.job.id).await.unwrap().state,
        JobState::Skipped
    );
    assert_eq!(ledger.get(&newer.id).await.unwrap().state, JobState::Queued);
}

async fn admission_wakes_local_workers_only_after_commit(db: TestDb) {
    let ledger = db.ledger();
    let mut wake = db.db.wake_bus().subscribe();
    wake.borrow_and_update();
    let mut tx = ledger.db().begin().await.unwrap();
    ledger
        .admit_in(&mut tx, maintain_job("wake"))
        .await
        .unwrap();
    assert!(!wake.has_changed().unwrap(), "no wake before commit");
    tx.commit().await.unwrap();
    assert!(wake.has_changed().unwrap(), "wake after commit");
    // Duplicates do not wake anyone.
    wake.borrow_and_update();
    ledger.admit(maintain_job("wake")).await.unwrap();
    assert!(!wake.has_changed().unwrap());
}

async fn claims_only_take_requested_kinds_and_scopes(db: TestDb) {
    let ledger = db.ledger();
    ledger
        .admit(maintain_job("k1").with_claim_scope("/repo-a/.zuno/RULES.md"))
        .await
        .unwrap();
    let extract = NewJob::new(
        JobIdentity::extract("p", "s", "m", "v", None),
        JobOrigin::ClosedTurn,
    );
    ledger.admit(extract).await.unwrap();
    let kinds = [JobKind::Maintain];
    let other_scope = vec![String::from("/repo-b/.zuno/RULES.md")];
    let batch = ledger
        .claim(
            &ClaimRequest {
                scopes: Some(&other_scope),
                ..request("w", &kinds, 5)
            },
            &AllowAll,
        )
        .await
        .unwrap();
    assert!(
        batch.claimed.is_empty(),
        "a job bound to another memory path is not claimed"
    );
    let own_scope = vec![String::from("/repo-a/.zuno/RULES.md")];
    let batch = ledger
        .claim(
            &ClaimRequest {
                scopes: Some(&own_scope),
                ..request("w", &kinds, 5)
            },
            &AllowAll,
        )
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 1);
    assert_eq!(batch.claimed[0].job.kind, JobKind::Maintain);
}

/// Defers a job while another of its kind and project runs, as the maintenance gate does.
struct DefersBesideARun {
    until: i64,
}

#[async_trait::async_trait]
impl ClaimGate for DefersBesideARun {
    async fn check(
        &self,
        tx: &mut Tx,
        job: &Job,
    ) -> Result<GateDecision, zuno_shared::db::StoreError> {
        if zuno_shared::ledger::another_run_in(tx, job).await? {
            return Ok(GateDecision::Defer {
                until: self.until,
                reason: "another run".into(),
            });
        }
        Ok(GateDecision::Proceed)
    }
}

/// A settled one-at-a-time run makes the jobs it held back due at once, whether it settles
/// alone or inside its handler's transaction; a job of another project stays deferred.
async fn a_settled_run_releases_the_jobs_it_held_back(db: TestDb) {
    let ledger = db.ledger();
    let kinds = [JobKind::Maintain];
    let gate = DefersBesideARun {
        until: ledger.now_ms() + 3_600_000,
    };
    ledger.admit(maintain_job("first")).await.unwrap();
    let first = claim_one(&ledger, "w1").await.expect("the first run");
    let held = ledger
        .admit(maintain_job("held"))
        .await
        .unwrap()
        .into_job()
        .id;
    let elsewhere = NewJob::new(
        JobIdentity::maintain("other", "/mem/other", "elsewhere"),
        JobOrigin::Explicit,
    );
    let elsewhere = ledger.admit(elsewhere).await.unwrap().into_job().id;
    let batch = ledger
        .claim(&request("w2", &kinds, 2), &gate)
        .await
        .unwrap();
    assert_eq!(batch.deferred, 1, "the same project's job waits");
    assert_eq!(batch.claimed.len(), 1, "another project's job runs");
    assert_eq!(batch.claimed[0].job.id, elsewhere);
    let deferred_until = ledger.get(&held).await.unwrap().run_at;
    assert!(deferred_until > ledger.now_ms());

    // Settled alone (the handler wrote nothing transactional).
    let settlement = ledger.begin_settlement(&first.lease).await.unwrap();
    settlement.complete(serde_json::json!({})).await.unwrap();
    let released = ledger.get(&held).await.unwrap();
    assert_eq!(released.state, JobState::Queued);
    assert!(released.run_at <= ledger.now_ms(), "held job due at once");
    let second = ledger
        .claim(&request("w3", &kinds, 1), &gate)
        .await
        .unwrap();
    assert_eq!(second.claimed.len(), 1);
    assert_eq!(second.claimed[0].job.id, held);

    // Settled inside the handler's transaction: the same release commits with it.
    let later = ledger
        .admit(maintain_job("later"))
        .await
        .unwrap()
        .into_job()
        .id;
    let batch = ledger
        .claim(&request("w4", &kinds, 1), &gate)
        .await
        .unwrap();
    assert_eq!(batch.deferred, 1);
    let mut settlement = ledger
        .begin_settlement(&second.claimed[0].lease)
        .await
        .unwrap();
    settlement.tx().await.unwrap();
    settlement.complete(serde_json::json!({})).await.unwrap();
    assert!(ledger.get(&later).await.unwrap().run_at <= ledger.now_ms());
}

on_both_backends!(
    admission_is_idempotent_whatever_the_state,
    concurrent_admissions_of_one_identity_leave_one_row,
    claim_hands_out_at_most_the_wake_limit_with_fresh_leases,
    concurrent_claimers_never_share_a_job,
    heartbeats_extend_the_lease,
    an_expired_lease_is_reclaimed_and_the_old_holder_is_fenced,
    settlement_writes_commit_with_the_state_or_not_at_all,
    attempts_are_capped_at_three_by_the_schema,
    a_job_failing_three_times_settles_failed_with_its_last_error,
    a_worker_that_keeps_dying_still_reaches_the_ceiling,
    a_permanent_failure_fails_at_once,
    a_gate_skip_settles_skipped_without_spending_an_attempt,
    a_gate_hands_what_it_read_to_the_claimed_job,
    closed_turns_are_claimed_before_legacy_backlog,
    one_interval_bucket_creates_one_job_across_hosts,
    a_release_returns_the_attempt_only_once,
    a_job_released_again_and_again_stops_and_fails,
    an_unreadable_row_fails_alone_and_the_claim_goes_on,
    a_gate_failing_on_one_job_fails_that_job_and_the_claim_goes_on,
    retries_releases_and_rescues_wake_waiting_workers,
    an_idle_claim_reports_when_the_next_job_is_due,
    revoking_a_source_fences_its_running_job,
    admission_wakes_local_workers_only_after_commit,
    claims_only_take_requested_kinds_and_scopes,
    a_settled_run_releases_the_jobs_it_held_back,
);
