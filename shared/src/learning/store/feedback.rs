//! Feedback's SQL: the revisioned `message_feedback` row of an assistant message.

use super::keyed;
use crate::db::{StoreError, Tx};
use crate::learning::feedback::{Feedback, FeedbackValue};

#[derive(sqlx::FromRow)]
struct FeedbackRow {
    message_id: String,
    session_id: String,
    value: String,
    note: Option<String>,
    revision: i64,
    updated_at: i64,
}

impl TryFrom<FeedbackRow> for Feedback {
    type Error = StoreError;
    fn try_from(row: FeedbackRow) -> Result<Feedback, StoreError> {
        Ok(Feedback {
            value: FeedbackValue::parse(&row.value)
                .ok_or_else(|| StoreError::Corrupt(format!("feedback value `{}`", row.value)))?,
            message_id: row.message_id,
            session_id: row.session_id,
            note: row.note,
            revision: row.revision,
            updated_at: row.updated_at,
        })
    }
}

/// The feedback on `message_id`, if any.
pub(crate) async fn load_in(tx: &mut Tx, message_id: &str) -> Result<Option<Feedback>, StoreError> {
    let sql = "SELECT message_id, session_id, value, note, revision, updated_at FROM message_feedback WHERE message_id = $1";
    let row: Option<FeedbackRow> = keyed!(on_tx, tx, query_as(sql), message_id, fetch_optional)?;
    row.map(Feedback::try_from).transpose()
}

/// The messages of `session_id` that carry feedback, least recently updated first.
pub(crate) async fn messages_of_session_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Vec<String>, StoreError> {
    let sql = "SELECT message_id FROM message_feedback WHERE session_id = $1 ORDER BY updated_at";
    Ok(keyed!(on_tx, tx, query_scalar(sql), session_id, fetch_all)?)
}

/// A message feedback may target: its session, its role (as stored) and its project.
#[derive(sqlx::FromRow)]
pub(crate) struct TargetRow {
    pub(crate) session_id: String,
    pub(crate) role: String,
    pub(crate) project_id: String,
}

/// The session, role and project of message `message_id`, if it exists.
pub(crate) async fn target_in(
    tx: &mut Tx,
    message_id: &str,
) -> Result<Option<TargetRow>, StoreError> {
    let sql = "SELECT m.session_id, m.role, s.project_id FROM message m JOIN session s ON s.id = m.session_id WHERE m.id = $1";
    let found = keyed!(on_tx, tx, query_as(sql), message_id, fetch_optional);
    Ok(found?)
}

/// Inserts `first`, the first feedback on its message (revision 1); returns the rows written:
/// 0 when a concurrent writer inserted it first.
pub(crate) async fn insert_first_in(tx: &mut Tx, first: &Feedback) -> Result<u64, StoreError> {
    let sql = "INSERT INTO message_feedback (message_id, session_id, value, note, revision, updated_at) \
               VALUES ($1, $2, $3, $4, 1, $5) ON CONFLICT (message_id) DO NOTHING";
    crate::db::execute_in(
        tx,
        sql,
        &[
            (&first.message_id).into(),
            (&first.session_id).into(),
            first.value.as_str().into(),
            (&first.note).into(),
            first.updated_at.into(),
        ],
    )
    .await
}

/// Replaces the feedback at `expected_revision` with `next`'s value and note, bumping the
/// revision; returns the rows written: 0 when the revision moved on.
pub(crate) async fn update_in(
    tx: &mut Tx,
    next: &Feedback,
    expected_revision: i64,
) -> Result<u64, StoreError> {
    let sql = "UPDATE message_feedback SET value = $2, note = $3, revision = revision + 1, updated_at = $4 \
               WHERE message_id = $1 AND revision = $5";
    crate::db::execute_in(
        tx,
        sql,
        &[
            (&next.message_id).into(),
            next.value.as_str().into(),
            (&next.note).into(),
            next.updated_at.into(),
            expected_revision.into(),
        ],
    )
    .await
}
