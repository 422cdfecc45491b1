//! Candidates: proposing a change, promotion policy, review (approve / reject) and reinforcing
//! an entry with new evidence.

use crate::config::MemoryPromotion;
use crate::db::Tx;
use crate::memory::MemoryAction;
use crate::memory::consolidate::{self, Consolidation, Standing};
use crate::memory::store::{self, Candidate, Document, MemoryCandidateState, Scope};
use crate::memory::write_check::{self, WriteRefusal};

use super::{
    MemoryError, MemoryService, Origin, Outcome, Proposal, Staged, Write, consolidation_json,
    contents, json,
};

impl MemoryService {
    /// Proposes a change. It is validated, journaled as a candidate, and applied at once when the
    /// promotion policy allows; otherwise it waits for review.
    pub async fn propose(&self, proposal: Proposal) -> Result<Outcome, MemoryError> {
        self.adopt_existing_file(proposal.scope, proposal.project_id.as_deref())
            .await?;
        let mut tx = self.db.begin().await?;
        let staged = self.propose_in(&mut tx, &proposal).await?;
        tx.commit().await?;
        self.committed(staged, proposal.project_id.as_deref()).await
    }

    /// After a staged change committed: when it applied, the project's guards are compiled again
    /// and the document's projection published.
    pub(super) async fn committed(
        &self,
        staged: Staged,
        project_id: Option<&str>,
    ) -> Result<Outcome, MemoryError> {
        let projection = if staged.applied {
            self.compile_guards(project_id).await;
            Some(self.publish(&staged.document_id).await?)
        } else {
            None
        };
        Ok(Outcome {
            candidate: staged.candidate,
            applied: staged.applied,
            revision: staged.revision,
            projection,
        })
    }

    /// [`MemoryService::propose`] inside the caller's transaction, without publishing: the
    /// maintenance stage commits a whole plan, its journal and its watermark in its fenced
    /// settlement, then publishes the touched documents.
    pub async fn propose_in(
        &self,
        tx: &mut Tx,
        proposal: &Proposal,
    ) -> Result<Staged, MemoryError> {
        self.stage_in(tx, proposal, Staging::ByPolicy).await
    }

    /// Stages `proposal` as a pending candidate for a person to review, never applied here:
    /// maintenance's replacement of an entry the user owns by a newer fact (an automatic writer
    /// may not rewrite it; approving the candidate does, as the user's decision).
    pub async fn propose_for_review_in(
        &self,
        tx: &mut Tx,
        proposal: &Proposal,
    ) -> Result<Staged, MemoryError> {
        self.stage_in(tx, proposal, Staging::ForReview).await
    }

    pub(super) async fn stage_in(
        &self,
        tx: &mut Tx,
        proposal: &Proposal,
        staging: Staging,
    ) -> Result<Staged, MemoryError> {
        check_fields(proposal)?;
        let now = self.now();
        let document =
            store::document_in(tx, proposal.scope, proposal.project_id.as_deref(), now).await?;
        check_revision(proposal, &document)?;
        let after = write_check::plan(
            &document.entries,
            proposal.action,
            proposal.content.as_deref(),
            proposal.old_text.as_deref(),
            proposal.expected_revision.is_some(),
        )?;
        if proposal.origin != Origin::User {
            self.protect_in(tx, &document, proposal, &after, staging)
                .await?;
        }
        let (after, consolidation) = self
            .fit_in(tx, &document, after, proposal.origin, &proposal.evidence)
            .await?;
        let candidate_id = crate::ids::new_id("mcand");
        let before = json(&contents(&document.entries));
        let after_json = json(&after);
        let consolidation_text = consolidation.as_ref().map(consolidation_json);
        let journaled = store::NewCandidate {
            id: &candidate_id,
            document_id: &document.id,
            project_id: proposal.project_id.as_deref(),
            target: proposal.scope,
            action: proposal.action.as_str(),
            content: proposal.content.as_deref(),
            old_text: proposal.old_text.as_deref(),
            reason: &proposal.reason,
            confidence: proposal.confidence,
            origin: proposal.origin.as_str(),
            base_revision: document.revision,
            before_entries: &before,
            after_entries: &after_json,
            job_id: proposal.job_id.as_deref(),
            consolidation: consolidation_text.as_deref(),
        };
        store::insert_candidate_in(tx, &journaled, &proposal.evidence, now).await?;
        let applied = match staging {
            Staging::ByPolicy => self.promotes(proposal),
            Staging::ForReview => false,
            Staging::Withhold => true,
        };
        let mut revision = document.revision;
        if applied {
            revision = self
                .apply_in(
                    tx,
                    &candidate_id,
                    &document,
                    Write {
                        after: &after,
                        origin: proposal.origin,
                        evidence: &proposal.evidence,
                        consolidation,
                    },
                    now,
                )
                .await?;
        }
        let candidate = store::candidate_in(tx, &candidate_id)
            .await?
            .expect("inserted above");
        Ok(Staged {
            candidate,
            applied,
            revision,
            document_id: document.id,
        })
    }

