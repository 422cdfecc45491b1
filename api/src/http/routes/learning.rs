//! Learning endpoints: session policy, feedback, reflection, the session projection, project
//! status and the manual `/learn` commands.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zuno_shared::learning::experience::{self, Experience, ExperienceOrigin};
use zuno_shared::learning::feedback::{Feedback, FeedbackError, FeedbackValue};
use zuno_shared::learning::policy::{self, Generation, PolicyError, SessionPolicy};
use zuno_shared::learning::projection::{self, ProjectStatus, SessionLearning};
use zuno_shared::learning::{ManualError, ReflectOutcome, ReflectScope, RepairReport, TurnOutcome};
use zuno_shared::ledger::Admission;

use super::visible::{visible_project, visible_session};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::json::ApiJson;
use crate::http::state::AppState;
use zuno_shared::tokens::GlobalAccess;

impl From<PolicyError> for ApiError {
    fn from(error: PolicyError) -> ApiError {
        match error {
            PolicyError::ExcludedIsHostAssigned => {
                ApiError::bad_request("generation", error.to_string())
            }
            PolicyError::Stale { .. } | PolicyError::Excluded | PolicyError::Missing(_) => {
                ApiError::Conflict(error.to_string())
            }
        }
    }
}

impl From<FeedbackError> for ApiError {
    fn from(error: FeedbackError) -> ApiError {
        match error {
            FeedbackError::NotFound(_) => ApiError::NotFound(error.to_string()),
            FeedbackError::NotAssistant(_) => ApiError::bad_request("messageID", error.to_string()),
            FeedbackError::NoteTooLong => ApiError::bad_request("note", error.to_string()),
            FeedbackError::Stale { .. } => ApiError::Conflict(error.to_string()),
        }
    }
}

impl From<ManualError> for ApiError {
    fn from(error: ManualError) -> ApiError {
        match error {
            ManualError::NotFound(detail) => ApiError::NotFound(detail),
            ManualError::Conflict(detail) | ManualError::Refused(detail) => {
                ApiError::Conflict(detail)
            }
            ManualError::Invalid { field, reason } => {
                ApiError::bad_request(field.clone(), format!("invalid `{field}`: {reason}"))
            }
        }
    }
}

async fn visible_experience(state: &AppState, caller: &Caller, id: &str) -> ApiResult<Experience> {
    let found = experience::get(&state.db, id).await?;
    match found {
        Some(experience) if caller.can_access(&experience.project_id) => Ok(experience),
        _ => Err(ApiError::NotFound(format!(
            "experience `{id}` was not found"
        ))),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyUpdate {
    /// The revision the client last read; a stale revision is a 409.
    pub expected_revision: i64,
    #[serde(default)]
    pub use_memories: Option<bool>,
    /// `enabled` or `disabled` (`excluded` is host-assigned).
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^(enabled|disabled)$")]
    pub generation: Option<Generation>,
}

/// Read the session's learning policy.
#[utoipa::path(get, path = "/api/session/{sessionID}/memory-policy", tag = "learning",
    params(("sessionID" = String, Path)), responses((status = 200, body = SessionPolicy),
        (status = 404, body = Problem)))]
pub async fn get_policy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
) -> ApiResult<Json<SessionPolicy>> {
    visible_session(&state, &caller, &session_id).await?;
    let mut tx = state.db.begin_read().await?;
    let current = policy::effective_in(
        &mut tx,
        &session_id,
        &state.config.learning,
        state.ledger.now_ms(),
    )
    .await?;
    tx.rollback().await?;
    Ok(Json(current))
}

