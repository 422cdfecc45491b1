//! The server as an attacker meets it: web pages (cross-origin, foreign `Host`, "simple" bodies),
//! scoped tokens that try global Memory and `origin: "user"`, worktree claims of paths that are
//! not theirs, and the smaller holes (page cursor overflow, resends, non-problem errors, live
//! stream floods, metrics, the dashboard's sign-in and CSP).

use std::time::Duration;

use serde_json::{Value, json};
use zuno_shared::config::{Config, MemoryPromotion};
use zuno_shared::tokens::{GlobalAccess, NewToken, TokenStore};
use zuno_tests::server::{TestServer, decode};
use zuno_tests::{TestDb, eventually, on_both_backends};

/// One request with exactly the headers given (no default token).
async fn raw(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String, Value) {
    let mut request = reqwest::Client::new().request(method, server.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_owned());
    }
    let response = request.send().await.expect("request");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (status, body) = decode(response).await;
    (status, content_type, body)
}

/// A JSON call with a token.
async fn call(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, server.url(path))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    decode(request.send().await.expect("request")).await
}

fn assert_problem(content_type: &str, body: &Value, status: u16, code: &str) {
    assert_eq!(content_type, "application/problem+json", "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(
        !body["detail"].as_str().unwrap_or_default().is_empty(),
        "{body}"
    );
}

async fn project_count(db: &TestDb) -> i64 {
    zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM project"
    )
    .fetch_one(pool)
    .await)
    .unwrap()
}

#[tokio::test]
async fn web_pages_cannot_write_or_read_through_a_browser() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let token = server.token().to_owned();
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;
    let project = r#"{"id":"x","name":"x"}"#;

    // The attack of the report: a cross-site "simple" request (no preflight), even carrying a
    // valid token, is refused before anything is parsed.
    let (status, content_type, body) = raw(
        &server,
        post.clone(),
        "/api/projects",
        Some(&token),
        &[
            ("origin", "https://evil.example"),
            ("content-type", "text/plain"),
        ],
        Some(project),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_problem(&content_type, &body, 403, "forbidden");
    // A sandboxed or file page sends `Origin: null`.
    let (status, _, _) = raw(
        &server,
        post.clone(),
        "/api/projects",
        Some(&token),
        &[("origin", "null"), ("content-type", "application/json")],
        Some(project),
    )
    .await;
    assert_eq!(status, 403);
    // Without an Origin, a text/plain, form or missing content type is still not JSON: 415.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|value| vec![("content-type", value)])
            .unwrap_or_default();
        let (status, got, body) = raw(
            &server,
            post.clone(),
            "/api/projects",
            Some(&token),
            &headers,
            Some(project),
        )
        .await;
        assert_eq!(status, 415, "{content_type:?}: {body}");
        assert_problem(&got, &body, 415, "unsupported_media_type");
    }
    // DNS rebinding: the page's own domain name arrives as Host; nothing answers it, not even
    // the unauthenticated routes.
    for path in ["/api/projects", "/metrics", "/ui", "/healthz"] {
        let (status, content_type, body) = raw(
            &server,
            get.clone(),
            path,
            Some(&token),
            &[("host", "evil.example:7878")],
            None,
        )
        .await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_problem(&content_type, &body, 403, "forbidden");
    }
    assert_eq!(project_count(&db).await, 0, "nothing was created");

    // The dashboard's own requests (same origin, JSON) pass, and the bearer scheme is
    // case-insensitive.
    let own_origin = server.base.clone();
    let (status, _, body) = raw(
        &server,
        post.clone(),
        "/api/projects",
        None,
        &[
            ("authorization", &format!("bearer {token}")),
            ("origin", &own_origin),
            ("content-type", "application/json"),
        ],
        Some(project),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, _, _) = raw(
        &server,
        get.clone(),
        "/api/projects",
        None,
        &[
            ("authorization", &format!("BEARER {token}")),
            ("host", "localhost"),
        ],
        None,
    )
    .await;
    assert_eq!(status, 200);
    // No token at all: 401, as a problem.
    let (status, content_type, body) = raw(&server, get, "/api/projects", None, &[], None).await;
    assert_eq!(status, 401);
    assert_problem(&content_type, &body, 401, "unauthorized");
}

