//! The live learning projection: `GET /api/session/{id}/learning/events` publishes
//! `learning.state.changed` when a worker settles an extraction, resumes from `Last-Event-ID`
//! and respects project scoping.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use zuno_shared::config::Config;
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::ingestion::project_and_session;
use crate::learning::{drain_extraction, post_correction_turn};

const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct SseEvent {
    event: String,
    id: Option<String>,
    data: Value,
}

/// A minimal text/event-stream reader over a reqwest response.
struct SseStream {
    response: reqwest::Response,
    buffer: String,
}

impl SseStream {
    async fn open(
        server: &TestServer,
        session: &str,
        token: Option<&str>,
        last_event_id: Option<&str>,
    ) -> Result<SseStream, (u16, String)> {
        let mut request = server
            .client
            .get(server.url(&format!("/api/session/{session}/learning/events")))
            .header("accept", "text/event-stream");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("request");
        if response.status() != 200 {
            let status = response.status().as_u16();
            return Err((status, response.text().await.unwrap_or_default()));
        }
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Ok(SseStream {
            response,
            buffer: String::new(),
        })
    }

    /// The next event (comments and keep-alives skipped), or a panic at `deadline`.
    async fn next(&mut self, deadline: Instant) -> SseEvent {
        loop {
            self.buffer = self.buffer.replace("\r\n", "\n");
            if let Some(cut) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..cut + 2).collect();
                let (mut event, mut id, mut data) = (String::from("message"), None, String::new());
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        event = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("id:") {
                        id = Some(value.trim().to_owned());
                    } else if let Some(value) = line.strip_prefix("data:") {
                        if !data.is_empty() {
                            data.push('\n');
                        }
                        data.push_str(value.strip_prefix(' ').unwrap_or(value));
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return SseEvent {
                    event,
                    id,
                    data: serde_json::from_str(&data).expect("event data is JSON"),
                };
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .expect("no server-sent event before the deadline")
                .expect("stream read")
                .expect("the stream ended");
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }

    /// Reads events until one satisfies `accept`.
    async fn until(&mut self, deadline: Instant, accept: impl Fn(&Value) -> bool) -> SseEvent {
        loop {
            let event = self.next(deadline).await;
            assert_eq!(event.event, "learning.state.changed", "{event:?}");
            if accept(&event.data) {
                return event;
            }
        }
    }
}

fn session_experiences(data: &Value) -> usize {
    data["learning"]["sessionExperiences"]
        .as_array()
        .map_or(0, Vec::len)
}

async fn an_extraction_publishes_learning_state_changed(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;
    let deadline = Instant::now() + DEADLINE;
    let mut stream = SseStream::open(&server, &session, None, None)
        .await
        .expect("stream opens");

    // The current state arrives first; its id is the projection revision.
    let first = stream.next(deadline).await;
    assert_eq!(first.event, "learning.state.changed");
    assert_eq!(first.data["sessionId"], session.as_str());
    assert_eq!(first.id.as_deref(), first.data["revision"].as_str());
    assert_eq!(session_experiences(&first.data), 0);

    // A closed eligible turn admits an extraction; the worker settles it.
    post_correction_turn(&server, &session).await;
    drain_extraction(&server).await;
    let learned = stream
        .until(deadline, |data| session_experiences(data) > 0)
        .await;
    let experience = &learned.data["learning"]["sessionExperiences"][0];
    assert_eq!(experience["verification"], "verified", "{:?}", learned.data);
    assert_eq!(
        experience["evidence"][0]["excerpt"],
        "That's wrong: run migrations with `zuno migrate`, never by hand."
    );
    assert_ne!(learned.id, first.id);
    // The pushed state is exactly what the projection route returns.
    let (status, view) = server
        .get(&format!("/api/session/{session}/learning"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        view["sessionExperiences"],
        learned.data["learning"]["sessionExperiences"]
    );
    drop(stream);

    // Resuming with the last revision does not resend it: the first event after reconnecting
    // is the next change (a policy update), not the state the client already has.
    let last = learned.id.clone().expect("event id");
    let mut resumed = SseStream::open(&server, &session, None, Some(&last))
        .await
        .expect("stream reopens");
    let (status, _) = server
        .client
        .put(server.url(&format!("/api/session/{session}/memory-policy")))
        .json(&json!({"expectedRevision": 1, "useMemories": false}))
        .send()
        .await
        .map(|response| (response.status().as_u16(), ()))
        .expect("policy update");
    assert_eq!(status, 200);
    let deadline = Instant::now() + DEADLINE;
    let next = resumed.next(deadline).await;
    assert_eq!(next.event, "learning.state.changed");
    assert_ne!(
        next.id.as_deref(),
        Some(last.as_str()),
        "the already-seen state was resent"
    );
    let updated = if next.data["learning"]["policy"]["revision"] == 2 {
        next
    } else {
        resumed
            .until(deadline, |data| data["learning"]["policy"]["revision"] == 2)
            .await
    };
    assert_eq!(updated.data["learning"]["policy"]["useMemories"], false);
}

async fn the_stream_respects_scoping(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), Some("operator-secret")).await;
    for project in ["alpha", "beta"] {
        let (status, _) = server
            .client
            .post(server.url("/api/projects"))
            .bearer_auth("operator-secret")
            .json(&json!({"id": project, "name": project}))
            .send()
            .await
            .map(|response| (response.status().as_u16(), ()))
            .expect("create project");
        assert_eq!(status, 201);
    }
    let response = server
        .client
        .post(server.url("/api/projects/beta/sessions"))
        .bearer_auth("operator-secret")
        .json(&json!({}))
        .send()
        .await
        .expect("create session");
    let beta_session: Value = response.json().await.expect("session");
    let beta_session = beta_session["id"].as_str().unwrap().to_owned();
    let (_, alpha_only) = server
        .state
        .tokens
        .create("alpha", &["alpha".to_owned()])
        .await
        .unwrap();

    let (status, body) = SseStream::open(&server, &beta_session, None, None)
        .await
        .err()
        .expect("no token is refused");
    assert_eq!(status, 401, "{body}");
    let (status, body) = SseStream::open(&server, &beta_session, Some(&alpha_only), None)
        .await
        .err()
        .expect("another project's session is hidden");
    assert_eq!(status, 404, "{body}");
    let problem: Value = serde_json::from_str(&body).expect("problem json");
    assert_eq!(problem["code"], "not_found");
    let mut stream = SseStream::open(&server, &beta_session, Some("operator-secret"), None)
        .await
        .expect("the operator sees every project");
    let first = stream.next(Instant::now() + DEADLINE).await;
    assert_eq!(first.data["learning"]["projectId"], "beta");
}

on_both_backends!(
    an_extraction_publishes_learning_state_changed,
    the_stream_respects_scoping,
);
