//! Manual commands, unresolved-issue enforcement, forgetting, history repair and catch-up.

use zuno_shared::config::Config;
use zuno_shared::learning::experience::ExperienceOrigin;
use zuno_shared::learning::feedback::FeedbackValue;
use zuno_shared::learning::{ManualError, ReflectScope};
use zuno_shared::ledger::{Admission, JobIdentity, JobOrigin, JobState, NewJob};
use zuno_shared::transcript::{MessageStatus, NewMessage, Role};
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{World, text};

async fn reprocess_returns_the_existing_job_unchanged(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    let turn = world.corrected_turn(&session).await;
    world.run_extract().await;
    let message = turn.message.id;
    let first = world
        .ledger
        .get(&turn.admission.unwrap().job().id)
        .await
        .unwrap();
    assert_eq!(first.state, JobState::Completed);
    let again = world
        .ingestion
        .reprocess("proj", &message, None)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(&again, Admission::Existing(job)
            if job.id == first.id && job.state == JobState::Completed && job.attempts == 1));
    let wrong = world
        .ingestion
        .reprocess("proj", "exp_not_a_message", None)
        .await
        .unwrap();
    assert!(matches!(wrong, Err(ManualError::NotFound(_))));
    let other_project = world
        .ingestion
        .reprocess("elsewhere", &message, None)
        .await
        .unwrap();
    assert!(
        matches!(other_project, Err(ManualError::NotFound(_))),
        "a project cannot reprocess another's message"
    );
}

