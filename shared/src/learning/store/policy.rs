//! Session learning policy's SQL: the `session_memory_policy` row of a session.

use super::{keyed, write_in};
use crate::db::{Db, StoreError, Tx};
use crate::learning::policy::{Generation, SessionPolicy};

#[derive(sqlx::FromRow)]
struct PolicyRow {
    session_id: String,
    use_memories: bool,
    generation: String,
    revision: i64,
    reason: Option<String>,
    updated_at: i64,
}

impl TryFrom<PolicyRow> for SessionPolicy {
    type Error = StoreError;
    fn try_from(row: PolicyRow) -> Result<Self, StoreError> {
        Ok(SessionPolicy {
            generation: Generation::parse(&row.generation).ok_or_else(|| {
                StoreError::Corrupt(format!("policy generation `{}`", row.generation))
            })?,
            session_id: row.session_id,
            use_memories: row.use_memories,
            revision: row.revision,
            reason: row.reason,
            updated_at: row.updated_at,
        })
    }
}

const LOAD: &str = "SELECT session_id, use_memories, generation, revision, reason, updated_at \
                    FROM session_memory_policy WHERE session_id = $1";

/// The durable policy of `session_id`, if it has one.
pub(crate) async fn load_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Option<SessionPolicy>, StoreError> {
    let row: Option<PolicyRow> = keyed!(on_tx, tx, query_as(LOAD), session_id, fetch_optional)?;
    row.map(SessionPolicy::try_from).transpose()
}

/// [`load_in`] as one statement outside any transaction.
pub(crate) async fn load(db: &Db, session_id: &str) -> Result<Option<SessionPolicy>, StoreError> {
    let row: Option<PolicyRow> = keyed!(on_db, db, query_as(LOAD), session_id, fetch_optional)?;
    row.map(SessionPolicy::try_from).transpose()
}

/// A session's project and its durable policy, when it has one.
pub(crate) struct SessionWithPolicy {
    pub(crate) project_id: Option<String>,
    pub(crate) policy: Option<SessionPolicy>,
}

/// `session_id`'s project and durable policy in one statement; `None` when there is no such
/// session.
pub(crate) async fn session_with_policy_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Option<SessionWithPolicy>, StoreError> {
    type Row = (
        Option<String>,
        Option<bool>,
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<i64>,
    );
    let sql = "SELECT s.project_id, p.use_memories, p.generation, p.revision, p.reason, p.updated_at \
         FROM session s LEFT JOIN session_memory_policy p ON p.session_id = s.id WHERE s.id = $1";
    let row: Option<Row> = keyed!(on_tx, tx, query_as(sql), session_id, fetch_optional)?;
    let Some((project_id, use_memories, generation, revision, reason, updated_at)) = row else {
        return Ok(None);
    };
    let policy = match (use_memories, generation, revision, updated_at) {
        (Some(use_memories), Some(generation), Some(revision), Some(updated_at)) => {
            Some(SessionPolicy::try_from(PolicyRow {
                session_id: session_id.to_owned(),
                use_memories,
                generation,
                revision,
                reason,
                updated_at,
            })?)
        }
        _ => None,
    };
    Ok(Some(SessionWithPolicy { project_id, policy }))
}

/// Writes `policy` as its session's policy, whatever was there.
pub(crate) async fn upsert_in(tx: &mut Tx, policy: &SessionPolicy) -> Result<(), StoreError> {
    let sql = "INSERT INTO session_memory_policy (session_id, use_memories, generation, revision, reason, updated_at) \
               VALUES ($1, $2, $3, $4, $5, $6) \
               ON CONFLICT (session_id) DO UPDATE SET use_memories = excluded.use_memories, \
                 generation = excluded.generation, revision = excluded.revision, \
                 reason = excluded.reason, updated_at = excluded.updated_at";
    write_in(
        tx,
        sql,
        &[
            (&policy.session_id).into(),
            policy.use_memories.into(),
            policy.generation.as_str().into(),
            policy.revision.into(),
            (&policy.reason).into(),
            policy.updated_at.into(),
        ],
    )
    .await
}

/// Replaces the policy at `expected_revision` with `next` (its reason kept); returns the rows
/// written: 0 when the revision moved on.
pub(crate) async fn update_in(
    tx: &mut Tx,
    next: &SessionPolicy,
    expected_revision: i64,
) -> Result<u64, StoreError> {
    // The revision guard makes concurrent writers with the same expected revision serialize:
    // only one UPDATE matches.
    let sql = "UPDATE session_memory_policy SET use_memories = $2, generation = $3, revision = $4, updated_at = $5 \
               WHERE session_id = $1 AND revision = $6";
    crate::db::execute_in(
        tx,
        sql,
        &[
            (&next.session_id).into(),
            next.use_memories.into(),
            next.generation.as_str().into(),
            next.revision.into(),
            next.updated_at.into(),
            expected_revision.into(),
        ],
    )
    .await
}
