//! Closed-turn admission and the source snapshot the database revalidates at claim.

use std::sync::Arc;

use zuno_shared::config::Config;
use zuno_shared::learning::{LearningIngestion, SourceGate};
use zuno_shared::ledger::{ClaimRequest, JobKind, JobState};
use zuno_shared::transcript::{
    MessageStatus, NewMessage, NewProject, NewSession, Part, Role, ToolStatus, TranscriptStore,
};
use zuno_tests::{TestDb, on_both_backends};

fn ingestion(db: &TestDb, config: Config) -> LearningIngestion {
    let clock = zuno_shared::clock::system_clock();
    LearningIngestion::new(
        TranscriptStore::new(db.db.clone(), clock),
        db.ledger(),
        Arc::new(config),
    )
}

async fn session(ingest: &LearningIngestion) -> String {
    let store = ingest.store();
    store
        .create_project(&NewProject {
            id: "proj".into(),
            name: "Project".into(),
            worktree: None,
        })
        .await
        .unwrap();
    let mut tx = store.db().begin().await.unwrap();
    let session = store
        .create_session_in(
            &mut tx,
            &NewSession {
                project_id: "proj".into(),
                ..NewSession::default()
            },
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    session.id
}

fn user(text: &str) -> NewMessage {
    NewMessage {
        id: None,
        role: Role::User,
        status: None,
        parts: vec![Part::Text {
            text: text.into(),
            injected: false,
        }],
        created_at: None,
    }
}

fn assistant_with_tool(status: Option<MessageStatus>) -> NewMessage {
    NewMessage {
        id: None,
        role: Role::Assistant,
        status,
        parts: vec![
            Part::ToolCall {
                tool_name: "bash".into(),
                call_id: Some("call_1".into()),
                arguments: serde_json::json!({"command": "cargo test"}),
                result: Some("test result: ok".into()),
                status: ToolStatus::Completed,
                external_context: false,
                injected: false,
            },
            Part::Text {
                text: "Tests pass.".into(),
                injected: false,
            },
        ],
        created_at: None,
    }
}

async fn claim(db: &TestDb) -> zuno_shared::ledger::ClaimBatch {
    let kinds = [JobKind::Extract];
    db.ledger()
        .claim(
            &ClaimRequest {
                worker_id: "w",
                kinds: &kinds,
                limit: 2,
                lease_ms: 10_000,
                scopes: None,
            },
            &SourceGate::new(
                Arc::new(Config::default()),
                zuno_shared::clock::system_clock(),
            ),
        )
        .await
        .unwrap()
}

async fn a_completed_turn_with_a_tool_call_admits_one_job_with_a_snapshot(db: TestDb) {
    let ingest = ingestion(&db, Config::default());
    let session = session(&ingest).await;
    ingest
        .append_message(&session, &user("run the tests"), None)
        .await
        .unwrap();
    let outcome = ingest
        .append_message(
            &session,
            &assistant_with_tool(Some(MessageStatus::Completed)),
            None,
        )
        .await
        .unwrap();
    let admission = outcome.admission.expect("admitted");
    assert_eq!(admission.outcome(), "queued");
    let job = admission.job();
    assert_eq!(job.kind, JobKind::Extract);
    assert_eq!(job.session_id.as_deref(), Some(session.as_str()));
    assert_eq!(
        job.source_message_id.as_deref(),
        Some(outcome.message.id.as_str())
    );
    // Completing again reuses the job.
    let again = ingest
        .complete_message(&outcome.message.id, MessageStatus::Completed, None)
        .await
        .unwrap();
    assert_eq!(again.admission.unwrap().outcome(), "existing");
    let batch = claim(&db).await;
    assert_eq!(batch.claimed.len(), 1, "an unchanged source is claimable");
}

async fn an_unfinished_or_signal_free_turn_is_not_admitted(db: TestDb) {
    let ingest = ingestion(&db, Config::default());
    let session = session(&ingest).await;
    ingest
        .append_message(&session, &user("hello"), None)
        .await
        .unwrap();
    let pending = ingest
        .append_message(&session, &assistant_with_tool(None), None)
        .await
        .unwrap();
    assert!(
        pending.admission.is_none(),
        "an in-progress message closes no turn"
    );
    let truncated = ingest
        .complete_message(&pending.message.id, MessageStatus::Truncated, None)
        .await
        .unwrap();
    assert!(truncated.admission.is_none());
    assert!(!truncated.eligibility.unwrap().eligible);
    let chat = NewMessage {
        parts: vec![Part::Text {
            text: "Hi!".into(),
            injected: false,
        }],
        ..assistant_with_tool(Some(MessageStatus::Completed))
    };
    ingest
        .append_message(&session, &user("how are you"), None)
        .await
        .unwrap();
    let outcome = ingest.append_message(&session, &chat, None).await.unwrap();
    assert!(outcome.admission.is_none());
    assert!(claim(&db).await.claimed.is_empty());
}

async fn disabled_generation_admits_nothing(db: TestDb) {
    let mut config = Config::default();
    config.learning.enabled = false;
    let ingest = ingestion(&db, config);
    let session = session(&ingest).await;
    ingest
        .append_message(&session, &user("run it"), None)
        .await
        .unwrap();
    let outcome = ingest
        .append_message(
            &session,
            &assistant_with_tool(Some(MessageStatus::Completed)),
            None,
        )
        .await
        .unwrap();
    assert!(outcome.eligibility.unwrap().eligible);
    assert!(outcome.admission.is_none());
    assert!(outcome.not_admitted.unwrap().contains("disabled"));
}

async fn a_source_edited_before_claim_is_skipped_without_an_attempt(db: TestDb) {
    let ingest = ingestion(&db, Config::default());
    let session = session(&ingest).await;
    let prompt = ingest
        .append_message(&session, &user("run the tests"), None)
        .await
        .unwrap();
    let outcome = ingest
        .append_message(
            &session,
            &assistant_with_tool(Some(MessageStatus::Completed)),
            None,
        )
        .await
        .unwrap();
    let job_id = outcome.admission.unwrap().job().id.clone();
    let mut tx = db.db.begin().await.unwrap();
    ingest
        .store()
        .replace_parts_in(
            &mut tx,
            &prompt.message.id,
            &[Part::Text {
                text: "edited".into(),
                injected: false,
            }],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let batch = claim(&db).await;
    assert!(batch.claimed.is_empty());
    assert_eq!(batch.skipped.len(), 1);
    assert!(
        batch.skipped[0].reason.contains("source changed"),
        "{}",
        batch.skipped[0].reason
    );
    let job = db.ledger().get(&job_id).await.unwrap();
    assert_eq!(job.state, JobState::Skipped);
    assert_eq!(job.attempts, 0);
}

async fn a_deleted_source_is_skipped_as_unavailable(db: TestDb) {
    let ingest = ingestion(&db, Config::default());
    let session = session(&ingest).await;
    ingest
        .append_message(&session, &user("run the tests"), None)
        .await
        .unwrap();
    let outcome = ingest
        .append_message(
            &session,
            &assistant_with_tool(Some(MessageStatus::Completed)),
            None,
        )
        .await
        .unwrap();
    zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "DELETE FROM message WHERE id = $1"
    )
    .bind(&outcome.message.id)
    .execute(pool)
    .await
    .map(|d| d.rows_affected()))
    .unwrap();
    let batch = claim(&db).await;
    assert_eq!(batch.skipped.len(), 1);
    assert!(
        batch.skipped[0].reason.contains("unavailable"),
        "{}",
        batch.skipped[0].reason
    );
}

async fn a_later_live_turn_does_not_widen_a_closed_snapshot(db: TestDb) {
    let ingest = ingestion(&db, Config::default());
    let session = session(&ingest).await;
    ingest
        .append_message(&session, &user("run the tests"), None)
        .await
        .unwrap();
    ingest
        .append_message(
            &session,
            &assistant_with_tool(Some(MessageStatus::Completed)),
            None,
        )
        .await
        .unwrap();
    // The next turn starts and is still running.
    ingest
        .append_message(&session, &user("now deploy"), None)
        .await
        .unwrap();
    ingest
        .append_message(&session, &assistant_with_tool(None), None)
        .await
        .unwrap();
    let batch = claim(&db).await;
    assert_eq!(
        batch.claimed.len(),
        1,
        "the closed snapshot stays valid while the next turn runs"
    );
}

on_both_backends!(
    a_completed_turn_with_a_tool_call_admits_one_job_with_a_snapshot,
    an_unfinished_or_signal_free_turn_is_not_admitted,
    disabled_generation_admits_nothing,
    a_source_edited_before_claim_is_skipped_without_an_attempt,
    a_deleted_source_is_skipped_as_unavailable,
    a_later_live_turn_does_not_widen_a_closed_snapshot,
);