    /// `memory.promotion`: automatic applies what passed validation; high_confidence applies at
    /// or above `memory.auto_confidence`; review applies nothing. Learning is narrower: global
    /// automatic memory needs explicit user evidence, and maintenance never applies without
    /// evidence (model confidence alone never authorises Memory).
    pub(super) fn promotes(&self, proposal: &Proposal) -> bool {
        if proposal.origin == Origin::User {
            return true;
        }
        if proposal.origin == Origin::Maintenance {
            if proposal.evidence.is_empty() {
                return false;
            }
            if proposal.scope == Scope::Global && !proposal.explicit_user_evidence {
                return false;
            }
        }
        match self.config.memory.promotion {
            MemoryPromotion::Automatic => true,
            MemoryPromotion::HighConfidence => {
                proposal.confidence >= self.config.memory.auto_confidence
            }
            MemoryPromotion::Review => false,
        }
    }

    /// Automatic writers cannot rewrite user-owned entries (unless the change only waits for
    /// the user's review) or resurrect forgotten text.
    pub(super) async fn protect_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        proposal: &Proposal,
        after: &[String],
        staging: Staging,
    ) -> Result<(), MemoryError> {
        if staging == Staging::ByPolicy
            && matches!(
                proposal.action,
                MemoryAction::Replace | MemoryAction::Remove
            )
            && let Some(old_text) = &proposal.old_text
            && let Ok(target) = write_check::locate(
                &document.entries,
                old_text,
                proposal.expected_revision.is_some(),
            )
            && matches!(target.owner.as_str(), "user" | "imported")
        {
            return Err(WriteRefusal::UserOwned.into());
        }
        let before = contents(&document.entries);
        for added in after.iter().filter(|e| !before.contains(e)) {
            if store::is_forgotten_in(tx, &document.id, added).await? {
                return Err(WriteRefusal::Forgotten.into());
            }
            if let Some(earlier) = store::dropped_evidence_in(tx, &document.id, added).await?
                && proposal.evidence.iter().all(|id| earlier.contains(id))
            {
                return Err(WriteRefusal::DroppedAtCap.into());
            }
        }
        Ok(())
    }

    /// The write's result within the document's cap: as planned when it fits, else consolidated
    /// (same-rule entries merged, the lowest-value derived entries dropped; see
    /// [`consolidate`]). Refused, naming the key that raises the cap, when even that does not
    /// fit.
    pub(super) async fn fit_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        after: Vec<String>,
        origin: Origin,
        evidence: &[String],
    ) -> Result<(Vec<String>, Option<Consolidation>), MemoryError> {
        let (limit, key) = write_check::cap(document.scope, &self.config.memory);
        if write_check::document_chars(&after) <= limit {
            return Ok((after, None));
        }
        let values = store::entry_values_in(tx, &document.id).await?;
        let new_text = match origin {
            Origin::User => Standing::Protected,
            Origin::Maintenance if !evidence.is_empty() => Standing::Derived,
            Origin::Maintenance | Origin::Tool => Standing::Asserted,
        };
        match consolidate::fit(
            &after,
            &document.entries,
            &values,
            new_text,
            evidence,
            limit,
        ) {
            Ok(fitted) => Ok((fitted.after, Some(fitted.consolidation))),
            Err(chars) => Err(WriteRefusal::OverCap { chars, limit, key }.into()),
        }
    }

    pub(super) async fn pending_candidate_in(
        &self,
        tx: &mut Tx,
        id: &str,
    ) -> Result<Candidate, MemoryError> {
        let candidate = store::candidate_in(tx, id).await?.ok_or_else(|| {
            MemoryError::NotFound(format!("memory candidate `{id}` was not found"))
        })?;
        if candidate.state != MemoryCandidateState::Pending {
            return Err(MemoryError::Conflict(format!(
                "memory candidate `{id}` is `{}`, not pending",
                candidate.state
            )));
        }
        Ok(candidate)
    }

    /// Reinforces the current entry of `scope` that states the same rule as `content`
    /// ([`super::dedupe::same_rule`]): `evidence` joins its support, and the document's text and
    /// revision stay as they are (adding an existing rule is not a change). Returns the entry, or
    /// `None` when no entry states that rule.
    pub async fn reinforce_in(
        &self,
        tx: &mut Tx,
        scope: Scope,
        project_id: Option<&str>,
        content: &str,
        evidence: &[String],
    ) -> Result<Option<store::Entry>, MemoryError> {
        let Some(view) = store::view_in(tx, scope, project_id).await? else {
            return Ok(None);
        };
        let rule = crate::memory::dedupe::RuleSignature::of(content);
        let Some(entry) = view.entries.into_iter().find(|entry| {
            crate::memory::dedupe::RuleSignature::of(&entry.content).same_rule_as(&rule)
        }) else {
            return Ok(None);
        };
        store::support_in(tx, &entry.id, evidence).await?;
        Ok(Some(entry))
    }

    /// Approves a pending candidate (optionally with edited content). A document that moved past
    /// the reviewed revision marks the candidate `stale` instead: drift is never applied.
    pub async fn approve(
        &self,
        id: &str,
        edited_content: Option<String>,
    ) -> Result<Outcome, MemoryError> {
        if let Some(content) = &edited_content {
            write_check::check_text("content", content)?;
        }
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = self.pending_candidate_in(&mut tx, id).await?;
        let document = self
            .document_by_id_in(&mut tx, &candidate.document_id)
            .await?;
        if document.revision != candidate.base_revision {
            let detail = format!(
                "memory moved from revision {} to {} after this candidate was proposed",
                candidate.base_revision, document.revision
            );
            store::mark_stale_in(&mut tx, id, &detail, now).await?;
            tx.commit().await?;
            return Err(MemoryError::Conflict(format!(
                "memory changed since this candidate was reviewed (revision {} → {}); it is now stale",
                candidate.base_revision, document.revision
            )));
        }
        let action = match candidate.action.as_str() {
            "add" => MemoryAction::Add,
            "replace" => MemoryAction::Replace,
            _ => MemoryAction::Remove,
        };
        let content = edited_content.clone().or(candidate.content.clone());
        let after = write_check::plan(
            &document.entries,
            action,
            content.as_deref(),
            candidate.old_text.as_deref(),
            true,
        )?;
        let evidence = store::candidate_evidence_in(&mut tx, id).await?;
        let origin = if candidate.origin == "maintenance" {
            Origin::Maintenance
        } else {
            Origin::User
        };
        let (after, consolidation) = self
            .fit_in(&mut tx, &document, after, origin, &evidence)
            .await?;
        if edited_content.is_some() {
            store::record_edit_in(&mut tx, id, content.as_deref()).await?;
        }
        store::set_after_entries_in(&mut tx, id, &json(&after)).await?;
        let revision = self
            .apply_in(
                &mut tx,
                id,
                &document,
                Write {
                    after: &after,
                    origin,
                    evidence: &evidence,
                    consolidation,
                },
                now,
            )
            .await?;
        let candidate = store::candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        self.compile_guards(candidate.project_id.as_deref()).await;
        self.published(&document.id, candidate, true, revision)
            .await
    }

    /// Compiles the guards the project's Memory implies after a change a person or the tool
    /// applied (maintenance compiles in its own settlement). A failure is logged: the committed
    /// change stands, and the next maintenance compiles again.
    pub(super) async fn compile_guards(&self, project_id: Option<&str>) {
        let Some(project_id) = project_id else {
            return;
        };
        let compiled = async {
            let mut tx = self.db.begin().await?;
            let compiled = crate::guards::compile_memory_in(
                &mut tx,
                project_id,
                &self.config.guards,
                self.now(),
            )
            .await?;
            tx.commit().await?;
            Ok::<_, crate::db::StoreError>(compiled)
        }
        .await;
        if let Err(error) = compiled {
            tracing::warn!(%error, project_id, "guard compilation after a memory change failed");
        }
    }

    /// Rejects a pending candidate; its proposed text is not proposed again automatically.
    pub async fn reject(&self, id: &str) -> Result<Candidate, MemoryError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = self.pending_candidate_in(&mut tx, id).await?;
        store::record_rejected_in(&mut tx, id, now).await?;
        if let Some(content) = &candidate.content {
            store::remember_forgotten_in(&mut tx, &candidate.document_id, content, "rejected", now)
                .await?;
        }
        let candidate = store::candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        Ok(candidate)
    }
}

