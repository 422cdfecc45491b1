//! Change markers of learning state, for the live learning stream: cheap summaries of
//! everything a session's learning projection is built from, and a waker for the ledger's
//! Postgres notifications. Equal markers mean (almost certainly) an equal projection, so a
//! stream rebuilds the projection only when its marker moved.

use super::store::changes as store;
use crate::db::{Db, StoreError};

/// Database-wide counters and update times of everything a projection is built from (jobs,
/// experiences, learning events, feedback, policies).
pub async fn global_marker(db: &Db) -> Result<Vec<i64>, StoreError> {
    Ok(store::global_counters(db).await?.to_vec())
}

/// The marker of one session's learning projection.
#[derive(Debug, PartialEq, Eq)]
pub struct SessionMarker {
    /// `(id, state, updated_at)` of the session's 200 most recently updated jobs.
    jobs: Vec<store::JobMarkerRow>,
    counters: [i64; 7],
}

/// The marker of `session_id`'s projection (experiences count project-wide).
pub async fn session_marker(
    db: &Db,
    session_id: &str,
    project_id: &str,
) -> Result<SessionMarker, StoreError> {
    let jobs = store::session_jobs(db, session_id).await?;
    let counters = store::session_counters(db, session_id, project_id).await?;
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
