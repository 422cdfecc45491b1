//! The live learning projection: `GET /api/session/{sessionID}/learning/events`, a server-sent
//! event stream publishing `learning.state.changed` with the session's new projection.
//!
//! Workers are separate processes, so the stream cannot rely on in-process notifications. One
//! change poller per process ([`LiveHub`]) watches a cheap database-wide marker of learning state
//! (jobs, experiences, learning events, feedback, policies) every 250 ms, and on Postgres also
//! wakes on the ledger's `LISTEN/NOTIFY` channel; it runs only while some stream is open and
//! broadcasts each change to every open stream. A stream then checks its own session's marker
//! and rebuilds the projection only when that moved, and sends an event only when the
//! projection's content differs from what the client last saw. Every few seconds each stream
//! rebuilds regardless, so nothing a marker misses goes unseen.
//!
//! The event id is the projection's revision: a digest of its content. A reconnecting client
//! sends it back as `Last-Event-ID` and receives nothing until the state moves on; any other
//! (or no) `Last-Event-ID` receives the current state at once.
//!
//! One token may hold at most `server.max_streams_per_token` streams open at once; the next is
//! refused with 429 until one closes.

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
use zuno_shared::learning::changes::{self, SessionMarker};
use zuno_shared::learning::projection::{self, SessionLearning};

use super::visible::visible_session;
use crate::http::auth::Caller;
use crate::http::error::{ApiResult, Problem};
use crate::http::state::AppState;

/// The SSE event name.
pub const STATE_CHANGED: &str = "learning.state.changed";

/// How often each stream rebuilds its projection even when no marker moved.
const FULL_REFRESH: Duration = Duration::from_secs(5);

/// One server-sent event of the stream, as the OpenAPI document describes it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LearningStateEvent {
    /// Always `learning.state.changed`.
    pub event: String,
    /// The projection's revision.
    pub id: String,
    /// A `LearningStateChanged` document, as JSON text.
    #[schema(content_media_type = "application/json")]
    pub data: String,
}

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
        (status = 200, content_type = "text/event-stream", body = LearningStateEvent,
            description = "A stream of `learning.state.changed` events; each event's `id` is the projection revision and its `data` a LearningStateChanged document."),
        (status = 404, body = Problem),
        (status = 429, body = Problem, description = "The token already holds `server.max_streams_per_token` streams open")))]
pub async fn session_learning_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let session = visible_session(&state, &caller, &session_id).await?;
    let permit = state.live.open_stream(caller.id())?;
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
    // The permit lives as long as the response stream: the slot is released when the client
    // goes away and the stream is dropped.
    let stream = futures::stream::unfold((receiver, permit), |(mut receiver, permit)| async move {
        receiver
            .recv()
            .await
            .map(|event| (Ok::<_, Infallible>(event), (receiver, permit)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
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

/// Waits for a learning change (`Some(false)`), the periodic full refresh (`Some(true)`: evaluate
/// even if the marker did not move), or the client leaving (`None`).
async fn next_wake(
    sender: &tokio::sync::mpsc::Sender<Event>,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    refresh: &mut tokio::time::Interval,
) -> Option<bool> {
    tokio::select! {
        () = sender.closed() => None,
        changed = changes.changed() => changed.ok().map(|()| false),
        _ = refresh.tick() => Some(true),
    }
}

/// Sends the session's learning state whenever it changes, until the client leaves or the
/// session is deleted. A cheap change marker decides whether the projection is built again;
/// the periodic refresh builds it regardless.
async fn publish(
    state: AppState,
    session_id: String,
    project_id: String,
    mut last_sent: Option<String>,
    sender: tokio::sync::mpsc::Sender<Event>,
) {
    let mut changes = state.live.subscribe();
    let mut refresh = tokio::time::interval(FULL_REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick completes at once: the current state is evaluated before any wait.
    refresh.tick().await;
    let mut last_marker: Option<SessionMarker> = None;
    let mut forced = true;
    loop {
        if forced || marker_moved(&state, &session_id, &project_id, &mut last_marker).await {
            forced = false;
            match send_current(&state, &session_id, &sender, &mut last_sent).await {
                Pass::Ended => return,
                // The marker is checked again at once; a change that happened while the
                // projection was built moves it.
                Pass::Done => continue,
                Pass::Failed => last_marker = None,
            }
        }
        match next_wake(&sender, &mut changes, &mut refresh).await {
            Some(full) => forced = full,
            None => return,
        }
    }
}

/// Whether the session's change marker moved since `last_marker` (which it then records). A
/// failed read counts as unmoved: the next wake tries again.
async fn marker_moved(
    state: &AppState,
    session_id: &str,
    project_id: &str,
    last_marker: &mut Option<SessionMarker>,
) -> bool {
    match changes::session_marker(&state.db, session_id, project_id).await {
        Ok(marker) if last_marker.as_ref() == Some(&marker) => false,
        Ok(marker) => {
            *last_marker = Some(marker);
            true
        }
        Err(error) => {
            tracing::warn!(%error, session_id, "learning stream: change marker failed");
            false
        }
    }
}

/// How one projection pass of the stream ended.
enum Pass {
    /// The state was sent, or it was what the client already has.
    Done,
    /// The projection failed; the next wake builds it again.
    Failed,
    /// The session was deleted or the client left: the stream ends.
    Ended,
}

/// Builds the session's projection and sends it unless its revision is the one last sent.
async fn send_current(
    state: &AppState,
    session_id: &str,
    sender: &tokio::sync::mpsc::Sender<Event>,
    last_sent: &mut Option<String>,
) -> Pass {
    let view =
        match projection::session_learning(&state.db, &state.ledger, &state.config, session_id, 0)
            .await
        {
            Ok(None) => return Pass::Ended,
            Ok(Some(view)) => view,
            Err(error) => {
                tracing::warn!(%error, session_id, "learning stream: projection failed");
                return Pass::Failed;
            }
        };
    let revision = revision(&view);
    if last_sent.as_deref() == Some(revision.as_str()) {
        return Pass::Done;
    }
    let data = LearningStateChanged {
        session_id: session_id.to_owned(),
        revision: revision.clone(),
        learning: view,
    };
    match Event::default()
        .event(STATE_CHANGED)
        .id(revision.clone())
        .json_data(&data)
    {
        Ok(event) => {
            if sender.send(event).await.is_err() {
                return Pass::Ended;
            }
            *last_sent = Some(revision);
        }
        Err(error) => {
            tracing::warn!(%error, session_id, "learning stream: encoding failed");
        }
    }
    Pass::Done
}
