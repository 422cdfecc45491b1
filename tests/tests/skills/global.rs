//! Global aggregation (7-day bucket): only promoted project patterns, matched across at least two
//! independent projects, become a global pattern — never a writable global Skill — and the job
//! identity is the bucket plus a digest of the promoted evidence.

use std::sync::Arc;

use serde_json::json;
use zuno_shared::clock::{ManualClock, SharedClock};
use zuno_shared::config::Config;
use zuno_shared::ledger::{JobKind, Ledger, bucket_start};
use zuno_shared::skills::pattern::{self, Group, Merge};
use zuno_shared::skills::{SkillError, SkillService, schedule};
use zuno_tests::fake_provider::FakeProvider;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{PROJECT, World, groups, model_config};

const OTHER: &str = "other";
const START: i64 = 1_800_000_000_000;
const WEEK: i64 = 7 * 24 * 60 * 60 * 1000;

async fn world_on(db: TestDb, config: Config) -> (World, ManualClock) {
    let clock = ManualClock::starting_at(START);
    let shared: SharedClock = Arc::new(clock.clone());
    let world = World::with_clock(db, config, shared).await;
    world.add_project(OTHER).await;
    (world, clock)
}

/// `promote <experience>` in `project`: a promoted one-evidence project pattern.
async fn promoted(world: &World, project: &str, title: &str, rule: &str) -> (String, String) {
    let session = world.session_in(project).await;
    let experience = world
        .experience_in(project, &session, "correction", "verified", title, rule)
        .await;
    let promoted = world
        .skills
        .promote_experience(project, &experience)
        .await
        .unwrap();
    assert_eq!(promoted.pattern.state.as_str(), "promoted");
    (promoted.pattern.id, experience)
}

/// An open (never promoted) project pattern over `rule`.
async fn open_pattern(world: &World, project: &str, rule: &str) -> String {
    let session = world.session_in(project).await;
    let experience = world
        .experience_in(project, &session, "correction", "verified", rule, rule)
        .await;
    let group = Group {
        pattern_id: None,
        concept: rule.into(),
        rules: vec![rule.into()],
        experience_ids: vec![experience],
    };
    let mut tx = world.db.db.begin().await.unwrap();
    let (merge, id) = pattern::merge_project_group_in(&mut tx, project, &group, 15, None, START)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(merge, Merge::Created);
    assert_eq!(
        world.skills.pattern(&id).await.unwrap().state.as_str(),
        "open"
    );
    id
}

fn skill_files(world: &World) -> Vec<std::path::PathBuf> {
    [world.worktree.clone(), world.dir.path().join(OTHER)]
        .into_iter()
        .map(|w| w.join(".agents"))
        .filter(|p| p.exists())
        .collect()
}

