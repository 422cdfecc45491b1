//! Guards over HTTP: the check a `PreToolUse` hook makes before a tool call, the list, a dry
//! run for `zuno guards test`, and a person's decisions (approve, reject, disable, enable).

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zuno_shared::config::GuardDecision;
use zuno_shared::guards::{
    self, Decision, GuardError, call, matcher::ToolCall, store::Guard, store::GuardState,
};
use zuno_shared::tokens::GlobalAccess;

use super::visible::visible_project;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::json::ApiJson;
use crate::http::state::AppState;

impl From<GuardError> for ApiError {
    fn from(error: GuardError) -> ApiError {
        match error {
            GuardError::NotFound(_) => ApiError::NotFound(error.to_string()),
            GuardError::Conflict { .. } => ApiError::Conflict(error.to_string()),
            GuardError::Store(store) => store.into(),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct ListParams {
    /// `pending`, `active`, `disabled`, `rejected` or `retired`.
    pub state: Option<String>,
}

/// The guards of a project and the global ones (global ones only for a caller who may read
/// global Memory), newest first.
#[utoipa::path(get, path = "/api/projects/{projectId}/guards", tag = "guards",
    params(("projectId" = String, Path), ListParams),
    responses((status = 200, body = Vec<Guard>), (status = 404, body = Problem)))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(params): Query<ListParams>,
) -> ApiResult<Json<Vec<Guard>>> {
    visible_project(&state, &caller, &project_id).await?;
    // A state no guard can be in lists nothing, as filtering by it always did.
    let state_filter = match params.state.as_deref().map(GuardState::parse) {
        None => None,
        Some(Some(known)) => Some(known),
        Some(None) => return Ok(Json(Vec::new())),
    };
    let mut found = guards::store::list(&state.db, &project_id, state_filter).await?;
    if !caller.can_read_global() {
        found.retain(|guard| guard.project_id.is_some());
    }
    Ok(Json(found))
}

/// A tool call as an agent's `PreToolUse` hook received it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckRequest {
    /// The hook's `tool_name` (`Bash`, `Edit`, `Write`, `MultiEdit`, `NotebookEdit`,
    /// `apply_patch`, …).
    pub tool_name: String,
    /// The hook's `tool_input`, as the agent sent it.
    #[schema(value_type = Object)]
    pub tool_input: serde_json::Value,
    pub session_id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckAnswer {
    /// `allow`, `ask` or `deny`.
    pub decision: String,
    pub reason: Option<String>,
    pub guard_id: Option<String>,
    /// The simple command or path the guard matched.
    pub matched: Option<String>,
}

/// The hook's question before a tool call: may it run? An `active` guard that matches answers
/// `ask` (or `deny` under `guards.decision: deny`) with the lesson, its citation and the
/// alternative, and the stop is recorded; anything else is `allow`.
#[utoipa::path(post, path = "/api/projects/{projectId}/guards/check", tag = "guards",
    params(("projectId" = String, Path)), request_body = CheckRequest,
    responses((status = 200, body = CheckAnswer), (status = 404, body = Problem)))]
pub async fn check(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(request): ApiJson<CheckRequest>,
) -> ApiResult<Json<CheckAnswer>> {
    caller.require(&project_id, "project", &project_id)?;
    if !request.tool_input.is_object() {
        return Err(ApiError::bad_request("toolInput", "must be a JSON object"));
    }
    let project = state.transcripts.project(&project_id).await?;
    let allow = CheckAnswer {
        decision: String::from("allow"),
        reason: None,
        guard_id: None,
        matched: None,
    };
    let worktree = project.worktree.as_deref().map(std::path::Path::new);
    let Some(call) = call::tool_call(&request.tool_name, &request.tool_input, worktree) else {
        return Ok(Json(allow));
    };
    let enforced = guards::store::enforced(&state.db, &project_id).await?;
    let Some(verdict) = guards::verdict(&enforced, &call, state.config.guards.decision) else {
        return Ok(Json(allow));
    };
    guards::record_block(
        &state.db,
        &verdict.guard.id,
        request.session_id.as_deref(),
        &verdict.matched,
        state.ledger.now_ms(),
    )
    .await?;
    Ok(Json(CheckAnswer {
        decision: verdict.decision.as_str().to_owned(),
        reason: Some(verdict.reason()),
        guard_id: Some(verdict.guard.id.clone()),
        matched: Some(verdict.matched.clone()),
    }))
}

