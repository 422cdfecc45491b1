//! The live learning projection: `GET /api/session/{sessionID}/learning/events`, a server-sent
//! event stream publishing `learning.state.changed` with the session's new projection.
//!
//! Workers are separate processes, so the stream cannot rely on in-process notifications. Each
//! open stream polls a cheap change marker of the session's durable learning state (its jobs'
//! states and update times, the project's experiences, the session's learning events, feedback
//! and policy) every 250 ms; only when the marker moves is the projection rebuilt, and only
//! when the projection's content differs from what the client last saw is an event sent. Every
//! few seconds the projection is rebuilt regardless, so nothing the marker misses goes unseen.
//!
//! The event id is the projection's revision: a digest of its content. A reconnecting client
//! sends it back as `Last-Event-ID` and receives nothing until the state moves on; any other
//! (or no) `Last-Event-ID` receives the current state at once.

use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use zuno_shared::db::{Db, StoreError};
use zuno_shared::learning::projection::{self, SessionLearning};

use super::sessions::visible_session;
use crate::http::AppState;
use crate::http::auth::Caller;
use crate::http::error::{ApiResult, Problem};

/// The SSE event name.
pub const STATE_CHANGED: &str = "learning.state.changed";

/// How often an open stream checks the change marker.
const POLL: Duration = Duration::from_millis(250);
/// Every this many polls the projection is rebuilt even when the marker did not move.
const FULL_REFRESH_EVERY: u32 = 20;

/// The data of a `learning.state.changed` event.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LearningStateChanged {
    pub session_id: String,
    /// The projection's revision (also the SSE event id); opaque.
    pub revision: String,
    /// The first page of the session's learning projection, as `GET …/learning` returns it.
    pub learning: SessionLearning,
}

/// Server-sent events: `learning.state.changed` whenever the session's learning state changes
/// (a job admitted, claimed or settled, an experience stored or changed, feedback, policy).
/// The current state is sent first unless `Last-Event-ID` names it.
#[utoipa::path(get, path = "/api/session/{sessionID}/learning/events", tag = "learning",
    params(
        ("sessionID" = String, Path),
        ("Last-Event-ID" = Option<String>, Header, description = "The revision the client last received; the current state is not resent while it is unchanged."),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = LearningStateChanged,
            description = "A stream of `learning.state.changed` events; each event's `id` is the projection revision and its `data` a LearningStateChanged document."),
        (status = 404, body = Problem)))]
pub async fn session_learning_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let session = visible_session(&state, &caller, &session_id).await?;
    let last_seen = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .map(str::to_owned);
    let (sender, receiver) = tokio::sync::mpsc::channel::<Event>(8);
    tokio::spawn(publish(
        state,
        session_id,
        session.project_id,
        last_seen,
        sender,
    ));
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|event| (Ok::<_, Infallible>(event), receiver))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// Cheap summary of everything the projection is built from; equal markers mean (almost
/// certainly) an equal projection.
#[derive(Debug, PartialEq, Eq)]
struct Marker {
    jobs: Vec<(String, String, i64)>,
    counters: (i64, i64, i64, i64, i64, i64, i64),
}

async fn change_marker(db: &Db, session_id: &str, project_id: &str) -> Result<Marker, StoreError> {
    let jobs_sql = "SELECT id, state, updated_at FROM learning_job WHERE session_id = $1 \
                    ORDER BY updated_at DESC, id DESC LIMIT 200";
    let counters_sql = "SELECT \
        (SELECT COUNT(*) FROM experience_record WHERE project_id = $2), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM experience_record WHERE project_id = $2), \
        (SELECT COUNT(*) FROM learning_event WHERE session_id = $1), \
        (SELECT COALESCE(MAX(at), 0) FROM learning_event WHERE session_id = $1), \
        (SELECT COUNT(*) FROM message_feedback WHERE session_id = $1), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM message_feedback WHERE session_id = $1), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM session_memory_policy WHERE session_id = $1)";
    let jobs: Vec<(String, String, i64)> = zuno_shared::on_db!(db, pool => sqlx::query_as(jobs_sql)
        .bind(session_id)
        .fetch_all(pool)
        .await)?;
    let counters: (i64, i64, i64, i64, i64, i64, i64) = zuno_shared::on_db!(db, pool => sqlx::query_as(counters_sql)
        .bind(session_id)
        .bind(project_id)
        .fetch_one(pool)
        .await)?;
    Ok(Marker { jobs, counters })
}

/// The content revision of a projection: what a client has seen.
fn revision(view: &SessionLearning) -> String {
    let mut stable = view.clone();
    if stable.policy.revision == 0 {
        // A legacy session's fallback policy is stamped with the read time.
        stable.policy.updated_at = 0;
    }
    let bytes = serde_json::to_vec(&stable).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..12])
}

async fn publish(
    state: AppState,
    session_id: String,
    project_id: String,
    mut last_sent: Option<String>,
    sender: tokio::sync::mpsc::Sender<Event>,
) {
    let mut ticker = tokio::time::interval(POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_marker: Option<Marker> = None;
    let mut since_refresh = 0u32;
    loop {
        tokio::select! {
            () = sender.closed() => return,
            _ = ticker.tick() => {}
        }
        since_refresh += 1;
        match change_marker(&state.db, &session_id, &project_id).await {
            Ok(marker) => {
                if last_marker.as_ref() == Some(&marker) && since_refresh < FULL_REFRESH_EVERY {
                    continue;
                }
                last_marker = Some(marker);
            }
            Err(error) => {
                tracing::warn!(%error, session_id, "learning stream: change marker failed");
                continue;
            }
        }
        since_refresh = 0;
        let view = match projection::session_learning(
            &state.db,
            &state.ledger,
            &state.config,
            &session_id,
            0,
        )
        .await
        {
            // The session was deleted: the stream ends.
            Ok(None) => return,
            Ok(Some(view)) => view,
            Err(error) => {
                tracing::warn!(%error, session_id, "learning stream: projection failed");
                last_marker = None;
                continue;
            }
        };
        let revision = revision(&view);
        if last_sent.as_deref() == Some(revision.as_str()) {
            continue;
        }
        let data = LearningStateChanged {
            session_id: session_id.clone(),
            revision: revision.clone(),
            learning: view,
        };
        let event = match Event::default()
            .event(STATE_CHANGED)
            .id(revision.clone())
            .json_data(&data)
        {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%error, session_id, "learning stream: encoding failed");
                continue;
            }
        };
        if sender.send(event).await.is_err() {
            return;
        }
        last_sent = Some(revision);
    }
}