async fn reflection_is_keyed_by_its_exact_input_and_revokes_older_input(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    let turn = world.corrected_turn(&session).await;
    let automatic = turn.admission.unwrap().job().id.clone();
    let first = world
        .ingestion
        .reflect(&session, ReflectScope::Turn, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.admission.outcome(), "queued");
    assert_eq!(
        first.revoked,
        std::slice::from_ref(&automatic),
        "the new explicit input revokes the older queued extraction"
    );
    let same = world
        .ingestion
        .reflect(&session, ReflectScope::Turn, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        same.admission.outcome(),
        "existing",
        "identical input stays idempotent"
    );
    // New feedback changes the input: a new job for the turn as it now reads.
    let (_, feedback) = world
        .ingestion
        .set_feedback(&turn.message.id, FeedbackValue::Positive, None, 0, None)
        .await
        .unwrap()
        .unwrap();
    let with_feedback = feedback.admission.expect("feedback admits the new input");
    assert_eq!(with_feedback.outcome(), "queued");
    assert_ne!(with_feedback.job().id, first.admission.job().id);
    // A session reflection over the same (one-turn) input is that job.
    let widened = world
        .ingestion
        .reflect(&session, ReflectScope::Session, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(widened.admission.outcome(), "existing");
    assert_eq!(widened.admission.job().id, with_feedback.job().id);
    assert_eq!(
        world.ledger.get(&automatic).await.unwrap().state,
        JobState::Skipped
    );
    world.run_extract().await;
    // The earlier explicit input no longer matches the turn: skipped, never run on stale input.
    assert_eq!(
        world
            .ledger
            .get(&first.admission.job().id)
            .await
            .unwrap()
            .state,
        JobState::Skipped
    );
    assert_eq!(
        world
            .ledger
            .get(&with_feedback.job().id)
            .await
            .unwrap()
            .state,
        JobState::Completed
    );
}

async fn unresolved_issues_never_become_memory_hints(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let issue = world
        .ingestion
        .record(
            "proj",
            None,
            ExperienceOrigin::Issue,
            "The integration test flakes on CI",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(issue.kind.as_str(), "unresolved_issue");
    let job = world
        .ledger
        .admit(NewJob::new(
            JobIdentity::maintain("proj", "/m", "x"),
            JobOrigin::Explicit,
        ))
        .await
        .unwrap()
        .into_job();
    let sql = "INSERT INTO memory_hint (job_id, ordinal, experience_id, experience_kind, project_id, target, action, content, reason, confidence, created_at) \
               VALUES ($1, 0, $2, $3, 'proj', 'project', 'add', 'x', 'r', 0.9, 0)";
    let direct = zuno_shared::on_db!(world.db.db, |pool| sqlx::query(sql)
        .bind(&job.id)
        .bind(&issue.id)
        .bind("unresolved_issue")
        .execute(pool)
        .await
        .map(|d| d.rows_affected()));
    assert!(
        direct.is_err(),
        "the schema refuses a hint on an unresolved issue"
    );
    let disguised = zuno_shared::on_db!(world.db.db, |pool| sqlx::query(sql)
        .bind(&job.id)
        .bind(&issue.id)
        .bind("correction")
        .execute(pool)
        .await
        .map(|d| d.rows_affected()));
    assert!(
        disguised.is_err(),
        "the hint must carry the experience's real kind"
    );
    // A hint on a correction, whose experience later becomes an unresolved issue: refused too.
    let remembered = world
        .ingestion
        .record("proj", None, ExperienceOrigin::Remember, "Use pnpm")
        .await
        .unwrap()
        .unwrap();
    zuno_shared::on_db!(world.db.db, |pool| sqlx::query(sql)
        .bind(&job.id)
        .bind(&remembered.id)
        .bind("feedback")
        .execute(pool)
        .await
        .map(|d| d.rows_affected()))
    .unwrap();
    let flipped = zuno_shared::on_db!(world.db.db, |pool| sqlx::query(
        "UPDATE experience_record SET kind = 'unresolved_issue' WHERE id = $1"
    )
    .bind(&remembered.id)
    .execute(pool)
    .await
    .map(|d| d.rows_affected()));
    assert!(flipped.is_err());
    // Solving the issue makes it a problem with a resolution.
    let solved = world
        .ingestion
        .solve(&issue.id, "Pin the test database port")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (solved.kind.as_str(), solved.resolution.as_deref()),
        ("problem", Some("Pin the test database port"))
    );
    assert!(matches!(
        world.ingestion.solve(&remembered.id, "x").await.unwrap(),
        Err(ManualError::Conflict(_))
    ));
}

async fn forgotten_evidence_cannot_be_readmitted(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    world.run_extract().await;
    let experience_id: String = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT id FROM experience_record"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    let (forgotten, _) = world
        .ingestion
        .forget(&experience_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(forgotten.status.as_str(), "forgotten");
    let reflect = world
        .ingestion
        .reflect(&session, ReflectScope::Turn, None)
        .await
        .unwrap();
    assert!(
        matches!(reflect, Err(ManualError::Refused(ref reason)) if reason.contains("forgotten")),
        "{reflect:?}"
    );
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM forgotten_source").await,
        1
    );
}

async fn remember_is_explicit_verified_user_evidence(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let remembered = world
        .ingestion
        .record(
            "proj",
            None,
            ExperienceOrigin::Remember,
            "Always run cargo fmt before committing",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (remembered.verification.as_str(), remembered.origin.as_str()),
        ("verified", "remember")
    );
    assert_eq!(
        remembered.evidence[0].address.as_deref(),
        Some("command:remember")
    );
    let bad = world
        .ingestion
        .record("proj", None, ExperienceOrigin::Remember, "hidden \u{E0041}")
        .await
        .unwrap();
    assert!(matches!(bad, Err(ManualError::Invalid { .. })));
    let empty = world
        .ingestion
        .record("proj", None, ExperienceOrigin::Remember, "   ")
        .await
        .unwrap();
    assert!(matches!(empty, Err(ManualError::Invalid { .. })));
}

async fn history_repair_previews_then_queues_once(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    let turn = world.corrected_turn(&session).await;
    // Pretend the turn was extracted by an older extractor that failed.
    let current = turn.admission.unwrap().job().id.clone();
    zuno_shared::on_db!(world.db.db, |pool| sqlx::query("UPDATE learning_job SET extractor_version = 'rules-0', identity_key = identity_key || '-old', state = 'failed', last_error = 'HTTP 400 old' WHERE id = $1")
        .bind(&current).execute(pool).await.map(|d| d.rows_affected())).unwrap();
    let before = world.scalar("SELECT COUNT(*) FROM learning_job").await;
    let preview = world.ingestion.repair_history("proj", true).await.unwrap();
    assert!(preview.dry_run);
    assert_eq!(
        (preview.examined, preview.would_queue, preview.queued),
        (1, 1, 0),
        "{preview:?}"
    );
    assert_eq!(preview.actions[0].action, "would_queue");
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM learning_job").await,
        before,
        "a dry run changes nothing"
    );
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM learning_repair").await,
        0
    );
    let applied = world.ingestion.repair_history("proj", false).await.unwrap();
    assert_eq!((applied.examined, applied.queued), (1, 1), "{applied:?}");
    let old = world.ledger.get(&current).await.unwrap();
    assert_eq!(
        old.last_error.as_deref(),
        Some("HTTP 400 old"),
        "old failures are preserved"
    );
    let again = world.ingestion.repair_history("proj", false).await.unwrap();
    assert_eq!(
        again.examined, 0,
        "a repaired job is not processed on every scan"
    );
    assert!(!again.has_more);
}

