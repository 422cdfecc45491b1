//! Start-up reconciliation of historical `applying`/`undoing` candidates from their exact
//! snapshots: after = applied, before = not applied, anything else = uncertain. Nothing is
//! replayed.

use zuno_shared::memory::service::{MemoryError, Origin};
use zuno_shared::memory::store::Scope;
use zuno_tests::processes::binary;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{Env, add, strings};
use zuno_shared::memory::store::MemoryCandidateState;

/// A candidate an older release left mid-flight (as after a crash), inserted directly.
async fn historical(
    env: &Env,
    document_id: &str,
    state: &str,
    before: &[&str],
    after: &[&str],
) -> String {
    let id = zuno_shared::ids::new_id("mcand");
    let sql = "INSERT INTO memory_candidate (id, document_id, project_id, target, action, content, reason, confidence, origin, \
                 state, base_revision, before_entries, after_entries, created_at, updated_at) \
               VALUES ($1, $2, 'proj', 'project', 'add', 'historical', 'from an older release', 0.9, 'tool', $3, 1, $4, $5, 1, 1)";
    zuno_shared::on_db!(env.db.db, |pool| sqlx::query(sql)
        .bind(&id)
        .bind(document_id)
        .bind(state)
        .bind(serde_json::to_string(before).unwrap())
        .bind(serde_json::to_string(after).unwrap())
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
    .expect("insert historical candidate");
    id
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

async fn historical_mutations_are_classified_from_their_snapshots_never_replayed(db: TestDb) {
    let env = Env::new(db).await;
    env.apply(add(Scope::Project, "A", Origin::Tool)).await;
    env.apply(add(Scope::Project, "B", Origin::Tool)).await;
    let document = env.document_id(Scope::Project).await;
    let file_before = std::fs::read(env.rules_path()).unwrap();
    // The document now holds exactly [A, B].
    let apply_done = historical(&env, &document, "applying", &["A"], &["A", "B"]).await;
    let apply_not_done =
        historical(&env, &document, "applying", &["A", "B"], &["A", "B", "C"]).await;
    let apply_third = historical(&env, &document, "applying", &["X"], &["Y"]).await;
    // An undo's target is the apply's `before`.
    let undo_done = historical(&env, &document, "undoing", &["A", "B"], &["A", "B", "D"]).await;
    let undo_not_done = historical(&env, &document, "undoing", &["A"], &["A", "B"]).await;
    let undo_third = historical(&env, &document, "undoing", &["Q"], &["R"]).await;

    let report = env.memory.reconcile().await.unwrap();
    assert_eq!(
        sorted(report.applied.clone()),
        sorted(vec![apply_done.clone(), undo_done.clone()])
    );
    assert_eq!(
        sorted(report.not_applied.clone()),
        sorted(vec![apply_not_done.clone(), undo_not_done.clone()])
    );
    assert_eq!(
        sorted(report.uncertain.clone()),
        sorted(vec![apply_third.clone(), undo_third.clone()])
    );
    for (id, state) in [
        (&apply_done, MemoryCandidateState::Applied),
        (&apply_not_done, MemoryCandidateState::Pending),
        (&apply_third, MemoryCandidateState::Uncertain),
        (&undo_done, MemoryCandidateState::Undone),
        (&undo_not_done, MemoryCandidateState::Applied),
        (&undo_third, MemoryCandidateState::Uncertain),
    ] {
        let candidate = env.candidate(id).await;
        assert_eq!(candidate.state, state, "{id}");
        assert!(
            candidate
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("reconciled")),
            "{candidate:?}"
        );
    }

    // Never replayed: entries, revision, history and the file are exactly as they were.
    assert_eq!(env.entries(Scope::Project).await, strings(&["A", "B"]));
    assert_eq!(env.revision(Scope::Project).await, 2);
    assert_eq!(env.revisions(Scope::Project).await.len(), 2);
    assert_eq!(std::fs::read(env.rules_path()).unwrap(), file_before);
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_candidate WHERE state IN ('applying', 'undoing')")
            .await,
        0
    );
    // An uncertain mutation is for a person to inspect; it cannot be approved mechanically.
    assert!(matches!(
        env.memory.approve(&apply_third, None).await,
        Err(MemoryError::Conflict(_))
    ));
    assert!(matches!(
        env.memory.undo(&undo_third).await,
        Err(MemoryError::Conflict(_))
    ));

    let again = env.memory.reconcile().await.unwrap();
    assert!(again.applied.is_empty() && again.not_applied.is_empty() && again.uncertain.is_empty());
    assert!(again.restored_projections.is_empty() && again.external_edits.is_empty());
    assert_eq!(env.revision(Scope::Project).await, 2);
}

/// A host that runs only `zuno-worker-maintain` (no `zuno serve`) reconciles when the worker
/// process starts: an interrupted mutation is classified, a deleted projection is restored from
/// its revision, and an edited one is preserved and recorded as an external edit.
async fn the_maintain_worker_reconciles_and_repairs_files_when_it_starts(db: TestDb) {
    let env = Env::new(db).await;
    env.apply(add(Scope::Project, "Use pnpm.", Origin::Tool))
        .await;
    let document = env.document_id(Scope::Project).await;
    let interrupted = historical(&env, &document, "applying", &[], &["Use pnpm."]).await;
    let rules = env.rules_path();
    let accepted = std::fs::read_to_string(&rules).unwrap();
    std::fs::remove_file(&rules).unwrap();

    let other_worktree = env.dir.path().join("other-repo");
    std::fs::create_dir(&other_worktree).unwrap();
    env.project("other", &other_worktree).await;
    let mut other = add(Scope::Project, "Run cargo nextest.", Origin::Tool);
    other.project_id = Some("other".into());
    env.apply(other).await;
    let other_rules = other_worktree.join(".zuno").join("RULES.md");
    let edited = format!(
        "{}- Edited by hand.\n",
        std::fs::read_to_string(&other_rules).unwrap()
    );
    std::fs::write(&other_rules, &edited).unwrap();

    // The worker reads the same worktree roots as this world (its projections are checked
    // against them).
    let config = env.dir.path().join("config.json");
    std::fs::write(&config, serde_json::to_string(&*env.config).unwrap()).unwrap();
    let output = tokio::process::Command::new(binary("zuno-worker-maintain"))
        .args([
            "--database-url",
            &env.db.url,
            "--worker-id",
            "maintain-start",
            "--exit-when-idle",
        ])
        .env("ZUNO_HOME", &env.home)
        .env("ZUNO_CONFIG", &config)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    zuno_tests::processes::assert_succeeded(&output);
    assert_eq!(
        std::fs::read_to_string(&rules).unwrap(),
        accepted,
        "the deleted projection is restored"
    );
    assert_eq!(
        env.candidate(&interrupted).await.state,
        MemoryCandidateState::Applied
    );
    assert_eq!(
        std::fs::read_to_string(&other_rules).unwrap(),
        edited,
        "an edit is preserved"
    );
    let state: String = zuno_shared::on_db!(env.db.db, |pool| sqlx::query_scalar(
        "SELECT state FROM memory_projection WHERE path = $1"
    )
    .bind(other_rules.display().to_string())
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!(state, "external_edit");
}

on_both_backends!(
    historical_mutations_are_classified_from_their_snapshots_never_replayed,
    the_maintain_worker_reconciles_and_repairs_files_when_it_starts,
);
