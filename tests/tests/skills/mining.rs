//! Mining: the count gates, semantic grouping with validated citations, rejection suppression and
//! reopening, promotion, and one job per bucket and evidence identity.

use serde_json::json;
use zuno_shared::ledger::{JobKind, JobState};
use zuno_shared::skills::SkillError;
use zuno_shared::skills::pattern::{self, Group, Merge};
use zuno_tests::fake_provider::FakeProvider;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{PROJECT, World, groups, model_config};

async fn check(world: &World) {
    world.skills.admit_project_check(PROJECT).await.unwrap();
}

async fn fewer_than_three_new_experiences_skip_without_a_model_request(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    for text in ["Use pnpm, not npm", "Install with pnpm"] {
        let session = world.session().await;
        world.experience(&session, text, text).await;
    }
    check(&world).await;
    let report = world.run_mine().await;
    assert_eq!(report.completed, 1, "{report:?}");
    assert_eq!(provider.request_count(), 0, "the gate needs no model");
    let job = &world.jobs(JobKind::AggregateProject).await[0];
    let result = job.result.clone().unwrap();
    assert_eq!(result["outcome"], "skipped", "{result}");
    assert_eq!(result["newRecords"], 2);
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM learning_pattern").await,
        0
    );
}

async fn three_sessions_are_needed_for_an_automatic_candidate(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    // Three new records, but only two independent sessions.
    let first = world.session().await;
    let second = world.session().await;
    let a = world
        .experience(&first, "npm used", "Use pnpm, not npm")
        .await;
    let b = world
        .experience(&first, "npm again", "Install packages with pnpm")
        .await;
    let c = world
        .experience(
            &second,
            "lockfile",
            "pnpm keeps the lockfile consistent; never npm",
        )
        .await;
    provider.push([groups(json!([{ "pattern_id": null, "concept": "Use pnpm", "rules": ["Install packages with pnpm, never npm."], "experience_ids": [a, b, c] }]))]);
    check(&world).await;
    assert_eq!(world.run_mine().await.completed, 1);
    let patterns = world.skills.patterns(Some(PROJECT)).await.unwrap();
    assert_eq!(
        patterns.len(),
        1,
        "different wording of one rule is one group"
    );
    assert_eq!(patterns[0].session_count, 2);
    assert_eq!(patterns[0].evidence_count, 3);
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM skill_candidate").await,
        0,
        "two sessions are not enough"
    );

    // Three more new records; one in a third session. The model continues the pattern.
    let third = world.session().await;
    let d = world
        .experience(&third, "npm ci", "CI must use pnpm install")
        .await;
    let e = world
        .experience(&first, "unrelated", "Run the linter before pushing")
        .await;
    let f = world
        .experience(&second, "unrelated 2", "Lint before you push")
        .await;
    provider.push([groups(json!([
        { "pattern_id": patterns[0].id, "concept": "Use pnpm", "rules": ["Use pnpm in CI too."], "experience_ids": [d] },
        { "pattern_id": null, "concept": "Lint first", "rules": ["Run the linter before pushing."], "experience_ids": [e, f] },
    ]))]);
    check(&world).await;
    assert_eq!(world.run_mine().await.completed, 1);
    let pattern = world.skills.pattern(&patterns[0].id).await.unwrap();
    assert_eq!(pattern.session_count, 3);
    assert_eq!(pattern.version, 2);
    assert_eq!(pattern.rules.len(), 2);
    let candidates = world.skills.candidates(PROJECT, None).await.unwrap();
    assert_eq!(
        candidates.len(),
        1,
        "only the pattern with three sessions gets a candidate"
    );
    let candidate = &candidates[0];
    assert_eq!(candidate.pattern_id.as_deref(), Some(pattern.id.as_str()));
    assert_eq!(candidate.state.as_str(), "pending");
    assert_eq!(candidate.operation, "apply");
    assert_eq!(candidate.evidence.len(), 4);
    assert!(
        candidate
            .target_path
            .ends_with(".agents/skills/use-pnpm/SKILL.md"),
        "{}",
        candidate.target_path
    );
    let content = candidate.content.as_deref().unwrap();
    assert!(
        content.contains("- Install packages with pnpm, never npm.")
            && content.contains("- Use pnpm in CI too."),
        "{content}"
    );
    assert!(
        candidate
            .diff
            .starts_with("--- /dev/null\n+++ b/.agents/skills/use-pnpm/SKILL.md"),
        "{}",
        candidate.diff
    );
    assert_eq!(candidate.source_kind, "absent");
    assert!(candidate.writable && !candidate.companion);
}

