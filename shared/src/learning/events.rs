//! Durable learning events (`learning.extraction.request`, `learning.extraction.outcome`,
//! `learning.feedback.changed`, `learning.retrieval_skipped`, …).

use serde::Serialize;

use crate::db::{Db, StoreError, Tx};

pub const EXTRACTION_REQUEST: &str = "learning.extraction.request";
pub const EXTRACTION_OUTCOME: &str = "learning.extraction.outcome";
pub const FEEDBACK_CHANGED: &str = "learning.feedback.changed";
pub const POLICY_CHANGED: &str = "learning.policy.changed";
pub const EXPERIENCE_CHANGED: &str = "learning.experience.changed";

/// Where an event belongs.
#[derive(Debug, Clone, Default)]
pub struct EventScope<'a> {
    pub project_id: Option<&'a str>,
    pub session_id: Option<&'a str>,
    pub job_id: Option<&'a str>,
    pub message_id: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LearningEvent {
    pub id: String,
    pub kind: String,
    pub project_id: Option<String>,
    pub session_id: Option<String>,
    pub job_id: Option<String>,
    pub message_id: Option<String>,
    /// JSON text.
    pub payload: String,
    pub at: i64,
}

pub async fn append_in(
    tx: &mut Tx,
    kind: &str,
    scope: &EventScope<'_>,
    payload: &serde_json::Value,
    now: i64,
) -> Result<String, StoreError> {
    let id = crate::ids::new_id("lev");
    let sql = "INSERT INTO learning_event (id, kind, project_id, session_id, job_id, message_id, payload, at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
    crate::db::execute_in(
        tx,
        sql,
        &[
            (&id).into(),
            kind.into(),
            scope.project_id.into(),
            scope.session_id.into(),
            scope.job_id.into(),
            scope.message_id.into(),
            (&payload.to_string()).into(),
            now.into(),
        ],
    )
    .await?;
    Ok(id)
}

const COLUMNS: &str = "id, kind, project_id, session_id, job_id, message_id, payload, at";

pub async fn for_job(db: &Db, job_id: &str) -> Result<Vec<LearningEvent>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM learning_event WHERE job_id = $1 ORDER BY at, id");
    Ok(crate::on_db!(db, |pool| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(job_id)
    .fetch_all(pool)
    .await)?)
}

pub async fn for_session(
    db: &Db,
    session_id: &str,
    kind: Option<&str>,
    limit: i64,
) -> Result<Vec<LearningEvent>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM learning_event WHERE session_id = $1 AND ($2 IS NULL OR kind = $2) \
         ORDER BY at DESC, id DESC LIMIT $3"
    );
    Ok(crate::on_db!(db, |pool| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(session_id)
    .bind(kind)
    .bind(limit)
    .fetch_all(pool)
    .await)?)
}
