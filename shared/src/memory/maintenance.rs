//! Admission of maintenance work.

use crate::db::{StoreError, Tx};
use crate::ledger::{Admission, JobIdentity, JobOrigin, Ledger, LedgerError, NewJob};
use crate::paths::Paths;

/// The canonical memory path a project's maintenance jobs are bound to (their claim scope): the
/// projection path when the project has a worktree, else a stable project key.
pub async fn memory_scope_in(tx: &mut Tx, project_id: &str) -> Result<String, StoreError> {
    let worktree = super::store::project_worktree_in(tx, project_id).await?;
    Ok(
        match worktree
            .flatten()
            .filter(|w| std::path::Path::new(w).is_absolute())
        {
            Some(worktree) => Paths::project_rules(std::path::Path::new(&worktree))
                .display()
                .to_string(),
            None => format!("project:{project_id}"),
        },
    )
}

/// Admits a maintenance job for `project_id`, triggered by `trigger` (the newest input, e.g. an
/// experience id), in the caller's transaction.
pub async fn admit_in(
    ledger: &Ledger,
    tx: &mut Tx,
    project_id: &str,
    trigger: &str,
) -> Result<Admission, LedgerError> {
    let scope = memory_scope_in(tx, project_id).await?;
    let job = NewJob::new(
        JobIdentity::maintain(project_id, &scope, trigger),
        JobOrigin::Explicit,
    )
    .with_claim_scope(scope)
    .with_trace_parent(crate::telemetry::current_traceparent());
    ledger.admit_in(tx, job).await
}
