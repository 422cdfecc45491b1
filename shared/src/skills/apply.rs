//! At-most-once Skill file effects: a retried or interrupted apply never writes a Skill file twice
//! and never writes over bytes it did not expect.
//!
//! Apply and undo run in three steps:
//!
//! 1. [`SkillService::prepare`] checks the source digest and the destination, then persists an
//!    operation id with the exact before/after snapshots and moves the candidate to `applying`
//!    (or `undoing`) by compare-and-set, so of two concurrent attempts exactly one proceeds.
//!    Drift marks the candidate `stale` instead and nothing is written.
//! 2. [`SkillService::perform`] makes the effect under the shared OS path lock: an atomic replace
//!    that only writes over the exact `before` bytes (or removal of exactly `after` for an undo
//!    back to absent).
//! 3. [`SkillService::finish`] records the outcome.
//!
//! After process loss between 1 and 3, [`SkillService::reconcile_skills`] reads the filesystem
//! under the same lock (skipping a busy writer): exact `after` = applied, exact `before` = not
//! applied, anything else = `uncertain`. It never replays the effect.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::candidate::{
    Candidate, SkillCandidateState, SkillFile, candidate_in, check_managed_dirs, read_skill,
    worktree_in,
};
use super::{SkillError, SkillService, is_managed_path};
use crate::db::Tx;
use crate::managed_file::{self, ManagedFileError, Publish};

/// A persisted operation, ready for its effect.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub id: String,
    pub candidate_id: String,
    /// `apply` or `undo`.
    pub kind: String,
    pub path: String,
    pub worktree: String,
    /// Exact bytes before the effect; `None` = absent.
    pub before: Option<String>,
    /// Exact bytes after the effect; `None` = absent.
    pub after: Option<String>,
}

/// What one effect did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Applied,
    /// The file no longer held the `before` bytes at the lock: nothing was written.
    Drifted,
}

#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillReconcileReport {
    pub applied: Vec<String>,
    pub not_applied: Vec<String>,
    pub uncertain: Vec<String>,
    /// Candidates whose path lock was held by a live writer: left for a later pass.
    pub busy: Vec<String>,
}

/// An interrupted operation: id, candidate, kind, path, before, after, project.
type InterruptedRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);

fn digest(content: Option<&str>) -> Option<String> {
    content.map(|c| managed_file::digest(c.as_bytes()))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ManagedFileError> + Send + 'static,
) -> Result<T, SkillError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SkillError::Conflict(format!("file task failed: {e}")))?
        .map_err(SkillError::from)
}

/// Creates `.agents`, `.agents/skills` and the Skill's directory one level at a time, refusing
/// links, so the final directory is a real directory under the worktree.
fn create_dirs(worktree: &Path, path: &Path) -> Result<(), ManagedFileError> {
    check_managed_dirs(worktree, path)?;
    let relative = path
        .strip_prefix(worktree)
        .map_err(|_| ManagedFileError::NotRegular {
            path: path.to_path_buf(),
        })?;
    let mut current = worktree.to_path_buf();
    let components: Vec<_> = relative.components().collect();
    for component in &components[..components.len().saturating_sub(1)] {
        current.push(component);
        match managed_file::create_dir_in_worktree(&current) {
            Ok(()) => {}
            Err(error) => {
                return Err(ManagedFileError::Io {
                    path: current,
                    reason: error.to_string(),
                });
            }
        }
    }
    check_managed_dirs(worktree, path)
}

