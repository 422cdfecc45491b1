//! Stale entries: maintenance withholds a derived entry whose files all left the worktree (or,
//! when configured, that nothing supported for `memory.stale_after_unused_days`). Withholding is a
//! journaled `remove`, so the text stays in the revision history; nothing is deleted. A person
//! restores one as their own entry, which is never withheld again.

use std::path::Path;

use crate::db::Tx;
use crate::memory::MemoryAction;
use crate::memory::audit::{exists_in_worktree, named_paths, names_only_missing_files};
use crate::memory::store::{self, Scope, StaleCandidate, StaleMark};
use crate::memory::write_check::WriteRefusal;

use super::candidates::Staging;
use super::{MemoryError, MemoryService, Origin, Outcome, Proposal, Staged};

const DAY_MS: i64 = 86_400_000;

/// Why an entry is stale: the reason recorded and the paths that are gone.
fn staleness(
    candidate: &StaleCandidate,
    worktree: Option<&Path>,
    unused_before: Option<i64>,
) -> Option<(&'static str, Vec<String>)> {
    if let Some(root) = worktree {
        let paths = named_paths(&candidate.entry.content);
        if names_only_missing_files(&paths, &|path| exists_in_worktree(root, path)) {
            return Some(("missing_files", paths));
        }
    }
    unused_before
        .is_some_and(|before| candidate.last_active_at < before)
        .then(|| ("unused", Vec::new()))
}

impl MemoryService {
    /// Withholds the stale derived entries of `project_id`'s document in the caller's
    /// transaction (maintenance's settlement). `worktree` is the project's worktree as this host
    /// sees it: unless it is a checkout here (it holds `.git`), no file is judged missing.
    pub async fn withhold_stale_in(
        &self,
        tx: &mut Tx,
        project_id: &str,
        worktree: Option<&Path>,
        job_id: Option<&str>,
    ) -> Result<Vec<Staged>, MemoryError> {
        let now = self.now();
        // Nothing to withhold in a document that does not exist (and none is created here).
        let Some(document_id) = store::document_id_in(tx, Scope::Project, Some(project_id)).await?
        else {
            return Ok(Vec::new());
        };
        let unused_before = match self.config.memory.stale_after_unused_days {
            0 => None,
            days => Some(now - i64::from(days) * DAY_MS),
        };
        // Only a checkout tells what the code holds: an empty or unrelated directory (a project
        // bound before its files arrived, an evaluation's scratch worktree) judges nothing.
        let worktree = worktree.filter(|root| root.join(".git").exists());
        let mut withheld = Vec::new();
        for candidate in store::stale_candidates_in(tx, &document_id).await? {
            let Some((reason, missing)) = staleness(&candidate, worktree, unused_before) else {
                continue;
            };
            if candidate.evidence.is_empty() {
                // Without support it is withheld from prompts already.
                continue;
            }
            let because = match reason {
                "missing_files" => {
                    format!("stale: {} no longer in the worktree", missing.join(", "))
                }
                _ => String::from("stale: unused for longer than memory.stale_after_unused_days"),
            };
            let proposal = Proposal {
                scope: Scope::Project,
                project_id: Some(project_id.to_owned()),
                action: MemoryAction::Remove,
                content: None,
                old_text: Some(candidate.entry.content.clone()),
                expected_revision: None,
                reason: because,
                confidence: 1.0,
                origin: Origin::Maintenance,
                evidence: candidate.evidence.clone(),
                explicit_user_evidence: false,
                job_id: job_id.map(str::to_owned),
            };
            let staged = match self.stage_in(tx, &proposal, Staging::Withhold).await {
                Ok(staged) => staged,
                // Two entries with one text: the locator is ambiguous; leave both for review.
                Err(MemoryError::Refused(refusal @ WriteRefusal::Invalid { .. })) => {
                    tracing::info!(%refusal, "stale entry left in place");
                    continue;
                }
                Err(error) => return Err(error),
            };
            let mark = StaleMark {
                candidate_id: &staged.candidate.id,
                document_id: &document_id,
                content: &candidate.entry.content,
                reason,
                missing_paths: &missing,
            };
            store::insert_stale_mark_in(tx, &mark, now).await?;
            withheld.push(staged);
        }
        Ok(withheld)
    }

    /// Restores an entry withheld as stale (by the candidate that withheld it) as the user's
    /// own entry, with the evidence it had.
    pub async fn restore_stale(&self, candidate_id: &str) -> Result<Outcome, MemoryError> {
        let mut tx = self.db.begin().await?;
        let (document_id, mark) = store::stale_mark_in(&mut tx, candidate_id)
            .await?
            .ok_or_else(|| {
                MemoryError::NotFound(format!(
                    "no entry was withheld as stale by memory candidate `{candidate_id}`"
                ))
            })?;
        if let Some(by) = mark.restored_candidate_id {
            return Err(MemoryError::Conflict(format!(
                "the entry withheld by `{candidate_id}` was restored already by `{by}`"
            )));
        }
        let document = self.document_by_id_in(&mut tx, &document_id).await?;
        let proposal = Proposal {
            scope: document.scope,
            project_id: document.project_id.clone(),
            action: MemoryAction::Add,
            content: Some(mark.content),
            old_text: None,
            expected_revision: None,
            reason: format!("restored the entry withheld as stale by {candidate_id}"),
            confidence: 1.0,
            origin: Origin::User,
            evidence: store::candidate_evidence_in(&mut tx, candidate_id).await?,
            explicit_user_evidence: true,
            job_id: None,
        };
        let staged = self.stage_in(&mut tx, &proposal, Staging::ByPolicy).await?;
        store::record_stale_restored_in(&mut tx, candidate_id, &staged.candidate.id).await?;
        tx.commit().await?;
        self.committed(staged, document.project_id.as_deref()).await
    }
}
