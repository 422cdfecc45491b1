//! Revocation: an applied Skill whose evidence disappeared becomes a reviewed `revoke`
//! candidate; applying it removes the file at most once, and undo restores it.

use std::path::Path;

use zuno_shared::ledger::JobKind;
use zuno_shared::skills::SkillError;
use zuno_shared::skills::candidate::SkillCandidateState;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{PROJECT, World};

const SUMMARY: &str = "Run database migrations with zuno migrate";

async fn an_applied_skill_whose_evidence_was_forgotten_is_revoked_once_and_undo_restores_it(
    db: TestDb,
) {
    let world = World::new(db, zuno_shared::config::Config::default()).await;
    let session = world.session().await;
    let experience = world.experience(&session, "Migrations", SUMMARY).await;
    let applied = world
        .skills
        .promote_experience(PROJECT, &experience)
        .await
        .unwrap()
        .candidate
        .unwrap();
    world.force_approved(&applied.id).await;
    let applied = world.skills.apply(&applied.id).await.unwrap();
    assert_eq!(applied.state.as_str(), "applied");
    let target = Path::new(&applied.target_path).to_path_buf();
    let content = std::fs::read_to_string(&target).unwrap();
    assert_eq!(Some(content.as_str()), applied.content.as_deref());

    // While the evidence is live, a check proposes nothing.
    world.skills.admit_project_check(PROJECT).await.unwrap();
    assert_eq!(world.run_mine().await.completed, 1);
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM skill_candidate WHERE operation = 'revoke'")
            .await,
        0
    );

    // The only evidence is forgotten: the next check (a new identity in the same bucket,
    // although no new experience arrived) proposes a revocation and removes nothing.
    world.ingestion.forget(&experience).await.unwrap().unwrap();
    world.skills.admit_project_check(PROJECT).await.unwrap();
    let report = world.run_mine().await;
    assert_eq!((report.completed, report.failed), (1, 0), "{report:?}");
    let revocations = world
        .skills
        .candidates(PROJECT, Some(SkillCandidateState::Pending))
        .await
        .unwrap();
    assert_eq!(revocations.len(), 1, "{revocations:?}");
    let revocation = &revocations[0];
    assert_eq!(revocation.operation.as_str(), "revoke");
    assert_eq!(revocation.revokes_id.as_deref(), Some(applied.id.as_str()));
    assert_eq!(revocation.target_path, applied.target_path);
    assert_eq!(revocation.content, None, "a revocation removes the file");
    assert_eq!(revocation.source_digest, applied.content_digest);
    let label = format!(
        "--- a/.agents/skills/{}/SKILL.md\n+++ /dev/null\n",
        applied.name
    );
    assert!(revocation.diff.starts_with(&label), "{}", revocation.diff);
    assert!(
        revocation.diff.lines().any(|l| l.starts_with("-- ")),
        "the diff removes the rules: {}",
        revocation.diff
    );
    let jobs = world.jobs(JobKind::AggregateProject).await;
    let newest = jobs
        .iter()
        .find(|j| {
            j.result
                .as_ref()
                .is_some_and(|r| r["revocations"].as_array().is_some_and(|a| !a.is_empty()))
        })
        .expect("the check reports the revocation");
    assert_eq!(
        newest.result.as_ref().unwrap()["revocations"][0],
        revocation.id.as_str()
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), content);
    assert_eq!(
        world
            .skills
            .candidate(&applied.id)
            .await
            .unwrap()
            .state
            .as_str(),
        "applied"
    );

    // A further check proposes no second revocation.
    world.skills.admit_project_check(PROJECT).await.unwrap();
    world.run_mine().await;
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM skill_candidate WHERE operation = 'revoke'")
            .await,
        1
    );

    // Reviewed by applying or rejecting it: there is nothing to evaluate.
    let error = world.skills.review(&revocation.id).await.unwrap_err();
    assert!(matches!(error, SkillError::Conflict(_)), "{error}");

    // Applying it removes the file, at most once.
    let revoked = world.skills.apply(&revocation.id).await.unwrap();
    assert_eq!(revoked.state.as_str(), "applied");
    assert!(!target.exists());
    let original = world.skills.candidate(&applied.id).await.unwrap();
    assert_eq!(original.state.as_str(), "undone");
    assert_eq!(original.detail.as_deref(), Some("revoked"));
    let again = world.skills.apply(&revocation.id).await.unwrap_err();
    assert!(matches!(again, SkillError::Conflict(_)), "{again}");
    assert!(!target.exists());
    assert_eq!(
        world
            .scalar(
                "SELECT COUNT(*) FROM skill_operation WHERE kind = 'apply' AND state = 'applied'"
            )
            .await,
        2,
        "one apply of the Skill and one of its revocation"
    );

    // Undo restores the exact file, and the revoked Skill is applied again.
    let undone = world.skills.undo(&revocation.id).await.unwrap();
    assert_eq!(undone.state.as_str(), "undone");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), content);
    let original = world.skills.candidate(&applied.id).await.unwrap();
    assert_eq!(original.state.as_str(), "applied");
    // Consistent: the restored Skill can itself be undone (back to absent).
    world.skills.undo(&applied.id).await.unwrap();
    assert!(!target.exists());
}

async fn a_revocation_whose_file_changed_is_stale_and_removes_nothing(db: TestDb) {
    let world = World::new(db, zuno_shared::config::Config::default()).await;
    let session = world.session().await;
    let experience = world.experience(&session, "Migrations", SUMMARY).await;
    let applied = world
        .skills
        .promote_experience(PROJECT, &experience)
        .await
        .unwrap()
        .candidate
        .unwrap();
    world.force_approved(&applied.id).await;
    world.skills.apply(&applied.id).await.unwrap();
    world.ingestion.forget(&experience).await.unwrap().unwrap();
    world.skills.admit_project_check(PROJECT).await.unwrap();
    world.run_mine().await;
    let revocation = world
        .skills
        .candidates(PROJECT, Some(SkillCandidateState::Pending))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(revocation.operation.as_str(), "revoke");
    // Someone edited the Skill after the revocation was proposed.
    let target = Path::new(&applied.target_path);
    std::fs::write(target, "hand-edited skill\n").unwrap();
    let error = world.skills.apply(&revocation.id).await.unwrap_err();
    assert!(matches!(error, SkillError::Stale(_)), "{error}");
    assert_eq!(
        std::fs::read_to_string(target).unwrap(),
        "hand-edited skill\n"
    );
    assert_eq!(
        world
            .skills
            .candidate(&revocation.id)
            .await
            .unwrap()
            .state
            .as_str(),
        "stale"
    );
    assert_eq!(
        world
            .skills
            .candidate(&applied.id)
            .await
            .unwrap()
            .state
            .as_str(),
        "applied"
    );
}

on_both_backends!(
    an_applied_skill_whose_evidence_was_forgotten_is_revoked_once_and_undo_restores_it,
    a_revocation_whose_file_changed_is_stale_and_removes_nothing,
);
