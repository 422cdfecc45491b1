//! Guards over HTTP: a checkable Memory rule becomes a pending guard; approved, it stops the
//! calls it forbids (`ask`, or `deny` when configured) with the lesson as the reason and counts
//! each stop; disabled it allows again; an assistant message that runs what it forbids counts
//! as a violation; a rule that leaves Memory retires its guard; scoped tokens stay in scope.

use serde_json::{Value, json};
use zuno_shared::config::{Config, GuardDecision};
use zuno_shared::tokens::TokenStore;
use zuno_tests::server::{TestServer, decode};
use zuno_tests::{TestDb, on_both_backends};

async fn with_token(
    server: &TestServer,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let client = reqwest::Client::new();
    let request = match body {
        Some(body) => client.post(server.url(path)).json(&body),
        None => client.get(server.url(path)),
    };
    decode(request.bearer_auth(token).send().await.expect("request")).await
}

async fn project_with_rule(server: &TestServer, project: &str, rule: &str) -> Value {
    let (status, body) = server
        .post("/api/projects", json!({"id": project, "name": project}))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, outcome) = server
        .post(
            &format!("/api/projects/{project}/memory"),
            json!({"target": "project", "action": "add", "content": rule,
                   "reason": "the user said so", "confidence": 1.0, "origin": "user"}),
        )
        .await;
    assert_eq!(status, 201, "{outcome}");
    let (status, guards) = server.get(&format!("/api/projects/{project}/guards")).await;
    assert_eq!(status, 200, "{guards}");
    guards
}