/// The effect itself (blocking): under the path lock, write `after` over exactly `before`.
fn effect(
    worktree: &Path,
    path: &Path,
    before: Option<&str>,
    after: Option<&str>,
) -> Result<Effect, ManagedFileError> {
    match after {
        Some(content) => {
            create_dirs(worktree, path)?;
            match managed_file::publish(path, content, digest(before).as_deref())? {
                Publish::Written { .. } | Publish::Unchanged { .. } => Ok(Effect::Applied),
                Publish::ExternalEdit { .. } => Ok(Effect::Drifted),
            }
        }
        None => managed_file::with_lock(path, || {
            check_managed_dirs(worktree, path)?;
            let current = managed_file::read(path)?;
            match current {
                None => Ok(Effect::Applied),
                Some(file) if Some(file.digest.as_str()) == digest(before).as_deref() => {
                    std::fs::remove_file(path).map_err(|e| ManagedFileError::Io {
                        path: path.to_path_buf(),
                        reason: e.to_string(),
                    })?;
                    Ok(Effect::Applied)
                }
                Some(_) => Ok(Effect::Drifted),
            }
        }),
    }
}

/// The state change an apply or undo makes, and the file contents it expects and writes.
struct Transition {
    from: SkillCandidateState,
    to: SkillCandidateState,
    /// For an undo: the exact bytes the file must still hold (`None` inside = absent).
    before_expected: Option<Option<String>>,
    /// Exact bytes after the effect; `None` = absent.
    after: Option<String>,
}

/// Checks `kind` is allowed in the candidate's state and works out what the effect writes.
async fn transition_in(
    tx: &mut Tx,
    candidate: &Candidate,
    kind: &str,
) -> Result<Transition, SkillError> {
    let id = &candidate.id;
    match kind {
        "apply" if candidate.operation == "apply" => {
            if candidate.state != SkillCandidateState::Approved {
                return Err(SkillError::Conflict(format!(
                    "skill candidate `{id}` is `{}`; apply needs a review that passed evaluation (`approved`)",
                    candidate.state
                )));
            }
            Ok(Transition {
                from: SkillCandidateState::Approved,
                to: SkillCandidateState::Applying,
                before_expected: None,
                after: candidate.content.clone(),
            })
        }
        "apply" => {
            if candidate.state != SkillCandidateState::Pending {
                return Err(SkillError::Conflict(format!(
                    "revocation `{id}` is `{}`, not pending",
                    candidate.state
                )));
            }
            Ok(Transition {
                from: SkillCandidateState::Pending,
                to: SkillCandidateState::Applying,
                before_expected: None,
                after: revoked_before_in(tx, candidate).await?,
            })
        }
        "undo" => {
            if candidate.state != SkillCandidateState::Applied {
                return Err(SkillError::Conflict(format!(
                    "skill candidate `{id}` is `{}`; only applied candidates can be undone",
                    candidate.state
                )));
            }
            let (applied, restored) = undo_contents_in(tx, candidate).await?;
            Ok(Transition {
                from: SkillCandidateState::Applied,
                to: SkillCandidateState::Undoing,
                before_expected: Some(applied),
                after: restored,
            })
        }
        other => Err(SkillError::Invalid {
            field: "operation",
            reason: format!("`{other}` is not apply or undo"),
        }),
    }
}

/// What a revocation restores: the file the revoked Skill replaced (usually: absent).
async fn revoked_before_in(
    tx: &mut Tx,
    candidate: &Candidate,
) -> Result<Option<String>, SkillError> {
    let revoked = match &candidate.revokes_id {
        Some(r) => candidate_in(tx, r).await?,
        None => None,
    };
    Ok(match revoked.and_then(|r| r.operation_id) {
        Some(op) => crate::on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT before_content FROM skill_operation WHERE id = $1 AND kind = 'apply'"
        )
        .bind(op)
        .fetch_optional(conn)
        .await)?
        .flatten(),
        None => None,
    })
}

/// For an undo: the applied file and what the undo restores.
async fn undo_contents_in(
    tx: &mut Tx,
    candidate: &Candidate,
) -> Result<(Option<String>, Option<String>), SkillError> {
    let last: Option<(String, Option<String>, Option<String>)> = crate::on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT kind, before_content, after_content FROM skill_operation WHERE id = $1",
        )
        .bind(&candidate.operation_id)
        .fetch_optional(conn)
        .await
    })?;
    let (last_kind, before, after) =
        last.ok_or_else(|| SkillError::Conflict(String::from("the applied operation is missing")))?;
    // After an undo that did not happen, the last operation is that undo: its `before` is the
    // applied file and its `after` what undo restores.
    Ok(if last_kind == "apply" {
        (after, before)
    } else {
        (before, after)
    })
}