#[tokio::test]
async fn every_error_is_a_problem_document() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let token = server.token().to_owned();
    // A method the path does not support.
    let (status, content_type, body) = raw(
        &server,
        reqwest::Method::PATCH,
        "/api/projects",
        Some(&token),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 405, "{body}");
    assert_problem(&content_type, &body, 405, "method_not_allowed");
    // Query-string values of the wrong type.
    for path in [
        "/api/jobs?limit=abc",
        "/api/jobs?kind=cron",
        "/api/session/s/messages?after=x",
        "/api/projects/p/memory?target=everything",
    ] {
        let (status, content_type, body) =
            raw(&server, reqwest::Method::GET, path, Some(&token), &[], None).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_problem(&content_type, &body, 400, "bad_request");
    }
    // Invalid UTF-8 in a path segment.
    let (status, content_type, body) = raw(
        &server,
        reqwest::Method::GET,
        "/api/projects/%FF%FE",
        Some(&token),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_problem(&content_type, &body, 400, "bad_request");
    // An oversized request head.
    let huge = "x".repeat(40 * 1024);
    let (status, content_type, body) = raw(
        &server,
        reqwest::Method::GET,
        "/api/projects",
        Some(&token),
        &[("x-padding", &huge)],
        None,
    )
    .await;
    assert_eq!(status, 431, "{body}");
    assert_problem(&content_type, &body, 431, "headers_too_large");
}

