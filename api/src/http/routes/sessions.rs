//! Sessions and their messages. Completing an assistant message closes its turn and admits the
//! turn's extraction job in the same transaction.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use zuno_shared::learning::{SessionDeletion, TurnOutcome};
use zuno_shared::transcript::{
    Message, MessageStatus, NewMessage, Part, Role, Session, TranscriptError, TranscriptStore,
};

use super::visible::visible_session;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::json::ApiJson;
use crate::http::state::AppState;
use zuno_shared::tokens::GlobalAccess;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppendMessage {
    #[serde(default)]
    pub id: Option<String>,
    pub role: Role,
    /// For assistant messages: `in_progress` (default), `completed`, `failed`, `truncated`
    /// or `pending_tools`.
    #[serde(default)]
    pub status: Option<MessageStatus>,
    pub parts: Vec<Part>,
    /// Original timestamp (Unix ms) when importing history.
    #[serde(default)]
    pub created_at: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplaceParts {
    pub parts: Vec<Part>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteMessage {
    pub status: MessageStatus,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct MessagePage {
    /// Return messages with a sequence number greater than this.
    #[serde(default)]
    pub after: i64,
    /// At most this many messages (1–1000, default 100); a page also stops before it would
    /// carry more than 4 MiB of part content (it always holds at least one message).
    #[serde(default = "default_page")]
    pub limit: i64,
}

fn default_page() -> i64 {
    100
}

async fn visible_message(
    state: &AppState,
    caller: &Caller,
    session_id: &str,
    message_id: &str,
) -> ApiResult<Message> {
    visible_session(state, caller, session_id).await?;
    let message = state.transcripts.message(message_id).await?;
    if message.session_id != session_id {
        return Err(ApiError::NotFound(format!(
            "message `{message_id}` was not found in session `{session_id}`"
        )));
    }
    Ok(message)
}

/// Get a session.
#[utoipa::path(get, path = "/api/session/{sessionID}", tag = "sessions",
    params(("sessionID" = String, Path)),
    responses((status = 200, body = Session), (status = 404, body = Problem)))]
pub async fn get_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
) -> ApiResult<Json<Session>> {
    Ok(Json(visible_session(&state, &caller, &session_id).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteSession {
    /// Required, no default: `true` also deletes Experience derived from this session (and
    /// retracts automatic Memory that loses its last source); `false` keeps project learning,
    /// detached from the session and withheld from recall because its sources are gone.
    pub cleanup_derived_experiences: bool,
}

/// Delete a session with its messages, feedback and learning jobs. The keep-versus-clean choice
/// for derived Experience is explicit.
#[utoipa::path(delete, path = "/api/session/{sessionID}", tag = "sessions",
    params(("sessionID" = String, Path), DeleteSession),
    responses((status = 200, body = SessionDeletion), (status = 400, body = Problem), (status = 404,
        body = Problem)))]
pub async fn delete_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    query: Result<Query<DeleteSession>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<SessionDeletion>> {
    let Query(choice) = query.map_err(|rejection| {
        ApiError::bad_request(
            "cleanupDerivedExperiences",
            format!("an explicit `true` or `false` is required ({rejection})"),
        )
    })?;
    visible_session(&state, &caller, &session_id).await?;
    let deletion = state
        .ingestion
        .delete_session(&session_id, choice.cleanup_derived_experiences)
        .await?;
    for document in &deletion.documents {
        // The retraction is committed; a failed projection is reported by inspect-memory.
        if let Err(error) = state.memory.publish(document).await {
            tracing::warn!(%error, "memory projection failed after session deletion");
        }
    }
    Ok(Json(deletion))
}

/// Append a message. An assistant message sent as already completed closes its turn: when the
/// turn is eligible, its extraction job is admitted in the same transaction.
///
/// A message sent with an `id` is stored once: sending it again with the same body answers 200
/// with the stored message (and its turn's admission), with a different body 409. Messages sent
/// without an `id` get a new one each time and are not deduplicated.
#[utoipa::path(post, path = "/api/session/{sessionID}/messages", tag = "messages",
    params(("sessionID" = String, Path)), request_body = AppendMessage,
    responses((status = 201, body = TurnOutcome, description = "Stored"),
        (status = 200, body = TurnOutcome,
            description = "The same message was already stored (a resend)"),
        (status = 400, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem), (status = 413,
            body = Problem)))]
