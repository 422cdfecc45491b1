//! The retrieval store: live recall candidates with the columns ranking reads, prompt
//! receipts, use counts and the feedback columns. Text search itself (full-text indexes and the
//! recall index) is the recall store's (`learning::recall::store`).

use crate::db::{Db, StoreError, Tx};
use crate::learning::experience::store::live_experience;
use crate::learning::experience::{EXPERIENCE_COLUMNS, ExperienceRow};
use crate::learning::recall::store::placeholders;

/// A live candidate: the stored experience plus the feedback columns ranking reads and what its
/// source label needs from its citations, in one row. The citation columns are kept on the
/// record by triggers on `experience_evidence` (migrations 0019 and 0020), so a candidate is one
/// row and `context` reads no evidence to label what it shows.
#[derive(sqlx::FromRow)]
pub(crate) struct CandidateRow {
    #[sqlx(flatten)]
    pub(crate) record: ExperienceRow,
    pub(crate) feedback_score: f64,
    pub(crate) violations: i64,
    /// The first citation (by ordinal) that names a message.
    pub(crate) source_message: Option<String>,
    /// The first citation's address.
    pub(crate) source_address: Option<String>,
}

/// The columns of a [`CandidateRow`] from `experience_record`.
fn candidate_columns() -> String {
    format!("{EXPERIENCE_COLUMNS}, feedback_score, violations, source_message, source_address")
}

/// What a candidate must be to be recalled: active, with its source unchanged.
const LIVE: &str = live_experience!();

/// The live records among experience ids `ids`, in no particular order. Rows are looked up by
/// id and the caller checks the project: with `project_id = $1` in the query, SQLite's planner
/// chose the project index and read every record of the project.
pub(crate) async fn live_candidates_by_id<'a>(
    db: &Db,
    ids: impl ExactSizeIterator<Item = &'a str>,
) -> Result<Vec<CandidateRow>, StoreError> {
    let sql = format!(
        "SELECT {} FROM experience_record WHERE id IN ({}) AND {LIVE}",
        candidate_columns(),
        placeholders(1, ids.len())
    );
    Ok(crate::on_db!(db, |pool| {
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()));
        for id in ids {
            query = query.bind(id);
        }
        query.fetch_all(pool).await
    })?)
}

/// A candidate read by its recall-index document number.
#[derive(sqlx::FromRow)]
pub(crate) struct NumberedCandidate {
    #[sqlx(flatten)]
    pub(crate) candidate: CandidateRow,
    pub(crate) recall_num: i64,
}

/// The live records of recall-index document numbers `nums`, with their numbers.
pub(crate) async fn live_candidates_by_number(
    db: &Db,
    nums: impl ExactSizeIterator<Item = i64>,
) -> Result<Vec<NumberedCandidate>, StoreError> {
    // The derived table names no column of `experience_record`, so the record's columns stay
    // unqualified; each candidate costs one document and one record lookup.
    let sql = format!(
        "SELECT {}, d.recall_num AS recall_num \
         FROM (SELECT num AS recall_num, experience_id AS doc_experience FROM recall_doc \
               WHERE num IN ({})) d \
         JOIN experience_record ON experience_record.id = d.doc_experience \
         WHERE {LIVE}",
        candidate_columns(),
        placeholders(1, nums.len())
    );
    Ok(crate::on_db!(db, |pool| {
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()));
        for num in nums {
            query = query.bind(num);
        }
        query.fetch_all(pool).await
    })?)
}

/// The project of a session, `None` for an unknown session.
pub(crate) async fn session_project(
    db: &Db,
    session_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(crate::on_db!(db, |pool| sqlx::query_scalar(
        "SELECT project_id FROM session WHERE id = $1"
    )
    .bind(session_id)
    .fetch_optional(pool)
    .await)?)
}

/// A prompt receipt as stored: its JSON columns already serialised.
#[derive(sqlx::FromRow)]
pub(crate) struct ReceiptRow {
    pub(crate) id: String,
    pub(crate) session_id: Option<String>,
    pub(crate) project_id: String,
    pub(crate) sections: String,
    pub(crate) memory_revisions: String,
    pub(crate) experience_ids: String,
    pub(crate) retrieval: String,
    pub(crate) created_at: i64,
}

pub(crate) async fn insert_receipt_in(tx: &mut Tx, receipt: &ReceiptRow) -> Result<(), StoreError> {
    let sql = "INSERT INTO prompt_receipt (id, session_id, project_id, sections, \
                 memory_revisions, experience_ids, retrieval, created_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
    crate::db::execute_in(
        tx,
        sql,
        &[
            (&receipt.id).into(),
            (&receipt.session_id).into(),
            (&receipt.project_id).into(),
            (&receipt.sections).into(),
            (&receipt.memory_revisions).into(),
            (&receipt.experience_ids).into(),
            (&receipt.retrieval).into(),
            receipt.created_at.into(),
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn receipt(db: &Db, id: &str) -> Result<Option<ReceiptRow>, StoreError> {
    let sql = "SELECT id, session_id, project_id, sections, memory_revisions, experience_ids, \
                 retrieval, created_at FROM prompt_receipt WHERE id = $1";
    Ok(crate::on_db!(db, |pool| sqlx::query_as(sql)
        .bind(id)
        .fetch_optional(pool)
        .await)?)
}

/// The experience ids (a JSON list) of the session's latest receipt.
pub(crate) async fn latest_receipt_experiences_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT experience_ids FROM prompt_receipt WHERE session_id = $1 \
         ORDER BY created_at DESC, id DESC LIMIT 1"
    )
    .bind(session_id)
    .fetch_optional(conn)
    .await)?)
}

/// Counts one more use of each of `ids` at `now`, in one statement: on SQLite each statement is
/// a round trip to the connection's thread while the write lock is held.
pub(crate) async fn count_uses_in(tx: &mut Tx, ids: &[String], now: i64) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "UPDATE experience_record SET use_count = use_count + 1, last_used_at = $1 \
         WHERE id IN ({})",
        placeholders(2, ids.len())
    );
    crate::on_tx!(tx, |conn| {
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.as_str())).bind(now);
        for id in ids {
            query = query.bind(id.as_str());
        }
        query.execute(conn).await.map(|done| done.rows_affected())
    })?;
    Ok(())
}

/// How many retrieval-skipped notices the session has had.
pub(crate) async fn skip_notices_in(tx: &mut Tx, session_id: &str) -> Result<i64, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT COUNT(*) FROM learning_event \
         WHERE session_id = $1 AND kind = 'learning.retrieval_skipped'"
    )
    .bind(session_id)
    .fetch_one(conn)
    .await)?)
}

/// One feedback step on an experience: its score moves by `delta` (clamped to [-1, 1]) and one
/// of its counters grows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Feedback {
    pub(crate) delta: f64,
    pub(crate) reinforcements: i64,
    pub(crate) violations: i64,
}

pub(crate) async fn add_feedback_in(
    tx: &mut Tx,
    experience_id: &str,
    feedback: Feedback,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE experience_record SET feedback_score = CASE \
             WHEN feedback_score + $2 > 1.0 THEN 1.0 \
             WHEN feedback_score + $2 < -1.0 THEN -1.0 ELSE feedback_score + $2 END, \
           reinforcements = reinforcements + $3, violations = violations + $4 WHERE id = $1",
        &[
            experience_id.into(),
            feedback.delta.into(),
            feedback.reinforcements.into(),
            feedback.violations.into(),
        ],
    )
    .await?;
    Ok(())
}
