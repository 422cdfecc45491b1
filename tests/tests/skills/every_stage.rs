//! The auto-answering fake provider (what the compose stack runs) answers every request kind in
//! its own schema, so every learning stage completes against it with no scripted reply:
//! extraction, maintenance, project aggregation and evaluation jobs all complete and none fails,
//! on both wire formats the fake speaks (OpenAI Chat with the schema in the prompt, Anthropic
//! Messages with native structured output through a forced tool).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use zuno_shared::config::{Config, ModelConfig, ProviderApi};
use zuno_shared::learning::SourceGate;
use zuno_shared::ledger::{JobFilter, JobKind, JobState};
use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::{Runner, RunnerConfig};
use zuno_shared::skills::SkillService;
use zuno_tests::fake_provider::{FakeProvider, RequestKind, learning_config};
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

/// Drains every queued job of every learning stage with one runner, as a fleet would.
async fn drain_every_stage(server: &TestServer, name: &str) {
    let mut runner = RunnerConfig::new(name);
    runner.exit_when_idle = true;
    let config = server.state.config.clone();
    let skills = SkillService::new(server.state.ledger.clone(), config.clone());
    let client = LearningModelClient::new();
    Runner::new(server.state.ledger.clone(), runner)
        .with_gate(Arc::new(SourceGate::new(
            config.clone(),
            server.state.ledger.clock().clone(),
        )))
        .register(Arc::new(zuno_worker_extract::extract::ExtractHandler::new(
            config.clone(),
            client.clone(),
        )))
        .register(Arc::new(
            zuno_worker_maintain::maintain::MaintainHandler::new(
                config,
                server.state.memory.clone(),
                client.clone(),
            ),
        ))
        .register(Arc::new(
            zuno_worker_mine::mine::AggregateProjectHandler::new(skills.clone(), client.clone()),
        ))
        .register(Arc::new(
            zuno_worker_mine::mine::AggregateGlobalHandler::new(skills.clone(), client.clone()),
        ))
        .register(Arc::new(zuno_worker_eval::eval::EvaluateHandler::new(
            skills, client,
        )))
        .run(CancellationToken::new())
        .await;
}

fn config_for(base_url: &str, api: ProviderApi) -> Config {
    let mut config = learning_config(base_url, 10_000);
    // The repeated correction reinforces one experience (one record, one session); mining
    // groups it and proposes its Skill candidate at once.
    config.learning.aggregation.min_new_records = 1;
    config.learning.skill.min_independent_sessions = 1;
    let provider = config.providers.get_mut("fake").expect("the fake provider");
    provider.api = api;
    if api == ProviderApi::AnthropicMessages {
        provider.models.insert(
            String::from("fake-model"),
            ModelConfig {
                supports_structured_output: true,
                ..ModelConfig::default()
            },
        );
        config.learning.execution.structured_output = true;
    }
    config
}

async fn every_stage_completes_against_the_auto_answering_fake(db: TestDb, api: ProviderApi) {
    let provider = FakeProvider::start_auto("127.0.0.1:0").await.unwrap();
    let server = TestServer::start(&db, config_for(provider.base_url(), api), None).await;
    let worktree = tempfile::tempdir().unwrap();
    let (status, _) = server
        .post(
            "/api/projects",
            json!({"id": "web", "name": "Web", "worktree": worktree.path().display().to_string()}),
        )
        .await;
    assert_eq!(status, 201);
    // The same correction in three sessions: the fake's lesson reinforces one experience,
    // which mining groups into a pattern with a Skill candidate.
    for _ in 0..3 {
        let (status, session) = server.post("/api/projects/web/sessions", json!({})).await;
        assert_eq!(status, 201, "{session}");
        let session = session["id"].as_str().unwrap().to_owned();
        server
            .post(
                &format!("/api/session/{session}/messages"),
                json!({"role": "user", "parts": [{"type": "text", "text": "No, don't use npm here; use pnpm."}]}),
            )
            .await;
        let (status, _) = server.post(&format!("/api/session/{session}/messages"), json!({
            "role": "assistant", "status": "completed",
            "parts": [{"type": "tool_call", "toolName": "bash", "arguments": {"command": "pnpm install"}, "result": "Done", "status": "completed"}]
        })).await;
        assert_eq!(status, 201);
    }
    drain_every_stage(&server, "every-stage-learn").await;

    let (status, candidates) = server.get("/api/projects/web/skills").await;
    assert_eq!(status, 200, "{candidates}");
    let candidate = candidates
        .as_array()
        .and_then(|all| all.first())
        .unwrap_or_else(|| panic!("mining proposed no Skill candidate: {candidates}"));
    let id = candidate["id"].as_str().unwrap().to_owned();
    let (status, review) = server
        .post(&format!("/api/skills/{id}/review"), json!({}))
        .await;
    assert_eq!(status, 202, "{review}");
    drain_every_stage(&server, "every-stage-evaluate").await;
    let (_, reviewed) = server.get(&format!("/api/skills/{id}")).await;
    assert!(
        matches!(reviewed["state"].as_str(), Some("approved" | "rejected")),
        "the evaluation reached a verdict: {reviewed}"
    );

    let jobs = server
        .state
        .ledger
        .list(&JobFilter {
            limit: 1000,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    let failed: Vec<_> = jobs
        .iter()
        .filter(|job| job.state != JobState::Completed && job.state != JobState::Skipped)
        .map(|job| (job.kind, job.state, job.result.clone()))
        .collect();
    assert!(failed.is_empty(), "jobs that did not complete: {failed:?}");
    let mut completed: BTreeMap<&str, usize> = BTreeMap::new();
    for job in jobs.iter().filter(|job| job.state == JobState::Completed) {
        *completed.entry(job.kind.as_str()).or_default() += 1;
    }
    for kind in [
        JobKind::Extract,
        JobKind::Maintain,
        JobKind::AggregateProject,
        JobKind::Evaluate,
    ] {
        assert!(
            completed.get(kind.as_str()).is_some_and(|n| *n > 0),
            "no completed {} job: {completed:?}",
            kind.as_str()
        );
    }
    // Every stage asked the model, each in its own schema, and nothing was unrecognised.
    let asked = provider.kinds();
    for kind in [
        RequestKind::Extraction,
        RequestKind::MaintenancePlan,
        RequestKind::ProjectGrouping,
        RequestKind::EvaluationStep,
        RequestKind::EvaluationGrade,
    ] {
        assert!(
            asked.get(&kind).is_some_and(|n| *n > 0),
            "no {} request reached the fake: {asked:?}",
            kind.as_str()
        );
    }
    assert_eq!(asked.get(&RequestKind::Unknown), None, "{asked:?}");
    // The mined rule is the fake's lesson.
    let (_, patterns) = server.get("/api/projects/web/learn/patterns").await;
    assert!(
        patterns[0]["rules"]
            .to_string()
            .contains("No, don't use npm here; use pnpm."),
        "{patterns}"
    );
}

async fn every_stage_completes_over_openai_chat(db: TestDb) {
    every_stage_completes_against_the_auto_answering_fake(db, ProviderApi::OpenaiChat).await;
}

async fn every_stage_completes_over_anthropic_messages_with_native_schemas(db: TestDb) {
    every_stage_completes_against_the_auto_answering_fake(db, ProviderApi::AnthropicMessages).await;
}

on_both_backends!(
    every_stage_completes_over_openai_chat,
    every_stage_completes_over_anthropic_messages_with_native_schemas
);
