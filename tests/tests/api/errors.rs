//! Bad input gets typed problem JSON and loses nothing.

use serde_json::json;
use zuno_shared::config::Config;
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::ingestion::project_and_session;

async fn count(db: &TestDb, table: &'static str) -> i64 {
    let sql = match table {
        "message" => "SELECT COUNT(*) FROM message",
        "message_part" => "SELECT COUNT(*) FROM message_part",
        _ => "SELECT COUNT(*) FROM learning_job",
    };
    zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(sql).fetch_one(pool).await).unwrap()
}

fn assert_problem(body: &serde_json::Value, status: u16, code: &str) {
    assert_eq!(body["status"], status, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(body["type"].as_str().unwrap().ends_with(code));
    assert!(!body["title"].as_str().unwrap().is_empty());
    assert!(!body["detail"].as_str().unwrap().is_empty());
}

async fn bad_fields_are_named_and_nothing_is_written(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    let bad = json!({"role": "assistant", "status": "completed", "parts": [
        {"type": "text", "text": "fine"},
        {"type": "tool_call", "toolName": "bash", "status": "exploded"}
    ]});
    let response = server
        .client
        .post(server.url(&format!("/api/session/{session}/messages")))
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let (status, body) = zuno_tests::server::decode(response).await;
    assert_eq!(status, 400);
    assert_problem(&body, 400, "bad_request");
    // Parts are an internally tagged enum, so the path stops at the part; the detail names the
    // offending value.
    assert_eq!(body["field"], "parts[1]", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("exploded"),
        "{body}"
    );
    let empty_name = json!({"role": "assistant", "parts": [{"type": "tool_call", "toolName": "", "status": "completed"}]});
    let (status, body) = server
        .post(&format!("/api/session/{session}/messages"), empty_name)
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["field"], "parts[0].toolName");
    let (status, body) = server
        .post(
            &format!("/api/session/{session}/messages"),
            json!({"role": "user", "parts": [], "colour": 1}),
        )
        .await;
    assert_eq!(status, 400, "unknown fields are refused: {body}");
    let (status, body) = server
        .post("/api/projects", json!({"id": "../etc", "name": "x"}))
        .await;
    assert_eq!((status, body["field"].as_str()), (400, Some("id")));
    assert_eq!(count(&db, "message").await, 0);
    assert_eq!(count(&db, "message_part").await, 0);
    assert_eq!(count(&db, "learning_job").await, 0);
}

async fn malformed_json_is_a_400(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let response = server
        .client
        .post(server.url("/api/projects"))
        .header("content-type", "application/json")
        .body("{\"id\": \"p1\", ")
        .send()
        .await
        .unwrap();
    let (status, body) = zuno_tests::server::decode(response).await;
    assert_eq!(status, 400);
    assert!(
        body["detail"].as_str().unwrap().contains("not valid JSON"),
        "{body}"
    );
}

async fn unknown_things_are_404(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    for path in [
        "/api/session/nope",
        "/api/projects/nope",
        "/api/jobs/job_nope",
        "/api/no/such/route",
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 404, "{path}");
        assert_problem(&body, 404, "not_found");
    }
    let (status, _) = server
        .post(
            "/api/session/nope/messages",
            json!({"role": "user", "parts": []}),
        )
        .await;
    assert_eq!(status, 404);
}

