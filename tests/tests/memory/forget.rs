//! Forgetting evidence retracts the automatic entries that lose all their support, in the same
//! transaction; independent support and user entries survive; forgotten text is not resurrected.

use std::sync::Arc;

use zuno_shared::clock::system_clock;
use zuno_shared::learning::LearningIngestion;
use zuno_shared::ledger::Ledger;
use zuno_shared::memory::service::Origin;
use zuno_shared::memory::store::Scope;
use zuno_shared::memory::write_check::WriteRefusal;
use zuno_shared::transcript::TranscriptStore;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{Env, add, file_entries, maintained, strings};
use zuno_shared::memory::store::MemoryCandidateState;

async fn forgetting_evidence_retracts_only_unsupported_automatic_entries(db: TestDb) {
    let env = Env::new(db).await;
    let ingestion = LearningIngestion::new(
        TranscriptStore::new(env.db.db.clone(), system_clock()),
        Ledger::new(env.db.db.clone(), system_clock()),
        Arc::clone(&env.config),
    );
    let forgotten = env.experience("Remember: use pnpm, never npm.").await;
    let independent = env.experience("Remember: search code with rg.").await;

    env.apply(maintained(
        Scope::Project,
        "Use pnpm for installs.",
        &[&forgotten],
        0.9,
    ))
    .await;
    env.apply(maintained(
        Scope::Project,
        "Search code with rg.",
        &[&forgotten, &independent],
        0.9,
    ))
    .await;
    env.apply(add(Scope::Project, "Keep commits small.", Origin::User))
        .await;
    // A global change without explicit user evidence waits, citing the forgotten experience.
    let waiting = env
        .propose(maintained(
            Scope::Global,
            "Prefer pnpm everywhere.",
            &[&forgotten],
            0.9,
        ))
        .await
        .unwrap();
    assert!(!waiting.applied);
    assert_eq!(env.revision(Scope::Project).await, 3);

    let (experience, documents) = ingestion.forget(&forgotten).await.unwrap().unwrap();
    assert_eq!(experience.status.as_str(), "forgotten");
    let project_document = env.document_id(Scope::Project).await;
    assert_eq!(documents, std::slice::from_ref(&project_document));

    let view = env.view(Scope::Project).await;
    assert_eq!(
        view.entries
            .iter()
            .map(|e| e.content.as_str())
            .collect::<Vec<_>>(),
        ["Search code with rg.", "Keep commits small."],
        "the unsupported entry is retracted; independent support and the user's entry survive"
    );
    assert_eq!(view.withheld, 0);
    assert_eq!(view.revision, 4);
    assert_eq!(env.revisions(Scope::Project).await[0].change, "retract");
    assert_eq!(
        env.candidate(&waiting.candidate.id).await.state,
        MemoryCandidateState::Rejected
    );
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_entry WHERE content = 'Use pnpm for installs.' AND retracted_revision = 4").await,
        1,
        "the retracted row stays for audit"
    );
    // The caller republishes what forget reports.
    env.memory.publish(&project_document).await.unwrap();
    assert_eq!(
        file_entries(&env.rules_path()),
        strings(&["Search code with rg.", "Keep commits small."])
    );

    // Forgotten text is not resurrected from unchanged evidence, by any automatic writer.
    for proposal in [
        maintained(
            Scope::Project,
            "Use pnpm for installs.",
            &[&independent],
            1.0,
        ),
        maintained(Scope::Project, "Use pnpm for installs.", &[&forgotten], 1.0),
        add(Scope::Project, "Use pnpm for installs.", Origin::Tool),
    ] {
        let result = env.propose(proposal).await;
        assert!(result.is_err(), "forgotten text came back: {result:?}");
    }
    assert_eq!(
        env.refused(maintained(
            Scope::Project,
            "Use pnpm for installs.",
            &[&independent],
            1.0
        ))
        .await,
        WriteRefusal::Forgotten
    );
    assert_eq!(env.revision(Scope::Project).await, 4);
    // Forgetting again changes nothing.
    let (_, documents) = ingestion.forget(&forgotten).await.unwrap().unwrap();
    assert!(documents.is_empty());
    assert_eq!(env.revision(Scope::Project).await, 4);
    // A person may reaffirm it.
    let reaffirmed = env
        .propose(add(Scope::Project, "Use pnpm for installs.", Origin::User))
        .await
        .unwrap();
    assert!(reaffirmed.applied);
    assert!(
        env.entries(Scope::Project)
            .await
            .contains(&String::from("Use pnpm for installs."))
    );
}

/// Forgets experience `id` and retracts the Memory entries it alone supported, in `tx`; returns
/// the documents the retraction changed.
async fn forget_and_retract(tx: &mut zuno_shared::db::Tx, id: &str, now: i64) -> Vec<String> {
    zuno_shared::learning::experience::forget_in(tx, id, now)
        .await
        .unwrap()
        .unwrap();
    zuno_shared::memory::service::retract_unsupported_in(tx, id, now)
        .await
        .unwrap()
}

async fn forgetting_the_last_support_of_several_entries_retracts_them_all(db: TestDb) {
    let env = Env::new(db).await;
    let a = env.experience("Remember: use pnpm.").await;
    let b = env.experience("Remember: run nextest.").await;
    env.apply(maintained(Scope::Project, "Use pnpm.", &[&a, &b], 0.9))
        .await;
    env.apply(maintained(Scope::Project, "Run cargo nextest.", &[&b], 0.9))
        .await;
    let now = system_clock().now_ms();

    // The first forget leaves "Use pnpm." with independent support.
    let mut tx = env.db.db.begin().await.unwrap();
    let documents = forget_and_retract(&mut tx, &b, now).await;
    tx.commit().await.unwrap();
    assert_eq!(documents.len(), 1);
    assert_eq!(env.entries(Scope::Project).await, ["Use pnpm."]);

    let mut tx = env.db.db.begin().await.unwrap();
    forget_and_retract(&mut tx, &a, now).await;
    // Rolled back: forgetting is atomic with the retraction.
    tx.rollback().await.unwrap();
    assert_eq!(env.entries(Scope::Project).await, ["Use pnpm."]);

    let mut tx = env.db.db.begin().await.unwrap();
    forget_and_retract(&mut tx, &a, now).await;
    tx.commit().await.unwrap();
    assert!(env.entries(Scope::Project).await.is_empty());
    assert_eq!(env.revision(Scope::Project).await, 4);
}

on_both_backends!(
    forgetting_evidence_retracts_only_unsupported_automatic_entries,
    forgetting_the_last_support_of_several_entries_retracts_them_all,
);
