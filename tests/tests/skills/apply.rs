//! At-most-once Skill effects: drift marks a candidate stale, read-only Skills get a companion,
//! a crash between the snapshot and the rename is classified from the filesystem (never
//! replayed), concurrent applies have one winner, and links are refused.

use std::path::Path;

use zuno_shared::skills::SkillError;
use zuno_shared::skills::apply::OperationKind;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{PROJECT, World};

const SUMMARY: &str = "Run database migrations with zuno migrate";

async fn world(db: TestDb) -> World {
    World::new(db, zuno_shared::config::Config::default()).await
}

async fn apply_with_source_drift_marks_the_candidate_stale(db: TestDb) {
    let world = world(db).await;
    let candidate = world.promoted_candidate("Migrations", SUMMARY).await;
    world.force_approved(&candidate.id).await;
    let target = Path::new(&candidate.target_path);
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(target, "someone else's skill\n").unwrap();
    let error = world.skills.apply(&candidate.id).await.unwrap_err();
    assert!(matches!(error, SkillError::Stale(_)), "{error}");
    assert_eq!(
        std::fs::read_to_string(target).unwrap(),
        "someone else's skill\n",
        "no stale source is overwritten"
    );
    let candidate = world.skills.candidate(&candidate.id).await.unwrap();
    assert_eq!(candidate.state.as_str(), "stale");
    assert!(candidate.detail.unwrap().contains("drift"));
}

async fn a_read_only_skill_gets_a_companion_and_a_read_only_companion_is_stale(db: TestDb) {
    let world = world(db).await;
    let builtin = world.worktree.join(".agents/skills/migrations/SKILL.md");
    std::fs::create_dir_all(builtin.parent().unwrap()).unwrap();
    std::fs::write(&builtin, "built-in skill\n").unwrap();
    let mut permissions = std::fs::metadata(&builtin).unwrap().permissions();
    permissions.set_readonly(true);
    std::fs::set_permissions(&builtin, permissions.clone()).unwrap();
    let candidate = world.promoted_candidate("Migrations", SUMMARY).await;
    assert!(candidate.companion);
    assert_eq!(candidate.source_kind.as_str(), "read_only");
    assert!(!candidate.writable);
    assert!(
        candidate
            .target_path
            .ends_with(".agents/skills/migrations-learned/SKILL.md"),
        "{}",
        candidate.target_path
    );
    assert!(
        candidate
            .content
            .as_deref()
            .unwrap()
            .contains("name: migrations-learned")
    );
    // A read-only companion already at the destination: stale, never overwritten.
    let companion = Path::new(&candidate.target_path);
    std::fs::create_dir_all(companion.parent().unwrap()).unwrap();
    std::fs::write(companion, "read-only companion\n").unwrap();
    std::fs::set_permissions(companion, permissions).unwrap();
    world.force_approved(&candidate.id).await;
    let error = world.skills.apply(&candidate.id).await.unwrap_err();
    assert!(matches!(error, SkillError::Stale(_)), "{error}");
    assert_eq!(
        std::fs::read_to_string(&builtin).unwrap(),
        "built-in skill\n"
    );
    assert_eq!(
        std::fs::read_to_string(companion).unwrap(),
        "read-only companion\n"
    );
    assert_eq!(
        world
            .skills
            .candidate(&candidate.id)
            .await
            .unwrap()
            .state
            .as_str(),
        "stale"
    );
}

/// Simulates process loss after the operation and its snapshots were persisted: `prepare` ran,
/// the effect and `finish` did not. `file` is what the filesystem shows at restart.
async fn crashed_between_snapshot_and_rename(db: TestDb, file: Option<&str>) -> (World, String) {
    let world = world(db).await;
    let candidate = world.promoted_candidate("Migrations", SUMMARY).await;
    world.force_approved(&candidate.id).await;
    let operation = world
        .skills
        .prepare(&candidate.id, OperationKind::Apply)
        .await
        .unwrap();
    assert_eq!(operation.before, None);
    assert_eq!(operation.after, candidate.content);
    assert_eq!(
        world
            .skills
            .candidate(&candidate.id)
            .await
            .unwrap()
            .state
            .as_str(),
        "applying"
    );
    let target = Path::new(&candidate.target_path);
    match file {
        Some("after") => {
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(target, candidate.content.as_deref().unwrap()).unwrap();
        }
        Some(other) => {
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(target, other).unwrap();
        }
        None => {}
    }
    (world, candidate.id)
}