/// Why an apply (or a revocation) no longer fits the files on disk, if it does not: the
/// candidate is then `stale` and nothing is written.
fn apply_drift(
    candidate: &Candidate,
    current: Option<&SkillFile>,
    source_now: Option<&SkillFile>,
) -> Option<String> {
    let current_digest = current.map(|f| &f.digest);
    let drift = match candidate.operation.as_str() {
        "revoke" => (current_digest != candidate.source_digest.as_ref())
            .then_some("the applied Skill file changed since the revocation was proposed"),
        "apply" if !candidate.companion => (current_digest != candidate.source_digest.as_ref())
            .then_some("the Skill file changed since the candidate was proposed (source drift)"),
        "apply" if source_now.map(|f| &f.digest) != candidate.source_digest.as_ref() => {
            Some("the read-only source Skill changed since the candidate was proposed")
        }
        "apply" if current.is_some_and(|f| f.read_only) => {
            Some("a read-only companion already exists at the destination")
        }
        "apply" if current.is_some() => {
            Some("the companion destination already exists and was not written by this candidate")
        }
        _ => None,
    };
    drift.map(String::from)
}

/// Moves the candidate on by compare-and-set (of concurrent attempts exactly one succeeds) and
/// persists the operation with its exact snapshots.
async fn record_operation_in(
    tx: &mut Tx,
    operation: &Operation,
    from: SkillCandidateState,
    to: SkillCandidateState,
    now: i64,
) -> Result<(), SkillError> {
    let (id, kind) = (&operation.candidate_id, &operation.kind);
    let moved = crate::on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE skill_candidate SET state = $3, operation_id = $4, updated_at = $5 WHERE id = $1 AND state = $2")
        .bind(id).bind(from.as_str()).bind(to.as_str()).bind(&operation.id).bind(now)
        .execute(conn).await.map(|d| d.rows_affected())
    })?;
    if moved != 1 {
        return Err(SkillError::Conflict(format!(
            "skill candidate `{id}` changed state concurrently; another {kind} is in progress or done"
        )));
    }
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO skill_operation (id, candidate_id, kind, path, before_content, before_digest, after_content, after_digest, \
               state, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'prepared', $9)")
        .bind(&operation.id).bind(id).bind(kind).bind(&operation.path)
        .bind(&operation.before).bind(digest(operation.before.as_deref()))
        .bind(&operation.after).bind(digest(operation.after.as_deref())).bind(now)
        .execute(conn).await.map(|d| d.rows_affected())
    })?;
    Ok(())
}

impl SkillService {
    /// Marks the candidate `stale` by compare-and-set on the state it was checked in: when a
    /// concurrent apply moved it on first (and its write is what this check saw as drift), the
    /// winner's state is kept and this attempt is a conflict, not a staleness verdict.
    async fn mark_stale_in(
        &self,
        tx: &mut Tx,
        id: &str,
        from_state: SkillCandidateState,
        detail: &str,
    ) -> Result<(), SkillError> {
        let moved = crate::on_tx!(tx, |conn| {
            sqlx::query(
                "UPDATE skill_candidate SET state = 'stale', detail = $2, updated_at = $3 WHERE id = $1 AND state = $4")
            .bind(id).bind(detail).bind(self.now()).bind(from_state.as_str()).execute(conn)
            .await.map(|d| d.rows_affected())
        })?;
        if moved != 1 {
            return Err(SkillError::Conflict(format!(
                "skill candidate `{id}` changed state concurrently; another apply is in progress or done"
            )));
        }
        Ok(())
    }

