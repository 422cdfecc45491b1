//! Learning over HTTP: the done-when path with both extractors, and the 409/400/404 paths.

use serde_json::json;
use zuno_shared::config::{Config, ProviderApi, ProviderConfig};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_tests::server::{TestServer, decode};
use zuno_tests::{TestDb, on_both_backends};

use crate::ingestion::project_and_session;

pub(crate) async fn drain_extraction(server: &TestServer) {
    server.drain_extraction("api-test-extract").await;
}

pub(crate) async fn post_correction_turn(server: &TestServer, session: &str) {
    server.post(&format!("/api/session/{session}/messages"),
        json!({"role": "user", "parts": [{"type": "text", "text": "That's wrong: run migrations with `zuno migrate`, never by hand."}]})).await;
    let (status, _) = server.post(&format!("/api/session/{session}/messages"), json!({
        "role": "assistant", "status": "completed",
        "parts": [
            {"type": "tool_call", "toolName": "bash", "arguments": {"command": "zuno migrate"}, "result": "database is up to date", "status": "completed"},
            {"type": "text", "text": "Ran `zuno migrate`."}
        ]})).await;
    assert_eq!(status, 201);
}

fn model_config(base_url: &str) -> Config {
    let mut config = Config::default();
    config.providers.insert(
        "fake".into(),
        ProviderConfig {
            api: ProviderApi::AnthropicMessages,
            base_url: base_url.to_owned(),
            api_key_env: None,
            header_envs: Default::default(),
            small_model: Some("claude-haiku".into()),
            models: Default::default(),
        },
    );
    config
}

async fn a_correction_with_a_tool_call_becomes_verified_experience_with_the_rules_extractor(
    db: TestDb,
) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    post_correction_turn(&server, &session).await;
    drain_extraction(&server).await;
    let (status, view) = server
        .get(&format!("/api/session/{session}/learning"))
        .await;
    assert_eq!(status, 200, "{view}");
    let experience = &view["sessionExperiences"][0];
    assert_eq!(experience["verification"], "verified", "{view}");
    assert_eq!(
        experience["evidence"][0]["excerpt"],
        "That's wrong: run migrations with `zuno migrate`, never by hand."
    );
    assert_eq!(view["policy"]["generation"], "enabled");
    let id = experience["id"].as_str().unwrap();
    let (status, got) = server.get(&format!("/api/experiences/{id}")).await;
    assert_eq!((status, got["id"].as_str()), (200, Some(id)));
}

async fn a_correction_with_a_tool_call_becomes_verified_experience_with_a_model(db: TestDb) {
    let fake = FakeProvider::start().await;
    let server = TestServer::start(&db, model_config(fake.base_url()), None).await;
    let session = project_and_session(&server, "p1").await;
    // Sessions carry their model; the provider's small model is preferred for learning.
    post_correction_turn(&server, &session).await;
    fake.push([Reply::answer(json!({
        "experiences": [{"kind": "correction", "title": "Migrations run through zuno migrate",
            "summary": "Run migrations with the CLI, never by hand.", "resolution": "Ran `zuno migrate`.",
            "citations": [{"source_id": "S1", "excerpt": "run migrations with `zuno migrate`, never by hand"},
                          {"source_id": "S3", "excerpt": "database is up to date"}],
            "confidence": 0.9}],
        "memories": []}).to_string())]);
    drain_extraction(&server).await;
    let (_, view) = server
        .get(&format!("/api/session/{session}/learning"))
        .await;
    let experience = &view["sessionExperiences"][0];
    assert_eq!(experience["verification"], "verified", "{view}");
    assert_eq!(experience["evidence"].as_array().unwrap().len(), 2);
    assert_eq!(
        fake.requests()[0].path,
        "/v1/messages",
        "the Anthropic wire format was spoken"
    );
    let (_, status) = server.get("/api/projects/p1/learn/status").await;
    assert_eq!(status["extractor"], "model");
    assert!(
        status["tokensToday"]["inputTokens"].as_i64().unwrap() > 0,
        "{status}"
    );
}

async fn stale_policy_and_feedback_writes_are_409(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    let (status, policy) = server
        .get(&format!("/api/session/{session}/memory-policy"))
        .await;
    assert_eq!((status, policy["revision"].as_i64()), (200, Some(1)));
    let put = |body: serde_json::Value| {
        let request = server
            .client
            .put(server.url(&format!("/api/session/{session}/memory-policy")))
            .json(&body);
        async move { decode(request.send().await.unwrap()).await }
    };
    let (status, updated) = put(json!({"expectedRevision": 1, "useMemories": false})).await;
    assert_eq!((status, updated["revision"].as_i64()), (200, Some(2)));
    let (status, stale) = put(json!({"expectedRevision": 1, "generation": "disabled"})).await;
    assert_eq!((status, stale["code"].as_str()), (409, Some("conflict")));
    let (status, host_only) = put(json!({"expectedRevision": 2, "generation": "excluded"})).await;
    assert_eq!(
        (status, host_only["field"].as_str()),
        (400, Some("generation"))
    );

    let (_, turn) = server.post(&format!("/api/session/{session}/messages"),
        json!({"role": "assistant", "status": "completed", "parts": [{"type": "text", "text": "Done."}]})).await;
    let message = turn["message"]["id"].as_str().unwrap();
    let feedback_url = format!("/api/session/{session}/messages/{message}/feedback");
    let (status, first) = server
        .post(
            &feedback_url,
            json!({"value": "positive", "expectedRevision": 0}),
        )
        .await;
    assert_eq!(
        (status, first["feedback"]["revision"].as_i64()),
        (200, Some(1)),
        "{first}"
    );
    let (status, stale) = server
        .post(
            &feedback_url,
            json!({"value": "negative", "expectedRevision": 0}),
        )
        .await;
    assert_eq!(status, 409, "{stale}");
    let (status, _) = server
        .post(
            &feedback_url,
            json!({"value": "meh", "expectedRevision": 1}),
        )
        .await;
    assert_eq!(status, 400);
}

