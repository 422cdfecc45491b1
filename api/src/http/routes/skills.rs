//! The slow path over HTTP: patterns (`promote`, `pattern-promote`, `pattern-reject`), Skill
//! candidates (`skill-review`, `skill-apply`, `skill-undo`, `skill-reject`), evaluation runs and
//! an explicit aggregation check.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use zuno_shared::ledger::Admission;
use zuno_shared::skills::candidate::{Candidate, SkillCandidateState};
use zuno_shared::skills::evaluation::{ReviewStarted, Run};
use zuno_shared::skills::pattern::{Pattern, Promoted};
use zuno_shared::skills::{SkillError, SkillService};

use super::visible::visible_project;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::json::ApiJson;
use crate::http::state::AppState;

impl From<SkillError> for ApiError {
    fn from(error: SkillError) -> ApiError {
        match error {
            SkillError::NotFound(detail) => ApiError::NotFound(detail),
            SkillError::Conflict(_) | SkillError::Stale(_) | SkillError::File(_) => {
                ApiError::Conflict(error.to_string())
            }
            SkillError::Invalid { field, .. } => ApiError::bad_request(field, error.to_string()),
            SkillError::Store(store) => store.into(),
            SkillError::Ledger(ledger) => ledger.into(),
            other => ApiError::Internal(other.into()),
        }
    }
}

fn service(state: &AppState) -> SkillService {
    SkillService::new(state.ledger.clone(), state.config.clone())
}

/// A candidate the caller may see (another project's answers 404).
async fn visible_candidate(state: &AppState, caller: &Caller, id: &str) -> ApiResult<Candidate> {
    let candidate = service(state).candidate(id).await?;
    caller.require(&candidate.project_id, "skill candidate", id)?;
    Ok(candidate)
}

/// A pattern the caller may see; global patterns are visible to unscoped callers only.
async fn visible_pattern(state: &AppState, caller: &Caller, id: &str) -> ApiResult<Pattern> {
    let pattern = service(state).pattern(id).await?;
    match &pattern.project_id {
        Some(project) => caller.require(project, "pattern", id)?,
        None if !caller.is_unscoped() => {
            return Err(ApiError::NotFound(format!("pattern `{id}` was not found")));
        }
        None => {}
    }
    Ok(pattern)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromoteRequest {
    pub experience_id: String,
}

/// `promote <experience-id>`: a one-evidence project pattern and companion Skill candidate. It
/// bypasses the evidence-count gate, never review or evaluation.
#[utoipa::path(post, path = "/api/projects/{projectId}/learn/promote", tag = "skills",
    params(("projectId" = String, Path)), request_body = PromoteRequest,
    responses((status = 201, body = Promoted), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn promote(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<PromoteRequest>,
) -> ApiResult<(StatusCode, Json<Promoted>)> {
    visible_project(&state, &caller, &project_id).await?;
    let promoted = service(&state)
        .promote_experience(&project_id, &body.experience_id)
        .await?;
    Ok((StatusCode::CREATED, Json(promoted)))
}

/// Admits the project's aggregation check for the current interval bucket now (the same job
/// identity the periodic and post-extraction checks use).
#[utoipa::path(post, path = "/api/projects/{projectId}/learn/aggregate", tag = "skills",
    params(("projectId" = String, Path)),
    responses((status = 202, body = Admission), (status = 404, body = Problem)))]
pub async fn aggregate(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<(StatusCode, Json<Admission>)> {
    visible_project(&state, &caller, &project_id).await?;
    let admission = service(&state).admit_project_check(&project_id).await?;
    Ok((StatusCode::ACCEPTED, Json(admission)))
}

/// The project's patterns, newest first.
#[utoipa::path(get, path = "/api/projects/{projectId}/learn/patterns", tag = "skills",
    params(("projectId" = String, Path)), responses((status = 200, body = Vec<Pattern>),
        (status = 404, body = Problem)))]
pub async fn patterns(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<Json<Vec<Pattern>>> {
    visible_project(&state, &caller, &project_id).await?;
    Ok(Json(service(&state).patterns(Some(&project_id)).await?))
}

/// Global patterns (mined from promoted project patterns of at least two projects).
#[utoipa::path(get, path = "/api/learn/global-patterns", tag = "skills",
    responses((status = 200, body = Vec<Pattern>), (status = 404, body = Problem)))]