async fn a_bad_cited_id_gets_one_repair(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let mut ids = Vec::new();
    for text in [
        "Use pnpm, not npm",
        "Install with pnpm please",
        "npm is wrong here; pnpm",
    ] {
        let session = world.session().await;
        ids.push(world.experience(&session, text, text).await);
    }
    provider.push([
        groups(json!([{ "concept": "pnpm", "rules": ["Use pnpm."], "experience_ids": [ids[0], "exp_invented"] }])),
        groups(json!([{ "concept": "pnpm", "rules": ["Use pnpm."], "experience_ids": ids }])),
    ]);
    check(&world).await;
    assert_eq!(world.run_mine().await.completed, 1);
    assert_eq!(provider.request_count(), 2, "exactly one repair");
    let repair = provider.requests()[1].body.to_string();
    assert!(
        repair.contains("exp_invented") && repair.contains("not one of the ids given"),
        "{repair}"
    );
    let patterns = world.skills.patterns(Some(PROJECT)).await.unwrap();
    assert_eq!(patterns.len(), 1);
    assert_eq!(patterns[0].session_count, 3);
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM skill_candidate").await,
        1
    );
}

async fn a_bad_cited_id_twice_fails_and_writes_nothing(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let mut ids = Vec::new();
    for text in ["a rule", "the rule", "rule again"] {
        let session = world.session().await;
        ids.push(world.experience(&session, text, text).await);
    }
    // An unresolved issue is never offered, so citing it is citing an unknown id.
    let session = world.session().await;
    let issue = world
        .experience_of(
            &session,
            "unresolved_issue",
            "verified",
            "open bug",
            "still broken",
        )
        .await;
    let bad =
        groups(json!([{ "concept": "x", "rules": ["Do x."], "experience_ids": [ids[0], issue] }]));
    provider.push([bad.clone(), bad]);
    check(&world).await;
    assert_eq!(world.run_mine().await.failed, 1);
    assert_eq!(
        world.jobs(JobKind::AggregateProject).await[0].state,
        JobState::Failed
    );
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM learning_pattern").await,
        0
    );
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM learning_aggregation")
            .await,
        0,
        "the watermark did not move"
    );
    let offered = provider.requests()[0].body.to_string();
    assert!(
        !offered.contains(&issue),
        "unresolved issues are never pattern evidence"
    );
}

async fn a_rejected_pattern_is_suppressed_until_new_evidence_reopens_it(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let mut ids = Vec::new();
    for text in ["Use pnpm", "pnpm only", "never npm"] {
        let session = world.session().await;
        ids.push(world.experience(&session, text, text).await);
    }
    provider.push([groups(
        json!([{ "concept": "pnpm", "rules": ["Use pnpm."], "experience_ids": ids }]),
    )]);
    check(&world).await;
    world.run_mine().await;
    let pattern = world
        .skills
        .patterns(Some(PROJECT))
        .await
        .unwrap()
        .remove(0);
    let rejected = world.skills.reject_pattern(&pattern.id).await.unwrap();
    assert_eq!(rejected.state.as_str(), "rejected");
    assert_eq!(rejected.rejected_version, Some(rejected.version));
    assert_eq!(
        rejected.rejected_digest.as_deref(),
        Some(rejected.evidence_digest.as_str())
    );
    let candidate = world
        .skills
        .candidates(PROJECT, None)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        candidate.state.as_str(),
        "rejected",
        "its candidate is rejected with it"
    );

    // The same evidence, even under another concept and wording, stays suppressed.
    let same = Group {
        pattern_id: None,
        concept: "Package manager".into(),
        rules: vec!["Prefer pnpm.".into()],
        experience_ids: ids.clone(),
    };
    let mut tx = world.db.db.begin().await.unwrap();
    let (merge, id) = pattern::merge_project_group_in(&mut tx, PROJECT, &same, 15, None, 1)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (merge, id.as_str()),
        (Merge::Suppressed, pattern.id.as_str())
    );
    let after = world.skills.pattern(&pattern.id).await.unwrap();
    assert_eq!(
        (after.state.as_str(), after.version),
        ("rejected", rejected.version)
    );

    // New evidence through the miner reopens it for review.
    let session = world.session().await;
    let mut more = Vec::new();
    for text in ["pnpm in CI", "pnpm for scripts", "pnpm workspace"] {
        more.push(world.experience(&session, text, text).await);
    }
    provider.push([groups(json!([{ "pattern_id": pattern.id, "concept": "pnpm", "rules": ["Use pnpm."], "experience_ids": more }]))]);
    check(&world).await;
    world.run_mine().await;
    let reopened = world.skills.pattern(&pattern.id).await.unwrap();
    assert_eq!(reopened.state.as_str(), "open");
    assert_eq!(reopened.version, rejected.version + 1);
    assert_eq!(reopened.evidence_count, 6);
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM skill_candidate WHERE state = 'pending'")
            .await,
        1,
        "reopened: a new candidate version"
    );
}

