//! Mining: the count gates, semantic grouping with validated citations, rejection suppression and
//! reopening, promotion, and one job per bucket and evidence identity.

use std::sync::Arc;

use serde_json::json;
use zuno_shared::ledger::{AllowAll, ClaimRequest, JobKind, JobState};
use zuno_shared::skills::SkillError;
use zuno_shared::skills::pattern::{self, Group, Merge};
use zuno_tests::fake_provider::{FakeProvider, Gate, Reply};
use zuno_tests::{TestDb, eventually, on_both_backends};

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
    assert_eq!(candidate.operation.as_str(), "apply");
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
    assert_eq!(candidate.source_kind.as_str(), "absent");
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
            .scalar("SELECT COUNT(*) FROM learning_aggregation WHERE watermark_seq > 0")
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
    assert_eq!(promoted.pattern.origin.as_str(), "promote");
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
    // New evidence joins the queued job of the bucket: it has not read its inputs yet.
    let session = world.session().await;
    world.experience(&session, "x", "x").await;
    let again = world.skills.admit_checks().await.unwrap();
    assert!(!again[0].is_new());
    assert_eq!(again[0].job().id, a[0].job().id);
    assert_eq!(world.jobs(JobKind::AggregateProject).await.len(), 1);
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// The experience ids the model was shown in request `index`.
fn offered_ids(provider: &FakeProvider, index: usize) -> Vec<String> {
    let request = &provider.requests()[index];
    let user = request.body["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no user message in {}", request.body))
        .to_owned();
    let input = user
        .trim_start_matches("<input>\n")
        .trim_end_matches("\n</input>");
    let input: serde_json::Value = serde_json::from_str(input).unwrap();
    sorted(
        input["experiences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect(),
    )
}

async fn three_in_new_sessions(world: &World, texts: [&str; 3]) -> Vec<String> {
    let mut ids = Vec::new();
    for text in texts {
        let session = world.session().await;
        ids.push(world.experience(&session, text, text).await);
    }
    ids
}

const LINT: [&str; 3] = [
    "Run the linter before pushing",
    "Lint before you push",
    "Never push unlinted code",
];

fn lint_groups(ids: &[String]) -> Reply {
    groups(
        json!([{ "pattern_id": null, "concept": "Lint first", "rules": ["Run the linter before pushing."], "experience_ids": ids }]),
    )
}

async fn experiences_written_during_a_slow_aggregation_are_mined_next_time(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let first = three_in_new_sessions(
        &world,
        ["Use pnpm, not npm", "Install with pnpm", "CI uses pnpm"],
    )
    .await;
    let gate = Gate::new();
    provider.push([Reply::held(
        &gate,
        groups(
            json!([{ "pattern_id": null, "concept": "Use pnpm", "rules": ["Install packages with pnpm."], "experience_ids": first }]),
        ),
    )]);
    check(&world).await;
    // While the model is grouping, three more experiences are written.
    let write_during_the_call = async {
        eventually(
            "the aggregation's model request",
            std::time::Duration::from_secs(30),
            || async { (provider.request_count() == 1).then_some(()) },
        )
        .await;
        let late = three_in_new_sessions(&world, LINT).await;
        gate.open();
        late
    };
    let (report, late) = tokio::join!(world.run_mine(), write_during_the_call);
    assert_eq!(report.completed, 1, "{report:?}");
    assert_eq!(offered_ids(&provider, 0), sorted(first.clone()));

    provider.push([lint_groups(&late)]);
    check(&world).await;
    let report = world.run_mine().await;
    assert_eq!(report.completed, 1, "{report:?}");
    assert_eq!(
        provider.request_count(),
        2,
        "the experiences written during the first run reach the model"
    );
    assert_eq!(offered_ids(&provider, 1), sorted(late.clone()));
    let patterns = world.skills.patterns(Some(PROJECT)).await.unwrap();
    let lint = patterns
        .iter()
        .find(|p| p.concept == "Lint first")
        .expect("the late experiences became a pattern");
    assert_eq!(sorted(lint.experience_ids.clone()), sorted(late));
}

async fn an_experience_stamped_by_a_slow_host_clock_is_still_mined(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let first = three_in_new_sessions(
        &world,
        ["Use pnpm, not npm", "Install with pnpm", "CI uses pnpm"],
    )
    .await;
    provider.push([groups(
        json!([{ "pattern_id": null, "concept": "Use pnpm", "rules": ["Install packages with pnpm."], "experience_ids": first }]),
    )]);
    check(&world).await;
    assert_eq!(world.run_mine().await.completed, 1);
    // Written after that run by a host whose clock is an hour behind: older `created_at` than
    // everything already mined.
    let behind = world.ledger.now_ms() - 3_600_000;
    let mut late = Vec::new();
    for (offset, text) in LINT.into_iter().enumerate() {
        let session = world.session().await;
        late.push(
            world
                .experience_written_at(
                    PROJECT,
                    &session,
                    "correction",
                    "verified",
                    text,
                    text,
                    behind + offset as i64,
                )
                .await,
        );
    }
    provider.push([lint_groups(&late)]);
    check(&world).await;
    assert_eq!(world.run_mine().await.completed, 1);
    assert_eq!(
        provider.request_count(),
        2,
        "the late experiences are mined"
    );
    assert_eq!(offered_ids(&provider, 1), sorted(late));
}

