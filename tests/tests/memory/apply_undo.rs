//! Apply and undo commit exact before/after snapshots, the entries, the revision history and the
//! candidate's state together; the projection follows.

use zuno_shared::config::MemoryPromotion;
use zuno_shared::memory::markdown;
use zuno_shared::memory::service::{MemoryError, Origin, Proposal};
use zuno_shared::memory::store::Scope;
use zuno_shared::memory::write_check::WriteRefusal;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{Env, add, file_entries, replace, strings};
use zuno_shared::memory::store::MemoryCandidateState;

fn snapshot(json: Option<&str>) -> Vec<String> {
    serde_json::from_str(json.expect("snapshot recorded")).expect("snapshot is a JSON array")
}

async fn approve_then_undo_restores_the_exact_before_snapshot(db: TestDb) {
    let env = Env::new(db).await;
    env.apply(add(Scope::Project, "Use pnpm.", Origin::Tool))
        .await;
    env.apply(add(Scope::Project, "Tabs, not spaces.", Origin::Tool))
        .await;
    env.apply(add(Scope::Project, "Run cargo nextest.", Origin::Tool))
        .await;
    let before = strings(&["Use pnpm.", "Tabs, not spaces.", "Run cargo nextest."]);
    let after = strings(&["Use pnpm.", "Spaces, not tabs.", "Run cargo nextest."]);

    let review = env.service_with(MemoryPromotion::Review);
    let pending = review
        .propose(Proposal {
            expected_revision: Some(3),
            ..replace(Scope::Project, "Tabs", "Spaces, not tabs.", Origin::Tool)
        })
        .await
        .unwrap();
    assert!(!pending.applied);
    let id = pending.candidate.id.clone();
    assert_eq!(pending.candidate.base_revision, 3);
    assert_eq!(
        snapshot(pending.candidate.before_entries.as_deref()),
        before
    );
    assert_eq!(snapshot(pending.candidate.after_entries.as_deref()), after);
    assert_eq!(
        file_entries(&env.rules_path()),
        before,
        "a pending change leaves the file alone"
    );

    let approved = env.memory.approve(&id, None).await.unwrap();
    assert!(approved.applied);
    assert_eq!(approved.revision, 4);
    assert_eq!(approved.candidate.state, MemoryCandidateState::Applied);
    assert_eq!(approved.candidate.applied_revision, Some(4));
    assert_eq!(approved.projection.as_ref().unwrap().state, "synced");
    assert_eq!(env.entries(Scope::Project).await, after);
    assert_eq!(
        std::fs::read_to_string(env.rules_path()).unwrap(),
        markdown::render("project", 4, &after)
    );

    let undone = env.memory.undo(&id).await.unwrap();
    assert!(!undone.applied);
    assert_eq!(undone.revision, 5);
    assert_eq!(undone.candidate.state, MemoryCandidateState::Undone);
    assert_eq!(undone.candidate.undone_revision, Some(5));
    assert_eq!(
        env.entries(Scope::Project).await,
        before,
        "the exact before snapshot, in order"
    );
    assert_eq!(
        std::fs::read_to_string(env.rules_path()).unwrap(),
        markdown::render("project", 5, &before)
    );
    let history = env.revisions(Scope::Project).await;
    assert_eq!(
        history
            .iter()
            .map(|r| (r.revision, r.change.as_str()))
            .collect::<Vec<_>>(),
        [
            (5, "undo"),
            (4, "apply"),
            (3, "apply"),
            (2, "apply"),
            (1, "apply")
        ]
    );
    assert_eq!(history[0].candidate_id.as_deref(), Some(id.as_str()));
    assert_eq!(history[1].candidate_id.as_deref(), Some(id.as_str()));
    assert_eq!(snapshot(Some(&history[0].entries)), before);
    assert_eq!(snapshot(Some(&history[1].entries)), after);

    // Undone is final, and undone text is not proposed back automatically.
    assert!(matches!(
        env.memory.undo(&id).await,
        Err(MemoryError::Conflict(_))
    ));
    assert_eq!(
        env.refused(add(Scope::Project, "Spaces, not tabs.", Origin::Tool))
            .await,
        WriteRefusal::Forgotten
    );

    // Adding an existing entry is applied without a new revision.
    let same = env
        .apply(add(Scope::Project, "Use pnpm.", Origin::Tool))
        .await;
    assert_eq!(same.revision, 5);
    assert_eq!(env.revisions(Scope::Project).await.len(), 5);

    // An undo that would discard later changes is refused.
    let first = env
        .apply(add(Scope::Project, "Prefer rg.", Origin::Tool))
        .await;
    env.apply(add(Scope::Project, "Prefer fd.", Origin::Tool))
        .await;
    let refused = env.memory.undo(&first.candidate.id).await;
    assert!(
        matches!(refused, Err(MemoryError::Conflict(_))),
        "{refused:?}"
    );
    assert_eq!(env.revision(Scope::Project).await, 7);
    assert_eq!(
        env.candidate(&first.candidate.id).await.state,
        MemoryCandidateState::Applied
    );
}

async fn a_rejected_candidate_is_not_applied_or_proposed_again(db: TestDb) {
    let env = Env::with_promotion(db, MemoryPromotion::Review).await;
    let pending = env
        .propose(add(Scope::Project, "Use npm.", Origin::Tool))
        .await
        .unwrap();
    let rejected = env.memory.reject(&pending.candidate.id).await.unwrap();
    assert_eq!(rejected.state, MemoryCandidateState::Rejected);
    assert!(matches!(
        env.memory.approve(&pending.candidate.id, None).await,
        Err(MemoryError::Conflict(_))
    ));
    assert_eq!(env.revision(Scope::Project).await, 0);
    assert_eq!(
        env.refused(add(Scope::Project, "Use npm.", Origin::Tool))
            .await,
        WriteRefusal::Forgotten
    );
    // A person may still write it.
    let mine = env
        .propose(add(Scope::Project, "Use npm.", Origin::User))
        .await
        .unwrap();
    assert!(mine.applied);
}

on_both_backends!(
    approve_then_undo_restores_the_exact_before_snapshot,
    a_rejected_candidate_is_not_applied_or_proposed_again,
);