async fn check(server: &TestServer, project: &str, tool: &str, input: Value) -> Value {
    let (status, answer) = server
        .post(
            &format!("/api/projects/{project}/guards/check"),
            json!({"toolName": tool, "toolInput": input, "sessionId": "s-1"}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    answer
}

async fn a_checkable_rule_becomes_a_guard_that_asks_once_approved(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let guards = project_with_rule(&server, "web", "Use pnpm, not npm.").await;
    let [guard] = guards.as_array().unwrap().as_slice() else {
        panic!("{guards}");
    };
    assert_eq!(guard["state"], "pending", "review by default: {guard}");
    assert_eq!(
        guard["matcher"],
        json!({"kind": "command", "program": "npm", "args": []})
    );
    assert_eq!(guard["alternative"], "pnpm");
    let id = guard["id"].as_str().unwrap();
    let npm = json!({"command": "cd web && npm i lodash"});
    assert_eq!(
        check(&server, "web", "Bash", npm.clone()).await["decision"],
        "allow",
        "pending"
    );

    let (status, approved) = server
        .post(&format!("/api/guards/{id}/approve"), json!({}))
        .await;
    assert_eq!(
        (status, approved["state"].as_str()),
        (200, Some("active")),
        "{approved}"
    );
    let stopped = check(&server, "web", "Bash", npm.clone()).await;
    assert_eq!(stopped["decision"], "ask", "{stopped}");
    assert_eq!(stopped["matched"], "npm i lodash");
    let reason = stopped["reason"].as_str().unwrap();
    assert!(
        reason.contains("Use pnpm, not npm.") && reason.contains("`pnpm` instead"),
        "{reason}"
    );
    assert!(reason.contains(id), "{reason}");
    for allowed in [
        json!({"command": "pnpm install"}),
        json!({"command": "echo npm"}),
    ] {
        assert_eq!(
            check(&server, "web", "Bash", allowed).await["decision"],
            "allow"
        );
    }
    assert_eq!(
        check(&server, "web", "Read", json!({"file_path": "/x"})).await["decision"],
        "allow"
    );

    let (_, listed) = server.get("/api/projects/web/guards?state=active").await;
    assert_eq!(listed[0]["blocks"], 1, "{listed}");
    let (status, disabled) = server
        .post(&format!("/api/guards/{id}/disable"), json!({}))
        .await;
    assert_eq!(
        (status, disabled["state"].as_str()),
        (200, Some("disabled"))
    );
    assert_eq!(
        check(&server, "web", "Bash", npm.clone()).await["decision"],
        "allow"
    );
    let (status, again) = server
        .post(&format!("/api/guards/{id}/disable"), json!({}))
        .await;
    assert_eq!(status, 409, "{again}");
    let (status, _) = server
        .post(&format!("/api/guards/{id}/enable"), json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(check(&server, "web", "Bash", npm).await["decision"], "ask");
    let (status, tested) = server
        .post(
            "/api/projects/web/guards/test",
            json!({"command": "sudo npx jest"}),
        )
        .await;
    assert_eq!(status, 200, "{tested}");
    assert_eq!(tested[0]["decision"], "ask", "{tested}");
    let (status, _) = server
        .post(
            "/api/projects/web/guards/test",
            json!({"command": "x", "path": "y"}),
        )
        .await;
    assert_eq!(status, 400);
}

async fn deny_when_configured_and_path_guards_stop_edits(db: TestDb) {
    let roots = tempfile::tempdir().unwrap();
    let roots_path = roots.path().canonicalize().unwrap();
    std::fs::create_dir(roots_path.join("api")).unwrap();
    let root = roots_path.join("api").to_string_lossy().into_owned();
    let mut config = Config::default();
    config.guards.decision = GuardDecision::Deny;
    config.server.worktree_roots = vec![roots_path.to_string_lossy().into_owned()];
    let server = TestServer::start(&db, config, None).await;
    let (status, body) = server
        .post(
            "/api/projects",
            json!({"id": "api", "name": "api", "worktree": root}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = server
        .post(
            "/api/projects/api/memory",
            json!({"target": "project", "action": "add",
            "content": "Don't edit vendor/ — it is generated.", "reason": "the user said so",
            "confidence": 1.0, "origin": "user"}),
        )
        .await;
    assert_eq!(status, 201);
    let (_, guards) = server.get("/api/projects/api/guards").await;
    let id = guards[0]["id"].as_str().unwrap().to_owned();
    server
        .post(&format!("/api/guards/{id}/approve"), json!({}))
        .await;
    let inside = format!("{root}/vendor/lib/a.js");
    let stopped = check(
        &server,
        "api",
        "Edit",
        json!({"file_path": inside, "old_string": "a", "new_string": "b"}),
    )
    .await;
    assert_eq!(stopped["decision"], "deny", "{stopped}");
    assert_eq!(stopped["matched"], "vendor/lib/a.js");
    let elsewhere = format!("{root}/src/vendor.js");
    assert_eq!(
        check(
            &server,
            "api",
            "Write",
            json!({"file_path": elsewhere, "content": ""})
        )
        .await["decision"],
        "allow"
    );
    let patch = "*** Begin Patch\n*** Update File: vendor/x.go\n@@\n-a\n+b\n*** End Patch";
    assert_eq!(
        check(&server, "api", "apply_patch", json!({"command": patch})).await["decision"],
        "deny"
    );
}

async fn a_broken_rule_counts_as_a_violation_and_a_removed_rule_retires_its_guard(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    project_with_rule(&server, "web", "Run scripts with python3, not python.").await;
    let (status, session) = server.post("/api/projects/web/sessions", json!({})).await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_owned();
    let messages = format!("/api/session/{session}/messages");
    server
        .post(
            &messages,
            json!({"role": "user", "parts": [{"type": "text", "text": "run the report"}]}),
        )
        .await;
    let (status, _) = server.post(&messages, json!({"role": "assistant", "status": "completed", "parts": [
        {"type": "tool_call", "toolName": "Bash", "arguments": {"command": "cd tools && python report.py"}, "result": "ok", "status": "completed"},
        {"type": "tool_call", "toolName": "Bash", "arguments": {"command": "python3 report.py"}, "result": "ok", "status": "completed"}
    ]})).await;
    assert_eq!(status, 201);
    let (_, guards) = server.get("/api/projects/web/guards").await;
    assert_eq!(
        guards[0]["violations"], 1,
        "one call broke it (pending guards count too): {guards}"
    );

    let (status, removed) = server
        .post(
            "/api/projects/web/memory",
            json!({"target": "project", "action": "remove",
            "oldText": "Run scripts with python3, not python.", "reason": "no longer true",
            "confidence": 1.0, "origin": "user"}),
        )
        .await;
    assert_eq!(status, 201, "{removed}");
    let (_, guards) = server.get("/api/projects/web/guards").await;
    assert_eq!(guards[0]["state"], "retired", "{guards}");
    let (status, _) = server
        .post(
            &format!("/api/guards/{}/approve", guards[0]["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "a retired guard is not approved");
}

async fn a_project_token_sees_and_decides_only_its_projects_guards(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let guards = project_with_rule(
        &server,
        "alpha",
        "Use `cargo nextest run`, not `cargo test`.",
    )
    .await;
    project_with_rule(&server, "beta", "Always answer in English.").await;
    let id = guards[0]["id"].as_str().unwrap().to_owned();
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, beta) = tokens.create("beta", &["beta".to_owned()]).await.unwrap();
    let (status, _) = with_token(
        &server,
        &format!("/api/guards/{id}/approve"),
        &beta,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 404, "another project's guard does not exist for it");
    let (status, _) = with_token(&server, "/api/projects/alpha/guards", &beta, None).await;
    assert_eq!(status, 404);
    let (status, _) = with_token(
        &server,
        "/api/projects/alpha/guards/check",
        &beta,
        Some(json!({"toolName": "Bash", "toolInput": {"command": "cargo test"}})),
    )
    .await;
    assert_eq!(status, 404);
    let (_, alpha) = tokens.create("alpha", &["alpha".to_owned()]).await.unwrap();
    let (status, approved) = with_token(
        &server,
        &format!("/api/guards/{id}/approve"),
        &alpha,
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (status, approved["state"].as_str()),
        (200, Some("active")),
        "{approved}"
    );
    let (status, answer) = with_token(
        &server,
        "/api/projects/alpha/guards/check",
        &alpha,
        Some(json!({"toolName": "Bash", "toolInput": {"command": "cargo test --workspace"}})),
    )
    .await;
    assert_eq!(
        (status, answer["decision"].as_str()),
        (200, Some("ask")),
        "{answer}"
    );
}

on_both_backends!(
    a_checkable_rule_becomes_a_guard_that_asks_once_approved,
    deny_when_configured_and_path_guards_stop_edits,
    a_broken_rule_counts_as_a_violation_and_a_removed_rule_retires_its_guard,
    a_project_token_sees_and_decides_only_its_projects_guards,
);
