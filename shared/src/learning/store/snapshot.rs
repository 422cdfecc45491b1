//! Source snapshots' SQL: the `learning_source_snapshot` row an extraction job is bound to.

use super::{keyed, write_in};
use crate::db::{StoreError, Tx};
use crate::learning::SourceSnapshot;

/// Binds `snapshot` to job `job_id`; a snapshot the job already has stays.
pub(crate) async fn insert_in(
    tx: &mut Tx,
    job_id: &str,
    snapshot: &SourceSnapshot,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO learning_source_snapshot (job_id, project_id, session_id, \
                 start_message_id, end_message_id, start_seq, end_seq, completed_at, \
                 terminal_digest, manifest_digest, input_bound, context_start_seq) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (job_id) DO NOTHING";
    write_in(
        tx,
        sql,
        &[
            job_id.into(),
            (&snapshot.project_id).into(),
            (&snapshot.session_id).into(),
            (&snapshot.start_message_id).into(),
            (&snapshot.end_message_id).into(),
            snapshot.start_seq.into(),
            snapshot.end_seq.into(),
            snapshot.completed_at.into(),
            (&snapshot.terminal_digest).into(),
            (&snapshot.manifest_digest).into(),
            snapshot.input_bound.into(),
            snapshot.context_start_seq.into(),
        ],
    )
    .await
}

/// The snapshot job `job_id` is bound to, if any.
pub(crate) async fn load_in(
    tx: &mut Tx,
    job_id: &str,
) -> Result<Option<SourceSnapshot>, StoreError> {
    let sql = "SELECT project_id, session_id, start_message_id, end_message_id, start_seq, \
                 end_seq, completed_at, terminal_digest, manifest_digest, input_bound, \
                 context_start_seq \
               FROM learning_source_snapshot WHERE job_id = $1";
    Ok(keyed!(on_tx, tx, query_as(sql), job_id, fetch_optional)?)
}