pub async fn append_message(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    ApiJson(body): ApiJson<AppendMessage>,
) -> ApiResult<(StatusCode, Json<TurnOutcome>)> {
    visible_session(&state, &caller, &session_id).await?;
    if caller.global() < GlobalAccess::Write {
        state
            .transcripts
            .mark_written_without_global_write(&session_id)
            .await?;
    }
    let message = NewMessage {
        id: body.id,
        role: body.role,
        status: body.status,
        parts: body.parts,
        created_at: body.created_at,
    };
    let appended = state
        .ingestion
        .append_message(
            &session_id,
            &message,
            zuno_shared::telemetry::current_traceparent(),
        )
        .await;
    match appended {
        Ok(outcome) => Ok((StatusCode::CREATED, Json(outcome))),
        Err(TranscriptError::Conflict(detail)) => match &message.id {
            Some(id) => Ok((
                StatusCode::OK,
                Json(resend(&state, &session_id, id, &message, detail).await?),
            )),
            None => Err(TranscriptError::Conflict(detail).into()),
        },
        Err(error) => Err(error.into()),
    }
}

/// The answer to a message sent again with an id that is already stored: the stored message
/// when the body is the same (for a turn-ending assistant message, with its turn's admission,
/// which is idempotent), 409 otherwise.
async fn resend(
    state: &AppState,
    session_id: &str,
    id: &str,
    message: &NewMessage,
    conflict: String,
) -> ApiResult<TurnOutcome> {
    let stored = match state.transcripts.message(id).await {
        Ok(stored) => stored,
        Err(TranscriptError::NotFound { .. }) => {
            return Err(TranscriptError::Conflict(conflict).into());
        }
        Err(error) => return Err(error.into()),
    };
    if stored.session_id != session_id || !TranscriptStore::same_message(&stored, message) {
        return Err(ApiError::Conflict(format!(
            "message `{id}` already exists with a different body; send a new id for a new message"
        )));
    }
    if stored.role == Role::Assistant && stored.status.ends_turn() {
        return Ok(state
            .ingestion
            .complete_message(
                id,
                stored.status,
                zuno_shared::telemetry::current_traceparent(),
            )
            .await?);
    }
    Ok(TurnOutcome {
        message: stored,
        eligibility: None,
        admission: None,
        not_admitted: None,
    })
}

/// List a session's messages in order.
#[utoipa::path(get, path = "/api/session/{sessionID}/messages", tag = "messages",
    params(("sessionID" = String, Path), MessagePage),
    responses((status = 200, body = Vec<Message>), (status = 404, body = Problem)))]
pub async fn list_messages(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    Query(page): Query<MessagePage>,
) -> ApiResult<Json<Vec<Message>>> {
    visible_session(&state, &caller, &session_id).await?;
    Ok(Json(
        state
            .transcripts
            .messages(&session_id, page.after, page.limit)
            .await?,
    ))
}

/// Replace a message's parts (an edit). Queued work whose source included the message is
/// skipped when claimed.
#[utoipa::path(put, path = "/api/session/{sessionID}/messages/{messageID}", tag = "messages",
    params(("sessionID" = String, Path), ("messageID" = String, Path)), request_body = ReplaceParts,
    responses((status = 200, body = Message), (status = 400, body = Problem), (status = 404,
        body = Problem)))]
pub async fn replace_parts(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((session_id, message_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<ReplaceParts>,
) -> ApiResult<Json<Message>> {
    visible_message(&state, &caller, &session_id, &message_id).await?;
    let mut tx = state.db.begin().await?;
    let message = state
        .transcripts
        .replace_parts_in(&mut tx, &message_id, &body.parts)
        .await?;
    tx.commit().await?;
    Ok(Json(message))
}

/// Set an assistant message's completion status. `completed` closes the turn and, when it is
/// eligible, admits its extraction job (or returns the existing one).
#[utoipa::path(post, path = "/api/session/{sessionID}/messages/{messageID}/complete",
    tag = "messages",
    params(("sessionID" = String, Path), ("messageID" = String,
        Path)), request_body = CompleteMessage,
    responses((status = 200, body = TurnOutcome), (status = 400, body = Problem), (status = 404,
        body = Problem)))]
pub async fn complete_message(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((session_id, message_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<CompleteMessage>,
) -> ApiResult<Json<TurnOutcome>> {
    visible_message(&state, &caller, &session_id, &message_id).await?;
    let outcome = state
        .ingestion
        .complete_message(
            &message_id,
            body.status,
            zuno_shared::telemetry::current_traceparent(),
        )
        .await?;
    Ok(Json(outcome))
}