/// The checks a proposal passes before any document is read: its text, its confidence, and a
/// project for project memory.
fn check_fields(proposal: &Proposal) -> Result<(), WriteRefusal> {
    for (field, text) in [
        ("content", proposal.content.as_deref()),
        ("old_text", proposal.old_text.as_deref()),
        ("reason", Some(proposal.reason.as_str())),
    ] {
        if let Some(text) = text {
            write_check::check_text(field, text)?;
        }
    }
    if !(0.0..=1.0).contains(&proposal.confidence) || !proposal.confidence.is_finite() {
        return Err(WriteRefusal::Invalid {
            field: "confidence",
            reason: String::from("must be a probability in [0, 1]"),
        });
    }
    if proposal.scope == Scope::Project && proposal.project_id.is_none() {
        return Err(WriteRefusal::Invalid {
            field: "project",
            reason: String::from("project memory needs a project"),
        });
    }
    Ok(())
}

/// Whether a staged candidate may apply under `memory.promotion`, or waits for review whatever
/// the policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Staging {
    ByPolicy,
    ForReview,
    /// Applied whatever the policy: maintenance withholding a stale entry (it adds no text).
    Withhold,
}

/// A proposal made against a revision the document has left is stale.
fn check_revision(proposal: &Proposal, document: &Document) -> Result<(), MemoryError> {
    match proposal.expected_revision {
        Some(expected) if expected != document.revision => Err(MemoryError::Stale {
            expected,
            current: document.revision,
        }),
        _ => Ok(()),
    }
}