async fn conflicts_are_409(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    server
        .post("/api/projects", json!({"id": "p1", "name": "One"}))
        .await;
    let (status, same) = server
        .post("/api/projects", json!({"id": "p1", "name": "One"}))
        .await;
    assert_eq!(status, 200, "identical create is idempotent: {same}");
    let (status, body) = server
        .post("/api/projects", json!({"id": "p1", "name": "Other"}))
        .await;
    assert_eq!(status, 409);
    assert_problem(&body, 409, "conflict");
    let (_, session) = server.post("/api/projects/p1/sessions", json!({})).await;
    let session = session["id"].as_str().unwrap().to_owned();
    let (status, _) = server
        .post("/api/projects/p1/sessions", json!({"id": session}))
        .await;
    assert_eq!(status, 409);
    let message = json!({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]});
    let (status, first) = server
        .post(&format!("/api/session/{session}/messages"), message.clone())
        .await;
    assert_eq!(status, 201, "{first}");
    let (status, again) = server
        .post(&format!("/api/session/{session}/messages"), message)
        .await;
    assert_eq!(
        status, 200,
        "a resend of the same message is not a conflict: {again}"
    );
    assert_eq!(again["message"], first["message"]);
    let changed = json!({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "bye"}]});
    let (status, body) = server
        .post(&format!("/api/session/{session}/messages"), changed)
        .await;
    assert_eq!(status, 409, "{body}");
    assert_problem(&body, 409, "conflict");
    assert_eq!(count(&db, "message").await, 1);
}

async fn bodies_over_the_limit_are_413(db: TestDb) {
    let mut config = Config::default();
    config.server.body_limit_bytes = 2048;
    let server = TestServer::start(&db, config, None).await;
    let session = project_and_session(&server, "p1").await;
    let big = json!({"role": "user", "parts": [{"type": "text", "text": "x".repeat(10_000)}]});
    let (status, body) = server
        .post(&format!("/api/session/{session}/messages"), big)
        .await;
    assert_eq!(status, 413);
    assert_problem(&body, 413, "payload_too_large");
    assert!(body["detail"].as_str().unwrap().contains("2048"));
    assert_eq!(count(&db, "message").await, 0);
}

async fn a_user_message_cannot_carry_a_completion_status(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    let (status, body) = server
        .post(
            &format!("/api/session/{session}/messages"),
            json!({"role": "user", "status": "failed", "parts": []}),
        )
        .await;
    assert_eq!((status, body["field"].as_str()), (400, Some("status")));
}

/// Where the OpenAPI document and the server used to disagree (schemathesis `--checks all`): a
/// JSON array is no object body even where every field is optional; `2.0` is an integer, as
/// JSON Schema's `integer` says; `toolInput` is an object; the Memory read limit has a maximum.
async fn the_server_reads_bodies_and_limits_as_the_document_states(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;

    let (status, body) = server
        .post("/api/projects/p1/sessions", json!([null, null]))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_problem(&body, 400, "bad_request");

    let put = |body: serde_json::Value| {
        let request = server
            .client
            .put(server.url(&format!("/api/session/{session}/memory-policy")))
            .json(&body);
        async move { zuno_tests::server::decode(request.send().await.unwrap()).await }
    };
    let (status, updated) = put(json!({"expectedRevision": 1.0, "useMemories": false})).await;
    assert_eq!(
        (status, updated["revision"].as_i64()),
        (200, Some(2)),
        "{updated}"
    );
    let (status, body) = put(json!({"expectedRevision": 2.5, "useMemories": true})).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("expectedRevision")),
        "{body}"
    );

    let (status, body) = server
        .post(
            "/api/projects/p1/guards/check",
            json!({"toolName": "Bash", "toolInput": [null, null]}),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("toolInput")),
        "{body}"
    );
    let (status, body) = server
        .post(
            "/api/projects/p1/guards/check",
            json!({"toolName": "Bash", "toolInput": {"command": "ls"}}),
        )
        .await;
    assert_eq!(
        (status, body["decision"].as_str()),
        (200, Some("allow")),
        "{body}"
    );

    let (status, body) = server.get("/api/projects/p1/memory?limit=1001").await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("limit")),
        "{body}"
    );
    let (status, body) = server.get("/api/projects/p1/memory?limit=1000").await;
    assert_eq!(status, 200, "{body}");
}

on_both_backends!(
    the_server_reads_bodies_and_limits_as_the_document_states,
    bad_fields_are_named_and_nothing_is_written,
    malformed_json_is_a_400,
    unknown_things_are_404,
    conflicts_are_409,
    bodies_over_the_limit_are_413,
    a_user_message_cannot_carry_a_completion_status,
);
