//! `memory.promotion`: automatic (default), high_confidence (at or above `auto_confidence`) and
//! review. Global automatic memory needs explicit user evidence; model confidence alone never
//! authorises Memory.

use zuno_shared::config::MemoryPromotion;
use zuno_shared::memory::service::{MemoryError, Origin, Proposal};
use zuno_shared::memory::store::Scope;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{Env, add, maintained};
use zuno_shared::memory::store::MemoryCandidateState;

fn tool(content: &str, confidence: f64) -> Proposal {
    Proposal {
        confidence,
        ..add(Scope::Project, content, Origin::Tool)
    }
}

async fn automatic_promotion_applies_validated_proposals_backed_by_evidence(db: TestDb) {
    let env = Env::new(db).await;
    assert_eq!(
        env.config.memory.promotion,
        MemoryPromotion::Automatic,
        "automatic is the default"
    );
    let evidence = env.experience("Remember: this repository uses pnpm.").await;

    let outcome = env
        .propose(maintained(Scope::Project, "Use pnpm.", &[&evidence], 0.3))
        .await
        .unwrap();
    assert!(
        outcome.applied,
        "automatic applies a validated maintenance change with evidence"
    );
    assert_eq!(outcome.candidate.state, MemoryCandidateState::Applied);
    let view = env.view(Scope::Project).await;
    assert_eq!(view.entries.len(), 1);
    assert_eq!(view.entries[0].owner, "automatic");
    assert!(
        view.entries[0].derived,
        "an entry from evidence is derived from it"
    );
    let outcome = env.propose(tool("Run cargo nextest.", 0.2)).await.unwrap();
    assert!(
        outcome.applied,
        "the foreground tool obeys the same promotion choice"
    );
    assert_eq!(env.revision(Scope::Project).await, 2);

    // Model confidence alone never authorises Memory.
    let outcome = env
        .propose(maintained(Scope::Project, "Prefer tabs.", &[], 1.0))
        .await
        .unwrap();
    assert!(!outcome.applied);
    assert_eq!(outcome.candidate.state, MemoryCandidateState::Pending);
    assert_eq!(outcome.revision, 2);

    // Global automatic memory needs explicit user evidence.
    let outcome = env
        .propose(maintained(
            Scope::Global,
            "Answer in English.",
            &[&evidence],
            1.0,
        ))
        .await
        .unwrap();
    assert!(
        !outcome.applied,
        "no explicit user evidence: the global change waits"
    );
    assert_eq!(outcome.candidate.state, MemoryCandidateState::Pending);
    assert!(
        !env.global_path().exists(),
        "a pending change writes no file"
    );
    let outcome = env
        .propose(Proposal {
            explicit_user_evidence: true,
            ..maintained(Scope::Global, "Answer in English.", &[&evidence], 1.0)
        })
        .await
        .unwrap();
    assert!(outcome.applied);
    assert_eq!(env.entries(Scope::Global).await, ["Answer in English."]);
    assert_eq!(
        env.entries(Scope::Project).await,
        ["Use pnpm.", "Run cargo nextest."]
    );
}

async fn high_confidence_applies_only_at_or_above_auto_confidence(db: TestDb) {
    let env = Env::with_promotion(db, MemoryPromotion::HighConfidence).await;
    assert_eq!(env.config.memory.auto_confidence, 0.9);
    let evidence = env.experience("Use pnpm here, not npm.").await;

    let low = env.propose(tool("Use pnpm.", 0.5)).await.unwrap();
    assert!(!low.applied);
    assert_eq!(low.candidate.state, MemoryCandidateState::Pending);
    let just_below = env
        .propose(tool("Use pnpm workspaces.", 0.89))
        .await
        .unwrap();
    assert!(!just_below.applied);
    assert_eq!(env.revision(Scope::Project).await, 0);
    assert!(!env.worktree.join(".zuno").exists());

    let at = env.propose(tool("Run cargo nextest.", 0.9)).await.unwrap();
    assert!(at.applied, "auto_confidence itself is enough");
    let maintained_high = env
        .propose(maintained(Scope::Project, "Use pnpm.", &[&evidence], 0.95))
        .await
        .unwrap();
    assert!(maintained_high.applied);
    let maintained_low = env
        .propose(maintained(Scope::Project, "Prefer rg.", &[&evidence], 0.5))
        .await
        .unwrap();
    assert!(!maintained_low.applied);
    let unsupported = env
        .propose(maintained(Scope::Project, "Prefer fd.", &[], 1.0))
        .await
        .unwrap();
    assert!(
        !unsupported.applied,
        "confidence without evidence never authorises Memory"
    );

    assert_eq!(
        env.entries(Scope::Project).await,
        ["Run cargo nextest.", "Use pnpm."]
    );
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_candidate WHERE state = 'pending'")
            .await,
        4
    );
}

async fn review_leaves_every_proposal_pending_until_approved(db: TestDb) {
    let env = Env::with_promotion(db, MemoryPromotion::Review).await;
    let evidence = env.experience("Remember: run clippy before pushing.").await;
    let from_tool = env.propose(tool("Use pnpm.", 0.99)).await.unwrap();
    let from_maintenance = env
        .propose(maintained(
            Scope::Project,
            "Run clippy before pushing.",
            &[&evidence],
            1.0,
        ))
        .await
        .unwrap();
    let global = env
        .propose(Proposal {
            explicit_user_evidence: true,
            ..maintained(Scope::Global, "Answer in English.", &[&evidence], 1.0)
        })
        .await
        .unwrap();
    for outcome in [&from_tool, &from_maintenance, &global] {
        assert!(!outcome.applied);
        assert_eq!(outcome.candidate.state, MemoryCandidateState::Pending);
        assert!(outcome.projection.is_none());
    }
    assert_eq!(env.revision(Scope::Project).await, 0);
    assert_eq!(env.revision(Scope::Global).await, 0);
    assert!(!env.worktree.join(".zuno").exists());
    assert!(!env.home.exists());

    let approved = env
        .memory
        .approve(&from_tool.candidate.id, None)
        .await
        .unwrap();
    assert!(approved.applied);
    assert_eq!(approved.revision, 1);
    assert_eq!(approved.candidate.state, MemoryCandidateState::Applied);
    assert_eq!(env.entries(Scope::Project).await, ["Use pnpm."]);

    // The second was reviewed against revision 0: approving it after the first moved the
    // document would apply drift, so it becomes stale instead.
    let drift = env
        .memory
        .approve(&from_maintenance.candidate.id, None)
        .await;
    assert!(matches!(drift, Err(MemoryError::Conflict(_))), "{drift:?}");
    assert_eq!(
        env.candidate(&from_maintenance.candidate.id).await.state,
        MemoryCandidateState::Stale
    );
    assert_eq!(env.entries(Scope::Project).await, ["Use pnpm."]);

    let approved = env
        .memory
        .approve(
            &global.candidate.id,
            Some(String::from("Answer in British English.")),
        )
        .await
        .unwrap();
    assert!(approved.applied);
    assert_eq!(
        env.entries(Scope::Global).await,
        ["Answer in British English."]
    );
    let again = env.memory.approve(&global.candidate.id, None).await;
    assert!(
        matches!(again, Err(MemoryError::Conflict(_))),
        "an applied candidate is not approved twice"
    );
}

on_both_backends!(
    automatic_promotion_applies_validated_proposals_backed_by_evidence,
    high_confidence_applies_only_at_or_above_auto_confidence,
    review_leaves_every_proposal_pending_until_approved,
);
