//! Learning events' SQL: appending and reading `learning_event` rows.

use super::keyed;
use crate::db::{Db, StoreError, Tx};
use crate::learning::events::{EventScope, LearningEvent};

/// Appends an event of `kind` in `scope` with its JSON `payload`; returns the event id.
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

/// The events of job `job_id`, oldest first.
pub async fn for_job(db: &Db, job_id: &str) -> Result<Vec<LearningEvent>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM learning_event WHERE job_id = $1 ORDER BY at, id"
    ));
    Ok(keyed!(on_db, db, query_as(sql), job_id, fetch_all)?)
}

/// Up to `limit` events of `session_id` (of `kind` only, when given), newest first.
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
    Ok(crate::on_db!(db, |conn| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(session_id)
    .bind(kind)
    .bind(limit)
    .fetch_all(conn)
    .await)?)
}

/// The JSON payload of `session_id`'s latest retrieval event (a selection or a skip), if any.
pub(crate) async fn last_retrieval_payload_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Option<String>, StoreError> {
    let sql = "SELECT payload FROM learning_event WHERE session_id = $1 AND kind LIKE 'learning.retrieval%' ORDER BY at DESC, id DESC LIMIT 1";
    let found = keyed!(on_tx, tx, query_scalar(sql), session_id, fetch_optional);
    Ok(found?)
}
