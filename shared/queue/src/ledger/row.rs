//! Conversion between stored rows and [`Job`].

use super::model::{Job, JobKind, JobOrigin, JobState};
use crate::db::StoreError;

/// Every column of `learning_job`, in [`JobRow`] order.
pub(crate) const JOB_COLUMNS: &str = "id, kind, identity_key, project_id, session_id, \
    source_message_id, extractor_version, input_digest, bucket_start, claim_scope, origin, \
    priority, state, run_at, attempts, max_attempts, lease_token, lease_owner, lease_expires_at, \
    heartbeat_at, payload, result, last_error, trace_parent, created_at, updated_at, finished_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct JobRow {
    id: String,
    kind: String,
    identity_key: String,
    project_id: Option<String>,
    session_id: Option<String>,
    source_message_id: Option<String>,
    extractor_version: Option<String>,
    input_digest: Option<String>,
    bucket_start: Option<i64>,
    claim_scope: Option<String>,
    origin: String,
    priority: i64,
    state: String,
    run_at: i64,
    attempts: i64,
    max_attempts: i64,
    lease_token: Option<String>,
    lease_owner: Option<String>,
    lease_expires_at: Option<i64>,
    heartbeat_at: Option<i64>,
    payload: String,
    result: Option<String>,
    last_error: Option<String>,
    trace_parent: Option<String>,
    created_at: i64,
    updated_at: i64,
    finished_at: Option<i64>,
}

impl JobRow {
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn kind_text(&self) -> &str {
        &self.kind
    }
}

impl TryFrom<JobRow> for Job {
    type Error = StoreError;

    fn try_from(row: JobRow) -> Result<Job, StoreError> {
        let corrupt = |what: &str, value: &str| {
            StoreError::Corrupt(format!("learning_job {}: {what} `{value}`", row.id))
        };
        let kind = JobKind::parse(&row.kind).ok_or_else(|| corrupt("kind", &row.kind))?;
        let state = JobState::parse(&row.state).ok_or_else(|| corrupt("state", &row.state))?;
        let origin = JobOrigin::parse(&row.origin).ok_or_else(|| corrupt("origin", &row.origin))?;
        let payload = serde_json::from_str(&row.payload).map_err(|_| corrupt("payload", "json"))?;
        let result = match &row.result {
            Some(text) => Some(serde_json::from_str(text).map_err(|_| corrupt("result", "json"))?),
            None => None,
        };
        Ok(Job {
            id: row.id,
            kind,
            identity_key: row.identity_key,
            project_id: row.project_id,
            session_id: row.session_id,
            source_message_id: row.source_message_id,
            extractor_version: row.extractor_version,
            input_digest: row.input_digest,
            bucket_start: row.bucket_start,
            claim_scope: row.claim_scope,
            origin,
            priority: row.priority,
            state,
            run_at: row.run_at,
            attempts: row.attempts,
            max_attempts: row.max_attempts,
            lease_token: row.lease_token,
            lease_owner: row.lease_owner,
            lease_expires_at: row.lease_expires_at,
            heartbeat_at: row.heartbeat_at,
            payload,
            result,
            last_error: row.last_error,
            trace_parent: row.trace_parent,
            created_at: row.created_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
        })
    }
}
