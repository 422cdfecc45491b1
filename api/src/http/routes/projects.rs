//! Projects and their sessions.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::ToSchema;
use zuno_shared::transcript::{NewProject, NewSession, Project, Session};

use crate::http::AppState;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::json::ApiJson;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateProject {
    /// Client-chosen stable id (1–128 of `[A-Za-z0-9._:@-]`).
    pub id: String,
    pub name: String,
    /// The project's worktree, where `.zuno/RULES.md` lives: an absolute path to an existing
    /// directory inside one of the server's `server.worktree_roots`, shared with no other
    /// project. It is stored canonical (symbolic links resolved). Binding one needs the user's
    /// token (the local token or one created with `--user`).
    #[serde(default)]
    pub worktree: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSession {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub parent_id: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    /// The session's model as `provider/model`.
    #[serde(default)]
    pub model: Option<String>,
    /// The host's own id for the session (e.g. a Claude Code session id).
    #[serde(default)]
    pub external_ref: Option<String>,
}

/// Create a project (idempotent for identical input).
#[utoipa::path(post, path = "/api/projects", tag = "projects", request_body = CreateProject,
    responses(
        (status = 201, description = "Created", body = Project),
        (status = 200, description = "Already existed with the same data", body = Project),
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 409, body = Problem)))]
pub async fn create_project(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(body): ApiJson<CreateProject>,
) -> ApiResult<(StatusCode, Json<Project>)> {
    if !caller.can_access(&body.id) {
        return Err(ApiError::Forbidden(format!(
            "this token may not create project `{}`",
            body.id
        )));
    }
    let worktree = match body.worktree {
        None => None,
        Some(requested) if !caller.is_user() => {
            // Repeating the exact creation of an existing project binds nothing new.
            let existing = state.transcripts.project(&body.id).await.ok();
            if let Some(project) = existing
                && project.name == body.name
                && project.worktree.as_deref() == Some(requested.as_str())
            {
                return Ok((StatusCode::OK, Json(project)));
            }
            return Err(ApiError::Forbidden(String::from(
                "binding a worktree needs the user's token (the local token, or one created with `zuno tokens create --user`)",
            )));
        }
        Some(requested) => Some(
            crate::http::worktree::resolve_blocking(
                requested,
                crate::http::worktree::roots(&state.config.server),
            )
            .await?,
        ),
    };
    let created = state
        .transcripts
        .create_project(&NewProject {
            id: body.id,
            name: body.name,
            worktree,
        })
        .await;
    let (project, created) = match created {
        Err(zuno_shared::transcript::TranscriptError::WorktreeClaimed { project }) => {
            return Err(crate::http::worktree::overlap(
                &project,
                caller.can_access(&project),
            ));
        }
        other => other?,
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(project)))
}

/// List the projects visible to the caller.
#[utoipa::path(get, path = "/api/projects", tag = "projects",
    responses((status = 200, body = Vec<Project>)))]
pub async fn list_projects(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<Project>>> {
    let projects = state.transcripts.projects().await?;
    Ok(Json(
        projects
            .into_iter()
            .filter(|p| caller.can_access(&p.id))
            .collect(),
    ))
}

/// Get one project.
#[utoipa::path(get, path = "/api/projects/{projectId}", tag = "projects",
    params(("projectId" = String, Path)),
    responses((status = 200, body = Project), (status = 404, body = Problem)))]
pub async fn get_project(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<Json<Project>> {
    caller.require(&project_id, "project", &project_id)?;
    Ok(Json(state.transcripts.project(&project_id).await?))
}

/// Create a session in a project (optionally as a child of another session).
#[utoipa::path(post, path = "/api/projects/{projectId}/sessions", tag = "sessions",
    params(("projectId" = String, Path)), request_body = CreateSession,
    responses((status = 201, body = Session), (status = 400, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn create_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<CreateSession>,
) -> ApiResult<(StatusCode, Json<Session>)> {
    caller.require(&project_id, "project", &project_id)?;
    // The session's learning policy is frozen in the same transaction (a child copies its
    // parent's).
    let (session, _policy) = state
        .ingestion
        .create_session(&NewSession {
            id: body.id,
            project_id,
            parent_id: body.parent_id,
            title: body.title,
            model: body.model,
            external_ref: body.external_ref,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(session)))
}