/// Update the session's policy (compare-and-set on `expectedRevision`).
#[utoipa::path(put, path = "/api/session/{sessionID}/memory-policy", tag = "learning",
    params(("sessionID" = String, Path)), request_body = PolicyUpdate,
    responses((status = 200, body = SessionPolicy), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn put_policy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    ApiJson(body): ApiJson<PolicyUpdate>,
) -> ApiResult<Json<SessionPolicy>> {
    visible_session(&state, &caller, &session_id).await?;
    let mut tx = state.db.begin().await?;
    let updated = policy::update_in(
        &mut tx,
        &session_id,
        body.expected_revision,
        body.use_memories,
        body.generation,
        &state.config.learning,
        state.ledger.now_ms(),
    )
    .await??;
    zuno_shared::learning::events::append_in(
        &mut tx,
        zuno_shared::learning::events::POLICY_CHANGED,
        &zuno_shared::learning::events::EventScope {
            session_id: Some(&session_id),
            ..Default::default()
        },
        &serde_json::json!({
            "revision": updated.revision,
            "useMemories": updated.use_memories,
            "generation": updated.generation,
        }),
        state.ledger.now_ms(),
    )
    .await?;
    tx.commit().await?;
    Ok(Json(updated))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FeedbackRequest {
    pub value: FeedbackValue,
    #[serde(default)]
    pub note: Option<String>,
    /// 0 when no feedback may exist yet; otherwise the current revision.
    pub expected_revision: i64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackResponse {
    pub feedback: Feedback,
    /// Feedback makes a completed turn eligible: its extraction admission, if any.
    pub turn: TurnOutcome,
}

/// Give feedback on a persisted assistant message.
#[utoipa::path(post, path = "/api/session/{sessionID}/messages/{messageID}/feedback",
    tag = "learning",
    params(("sessionID" = String, Path), ("messageID" = String,
        Path)), request_body = FeedbackRequest,
    responses((status = 200, body = FeedbackResponse), (status = 400, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn post_feedback(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((session_id, message_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<FeedbackRequest>,
) -> ApiResult<Json<FeedbackResponse>> {
    visible_session(&state, &caller, &session_id).await?;
    if caller.global() < GlobalAccess::Write {
        state
            .transcripts
            .mark_written_without_global_write(&session_id)
            .await?;
    }
    let message = state.transcripts.message(&message_id).await?;
    if message.session_id != session_id {
        return Err(ApiError::NotFound(format!(
            "message `{message_id}` was not found in session `{session_id}`"
        )));
    }
    let (feedback, turn) = state
        .ingestion
        .set_feedback(
            &message_id,
            body.value,
            body.note.as_deref(),
            body.expected_revision,
            zuno_shared::telemetry::current_traceparent(),
        )
        .await??;
    Ok(Json(FeedbackResponse { feedback, turn }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReflectRequest {
    #[serde(default = "default_scope")]
    pub scope: ReflectScope,
}

fn default_scope() -> ReflectScope {
    ReflectScope::Turn
}

/// `/reflect turn|session`: admit a manual extraction, immediately due.
#[utoipa::path(post, path = "/api/session/{sessionID}/reflect", tag = "learning",
    params(("sessionID" = String, Path)), request_body = ReflectRequest,
    responses((status = 202, body = ReflectOutcome), (status = 404, body = Problem), (status = 409,
        body = Problem)))]
pub async fn reflect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    ApiJson(body): ApiJson<ReflectRequest>,
) -> ApiResult<(StatusCode, Json<ReflectOutcome>)> {
    visible_session(&state, &caller, &session_id).await?;
    let outcome = state
        .ingestion
        .reflect(
            &session_id,
            body.scope,
            zuno_shared::telemetry::current_traceparent(),
        )
        .await??;
    Ok((StatusCode::ACCEPTED, Json(outcome)))
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct Page {
    /// Experience offset (100 per page), 0 to 2147483647.
    #[serde(default)]
    #[param(minimum = 0, maximum = 2147483647)]
    pub offset: i64,
}

/// The largest page offset: far beyond any real listing, and far from the end of the integer
/// range, so `offset + page` cannot overflow anywhere downstream.
const MAX_OFFSET: i64 = i32::MAX as i64;

fn check_offset(offset: i64) -> ApiResult<()> {
    if (0..=MAX_OFFSET).contains(&offset) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "offset",
            format!("must be between 0 and {MAX_OFFSET}"),
        ))
    }
}

/// The session's learning projection: its policy, queue, experiences, warnings and last
/// retrieval, as a client renders them.
#[utoipa::path(get, path = "/api/session/{sessionID}/learning", tag = "learning",
    params(("sessionID" = String, Path), Page), responses((status = 200, body = SessionLearning),
        (status = 404, body = Problem)))]
pub async fn session_learning(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    Query(page): Query<Page>,
) -> ApiResult<Json<SessionLearning>> {
    visible_session(&state, &caller, &session_id).await?;
    check_offset(page.offset)?;
    let view = projection::session_learning(
        &state.db,
        &state.ledger,
        &state.config,
        &session_id,
        page.offset,
    )
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("session `{session_id}` was not found")))?;
    Ok(Json(view))
}