/// Projects A and B; B has a global Memory entry and a pending global candidate (review
/// promotion), both made by the local user.
/// A user-wide preference learned from a session in `alpha` whose messages `token` sent: the
/// global Memory document afterwards, and the pending global candidates.
async fn learn_a_user_wide_preference(server: &TestServer, token: &str) -> (Value, Value) {
    for id in ["alpha", "beta"] {
        let (status, body) = server
            .post("/api/projects", json!({"id": id, "name": id}))
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let post = reqwest::Method::POST;
    let (status, session) = call(
        server,
        post.clone(),
        "/api/projects/alpha/sessions",
        token,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_owned();
    let messages = format!("/api/session/{session}/messages");
    let (status, body) = call(
        server,
        post.clone(),
        &messages,
        token,
        Some(json!({"role": "user", "parts": [{"type": "text",
        "text": "From now on, in all my projects, always reply in German."}]})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(server, post, &messages, token, Some(json!({"role": "assistant", "status": "completed",
        "parts": [{"type": "tool_call", "toolName": "bash", "arguments": {"command": "ls"}, "result": "ok", "status": "completed"},
                  {"type": "text", "text": "Verstanden."}]}))).await;
    assert_eq!(status, 201, "{body}");
    server.drain_extraction("scope-extract").await;
    server.drain_maintenance("scope-maintain").await;
    let (_, global) = server.get("/api/projects/beta/memory?target=global").await;
    let (_, pending) = server
        .get("/api/projects/beta/memory/candidates?state=pending")
        .await;
    (global, pending)
}

/// A project-scoped token (no global write) cannot write global Memory through learning: the
/// user-wide lesson it sent waits for review, where the same turn sent with the user's token
/// (global write) is applied. `POST …/memory` with `target: global` refuses that token with a
/// 403; learning is no way around it.
async fn a_project_token_reaches_global_memory_only_through_review(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, alpha) = tokens.create("alpha", &["alpha".to_owned()]).await.unwrap();
    let (global, pending) = learn_a_user_wide_preference(&server, &alpha).await;
    assert!(!global.to_string().contains("German"), "applied: {global}");
    let pending = pending.as_array().unwrap();
    assert!(
        pending.iter().any(|c| c["target"] == "global"
            && c["content"].as_str().unwrap_or_default().contains("German")),
        "no pending global candidate: {pending:?}"
    );
}

async fn the_users_own_token_still_learns_user_wide_preferences(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let token = server.token().to_owned();
    let (global, _) = learn_a_user_wide_preference(&server, &token).await;
    assert!(
        global.to_string().contains("German"),
        "not applied: {global}"
    );
}

async fn two_projects_with_global_memory(server: &TestServer) -> String {
    for id in ["alpha", "beta"] {
        let (status, body) = server
            .post("/api/projects", json!({"id": id, "name": id}))
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, applied) = server
        .post(
            "/api/projects/beta/memory",
            json!({"target": "global", "action": "add", "content": "Answer in English.",
                   "reason": "the user said so", "confidence": 1.0, "origin": "user"}),
        )
        .await;
    assert_eq!(status, 201, "{applied}");
    assert_eq!(applied["applied"], true, "{applied}");
    let (status, pending) = server
        .post(
            "/api/projects/beta/memory",
            json!({"target": "global", "action": "add", "content": "Prefer tabs in Go files.",
                   "reason": "seen in beta", "confidence": 0.5}),
        )
        .await;
    assert_eq!(status, 201, "{pending}");
    assert_eq!(
        pending["applied"], false,
        "review leaves it pending: {pending}"
    );
    pending["candidate"]["id"].as_str().unwrap().to_owned()
}

async fn scoped_tokens_stop_at_global_memory(db: TestDb) {
    let mut config = Config::default();
    config.memory.promotion = MemoryPromotion::Review;
    let server = TestServer::start(&db, config, None).await;
    let beta_candidate = two_projects_with_global_memory(&server).await;
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, alpha) = tokens.create("alpha", &["alpha".to_owned()]).await.unwrap();
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;

    // Reading: global documents, candidates, revisions and the file are out of reach.
    for path in [
        "/api/projects/alpha/memory?target=global",
        "/api/projects/alpha/memory/inspect?target=global",
        "/api/projects/alpha/memory/revisions?target=global",
    ] {
        let (status, body) = call(&server, get.clone(), path, &alpha, None).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            !body.to_string().contains("MEMORY.md") && !body.to_string().contains(&beta_candidate),
            "{path} leaks: {body}"
        );
    }
    let (status, both) = call(
        &server,
        get.clone(),
        "/api/projects/alpha/memory",
        &alpha,
        None,
    )
    .await;
    assert_eq!(status, 200, "{both}");
    let scopes: Vec<&str> = both["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["scope"].as_str().unwrap())
        .collect();
    assert!(!scopes.contains(&"global"), "no global document: {both}");
    assert!(!both.to_string().contains("Answer in English"), "{both}");
    let (status, candidates) = call(
        &server,
        get.clone(),
        "/api/projects/alpha/memory/candidates",
        &alpha,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        candidates,
        json!([]),
        "beta's global candidates are not listed"
    );
    // Acting on beta's global candidate: it does not exist for this token.
    for action in ["approve", "reject", "undo"] {
        let (status, body) = call(
            &server,
            post.clone(),
            &format!("/api/memory/candidates/{beta_candidate}/{action}"),
            &alpha,
            Some(json!({})),
        )
        .await;
        assert_eq!(status, 404, "{action}: {body}");
    }
    // Writing: no global change, no import, no user origin.
    let (status, body) = call(
        &server,
        post.clone(),
        "/api/projects/alpha/memory",
        &alpha,
        Some(
            json!({"target": "global", "action": "remove", "oldText": "Answer in English.",
                    "reason": "x", "confidence": 1.0}),
        ),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = call(
        &server,
        post.clone(),
        "/api/projects/alpha/memory/import",
        &alpha,
        Some(json!({"target": "global"})),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = call(
        &server,
        post.clone(),
        "/api/projects/alpha/memory",
        &alpha,
        Some(
            json!({"target": "project", "action": "add", "content": "Use pnpm.",
                    "reason": "x", "confidence": 1.0, "origin": "user"}),
        ),
    )
    .await;
    assert_eq!(
        status, 403,
        "a non-user token cannot claim origin user: {body}"
    );
    let (status, body) = call(
        &server,
        post.clone(),
        "/api/projects/alpha/memory",
        &alpha,
        Some(
            json!({"target": "project", "action": "add", "content": "Use pnpm.",
                    "reason": "x", "confidence": 1.0}),
        ),
    )
    .await;
    assert_eq!(status, 201, "its own project Memory is fine: {body}");
    assert_eq!(body["candidate"]["origin"], "tool");
    let (_, read) = server.get("/api/projects/beta/memory?target=global").await;
    assert!(
        read.to_string().contains("Answer in English."),
        "beta's global entry is intact: {read}"
    );

    // A token with global read sees global Memory but cannot change it; with global write and
    // the user's mark it can, as the user.
    let (_, reader) = tokens
        .create_with(&NewToken {
            name: "reader".into(),
            projects: vec!["alpha".into()],
            global: GlobalAccess::Read,
            user: false,
        })
        .await
        .unwrap();
    let (status, body) = call(
        &server,
        get.clone(),
        "/api/projects/alpha/memory?target=global",
        &reader,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("Answer in English."));
    let (status, _) = call(
        &server,
        post.clone(),
        &format!("/api/memory/candidates/{beta_candidate}/approve"),
        &reader,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 403, "reading is not writing");
    let (_, writer) = tokens
        .create_with(&NewToken {
            name: "writer".into(),
            projects: vec!["alpha".into()],
            global: GlobalAccess::Write,
            user: true,
        })
        .await
        .unwrap();
    let (status, body) = call(
        &server,
        post.clone(),
        "/api/projects/alpha/memory",
        &writer,
        Some(
            json!({"target": "global", "action": "add", "content": "Keep answers short.",
                    "reason": "the user said so", "confidence": 1.0, "origin": "user"}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["applied"], true, "{body}");
}

/// Issue 31, item 8: global read reaches global Memory, not the projects it was learned in; a
/// global candidate another project proposed is listed without that project's id, reason, job
/// or detail (to a global writer acting on it too), and in full to a caller of that project.
async fn a_global_reader_does_not_see_other_projects_in_global_candidates(db: TestDb) {
    let mut config = Config::default();
    config.memory.promotion = MemoryPromotion::Review;
    let server = TestServer::start(&db, config, None).await;
    let beta_candidate = two_projects_with_global_memory(&server).await;
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let token = |name: &str, project: &str, global: GlobalAccess| NewToken {
        name: name.into(),
        projects: vec![project.into()],
        global,
        user: false,
    };
    let (_, reader) = tokens
        .create_with(&token("reader", "alpha", GlobalAccess::Read))
        .await
        .unwrap();
    let (_, writer) = tokens
        .create_with(&token("writer", "alpha", GlobalAccess::Write))
        .await
        .unwrap();
    let (_, beta) = tokens
        .create_with(&token("beta", "beta", GlobalAccess::Read))
        .await
        .unwrap();
    let get = reqwest::Method::GET;
    let global_candidates = |list: &Value| -> Vec<Value> {
        list.as_array()
            .unwrap()
            .iter()
            .filter(|c| c["target"] == "global")
            .cloned()
            .collect()
    };

    let (status, list) = call(
        &server,
        get.clone(),
        "/api/projects/alpha/memory/candidates",
        &reader,
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    let seen = global_candidates(&list);
    assert!(!seen.is_empty(), "global candidates are listed: {list}");
    for candidate in &seen {
        assert_eq!(candidate["projectId"], Value::Null, "{candidate}");
        assert_eq!(candidate["jobId"], Value::Null, "{candidate}");
        assert_eq!(
            candidate["reason"], "proposed in another project",
            "{candidate}"
        );
    }
    let text = list.to_string();
    assert!(!text.contains("beta"), "beta's id and reasons leak: {text}");
    assert!(
        text.contains("Prefer tabs in Go files."),
        "global content is readable: {text}"
    );

    // Beta's own token sees its candidate in full.
    let (_, list) = call(
        &server,
        get.clone(),
        "/api/projects/beta/memory/candidates",
        &beta,
        None,
    )
    .await;
    let own = global_candidates(&list);
    let pending = own
        .iter()
        .find(|c| c["id"] == beta_candidate.as_str())
        .unwrap();
    assert_eq!(pending["projectId"], "beta", "{pending}");
    assert_eq!(pending["reason"], "seen in beta", "{pending}");

    // A global writer of another project may reject it, and learns no more from the answer.
    let (status, rejected) = call(
        &server,
        reqwest::Method::POST,
        &format!("/api/memory/candidates/{beta_candidate}/reject"),
        &writer,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{rejected}");
    assert_eq!(rejected["state"], "rejected", "{rejected}");
    assert!(!rejected.to_string().contains("beta"), "{rejected}");
}

async fn a_parent_session_of_another_project_looks_absent(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    for id in ["alpha", "beta"] {
        server
            .post("/api/projects", json!({"id": id, "name": id}))
            .await;
    }
    let (_, beta_session) = server.post("/api/projects/beta/sessions", json!({})).await;
    let beta_session = beta_session["id"].as_str().unwrap();
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, alpha) = tokens.create("alpha", &["alpha".to_owned()]).await.unwrap();
    let mut answers = Vec::new();
    for parent in [beta_session, "ses_does_not_exist"] {
        let (status, body) = call(
            &server,
            reqwest::Method::POST,
            "/api/projects/alpha/sessions",
            &alpha,
            Some(json!({"parentId": parent})),
        )
        .await;
        assert_eq!(status, 404, "{body}");
        answers.push(body["detail"].as_str().unwrap().replace(parent, "<id>"));
    }
    assert_eq!(answers[0], answers[1], "the two refusals read the same");
}

async fn worktrees_are_claims(db: TestDb) {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().canonicalize().unwrap();
    let mut config = Config::default();
    config.server.worktree_roots = vec![root.display().to_string()];
    let server = TestServer::start(&db, config, None).await;
    let repo = root.join("repo");
    std::fs::create_dir_all(repo.join("sub")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    // Someone else's tree with a rules file that must never be adopted.
    std::fs::create_dir_all(outside.path().join(".zuno")).unwrap();
    std::fs::write(
        outside.path().join(".zuno/RULES.md"),
        "- Someone else's private rule\n",
    )
    .unwrap();

    let create = |id: &str, worktree: &str| json!({"id": id, "name": id, "worktree": worktree});
    let (status, body) = server
        .post("/api/projects", create("web", repo.to_str().unwrap()))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["worktree"], repo.to_str().unwrap());

    // System paths, other trees, non-existent paths, files, the root itself, a link out of the
    // roots, another project's tree (inside, above, or through a link): all refused alike.
    let link = root.join("link-to-outside");
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    let link_to_repo = root.join("link-to-repo");
    std::os::unix::fs::symlink(&repo, &link_to_repo).unwrap();
    std::fs::write(root.join("a-file"), "x").unwrap();
    let refused = [
        "/etc".to_owned(),
        "/nonexistent/zuno/path".to_owned(),
        outside.path().display().to_string(),
        root.join("missing").display().to_string(),
        root.join("a-file").display().to_string(),
        root.display().to_string(),
        link.display().to_string(),
        repo.join("sub").display().to_string(),
        link_to_repo.display().to_string(),
    ];
    let mut details = Vec::new();
    for (index, path) in refused.iter().enumerate() {
        let (status, body) = server
            .post("/api/projects", create(&format!("p{index}"), path))
            .await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["field"], "worktree", "{body}");
        details.push(body["detail"].as_str().unwrap().to_owned());
    }
    // The filesystem refusals (all but the overlaps with `web`, which the local user may see)
    // do not tell an existing path from a missing one.
    assert!(
        details[..7].iter().all(|d| d == &details[0]),
        "{details:#?}"
    );
    assert!(details[7].contains("`web`"), "{}", details[7]);
    let (status, body) = server
        .post("/api/projects", create("above", root.to_str().unwrap()))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(project_count(&db).await, 1, "only `web` exists");
    assert!(
        std::fs::read_to_string(outside.path().join(".zuno/RULES.md"))
            .unwrap()
            .contains("Someone else's"),
        "the foreign rules file is untouched"
    );

    // A token that is not the user's cannot bind a worktree at all, even inside the roots; the
    // exact repeat of an existing project's creation is still answered.
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, ci) = tokens
        .create("ci", &["web".to_owned(), "docs".to_owned()])
        .await
        .unwrap();
    let docs = root.join("docs");
    std::fs::create_dir(&docs).unwrap();
    let (status, body) = call(
        &server,
        reqwest::Method::POST,
        "/api/projects",
        &ci,
        Some(create("docs", docs.to_str().unwrap())),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = call(
        &server,
        reqwest::Method::POST,
        "/api/projects",
        &ci,
        Some(create("web", repo.to_str().unwrap())),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The user binds it.
    let (status, body) = server
        .post("/api/projects", create("docs", docs.to_str().unwrap()))
        .await;
    assert_eq!(status, 201, "{body}");
}

/// Issue 31, item 2: a worktree claimed by mistake (a parent of repositories, say) can be
/// released and a project moved or deleted, by the user only; the claim rules hold for a move;
/// sensitive directories are never bound.
async fn a_user_token_unbinds_moves_and_deletes_a_project(db: TestDb) {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().canonicalize().unwrap();
    let mut config = Config::default();
    config.server.worktree_roots = vec![root.display().to_string()];
    let server = TestServer::start(&db, config, None).await;
    let src = root.join("src");
    let (app, docs) = (src.join("app"), src.join("docs"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&docs).unwrap();
    let create = |id: &str, worktree: &std::path::Path| {
        let worktree = worktree.to_str().unwrap();
        json!({"id": id, "name": id, "worktree": worktree})
    };
    let (status, body) = server.post("/api/projects", create("src", &src)).await;
    assert_eq!(status, 201, "{body}");
    // The parent holds the claim: the repository below it cannot be bound.
    let (status, body) = server.post("/api/projects", create("app", &app)).await;
    assert_eq!(status, 400, "{body}");
    server
        .post("/api/projects", json!({"id": "app", "name": "app"}))
        .await;

    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, ci) = tokens
        .create("ci", &["src".to_owned(), "app".to_owned()])
        .await
        .unwrap();
    let (_, stranger) = tokens
        .create_with(&NewToken {
            name: "stranger".into(),
            projects: vec!["other".into()],
            global: GlobalAccess::Write,
            user: true,
        })
        .await
        .unwrap();
    let (put, delete) = (reqwest::Method::PUT, reqwest::Method::DELETE);
    let move_to = |path: &std::path::Path| Some(json!({"worktree": path.to_str().unwrap()}));
    // A token that is not the user's may not unbind, move or delete (403); one without the
    // project in its scope does not learn that it exists (404).
    for (method, path, body) in [
        (delete.clone(), "/api/projects/src/worktree", None),
        (put.clone(), "/api/projects/app/worktree", move_to(&app)),
        (delete.clone(), "/api/projects/src", None),
    ] {
        let (status, answer) = call(&server, method.clone(), path, &ci, body.clone()).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
        let (status, answer) = call(&server, method.clone(), path, &stranger, body).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
    }
    let (_, unchanged) = server.get("/api/projects/src").await;
    assert_eq!(unchanged["worktree"], src.to_str().unwrap());

    // The user unbinds the parent; the repository's next session binds it.
    let token = server.token().to_owned();
    let (status, body) = call(
        &server,
        delete.clone(),
        "/api/projects/src/worktree",
        &token,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["worktree"], Value::Null, "{body}");
    let (status, body) = server.post("/api/projects", create("app", &app)).await;
    assert_eq!(status, 200, "an unbound project takes its worktree: {body}");
    assert_eq!(body["worktree"], app.to_str().unwrap());

    // Moving respects the claims, the roots and the sensitive directories.
    let home = std::path::PathBuf::from(std::env::var("HOME").expect("HOME"));
    let refusals = [
        (src.clone(), "`app`"),
        (app.join("..").join("app"), "`app`"),
        (std::env::temp_dir(), "worktree roots"),
        (home.join(".ssh"), "sensitive"),
        (home.clone(), "sensitive"),
        (server.home().to_path_buf(), "sensitive"),
    ];
    for (path, says) in refusals {
        let (status, body) = call(
            &server,
            put.clone(),
            "/api/projects/src/worktree",
            &token,
            move_to(&path),
        )
        .await;
        assert_eq!(status, 400, "{}: {body}", path.display());
        assert_eq!(body["field"], "worktree", "{body}");
        assert!(
            body["detail"].as_str().unwrap().contains(says),
            "{}: {body}",
            path.display()
        );
    }
    let (status, body) = call(
        &server,
        put.clone(),
        "/api/projects/app/worktree",
        &token,
        move_to(&docs),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["worktree"], docs.to_str().unwrap(), "moved");
    let (status, body) = call(
        &server,
        put.clone(),
        "/api/projects/src/worktree",
        &token,
        move_to(&app),
    )
    .await;
    assert_eq!(status, 200, "the old place is free again: {body}");

    // Deleting: the project's sessions, turns and jobs go; nothing is left for a worker.
    let (_, session) = server.post("/api/projects/app/sessions", json!({})).await;
    let session = session["id"].as_str().unwrap().to_owned();
    let messages = format!("/api/session/{session}/messages");
    server
        .post(
            &messages,
            json!({"role": "user", "parts": [{"type": "text", "text": "No, use pnpm, not npm"}]}),
        )
        .await;
    let (status, turn) = server
        .post(&messages, json!({"role": "assistant", "status": "completed", "parts": [
            {"type": "tool_call", "toolName": "bash", "arguments": {"cmd": "pnpm i"}, "result": "ok", "status": "completed"}]}))
        .await;
    assert_eq!(status, 201, "{turn}");
    assert_eq!(turn["admission"]["outcome"], "queued", "{turn}");
    let (status, body) = call(&server, delete.clone(), "/api/projects/app", &token, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["projectId"], "app");
    assert_eq!(body["sessionsRemoved"], 1, "{body}");
    assert_eq!(body["jobsRemoved"], 1, "{body}");
    assert_eq!(body["worktree"], docs.to_str().unwrap());
    let (status, _) = server.get("/api/projects/app").await;
    assert_eq!(status, 404);
    let (status, _) = server.get(&format!("/api/session/{session}")).await;
    assert_eq!(status, 404);
    let jobs: i64 = zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM learning_job WHERE project_id = 'app'"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!(
        jobs, 0,
        "no job of the deleted project is left for a worker"
    );
    server.drain_extraction("after-delete").await;
    server.drain_maintenance("after-delete").await;
    let (status, body) = call(&server, delete.clone(), "/api/projects/app", &token, None).await;
    assert_eq!(status, 404, "{body}");
    let (_, projects) = server.get("/api/projects").await;
    assert_eq!(projects.as_array().unwrap().len(), 1, "{projects}");
}

async fn claims_race_to_one_winner(db: TestDb) {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().canonicalize().unwrap();
    let mut config = Config::default();
    config.server.worktree_roots = vec![root.display().to_string()];
    let server = TestServer::start(&db, config, None).await;
    let outer = root.join("outer");
    let inner = outer.join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    // Ten claims of nested directories at once: exactly one may win.
    let attempts = (0..10).map(|i| {
        let path = if i % 2 == 0 { &outer } else { &inner };
        server.post(
            "/api/projects",
            json!({"id": format!("p{i}"), "name": "p", "worktree": path}),
        )
    });
    let results = futures::future::join_all(attempts).await;
    let won = results.iter().filter(|(status, _)| *status == 201).count();
    assert_eq!(won, 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|(status, _)| matches!(status, 201 | 400))
    );
}

async fn the_page_cursor_saturates_and_pages_are_bounded(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    server
        .post("/api/projects", json!({"id": "p", "name": "p"}))
        .await;
    let (_, session) = server.post("/api/projects/p/sessions", json!({})).await;
    let session = session["id"].as_str().unwrap().to_owned();
    let messages = format!("/api/session/{session}/messages");
    // Three messages of 1.8 MiB each: a page holds two (3.6 MiB ≤ 4 MiB), never three.
    let chunk = "x".repeat(900 * 1024);
    for _ in 0..3 {
        let (status, body) = server
            .post(
                &messages,
                json!({"role": "user", "parts": [{"type": "text", "text": chunk}, {"type": "text", "text": chunk}]}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let seqs = |page: &Value| -> Vec<i64> {
        page.as_array()
            .unwrap()
            .iter()
            .map(|m| m["seq"].as_i64().unwrap())
            .collect()
    };
    let (status, page) = server.get(&format!("{messages}?limit=100")).await;
    assert_eq!(status, 200);
    assert_eq!(seqs(&page), [1, 2]);
    let (_, page) = server.get(&format!("{messages}?after=2")).await;
    assert_eq!(seqs(&page), [3]);
    // The cursor at the end of the range used to overflow (`after + 1`): now an empty page.
    for after in [i64::MAX, i64::MAX - 1] {
        let (status, page) = server
            .get(&format!("{messages}?after={after}&limit=1000"))
            .await;
        assert_eq!(
            (status, seqs(&page)),
            (200, vec![]),
            "after={after}: {page}"
        );
    }
    let (status, page) = server.get(&format!("{messages}?limit=-5")).await;
    assert_eq!(
        (status, seqs(&page)),
        (200, vec![1]),
        "a limit below 1 is 1"
    );
}

async fn a_resent_message_is_stored_once(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    server
        .post("/api/projects", json!({"id": "p", "name": "p"}))
        .await;
    let (_, session) = server.post("/api/projects/p/sessions", json!({})).await;
    let session = session["id"].as_str().unwrap().to_owned();
    let messages = format!("/api/session/{session}/messages");
    server
        .post(
            &messages,
            json!({"role": "user", "parts": [{"type": "text", "text": "No, use pnpm, not npm"}]}),
        )
        .await;
    let turn = json!({"id": "turn-1", "role": "assistant", "status": "completed", "parts": [
        {"type": "tool_call", "toolName": "bash", "arguments": {"cmd": "pnpm i"}, "result": "ok", "status": "completed"}]});
    let (status, first) = server.post(&messages, turn.clone()).await;
    assert_eq!(status, 201, "{first}");
    let job = first["admission"]["job"]["id"].as_str().unwrap().to_owned();
    let (status, again) = server.post(&messages, turn.clone()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["message"], first["message"]);
    assert_eq!(
        again["admission"]["job"]["id"], job,
        "the resend reports the turn's existing job"
    );
    let mut different = turn.clone();
    different["parts"][0]["result"] = json!("failed");
    let (status, body) = server.post(&messages, different).await;
    assert_eq!(status, 409, "{body}");
    // Without an id, every send is a new message.
    for _ in 0..2 {
        server
            .post(
                &messages,
                json!({"role": "user", "parts": [{"type": "text", "text": "same"}]}),
            )
            .await;
    }
    let (_, page) = server.get(&messages).await;
    assert_eq!(page.as_array().unwrap().len(), 4, "{page}");
    let (_, jobs) = server
        .get(&format!("/api/jobs?kind=extract&sessionId={session}"))
        .await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 1, "{jobs}");
}

on_both_backends!(
    a_project_token_reaches_global_memory_only_through_review,
    the_users_own_token_still_learns_user_wide_preferences,
    scoped_tokens_stop_at_global_memory,
    a_global_reader_does_not_see_other_projects_in_global_candidates,
    a_parent_session_of_another_project_looks_absent,
    worktrees_are_claims,
    a_user_token_unbinds_moves_and_deletes_a_project,
    claims_race_to_one_winner,
    the_page_cursor_saturates_and_pages_are_bounded,
    a_resent_message_is_stored_once,
);

/// Opens a live stream; `Ok` holds the open response.
async fn open_stream(
    server: &TestServer,
    session: &str,
    token: &str,
) -> Result<reqwest::Response, (u16, Value)> {
    let response = reqwest::Client::new()
        .get(server.url(&format!("/api/session/{session}/learning/events")))
        .bearer_auth(token)
        .send()
        .await
        .expect("request");
    if response.status() == 200 {
        Ok(response)
    } else {
        Err(decode(response).await)
    }
}

#[tokio::test]
async fn live_streams_are_capped_per_token() {
    let db = TestDb::sqlite().await;
    let mut config = Config::default();
    config.server.max_streams_per_token = 2;
    let server = TestServer::start(&db, config, None).await;
    server
        .post("/api/projects", json!({"id": "p", "name": "p"}))
        .await;
    let (_, session) = server.post("/api/projects/p/sessions", json!({})).await;
    let session = session["id"].as_str().unwrap().to_owned();
    let token = server.token().to_owned();
    let first = open_stream(&server, &session, &token).await.expect("first");
    let second = open_stream(&server, &session, &token)
        .await
        .expect("second");
    let (status, body) = open_stream(&server, &session, &token)
        .await
        .expect_err("a third stream is refused");
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "too_many_requests");
    // Another token has slots of its own.
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, other) = tokens.create("other", &["p".to_owned()]).await.unwrap();
    let third = open_stream(&server, &session, &other)
        .await
        .expect("other token");
    // Closing a stream frees its slot once the server sees the disconnect.
    drop(first);
    let reopened = eventually(
        "a slot frees after a stream closes",
        Duration::from_secs(20),
        || async { open_stream(&server, &session, &token).await.ok() },
    )
    .await;
    assert_eq!(server.state.live.open_streams("local"), 2);
    drop((second, third, reopened));
}

#[tokio::test]
async fn metrics_can_require_the_token() {
    let db = TestDb::sqlite().await;
    let mut config = Config::default();
    config.server.metrics_auth = Some(true);
    let server = TestServer::start(&db, config, None).await;
    let (status, content_type, body) =
        raw(&server, reqwest::Method::GET, "/metrics", None, &[], None).await;
    assert_eq!(status, 401, "{body}");
    assert_problem(&content_type, &body, 401, "unauthorized");
    let (status, _, _) = raw(
        &server,
        reqwest::Method::GET,
        "/metrics",
        Some(server.token()),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    // Loopback default: open.
    let open = TestServer::start(&db, Config::default(), None).await;
    let (status, _, _) = raw(&open, reqwest::Method::GET, "/metrics", None, &[], None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_dashboard_signs_in_once_and_runs_only_its_own_script() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let response = reqwest::Client::new()
        .get(server.url("/ui"))
        .send()
        .await
        .unwrap();
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    let script_src = csp
        .split(';')
        .map(str::trim)
        .find(|d| d.starts_with("script-src"))
        .unwrap();
    assert_eq!(script_src, "script-src 'self'", "{csp}");
    let page = response.text().await.unwrap();
    assert!(page.contains(r#"<script src="/ui/app.js"></script>"#));
    assert!(!page.contains("<script>"), "no inline script");
    let script = reqwest::Client::new()
        .get(server.url("/ui/app.js"))
        .send()
        .await
        .unwrap();
    assert!(
        script.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );

    let code = server.state.dashboard.new_code().expect("a code");
    let redeem = |code: String| {
        let url = server.url("/ui/token");
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&json!({ "code": code }))
                .send()
                .await
                .unwrap();
            decode(response).await
        }
    };
    let (status, body) = redeem(code.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["token"], server.token());
    let (status, body) = redeem(code).await;
    assert_eq!(status, 403, "a code works once: {body}");
    let (status, _) = redeem(String::from("guessed-code-guessed-code")).await;
    assert_eq!(status, 403);
}