    /// `skill-apply` (an approved candidate, or a pending revocation) and `skill-undo` (an
    /// applied candidate), end to end. Returns the candidate after the effect.
    pub async fn apply(&self, id: &str) -> Result<Candidate, SkillError> {
        let operation = self.prepare(id, "apply").await?;
        let effect = self.perform(&operation).await?;
        self.finish(&operation, effect).await
    }

    pub async fn undo(&self, id: &str) -> Result<Candidate, SkillError> {
        let operation = self.prepare(id, "undo").await?;
        let effect = self.perform(&operation).await?;
        self.finish(&operation, effect).await
    }

    /// Step 1: checks, then persists the operation and its exact snapshots (see the module docs).
    pub async fn prepare(&self, id: &str, kind: &str) -> Result<Operation, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = candidate_in(&mut tx, id)
            .await?
            .ok_or_else(|| SkillError::NotFound(format!("skill candidate `{id}` was not found")))?;
        let worktree = worktree_in(&mut tx, &candidate.project_id)
            .await?
            .ok_or_else(|| SkillError::Conflict(String::from("the project has no worktree")))?;
        let target = PathBuf::from(&candidate.target_path);
        let source = PathBuf::from(&candidate.source_path);
        if !is_managed_path(&worktree, &target) || !is_managed_path(&worktree, &source) {
            return Err(SkillError::Invalid {
                field: "targetPath",
                reason: String::from(
                    "a Skill target must be <worktree>/.agents/skills/<name>/SKILL.md",
                ),
            });
        }
        let transition = transition_in(&mut tx, &candidate, kind).await?;
        // The authoritative filesystem, read now (links refused).
        let (current, source_now) = {
            let (w, t, s) = (worktree.clone(), target.clone(), source.clone());
            blocking(move || Ok((read_skill(&w, &t)?, read_skill(&w, &s)?))).await?
        };
        if kind == "apply"
            && let Some(detail) = apply_drift(&candidate, current.as_ref(), source_now.as_ref())
        {
            self.mark_stale_in(&mut tx, id, transition.from, &detail)
                .await?;
            tx.commit().await?;
            return Err(SkillError::Stale(detail));
        }
        let current_content = current.map(|f| f.content);
        if let Some(expected) = transition.before_expected
            && current_content != expected
        {
            return Err(SkillError::Conflict(String::from(
                "the Skill file changed after it was applied; undoing it would discard those changes",
            )));
        }
        let operation = Operation {
            id: crate::ids::new_id("skop"),
            candidate_id: id.to_owned(),
            kind: kind.to_owned(),
            path: candidate.target_path.clone(),
            worktree: worktree.display().to_string(),
            before: current_content,
            after: transition.after,
        };
        record_operation_in(&mut tx, &operation, transition.from, transition.to, now).await?;
        tx.commit().await?;
        Ok(operation)
    }

    /// Step 2: the file effect under the shared OS path lock.
    pub async fn perform(&self, operation: &Operation) -> Result<Effect, SkillError> {
        let (worktree, path) = (
            PathBuf::from(&operation.worktree),
            PathBuf::from(&operation.path),
        );
        let (before, after) = (operation.before.clone(), operation.after.clone());
        blocking(move || effect(&worktree, &path, before.as_deref(), after.as_deref())).await
    }

    /// Step 3: records the outcome. A drifted effect wrote nothing: the candidate is `stale`.
    pub async fn finish(
        &self,
        operation: &Operation,
        effect: Effect,
    ) -> Result<Candidate, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let (op_state, candidate_state, detail) = match (effect, operation.kind.as_str()) {
            (Effect::Applied, "apply") => ("applied", SkillCandidateState::Applied, None),
            (Effect::Applied, _) => ("applied", SkillCandidateState::Undone, None),
            (Effect::Drifted, _) => (
                "not_applied",
                SkillCandidateState::Stale,
                Some("the file changed between the check and the write; nothing was written"),
            ),
        };
        self.settle_operation_in(&mut tx, operation, op_state, candidate_state, detail, now)
            .await?;
        let candidate = candidate_in(&mut tx, &operation.candidate_id)
            .await?
            .expect("exists");
        tx.commit().await?;
        if effect == Effect::Drifted {
            return Err(SkillError::Stale(String::from(
                "the Skill file changed between the check and the write; the candidate is stale",
            )));
        }
        Ok(candidate)
    }

    async fn settle_operation_in(
        &self,
        tx: &mut Tx,
        operation: &Operation,
        op_state: &str,
        candidate_state: SkillCandidateState,
        detail: Option<&str>,
        now: i64,
    ) -> Result<(), SkillError> {
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "UPDATE skill_operation SET state = $2, detail = $3, settled_at = $4 WHERE id = $1 AND state = 'prepared'")
            .bind(&operation.id).bind(op_state).bind(detail).bind(now).execute(conn)
            .await.map(|d| d.rows_affected())
        })?;
        crate::on_tx!(tx, |conn| sqlx::query(
            "UPDATE skill_candidate SET state = $3, detail = $4, updated_at = $5 \
                 WHERE id = $1 AND operation_id = $2 AND state IN ('applying', 'undoing')"
        )
        .bind(&operation.candidate_id)
        .bind(&operation.id)
        .bind(candidate_state.as_str())
        .bind(detail)
        .bind(now)
        .execute(conn)
        .await
        .map(|d| d.rows_affected()))?;
        // A completed revocation ends the revoked candidate too.
        if candidate_state == SkillCandidateState::Applied {
            crate::on_tx!(tx, |conn| {
                sqlx::query(
                    "UPDATE skill_candidate SET state = 'undone', detail = 'revoked', updated_at = $2 \
                     WHERE id = (SELECT revokes_id FROM skill_candidate WHERE id = $1) AND state = 'applied'")
                .bind(&operation.candidate_id).bind(now).execute(conn)
                .await.map(|d| d.rows_affected())
            })?;
        }
        // An undone revocation restored the Skill: the revoked candidate is applied again (its
        // own apply operation still describes the file, so it can be undone later).
        if candidate_state == SkillCandidateState::Undone {
            crate::on_tx!(tx, |conn| {
                sqlx::query(
                    "UPDATE skill_candidate SET state = 'applied', detail = 'its revocation was undone', updated_at = $2 \
                     WHERE id = (SELECT revokes_id FROM skill_candidate WHERE id = $1 AND operation = 'revoke') AND state = 'undone'")
                .bind(&operation.candidate_id).bind(now).execute(conn)
                .await.map(|d| d.rows_affected())
            })?;
        }
        Ok(())
    }

    /// Classifies interrupted operations from the filesystem (see the module docs): never
    /// replays an effect, skips a path whose lock a live writer holds.
    pub async fn reconcile_skills(&self) -> Result<SkillReconcileReport, SkillError> {
        let mut report = SkillReconcileReport::default();
        let rows: Vec<InterruptedRow> = crate::on_db!(self.db, |pool| {
            sqlx::query_as(
                "SELECT o.id, o.candidate_id, o.kind, o.path, o.before_content, o.after_content, c.project_id \
                 FROM skill_operation o JOIN skill_candidate c ON c.operation_id = o.id \
                 WHERE o.state = 'prepared' AND c.state IN ('applying', 'undoing')")
            .fetch_all(pool).await
        })?;
        for (op_id, candidate_id, kind, path, before, after, project_id) in rows {
            let observed = match self.observe_skill_file(&project_id, &path).await? {
                Observed::NoWorktree => continue,
                Observed::Busy => {
                    report.busy.push(candidate_id);
                    continue;
                }
                Observed::Content(content) => content,
            };
            let operation = Operation {
                id: op_id,
                candidate_id: candidate_id.clone(),
                kind,
                path,
                worktree: String::new(),
                before,
                after,
            };
            let mut tx = self.db.begin().await?;
            let verdict = self
                .settle_interrupted_in(&mut tx, &operation, observed.as_deref())
                .await?;
            tx.commit().await?;
            match verdict {
                Reconciled::Applied => report.applied.push(candidate_id),
                Reconciled::NotApplied => report.not_applied.push(candidate_id),
                Reconciled::Uncertain => report.uncertain.push(candidate_id),
            }
        }
        Ok(report)
    }

    /// The interrupted operation's file as it is now, read under its path lock.
    async fn observe_skill_file(
        &self,
        project_id: &str,
        path: &str,
    ) -> Result<Observed, SkillError> {
        let mut read = self.db.begin_read().await?;
        let worktree = worktree_in(&mut read, project_id).await?;
        read.rollback().await?;
        let Some(worktree) = worktree else {
            return Ok(Observed::NoWorktree);
        };
        let target = PathBuf::from(path);
        let observed = blocking(move || {
            match managed_file::try_with_lock(&target, || read_skill(&worktree, &target)) {
                Ok(file) => Ok(Some(file.map(|f| f.content))),
                Err(ManagedFileError::Busy { .. }) => Ok(None),
                Err(error) => Err(error),
            }
        })
        .await;
        match observed {
            Ok(Some(content)) => Ok(Observed::Content(content)),
            Ok(None) => Ok(Observed::Busy),
            // An unreadable or redirected path is neither snapshot.
            Err(SkillError::File(_)) => {
                Ok(Observed::Content(Some(String::from("\u{0}unreadable"))))
            }
            Err(other) => Err(other),
        }
    }

    /// Settles an interrupted operation by what its file holds: the after snapshot means the
    /// effect happened, the before snapshot that it did not, anything else is uncertain (and
    /// is never replayed).
    async fn settle_interrupted_in(
        &self,
        tx: &mut Tx,
        operation: &Operation,
        observed: Option<&str>,
    ) -> Result<Reconciled, SkillError> {
        let now = self.now();
        if observed == operation.after.as_deref() {
            let state = if operation.kind == "apply" {
                SkillCandidateState::Applied
            } else {
                SkillCandidateState::Undone
            };
            self.settle_operation_in(
                tx,
                operation,
                "applied",
                state,
                Some("reconciled: the file holds the exact after snapshot"),
                now,
            )
            .await?;
            return Ok(Reconciled::Applied);
        }
        if observed == operation.before.as_deref() {
            let state = if operation.kind == "apply" {
                let operation_kind: String = crate::on_tx!(tx, |conn| sqlx::query_scalar(
                    "SELECT operation FROM skill_candidate WHERE id = $1"
                )
                .bind(&operation.candidate_id)
                .fetch_one(conn)
                .await)?;
                if operation_kind == "revoke" {
                    SkillCandidateState::Pending
                } else {
                    SkillCandidateState::Approved
                }
            } else {
                SkillCandidateState::Applied
            };
            self.settle_operation_in(tx, operation, "not_applied", state,
                Some("reconciled: the file holds the exact before snapshot; the effect did not happen"), now).await?;
            return Ok(Reconciled::NotApplied);
        }
        self.settle_operation_in(tx, operation, "uncertain", SkillCandidateState::Uncertain,
            Some("reconciled: the file matches neither snapshot; inspect it before deciding (never replayed)"), now).await?;
        Ok(Reconciled::Uncertain)
    }
}

/// An interrupted operation's file, as reconciliation finds it.
enum Observed {
    /// The project has no worktree any more: nothing to look at.
    NoWorktree,
    /// A live writer holds the path lock: left for a later pass.
    Busy,
    /// The file's content (`None`: absent).
    Content(Option<String>),
}

/// What reconciliation decided about an interrupted operation.
enum Reconciled {
    Applied,
    NotApplied,
    Uncertain,
}
