//! Mining and evaluation model calls record their tokens like extraction does: one
//! `provider_usage` row per call (retries and the repair summed), per job and project, counted
//! in status and — for background mining, not explicit reviews — in the daily token budget.

use serde_json::json;
use zuno_shared::learning::projection::project_status;
use zuno_shared::learning::usage::{self, TokenTotals};
use zuno_shared::ledger::{JobKind, JobState};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{PROJECT, World, answer, call, grade, model_config};

/// job, project, provider, model, automatic, input, output.
type UsageRow = (
    Option<String>,
    Option<String>,
    String,
    String,
    bool,
    i64,
    i64,
);

async fn usage_rows(world: &World) -> Vec<UsageRow> {
    zuno_shared::on_db!(world.db.db, |pool| sqlx::query_as(
        "SELECT job_id, project_id, provider, model, automatic, input_tokens, output_tokens \
             FROM provider_usage ORDER BY at, id"
    )
    .fetch_all(pool)
    .await)
    .unwrap()
}

fn groups_with_usage(groups: serde_json::Value, input: u64, output: u64) -> Reply {
    Reply::answer_with_usage(json!({ "groups": groups }).to_string(), input, output)
}

async fn three_experiences(world: &World) -> Vec<String> {
    let mut ids = Vec::new();
    for text in [
        "Use pnpm, not npm",
        "Install with pnpm",
        "npm is wrong; pnpm",
    ] {
        let session = world.session().await;
        ids.push(world.experience(&session, text, text).await);
    }
    ids
}

async fn a_mining_job_records_its_tokens_in_usage_status_and_the_budget(db: TestDb) {
    let provider = FakeProvider::start().await;
    let mut config = model_config(provider.base_url());
    // Room for one call's ceiling, and 500 tokens beyond it.
    let ceiling = usage::call_ceiling(&config.learning.execution);
    config.learning.execution.max_tokens_per_day = Some(ceiling + 500);
    let world = World::new(db, config).await;
    let ids = three_experiences(&world).await;
    // A bad citation, then the repaired answer: one call, both requests' tokens.
    provider.push([
        groups_with_usage(
            json!([{ "concept": "pnpm", "rules": ["Use pnpm."], "experience_ids": ["exp_invented"] }]),
            300,
            30,
        ),
        groups_with_usage(
            json!([{ "concept": "pnpm", "rules": ["Use pnpm."], "experience_ids": ids }]),
            200,
            20,
        ),
    ]);
    world.skills.admit_project_check(PROJECT).await.unwrap();
    assert_eq!(world.run_mine().await.completed, 1);
    assert_eq!(provider.request_count(), 2);
    let job = world.jobs(JobKind::AggregateProject).await.remove(0);

    assert_eq!(
        usage_rows(&world).await,
        vec![(
            Some(job.id.clone()),
            Some(PROJECT.to_owned()),
            "fake".to_owned(),
            "fake-model".to_owned(),
            true,
            500,
            50
        )],
        "one row for the call, the repair included; background mining is automatic"
    );
    let expected = TokenTotals {
        input_tokens: 500,
        output_tokens: 50,
        requests: 1,
    };
    assert_eq!(
        usage::job_totals(&world.db.db, &job.id).await.unwrap(),
        expected
    );
    let status = project_status(&world.db.db, &world.ledger, &world.config, PROJECT)
        .await
        .unwrap();
    assert_eq!(status.tokens_today, expected);
    assert_eq!(status.tokens_total, expected);
    assert_eq!(status.automatic_tokens_today, 550);
    assert!(
        status.automatic_paused,
        "mining tokens count toward the daily cap: 550 spent leave less than a call's ceiling"
    );
    let health = status.providers;
    assert_eq!(health.len(), 1);
    assert_eq!(
        (health[0].provider.as_str(), health[0].healthy),
        ("fake", true)
    );
}

async fn a_failed_mining_call_still_records_its_tokens(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    three_experiences(&world).await;
    let bad = groups_with_usage(
        json!([{ "concept": "x", "rules": ["Do x."], "experience_ids": ["exp_invented"] }]),
        70,
        7,
    );
    provider.push([bad.clone(), bad]);
    world.skills.admit_project_check(PROJECT).await.unwrap();
    assert_eq!(world.run_mine().await.failed, 1);
    let job = world.jobs(JobKind::AggregateProject).await.remove(0);
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        usage::job_totals(&world.db.db, &job.id).await.unwrap(),
        TokenTotals {
            input_tokens: 140,
            output_tokens: 14,
            requests: 1,
        }
    );
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM learning_pattern").await,
        0,
        "usage is recorded, nothing else"
    );
}

async fn an_evaluation_records_every_call_as_explicit_usage(db: TestDb) {
    let provider = FakeProvider::start().await;
    let world = World::new(db, model_config(provider.base_url())).await;
    let session = world.session().await;
    world
        .experience(&session, "Lint", "Run the linter before pushing")
        .await;
    let candidate = world
        .promoted_candidate("Migrations", "Run database migrations with zuno migrate")
        .await;
    world.skills.review(&candidate.id).await.unwrap();
    provider.push([
        call("lookup_evidence", json!({ "id": candidate.evidence[0] })),
        answer("edit the schema by hand"),
        answer("run zuno migrate"),
        grade(0.0, false, false),
        grade(1.0, true, false),
        answer("run the linter"),
        answer("run the linter"),
        grade(1.0, true, false),
        grade(1.0, true, false),
    ]);
    assert_eq!(world.run_eval().await.completed, 1);
    assert_eq!(provider.request_count(), 9);
    let job = world.jobs(JobKind::Evaluate).await.remove(0);
    let rows = usage_rows(&world).await;
    assert_eq!(rows.len(), 9, "one row per model call: {rows:?}");
    for row in &rows {
        assert_eq!(row.0.as_deref(), Some(job.id.as_str()));
        assert_eq!(row.1.as_deref(), Some(PROJECT));
        assert!(!row.4, "an explicit review is not automatic work");
        assert_eq!((row.5, row.6), (100, 20));
    }
    assert_eq!(
        usage::job_totals(&world.db.db, &job.id).await.unwrap(),
        TokenTotals {
            input_tokens: 900,
            output_tokens: 180,
            requests: 9,
        }
    );
    let status = project_status(&world.db.db, &world.ledger, &world.config, PROJECT)
        .await
        .unwrap();
    assert_eq!(status.tokens_today.input_tokens, 900);
    assert_eq!(status.automatic_tokens_today, 0);
    let health = status.providers;
    assert_eq!(
        health
            .iter()
            .map(|h| (h.provider.as_str(), h.healthy))
            .collect::<Vec<_>>(),
        [("fake", true)],
        "the evaluation's answers mark the provider healthy"
    );
}

on_both_backends!(
    a_mining_job_records_its_tokens_in_usage_status_and_the_budget,
    a_failed_mining_call_still_records_its_tokens,
    an_evaluation_records_every_call_as_explicit_usage,
);