async fn a_crash_after_the_rename_reconciles_to_applied(db: TestDb) {
    let (world, id) = crashed_between_snapshot_and_rename(db, Some("after")).await;
    let report = world.skills.reconcile_skills().await.unwrap();
    assert_eq!(report.applied, vec![id.clone()]);
    let candidate = world.skills.candidate(&id).await.unwrap();
    assert_eq!(candidate.state.as_str(), "applied");
    // Undo works from the reconciled state and restores the exact before (absent).
    world.skills.undo(&id).await.unwrap();
    assert!(!Path::new(&candidate.target_path).exists());
}

async fn a_crash_before_the_rename_reconciles_to_not_applied(db: TestDb) {
    let (world, id) = crashed_between_snapshot_and_rename(db, None).await;
    let report = world.skills.reconcile_skills().await.unwrap();
    assert_eq!(report.not_applied, vec![id.clone()]);
    let candidate = world.skills.candidate(&id).await.unwrap();
    assert_eq!(
        candidate.state.as_str(),
        "approved",
        "not applied: it can be applied again explicitly"
    );
    assert!(
        !Path::new(&candidate.target_path).exists(),
        "never replayed"
    );
    let state: String = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT state FROM skill_operation"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!(state, "not_applied");
}

async fn a_crash_leaving_a_third_state_reconciles_to_uncertain(db: TestDb) {
    let (world, id) = crashed_between_snapshot_and_rename(db, Some("half-written\n")).await;
    let report = world.skills.reconcile_skills().await.unwrap();
    assert_eq!(report.uncertain, vec![id.clone()]);
    let candidate = world.skills.candidate(&id).await.unwrap();
    assert_eq!(candidate.state.as_str(), "uncertain");
    assert_eq!(
        std::fs::read_to_string(&candidate.target_path).unwrap(),
        "half-written\n",
        "never replayed or removed"
    );
    assert!(matches!(
        world.skills.apply(&id).await.unwrap_err(),
        SkillError::Conflict(_)
    ));
}

async fn a_busy_writer_is_skipped_by_reconciliation(db: TestDb) {
    let (world, id) = crashed_between_snapshot_and_rename(db, Some("after")).await;
    let candidate = world.skills.candidate(&id).await.unwrap();
    let target = std::path::PathBuf::from(&candidate.target_path);
    // Another writer holds the path lock (on its own thread, as another process would).
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        zuno_shared::managed_file::with_lock(&target, || {
            locked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            Ok(())
        })
        .unwrap();
    });
    locked_rx.recv().unwrap();
    let report = world.skills.reconcile_skills().await.unwrap();
    assert_eq!(report.busy, vec![id.clone()]);
    assert_eq!(
        world.skills.candidate(&id).await.unwrap().state.as_str(),
        "applying"
    );
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(
        world.skills.reconcile_skills().await.unwrap().applied,
        vec![id]
    );
}

async fn concurrent_apply_attempts_have_one_winner(db: TestDb) {
    let world = world(db).await;
    let candidate = world.promoted_candidate("Migrations", SUMMARY).await;
    world.force_approved(&candidate.id).await;
    let other = zuno_shared::skills::SkillService::new(
        zuno_shared::ledger::Ledger::new(
            world.db.reopen().await,
            zuno_shared::clock::system_clock(),
        ),
        world.config.clone(),
    );
    let (a, b) = tokio::join!(
        world.skills.apply(&candidate.id),
        other.apply(&candidate.id)
    );
    let wins = [a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count();
    assert_eq!(wins, 1, "{a:?} {b:?}");
    let loser = match (a, b) {
        (Ok(_), Err(loser)) | (Err(loser), Ok(_)) => loser,
        other => panic!("exactly one apply must win: {other:?}"),
    };
    assert!(matches!(loser, SkillError::Conflict(_)), "{loser}");
    assert_eq!(
        std::fs::read_to_string(&candidate.target_path).unwrap(),
        candidate.content.unwrap()
    );
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM skill_operation").await,
        1
    );
}

#[cfg(unix)]
async fn a_symlinked_skills_directory_is_refused(db: TestDb) {
    let world = world(db).await;
    let outside = world.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, world.worktree.join(".agents")).unwrap();
    let session = world.session().await;
    let experience = world.experience(&session, "Migrations", SUMMARY).await;
    let error = world
        .skills
        .promote_experience(PROJECT, &experience)
        .await
        .unwrap_err();
    assert!(matches!(error, SkillError::File(_)), "{error}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written through the link"
    );
}

on_both_backends!(
    apply_with_source_drift_marks_the_candidate_stale,
    a_read_only_skill_gets_a_companion_and_a_read_only_companion_is_stale,
    a_crash_after_the_rename_reconciles_to_applied,
    a_crash_before_the_rename_reconciles_to_not_applied,
    a_crash_leaving_a_third_state_reconciles_to_uncertain,
    a_busy_writer_is_skipped_by_reconciliation,
    concurrent_apply_attempts_have_one_winner,
    a_symlinked_skills_directory_is_refused,
);