async fn catch_up_admits_missed_recent_turns(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    // A turn stored without admission (e.g. written while the server was down).
    let mut tx = world.db.db.begin().await.unwrap();
    let store = world.ingestion.store();
    store
        .append_message_in(
            &mut tx,
            &session,
            &NewMessage {
                id: None,
                role: Role::User,
                status: None,
                parts: vec![text("No, use the staging database instead.")],
                created_at: None,
            },
        )
        .await
        .unwrap();
    store
        .append_message_in(
            &mut tx,
            &session,
            &NewMessage {
                id: None,
                role: Role::Assistant,
                status: Some(MessageStatus::Completed),
                parts: vec![text("Switched to staging.")],
                created_at: None,
            },
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(world.scalar("SELECT COUNT(*) FROM learning_job").await, 0);
    let outcomes = world.ingestion.catch_up().await.unwrap();
    assert_eq!(outcomes.len(), 1);
    assert_eq!(world.scalar("SELECT COUNT(*) FROM learning_job").await, 1);
    assert!(
        world.ingestion.catch_up().await.unwrap().is_empty(),
        "nothing missed the second time"
    );
}

/// Stores a completed turn without admitting anything (as if no server ran); returns the
/// assistant message's id.
async fn stored_turn(world: &World, session: &str, user: &str, assistant: &str) -> String {
    let mut tx = world.db.db.begin().await.unwrap();
    let store = world.ingestion.store();
    for (role, status, body) in [
        (Role::User, None, user),
        (Role::Assistant, Some(MessageStatus::Completed), assistant),
    ] {
        let message = store
            .append_message_in(
                &mut tx,
                session,
                &NewMessage {
                    id: None,
                    role,
                    status,
                    parts: vec![text(body)],
                    created_at: None,
                },
            )
            .await
            .unwrap();
        if role == Role::Assistant {
            tx.commit().await.unwrap();
            return message.id;
        }
    }
    unreachable!("the loop returns after the assistant message")
}

async fn catch_up_moves_past_ineligible_turns_to_older_eligible_ones(db: TestDb) {
    use zuno_shared::learning::CATCH_UP_LIMIT;
    let world = World::new(db, Config::default()).await;
    let older = world.session().await;
    let mut eligible = Vec::new();
    for _ in 0..3 {
        eligible.push(
            stored_turn(
                &world,
                &older,
                "No, use the staging database instead.",
                "Switched to staging.",
            )
            .await,
        );
    }
    // Completed an hour before everything else.
    for id in &eligible {
        zuno_shared::on_db!(world.db.db, |pool| sqlx::query(
            "UPDATE message SET completed_at = completed_at - 3600000 WHERE id = $1"
        )
        .bind(id)
        .execute(pool)
        .await
        .map(|d| d.rows_affected()))
        .unwrap();
    }
    let recent = world.session().await;
    let small_talk = CATCH_UP_LIMIT as usize + 6;
    for _ in 0..small_talk {
        stored_turn(&world, &recent, "hello", "Hi.").await;
    }
    let extraction_jobs = "SELECT COUNT(*) FROM learning_job WHERE kind = 'extract'";

    // First start-up: the newest 64 turns, none eligible.
    let first = world.ingestion.catch_up().await.unwrap();
    assert_eq!(first.len(), CATCH_UP_LIMIT as usize);
    assert!(
        first
            .iter()
            .all(|o| o.eligibility.as_ref().is_some_and(|e| !e.eligible))
    );
    assert_eq!(world.scalar(extraction_jobs).await, 0);
    // Second start-up: the rest of the small talk, then the older eligible turns.
    let second = world.ingestion.catch_up().await.unwrap();
    assert_eq!(second.len(), 6 + eligible.len());
    assert_eq!(world.scalar(extraction_jobs).await, 3);
    for id in &eligible {
        assert!(
            second
                .iter()
                .any(|o| &o.message.id == id && o.admission.as_ref().is_some_and(|a| a.is_new())),
            "{id} was admitted"
        );
    }
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM learning_turn_inspection WHERE outcome = 'not_eligible'")
            .await,
        small_talk as i64
    );
    // Third start-up: nothing left to look at.
    assert!(world.ingestion.catch_up().await.unwrap().is_empty());
}

on_both_backends!(
    reprocess_returns_the_existing_job_unchanged,
    reflection_is_keyed_by_its_exact_input_and_revokes_older_input,
    unresolved_issues_never_become_memory_hints,
    forgotten_evidence_cannot_be_readmitted,
    remember_is_explicit_verified_user_evidence,
    history_repair_previews_then_queues_once,
    catch_up_admits_missed_recent_turns,
    catch_up_moves_past_ineligible_turns_to_older_eligible_ones,
);