async fn promoted_patterns_matched_across_two_projects_make_one_global_pattern_and_no_skill(
    db: TestDb,
) {
    let provider = FakeProvider::start().await;
    let (world, _clock) = world_on(db, model_config(provider.base_url())).await;
    let (pnpm_here, exp_here) = promoted(&world, PROJECT, "npm used", "Use pnpm, not npm").await;
    let (lint_here, _) = promoted(&world, PROJECT, "lint", "Run the linter before pushing").await;
    let (pnpm_there, exp_there) =
        promoted(&world, OTHER, "installs", "Install dependencies with pnpm").await;
    let candidates_before = world.scalar("SELECT COUNT(*) FROM skill_candidate").await;
    assert_eq!(
        candidates_before, 3,
        "one companion per promoted experience"
    );

    // Different wording of one rule across the two projects is one group; the lint rule is
    // matched in one project only.
    provider.push([groups(json!([
        { "concept": "Use pnpm", "rules": ["Install packages with pnpm, never npm."], "pattern_ids": [pnpm_here, pnpm_there] },
        { "concept": "Lint first", "rules": ["Run the linter before pushing."], "pattern_ids": [lint_here] },
    ]))]);
    world.skills.admit_checks().await.unwrap();
    let report = world.run_mine().await;
    assert_eq!(report.failed, 0, "{report:?}");
    assert_eq!(
        provider.request_count(),
        1,
        "one grouping request (the project checks are below their count gate)"
    );
    let offered = provider.requests()[0].body.to_string();
    for id in [&pnpm_here, &lint_here, &pnpm_there] {
        assert!(offered.contains(id.as_str()), "{id} offered: {offered}");
    }

    let global = world.skills.patterns(None).await.unwrap();
    assert_eq!(global.len(), 1, "{global:?}");
    let global = &global[0];
    assert_eq!(global.scope.as_str(), "global");
    assert_eq!(global.project_id, None);
    assert_eq!(global.state.as_str(), "open");
    assert_eq!(global.project_count, 2);
    assert_eq!(global.evidence_count, 2);
    let mut expected = vec![exp_here.clone(), exp_there.clone()];
    expected.sort();
    assert_eq!(global.experience_ids, expected);
    assert_eq!(global.rules, vec!["Install packages with pnpm, never npm."]);
    let job = world.jobs(JobKind::AggregateGlobal).await.remove(0);
    let result = job.result.unwrap();
    assert_eq!(result["outcome"], "aggregated", "{result}");
    assert_eq!(result["globalPatterns"].as_array().unwrap().len(), 1);
    assert_eq!(result["globalPatterns"][0]["projects"], 2);

    // Never a global Skill: no candidate for it, nothing written anywhere.
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM skill_candidate").await,
        candidates_before
    );
    assert_eq!(
        world
            .scalar(
                "SELECT COUNT(*) FROM skill_candidate WHERE pattern_id IN \
                 (SELECT id FROM learning_pattern WHERE scope = 'global')"
            )
            .await,
        0
    );
    assert!(skill_files(&world).is_empty(), "{:?}", skill_files(&world));
    // Promoting it needs a project to receive a (reviewed) companion: it never writes globally.
    let error = world
        .skills
        .promote_pattern(&global.id, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            SkillError::Invalid {
                field: "projectId",
                ..
            }
        ),
        "{error}"
    );
    let companion = world
        .skills
        .promote_pattern(&global.id, Some(PROJECT))
        .await
        .unwrap()
        .candidate
        .expect("a project companion");
    assert_eq!(companion.project_id, PROJECT);
    assert_eq!(
        companion.state.as_str(),
        "pending",
        "review and evaluation still apply"
    );
    assert!(
        std::path::Path::new(&companion.target_path).starts_with(&world.worktree),
        "{}",
        companion.target_path
    );
    assert!(skill_files(&world).is_empty(), "promotion writes no file");
}

async fn a_single_project_or_unpromoted_patterns_make_no_global_pattern(db: TestDb) {
    let provider = FakeProvider::start().await;
    let (world, _clock) = world_on(db, model_config(provider.base_url())).await;
    // Two promoted patterns with the same rule, but in one project; the other project's
    // matching pattern is only open.
    promoted(&world, PROJECT, "npm", "Use pnpm, not npm").await;
    promoted(&world, PROJECT, "npm again", "Use pnpm, not npm").await;
    let unpromoted = open_pattern(&world, OTHER, "Use pnpm, not npm").await;
    world.skills.admit_checks().await.unwrap();
    let report = world.run_mine().await;
    assert_eq!(report.failed, 0, "{report:?}");
    assert_eq!(
        provider.request_count(),
        0,
        "skipped without a model request"
    );
    let jobs = world.jobs(JobKind::AggregateGlobal).await;
    assert_eq!(jobs.len(), 1);
    let result = jobs[0].result.clone().unwrap();
    assert_eq!(result["outcome"], "skipped", "{result}");
    assert_eq!(result["projects"], 1);
    assert!(world.skills.patterns(None).await.unwrap().is_empty());

    // Once the other project's pattern is promoted, two projects qualify — but a group whose
    // patterns all come from one project is still no global pattern.
    let here: Vec<String> = world
        .skills
        .patterns(Some(PROJECT))
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect();
    world
        .skills
        .promote_pattern(&unpromoted, None)
        .await
        .unwrap();
    provider.push([groups(json!([
        { "concept": "pnpm here", "rules": ["Use pnpm."], "pattern_ids": here },
        { "concept": "pnpm there", "rules": ["Use pnpm."], "pattern_ids": [unpromoted] },
    ]))]);
    let report = world.run_mine().await;
    assert_eq!(
        (report.completed, report.failed),
        (1, 0),
        "promotion admitted one global check: {report:?}"
    );
    assert_eq!(provider.request_count(), 1);
    let jobs = world.jobs(JobKind::AggregateGlobal).await;
    assert_eq!(jobs.len(), 2);
    let newest = jobs
        .iter()
        .find(|j| {
            j.result
                .as_ref()
                .is_some_and(|r| r["outcome"] == "aggregated")
        })
        .expect("the second check aggregated");
    assert_eq!(newest.result.as_ref().unwrap()["globalPatterns"], json!([]));
    assert!(world.skills.patterns(None).await.unwrap().is_empty());
    assert!(skill_files(&world).is_empty());
}

