//! Reconciliation: finishes what a crash interrupted (stale candidates) and restores or reports
//! projections that drifted from the database.

use std::path::PathBuf;

use crate::managed_file::{self};
use crate::memory::store::{self, Candidate, MemoryCandidateState};

use super::{MemoryError, MemoryService, ReconcileReport, contents};

impl MemoryService {
    /// Start-up reconciliation: historical `applying`/`undoing` candidates are classified from
    /// their exact snapshots (after = applied, before = not applied, anything else = uncertain;
    /// never replayed), and missing projections are restored from their recorded revision.
    pub async fn reconcile(&self) -> Result<ReconcileReport, MemoryError> {
        let mut report = ReconcileReport::default();
        self.reconcile_candidates(&mut report).await?;
        self.reconcile_projections(&mut report).await?;
        Ok(report)
    }

    async fn reconcile_candidates(&self, report: &mut ReconcileReport) -> Result<(), MemoryError> {
        let now = self.now();
        for candidate in store::interrupted_candidates(&self.db).await? {
            let mut tx = self.db.begin().await?;
            let document = self
                .document_by_id_in(&mut tx, &candidate.document_id)
                .await?;
            let undoing = candidate.state == MemoryCandidateState::Undoing;
            let (state, outcome) = classify(&candidate, &contents(&document.entries));
            let detail = format!(
                "reconciled at start-up from `{}`: the document matched {}",
                candidate.state,
                if state == MemoryCandidateState::Uncertain {
                    "neither snapshot; inspect before deciding"
                } else if bucket_is_done(state, undoing) {
                    "the completed snapshot"
                } else {
                    "the prior snapshot"
                }
            );
            store::set_state_in(&mut tx, &candidate.id, state, &detail, now).await?;
            tx.commit().await?;
            let bucket = match outcome {
                Matched::Done => &mut report.applied,
                Matched::NotDone => &mut report.not_applied,
                Matched::Neither => &mut report.uncertain,
            };
            bucket.push(candidate.id);
        }
        Ok(())
    }

    /// Restores projections that went missing; reports (and preserves) ones edited outside Zuno.
    async fn reconcile_projections(&self, report: &mut ReconcileReport) -> Result<(), MemoryError> {
        for (document_id, path, written) in store::published_documents(&self.db).await? {
            let Some(path) = path else { continue };
            // A moved worktree is neither read nor written: publishing records the refusal.
            if !self.projection_still_there(&document_id).await? {
                self.publish(&document_id).await?;
                continue;
            }
            let target = PathBuf::from(&path);
            let state = tokio::task::spawn_blocking(move || managed_file::read(&target))
                .await
                .map_err(|e| MemoryError::Conflict(e.to_string()))?;
            match state {
                Ok(None) => {
                    let published = self.publish(&document_id).await?;
                    if published.state == "synced" {
                        report.restored_projections.push(path);
                    }
                }
                Ok(Some(file)) if written.as_deref().is_some_and(|w| w != file.digest) => {
                    let detail = "the file changed outside Zuno; it was preserved — compare with \
                                  inspect-memory, accept with import-memory";
                    self.record_projection(
                        &document_id,
                        std::path::Path::new(&path),
                        "external_edit",
                        None,
                        None,
                        Some(detail),
                    )
                    .await?;
                    report.external_edits.push(path);
                }
                Ok(Some(_)) => {}
                Err(error) => {
                    self.record_projection(
                        &document_id,
                        std::path::Path::new(&path),
                        "error",
                        None,
                        None,
                        Some(&error.to_string()),
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }
}

impl MemoryService {
    /// False when the document's project worktree moved since its claim.
    async fn projection_still_there(&self, document_id: &str) -> Result<bool, MemoryError> {
        let mut tx = self.db.begin_read().await?;
        let document = self.document_by_id_in(&mut tx, document_id).await?;
        tx.rollback().await?;
        match self
            .projection_path(document.scope, document.project_id.as_deref())
            .await
        {
            Ok(_) => Ok(true),
            Err(MemoryError::Worktree(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }
}

/// Which of an interrupted candidate's snapshots the document holds.
enum Matched {
    Done,
    NotDone,
    Neither,
}

/// The state an interrupted candidate settles in, from the document's current entries: an
/// apply's target is its `after`, an undo's the apply's `before`.
fn classify(candidate: &Candidate, current: &[String]) -> (MemoryCandidateState, Matched) {
    let snapshot = |json: Option<&str>| -> Vec<String> {
        serde_json::from_str(json.unwrap_or("null")).unwrap_or_default()
    };
    let before = snapshot(candidate.before_entries.as_deref());
    let after = snapshot(candidate.after_entries.as_deref());
    let undoing = candidate.state == MemoryCandidateState::Undoing;
    let (done, not_done) = if undoing {
        (&before, &after)
    } else {
        (&after, &before)
    };
    if current == done.as_slice() {
        let state = if undoing {
            MemoryCandidateState::Undone
        } else {
            MemoryCandidateState::Applied
        };
        (state, Matched::Done)
    } else if current == not_done.as_slice() {
        let state = if undoing {
            MemoryCandidateState::Applied
        } else {
            MemoryCandidateState::Pending
        };
        (state, Matched::NotDone)
    } else {
        (MemoryCandidateState::Uncertain, Matched::Neither)
    }
}

fn bucket_is_done(state: MemoryCandidateState, undoing: bool) -> bool {
    matches!(
        (state, undoing),
        (MemoryCandidateState::Applied, false) | (MemoryCandidateState::Undone, true)
    )
}
