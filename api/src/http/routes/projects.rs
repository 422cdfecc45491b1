//! Projects and their sessions.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::ToSchema;
use zuno_shared::learning::ProjectDeletion;
use zuno_shared::transcript::{NewProject, NewSession, Project, Session};

use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::json::ApiJson;
use crate::http::state::AppState;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateProject {
    /// Client-chosen stable id (1–128 of `[A-Za-z0-9._:@-]`).
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")]
    pub id: String,
    /// 1–200 characters, not all white space.
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: String,
    /// The project's worktree, where `.zuno/RULES.md` lives: an absolute path to an existing
    /// directory inside one of the server's `server.worktree_roots`, shared with no other
    /// project and not a sensitive directory (the home directory itself, `~/.ssh`, …). It is
    /// stored canonical (symbolic links resolved). Binding one needs the user's token (the local
    /// token or one created with `--user`). An existing project without a worktree is bound to
    /// it; one with another worktree answers 409 (move it with `PUT …/worktree`).
    #[serde(default)]
    #[schema(pattern = "^/[^\\u0000]*$")]
    pub worktree: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSession {
    /// Client-chosen stable id (1–128 of `[A-Za-z0-9._:@-]`); the server makes one when absent.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")]
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
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 409,
            body = Problem)))]
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
            crate::http::worktree::resolve_blocking(requested, &state.config.server, &state.paths)
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

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BindWorktree {
    /// The new worktree, under the rules of `CreateProject.worktree`, here named explicitly:
    /// it need not be a repository root.
    #[schema(pattern = "^/[^\\u0000]*$")]
    pub worktree: String,
}

/// 404 outside the caller's scope, 403 for a token that is not the user's: binding, moving and
/// deleting are the user's acts, as binding is at creation.
fn require_user(caller: &Caller, project_id: &str, verb: &str) -> Result<(), ApiError> {
    caller.require(project_id, "project", project_id)?;
    if caller.is_user() {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "{verb} needs the user's token (the local token, or one created with `zuno tokens create --user`)"
        )))
    }
}

/// Rewrites the project's rules file at its (new) worktree, when it has Memory; a failure is
/// the projection's state, reported by inspect-memory, not the request's.
async fn republish_project_memory(state: &AppState, project_id: &str) {
    match state.memory.project_document_id(project_id).await {
        Ok(Some(document)) => {
            if let Err(error) = state.memory.publish(&document).await {
                tracing::warn!(%error, "memory projection failed after a worktree change");
            }
        }
        Ok(None) => {}
        Err(error) => tracing::warn!(%error, "memory projection skipped after a worktree change"),
    }
}

/// Bind the project to a worktree, or move it to another one. The user names the directory
/// explicitly; it must lie inside `server.worktree_roots`, overlap no other project's worktree
/// and not be a sensitive directory. The rules file is written at the new place (a file there
/// that Zuno did not write is kept and reported by inspect-memory); the old file stays.
#[utoipa::path(put, path = "/api/projects/{projectId}/worktree", tag = "projects",
    params(("projectId" = String, Path)), request_body = BindWorktree,
    responses((status = 200, body = Project), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn bind_worktree(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<BindWorktree>,
) -> ApiResult<Json<Project>> {
    require_user(&caller, &project_id, "binding a worktree")?;
    let worktree =
        crate::http::worktree::resolve_blocking(body.worktree, &state.config.server, &state.paths)
            .await?;
    let project = match state
        .transcripts
        .set_worktree(&project_id, Some(&worktree))
        .await
    {
        Err(zuno_shared::transcript::TranscriptError::WorktreeClaimed { project }) => {
            return Err(crate::http::worktree::overlap(
                &project,
                caller.can_access(&project),
            ));
        }
        other => other?,
    };
    republish_project_memory(&state, &project_id).await;
    Ok(Json(project))
}

/// Unbind the project's worktree. Nothing on disk changes; Zuno stops writing there, and the
/// directory may be claimed by another project. The project's next hook session binds it again
/// when it runs in a repository root.
#[utoipa::path(delete, path = "/api/projects/{projectId}/worktree", tag = "projects",
    params(("projectId" = String, Path)),
    responses((status = 200, body = Project), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn unbind_worktree(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<Json<Project>> {
    require_user(&caller, &project_id, "unbinding a worktree")?;
    Ok(Json(
        state.transcripts.set_worktree(&project_id, None).await?,
    ))
}

/// Delete a project with its sessions, transcripts, Experience, project Memory, Skill
/// candidates and learning jobs. Global Memory entries that only this project's Experience
/// supported are retracted; its pending global candidates become `stale`. Files in the
/// worktree (`.zuno/RULES.md`, applied Skills) and tokens naming the project are left alone.
#[utoipa::path(delete, path = "/api/projects/{projectId}", tag = "projects",
    params(("projectId" = String, Path)),
    responses((status = 200, body = ProjectDeletion), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn delete_project(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<Json<ProjectDeletion>> {
    require_user(&caller, &project_id, "deleting a project")?;
    let deletion = state.ingestion.delete_project(&project_id).await?;
    for document in &deletion.documents {
        // The retraction is committed; a failed projection is reported by inspect-memory.
        if let Err(error) = state.memory.publish(document).await {
            tracing::warn!(%error, "memory projection failed after project deletion");
        }
    }
    Ok(Json(deletion))
}
