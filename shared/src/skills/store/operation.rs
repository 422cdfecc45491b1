//! Apply and undo operations: their exact before/after snapshots and how they settled.

use crate::db::{Db, StoreError, Tx};
use crate::managed_file;
use crate::skills::apply::{Operation, OperationKind, OperationState};

fn digest(content: Option<&str>) -> Option<String> {
    content.map(|c| managed_file::digest(c.as_bytes()))
}

/// Persists a `prepared` operation with its exact snapshots.
pub async fn insert_in(tx: &mut Tx, operation: &Operation, now: i64) -> Result<(), StoreError> {
    let before_digest = digest(operation.before.as_deref());
    let after_digest = digest(operation.after.as_deref());
    crate::db::execute_in(
        tx,
        "INSERT INTO skill_operation (id, candidate_id, kind, path, before_content, \
           before_digest, after_content, after_digest, state, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &[
            (&operation.id).into(),
            (&operation.candidate_id).into(),
            operation.kind.as_str().into(),
            (&operation.path).into(),
            (&operation.before).into(),
            (&before_digest).into(),
            (&operation.after).into(),
            (&after_digest).into(),
            OperationState::Prepared.as_str().into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// An operation's kind and exact snapshots, by id.
pub async fn snapshots_in(
    tx: &mut Tx,
    id: &str,
) -> Result<Option<(OperationKind, Option<String>, Option<String>)>, StoreError> {
    let row: Option<(String, Option<String>, Option<String>)> =
        crate::on_tx!(tx, |conn| sqlx::query_as(
            "SELECT kind, before_content, after_content FROM skill_operation WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(conn)
        .await)?;
    row.map(|(kind, before, after)| {
        let kind = OperationKind::try_from(kind).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok((kind, before, after))
    })
    .transpose()
}

/// Settles a `prepared` operation.
pub async fn settle_in(
    tx: &mut Tx,
    id: &str,
    state: OperationState,
    detail: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE skill_operation SET state = $2, detail = $3, settled_at = $4 \
         WHERE id = $1 AND state = 'prepared'",
        &[id.into(), state.as_str().into(), detail.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// A prepared operation whose candidate is still `applying` or `undoing`, and the candidate's
/// project.
#[derive(Debug, Clone)]
pub struct Interrupted {
    pub operation: Operation,
    pub project_id: String,
}

/// id, candidate, kind, path, before, after, project.
type InterruptedRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);

/// Operations interrupted between their preparation and their settlement.
pub async fn interrupted(db: &Db) -> Result<Vec<Interrupted>, StoreError> {
    let rows: Vec<InterruptedRow> = crate::on_db!(db, |pool| sqlx::query_as(
        "SELECT o.id, o.candidate_id, o.kind, o.path, o.before_content, o.after_content, \
           c.project_id \
         FROM skill_operation o JOIN skill_candidate c ON c.operation_id = o.id \
         WHERE o.state = 'prepared' AND c.state IN ('applying', 'undoing')"
    )
    .fetch_all(pool)
    .await)?;
    rows.into_iter()
        .map(
            |(id, candidate_id, kind, path, before, after, project_id)| {
                let kind = OperationKind::try_from(kind)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(Interrupted {
                    operation: Operation {
                        id,
                        candidate_id,
                        kind,
                        path,
                        worktree: String::new(),
                        before,
                        after,
                    },
                    project_id,
                })
            },
        )
        .collect()
}