/// `/learn status`.
#[utoipa::path(get, path = "/api/projects/{projectId}/learn/status", tag = "learning",
    params(("projectId" = String, Path)), responses((status = 200, body = ProjectStatus),
        (status = 404, body = Problem)))]
pub async fn status(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<Json<ProjectStatus>> {
    visible_project(&state, &caller, &project_id).await?;
    Ok(Json(
        projection::project_status(&state.db, &state.ledger, &state.config, &project_id).await?,
    ))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExperiencePage {
    pub experiences: Vec<Experience>,
    pub total: i64,
    pub next_offset: Option<i64>,
}

/// `/learn list [offset]`: the project's experiences, 100 per page.
#[utoipa::path(get, path = "/api/projects/{projectId}/learn/experiences", tag = "learning",
    params(("projectId" = String, Path), Page), responses((status = 200, body = ExperiencePage),
        (status = 400, body = Problem), (status = 404, body = Problem)))]
pub async fn list_experiences(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(page): Query<Page>,
) -> ApiResult<Json<ExperiencePage>> {
    visible_project(&state, &caller, &project_id).await?;
    check_offset(page.offset)?;
    let (experiences, total) =
        experience::list(&state.db, &project_id, page.offset, projection::PAGE).await?;
    let next = page.offset + projection::PAGE;
    Ok(Json(ExperiencePage {
        experiences,
        total,
        next_offset: (next < total).then_some(next),
    }))
}

/// `/learn get <experience-id>`: citations, validation state and usage.
#[utoipa::path(get, path = "/api/experiences/{experienceId}", tag = "learning",
    params(("experienceId" = String, Path)), responses((status = 200, body = Experience),
        (status = 404, body = Problem)))]
