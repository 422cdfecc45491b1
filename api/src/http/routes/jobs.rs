//! Job inspection.

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zuno_shared::learning::SourceSnapshot;
use zuno_shared::ledger::{Job, JobEvent, JobFilter, JobKind, JobState, QueueCount};

use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::state::AppState;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
pub struct JobQuery {
    pub kind: Option<JobKind>,
    pub state: Option<JobState>,
    pub session_id: Option<String>,
    /// Pagination cursor: only jobs whose id sorts before this one.
    pub before: Option<String>,
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Pass as `before` for the next page; absent on the last page.
    pub next_before: Option<String>,
    pub counts: Vec<QueueCount>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobDetail {
    pub job: Job,
    pub events: Vec<JobEvent>,
    pub source: Option<SourceSnapshot>,
}

/// List jobs, newest first, with queue counts.
#[utoipa::path(get, path = "/api/jobs", tag = "jobs", params(JobQuery),
    responses((status = 200, body = JobPage), (status = 400, body = Problem)))]
pub async fn list_jobs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<JobQuery>,
) -> ApiResult<Json<JobPage>> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request("limit", "must be between 1 and 1000"));
    }
    let filter = JobFilter {
        kind: query.kind,
        state: query.state,
        projects: caller.project_filter(),
        session_id: query.session_id,
        before_id: query.before,
        limit,
    };
    let jobs = state.ledger.list(&filter).await?;
    let next_before = (jobs.len() as i64 == limit)
        .then(|| jobs.last().map(|j| j.id.clone()))
        .flatten();
    // Queue counts are global; a scoped caller sees only its own jobs' counts.
    let counts = match caller.project_filter() {
        None => state.ledger.counts().await?,
        Some(_) => Vec::new(),
    };
    Ok(Json(JobPage {
        jobs,
        next_before,
        counts,
    }))
}

/// One job with its audit events and bound source.
#[utoipa::path(get, path = "/api/jobs/{id}", tag = "jobs", params(("id" = String, Path)),
    responses((status = 200, body = JobDetail), (status = 404, body = Problem)))]
pub async fn get_job(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<JobDetail>> {
    let job = state.ledger.get(&id).await?;
    let visible = match &job.project_id {
        Some(project) => caller.can_access(project),
        None => caller.project_filter().is_none(),
    };
    if !visible {
        return Err(ApiError::NotFound(format!("job `{id}` was not found")));
    }
    let events = state.ledger.events(&id).await?;
    let mut tx = state.db.begin_read().await?;
    let source = SourceSnapshot::load_in(&mut tx, &id).await?;
    tx.rollback().await?;
    Ok(Json(JobDetail {
        job,
        events,
        source,
    }))
}
