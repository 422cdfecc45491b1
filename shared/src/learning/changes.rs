//! Change markers of learning state, for the live learning stream: cheap summaries of
//! everything a session's learning projection is built from, and a waker for the ledger's
//! Postgres notifications. Equal markers mean (almost certainly) an equal projection, so a
//! stream rebuilds the projection only when its marker moved.

use crate::db::{Db, StoreError};

/// Database-wide counters and update times of everything a projection is built from (jobs,
/// experiences, learning events, feedback, policies).
pub async fn global_marker(db: &Db) -> Result<Vec<i64>, StoreError> {
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
    Ok(vec![
        row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
    ])
}

/// The marker of one session's learning projection.
#[derive(Debug, PartialEq, Eq)]
pub struct SessionMarker {
    /// `(id, state, updated_at)` of the session's 200 most recently updated jobs.
    jobs: Vec<(String, String, i64)>,
    counters: (i64, i64, i64, i64, i64, i64, i64),
}

/// The marker of `session_id`'s projection (experiences count project-wide).
pub async fn session_marker(
    db: &Db,
    session_id: &str,
    project_id: &str,
) -> Result<SessionMarker, StoreError> {
    let jobs_sql = "SELECT id, state, updated_at FROM learning_job WHERE session_id = $1 \
                    ORDER BY updated_at DESC, id DESC LIMIT 200";
    let counters_sql = "SELECT \
        (SELECT COUNT(*) FROM experience_record WHERE project_id = $2), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM experience_record WHERE project_id = $2), \
        (SELECT COUNT(*) FROM learning_event WHERE session_id = $1), \
        (SELECT COALESCE(MAX(at), 0) FROM learning_event WHERE session_id = $1), \
        (SELECT COUNT(*) FROM message_feedback WHERE session_id = $1), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM message_feedback WHERE session_id = $1), \
        (SELECT COALESCE(MAX(updated_at), 0) FROM session_memory_policy WHERE session_id = $1)";
    let jobs: Vec<(String, String, i64)> = crate::on_db!(db, |pool| sqlx::query_as(jobs_sql)
        .bind(session_id)
        .fetch_all(pool)
        .await)?;
    let counters: (i64, i64, i64, i64, i64, i64, i64) =
        crate::on_db!(db, |pool| sqlx::query_as(counters_sql)
            .bind(session_id)
            .bind(project_id)
            .fetch_one(pool)
            .await)?;
    Ok(SessionMarker { jobs, counters })
}

/// Wakes on the ledger's Postgres notifications (a job admitted or settled), so a change is seen
/// before the next poll.
pub struct ChangeListener {
    listener: sqlx::postgres::PgListener,
}

impl ChangeListener {
    /// Listens on the ledger's notification channel; `Ok(None)` on SQLite, which has none.
    pub async fn connect(db: &Db) -> Result<Option<ChangeListener>, StoreError> {
        let Some(pool) = db.as_postgres() else {
            return Ok(None);
        };
        let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
        listener.listen(crate::ledger::PG_CHANNEL).await?;
        Ok(Some(ChangeListener { listener }))
    }

    /// Waits for the next notification.
    pub async fn recv(&mut self) -> Result<(), StoreError> {
        self.listener.recv().await?;
        Ok(())
    }
}