async fn one_bucket_queues_one_check_and_one_follow_up_during_a_run(db: TestDb) {
    // A fixed clock keeps every check inside one bucket.
    let clock = zuno_shared::clock::ManualClock::starting_at(1_800_000_000_000);
    let world = World::with_clock(
        db,
        zuno_shared::config::Config::default(),
        std::sync::Arc::new(clock),
    )
    .await;
    // A check per new experience (as after each verified extraction) while the job is queued.
    let mut admissions = Vec::new();
    for text in [
        "Use pnpm, not npm",
        "Install with pnpm",
        "CI uses pnpm",
        "pnpm in scripts",
    ] {
        let session = world.session().await;
        world.experience(&session, text, text).await;
        admissions.push(world.skills.admit_project_check(PROJECT).await.unwrap());
    }
    assert!(admissions[0].is_new());
    let first = admissions[0].job().id.clone();
    assert!(
        admissions[1..]
            .iter()
            .all(|a| !a.is_new() && a.job().id == first),
        "{admissions:?}"
    );
    assert_eq!(world.jobs(JobKind::AggregateProject).await.len(), 1);

    // The job starts running; evidence arriving now schedules exactly one follow-up.
    let kinds = [JobKind::AggregateProject];
    let claimed = world
        .ledger
        .claim(
            &ClaimRequest {
                worker_id: "mine-1",
                kinds: &kinds,
                limit: 1,
                lease_ms: 60_000,
                scopes: None,
            },
            &AllowAll,
        )
        .await
        .unwrap()
        .claimed;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job.id, first);
    let mut during = Vec::new();
    for text in LINT {
        let session = world.session().await;
        world.experience(&session, text, text).await;
        during.push(world.skills.admit_project_check(PROJECT).await.unwrap());
    }
    assert!(
        during[0].is_new(),
        "the first new evidence schedules a follow-up"
    );
    let follow_up = during[0].job().clone();
    assert!(
        during[1..]
            .iter()
            .all(|a| !a.is_new() && a.job().id == follow_up.id),
        "later evidence joins the same follow-up: {during:?}"
    );
    let jobs = world.jobs(JobKind::AggregateProject).await;
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let state = |id: &str| jobs.iter().find(|j| j.id == id).unwrap().state;
    assert_eq!(state(&first), JobState::Running);
    assert_eq!(state(&follow_up.id), JobState::Queued);
    assert_eq!(follow_up.bucket_start, claimed[0].job.bucket_start);
    // Unchanged evidence does not add a third job.
    assert!(
        !world
            .skills
            .admit_project_check(PROJECT)
            .await
            .unwrap()
            .is_new()
    );
    assert_eq!(world.jobs(JobKind::AggregateProject).await.len(), 2);
}

/// A follow-up admitted while its run goes waits at the claim gate until that run has settled,
/// without spending an attempt, and is due the moment it settles: two runs of one project never
/// hold leases at once.
async fn a_follow_up_waits_for_the_run_it_follows(db: TestDb) {
    let clock = Arc::new(zuno_shared::clock::ManualClock::starting_at(
        1_800_000_000_000,
    ));
    let shared: zuno_shared::clock::SharedClock = clock.clone();
    let world = World::with_clock(db, zuno_shared::config::Config::default(), shared.clone()).await;
    let gate = zuno_shared::learning::SourceGate::new(world.config.clone(), shared);
    let kinds = [JobKind::AggregateProject];
    let request = ClaimRequest {
        worker_id: "mine-1",
        kinds: &kinds,
        limit: 2,
        lease_ms: 60_000,
        scopes: None,
    };
    let session = world.session().await;
    world
        .experience(&session, "Use pnpm, not npm", "Use pnpm, not npm")
        .await;
    let first = world.skills.admit_project_check(PROJECT).await.unwrap();
    let claimed = world.ledger.claim(&request, &gate).await.unwrap().claimed;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job.id, first.job().id);
    let session = world.session().await;
    world
        .experience(&session, "Install with pnpm", "Install with pnpm")
        .await;
    let follow_up = world.skills.admit_project_check(PROJECT).await.unwrap();
    assert!(follow_up.is_new());

    let waiting = world.ledger.claim(&request, &gate).await.unwrap();
    assert!(waiting.claimed.is_empty(), "{:?}", waiting.claimed);
    assert_eq!(waiting.deferred, 1);
    let deferred = world.ledger.get(&follow_up.job().id).await.unwrap();
    assert_eq!(deferred.state, JobState::Queued);
    assert_eq!(deferred.attempts, 0, "waiting spends no attempt");
    // Still waiting when it is due again while the run goes on.
    clock.advance(5_000);
    assert!(
        world
            .ledger
            .claim(&request, &gate)
            .await
            .unwrap()
            .claimed
            .is_empty()
    );

    world
        .ledger
        .begin_settlement(&claimed[0].lease)
        .await
        .unwrap()
        .complete(serde_json::json!({}))
        .await
        .unwrap();
    // Due at once: the settlement of the run it waited for moved it forward.
    let next = world.ledger.claim(&request, &gate).await.unwrap().claimed;
    assert_eq!(
        next.len(),
        1,
        "the follow-up runs as soon as its run settled"
    );
    assert_eq!(next[0].job.id, follow_up.job().id);
    assert_eq!(next[0].job.attempts, 1);
}

