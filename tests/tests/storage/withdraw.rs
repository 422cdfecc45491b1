//! Skipping, revoking and pruning are ledger operations: each changes the rows it names inside
//! the owner's transaction, leaves one audit event per job and counts a metric. Each nextest
//! test is its own process, so the meter provider installed here sees this test's counts alone.

use zuno_shared::ledger::{
    AllowAll, ClaimRequest, ClaimedJob, JobIdentity, JobKind, JobOrigin, JobScope, JobState,
    Ledger, LedgerError, NewJob, QueuedJobs,
};
use zuno_shared::telemetry::{self, TelemetryConfig, TelemetryGuard};
use zuno_tests::{TestDb, on_both_backends};

fn metrics() -> TelemetryGuard {
    telemetry::init(&TelemetryConfig {
        service_name: String::from("zuno-withdraw-test"),
        ..TelemetryConfig::default()
    })
    .expect("install telemetry")
}

/// The value of counter `name` for job kind `kind`, as `/metrics` would show it.
fn counter(guard: &TelemetryGuard, name: &str, kind: JobKind) -> String {
    let text = telemetry::render_prometheus(guard.registry());
    let label = format!("kind=\"{}\"", kind.as_str());
    text.lines()
        .find(|line| line.starts_with(name) && line.contains(&label))
        .and_then(|line| line.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no {name} for {label} in:\n{text}"))
        .to_owned()
}

async fn admit(ledger: &Ledger, identity: JobIdentity, origin: JobOrigin) -> String {
    ledger
        .admit(NewJob::new(identity, origin))
        .await
        .unwrap()
        .into_job()
        .id
}

/// Claims one maintain job (of those queued) for worker `w1`.
async fn claim_one_maintain(ledger: &Ledger) -> ClaimedJob {
    let kinds = [JobKind::Maintain];
    let request = ClaimRequest {
        worker_id: "w1",
        kinds: &kinds,
        limit: 1,
        lease_ms: 10_000,
        scopes: None,
    };
    let mut claimed = ledger.claim(&request, &AllowAll).await.unwrap().claimed;
    assert_eq!(claimed.len(), 1);
    claimed.pop().unwrap()
}

async fn events(ledger: &Ledger, job_id: &str) -> Vec<(String, Option<String>)> {
    ledger
        .events(job_id)
        .await
        .unwrap()
        .into_iter()
        .map(|event| (event.event, event.detail))
        .collect()
}

async fn skipping_queued_automatic_jobs_records_events_and_metrics(db: TestDb) {
    let guard = metrics();
    let ledger = db.ledger();
    let automatic = admit(
        &ledger,
        JobIdentity::extract("p", "s1", "m1", "v1", None),
        JobOrigin::ClosedTurn,
    )
    .await;
    let by_hand = admit(
        &ledger,
        JobIdentity::extract("p", "s1", "m2", "v1", None),
        JobOrigin::Manual,
    )
    .await;
    let other_session = admit(
        &ledger,
        JobIdentity::extract("p", "s2", "m3", "v1", None),
        JobOrigin::ClosedTurn,
    )
    .await;
    let mut tx = db.db.begin().await.unwrap();
    let selection = QueuedJobs {
        kind: JobKind::Extract,
        scope: JobScope::Session("s1"),
        origins: &[JobOrigin::ClosedTurn, JobOrigin::Legacy],
    };
    let skipped = ledger
        .skip_queued_in(&mut tx, selection, "the session was excluded")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(skipped, vec![automatic.clone()]);
    let job = ledger.get(&automatic).await.unwrap();
    assert_eq!(job.state, JobState::Skipped);
    assert!(job.finished_at.is_some());
    assert_eq!(
        events(&ledger, &automatic).await,
        vec![(
            "skipped".to_owned(),
            Some("the session was excluded".to_owned())
        )]
    );
    for untouched in [&by_hand, &other_session] {
        assert_eq!(ledger.get(untouched).await.unwrap().state, JobState::Queued);
        assert!(events(&ledger, untouched).await.is_empty());
    }
    assert_eq!(counter(&guard, "zuno_jobs_skipped", JobKind::Extract), "1");
}

async fn pruning_a_project_deletes_its_jobs_with_events_and_metrics(db: TestDb) {
    let guard = metrics();
    let ledger = db.ledger();
    let queued = admit(
        &ledger,
        JobIdentity::maintain("p", "/memory", "a"),
        JobOrigin::Explicit,
    )
    .await;
    let running = admit(
        &ledger,
        JobIdentity::maintain("p", "/memory", "b"),
        JobOrigin::Explicit,
    )
    .await;
    let kept = admit(
        &ledger,
        JobIdentity::maintain("other", "/memory", "c"),
        JobOrigin::Explicit,
    )
    .await;
    let claimed = claim_one_maintain(&ledger).await;

    let mut tx = db.db.begin().await.unwrap();
    let pruned = ledger
        .prune_in(&mut tx, JobScope::Project("p"), "its project was deleted")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(pruned, 2);
    for gone in [&queued, &running] {
        assert!(matches!(
            ledger.get(gone).await,
            Err(LedgerError::NotFound(_))
        ));
        assert_eq!(
            events(&ledger, gone).await,
            vec![(
                "pruned".to_owned(),
                Some("its project was deleted".to_owned())
            )]
        );
    }
    assert_eq!(ledger.get(&kept).await.unwrap().state, JobState::Queued);
    // The worker that held a pruned job learns it lost the lease: nothing it writes commits.
    let settlement = ledger.begin_settlement(&claimed.lease).await.unwrap();
    assert!(matches!(
        settlement.complete(serde_json::json!({})).await,
        Err(LedgerError::LeaseLost { .. })
    ));
    assert_eq!(counter(&guard, "zuno_jobs_pruned", JobKind::Maintain), "2");
}

async fn pruning_a_session_leaves_other_sessions_jobs(db: TestDb) {
    let guard = metrics();
    let ledger = db.ledger();
    let gone = admit(
        &ledger,
        JobIdentity::extract("p", "s1", "m1", "v1", None),
        JobOrigin::ClosedTurn,
    )
    .await;
    let kept = admit(
        &ledger,
        JobIdentity::extract("p", "s2", "m2", "v1", None),
        JobOrigin::ClosedTurn,
    )
    .await;
    let mut tx = db.db.begin().await.unwrap();
    let pruned = ledger
        .prune_in(&mut tx, JobScope::Session("s1"), "its session was deleted")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(pruned, 1);
    assert!(ledger.get(&gone).await.is_err());
    assert_eq!(events(&ledger, &gone).await.len(), 1);
    assert_eq!(ledger.get(&kept).await.unwrap().state, JobState::Queued);
    assert_eq!(counter(&guard, "zuno_jobs_pruned", JobKind::Extract), "1");
}

async fn revoking_a_source_records_events_and_metrics(db: TestDb) {
    let guard = metrics();
    let ledger = db.ledger();
    let older = admit(
        &ledger,
        JobIdentity::extract("p", "s1", "m1", "v1", Some("digest-a")),
        JobOrigin::Manual,
    )
    .await;
    let mut tx = db.db.begin().await.unwrap();
    let newer = NewJob::new(
        JobIdentity::extract("p", "s1", "m1", "v1", Some("digest-b")),
        JobOrigin::Manual,
    );
    let newer = ledger.admit_in(&mut tx, newer).await.unwrap().into_job();
    let revoked = ledger
        .revoke_source_jobs_in(&mut tx, "s1", "m1", &newer.id, "superseded")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(revoked, vec![older.clone()]);
    assert_eq!(ledger.get(&older).await.unwrap().state, JobState::Skipped);
    assert_eq!(
        events(&ledger, &older).await,
        vec![("revoked".to_owned(), Some("superseded".to_owned()))]
    );
    assert_eq!(counter(&guard, "zuno_jobs_revoked", JobKind::Extract), "1");
}

/// `revoke_in` takes one queued or running job out: `skipped`, a `revoked` event, the metric;
/// its holder's heartbeat and settlement are refused; a job already settled stays as it was.
async fn revoking_one_job_fences_its_holder(db: TestDb) {
    let guard = metrics();
    let ledger = db.ledger();
    let queued = admit(
        &ledger,
        JobIdentity::maintain("p", "/memory", "queued"),
        JobOrigin::Explicit,
    )
    .await;
    let other = admit(
        &ledger,
        JobIdentity::maintain("p", "/memory", "other"),
        JobOrigin::Explicit,
    )
    .await;
    let holder = claim_one_maintain(&ledger).await;
    // The job not claimed stays queued.
    let queued = if holder.job.id == queued {
        other
    } else {
        queued
    };

    let mut tx = db.db.begin().await.unwrap();
    assert!(
        ledger
            .revoke_in(&mut tx, &holder.job.id, "withdrawn")
            .await
            .unwrap()
    );
    assert!(
        ledger
            .revoke_in(&mut tx, &queued, "withdrawn")
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    for job in [&holder.job.id, &queued] {
        let job_row = ledger.get(job).await.unwrap();
        assert_eq!(job_row.state, JobState::Skipped);
        assert_eq!(job_row.lease_expires_at, None);
        assert_eq!(
            events(&ledger, job).await.last().cloned(),
            Some(("revoked".to_owned(), Some("withdrawn".to_owned())))
        );
    }
    assert_eq!(counter(&guard, "zuno_jobs_revoked", JobKind::Maintain), "2");
    let heartbeat = ledger.heartbeat(&holder.lease, 10_000, &AllowAll).await;
    assert!(matches!(heartbeat, Err(LedgerError::LeaseLost { .. })));
    let settled = ledger
        .begin_settlement(&holder.lease)
        .await
        .unwrap()
        .complete(serde_json::json!({}))
        .await;
    assert!(matches!(settled, Err(LedgerError::LeaseLost { .. })));

    // A settled job is not revoked again: no second event, no count.
    let mut tx = db.db.begin().await.unwrap();
    assert!(!ledger.revoke_in(&mut tx, &queued, "again").await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(ledger.get(&queued).await.unwrap().state, JobState::Skipped);
    assert_eq!(counter(&guard, "zuno_jobs_revoked", JobKind::Maintain), "2");
}

on_both_backends!(
    revoking_one_job_fences_its_holder,
    skipping_queued_automatic_jobs_records_events_and_metrics,
    pruning_a_project_deletes_its_jobs_with_events_and_metrics,
    pruning_a_session_leaves_other_sessions_jobs,
    revoking_a_source_records_events_and_metrics,
);
