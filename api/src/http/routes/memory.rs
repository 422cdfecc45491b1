//! Recall and resident Memory over HTTP: the `/context` call a host makes before each model
//! request, receipts, `experience_search`, `memory_read`, `memory_update` and the review
//! surface (approve, edit, reject, undo, inspect, import).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zuno_shared::learning::recall::search_terms::MatchMode;
use zuno_shared::learning::retrieval::{self, PromptContext, Receipt, SearchHit};
use zuno_shared::memory::MemoryAction;
use zuno_shared::memory::audit::MemoryAudit;
use zuno_shared::memory::service::{Inspection, MemoryError, Origin, Outcome, Proposal};
use zuno_shared::memory::store::{self, Candidate, DocumentView, Revision, Scope};
use zuno_shared::memory::write_check::WriteRefusal;
use zuno_shared::tokens::GlobalAccess;

use super::visible::{visible_project, visible_session};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::json::ApiJson;
use crate::http::state::AppState;

impl From<MemoryError> for ApiError {
    fn from(error: MemoryError) -> ApiError {
        match error {
            MemoryError::Refused(refusal) => {
                let field = match &refusal {
                    WriteRefusal::Invalid { field, .. }
                    | WriteRefusal::Injection { field, .. }
                    | WriteRefusal::Credential { field, .. }
                    | WriteRefusal::Encoding { field, .. } => field,
                    WriteRefusal::Ambiguous { .. }
                    | WriteRefusal::NoMatch
                    | WriteRefusal::NotFullEntry => &"old_text",
                    WriteRefusal::OverCap { key, .. } => key,
                    WriteRefusal::Forgotten
                    | WriteRefusal::UserOwned
                    | WriteRefusal::DroppedAtCap => &"content",
                };
                ApiError::bad_request(*field, refusal.to_string())
            }
            MemoryError::NotFound(detail) => ApiError::NotFound(detail),
            MemoryError::Stale { .. } | MemoryError::Conflict(_) | MemoryError::Worktree(_) => {
                ApiError::Conflict(error.to_string())
            }
            MemoryError::Store(store) => store.into(),
        }
    }
}

/// Global Memory is reachable only with a global scope: `read` to see it (its entries, candidates,
/// revisions, file), `write` to change it.
fn require_scope(caller: &Caller, scope: Scope, needed: GlobalAccess) -> ApiResult<()> {
    match scope {
        Scope::Global => caller.require_global(needed),
        Scope::Project => Ok(()),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContextRequest {
    /// The user prompt (or the text the next request is about); it becomes bounded quoted
    /// search terms, never query syntax.
    pub prompt: String,
}

/// Prompt context for the session's next model request: `memory.global`, `memory.project` and
/// `learning.experiences` sections under the session's `use_memories` policy, with the receipt id.
#[utoipa::path(post, path = "/api/session/{sessionID}/context", tag = "recall",
    params(("sessionID" = String, Path)), request_body = ContextRequest,
    responses((status = 200, body = PromptContext), (status = 400, body = Problem), (status = 404,
        body = Problem)))]
pub async fn context(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(session_id): Path<String>,
    ApiJson(body): ApiJson<ContextRequest>,
) -> ApiResult<Json<PromptContext>> {
    visible_session(&state, &caller, &session_id).await?;
    if body.prompt.len() > 64 * 1024 {
        return Err(ApiError::bad_request(
            "prompt",
            "must be at most 65536 bytes",
        ));
    }
    let context = retrieval::assemble(
        &state.db,
        &state.config,
        &session_id,
        &body.prompt,
        state.ledger.now_ms(),
    )
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("session `{session_id}` was not found")))?;
    Ok(Json(context))
}

/// Replays a prompt receipt: the exact sections a request used.
#[utoipa::path(get, path = "/api/receipts/{receiptId}", tag = "recall",
    params(("receiptId" = String, Path)), responses((status = 200, body = Receipt), (status = 404,
        body = Problem)))]