async fn promoted_digest(world: &World) -> String {
    let mut tx = world.db.db.begin().await.unwrap();
    let digest = schedule::promoted_evidence_digest_in(&mut tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    digest
}

async fn the_global_job_is_one_per_bucket_and_promoted_evidence_digest(db: TestDb) {
    let (world, clock) = world_on(db, Config::default()).await;
    assert_eq!(
        world.config.learning.global_promotion.interval_ms, WEEK as u64,
        "the global bucket is seven days"
    );
    promoted(&world, PROJECT, "npm", "Use pnpm, not npm").await;
    promoted(&world, OTHER, "npm", "Use pnpm, not npm").await;
    let empty = pattern::evidence_digest::<&str>(&[]);
    let digest = promoted_digest(&world).await;
    assert_ne!(digest, empty);

    // Several hosts admitting together share one job for this bucket and digest.
    let other_host = SkillService::new(
        Ledger::new(world.db.reopen().await, Arc::new(clock.clone())),
        world.config.clone(),
    );
    let (a, b) = tokio::join!(world.skills.admit_checks(), other_host.admit_checks());
    let (a, b) = (a.unwrap(), b.unwrap());
    let (a, b) = (a.last().unwrap().job(), b.last().unwrap().job());
    assert_eq!(a.kind, JobKind::AggregateGlobal);
    assert_eq!(a.id, b.id);
    let jobs = world.jobs(JobKind::AggregateGlobal).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].input_digest.as_deref(), Some(digest.as_str()));
    assert_eq!(jobs[0].bucket_start, Some(bucket_start(START, WEEK)));
    assert_eq!(jobs[0].project_id, None);

    // Evidence that is not promoted does not change the identity.
    let open = open_pattern(&world, OTHER, "Run the linter before pushing").await;
    world.skills.admit_checks().await.unwrap();
    assert_eq!(promoted_digest(&world).await, digest);
    assert_eq!(world.jobs(JobKind::AggregateGlobal).await.len(), 1);

    // Changed promoted evidence is a new job in the same bucket.
    clock.advance(60_000);
    world.skills.promote_pattern(&open, None).await.unwrap();
    let changed = promoted_digest(&world).await;
    assert_ne!(changed, digest);
    other_host.admit_checks().await.unwrap();
    let jobs = world.jobs(JobKind::AggregateGlobal).await;
    assert_eq!(
        jobs.len(),
        2,
        "one new job for the new digest, shared by both admissions"
    );
    assert_eq!(jobs[0].bucket_start, jobs[1].bucket_start);
    let mut digests: Vec<_> = jobs.iter().filter_map(|j| j.input_digest.clone()).collect();
    digests.sort();
    let mut expected = vec![digest.clone(), changed.clone()];
    expected.sort();
    assert_eq!(digests, expected);

    // Both checks run over the current promoted evidence: one global pattern.
    let report = world.run_mine().await;
    assert_eq!(report.failed, 0, "{report:?}");
    let global = world.skills.patterns(None).await.unwrap();
    assert_eq!(global.len(), 1, "{global:?}");
    assert_eq!((global[0].project_count, global[0].version), (2, 1));

    // The next bucket is new work even with unchanged evidence.
    clock.advance(WEEK);
    world.skills.admit_checks().await.unwrap();
    let jobs = world.jobs(JobKind::AggregateGlobal).await;
    assert_eq!(jobs.len(), 3);
    assert!(jobs.iter().any(
        |j| j.bucket_start == Some(bucket_start(START + WEEK + 60_000, WEEK))
            && j.input_digest.as_deref() == Some(changed.as_str())
    ));
    let report = world.run_mine().await;
    assert_eq!(report.failed, 0, "{report:?}");
    let again = world.skills.patterns(None).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].version, again[0].state.as_str()),
        (global[0].version, "open"),
        "unchanged evidence and rules keep the global pattern and its version"
    );
}

on_both_backends!(
    promoted_patterns_matched_across_two_projects_make_one_global_pattern_and_no_skill,
    a_single_project_or_unpromoted_patterns_make_no_global_pattern,
    the_global_job_is_one_per_bucket_and_promoted_evidence_digest,
);