/// A field that is a string when present (`null` is refused, as the document says).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    <String as serde::Deserialize>::deserialize(deserializer).map(Some)
}

/// A call to try against the guards: a shell command, or a path an edit would touch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(max_properties = 1)]
pub struct TestRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub command: Option<String>,
    /// Relative to the worktree.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub path: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TestMatch {
    /// The guard's id.
    pub id: String,
    /// `<what it matched>: <the lesson>`.
    pub detail: String,
    pub guard: Guard,
    pub matched: String,
    /// What the hook would answer now: `ask` or `deny` for an active guard, `none` for one that
    /// is not in force.
    pub decision: String,
}

/// `zuno guards test`: which pending or active guards match a call, recording nothing.
#[utoipa::path(post, path = "/api/projects/{projectId}/guards/test", tag = "guards",
    params(("projectId" = String, Path)), request_body = TestRequest,
    responses((status = 200, body = Vec<TestMatch>), (status = 400, body = Problem), (status = 404,
        body = Problem)))]
pub async fn test(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(request): ApiJson<TestRequest>,
) -> ApiResult<Json<Vec<TestMatch>>> {
    visible_project(&state, &caller, &project_id).await?;
    let call = match (request.command, request.path) {
        (Some(command), None) => ToolCall::Shell(command),
        (None, Some(path)) => ToolCall::Edit(vec![path]),
        _ => {
            return Err(ApiError::bad_request(
                "command",
                "give exactly one of `command` and `path`",
            ));
        }
    };
    let mut matches = Vec::new();
    for guard in guards::store::list(&state.db, &project_id, None).await? {
        if !guard.state.is_live() || (guard.project_id.is_none() && !caller.can_read_global()) {
            continue;
        }
        if let Some(matched) = guard.matcher.matches(&call) {
            let decision = if guard.state != GuardState::Active {
                "none"
            } else if guard.decision == GuardDecision::Deny
                || state.config.guards.decision == GuardDecision::Deny
            {
                "deny"
            } else {
                "ask"
            };
            matches.push(TestMatch {
                id: guard.id.clone(),
                detail: format!("{matched}: {}", guard.reason),
                decision: decision.to_owned(),
                guard,
                matched,
            });
        }
    }
    Ok(Json(matches))
}

/// Approve, reject, disable or enable a guard. A global guard needs global write.
async fn decide(
    state: &AppState,
    caller: &Caller,
    id: &str,
    decision: Decision,
) -> ApiResult<Json<Guard>> {
    let not_found = || ApiError::NotFound(format!("guard `{id}` was not found"));
    let guard = guards::get(&state.db, id).await?.ok_or_else(not_found)?;
    match guard.project_id.as_deref() {
        Some(project) if caller.can_access(project) => {}
        None if caller.can_read_global() => caller.require_global(GlobalAccess::Write)?,
        _ => return Err(not_found()),
    }
    Ok(Json(
        guards::decide(&state.db, id, decision, state.ledger.now_ms()).await?,
    ))
}

macro_rules! decision_route {
    ($name:ident, $verb:literal, $decision:expr, $doc:literal) => {
        #[doc = $doc]
        #[utoipa::path(post, path = concat!("/api/guards/{guardId}/", $verb), tag = "guards",
            operation_id = concat!("guard_", $verb), params(("guardId" = String, Path)),
            responses((status = 200, body = Guard), (status = 404, body = Problem), (status = 409,
                body = Problem)))]
        pub async fn $name(
            State(state): State<AppState>,
            Extension(caller): Extension<Caller>,
            Path(id): Path<String>,
        ) -> ApiResult<Json<Guard>> {
            decide(&state, &caller, &id, $decision).await
        }
    };
}

decision_route!(
    approve,
    "approve",
    Decision::Approve,
    "Approve a pending guard: it takes effect."
);
decision_route!(
    reject,
    "reject",
    Decision::Reject,
    "Reject a pending guard: it is never proposed again."
);
decision_route!(
    disable,
    "disable",
    Decision::Disable,
    "Disable a guard (pending or active)."
);
decision_route!(
    enable,
    "enable",
    Decision::Enable,
    "Enable a disabled guard again."
);
