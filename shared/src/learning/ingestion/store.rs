//! Ingestion's SQL: the rows session and project deletion remove, history repair's legacy jobs
//! and records, and catch-up's turn inspections. Experience rows are the Experience store's
//! (`learning/experience/store.rs`); learning jobs are admitted, pruned and found through the
//! ledger.

use crate::db::{Db, StoreError, Tx};
use crate::learning::store::{keyed, write_in};
use crate::ledger::JobState;

/// Whether session `session_id` exists.
pub(super) async fn session_exists_in(tx: &mut Tx, session_id: &str) -> Result<bool, StoreError> {
    let sql = "SELECT id FROM session WHERE id = $1";
    let exists: Option<String> = keyed!(on_tx, tx, query_scalar(sql), session_id, fetch_optional)?;
    Ok(exists.is_some())
}

/// The worktree project `project_id` is bound to (`Some(None)`: none), or `None` when there is
/// no such project.
pub(super) async fn project_worktree_in(
    tx: &mut Tx,
    project_id: &str,
) -> Result<Option<Option<String>>, StoreError> {
    let sql = "SELECT worktree FROM project WHERE id = $1";
    let found = keyed!(on_tx, tx, query_scalar(sql), project_id, fetch_optional);
    Ok(found?)
}

/// How many sessions project `project_id` has.
pub(super) async fn session_count_in(tx: &mut Tx, project_id: &str) -> Result<i64, StoreError> {
    let sql = "SELECT COUNT(*) FROM session WHERE project_id = $1";
    Ok(keyed!(on_tx, tx, query_scalar(sql), project_id, fetch_one)?)
}

/// Marks the pending global Memory candidates `project_id` proposed `stale`; returns how many.
pub(super) async fn withdraw_candidates_in(
    tx: &mut Tx,
    project_id: &str,
    now: i64,
) -> Result<u64, StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE memory_candidate SET state = 'stale', detail = 'its project was deleted', \
           updated_at = $2 WHERE project_id = $1 AND state = 'pending'",
        &[project_id.into(), now.into()],
    )
    .await
}

/// Deletes session `session_id`; what it owns cascades.
pub(super) async fn delete_session_in(tx: &mut Tx, session_id: &str) -> Result<(), StoreError> {
    const SQL: &str = "DELETE FROM session WHERE id = $1";
    write_in(tx, SQL, &[session_id.into()]).await
}

/// Deletes project `project_id`; what it owns cascades.
pub(super) async fn delete_project_in(tx: &mut Tx, project_id: &str) -> Result<(), StoreError> {
    const SQL: &str = "DELETE FROM project WHERE id = $1";
    write_in(tx, SQL, &[project_id.into()]).await
}

/// Deletes the project's rows in tables without a foreign key to it: prompt receipts, learning
/// events and its aggregation watermarks.
pub(super) async fn delete_unowned_rows_in(
    tx: &mut Tx,
    project_id: &str,
) -> Result<(), StoreError> {
    for sql in [
        "DELETE FROM prompt_receipt WHERE project_id = $1",
        "DELETE FROM learning_event WHERE project_id = $1",
    ] {
        crate::db::execute_in(tx, sql, &[project_id.into()]).await?;
    }
    const SQL: &str = "DELETE FROM learning_aggregation WHERE scope_key = $1";
    write_in(tx, SQL, &[(&format!("project:{project_id}")).into()]).await
}

/// The latest completed assistant message of `session_id`, if any.
pub(super) async fn latest_completed_assistant_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Option<String>, StoreError> {
    let sql = "SELECT id FROM message WHERE session_id = $1 AND role = 'assistant' AND status = 'completed' \
             ORDER BY seq DESC LIMIT 1";
    let found = keyed!(on_tx, tx, query_scalar(sql), session_id, fetch_optional);
    Ok(found?)
}

/// An extraction job of an older extractor version that repair may examine.
#[derive(sqlx::FromRow)]
pub(super) struct LegacyJob {
    pub(super) id: String,
    pub(super) session_id: Option<String>,
    pub(super) source_message_id: Option<String>,
    #[sqlx(try_from = "String")]
    pub(super) state: JobState,
}