pub async fn global_patterns(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<Pattern>>> {
    if !caller.is_unscoped() {
        return Ok(Json(Vec::new()));
    }
    Ok(Json(service(&state).patterns(None).await?))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatternPromoteRequest {
    /// For a global pattern: the project that receives the companion Skill candidate.
    #[serde(default)]
    pub project_id: Option<String>,
}

/// `pattern-promote <pattern-id>`.
#[utoipa::path(post, path = "/api/patterns/{patternId}/promote", tag = "skills",
    params(("patternId" = String, Path)), request_body = PatternPromoteRequest,
    responses((status = 200, body = Promoted), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn pattern_promote(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PatternPromoteRequest>,
) -> ApiResult<Json<Promoted>> {
    visible_pattern(&state, &caller, &id).await?;
    if let Some(project) = &body.project_id {
        visible_project(&state, &caller, project).await?;
    }
    Ok(Json(
        service(&state)
            .promote_pattern(&id, body.project_id.as_deref())
            .await?,
    ))
}

/// `pattern-reject <pattern-id>`: suppressed until new evidence arrives.
#[utoipa::path(post, path = "/api/patterns/{patternId}/reject", tag = "skills",
    params(("patternId" = String, Path)), responses((status = 200, body = Pattern), (status = 404,
        body = Problem)))]
pub async fn pattern_reject(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Pattern>> {
    visible_pattern(&state, &caller, &id).await?;
    Ok(Json(service(&state).reject_pattern(&id).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct CandidateParams {
    /// Only candidates in this state.
    pub state: Option<String>,
}

/// The project's Skill candidates, newest first.
#[utoipa::path(get, path = "/api/projects/{projectId}/skills", tag = "skills",
    operation_id = "skill_candidates", params(("projectId" = String, Path), CandidateParams),
    responses((status = 200, body = Vec<Candidate>), (status = 404, body = Problem)))]
pub async fn candidates(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(params): Query<CandidateParams>,
) -> ApiResult<Json<Vec<Candidate>>> {
    visible_project(&state, &caller, &project_id).await?;
    // A state no candidate can be in lists nothing, as filtering by it always did.
    let state_filter = match params.state.as_deref() {
        None => None,
        Some(text) => match SkillCandidateState::parse(text) {
            Some(state) => Some(state),
            None => return Ok(Json(Vec::new())),
        },
    };
    Ok(Json(
        service(&state)
            .candidates(&project_id, state_filter)
            .await?,
    ))
}

/// One Skill candidate: SKILL.md, diff, rules, evidence, source identity, target and state.
#[utoipa::path(get, path = "/api/skills/{candidateId}", tag = "skills",
    params(("candidateId" = String, Path)), responses((status = 200, body = Candidate),
        (status = 404, body = Problem)))]
pub async fn get_candidate(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Candidate>> {
    Ok(Json(visible_candidate(&state, &caller, &id).await?))
}

/// `skill-review <candidate-id>`: starts an immutable, versioned offline suite and admits its
/// evaluation job. Passing sets `approved`; it writes no file.
#[utoipa::path(post, path = "/api/skills/{candidateId}/review", tag = "skills",
    params(("candidateId" = String, Path)),
    responses((status = 202, body = ReviewStarted), (status = 404, body = Problem), (status = 409,
        body = Problem)))]
pub async fn review(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<ReviewStarted>)> {
    visible_candidate(&state, &caller, &id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(service(&state).review(&id).await?),
    ))
}

/// The candidate's evaluation runs, newest first (state, deadline, scores, diagnostic).
#[utoipa::path(get, path = "/api/skills/{candidateId}/runs", tag = "skills",
    params(("candidateId" = String, Path)), responses((status = 200, body = Vec<Run>),
        (status = 404, body = Problem)))]
pub async fn runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<Run>>> {
    visible_candidate(&state, &caller, &id).await?;
    Ok(Json(service(&state).runs(&id).await?))
}

/// `skill-apply <candidate-id>`: the separate, digest-checked apply of an approved candidate (or
/// a pending revocation). Drift marks the candidate `stale` (409).
#[utoipa::path(post, path = "/api/skills/{candidateId}/apply", tag = "skills",
    params(("candidateId" = String, Path)),
    responses((status = 200, body = Candidate), (status = 404, body = Problem), (status = 409,
        body = Problem)))]
pub async fn apply(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Candidate>> {
    visible_candidate(&state, &caller, &id).await?;
    Ok(Json(service(&state).apply(&id).await?))
}

/// `skill-undo <candidate-id>`: restores the exact file an applied candidate replaced.
#[utoipa::path(post, path = "/api/skills/{candidateId}/undo", tag = "skills",
    operation_id = "skill_undo", params(("candidateId" = String, Path)),
    responses((status = 200, body = Candidate), (status = 404, body = Problem), (status = 409,
        body = Problem)))]
pub async fn undo(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Candidate>> {
    visible_candidate(&state, &caller, &id).await?;
    Ok(Json(service(&state).undo(&id).await?))
}

/// `skill-reject <candidate-id>`.
#[utoipa::path(post, path = "/api/skills/{candidateId}/reject", tag = "skills",
    operation_id = "skill_reject", params(("candidateId" = String, Path)),
    responses((status = 200, body = Candidate), (status = 404, body = Problem), (status = 409,
        body = Problem)))]
pub async fn reject(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Candidate>> {
    visible_candidate(&state, &caller, &id).await?;
    Ok(Json(service(&state).reject(&id).await?))
}