async fn unchanged_evidence_keeps_a_promoted_pattern_and_its_version(db: TestDb) {
    let world = World::new(db, zuno_shared::config::Config::default()).await;
    let mut ids = Vec::new();
    for text in ["Use pnpm", "pnpm only", "never npm"] {
        let session = world.session().await;
        ids.push(world.experience(&session, text, text).await);
    }
    let group = Group {
        pattern_id: None,
        concept: "pnpm".into(),
        rules: vec!["Use pnpm.".into()],
        experience_ids: ids.clone(),
    };
    let mut tx = world.db.db.begin().await.unwrap();
    let (merge, id) = pattern::merge_project_group_in(&mut tx, PROJECT, &group, 15, None, 1)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(merge, Merge::Created);
    let promoted = world.skills.promote_pattern(&id, None).await.unwrap();
    assert_eq!(promoted.pattern.state.as_str(), "promoted");
    assert!(promoted.candidate.is_some());
    let mut tx = world.db.db.begin().await.unwrap();
    let (merge, _) = pattern::merge_project_group_in(&mut tx, PROJECT, &group, 15, None, 2)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(merge, Merge::Unchanged);
    let after = world.skills.pattern(&id).await.unwrap();
    assert_eq!(
        (after.state.as_str(), after.version),
        ("promoted", promoted.pattern.version)
    );
    // Promotion admitted a global check keyed by the promoted evidence.
    assert_eq!(world.jobs(JobKind::AggregateGlobal).await.len(), 1);
}

async fn promote_bypasses_the_count_gate_but_not_review(db: TestDb) {
    let world = World::new(db, zuno_shared::config::Config::default()).await;
    let session = world.session().await;
    let experience = world
        .experience(&session, "Migrations", "Run migrations with zuno migrate")
        .await;
    let promoted = world
        .skills
        .promote_experience(PROJECT, &experience)
        .await
        .unwrap();
    assert_eq!(promoted.pattern.evidence_count, 1);
    assert_eq!(promoted.pattern.origin, "promote");
    let candidate = promoted.candidate.unwrap();
    assert_eq!(candidate.state.as_str(), "pending");
    assert_eq!(candidate.evaluation_state.as_str(), "none");
    // Not approved: apply is refused.
    let error = world.skills.apply(&candidate.id).await.unwrap_err();
    assert!(matches!(error, SkillError::Conflict(_)), "{error}");
    // Idempotent.
    let again = world
        .skills
        .promote_experience(PROJECT, &experience)
        .await
        .unwrap();
    assert_eq!(again.pattern.id, promoted.pattern.id);
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM skill_candidate").await,
        1
    );
    // Unresolved issues can never be promoted.
    let issue = world
        .experience_of(
            &session,
            "unresolved_issue",
            "verified",
            "bug",
            "still broken",
        )
        .await;
    let error = world
        .skills
        .promote_experience(PROJECT, &issue)
        .await
        .unwrap_err();
    assert!(matches!(error, SkillError::Conflict(_)), "{error}");
}

async fn several_hosts_checking_together_create_one_job(db: TestDb) {
    let world = World::new(db, zuno_shared::config::Config::default()).await;
    let other = zuno_shared::skills::SkillService::new(
        zuno_shared::ledger::Ledger::new(
            world.db.reopen().await,
            zuno_shared::clock::system_clock(),
        ),
        world.config.clone(),
    );
    let (a, b) = tokio::join!(world.skills.admit_checks(), other.admit_checks());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a[0].job().id, b[0].job().id);
    assert_eq!(world.jobs(JobKind::AggregateProject).await.len(), 1);
    assert_eq!(world.jobs(JobKind::AggregateGlobal).await.len(), 1);
    // New evidence is a new identity within the same bucket.
    let session = world.session().await;
    world.experience(&session, "x", "x").await;
    world.skills.admit_checks().await.unwrap();
    let jobs = world.jobs(JobKind::AggregateProject).await;
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0].bucket_start, jobs[1].bucket_start);
}

on_both_backends!(
    fewer_than_three_new_experiences_skip_without_a_model_request,
    three_sessions_are_needed_for_an_automatic_candidate,
    a_bad_cited_id_gets_one_repair,
    a_bad_cited_id_twice_fails_and_writes_nothing,
    a_rejected_pattern_is_suppressed_until_new_evidence_reopens_it,
    unchanged_evidence_keeps_a_promoted_pattern_and_its_version,
    promote_bypasses_the_count_gate_but_not_review,
    several_hosts_checking_together_create_one_job,
);