/// Up to `limit` of `project_id`'s extraction jobs not made by `version` and not yet repaired
/// for it (queued or finished), newest first.
pub(super) async fn legacy_jobs_in(
    tx: &mut Tx,
    project_id: &str,
    version: &str,
    limit: i64,
) -> Result<Vec<LegacyJob>, StoreError> {
    let sql = "SELECT id, session_id, source_message_id, state FROM learning_job j \
               WHERE kind = 'extract' AND project_id = $1 AND COALESCE(extractor_version, '') <> $2 \
                 AND state IN ('queued', 'completed', 'skipped', 'failed') \
                 AND NOT EXISTS (SELECT 1 FROM learning_repair r WHERE r.job_id = j.id AND r.extractor_version = $2) \
               ORDER BY created_at DESC, id DESC LIMIT $3";
    Ok(keyed!(
        on_tx,
        tx,
        query_as(sql),
        [project_id, version, limit],
        fetch_all
    )?)
}

/// What repair did with one legacy job for one extractor version.
pub(super) struct RepairRecord<'a> {
    pub(super) job_id: &'a str,
    pub(super) extractor_version: &'a str,
    pub(super) outcome: &'a str,
    pub(super) detail: Option<&'a str>,
}

/// Records `record`, once per job and extractor version.
pub(super) async fn record_repair_in(
    tx: &mut Tx,
    record: &RepairRecord<'_>,
    now: i64,
) -> Result<(), StoreError> {
    write_in(
        tx,
        "INSERT INTO learning_repair (job_id, extractor_version, outcome, detail, repaired_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (job_id, extractor_version) DO NOTHING",
        &[
            record.job_id.into(),
            record.extractor_version.into(),
            record.outcome.into(),
            record.detail.into(),
            now.into(),
        ],
    ).await
}

/// Which closed turns catch-up looks at.
pub(super) struct CatchUpWindow<'a> {
    /// Turns completed at or after this time.
    pub(super) since: i64,
    /// Turns without an extraction job of this version.
    pub(super) extractor_version: &'a str,
    pub(super) limit: i64,
}

/// Up to `window.limit` completed assistant turns in `window` that have no current-version
/// extraction job and were never inspected, newest first.
pub(super) async fn turns_to_catch_up(
    db: &Db,
    window: &CatchUpWindow<'_>,
) -> Result<Vec<String>, StoreError> {
    let sql = "SELECT m.id FROM message m \
               WHERE m.role = 'assistant' AND m.status = 'completed' AND m.completed_at >= $1 \
                 AND NOT EXISTS (SELECT 1 FROM learning_job j WHERE j.kind = 'extract' AND j.session_id = m.session_id \
                   AND j.source_message_id = m.id AND j.extractor_version = $2 AND j.input_digest IS NULL) \
                 AND NOT EXISTS (SELECT 1 FROM learning_turn_inspection i WHERE i.message_id = m.id) \
               ORDER BY m.completed_at DESC, m.id DESC LIMIT $3";
    Ok(keyed!(
        on_db,
        db,
        query_scalar(sql),
        [window.since, window.extractor_version, window.limit],
        fetch_all
    )?)
}

/// What catch-up found in a turn it will not admit.
pub(super) enum Inspection {
    NotEligible,
    /// Eligible, but its session's policy (exclusion, generation, a forgotten source) refused it.
    NotAdmitted(String),
}

/// Records that catch-up inspected `message_id` and found `inspection`, replacing an earlier
/// record.
pub(super) async fn record_inspection_in(
    tx: &mut Tx,
    message_id: &str,
    inspection: Inspection,
    now: i64,
) -> Result<(), StoreError> {
    let (outcome, detail) = match inspection {
        Inspection::NotEligible => ("not_eligible", None),
        Inspection::NotAdmitted(reason) => ("not_admitted", Some(reason)),
    };
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO learning_turn_inspection (message_id, outcome, detail, inspected_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (message_id) DO UPDATE SET outcome = excluded.outcome, detail = excluded.detail, \
               inspected_at = excluded.inspected_at")
        .bind(message_id).bind(outcome).bind(detail).bind(now)
        .execute(conn).await.map(|d| d.rows_affected())
    })?;
    Ok(())
}