async fn manual_commands_over_http(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    post_correction_turn(&server, &session).await;
    let (status, reflected) = server
        .post(
            &format!("/api/session/{session}/reflect"),
            json!({"scope": "turn"}),
        )
        .await;
    assert_eq!(
        (status, reflected["admission"]["outcome"].as_str()),
        (202, Some("queued")),
        "{reflected}"
    );
    let (status, remembered) = server
        .post(
            "/api/projects/p1/learn/remember",
            json!({"text": "Use pnpm."}),
        )
        .await;
    assert_eq!(status, 201, "{remembered}");
    let (status, issue) = server
        .post("/api/projects/p1/learn/issue", json!({"text": "Flaky CI"}))
        .await;
    assert_eq!(status, 201);
    let issue_id = issue["id"].as_str().unwrap();
    let (status, solved) = server
        .post(
            &format!("/api/experiences/{issue_id}/solved"),
            json!({"resolution": "Pinned the port"}),
        )
        .await;
    assert_eq!((status, solved["kind"].as_str()), (200, Some("problem")));
    let remembered_id = remembered["id"].as_str().unwrap();
    let (status, _) = server
        .post(
            &format!("/api/experiences/{remembered_id}/solved"),
            json!({"resolution": "x"}),
        )
        .await;
    assert_eq!(status, 409, "only unresolved issues can be solved");
    let (status, forgotten) = server
        .post(
            &format!("/api/experiences/{remembered_id}/forget"),
            json!({}),
        )
        .await;
    assert_eq!(
        (status, forgotten["status"].as_str()),
        (200, Some("forgotten"))
    );
    let (status, report) = server
        .post(
            "/api/projects/p1/learn/repair-history",
            json!({"dryRun": true}),
        )
        .await;
    assert_eq!((status, report["dryRun"].as_bool()), (200, Some(true)));
    let (status, listed) = server
        .get("/api/projects/p1/learn/experiences?offset=0")
        .await;
    assert_eq!((status, listed["total"].as_i64()), (200, Some(2)));
    let (status, _) = server
        .post(
            "/api/projects/p1/learn/reprocess",
            json!({"assistantMessageId": "msg_missing"}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = server.get("/api/experiences/exp_missing").await;
    assert_eq!(status, 404);
}

/// A lesson consolidation pushes out of a full document stays Experience and is listed by the
/// audit as pushed out, with the lesson's experience (issue 29, a budget with an order).
async fn the_audit_lists_what_the_cap_pushed_out(db: TestDb) {
    let mut config = Config::default();
    config.memory.project_char_limit = 80;
    let server = TestServer::start(&db, config, None).await;
    server
        .post("/api/projects", json!({"id": "p1", "name": "p1"}))
        .await;
    let lessons = [
        "Keep every migration reversible with a down step.",
        "Run the linters before every commit you make.",
    ];
    for text in lessons {
        let (status, body) = server
            .post("/api/projects/p1/learn/remember", json!({"text": text}))
            .await;
        assert_eq!(status, 201, "{body}");
        server.drain_maintenance("audit-maintain").await;
    }
    let (status, audit) = server.get("/api/projects/p1/memory/audit").await;
    assert_eq!(status, 200, "{audit}");
    let project = audit["documents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["target"] == "project")
        .expect("the project document")
        .clone();
    let (_, candidates) = server.get("/api/projects/p1/memory/candidates").await;
    assert_eq!(project["entries"], 1, "{audit}\n{candidates}");
    let pushed = project["pushedOut"].as_array().unwrap();
    assert_eq!(pushed.len(), 1, "{audit}\n{candidates}");
    assert_eq!(pushed[0]["content"], lessons[0]);
    let experience = pushed[0]["experienceIds"][0].as_str().unwrap();
    let (status, kept) = server.get(&format!("/api/experiences/{experience}")).await;
    assert_eq!(
        (status, kept["status"].as_str()),
        (200, Some("active")),
        "{kept}"
    );
}

on_both_backends!(
    the_audit_lists_what_the_cap_pushed_out,
    a_correction_with_a_tool_call_becomes_verified_experience_with_the_rules_extractor,
    a_correction_with_a_tool_call_becomes_verified_experience_with_a_model,
    stale_policy_and_feedback_writes_are_409,
    manual_commands_over_http,
);
