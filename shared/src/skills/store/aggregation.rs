//! Aggregation scopes: the per-project watermark and the row whose lock serialises one scope's
//! settlements.
//!
//! A project scope's watermark is the last experience `seq` a completed aggregation read (0
//! before the first). `seq` is assigned by the database in commit order per project, so every
//! experience past the watermark is one no aggregation has read, whatever the hosts' clocks say.
//!
//! [`lock_scope_in`] serialises the settlements of one scope (`project:<id>` or `global`): its
//! row's lock is held until the caller's transaction ends. Two checks of one scope (a follow-up
//! and the run it follows, or several hosts) may run at once; without it, both could find no
//! pattern for the same evidence under Postgres' read-committed isolation and each create one.
//! Admission of a project check and an aggregation's read of its inputs take the same lock, so
//! evidence committed with an admission that found a job still queued is read by that job. A
//! missing row reads as "no watermark", so the row it inserts changes nothing else. (SQLite's
//! write transactions are already serial.)

use crate::db::{Db, StoreError, Tx};

/// The watermark of scope `key` (0 before the first completed aggregation).
pub async fn watermark_in(tx: &mut Tx, key: &str) -> Result<i64, StoreError> {
    let mark: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT watermark_seq FROM learning_aggregation WHERE scope_key = $1"
    )
    .bind(key)
    .fetch_optional(conn)
    .await)?;
    Ok(mark.unwrap_or(0))
}

/// Upserts the scope's row; its lock is held until the caller's transaction ends.
pub async fn lock_scope_in(tx: &mut Tx, key: &str, now: i64) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO learning_aggregation (scope_key, watermark_seq, updated_at) \
         VALUES ($1, 0, $2) \
         ON CONFLICT (scope_key) DO UPDATE SET updated_at = excluded.updated_at",
        &[key.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// Moves the scope's watermark forward to `seq`, never back (a follow-up that settles first
/// keeps its further mark).
pub async fn advance_watermark_in(
    tx: &mut Tx,
    key: &str,
    seq: i64,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO learning_aggregation (scope_key, watermark_seq, updated_at) \
         VALUES ($1, $2, $3) \
         ON CONFLICT (scope_key) DO UPDATE SET watermark_seq = CASE \
           WHEN excluded.watermark_seq > learning_aggregation.watermark_seq \
           THEN excluded.watermark_seq ELSE learning_aggregation.watermark_seq END, \
           updated_at = excluded.updated_at",
        &[key.into(), seq.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// Every project id, in order: what the periodic check visits.
pub async fn project_ids(db: &Db) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_db!(db, |pool| sqlx::query_scalar(
        "SELECT id FROM project ORDER BY id"
    )
    .fetch_all(pool)
    .await)?)
}

/// The project's absolute worktree path as recorded (`None`: unknown project or none).
pub async fn worktree_in(tx: &mut Tx, project_id: &str) -> Result<Option<String>, StoreError> {
    let worktree: Option<Option<String>> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT worktree FROM project WHERE id = $1"
    )
    .bind(project_id)
    .fetch_optional(conn)
    .await)?;
    Ok(worktree.flatten())
}
