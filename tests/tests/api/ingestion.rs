//! Ingestion and admission over HTTP.

use serde_json::json;
use zuno_shared::config::Config;
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

pub async fn project_and_session(server: &TestServer, project: &str) -> String {
    let (status, _) = server
        .post("/api/projects", json!({"id": project, "name": project}))
        .await;
    assert!(status == 201 || status == 200, "{status}");
    let (status, session) = server
        .post(&format!("/api/projects/{project}/sessions"), json!({}))
        .await;
    assert_eq!(status, 201, "{session}");
    session["id"].as_str().unwrap().to_owned()
}

/// A completed assistant turn: a tool call, which closes the turn.
pub use zuno_tests::pnpm::assistant_turn as tool_turn;

async fn a_closed_turn_is_admitted_and_visible_as_a_job(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    let (status, user) = server
        .post(&format!("/api/session/{session}/messages"), json!({"role": "user", "parts": [{"type": "text", "text": "No, use pnpm instead of npm"}]}))
        .await;
    assert_eq!(status, 201, "{user}");
    assert!(user["admission"].is_null(), "a user message closes no turn");
    let (status, outcome) = server
        .post(&format!("/api/session/{session}/messages"), tool_turn())
        .await;
    assert_eq!(status, 201, "{outcome}");
    assert_eq!(outcome["eligibility"]["eligible"], true);
    assert_eq!(
        outcome["eligibility"]["reasons"],
        json!(["user_correction", "tool_call"])
    );
    assert_eq!(outcome["admission"]["outcome"], "queued");
    let job_id = outcome["admission"]["job"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(outcome["admission"]["job"]["kind"], "extract");
    assert_eq!(outcome["admission"]["job"]["state"], "queued");

    let message_id = outcome["message"]["id"].as_str().unwrap();
    let (status, again) = server
        .post(
            &format!("/api/session/{session}/messages/{message_id}/complete"),
            json!({"status": "completed"}),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["admission"]["outcome"], "existing");
    assert_eq!(again["admission"]["job"]["id"], job_id.as_str());

    let (status, page) = server.get("/api/jobs?kind=extract").await;
    assert_eq!(status, 200);
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);
    let (status, detail) = server.get(&format!("/api/jobs/{job_id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["source"]["sessionId"], session.as_str());
    assert_eq!(detail["source"]["endMessageId"], message_id);
}

async fn completing_an_in_progress_turn_admits_it(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    let mut turn = tool_turn();
    turn["status"] = json!("in_progress");
    let (_, outcome) = server
        .post(&format!("/api/session/{session}/messages"), turn)
        .await;
    assert!(outcome["admission"].is_null());
    let message_id = outcome["message"]["id"].as_str().unwrap();
    let (status, failed) = server
        .post(
            &format!("/api/session/{session}/messages/{message_id}/complete"),
            json!({"status": "failed"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(failed["eligibility"]["ineligible"], "not_completed");
    assert!(failed["admission"].is_null());
    let (_, completed) = server
        .post(
            &format!("/api/session/{session}/messages/{message_id}/complete"),
            json!({"status": "completed"}),
        )
        .await;
    assert_eq!(completed["admission"]["outcome"], "queued");
}

async fn messages_are_listed_in_order_and_edits_bump_the_revision(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    for text in ["one", "two", "three"] {
        server
            .post(
                &format!("/api/session/{session}/messages"),
                json!({"role": "user", "parts": [{"type": "text", "text": text}]}),
            )
            .await;
    }
    let (_, messages) = server
        .get(&format!("/api/session/{session}/messages?after=1&limit=5"))
        .await;
    let texts: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["two", "three"]);
    let id = messages[0]["id"].as_str().unwrap();
    let response = server
        .client
        .put(server.url(&format!("/api/session/{session}/messages/{id}")))
        .json(&json!({"parts": [{"type": "text", "text": "two (edited)"}]}))
        .send()
        .await
        .unwrap();
    let (status, edited) = zuno_tests::server::decode(response).await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(edited["revision"], 2);
}

on_both_backends!(
    a_closed_turn_is_admitted_and_visible_as_a_job,
    completing_an_in_progress_turn_admits_it,
    messages_are_listed_in_order_and_edits_bump_the_revision,
);