pub async fn get_receipt(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Receipt>> {
    match retrieval::receipt(&state.db, &id).await? {
        Some(receipt) if caller.can_access(&receipt.project_id) => Ok(Json(receipt)),
        _ => Err(ApiError::NotFound(format!("receipt `{id}` was not found"))),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct SearchParams {
    pub query: String,
    #[serde(default)]
    #[param(minimum = 1, maximum = 50)]
    pub limit: Option<usize>,
    /// `any` (default: recall any meaningful term and rerank) or `all`.
    #[serde(default, rename = "match")]
    pub match_mode: Option<MatchMode>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchResults {
    pub results: Vec<SearchHit>,
}

/// `experience_search(query, limit, match)`: read-only, with citations and verification state.
#[utoipa::path(get, path = "/api/projects/{projectId}/experiences/search", tag = "recall",
    params(("projectId" = String, Path), SearchParams),
    responses((status = 200, body = SearchResults), (status = 400, body = Problem), (status = 404,
        body = Problem)))]
pub async fn search(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(params): Query<SearchParams>,
) -> ApiResult<Json<SearchResults>> {
    visible_project(&state, &caller, &project_id).await?;
    let limit = params.limit.unwrap_or(10);
    if !(1..=50).contains(&limit) {
        return Err(ApiError::bad_request("limit", "must be between 1 and 50"));
    }
    let results = retrieval::search(
        &state.db,
        &project_id,
        &params.query,
        limit,
        params.match_mode.unwrap_or_default(),
        state.ledger.now_ms(),
    )
    .await?;
    Ok(Json(SearchResults { results }))
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct ReadParams {
    /// `global` or `project` (default: both).
    pub target: Option<Scope>,
    pub query: Option<String>,
    /// At most this many entries per document.
    #[param(minimum = 0, maximum = 1000)]
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRead {
    pub documents: Vec<DocumentView>,
}

/// `memory_read(target?, query?, limit?)`: entries with revisions, and how many unsupported
/// derived entries were withheld.
#[utoipa::path(get, path = "/api/projects/{projectId}/memory", tag = "memory",
    params(("projectId" = String, Path), ReadParams), responses((status = 200, body = MemoryRead),
        (status = 404, body = Problem)))]
pub async fn read(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(params): Query<ReadParams>,
) -> ApiResult<Json<MemoryRead>> {
    visible_project(&state, &caller, &project_id).await?;
    if params.limit.is_some_and(|limit| limit > 1000) {
        return Err(ApiError::bad_request("limit", "must be at most 1000"));
    }
    let target = match params.target {
        Some(scope) => {
            require_scope(&caller, scope, GlobalAccess::Read)?;
            Some(scope)
        }
        // Both documents, as far as the caller may read them.
        None if caller.can_read_global() => None,
        None => Some(Scope::Project),
    };
    let documents = state
        .memory
        .read(
            target,
            Some(&project_id),
            params.query.as_deref(),
            params.limit,
        )
        .await?;
    Ok(Json(MemoryRead { documents }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateRequest {
    pub target: Scope,
    pub action: MemoryAction,
    #[serde(default)]
    pub content: Option<String>,
    /// A unique locator of the entry to replace or remove (the exact full entry when no
    /// `expectedRevision` is given).
    #[serde(default)]
    pub old_text: Option<String>,
    #[serde(default)]
    pub expected_revision: Option<i64>,
    pub reason: String,
    pub confidence: f64,
    /// `tool` (the model's memory_update, default) or `user` (a person; only from the user's
    /// token: the local token or one created with `--user`).
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^(tool|user)$")]
    pub origin: Option<String>,
}

/// `memory_update`: creates an audited MemoryCandidate through the memory service; it applies
/// at once under the promotion policy, otherwise it waits for review.
#[utoipa::path(post, path = "/api/projects/{projectId}/memory", tag = "memory",
    params(("projectId" = String, Path)), request_body = UpdateRequest,
    responses((status = 201, body = Outcome), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<UpdateRequest>,
) -> ApiResult<(StatusCode, Json<Outcome>)> {
    visible_project(&state, &caller, &project_id).await?;
    require_scope(&caller, body.target, GlobalAccess::Write)?;
    let origin = match body.origin.as_deref() {
        None | Some("tool") => Origin::Tool,
        // A user-origin change always promotes and is protected as user-owned, so only the
        // user may claim it.
        Some("user") if !caller.is_user() => {
            return Err(ApiError::Forbidden(String::from(
                "`origin: \"user\"` needs the user's token (the local token, or one created with `zuno tokens create --user`)",
            )));
        }
        Some("user") => Origin::User,
        Some(other) => {
            return Err(ApiError::bad_request(
                "origin",
                format!("`{other}` is not `tool` or `user`"),
            ));
        }
    };
    let outcome = state
        .memory
        .propose(Proposal {
            scope: body.target,
            project_id: Some(project_id),
            action: body.action,
            content: body.content,
            old_text: body.old_text,
            expected_revision: body.expected_revision,
            reason: body.reason,
            confidence: body.confidence,
            origin,
            evidence: Vec::new(),
            explicit_user_evidence: origin == Origin::User,
            job_id: None,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(outcome)))
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct CandidateParams {
    /// `pending`, `applied`, `rejected`, `undone`, `stale`, `uncertain`.
    pub state: Option<String>,
}

/// Memory candidates of a project (and global ones, for a caller that may read global
/// Memory), newest first.
#[utoipa::path(get, path = "/api/projects/{projectId}/memory/candidates", tag = "memory",
    operation_id = "memory_candidates",
    params(("projectId" = String, Path), CandidateParams),
    responses((status = 200, body = Vec<Candidate>), (status = 404, body = Problem)))]
pub async fn candidates(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(params): Query<CandidateParams>,
) -> ApiResult<Json<Vec<Candidate>>> {
    visible_project(&state, &caller, &project_id).await?;
    let mut candidates =
        store::candidates(&state.db, Some(&project_id), params.state.as_deref(), 200).await?;
    if !caller.can_read_global() {
        candidates.retain(|candidate| {
            !candidate.targets_global() && candidate.project_id.as_deref() == Some(&project_id)
        });
    }
    Ok(Json(
        candidates
            .into_iter()
            .map(|candidate| redact_foreign(&caller, candidate))
            .collect(),
    ))
}

/// What a caller sees of a global candidate proposed in a project outside its scope: global
/// access reaches global Memory, not the projects it was learned in, so the project's id, the
/// reason (drawn from that project's transcripts), the job and the detail are withheld.
fn redact_foreign(caller: &Caller, mut candidate: Candidate) -> Candidate {
    let foreign = candidate
        .project_id
        .as_deref()
        .is_some_and(|project| !caller.can_access(project));
    if foreign {
        candidate.project_id = None;
        candidate.reason = String::from("proposed in another project");
        candidate.job_id = None;
        candidate.detail = None;
    }
    candidate
}

fn redact_outcome(caller: &Caller, mut outcome: Outcome) -> Outcome {
    outcome.candidate = redact_foreign(caller, outcome.candidate);
    outcome
}

/// A candidate the caller may see (404 otherwise, also for a global candidate without global
/// read access), and 403 when acting on it needs global write access the caller lacks.
async fn visible_candidate(
    state: &AppState,
    caller: &Caller,
    id: &str,
    needed: GlobalAccess,
) -> ApiResult<()> {
    let mut read = state.db.begin_read().await?;
    let candidate = store::candidate_in(&mut read, id).await?;
    read.rollback().await?;
    let not_found = || ApiError::NotFound(format!("memory candidate `{id}` was not found"));
    let candidate = candidate.ok_or_else(not_found)?;
    if candidate.targets_global() {
        if !caller.can_read_global() {
            return Err(not_found());
        }
        return caller.require_global(needed);
    }
    match candidate.project_id.as_deref() {
        Some(project) if caller.can_access(project) => Ok(()),
        None if caller.is_unscoped() => Ok(()),
        _ => Err(not_found()),
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApproveRequest {
    /// Edited content to apply instead of the proposed content.
    #[serde(default)]
    pub content: Option<String>,
}

/// Approve (optionally edit) a pending candidate.
#[utoipa::path(post, path = "/api/memory/candidates/{candidateId}/approve", tag = "memory",
    operation_id = "memory_approve", params(("candidateId" = String,
        Path)), request_body = ApproveRequest,
    responses((status = 200, body = Outcome), (status = 400, body = Problem), (status = 404,
        body = Problem), (status = 409, body = Problem)))]
pub async fn approve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ApproveRequest>,
) -> ApiResult<Json<Outcome>> {
    visible_candidate(&state, &caller, &id, GlobalAccess::Write).await?;
    let outcome = state.memory.approve(&id, body.content).await?;
    Ok(Json(redact_outcome(&caller, outcome)))
}

/// Reject a pending candidate.
#[utoipa::path(post, path = "/api/memory/candidates/{candidateId}/reject", tag = "memory",
    operation_id = "memory_reject", params(("candidateId" = String, Path)), responses((status = 200,
        body = Candidate), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn reject(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Candidate>> {
    visible_candidate(&state, &caller, &id, GlobalAccess::Write).await?;
    let candidate = state.memory.reject(&id).await?;
    Ok(Json(redact_foreign(&caller, candidate)))
}

/// Undo an applied candidate (a new revision restoring its exact `before` snapshot).
#[utoipa::path(post, path = "/api/memory/candidates/{candidateId}/undo", tag = "memory",
    operation_id = "memory_undo", params(("candidateId" = String, Path)), responses((status = 200,
        body = Outcome), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn undo(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Outcome>> {
    visible_candidate(&state, &caller, &id, GlobalAccess::Write).await?;
    let outcome = state.memory.undo(&id).await?;
    Ok(Json(redact_outcome(&caller, outcome)))
}

/// Restore an entry maintenance withheld as stale (named by the `remove` candidate that withheld
/// it, as `memory/audit` lists it): it comes back as the user's own entry, never withheld again.
#[utoipa::path(post, path = "/api/memory/candidates/{candidateId}/restore", tag = "memory",
    operation_id = "memory_restore_stale", params(("candidateId" = String, Path)),
    responses((status = 200, body = Outcome), (status = 404, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem)))]
pub async fn restore(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Outcome>> {
    visible_candidate(&state, &caller, &id, GlobalAccess::Write).await?;
    Ok(Json(state.memory.restore_stale(&id).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct TargetParams {
    pub target: Scope,
}

/// `inspect-memory global|project`: the accepted version beside the file.
#[utoipa::path(get, path = "/api/projects/{projectId}/memory/inspect", tag = "memory",
    params(("projectId" = String, Path), TargetParams), responses((status = 200, body = Inspection),
        (status = 404, body = Problem)))]
pub async fn inspect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(params): Query<TargetParams>,
) -> ApiResult<Json<Inspection>> {
    visible_project(&state, &caller, &project_id).await?;
    require_scope(&caller, params.target, GlobalAccess::Read)?;
    Ok(Json(
        state
            .memory
            .inspect(params.target, Some(&project_id))
            .await?,
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImportRequest {
    pub target: Scope,
}

/// `import-memory global|project`: accept the edited file as a new version.
#[utoipa::path(post, path = "/api/projects/{projectId}/memory/import", tag = "memory",
    params(("projectId" = String, Path)), request_body = ImportRequest,
    responses((status = 200, body = Outcome), (status = 400, body = Problem), (status = 404,
        body = Problem)))]
pub async fn import(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<ImportRequest>,
) -> ApiResult<Json<Outcome>> {
    visible_project(&state, &caller, &project_id).await?;
    require_scope(&caller, body.target, GlobalAccess::Write)?;
    Ok(Json(
        state.memory.import(body.target, Some(&project_id)).await?,
    ))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct History {
    pub revisions: Vec<Revision>,
}

/// A memory document's revision history (newest first), each with its full entry list.
#[utoipa::path(get, path = "/api/projects/{projectId}/memory/revisions", tag = "memory",
    params(("projectId" = String, Path), TargetParams), responses((status = 200, body = History),
        (status = 404, body = Problem)))]
pub async fn revisions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
    Query(params): Query<TargetParams>,
) -> ApiResult<Json<History>> {
    visible_project(&state, &caller, &project_id).await?;
    require_scope(&caller, params.target, GlobalAccess::Read)?;
    let mut tx = state.db.begin().await?;
    let document = store::document_in(
        &mut tx,
        params.target,
        Some(&project_id),
        state.ledger.now_ms(),
    )
    .await?;
    tx.commit().await?;
    Ok(Json(History {
        revisions: store::revisions(&state.db, &document.id, 100).await?,
    }))
}

/// `zuno memory audit`: per document its size against its limit, the entries that share a
/// subject, the pairs that state one rule twice, and the entries naming a file that is no longer
/// in the project's worktree. Read-only; the global document only for a caller who may read it.
#[utoipa::path(get, path = "/api/projects/{projectId}/memory/audit", tag = "memory",
    params(("projectId" = String, Path)),
    responses((status = 200, body = MemoryAudit), (status = 404, body = Problem)))]
pub async fn audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project_id): Path<String>,
) -> ApiResult<Json<MemoryAudit>> {
    visible_project(&state, &caller, &project_id).await?;
    let mut entries = store::supported_entries(&state.db, &project_id).await?;
    if !caller.can_read_global() {
        entries.retain(|entry| entry.scope == Scope::Project);
    }
    let worktree = store::project_worktree(&state.db, &project_id)
        .await?
        .flatten()
        .map(std::path::PathBuf::from);
    let exists = |path: &str| {
        worktree
            .as_deref()
            .is_some_and(|root| zuno_shared::memory::audit::exists_in_worktree(root, path))
    };
    let mut marked = store::marked_stale(&state.db, &project_id).await?;
    let applied = store::candidates(&state.db, Some(&project_id), Some("applied"), 200).await?;
    let mut pushed = zuno_shared::memory::audit::pushed_out(&applied, &entries);
    if !caller.can_read_global() {
        marked.retain(|mark| mark.scope == Scope::Project);
        pushed.retain(|entry| entry.scope == Scope::Project);
    }
    let config = state.config.clone();
    Ok(Json(zuno_shared::memory::audit::audit(
        &entries,
        &marked,
        &pushed,
        |scope| zuno_shared::memory::audit::char_limit(&config, scope),
        worktree
            .is_some()
            .then_some(&exists as &dyn Fn(&str) -> bool),
    )))
}
