//! Change markers' reads: counters and update times of what a learning projection is built
//! from.

use super::keyed;
use crate::db::{Db, StoreError};

/// Database-wide counters and update times of jobs, experiences, learning events, feedback and
/// policies.
pub(crate) async fn global_counters(db: &Db) -> Result<[i64; 9], StoreError> {
    let sql = "SELECT \
        (SELECT COUNT(*) FROM learning_job), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM learning_job), \
        (SELECT COUNT(*) FROM experience_record), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM experience_record), \
        (SELECT COUNT(*) FROM learning_event), \
        (SELECT COALESCE(MAX(at), 0) FROM learning_event), \
        (SELECT COUNT(*) FROM message_feedback), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM message_feedback), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM session_memory_policy)";
    let row: (i64, i64, i64, i64, i64, i64, i64, i64, i64) =
        crate::on_db!(db, |pool| sqlx::query_as(sql).fetch_one(pool).await)?;
    Ok([
        row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
    ])
}

/// A learning job as a session marker sees it.
#[derive(Debug, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct JobMarkerRow {
    id: String,
    state: String,
    updated_at: i64,
}

/// `session_id`'s 200 most recently updated jobs.
pub(crate) async fn session_jobs(
    db: &Db,
    session_id: &str,
) -> Result<Vec<JobMarkerRow>, StoreError> {
    let sql = "SELECT id, state, updated_at FROM learning_job WHERE session_id = $1 \
               ORDER BY updated_at DESC, id DESC LIMIT 200";
    let found = keyed!(on_db, db, query_as(sql), session_id, fetch_all);
    Ok(found?)
}

/// Counters and update times of `project_id`'s experiences and of `session_id`'s learning
/// events, feedback and policy.
pub(crate) async fn session_counters(
    db: &Db,
    session_id: &str,
    project_id: &str,
) -> Result<[i64; 7], StoreError> {
    let sql = "SELECT \
        (SELECT COUNT(*) FROM experience_record WHERE project_id = $2), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM experience_record WHERE project_id = $2), \
        (SELECT COUNT(*) FROM learning_event WHERE session_id = $1), \
        (SELECT COALESCE(MAX(at), 0) FROM learning_event WHERE session_id = $1), \
        (SELECT COUNT(*) FROM message_feedback WHERE session_id = $1), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM message_feedback WHERE session_id = $1), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM session_memory_policy WHERE session_id = $1)";
    let row: (i64, i64, i64, i64, i64, i64, i64) = keyed!(
        on_db,
        db,
        query_as(sql),
        [session_id, project_id],
        fetch_one
    )?;
    Ok([row.0, row.1, row.2, row.3, row.4, row.5, row.6])
}