pub async fn get_experience(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Experience>> {
    Ok(Json(visible_experience(&state, &caller, &id).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordRequest {
    /// 1–4000 characters once surrounding white space is trimmed.
    #[schema(min_length = 1, max_length = 4000, pattern = "\\S")]
    pub text: String,
    /// The session the command was given in (its policy applies).
    #[serde(default)]
    pub session_id: Option<String>,
}

async fn record(
    state: &AppState,
    caller: &Caller,
    project_id: &str,
    body: RecordRequest,
    origin: ExperienceOrigin,
) -> ApiResult<(StatusCode, Json<Experience>)> {
    visible_project(state, caller, project_id).await?;
    let experience = state
        .ingestion
        .record_by(
            project_id,
            body.session_id.as_deref(),
            origin,
            &body.text,
            caller.global() >= GlobalAccess::Write,
        )
        .await??;
    Ok((StatusCode::CREATED, Json(experience)))
}

/// `/learn remember <stable fact, preference, or project rule>`.
#[utoipa::path(post, path = "/api/projects/{projectId}/learn/remember", tag = "learning",
    params(("projectId" = String, Path)), request_body = RecordRequest,
    responses((status = 201, body = Experience), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn remember(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<RecordRequest>,
) -> ApiResult<(StatusCode, Json<Experience>)> {
    record(
        &state,
        &caller,
        &project_id,
        body,
        ExperienceOrigin::Remember,
    )
    .await
}

/// `/learn issue <unresolved issue>`.
#[utoipa::path(post, path = "/api/projects/{projectId}/learn/issue", tag = "learning",
    params(("projectId" = String, Path)), request_body = RecordRequest,
    responses((status = 201, body = Experience), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn issue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<RecordRequest>,
) -> ApiResult<(StatusCode, Json<Experience>)> {
    record(&state, &caller, &project_id, body, ExperienceOrigin::Issue).await
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SolvedRequest {
    /// 1–4000 characters of plain text once surrounding white space is trimmed.
    #[schema(min_length = 1, max_length = 4000, pattern = "\\S")]
    pub resolution: String,
}

/// `/learn solved <experience-id> <resolution>`.
#[utoipa::path(post, path = "/api/experiences/{experienceId}/solved", tag = "learning",
    params(("experienceId" = String, Path)), request_body = SolvedRequest,
    responses((status = 200, body = Experience), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn solved(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SolvedRequest>,
) -> ApiResult<Json<Experience>> {
    visible_experience(&state, &caller, &id).await?;
    Ok(Json(state.ingestion.solve(&id, &body.resolution).await??))
}

/// `/learn forget <experience-id>`.
#[utoipa::path(post, path = "/api/experiences/{experienceId}/forget", tag = "learning",
    params(("experienceId" = String, Path)), responses((status = 200, body = Experience),
        (status = 404, body = Problem)))]
pub async fn forget(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Experience>> {
    visible_experience(&state, &caller, &id).await?;
    let (experience, documents) = state.ingestion.forget(&id).await??;
    for document in documents {
        // The retraction is committed; a failed projection is reported in inspect-memory.
        if let Err(error) = state.memory.publish(&document).await {
            tracing::warn!(%error, "memory projection failed after forget");
        }
    }
    Ok(Json(experience))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReprocessRequest {
    /// An assistant-message id (not an experience id).
    pub assistant_message_id: String,
}

/// `/learn reprocess <assistant-message-id>`: admit, or return the existing current-version job
/// unchanged.
#[utoipa::path(post, path = "/api/projects/{projectId}/learn/reprocess", tag = "learning",
    params(("projectId" = String, Path)), request_body = ReprocessRequest,
    responses((status = 200, body = Admission), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn reprocess(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<ReprocessRequest>,
) -> ApiResult<Json<Admission>> {
    visible_project(&state, &caller, &project_id).await?;
    Ok(Json(
        state
            .ingestion
            .reprocess(
                &project_id,
                &body.assistant_message_id,
                zuno_shared::telemetry::current_traceparent(),
            )
            .await??,
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepairRequest {
    #[serde(default)]
    pub dry_run: bool,
}

/// `/learn embed-backfill`: queues the embedding of every live experience of the project that
/// has no vector of the configured embedding model (nothing without an embeddings provider).
#[utoipa::path(post, path = "/api/projects/{projectId}/learn/embed-backfill", tag = "learning",
    params(("projectId" = String, Path)),
    responses((status = 200, body = zuno_shared::learning::recall::semantic::Backfill),
        (status = 404, body = Problem)))]
pub async fn embed_backfill(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<Json<zuno_shared::learning::recall::semantic::Backfill>> {
    visible_project(&state, &caller, &project_id).await?;
    let report = zuno_shared::learning::recall::semantic::backfill(
        &state.ledger,
        &state.config,
        Some(&project_id),
    )
    .await
    .map_err(ApiError::from)?;
    Ok(Json(report))
}

/// `/learn repair-history [--dry-run]`: at most 32 legacy jobs per call.
#[utoipa::path(post, path = "/api/projects/{projectId}/learn/repair-history", tag = "learning",
    params(("projectId" = String, Path)), request_body = RepairRequest,
    responses((status = 200, body = RepairReport), (status = 404, body = Problem)))]
pub async fn repair_history(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<RepairRequest>,
) -> ApiResult<Json<RepairReport>> {
    visible_project(&state, &caller, &project_id).await?;
    Ok(Json(
        state
            .ingestion
            .repair_history(&project_id, body.dry_run)
            .await?,
    ))
}
