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
    Candidate, CandidateOperation, SkillCandidateState, SkillFile, candidate_in,
    check_managed_dirs, read_skill, worktree_in,
};
use super::store::candidate::{self as candidate_store, Noted};
use super::store::operation as store;
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
    #[schema(value_type = String)]
    pub kind: OperationKind,
    pub path: String,
    pub worktree: String,
    /// Exact bytes before the effect; `None` = absent.
    pub before: Option<String>,
    /// Exact bytes after the effect; `None` = absent.
    pub after: Option<String>,
}

crate::states::stored_states! {
    /// What an operation does to a Skill file: apply a candidate, or undo an applied one.
    pub enum OperationKind in "skill_operation"."kind" {
        Apply = "apply",
        Undo = "undo",
    }
}

crate::states::stored_states! {
    /// Where an operation is: prepared (snapshots persisted, effect pending) or settled.
    pub enum OperationState in "skill_operation"."state" {
        Prepared = "prepared",
        Applied = "applied",
        NotApplied = "not_applied",
        Uncertain = "uncertain",
    }
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
    kind: OperationKind,
) -> Result<Transition, SkillError> {
    let id = &candidate.id;
    match (kind, candidate.operation) {
        (OperationKind::Apply, CandidateOperation::Apply) => {
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
        (OperationKind::Apply, CandidateOperation::Revoke) => {
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
        (OperationKind::Undo, _) => {
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
    let Some(operation_id) = revoked.and_then(|r| r.operation_id) else {
        return Ok(None);
    };
    Ok(match store::snapshots_in(tx, &operation_id).await? {
        Some((OperationKind::Apply, before, _)) => before,
        _ => None,
    })
}

/// For an undo: the applied file and what the undo restores.
async fn undo_contents_in(
    tx: &mut Tx,
    candidate: &Candidate,
) -> Result<(Option<String>, Option<String>), SkillError> {
    let last = match &candidate.operation_id {
        Some(operation_id) => store::snapshots_in(tx, operation_id).await?,
        None => None,
    };
    let (last_kind, before, after) =
        last.ok_or_else(|| SkillError::Conflict(String::from("the applied operation is missing")))?;
    // After an undo that did not happen, the last operation is that undo: its `before` is the
    // applied file and its `after` what undo restores.
    Ok(if last_kind == OperationKind::Apply {
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
    let source_digest = candidate.source_digest.as_ref();
    let drift = match candidate.operation {
        CandidateOperation::Revoke => (current_digest != source_digest)
            .then_some("the applied Skill file changed since the revocation was proposed"),
        CandidateOperation::Apply if !candidate.companion => (current_digest != source_digest)
            .then_some("the Skill file changed since the candidate was proposed (source drift)"),
        CandidateOperation::Apply if source_now.map(|f| &f.digest) != source_digest => {
            Some("the read-only source Skill changed since the candidate was proposed")
        }
        CandidateOperation::Apply if current.is_some_and(|f| f.read_only) => {
            Some("a read-only companion already exists at the destination")
        }
        CandidateOperation::Apply if current.is_some() => {
            Some("the companion destination already exists and was not written by this candidate")
        }
        CandidateOperation::Apply => None,
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
    let (id, kind) = (&operation.candidate_id, operation.kind);
    let noted = Noted {
        operation_id: Some(&operation.id),
        detail: None,
    };
    if !candidate_store::compare_and_set_in(tx, id, from, to, noted, now).await? {
        return Err(SkillError::Conflict(format!(
            "skill candidate `{id}` changed state concurrently; another {kind} is in progress or done"
        )));
    }
    store::insert_in(tx, operation, now).await?;
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
        let noted = Noted {
            operation_id: None,
            detail: Some(detail),
        };
        let stale = SkillCandidateState::Stale;
        let moved =
            candidate_store::compare_and_set_in(tx, id, from_state, stale, noted, self.now())
                .await?;
        if !moved {
            return Err(SkillError::Conflict(format!(
                "skill candidate `{id}` changed state concurrently; another apply is in progress or done"
            )));
        }
        Ok(())
    }

    /// `skill-apply` (an approved candidate, or a pending revocation) and `skill-undo` (an
    /// applied candidate), end to end. Returns the candidate after the effect.
    pub async fn apply(&self, id: &str) -> Result<Candidate, SkillError> {
        let operation = self.prepare(id, OperationKind::Apply).await?;
        let effect = self.perform(&operation).await?;
        self.finish(&operation, effect).await
    }

    pub async fn undo(&self, id: &str) -> Result<Candidate, SkillError> {
        let operation = self.prepare(id, OperationKind::Undo).await?;
        let effect = self.perform(&operation).await?;
        self.finish(&operation, effect).await
    }

    /// Step 1: checks, then persists the operation and its exact snapshots (see the module docs).
    pub async fn prepare(&self, id: &str, kind: OperationKind) -> Result<Operation, SkillError> {
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
        if kind == OperationKind::Apply
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
            kind,
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
        let (op_state, candidate_state, detail) = match (effect, operation.kind) {
            (Effect::Applied, OperationKind::Apply) => {
                (OperationState::Applied, SkillCandidateState::Applied, None)
            }
            (Effect::Applied, OperationKind::Undo) => {
                (OperationState::Applied, SkillCandidateState::Undone, None)
            }
            (Effect::Drifted, _) => (
                OperationState::NotApplied,
                SkillCandidateState::Stale,
                Some("the file changed between the check and the write; nothing was written"),
            ),
        };
        let settled = Settled {
            operation: op_state,
            candidate: candidate_state,
            detail,
        };
        self.settle_operation_in(&mut tx, operation, settled, now)
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
        settled: Settled<'_>,
        now: i64,
    ) -> Result<(), SkillError> {
        let Settled {
            operation: operation_state,
            candidate: candidate_state,
            detail,
        } = settled;
        store::settle_in(tx, &operation.id, operation_state, detail, now).await?;
        let candidate_id = &operation.candidate_id;
        candidate_store::settle_operation_in(
            tx,
            candidate_id,
            &operation.id,
            candidate_state,
            detail,
            now,
        )
        .await?;
        use SkillCandidateState::{Applied, Undone};
        // A completed revocation ends the revoked candidate too; an undone revocation restored
        // the Skill, so the revoked candidate is applied again (its own apply operation still
        // describes the file, so it can be undone later).
        let revoked_moves = match candidate_state {
            Applied => Some((Applied, Undone, "revoked")),
            Undone => Some((Undone, Applied, "its revocation was undone")),
            _ => None,
        };
        if let Some((from, to, detail)) = revoked_moves {
            candidate_store::move_revoked_in(tx, candidate_id, from, to, detail, now).await?;
        }
        Ok(())
    }

    /// Classifies interrupted operations from the filesystem (see the module docs): never
    /// replays an effect, skips a path whose lock a live writer holds.
    pub async fn reconcile_skills(&self) -> Result<SkillReconcileReport, SkillError> {
        let mut report = SkillReconcileReport::default();
        for interrupted in store::interrupted(&self.db).await? {
            let store::Interrupted {
                operation,
                project_id,
            } = interrupted;
            let candidate_id = operation.candidate_id.clone();
            let observed = match self
                .observe_skill_file(&project_id, &operation.path)
                .await?
            {
                Observed::NoWorktree => continue,
                Observed::Busy => {
                    report.busy.push(candidate_id);
                    continue;
                }
                Observed::Content(content) => content,
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
        let (reconciled, operation_state, candidate_state, detail) = if observed
            == operation.after.as_deref()
        {
            let state = match operation.kind {
                OperationKind::Apply => SkillCandidateState::Applied,
                OperationKind::Undo => SkillCandidateState::Undone,
            };
            let detail = "reconciled: the file holds the exact after snapshot";
            (Reconciled::Applied, OperationState::Applied, state, detail)
        } else if observed == operation.before.as_deref() {
            let state = match operation.kind {
                OperationKind::Apply => self.unapplied_state_in(tx, operation).await?,
                OperationKind::Undo => SkillCandidateState::Applied,
            };
            let detail =
                "reconciled: the file holds the exact before snapshot; the effect did not happen";
            (
                Reconciled::NotApplied,
                OperationState::NotApplied,
                state,
                detail,
            )
        } else {
            let detail = "reconciled: the file matches neither snapshot; inspect it before \
                          deciding (never replayed)";
            let uncertain = SkillCandidateState::Uncertain;
            (
                Reconciled::Uncertain,
                OperationState::Uncertain,
                uncertain,
                detail,
            )
        };
        let settled = Settled {
            operation: operation_state,
            candidate: candidate_state,
            detail: Some(detail),
        };
        self.settle_operation_in(tx, operation, settled, self.now())
            .await?;
        Ok(reconciled)
    }

    /// Where a candidate goes back to when its apply did not happen: a revocation is pending
    /// again, a Skill candidate approved.
    async fn unapplied_state_in(
        &self,
        tx: &mut Tx,
        operation: &Operation,
    ) -> Result<SkillCandidateState, SkillError> {
        let candidate = candidate_in(tx, &operation.candidate_id)
            .await?
            .ok_or_else(|| SkillError::NotFound(String::from("the candidate vanished")))?;
        Ok(match candidate.operation {
            CandidateOperation::Revoke => SkillCandidateState::Pending,
            CandidateOperation::Apply => SkillCandidateState::Approved,
        })
    }
}

/// How an operation settled: its own state, its candidate's, and why.
#[derive(Debug, Clone, Copy)]
struct Settled<'a> {
    operation: OperationState,
    candidate: SkillCandidateState,
    detail: Option<&'a str>,
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
