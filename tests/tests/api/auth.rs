//! Bearer tokens, and project scoping: one project cannot read or write another's data.

use serde_json::json;
use zuno_shared::config::Config;
use zuno_shared::tokens::TokenStore;
use zuno_tests::server::{TestServer, decode};
use zuno_tests::{TestDb, on_both_backends};

const OPERATOR: &str = "operator-secret-token";

async fn call(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = server.client.request(method, server.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    decode(request.send().await.unwrap()).await
}

async fn requests_without_a_valid_token_are_refused(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), Some(OPERATOR)).await;
    let response = server
        .client
        .get(server.url("/api/projects"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let (status, body) = call(
        &server,
        reqwest::Method::GET,
        "/api/projects",
        Some("wrong"),
        None,
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let (status, _) = call(
        &server,
        reqwest::Method::GET,
        "/api/projects",
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(status, 200);
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            server
                .client
                .get(server.url(open))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "{open}"
        );
    }
}

async fn a_scoped_token_reaches_only_its_projects(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), Some(OPERATOR)).await;
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (_, alpha_token) = tokens
        .create("alpha-ci", &["alpha".to_owned()])
        .await
        .unwrap();
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;

    // The operator sets up project beta with a session and an admitted job.
    call(
        &server,
        post.clone(),
        "/api/projects",
        Some(OPERATOR),
        Some(json!({"id": "beta", "name": "Beta"})),
    )
    .await;
    let (_, beta_session) = call(
        &server,
        post.clone(),
        "/api/projects/beta/sessions",
        Some(OPERATOR),
        Some(json!({})),
    )
    .await;
    let beta_session = beta_session["id"].as_str().unwrap().to_owned();
    let (_, turn) = call(
        &server,
        post.clone(),
        &format!("/api/session/{beta_session}/messages"),
        Some(OPERATOR),
        Some(crate::ingestion::tool_turn()),
    )
    .await;
    let beta_job = turn["admission"]["job"]["id"].as_str().unwrap().to_owned();

    // The alpha token works on alpha.
    let (status, _) = call(
        &server,
        post.clone(),
        "/api/projects",
        Some(&alpha_token),
        Some(json!({"id": "alpha", "name": "Alpha"})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, session) = call(
        &server,
        post.clone(),
        "/api/projects/alpha/sessions",
        Some(&alpha_token),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    let alpha_session = session["id"].as_str().unwrap().to_owned();
    let (status, _) = call(
        &server,
        post.clone(),
        &format!("/api/session/{alpha_session}/messages"),
        Some(&alpha_token),
        Some(crate::ingestion::tool_turn()),
    )
    .await;
    assert_eq!(status, 201);

    // …and cannot see or touch beta.
    let (status, _) = call(
        &server,
        post.clone(),
        "/api/projects",
        Some(&alpha_token),
        Some(json!({"id": "gamma", "name": "Gamma"})),
    )
    .await;
    assert_eq!(status, 403, "creating a project outside the scope");
    for path in [
        "/api/projects/beta".to_string(),
        format!("/api/session/{beta_session}"),
        format!("/api/session/{beta_session}/messages"),
        format!("/api/jobs/{beta_job}"),
    ] {
        let (status, _) = call(&server, get.clone(), &path, Some(&alpha_token), None).await;
        assert_eq!(
            status, 404,
            "{path} must look absent to another project's token"
        );
    }
    let (status, _) = call(
        &server,
        post.clone(),
        &format!("/api/session/{beta_session}/messages"),
        Some(&alpha_token),
        Some(json!({"role": "user", "parts": [{"type": "text", "text": "injected"}]})),
    )
    .await;
    assert_eq!(status, 404);
    let (_, projects) = call(
        &server,
        get.clone(),
        "/api/projects",
        Some(&alpha_token),
        None,
    )
    .await;
    let ids: Vec<&str> = projects
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha"]);
    let (_, jobs) = call(&server, get.clone(), "/api/jobs", Some(&alpha_token), None).await;
    let job_projects: Vec<&str> = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["projectId"].as_str().unwrap())
        .collect();
    assert_eq!(job_projects, ["alpha"]);
    let (_, beta_messages) = call(
        &server,
        get.clone(),
        &format!("/api/session/{beta_session}/messages"),
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(
        beta_messages.as_array().unwrap().len(),
        1,
        "the refused write left nothing behind"
    );
}

async fn a_revoked_token_stops_working(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), Some(OPERATOR)).await;
    let tokens = TokenStore::new(db.db.clone(), zuno_shared::clock::system_clock());
    let (info, secret) = tokens.create("temp", &["alpha".to_owned()]).await.unwrap();
    let (status, _) = call(
        &server,
        reqwest::Method::GET,
        "/api/projects",
        Some(&secret),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(tokens.revoke(&info.id).await.unwrap());
    let (status, _) = call(
        &server,
        reqwest::Method::GET,
        "/api/projects",
        Some(&secret),
        None,
    )
    .await;
    assert_eq!(status, 401);
}

on_both_backends!(
    requests_without_a_valid_token_are_refused,
    a_scoped_token_reaches_only_its_projects,
    a_revoked_token_stops_working,
);
