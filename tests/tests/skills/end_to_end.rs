//! Done when: three sessions repeating one correction produce a candidate that can be reviewed,
//! evaluated, applied and undone end to end over the API.

use std::sync::Arc;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use zuno_shared::learning::SourceGate;
use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::{Runner, RunnerConfig};
use zuno_shared::skills::SkillService;
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{answer, grade, groups, model_config};

async fn drain(server: &TestServer) {
    let mut config = RunnerConfig::new("e2e");
    config.exit_when_idle = true;
    let learning = server.state.config.clone();
    let skills = SkillService::new(server.state.ledger.clone(), learning.clone());
    let client = LearningModelClient::new();
    Runner::new(server.state.ledger.clone(), config)
        .with_gate(Arc::new(SourceGate::new(
            learning.clone(),
            server.state.ledger.clock().clone(),
        )))
        .register(Arc::new(zuno_worker_extract::extract::ExtractHandler::new(
            learning.clone(),
            client.clone(),
        )))
        .register(Arc::new(
            zuno_worker_mine::mine::AggregateProjectHandler::new(skills.clone(), client.clone()),
        ))
        .register(Arc::new(zuno_worker_eval::eval::EvaluateHandler::new(
            skills, client,
        )))
        .run(CancellationToken::new())
        .await;
}

async fn three_sessions_repeating_one_correction_become_an_applied_and_undone_skill(db: TestDb) {
    let provider = FakeProvider::start().await;
    let mut config = model_config(provider.base_url());
    // Maintenance is another stage; keep this test to the slow path.
    config.learning.execution.timeout_ms = 10_000;
    let server = TestServer::start(&db, config, None).await;
    let worktree = tempfile::tempdir().unwrap();
    let (status, _) = server
        .post(
            "/api/projects",
            json!({"id": "web", "name": "Web", "worktree": worktree.path().display().to_string()}),
        )
        .await;
    assert_eq!(status, 201);
    for wording in [
        "No, don't use npm here; use pnpm.",
        "Wrong tool again: this repo uses pnpm, not npm.",
        "Please stop running npm. We install with pnpm.",
    ] {
        let (status, session) = server.post("/api/projects/web/sessions", json!({})).await;
        assert_eq!(status, 201, "{session}");
        let session = session["id"].as_str().unwrap().to_owned();
        server
            .post(
                &format!("/api/session/{session}/messages"),
                json!({"role": "user", "parts": [{"type": "text", "text": wording}]}),
            )
            .await;
        let (status, _) = server.post(&format!("/api/session/{session}/messages"), json!({
            "role": "assistant", "status": "completed",
            "parts": [{"type": "tool_call", "toolName": "bash", "arguments": {"command": "pnpm install"}, "result": "Done", "status": "completed"}]
        })).await;
        assert_eq!(status, 201);
    }
    // Extraction (the fake derives one cited correction per turn).
    provider.push([Reply::auto(), Reply::auto(), Reply::auto()]);
    server.drain_extraction("e2e-extract").await;
    let (_, experiences) = server.get("/api/projects/web/learn/experiences").await;
    let ids: Vec<String> = experiences["experiences"]
        .as_array()
        .or_else(|| experiences.as_array())
        .expect("experiences")
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3, "{experiences}");

    // Each extraction admitted the project check; one of them sees all three and groups them.
    provider.push([groups(json!([{ "concept": "Use pnpm", "rules": ["Install and run scripts with pnpm, never npm."], "experience_ids": ids }]))]);
    drain(&server).await;
    let (status, candidates) = server.get("/api/projects/web/skills").await;
    assert_eq!(status, 200);
    let candidates = candidates.as_array().unwrap().clone();
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    let candidate = &candidates[0];
    let id = candidate["id"].as_str().unwrap().to_owned();
    assert_eq!(candidate["state"], "pending");
    assert_eq!(candidate["evidence"].as_array().unwrap().len(), 3);
    let (_, patterns) = server.get("/api/projects/web/learn/patterns").await;
    assert_eq!(patterns[0]["sessionCount"], 3, "{patterns}");

    // Apply before review is refused.
    let (status, problem) = server
        .post(&format!("/api/skills/{id}/apply"), json!({}))
        .await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "conflict");

    // Review: three failure cases (one per cited correction), each passing.
    let (status, review) = server
        .post(&format!("/api/skills/{id}/review"), json!({}))
        .await;
    assert_eq!(status, 202, "{review}");
    assert_eq!(review["cases"], 3);
    for _ in 0..3 {
        provider.push([
            answer("npm install"),
            answer("pnpm install"),
            grade(0.0, false, false),
            grade(1.0, true, false),
        ]);
    }
    drain(&server).await;
    let (_, candidate) = server.get(&format!("/api/skills/{id}")).await;
    assert_eq!(candidate["state"], "approved", "{candidate}");
    let target = std::path::PathBuf::from(candidate["targetPath"].as_str().unwrap());
    assert!(target.starts_with(worktree.path().join(".agents/skills")));
    assert!(!target.exists());

    // Apply, then undo.
    let (status, applied) = server
        .post(&format!("/api/skills/{id}/apply"), json!({}))
        .await;
    assert_eq!(status, 200, "{applied}");
    assert_eq!(applied["state"], "applied");
    let written = std::fs::read_to_string(&target).unwrap();
    assert_eq!(written, candidate["content"].as_str().unwrap());
    assert!(written.contains("Install and run scripts with pnpm, never npm."));
    let (status, undone) = server
        .post(&format!("/api/skills/{id}/undo"), json!({}))
        .await;
    assert_eq!(status, 200, "{undone}");
    assert_eq!(undone["state"], "undone");
    assert!(
        !target.exists(),
        "undo restored the exact before state (absent)"
    );
    let (status, _) = server
        .post(&format!("/api/skills/{id}/undo"), json!({}))
        .await;
    assert_eq!(status, 409);
    let (status, _) = server.get("/api/skills/skc_unknown").await;
    assert_eq!(status, 404);
}

on_both_backends!(three_sessions_repeating_one_correction_become_an_applied_and_undone_skill);