/// Two queued runs of one project claimed in one batch: the earlier runs, the later waits.
async fn of_two_runs_claimed_together_only_the_earlier_proceeds(db: TestDb) {
    let clock = Arc::new(zuno_shared::clock::ManualClock::starting_at(
        1_800_000_000_000,
    ));
    let shared: zuno_shared::clock::SharedClock = clock.clone();
    let world = World::with_clock(db, zuno_shared::config::Config::default(), shared.clone()).await;
    let gate = zuno_shared::learning::SourceGate::new(world.config.clone(), shared);
    let kinds = [JobKind::AggregateProject];
    let request = ClaimRequest {
        worker_id: "mine-1",
        kinds: &kinds,
        limit: 2,
        lease_ms: 60_000,
        scopes: None,
    };
    // Two buckets of one project, both queued.
    let session = world.session().await;
    world
        .experience(&session, "Use pnpm, not npm", "Use pnpm, not npm")
        .await;
    let earlier = world.skills.admit_project_check(PROJECT).await.unwrap();
    clock.advance(i64::try_from(world.config.learning.aggregation.interval_ms).unwrap());
    let session = world.session().await;
    world
        .experience(&session, "Install with pnpm", "Install with pnpm")
        .await;
    let later = world.skills.admit_project_check(PROJECT).await.unwrap();
    assert!(later.is_new());
    assert_ne!(earlier.job().id, later.job().id);

    let batch = world.ledger.claim(&request, &gate).await.unwrap();
    let ids: Vec<_> = batch.claimed.iter().map(|c| c.job.id.clone()).collect();
    assert_eq!(ids, [earlier.job().id.clone()]);
    assert_eq!(batch.deferred, 1);
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
    experiences_written_during_a_slow_aggregation_are_mined_next_time,
    an_experience_stamped_by_a_slow_host_clock_is_still_mined,
    one_bucket_queues_one_check_and_one_follow_up_during_a_run,
    a_follow_up_waits_for_the_run_it_follows,
    of_two_runs_claimed_together_only_the_earlier_proceeds,
);

/// On Postgres, transactions commit in any order; the experience sequence must not. A second
/// writer of the same project waits for the first one's commit, so it can never make a larger
/// `seq` visible while a smaller one is still uncommitted (a reader would pass the gap for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_experience_sequence_follows_commit_order() {
    let world = World::new(
        TestDb::postgres().await,
        zuno_shared::config::Config::default(),
    )
    .await;
    let session = world.session().await;
    let insert = "INSERT INTO experience_record (id, project_id, session_id, origin, kind, title, summary, confidence, \
                    verification, content_digest, created_at, updated_at) \
                  VALUES ($1, $2, $3, 'extraction', 'correction', 'x', 'x', 0.9, 'verified', 'd', 1, 1) RETURNING seq";
    let mut first = world.db.db.begin().await.unwrap();
    let first_seq: i64 = zuno_shared::on_tx!(&mut first, |conn| sqlx::query_scalar(insert)
        .bind("exp_first")
        .bind(PROJECT)
        .bind(&session)
        .fetch_one(conn)
        .await)
    .unwrap();
    let other = world.db.reopen().await;
    let second_session = session.clone();
    let second = tokio::spawn(async move {
        let mut tx = other.begin().await.unwrap();
        let seq: i64 = zuno_shared::on_tx!(&mut tx, |conn| sqlx::query_scalar(insert)
            .bind("exp_second")
            .bind(PROJECT)
            .bind(&second_session)
            .fetch_one(conn)
            .await)
        .unwrap();
        tx.commit().await.unwrap();
        seq
    });
    eventually(
        "the second writer waits for the first one's commit",
        std::time::Duration::from_secs(30),
        || async {
            let waiting: i64 = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO experience_record%'"
            )
            .fetch_one(pool)
            .await)
            .unwrap();
            (waiting == 1).then_some(())
        },
    )
    .await;
    assert!(!second.is_finished());
    first.commit().await.unwrap();
    let second_seq = second.await.unwrap();
    assert!(
        second_seq > first_seq,
        "{second_seq} must follow {first_seq}"
    );
}
