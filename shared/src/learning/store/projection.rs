//! The learning projection's own reads: a session's project and what a project's learning has
//! read and kept. The rest of the projection reads through the other stores and the ledger.

use super::keyed;
use crate::db::{Db, StoreError};
use crate::learning::projection::Learned;

/// The project of `session_id`, if the session exists.
pub(crate) async fn project_of_session(
    db: &Db,
    session_id: &str,
) -> Result<Option<String>, StoreError> {
    let sql = "SELECT project_id FROM session WHERE id = $1";
    let found = keyed!(on_db, db, query_scalar(sql), session_id, fetch_optional);
    Ok(found?)
}

/// Prompts read, extraction jobs admitted (and still waiting) and experiences of a project.
const LEARNED_SQL: &str = "SELECT \
    (SELECT COUNT(*) FROM message m JOIN session s ON s.id = m.session_id \
       WHERE s.project_id = $1 AND m.role = 'user'), \
    (SELECT COUNT(*) FROM learning_job WHERE project_id = $1 AND kind = 'extract'), \
    (SELECT COUNT(*) FROM learning_job WHERE project_id = $1 AND kind = 'extract' \
       AND state IN ('queued', 'running')), \
    (SELECT COUNT(*) FROM experience_record WHERE project_id = $1)";

/// What `project_id`'s learning has read and kept so far.
pub(crate) async fn learned(db: &Db, project_id: &str) -> Result<Learned, StoreError> {
    let (prompts, turns, waiting, experiences): (i64, i64, i64, i64) =
        keyed!(on_db, db, query_as(LEARNED_SQL), project_id, fetch_one)?;
    Ok(Learned {
        prompts,
        turns,
        waiting,
        experiences,
    })
}
